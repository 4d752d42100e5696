//! Reading bodies whole, bounded: the client's request body ([`read_body`]: its size and its
//! arrival time) and a backend's answer after its first bytes ([`read_whole`]: its size and
//! the silence between two reads).

use std::time::Duration;

use crate::backend::upstream::UpstreamBody;
use axum::body::Body;
use axum::http::header;
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};

use crate::error::GatewayError;

/// Largest whole (non-streaming) answer the gateway reads to meter it.
pub(crate) const MAX_WHOLE_ANSWER: usize = 64 << 20;

/// Largest backend error body read to put in OpenAI's shape.
pub(crate) const MAX_ERROR_BODY: usize = 1 << 20;

/// Reads the whole request body, refusing more than `limit` bytes or a body that takes longer
/// than `deadline` to arrive. A `Content-Length` over the limit is refused from the header
/// alone, before a byte of the body is read (and before a client waiting on
/// `Expect: 100-continue` is told to send it).
pub(crate) async fn read_body(
    parts: &axum::http::request::Parts,
    body: Body,
    limit: usize,
    deadline: Duration,
) -> Result<Bytes, GatewayError> {
    let declared = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(GatewayError::BodyTooLarge { limit });
    }
    match tokio::time::timeout(deadline, Limited::new(body, limit).collect()).await {
        Err(_) => Err(GatewayError::BodyTimeout { after: deadline }),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(GatewayError::BodyTooLarge { limit }),
        Ok(Err(e)) => Err(GatewayError::invalid(format!("cannot read the request body: {e}"), None)),
    }
}

/// Reads the rest of a body after `first`, at most `limit` bytes, with at most `idle_timeout`
/// between two reads.
pub(crate) async fn read_whole(
    backend: &str,
    first: Option<Bytes>,
    mut body: UpstreamBody,
    limit: usize,
    idle_timeout: Duration,
) -> Result<Vec<u8>, GatewayError> {
    let mut whole = first.map(|b| b.to_vec()).unwrap_or_default();
    loop {
        let frame = tokio::time::timeout(idle_timeout, body.frame())
            .await
            .map_err(|_| GatewayError::BackendStalled { backend: backend.to_string(), after: idle_timeout })?;
        match frame {
            None => return Ok(whole),
            Some(Err(e)) => {
                return Err(GatewayError::Backend {
                    backend: backend.to_string(),
                    reason: format!("its answer broke before its end: {e}"),
                });
            }
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    whole.extend_from_slice(&data);
                }
                if whole.len() > limit {
                    return Err(GatewayError::Backend {
                        backend: backend.to_string(),
                        reason: format!("its answer is larger than the gateway reads ({} MiB)", limit >> 20),
                    });
                }
            }
        }
    }
}
