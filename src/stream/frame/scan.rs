//! The meter's reading of an event in one pass over its bytes, for the shapes servers send
//! (a chat completion chunk): the same [`Seen`] as the `serde` readings of `frame.rs`, at a
//! fraction of their cost per streamed chunk. It declines (`None`) whatever it does not read
//! the plain way — an escape in a key or in the `id`, a key the meter reads given twice, an
//! `error`, a choice or delta that is not an object, a surrogate escape, nesting deeper than
//! [`MAX_DEPTH`], and anything that is not strict JSON — and the serde readings read those as
//! before.

use super::{ChoiceSeen, KEEPALIVE_ID, Seen, UsageSeen};

/// Deeper values are left to the serde readings (whose limit is 128).
const MAX_DEPTH: usize = 100;

/// Reads an event's JSON the plain way; `None` when it declines.
pub(super) fn read(data: &str) -> Option<Seen> {
    let mut s = Scanner { bytes: data.as_bytes(), at: 0 };
    let mut seen = Seen::default();
    let mut keys = Keys::default();
    s.object(|s, key| {
        match key {
            b"id" => {
                keys.once(0)?;
                match s.value_raw(1)? {
                    (b'"', raw) => {
                        let text = &raw[1..raw.len() - 1];
                        if text.contains(&b'\\') {
                            return None;
                        }
                        seen.keepalive = text == KEEPALIVE_ID.as_bytes();
                    }
                    _ => seen.keepalive = false,
                }
            }
            b"model" => {
                keys.once(1)?;
                s.peek()?;
                let start = s.at;
                seen.model = match s.value_raw(1)? {
                    (b'"', _) => Some(start..s.at),
                    _ => None,
                };
            }
            b"error" => {
                keys.once(2)?;
                s.null()?;
            }
            b"usage" => {
                keys.once(3)?;
                seen.usage = if s.peek()? == b'{' {
                    Some(usage(s)?)
                } else {
                    s.value_raw(1)?;
                    None
                };
            }
            b"choices" => {
                keys.once(4)?;
                match s.peek()? {
                    b'n' => s.null()?,
                    b'[' => {
                        seen.has_choices = true;
                        s.array(|s| {
                            let choice = choice(s)?;
                            seen.choices.push(choice);
                            Some(())
                        })?;
                    }
                    _ => return None,
                }
            }
            _ => {
                s.value_raw(1)?;
            }
        }
        Some(())
    })?;
    s.ws();
    (s.at == s.bytes.len()).then_some(seen)
}

/// The keys read so far of one object, to decline one given twice.
#[derive(Default)]
struct Keys(u8);

impl Keys {
    fn once(&mut self, key: u8) -> Option<()> {
        let bit = 1 << key;
        if self.0 & bit != 0 {
            return None;
        }
        self.0 |= bit;
        Some(())
    }
}

fn usage(s: &mut Scanner<'_>) -> Option<UsageSeen> {
    let mut usage = UsageSeen::default();
    let mut keys = Keys::default();
    s.object(|s, key| {
        match key {
            b"prompt_tokens" => {
                keys.once(0)?;
                usage.prompt_tokens = s.count()?;
            }
            b"completion_tokens" => {
                keys.once(1)?;
                usage.completion_tokens = s.count()?;
            }
            b"prompt_tokens_details" => {
                keys.once(2)?;
                if s.peek()? == b'{' {
                    let mut details = Keys::default();
                    s.object(|s, key| {
                        if key == b"cached_tokens" {
                            details.once(0)?;
                            usage.cached_tokens = s.count()?;
                        } else {
                            s.value_raw(3)?;
                        }
                        Some(())
                    })?;
                } else {
                    s.value_raw(2)?;
                }
            }
            _ => {
                s.value_raw(2)?;
            }
        }
        Some(())
    })?;
    Some(usage)
}

fn choice(s: &mut Scanner<'_>) -> Option<ChoiceSeen> {
    if s.peek()? != b'{' {
        return None;
    }
    let (mut index, mut finished, mut output) = (0, false, false);
    let mut keys = Keys::default();
    s.object(|s, key| {
        match key {
            b"index" => {
                keys.once(0)?;
                index = s.count()?.unwrap_or(0);
            }
            b"finish_reason" => {
                keys.once(1)?;
                finished = s.value_raw(3)?.0 == b'"';
            }
            b"text" => {
                keys.once(2)?;
                output |= non_empty_string(s.value_raw(3)?);
            }
            b"delta" => {
                keys.once(3)?;
                match s.peek()? {
                    b'n' => s.null()?,
                    b'{' => output |= delta(s)?,
                    _ => return None,
                }
            }
            _ => {
                s.value_raw(3)?;
            }
        }
        Some(())
    })?;
    Some(ChoiceSeen { index, finished, output })
}

/// Whether a delta carries output.
fn delta(s: &mut Scanner<'_>) -> Option<bool> {
    let mut output = false;
    let mut keys = Keys::default();
    s.object(|s, key| {
        match key {
            b"content" | b"reasoning_content" | b"reasoning" => {
                keys.once(match key {
                    b"content" => 0,
                    b"reasoning_content" => 1,
                    _ => 2,
                })?;
                output |= non_empty_string(s.value_raw(4)?);
            }
            b"tool_calls" => {
                keys.once(3)?;
                let (first, raw) = s.value_raw(4)?;
                output |= first == b'[' && raw[1..].iter().find(|b| !is_ws(**b)) != Some(&b']');
            }
            b"function_call" => {
                keys.once(4)?;
                output |= s.value_raw(4)?.0 != b'n';
            }
            _ => {
                s.value_raw(4)?;
            }
        }
        Some(())
    })?;
    Some(output)
}

/// A string other than `""`.
fn non_empty_string((first, raw): (u8, &[u8])) -> bool {
    first == b'"' && raw.len() > 2
}

/// JSON's whitespace.
fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// A position in an event's bytes.
struct Scanner<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Scanner<'a> {
    fn ws(&mut self) {
        while self.bytes.get(self.at).is_some_and(|b| is_ws(*b)) {
            self.at += 1;
        }
    }

    /// The first byte of the next value (after whitespace).
    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.bytes.get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    fn null(&mut self) -> Option<()> {
        self.ws();
        self.literal(b"null")
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at + word.len();
        (self.bytes.get(self.at..end)? == word).then(|| self.at = end)
    }

    /// An object's members: `member` is called at each value, with its key (escapes declined).
    fn object(&mut self, mut member: impl FnMut(&mut Self, &'a [u8]) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(());
        }
        loop {
            self.eat(b'"')?;
            let start = self.at;
            let len = self.bytes[start..].iter().position(|b| *b == b'"' || *b == b'\\' || *b < 0x20)?;
            self.at += len;
            if self.bytes[self.at] != b'"' {
                return None;
            }
            let key = &self.bytes[start..self.at];
            self.at += 1;
            self.eat(b':')?;
            member(self, key)?;
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// An array's elements: `element` reads each.
    fn array(&mut self, mut element: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(b'[')?;
        if self.peek()? == b']' {
            self.at += 1;
            return Some(());
        }
        loop {
            element(self)?;
            match self.peek()? {
                b',' => self.at += 1,
                b']' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A `u64` count as `Value::as_u64` reads it (`None` for any other value).
    fn count(&mut self) -> Option<Option<u64>> {
        let (_, raw) = self.value_raw(4)?;
        Some(std::str::from_utf8(raw).ok().and_then(|t| t.parse().ok()))
    }

    /// Skips one value (strict JSON) nested `depth` deep: its first byte and its text.
    fn value_raw(&mut self, depth: usize) -> Option<(u8, &'a [u8])> {
        let first = self.peek()?;
        let start = self.at;
        match first {
            b'"' => self.string()?,
            b'{' => {
                if depth >= MAX_DEPTH {
                    return None;
                }
                self.object(|s, _| s.value_raw(depth + 1).map(drop))?;
            }
            b'[' => {
                if depth >= MAX_DEPTH {
                    return None;
                }
                self.array(|s| s.value_raw(depth + 1).map(drop))?;
            }
            b't' => self.literal(b"true")?,
            b'f' => self.literal(b"false")?,
            b'n' => self.literal(b"null")?,
            b'-' | b'0'..=b'9' => self.number()?,
            _ => return None,
        }
        Some((first, &self.bytes[start..self.at]))
    }

    /// A string, its escapes checked (a `\u` escape of a surrogate is declined).
    fn string(&mut self) -> Option<()> {
        self.at += 1;
        loop {
            let len = self.bytes[self.at..].iter().position(|b| *b == b'"' || *b == b'\\' || *b < 0x20)?;
            self.at += len;
            match self.bytes[self.at] {
                b'"' => {
                    self.at += 1;
                    return Some(());
                }
                b'\\' => match *self.bytes.get(self.at + 1)? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.at += 2,
                    b'u' => {
                        let hex = self.bytes.get(self.at + 2..self.at + 6)?;
                        if !hex.iter().all(u8::is_ascii_hexdigit) {
                            return None;
                        }
                        let code = u32::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
                        if (0xD800..0xE000).contains(&code) {
                            return None;
                        }
                        self.at += 6;
                    }
                    _ => return None,
                },
                _ => return None,
            }
        }
    }

    /// A number (the JSON grammar; its range unchecked, as the serde readings skip numbers).
    fn number(&mut self) -> Option<()> {
        let digits = |s: &mut Self| {
            let n = s.bytes[s.at..].iter().take_while(|b| b.is_ascii_digit()).count();
            s.at += n;
            n
        };
        if self.bytes[self.at] == b'-' {
            self.at += 1;
        }
        match self.bytes.get(self.at)? {
            b'0' => self.at += 1,
            b'1'..=b'9' => {
                digits(self);
            }
            _ => return None,
        }
        if self.bytes.get(self.at) == Some(&b'.') {
            self.at += 1;
            if digits(self) == 0 {
                return None;
            }
        }
        if matches!(self.bytes.get(self.at), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.bytes.get(self.at), Some(b'+' | b'-')) {
                self.at += 1;
            }
            if digits(self) == 0 {
                return None;
            }
        }
        Some(())
    }
}
