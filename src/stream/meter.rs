//! `StreamMeter`: the one wrapper around every proxied response body. It forwards each frame the
//! moment the backend's bytes arrive (no buffering), holds the request's queue [`Permit`] until
//! the body ends or the client goes away (never just until the headers), records the outcome, and
//! turns a backend failure after the stream began into a final SSE error event.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use pin_project_lite::pin_project;

use crate::dispatch::queue::Permit;
use crate::error::GatewayError;
use crate::metrics::Metrics;

/// Labels and state for recording one request when its body ends.
pub struct Outcome {
    pub metrics: Metrics,
    pub model: String,
    pub backend: String,
}

pin_project! {
    /// Wraps the backend's body for the client.
    pub struct StreamMeter {
        #[pin]
        inner: Incoming,
        // Bytes already read from `inner` (the first frame of a managed backend's answer).
        first: Option<Bytes>,
        permit: Option<Permit>,
        outcome: Option<Outcome>,
        // True for `text/event-stream`: failures become a final `data: {"error": …}` event.
        sse: bool,
        finished: bool,
    }

    impl PinnedDrop for StreamMeter {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // Body dropped before its end: the client went away.
            if let Some(outcome) = this.outcome.take() {
                outcome.record("client_closed");
            }
        }
    }
}

impl Outcome {
    fn record(self, outcome: &str) {
        self.metrics.requests.with_label_values(&[&self.model, &self.backend, outcome]).inc();
    }
}

impl StreamMeter {
    /// Wraps `inner`; `permit` is released when the body ends or is dropped.
    /// `first` holds bytes already taken from `inner`; they go out before anything else.
    pub fn new(inner: Incoming, first: Option<Bytes>, permit: Permit, outcome: Outcome, sse: bool) -> Self {
        StreamMeter { inner, first, permit: Some(permit), outcome: Some(outcome), sse, finished: false }
    }
}

impl Body for StreamMeter {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.project();
        if *this.finished {
            return Poll::Ready(None);
        }
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        match this.inner.poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
            Poll::Ready(None) => {
                *this.finished = true;
                this.permit.take();
                if let Some(outcome) = this.outcome.take() {
                    outcome.record("ok");
                }
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                *this.finished = true;
                this.permit.take();
                let backend = this.outcome.as_ref().map(|o| o.backend.clone()).unwrap_or_default();
                if let Some(outcome) = this.outcome.take() {
                    outcome.record("backend_error");
                }
                tracing::warn!(backend, error = %e, "backend stream failed after it began");
                if *this.sse {
                    let event =
                        GatewayError::Backend { backend, reason: format!("the stream broke after it began: {e}") }
                            .sse_event();
                    Poll::Ready(Some(Ok(Frame::data(event))))
                } else {
                    Poll::Ready(Some(Err(e)))
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.finished || (self.first.is_none() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        if self.finished {
            return SizeHint::with_exact(0);
        }
        let first = self.first.as_ref().map_or(0, |b| b.len() as u64);
        let inner = self.inner.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + first);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + first);
        }
        hint
    }
}
