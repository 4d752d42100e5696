//! A model's chat template rendered as `transformers` renders it (`apply_chat_template`,
//! `utils/chat_template_utils.py`): jinja2 with `trim_blocks`, `lstrip_blocks` and loop
//! controls; the globals `raise_exception` and `strftime_now`; transformers' own `tojson`
//! (Python's `json.dumps`: no HTML escaping, `", "`/`": "` separators, `indent`, `sort_keys`);
//! Python's string, dict and list methods (minijinja-contrib's pycompat); values printed as
//! Python prints them (`True`, `None`, `{'a': 1}`); messages normalised as transformers does
//! (keys whose value is null dropped, reasoning aliased to `reasoning_content` and `thinking`).

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State, Value};
use serde_json::Value as Json;

/// The name the compiled template is stored under in its environment.
const NAME: &str = "chat_template";

/// Names a message's reasoning is passed under; the first is what templates read.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// A chat template compiled once at load, rendered per request.
pub struct ChatTemplate {
    env: Environment<'static>,
}

/// What one rendering sees besides the messages.
pub struct Variables<'a> {
    /// The request's tools (`None` renders as jinja's `none`, as transformers passes it).
    pub tools: Option<&'a [Json]>,
    /// The named special tokens (`bos_token`, `eos_token`, ...), as strings.
    pub special_tokens: &'a [(String, String)],
    /// `chat_template_kwargs`: these override the special tokens of the same name.
    pub kwargs: Option<&'a serde_json::Map<String, Json>>,
}

impl ChatTemplate {
    /// Compiles a template source in transformers' environment.
    pub fn compile(source: String) -> Result<ChatTemplate, Error> {
        let mut env = Environment::new();
        env.set_syntax(minijinja::syntax::SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build()?);
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python_formatter);
        env.add_filter("tojson", tojson);
        env.add_filter("string", |value: &Value| python_str(value));
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, source)?;
        Ok(ChatTemplate { env })
    }

    /// Renders messages with `add_generation_prompt: true`.
    pub fn render(&self, messages: &[Json], vars: &Variables<'_>) -> Result<String, Error> {
        let template = self.env.get_template(NAME)?;
        let messages = messages.iter().map(template_message).collect::<Result<Vec<_>, _>>()?;
        let tools = vars.tools.map(|t| t.iter().map(to_value).collect::<Vec<_>>());
        let mut context: Vec<(Value, Value)> = Vec::with_capacity(8);
        for (name, token) in vars.special_tokens {
            context.push((Value::from(name.as_str()), Value::from(token.as_str())));
        }
        if let Some(kwargs) = vars.kwargs {
            for (name, value) in kwargs {
                context.retain(|(k, _)| k.as_str() != Some(name));
                context.push((Value::from(name.as_str()), to_value(value)));
            }
        }
        context.push((Value::from("messages"), Value::from(messages)));
        context.push((Value::from("tools"), Value::from(tools)));
        context.push((Value::from("documents"), Value::from(())));
        context.push((Value::from("add_generation_prompt"), Value::from(true)));
        template.render(Value::from_pairs(context))
    }
}

/// A message as transformers hands it to the template: null-valued keys dropped, reasoning
/// under `thinking` (first) and `reasoning_content` too.
fn template_message(message: &Json) -> Result<Value, Error> {
    let Some(fields) = message.as_object() else {
        return Err(Error::new(ErrorKind::InvalidOperation, format!("chat messages must be objects, got {message}")));
    };
    let reasoning = REASONING_FIELDS.iter().find_map(|k| fields.get(*k).filter(|v| !v.is_null()));
    let mut pairs: Vec<(Value, Value)> = Vec::with_capacity(fields.len() + 2);
    if let Some(reasoning) = reasoning {
        pairs.push((Value::from("thinking"), to_value(reasoning)));
    }
    for (key, value) in fields {
        if value.is_null() {
            continue;
        }
        if reasoning.is_some() && key == "thinking" {
            pairs[0].1 = to_value(value); // `{"thinking": r, **message}`: first place, own value
            continue;
        }
        if reasoning.is_some() && key == "reasoning_content" {
            pairs.push((Value::from("reasoning_content"), Value::UNDEFINED));
            continue;
        }
        pairs.push((Value::from(key.as_str()), to_value(value)));
    }
    if let Some(reasoning) = reasoning {
        match pairs.iter_mut().find(|(k, _)| k.as_str() == Some("reasoning_content")) {
            Some(slot) => slot.1 = to_value(reasoning),
            None => pairs.push((Value::from("reasoning_content"), to_value(reasoning))),
        }
    }
    Ok(Value::from_pairs(pairs))
}

/// A JSON value as a template value (maps keep their order).
pub fn to_value(json: &Json) -> Value {
    match json {
        Json::Null => Value::from(()),
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(u)) => Value::from(u),
            _ => Value::from(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(items) => items.iter().map(to_value).collect(),
        Json::Object(fields) => Value::from_pairs(fields.iter().map(|(k, v)| (k.as_str(), to_value(v)))),
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `{{ value }}` as Python's `str(value)` (strings as they are, nothing escaped).
fn python_formatter(out: &mut minijinja::Output, _: &mut State, value: &Value) -> Result<(), Error> {
    let result = match value.kind() {
        ValueKind::Undefined => Ok(()),
        ValueKind::String => out.write_str(value.as_str().unwrap_or_default()),
        _ => write_python(out, value, false),
    };
    result.map_err(|_| Error::new(ErrorKind::WriteFailure, "formatting failed"))
}

/// Python's `str(value)`.
fn python_str(value: &Value) -> Value {
    if value.kind() == ValueKind::String {
        return value.clone();
    }
    let mut out = String::new();
    let _ = write_python(&mut out, value, false);
    Value::from(out)
}

/// Python's `str()` (`repr == false`) or `repr()` of a value.
fn write_python(out: &mut impl std::fmt::Write, value: &Value, repr: bool) -> std::fmt::Result {
    match value.kind() {
        ValueKind::Undefined => Ok(()),
        ValueKind::None => out.write_str("None"),
        ValueKind::Bool => out.write_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number if value.is_integer() => write!(out, "{value}"),
        ValueKind::Number => out.write_str(&python_float(f64::try_from(value.clone()).unwrap_or(f64::NAN), false)),
        ValueKind::String if repr => write_python_repr_str(out, value.as_str().unwrap_or_default()),
        ValueKind::String => out.write_str(value.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            out.write_char('[')?;
            for (i, item) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.write_str(", ")?;
                }
                write_python(out, &item, true)?;
            }
            out.write_char(']')
        }
        ValueKind::Map => {
            out.write_char('{')?;
            for (i, key) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.write_str(", ")?;
                }
                write_python(out, &key, true)?;
                out.write_str(": ")?;
                write_python(out, &value.get_item(&key).unwrap_or_default(), true)?;
            }
            out.write_char('}')
        }
        _ => write!(out, "{value}"),
    }
}

/// Python's `repr()` of a string: single quotes unless the text holds `'` and no `"`.
fn write_python_repr_str(out: &mut impl std::fmt::Write, s: &str) -> std::fmt::Result {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.write_char(quote)?;
    for c in s.chars() {
        match c {
            '\\' => out.write_str("\\\\")?,
            '\n' => out.write_str("\\n")?,
            '\r' => out.write_str("\\r")?,
            '\t' => out.write_str("\\t")?,
            c if c == quote => write!(out, "\\{c}")?,
            c if (c as u32) < 0x20 || (0x7f..0xa0).contains(&(c as u32)) => write!(out, "\\x{:02x}", c as u32)?,
            c => out.write_char(c)?,
        }
    }
    out.write_char(quote)
}

/// Python's `repr(float)` (`json == false`) or `json.dumps(float)`.
pub fn python_float(f: f64, json: bool) -> String {
    if f.is_nan() {
        return if json { "NaN" } else { "nan" }.into();
    }
    if f.is_infinite() {
        let name = if json { "Infinity" } else { "inf" };
        return if f < 0.0 { format!("-{name}") } else { name.into() };
    }
    // Rust's `{:e}` gives the shortest round-trip digits, as Python's repr does.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        if exp >= 0 {
            let int_len = exp as usize + 1;
            let padded = format!("{digits:0<int_len$}");
            let (int, frac) = padded.split_at(int_len);
            format!("{sign}{int}.{}", if frac.is_empty() { "0" } else { frac })
        } else {
            format!("{sign}0.{}{digits}", "0".repeat((-exp - 1) as usize))
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let dot = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{dot}e{esign}{:02}", exp.abs())
    }
}

/// How `json.dumps` lays a value out.
struct JsonStyle {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
/// i.e. `json.dumps` with those arguments (`sort_keys` by keyword only: minijinja filters take
/// at most four positional arguments besides keywords).
fn tojson(
    value: &Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    separators: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let arg = |positional: Option<Value>, name: &str| -> Result<Option<Value>, Error> {
        Ok(match kwargs.get::<Option<Value>>(name)? {
            Some(v) => Some(v),
            None => positional,
        })
    };
    let ensure_ascii = arg(ensure_ascii, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = match arg(indent, "indent")? {
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_owned(),
            None => " ".repeat(v.as_usize().unwrap_or(0)),
        }),
        None => None,
    };
    let (default_item, default_key) = if indent.is_some() { (",", ": ") } else { (", ", ": ") };
    let (item_sep, key_sep) = match arg(separators, "separators")? {
        Some(v) if !v.is_none() && !v.is_undefined() => {
            let item = v.get_item_by_index(0)?;
            let key = v.get_item_by_index(1)?;
            (item.as_str().unwrap_or(default_item).to_owned(), key.as_str().unwrap_or(default_key).to_owned())
        }
        _ => (default_item.to_owned(), default_key.to_owned()),
    };
    let sort_keys = arg(None, "sort_keys")?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let style = JsonStyle { ensure_ascii, indent, item_sep, key_sep, sort_keys };
    let mut out = String::new();
    write_json(&mut out, value, &style, 0)?;
    Ok(Value::from(out))
}

fn write_json(out: &mut String, value: &Value, style: &JsonStyle, depth: usize) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number if value.is_integer() => {
            let _ = write!(out, "{value}");
        }
        ValueKind::Number => out.push_str(&python_float(f64::try_from(value.clone())?, true)),
        ValueKind::String => write_json_str(out, value.as_str().unwrap_or_default(), style.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_json_container(out, '[', ']', &items, style, depth, |out, item, depth| {
                write_json(out, item, style, depth)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if style.sort_keys {
                keys.sort_by_key(ToString::to_string);
            }
            write_json_container(out, '{', '}', &keys, style, depth, |out, key, depth| {
                match key.as_str() {
                    Some(k) => write_json_str(out, k, style.ensure_ascii),
                    None => write_json_str(out, &python_str(key).to_string(), style.ensure_ascii),
                }
                out.push_str(&style.key_sep);
                write_json(out, &value.get_item(key)?, style, depth)
            })?;
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("Object of type {} is not JSON serializable", value.kind()),
            ));
        }
    }
    Ok(())
}

fn write_json_container(
    out: &mut String,
    open: char,
    close: char,
    items: &[Value],
    style: &JsonStyle,
    depth: usize,
    mut write_item: impl FnMut(&mut String, &Value, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&style.item_sep);
        }
        if let Some(indent) = &style.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth + 1));
        }
        write_item(out, item, depth + 1)?;
    }
    if let Some(indent) = &style.indent {
        out.push('\n');
        out.push_str(&indent.repeat(depth));
    }
    out.push(close);
    Ok(())
}

/// A JSON string as `json.dumps` writes it.
fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `strftime_now(format)`: the current time (UTC: there is no time zone database here, where
/// Python uses local time) formatted with the common `strftime` codes.
fn strftime_now(format: String) -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    strftime(&format, secs)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

fn strftime(format: &str, unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let secs = unix_secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    let weekday = ((days + 3).rem_euclid(7)) as usize; // 1970-01-01 was a Thursday
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut code = chars.next();
        let no_pad = code == Some('-');
        if no_pad {
            code = chars.next();
        }
        let num = |n: u64, width: usize| if no_pad { n.to_string() } else { format!("{n:0width$}") };
        match code {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&num(year.rem_euclid(100) as u64, 2)),
            Some('m') => out.push_str(&num(month as u64, 2)),
            Some('d') => out.push_str(&num(day as u64, 2)),
            Some('e') => out.push_str(&format!("{day:2}")),
            Some('H') => out.push_str(&num(hour, 2)),
            Some('I') => out.push_str(&num((hour + 11) % 12 + 1, 2)),
            Some('M') => out.push_str(&num(minute, 2)),
            Some('S') => out.push_str(&num(second, 2)),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('B') => out.push_str(MONTHS[month as usize - 1]),
            Some('b') | Some('h') => out.push_str(&MONTHS[month as usize - 1][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// (year, month, day) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
pub(crate) fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(source: &str, messages: Json) -> String {
        let template = ChatTemplate::compile(source.into()).unwrap();
        let vars = Variables { tools: None, special_tokens: &[], kwargs: None };
        template.render(messages.as_array().unwrap(), &vars).unwrap()
    }

    #[test]
    fn tojson_is_pythons_json_dumps() {
        let out = render(
            "{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=2) }}|{{ messages[0].x | tojson(sort_keys=true, separators=[',', ':']) }}",
            json!([{"b": "<é>\"\n", "a": [1, 2.5, 1e20, true, null], "x": {"z": 1.0, "y": []}}]),
        );
        assert_eq!(
            out,
            "{\"b\": \"<é>\\\"\\n\", \"a\": [1, 2.5, 1e+20, true, null], \"x\": {\"z\": 1.0, \"y\": []}}|\
             {\n  \"b\": \"<é>\\\"\\n\",\n  \"a\": [\n    1,\n    2.5,\n    1e+20,\n    true,\n    null\n  ],\n  \"x\": {\n    \"z\": 1.0,\n    \"y\": []\n  }\n}|\
             {\"y\":[],\"z\":1.0}"
        );
    }

    #[test]
    fn tojson_ensure_ascii_escapes_as_surrogates() {
        let out = render("{{ messages[0].t | tojson(ensure_ascii=true) }}", json!([{"t": "é😀"}]));
        assert_eq!(out, "\"\\u00e9\\ud83d\\ude00\"");
    }

    #[test]
    fn values_print_as_python_prints_them() {
        let out = render(
            "{{ messages[0].a }} {{ messages[0].b }} {{ messages[0].c }} {{ messages[0].d | string }}",
            json!([{"a": true, "b": 0.5, "c": [1, "it's", {"k": false}], "d": 3.0}]),
        );
        assert_eq!(out, "True 0.5 [1, \"it's\", {'k': False}] 3.0");
    }

    #[test]
    fn python_float_repr() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1e16, "1e+16"),
            (123.456, "123.456"),
            (-2.5e-7, "-2.5e-07"),
        ] {
            assert_eq!(python_float(f, false), want);
        }
    }

    #[test]
    fn null_keys_are_dropped_and_reasoning_is_aliased() {
        let out =
            render("{{ messages[0] | tojson }}", json!([{"role": "assistant", "content": null, "reasoning": "hm"}]));
        assert_eq!(out, r#"{"thinking": "hm", "role": "assistant", "reasoning": "hm", "reasoning_content": "hm"}"#);
    }

    #[test]
    fn raise_exception_fails_the_render() {
        let template = ChatTemplate::compile("{{ raise_exception('roles must alternate') }}".into()).unwrap();
        let vars = Variables { tools: None, special_tokens: &[], kwargs: None };
        let err = template.render(&[], &vars).unwrap_err();
        assert!(err.to_string().contains("roles must alternate"), "{err}");
    }

    #[test]
    fn strftime_formats_a_known_date() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        assert_eq!(strftime("%d %b %Y %H:%M:%S %A %-d %B", 1_709_211_909), "29 Feb 2024 13:05:09 Thursday 29 February");
    }
}
