//! Holding the slot of an answer its client abandoned (`hold_abandoned`: a server that goes on
//! generating after its client left). The slot is marked abandoned — still in flight, since the
//! server is busy, but no work a swap, a stop or the idle rule waits for — and held until the
//! backend has ended the answer, read to its end and discarded (bounded), so that the next
//! request waits for the slot in the queue, where its wait shows, and not unseen at a backend
//! still busy with the abandoned answer. [`Hold`] is the one way to do it: the meter's, for a
//! client that left mid-stream ([`hold_in_background`]), and the call's, for one that left
//! before the first bytes (`Hold::begin(…).until_ended(answer)`, in `dispatch/call.rs`).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::upstream::UpstreamBody;
use bytes::Bytes;
use prometheus::IntGauge;

use super::shutdown::Cutoff;
use crate::dispatch::queue::Permit;
use crate::metrics::Metrics;

/// The longest an abandoned stream is read for before its slot is freed whatever the backend
/// does. Each read is also bounded by the backend's `stream_idle_timeout`. Ten minutes covers
/// any answer the servers here generate on a Mac (tens of thousands of tokens at 50+ tokens/s),
/// while a backend that never ends a stream cannot keep the slot for more than that.
pub const MAX_ABANDONED_DRAIN: Duration = Duration::from_secs(600);

/// How the reading of an abandoned answer ended, and what it discarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// `finished`, `broken`, `stalled`, `capped`, `shutdown` (or, for an answer that never came,
    /// `failed`).
    pub end: &'static str,
    /// The bytes read and discarded.
    pub bytes: usize,
}

/// The slot of an answer its client abandoned, held until the backend has ended that answer:
/// counted in `mlxgate_abandoned_held` (by backend) from [`Hold::begin`] until it is dropped,
/// which frees the slot.
pub struct Hold {
    /// `Some` until the hold ends (freed before the gauge goes down).
    permit: Option<Permit>,
    held: IntGauge,
    backend: String,
    idle_timeout: Duration,
    cutoff: Arc<Cutoff>,
    started: Instant,
}

impl Hold {
    /// Marks `permit`'s slot abandoned and counts it held, from now on. `idle_timeout` (the
    /// backend's `stream_idle_timeout`) bounds each read of the answer.
    pub fn begin(
        mut permit: Permit,
        backend: &str,
        idle_timeout: Duration,
        metrics: &Metrics,
        cutoff: Arc<Cutoff>,
    ) -> Hold {
        permit.abandon();
        let held = metrics.abandoned_held.with_label_values(&[backend]);
        held.inc();
        Hold { permit: Some(permit), held, backend: backend.to_string(), idle_timeout, cutoff, started: Instant::now() }
    }

    /// Holds the slot until `answer` — the abandoned answer's body once the backend has
    /// answered, `None` when it failed — has been read to its end (bounded as [`read_to_end`]
    /// is), or the gateway's shutdown; then frees it.
    pub async fn until_ended(self, answer: impl Future<Output = Option<UpstreamBody>>) {
        let notified = self.cutoff.notified();
        let shutdown = async {
            if !self.cutoff.is_cut() {
                notified.await;
            }
        };
        let drained = tokio::select! {
            body = answer => match body {
                Some(body) => read_to_end(body, self.idle_timeout, &self.cutoff).await,
                None => Drained { end: "failed", bytes: 0 },
            },
            () = shutdown => Drained { end: "shutdown", bytes: 0 },
        };
        let Drained { end, bytes } = drained;
        tracing::info!(backend = %self.backend, end, bytes, held_for = ?self.started.elapsed(), "abandoned answer read to its end; its slot is free");
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        drop(self.permit.take());
        self.held.dec();
    }
}

/// The hold of a stream whose client left with its body in hand (the meter's), on a task of its
/// own. Without a runtime (a test dropping a meter outside one) the slot is freed at once.
pub fn hold_in_background(
    body: UpstreamBody,
    permit: Permit,
    backend: &str,
    idle_timeout: Duration,
    metrics: &Metrics,
    cutoff: Arc<Cutoff>,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    let hold = Hold::begin(permit, backend, idle_timeout, metrics, cutoff);
    runtime.spawn(hold.until_ended(std::future::ready(Some(body))));
}

/// Reads an abandoned answer's `body` to its end, discarding it, bounded: each read by
/// `idle_timeout`, the whole by [`MAX_ABANDONED_DRAIN`], and the shutdown's cut.
pub async fn read_to_end(mut body: UpstreamBody, idle_timeout: Duration, cutoff: &Cutoff) -> Drained {
    use http_body_util::BodyExt;
    let mut shutdown = cutoff.notified();
    let cap = tokio::time::sleep(MAX_ABANDONED_DRAIN);
    tokio::pin!(cap);
    let mut bytes = 0;
    let end = loop {
        if cutoff.is_cut() {
            break "shutdown";
        }
        tokio::select! {
            () = shutdown.as_mut() => break "shutdown",
            () = &mut cap => break "capped",
            read = tokio::time::timeout(idle_timeout, body.frame()) => match read {
                Err(_) => break "stalled",
                Ok(None) => break "finished",
                Ok(Some(Err(_))) => break "broken",
                Ok(Some(Ok(frame))) => bytes += frame.data_ref().map_or(0, Bytes::len),
            },
        }
    };
    Drained { end, bytes }
}
