//! fit: a request's prompt against its backend's context cap, decided before the request takes
//! a queue slot or starts a swap (a rejection costs no backend time). Counting (chat template +
//! tokenizer) runs on a blocking thread: a 53k-token prompt takes milliseconds of CPU.
//!
//! The plan comes from `tokens::overflow` (pure); this module reads the request's fields,
//! applies the plan to them (messages rewritten, `max_tokens` set) and says what is left to do:
//! send, or map-reduce the pieces of an over-long message (`api::chunk`).

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use serde_json::value::RawValue;

use super::fields::RawBody;
use crate::dispatch::Route;
use crate::error::{GatewayError, PromptPart};
use crate::kinds::Kind;
use crate::metrics::Metrics;
use crate::tokens::counter::Estimate;
use crate::tokens::overflow::{self, Budget, ChatPlan, ChunkPlan, Requested, TextPlan};
use crate::tokens::registry::ModelTokens;
use crate::tokens::{ChatPrompt, Count, OnOverflow};

/// What the handler does after fitting.
pub enum Fitted {
    /// Send the (possibly rewritten) request; `transform` is the `x-mlxgate-transform` header,
    /// `prompt_tokens` the prompt's tokens as counted for the cap (an upper bound when the
    /// prompt fitted by its bytes; `None`: not counted).
    Send { transform: Option<String>, prompt_tokens: Option<usize> },
    /// Map the pieces of the over-long last message, then reduce (`api::chunk`).
    Chunk(Chunked),
    /// Embed the inputs' pieces in one request and average each input's vectors.
    Embed(EmbedPlan),
}

/// A chunk plan and the client's own messages, to forward in place of the ones rewritten for
/// counting.
pub struct Chunked {
    pub plan: ChunkPlan,
    pub restore: Restore,
}

/// Puts the client's own messages back into a plan's messages. The planner works on messages
/// rewritten as the servers render them (text parts joined, `null` contents, tool arguments
/// parsed); what is forwarded is what the client sent: a kept message as it was, a cut one as it
/// was with its cut content, a message the planner wrote (a map or reduce prompt) as written.
pub struct Restore {
    rewritten: Vec<Value>,
    /// `None`: the client's messages needed no rewriting (most requests: nothing was copied).
    originals: Option<Vec<Value>>,
}

impl Restore {
    /// The client's messages in place of the rewritten ones in `planned` (same order: the
    /// planner only removes messages, cuts contents and adds its own).
    pub fn apply(&self, planned: Vec<Value>) -> Vec<Value> {
        let Some(originals) = &self.originals else { return planned };
        let mut next = 0;
        planned
            .into_iter()
            .map(|message| {
                let found = (next..self.rewritten.len()).find_map(|k| {
                    let rewritten = &self.rewritten[k];
                    let kept = *rewritten == message;
                    (kept || same_but_content(rewritten, &message)).then_some((k, kept))
                });
                let Some((k, kept)) = found else { return message };
                next = k + 1;
                let mut original = originals[k].clone();
                if !kept {
                    original["content"] = message["content"].clone();
                }
                original
            })
            .collect()
    }
}

/// Whether two messages differ in their `content` only.
fn same_but_content(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else { return false };
    a.len() == b.len() && a.iter().all(|(key, value)| key == "content" || b.get(key) == Some(value))
}

/// Embedding inputs split at token boundaries: `pieces` is sent as the request's `input`;
/// `groups[i]` lists, for the client's input `i`, its pieces' indexes and token counts.
pub struct EmbedPlan {
    pub pieces: Vec<Value>,
    pub groups: Vec<Vec<(usize, usize)>>,
}

impl EmbedPlan {
    /// How many pieces the over-long inputs were cut into (the header's `pieces=`).
    pub fn piece_count(&self) -> usize {
        self.pieces.len()
    }
}

/// Which endpoint a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
    Embeddings,
}

impl Endpoint {
    /// The endpoint of a request path, if it is one the proxy serves.
    pub fn of(path: &str) -> Option<Endpoint> {
        match path {
            "/v1/chat/completions" => Some(Endpoint::Chat),
            "/v1/completions" => Some(Endpoint::Completions),
            "/v1/embeddings" => Some(Endpoint::Embeddings),
            _ => None,
        }
    }
}

/// Fits the request in `fields` to its model's cap, rewriting `fields` as the plan says.
/// Without a known cap nothing is counted. `exact`: a chat prompt that fits by its bytes is
/// tokenized all the same, for an exact [`Fitted::Send::prompt_tokens`] (a client with a token
/// limit is charged it up front: a bytes bound several times the count could refuse it).
pub async fn fit(
    metrics: &Metrics,
    route: &Route,
    tokens: Option<&ModelTokens>,
    endpoint: Endpoint,
    fields: &mut RawBody,
    exact: bool,
) -> Result<Fitted, GatewayError> {
    let Some(tokens) = tokens else { return Ok(Fitted::Send { transform: None, prompt_tokens: None }) };
    let Some(cap) = tokens.cap else { return Ok(Fitted::Send { transform: None, prompt_tokens: None }) };
    let inline = Inline::allows(fields);
    let model = route.model.name.clone();
    let counter = Arc::clone(&tokens.counter);
    let action = tokens.on_overflow;
    let default_max_tokens = route.model.default_max_tokens as usize;
    let Limits { smallest: max_tokens, largest } = requested_max_tokens(fields)?;
    let budget = Budget { cap, max_tokens, min_room: route.model.min_room as usize };
    let count_timer = metrics.prompt_count_seconds.with_label_values(&[&model]);
    let overflowed = |action: &str| metrics.context_overflow.with_label_values(&[&model, action]).inc();
    let reject = |requested: Requested, what: PromptPart| {
        overflowed(OnOverflow::Reject.label());
        let (prompt, completion) = (requested.prompt, requested.completion);
        tracing::info!(model = %model, cap, prompt, ?completion, "prompt over the context cap: rejected");
        GatewayError::ContextLengthExceeded { cap, requested, what }
    };
    match endpoint {
        Endpoint::Chat => {
            let mut request = ChatRequest::read(fields)?;
            // The client's messages are copied only when the servers would render them otherwise.
            let originals = rendered_differently(&request.messages).then(|| request.messages.clone());
            if originals.is_some() {
                as_servers_render(route.backend.config.kind, &mut request.messages);
            }
            let started = Instant::now();
            // Every limit the client sent must fit as it is (else it is cut, to the exact room).
            let needed = largest.unwrap_or(default_max_tokens);
            let (plan, request) = blocking(inline, move || {
                let counter = Lenient { counter };
                let prompt = request.prompt();
                // Most prompts fit by far: their bytes bound their tokens, no tokenizing. When
                // the exact count is wanted anyway (a client's tpm), it is the bound, and the
                // template is rendered once.
                let measured = if exact { counter.chat_tokens(prompt) } else { counter.chat_tokens_at_most(prompt) };
                let plan = match measured {
                    Ok(tokens) if tokens.saturating_add(needed) <= cap => {
                        Ok(ChatPlan::Fits { prompt_tokens: tokens, max_tokens: cap - tokens })
                    }
                    _ => overflow::plan_chat(&counter, prompt, budget, action),
                };
                (plan, request)
            })
            .await?;
            let plan = plan.map_err(|e| GatewayError::invalid(e.to_string(), Some("messages")))?;
            let restore = Restore { rewritten: request.messages, originals };
            count_timer.observe(started.elapsed().as_secs_f64());
            match plan {
                // The limits are set from the room the prompt leaves (a client's smaller limit that
                // fits stays; a larger one is cut to the room).
                ChatPlan::Fits { prompt_tokens, .. } => {
                    let room = cap.saturating_sub(prompt_tokens);
                    let transform = set_max_tokens(fields, max_tokens, room, default_max_tokens)?;
                    Ok(Fitted::Send { transform, prompt_tokens: Some(prompt_tokens) })
                }
                ChatPlan::Reject(requested) => Err(reject(requested, PromptPart::Messages)),
                ChatPlan::MiddleOut { messages, removed_tokens, prompt_tokens, .. } => {
                    let room = cap.saturating_sub(prompt_tokens);
                    overflowed(OnOverflow::MiddleOut.label());
                    tracing::info!(model = %model, cap, removed_tokens, "prompt over the context cap: middle-out");
                    fields.insert("messages".into(), raw(&restore.apply(messages))?);
                    let cut = set_max_tokens(fields, max_tokens, room, default_max_tokens)?;
                    let transform = Some(transforms(format!("middle-out; removed_tokens={removed_tokens}"), cut));
                    Ok(Fitted::Send { transform, prompt_tokens: Some(prompt_tokens) })
                }
                ChatPlan::Chunk(plan) => {
                    overflowed(OnOverflow::Chunk.label());
                    tracing::info!(model = %model, cap, pieces = plan.pieces.len(), "prompt over the context cap: chunked");
                    Ok(Fitted::Chunk(Chunked { plan, restore }))
                }
            }
        }
        Endpoint::Completions => {
            let Some(prompt) = fields.get("prompt") else {
                return Ok(Fitted::Send { transform: None, prompt_tokens: None });
            };
            let prompts = Prompts::read(prompt.get(), "prompt")?;
            let started = Instant::now();
            let plans = blocking(inline, move || prompts.plan(&*counter, budget, action)).await?;
            count_timer.observe(started.elapsed().as_secs_f64());
            let mut room = usize::MAX;
            let mut removed = 0;
            // Token arrays are not counted here: their total is left to the estimate.
            let mut counted = Some(0usize);
            let mut rewritten = Vec::with_capacity(plans.len());
            for plan in plans {
                match plan {
                    PromptPlan::Text(TextPlan::Reject(requested)) | PromptPlan::Ids(Err(requested)) => {
                        return Err(reject(requested, PromptPart::Prompt));
                    }
                    PromptPlan::Text(TextPlan::Fits { prompt_tokens, .. }) => {
                        room = room.min(cap.saturating_sub(prompt_tokens));
                        counted = counted.map(|n| n + prompt_tokens);
                        rewritten.push(None);
                    }
                    PromptPlan::Ids(Ok(left)) => {
                        room = room.min(left);
                        counted = None;
                        rewritten.push(None);
                    }
                    PromptPlan::Text(TextPlan::MiddleOut { text, removed_tokens, prompt_tokens, .. }) => {
                        counted = counted.map(|n| n + prompt_tokens);
                        room = room.min(cap.saturating_sub(prompt_tokens));
                        removed += removed_tokens;
                        rewritten.push(Some(text));
                    }
                }
            }
            let cut = set_max_tokens(fields, max_tokens, room, default_max_tokens)?;
            if removed == 0 {
                return Ok(Fitted::Send { transform: cut, prompt_tokens: counted });
            }
            overflowed(OnOverflow::MiddleOut.label());
            let prompt = Prompts::read(fields.get("prompt").map_or("null", |p| p.get()), "prompt")?;
            fields.insert("prompt".into(), raw(&prompt.rewrite(rewritten))?);
            Ok(Fitted::Send {
                transform: Some(transforms(format!("middle-out; removed_tokens={removed}"), cut)),
                prompt_tokens: counted,
            })
        }
        Endpoint::Embeddings => {
            let Some(input) = fields.get("input") else {
                return Ok(Fitted::Send { transform: None, prompt_tokens: None });
            };
            let inputs = Prompts::read(input.get(), "input")?;
            let started = Instant::now();
            let chunk = action == OnOverflow::Chunk;
            let plan = blocking(inline, move || inputs.split(&*counter, cap)).await?;
            count_timer.observe(started.elapsed().as_secs_f64());
            let longest = plan.longest;
            if longest <= cap {
                return Ok(Fitted::Send { transform: None, prompt_tokens: None });
            }
            if !chunk {
                return Err(reject(Requested { prompt: longest, completion: None }, PromptPart::Input));
            }
            overflowed(OnOverflow::Chunk.label());
            Ok(Fitted::Embed(plan.plan))
        }
    }
}

/// The exact count of a chat request's prompt, the one [`fit`] compares with the cap when it
/// tokenizes: the messages as the backend's servers render them, the model's chat template
/// (tools and `chat_template_kwargs` included) and tokenizer, the estimate when the template
/// fails on them or the model has no tokenizer. `POST /v1/messages/count_tokens` answers it.
/// Timed in `mlxgate_prompt_count_seconds` as the cap's counts are. `hold` (a permit of the
/// caller's own share of the pool) is held until the count ends, as the pool's own slot is.
pub(crate) async fn chat_prompt_tokens(
    metrics: &Metrics,
    route: &Route,
    tokens: Option<&ModelTokens>,
    fields: &RawBody,
    hold: impl Send + 'static,
) -> Result<usize, GatewayError> {
    let mut request = ChatRequest::read(fields)?;
    if rendered_differently(&request.messages) {
        as_servers_render(route.backend.config.kind, &mut request.messages);
    }
    let counter: Arc<dyn Count> =
        tokens.map_or_else(|| Arc::new(Estimate) as Arc<dyn Count>, |t| Arc::clone(&t.counter));
    let started = Instant::now();
    let counted = blocking(Inline::allows(fields), move || {
        let _hold = hold;
        Lenient { counter }.chat_tokens(request.prompt())
    })
    .await?;
    metrics.prompt_count_seconds.with_label_values(&[&route.model.name]).observe(started.elapsed().as_secs_f64());
    counted.map_err(|e| GatewayError::invalid(e.to_string(), Some("messages")))
}

/// The messages as the servers hand them to their chat templates (mlx_lm.server's
/// `process_message_content`; vLLM-style servers the same with text parts joined by newlines):
/// text parts joined into one string, a null content made `""`, tool-call arguments given as a
/// JSON string parsed into an object. Counting the messages the template sees gives the
/// server's own count, and templates written for string contents (Qwen's) render them.
fn as_servers_render(kind: Kind, messages: &mut [Value]) {
    let joiner = kind.content_joiner();
    for message in messages.iter_mut() {
        let Some(message) = message.as_object_mut() else { continue };
        match message.get("content") {
            Some(Value::Array(parts)) if parts.iter().all(|p| p["type"] == "text") => {
                let text: Vec<&str> = parts.iter().filter_map(|p| p["text"].as_str()).collect();
                let text = text.join(joiner);
                message.insert("content".into(), Value::String(text));
            }
            Some(Value::Null) => {
                message.insert("content".into(), Value::String(String::new()));
            }
            _ => {}
        }
        let Some(Value::Array(calls)) = message.get_mut("tool_calls") else { continue };
        for call in calls {
            let Some(arguments) = call.get_mut("function").and_then(|f| f.get_mut("arguments")) else { continue };
            if let Some(parsed) =
                arguments.as_str().filter(|a| !a.is_empty()).and_then(|a| serde_json::from_str(a).ok())
            {
                *arguments = parsed;
            }
        }
    }
}

/// Whether [`as_servers_render`] would change any of `messages`.
fn rendered_differently(messages: &[Value]) -> bool {
    messages.iter().any(|message| {
        let text_parts =
            matches!(&message["content"], Value::Array(parts) if parts.iter().all(|p| p["type"] == "text"));
        let string_arguments = message["tool_calls"]
            .as_array()
            .is_some_and(|calls| calls.iter().any(|c| c["function"]["arguments"].is_string()));
        text_parts || message.get("content").is_some_and(Value::is_null) || string_arguments
    })
}

/// The model's counter, falling back to the estimate for a request its chat template fails on
/// (a template that expects string contents given image parts, roles it refuses): counting
/// never refuses a request the backend itself may take.
struct Lenient {
    counter: Arc<dyn Count>,
}

impl Lenient {
    fn or_estimate(
        &self,
        prompt: ChatPrompt<'_>,
        count: impl Fn(&dyn Count, ChatPrompt<'_>) -> Result<usize, crate::tokens::CountError>,
    ) -> Result<usize, crate::tokens::CountError> {
        count(&*self.counter, prompt).or_else(|e| {
            tracing::info!(error = %e, "the chat template failed on this request: its prompt is counted with the estimate");
            count(&Estimate, prompt)
        })
    }
}

impl Count for Lenient {
    fn chat_tokens(&self, prompt: ChatPrompt<'_>) -> Result<usize, crate::tokens::CountError> {
        self.or_estimate(prompt, |c, p| c.chat_tokens(p))
    }
    fn chat_tokens_at_most(&self, prompt: ChatPrompt<'_>) -> Result<usize, crate::tokens::CountError> {
        self.or_estimate(prompt, |c, p| c.chat_tokens_at_most(p))
    }
    fn text_tokens(&self, text: &str) -> usize {
        self.counter.text_tokens(text)
    }
    fn encode(&self, text: &str) -> Vec<u32> {
        self.counter.encode(text)
    }
    fn decode(&self, ids: &[u32]) -> String {
        self.counter.decode(ids)
    }
    fn exact(&self) -> bool {
        self.counter.exact()
    }
}

/// Prompts counted at once: one per core (a count is pure CPU; more at once only makes each
/// slower and lets a few huge bodies take the machine).
fn counting() -> &'static tokio::sync::Semaphore {
    static COUNTING: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    COUNTING.get_or_init(|| {
        tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(2, std::num::NonZero::get))
    })
}

/// Small, flat request bodies are counted on the async thread that read them: the count of such
/// a prompt (a template over a few short messages) takes tens of microseconds, less than handing
/// it to a blocking thread and back, which cost a features-on gateway ~25 µs of futex, epoll and
/// context switches per request on one CPU (bench/overhead's profiles of `mlxgate-full`).
///
/// Both bounds matter: the template, not the body, decides the work, and what a template can
/// blow up is nesting (Llama 3's renders tools with `tojson(indent=4)`: a 343-byte body of
/// tools nested 120 deep rendered to 57 KB, ~20 ms of tokenizing). Messages with content parts
/// are 5 deep (`messages[{content[{text}]}]`); a tool's schema is deeper, and goes to the
/// blocking threads with every larger body.
#[derive(Debug, Clone, Copy)]
struct Inline;

impl Inline {
    /// Largest body counted inline (the fields' keys and raw values).
    const MAX_BYTES: usize = 512;
    /// Deepest nesting of arrays and objects counted inline, the body's own object included
    /// (so a field nests less).
    const MAX_DEPTH: usize = 5;

    /// Whether the body of `fields` is small and flat enough to count inline.
    fn allows(fields: &RawBody) -> bool {
        let bytes: usize = fields.iter().map(|(key, value)| key.len() + value.get().len()).sum();
        bytes <= Self::MAX_BYTES && fields.values().all(|v| nesting(v.get()) < Self::MAX_DEPTH)
    }
}

/// How deep arrays and objects nest in the JSON text `raw` (0 for a string or a number),
/// brackets inside strings not counted.
fn nesting(raw: &str) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for byte in raw.bytes() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Runs CPU work (template rendering, tokenizing): inline when [`Inline::allows`] the body,
/// else off the async threads, one per core at once. A panic in it (a tokenizer's, a
/// template's) is an internal error either way, not a dropped connection. The work holds its
/// slot until it ends, not until its caller stops waiting: a client that hangs up mid-count
/// (a blocking task cannot be stopped) does not free a core still counting for it.
async fn blocking<T: Send + 'static>(
    inline: bool,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, GatewayError> {
    if inline {
        return std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).map_err(|_| {
            tracing::error!("counting a prompt panicked");
            GatewayError::Internal("counting the prompt failed".into())
        });
    }
    let permit = counting().acquire().await.map_err(|e| GatewayError::Internal(format!("counting: {e}")))?;
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        work()
    })
    .await
    .map_err(|e| {
        tracing::error!(error = %e, "counting a prompt failed");
        GatewayError::Internal(format!("counting the prompt failed: {e}"))
    })
}

/// The limits a client sent on its answer (`max_tokens`, `max_completion_tokens`; a null is
/// none). When it sent both, servers differ in which they read: the smaller is the answer the
/// client is ready for (the plans' `max_tokens`), and a larger one is cut to the room left all
/// the same (see [`set_max_tokens`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Limits {
    smallest: Option<usize>,
    largest: Option<usize>,
}

fn requested_max_tokens(fields: &RawBody) -> Result<Limits, GatewayError> {
    let mut limits = Limits::default();
    for key in ["max_completion_tokens", "max_tokens"] {
        let Some(raw) = fields.get(key) else { continue };
        if raw.get() == "null" {
            continue;
        }
        let n: u64 = serde_json::from_str(raw.get()).map_err(|_| GatewayError::InvalidRequest {
            message: format!("`{key}` must be a non-negative integer"),
            param: Some(key),
        })?;
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        limits.smallest = Some(limits.smallest.map_or(n, |m| m.min(n)));
        limits.largest = Some(limits.largest.map_or(n, |m| m.max(n)));
    }
    Ok(limits)
}

/// Sets the limits the backend gets from `room`, what the prompt leaves under the cap: when the
/// client gave none, the model's default cut to the room (a 30k-token prompt on a 32k cap gets
/// the 2k that fit, not a 400); each of `max_tokens` and `max_completion_tokens` the client sent
/// that is larger than the room (OpenCode sends `max_tokens: 32000`) is cut to it, a smaller one
/// stays. Returns the `x-mlxgate-transform` entry when a limit was cut (`max_tokens=N`).
fn set_max_tokens(
    fields: &mut RawBody,
    given: Option<usize>,
    room: usize,
    default: usize,
) -> Result<Option<String>, GatewayError> {
    if given.is_none() {
        let max_tokens = default.min(room).max(1);
        fields.insert("max_tokens".into(), raw(&max_tokens)?);
        return Ok(None);
    }
    // Each limit the client sent is cut on its own, never raised: a smaller one stays its own.
    let mut cut = false;
    for key in ["max_tokens", "max_completion_tokens"] {
        let sent = fields.get(key).and_then(|v| serde_json::from_str::<u64>(v.get()).ok());
        if sent.is_some_and(|n| n > room as u64) {
            fields.insert(key.into(), raw(&room)?);
            cut = true;
        }
    }
    Ok(cut.then(|| format!("max_tokens={room}")))
}

/// The `x-mlxgate-transform` value of a prompt transform and, when it was also cut, the
/// client's limit (`middle-out; removed_tokens=K, max_tokens=N`).
fn transforms(transform: String, cut: Option<String>) -> String {
    match cut {
        Some(cut) => format!("{transform}, {cut}"),
        None => transform,
    }
}

pub(crate) fn raw<T: serde::Serialize + ?Sized>(value: &T) -> Result<Box<RawValue>, GatewayError> {
    serde_json::value::to_raw_value(value).map_err(|e| GatewayError::invalid(format!("cannot encode: {e}"), None))
}

/// A chat request's prompt fields, owned (they go to a blocking thread).
struct ChatRequest {
    messages: Vec<Value>,
    tools: Option<Vec<Value>>,
    kwargs: Option<serde_json::Map<String, Value>>,
}

impl ChatRequest {
    fn read(fields: &RawBody) -> Result<ChatRequest, GatewayError> {
        let messages = fields
            .get("messages")
            .ok_or_else(|| GatewayError::invalid("you must provide a messages parameter", Some("messages")))?;
        let messages: Vec<Value> = serde_json::from_str(messages.get())
            .map_err(|_| GatewayError::invalid("`messages` must be an array of message objects", Some("messages")))?;
        if let Some(i) = messages.iter().position(|m| !m.is_object()) {
            return Err(GatewayError::invalid(format!("`messages[{i}]` must be an object"), Some("messages")));
        }
        let tools = match fields.get("tools").map(|t| t.get()) {
            None | Some("null") => None,
            Some(text) => Some(
                serde_json::from_str(text)
                    .map_err(|_| GatewayError::invalid("`tools` must be an array", Some("tools")))?,
            ),
        };
        let kwargs = match fields.get("chat_template_kwargs").map(|t| t.get()) {
            None | Some("null") => None,
            Some(text) => Some(serde_json::from_str(text).map_err(|_| {
                GatewayError::invalid("`chat_template_kwargs` must be an object", Some("chat_template_kwargs"))
            })?),
        };
        Ok(ChatRequest { messages, tools, kwargs })
    }

    fn prompt(&self) -> ChatPrompt<'_> {
        ChatPrompt { messages: &self.messages, tools: self.tools.as_deref(), template_kwargs: self.kwargs.as_ref() }
    }
}

/// A `/v1/completions` `prompt` or a `/v1/embeddings` `input`: a string, a list of strings, a
/// token array, or a list of token arrays.
#[derive(Debug)]
enum Prompts {
    One(PromptItem),
    Many(Vec<PromptItem>),
}

#[derive(Debug, Clone)]
enum PromptItem {
    Text(String),
    Ids(Vec<u64>),
}

/// One prompt's plan: a text's, or a token array's (`Ok(room)` / `Err(requested)`: token arrays
/// are never rewritten).
enum PromptPlan {
    Text(TextPlan),
    Ids(Result<usize, Requested>),
}

/// The embedding inputs split where needed, and the longest input's tokens.
struct EmbedSplit {
    plan: EmbedPlan,
    longest: usize,
}

impl Prompts {
    fn read(text: &str, field: &'static str) -> Result<Prompts, GatewayError> {
        let bad = || {
            GatewayError::invalid(
                format!("`{field}` must be a string, an array of strings, or an array of token arrays"),
                Some(field),
            )
        };
        let value: Value = serde_json::from_str(text).map_err(|_| bad())?;
        let item = |v: &Value| -> Option<PromptItem> {
            match v {
                Value::String(s) => Some(PromptItem::Text(s.clone())),
                Value::Array(a) => a.iter().map(Value::as_u64).collect::<Option<Vec<_>>>().map(PromptItem::Ids),
                _ => None,
            }
        };
        match &value {
            Value::String(_) => Ok(Prompts::One(item(&value).ok_or_else(bad)?)),
            Value::Array(a) if a.iter().all(Value::is_u64) => Ok(Prompts::One(item(&value).ok_or_else(bad)?)),
            Value::Array(a) => Ok(Prompts::Many(a.iter().map(item).collect::<Option<Vec<_>>>().ok_or_else(bad)?)),
            _ => Err(bad()),
        }
    }

    fn items(&self) -> &[PromptItem] {
        match self {
            Prompts::One(item) => std::slice::from_ref(item),
            Prompts::Many(items) => items,
        }
    }

    fn plan(&self, counter: &dyn Count, budget: Budget, action: OnOverflow) -> Vec<PromptPlan> {
        self.items()
            .iter()
            .map(|item| match item {
                PromptItem::Text(text) => PromptPlan::Text(overflow::plan_text(counter, text, budget, action)),
                PromptItem::Ids(ids) => PromptPlan::Ids(fit_ids(ids.len(), budget)),
            })
            .collect()
    }

    /// The prompt with the middle-outed texts put in place.
    fn rewrite(self, texts: Vec<Option<String>>) -> Value {
        let put = |item: PromptItem, text: Option<String>| match (item, text) {
            (_, Some(text)) => Value::String(text),
            (PromptItem::Text(t), None) => Value::String(t),
            (PromptItem::Ids(ids), None) => Value::from(ids),
        };
        let mut texts = texts.into_iter();
        match self {
            Prompts::One(item) => put(item, texts.next().flatten()),
            Prompts::Many(items) => Value::Array(items.into_iter().map(|i| put(i, texts.next().flatten())).collect()),
        }
    }

    /// Splits every input over `cap` at token boundaries (texts with the planner, token arrays
    /// in slices of `cap`).
    fn split(&self, counter: &dyn Count, cap: usize) -> EmbedSplit {
        // Room for what the tokenizer adds around every text (BOS/EOS, CLS/SEP).
        let specials = counter.text_tokens("");
        let room = cap.saturating_sub(specials).max(1);
        let mut pieces = Vec::new();
        let mut groups = Vec::new();
        let mut longest = 0;
        for item in self.items() {
            let mut group = Vec::new();
            match item {
                PromptItem::Text(text) => {
                    let tokens = counter.text_tokens(text);
                    longest = longest.max(tokens);
                    if tokens <= cap {
                        group.push((pieces.len(), tokens));
                        pieces.push(Value::String(text.clone()));
                    } else {
                        for (piece, n) in overflow::split_for_embedding(counter, text, room) {
                            group.push((pieces.len(), n));
                            pieces.push(Value::String(piece));
                        }
                    }
                }
                PromptItem::Ids(ids) => {
                    longest = longest.max(ids.len() + specials);
                    for slice in ids.chunks(room) {
                        group.push((pieces.len(), slice.len()));
                        pieces.push(Value::from(slice.to_vec()));
                    }
                    if ids.is_empty() {
                        group.push((pieces.len(), 0));
                        pieces.push(Value::Array(vec![]));
                    }
                }
            }
            groups.push(group);
        }
        EmbedSplit { plan: EmbedPlan { pieces, groups }, longest }
    }
}

/// A token-array prompt: `Ok(the room it leaves)` when it fits by the rule of every prompt
/// ([`Budget::fitting`]), else `Err(what a rejection reports)`.
fn fit_ids(len: usize, budget: Budget) -> Result<usize, Requested> {
    budget.fitting(len).map(|_| budget.cap - len).ok_or_else(|| budget.requested(len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn a_count_whose_caller_stopped_waiting_keeps_its_core_until_it_ends() {
        // Fill the pool with counts that block, then drop their callers (a client hanging up).
        let pool = counting().available_permits();
        assert!(pool > 0);
        let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
        let mut releases = Vec::new();
        let mut callers = Vec::new();
        for _ in 0..pool {
            let (release, wait) = std::sync::mpsc::channel::<()>();
            releases.push(release);
            let started_tx = started_tx.clone();
            callers.push(tokio::spawn(blocking(false, move || {
                let _ = started_tx.send(());
                let _ = wait.recv();
            })));
        }
        for _ in 0..pool {
            started.recv().await.expect("a count started");
        }
        for caller in &callers {
            caller.abort();
        }
        for caller in callers {
            assert!(caller.await.expect_err("aborted").is_cancelled());
        }
        assert_eq!(counting().available_permits(), 0, "the counts still running hold every core");
        drop(releases);
        let all = counting().acquire_many(u32::try_from(pool).expect("cores")).await.expect("open");
        drop(all);
    }

    #[test]
    fn messages_are_counted_as_mlx_lm_server_renders_them() {
        let mut messages = vec![
            json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]}),
            json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}),
        ];
        assert!(rendered_differently(&messages));
        as_servers_render(Kind::MlxLm, &mut messages);
        assert!(!rendered_differently(&messages[..2]), "rendered once, nothing left to render");
        assert_eq!(messages[0]["content"], "ab");
        assert_eq!(messages[1]["content"], "");
        assert_eq!(messages[1]["tool_calls"][0]["function"]["arguments"], json!({"x": 1}));
        assert!(messages[2]["content"].is_array(), "image parts are left to the server");
    }

    #[test]
    fn prompts_read_every_openai_shape() {
        assert!(matches!(Prompts::read(r#""hi""#, "prompt").unwrap(), Prompts::One(PromptItem::Text(_))));
        assert!(matches!(Prompts::read("[1,2,3]", "prompt").unwrap(), Prompts::One(PromptItem::Ids(_))));
        let many = Prompts::read(r#"["a", [1, 2], "b"]"#, "prompt").unwrap();
        assert_eq!(many.items().len(), 3);
        assert!(Prompts::read("{}", "prompt").is_err());
        assert!(Prompts::read(r#"["a", {"x": 1}]"#, "input").is_err());
        assert!(Prompts::read("[1, -2]", "prompt").is_err());
    }

    #[test]
    fn token_arrays_get_the_room_left_or_are_rejected_in_openais_two_wordings() {
        let budget = |max_tokens| Budget { cap: 100, max_tokens, min_room: 20 };
        assert_eq!(fit_ids(10, budget(Some(90))), Ok(90));
        // Over the cap with the completion: cut to the room left, not refused.
        assert_eq!(fit_ids(10, budget(Some(91))), Ok(90));
        assert_eq!(fit_ids(10, budget(None)), Ok(90));
        // Less than min_room left: refused, the completion counted (the room the gateway keeps
        // when the client gave none).
        assert_eq!(fit_ids(85, budget(Some(91))), Err(Requested { prompt: 85, completion: Some(91) }));
        assert_eq!(fit_ids(85, budget(None)), Err(Requested { prompt: 85, completion: Some(20) }));
        // A client asking for fewer tokens than min_room needs only those.
        assert_eq!(fit_ids(85, budget(Some(15))), Ok(15));
        // The prompt alone over the cap: "your prompt resulted in N tokens".
        assert_eq!(fit_ids(101, budget(Some(1))), Err(Requested { prompt: 101, completion: None }));
    }

    #[test]
    fn each_limit_the_client_sent_is_cut_on_its_own_and_never_raised() {
        let mut fields: RawBody =
            serde_json::from_str(r#"{"max_completion_tokens": 32000, "max_tokens": 100}"#).expect("JSON");
        let given = requested_max_tokens(&fields).expect("valid").smallest;
        assert_eq!(given, Some(100), "the smaller decides");
        assert_eq!(set_max_tokens(&mut fields, given, 1029, 4096).expect("set"), Some("max_tokens=1029".into()));
        assert_eq!(fields["max_completion_tokens"].get(), "1029");
        assert_eq!(fields["max_tokens"].get(), "100", "the client's smaller limit stays");
        let mut fields: RawBody = serde_json::from_str(r#"{"max_tokens": 32000}"#).expect("JSON");
        assert_eq!(set_max_tokens(&mut fields, Some(32000), 700, 4096).expect("set"), Some("max_tokens=700".into()));
        assert_eq!(fields["max_tokens"].get(), "700");
        assert!(!fields.contains_key("max_completion_tokens"), "no field the client did not send");
        let mut fields: RawBody = serde_json::from_str(r#"{"max_tokens": 50}"#).expect("JSON");
        assert_eq!(set_max_tokens(&mut fields, Some(50), 700, 4096).expect("set"), None);
        assert_eq!(fields["max_tokens"].get(), "50");
    }

    #[test]
    fn max_tokens_is_read_from_either_name() {
        let fields: RawBody = serde_json::from_str(r#"{"max_completion_tokens": 7, "max_tokens": 9}"#).unwrap();
        let limits = requested_max_tokens(&fields).unwrap();
        assert_eq!((limits.smallest, limits.largest), (Some(7), Some(9)));
        let fields: RawBody = serde_json::from_str(r#"{"max_completion_tokens": 7, "max_tokens": null}"#).unwrap();
        assert_eq!(requested_max_tokens(&fields).unwrap(), Limits { smallest: Some(7), largest: Some(7) });
        let fields: RawBody = serde_json::from_str(r#"{"max_tokens": null}"#).unwrap();
        assert_eq!(requested_max_tokens(&fields).unwrap(), Limits::default());
        let fields: RawBody = serde_json::from_str(r#"{"max_tokens": -1}"#).unwrap();
        assert!(requested_max_tokens(&fields).is_err());
    }

    #[test]
    fn small_flat_bodies_are_counted_inline_and_nested_or_large_ones_are_not() {
        assert_eq!(nesting(r#""a [string] {with} brackets \" ["#), 0);
        assert_eq!(nesting(r#"[{"content":[{"type":"text","text":"]]]"}]}]"#), 4);
        let body = |text: &str| -> RawBody { serde_json::from_str(text).expect("a JSON object") };
        let chat = r#"{"model":"m","messages":[{"role":"user","content":"Say hello in one word."}]}"#;
        assert!(Inline::allows(&body(chat)));
        let parts = r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#;
        assert!(Inline::allows(&body(parts)), "content parts are 5 deep");
        // The review's case: tools nested deep in a small body render to tens of KB.
        let deep = format!(r#"{{"model":"m","messages":[],"tools":{}{}}}"#, "[".repeat(120), "]".repeat(120));
        assert!(deep.len() <= Inline::MAX_BYTES && !Inline::allows(&body(&deep)));
        let tool = r#"{"model":"m","messages":[],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"string"}}}}}]}"#;
        assert!(!Inline::allows(&body(tool)), "a tool's schema is deeper than messages");
        let long = format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#, "word ".repeat(200));
        assert!(!Inline::allows(&body(&long)));
    }
}
