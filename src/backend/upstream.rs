//! The HTTP client side: kept-alive HTTP/1.1 connections to the backends (`pool.rs`), each
//! driven by the task that awaits its answer (no task per connection), with TCP_NODELAY (a small
//! SSE frame must not wait 40 ms for Nagle), a connect timeout and a response-header timeout per
//! backend; idle ones are closed after the backend's `normalise.pool_idle_timeout`, below the
//! server's own keep-alive, so that a connection the server is closing is never reused. The
//! transport normalisations act here: `loopback_host` (Host `127.0.0.1:<port>`, no `Origin`).
//! Transport failures are told apart here ([`UpstreamError`]): whether anything can have reached
//! the backend decides a retry.
//!
//! A request that fails on a reused connection is sent again (on a new one) only when none of
//! it was written: the connection was found closed at checkout or before the first byte went
//! out. Once written, a POST may have been read by the backend (a server that accepted it and
//! then dropped the connection looks the same on the wire as one that was closing the idle
//! connection), so it is never sent again here: the pool idle timeout is what keeps stale
//! connections out.

mod pool;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Response, Uri, header};
use bytes::Bytes;

use crate::config::BackendConfig;
pub use pool::UpstreamBody;
use pool::{Destination, ExchangeError, Outgoing, Pool};

/// Why a request got no response headers from its backend.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// No connection: nothing reached the backend (refused, unreachable, connect timeout).
    #[error("{0}")]
    Connect(String),
    /// The connection failed after the request may have reached the backend.
    #[error("{0}")]
    Broken(String),
    /// No response headers within the backend's `response_timeout`.
    #[error("no response headers within {}s", .0.as_secs())]
    Timeout(Duration),
}

/// Kept-alive HTTP/1.1 connections to the backends (see `pool.rs`), one idle list per URL and
/// pool idle timeout.
#[derive(Clone)]
pub struct Upstream {
    connect_timeout: Duration,
    pool: Arc<Pool>,
}

/// Headers that belong to one connection and must not be forwarded (RFC 9110 §7.6.1), plus
/// those the gateway sets itself.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes hop-by-hop headers, including any named in `Connection`.
///
/// A backend's `Set-Cookie` goes too: a backend does not set cookies on the gateway's site
/// (where the `/ui` page keeps its session).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    headers.remove(header::SET_COOKIE);
    for name in connection_named(headers).iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
}

/// The client's headers a backend gets: none of the gateway's own, none hop-by-hop (the
/// standard ones and any the client's `Connection` names), with room for the gateway's.
fn end_to_end(client_headers: &HeaderMap) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(client_headers.len() + 3);
    for (name, value) in client_headers {
        if !is_dropped_request_header(name) && !HOP_BY_HOP.contains(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    for name in connection_named(client_headers) {
        headers.remove(name);
    }
    headers
}

/// The headers `Connection` names (hop-by-hop by its word).
fn connection_named(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect()
}

impl Upstream {
    /// Connections made within `connect_timeout`; each backend's idle ones are closed after its
    /// pool idle timeout.
    pub fn new(connect_timeout: Duration) -> Self {
        Upstream { connect_timeout, pool: Arc::default() }
    }

    /// The destination of `backend`'s URL (parsed once).
    fn destination(&self, backend: &BackendConfig) -> Result<Arc<Destination>, UpstreamError> {
        let idle_timeout = backend.normalise.pool_idle_timeout;
        self.pool
            .destination(&backend.url, idle_timeout, || destination_of(&backend.url, idle_timeout))
            .ok_or_else(|| UpstreamError::Connect(format!("cannot reach {}: not an http://host:port URL", backend.url)))
    }

    /// Sends `body` to `backend` at `path_and_query` with the client's end-to-end headers, and
    /// waits for the response headers (at most the backend's `response_timeout`). The backend is
    /// asked for an uncompressed answer: the gateway reads every stream it forwards.
    pub async fn send(
        &self,
        backend: &BackendConfig,
        method: Method,
        path_and_query: &str,
        client_headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let destination = self.destination(backend)?;
        let uri = || format!("{}{}", backend.url, path_and_query);
        let mut headers = end_to_end(client_headers);
        headers.insert(header::HOST, destination.authority.clone());
        // A compressed stream could not be metered (and its usage not read).
        headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        if !body.is_empty() {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        address_loopback(backend, &mut headers);
        let request = Outgoing::new(&method, &destination.target(path_and_query), &headers, body)
            .map_err(|e| UpstreamError::Connect(format!("cannot build a request to {}: {e}", uri())))?;
        let exchange = destination.exchange(&request, self.connect_timeout);
        match tokio::time::timeout(backend.response_timeout, exchange).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e @ ExchangeError::Connect(_))) => Err(UpstreamError::Connect(describe(&e, &uri()))),
            Ok(Err(e)) => Err(UpstreamError::Broken(describe(&e, &uri()))),
            Err(_) => Err(UpstreamError::Timeout(backend.response_timeout)),
        }
    }

    /// A short GET used by `/ready`: true when the backend answers 2xx within `timeout`.
    pub async fn probe(&self, backend: &BackendConfig, path: &str, timeout: Duration) -> Result<(), String> {
        let uri = format!("{}{}", backend.url, path);
        let destination = self.destination(backend).map_err(|e| e.to_string())?;
        let mut headers = HeaderMap::with_capacity(2);
        headers.insert(header::HOST, destination.authority.clone());
        address_loopback(backend, &mut headers);
        let request = Outgoing::new(&Method::GET, &destination.target(path), &headers, Bytes::new())
            .map_err(|e| e.to_string())?;
        // The status is the answer: the body is not read (its connection is then closed).
        let probe = async { destination.exchange(&request, self.connect_timeout).await.map(|r| r.status()) };
        match tokio::time::timeout(timeout, probe).await {
            Ok(Ok(status)) if status.is_success() => Ok(()),
            Ok(Ok(status)) => Err(format!("GET {path} answered {status}")),
            Ok(Err(e)) => Err(describe(&e, &uri)),
            Err(_) => Err(format!("GET {path} gave no answer within {}s", timeout.as_secs())),
        }
    }
}

/// The destination of a backend URL: `http://host[:port]` (port 80 when it names none), its
/// authority the requests' `Host`.
fn destination_of(url: &str, idle_timeout: Duration) -> Option<Destination> {
    let uri: Uri = url.parse().ok()?;
    if uri.scheme_str() != Some("http") {
        return None;
    }
    let authority = uri.authority()?;
    let host = authority.host().trim_start_matches('[').trim_end_matches(']').to_string();
    let port = authority.port_u16().unwrap_or(80);
    // As HTTP clients write it: the host (an IPv6 one in brackets), its port unless 80; never
    // the URL's user information.
    let named = if port == 80 { authority.host().to_string() } else { format!("{}:{port}", authority.host()) };
    let value = HeaderValue::from_str(&named).ok()?;
    let prefix = uri.path().trim_end_matches('/').to_string();
    Some(Destination::new(host, port, value, prefix, idle_timeout))
}

/// With `loopback_host`, the request is addressed as a local one whatever name the backend's URL
/// uses: `Host: 127.0.0.1:<the URL's port>`, and no `Origin` (Rapid-MLX answers 400 to a Host
/// that is not localhost, 127.0.0.1 or [::1], and 403 to any `Origin` not of its own address).
/// `Referer` is kept: Rapid-MLX's `BrowserSecurityMiddleware` reads only Host and Origin.
fn address_loopback(backend: &BackendConfig, headers: &mut HeaderMap) {
    if !backend.normalise.loopback_host {
        return;
    }
    headers.remove(header::ORIGIN);
    if let Some(host) = loopback_host(&backend.url) {
        headers.insert(header::HOST, host);
    }
}

/// `127.0.0.1:<port>` for a backend URL (its scheme's default port when it names none).
fn loopback_host(url: &str) -> Option<HeaderValue> {
    let uri: Uri = url.parse().ok()?;
    let port = uri.port_u16().unwrap_or(if uri.scheme_str() == Some("https") { 443 } else { 80 });
    HeaderValue::from_str(&format!("127.0.0.1:{port}")).ok()
}

/// Request headers the gateway never forwards: its own connection's framing, the gateway's
/// API key in either header clients send it in (a backend has its own), the client's `Host`,
/// the client's encodings (the gateway asks for `identity`), and the browser's cookies for the
/// gateway's host (the `/ui` page's session among them: a backend, perhaps another machine
/// over plain HTTP, would hold the admin's session).
fn is_dropped_request_header(name: &HeaderName) -> bool {
    name == header::HOST
        || name == header::CONTENT_LENGTH
        || name == header::AUTHORIZATION
        || name == "x-api-key"
        || name == header::ACCEPT_ENCODING
        || name == header::COOKIE
}

/// Turns an exchange's failure into a sentence naming the cause (connection refused, reset, …).
fn describe(e: &ExchangeError, uri: &str) -> String {
    match e {
        ExchangeError::Connect(io) => format!("cannot connect to {uri}: {io}"),
        ExchangeError::Broken(e) => format!("the connection to {uri} failed before a response: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_hop_by_hop_and_connection_named_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, x-private"));
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        h.insert(header::SET_COOKIE, HeaderValue::from_static("mlxgate_session=planted; Path=/"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key(header::CONTENT_TYPE));
    }

    #[test]
    fn the_request_drops_hop_by_hop_and_what_connection_names() {
        let mut client = HeaderMap::new();
        client.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, X-Private"));
        client.insert("x-private", HeaderValue::from_static("1"));
        client.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        client.insert(header::TE, HeaderValue::from_static("trailers"));
        client.insert(header::USER_AGENT, HeaderValue::from_static("sdk/1"));
        client.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer sk-client"));
        client.append(header::CONNECTION, HeaderValue::from_static("x-other"));
        client.insert("x-other", HeaderValue::from_static("2"));
        let sent = end_to_end(&client);
        assert_eq!(sent.keys().collect::<Vec<_>>(), [header::USER_AGENT]);
    }

    #[test]
    fn clients_keys_and_cookies_are_not_forwarded() {
        for name in [header::AUTHORIZATION, HeaderName::from_static("x-api-key"), header::COOKIE] {
            assert!(is_dropped_request_header(&name), "{name}");
        }
        assert!(!is_dropped_request_header(&header::CONTENT_TYPE));
    }

    #[test]
    fn a_destination_keeps_the_urls_path_and_names_its_host_as_clients_do() {
        let d = destination_of("http://user:secret@gw:8080/mlx/", Duration::from_secs(1)).expect("a destination");
        assert_eq!(d.authority, "gw:8080");
        assert_eq!(d.target("/v1/chat/completions"), "/mlx/v1/chat/completions");
        let d = destination_of("http://studio.local", Duration::from_secs(1)).expect("a destination");
        assert_eq!((d.authority.to_str().ok(), d.target("/health").as_ref()), (Some("studio.local"), "/health"));
        let d = destination_of("http://[::1]:80/", Duration::from_secs(1)).expect("a destination");
        assert_eq!((d.authority.to_str().ok(), d.target("/v1/models").as_ref()), (Some("[::1]"), "/v1/models"));
        assert!(destination_of("https://secure:443", Duration::from_secs(1)).is_none(), "http only");
    }

    #[test]
    fn loopback_host_names_the_urls_port() {
        assert_eq!(loopback_host("http://vm:8104").expect("host"), "127.0.0.1:8104");
        assert_eq!(loopback_host("http://[::1]:9").expect("host"), "127.0.0.1:9");
        assert_eq!(loopback_host("http://studio.local").expect("host"), "127.0.0.1:80");
    }
}
