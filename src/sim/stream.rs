//! Writes one simulated response stream: keepalives during prefill, paced token chunks, usage
//! where the plan puts it, injected faults, and the byte splitting that tests the gateway's
//! parser. Runs as its own task feeding the response body through a small channel, so pacing is
//! real: nothing is written before its time.

use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::SimState;
use super::behaviour::{AfterError, ContentField, Keepalive, Plan, RolePlacement, UsagePlacement};
use super::script::{Reply, ToolCall, argument_pieces, text_pieces};

/// What one request asked for.
pub struct Job {
    pub id: String,
    pub model: String,
    pub chat: bool,
    pub prompt_tokens: u32,
    /// Prompt tokens served from the cache, when the style reports them.
    pub cached_tokens: Option<u32>,
    pub completion_tokens: u32,
    pub finish_reason: &'static str,
    pub include_usage: bool,
    /// The scripted reply, when the server has a script (chat only).
    pub scripted: Option<Scripted>,
    /// The sequence the LRU prompt cache stores when the answer ends (`None`: no such cache).
    pub remember: Option<Vec<String>>,
}

/// A scripted reply cut into the pieces it is sent in.
pub struct Scripted {
    /// The text, a word (with its following space) per piece.
    pieces: Vec<String>,
    calls: Vec<ToolCall>,
}

impl Scripted {
    /// The pieces of `reply`.
    pub fn of(reply: Reply) -> Self {
        Scripted { pieces: text_pieces(&reply.text), calls: reply.calls }
    }

    /// The tokens usage reports: a text piece, a call's name and an argument piece count one each.
    pub fn completion_tokens(&self) -> u32 {
        let calls: usize = self.calls.iter().map(|c| 1 + argument_pieces(&c.arguments).len()).sum();
        u32::try_from(self.pieces.len() + calls).unwrap_or(u32::MAX)
    }
}

impl Job {
    /// How many text tokens the answer has.
    pub fn text_tokens(&self) -> u32 {
        match &self.scripted {
            Some(s) => u32::try_from(s.pieces.len()).unwrap_or(u32::MAX),
            None => self.completion_tokens,
        }
    }

    /// The text of the `i`-th token.
    pub fn token(&self, i: u32) -> String {
        match &self.scripted {
            Some(s) => s.pieces.get(i as usize).cloned().unwrap_or_default(),
            None => token_text(i),
        }
    }

    /// The scripted tool calls (none without a script).
    pub fn tool_calls(&self) -> &[ToolCall] {
        self.scripted.as_ref().map_or(&[], |s| s.calls.as_slice())
    }

    /// The id of the answer's `k`-th tool call.
    pub fn call_id(&self, k: usize) -> String {
        format!("call_{}_{k}", self.id.replace(['-', '_'], ""))
    }

    /// `tool_calls` when the answer calls tools, else how the text ended.
    pub fn finish_reason(&self) -> &'static str {
        if self.tool_calls().is_empty() { self.finish_reason } else { "tool_calls" }
    }
}

/// One write of the body, or the connection dropped.
pub type Write = Result<Bytes, std::io::Error>;

/// Sends the body's writes into `tx`; stops early when the client goes away.
pub async fn write_stream(state: &SimState, plan: &Plan, job: &Job, tx: mpsc::Sender<Write>) {
    let out = Writer { tx, split: plan.bytes_per_write, keep_generating: plan.keep_generating };
    if plan.drop_after == Some(0) {
        out.drop_connection().await;
        return;
    }
    if !prefill(plan, job, &out).await {
        return;
    }
    let created = super::now_secs();
    if job.chat
        && plan.role == RolePlacement::First
        && !out.frame(&chunk(job, created, json!({"role": "assistant"}), None)).await
    {
        return;
    }
    let mut held_back = Vec::new();
    let mut content_frames = 0u32;
    for i in 0..job.text_tokens() {
        if plan.exit_after == Some(i) {
            // What was written before a crash has reached the socket: let the connection
            // take everything queued, then die.
            while out.tx.capacity() < out.tx.max_capacity() && !out.tx.is_closed() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            state.crash();
            // Keep the body open until the crash cuts the connection: ending it here would
            // let the server finish the chunked body cleanly.
            out.tx.closed().await;
            return;
        }
        if plan.hang_after == Some(i) {
            out.tx.closed().await;
            return;
        }
        if i > 0 && plan.drop_after == Some(i) {
            out.drop_connection().await;
            return;
        }
        if plan.error_after == Some(i) {
            let error = json!({"error": {"message": "simulated failure during generation", "type": "server_error", "code": 500}});
            if !out.frame(&error).await {
                return;
            }
            if plan.after_error == AfterError::StopAndDone {
                let _ = out.frame(&finish_chunk(job, created, plan, "stop", None)).await && out.done().await;
            }
            return;
        }
        if i > 0 && !out.pace(state.token_interval(plan)).await {
            return;
        }
        let text = job.token(i);
        let delta = match (job.chat, plan.content_field) {
            (_, ContentField::None) => None,
            (false, _) => Some(json!({"text": text})),
            (true, ContentField::Content) => Some(json!({"content": text})),
            (true, ContentField::ReasoningContent) => Some(json!({"reasoning_content": text})),
            (true, ContentField::BothReasoning) => Some(json!({"reasoning_content": text, "reasoning": text})),
        };
        let Some(mut delta) = delta else { continue };
        if job.chat && plan.role == RolePlacement::Every {
            delta["role"] = json!("assistant");
        }
        let frame = if job.chat { chunk(job, created, delta, None) } else { text_chunk(job, created, &delta, None) };
        if plan.burst {
            held_back.push(frame);
            continue;
        }
        if !out.frame(&frame).await {
            return;
        }
        content_frames += 1;
        if plan.hold_after == Some(content_frames) && !state.hold(&plan.hold_key, &out.tx).await {
            return;
        }
    }
    if !held_back.is_empty() {
        let all: String = held_back.iter().map(|f| format!("data: {f}\n\n")).collect();
        if !out.raw(Bytes::from(all)).await {
            return;
        }
    }
    if !send_tool_calls(state, plan, job, created, &out).await {
        return;
    }
    // The server stores the sequence as it queues the last token, before the client reads the end.
    if let Some(sequence) = &job.remember {
        state.remember(sequence.clone(), super::prompt_cache::Kind::Assistant);
    }
    let usage = job.include_usage || plan.usage_always;
    let finish_usage = usage && matches!(plan.usage, UsagePlacement::Finish | UsagePlacement::Both);
    let reason = if plan.tool_call && job.chat { "tool_calls" } else { job.finish_reason() };
    let mut finish = finish_chunk(job, created, plan, reason, finish_usage.then(|| usage_of(job)));
    if plan.tool_call && job.chat {
        finish["choices"][0]["delta"]["tool_calls"] = json!([{"id": format!("call_{}", job.id), "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]);
    }
    if !out.frame(&finish).await {
        return;
    }
    if usage && plan.usage == UsagePlacement::RepeatFinish {
        // mlx-omni-server: the finish again, its delta the role alone, with the usage.
        let repeat = finish_chunk(job, created, plan, reason, Some(usage_of(job)));
        if !out.frame(&repeat).await {
            return;
        }
    }
    if usage && matches!(plan.usage, UsagePlacement::Separate | UsagePlacement::Both) {
        let mut only = chunk(job, created, json!({}), Some(usage_of(job)));
        only["choices"] = json!([]);
        if !out.frame(&only).await {
            return;
        }
    }
    out.done().await;
}

/// Streams the scripted tool calls as real servers do: per call, a first delta with its
/// `index`, `id`, `type` and `function.name` (arguments empty), then the arguments in several
/// deltas carrying only `index` and `function.arguments`; false when the client left.
async fn send_tool_calls(state: &SimState, plan: &Plan, job: &Job, created: u64, out: &Writer) -> bool {
    let mut first = job.text_tokens() == 0;
    for (k, call) in job.tool_calls().iter().enumerate() {
        let opening = json!({"index": k, "id": job.call_id(k), "type": "function",
            "function": {"name": call.name, "arguments": ""}});
        let pieces = argument_pieces(&call.arguments)
            .into_iter()
            .map(|piece| json!({"index": k, "function": {"arguments": piece}}));
        for tool_call in std::iter::once(opening).chain(pieces) {
            if !first && !out.pace(state.token_interval(plan)).await {
                return false;
            }
            first = false;
            let mut delta = json!({"tool_calls": [tool_call]});
            if plan.role == RolePlacement::Every {
                delta["role"] = json!("assistant");
            }
            if !out.frame(&chunk(job, created, delta, None)).await {
                return false;
            }
        }
    }
    true
}

/// Waits out the time to first token, sending keepalives; false when the client left.
async fn prefill(plan: &Plan, job: &Job, out: &Writer) -> bool {
    let total = Duration::from_millis(plan.ttft_ms);
    let interval = Duration::from_millis(plan.keepalive_ms);
    let started = tokio::time::Instant::now();
    let mut sent = 0u64;
    loop {
        let elapsed = started.elapsed();
        if plan.keepalive == Keepalive::Omlx && (sent == 0 || elapsed >= interval * sent as u32) {
            let fake = json!({"id": "chatcmpl-keepalive", "object": "chat.completion.chunk", "created": super::now_secs(),
                "model": job.model, "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": null}]});
            if !out.frame(&fake).await {
                return false;
            }
            sent += 1;
        }
        if elapsed >= total {
            return true;
        }
        let next_keepalive = match plan.keepalive {
            Keepalive::None => total,
            _ => interval * (sent as u32 + u32::from(plan.keepalive == Keepalive::Comment)),
        };
        if !out.pace(next_keepalive.min(total).saturating_sub(elapsed)).await {
            return false;
        }
        if plan.keepalive == Keepalive::Comment && started.elapsed() < total {
            sent += 1;
            let done = (job.prompt_tokens as u64 * started.elapsed().as_millis() as u64) / plan.ttft_ms.max(1);
            let comment = format!(": keepalive {done}/{}\n\n", job.prompt_tokens);
            if !out.raw(Bytes::from(comment)).await {
                return false;
            }
        }
    }
}

/// The OpenAI usage object of a finished job, with `prompt_tokens_details.cached_tokens` when
/// the style reports it (mlx_lm.server's shape).
pub fn usage_of(job: &Job) -> Value {
    let mut usage = json!({"prompt_tokens": job.prompt_tokens, "completion_tokens": job.completion_tokens,
        "total_tokens": job.prompt_tokens + job.completion_tokens});
    if let Some(cached) = job.cached_tokens {
        usage["prompt_tokens_details"] = json!({"cached_tokens": cached});
    }
    usage
}

fn chunk(job: &Job, created: u64, delta: Value, usage: Option<Value>) -> Value {
    let mut c = json!({"id": job.id, "object": "chat.completion.chunk", "created": created, "model": job.model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": null}]});
    if let Some(u) = usage {
        c["usage"] = u;
    }
    c
}

fn text_chunk(job: &Job, created: u64, delta: &Value, usage: Option<Value>) -> Value {
    let mut c = json!({"id": job.id, "object": "text_completion", "created": created, "model": job.model,
        "choices": [{"index": 0, "text": delta["text"], "finish_reason": null}]});
    if let Some(u) = usage {
        c["usage"] = u;
    }
    c
}

fn finish_chunk(job: &Job, created: u64, plan: &Plan, reason: &str, usage: Option<Value>) -> Value {
    let mut c = if job.chat {
        let mut delta = json!({});
        if plan.role == RolePlacement::Every {
            delta["role"] = json!("assistant");
        }
        chunk(job, created, delta, usage)
    } else {
        text_chunk(job, created, &json!({"text": ""}), usage)
    };
    c["choices"][0]["finish_reason"] = json!(reason);
    c
}

/// The answer to a stream that arrives while another generates, in vllm-mlx's simple mode: a
/// role chunk, an in-band error event, `[DONE]`.
pub fn busy_body(job: &Job) -> String {
    let role = chunk(job, super::now_secs(), json!({"role": "assistant"}), None);
    let error = json!({"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}});
    format!("data: {role}\n\ndata: {error}\n\ndata: [DONE]\n\n")
}

/// The text of the `i`-th generated token.
pub fn token_text(i: u32) -> String {
    format!("t{i} ")
}

/// The channel into the response body, with byte splitting.
struct Writer {
    tx: mpsc::Sender<Write>,
    split: usize,
    /// A client that left does not stop the generation: writes to nobody count as sent.
    keep_generating: bool,
}

impl Writer {
    async fn frame(&self, value: &Value) -> bool {
        self.raw(Bytes::from(format!("data: {value}\n\n"))).await
    }

    async fn done(&self) -> bool {
        self.raw(Bytes::from_static(b"data: [DONE]\n\n")).await
    }

    /// Sends `bytes`, as pieces of `split` bytes when splitting (each piece its own write).
    async fn raw(&self, bytes: Bytes) -> bool {
        if self.split == 0 || bytes.len() <= self.split {
            return self.tx.send(Ok(bytes)).await.is_ok() || self.keep_generating;
        }
        let mut rest = bytes;
        while !rest.is_empty() {
            let piece = rest.split_to(self.split.min(rest.len()));
            if self.tx.send(Ok(piece)).await.is_err() {
                return self.keep_generating;
            }
            // Give the connection task a turn so the piece leaves as its own write.
            tokio::task::yield_now().await;
        }
        true
    }

    /// Drops the connection (the body fails; the process lives on).
    async fn drop_connection(&self) {
        let dropped = std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "mlxgate-sim: drop_after");
        let _ = self.tx.send(Err(dropped)).await;
    }

    /// Sleeps `d` unless the client leaves first; false when it left (and the server stops).
    async fn pace(&self, d: Duration) -> bool {
        if self.keep_generating {
            tokio::time::sleep(d).await;
            return true;
        }
        tokio::select! {
            () = tokio::time::sleep(d) => true,
            () = self.tx.closed() => false,
        }
    }
}
