//! The HTTP client side: pooled, kept-alive hyper clients, one per pool idle timeout in use
//! (each backend's `normalise.pool_idle_timeout`, below the server's own keep-alive so that a
//! connection the server is closing is never reused), with TCP_NODELAY (a small SSE frame must
//! not wait 40 ms for Nagle), a connect timeout and a response-header timeout per backend. The
//! transport normalisations act here: `loopback_host` (Host `127.0.0.1:<port>`, no `Origin`).
//! Transport failures are told apart here ([`UpstreamError`]): whether anything can have reached
//! the backend decides a retry.
//!
//! A request that fails on a reused connection is sent again only when hyper knows nothing of
//! it was written (its `retry_canceled_requests`, on by default: the connection was found closed
//! at checkout or before the first byte went out). Once written, a POST may have been read by the
//! backend (a server that accepted it and then dropped the connection looks the same on the wire
//! as one that was closing the idle connection), so it is never sent again here: the pool idle
//! timeout is what keeps stale connections out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, Uri, header};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::config::BackendConfig;

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

/// A pooled HTTP/1.1 client.
type Pooled = Client<HttpConnector, Full<Bytes>>;

/// Pooled HTTP/1.1 clients to the backends, one per pool idle timeout (made on first use).
#[derive(Clone)]
pub struct Upstream {
    connect_timeout: Duration,
    clients: Arc<Mutex<HashMap<Duration, Pooled>>>,
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
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
}

impl Upstream {
    /// Clients with `connect_timeout`; each backend's requests go through the one with its
    /// pool idle timeout.
    pub fn new(connect_timeout: Duration) -> Self {
        Upstream { connect_timeout, clients: Arc::default() }
    }

    /// The client whose pooled connections idle at most `idle_timeout` before they are dropped.
    fn client(&self, idle_timeout: Duration) -> Pooled {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        clients
            .entry(idle_timeout)
            .or_insert_with(|| {
                let mut connector = HttpConnector::new();
                connector.set_nodelay(true);
                connector.set_connect_timeout(Some(self.connect_timeout));
                connector.set_keepalive(Some(Duration::from_secs(60)));
                Client::builder(TokioExecutor::new())
                    .pool_idle_timeout(idle_timeout)
                    .pool_max_idle_per_host(64)
                    .build(connector)
            })
            .clone()
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
    ) -> Result<Response<Incoming>, UpstreamError> {
        let uri = format!("{}{}", backend.url, path_and_query);
        let mut builder = Request::builder().method(method).uri(&uri);
        if let Some(headers) = builder.headers_mut() {
            for (name, value) in client_headers {
                if !is_dropped_request_header(name) {
                    headers.append(name.clone(), value.clone());
                }
            }
            strip_hop_by_hop(headers);
            // A compressed stream could not be metered (and its usage not read).
            headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
            if !body.is_empty() {
                headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            }
            address_loopback(backend, headers);
        }
        let request = builder
            .body(Full::new(body))
            .map_err(|e| UpstreamError::Connect(format!("cannot build a request to {uri}: {e}")))?;
        let client = self.client(backend.normalise.pool_idle_timeout);
        match tokio::time::timeout(backend.response_timeout, client.request(request)).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) if e.is_connect() => Err(UpstreamError::Connect(describe(&e, &uri))),
            Ok(Err(e)) => Err(UpstreamError::Broken(describe(&e, &uri))),
            Err(_) => Err(UpstreamError::Timeout(backend.response_timeout)),
        }
    }

    /// A short GET used by `/ready`: true when the backend answers 2xx within `timeout`.
    pub async fn probe(&self, backend: &BackendConfig, path: &str, timeout: Duration) -> Result<(), String> {
        let uri = format!("{}{}", backend.url, path);
        let mut request = Request::get(&uri).body(Full::new(Bytes::new())).map_err(|e| e.to_string())?;
        address_loopback(backend, request.headers_mut());
        let client = self.client(backend.normalise.pool_idle_timeout);
        match tokio::time::timeout(timeout, client.request(request)).await {
            Ok(Ok(r)) if r.status().is_success() => Ok(()),
            Ok(Ok(r)) => Err(format!("GET {path} answered {}", r.status())),
            Ok(Err(e)) => Err(describe(&e, &uri)),
            Err(_) => Err(format!("GET {path} gave no answer within {}s", timeout.as_secs())),
        }
    }
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

/// Turns a client error into a sentence naming the cause (connection refused, reset, …).
fn describe(e: &hyper_util::client::legacy::Error, uri: &str) -> String {
    let mut cause: Option<&dyn std::error::Error> = std::error::Error::source(e);
    let mut deepest = e.to_string();
    while let Some(c) = cause {
        deepest = c.to_string();
        cause = c.source();
    }
    if e.is_connect() {
        format!("cannot connect to {uri}: {deepest}")
    } else {
        format!("the connection to {uri} failed before a response: {deepest}")
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
    fn clients_keys_and_cookies_are_not_forwarded() {
        for name in [header::AUTHORIZATION, HeaderName::from_static("x-api-key"), header::COOKIE] {
            assert!(is_dropped_request_header(&name), "{name}");
        }
        assert!(!is_dropped_request_header(&header::CONTENT_TYPE));
    }

    #[test]
    fn loopback_host_names_the_urls_port() {
        assert_eq!(loopback_host("http://vm:8104").expect("host"), "127.0.0.1:8104");
        assert_eq!(loopback_host("http://[::1]:9").expect("host"), "127.0.0.1:9");
        assert_eq!(loopback_host("http://studio.local").expect("host"), "127.0.0.1:80");
    }
}
