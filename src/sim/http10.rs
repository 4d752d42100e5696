//! The simulator's HTTP/1.0 transport, as mlx_lm.server (Python's `BaseHTTPServer`) speaks it:
//! one request per connection, a status line `HTTP/1.0`, no chunked encoding, and a streamed or
//! error body that ends when the server closes the connection. A 2xx whole answer carries a
//! `Content-Length`; streams and error bodies do not. When the process dies, the client sees a
//! clean end of file after the last complete write, exactly like a normal end: only `[DONE]` or
//! a `finish_reason` tells them apart.

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Request, Response, header};
use http_body::Body as _;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tower::ServiceExt;

/// Largest request head the simulator reads.
const MAX_HEAD: usize = 64 << 10;

/// Serves one request on `tcp` with `router`, then closes the connection.
pub async fn serve(mut tcp: TcpStream, router: Router) -> std::io::Result<()> {
    let Some(request) = read_request(&mut tcp).await? else { return Ok(()) };
    let response: Response<Body> = match router.oneshot(request).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    write_response(&mut tcp, response).await?;
    tcp.shutdown().await
}

/// Reads a request head and its `Content-Length` body; `None` when the client sent nothing usable.
async fn read_request(tcp: &mut TcpStream) -> std::io::Result<Option<Request<Body>>> {
    let mut buf = Vec::with_capacity(4096);
    let head_end = loop {
        let mut chunk = [0u8; 4096];
        let n = tcp.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(pos) = memchr::memmem::find(&buf, b"\r\n\r\n") {
            break pos + 4;
        }
        if buf.len() > MAX_HEAD {
            return Ok(None);
        }
    };
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut parsed = httparse::Request::new(&mut headers);
    if !matches!(parsed.parse(&buf[..head_end]), Ok(httparse::Status::Complete(_))) {
        return Ok(None);
    }
    let mut builder = Request::builder().method(parsed.method.unwrap_or("GET")).uri(parsed.path.unwrap_or("/"));
    let mut content_length = 0usize;
    for h in parsed.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            content_length = std::str::from_utf8(h.value).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(0);
        }
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(h.name.as_bytes()), HeaderValue::from_bytes(h.value)) {
            builder = builder.header(name, value);
        }
    }
    let mut body = buf[head_end..].to_vec();
    while body.len() < content_length {
        let mut chunk = vec![0u8; (content_length - body.len()).min(64 << 10)];
        let n = tcp.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(content_length);
    Ok(builder.body(Body::from(body)).ok())
}

/// Writes the status line and headers, then each body frame as its own write, as it comes.
async fn write_response(tcp: &mut TcpStream, response: Response<Body>) -> std::io::Result<()> {
    let (parts, mut body) = response.into_parts();
    let status = parts.status;
    let mut head = format!(
        "HTTP/1.0 {} {}\r\nServer: BaseHTTP/0.6 Python/3.11 (mlxgate-sim)\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    );
    for (name, value) in &parts.headers {
        if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING || name == header::CONNECTION {
            continue;
        }
        head.push_str(&format!("{}: {}\r\n", name, value.to_str().unwrap_or("")));
    }
    // Like BaseHTTPServer's handlers: a whole 2xx answer says its length; streams and error
    // bodies end at the close.
    let exact = body.size_hint().exact();
    if status.is_success()
        && let Some(length) = exact
    {
        head.push_str(&format!("Content-Length: {length}\r\n"));
    }
    head.push_str("\r\n");
    tcp.write_all(head.as_bytes()).await?;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { break };
        if let Ok(data) = frame.into_data() {
            tcp.write_all(&data).await?;
        }
    }
    Ok(())
}
