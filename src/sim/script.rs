//! Scripted turns: the simulator playing a coding agent's backend. A server-level script (flags
//! `--script FILE` / `--script-json JSON`, since agents cannot send the per-request `"sim"`
//! object) says what each turn of a tool loop answers: "call tool X with these arguments", then,
//! once the tool's result is back, "answer with this text". This module owns the script's format
//! and the pure choice of one request's reply; `stream.rs` and `mod.rs` send it.
//!
//! How a turn is chosen: the step is the number of assistant messages carrying `tool_calls`
//! after the conversation's last `user` message (one per round trip, however many calls it
//! made), and the turn is the script's turn at that step (its last turn beyond the end). A
//! request that offers no tools is a side request (a title, a summary, Qwen Code's
//! "next speaker" check): it gets the script's `text`, or a JSON value when it asks for JSON
//! with `response_format` (the script's `json`, else an instance of the request's JSON schema).
//! A call turn whose tools the request does not offer is answered as a side request too.

use serde::Deserialize;
use serde_json::{Value, json};

/// What a side request (no tools offered) gets when the script names no text.
pub const DEFAULT_TEXT: &str = "mlxgate-sim scripted answer.";

/// A server-level script.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Script {
    /// The turns of one tool loop, in order.
    #[serde(default)]
    pub turns: Vec<Turn>,
    /// The answer to a side request (no tools offered); [`DEFAULT_TEXT`] when absent.
    #[serde(default)]
    pub text: Option<String>,
    /// The answer to a side request that asks for JSON (`response_format`); when absent, an
    /// instance of its schema (`{}` for `json_object`).
    #[serde(default)]
    pub json: Option<Value>,
}

/// One assistant message of the loop.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged, deny_unknown_fields)]
pub enum Turn {
    /// Tool calls in one message (several run in one round trip), with optional text before them.
    Calls {
        calls: Vec<Call>,
        #[serde(default)]
        text: Option<String>,
    },
    /// A plain text answer (the loop's end).
    Text { text: String },
}

/// One scripted tool call.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Call {
    /// The names this call may take (agents name their shell tool differently: `bash`,
    /// `run_shell_command`, `shell`…): the first one the request offers is called.
    #[serde(deserialize_with = "one_or_many")]
    pub tool: Vec<String>,
    /// The call's arguments: a JSON object (sent serialized), or a string sent as it is.
    #[serde(default = "empty_object")]
    pub arguments: Value,
}

fn empty_object() -> Value {
    json!({})
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

/// The reply chosen for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// Text before any tool call (may be empty).
    pub text: String,
    /// Tool calls, in order (their index in the message is their position here).
    pub calls: Vec<ToolCall>,
}

/// A tool call to send.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as the JSON text the client receives.
    pub arguments: String,
}

impl Script {
    /// Parses a script from its JSON text.
    pub fn parse(text: &str) -> Result<Script, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// The reply to a chat `request` (its body as received).
    pub fn reply(&self, request: &Value) -> Reply {
        let offered = offered_tools(request);
        if offered.is_empty() {
            return self.side(request);
        }
        let Some(turn) = self.turns.get(step(request)).or(self.turns.last()) else {
            return self.side(request);
        };
        match turn {
            Turn::Text { text } => Reply { text: text.clone(), calls: vec![] },
            Turn::Calls { calls, text } => {
                let calls: Vec<ToolCall> = calls
                    .iter()
                    .filter_map(|c| {
                        let name = c.tool.iter().find(|t| offered.contains(&t.as_str()))?;
                        let arguments = match &c.arguments {
                            Value::String(s) => s.clone(),
                            v => v.to_string(),
                        };
                        Some(ToolCall { name: name.clone(), arguments })
                    })
                    .collect();
                if calls.is_empty() {
                    return self.side(request);
                }
                Reply { text: text.clone().unwrap_or_default(), calls }
            }
        }
    }

    /// The answer to a side request: JSON when it asks for JSON, else the script's text.
    fn side(&self, request: &Value) -> Reply {
        let format = request.pointer("/response_format/type").and_then(Value::as_str);
        let text = match format {
            Some("json_schema") => self
                .json
                .clone()
                .unwrap_or_else(|| {
                    instance_of(request.pointer("/response_format/json_schema/schema").unwrap_or(&Value::Null))
                })
                .to_string(),
            Some("json_object") => self.json.clone().unwrap_or_else(|| json!({})).to_string(),
            _ => self.text.clone().unwrap_or_else(|| DEFAULT_TEXT.to_string()),
        };
        Reply { text, calls: vec![] }
    }
}

/// The names of the function tools a chat request offers.
pub fn offered_tools(request: &Value) -> Vec<&str> {
    request
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| t.pointer("/function/name").or_else(|| t.get("name")).and_then(Value::as_str))
        .collect()
}

/// The round trips already made in the current exchange: assistant messages with tool calls
/// after the last user message.
pub fn step(request: &Value) -> usize {
    let messages = request.get("messages").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
    let since_user = messages.iter().rposition(|m| m["role"] == "user").map_or(0, |i| i + 1);
    messages[since_user..]
        .iter()
        .filter(|m| m["role"] == "assistant" && m["tool_calls"].as_array().is_some_and(|c| !c.is_empty()))
        .count()
}

/// A value that satisfies a JSON schema's common shapes: an object with its required properties
/// (every property when none is marked required), the first `enum` value, `const`, empty arrays,
/// zero, false, and a short string.
pub fn instance_of(schema: &Value) -> Value {
    if let Some(c) = schema.get("const") {
        return c.clone();
    }
    if let Some(first) = schema.get("enum").and_then(Value::as_array).and_then(|e| e.first()) {
        return first.clone();
    }
    if let Some(first) = ["anyOf", "oneOf", "allOf"].iter().find_map(|k| schema.get(*k)?.as_array()?.first()) {
        return instance_of(first);
    }
    let kind = match schema.get("type") {
        Some(Value::Array(types)) => types.iter().find(|t| *t != "null").and_then(Value::as_str),
        Some(t) => t.as_str(),
        None if schema.get("properties").is_some() => Some("object"),
        None => None,
    };
    match kind.map(str::to_ascii_lowercase).as_deref() {
        Some("object") => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let required: Vec<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let mut out = serde_json::Map::new();
            for (name, property) in properties.into_iter().flatten() {
                if required.is_empty() || required.contains(&name.as_str()) {
                    out.insert(name.clone(), instance_of(property));
                }
            }
            Value::Object(out)
        }
        Some("array") => json!([]),
        Some("integer" | "number") => json!(0),
        Some("boolean") => json!(false),
        Some("null") => Value::Null,
        _ => json!("mlxgate-sim"),
    }
}

/// Splits `text` into the pieces a stream sends: words with the space that follows each.
pub fn text_pieces(text: &str) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut current = String::new();
    for c in text.chars() {
        if !c.is_whitespace() && current.ends_with(char::is_whitespace) {
            pieces.push(std::mem::take(&mut current));
        }
        current.push(c);
    }
    if !current.is_empty() {
        pieces.push(current);
    }
    pieces
}

/// Splits a tool call's arguments into the pieces a stream sends them in (about 3 to 6 pieces,
/// cut on character boundaries), as real servers stream arguments token by token.
pub fn argument_pieces(arguments: &str) -> Vec<String> {
    let chars: Vec<char> = arguments.chars().collect();
    if chars.is_empty() {
        return vec![String::new()];
    }
    let size = chars.len().div_ceil(4).max(1);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script() -> Script {
        Script::parse(
            r#"{"turns": [
                {"calls": [{"tool": ["bash", "run_shell_command"], "arguments": {"command": "echo hi"}},
                           {"tool": "read", "arguments": "{\"path\": \"a\"}"}]},
                {"text": "done MARK"}],
              "text": "side"}"#,
        )
        .expect("script")
    }

    fn tools(names: &[&str]) -> Value {
        names.iter().map(|n| json!({"type": "function", "function": {"name": n, "parameters": {}}})).collect()
    }

    #[test]
    fn first_turn_calls_the_offered_tools_in_order() {
        let request = json!({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "go"}],
            "tools": tools(&["read", "run_shell_command"])});
        let reply = script().reply(&request);
        assert_eq!(reply.text, "");
        assert_eq!(
            reply.calls,
            vec![
                ToolCall { name: "run_shell_command".into(), arguments: r#"{"command":"echo hi"}"#.into() },
                ToolCall { name: "read".into(), arguments: r#"{"path": "a"}"#.into() },
            ]
        );
    }

    #[test]
    fn after_the_tool_results_the_text_turn_answers() {
        let request = json!({"tools": tools(&["bash"]), "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "1"}, {"id": "2"}]},
            {"role": "tool", "tool_call_id": "1", "content": "hi"},
            {"role": "tool", "tool_call_id": "2", "content": "a"}]});
        assert_eq!(step(&request), 1);
        assert_eq!(script().reply(&request), Reply { text: "done MARK".into(), calls: vec![] });
    }

    #[test]
    fn a_new_user_message_starts_the_script_again_and_beyond_the_end_the_last_turn_holds() {
        let history = json!({"tools": tools(&["bash"]), "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "tool_calls": [{"id": "1"}]}, {"role": "tool", "content": "x"},
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "again"}]});
        assert_eq!(step(&history), 0);
        assert_eq!(script().reply(&history).calls.len(), 1);
        let beyond = json!({"tools": tools(&["bash"]), "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "tool_calls": [{"id": "1"}]}, {"role": "tool", "content": "x"},
            {"role": "assistant", "tool_calls": [{"id": "2"}]}, {"role": "tool", "content": "y"}]});
        assert_eq!(script().reply(&beyond).text, "done MARK");
    }

    #[test]
    fn side_requests_get_text_or_json_as_asked() {
        let plain = json!({"messages": [{"role": "user", "content": "title please"}]});
        assert_eq!(script().reply(&plain), Reply { text: "side".into(), calls: vec![] });
        assert_eq!(Script::default().reply(&plain).text, DEFAULT_TEXT);
        let unmatched = json!({"messages": [{"role": "user", "content": "x"}], "tools": tools(&["other"])});
        assert_eq!(script().reply(&unmatched).text, "side");
        let schema = json!({"type": "object", "properties": {
            "reasoning": {"type": "string"}, "next_speaker": {"type": "string", "enum": ["user", "model"]}},
            "required": ["reasoning", "next_speaker"]});
        let asks = json!({"messages": [], "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}});
        let answer: Value = serde_json::from_str(&script().reply(&asks).text).expect("json");
        assert_eq!(answer, json!({"reasoning": "mlxgate-sim", "next_speaker": "user"}));
        let object = json!({"messages": [], "response_format": {"type": "json_object"}});
        assert_eq!(script().reply(&object).text, "{}");
    }

    #[test]
    fn schema_instances_cover_the_common_shapes() {
        let schema = json!({"properties": {"a": {"type": ["null", "integer"]}, "b": {"type": "array"},
            "c": {"anyOf": [{"type": "boolean"}]}, "d": {"const": "x"}}});
        assert_eq!(instance_of(&schema), json!({"a": 0, "b": [], "c": false, "d": "x"}));
    }

    #[test]
    fn scripts_are_checked_when_read() {
        assert!(Script::parse(r#"{"turns": [{"calls": [{"tool": "x", "args": {}}]}]}"#).is_err());
        assert!(Script::parse(r#"{"turn": []}"#).is_err());
        assert!(Script::parse(r#"{"turns": [{"calls": [{"tool": "x"}]}, {"text": "t"}]}"#).is_ok());
    }

    #[test]
    fn pieces_rebuild_the_whole() {
        let text = "done, the marker is MARK-1.\nbye";
        assert_eq!(text_pieces(text).concat(), text);
        assert_eq!(text_pieces(text)[0], "done, ");
        let args = r#"{"command":"echo hi; ls -la"}"#;
        let pieces = argument_pieces(args);
        assert!(pieces.len() >= 3, "{pieces:?}");
        assert_eq!(pieces.concat(), args);
        assert_eq!(argument_pieces("é€x"), vec!["é", "€", "x"]);
    }
}
