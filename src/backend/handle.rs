//! One backend as the request path sees it: one attempt — send a request, wait for the answer's
//! first body bytes — and what the attempt saw, told apart as the retry rules need it
//! ([`Failure`]: refused, broken, timed out); and whether a serialized backend's answer says it
//! is busy ([`busy`]). Whether and when to send again is decided by the call
//! (`dispatch::call`), which owns every retry rule.
//!
//! The answer is held until its first body bytes, so a failure before them has shown the client
//! nothing.
//!
//! A serialized backend (`normalise.serialize`: vllm-mlx without `--continuous-batching`) that
//! is still busy with the previous request — a moment after a client aborted a stream, and now
//! and then right after a stream that ended normally (measured) — answers 200, a role chunk and
//! an error event, or 503 "busy" to a whole answer. [`busy`] reads that from the answer's front.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::upstream::UpstreamBody;
use axum::http::{HeaderMap, Method};
use bytes::Bytes;
use http_body_util::BodyExt;

use super::supervisor::Supervisor;
use super::upstream::{Upstream, UpstreamError};
use crate::config::BackendConfig;
use crate::error::GatewayError;

/// How long after its first bytes a serialized backend's stream is watched for the busy error
/// event (it follows the role chunk at once); a stream still silent then is prefilling.
const BUSY_WINDOW: Duration = Duration::from_secs(1);

/// The most of a serialized backend's stream read while looking for the busy error event (it
/// comes within the first few hundred bytes); past it the stream is taken as generating.
const BUSY_LOOK_BYTES: usize = 64 * 1024;

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
    pub body: UpstreamBody,
    /// The first data read from the body; `None` for an empty body (only for non-2xx answers).
    pub first: Option<Bytes>,
    /// When the request went to the backend.
    pub sent_at: Instant,
}

/// Why an attempt got no answer, as the retry rules tell failures apart: by what the backend can
/// have done with the request.
#[derive(Debug)]
pub enum Failure {
    /// The connection was never made: nothing reached the backend.
    Refused(GatewayError),
    /// The connection broke, or a 2xx came without a byte of its body: the backend may have
    /// received the request (and may be generating its answer still).
    Broken(GatewayError),
    /// No headers or first bytes within `first_byte_timeout`: the backend may still be working.
    TimedOut(GatewayError),
}

/// What waiting for an answer's first body bytes came to.
enum FirstBytes {
    /// The answer, its first bytes read (none: an empty non-2xx body).
    Answer(Answer),
    /// The body broke before its first byte, or a 2xx ended without one.
    Broken(String),
    /// The first byte did not come within `first_byte_timeout`.
    TimedOut(GatewayError),
}

/// A serialized backend's answer, read at its front for the busy sign (see [`busy`]).
pub struct Inspected {
    /// It says the backend is busy with the previous request: it generated nothing.
    pub busy: bool,
    /// The answer, what was read of it back at its front.
    pub answer: Answer,
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

    /// One attempt: send, wait for the headers and the first body bytes.
    pub async fn attempt(&self, request: &Outbound) -> Result<Answer, Failure> {
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
        let error = |reason| GatewayError::Backend { backend: self.name(), reason };
        match sent {
            Ok(response) => match self.first_bytes(response, sent_at).await {
                FirstBytes::Answer(answer) => Ok(answer),
                FirstBytes::Broken(reason) => Err(Failure::Broken(error(reason))),
                FirstBytes::TimedOut(timeout) => Err(Failure::TimedOut(timeout)),
            },
            Err(UpstreamError::Timeout(after)) => {
                Err(Failure::TimedOut(GatewayError::BackendTimeout { backend: self.name(), after }))
            }
            Err(UpstreamError::Connect(reason)) => Err(Failure::Refused(error(reason))),
            Err(UpstreamError::Broken(reason)) => Err(Failure::Broken(error(reason))),
        }
    }

    /// Waits (within `first_byte_timeout` of sending) for the first body bytes.
    async fn first_bytes(&self, response: hyper::Response<UpstreamBody>, sent_at: Instant) -> FirstBytes {
        let (head, mut body) = response.into_parts();
        let deadline = tokio::time::Instant::from_std(sent_at + self.config.first_byte_timeout);
        loop {
            let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
                Err(_) => {
                    return FirstBytes::TimedOut(GatewayError::BackendTimeout {
                        backend: self.name(),
                        after: self.config.first_byte_timeout,
                    });
                }
                Ok(frame) => frame,
            };
            match frame {
                None if head.status.is_success() => {
                    return FirstBytes::Broken(format!(
                        "it answered {} and then closed the connection without a byte of the answer",
                        head.status
                    ));
                }
                None => return FirstBytes::Answer(Answer { head, body, first: None, sent_at }),
                Some(Err(e)) => return FirstBytes::Broken(format!("the answer broke before its first byte: {e}")),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if !data.is_empty() => {
                        return FirstBytes::Answer(Answer { head, body, first: Some(data), sent_at });
                    }
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
pub async fn busy(mut answer: Answer) -> Inspected {
    let first = answer.first.clone().unwrap_or_default();
    if answer.head.status == hyper::StatusCode::SERVICE_UNAVAILABLE {
        return Inspected { busy: String::from_utf8_lossy(&first).contains("busy"), answer };
    }
    let sse = answer
        .head
        .headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !answer.head.status.is_success() || !sse {
        return Inspected { busy: false, answer };
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
    Inspected { busy: verdict == Event::Error, answer }
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
