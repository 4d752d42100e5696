//! The connections to the backends, kept alive and driven by the task that uses them (pingora's
//! shape): no connection has a task of its own. An exchange — send the request, read the
//! answer's head, read its body — polls its connection from the task that serves the client, so
//! a chunk from the backend reaches the client's socket without a wake-up of another task.
//!
//! - **Checkout** ([`Destination::exchange`]): the most recently used idle connection (LIFO: the
//!   least likely to be closing), after dropping those idle past the backend's pool idle timeout
//!   and one that shows it was closed (polled once, without a waker, before use: a server's FIN
//!   is seen there); else a new connection (`TCP_NODELAY`, keep-alive probes, within the
//!   connect timeout).
//! - **A request is sent again on a new connection only when none of it was written**: hyper
//!   hands it back (`try_send_request`) when the connection closed before it wrote a byte. Once
//!   written, a POST may have been read by the backend; the caller decides.
//! - **Check-in** ([`Link::check_in`]): when the answer's body has been read to its end and the
//!   connection is ready for another request, it goes back to its destination's idle list (at
//!   most [`MAX_IDLE`]); an answer dropped before its end closes its connection (HTTP/1 has no
//!   other way to abort one).
//! - **Idle connections are reaped** every so often by one task per pool (it ends with the pool):
//!   a connection idle past its timeout is closed even when no request comes.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Idle connections kept per destination.
pub const MAX_IDLE: usize = 64;

/// How long the last bytes of an answer whose client hung up at its `[DONE]` may take to come
/// (see [`UpstreamBody::finish_in_background`]); past it, its connection is closed.
const DRAIN_WAIT: Duration = Duration::from_secs(1);

/// The most of such an answer read after its `[DONE]` before its connection is closed instead.
const DRAIN_BYTES: usize = 64 << 10;

/// The TCP keep-alive probes' idle time on a backend connection.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

type Conn = http1::Connection<TokioIo<TcpStream>, Full<Bytes>>;

/// One backend address (scheme `http`, a host and a port) and its idle connections.
pub struct Destination {
    host: String,
    port: u16,
    /// The `Host` header its requests carry (the URL's host, and its port unless the default).
    pub authority: HeaderValue,
    /// The URL's path, without its last `/` (empty for none): every request's path goes after it.
    pub prefix: String,
    idle: Mutex<Vec<Link>>,
    /// Idle connections older than this are closed (the backend's pool idle timeout).
    idle_timeout: Duration,
    /// The pool, whose reaper a connection going idle wakes.
    pool: Weak<Pool>,
}

/// A connection: the handle requests are sent through, and the connection's state machine,
/// which whoever awaits the answer polls.
pub struct Link {
    sender: http1::SendRequest<Full<Bytes>>,
    /// The connection's state machine; `None` once it has completed (it is closed). Dropped at
    /// once then: a request still queued on it comes back to its sender unsent.
    conn: Option<Pin<Box<Conn>>>,
    /// When it went idle.
    since: Instant,
    home: Weak<Destination>,
}

/// Why an exchange got no response head.
#[derive(Debug)]
pub enum ExchangeError {
    /// No connection could be made: nothing reached the backend.
    Connect(std::io::Error),
    /// The connection failed after the request may have reached the backend.
    Broken(hyper::Error),
}

impl Link {
    /// Polls the connection's state machine (reads and writes on its socket); once it has
    /// completed, the connection is dropped (`conn` is `None`).
    fn drive(&mut self, cx: &mut Context<'_>) {
        if let Some(conn) = self.conn.as_mut()
            && conn.as_mut().poll(cx).is_ready()
        {
            self.conn = None;
        }
    }

    /// Whether an idle connection can take a request: not closed (a FIN the server sent while
    /// it idled is read here) and ready.
    fn usable(&mut self) -> bool {
        self.drive(&mut Context::from_waker(std::task::Waker::noop()));
        self.conn.is_some() && self.sender.is_ready()
    }

    /// Sends `request` and waits for the response head, driving the connection meanwhile.
    /// `Err(Ok(request))`: nothing of it was written (the connection had closed); send it on
    /// another.
    async fn send(
        &mut self,
        request: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, Result<Request<Full<Bytes>>, hyper::Error>> {
        let response = self.sender.try_send_request(request);
        let mut response = std::pin::pin!(response);
        let sent = std::future::poll_fn(|cx| {
            self.drive(cx);
            response.as_mut().poll(cx)
        })
        .await;
        sent.map_err(|mut e| match e.take_message() {
            Some(request) => Ok(request),
            None => Err(e.into_error()),
        })
    }

    /// The answer's body has been read to its end: back to its destination's idle list when it
    /// can take another request, else closed.
    fn check_in(mut self, cx: &mut Context<'_>) {
        self.drive(cx);
        let Some(home) = self.home.upgrade() else { return };
        // Ready for another request, or about to be (hyper may want one more poll to see the
        // answer ended: the checkout's poll gives it that).
        if self.conn.is_none() || self.sender.is_closed() {
            return;
        }
        self.since = Instant::now();
        let pool = home.pool.upgrade();
        {
            let mut idle = home.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if idle.len() < MAX_IDLE {
                idle.push(self);
            }
        }
        if let Some(pool) = pool {
            pool.reap_later();
        }
    }
}

impl Destination {
    /// The destination of `host:port`, its idle connections closed after `idle_timeout`.
    pub fn new(host: String, port: u16, authority: HeaderValue, prefix: String, idle_timeout: Duration) -> Self {
        Destination { host, port, authority, prefix, idle: Mutex::default(), idle_timeout, pool: Weak::new() }
    }

    /// The request target of `path_and_query` at this destination (after the URL's own path).
    pub fn target<'a>(&self, path_and_query: &'a str) -> std::borrow::Cow<'a, str> {
        if self.prefix.is_empty() {
            std::borrow::Cow::Borrowed(path_and_query)
        } else {
            std::borrow::Cow::Owned(format!("{}{path_and_query}", self.prefix))
        }
    }

    /// A usable idle connection, the stale ones dropped on the way.
    fn checkout(&self) -> Option<Link> {
        let mut idle = self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let expired = idle.iter().take_while(|l| l.since.elapsed() >= self.idle_timeout).count();
        idle.drain(..expired);
        while let Some(mut link) = idle.pop() {
            if link.usable() {
                return Some(link);
            }
        }
        None
    }

    /// Closes the connections idle past the timeout and those the server closed; whether any
    /// is left idle.
    fn reap(&self) -> bool {
        let mut idle = self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        idle.retain_mut(|l| l.since.elapsed() < self.idle_timeout && l.usable());
        !idle.is_empty()
    }

    /// A new connection, within `connect_timeout`: each address the host name resolves to is
    /// tried in turn with its share of what is left of the timeout (a firewalled IPv6 address
    /// first does not keep the IPv4 one from being tried).
    async fn connect(self: &Arc<Self>, connect_timeout: Duration) -> Result<Link, ExchangeError> {
        let deadline = tokio::time::Instant::now() + connect_timeout;
        let timed_out = || {
            let after = format!("no connection within {}", humantime::format_duration(connect_timeout));
            ExchangeError::Connect(std::io::Error::new(std::io::ErrorKind::TimedOut, after))
        };
        let addresses: Vec<std::net::SocketAddr> = match self.host.parse::<std::net::IpAddr>() {
            Ok(ip) => vec![std::net::SocketAddr::new(ip, self.port)],
            Err(_) => match tokio::time::timeout_at(deadline, tokio::net::lookup_host((self.host.as_str(), self.port)))
                .await
            {
                Ok(Ok(found)) => found.collect(),
                Ok(Err(e)) => return Err(ExchangeError::Connect(e)),
                Err(_) => return Err(timed_out()),
            },
        };
        let mut last = None;
        let mut tcp = None;
        for (i, address) in addresses.iter().enumerate() {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let share = left / u32::try_from(addresses.len() - i).unwrap_or(1);
            match tokio::time::timeout(share, TcpStream::connect(address)).await {
                Ok(Ok(connected)) => {
                    tcp = Some(connected);
                    break;
                }
                Ok(Err(e)) => last = Some(ExchangeError::Connect(e)),
                Err(_) => last = Some(timed_out()),
            }
        }
        let Some(tcp) = tcp else {
            return Err(last.unwrap_or_else(|| {
                let none = format!("{} resolves to no address", self.host);
                ExchangeError::Connect(std::io::Error::new(std::io::ErrorKind::NotFound, none))
            }));
        };
        // Small SSE frames must not wait 40 ms for Nagle; a peer that vanished is noticed.
        let _ = tcp.set_nodelay(true);
        let _ = socket2::SockRef::from(&tcp).set_tcp_keepalive(&socket2::TcpKeepalive::new().with_time(TCP_KEEPALIVE));
        let (sender, conn) = http1::handshake(TokioIo::new(tcp)).await.map_err(ExchangeError::Broken)?;
        Ok(Link { sender, conn: Some(Box::pin(conn)), since: Instant::now(), home: Arc::downgrade(self) })
    }

    /// Sends `request` (origin-form URI, `Host` set) on an idle connection or a new one, and
    /// waits for the response head; the body that comes with it drives the connection.
    pub async fn exchange(
        self: &Arc<Self>,
        mut request: Request<Full<Bytes>>,
        connect_timeout: Duration,
    ) -> Result<Response<UpstreamBody>, ExchangeError> {
        while let Some(mut link) = self.checkout() {
            match link.send(request).await {
                Ok(response) => return Ok(with_link(response, link)),
                // The connection closed before a byte went out: another one.
                Err(Ok(unsent)) => request = unsent,
                Err(Err(e)) => return Err(ExchangeError::Broken(e)),
            }
        }
        let mut link = self.connect(connect_timeout).await?;
        match link.send(request).await {
            Ok(response) => Ok(with_link(response, link)),
            Err(Ok(_)) => Err(ExchangeError::Connect(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the new connection closed before the request was sent",
            ))),
            Err(Err(e)) => Err(ExchangeError::Broken(e)),
        }
    }
}

fn with_link(response: Response<Incoming>, link: Link) -> Response<UpstreamBody> {
    response.map(|body| UpstreamBody { body: Some(body), link: Some(link) })
}

/// A backend's answer body, which drives its connection while it is read, and gives the
/// connection back to its pool at its end. Dropped before its end, it closes the connection.
pub struct UpstreamBody {
    /// `None` once handed to [`UpstreamBody::finish_in_background`].
    body: Option<Incoming>,
    link: Option<Link>,
}

impl UpstreamBody {
    /// An answer whose end the gateway has seen (its `[DONE]`) but whose body has not ended
    /// (the chunked body's last bytes are still to come) and whose client hung up: its last
    /// bytes are read in the background (at most [`DRAIN_WAIT`] and [`DRAIN_BYTES`], discarded)
    /// and its connection goes back to the pool. Dropped instead, the connection would close.
    pub fn finish_in_background(mut self) {
        let (Some(body), Some(link)) = (self.body.take(), self.link.take()) else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        runtime.spawn(async move {
            let mut rest = UpstreamBody { body: Some(body), link: Some(link) };
            let mut read = 0;
            let drained = tokio::time::timeout(DRAIN_WAIT, async {
                while let Some(Ok(frame)) = http_body_util::BodyExt::frame(&mut rest).await {
                    read += frame.data_ref().map_or(0, Bytes::len);
                    if read > DRAIN_BYTES {
                        return;
                    }
                }
            });
            // At the body's end `poll_frame` checked the connection in; else it closes here.
            let _ = drained.await;
        });
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        if let Some(link) = this.link.as_mut() {
            link.drive(cx);
        }
        let Some(body) = this.body.as_mut() else { return Poll::Ready(None) };
        let polled = Pin::new(body).poll_frame(cx);
        if let Poll::Ready(None) = polled
            && let Some(link) = this.link.take()
        {
            link.check_in(cx);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body.as_ref().map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

/// Destinations by URL (and pool idle timeout), and the task that reaps their idle connections
/// while any is idle (no timer runs in a gateway without idle connections).
#[derive(Default)]
pub struct Pool {
    destinations: Mutex<HashMap<String, Vec<Arc<Destination>>>>,
    reaping: AtomicBool,
}

impl Pool {
    /// The destination for `url`'s connections idle at most `idle_timeout`, made on first use
    /// with `make` (which parses the URL).
    pub fn destination(
        self: &Arc<Self>,
        url: &str,
        idle_timeout: Duration,
        make: impl FnOnce() -> Option<Destination>,
    ) -> Option<Arc<Destination>> {
        let mut destinations = self.destinations.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(found) = destinations.get(url).and_then(|ds| ds.iter().find(|d| d.idle_timeout == idle_timeout)) {
            return Some(Arc::clone(found));
        }
        let mut made = make()?;
        made.pool = Arc::downgrade(self);
        let made = Arc::new(made);
        destinations.entry(url.to_string()).or_default().push(Arc::clone(&made));
        Some(made)
    }

    /// Starts the reaper unless it runs.
    fn reap_later(self: &Arc<Self>) {
        if !self.reaping.swap(true, Ordering::AcqRel) {
            spawn_reaper(Arc::downgrade(self));
        }
    }

    /// Reaps every destination; whether any connection is left idle.
    fn reap(&self) -> bool {
        let destinations: Vec<Arc<Destination>> = {
            let map = self.destinations.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            map.values().flatten().cloned().collect()
        };
        destinations.iter().fold(false, |left, d| d.reap() | left)
    }
}

/// Every second while a connection is idle, closes those idle past their timeout; ends when
/// none is idle (the next check-in starts it again) or the pool is gone.
fn spawn_reaper(pool: Weak<Pool>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        if let Some(pool) = pool.upgrade() {
            pool.reaping.store(false, Ordering::Release);
        }
        return;
    };
    runtime.spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let Some(pool) = pool.upgrade() else { return };
            if pool.reap() {
                continue;
            }
            pool.reaping.store(false, Ordering::Release);
            // A connection checked in meanwhile found the reaper running: look once more.
            if !pool.reap() || pool.reaping.swap(true, Ordering::AcqRel) {
                return;
            }
        }
    });
}
