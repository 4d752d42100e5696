//! One backend as the request path sees it: send a request, wait for the answer's first body
//! bytes, and decide whether a failure may be sent again: this one handle owns send → first
//! byte → retry, so no other part of the request path sends or retries.
//!
//! The answer is held until its first body bytes, so a failure before them has shown the client
//! nothing. Whether sending again is safe depends on what the backend may have done with it:
//! - the connection was never made (refused): nothing reached it — safe;
//! - the process that had the request is gone (crashed, replaced): whatever it began died with
//!   it — safe, once a new process is up;
//! - a live backend dropped the connection or answered an empty 2xx: it may be generating the
//!   answer still — never sent again (a server that drops connections would otherwise prefill
//!   the same prompt three times);
//! - a timeout: the backend may still be working on it — never sent again.
//!
//! A serialized backend (`normalise.serialize`: vllm-mlx without `--continuous-batching`) that
//! is still busy with the previous request — a moment after a client aborted a stream, and now
//! and then right after a stream that ended normally (measured) — answers 200, a role chunk and
//! an error event, or 503 "busy" to a whole answer. It generated nothing: the request is sent
//! again after a short pause (a few times, bounded), and the client sees only the answer that
//! was not busy.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, Method};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::supervisor::Supervisor;
use super::upstream::{Upstream, UpstreamError};
use crate::config::BackendConfig;
use crate::error::GatewayError;

/// Pauses before sending again to a serialized backend that answered "busy". vllm-mlx's
/// serialized route stayed busy 47–99 ms after a client aborted a stream (measured).
const BUSY_PAUSES: [Duration; 4] =
    [Duration::from_millis(100), Duration::from_millis(200), Duration::from_millis(400), Duration::from_millis(800)];

/// A serialized backend is taken to be busy with the previous request only when that request
/// ended less than this before the new one got its slot: the route stayed busy 47–99 ms after a
/// client's abort (measured). Later, the same error event is a real failure, never sent again.
pub const BUSY_AFTER_RELEASE: Duration = Duration::from_secs(1);

/// How often a request is sent again to a serialized backend that answers busy: after an
/// aborted (or failed) request, every pause of [`BUSY_PAUSES`]; after one that ended normally
/// (busy then was seen once in ten raw-socket tries, never through the gateway), once.
pub fn busy_retries(previous: Option<crate::dispatch::queue::Previous>) -> usize {
    match previous {
        Some(p) if p.ended_ago < BUSY_AFTER_RELEASE && !p.finished => BUSY_PAUSES.len(),
        Some(p) if p.ended_ago < BUSY_AFTER_RELEASE => 1,
        _ => 0,
    }
}

/// How long after its first bytes a serialized backend's stream is watched for the busy error
/// event (it follows the role chunk at once); a stream still silent then is prefilling.
const BUSY_WINDOW: Duration = Duration::from_secs(1);

/// The most of a serialized backend's stream read while looking for the busy error event (it
/// comes within the first few hundred bytes); past it the stream is taken as generating.
const BUSY_LOOK_BYTES: usize = 64 * 1024;

/// How long a failed attempt waits to see the managed process that had it gone. A crash closes
/// the connection and ends the process at once (the supervisor sees the exit within
/// milliseconds); this bounds the wait when the process lives on (no retry then).
const REPLACEMENT_WAIT: Duration = Duration::from_secs(2);

/// A request as it goes to the backend.
pub struct Outbound {
    pub method: Method,
    pub path_and_query: String,
    /// The client's headers (hop-by-hop and the gateway's own are dropped when sent).
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// The backend's answer, with its first body bytes already read.
pub struct Answer {
    pub head: hyper::http::response::Parts,
    pub body: Incoming,
    /// The first data read from the body; `None` for an empty body (only for non-2xx answers).
    pub first: Option<Bytes>,
    /// When the request went to the backend.
    pub sent_at: Instant,
}

/// Why an attempt failed, and whether the caller may send the request again.
#[derive(Debug)]
pub enum SendFailure {
    /// Nothing reached the client and nothing the backend began survives: send again (after
    /// getting a slot again: the backend has restarted).
    Retry(GatewayError),
    /// Give the client this error.
    Final(GatewayError),
}

/// What happened before the first body byte.
enum Broke {
    /// Nothing reached the backend.
    Refused(String),
    /// The backend may have received the request.
    Broken(String),
}

/// Sends to one backend.
#[derive(Clone)]
pub struct BackendHandle {
    pub config: Arc<BackendConfig>,
    upstream: Upstream,
    supervisor: Option<Arc<Supervisor>>,
}

impl BackendHandle {
    /// A handle on `config`'s backend through its pooled client; `supervisor` for managed ones.
    pub fn new(config: Arc<BackendConfig>, upstream: Upstream, supervisor: Option<Arc<Supervisor>>) -> Self {
        BackendHandle { config, upstream, supervisor }
    }

    /// The managed backend's supervisor, if mlxgate runs it.
    pub fn supervisor(&self) -> Option<&Arc<Supervisor>> {
        self.supervisor.as_ref()
    }

    /// Sends `request`: one attempt, sent again (after a pause, at most `busy_retries` times,
    /// see [`busy_retries`]) while a serialized backend answers that it is busy.
    pub async fn send(&self, request: &Outbound, busy_retries: usize) -> Result<Answer, SendFailure> {
        let mut pauses = BUSY_PAUSES.iter().take(busy_retries);
        loop {
            let answer = self.attempt(request).await?;
            if !self.config.normalise.serialize || busy_retries == 0 {
                return Ok(answer);
            }
            let (busy, answer) = busy(answer).await;
            match pauses.next() {
                Some(pause) if busy => {
                    tracing::info!(backend = %self.config.name, pause_ms = pause.as_millis() as u64, "the serialized backend answered busy; sending again");
                    tokio::time::sleep(*pause).await;
                }
                _ => return Ok(answer),
            }
        }
    }

    /// One attempt: send, wait for the headers and the first body bytes.
    async fn attempt(&self, request: &Outbound) -> Result<Answer, SendFailure> {
        let generation = self.supervisor.as_ref().map(|s| s.status().generation);
        let sent_at = Instant::now();
        // The first byte comes with or after the headers: its deadline bounds both.
        let first_byte_deadline = tokio::time::Instant::from_std(sent_at + self.config.first_byte_timeout);
        let send = self.upstream.send(
            &self.config,
            request.method.clone(),
            &request.path_and_query,
            &request.headers,
            request.body.clone(),
        );
        let sent = tokio::time::timeout_at(first_byte_deadline, send)
            .await
            .unwrap_or(Err(UpstreamError::Timeout(self.config.first_byte_timeout)));
        let broke = match sent {
            Ok(response) => match self.first_bytes(response, sent_at).await {
                Ok(answer) => return Ok(answer),
                Err(Ok(broke)) => broke,
                Err(Err(timeout)) => return Err(SendFailure::Final(timeout)),
            },
            Err(UpstreamError::Timeout(after)) => {
                return Err(SendFailure::Final(GatewayError::BackendTimeout { backend: self.name(), after }));
            }
            Err(UpstreamError::Connect(reason)) => Broke::Refused(reason),
            Err(UpstreamError::Broken(reason)) => Broke::Broken(reason),
        };
        let (refused, reason) = match broke {
            Broke::Refused(r) => (true, r),
            Broke::Broken(r) => (false, r),
        };
        let error = GatewayError::Backend { backend: self.name(), reason };
        let (Some(supervisor), Some(generation)) = (&self.supervisor, generation) else {
            return Err(SendFailure::Final(error));
        };
        // A refused connection is safe to retry, but only once the process can have been
        // replaced; otherwise retrying is safe only when the process that had it is gone.
        let gone = supervisor.replaced(generation, REPLACEMENT_WAIT).await;
        if refused || gone { Err(SendFailure::Retry(error)) } else { Err(SendFailure::Final(error)) }
    }

    /// Waits (within `first_byte_timeout` of sending) for the first body bytes. `Err(Ok(_))`:
    /// the answer broke or was an empty 2xx; `Err(Err(_))`: the timeout.
    async fn first_bytes(
        &self,
        response: hyper::Response<Incoming>,
        sent_at: Instant,
    ) -> Result<Answer, Result<Broke, GatewayError>> {
        let (head, mut body) = response.into_parts();
        let deadline = tokio::time::Instant::from_std(sent_at + self.config.first_byte_timeout);
        loop {
            let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
                Err(_) => {
                    return Err(Err(GatewayError::BackendTimeout {
                        backend: self.name(),
                        after: self.config.first_byte_timeout,
                    }));
                }
                Ok(frame) => frame,
            };
            match frame {
                None if head.status.is_success() => {
                    return Err(Ok(Broke::Broken(format!(
                        "it answered {} and then closed the connection without a byte of the answer",
                        head.status
                    ))));
                }
                None => return Ok(Answer { head, body, first: None, sent_at }),
                Some(Err(e)) => return Err(Ok(Broke::Broken(format!("the answer broke before its first byte: {e}")))),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if !data.is_empty() => return Ok(Answer { head, body, first: Some(data), sent_at }),
                    // An empty data frame or trailers: keep waiting for bytes.
                    _ => {}
                },
            }
        }
    }

    fn name(&self) -> String {
        self.config.name.clone()
    }
}

/// Whether a serialized backend's answer says it is busy: a 503 naming it busy, or a stream
/// whose first event after any role-only or empty chunks is an error event. A stream is read
/// (at most [`BUSY_WINDOW`]) until it shows a generating event, an error, or silence; what was
/// read stays at the front of the answer.
async fn busy(mut answer: Answer) -> (bool, Answer) {
    let first = answer.first.clone().unwrap_or_default();
    if answer.head.status == hyper::StatusCode::SERVICE_UNAVAILABLE {
        return (String::from_utf8_lossy(&first).contains("busy"), answer);
    }
    let sse = answer
        .head
        .headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !answer.head.status.is_success() || !sse {
        return (false, answer);
    }
    let mut seen = first.to_vec();
    let deadline = tokio::time::Instant::now() + BUSY_WINDOW;
    let verdict = loop {
        if let Some(verdict) = first_event(&seen) {
            break verdict;
        }
        if seen.len() > BUSY_LOOK_BYTES {
            break Event::Generated;
        }
        match tokio::time::timeout_at(deadline, answer.body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    seen.extend_from_slice(&data);
                }
            }
            // Silence (prefill), the end or a broken body: not busy; the meter sees the rest.
            _ => break Event::Generated,
        }
    };
    answer.first = Some(Bytes::from(seen));
    (verdict == Event::Error, answer)
}

/// What the first telling event of a stream is.
#[derive(Debug, PartialEq, Eq)]
enum Event {
    /// An `{"error": …}` event before anything was generated.
    Error,
    /// Anything else: a token, a finish, or something not OpenAI's.
    Generated,
}

/// The first complete event of `stream` that is neither a comment nor a chunk without output
/// (a role-only chunk, an empty delta); `None` until one has arrived.
fn first_event(stream: &[u8]) -> Option<Event> {
    let text = String::from_utf8_lossy(stream).replace("\r\n", "\n");
    let complete = &text[..text.rfind("\n\n")?];
    for event in complete.split("\n\n") {
        let data: String = event.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim_start).collect();
        if data.is_empty() {
            continue;
        }
        let Ok(value) = serde_json::from_str::<serde_json::Value>(&data) else { return Some(Event::Generated) };
        if value.get("error").is_some_and(|e| !e.is_null()) {
            return Some(Event::Error);
        }
        if !without_output(&value) {
            return Some(Event::Generated);
        }
    }
    None
}

/// A chunk whose choices carry no output and no finish: only a role, or an empty delta.
fn without_output(chunk: &serde_json::Value) -> bool {
    let Some(choices) = chunk.get("choices").and_then(serde_json::Value::as_array) else { return false };
    !choices.is_empty()
        && choices.iter().all(|choice| {
            let unfinished = choice.get("finish_reason").is_none_or(serde_json::Value::is_null);
            let delta = choice.get("delta").and_then(serde_json::Value::as_object);
            unfinished
                && delta
                    .is_some_and(|d| d.iter().all(|(key, v)| key == "role" || v.is_null() || v.as_str() == Some("")))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROLE: &str =
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null}]}\n\n";

    #[test]
    fn a_busy_stream_is_a_role_chunk_then_an_error_event() {
        let busy = format!(
            "{ROLE}data: {{\"error\": {{\"message\": \"Internal server error\", \"type\": \"InternalServerError\", \"param\": null, \"code\": 500}}}}\n\n"
        );
        assert_eq!(first_event(busy.as_bytes()), Some(Event::Error));
        assert_eq!(first_event(ROLE.as_bytes()), None, "a role chunk alone tells nothing");
        let empty = "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":null}]}\n\n";
        let token = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\n";
        assert_eq!(first_event(format!(": heartbeat\n\n{ROLE}{empty}{token}").as_bytes()), Some(Event::Generated));
        assert_eq!(first_event(format!("{ROLE}data: {{\"err").as_bytes()), None, "an event not yet whole");
        let finish = "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n";
        assert_eq!(first_event(finish.as_bytes()), Some(Event::Generated));
        let null_error = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}],\"error\":null}\n\n";
        assert_eq!(first_event(null_error.as_bytes()), Some(Event::Generated), "error: null is no error");
    }
}
