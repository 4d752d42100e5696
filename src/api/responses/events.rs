//! The backend's chat answer as a Responses answer: a pure state machine fed the chat stream's
//! events one at a time (each turned at once into the Responses events it completes: nothing
//! waits for the stream's end), and the same machine fed a whole chat completion for the
//! non-streamed `response` object.
//!
//! A stream is `response.created`, `response.in_progress`, then per output item (reasoning,
//! the message, each tool call, in the order they begin) `response.output_item.added`, its
//! parts and deltas, `response.output_item.done` with the whole item (Codex takes a tool call
//! only from there), and one terminal event:
//!
//! - `response.completed` — with `usage` (input, cached, output tokens, as the backend reported
//!   them). An answer cut by its token limit (chat `finish_reason: "length"`) is also
//!   `response.completed`, its response `status: "incomplete"` with `incomplete_details.reason:
//!   "max_output_tokens"` and the cut item `status: "incomplete"`: Codex fails a turn on
//!   `response.incomplete` (and sends the same request again, to be cut again), while it keeps
//!   what a `response.completed` carries and goes on; the openai SDK's typed parser accepts
//!   `status: "incomplete"` there and its stream helper needs `response.completed` to finish.
//! - `response.failed` — the backend failed mid-stream (an error event, or the meter's event for
//!   a cut stream), with `error.code: "server_error"`, the gateway's message, and the chat error
//!   event's `type` and `request_id`; its output shows the items as far as they went (open
//!   ones `incomplete`); nothing follows.
//!
//! Tool calls get their own call ids (`call_…`, unique in the response): backends' ids repeat
//! (from 0 each answer, or none), while clients match outputs to calls by them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::request::{CUSTOM_INPUT, Shape, ToolKind};
use crate::api::completion::{CallDelta, Chunk, Usage, error_message};

/// Per-process counter making response ids unique.
static RESPONSES: AtomicU64 = AtomicU64::new(0);

/// A new response id (`resp_` and hex: the time in nanoseconds and a per-process counter).
fn response_id() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let n = RESPONSES.fetch_add(1, Ordering::Relaxed);
    format!("resp_{:x}{:04x}", nanos & 0xffff_ffff_ffff_ffff, n & 0xffff)
}

fn now_seconds() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// One output item being built.
#[derive(Debug)]
struct Item {
    id: String,
    body: Body,
    /// `output_item.added` has been sent (a tool call waits for its name).
    announced: bool,
    /// `output_item.done` has been sent.
    done: bool,
    /// Cut by the token limit.
    incomplete: bool,
}

#[derive(Debug)]
enum Body {
    Message { text: String },
    Reasoning { text: String },
    Call { kind: ToolKind, key: u64, backend_id: Option<String>, call_id: String, name: String, arguments: String },
}

/// Where the translation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Before `response.created`.
    New,
    Running,
    /// A `finish_reason` was seen: the items are done; usage and `[DONE]` may follow.
    Finished,
    /// The terminal event is sent: nothing more.
    Over,
}

/// The translation of one answer.
#[derive(Debug)]
pub struct Translator {
    shape: Shape,
    id: String,
    created_at: u64,
    sequence: u64,
    items: Vec<Item>,
    usage: Option<Usage>,
    finish: Option<String>,
    /// Why the answer failed: the message, and the chat error event's object when there was
    /// one (its `type`, `code` and `request_id` go into `response.error`).
    error: Option<(String, Option<Value>)>,
    phase: Phase,
}

impl Translator {
    pub fn new(shape: Shape) -> Self {
        Translator {
            shape,
            id: response_id(),
            created_at: now_seconds(),
            sequence: 0,
            items: Vec::new(),
            usage: None,
            finish: None,
            error: None,
            phase: Phase::New,
        }
    }

    /// `response.created` and `response.in_progress`.
    pub fn start(&mut self) -> Bytes {
        let mut out = Vec::new();
        self.begin(&mut out);
        Bytes::from(out)
    }

    fn begin(&mut self, out: &mut Vec<u8>) {
        if self.phase != Phase::New {
            return;
        }
        self.phase = Phase::Running;
        let response = self.response("in_progress");
        self.emit(out, "response.created", json!({"response": response}));
        self.emit(out, "response.in_progress", json!({"response": response}));
    }

    /// The Responses events one chat SSE event (its `data`) completes.
    pub fn chat_event(&mut self, data: &str) -> Bytes {
        let mut out = Vec::new();
        self.begin(&mut out);
        if self.phase == Phase::Over {
            return Bytes::new();
        }
        if data.trim() == "[DONE]" {
            self.terminate(&mut out);
            return Bytes::from(out);
        }
        // What is not a chat chunk (a server's odd line) is skipped, as the meter skips it.
        let Ok(chunk) = serde_json::from_str::<Chunk>(data) else { return Bytes::from(out) };
        self.chunk(&mut out, chunk);
        Bytes::from(out)
    }

    /// The end of the chat stream: the terminal event if none was sent (`response.completed`
    /// after a finish, else `response.failed`: the answer stopped before its end).
    pub fn end(&mut self) -> Bytes {
        let mut out = Vec::new();
        self.begin(&mut out);
        if self.phase == Phase::Running {
            self.error.get_or_insert_with(|| ("the backend's answer ended before it was complete".into(), None));
        }
        self.terminate(&mut out);
        Bytes::from(out)
    }

    /// The stream broke (`message`): `response.failed`, unless the answer was already over.
    pub fn fail(&mut self, message: &str) -> Bytes {
        let mut out = Vec::new();
        self.begin(&mut out);
        if self.phase == Phase::Running {
            self.error = Some((message.to_string(), None));
        }
        self.terminate(&mut out);
        Bytes::from(out)
    }

    fn chunk(&mut self, out: &mut Vec<u8>, chunk: Chunk) {
        if let Some(error) = chunk.error.filter(|e| !e.is_null()) {
            self.error = Some((error_message(&error), Some(error)));
            self.terminate(out);
            return;
        }
        if let Some(usage) = chunk.usage {
            // vllm-mlx sends it twice: the last wins.
            self.usage = Some(usage);
        }
        // A Responses answer has one output: the first choice's (`n` is not a Responses field).
        for choice in chunk.choices.into_iter().filter(|c| c.index == 0) {
            if self.phase != Phase::Running {
                continue;
            }
            let delta = choice.delta.unwrap_or_default();
            let reasoning = delta.reasoning_content.or(delta.reasoning).filter(|t| !t.is_empty());
            if let Some(text) = reasoning {
                self.reasoning(out, &text);
            }
            if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                self.text(out, &text);
            }
            for (position, call) in delta.tool_calls.into_iter().flatten().enumerate() {
                self.call(out, position, call);
            }
            if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
                let cut = matches!(reason.as_str(), "length" | "content_filter");
                self.close_all(out, cut);
                self.finish = Some(reason);
                self.phase = Phase::Finished;
            }
        }
    }

    fn reasoning(&mut self, out: &mut Vec<u8>, delta: &str) {
        let index = match self.open(|b| matches!(b, Body::Reasoning { .. })) {
            Some(index) => index,
            None => {
                self.close_all(out, false);
                let id = format!("rs_{}_{}", self.suffix(), self.items.len());
                self.add(out, Item::new(id, Body::Reasoning { text: String::new() }))
            }
        };
        if let Body::Reasoning { text } = &mut self.items[index].body {
            text.push_str(delta);
        }
        self.emit_delta(out, "response.reasoning_text.delta", index, delta, false);
    }

    fn text(&mut self, out: &mut Vec<u8>, delta: &str) {
        let index = match self.open(|b| matches!(b, Body::Message { .. })) {
            Some(index) => index,
            None => {
                self.close_all(out, false);
                let id = format!("msg_{}_{}", self.suffix(), self.items.len());
                self.add(out, Item::new(id, Body::Message { text: String::new() }))
            }
        };
        if let Body::Message { text } = &mut self.items[index].body {
            text.push_str(delta);
        }
        self.emit_delta(out, "response.output_text.delta", index, delta, true);
    }

    /// One tool-call delta, the `position`th of its chunk: `index` says which call it continues;
    /// without one (servers that send each call whole), a new `id` is a new call, and no id
    /// continues the last open call (a chunk's first) or is a new call (the others). Without an
    /// `index`, a delta that names its function while the call it would continue (by a repeated
    /// id, or as the last open call) is already named is a new call: a name comes once per
    /// call, so two whole calls never merge into one ("readwrite", `{"p":1}{"q":2}`).
    fn call(&mut self, out: &mut Vec<u8>, position: usize, delta: CallDelta) {
        let named = delta.function.as_ref().and_then(|f| f.name.as_deref()).is_some_and(|n| !n.is_empty());
        let calls = || {
            self.items.iter().enumerate().filter_map(|(at, item)| match &item.body {
                Body::Call { key, backend_id, name, .. } if !item.done => Some((at, *key, backend_id, name)),
                _ => None,
            })
        };
        // A named delta goes on only with a call that has no name yet.
        let goes_on = |name: &String| !named || name.is_empty();
        let found = match (delta.index, &delta.id) {
            (Some(index), _) => calls().find(|(_, key, _, _)| *key == index).map(|(at, ..)| at),
            // The latest call with that id (a repeated id may already have started another).
            (None, Some(id)) => calls()
                .rfind(|(_, _, backend_id, _)| backend_id.as_ref() == Some(id))
                .filter(|(.., name)| goes_on(name))
                .map(|(at, ..)| at),
            // No index and no id: the last open call goes on (the first of a delta's calls: the
            // others in the same delta are calls of their own).
            (None, None) => calls().next_back().filter(|(.., name)| position == 0 && goes_on(name)).map(|(at, ..)| at),
        };
        let function = delta.function.unwrap_or_default();
        let piece = match function.arguments {
            Some(Value::String(text)) => text,
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        };
        let index = match found {
            Some(index) => index,
            None => {
                // A new call closes the message and reasoning before it (calls stay open
                // together: their deltas may interleave).
                for at in 0..self.items.len() {
                    if !matches!(self.items[at].body, Body::Call { .. }) {
                        self.close(out, at, false);
                    }
                }
                let n = self.items.len();
                let key = delta.index.unwrap_or(10_000 + n as u64);
                let suffix = self.suffix().to_string();
                let body = Body::Call {
                    kind: ToolKind::Function,
                    key,
                    backend_id: delta.id.clone(),
                    call_id: format!("call_{suffix}_{n}"),
                    name: String::new(),
                    arguments: String::new(),
                };
                self.items.push(Item::new(format!("fc_{suffix}_{n}"), body));
                n
            }
        };
        if let Body::Call { name, kind, .. } = &mut self.items[index].body
            && let Some(more) = function.name.filter(|n| !n.is_empty())
        {
            name.push_str(&more);
            *kind = self.shape.kind_of(name);
        }
        let announced = self.items[index].announced;
        if let Body::Call { name, arguments, kind, .. } = &mut self.items[index].body {
            arguments.push_str(&piece);
            if !announced && name.is_empty() {
                // Arguments before the name: held until it comes.
                return;
            }
            let kind = *kind;
            if !announced {
                // The arguments so far go out with the announcement.
                let so_far = arguments.clone();
                self.announce(out, index);
                if kind == ToolKind::Function && !so_far.is_empty() {
                    self.arguments_delta(out, index, &so_far);
                }
                return;
            }
            if kind == ToolKind::Function && !piece.is_empty() {
                self.arguments_delta(out, index, &piece);
            }
        }
    }

    fn arguments_delta(&mut self, out: &mut Vec<u8>, index: usize, delta: &str) {
        let id = self.items[index].id.clone();
        self.emit(
            out,
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": delta}),
        );
    }

    /// The open (not done) item whose body matches, if any.
    fn open(&self, matches: impl Fn(&Body) -> bool) -> Option<usize> {
        self.items.iter().position(|item| !item.done && matches(&item.body))
    }

    /// Adds an item and announces it; returns its output index.
    fn add(&mut self, out: &mut Vec<u8>, item: Item) -> usize {
        self.items.push(item);
        let index = self.items.len() - 1;
        self.announce(out, index);
        index
    }

    /// `output_item.added` (and a text's or reasoning's `content_part.added`).
    fn announce(&mut self, out: &mut Vec<u8>, index: usize) {
        self.items[index].announced = true;
        let item = self.item_json(index, "in_progress");
        let id = self.items[index].id.clone();
        self.emit(out, "response.output_item.added", json!({"output_index": index, "item": item}));
        let part = match self.items[index].body {
            Body::Message { .. } => json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []}),
            Body::Reasoning { .. } => json!({"type": "reasoning_text", "text": ""}),
            Body::Call { .. } => return,
        };
        self.emit(
            out,
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
        );
    }

    /// Closes every open item (`cut`: the answer was cut by its token limit).
    fn close_all(&mut self, out: &mut Vec<u8>, cut: bool) {
        for index in 0..self.items.len() {
            self.close(out, index, cut);
        }
    }

    /// An item's closing events and `output_item.done`, once.
    fn close(&mut self, out: &mut Vec<u8>, index: usize, cut: bool) {
        if self.items[index].done {
            return;
        }
        if !self.items[index].announced {
            self.announce(out, index);
        }
        self.items[index].done = true;
        self.items[index].incomplete = cut;
        let id = self.items[index].id.clone();
        match &self.items[index].body {
            Body::Message { text } => {
                let text = text.clone();
                let at = json!({"item_id": id, "output_index": index, "content_index": 0});
                self.emit(out, "response.output_text.done", with(&at, json!({"text": text, "logprobs": []})));
                let part = json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
                self.emit(out, "response.content_part.done", with(&at, json!({"part": part})));
            }
            Body::Reasoning { text } => {
                let text = text.clone();
                let at = json!({"item_id": id, "output_index": index, "content_index": 0});
                self.emit(out, "response.reasoning_text.done", with(&at, json!({"text": text})));
                let part = json!({"type": "reasoning_text", "text": text});
                self.emit(out, "response.content_part.done", with(&at, json!({"part": part})));
            }
            Body::Call { kind: ToolKind::Function, arguments, name, .. } => {
                let done = json!({"item_id": id, "output_index": index, "name": name, "arguments": arguments});
                self.emit(out, "response.function_call_arguments.done", done);
            }
            Body::Call { kind: ToolKind::Custom, arguments, .. } => {
                let input = custom_input(arguments);
                let at = json!({"item_id": id, "output_index": index});
                self.emit(out, "response.custom_tool_call_input.delta", with(&at, json!({"delta": input})));
                self.emit(out, "response.custom_tool_call_input.done", with(&at, json!({"input": input})));
            }
            Body::Call { kind: ToolKind::LocalShell, .. } => {}
        }
        let status = if cut { "incomplete" } else { "completed" };
        let item = self.item_json(index, status);
        self.emit(out, "response.output_item.done", json!({"output_index": index, "item": item}));
    }

    /// The terminal event, once: `response.failed` after an error, else `response.completed`
    /// (its status `incomplete` for an answer cut by its token limit).
    fn terminate(&mut self, out: &mut Vec<u8>) {
        if self.phase == Phase::Over {
            return;
        }
        if self.error.is_none() {
            self.close_all(out, false);
        }
        self.phase = Phase::Over;
        let (kind, status) = match (&self.error, self.finish.as_deref()) {
            (Some(_), _) => ("response.failed", "failed"),
            (None, Some("length" | "content_filter")) => ("response.completed", "incomplete"),
            (None, _) => ("response.completed", "completed"),
        };
        let response = self.response(status);
        self.emit(out, kind, json!({"response": response}));
    }

    /// The `response` object as it stands, with `status`.
    pub fn response(&self, status: &str) -> Value {
        let echo = &self.shape.echo;
        let output: Vec<Value> = if status == "in_progress" {
            Vec::new()
        } else {
            // An item still open when the answer failed is shown as far as it went.
            let status_of = |i: usize| if self.items[i].done { "" } else { "incomplete" };
            (0..self.items.len())
                .filter(|&i| self.items[i].announced)
                .map(|i| self.item_json(i, status_of(i)))
                .collect()
        };
        let mut response = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.shape.model,
            "output": output,
            "error": null,
            "incomplete_details": null,
            "instructions": null,
            "metadata": {},
            "parallel_tool_calls": echo.parallel_tool_calls.unwrap_or(true),
            "tool_choice": echo.tool_choice.clone().unwrap_or_else(|| Value::from("auto")),
            "tools": [],
            "temperature": echo.temperature,
            "top_p": echo.top_p,
            "max_output_tokens": echo.max_output_tokens,
            "previous_response_id": null,
            "prompt_cache_key": echo.prompt_cache_key,
            "store": false,
            "usage": self.usage_json(),
        });
        match status {
            "failed" => response["error"] = self.error_json(),
            "incomplete" => {
                let reason = match self.finish.as_deref() {
                    Some("content_filter") => "content_filter",
                    _ => "max_output_tokens",
                };
                response["incomplete_details"] = json!({"reason": reason});
                response["completed_at"] = Value::from(now_seconds());
            }
            "completed" => response["completed_at"] = Value::from(now_seconds()),
            _ => {}
        }
        response
    }

    /// A failed response's `error`: its message, `code` `server_error` (the Responses API's
    /// code for a failure on the server's side; `rate_limit_exceeded` kept), and from the chat
    /// error event the gateway's `type` and the request's `request_id` (the access log line's
    /// id), which OpenAI's error object does not have and its SDKs keep.
    fn error_json(&self) -> Value {
        let (message, event) = self.error.clone().unwrap_or_default();
        let event = event.unwrap_or(Value::Null);
        let code = match event.get("code").and_then(Value::as_str) {
            Some("rate_limit_exceeded") => "rate_limit_exceeded",
            _ => "server_error",
        };
        let mut error = json!({"code": code, "message": message});
        for key in ["type", "request_id"] {
            if let Some(value) = event.get(key).filter(|v| v.is_string()) {
                error[key] = value.clone();
            }
        }
        error
    }

    /// The whole item at `index`; `status` empty: its own (`completed`, `incomplete`, or
    /// `in_progress` while open).
    fn item_json(&self, index: usize, status: &str) -> Value {
        let item = &self.items[index];
        let status = match status {
            "" if !item.done => "in_progress",
            "" if item.incomplete => "incomplete",
            "" => "completed",
            given => given,
        };
        let open = status == "in_progress";
        match &item.body {
            Body::Message { text } => {
                let content = if open {
                    json!([])
                } else {
                    json!([{"type": "output_text", "text": text, "annotations": [], "logprobs": []}])
                };
                json!({"id": item.id, "type": "message", "status": status, "role": "assistant", "content": content})
            }
            Body::Reasoning { text } => {
                let content = if open { json!([]) } else { json!([{"type": "reasoning_text", "text": text}]) };
                json!({"id": item.id, "type": "reasoning", "status": status, "summary": [], "content": content})
            }
            Body::Call { kind: ToolKind::Function, call_id, name, arguments, .. } => {
                let arguments = if open { "" } else { arguments.as_str() };
                let mut call = json!({"id": item.id, "type": "function_call", "status": status, "call_id": call_id,
                                      "name": name, "arguments": arguments});
                if let Some(namespace) = self.shape.namespaces.get(name) {
                    call["namespace"] = Value::from(namespace.as_str());
                }
                call
            }
            Body::Call { kind: ToolKind::Custom, call_id, name, arguments, .. } => {
                let input = if open { String::new() } else { custom_input(arguments) };
                json!({"id": item.id, "type": "custom_tool_call", "status": status, "call_id": call_id, "name": name,
                       "input": input})
            }
            Body::Call { kind: ToolKind::LocalShell, call_id, arguments, .. } => {
                let action =
                    if open { json!({"type": "exec", "command": [], "env": {}}) } else { shell_action(arguments) };
                json!({"id": item.id, "type": "local_shell_call", "status": status, "call_id": call_id,
                       "action": action})
            }
        }
    }

    fn usage_json(&self) -> Value {
        let Some(usage) = self.usage else { return Value::Null };
        let input = usage.prompt_tokens.unwrap_or(0);
        let output = usage.completion_tokens.unwrap_or(0);
        let cached = usage.prompt_tokens_details.and_then(|d| d.cached_tokens).unwrap_or(0);
        let reasoning = usage.completion_tokens_details.and_then(|d| d.reasoning_tokens).unwrap_or(0);
        json!({
            "input_tokens": input,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": usage.total_tokens.unwrap_or(input + output),
        })
    }

    /// The part of the response id after `resp_`, for item ids.
    fn suffix(&self) -> &str {
        self.id.strip_prefix("resp_").unwrap_or(&self.id)
    }

    /// Writes one event: `event: kind` and its data with `type` and the next `sequence_number`.
    fn emit(&mut self, out: &mut Vec<u8>, kind: &str, fields: Value) {
        let mut event = Map::new();
        event.insert("type".into(), Value::from(kind));
        event.insert("sequence_number".into(), Value::from(self.sequence));
        if let Value::Object(fields) = fields {
            event.extend(fields);
        }
        self.sequence += 1;
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\ndata: ");
        // A `Value` always serializes.
        out.extend_from_slice(Value::Object(event).to_string().as_bytes());
        out.extend_from_slice(b"\n\n");
    }

    /// Writes one text or reasoning delta of item `index` (an event per streamed chunk) as
    /// [`Self::emit`] writes it, without building a `Value`: `{"type", "sequence_number",
    /// "item_id", "output_index", "content_index": 0, "delta"}` and, for text, `"logprobs": []`.
    fn emit_delta(&mut self, out: &mut Vec<u8>, kind: &str, index: usize, delta: &str, logprobs: bool) {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\ndata: {\"type\":");
        json_string(out, kind);
        out.extend_from_slice(b",\"sequence_number\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.sequence).as_bytes());
        out.extend_from_slice(b",\"item_id\":");
        json_string(out, &self.items[index].id);
        out.extend_from_slice(b",\"output_index\":");
        out.extend_from_slice(itoa::Buffer::new().format(index).as_bytes());
        out.extend_from_slice(b",\"content_index\":0,\"delta\":");
        json_string(out, delta);
        if logprobs {
            out.extend_from_slice(b",\"logprobs\":[]");
        }
        out.extend_from_slice(b"}\n\n");
        self.sequence += 1;
    }
}

impl Item {
    fn new(id: String, body: Body) -> Self {
        Item { id, body, announced: false, done: false, incomplete: false }
    }
}

/// `text` as a JSON string, escaped as `serde_json` escapes it.
fn json_string(out: &mut Vec<u8>, text: &str) {
    // Writing a string into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, text);
}

/// `base` with `more`'s fields added.
fn with(base: &Value, more: Value) -> Value {
    let mut merged = base.clone();
    if let (Value::Object(merged), Value::Object(more)) = (&mut merged, more) {
        merged.extend(more);
    }
    merged
}

/// A custom tool's input from the function arguments the backend wrote (`{"input": "…"}`); a
/// model that wrote something else gets its text passed on as the input.
fn custom_input(arguments: &str) -> String {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(object)) => match object.get(CUSTOM_INPUT) {
            Some(Value::String(input)) => input.clone(),
            _ if object.len() == 1 => object.values().next().and_then(Value::as_str).unwrap_or(arguments).to_string(),
            _ => arguments.to_string(),
        },
        Ok(Value::String(input)) => input,
        _ => arguments.to_string(),
    }
}

/// A `local_shell_call`'s action from the function arguments (`command`, `workdir`,
/// `timeout_ms`).
fn shell_action(arguments: &str) -> Value {
    let parsed: Value = serde_json::from_str(arguments).unwrap_or(Value::Null);
    let command = match parsed.get("command") {
        Some(Value::Array(parts)) => Value::Array(parts.clone()),
        Some(Value::String(line)) => json!(["bash", "-lc", line]),
        _ => json!([]),
    };
    json!({
        "type": "exec",
        "command": command,
        "env": {},
        "working_directory": parsed.get("workdir").filter(|v| v.is_string()),
        "timeout_ms": parsed.get("timeout_ms").filter(|v| v.is_number()),
        "user": null,
    })
}

/// A whole chat completion as one `response` object (the non-streamed answer). `None` when the
/// body is not a chat completion.
pub fn whole(shape: Shape, completion: &[u8]) -> Option<Value> {
    let chunk: Chunk = serde_json::from_slice(completion).ok()?;
    if chunk.choices.is_empty() && chunk.error.is_none() {
        return None;
    }
    let mut translator = Translator::new(shape);
    let mut ignored = Vec::new();
    translator.begin(&mut ignored);
    translator.chunk(&mut ignored, chunk);
    translator.terminate(&mut ignored);
    let status = match (&translator.error, translator.finish.as_deref()) {
        (Some(_), _) => "failed",
        (None, Some("length" | "content_filter")) => "incomplete",
        (None, _) => "completed",
    };
    Some(translator.response(status))
}

#[cfg(test)]
mod tests;
