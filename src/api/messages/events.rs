//! The backend's chat answer as an Anthropic Messages answer: a pure state machine fed the chat
//! stream's events one at a time (each turned at once into the Messages events it completes:
//! nothing waits for the stream's end), and the same machine fed a whole chat completion for
//! the non-streamed `message` object.
//!
//! A stream is strictly `message_start` → per content block (thinking, text, each tool call, in
//! the order they begin; one open at a time) `content_block_start`, its deltas (`thinking_delta`
//! then one `signature_delta`; `text_delta`; `input_json_delta` pieces as the backend streams a
//! call's arguments, `{}` when it sent none), `content_block_stop` → `message_delta` (the stop
//! reason and the usage) → `message_stop`. Block indices count from 0 in the order blocks
//! start. A backend failure mid-stream (its error event, the meter's event for a cut stream, an
//! answer that ends unfinished) is `event: error` with Anthropic's error object, and nothing
//! follows it (no `message_stop`): the SDKs raise the error's type.
//!
//! Usage is Anthropic's: `input_tokens` is the prompt *without* the tokens the backend served
//! from its prompt cache, which are `cache_read_input_tokens` (Claude Code adds the two: a
//! whole prompt as input would count its context twice). `message_start` carries the prompt's
//! tokens as the gateway counted them for the context cap (an upper bound when the prompt fitted
//! by its bytes; the estimate without a cap), the backend's usage coming only at the end;
//! `message_delta` carries the backend's figures, input and cache reads included, which the
//! SDKs' accumulators take over the start's.
//!
//! Calls a backend interleaves (every call named first, then their arguments in turns): a call
//! that begins while the open call's arguments are still incomplete waits, its pieces gathered,
//! and starts when that call's JSON is complete (or at the end), so no piece is lost to a block
//! already stopped. Arguments cut by the token limit are closed into valid JSON at the stop
//! (`closing`).
//!
//! A call's name that the offered tools do not have is restored to the offered one it is a
//! cut of, or equals but for case ([`Shape::tool_name`]).
//!
//! Tool calls get their own ids (`toolu_…`, unique): backends' ids repeat (from 0 each answer,
//! or none), while clients match results to calls by them. Thinking blocks carry an empty
//! `signature` (the SDKs require the field; there is nothing to sign).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::error;
use super::request::Shape;
use crate::api::completion::{CallDelta, Chunk, Usage, error_message};

mod closing;

/// The id of omlx's keep-alive data chunks.
const KEEPALIVE_ID: &str = "chatcmpl-keepalive";

/// Per-process counter making message and tool ids unique.
static MESSAGES: AtomicU64 = AtomicU64::new(0);

/// A new id with `prefix` (hex: the time in nanoseconds and a per-process counter).
fn new_id(prefix: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let n = MESSAGES.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{:016x}{:04x}", nanos & 0xffff_ffff_ffff_ffff, n & 0xffff)
}

/// One content block.
#[derive(Debug)]
enum Block {
    Thinking { text: String },
    Text { text: String },
    ToolUse { key: u64, backend_id: Option<String>, id: String, name: String, json: String },
}

/// A tool call the backend began without its name yet: it becomes a block when named.
#[derive(Debug)]
struct Unnamed {
    key: u64,
    backend_id: Option<String>,
    json: String,
}

/// A named call that began while the open call's arguments were incomplete (a backend
/// interleaving its calls' pieces): it starts when that one is complete, or at the end, so that
/// no piece goes to a stopped block.
#[derive(Debug)]
struct Waiting {
    key: u64,
    backend_id: Option<String>,
    name: String,
    json: String,
}

/// Where the translation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Before `message_start`.
    New,
    Running,
    /// A `finish_reason` was seen: the blocks are stopped; usage and `[DONE]` may follow.
    Finished,
    /// `message_stop` or `error` is sent: nothing more.
    Over,
}

/// The translation of one answer.
#[derive(Debug)]
pub struct Translator {
    shape: Shape,
    id: String,
    blocks: Vec<Block>,
    /// The index of the block that is open (started, not stopped).
    open: Option<usize>,
    unnamed: Option<Unnamed>,
    /// Calls waiting for the open call's arguments to complete, in the order they began.
    waiting: Vec<Waiting>,
    usage: Option<Usage>,
    finish: Option<String>,
    /// The client's stop sequence the backend says it stopped on.
    stop_sequence: Option<String>,
    /// Anything but `ping` was sent after `message_start` (the ping timer stops then).
    content_started: bool,
    /// The prompt's tokens as the gateway counted them, for `message_start`.
    counted_prompt: u64,
    phase: Phase,
}

impl Translator {
    /// The translation of one answer to a request of `shape` (a new message id).
    pub fn new(shape: Shape) -> Self {
        Translator {
            shape,
            id: new_id("msg_"),
            blocks: Vec::new(),
            open: None,
            unnamed: None,
            waiting: Vec::new(),
            usage: None,
            finish: None,
            stop_sequence: None,
            content_started: false,
            counted_prompt: 0,
            phase: Phase::New,
        }
    }

    /// `message_start` says `prompt_tokens` of input (the gateway's count) until `message_delta`
    /// gives the backend's figures.
    pub fn with_counted_prompt(mut self, prompt_tokens: u64) -> Self {
        self.counted_prompt = prompt_tokens;
        self
    }

    /// `message_start`.
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
        let mut message = self.message_json(Vec::new());
        message["usage"] = json!({"input_tokens": self.counted_prompt, "cache_creation_input_tokens": 0,
                                  "cache_read_input_tokens": 0, "output_tokens": 0});
        emit(out, "message_start", json!({"message": message}));
    }

    /// A `ping` (the backend is still prefilling), unless the message is over.
    pub fn ping(&mut self) -> Bytes {
        let mut out = Vec::new();
        self.begin(&mut out);
        if self.phase != Phase::Over {
            emit(&mut out, "ping", json!({}));
        }
        Bytes::from(out)
    }

    /// Whether content has begun (or the message is over): no more timer pings are needed.
    pub fn content_started(&self) -> bool {
        self.content_started || self.phase == Phase::Over
    }

    /// The Messages events that one chat SSE event's `data` completes.
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
        let Ok(chunk) = serde_json::from_str::<Chunk>(data) else { return Bytes::from(out) };
        if chunk.id.as_deref() == Some(KEEPALIVE_ID) {
            emit(&mut out, "ping", json!({}));
            return Bytes::from(out);
        }
        self.chunk(&mut out, chunk);
        Bytes::from(out)
    }

    /// The chat stream ended: the message's last events, or an error if it ended unfinished.
    pub fn end(&mut self) -> Bytes {
        let mut out = Vec::new();
        self.begin(&mut out);
        if self.phase == Phase::Running {
            self.fail_into(&mut out, "The backend's answer ended before it was complete.", None, None);
        }
        self.terminate(&mut out);
        Bytes::from(out)
    }

    /// The chat stream broke (`message`): an error event.
    pub fn fail(&mut self, message: &str) -> Bytes {
        let mut out = Vec::new();
        self.begin(&mut out);
        self.fail_into(&mut out, message, None, None);
        Bytes::from(out)
    }

    fn chunk(&mut self, out: &mut Vec<u8>, chunk: Chunk) {
        if let Some(failure) = chunk.error.filter(|e| !e.is_null()) {
            let request_id = failure.get("request_id").and_then(Value::as_str).map(str::to_string).or(chunk.request_id);
            let kind = failure.get("type").and_then(Value::as_str).map(str::to_string);
            self.fail_into(out, &error_message(&failure), kind.as_deref(), request_id.as_deref());
            return;
        }
        if let Some(usage) = chunk.usage {
            self.usage = Some(usage);
        }
        for choice in chunk.choices.into_iter().filter(|c| c.index == 0) {
            if self.phase != Phase::Running {
                continue;
            }
            let delta = choice.delta.unwrap_or_default();
            let reasoning = delta.reasoning_content.or(delta.reasoning).filter(|t| !t.is_empty());
            if let Some(text) = reasoning.filter(|_| self.shape.thinking) {
                self.thinking(out, &text);
            }
            if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                self.text(out, &text);
            }
            for call in delta.tool_calls.into_iter().flatten() {
                self.call(out, call);
            }
            if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
                self.stop_sequence = match choice.stop_reason {
                    Some(Value::String(stop)) if self.shape.stop_sequences.contains(&stop) => Some(stop),
                    _ => None,
                };
                self.close_open(out);
                self.finish = Some(reason);
                self.phase = Phase::Finished;
            }
        }
    }

    fn thinking(&mut self, out: &mut Vec<u8>, delta: &str) {
        let index = match self.open.filter(|&i| matches!(self.blocks[i], Block::Thinking { .. })) {
            Some(index) => index,
            None => self.start_block(out, Block::Thinking { text: String::new() }),
        };
        if let Block::Thinking { text } = &mut self.blocks[index] {
            text.push_str(delta);
        }
        emit(
            out,
            "content_block_delta",
            json!({"index": index, "delta": {"type": "thinking_delta", "thinking": delta}}),
        );
    }

    fn text(&mut self, out: &mut Vec<u8>, delta: &str) {
        let index = match self.open.filter(|&i| matches!(self.blocks[i], Block::Text { .. })) {
            Some(index) => index,
            None => self.start_block(out, Block::Text { text: String::new() }),
        };
        if let Block::Text { text } = &mut self.blocks[index] {
            text.push_str(delta);
        }
        emit(out, "content_block_delta", json!({"index": index, "delta": {"type": "text_delta", "text": delta}}));
    }

    /// A piece of a tool call: found by its chat `index`, else its id, else (no name: the
    /// arguments go on) the call being streamed; a named piece that matches none begins a call.
    fn call(&mut self, out: &mut Vec<u8>, delta: CallDelta) {
        let function = delta.function.unwrap_or_default();
        let name = function.name.filter(|n| !n.is_empty());
        let piece = match function.arguments {
            Some(Value::String(text)) => text,
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        };
        // The call waiting for its name.
        let unnamed_matches = self.unnamed.as_ref().is_some_and(|u| match (delta.index, &delta.id) {
            (Some(index), _) => u.key == index,
            (None, Some(id)) => u.backend_id.as_ref() == Some(id),
            (None, None) => true,
        });
        if unnamed_matches {
            if let Some(unnamed) = self.unnamed.as_mut() {
                unnamed.json.push_str(&piece);
            }
            if let Some(name) = name
                && let Some(unnamed) = self.unnamed.take()
            {
                let Unnamed { key, backend_id, json } = unnamed;
                self.begin_call(out, key, backend_id, name, json);
            }
            return;
        }
        // A call waiting for its turn (the latest with that index: a server numbering every
        // call 0 continues the last one).
        let waiting = self.waiting.iter_mut().rev().find(|w| match (delta.index, &delta.id) {
            (Some(index), Some(id)) if name.is_some() => w.key == index && w.backend_id.as_ref() == Some(id),
            (Some(index), _) => w.key == index,
            (None, Some(id)) => w.backend_id.as_ref() == Some(id) && name.is_none(),
            (None, None) => false,
        });
        if let Some(waiting) = waiting {
            waiting.json.push_str(&piece);
            return;
        }
        let found = self.blocks.iter().enumerate().rev().find_map(|(at, block)| match block {
            Block::ToolUse { key, backend_id, .. } => {
                let same = match (delta.index, &delta.id) {
                    // A named piece with another id under the same index is another call (a
                    // server numbering every call 0).
                    (Some(index), Some(id)) if name.is_some() => *key == index && backend_id.as_ref() == Some(id),
                    (Some(index), _) => *key == index,
                    (None, Some(id)) => backend_id.as_ref() == Some(id) && name.is_none(),
                    (None, None) => name.is_none() && self.open == Some(at),
                };
                same.then_some(at)
            }
            _ => None,
        });
        match found {
            Some(at) => {
                if let Block::ToolUse { json, .. } = &mut self.blocks[at] {
                    json.push_str(&piece);
                }
                // A piece of a call already stopped (a backend interleaving its calls) cannot
                // be streamed any more: it stays in the whole message only.
                if self.open == Some(at) && !piece.is_empty() {
                    emit(out, "content_block_delta", json!({"index": at, "delta": input_delta(&piece)}));
                    self.start_waiting(out);
                }
            }
            None => {
                let key = delta.index.unwrap_or(10_000 + self.blocks.len() as u64);
                match name {
                    Some(name) => self.begin_call(out, key, delta.id, name, piece),
                    None => {
                        // Its name comes later: what is open now stops (its call comes next).
                        self.close_open(out);
                        self.unnamed = Some(Unnamed { key, backend_id: delta.id, json: piece });
                    }
                }
            }
        }
    }

    /// A named call begins: at once, unless the open call's arguments are incomplete (their
    /// pieces may still come) or calls already wait: then after them.
    fn begin_call(&mut self, out: &mut Vec<u8>, key: u64, backend_id: Option<String>, name: String, json: String) {
        if self.open_call_incomplete() || !self.waiting.is_empty() {
            self.waiting.push(Waiting { key, backend_id, name, json });
        } else {
            self.start_call(out, key, backend_id, name, json);
        }
    }

    /// Whether the open block is a call whose arguments are not yet complete JSON.
    fn open_call_incomplete(&self) -> bool {
        self.open.is_some_and(|at| match &self.blocks[at] {
            Block::ToolUse { json, .. } => serde_json::from_str::<serde::de::IgnoredAny>(json).is_err(),
            _ => false,
        })
    }

    /// The waiting calls start, in order, while the open call is complete (`all`: regardless).
    fn start_waiting_while(&mut self, out: &mut Vec<u8>, all: bool) {
        while !self.waiting.is_empty() && (all || !self.open_call_incomplete()) {
            let Waiting { key, backend_id, name, json } = self.waiting.remove(0);
            self.start_call(out, key, backend_id, name, json);
        }
    }

    fn start_waiting(&mut self, out: &mut Vec<u8>) {
        self.start_waiting_while(out, false);
    }

    fn start_call(&mut self, out: &mut Vec<u8>, key: u64, backend_id: Option<String>, name: String, json: String) {
        let name = self.shape.tool_name(name);
        let block = Block::ToolUse { key, backend_id, id: new_id("toolu_"), name, json: String::new() };
        let index = self.start_block(out, block);
        if let Block::ToolUse { json: kept, .. } = &mut self.blocks[index] {
            kept.push_str(&json);
        }
        if !json.is_empty() {
            emit(out, "content_block_delta", json!({"index": index, "delta": input_delta(&json)}));
        }
    }

    /// Stops the open block and starts `block`; its index.
    fn start_block(&mut self, out: &mut Vec<u8>, block: Block) -> usize {
        self.close_open(out);
        self.content_started = true;
        let start = match &block {
            Block::Thinking { .. } => json!({"type": "thinking", "thinking": "", "signature": ""}),
            Block::Text { .. } => json!({"type": "text", "text": ""}),
            Block::ToolUse { id, name, .. } => json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
        };
        self.blocks.push(block);
        let index = self.blocks.len() - 1;
        self.open = Some(index);
        emit(out, "content_block_start", json!({"index": index, "content_block": start}));
        index
    }

    /// Stops the open block: a thinking block gets its `signature_delta` first, a call that
    /// streamed no arguments gets `{}`, a call cut short the text that closes its JSON (what it
    /// streamed is valid JSON at its stop).
    fn close_open(&mut self, out: &mut Vec<u8>) {
        let Some(index) = self.open.take() else { return };
        match &mut self.blocks[index] {
            Block::Thinking { .. } => {
                emit(
                    out,
                    "content_block_delta",
                    json!({"index": index, "delta": {"type": "signature_delta", "signature": ""}}),
                );
            }
            Block::ToolUse { json, .. } if json.trim().is_empty() => {
                json.clear();
                json.push_str("{}");
                emit(out, "content_block_delta", json!({"index": index, "delta": input_delta("{}")}));
            }
            // Cut short (the token limit): closed, so that what streamed parses at the stop.
            Block::ToolUse { json, .. } if serde_json::from_str::<serde::de::IgnoredAny>(json).is_err() => {
                let rest = closing::closing(json);
                if !rest.is_empty() {
                    json.push_str(&rest);
                    emit(out, "content_block_delta", json!({"index": index, "delta": input_delta(&rest)}));
                }
            }
            _ => {}
        }
        emit(out, "content_block_stop", json!({"index": index}));
    }

    /// The end of an answer that finished: the open block stops, then `message_delta` and
    /// `message_stop`.
    fn terminate(&mut self, out: &mut Vec<u8>) {
        if self.phase == Phase::Over {
            return;
        }
        if self.phase == Phase::Running && self.finish.is_none() {
            // `[DONE]` without a finish: the answer ended as the backend meant it.
            self.finish = Some("stop".into());
        }
        self.flush_unnamed(out);
        self.start_waiting_while(out, true);
        self.close_open(out);
        self.phase = Phase::Over;
        let delta = json!({"stop_reason": self.stop_reason(), "stop_sequence": self.stop_sequence});
        emit(out, "message_delta", json!({"delta": delta, "usage": self.usage_json()}));
        emit(out, "message_stop", json!({}));
    }

    /// A call still unnamed at the end: it goes out with an empty name rather than be lost.
    fn flush_unnamed(&mut self, out: &mut Vec<u8>) {
        if let Some(Unnamed { key, backend_id, json }) = self.unnamed.take() {
            self.begin_call(out, key, backend_id, String::new(), json);
        }
    }

    /// The error event (once); nothing follows it.
    fn fail_into(&mut self, out: &mut Vec<u8>, message: &str, kind: Option<&str>, request_id: Option<&str>) {
        if self.phase == Phase::Over {
            return;
        }
        self.phase = Phase::Over;
        let body = error::stream_error(message, kind, request_id);
        out.extend_from_slice(b"event: error\ndata: ");
        out.extend_from_slice(body.to_string().as_bytes());
        out.extend_from_slice(b"\n\n");
    }

    /// Anthropic's stop reason for the chat `finish_reason`.
    fn stop_reason(&self) -> &'static str {
        let called = self.blocks.iter().any(|b| matches!(b, Block::ToolUse { .. }));
        match self.finish.as_deref() {
            Some("length") => "max_tokens",
            Some("tool_calls" | "function_call") => "tool_use",
            Some("content_filter") => "refusal",
            // Some servers say `stop` after tool calls.
            _ if called => "tool_use",
            _ if self.stop_sequence.is_some() => "stop_sequence",
            _ => "end_turn",
        }
    }

    /// Anthropic's usage from the backend's; without the backend's prompt count, the gateway's
    /// (the SDKs take `message_delta`'s `input_tokens` over `message_start`'s: a 0 would erase it).
    fn usage_json(&self) -> Value {
        let usage = self.usage.unwrap_or_default();
        let prompt = usage.prompt_tokens.unwrap_or(self.counted_prompt);
        let cached = usage.prompt_tokens_details.and_then(|d| d.cached_tokens).unwrap_or(0).min(prompt);
        json!({
            "input_tokens": prompt - cached,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
            "output_tokens": usage.completion_tokens.unwrap_or(0),
        })
    }

    fn message_json(&self, content: Vec<Value>) -> Value {
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.shape.model,
            "content": content,
            "stop_reason": null,
            "stop_sequence": null,
            "usage": self.usage_json(),
        })
    }

    /// The whole message: its blocks, stop reason and usage.
    fn message(&self) -> Value {
        let content = self
            .blocks
            .iter()
            .map(|block| match block {
                Block::Thinking { text } => json!({"type": "thinking", "thinking": text, "signature": ""}),
                Block::Text { text } => json!({"type": "text", "text": text}),
                Block::ToolUse { id, name, json, .. } => {
                    json!({"type": "tool_use", "id": id, "name": name, "input": input_object(json)})
                }
            })
            .collect();
        let mut message = self.message_json(content);
        message["stop_reason"] = Value::from(self.stop_reason());
        message["stop_sequence"] = self.stop_sequence.clone().map_or(Value::Null, Value::from);
        message
    }
}

fn input_delta(piece: &str) -> Value {
    json!({"type": "input_json_delta", "partial_json": piece})
}

/// A call's arguments as the `input` object: an object as it is, text cut by the token limit
/// closed as the stream closes it; anything else (not JSON, not an object) as an empty object,
/// since `input` must be one.
fn input_object(arguments: &str) -> Value {
    let parsed = serde_json::from_str::<Value>(arguments)
        .or_else(|_| serde_json::from_str::<Value>(&format!("{arguments}{}", closing::closing(arguments))));
    match parsed {
        Ok(Value::Object(object)) => Value::Object(object),
        _ => json!({}),
    }
}

/// Writes one SSE event: `event: KIND`, then `data:` with `type` first.
fn emit(out: &mut Vec<u8>, kind: &str, fields: Value) {
    let mut event = Map::new();
    event.insert("type".into(), Value::from(kind));
    if let Value::Object(fields) = fields {
        event.extend(fields);
    }
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    // A `Value` always serializes.
    out.extend_from_slice(Value::Object(event).to_string().as_bytes());
    out.extend_from_slice(b"\n\n");
}

/// What a whole chat completion becomes.
#[derive(Debug)]
pub enum Whole {
    /// The `message` object.
    Message(Value),
    /// The backend answered 200 with an error object: Anthropic's error body and its status.
    Error(axum::http::StatusCode, Value),
}

/// The `message` object of a whole chat completion; `None` when it is not one.
pub fn whole(shape: Shape, completion: &[u8]) -> Option<Whole> {
    let chunk: Chunk = serde_json::from_slice(completion).ok()?;
    if let Some(failure) = chunk.error.as_ref().filter(|e| !e.is_null()) {
        let kind = failure.get("type").and_then(Value::as_str);
        let body = error::stream_error(&error_message(failure), kind, chunk.request_id.as_deref());
        return Some(Whole::Error(axum::http::StatusCode::BAD_GATEWAY, body));
    }
    if chunk.choices.is_empty() {
        return None;
    }
    let mut translator = Translator::new(shape);
    let mut ignored = Vec::new();
    translator.begin(&mut ignored);
    translator.chunk(&mut ignored, chunk);
    translator.terminate(&mut ignored);
    Some(Whole::Message(translator.message()))
}

#[cfg(test)]
mod tests;
