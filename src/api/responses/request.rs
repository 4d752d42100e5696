//! A Responses API request (`POST /v1/responses`) as the chat completion the backend serves:
//! pure functions from the client's JSON to the chat body, the tools' kinds (to give each call
//! back in its own item type) and what the answer echoes.
//!
//! What is translated: `input` (a string, or items: messages with text, image and output
//! parts; `function_call`, `custom_tool_call`, `local_shell_call` and their outputs;
//! `reasoning` items), `instructions`, `tools` (functions; `custom` tools and `local_shell` as
//! functions; hosted tools dropped), `tool_choice`, `parallel_tool_calls`,
//! `max_output_tokens`, `temperature`, `top_p`, `stream`, `text.format` (as `response_format`).
//! What is refused: server-side state (`store: true`, `previous_response_id`, `conversation`):
//! mlxgate keeps no responses; an `input` with no item a chat backend can use. Any other field
//! is ignored, never refused (Codex sends `include`, `reasoning`, `text.verbosity`,
//! `client_metadata`, …).
//!
//! System text: Qwen's chat templates take the first message's system text into their tools
//! header, and some (Qwen3.5's) raise on a system message that is not first. So
//! `instructions` and the `system`/`developer` messages before the conversation's first other
//! item become one leading system message; a `system`/`developer` message later in the
//! conversation (Codex adds some between turns) becomes a user message in its place, which
//! every template renders and which leaves the prompt's prefix — the backend's prompt cache —
//! as it was.
//!
//! Reasoning passed back: a `reasoning` item's text becomes the `reasoning_content` of the
//! assistant message that follows it. Qwen3's templates render it inside `<think>` for the
//! assistant messages after the last user query (the tool loop in progress, as the model
//! generated it) and drop it for earlier turns; templates without reasoning ignore the field.

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use crate::api::openai::RawBody;
use crate::error::GatewayError;

/// How a chat function the backend calls is given back to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolKind {
    /// A `function` tool: a `function_call` item.
    Function,
    /// A `custom` tool (free-form input, e.g. Codex's `apply_patch`), sent to the backend as a
    /// function with one string parameter `input`: a `custom_tool_call` item with that input.
    Custom,
    /// The `local_shell` tool, sent as a function with `command`, `workdir`, `timeout_ms`: a
    /// `local_shell_call` item.
    LocalShell,
}

/// The one string parameter a custom tool becomes.
pub const CUSTOM_INPUT: &str = "input";

/// The name the `local_shell` tool has as a function.
pub const LOCAL_SHELL: &str = "local_shell";

/// What the answer's translation needs from the request.
#[derive(Debug, Clone)]
pub struct Shape {
    /// The model as the client named it (every event and object carries it).
    pub model: String,
    /// Each function the backend may call: how its calls go back to the client.
    pub tools: HashMap<String, ToolKind>,
    /// The namespace of each function that came from a `namespace` tool.
    pub namespaces: HashMap<String, String>,
    /// Request fields the response object repeats.
    pub echo: Echo,
}

impl Shape {
    /// The kind of the function `name` (a function the request did not declare: a function).
    pub fn kind_of(&self, name: &str) -> ToolKind {
        self.tools.get(name).copied().unwrap_or(ToolKind::Function)
    }
}

/// Request fields the response object repeats, as OpenAI's does.
#[derive(Debug, Clone, Default)]
pub struct Echo {
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub temperature: Option<Value>,
    pub top_p: Option<Value>,
    pub max_output_tokens: Option<Value>,
    pub prompt_cache_key: Option<String>,
}

/// A Responses request translated.
#[derive(Debug)]
pub struct Translated {
    /// The chat completion request.
    pub fields: RawBody,
    /// The conversation's key (`prompt_cache_key`; Codex sends its session id), kept for routing.
    pub session: Option<String>,
    pub shape: Shape,
}

/// Translates a Responses request body into a chat completion request.
pub fn translate(body: &[u8]) -> Result<Translated, GatewayError> {
    let request: Map<String, Value> = serde_json::from_slice(body)
        .map_err(|e| GatewayError::invalid(format!("The request body is not a JSON object: {e}."), None))?;
    refuse_state(&request)?;
    let Tools { chat: tools, kinds, namespaces } = tools(request.get("tools"));
    let messages = messages(request.get("instructions"), request.get("input"))?;
    let stream = request.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let mut chat = Map::new();
    if let Some(model) = request.get("model") {
        chat.insert("model".into(), model.clone());
    }
    chat.insert("messages".into(), Value::Array(messages));
    if !tools.is_empty() {
        chat.insert("tools".into(), Value::Array(tools));
        if let Some(choice) = request.get("tool_choice").and_then(|c| tool_choice(c, &kinds)) {
            chat.insert("tool_choice".into(), choice);
        }
        if let Some(parallel) = request.get("parallel_tool_calls").filter(|v| v.is_boolean()) {
            chat.insert("parallel_tool_calls".into(), parallel.clone());
        }
    }
    for (from, to) in [("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p")] {
        if let Some(value) = request.get(from).filter(|v| v.is_number()) {
            chat.insert(to.into(), value.clone());
        }
    }
    if let Some(format) = request.get("text").and_then(|t| t.get("format")).and_then(response_format) {
        chat.insert("response_format".into(), format);
    }
    chat.insert("stream".into(), Value::Bool(stream));
    if stream {
        // The face's answer needs the usage: `response.completed` carries it.
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }
    let session = request.get("prompt_cache_key").and_then(Value::as_str).map(str::to_string);
    let echo = Echo {
        tool_choice: request.get("tool_choice").cloned(),
        parallel_tool_calls: request.get("parallel_tool_calls").and_then(Value::as_bool),
        temperature: request.get("temperature").filter(|v| v.is_number()).cloned(),
        top_p: request.get("top_p").filter(|v| v.is_number()).cloned(),
        max_output_tokens: request.get("max_output_tokens").filter(|v| v.is_number()).cloned(),
        prompt_cache_key: session.clone(),
    };
    let model = request.get("model").and_then(Value::as_str).unwrap_or_default().to_string();
    let fields = chat
        .into_iter()
        .map(|(key, value)| {
            serde_json::value::to_raw_value(&value)
                .map(|raw| (key, raw))
                .map_err(|e| GatewayError::invalid(format!("cannot encode the chat request: {e}"), None))
        })
        .collect::<Result<RawBody, _>>()?;
    Ok(Translated { fields, session, shape: Shape { model, tools: kinds, namespaces, echo } })
}

/// Server-side state mlxgate does not keep: a clear 400 rather than an answer that silently
/// forgot the conversation.
fn refuse_state(request: &Map<String, Value>) -> Result<(), GatewayError> {
    const STATELESS: &str = "mlxgate serves only stateless Responses requests: send `store: false` (or no \
                             `store`) and the whole conversation in `input` each turn, as Codex does.";
    if request.get("store").and_then(Value::as_bool) == Some(true) {
        return Err(GatewayError::invalid(format!("`store: true` is not supported. {STATELESS}"), Some("store")));
    }
    if request.get("previous_response_id").is_some_and(|v| !v.is_null()) {
        let message = format!("`previous_response_id` is not supported: no response is stored. {STATELESS}");
        return Err(GatewayError::invalid(message, Some("previous_response_id")));
    }
    if request.get("conversation").is_some_and(|v| !v.is_null()) {
        let message = format!("`conversation` is not supported: no conversation is stored. {STATELESS}");
        return Err(GatewayError::invalid(message, Some("conversation")));
    }
    Ok(())
}

/// The chat tools and each function's kind. Functions stay functions; a `custom` tool becomes
/// a function with one string parameter (its grammar, if any, told in the description);
/// `local_shell` a function with its exec parameters. Hosted tools (`web_search`,
/// `file_search`, `image_generation`, `mcp`, …) have nothing to run them here: dropped.
fn tools(tools: Option<&Value>) -> Tools {
    let mut chat = Vec::new();
    let mut kinds = HashMap::new();
    let mut namespaces = HashMap::new();
    // A `namespace`'s tools (Codex's `multi_agent_v1`) are offered as the others are; their
    // calls go back naming the namespace.
    let listed = tools.and_then(Value::as_array).into_iter().flatten().flat_map(|tool| {
        let inner = tool.get("tools").and_then(Value::as_array).filter(|_| tool["type"] == "namespace");
        let namespace = tool.get("name").and_then(Value::as_str);
        match inner {
            Some(inner) => inner.iter().map(|t| (t, namespace)).collect::<Vec<_>>(),
            None => vec![(tool, None)],
        }
    });
    for (tool, namespace) in listed {
        let name = tool.get("name").and_then(Value::as_str);
        let description = tool.get("description").and_then(Value::as_str).unwrap_or_default();
        let (name, kind, description, parameters) = match (tool.get("type").and_then(Value::as_str), name) {
            (Some("function"), Some(name)) => {
                let parameters =
                    tool.get("parameters").filter(|p| p.is_object()).cloned().unwrap_or_else(empty_parameters);
                (name, ToolKind::Function, description.to_string(), parameters)
            }
            (Some("custom"), Some(name)) => {
                let mut description = description.to_string();
                let format = tool.get("format");
                if let Some(definition) = format.and_then(|f| f.get("definition")).and_then(Value::as_str) {
                    let syntax = format.and_then(|f| f.get("syntax")).and_then(Value::as_str).unwrap_or("grammar");
                    description
                        .push_str(&format!("\n\nThe `{CUSTOM_INPUT}` follows this {syntax} grammar:\n{definition}"));
                }
                let parameters = json!({
                    "type": "object",
                    "properties": {CUSTOM_INPUT: {"type": "string", "description": "The tool's whole input, as free-form text."}},
                    "required": [CUSTOM_INPUT],
                    "additionalProperties": false,
                });
                (name, ToolKind::Custom, description, parameters)
            }
            (Some("local_shell"), _) => {
                let parameters = json!({
                    "type": "object",
                    "properties": {
                        "command": {"type": "array", "items": {"type": "string"}, "description": "The command and its arguments."},
                        "workdir": {"type": "string", "description": "The working directory."},
                        "timeout_ms": {"type": "integer", "description": "The longest the command may run, in milliseconds."},
                    },
                    "required": ["command"],
                    "additionalProperties": false,
                });
                (
                    LOCAL_SHELL,
                    ToolKind::LocalShell,
                    "Runs a shell command on the user's machine.".to_string(),
                    parameters,
                )
            }
            _ => continue,
        };
        let mut function = Map::new();
        function.insert("name".into(), Value::from(name));
        if !description.is_empty() {
            function.insert("description".into(), Value::from(description));
        }
        function.insert("parameters".into(), parameters);
        chat.push(json!({"type": "function", "function": function}));
        kinds.insert(name.to_string(), kind);
        match namespace {
            Some(namespace) => namespaces.insert(name.to_string(), namespace.to_string()),
            None => namespaces.remove(name),
        };
    }
    Tools { chat, kinds, namespaces }
}

/// The chat tools of a request, and how their calls go back.
struct Tools {
    chat: Vec<Value>,
    kinds: HashMap<String, ToolKind>,
    /// The namespace of each function that came from one.
    namespaces: HashMap<String, String>,
}

fn empty_parameters() -> Value {
    json!({"type": "object", "properties": {}})
}

/// `tool_choice` for the chat request: the modes as they are, a named function or custom
/// tool as the function; a choice of a dropped (hosted) tool or an allowed-tools list leaves
/// the backend's default (`None`).
fn tool_choice(choice: &Value, kinds: &HashMap<String, ToolKind>) -> Option<Value> {
    if let Some(mode) = choice.as_str() {
        return matches!(mode, "auto" | "none" | "required").then(|| Value::from(mode));
    }
    let name = match choice.get("type").and_then(Value::as_str)? {
        "function" | "custom" => choice.get("name").and_then(Value::as_str)?,
        "local_shell" => LOCAL_SHELL,
        _ => return None,
    };
    kinds.contains_key(name).then(|| json!({"type": "function", "function": {"name": name}}))
}

/// Structured output: the Responses `text.format` as the chat `response_format` (`json_schema`
/// with its name, schema, strict and description under `json_schema`; `json_object` as is).
/// `text` (the default) and anything unknown: none.
fn response_format(format: &Value) -> Option<Value> {
    match format.get("type").and_then(Value::as_str)? {
        "json_schema" => {
            let mut schema = Map::new();
            for key in ["name", "schema", "strict", "description"] {
                if let Some(value) = format.get(key).filter(|v| !v.is_null()) {
                    schema.insert(key.into(), value.clone());
                }
            }
            Some(json!({"type": "json_schema", "json_schema": schema}))
        }
        "json_object" => Some(json!({"type": "json_object"})),
        _ => None,
    }
}

/// A history call's `arguments` as valid JSON text. mlx_lm.server parses every history call's
/// arguments (`json.loads`) and answers 404 on text that is not JSON, which a call cut by
/// `max_output_tokens` and sent back as it was (`{"cmd": "ec`) is: such text goes to the
/// backend as a JSON string (the template shows it as written), an empty one as `{}`.
fn json_arguments(text: &str) -> String {
    if text.trim().is_empty() {
        return "{}".to_string();
    }
    match serde_json::from_str::<serde::de::IgnoredAny>(text) {
        Ok(_) => text.to_string(),
        Err(_) => Value::from(text).to_string(),
    }
}

/// The chat messages of `instructions` and `input`. An input with no item a chat backend can
/// use (none, `[]`, only references to stored items or unknown items) is refused: the backend
/// would get an empty conversation (mlx_lm.server answers 404 on it).
fn messages(instructions: Option<&Value>, input: Option<&Value>) -> Result<Vec<Value>, GatewayError> {
    let mut conversation = Conversation::default();
    if let Some(text) = instructions.and_then(Value::as_str).filter(|t| !t.is_empty()) {
        conversation.system.push(text.to_string());
    }
    // The system texts that did not come from `input`.
    let from_input = conversation.system.len();
    match input {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => conversation.push(json!({"role": "user", "content": text})),
        Some(Value::Array(items)) => {
            for item in items {
                conversation.item(item)?;
            }
        }
        Some(_) => return Err(GatewayError::invalid("`input` must be a string or an array of items", Some("input"))),
    }
    let nothing_from_input = conversation.messages.is_empty() && conversation.system.len() == from_input;
    let messages = conversation.into_messages();
    if nothing_from_input || messages.is_empty() {
        let message = "`input` has no item mlxgate can send to the model: give a string, or messages and tool \
                       items (references to stored items are not supported: mlxgate stores none).";
        return Err(GatewayError::invalid(message, Some("input")));
    }
    Ok(messages)
}

/// The chat conversation being built from the items, in order.
#[derive(Default)]
struct Conversation {
    /// The leading system text (instructions, then the system/developer messages before any
    /// other item).
    system: Vec<String>,
    messages: Vec<Value>,
    /// A reasoning item's text, for the next assistant message.
    reasoning: Option<String>,
}

impl Conversation {
    fn item(&mut self, item: &Value) -> Result<(), GatewayError> {
        let kind = item.get("type").and_then(Value::as_str);
        // An "easy" message has a role and no type.
        let kind = kind.or_else(|| item.get("role").map(|_| "message"));
        match kind {
            Some("message") => self.message(item),
            Some("function_call") => {
                let name = item.get("name").and_then(Value::as_str).unwrap_or_default();
                let arguments = match item.get("arguments") {
                    Some(Value::String(text)) => json_arguments(text),
                    Some(other) if !other.is_null() => other.to_string(),
                    _ => "{}".to_string(),
                };
                self.call(call_id(item), name, arguments);
            }
            Some("custom_tool_call") => {
                let name = item.get("name").and_then(Value::as_str).unwrap_or_default();
                let input = item.get("input").and_then(Value::as_str).unwrap_or_default();
                self.call(call_id(item), name, json!({CUSTOM_INPUT: input}).to_string());
            }
            Some("local_shell_call") => {
                let action = item.get("action").cloned().unwrap_or(Value::Null);
                let mut arguments = Map::new();
                arguments.insert("command".into(), action.get("command").cloned().unwrap_or_else(|| json!([])));
                if let Some(dir) = action.get("working_directory").filter(|v| v.is_string()) {
                    arguments.insert("workdir".into(), dir.clone());
                }
                if let Some(timeout) = action.get("timeout_ms").filter(|v| v.is_number()) {
                    arguments.insert("timeout_ms".into(), timeout.clone());
                }
                self.call(call_id(item), LOCAL_SHELL, Value::Object(arguments).to_string());
            }
            Some("function_call_output" | "custom_tool_call_output" | "local_shell_call_output") => {
                let content = output_text(item.get("output"));
                self.push(json!({"role": "tool", "tool_call_id": call_id(item), "content": content}));
            }
            Some("reasoning") => {
                let text = reasoning_text(item);
                if !text.is_empty() {
                    let joined = match self.reasoning.take() {
                        Some(before) => format!("{before}\n\n{text}"),
                        None => text,
                    };
                    self.reasoning = Some(joined);
                }
            }
            // References to stored items, hosted tools' calls, compaction summaries: nothing a
            // stateless chat backend can use.
            _ => {}
        }
        Ok(())
    }

    fn message(&mut self, item: &Value) {
        let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
        let content = item.get("content");
        match role {
            "system" | "developer" => {
                let text = text_of(content);
                if self.messages.is_empty() {
                    self.system.push(text);
                } else {
                    self.push(json!({"role": "user", "content": text}));
                }
            }
            "assistant" => {
                let mut message = json!({"role": "assistant", "content": text_of(content)});
                if let Some(reasoning) = self.reasoning.take() {
                    message["reasoning_content"] = Value::from(reasoning);
                }
                self.messages.push(message);
            }
            _ => self.push(json!({"role": "user", "content": user_content(content)})),
        }
    }

    /// A tool call: added to the assistant message just before it (consecutive calls, or a
    /// text and its calls, are one assistant turn), else a new assistant message.
    fn call(&mut self, id: String, name: &str, arguments: String) {
        let call = json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}});
        let reasoning = self.reasoning.take();
        if reasoning.is_none()
            && let Some(last) = self.messages.last_mut().filter(|m| m["role"] == "assistant")
        {
            match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                Some(calls) => calls.push(call),
                None => last["tool_calls"] = json!([call]),
            }
            return;
        }
        // Qwen's templates read `content` as a string: an empty one, never null.
        let mut message = json!({"role": "assistant", "content": "", "tool_calls": [call]});
        if let Some(reasoning) = reasoning {
            message["reasoning_content"] = Value::from(reasoning);
        }
        self.messages.push(message);
    }

    /// A user or tool message: a reasoning item not followed by its assistant message is
    /// dropped.
    fn push(&mut self, message: Value) {
        self.reasoning = None;
        self.messages.push(message);
    }

    fn into_messages(self) -> Vec<Value> {
        let mut messages = Vec::with_capacity(self.messages.len() + 1);
        let system: Vec<String> = self.system.into_iter().filter(|t| !t.is_empty()).collect();
        if !system.is_empty() {
            messages.push(json!({"role": "system", "content": system.join("\n\n")}));
        }
        messages.extend(self.messages);
        messages
    }
}

/// An item's `call_id` (a `local_shell_call_output` of older clients names it `id`).
fn call_id(item: &Value) -> String {
    item.get("call_id").or_else(|| item.get("id")).and_then(Value::as_str).unwrap_or_default().to_string()
}

/// The text of a content: a string, or its text parts joined (images and files dropped).
fn text_of(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts.iter().filter_map(part_text).collect::<Vec<_>>().join(""),
        _ => String::new(),
    }
}

/// A text part's text: `input_text`, `output_text`, a refusal, a chat-style `text` part.
fn part_text(part: &Value) -> Option<&str> {
    match part.get("type").and_then(Value::as_str) {
        Some("input_text" | "output_text" | "text" | "summary_text" | "reasoning_text") => {
            part.get("text").and_then(Value::as_str)
        }
        Some("refusal") => part.get("refusal").and_then(Value::as_str),
        _ => None,
    }
}

/// A user message's content: a string when it is all text (Qwen's templates read strings),
/// else chat parts (text and `image_url`; files and stored images dropped).
fn user_content(content: Option<&Value>) -> Value {
    let Some(Value::Array(parts)) = content else { return Value::from(text_of(content)) };
    let has_image = parts.iter().any(|p| p.get("type").and_then(Value::as_str) == Some("input_image"));
    if !has_image {
        return Value::from(text_of(content));
    }
    let chat: Vec<Value> = parts
        .iter()
        .filter_map(|part| match part.get("type").and_then(Value::as_str) {
            Some("input_image") => {
                let url = part.get("image_url").and_then(Value::as_str)?;
                let mut image = json!({"url": url});
                if let Some(detail) = part.get("detail").filter(|d| d.is_string()) {
                    image["detail"] = detail.clone();
                }
                Some(json!({"type": "image_url", "image_url": image}))
            }
            _ => part_text(part).map(|text| json!({"type": "text", "text": text})),
        })
        .collect();
    Value::Array(chat)
}

/// A tool output's text: a string, the text parts of an array, or the older `{content}` form.
fn output_text(output: Option<&Value>) -> String {
    match output {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts.iter().filter_map(part_text).collect::<Vec<_>>().join("\n"),
        Some(Value::Object(object)) => match object.get("content") {
            Some(Value::String(text)) => text.clone(),
            _ => Value::Object(object.clone()).to_string(),
        },
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

/// A reasoning item's text: its `reasoning_text` content, else its summary.
fn reasoning_text(item: &Value) -> String {
    let of = |key: &str| -> String {
        item.get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(part_text)
            .collect::<Vec<_>>()
            .join("\n")
    };
    let content = of("content");
    if content.is_empty() { of("summary") } else { content }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(request: Value) -> (Map<String, Value>, Translated) {
        let translated = translate(request.to_string().as_bytes()).expect("translated");
        let fields = serde_json::to_value(&translated.fields).expect("encode");
        let Value::Object(fields) = fields else { panic!("not an object") };
        (fields, translated)
    }

    fn refused(request: Value) -> GatewayError {
        translate(request.to_string().as_bytes()).expect_err("refused")
    }

    #[test]
    fn a_string_input_with_instructions_and_the_sampling_fields() {
        let (fields, translated) = chat(json!({
            "model": "qwen", "instructions": "Be brief.", "input": "Hello",
            "max_output_tokens": 64, "temperature": 0.2, "top_p": 0.9, "stream": true,
            // Fields a chat backend has no use for: ignored, never refused.
            "store": false, "include": ["reasoning.encrypted_content"], "reasoning": {"summary": "auto"},
            "text": {"verbosity": "low"}, "client_metadata": {"a": 1}, "metadata": {"b": "c"},
            "truncation": "auto", "user": "u", "service_tier": "auto", "prompt_cache_key": "session-1",
        }));
        assert_eq!(
            Value::Object(fields),
            json!({
                "model": "qwen",
                "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
                "max_tokens": 64, "temperature": 0.2, "top_p": 0.9,
                "stream": true, "stream_options": {"include_usage": true},
            })
        );
        assert_eq!(translated.session.as_deref(), Some("session-1"));
        assert_eq!(translated.shape.model, "qwen");
        assert_eq!(translated.shape.echo.max_output_tokens, Some(json!(64)));
        // Not streamed: no stream_options, no limit (the pipeline adds the model's default).
        let (fields, translated) = chat(json!({"model": "qwen", "input": "Hi"}));
        assert_eq!(fields["stream"], false);
        assert!(!fields.contains_key("stream_options") && !fields.contains_key("max_tokens"));
        assert_eq!(translated.session, None);
    }

    #[test]
    fn server_side_state_is_refused_with_a_clear_400() {
        for (request, param) in [
            (json!({"model": "qwen", "input": "x", "store": true}), "store"),
            (json!({"model": "qwen", "input": "x", "previous_response_id": "resp_1"}), "previous_response_id"),
            (json!({"model": "qwen", "input": "x", "conversation": "conv_1"}), "conversation"),
        ] {
            let e = refused(request);
            assert_eq!(e.status(), axum::http::StatusCode::BAD_REQUEST);
            let body = e.body();
            assert_eq!(body["error"]["param"], param);
            assert_eq!(body["error"]["type"], "invalid_request_error");
            let message = body["error"]["message"].as_str().expect("message");
            assert!(message.contains("only stateless"), "{message}");
        }
        // `store: false`, a null previous_response_id, no store at all: served.
        chat(json!({"model": "qwen", "input": "x", "store": false, "previous_response_id": null}));
        assert_eq!(refused(json!([1])).status(), axum::http::StatusCode::BAD_REQUEST);
        assert_eq!(refused(json!({"model": "qwen", "input": 3})).body()["error"]["param"], "input");
    }

    #[test]
    fn text_format_is_the_chat_response_format() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        let (fields, _) = chat(json!({"model": "qwen", "input": "x", "text": {"verbosity": "low", "format":
            {"type": "json_schema", "name": "Out", "schema": schema, "strict": true, "description": "d"}}}));
        assert_eq!(
            fields["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "Out", "schema": schema, "strict": true, "description": "d"}})
        );
        let (fields, _) = chat(json!({"model": "qwen", "input": "x", "text": {"format": {"type": "json_schema",
            "name": "Out", "schema": schema, "strict": null}}}));
        assert_eq!(fields["response_format"]["json_schema"], json!({"name": "Out", "schema": schema}));
        let (fields, _) = chat(json!({"model": "qwen", "input": "x", "text": {"format": {"type": "json_object"}}}));
        assert_eq!(fields["response_format"], json!({"type": "json_object"}));
        for text in [json!({"format": {"type": "text"}}), json!({"verbosity": "low"}), json!(null)] {
            let (fields, _) = chat(json!({"model": "qwen", "input": "x", "text": text}));
            assert!(!fields.contains_key("response_format"), "{text}");
        }
    }

    #[test]
    fn an_input_with_nothing_to_send_is_a_400_on_input() {
        for request in [
            json!({"model": "qwen", "input": []}),
            json!({"model": "qwen", "instructions": "Be brief.", "input": null}),
            json!({"model": "qwen", "instructions": "Be brief."}),
            json!({"model": "qwen", "input": [{"type": "item_reference", "id": "msg_1"},
                                              {"type": "web_search_call", "id": "ws_1"}]}),
            json!({"model": "qwen", "input": [{"role": "developer", "content": ""}]}),
        ] {
            let e = refused(request.clone());
            assert_eq!(e.status(), axum::http::StatusCode::BAD_REQUEST, "{request}");
            assert_eq!(e.body()["error"]["param"], "input", "{request}");
        }
        // A developer message alone is something to send: the system message.
        let (fields, _) = chat(json!({"model": "qwen", "input": [{"role": "developer", "content": "d"}]}));
        assert_eq!(fields["messages"], json!([{"role": "system", "content": "d"}]));
    }

    #[test]
    fn history_arguments_that_are_not_json_become_json() {
        let (fields, _) = chat(json!({"model": "qwen", "input": [
            {"role": "user", "content": "go"},
            {"type": "function_call", "call_id": "a", "name": "shell", "arguments": "{\"cmd\": \"ec"},
            {"type": "function_call", "call_id": "b", "name": "shell", "arguments": ""},
            {"type": "function_call", "call_id": "c", "name": "shell", "arguments": "{\"cmd\": \"ls\"}"},
        ]}));
        let calls = fields["messages"][1]["tool_calls"].as_array().expect("calls");
        let arguments: Vec<&Value> = calls.iter().map(|c| &c["function"]["arguments"]).collect();
        assert_eq!(arguments, [&json!("\"{\\\"cmd\\\": \\\"ec\""), &json!("{}"), &json!("{\"cmd\": \"ls\"}")]);
    }

    /// A Codex turn as it sends it: instructions, a developer message, the user's context and
    /// prompt, then its tool loop (reasoning, parallel calls, their outputs, a custom tool),
    /// and a developer message added later.
    #[test]
    fn a_codex_conversation_becomes_chat_messages() {
        let (fields, _) = chat(json!({
            "model": "qwen", "instructions": "You are Codex.", "store": false, "stream": true,
            "input": [
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions>"}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context>"}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "summary"}],
                 "content": [{"type": "reasoning_text", "text": "I should run ls."}], "encrypted_content": null},
                {"type": "function_call", "name": "shell", "arguments": "{\"command\":[\"ls\"]}", "call_id": "call_1"},
                {"type": "function_call", "name": "shell", "arguments": "{\"command\":[\"pwd\"]}", "call_id": "call_2"},
                {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
                {"type": "function_call_output", "call_id": "call_2",
                 "output": [{"type": "input_text", "text": "/tmp"}, {"type": "input_image", "image_url": "data:"}]},
                {"type": "custom_tool_call", "call_id": "call_3", "name": "apply_patch", "input": "*** Begin Patch"},
                {"type": "custom_tool_call_output", "call_id": "call_3", "output": "Done!"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a.txt in /tmp"}]},
                {"type": "message", "role": "developer", "content": "<model switched>"},
                {"role": "user", "content": "thanks"},
                {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search"}},
                {"type": "item_reference", "id": "msg_1"},
            ],
        }));
        let call = |id: &str, name: &str, arguments: &str| json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}});
        assert_eq!(
            fields["messages"],
            json!([
                {"role": "system", "content": "You are Codex.\n\n<permissions>"},
                {"role": "user", "content": "<environment_context>"},
                {"role": "user", "content": "list the files"},
                {"role": "assistant", "content": "", "reasoning_content": "I should run ls.", "tool_calls": [
                    call("call_1", "shell", "{\"command\":[\"ls\"]}"),
                    call("call_2", "shell", "{\"command\":[\"pwd\"]}"),
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
                {"role": "tool", "tool_call_id": "call_2", "content": "/tmp"},
                {"role": "assistant", "content": "", "tool_calls": [
                    call("call_3", "apply_patch", "{\"input\":\"*** Begin Patch\"}"),
                ]},
                {"role": "tool", "tool_call_id": "call_3", "content": "Done!"},
                {"role": "assistant", "content": "a.txt in /tmp"},
                {"role": "user", "content": "<model switched>"},
                {"role": "user", "content": "thanks"},
            ])
        );
    }

    #[test]
    fn a_text_and_its_calls_are_one_assistant_turn_and_reasoning_without_one_is_dropped() {
        let (fields, _) = chat(json!({"model": "qwen", "input": [
            {"role": "user", "content": "go"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "only a summary"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Running it."}]},
            {"type": "function_call", "name": "shell", "arguments": "{}", "call_id": "c1"},
            {"type": "local_shell_call", "call_id": "c2", "status": "completed",
             "action": {"type": "exec", "command": ["ls"], "working_directory": "/w", "timeout_ms": 5}},
            {"type": "local_shell_call_output", "id": "c2", "output": "x"},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "lost"}]},
            {"role": "user", "content": "next"},
        ]}));
        let messages = fields["messages"].as_array().expect("messages");
        assert_eq!(messages.len(), 4);
        assert_eq!(messages[1]["content"], "Running it.");
        assert_eq!(messages[1]["reasoning_content"], "only a summary");
        let calls = messages[1]["tool_calls"].as_array().expect("calls");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1]["function"]["name"], LOCAL_SHELL);
        let arguments: Value =
            serde_json::from_str(calls[1]["function"]["arguments"].as_str().expect("string")).expect("json");
        assert_eq!(arguments, json!({"command": ["ls"], "workdir": "/w", "timeout_ms": 5}));
        assert_eq!(messages[2], json!({"role": "tool", "tool_call_id": "c2", "content": "x"}));
        assert_eq!(messages[3], json!({"role": "user", "content": "next"}));
    }

    #[test]
    fn user_images_stay_parts_and_text_parts_are_joined() {
        let (fields, _) = chat(json!({"model": "qwen", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"role": "user", "content": [{"type": "input_text", "text": "see"},
                                         {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "low"},
                                         {"type": "input_image", "file_id": "file_1"},
                                         {"type": "input_file", "file_id": "file_2"}]},
        ]}));
        assert_eq!(fields["messages"][0]["content"], "ab");
        assert_eq!(
            fields["messages"][1]["content"],
            json!([{"type": "text", "text": "see"},
                   {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA", "detail": "low"}}])
        );
    }

    #[test]
    fn tools_map_to_functions_where_they_can_and_are_dropped_otherwise() {
        let (fields, translated) = chat(json!({"model": "qwen", "input": "x", "parallel_tool_calls": false,
        "tool_choice": {"type": "custom", "name": "apply_patch"},
        "tools": [
            {"type": "function", "name": "shell", "description": "Runs a command.", "strict": false,
             "parameters": {"type": "object", "properties": {"command": {"type": "array"}}}},
            {"type": "function", "name": "no_parameters"},
            {"type": "custom", "name": "apply_patch", "description": "Edits files.",
             "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch"}},
            {"type": "local_shell"},
            {"type": "web_search", "external_web_access": false},
            {"type": "image_generation", "output_format": "png"},
            {"type": "namespace", "name": "multi_agent_v1", "description": "d", "tools": [
                {"type": "function", "name": "close_agent", "parameters": {"type": "object", "properties": {}}}]},
            {"type": "file_search", "vector_store_ids": []},
        ]}));
        let tools = fields["tools"].as_array().expect("tools");
        let names: Vec<&Value> = tools.iter().map(|t| &t["function"]["name"]).collect();
        assert_eq!(
            names,
            [
                &json!("shell"),
                &json!("no_parameters"),
                &json!("apply_patch"),
                &json!("local_shell"),
                &json!("close_agent")
            ]
        );
        assert!(tools.iter().all(|t| t["type"] == "function"));
        assert_eq!(tools[0]["function"]["parameters"]["properties"]["command"]["type"], "array");
        assert_eq!(tools[1]["function"]["parameters"], json!({"type": "object", "properties": {}}));
        let patch = &tools[2]["function"];
        assert_eq!(patch["parameters"]["required"], json!([CUSTOM_INPUT]));
        let description = patch["description"].as_str().expect("description");
        assert!(description.starts_with("Edits files.") && description.contains("lark grammar:\nstart: begin_patch"));
        assert_eq!(fields["tool_choice"], json!({"type": "function", "function": {"name": "apply_patch"}}));
        assert_eq!(fields["parallel_tool_calls"], false);
        let shape = &translated.shape;
        assert_eq!(shape.kind_of("shell"), ToolKind::Function);
        assert_eq!(shape.kind_of("apply_patch"), ToolKind::Custom);
        assert_eq!(shape.kind_of("local_shell"), ToolKind::LocalShell);
        assert_eq!(shape.kind_of("unknown"), ToolKind::Function);
        assert_eq!(shape.echo.parallel_tool_calls, Some(false));
        assert_eq!(shape.namespaces.get("close_agent").map(String::as_str), Some("multi_agent_v1"));
        assert_eq!(shape.namespaces.get("shell"), None);

        // Only hosted tools: no tools, no choice, no parallel flag for the backend.
        let (fields, _) = chat(json!({"model": "qwen", "input": "x", "tool_choice": "required",
            "parallel_tool_calls": true, "tools": [{"type": "web_search"}]}));
        assert!(!fields.contains_key("tools") && !fields.contains_key("tool_choice"));
        assert!(!fields.contains_key("parallel_tool_calls"));
    }

    #[test]
    fn tool_choice_modes_and_names() {
        let kinds =
            HashMap::from([("f".to_string(), ToolKind::Function), (LOCAL_SHELL.to_string(), ToolKind::LocalShell)]);
        assert_eq!(tool_choice(&json!("auto"), &kinds), Some(json!("auto")));
        assert_eq!(tool_choice(&json!("required"), &kinds), Some(json!("required")));
        assert_eq!(tool_choice(&json!("none"), &kinds), Some(json!("none")));
        assert_eq!(
            tool_choice(&json!({"type": "function", "name": "f"}), &kinds),
            Some(json!({"type": "function", "function": {"name": "f"}}))
        );
        assert_eq!(
            tool_choice(&json!({"type": "local_shell"}), &kinds),
            Some(json!({"type": "function", "function": {"name": "local_shell"}}))
        );
        // A dropped tool, a hosted tool, an allowed-tools list: the backend's default.
        assert_eq!(tool_choice(&json!({"type": "function", "name": "gone"}), &kinds), None);
        assert_eq!(tool_choice(&json!({"type": "web_search_preview"}), &kinds), None);
        assert_eq!(tool_choice(&json!({"type": "allowed_tools", "mode": "auto", "tools": []}), &kinds), None);
    }
}

#[cfg(test)]
mod recorded {
    use super::*;

    /// Codex CLI 0.171's first request, as it sent it (tests/data/agents).
    #[test]
    fn codex_s_recorded_request_translates() {
        let body = include_str!("../../../tests/data/agents/codex-responses.json");
        let translated = translate(body.as_bytes()).expect("translated");
        assert_eq!(translated.session.as_deref(), Some("00000000-0000-7000-8000-000000000005"));
        let fields = serde_json::to_value(&translated.fields).expect("encode");
        let messages = fields["messages"].as_array().expect("messages");
        let roles: Vec<&str> = messages.iter().filter_map(|m| m["role"].as_str()).collect();
        // Its two developer messages are the one system message; its context and prompt follow.
        assert_eq!(roles, ["system", "user", "user"]);
        assert!(messages[0]["content"].as_str().is_some_and(|t| t.contains("<skills_instructions>")));
        assert_eq!(messages[2]["content"], "Run the shell command: echo hi");
        let tools = fields["tools"].as_array().expect("tools");
        let names: Vec<&str> = tools.iter().filter_map(|t| t["function"]["name"].as_str()).collect();
        assert!(names.contains(&"exec_command") && names.contains(&"close_agent"), "{names:?}");
        // web_search has nothing to run it here.
        assert!(!names.contains(&"web_search"));
        assert_eq!(fields["tool_choice"], "auto");
        assert_eq!(fields["stream_options"], json!({"include_usage": true}));
        for dropped in ["include", "reasoning", "store", "client_metadata", "prompt_cache_key", "input"] {
            assert!(fields.get(dropped).is_none(), "{dropped} reached the backend");
        }
    }

    /// Its second request: the call it made and the call's output, sent back.
    #[test]
    fn codex_s_recorded_second_turn_translates_into_a_tool_call_and_a_tool_message() {
        let body = include_str!("../../../tests/data/agents/codex-responses-turn2.json");
        let translated = translate(body.as_bytes()).expect("translated");
        let fields = serde_json::to_value(&translated.fields).expect("encode");
        let messages = fields["messages"].as_array().expect("messages");
        let roles: Vec<&str> = messages.iter().filter_map(|m| m["role"].as_str()).collect();
        assert_eq!(roles, ["system", "user", "user", "assistant", "tool"]);
        let call = &messages[3]["tool_calls"][0];
        assert_eq!(call["id"], "call_1");
        assert_eq!(call["function"]["name"], "exec_command");
        assert_eq!(call["function"]["arguments"], "{\"cmd\": \"echo sim-tool-result-5c1e | tee tool-output.txt\"}");
        assert_eq!(messages[3]["content"], "");
        assert_eq!(messages[4]["tool_call_id"], "call_1");
        assert!(messages[4]["content"].as_str().is_some_and(|c| c.ends_with("sim-tool-result-5c1e\n")));
    }
}
