//! One backend as the request path sees it: send a request, wait for the answer's first body
//! bytes, and decide whether a failure may be sent again (DESIGN.md rule 10: one handle owns
//! send → first byte → retry).
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

    /// One attempt: send, wait for the headers and the first body bytes.
    pub async fn send(&self, request: &Outbound) -> Result<Answer, SendFailure> {
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
