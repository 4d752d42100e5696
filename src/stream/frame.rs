//! What the meter reads from one SSE event's JSON: its error, usage, choices (index, finish,
//! whether it carries output) and whether it is a keep-alive. The fast path borrows raw slices
//! of the event (`serde_json::value::RawValue`) and skips every other field, building no
//! `serde_json::Value` (whose maps and strings were most of a frame's cost); an event it cannot
//! read that way (duplicate keys, odd shapes) is read through `Value`, with the same meaning.
//! One difference, found by review: inside fields it skips, the fast path accepts what `Value`
//! refuses (a lone surrogate escape, a number beyond f64, nesting deeper than 128), so such a
//! frame is metered where the `Value` reading ignored it whole. No server is known to send one.
//!
//! It also finds where the event's `model` string lies in its text ([`Seen::model`]), so that the
//! meter can put the public model name in its place without re-encoding the event; a frame with
//! `model` twice keeps its own (no server sends one).

use std::ops::Range;

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

/// One event, as the meter needs it.
#[derive(Debug, Default, PartialEq)]
pub struct Seen {
    /// The message of a non-null `error`.
    pub error: Option<String>,
    /// `usage` when it is an object: prompt, completion and cached tokens.
    pub usage: Option<UsageSeen>,
    /// Each choice: its index, whether it has a `finish_reason`, whether it carries output.
    pub choices: Vec<ChoiceSeen>,
    /// `choices` is an array (possibly empty).
    pub has_choices: bool,
    /// The `id` is mlx-openai-server's fake keep-alive chunk.
    pub keepalive: bool,
    /// Where the `model` string (quotes included) lies in the event's text.
    pub model: Option<Range<usize>>,
}

/// A usage object's counts.
#[derive(Debug, Default, PartialEq, Clone, Copy)]
pub struct UsageSeen {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
}

/// One choice of an event.
#[derive(Debug, PartialEq, Clone, Copy)]
pub struct ChoiceSeen {
    pub index: u64,
    pub finished: bool,
    pub output: bool,
}

const KEEPALIVE_ID: &str = "chatcmpl-keepalive";

/// Reads an event's JSON; `None` when it is not a JSON object the meter can read.
pub fn read(data: &str) -> Option<Seen> {
    scan::read(data).or_else(|| fast(data)).or_else(|| slow(data))
}

mod scan;

#[derive(Deserialize)]
struct RawFrame<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
    #[serde(borrow, default)]
    usage: Option<&'a RawValue>,
    /// Read in the same pass as the frame (a frame whose choices are not an array of objects
    /// fails here and goes to the slow path, which reads it with the same meaning).
    #[serde(borrow, default)]
    choices: Option<Vec<Object<RawChoice<'a>>>>,
}

#[derive(Deserialize)]
struct RawChoice<'a> {
    #[serde(borrow, default)]
    index: Option<&'a RawValue>,
    #[serde(borrow, default)]
    finish_reason: Option<&'a RawValue>,
    #[serde(borrow, default)]
    delta: Option<Object<RawDelta<'a>>>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawDelta<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning_content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_calls: Option<&'a RawValue>,
    #[serde(borrow, default)]
    function_call: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawUsage<'a> {
    #[serde(borrow, default)]
    prompt_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    completion_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prompt_tokens_details: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawDetails<'a> {
    #[serde(borrow, default)]
    cached_tokens: Option<&'a RawValue>,
}

/// A struct read from a JSON object only (serde would also read one from an array, by
/// position): anything else fails the fast path.
pub(super) struct Object<T>(pub(super) T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Only<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Only<T> {
            type Value = Object<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Object<T>, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Object)
            }
        }
        deserializer.deserialize_map(Only(std::marker::PhantomData))
    }
}

fn is_object(raw: &RawValue) -> bool {
    raw.get().starts_with('{')
}

/// A non-empty string (`""` is the only way to write an empty one).
fn non_empty_string(raw: Option<&RawValue>) -> bool {
    raw.is_some_and(|r| r.get().starts_with('"') && r.get() != "\"\"")
}

fn non_empty_array(raw: Option<&RawValue>) -> bool {
    raw.and_then(|r| r.get().strip_prefix('[')).is_some_and(|rest| !rest.trim_start().starts_with(']'))
}

/// A JSON number that is a u64 (as `Value::as_u64` reads it: no fraction, no exponent).
fn as_u64(raw: Option<&RawValue>) -> Option<u64> {
    raw.and_then(|r| r.get().parse().ok())
}

/// Where `raw`, a slice of `text`, lies in it, when it is a string.
pub(super) fn string_span(text: &str, raw: &RawValue) -> Option<Range<usize>> {
    let value = raw.get();
    if !value.starts_with('"') {
        return None;
    }
    // `raw` borrows from `text`: its offset is the distance between the two addresses.
    let start = (value.as_ptr() as usize).checked_sub(text.as_ptr() as usize)?;
    let end = start + value.len();
    (end <= text.len() && text.get(start..end) == Some(value)).then_some(start..end)
}

/// Where the top-level `model` string of a JSON object (an event, a whole answer) lies in it.
pub fn model_span(json: &str) -> Option<Range<usize>> {
    #[derive(Deserialize)]
    struct ModelOnly<'a> {
        #[serde(borrow, default)]
        model: Option<&'a RawValue>,
    }
    if !json.trim_start().starts_with('{') {
        return None;
    }
    let only: ModelOnly<'_> = serde_json::from_str(json).ok()?;
    string_span(json, only.model?)
}

fn fast(data: &str) -> Option<Seen> {
    // Serde would also read a struct from an array: only objects take this path.
    if !data.trim_start().starts_with('{') {
        return None;
    }
    let frame: RawFrame<'_> = serde_json::from_str(data).ok()?;
    if frame.error.is_some() {
        // Rare: its message may be an object, a string, escaped text.
        return slow(data);
    }
    let model = frame.model.and_then(|raw| string_span(data, raw));
    let keepalive = match frame.id {
        Some(id) if id.get().contains('\\') => serde_json::from_str::<String>(id.get()).ok()? == KEEPALIVE_ID,
        Some(id) => id.get().strip_prefix('"').and_then(|s| s.strip_suffix('"')) == Some(KEEPALIVE_ID),
        None => false,
    };
    let usage = match frame.usage.filter(|u| is_object(u)) {
        Some(raw) => {
            let usage: RawUsage<'_> = serde_json::from_str(raw.get()).ok()?;
            let cached = match usage.prompt_tokens_details.filter(|d| is_object(d)) {
                Some(details) => as_u64(serde_json::from_str::<RawDetails<'_>>(details.get()).ok()?.cached_tokens),
                None => None,
            };
            Some(UsageSeen {
                prompt_tokens: as_u64(usage.prompt_tokens),
                completion_tokens: as_u64(usage.completion_tokens),
                cached_tokens: cached,
            })
        }
        None => None,
    };
    let mut seen = Seen { usage, keepalive, model, ..Seen::default() };
    if let Some(choices) = frame.choices {
        seen.has_choices = true;
        seen.choices.reserve(choices.len());
        for Object(choice) in choices {
            let output = choice.delta.as_ref().is_some_and(|Object(d)| {
                non_empty_string(d.content)
                    || non_empty_string(d.reasoning_content)
                    || non_empty_string(d.reasoning)
                    || non_empty_array(d.tool_calls)
                    || d.function_call.is_some()
            }) || non_empty_string(choice.text);
            seen.choices.push(ChoiceSeen {
                index: as_u64(choice.index).unwrap_or(0),
                finished: choice.finish_reason.is_some_and(|f| f.get().starts_with('"')),
                output,
            });
        }
    }
    Some(seen)
}

/// The same reading through `serde_json::Value`, for what the fast path declines.
fn slow(data: &str) -> Option<Seen> {
    let value = serde_json::from_str::<Value>(data).ok()?;
    let model = model_span(data);
    if let Some(error) = value.get("error").filter(|e| !e.is_null()) {
        let message = error.get("message").and_then(Value::as_str).map_or_else(|| error.to_string(), str::to_string);
        return Some(Seen { error: Some(message), model, ..Seen::default() });
    }
    let usage = value.get("usage").filter(|u| u.is_object()).map(|usage| UsageSeen {
        prompt_tokens: usage.get("prompt_tokens").and_then(Value::as_u64),
        completion_tokens: usage.get("completion_tokens").and_then(Value::as_u64),
        cached_tokens: usage.get("prompt_tokens_details").and_then(|d| d.get("cached_tokens")).and_then(Value::as_u64),
    });
    let choices = value.get("choices").and_then(Value::as_array);
    let seen_choices = choices
        .into_iter()
        .flatten()
        .map(|choice| ChoiceSeen {
            index: choice.get("index").and_then(Value::as_u64).unwrap_or(0),
            finished: choice.get("finish_reason").is_some_and(Value::is_string),
            output: carries_output(choice),
        })
        .collect();
    Some(Seen {
        error: None,
        usage,
        choices: seen_choices,
        has_choices: choices.is_some(),
        keepalive: value.get("id").and_then(Value::as_str) == Some(KEEPALIVE_ID),
        model,
    })
}

/// Whether a choice carries generated output: text, reasoning or a tool call.
fn carries_output(choice: &Value) -> bool {
    let non_empty = |v: Option<&Value>| v.and_then(Value::as_str).is_some_and(|s| !s.is_empty());
    let delta = choice.get("delta");
    let field = |name: &str| delta.and_then(|d| d.get(name));
    non_empty(field("content"))
        || non_empty(field("reasoning_content"))
        || non_empty(field("reasoning"))
        || field("tool_calls").and_then(Value::as_array).is_some_and(|t| !t.is_empty())
        || field("function_call").is_some_and(|f| !f.is_null())
        || non_empty(choice.get("text"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Events in every server's shape (wire facts) and the odd ones.
    const EVENTS: &[&str] = &[
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"finish_reason":null,"delta":{"role":"assistant","content":"\n"}}]}"#,
        r#"{"id":"x","choices":[{"index":0,"finish_reason":"length","delta":{"role":"assistant"}}]}"#,
        r#"{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":27,"completion_tokens":30,"total_tokens":57,"prompt_tokens_details":{"cached_tokens":26}}}"#,
        r#"{"id":"x","choices":[{"delta":{},"finish_reason":"stop","index":0}],"usage":{"prompt_tokens":1,"total_tokens":31,"completion_tokens":30,"prompt_tokens_details":{"cached_tokens":26}}}"#,
        r#"{"id":"x","choices":[{"index":0,"delta":{"content":"try"},"finish_reason":"length"}],"usage":{"prompt_tokens":27,"completion_tokens":30,"total_tokens":57},"generation_metadata":null}"#,
        r#"{"id":"x","choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}],"usage":null}"#,
        r#"{"id":"chatcmpl-keepalive","choices":[{"index":0,"delta":{"content":" "}}]}"#,
        r#"{"id":"chatcmpl\u002dkeepalive","choices":[{"index":0,"delta":{"content":" "}}]}"#,
        r#"{"choices":[{"index":1,"delta":{"reasoning_content":"hm","content":null}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"reasoning":"","content":""}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"t"}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[ ]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"function_call":null}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"function_call":{"name":"f"}}}]}"#,
        r#"{"choices":[{"index":0,"text":"completion text","finish_reason":null}]}"#,
        r#"{"choices":[{"index":2.0,"delta":{"content":"x"}}]}"#,
        r#"{"choices":[{"index":-1,"delta":"not an object"}]}"#,
        r#"{"choices":"not an array","usage":5}"#,
        r#"{"choices":[1,2]}"#,
        r#"{"error":{"message":"boom","type":"server_error"}}"#,
        r#"{"error":"plain words"}"#,
        r#"{"error":null,"choices":[{"index":0,"delta":{"content":"\"quoted\""}}]}"#,
        r#"{"id":"x","id":"chatcmpl-keepalive","choices":[]}"#,
        r#"{"usage":{"prompt_tokens":1e3,"completion_tokens":18446744073709551616,"prompt_tokens_details":null}}"#,
        r#"[1,2,3]"#,
        r#"["chatcmpl-keepalive"]"#,
        r#"{"choices":[["x", null, {"content": "y"}]]}"#,
        r#"not json"#,
    ];

    #[test]
    fn the_model_string_is_found_where_it_lies() {
        let path = r#"{"id":"x","object":"chat.completion.chunk","model":"/path/on/disk/tiny-qwen3","choices":[]}"#;
        let escaped = r#"{"choices":[{"index":0,"delta":{"content":"a"}}], "model" : "a\"b\u00e9" }"#;
        for (event, model) in [(path, r#""/path/on/disk/tiny-qwen3""#), (escaped, r#""a\"b\u00e9""#)] {
            let span = read(event).and_then(|s| s.model).expect("a model");
            assert_eq!(&event[span.clone()], model);
            assert_eq!(slow(event).and_then(|s| s.model), Some(span.clone()));
            assert_eq!(model_span(event), Some(span));
        }
        for none in [r#"{"choices":[]}"#, r#"{"model":null}"#, r#"{"model":7}"#, r#"{"x":{"model":"inner"}}"#, "[]"] {
            assert_eq!(read(none).and_then(|s| s.model), None, "{none}");
            assert_eq!(model_span(none), None, "{none}");
        }
        let error = r#"{"model":"m","error":{"message":"boom"}}"#;
        assert_eq!(read(error).and_then(|s| s.model), Some(9..12));
    }

    #[test]
    fn the_fast_reading_means_what_the_value_reading_means() {
        for event in EVENTS {
            assert_eq!(read(event), slow(event), "{event}");
        }
    }

    #[test]
    fn what_only_the_fast_reading_accepts_in_skipped_fields_is_metered() {
        // The documented difference: the Value reading ignores these frames whole, the fast one
        // reads their output and usage (as Python's and JavaScript's parsers, i.e. clients, do).
        let deep = format!(
            r#"{{"x":{}1{},"choices":[{{"index":0,"delta":{{"content":"a"}}}}]}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        let lenient = [
            r#"{"x":"\udc00","choices":[{"index":0,"delta":{"content":"a"}}]}"#.to_string(),
            r#"{"x":1e400,"choices":[{"index":0,"delta":{"content":"a"}}]}"#.to_string(),
            deep,
        ];
        for event in &lenient {
            assert_eq!(slow(event), None, "{event}");
            let seen = read(event).expect("read by the fast path");
            assert!(seen.choices.first().is_some_and(|c| c.output), "{event}: {seen:?}");
        }
        let usage = r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,"x":-1e999}}"#;
        assert_eq!(read(usage).and_then(|s| s.usage).and_then(|u| u.completion_tokens), Some(7));
    }

    #[test]
    fn the_fast_path_reads_the_common_shapes_itself() {
        for event in &EVENTS[..7] {
            assert!(fast(event).is_some(), "{event}");
        }
        let seen = fast(EVENTS[2]).expect("usage frame");
        assert_eq!(
            seen.usage,
            Some(UsageSeen { prompt_tokens: Some(27), completion_tokens: Some(30), cached_tokens: Some(26) })
        );
        assert!(seen.has_choices && seen.choices.is_empty());
    }

    /// The serde readings, which the scan must equal where it reads.
    fn by_serde(data: &str) -> Option<Seen> {
        fast(data).or_else(|| slow(data))
    }

    #[test]
    fn the_scan_reads_the_common_shapes_as_serde_does_and_declines_the_rest() {
        for event in EVENTS {
            if let Some(seen) = scan::read(event) {
                assert_eq!(Some(seen), by_serde(event), "{event}");
            }
        }
        for event in EVENTS[..7].iter().chain([&" {\"model\" : \"a\\\"b\" , \"choices\":[ ] } "]) {
            assert!(scan::read(event).is_some(), "{event}");
        }
        let declined = [
            r#"{"error":{"message":"boom"}}"#,
            r#"{"id":"chatcmpl\u002dkeepalive","choices":[]}"#,
            r#"{"id":"x","id":"y"}"#,
            r#"{"choices":[1]}"#,
            r#"{"x":"\udc00","choices":[]}"#,
            r#"{"choices":[]} x"#,
            r#"{"choices":[],}"#,
            r#"{"x":01}"#,
        ];
        for event in declined {
            assert_eq!(scan::read(event), None, "{event}");
        }
    }

    /// JSON values of the chunk's keys, nested, for the scan's property.
    fn json_tree() -> impl Strategy<Value = serde_json::Value> {
        let key = prop_oneof![
            Just("id"),
            Just("model"),
            Just("error"),
            Just("usage"),
            Just("choices"),
            Just("index"),
            Just("finish_reason"),
            Just("delta"),
            Just("text"),
            Just("content"),
            Just("reasoning"),
            Just("reasoning_content"),
            Just("tool_calls"),
            Just("function_call"),
            Just("prompt_tokens"),
            Just("completion_tokens"),
            Just("prompt_tokens_details"),
            Just("cached_tokens"),
            Just("x"),
        ];
        let leaf = prop_oneof![
            json_leaf(),
            Just(serde_json::json!("chatcmpl-keepalive")),
            Just(serde_json::json!(-0.5e3)),
            Just(serde_json::json!(18446744073709551615u64)),
        ];
        leaf.prop_recursive(4, 24, 4, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                prop::collection::vec((key.clone(), inner), 0..5).prop_map(|members| {
                    serde_json::Value::Object(members.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
                }),
            ]
        })
    }

    fn json_leaf() -> impl Strategy<Value = serde_json::Value> {
        prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<u32>().prop_map(serde_json::Value::from),
            (-5i64..5).prop_map(serde_json::Value::from),
            Just(serde_json::json!(1.5)),
            "[a-z\" \\\\]{0,4}".prop_map(serde_json::Value::from),
            Just(serde_json::json!([])),
            Just(serde_json::json!([{"id": "t"}])),
        ]
    }

    proptest! {
        #[test]
        fn random_frames_read_alike(
            index in json_leaf(), finish in json_leaf(), content in json_leaf(), reasoning in json_leaf(),
            tools in json_leaf(), text in json_leaf(), prompt in json_leaf(), cached in json_leaf(),
            with_usage in any::<bool>(), id in prop_oneof![Just("chatcmpl-keepalive"), Just("c")],
        ) {
            let mut frame = serde_json::json!({"id": id, "model": text, "choices": [{"index": index, "finish_reason": finish,
                "delta": {"content": content, "reasoning": reasoning, "tool_calls": tools}, "text": text}]});
            if with_usage {
                frame["usage"] = serde_json::json!({"prompt_tokens": prompt, "completion_tokens": 3,
                    "prompt_tokens_details": {"cached_tokens": cached}});
            }
            let data = frame.to_string();
            prop_assert_eq!(read(&data), slow(&data), "{}", data);
            prop_assert_eq!(scan::read(&data), by_serde(&data), "{}", data);
        }

        #[test]
        fn the_scan_equals_serde_where_it_reads(
            tree in json_tree(), spaced in any::<bool>(), edit in any::<Option<(prop::sample::Index, char)>>(),
            cut in any::<Option<prop::sample::Index>>(),
        ) {
            let mut data = if spaced { serde_json::to_string_pretty(&tree) } else { serde_json::to_string(&tree) }
                .unwrap_or_default();
            if let Some((at, c)) = edit {
                let at = at.index(data.len() + 1);
                if data.is_char_boundary(at) {
                    data.insert(at, c);
                }
            }
            if let Some(at) = cut {
                let at = at.index(data.len() + 1);
                if data.is_char_boundary(at) {
                    data.truncate(at);
                }
            }
            if let Some(seen) = scan::read(&data) {
                prop_assert_eq!(Some(seen), by_serde(&data), "{}", data);
            }
        }
    }
}
