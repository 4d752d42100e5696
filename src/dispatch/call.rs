//! The call: one prepared request through its model's queue to its backend, until the answer's
//! first bytes. [`call`] is its one entry point: acquire a slot, send, wait for the first
//! bytes, retry, and hold the slot of an answer whose client left before it began; it returns
//! the held answer ([`Held`]: the slot, the answer's head and first bytes, the queue wait).
//!
//! Every retry rule is here, each in one place, decided by what the backend can have done with
//! the request (the client has seen nothing before the first bytes):
//! - **a restarted backend** (`retry_or_final`): a refused connection (nothing reached the
//!   server) or a failure on a process that is gone (whatever it began died with it) is sent
//!   again, after getting a slot again, at most twice; a live server that dropped the
//!   connection or answered an empty 2xx may be generating the answer still, and a timeout may
//!   be a server still working on it: never sent again (a server that drops connections would
//!   otherwise prefill the same prompt three times);
//! - **a busy serialized backend** ([`busy_retries`], `send`): a backend with
//!   `normalise.serialize` still busy with the previous request answers busy having generated
//!   nothing; the request is sent again after a short pause, a few times, bounded, and the
//!   client sees only the answer that was not busy;
//! - **an abandoned answer** (`attempt`, `held_for_abandoned`): for a backend that keeps
//!   generating for a client that left (`hold_abandoned`), an attempt whose client leaves
//!   before the first bytes keeps its slot until the backend has answered and its answer has
//!   been read to its end, so the next request waits in the queue rather than, unseen, at the
//!   backend;
//! - **another backend** (`failover`): on a model served by several backends, an attempt that
//!   failed before its first byte — refused, reset, timed out, or answered a 5xx — is sent to
//!   another of them (the failed one excluded: at most once per backend), within what is left
//!   of `max_wait`; never after the first byte (the client has seen it). The failure counts
//!   against the backend's health, an answer for it. A model of one backend keeps the rules
//!   above alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::Route;
use super::queue::{Ask, ClientId, Permit, Previous, bit};
use super::route::Router;
use crate::backend::handle::{Answer, BackendHandle, Failure, Outbound, busy};
use crate::error::GatewayError;
use crate::metrics::Metrics;
use crate::stream::abandoned::Hold;
use crate::stream::shutdown::Cutoff;

/// Sends to a restarted managed backend at most this many times.
const MAX_RETRIES: u32 = 2;

/// Pauses before sending again to a serialized backend that answered "busy". vllm-mlx's
/// serialized route stayed busy 47–99 ms after a client aborted a stream (measured).
const BUSY_PAUSES: [Duration; 4] =
    [Duration::from_millis(100), Duration::from_millis(200), Duration::from_millis(400), Duration::from_millis(800)];

/// A serialized backend is taken to be busy with the previous request only when that request
/// ended less than this before the new one got its slot: the route stayed busy 47–99 ms after a
/// client's abort (measured). Later, the same error event is a real failure, never sent again.
pub const BUSY_AFTER_RELEASE: Duration = Duration::from_secs(1);

/// How long a failed attempt waits to see the managed process that had it gone. A crash closes
/// the connection and ends the process at once (the supervisor sees the exit within
/// milliseconds); this bounds the wait when the process lives on (no retry then).
const REPLACEMENT_WAIT: Duration = Duration::from_secs(2);

/// Builds the request for the model's backend at a position (its upstream model name, its
/// normalisations): `None` when it takes the first backend's request as it is.
pub type Encode<'a> = &'a (dyn Fn(usize) -> Option<Result<Outbound, GatewayError>> + Send + Sync);

/// A request ready for its backend: its route, its client (for the queue's fairness), the
/// bytes to send, and the flag set once it got a slot (it may reach a backend from then on).
pub struct Prepared<'a> {
    pub route: &'a Route,
    pub client: &'a ClientId,
    /// The request for the model's first backend.
    pub outbound: &'a Outbound,
    /// The request for another backend, built once when the call is given it (`None`: every
    /// backend takes `outbound`).
    pub encode: Option<Encode<'a>>,
    /// The model's router (`None`: the least loaded backend).
    pub router: Option<Router<'a>>,
    pub sent: &'a AtomicBool,
    /// How long the request may wait for slots in all: its model's `max_wait`, or less (a
    /// request its model's `fallback:` serves keeps its own model's bound).
    pub max_wait: Duration,
    /// The request's id, for the log lines of its retries and failovers.
    pub request_id: &'a str,
}

/// The answer the call holds for its request.
pub struct Held {
    /// The slot at the backend; it travels with the answer's body.
    pub permit: Permit,
    /// The answer's head, its first bytes read.
    pub answer: Answer,
    /// Time spent waiting for slots (every attempt's).
    pub queue_wait: Duration,
}

impl Held {
    /// The model's backend that answered: its position in the model's list.
    pub fn position(&self) -> usize {
        self.permit.position()
    }
}

/// Why an attempt failed, and whether the call may send the request again.
#[derive(Debug)]
enum SendFailure {
    /// Nothing reached the client and nothing the backend began survives: send again (after
    /// getting a slot again: the backend has restarted).
    Retry(GatewayError),
    /// Give the client this error — or, on a model of several backends, send it to another
    /// (`failover`: it failed before its first byte).
    Final { error: GatewayError, failover: bool },
}

/// What an attempt came to, as the call decides on it.
enum Attempted {
    Answered(Answer, Permit),
    /// A 5xx answer before any byte reached the client: another backend may serve it.
    ServerError(Answer, Permit),
    Failed(SendFailure),
}

/// acquire → send, sent again (up to [`MAX_RETRIES`]) when the managed process that had it is
/// gone before the first byte, or to another backend of the model when one failed before it.
/// Returns the slot, the answer and the time spent waiting for slots. `metrics`: the queue wait
/// and held abandoned answers are observed there; `cutoff`: the end of the shutdown grace,
/// which ends the hold of an abandoned answer.
pub async fn call(request: Prepared<'_>, metrics: &Metrics, cutoff: &Arc<Cutoff>) -> Result<Held, GatewayError> {
    let Prepared { route, client, outbound, encode, mut router, sent, max_wait, request_id } = request;
    let model = &route.model.name;
    let several = route.backends.len() > 1;
    let mut retries = 0;
    // Backends tried and failed before their first byte (a model of several backends).
    let mut excluded = 0u64;
    // The requests built for other backends than the first, by position, when they differ.
    let mut others: Vec<Option<Outbound>> = Vec::new();
    // A request's queue wait is the time it waited for slots: a retry's wait for the restarted
    // backend counts, its failed attempt at the backend does not. Recorded once, when the
    // request got at least one slot.
    let mut queue_wait = Duration::ZERO;
    let observe_wait = |waited: Duration| metrics.queue_wait.with_label_values(&[&model]).observe(waited.as_secs_f64());
    let mut attempts = 0u32;
    let (permit, answer) = loop {
        // A request sent again waits again, within what is left of its max_wait.
        let left = max_wait.saturating_sub(queue_wait).max(Duration::from_millis(1));
        let asked = Instant::now();
        // A reborrow for this acquire (the router's object lifetime shortened to it).
        let this_time = router.as_mut().map(|r| &mut **r as Router<'_>);
        let ask = Ask { client: client.clone(), limit: left, excluded, router: this_time };
        let acquired = route.slot.acquire_with(ask).await;
        queue_wait += asked.elapsed();
        let permit = match acquired {
            Ok(permit) => permit,
            Err(e) => {
                if attempts > 0 {
                    observe_wait(queue_wait);
                }
                return Err(e);
            }
        };
        attempts += 1;
        let position = permit.position();
        let backend = &route.backends[position];
        let outbound = match outbound_for(outbound, encode, &mut others, position) {
            Ok(outbound) => outbound,
            Err(e) => {
                observe_wait(queue_wait);
                return Err(e);
            }
        };
        sent.store(true, Ordering::SeqCst);
        let may_fail_over = |excluded: u64| several && route.slot.has_other(excluded | bit(position));
        // Another backend could take it: a failure goes there at once, not waiting to see
        // whether a managed process is gone.
        let elsewhere = may_fail_over(excluded);
        let attempted = attempt(backend, outbound, permit, retries == 0, elsewhere, metrics, cutoff).await;
        let failed = match attempted {
            Attempted::Answered(answer, permit) => {
                if several {
                    route.slot.report(position, true);
                }
                break (permit, answer);
            }
            Attempted::ServerError(answer, permit) => {
                if !several {
                    break (permit, answer);
                }
                route.slot.report(position, false);
                if !may_fail_over(excluded) {
                    break (permit, answer);
                }
                let status = answer.head.status;
                drop((answer, permit));
                tracing::warn!(request_id, backend = %backend.config.name, %status, "backend answered an error before its first byte; sending to another backend");
                excluded |= bit(position);
                continue;
            }
            Attempted::Failed(failed) => failed,
        };
        if several {
            route.slot.report(position, false);
        }
        match failed {
            SendFailure::Retry(e) | SendFailure::Final { error: e, failover: true } if may_fail_over(excluded) => {
                tracing::warn!(request_id, backend = %backend.config.name, error = %e, "backend failed before the first byte; sending to another backend");
                excluded |= bit(position);
            }
            SendFailure::Retry(e) if retries < MAX_RETRIES => {
                retries += 1;
                tracing::warn!(request_id, backend = %backend.config.name, error = %e, retries, "backend failed before the first byte and its process is gone; sending again");
            }
            SendFailure::Retry(e) | SendFailure::Final { error: e, .. } => {
                observe_wait(queue_wait);
                return Err(e);
            }
        }
    };
    observe_wait(queue_wait);
    Ok(Held { permit, answer, queue_wait })
}

/// The request for the backend at `position`: the first backend's, or the one `encode` builds
/// for it (once: kept in `others`).
fn outbound_for<'o>(
    first: &'o Outbound,
    encode: Option<Encode<'_>>,
    others: &'o mut Vec<Option<Outbound>>,
    position: usize,
) -> Result<&'o Outbound, GatewayError> {
    let Some(encode) = encode.filter(|_| position > 0) else { return Ok(first) };
    if others.len() <= position {
        others.resize_with(position + 1, || None);
    }
    if others[position].is_none() {
        match encode(position) {
            None => return Ok(first),
            Some(built) => others[position] = Some(built?),
        }
    }
    Ok(others[position].as_ref().unwrap_or(first))
}

/// One attempt at the backend, holding `permit`. For a backend that keeps generating for a
/// client that left (`hold_abandoned`), the attempt runs as its own task: if the client goes
/// away before the answer's first bytes (a long prefill, a whole answer being generated), the
/// slot stays held until the backend has answered and its answer has been read to its end, so
/// the next request waits in the queue rather than, unseen, at the backend.
async fn attempt(
    backend: &BackendHandle,
    outbound: &Outbound,
    permit: Permit,
    first_attempt: bool,
    elsewhere: bool,
    metrics: &Metrics,
    cutoff: &Arc<Cutoff>,
) -> Attempted {
    // A request sent again after a restart was its own previous request: no busy retries.
    let busy_retries = if first_attempt { busy_retries(permit.previous()) } else { 0 };
    let answered = if !backend.config.normalise.hold_abandoned {
        send(backend, outbound, busy_retries, elsewhere).await.map(|answer| (answer, permit))
    } else {
        held(backend, outbound, permit, (busy_retries, elsewhere), metrics, cutoff).await
    };
    match answered {
        Ok((answer, permit)) if fails_over(answer.head.status) => Attempted::ServerError(answer, permit),
        Ok((answer, permit)) => Attempted::Answered(answer, permit),
        Err(failed) => Attempted::Failed(failed),
    }
}

/// The attempt of a `hold_abandoned` backend, as its own task (see [`attempt`]).
async fn held(
    backend: &BackendHandle,
    outbound: &Outbound,
    permit: Permit,
    (busy_retries, elsewhere): (usize, bool),
    metrics: &Metrics,
    cutoff: &Arc<Cutoff>,
) -> Result<(Answer, Permit), SendFailure> {
    let backend = backend.clone();
    let copy = Outbound {
        method: outbound.method.clone(),
        path_and_query: outbound.path_and_query.clone(),
        headers: outbound.headers.clone(),
        body: outbound.body.clone(),
    };
    let name = backend.config.name.clone();
    let (metrics, cutoff) = (metrics.clone(), Arc::clone(cutoff));
    let (mut tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let send = send(&backend, &copy, busy_retries, elsewhere);
        tokio::pin!(send);
        let answered = tokio::select! {
            answered = &mut send => answered,
            () = tx.closed() => return held_for_abandoned(send, permit, &backend, &metrics, &cutoff).await,
        };
        // The client may have left in between.
        if let Err((answered, permit)) = tx.send((answered, permit)) {
            held_for_abandoned(std::future::ready(answered), permit, &backend, &metrics, &cutoff).await;
        }
    });
    match rx.await {
        Ok((answered, permit)) => answered.map(|answer| (answer, permit)),
        Err(_) => {
            // The attempt's task failed (and its slot went with it).
            let reason = "the attempt ended without an answer".to_string();
            Err(SendFailure::Final { error: GatewayError::Backend { backend: name, reason }, failover: false })
        }
    }
}

/// How often a request is sent again to a serialized backend that answers busy: after an
/// aborted (or failed) request, every pause of [`BUSY_PAUSES`]; after one that ended normally
/// (busy then was seen once in ten raw-socket tries, never through the gateway), once.
pub fn busy_retries(previous: Option<Previous>) -> usize {
    match previous {
        Some(p) if p.ended_ago < BUSY_AFTER_RELEASE && !p.finished => BUSY_PAUSES.len(),
        Some(p) if p.ended_ago < BUSY_AFTER_RELEASE => 1,
        _ => 0,
    }
}

/// Sends `request`: one attempt, sent again (after a pause, at most `busy_retries` times, see
/// [`busy_retries`]) while a serialized backend answers that it is busy. `elsewhere`: another
/// backend of the model could take it (see [`retry_or_final`]).
async fn send(
    backend: &BackendHandle,
    request: &Outbound,
    busy_retries: usize,
    elsewhere: bool,
) -> Result<Answer, SendFailure> {
    let mut pauses = BUSY_PAUSES.iter().take(busy_retries);
    loop {
        let generation = backend.supervisor().map(|s| s.status().generation);
        let answer = match backend.attempt(request).await {
            Ok(answer) => answer,
            Err(failure) => return Err(retry_or_final(backend, generation, failure, elsewhere).await),
        };
        if !backend.config.normalise.serialize || busy_retries == 0 {
            return Ok(answer);
        }
        let inspected = busy(answer).await;
        match pauses.next() {
            Some(pause) if inspected.busy => {
                tracing::info!(backend = %backend.config.name, pause_ms = pause.as_millis() as u64, "the serialized backend answered busy; sending again");
                tokio::time::sleep(*pause).await;
            }
            _ => return Ok(inspected.answer),
        }
    }
}

/// Whether a failed attempt on process `generation` (`None`: a backend mlxgate does not run)
/// may be sent again. A refused connection is safe to retry, but only once the process can
/// have been replaced; otherwise retrying is safe only when the process that had it is gone.
/// A timeout is never retried. With `elsewhere` (another backend of the model could take it),
/// every failure goes there at once.
async fn retry_or_final(
    backend: &BackendHandle,
    generation: Option<u64>,
    failure: Failure,
    elsewhere: bool,
) -> SendFailure {
    // Every failure before the first byte may go to another backend of the model.
    let (refused, error) = match failure {
        Failure::TimedOut(error) => return SendFailure::Final { error, failover: true },
        Failure::Refused(error) => (true, error),
        Failure::Broken(error) => (false, error),
    };
    let (Some(supervisor), Some(generation), false) = (backend.supervisor(), generation, elsewhere) else {
        return SendFailure::Final { error, failover: true };
    };
    let gone = supervisor.replaced(generation, REPLACEMENT_WAIT).await;
    if refused || gone { SendFailure::Retry(error) } else { SendFailure::Final { error, failover: true } }
}

/// Holds `permit` for an attempt whose client left before its answer's first bytes: until the
/// backend has `answered` and its answer has been read to its end, or the gateway's shutdown
/// (the one [`Hold`], the meter's too).
async fn held_for_abandoned(
    answered: impl std::future::Future<Output = Result<Answer, SendFailure>>,
    permit: Permit,
    backend: &BackendHandle,
    metrics: &Metrics,
    cutoff: &Arc<Cutoff>,
) {
    let config = &backend.config;
    let hold = Hold::begin(permit, &config.name, config.stream_idle_timeout, metrics, Arc::clone(cutoff));
    hold.until_ended(async { answered.await.ok().map(|answer| answer.body) }).await;
}

/// A server's answer before any byte reached the client that another backend of the model may
/// serve better, and that counts against the backend's health: 502, 503 and 504 (the server, or
/// a proxy in front of it, is unavailable or overloaded). Other 5xx — a 500 a request itself
/// provokes (a chat template that cannot render it, a model name a server does not take) —
/// go to the client as they are: sent to every backend, one bad request would eject them all.
fn fails_over(status: axum::http::StatusCode) -> bool {
    matches!(status.as_u16(), 502..=504)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_retries_follow_how_the_previous_request_ended() {
        let ended = |ago_ms: u64, finished: bool| Some(Previous { ended_ago: Duration::from_millis(ago_ms), finished });
        assert_eq!(busy_retries(ended(50, false)), BUSY_PAUSES.len(), "after an abort: every pause");
        assert_eq!(busy_retries(ended(50, true)), 1, "after a normal end: once");
        assert_eq!(busy_retries(ended(1500, false)), 0, "long after: a real failure");
        assert_eq!(busy_retries(None), 0, "no previous request");
    }
}
