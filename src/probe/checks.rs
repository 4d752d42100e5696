//! Each measurement of `mlxgate probe`: one streamed request read event by event (with the
//! gateway's own SSE parser and frame reader), and what its events say — role chunk, keepalive
//! style, usage placement, `[DONE]`, reasoning field, finish reason — then keep-alive and its
//! idle timeout, the Host and Origin checks, error statuses and body shapes, two concurrent
//! streams, and whether a client's disconnect stops the generation.
//!
//! Everything runs under one [`Budget`] (the probe's deadline): a response head must come within
//! `HEAD_LIMIT`, a stream may be silent for at most `STALL_LIMIT`, and a stream keeps at most
//! `MAX_EVENTS` events. A stream that ends without `finish_reason` or `[DONE]` is a failure of
//! that check, never a fact about the server.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::wire::{Connection, Head, Target, exchange, exchange_with};
use crate::stream::frame::{self, Seen};
use crate::stream::sse::{Item, SseParser};

/// Longest wait for a response head.
pub const HEAD_LIMIT: Duration = Duration::from_secs(20);
/// Longest silence inside a stream (servers with keepalives send one every 20 s at most).
pub const STALL_LIMIT: Duration = Duration::from_secs(25);
/// Most events one stream may send before the probe gives up on it.
pub const MAX_EVENTS: usize = 20_000;
/// Most bytes one stream may send before the probe gives up on it (an event without end would
/// otherwise grow the SSE parser's buffer).
pub const MAX_STREAM_BYTES: usize = 16 << 20;

/// The probe's overall deadline, shared by every request.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    end: Instant,
    total: Duration,
}

impl Budget {
    /// A deadline `total` from now.
    pub fn new(total: Duration) -> Budget {
        Budget { end: Instant::now() + total, total }
    }

    /// Time left before the deadline.
    pub fn left(&self) -> Duration {
        self.end.saturating_duration_since(Instant::now())
    }

    /// Runs `work` for at most `limit` (and never past the deadline); the error says which ran
    /// out, with `waiting` describing what did not come ("no response head").
    pub async fn within<T>(&self, limit: Duration, waiting: &str, work: impl Future<Output = T>) -> Result<T, String> {
        let left = self.left();
        let allowed = limit.min(left);
        tokio::time::timeout(allowed, work).await.map_err(|_| {
            if allowed < limit {
                format!(
                    "the probe's deadline ({}) ran out: {waiting} within {:.1} s",
                    humantime::format_duration(self.total),
                    allowed.as_secs_f64()
                )
            } else {
                format!("{waiting} within {} s", limit.as_secs())
            }
        })
    }

    /// Whether the deadline has passed.
    pub fn spent(&self) -> bool {
        self.left().is_zero()
    }

    /// The reason a case is skipped once the deadline has passed.
    pub fn spent_reason(&self) -> String {
        format!("the probe's deadline ({}) ran out first", humantime::format_duration(self.total))
    }
}

/// One thing a stream said, when (from the request's send).
#[derive(Debug)]
pub enum Said {
    Comment(String),
    Data { json: Value, seen: Seen, at: Duration },
    Unreadable(String),
    Done,
}

/// A streamed response as read off the wire.
#[derive(Debug)]
pub struct StreamRecord {
    pub head: Head,
    pub said: Vec<Said>,
    /// The body ended as its framing says.
    pub complete: bool,
    /// The body ended early: EOF before the 0-chunk or the length.
    pub truncated: bool,
    /// The client left after the first output (`leave_after_output`).
    pub left: bool,
    /// When the body ended (or was left), from the request's send.
    pub ended: Duration,
    /// The body of a non-200 answer.
    pub refusal: Option<String>,
}

/// The model part of a request: a name, or none (mlx_lm.server then uses its launch model).
pub type ModelField<'a> = Option<&'a str>;

/// A chat request body.
pub fn chat(model: ModelField<'_>, prompt: &str, max_tokens: i64, stream: bool, include_usage: Option<bool>) -> Value {
    let mut body = json!({"stream": stream, "max_tokens": max_tokens, "temperature": 0,
        "messages": [{"role": "user", "content": prompt}]});
    if let Some(model) = model {
        body["model"] = json!(model);
    }
    if let Some(include) = include_usage {
        body["stream_options"] = json!({"include_usage": include});
    }
    body
}

/// Sends a streamed request on a fresh connection and reads it to its end, or (when
/// `leave_after_output`) until its first generated output, then drops the connection.
pub async fn stream(
    target: &Target,
    budget: &Budget,
    body: &Value,
    leave_after_output: bool,
) -> Result<StreamRecord, String> {
    // On the heap: two of these are joined, and several nest in the cancel check.
    Box::pin(read_stream(target, budget, body, leave_after_output)).await
}

async fn read_stream(
    target: &Target,
    budget: &Budget,
    body: &Value,
    leave_after_output: bool,
) -> Result<StreamRecord, String> {
    let started = Instant::now();
    let opened = async {
        let mut conn = Connection::open(target).await?;
        conn.send(target, "POST", "/v1/chat/completions", body.to_string().as_bytes()).await?;
        let (head, state) = conn.read_head().await?;
        Ok::<_, std::io::Error>((conn, head, state))
    };
    let (mut conn, head, mut state) =
        budget.within(HEAD_LIMIT, "no response head", opened).await?.map_err(|e| e.to_string())?;
    if head.status != 200 {
        let bytes = budget.within(HEAD_LIMIT, "no whole error body", conn.read_body(&mut state)).await;
        let bytes = bytes.ok().and_then(Result::ok).unwrap_or_default();
        return Ok(StreamRecord {
            head,
            said: vec![],
            complete: state.complete,
            truncated: state.truncated,
            left: false,
            ended: started.elapsed(),
            refusal: Some(String::from_utf8_lossy(&bytes).chars().take(300).collect()),
        });
    }
    let mut parser = SseParser::new();
    let mut said = Vec::new();
    let mut left = false;
    let mut bytes = 0usize;
    loop {
        let waiting = format!("the stream stalled after {} events: no byte", said.len());
        let piece = budget.within(STALL_LIMIT, &waiting, conn.next_piece(&mut state)).await?;
        let Some(piece) = piece.map_err(|e| format!("the stream failed after {} events: {e}", said.len()))? else {
            break;
        };
        bytes += piece.len();
        if bytes > MAX_STREAM_BYTES {
            return Err(format!("the stream sent more than {} MiB without an end: left", MAX_STREAM_BYTES >> 20));
        }
        let at = started.elapsed();
        parser.feed(&piece, |item, _| match item {
            Item::Comment(c) => said.push(Said::Comment(c)),
            Item::Event(e) if e.data.trim() == "[DONE]" => said.push(Said::Done),
            Item::Event(e) => match (serde_json::from_str::<Value>(&e.data), frame::read(&e.data)) {
                (Ok(json), Some(seen)) => said.push(Said::Data { json, seen, at }),
                _ => said.push(Said::Unreadable(e.data.chars().take(300).collect())),
            },
            Item::Blank => {}
        });
        if said.len() > MAX_EVENTS {
            return Err(format!("the stream sent more than {MAX_EVENTS} events without an end: left"));
        }
        if leave_after_output && said.iter().any(|s| matches!(s, Said::Data { seen, .. } if has_output(seen))) {
            left = true;
            break;
        }
    }
    Ok(StreamRecord {
        head,
        said,
        complete: state.complete,
        truncated: state.truncated,
        left,
        ended: started.elapsed(),
        refusal: None,
    })
}

fn has_output(seen: &Seen) -> bool {
    seen.choices.iter().any(|c| c.output)
}

impl StreamRecord {
    fn data(&self) -> impl Iterator<Item = (&Value, &Seen, Duration)> {
        self.said.iter().filter_map(|s| match s {
            Said::Data { json, seen, at } => Some((json, seen, *at)),
            _ => None,
        })
    }

    /// Why this 200 stream cannot be read as a whole answer: it ended (the server closed it, or
    /// its framing broke off) without a `finish_reason` or `[DONE]`. `None` for a whole stream, an
    /// in-band error event, or a stream the client left on purpose.
    pub fn cut(&self) -> Option<String> {
        if self.left || self.head.status != 200 || self.error_event().is_some() {
            return None;
        }
        let ended = self.finish_reason().is_some() || self.done_marker();
        if ended && !self.truncated {
            return None;
        }
        let how = if self.truncated { "its framing broke off" } else { "connection closed by the server" };
        Some(format!("the stream ended after {} events without finish_reason or [DONE] ({how})", self.said.len()))
    }

    /// When the first generated output arrived.
    pub fn first_output(&self) -> Option<Duration> {
        self.data().find(|(_, s, _)| has_output(s)).map(|(_, _, at)| at)
    }

    /// When the last generated output arrived.
    pub fn last_output(&self) -> Option<Duration> {
        self.data().filter(|(_, s, _)| has_output(s)).map(|(_, _, at)| at).last()
    }

    /// Decoded tokens per second between the first and the last output.
    pub fn decode_rate(&self) -> Option<f64> {
        let tokens = self.tokens()?;
        let span = self.last_output()?.checked_sub(self.first_output()?)?.as_secs_f64();
        (tokens > 1 && span > 0.0).then(|| (tokens - 1) as f64 / span)
    }

    /// `first`: a role-only chunk before any output; `every`: every output delta has a role;
    /// `none` otherwise.
    pub fn role_chunk(&self) -> &'static str {
        let deltas: Vec<&Value> = self.data().filter_map(|(j, _, _)| j.pointer("/choices/0/delta")).collect();
        let first_is_role_only =
            self.data().find(|(j, _, _)| j.pointer("/choices/0").is_some()).is_some_and(|(j, s, _)| {
                !has_output(s) && j.pointer("/choices/0/delta/role").is_some_and(Value::is_string)
            });
        let outputs: Vec<&&Value> = deltas.iter().filter(|d| carries_text(d)).collect();
        if first_is_role_only {
            "first"
        } else if !outputs.is_empty() && outputs.iter().all(|d| d.get("role").is_some_and(Value::is_string)) {
            "every"
        } else {
            "none"
        }
    }

    /// `comment` (SSE comment lines), `data` (a fake data chunk: omlx's `chatcmpl-keepalive`,
    /// or an empty content delta before the first output) or `none`.
    pub fn keepalive(&self) -> &'static str {
        if self.said.iter().any(|s| matches!(s, Said::Comment(_))) {
            return "comment";
        }
        let first = self.first_output();
        let fake = self.data().any(|(j, s, at)| {
            s.keepalive
                || (first.is_none_or(|f| at < f)
                    && j.pointer("/choices/0/delta/content").is_some_and(|c| c.as_str() == Some(""))
                    && j.pointer("/choices/0/delta/role").is_none())
        });
        if fake { "data" } else { "none" }
    }

    /// Where usage came: on the chunk with the finish reason, in a separate `choices: []`
    /// chunk, both, or none.
    pub fn usage_placement(&self) -> &'static str {
        let on_finish = self.data().any(|(_, s, _)| s.usage.is_some() && s.choices.iter().any(|c| c.finished));
        let separate = self.data().any(|(_, s, _)| s.usage.is_some() && s.choices.is_empty());
        match (on_finish, separate) {
            (true, true) => "both",
            (true, false) => "finish",
            (false, true) => "separate",
            (false, false) => "none",
        }
    }

    /// The stream had usage anywhere.
    pub fn has_usage(&self) -> bool {
        self.data().any(|(_, s, _)| s.usage.is_some())
    }

    /// Tokens generated: the usage's completion tokens, else the deltas with output.
    pub fn tokens(&self) -> Option<u64> {
        self.completion_tokens().or_else(|| u64::try_from(self.data().filter(|(_, s, _)| has_output(s)).count()).ok())
    }

    /// The last usage's completion tokens.
    pub fn completion_tokens(&self) -> Option<u64> {
        self.data().filter_map(|(_, s, _)| s.usage.and_then(|u| u.completion_tokens)).last()
    }

    /// The last usage's `prompt_tokens_details.cached_tokens`.
    pub fn cached_tokens(&self) -> Option<u64> {
        self.data().filter_map(|(_, s, _)| s.usage.and_then(|u| u.cached_tokens)).last()
    }

    /// Whether `data: [DONE]` came.
    pub fn done_marker(&self) -> bool {
        self.said.iter().any(|s| matches!(s, Said::Done))
    }

    /// The first `finish_reason` string.
    pub fn finish_reason(&self) -> Option<String> {
        self.data()
            .find_map(|(j, _, _)| j.pointer("/choices/0/finish_reason").and_then(Value::as_str).map(str::to_string))
    }

    /// How many chunks carried a finish reason (mlx-omni-server sends it twice).
    pub fn finish_chunks(&self) -> usize {
        self.data().filter(|(_, s, _)| s.choices.iter().any(|c| c.finished)).count()
    }

    /// The message of an in-band `{"error": …}` event.
    pub fn error_event(&self) -> Option<String> {
        self.data().find_map(|(_, s, _)| s.error.clone())
    }

    /// Whether any data chunk has `key` at `pointer` (a JSON pointer), even null-valued.
    pub fn any_has(&self, pointer: &str) -> bool {
        self.data().any(|(j, _, _)| j.pointer(pointer).is_some())
    }

    /// The first chunk's `id`.
    pub fn id(&self) -> Option<&str> {
        self.data().find_map(|(j, _, _)| j.get("id").and_then(Value::as_str))
    }

    /// The delta field that carries reasoning: the ones holding text, else the ones present
    /// at all (null-valued, as mlx-vlm sends them); `both` when both are there.
    pub fn reasoning_field(&self) -> Option<&'static str> {
        let deltas: Vec<&Value> = self.data().filter_map(|(j, _, _)| j.pointer("/choices/0/delta")).collect();
        let with = |f: fn(&Value) -> bool| {
            let has = |name: &str| deltas.iter().any(|d| d.get(name).is_some_and(f));
            match (has("reasoning_content"), has("reasoning")) {
                (true, true) => Some("both"),
                (true, false) => Some("reasoning_content"),
                (false, true) => Some("reasoning"),
                (false, false) => None,
            }
        };
        with(|v| v.as_str().is_some_and(|s| !s.is_empty())).or_else(|| with(|_| true))
    }
}

fn carries_text(delta: &Value) -> bool {
    ["content", "reasoning_content", "reasoning"]
        .iter()
        .any(|f| delta.get(*f).and_then(Value::as_str).is_some_and(|s| !s.is_empty()))
}

/// Keep-alive and idle timeout, measured on a connection of its own.
#[derive(Debug, Clone, Copy)]
pub struct KeepAlive {
    pub keep_alive: bool,
    /// When the server closed the idle connection; `None` when it did not within the limit.
    pub idle_timeout: Option<Duration>,
    /// How long the probe waited for the close.
    pub waited: Duration,
}

/// Two `GET /v1/models` on one connection: whether the second is answered, then how long the
/// server leaves the connection idle before closing it (at most `limit`, never past the
/// deadline).
pub async fn keep_alive(target: &Target, budget: &Budget, limit: Duration) -> Result<KeepAlive, String> {
    let first = budget.within(HEAD_LIMIT, "no answer to GET /v1/models", exchange(target, "GET", "/v1/models", b""));
    let (head, _, mut conn) = first.await?.map_err(|e| e.to_string())?;
    if head.closes() || conn.at_eof() {
        return Ok(KeepAlive { keep_alive: false, idle_timeout: None, waited: Duration::ZERO });
    }
    let answered = async {
        conn.send(target, "GET", "/v1/models", b"").await?;
        let (_, mut body) = conn.read_head().await?;
        conn.read_body(&mut body).await?;
        Ok::<_, std::io::Error>(())
    };
    if budget.within(HEAD_LIMIT, "", answered).await.map_or(true, |r| r.is_err()) {
        return Ok(KeepAlive { keep_alive: false, idle_timeout: None, waited: Duration::ZERO });
    }
    let waited = limit.min(budget.left());
    Ok(KeepAlive { keep_alive: true, idle_timeout: conn.closed_within(waited).await, waited })
}

/// One error case's answer.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ErrorCase {
    pub status: Option<u16>,
    /// The body is OpenAI's `{"error": {"message": …, "type": …}}` (null for a 200).
    pub openai_shape: Option<bool>,
    /// Why the case was not sent (or not answered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// The start of the body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

impl ErrorCase {
    /// A case not sent, or not answered, and why.
    pub fn skipped(why: impl Into<String>) -> ErrorCase {
        ErrorCase { skipped: Some(why.into()), ..ErrorCase::default() }
    }

    fn answered(status: u16, body: &[u8]) -> ErrorCase {
        if status == 200 {
            return ErrorCase { status: Some(200), ..ErrorCase::default() };
        }
        let text = String::from_utf8_lossy(body);
        let shape = serde_json::from_slice::<Value>(body).ok().is_some_and(|v| {
            v.pointer("/error/message").is_some_and(Value::is_string) && v.pointer("/error/type").is_some()
        });
        ErrorCase {
            status: Some(status),
            openai_shape: Some(shape),
            skipped: None,
            body: Some(text.chars().take(160).collect()),
        }
    }
}

/// Sends `body` (raw bytes) as a non-streamed chat request and reads the answer (capped).
pub async fn error_case(target: &Target, budget: &Budget, body: &[u8]) -> ErrorCase {
    if budget.spent() {
        return ErrorCase::skipped(budget.spent_reason());
    }
    let sent = budget.within(HEAD_LIMIT, "no answer", exchange(target, "POST", "/v1/chat/completions", body)).await;
    match sent {
        Ok(Ok((head, bytes, _))) => ErrorCase::answered(head.status, &bytes),
        Ok(Err(e)) => ErrorCase::skipped(format!("no answer: {e}")),
        Err(why) => ErrorCase::skipped(why),
    }
}

/// Sends a streamed request and keeps only its status and (for a refusal) body: a 200 is left
/// at its head (its generation goes on only in servers that do not cancel on disconnect).
pub async fn status_only(target: &Target, budget: &Budget, body: &Value) -> ErrorCase {
    if budget.spent() {
        return ErrorCase::skipped(budget.spent_reason());
    }
    let answer = async {
        let mut conn = Connection::open(target).await?;
        conn.send(target, "POST", "/v1/chat/completions", body.to_string().as_bytes()).await?;
        let (head, mut state) = conn.read_head().await?;
        if head.status == 200 {
            return Ok::<_, std::io::Error>(ErrorCase::answered(200, b""));
        }
        let bytes = conn.read_body(&mut state).await?;
        Ok(ErrorCase::answered(head.status, &bytes))
    };
    match budget.within(HEAD_LIMIT, "no answer", answer).await {
        Ok(Ok(case)) => case,
        Ok(Err(e)) => ErrorCase::skipped(format!("no answer: {e}")),
        Err(why) => ErrorCase::skipped(why),
    }
}

/// What a server answered to a `GET /v1/models` with one unusual header (`Host`, `Origin`).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct HeaderCheck {
    /// The header sent.
    pub sent: String,
    pub status: Option<u16>,
    /// Answered 4xx: the server checks this header.
    pub refused: bool,
    /// The start of a refusal's body, or why there was no answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

/// `GET /v1/models` with the header `name: value`.
pub async fn header_check(target: &Target, budget: &Budget, name: &str, value: &str) -> HeaderCheck {
    let sent = format!("{name}: {value}");
    let extra = [(name, value)];
    let asked = exchange_with(target, "GET", "/v1/models", b"", &extra);
    match budget.within(HEAD_LIMIT, "no answer", asked).await {
        Ok(Ok((head, body, _))) => {
            let refused = (400..500).contains(&head.status);
            let body = refused.then(|| String::from_utf8_lossy(&body).chars().take(160).collect());
            HeaderCheck { sent, status: Some(head.status), refused, body }
        }
        Ok(Err(e)) => HeaderCheck { sent, body: Some(format!("no answer: {e}")), ..HeaderCheck::default() },
        Err(why) => HeaderCheck { sent, body: Some(why), ..HeaderCheck::default() },
    }
}

/// The least speedup of two concurrent streams over one alone that counts as batching.
pub const BATCHED_SPEEDUP: f64 = 1.3;

/// What two streams sent at the same instant got.
#[derive(Debug, Clone)]
pub struct Concurrency {
    /// `batched` (both generated at once, together at least `BATCHED_SPEEDUP` times the rate
    /// of one alone), `serialized` (one after the other, or at once without that gain),
    /// `error_event` or `busy_status`.
    pub verdict: &'static str,
    /// Tokens/s of the pair over tokens/s of one alone.
    pub speedup: Option<f64>,
}

/// Two streams of `max_tokens` each (`a`, `b`: their bodies) at once, against `single` (one
/// of the same length alone).
pub async fn concurrency(
    target: &Target,
    budget: &Budget,
    pair: [&Value; 2],
    single: &StreamRecord,
) -> Result<Concurrency, String> {
    let started = Instant::now();
    let (ra, rb) = tokio::join!(stream(target, budget, pair[0], false), stream(target, budget, pair[1], false));
    let wall = started.elapsed();
    let (ra, rb) = (ra?, rb?);
    if ra.head.status != 200 || rb.head.status != 200 {
        return Ok(Concurrency { verdict: "busy_status", speedup: None });
    }
    if ra.error_event().is_some() || rb.error_event().is_some() {
        return Ok(Concurrency { verdict: "error_event", speedup: None });
    }
    if let Some(cut) = ra.cut().or_else(|| rb.cut()) {
        return Err(cut);
    }
    let windows = [(ra.first_output(), ra.last_output()), (rb.first_output(), rb.last_output())];
    let speedup = match (single.completion_tokens(), ra.completion_tokens(), rb.completion_tokens()) {
        (Some(one), Some(ta), Some(tb)) if one > 0 && !single.ended.is_zero() && !wall.is_zero() => {
            let alone = one as f64 / single.ended.as_secs_f64();
            let pair = (ta + tb) as f64 / wall.as_secs_f64();
            Some((pair / alone * 100.0).round() / 100.0)
        }
        _ => None,
    };
    let verdict = match windows {
        [(Some(fa), Some(la)), (Some(fb), Some(lb))] if fa.max(fb) >= la.min(lb) => "serialized",
        // Interleaved without a gain: two streams on one busy core take turns.
        _ if speedup.is_some_and(|s| s < BATCHED_SPEEDUP) => "serialized",
        _ => "batched",
    };
    Ok(Concurrency { verdict, speedup })
}

/// How long the abandoned stream of the cancel check should last if nobody cancelled it.
const ORPHAN_SECONDS: f64 = 6.0;
/// The share of that duration a follow-up may wait before the server counts as generating on
/// (its decode rate measured on a short stream overstates the time; mlx_lm.server takes up to
/// 0.5 s to notice a disconnect).
const WAIT_SHARE: f64 = 0.25;
/// Attempts of the follow-up request when it gets a busy answer.
const FOLLOW_UP_TRIES: u32 = 4;
/// Pause before a follow-up is sent again after a busy answer.
const FOLLOW_UP_PAUSE: Duration = Duration::from_millis(500);

/// What the cancel check saw.
#[derive(Debug, Clone)]
pub struct Cancel {
    /// `None` when no follow-up produced output.
    pub cancels: Option<bool>,
    /// What it measured, for the notes.
    pub seen: String,
}

/// `max_tokens` of an abandoned stream that would last about `ORPHAN_SECONDS` at `rate`
/// tokens/s (a server that does not cancel generates it for nobody, also after a probe cut
/// short), and that duration.
pub fn orphan(rate: f64) -> (i64, Duration) {
    let tokens = ((rate * ORPHAN_SECONDS) as i64).clamp(64, 4096);
    (tokens, Duration::from_secs_f64(tokens as f64 / rate.max(f64::MIN_POSITIVE)))
}

/// Whether the server stops generating when the client leaves: a stream (`long`, whose
/// generation would take `expected` if nobody stopped it) is left after its first output, and a
/// short one (`next`) is sent at once. A busy answer to it (an error event, or a non-200 status)
/// is its own outcome: it is sent again after a short pause. Only a follow-up that produced
/// output decides, by timing: waiting more than `WAIT_SHARE` of `expected` since the disconnect
/// means the server went on generating for nobody. (A batching server that generates on does not make it
/// wait: it counts as cancelling.)
pub async fn cancels_on_disconnect(
    target: &Target,
    budget: &Budget,
    long: &Value,
    next: &Value,
    expected: Duration,
) -> Result<Cancel, String> {
    let orphan = stream(target, budget, long, true).await?;
    if !orphan.left {
        let why = orphan.cut().or(orphan.refusal).unwrap_or_else(|| "it ended before any output".into());
        return Err(format!("the stream to abandon was not left after its first output: {why}"));
    }
    let left_at = Instant::now();
    let mut busy = Vec::new();
    for attempt in 0..FOLLOW_UP_TRIES {
        if attempt > 0 {
            tokio::time::sleep(FOLLOW_UP_PAUSE.min(budget.left())).await;
        }
        let record = budget
            .within(expected * 2 + STALL_LIMIT, "the request after the abandoned one had no answer", async {
                stream(target, budget, next, false).await
            })
            .await;
        let record = match record {
            Ok(Ok(r)) => r,
            Ok(Err(e)) | Err(e) => {
                return Ok(Cancel { cancels: Some(false), seen: format!("{e} (after {} busy answers)", busy.len()) });
            }
        };
        if record.head.status != 200 {
            busy.push(format!("status {}", record.head.status));
            continue;
        }
        if let Some(error) = record.error_event() {
            busy.push(format!("error event {error:?}"));
            continue;
        }
        let Some(first) = record.first_output() else {
            busy.push(record.cut().unwrap_or_else(|| "no output".into()));
            continue;
        };
        let since_disconnect = left_at.elapsed().saturating_sub(record.ended.saturating_sub(first));
        let threshold = expected.mul_f64(WAIT_SHARE);
        let cancels = since_disconnect <= threshold;
        let busy = if busy.is_empty() { String::new() } else { format!(", after busy answers: {}", busy.join("; ")) };
        return Ok(Cancel {
            cancels: Some(cancels),
            seen: format!(
                "first output {:.2} s after the disconnect (cancelling: within {:.2} s); the abandoned stream \
                 would have lasted about {:.1} s{busy}",
                since_disconnect.as_secs_f64(),
                threshold.as_secs_f64(),
                expected.as_secs_f64()
            ),
        });
    }
    Ok(Cancel { cancels: None, seen: format!("every follow-up got a busy answer: {}", busy.join("; ")) })
}

/// A prompt of about `words` words starting with `lead` (different leads miss each other's
/// prompt cache).
pub fn prompt(lead: &str, words: usize) -> String {
    const FILLER: &[&str] = &["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while"];
    let mut text = format!("{lead}:");
    for i in 0..words {
        text.push(' ');
        text.push_str(FILLER[i % FILLER.len()]);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_orphan_lasts_seconds_at_the_measured_rate_within_bounds() {
        assert_eq!(orphan(450.0).0, 2700);
        assert_eq!(orphan(5000.0).0, 4096);
        // A slow server: the orphan still ends by itself within seconds.
        let (tokens, lasts) = orphan(12.0);
        assert_eq!(tokens, 72);
        assert!(lasts <= Duration::from_secs(6), "{lasts:?}");
    }
}
