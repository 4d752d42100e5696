//! Reading and writing chat messages as the planners see them: roles, the instructions
//! (system/developer messages), a message's texts and tool calls, and a text put back.

use serde_json::{Value, json};

pub(super) fn role(message: &Value) -> &str {
    message.get("role").and_then(Value::as_str).unwrap_or("")
}

/// System and developer messages: the instructions, always kept and never cut.
pub(super) fn is_instruction(message: &Value) -> bool {
    matches!(role(message), "system" | "developer")
}

pub(super) fn user_message(content: String) -> Value {
    json!({"role": "user", "content": content})
}

/// A message's texts: its string content, or each text part (with its index).
pub(super) fn text_segments(message: &Value) -> Vec<(Option<usize>, &str)> {
    match message.get("content") {
        Some(Value::String(text)) => vec![(None, text.as_str())],
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .filter(|(_, part)| part.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|(index, part)| part.get("text").and_then(Value::as_str).map(|text| (Some(index), text)))
            .collect(),
        _ => Vec::new(),
    }
}

/// The text of a message made of text only (string content, or text parts joined by a
/// newline); `None` when it has another part (an image).
pub(super) fn text_only(message: &Value) -> Option<String> {
    match message.get("content")? {
        Value::String(text) => Some(text.clone()),
        Value::Array(parts) => {
            let texts = text_segments(message);
            (texts.len() == parts.len()).then(|| texts.iter().map(|(_, t)| *t).collect::<Vec<_>>().join("\n"))
        }
        _ => None,
    }
}

/// The names and arguments of a message's tool calls, for an estimate of their tokens.
pub(super) fn tool_call_text(message: &Value) -> Option<String> {
    let calls = message.get("tool_calls")?.as_array()?;
    Some(
        calls
            .iter()
            .filter_map(|call| call.get("function"))
            .flat_map(|function| {
                ["name", "arguments"].into_iter().filter_map(|key| function.get(key).and_then(Value::as_str))
            })
            .collect::<Vec<_>>()
            .join(" "),
    )
}

pub(super) fn set_text(message: &mut Value, part: Option<usize>, text: String) {
    let slot = match part {
        None => message.get_mut("content"),
        Some(index) => {
            message.get_mut("content").and_then(|content| content.get_mut(index)).and_then(|part| part.get_mut("text"))
        }
    };
    if let Some(slot) = slot {
        *slot = Value::String(text);
    }
}
