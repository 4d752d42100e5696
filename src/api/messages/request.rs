//! An Anthropic Messages request (`POST /v1/messages`) as the chat completion the backend
//! serves: a pure function from the client's JSON to the chat body, the conversation's key and
//! what the answer's translation needs.
//!
//! What is translated: `system` (a string or text blocks), `messages` (text, images, `tool_use`,
//! `tool_result`, `thinking`), `tools` (client tools: `input_schema` as the function's
//! `parameters`), `tool_choice` (`auto`, `any` as `required`, `tool` as the named function,
//! `none`; `disable_parallel_tool_use` as `parallel_tool_calls: false`), `stop_sequences` (as
//! `stop`), `max_tokens`, `temperature`, `top_p`, `top_k`, `stream`, `thinking` (as the chat
//! template's `enable_thinking`), `metadata.user_id` (the conversation's key when the client
//! sends no session header). Every other field (`context_management`, `output_config`,
//! `container`, `mcp_servers`, `service_tier`, …) is ignored, never refused.
//!
//! The prompt cache: Claude Code's first system block is a billing line
//! (`x-anthropic-billing-header: cc_version=…; cc_entrypoint=…; cch=…;`) that changes between
//! requests and means nothing to a local model. Sent on, it would make every turn's prompt
//! differ from its first tokens, and every server's prompt cache miss: the whole block is
//! dropped (and counted). Everything else is rendered deterministically — fields in a fixed
//! order, the client's JSON objects (tool schemas, tool inputs) in the client's own key order
//! (serde_json's `preserve_order`, on for the whole crate), `cache_control` never copied — so
//! the same conversation gives the same bytes turn after turn and a new turn only appends.
//!
//! System text: Qwen's chat templates take the first message's system text into their tools
//! header and some raise on a system message that is not first, so the system blocks become one
//! leading system message (joined by a blank line). A `role: "system"` message inside
//! `messages` (Claude Code 2.1 puts its environment there, after the first user message)
//! becomes a user message in its place.
//!
//! Thinking in history: a `thinking` block's text becomes the `reasoning_content` of its
//! assistant message (as the Responses face does with reasoning items). Qwen3's templates render
//! it inside `<think>` for the assistant messages of the tool loop in progress — the tokens the
//! model generated, so the prompt the backend sees keeps matching its cache — and drop it for
//! earlier turns; templates without reasoning ignore the field. `redacted_thinking` carries no
//! text a local model can read: dropped.

use serde_json::{Map, Value, json};

use crate::api::fields::RawBody;
use crate::error::GatewayError;

/// Longest `metadata.user_id` kept as the conversation's key (Claude Code's is a JSON string of
/// about 140 bytes).
const MAX_USER_ID: usize = 512;

/// The shortest tool name taken for a cut of a longer offered one (backends that cut names do it
/// at 64 or so; Claude Code's MCP tools are `mcp__<server>__<tool>`).
pub const MIN_CUT_NAME: usize = 24;

/// How a system text block Claude Code uses for billing begins.
pub const BILLING_PREFIX: &str = "x-anthropic-billing-header:";

/// What the answer's translation needs from the request.
#[derive(Debug, Clone, Default)]
pub struct Shape {
    /// The model as the client named it (the message and its events carry it).
    pub model: String,
    /// The client's `stop_sequences`: a backend that says which one stopped it gives
    /// `stop_reason: "stop_sequence"`.
    pub stop_sequences: Vec<String>,
    /// Whether the backend's reasoning goes back as `thinking` blocks (not when the client
    /// turned thinking off).
    pub thinking: bool,
    /// The names of the tools offered, for restoring a name a backend cut or re-cased.
    pub tools: Vec<String>,
}

impl Shape {
    /// A called tool's name as the client offered it: the name itself when offered; else the one
    /// offered name it is a cut of (a backend that limits names' length; a name of at least
    /// [`MIN_CUT_NAME`] bytes: a short unknown name is the model's, not a cut), or the one it equals
    /// but for case; else as the backend sent it.
    pub fn tool_name(&self, name: String) -> String {
        if name.is_empty() || self.tools.contains(&name) {
            return name;
        }
        let only = |matches: Vec<&String>| if matches.len() == 1 { Some(matches[0].clone()) } else { None };
        let cut = (name.len() >= MIN_CUT_NAME)
            .then(|| only(self.tools.iter().filter(|t| t.starts_with(name.as_str())).collect()))
            .flatten();
        cut.or_else(|| only(self.tools.iter().filter(|t| t.eq_ignore_ascii_case(&name)).collect())).unwrap_or(name)
    }
}

/// A Messages request translated.
#[derive(Debug)]
pub struct Translated {
    /// The chat completion request.
    pub fields: RawBody,
    /// The conversation's key from the body (`metadata.user_id`), kept for routing.
    pub session: Option<String>,
    /// Billing-header system blocks dropped (for `mlxgate_anthropic_billing_blocks_stripped_total`).
    pub billing_blocks_stripped: u64,
    pub shape: Shape,
}

/// Translates a Messages request body into a chat completion request.
pub(crate) fn translate(body: &[u8]) -> Result<Translated, GatewayError> {
    let request: Map<String, Value> = serde_json::from_slice(body)
        .map_err(|e| GatewayError::invalid(format!("The request body is not a JSON object: {e}."), None))?;
    let (system, billing_blocks_stripped) = system_text(request.get("system"))?;
    let mut messages = Vec::new();
    if !system.is_empty() {
        messages.push(json!({"role": "system", "content": system}));
    }
    match request.get("messages") {
        Some(Value::Array(items)) if !items.is_empty() => {
            for (at, message) in items.iter().enumerate() {
                push_message(&mut messages, message, at)?;
            }
        }
        Some(Value::Array(_)) | None | Some(Value::Null) => {
            return Err(GatewayError::invalid("messages: at least one message is required", Some("messages")));
        }
        Some(_) => return Err(GatewayError::invalid("messages: must be an array of messages", Some("messages"))),
    }
    let stream = request.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let mut chat = Map::new();
    if let Some(model) = request.get("model") {
        chat.insert("model".into(), model.clone());
    }
    chat.insert("messages".into(), Value::Array(messages));
    let tools = tools(request.get("tools"));
    let tool_names: Vec<String> =
        tools.iter().filter_map(|t| t.pointer("/function/name").and_then(Value::as_str)).map(str::to_string).collect();
    if !tools.is_empty() {
        let names: Vec<&str> = tool_names.iter().map(String::as_str).collect();
        let choice = request.get("tool_choice");
        if let Some(choice) = choice.and_then(|c| tool_choice(c, &names)) {
            chat.insert("tool_choice".into(), choice);
        }
        if choice.and_then(|c| c.get("disable_parallel_tool_use")).and_then(Value::as_bool) == Some(true) {
            chat.insert("parallel_tool_calls".into(), Value::Bool(false));
        }
        // After `tool_choice`'s names are read: the tools move into the body.
        chat.insert("tools".into(), Value::Array(tools));
    }
    let stop_sequences: Vec<String> = match request.get("stop_sequences") {
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).map(str::to_string).collect(),
        Some(Value::String(one)) => vec![one.clone()],
        _ => Vec::new(),
    };
    if !stop_sequences.is_empty() {
        chat.insert("stop".into(), json!(stop_sequences));
    }
    for key in ["max_tokens", "temperature", "top_p", "top_k"] {
        if let Some(value) = request.get(key).filter(|v| v.is_number()) {
            chat.insert(key.into(), value.clone());
        }
    }
    let thinking = thinking_switch(request.get("thinking"));
    if let Some(enabled) = thinking {
        chat.insert("chat_template_kwargs".into(), json!({"enable_thinking": enabled}));
    }
    chat.insert("stream".into(), Value::Bool(stream));
    if stream {
        // `message_delta` carries the usage.
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }
    let session = request
        .get("metadata")
        .and_then(|m| m.get("user_id"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty() && s.len() <= MAX_USER_ID)
        .map(str::to_string);
    let model = request.get("model").and_then(Value::as_str).unwrap_or_default().to_string();
    let fields = chat
        .into_iter()
        .map(|(key, value)| {
            serde_json::value::to_raw_value(&value)
                .map(|raw| (key, raw))
                .map_err(|e| GatewayError::invalid(format!("cannot encode the chat request: {e}"), None))
        })
        .collect::<Result<RawBody, _>>()?;
    let shape = Shape { model, stop_sequences, thinking: thinking != Some(false), tools: tool_names };
    Ok(Translated { fields, session, billing_blocks_stripped, shape })
}

/// `thinking` as the chat template's `enable_thinking`: `enabled` and `adaptive` (Claude Code's)
/// on, `disabled` off, absent or unknown: the template's default (no switch sent).
fn thinking_switch(thinking: Option<&Value>) -> Option<bool> {
    match thinking?.get("type").and_then(Value::as_str)? {
        "enabled" | "adaptive" => Some(true),
        "disabled" => Some(false),
        _ => None,
    }
}

/// Whether a system text is Claude Code's billing line.
pub fn is_billing(text: &str) -> bool {
    text.trim_start().starts_with(BILLING_PREFIX)
}

/// The system text (blocks joined by a blank line; billing blocks dropped) and how many billing
/// blocks were dropped. A system string that begins with the billing line loses that line.
fn system_text(system: Option<&Value>) -> Result<(String, u64), GatewayError> {
    match system {
        None | Some(Value::Null) => Ok((String::new(), 0)),
        Some(Value::String(text)) if is_billing(text) => {
            let rest = text.trim_start().split_once('\n').map_or("", |(_, rest)| rest);
            Ok((rest.trim_start_matches('\n').to_string(), 1))
        }
        Some(Value::String(text)) => Ok((text.clone(), 0)),
        Some(Value::Array(blocks)) => {
            let mut stripped = 0;
            let mut texts = Vec::new();
            for block in blocks {
                let Some(text) = block_text(block) else { continue };
                if is_billing(text) {
                    stripped += 1;
                } else if !text.is_empty() {
                    texts.push(text);
                }
            }
            Ok((texts.join("\n\n"), stripped))
        }
        Some(_) => Err(GatewayError::invalid("system: must be a string or an array of text blocks", Some("system"))),
    }
}

/// A text block's text (a bare string counts as one).
fn block_text(block: &Value) -> Option<&str> {
    match block {
        Value::String(text) => Some(text),
        Value::Object(_) if block.get("type").and_then(Value::as_str).unwrap_or("text") == "text" => {
            block.get("text").and_then(Value::as_str)
        }
        _ => None,
    }
}

/// Client tools as chat functions, in the client's order. Server tools (`web_search_…`,
/// `code_execution_…`, an MCP toolset: a `type` other than `custom` and no `input_schema`) have
/// nothing to run them here: dropped.
fn tools(tools: Option<&Value>) -> Vec<Value> {
    let mut chat = Vec::new();
    for tool in tools.and_then(Value::as_array).into_iter().flatten() {
        let Some(name) = tool.get("name").and_then(Value::as_str) else { continue };
        let kind = tool.get("type").and_then(Value::as_str).unwrap_or("custom");
        let schema = tool.get("input_schema").filter(|s| s.is_object());
        if kind != "custom" && schema.is_none() {
            continue;
        }
        let mut function = Map::new();
        function.insert("name".into(), Value::from(name));
        if let Some(description) = tool.get("description").and_then(Value::as_str).filter(|d| !d.is_empty()) {
            function.insert("description".into(), Value::from(description));
        }
        let parameters = schema.cloned().unwrap_or_else(|| json!({"type": "object", "properties": {}}));
        function.insert("parameters".into(), parameters);
        chat.push(json!({"type": "function", "function": function}));
    }
    chat
}

/// `tool_choice` for the chat request: `auto`, `any` (→ `required`), `none`, `tool` (→ that
/// function, when it is offered). Anything else leaves the backend's default.
fn tool_choice(choice: &Value, names: &[&str]) -> Option<Value> {
    match choice.get("type").and_then(Value::as_str)? {
        "auto" => Some(Value::from("auto")),
        "any" => Some(Value::from("required")),
        "none" => Some(Value::from("none")),
        "tool" => {
            let name = choice.get("name").and_then(Value::as_str)?;
            names.contains(&name).then(|| json!({"type": "function", "function": {"name": name}}))
        }
        _ => None,
    }
}

/// Appends the chat messages of one Messages message (`at`: its index, for errors).
fn push_message(messages: &mut Vec<Value>, message: &Value, at: usize) -> Result<(), GatewayError> {
    let Some(object) = message.as_object() else {
        return Err(GatewayError::invalid(format!("messages.{at}: must be an object"), Some("messages")));
    };
    let content = object.get("content");
    match object.get("role").and_then(Value::as_str) {
        Some("assistant") => messages.push(assistant(content)),
        // A system message inside the conversation (Claude Code 2.1 sends its environment so,
        // after the first user message): a user message in its place, as the Responses face
        // does — every template renders it, and the prompt before it stays as it was.
        _ => user(messages, content),
    }
    Ok(())
}

/// An assistant message: its text, its `tool_use` blocks as `tool_calls` (ids kept, `input`
/// as the arguments' JSON text), its thinking as `reasoning_content`.
fn assistant(content: Option<&Value>) -> Value {
    let mut text = String::new();
    let mut reasoning = Vec::new();
    let mut calls = Vec::new();
    match content {
        Some(Value::String(all)) => text.push_str(all),
        Some(Value::Array(blocks)) => {
            for block in blocks {
                match block.get("type").and_then(Value::as_str) {
                    Some("text") => text.push_str(block.get("text").and_then(Value::as_str).unwrap_or_default()),
                    Some("thinking") => {
                        if let Some(thought) = block.get("thinking").and_then(Value::as_str).filter(|t| !t.is_empty()) {
                            reasoning.push(thought);
                        }
                    }
                    Some("tool_use") => {
                        let id = block.get("id").and_then(Value::as_str).unwrap_or_default();
                        let name = block.get("name").and_then(Value::as_str).unwrap_or_default();
                        let arguments = arguments(block.get("input"));
                        calls.push(json!({"id": id, "type": "function",
                                          "function": {"name": name, "arguments": arguments}}));
                    }
                    // redacted_thinking, server tools' blocks: nothing a local model can use.
                    _ => {}
                }
            }
        }
        _ => {}
    }
    // Qwen's templates read `content` as a string: an empty one, never null.
    let mut message = json!({"role": "assistant", "content": text});
    if !reasoning.is_empty() {
        message["reasoning_content"] = Value::from(reasoning.join("\n\n"));
    }
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    message
}

/// A `tool_use` block's `input` as the JSON text of chat arguments (the input's keys in its own
/// order). A string input (not Anthropic's shape, but seen from translating proxies) is kept if
/// it is JSON, else sent as a JSON string; none is `{}`.
fn arguments(input: Option<&Value>) -> String {
    match input {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(text)) if text.trim().is_empty() => "{}".to_string(),
        Some(Value::String(text)) => match serde_json::from_str::<serde::de::IgnoredAny>(text) {
            Ok(_) => text.clone(),
            Err(_) => Value::from(text.as_str()).to_string(),
        },
        Some(other) => other.to_string(),
    }
}

/// A user message: its `tool_result` blocks first, each a `tool` message in order (the chat
/// API wants them right after the assistant's calls), then its other content as one user
/// message (when there is any).
fn user(messages: &mut Vec<Value>, content: Option<&Value>) {
    let blocks = match content {
        Some(Value::String(text)) => {
            messages.push(json!({"role": "user", "content": text}));
            return;
        }
        Some(Value::Array(blocks)) => blocks,
        _ => {
            messages.push(json!({"role": "user", "content": ""}));
            return;
        }
    };
    let before = messages.len();
    let mut parts = Vec::new();
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("tool_result") => {
                let id = block.get("tool_use_id").and_then(Value::as_str).unwrap_or_default();
                let mut text = result_text(block.get("content"));
                if block.get("is_error").and_then(Value::as_bool) == Some(true) {
                    text = if text.is_empty() { "Error".to_string() } else { format!("Error: {text}") };
                }
                messages.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
            }
            _ => {
                if let Some(part) = user_part(block) {
                    parts.push(part);
                }
            }
        }
    }
    if parts.is_empty() {
        if messages.len() == before {
            // Only blocks a chat model cannot take (a PDF, an unknown type): the turn stays,
            // empty (an empty conversation is a backend error; the roles must alternate).
            messages.push(json!({"role": "user", "content": ""}));
        }
        return;
    }
    let has_image = parts.iter().any(|p| p["type"] == "image_url");
    let content = if has_image {
        Value::Array(parts)
    } else {
        // All text: a string (Qwen's templates read strings), the blocks joined by a blank line.
        let texts: Vec<&str> = parts.iter().filter_map(|p| p["text"].as_str()).collect();
        Value::from(texts.join("\n\n"))
    };
    messages.push(json!({"role": "user", "content": content}));
}

/// A user content block as a chat part: text, an image (`image_url`, base64 as a data URL), a
/// plain-text document as text. Other blocks: none.
fn user_part(block: &Value) -> Option<Value> {
    match block.get("type").and_then(Value::as_str) {
        Some("text") => block.get("text").and_then(Value::as_str).map(|text| json!({"type": "text", "text": text})),
        Some("image") => {
            image_url(block.get("source")?).map(|url| json!({"type": "image_url", "image_url": {"url": url}}))
        }
        Some("document") => {
            let source = block.get("source")?;
            (source.get("type").and_then(Value::as_str) == Some("text"))
                .then(|| source.get("data").and_then(Value::as_str))
                .flatten()
                .map(|text| json!({"type": "text", "text": text}))
        }
        _ => None,
    }
}

/// An image source as a URL: `base64` as a `data:` URL, `url` as it is.
fn image_url(source: &Value) -> Option<String> {
    match source.get("type").and_then(Value::as_str)? {
        "base64" => {
            let media = source.get("media_type").and_then(Value::as_str).unwrap_or("image/png");
            let data = source.get("data").and_then(Value::as_str)?;
            Some(format!("data:{media};base64,{data}"))
        }
        "url" => source.get("url").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

/// A `tool_result`'s content as text: a string, or its text blocks joined by a newline (an
/// image in a result is named, not sent: chat `tool` messages carry text).
fn result_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .filter_map(|block| match block.get("type").and_then(Value::as_str) {
                Some("image") => Some("[image]"),
                _ => block_text(block),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        None | Some(Value::Null) => String::new(),
        Some(other) => other.to_string(),
    }
}

#[cfg(test)]
mod tests;
