//! The commands that call a running gateway's admin API: `mlxgate drain NAME [--undrain]`.
//! The gateway is found as `mlxgate reload` finds it — the configuration file's `listen` (an
//! unspecified address is this machine's loopback) — or at the `--url` given; the admin key is
//! `--admin-key` / `MLXGATE_ADMIN_KEY` (the file holds only its digest), and without one the
//! call is made from this machine, which the gateway admits when it has no admin key.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Longest wait for the gateway's answer (an admin call answers at once).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest admin answer read (a backend's entry is a few hundred bytes).
const MAX_ANSWER: usize = 1 << 20;

/// The base URL of the gateway listening on `listen`, from this machine: an unspecified
/// address (`0.0.0.0`, `::`) is reached on the loopback. A port chosen at start (0) cannot be
/// known from the file.
pub fn gateway_url(listen: SocketAddr) -> Result<String, String> {
    if listen.port() == 0 {
        return Err("the file listens on port 0 (a port chosen at start): give the gateway's --url".into());
    }
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    Ok(format!("http://{}", SocketAddr::new(ip, listen.port())))
}

/// The admin path that drains (`true`) or undrains a backend; the name is percent-encoded
/// where a path segment needs it.
pub fn drain_path(backend: &str, drained: bool) -> String {
    let action = if drained { "drain" } else { "undrain" };
    let mut segment = String::with_capacity(backend.len());
    for byte in backend.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => segment.push(byte as char),
            _ => segment.push_str(&format!("%{byte:02X}")),
        }
    }
    format!("/admin/backends/{segment}/{action}")
}

/// POSTs the drain call to the gateway at `base` and gives the backend's entry it answers, or
/// why not (the gateway's own error message for a refusal: an unknown backend, a missing key).
pub async fn drain(base: &str, key: Option<&str>, backend: &str, drained: bool) -> Result<serde_json::Value, String> {
    let url = format!("{}{}", base.trim_end_matches('/'), drain_path(backend, drained));
    let (status, body) = post(&url, key).await?;
    let json: Option<serde_json::Value> = serde_json::from_slice(&body).ok();
    if status.is_success() {
        return json.ok_or_else(|| format!("{url} answered {status} with no JSON: is it an mlxgate gateway?"));
    }
    let message = json
        .as_ref()
        .and_then(|j| j.pointer("/error/message"))
        .and_then(serde_json::Value::as_str)
        .map_or_else(|| String::from_utf8_lossy(&body).trim().to_string(), str::to_string);
    Err(format!("{url}: {status}: {message}"))
}

/// One POST with an empty body, bounded in time and in the answer's size.
async fn post(url: &str, key: Option<&str>) -> Result<(StatusCode, Bytes), String> {
    let mut request = Request::builder().method(Method::POST).uri(url).header(header::CONTENT_LENGTH, "0");
    if let Some(key) = key {
        request = request.header(header::AUTHORIZATION, format!("Bearer {key}"));
    }
    let request = request.body(Full::new(Bytes::new())).map_err(|e| format!("{url} is not a URL: {e}"))?;
    let client = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let call = async {
        let response = client.request(request).await.map_err(|e| format!("no gateway answers at {url}: {e}"))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| format!("{url}: the answer could not be read: {e}"))?
            .to_bytes();
        Ok::<_, String>((status, body))
    };
    tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .map_err(|_| format!("{url}: no answer within {}", humantime::format_duration(CALL_TIMEOUT)))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_is_reached_where_it_listens_and_on_the_loopback_for_any_address() {
        let url = |s: &str| gateway_url(s.parse().expect("address"));
        assert_eq!(url("127.0.0.1:8000"), Ok("http://127.0.0.1:8000".to_string()));
        assert_eq!(url("0.0.0.0:8000"), Ok("http://127.0.0.1:8000".to_string()));
        assert_eq!(url("[::]:8000"), Ok("http://[::1]:8000".to_string()));
        assert_eq!(url("10.0.0.2:9000"), Ok("http://10.0.0.2:9000".to_string()));
        assert!(url("127.0.0.1:0").is_err_and(|e| e.contains("--url")));
    }

    #[test]
    fn a_backend_name_is_one_path_segment() {
        assert_eq!(drain_path("studio", true), "/admin/backends/studio/drain");
        assert_eq!(drain_path("mac mini/2", false), "/admin/backends/mac%20mini%2F2/undrain");
    }
}
