//! The text that closes JSON cut short (a tool call's arguments when the token limit stopped the
//! answer): what was streamed cannot be taken back, so the call's `input_json_delta` pieces are
//! made valid JSON at the block's stop by appending to them — an open string closed (a cut escape
//! completed), a cut literal or number finished, a key without its value given `null`, every open
//! object and array closed. A pure function of the text streamed so far.

/// What the innermost container expects next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// A value (top level, after `[`, `,` in an array, or `:`).
    Value,
    /// A key or `}` (after `{`).
    KeyOrEnd,
    /// A key (after `,` in an object).
    Key,
    /// `:` after a key.
    Colon,
    /// `,` or the container's end, after a value.
    Next,
}

/// What to append to `partial` (JSON cut anywhere) to make it valid JSON; empty when nothing is
/// open. Text that is not JSON at all is not repaired (the result may still be invalid).
pub fn closing(partial: &str) -> String {
    let mut stack: Vec<(char, Expect)> = vec![(' ', Expect::Value)];
    let mut in_string = false;
    // 0: none; 1: after `\`; 2..=5: after `\u` and that many hex digits minus 2.
    let mut escape = 0u8;
    let mut token = String::new();
    for c in partial.chars() {
        if in_string {
            match escape {
                0 if c == '\\' => escape = 1,
                0 if c == '"' => {
                    in_string = false;
                    after_string(&mut stack);
                }
                0 => {}
                1 if c == 'u' => escape = 2,
                1 => escape = 0,
                5 => escape = 0,
                _ => escape += 1,
            }
            continue;
        }
        if !token.is_empty() && !is_token_char(c) {
            token.clear();
            set_top(&mut stack, Expect::Next);
        }
        match c {
            '"' => in_string = true,
            '{' => stack.push(('{', Expect::KeyOrEnd)),
            '[' => stack.push(('[', Expect::Value)),
            '}' | ']' => {
                if stack.len() > 1 {
                    stack.pop();
                }
                set_top(&mut stack, Expect::Next);
            }
            ':' => set_top(&mut stack, Expect::Value),
            ',' => {
                let next = if top(&stack).0 == '{' { Expect::Key } else { Expect::Value };
                set_top(&mut stack, next);
            }
            c if is_token_char(c) => token.push(c),
            _ => {}
        }
    }
    let mut out = String::new();
    if in_string {
        match escape {
            1 => out.push('n'),
            2..=5 => out.extend(std::iter::repeat_n('0', usize::from(6 - escape))),
            _ => {}
        }
        out.push('"');
        after_string(&mut stack);
    } else if !token.is_empty() {
        out.push_str(&finish_token(&token));
        set_top(&mut stack, Expect::Next);
    }
    match top(&stack).1 {
        Expect::Colon => out.push_str(":null"),
        Expect::Value if stack.len() > 1 => out.push_str("null"),
        Expect::Key => out.push_str("\"\":null"),
        _ => {}
    }
    for (open, _) in stack.iter().skip(1).rev() {
        out.push(if *open == '{' { '}' } else { ']' });
    }
    out
}

fn top(stack: &[(char, Expect)]) -> (char, Expect) {
    stack.last().copied().unwrap_or((' ', Expect::Next))
}

fn set_top(stack: &mut [(char, Expect)], expect: Expect) {
    if let Some(last) = stack.last_mut() {
        last.1 = expect;
    }
}

/// A string ended: a key (then `:` is due) or a value.
fn after_string(stack: &mut [(char, Expect)]) {
    let next = match top(stack).1 {
        Expect::KeyOrEnd | Expect::Key => Expect::Colon,
        _ => Expect::Next,
    };
    set_top(stack, next);
}

fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '+' | '.')
}

/// The rest of a cut literal (`tr` → `ue`) or number (`1.` → `0`).
fn finish_token(token: &str) -> String {
    for word in ["true", "false", "null"] {
        if let Some(rest) = word.strip_prefix(token) {
            return rest.to_string();
        }
    }
    if token.ends_with(['-', '+', '.', 'e', 'E']) { "0".to_string() } else { String::new() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cut_of_a_json_object_closes_into_valid_json() {
        let whole =
            r#"{"command": "echo caf\u00e9 \"x\" \\ 😀", "n": [1, -2.5e3, true, false, null, {"k": {}}], "e": []}"#;
        for (at, _) in whole.char_indices() {
            let cut = &whole[..at];
            let closed = format!("{cut}{}", closing(cut));
            if cut.trim().is_empty() {
                continue;
            }
            assert!(serde_json::from_str::<serde_json::Value>(&closed).is_ok(), "{cut:?} → {closed:?}");
        }
        assert_eq!(closing(whole), "");
    }
}
