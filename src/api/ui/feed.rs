//! The `/ui` page's live feeds, as Server-Sent Events (the browser's `EventSource` reconnects
//! by itself): `/ui/events` — the state of everything (`state`, when anything but the uptimes
//! changed, checked twice a second; one snapshot per tick shared by every open page), the last finished requests (`requests`, once) and each one as it finishes
//! (`request`) — and `/ui/events/logs/{name}`, a managed backend's output (`line`, the last 200
//! then each new one, the gateway's marks of starts and ends among them).
//!
//! Each open feed is one task writing into a bounded channel that the response body reads: a
//! page that reads slowly makes its task wait, and the rings it follows tell it how many
//! entries it missed (`lagged`) rather than holding them. With no page open nothing here runs.
//! Feeds end when the page goes away, when what let it in no longer does (its session ended
//! or the admin key changed: checked at every tick, as the admin layer checked it at the
//! start), or when the gateway begins to shut down.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tokio::sync::{broadcast, mpsc};

use super::super::AppState;
use super::super::admin;
use crate::accept::{OpenEnded, OpenEndedHold};
use crate::activity::RequestSummary;
use crate::auth::Access;
use crate::error::GatewayError;

/// How many requests the activity feed starts with.
const BACKLOG_REQUESTS: usize = 200;
/// How many log lines the log feed starts with.
const BACKLOG_LINES: usize = 200;
/// How often the state is compared with the last one sent.
const STATE_EVERY: Duration = Duration::from_millis(500);
/// A snapshot this young is shared by every open feed (one made per tick, not one per page).
const SHARED: Duration = Duration::from_millis(400);
/// A comment this often keeps proxies and the browser from closing an idle feed.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Events written and not yet read by the page.
const PENDING: usize = 32;
/// The most finished requests sent in one write.
const BATCH: usize = 64;

/// One SSE event: `event: NAME` and its JSON on one `data:` line (JSON never holds a raw
/// newline).
fn event(name: &str, data: &impl Serialize) -> Bytes {
    let mut frame = Vec::with_capacity(256);
    append_event(&mut frame, name, data);
    Bytes::from(frame)
}

/// Appends the event `name` with `data` as its JSON to `out`.
fn append_event(out: &mut Vec<u8>, name: &str, data: &impl Serialize) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    if serde_json::to_writer(&mut *out, data).is_err() {
        out.extend_from_slice(b"null");
    }
    out.extend_from_slice(b"\n\n");
}

/// The response whose body is what the task given the sender writes.
///
/// The body holds its connection's [`OpenEnded`] (`hold`): when the gateway begins to shut
/// down the connection is closed at once, whether or not the page still reads (one that
/// stopped, a laptop asleep with it open, would hold the shutdown for its whole grace waiting
/// for the end to be written); a page that reads sees the body fail and reconnects elsewhere.
fn stream(
    state: &AppState,
    hold: Option<OpenEndedHold>,
    run: impl FnOnce(mpsc::Sender<Bytes>) -> tokio::task::JoinHandle<()>,
) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(PENDING);
    run(tx);
    let closing = state.closing.notified();
    let cut = state.closing.is_cut();
    let body = futures_util::stream::unfold((rx, closing, cut, hold), |(mut rx, mut closing, cut, hold)| async move {
        if cut {
            return None;
        }
        tokio::select! {
            received = rx.recv() => received.map(|bytes| (Ok(bytes), (rx, closing, false, hold))),
            () = &mut closing => Some((Err(ShuttingDown), (rx, closing, true, hold))),
        }
    });
    let mut response = Body::from_stream(body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // A buffering proxy in front (nginx) would hold the events back.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// The error a feed's body ends with when the gateway shuts down.
#[derive(Debug, thiserror::Error)]
#[error("the gateway is shutting down")]
struct ShuttingDown;

/// What let a feed's request in, to ask the admin rule again: its headers and peer, and what
/// the rule depended on when it last said yes (the sessions' epoch, the keys in force).
struct Credentials {
    headers: HeaderMap,
    peer: Option<SocketAddr>,
    epoch: u64,
    access: Arc<Access>,
}

impl Credentials {
    fn of(state: &AppState, request: &Request) -> Credentials {
        let peer = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0);
        Credentials { headers: request.headers().clone(), peer, epoch: state.sessions.epoch(), access: state.access() }
    }

    /// Whether the admin rule still lets them in (a session ended, a new admin key: no),
    /// asked in full (at every tick: a session also expires).
    fn still_admitted(&mut self, state: &AppState) -> bool {
        self.epoch = state.sessions.epoch();
        self.access = state.access();
        admin::admit(state, &self.headers, self.peer).is_ok()
    }

    /// As [`still_admitted`](Self::still_admitted), asked again only when a session was closed
    /// or the keys were reloaded since (before every event: nothing is sent after a sign-out).
    fn admitted_now(&mut self, state: &AppState) -> bool {
        let unchanged = state.sessions.epoch() == self.epoch && Arc::ptr_eq(&state.access(), &self.access);
        unchanged || self.still_admitted(state)
    }
}

/// GET `/ui/events`.
pub async fn activity(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let credentials = Credentials::of(&state, &request);
    let hold = request.extensions().get::<OpenEnded>().map(OpenEnded::hold);
    stream(&Arc::clone(&state), hold, |tx| tokio::spawn(run_activity(state, credentials, tx)))
}

async fn run_activity(state: Arc<AppState>, mut credentials: Credentials, tx: mpsc::Sender<Bytes>) {
    let mut closing = state.closing.notified();
    if state.closing.is_cut() {
        return;
    }
    let first = state.snapshot_text(SHARED);
    let mut last = first.changes;
    let first = Bytes::from(format!("event: state\ndata: {}\n\n", first.text));
    let (backlog, mut finished) = state.activity.follow(BACKLOG_REQUESTS);
    if tx.send(first).await.is_err() || tx.send(event("requests", &backlog)).await.is_err() {
        return;
    }
    drop(backlog);
    let mut tick = tokio::time::interval(STATE_EVERY);
    let mut keep_alive = tokio::time::interval(KEEP_ALIVE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let frame = tokio::select! {
            () = &mut closing => return,
            () = tx.closed() => return,
            received = finished.recv() => match received {
                Ok(summary) => requests_ready(&summary, &mut finished),
                Err(broadcast::error::RecvError::Lagged(missed)) => event("lagged", &serde_json::json!({"missed": missed})),
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = tick.tick() => {
                if !credentials.still_admitted(&state) {
                    return;
                }
                let now = state.snapshot_text(SHARED);
                if now.changes == last {
                    continue;
                }
                last = now.changes;
                Bytes::from(format!("event: state\ndata: {}\n\n", now.text))
            }
            _ = keep_alive.tick() => Bytes::from_static(b": keep-alive\n\n"),
        };
        if !credentials.admitted_now(&state) || tx.send(frame).await.is_err() {
            return;
        }
    }
}

/// The `request` events of `first` and of every request already waiting behind it (at most
/// [`BATCH`]), as one write: under thousands of requests a second, one wake-up and one write
/// per batch rather than per request.
fn requests_ready(first: &RequestSummary, finished: &mut broadcast::Receiver<Arc<RequestSummary>>) -> Bytes {
    let mut frames = Vec::with_capacity(1024);
    append_event(&mut frames, "request", first);
    for _ in 1..BATCH {
        match finished.try_recv() {
            Ok(summary) => append_event(&mut frames, "request", &*summary),
            Err(broadcast::error::TryRecvError::Lagged(missed)) => {
                append_event(&mut frames, "lagged", &serde_json::json!({"missed": missed}));
            }
            Err(_) => break,
        }
    }
    Bytes::from(frames)
}

/// GET `/ui/events/logs/{name}`: a managed backend's output (404 for another backend).
pub async fn logs(
    State(state): State<Arc<AppState>>,
    name: Result<Path<String>, PathRejection>,
    request: Request,
) -> Result<Response, GatewayError> {
    let mut credentials = Credentials::of(&state, &request);
    let hold = request.extensions().get::<OpenEnded>().map(OpenEnded::hold);
    let Path(name) = name.map_err(|e| GatewayError::invalid(e.body_text(), None))?;
    let supervisor = state.dispatch.supervisors.get(&name).ok_or_else(|| GatewayError::UnknownBackend(name.clone()))?;
    let logs = Arc::clone(&supervisor.logs);
    Ok(stream(&Arc::clone(&state), hold, |tx| {
        tokio::spawn(async move {
            let mut closing = state.closing.notified();
            if state.closing.is_cut() {
                return;
            }
            let (backlog, mut lines) = logs.follow(BACKLOG_LINES);
            drop(logs);
            for line in backlog {
                if tx.send(event("line", &*line)).await.is_err() {
                    return;
                }
            }
            let mut keep_alive = tokio::time::interval(KEEP_ALIVE);
            let mut check = tokio::time::interval(STATE_EVERY);
            loop {
                let frame = tokio::select! {
                    () = &mut closing => return,
                    () = tx.closed() => return,
                    _ = check.tick() => {
                        if credentials.still_admitted(&state) {
                            continue;
                        }
                        return;
                    }
                    received = lines.recv() => match received {
                        Ok(line) => event("line", &*line),
                        Err(broadcast::error::RecvError::Lagged(missed)) => event("lagged", &serde_json::json!({"missed": missed})),
                        Err(broadcast::error::RecvError::Closed) => return,
                    },
                    _ = keep_alive.tick() => Bytes::from_static(b": keep-alive\n\n"),
                };
                if !credentials.admitted_now(&state) || tx.send(frame).await.is_err() {
                    return;
                }
            }
        })
    }))
}
