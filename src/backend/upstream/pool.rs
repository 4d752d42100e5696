//! The connections to the backends, kept alive and driven by the task that uses them (pingora's
//! shape): no connection has a task of its own, and the HTTP/1.1 on them is the gateway's own
//! (`wire.rs`), not a general client's. An exchange — write the request, read the answer's head,
//! read its body — reads and writes its socket from the task that serves the client, so a chunk
//! from the backend reaches the client's socket without a wake-up of another task, and no
//! dispatcher, channel or second header map stands between them.
//!
//! - **Checkout** ([`Destination::exchange`]): the most recently used idle connection (LIFO: the
//!   least likely to be closing), after dropping those idle past the backend's pool idle timeout
//!   and one that shows it was closed (its socket read once, without a waker, before use: a
//!   server's FIN, or bytes nobody asked for, are seen there); else a new connection
//!   (`TCP_NODELAY`, keep-alive probes, within the connect timeout).
//! - **A request is sent again on a new connection only when none of it was written**: the
//!   connection's first write failed. Once written, a POST may have been read by the backend;
//!   the caller decides.
//! - **Check-in**: when the answer's body has been read to its end, its framing allowed another
//!   request (HTTP/1.1 without `Connection: close`, a length or chunked body) and nothing
//!   follows it on the socket, the connection goes back to its destination's idle list (at most
//!   [`MAX_IDLE`]); an answer dropped before its end closes its connection (HTTP/1 has no other
//!   way to abort one).
//! - **Idle connections are reaped** every so often by one task per pool (it ends with the pool):
//!   a connection idle past its timeout is closed even when no request comes.

use std::collections::HashMap;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method, Response};
use http_body::{Body, Frame, SizeHint};
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;

use super::wire::{self, Decoder, Step, WireError};

/// Idle connections kept per destination.
pub const MAX_IDLE: usize = 64;

/// How long the last bytes of an answer whose client hung up at its `[DONE]` may take to come
/// (see [`UpstreamBody::finish_in_background`]); past it, its connection is closed.
const DRAIN_WAIT: Duration = Duration::from_secs(1);

/// The most of such an answer read after its `[DONE]` before its connection is closed instead.
const DRAIN_BYTES: usize = 64 << 10;

/// The TCP keep-alive probes' idle time on a backend connection.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// The room made in a connection's read buffer before each read.
const READ_ROOM: usize = 16 << 10;

/// One backend address (scheme `http`, a host and a port) and its idle connections.
pub struct Destination {
    host: String,
    port: u16,
    /// The `Host` header its requests carry (the URL's host, and its port unless the default).
    pub authority: HeaderValue,
    /// The URL's path, without its last `/` (empty for none): every request's path goes after it.
    pub prefix: String,
    #[expect(
        clippy::vec_box,
        reason = "a link moves between this list and an answer's body: boxed once, at its connect"
    )]
    idle: Mutex<Vec<Box<Link>>>,
    /// Idle connections older than this are closed (the backend's pool idle timeout).
    idle_timeout: Duration,
    /// The pool, whose reaper a connection going idle wakes.
    pool: Weak<Pool>,
}

/// A connection: its socket and the bytes read from it that no answer has taken yet.
pub struct Link {
    tcp: TcpStream,
    buf: BytesMut,
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
    Broken(WireError),
}

/// Why a request got no head on a connection.
enum SendError {
    /// None of it was written (the connection had closed): send it on another.
    Unsent,
    Broken(WireError),
}

/// A request as it goes on the wire: its head (request line and headers) and its body.
pub struct Outgoing {
    pub head: Vec<u8>,
    pub body: Bytes,
    /// It is a `HEAD` request (its answer has no body).
    pub head_request: bool,
}

impl Outgoing {
    /// `method target` with `headers` and `body`; `Err` for a target that cannot be sent.
    pub fn new(method: &Method, target: &str, headers: &HeaderMap, body: Bytes) -> Result<Self, WireError> {
        let mut head = Vec::new();
        wire::encode_request(&mut head, method, target, headers, body.len())?;
        Ok(Outgoing { head, body, head_request: *method == Method::HEAD })
    }
}

impl Link {
    fn new(tcp: TcpStream, home: Weak<Destination>) -> Self {
        Link { tcp, buf: BytesMut::new(), since: Instant::now(), home }
    }

    /// Reads what the socket has into the buffer: the bytes read (0 at the connection's close).
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < READ_ROOM / 4 {
            self.buf.reserve(READ_ROOM);
        }
        loop {
            ready!(self.tcp.poll_read_ready(cx))?;
            match self.tcp.try_read_buf(&mut self.buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                read => return Poll::Ready(read),
            }
        }
    }

    /// Whether an idle connection can take a request: the server has not closed it (a FIN it
    /// sent while the connection idled is read here) nor sent anything unasked.
    fn usable(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        self.poll_fill(&mut Context::from_waker(std::task::Waker::noop())).is_pending()
    }

    /// Writes `request`, then reads until its response head (a `100 Continue` or other 1xx
    /// head skipped). While the request is being written, the socket is read too: a server that
    /// answers before it has read the whole body (and perhaps closes) is heard.
    async fn send(&mut self, request: &Outgoing) -> Result<wire::Head, SendError> {
        let total = request.head.len() + request.body.len();
        let mut written = 0;
        std::future::poll_fn(|cx| {
            while written < total {
                let (head, body) = if written < request.head.len() {
                    (&request.head[written..], &request.body[..])
                } else {
                    (&[][..], &request.body[written - request.head.len()..])
                };
                let slices = [IoSlice::new(head), IoSlice::new(body)];
                match Pin::new(&mut self.tcp).poll_write_vectored(cx, &slices) {
                    Poll::Ready(Ok(0)) if written == 0 => return Poll::Ready(Err(SendError::Unsent)),
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(Err(SendError::Broken(WireError::Io(
                            std::io::ErrorKind::WriteZero.into(),
                        ))));
                    }
                    Poll::Ready(Ok(n)) => written += n,
                    Poll::Ready(Err(_)) if written == 0 => return Poll::Ready(Err(SendError::Unsent)),
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(SendError::Broken(e.into()))),
                    Poll::Pending => {
                        // An early answer ends the write: the head is read below.
                        return match self.poll_fill(cx) {
                            Poll::Ready(Ok(n)) if n > 0 => Poll::Ready(Ok(())),
                            Poll::Ready(Ok(_)) => Poll::Ready(Err(SendError::Broken(WireError::ClosedBeforeHead(0)))),
                            Poll::Ready(Err(e)) => Poll::Ready(Err(SendError::Broken(e.into()))),
                            Poll::Pending => Poll::Pending,
                        };
                    }
                }
            }
            Poll::Ready(Ok(()))
        })
        .await?;
        let whole = written == total;
        let head = std::future::poll_fn(|cx| {
            loop {
                match wire::parse_head(&mut self.buf, request.head_request) {
                    Ok(Some(head)) if head.status.is_informational() => {
                        if head.status == http::StatusCode::SWITCHING_PROTOCOLS {
                            return Poll::Ready(Err(WireError::BadHead(
                                "101 Switching Protocols to a request that asked for no upgrade".into(),
                            )));
                        }
                        continue;
                    }
                    Ok(Some(head)) => return Poll::Ready(Ok(head)),
                    Ok(None) => {}
                    Err(e) => return Poll::Ready(Err(e)),
                }
                match ready!(self.poll_fill(cx)) {
                    Ok(0) => return Poll::Ready(Err(WireError::ClosedBeforeHead(self.buf.len()))),
                    Ok(_) => {}
                    Err(e) => return Poll::Ready(Err(e.into())),
                }
            }
        })
        .await
        .map_err(SendError::Broken)?;
        let mut head = head;
        // An answer that came before the whole request was written leaves the connection unusable.
        head.keep_alive &= whole;
        Ok(head)
    }

    /// The answer's body has been read to its end: back to its destination's idle list.
    fn check_in(mut self: Box<Self>) {
        let Some(home) = self.home.upgrade() else { return };
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
    fn checkout(&self) -> Option<Box<Link>> {
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
    async fn connect(self: &Arc<Self>, connect_timeout: Duration) -> Result<Box<Link>, ExchangeError> {
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
        Ok(Box::new(Link::new(tcp, Arc::downgrade(self))))
    }

    /// Sends `request` (origin-form target, `Host` among its headers) on an idle connection or
    /// a new one, and waits for the response head; the body that comes with it reads the
    /// connection.
    pub async fn exchange(
        self: &Arc<Self>,
        request: &Outgoing,
        connect_timeout: Duration,
    ) -> Result<Response<UpstreamBody>, ExchangeError> {
        while let Some(mut link) = self.checkout() {
            match link.send(request).await {
                Ok(head) => return Ok(with_link(head, link)),
                // The connection closed before a byte went out: another one.
                Err(SendError::Unsent) => {}
                Err(SendError::Broken(e)) => return Err(ExchangeError::Broken(e)),
            }
        }
        let mut link = self.connect(connect_timeout).await?;
        match link.send(request).await {
            Ok(head) => Ok(with_link(head, link)),
            Err(SendError::Unsent) => Err(ExchangeError::Connect(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the new connection closed before the request was sent",
            ))),
            Err(SendError::Broken(e)) => Err(ExchangeError::Broken(e)),
        }
    }
}

fn with_link(head: wire::Head, link: Box<Link>) -> Response<UpstreamBody> {
    let decoder = Decoder::new(head.framing);
    let mut response = Response::new(UpstreamBody { link: Some(link), decoder, keep_alive: head.keep_alive });
    *response.status_mut() = head.status;
    *response.version_mut() = head.version;
    *response.headers_mut() = head.headers;
    // An answer without a body is over already: its connection goes back at once.
    if response.body().decoder.is_done() {
        response.body_mut().end();
    }
    response
}

/// A backend's answer body, which reads its connection while it is read, and gives the
/// connection back to its pool at its end. Dropped before its end, it closes the connection.
pub struct UpstreamBody {
    /// `None` once the body has ended (or was handed to [`UpstreamBody::finish_in_background`]).
    link: Option<Box<Link>>,
    decoder: Decoder,
    /// The answer's head allowed another request on the connection after it.
    keep_alive: bool,
}

impl UpstreamBody {
    /// An answer whose end the gateway has seen (its `[DONE]`) but whose body has not ended
    /// (the chunked body's last bytes are still to come) and whose client hung up: its last
    /// bytes are read in the background (at most [`DRAIN_WAIT`] and [`DRAIN_BYTES`], discarded)
    /// and its connection goes back to the pool. Dropped instead, the connection would close.
    pub fn finish_in_background(mut self) {
        let Some(link) = self.link.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let mut rest = UpstreamBody { link: Some(link), decoder: self.decoder, keep_alive: self.keep_alive };
        runtime.spawn(async move {
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

    /// The body has ended: its connection goes back to the pool when it can carry another
    /// request (and nothing unasked follows the answer), else it closes.
    fn end(&mut self) {
        self.decoder = Decoder::Done;
        if let Some(link) = self.link.take()
            && self.keep_alive
            && link.buf.is_empty()
        {
            link.check_in();
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = WireError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, WireError>>> {
        let this = &mut *self;
        loop {
            let Some(link) = this.link.as_mut() else { return Poll::Ready(None) };
            let step = match this.decoder.decode(&mut link.buf) {
                Ok(Step::More) => match ready!(link.poll_fill(cx)) {
                    Ok(0) => this.decoder.closed(),
                    Ok(_) => continue,
                    Err(e) => Err(e.into()),
                },
                decoded => decoded,
            };
            return Poll::Ready(match step {
                Ok(Step::Data(data)) => Some(Ok(Frame::data(data))),
                Ok(Step::End) => {
                    this.end();
                    None
                }
                Ok(Step::More) => continue,
                Err(e) => {
                    // A broken body: its connection closes.
                    this.link = None;
                    this.decoder = Decoder::Done;
                    Some(Err(e))
                }
            });
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        self.decoder.left().map_or_else(SizeHint::default, SizeHint::with_exact)
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
