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

use crate::api::fields::RawBody;
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
mod tests;
