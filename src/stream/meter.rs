//! `StreamMeter`: the one wrapper around every proxied streaming response body. It measures and
//! hands off (tower-http's trace body is the model):
//!
//! - forwards the backend's own bytes as soon as each SSE frame is complete (`stream/forward.rs`,
//!   which also drops the usage-only chunk when the client did not ask for usage, applies the
//!   backend's finish normalisations, `stream/finish.rs`, and names the model as the client did);
//! - measures what the client really got ([`StreamFigures`]: time to first token, decode speed,
//!   tokens from the backend's last `usage`, an `{"error": …}` event as a failure whatever
//!   `finish_reason` follows);
//! - holds the request's queue [`Permit`] until the body ends or the client goes away — or, for
//!   a backend that keeps generating after its client left (`hold_abandoned`), hands it to a
//!   `stream/abandoned.rs` hold until the backend has ended the answer;
//! - classifies how the stream ended, once: complete (`[DONE]` or a `finish_reason` seen), an
//!   error event, or cut — an end of file before the answer's end (HTTP/1.0 bodies end at the
//!   close, so a crashed mlx_lm.server looks like a normal end), a broken connection, silence
//!   longer than `stream_idle_timeout`, an event larger than [`MAX_EVENT_BYTES`], or the
//!   gateway's shutdown cut ([`Cutoff`]); a cut stream gets a final SSE error event and counts
//!   as a backend failure;
//! - hands the figures to the request's record, once, when the stream ends: the record
//!   (`outcome.rs`) records every metric of the finished request.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::abandoned;
use super::alarms::{Alarms, Rang};
use super::figures::StreamFigures;
use super::finish::StreamNormalise;
use super::forward::Forward;
use super::shutdown::Cutoff;
use crate::backend::upstream::UpstreamBody;
use crate::dispatch::queue::Permit;
use crate::error::GatewayError;
use crate::outcome::{Outcome, RequestRecord};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

/// The largest SSE event (or unfinished line) a backend may send: past it the stream is cut,
/// so a backend that never ends a line cannot make the gateway hold its bytes without bound.
pub const MAX_EVENT_BYTES: usize = 16 << 20;

/// Who the request was and what the client asked.
pub struct RequestInfo {
    /// The request's one outcome record (labels, arrival time).
    pub record: RequestRecord,
    pub queue_wait: Duration,
    /// The client asked for `stream_options.include_usage`; else the usage-only chunk is dropped.
    pub client_wants_usage: bool,
    /// Append `: mlxgate queue_ms=… ttft_ms=… tokens=… tps=…` at the end (`x-mlxgate-stats: 1`).
    pub stats_comment: bool,
    /// Longest silence of the backend once its answer has begun.
    pub idle_timeout: Duration,
    /// The gateway's shutdown cut.
    pub cutoff: Arc<Cutoff>,
    /// The backend's stream-side normalisations.
    pub normalise: StreamNormalise,
}

impl RequestInfo {
    fn backend(&self) -> String {
        self.record.backend.clone()
    }
}

pin_project! {
    /// Wraps the backend's streaming body for the client.
    #[project = StreamMeterProj]
    pub struct StreamMeter {
        // The backend's body; taken by the reading of an abandoned stream (`hold_abandoned`).
        inner: Option<UpstreamBody>,
        forward: Forward,
        figures: StreamFigures,
        info: Option<RequestInfo>,
        permit: Option<Permit>,
        finished: bool,
        // Ring when the backend has been silent for the idle timeout, or when the gateway's
        // shutdown grace is over.
        alarms: Alarms,
    }

    impl PinnedDrop for StreamMeter {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // Dropped after the answer's `[DONE]` went out, before the backend closed: the client
            // had the whole answer and hung up (Codex closes at `response.completed`, which the
            // Responses face sends at `[DONE]`). That is the answer's end, not a departure.
            // Its slot is not `finish`ed (the backend's body was not read to its end: a
            // serialized backend's next request keeps its pauses).
            if this.figures.done && this.forward.out.is_empty() {
                // Its last bytes (the chunked body's end) read in the background: the
                // connection goes back to the pool rather than closing.
                if !*this.finished
                    && let Some(body) = this.inner.take()
                {
                    body.finish_in_background();
                }
                if let Some(info) = this.info.take() {
                    let outcome = if this.figures.error.is_some() { Outcome::StreamError } else { Outcome::Ok };
                    record(info, this.figures, outcome);
                }
                return;
            }
            // Dropped before its end: the client went away.
            if let Some(info) = this.info.take() {
                if info.normalise.hold_abandoned
                    && !*this.finished
                    && let (Some(body), Some(permit)) = (this.inner.take(), this.permit.take())
                {
                    let metrics = info.record.metrics();
                    let cutoff = Arc::clone(&info.cutoff);
                    abandoned::hold_in_background(body, permit, &info.record.backend, info.idle_timeout, metrics, cutoff);
                }
                record(info, this.figures, Outcome::ClientClosed);
            }
        }
    }
}

impl StreamMeter {
    /// Wraps `inner`; `first` holds bytes already taken from it (the first frame of a managed
    /// backend's answer). `permit` is released when the body ends or is dropped.
    pub fn new(inner: UpstreamBody, first: Option<Bytes>, permit: Permit, info: RequestInfo) -> Self {
        let alarms = Alarms::new(info.idle_timeout, &info.cutoff);
        let mut meter = StreamMeter {
            inner: Some(inner),
            forward: Forward::new(info.normalise).naming(info.record.public_model()),
            figures: StreamFigures { metered: true, ..Default::default() },
            info: Some(info),
            permit: Some(permit),
            finished: false,
            alarms,
        };
        if let Some(first) = first {
            let wants_usage = meter.info.as_ref().is_some_and(|i| i.client_wants_usage);
            meter.forward.observe(&mut meter.figures, first, wants_usage);
        }
        meter
    }
}

/// Hands the figures of a finished stream to its record, which records them with `outcome`.
fn record(info: RequestInfo, figures: &StreamFigures, outcome: Outcome) {
    info.record.finish_answered(outcome, &figures.of_stream());
}

/// The `x-mlxgate-stats` comment line.
fn stats_line(info: &RequestInfo, f: &StreamFigures) -> Bytes {
    let ttft = f.first_token.map(|t| t.duration_since(info.record.arrived).as_millis().to_string());
    let tps = f.decode_tokens_per_second().map(|t| format!("{t:.1}"));
    let unknown = || "unknown".to_string();
    Bytes::from(format!(
        ": mlxgate queue_ms={} ttft_ms={} tokens={} tps={}\n\n",
        info.queue_wait.as_millis(),
        ttft.unwrap_or_else(unknown),
        f.tokens().map_or_else(unknown, |t| t.to_string()),
        tps.unwrap_or_else(unknown),
    ))
}

impl Body for StreamMeter {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        let mut this = self.project();
        loop {
            if let Some(bytes) = this.forward.out.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(bytes))));
            }
            if *this.finished {
                return Poll::Ready(None);
            }
            let Some(info) = this.info.as_ref() else { return Poll::Ready(None) };
            let (wants_usage, idle_timeout) = (info.client_wants_usage, info.idle_timeout);
            if info.cutoff.is_cut() {
                cut(&mut this, |_| GatewayError::ShuttingDown);
                continue;
            }
            let polled = match this.inner.as_mut() {
                Some(inner) => Pin::new(inner).poll_frame(cx),
                None => return Poll::Ready(None),
            };
            match polled {
                Poll::Pending => match this.alarms.poll(cx) {
                    None => return Poll::Pending,
                    Some(Rang::Shutdown) => cut(&mut this, |_| GatewayError::ShuttingDown),
                    Some(Rang::Idle) => {
                        cut(&mut this, |backend| GatewayError::BackendStalled { backend, after: idle_timeout });
                    }
                },
                Poll::Ready(Some(Ok(frame))) => {
                    let now = Instant::now();
                    this.alarms.read_at(now);
                    let Ok(data) = frame.into_data() else { continue };
                    this.forward.observe_at(this.figures, data, wants_usage, now);
                    if this.forward.pending_bytes() > MAX_EVENT_BYTES {
                        let reason = format!(
                            "it sent more than {} MiB without ending an SSE event; the answer was cut",
                            MAX_EVENT_BYTES >> 20
                        );
                        cut(&mut this, |backend| GatewayError::Backend { backend, reason });
                    }
                }
                Poll::Ready(None) => {
                    this.forward.finish(this.figures, wants_usage);
                    let ended_early = !this.figures.complete();
                    if ended_early && this.figures.error.is_none() {
                        let reason = "the stream ended before the answer did (no finish_reason, no [DONE]): \
                                      the backend closed the connection"
                            .to_string();
                        cut(&mut this, |backend| GatewayError::Backend { backend, reason });
                        continue;
                    }
                    end(&mut this);
                }
                Poll::Ready(Some(Err(e))) => {
                    let reason = format!("the stream broke after it began: {e}");
                    cut(&mut this, |backend| GatewayError::Backend { backend, reason });
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.finished && self.forward.out.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// Ends a stream that reached its end: the slot freed, the outcome recorded (`ok`, or
/// `stream_error` after an error event), the stats line added when asked for.
fn end(this: &mut StreamMeterProj<'_>) {
    *this.finished = true;
    // An answer that ended with an error event did not end normally (its backend may still be
    // busy with it: vllm-mlx's serialized route).
    if let Some(mut permit) = this.permit.take()
        && this.figures.error.is_none()
    {
        permit.finish();
    }
    if let Some(info) = this.info.take() {
        let outcome = if this.figures.error.is_some() { Outcome::StreamError } else { Outcome::Ok };
        if info.stats_comment {
            this.forward.out.push_back(stats_line(&info, this.figures));
        }
        record(info, this.figures, outcome);
    }
}

/// Ends a stream that the backend cut: the unfinished event is dropped, the slot freed, the
/// request counted as the error's failure, and the client gets the error (made from the
/// backend's name) as a final SSE event.
fn cut(this: &mut StreamMeterProj<'_>, error: impl FnOnce(String) -> GatewayError) {
    if this.figures.complete() {
        // The answer had reached its end; only the close was missing (a chunked server that
        // died before its last chunk, a silent backend after `[DONE]`, the shutdown's cut).
        let wants_usage = this.info.as_ref().is_some_and(|i| i.client_wants_usage);
        this.forward.finish(this.figures, wants_usage);
        end(this);
        return;
    }
    let error = error(this.info.as_ref().map(RequestInfo::backend).unwrap_or_default());
    *this.finished = true;
    this.forward.partial.clear();
    this.permit.take();
    let id = this.info.as_ref().map_or("-", |i| i.record.request_id().as_str());
    tracing::warn!(error = %error, request_id = %id, "backend stream cut");
    let outcome = Outcome::from(&error);
    this.forward.out.push_back(error.sse_event_for(id));
    if let Some(info) = this.info.take() {
        record(info, this.figures, outcome);
    }
}
