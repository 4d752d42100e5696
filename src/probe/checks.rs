//! Each measurement of `mlxgate probe`: one streamed request read event by event (with the
//! gateway's own SSE parser and frame reader), and what its events say — role chunk, keepalive
//! style, usage placement, `[DONE]`, reasoning field, finish reason — then keep-alive and its
//! idle timeout, error statuses and body shapes, two concurrent streams, and whether a client's
//! disconnect stops the generation.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::wire::{Connection, Head, Target, exchange};
use crate::stream::frame::{self, Seen};
use crate::stream::sse::{Item, SseParser};

/// Longest one probe request may take before it counts as failed.
pub const REQUEST_LIMIT: Duration = Duration::from_secs(120);

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
    /// When the body ended (or was left), from the request's send.
    pub ended: Duration,
    /// The body of a non-200 answer.
    pub refusal: Option<String>,
}

/// A chat request body for `model`.
pub fn chat(model: &str, prompt: &str, max_tokens: i64, stream: bool, include_usage: Option<bool>) -> Value {
    let mut body = json!({"model": model, "stream": stream, "max_tokens": max_tokens, "temperature": 0,
        "messages": [{"role": "user", "content": prompt}]});
    if let Some(include) = include_usage {
        body["stream_options"] = json!({"include_usage": include});
    }
    body
}

/// Sends a streamed request on a fresh connection and reads it to its end, or (when
/// `leave_after_output`) until its first generated output, then drops the connection.
pub async fn stream(target: &Target, body: &Value, leave_after_output: bool) -> std::io::Result<StreamRecord> {
    tokio::time::timeout(REQUEST_LIMIT, stream_unbounded(target, body, leave_after_output))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no end of stream within the limit"))?
}

async fn stream_unbounded(target: &Target, body: &Value, leave_after_output: bool) -> std::io::Result<StreamRecord> {
    let started = Instant::now();
    let mut conn = Connection::open(target).await?;
    conn.send(target, "POST", "/v1/chat/completions", body.to_string().as_bytes()).await?;
    let (head, mut state) = conn.read_head().await?;
    if head.status != 200 {
        let bytes = conn.read_body(&mut state).await.unwrap_or_default();
        return Ok(StreamRecord {
            head,
            said: vec![],
            complete: state.complete,
            ended: started.elapsed(),
            refusal: Some(String::from_utf8_lossy(&bytes).into_owned()),
        });
    }
    let mut parser = SseParser::new();
    let mut said = Vec::new();
    while let Some(piece) = conn.next_piece(&mut state).await? {
        let at = started.elapsed();
        parser.feed(&piece, |item, _| match item {
            Item::Comment(c) => said.push(Said::Comment(c)),
            Item::Event(e) if e.data.trim() == "[DONE]" => said.push(Said::Done),
            Item::Event(e) => match (serde_json::from_str::<Value>(&e.data), frame::read(&e.data)) {
                (Ok(json), Some(seen)) => said.push(Said::Data { json, seen, at }),
                _ => said.push(Said::Unreadable(e.data)),
            },
            Item::Blank => {}
        });
        if leave_after_output && said.iter().any(|s| matches!(s, Said::Data { seen, .. } if has_output(seen))) {
            break;
        }
    }
    Ok(StreamRecord { head, said, complete: state.complete, ended: started.elapsed(), refusal: None })
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

    /// When the first generated output arrived.
    pub fn first_output(&self) -> Option<Duration> {
        self.data().find(|(_, s, _)| has_output(s)).map(|(_, _, at)| at)
    }

    /// When the last generated output arrived.
    pub fn last_output(&self) -> Option<Duration> {
        self.data().filter(|(_, s, _)| has_output(s)).map(|(_, _, at)| at).last()
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
}

/// Two `GET /v1/models` on one connection: whether the second is answered, then how long the
/// server leaves the connection idle before closing it (at most `limit`).
pub async fn keep_alive(target: &Target, limit: Duration) -> std::io::Result<KeepAlive> {
    let (head, _, mut conn) = exchange(target, "GET", "/v1/models", b"").await?;
    if head.closes() || conn.at_eof() {
        return Ok(KeepAlive { keep_alive: false, idle_timeout: None });
    }
    let answered = async {
        conn.send(target, "GET", "/v1/models", b"").await?;
        let (_, mut body) = conn.read_head().await?;
        conn.read_body(&mut body).await?;
        Ok::<_, std::io::Error>(())
    };
    if tokio::time::timeout(REQUEST_LIMIT, answered).await.map_or(true, |r| r.is_err()) {
        return Ok(KeepAlive { keep_alive: false, idle_timeout: None });
    }
    Ok(KeepAlive { keep_alive: true, idle_timeout: conn.closed_within(limit).await })
}

/// One error case's answer.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ErrorCase {
    pub status: Option<u16>,
    /// The body is OpenAI's `{"error": {"message": …, "type": …}}`.
    pub openai_shape: Option<bool>,
    /// Why the case was not sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// The start of the body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

impl ErrorCase {
    pub fn skipped(why: impl Into<String>) -> ErrorCase {
        ErrorCase { skipped: Some(why.into()), ..ErrorCase::default() }
    }

    fn answered(status: u16, body: &[u8]) -> ErrorCase {
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

/// Sends `body` (raw bytes) as a non-streamed chat request and reads the whole answer.
pub async fn error_case(target: &Target, body: &[u8]) -> ErrorCase {
    let sent = tokio::time::timeout(REQUEST_LIMIT, exchange(target, "POST", "/v1/chat/completions", body)).await;
    match sent {
        Ok(Ok((head, bytes, _))) => ErrorCase::answered(head.status, &bytes),
        Ok(Err(e)) => ErrorCase::skipped(format!("no answer: {e}")),
        Err(_) => ErrorCase::skipped("no answer within the limit"),
    }
}

/// Sends a streamed request and keeps only its status and (for a refusal) body: a 200 is left
/// at once (its generation may go on in servers that do not cancel).
pub async fn status_only(target: &Target, body: &Value) -> ErrorCase {
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
    match tokio::time::timeout(REQUEST_LIMIT, answer).await {
        Ok(Ok(mut case)) => {
            if case.status == Some(200) {
                case.openai_shape = None;
                case.body = None;
            }
            case
        }
        Ok(Err(e)) => ErrorCase::skipped(format!("no answer: {e}")),
        Err(_) => ErrorCase::skipped("no answer within the limit"),
    }
}

/// What two streams sent at the same instant got.
#[derive(Debug, Clone)]
pub struct Concurrency {
    /// `batched`, `serialized`, `error_event` or `busy_status`.
    pub verdict: &'static str,
    /// Tokens/s of the pair over tokens/s of one alone.
    pub speedup: Option<f64>,
}

/// Two identical-length streams at once, against `single` (the same request alone).
pub async fn concurrency(
    target: &Target,
    model: &str,
    single: &StreamRecord,
    max_tokens: i64,
) -> std::io::Result<Concurrency> {
    let a = chat(model, &prompt("concurrent stream one", 24), max_tokens, true, Some(true));
    let b = chat(model, &prompt("concurrent stream two", 24), max_tokens, true, Some(true));
    let started = Instant::now();
    let (ra, rb) = tokio::join!(stream(target, &a, false), stream(target, &b, false));
    let wall = started.elapsed();
    let (ra, rb) = (ra?, rb?);
    if ra.head.status != 200 || rb.head.status != 200 {
        return Ok(Concurrency { verdict: "busy_status", speedup: None });
    }
    if ra.error_event().is_some() || rb.error_event().is_some() {
        return Ok(Concurrency { verdict: "error_event", speedup: None });
    }
    let windows = [(ra.first_output(), ra.last_output()), (rb.first_output(), rb.last_output())];
    let verdict = match windows {
        [(Some(fa), Some(la)), (Some(fb), Some(lb))] if fa.max(fb) >= la.min(lb) => "serialized",
        _ => "batched",
    };
    let speedup = match (single.completion_tokens(), ra.completion_tokens(), rb.completion_tokens()) {
        (Some(one), Some(ta), Some(tb)) if one > 0 && !single.ended.is_zero() && !wall.is_zero() => {
            let alone = one as f64 / single.ended.as_secs_f64();
            let pair = (ta + tb) as f64 / wall.as_secs_f64();
            Some((pair / alone * 100.0).round() / 100.0)
        }
        _ => None,
    };
    Ok(Concurrency { verdict, speedup })
}

/// Whether the server stops generating when the client leaves: a long stream is left after
/// its first output, and a short request sent at once must get its first output about as fast
/// as alone (`alone`); a server that generates on for the client that left makes it wait.
/// (A batching server that generates on does not make it wait: it counts as cancelling.)
pub async fn cancels_on_disconnect(target: &Target, model: &str, alone: Duration) -> std::io::Result<bool> {
    let long = chat(model, &prompt("a long answer nobody reads", 24), 512, true, None);
    stream(target, &long, true).await?;
    let next = chat(model, &prompt("the request after the one that left", 24), 4, true, None);
    let limit = alone * 3 + Duration::from_secs(1);
    let waited = tokio::time::timeout(limit * 10, stream(target, &next, false)).await;
    Ok(match waited {
        Ok(Ok(record)) => record.first_output().is_some_and(|f| f <= limit),
        _ => false,
    })
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
