//! The accept loop: takes client connections off a listener and serves each with hyper, so
//! that no client can take the gateway from others.
//!
//! It owns what `axum::serve` leaves out: a deadline on reading each request head (a connection
//! that never finishes its headers, or idles between requests, is closed), a cap on the
//! connections one client address holds (more are answered 503 and closed at once), a back-off
//! on accept errors such as EMFILE (logged once per burst, never spinning), and the graceful
//! shutdown: stop accepting, let running requests finish for up to the grace period, then cut.
//! A connection carrying a response that never ends by itself (the live page's feeds: see
//! [`OpenEnded`]) is closed as soon as the shutdown begins instead: a page whose reader stopped
//! (a laptop asleep with it open) would otherwise hold the shutdown for its whole grace.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// How long the loop pauses after an accept error that is not about one connection (EMFILE,
/// ENFILE, ENOBUFS): long enough not to spin, short enough that a freed descriptor is used soon.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// What each connection is held to.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Longest time to receive a whole request head, and longest idle keep-alive gap.
    pub header_read_timeout: Duration,
    /// Connections one client address may hold at once.
    pub max_per_client: usize,
}

/// In every request's extensions: what its connection carries that never ends by itself. While
/// a response holds it ([`OpenEnded::hold`]), the connection is closed at once when the
/// shutdown begins, not drained.
#[derive(Debug, Clone, Default)]
pub struct OpenEnded(Arc<AtomicUsize>);

/// A response's hold on its connection's [`OpenEnded`], released when dropped (with the body).
#[derive(Debug)]
pub struct OpenEndedHold(Arc<AtomicUsize>);

impl OpenEnded {
    /// Marks the connection as carrying a response that never ends by itself, until the hold
    /// is dropped.
    pub fn hold(&self) -> OpenEndedHold {
        self.0.fetch_add(1, Ordering::SeqCst);
        OpenEndedHold(Arc::clone(&self.0))
    }

    fn held(&self) -> bool {
        self.0.load(Ordering::SeqCst) > 0
    }
}

impl Drop for OpenEndedHold {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What serves the connections: the service of each, given its peer and its [`OpenEnded`]
/// (which goes into every request's extensions that may hold one).
pub trait Connections {
    /// One connection's service.
    type Service: hyper::service::Service<
            http::Request<Incoming>,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
            Future: Send + 'static,
        > + Send
        + 'static;

    /// The service of the connection from `peer`.
    fn connection(&self, peer: SocketAddr, open_ended: OpenEnded) -> Self::Service;
}

/// How long streams cut at the end of the grace period get to send their final error event.
const CUT_FLUSH: Duration = Duration::from_secs(1);

/// Serves `front`'s connections on `listener` until `shutdown` resolves; then stops accepting,
/// lets running requests finish for up to `grace`, calls `at_grace_end` (streams end themselves
/// with an error event), gives them a moment to send it, and cuts whatever is left.
pub async fn serve(
    front: impl Connections,
    listener: TcpListener,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
    at_grace_end: impl FnOnce(),
) {
    let builder = Arc::new(http1_builder(limits.header_read_timeout));
    let clients = ClientTable::new(limits.max_per_client);
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    let mut accept_errors = AcceptErrors::default();
    let mut shutdown = std::pin::pin!(shutdown);
    let (closing, closing_seen) = watch::channel(false);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    accept_errors.recovered();
                    let Some(slot) = clients.admit(peer.ip()) else {
                        refuse(&tcp, peer, limits.max_per_client);
                        continue;
                    };
                    // Small SSE frames must leave at once, not after Nagle's 40 ms.
                    if let Err(e) = tcp.set_nodelay(true) {
                        tracing::debug!(error = %e, "cannot set TCP_NODELAY on a client connection");
                    }
                    let open_ended = OpenEnded::default();
                    let service = front.connection(peer, open_ended.clone());
                    let watcher = graceful.watcher();
                    let builder = Arc::clone(&builder);
                    let mut closing = closing_seen.clone();
                    connections.spawn(async move {
                        let _slot = slot;
                        let conn = builder.serve_connection(TokioIo::new(tcp), service);
                        let served = watcher.watch(conn);
                        tokio::pin!(served);
                        let open_ended_at_shutdown = async {
                            // Never resolves unless the shutdown began while a response held it.
                            if closing.wait_for(|c| *c).await.is_ok() && open_ended.held() {
                                return;
                            }
                            std::future::pending::<()>().await;
                        };
                        tokio::select! {
                            result = &mut served => if let Err(e) = result {
                                tracing::debug!(%peer, error = %e, "client connection ended with an error");
                            },
                            () = open_ended_at_shutdown => {
                                tracing::debug!(%peer, "closing a connection with a live feed: the gateway is shutting down");
                            }
                        }
                    });
                }
                Err(e) => accept_errors.back_off(e).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    closing.send_replace(true);
    tracing::info!(
        grace_seconds = grace.as_secs(),
        connections = connections.len(),
        "shutting down: no new connections, waiting for running requests"
    );
    let finished = graceful.shutdown();
    tokio::pin!(finished);
    if tokio::time::timeout(grace, &mut finished).await.is_err() {
        tracing::warn!(connections = connections.len(), "grace period over: cutting the requests still running");
        at_grace_end();
        let _ = tokio::time::timeout(CUT_FLUSH, &mut finished).await;
    }
    connections.shutdown().await;
}

/// HTTP/1 only: the version sniffing of an HTTP/1-or-2 connection has no deadline, so a client
/// that connects and sends nothing would never be timed out. OpenAI clients speak HTTP/1.1.
fn http1_builder(header_read_timeout: Duration) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(header_read_timeout).keep_alive(true);
    builder
}

/// Answers a connection over its client's cap with a 503 (if the socket takes it at once) and
/// closes it. Small SSE frames aside, this is the one write that does not wait.
fn refuse(tcp: &TcpStream, peer: SocketAddr, cap: usize) {
    let body = serde_json::json!({"error": {
        "message": format!(
            "Too many connections from {} (at most {cap} at once per client address); close some and retry.",
            peer.ip()
        ),
        "type": "server_overloaded",
        "param": null,
        "code": "too_many_connections",
    }})
    .to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         retry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tcp.try_write(response.as_bytes());
}

/// Open connections per client address.
#[derive(Clone)]
struct ClientTable {
    cap: usize,
    open: Arc<Mutex<HashMap<IpAddr, ClientEntry>>>,
}

#[derive(Default)]
struct ClientEntry {
    open: usize,
    /// Connections refused since the client last held none: the first refusal is logged.
    refused: u64,
}

impl ClientTable {
    fn new(cap: usize) -> Self {
        ClientTable { cap, open: Arc::default() }
    }

    /// A slot for one more connection from `ip`, or `None` when it already holds `cap`.
    fn admit(&self, ip: IpAddr) -> Option<ClientSlot> {
        // `::ffff:1.2.3.4` on a dual-stack listener is the same client as `1.2.3.4`.
        let ip = ip.to_canonical();
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let entry = open.entry(ip).or_default();
        if entry.open >= self.cap {
            entry.refused += 1;
            if entry.refused == 1 {
                tracing::warn!(client = %ip, cap = self.cap, "client holds max_connections_per_client: refusing more");
            }
            return None;
        }
        entry.open += 1;
        Some(ClientSlot { table: self.clone(), ip })
    }

    fn release(&self, ip: IpAddr) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = open.get_mut(&ip) {
            entry.open = entry.open.saturating_sub(1);
            if entry.open == 0 {
                if entry.refused > 0 {
                    tracing::info!(client = %ip, refused = entry.refused, "client holds no connection any more");
                }
                open.remove(&ip);
            }
        }
    }
}

/// One admitted connection; frees its place when dropped.
struct ClientSlot {
    table: ClientTable,
    ip: IpAddr,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        self.table.release(self.ip);
    }
}

/// A run of failed accepts: logged once when it starts and once when it ends.
#[derive(Default)]
struct AcceptErrors {
    burst: Option<(Instant, u64)>,
}

impl AcceptErrors {
    /// Handles a failed accept. An error about one connection (reset or aborted before it was
    /// taken) is skipped; any other (out of descriptors) pauses the loop, logged once a burst.
    async fn back_off(&mut self, error: std::io::Error) {
        use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
        if matches!(error.kind(), ConnectionAborted | ConnectionRefused | ConnectionReset) {
            return;
        }
        match &mut self.burst {
            Some((_, failures)) => *failures += 1,
            None => {
                tracing::error!(
                    error = %error,
                    "accept error: pausing new connections until descriptors are free \
                     (raise the open-files limit, or lower max_connections_per_client)"
                );
                self.burst = Some((Instant::now(), 1));
            }
        }
        tokio::time::sleep(ACCEPT_BACKOFF).await;
    }

    /// A connection was accepted: ends a burst of failures.
    fn recovered(&mut self) {
        if let Some((since, failures)) = self.burst.take() {
            tracing::warn!(
                failed_accepts = failures,
                seconds = since.elapsed().as_secs(),
                "accepting connections again"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_gets_its_cap_and_its_places_back() {
        let table = ClientTable::new(2);
        let a: IpAddr = "127.0.0.2".parse().expect("ip");
        let b: IpAddr = "127.0.0.1".parse().expect("ip");
        let first = table.admit(a).expect("first");
        let second = table.admit(a).expect("second");
        assert!(table.admit(a).is_none(), "a third connection from the same address is refused");
        assert!(table.admit(b).is_some(), "another address is not affected");
        drop(first);
        assert!(table.admit(a).is_some(), "a closed connection frees its place");
        drop(second);
    }

    #[test]
    fn an_ipv4_mapped_address_is_the_same_client() {
        let table = ClientTable::new(1);
        let _v4 = table.admit("10.0.0.1".parse().expect("ip")).expect("first");
        assert!(table.admit("::ffff:10.0.0.1".parse().expect("ip")).is_none());
    }
}
