//! Raw HTTP/1.1 over a tokio `TcpStream`, written and read by hand so that what a client
//! library hides stays visible: the status line's version, how the body is framed (chunked,
//! `Content-Length` or ended by the close), whether the server keeps the connection open, and
//! when it closes an idle one. Requests carry the URL's host as `Host` (or the loopback host the
//! probe switched to after a refusal) and no `Connection` header, as the wire facts were measured.
//! Every body read is capped (`MAX_BODY`): a server that sends without end cannot fill memory.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest response head read.
const MAX_HEAD: usize = 64 << 10;
/// Most of a whole (non-stream) body kept; the rest is not read.
pub const MAX_BODY: usize = 1 << 20;

/// Where the probed server listens: `http://host:port[/prefix]`.
#[derive(Debug, Clone)]
pub struct Target {
    pub host: String,
    pub port: u16,
    /// The path before `/v1/...` (empty for most servers).
    pub prefix: String,
    /// The `Host` header sent instead of the URL's authority (a loopback one, for a server that
    /// refused the URL's host).
    pub host_header: Option<String>,
}

impl Target {
    /// Parses an `http://` URL; a trailing `/v1` is dropped (people paste the OpenAI base URL).
    pub fn parse(url: &str) -> Result<Target, String> {
        let uri: http::Uri = url.trim().parse().map_err(|e| format!("{url}: not a URL ({e})"))?;
        if !uri.scheme_str().is_some_and(|s| s.eq_ignore_ascii_case("http")) {
            return Err(format!("{url}: only http:// URLs can be probed"));
        }
        let host = uri.host().filter(|h| !h.is_empty()).ok_or_else(|| format!("{url}: no host"))?.to_string();
        let written =
            uri.authority().and_then(|a| a.as_str().rsplit_once(':')).map(|(_, p)| p).filter(|p| !p.contains(']'));
        let port = match written {
            Some(p) => p.parse::<u16>().map_err(|_| format!("{url}: bad port {p:?}"))?,
            None => 80,
        };
        let path = uri.path().trim_end_matches('/');
        let path = path.strip_suffix("/v1").unwrap_or(if path == "v1" { "" } else { path });
        let prefix = path.trim_end_matches('/').to_string();
        Ok(Target { host, port, prefix, host_header: None })
    }

    /// The URL the gateway's `url:` key takes: `http://host:port[/prefix]`, without `/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}{}", self.authority(), self.prefix)
    }

    /// Whether the URL's host is a loopback name or address.
    pub fn loopback(&self) -> bool {
        is_loopback(&self.host)
    }

    /// `127.0.0.1:<port>`: the Host a server that checks it accepts.
    pub fn loopback_authority(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn authority(&self) -> String {
        if self.port == 80 { self.host.clone() } else { format!("{}:{}", self.host, self.port) }
    }
}

/// `localhost`, `127.x.x.x` or `[::1]` (a Host header's host part).
pub fn is_loopback(host: &str) -> bool {
    let host = host.trim_matches(['[', ']']);
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// How a response body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Chunked,
    ContentLength(u64),
    /// No length and not chunked: the body ends when the server closes the connection.
    Close,
}

impl Framing {
    /// The name the report uses.
    pub fn name(self) -> &'static str {
        match self {
            Framing::Chunked => "chunked",
            Framing::ContentLength(_) => "content-length",
            Framing::Close => "close",
        }
    }
}

/// A response's status line and headers.
#[derive(Debug, Clone)]
pub struct Head {
    /// `HTTP/1.0` or `HTTP/1.1`, as the status line says.
    pub version: String,
    pub status: u16,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    pub framing: Framing,
}

impl Head {
    /// The first header called `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// Whether the server said it closes the connection after this response (HTTP/1.0
    /// without keep-alive, `Connection: close`, or a close-delimited body).
    pub fn closes(&self) -> bool {
        let connection = self.header("connection").map(str::to_ascii_lowercase);
        self.framing == Framing::Close
            || connection.as_deref() == Some("close")
            || (self.version == "HTTP/1.0" && connection.as_deref() != Some("keep-alive"))
    }
}

/// One connection to the server, with what was read past the last thing parsed.
pub struct Connection {
    tcp: TcpStream,
    buffer: Vec<u8>,
    /// Set once the server closed its side.
    eof: bool,
}

/// The state of one response body being read.
#[derive(Debug)]
pub struct Body {
    framing: Framing,
    /// Bytes left in the current chunk, or in a Content-Length body.
    left: u64,
    /// The body ended as its framing says (0-chunk, length reached, or the close).
    pub complete: bool,
    /// The body ended early: EOF before the 0-chunk or the length.
    pub truncated: bool,
}

impl Connection {
    /// Connects to `target`.
    pub async fn open(target: &Target) -> std::io::Result<Connection> {
        let tcp = TcpStream::connect((target.host.trim_matches(['[', ']']), target.port)).await?;
        tcp.set_nodelay(true)?;
        Ok(Connection { tcp, buffer: Vec::new(), eof: false })
    }

    /// Writes a request with a JSON (or any) body; `path` is below the target's prefix.
    pub async fn send(&mut self, target: &Target, method: &str, path: &str, body: &[u8]) -> std::io::Result<()> {
        self.send_with(target, method, path, body, &[]).await
    }

    /// `send` with extra headers; a `Host` among them replaces the target's.
    pub async fn send_with(
        &mut self,
        target: &Target,
        method: &str,
        path: &str,
        body: &[u8],
        extra: &[(&str, &str)],
    ) -> std::io::Result<()> {
        let host = extra
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("host"))
            .map(|(_, v)| v.to_string())
            .or_else(|| target.host_header.clone())
            .unwrap_or_else(|| target.authority());
        let mut request = format!("{method} {}{path} HTTP/1.1\r\nHost: {host}\r\n", target.prefix);
        for (name, value) in extra.iter().filter(|(n, _)| !n.eq_ignore_ascii_case("host")) {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        if method == "POST" {
            request.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()));
        }
        request.push_str("Accept: */*\r\n\r\n");
        let mut bytes = request.into_bytes();
        bytes.extend_from_slice(body);
        self.tcp.write_all(&bytes).await
    }

    async fn fill(&mut self) -> std::io::Result<usize> {
        // Read into the buffer itself: a stack array would sit in every future that reads.
        self.buffer.reserve(16 << 10);
        let n = self.tcp.read_buf(&mut self.buffer).await?;
        if n == 0 {
            self.eof = true;
        }
        Ok(n)
    }

    /// Reads the status line and headers.
    pub async fn read_head(&mut self) -> std::io::Result<(Head, Body)> {
        let end = loop {
            if let Some(pos) = memchr::memmem::find(&self.buffer, b"\r\n\r\n") {
                break pos + 4;
            }
            if self.buffer.len() > MAX_HEAD {
                return Err(invalid("response head too large"));
            }
            if self.fill().await? == 0 {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed before a response"));
            }
        };
        let head_bytes: Vec<u8> = self.buffer.drain(..end).collect();
        let text = String::from_utf8_lossy(&head_bytes);
        let mut lines = text.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default().to_string();
        let status = parts.next().and_then(|s| s.parse().ok()).ok_or_else(|| invalid(status_line))?;
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let find = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
        let framing = if find("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
            Framing::Chunked
        } else if let Some(length) = find("content-length").and_then(|v| v.parse().ok()) {
            Framing::ContentLength(length)
        } else {
            Framing::Close
        };
        let left = match framing {
            Framing::ContentLength(n) => n,
            _ => 0,
        };
        let body = Body { framing, left, complete: false, truncated: false };
        Ok((Head { version, status, headers, framing }, body))
    }

    /// The next piece of the body's payload (chunk framing removed); `None` when it ended
    /// (see `body.complete` / `body.truncated`).
    pub async fn next_piece(&mut self, body: &mut Body) -> std::io::Result<Option<Vec<u8>>> {
        loop {
            if body.complete || body.truncated {
                return Ok(None);
            }
            match body.framing {
                Framing::Close => {
                    if !self.buffer.is_empty() {
                        return Ok(Some(std::mem::take(&mut self.buffer)));
                    }
                    if self.fill().await? == 0 {
                        body.complete = true;
                    }
                }
                Framing::ContentLength(_) => {
                    if body.left == 0 {
                        body.complete = true;
                        continue;
                    }
                    if !self.buffer.is_empty() {
                        let take = (body.left as usize).min(self.buffer.len());
                        body.left -= take as u64;
                        return Ok(Some(self.buffer.drain(..take).collect()));
                    }
                    if self.fill().await? == 0 {
                        body.truncated = true;
                    }
                }
                Framing::Chunked => {
                    if body.left > 0 {
                        if !self.buffer.is_empty() {
                            let take = (body.left as usize).min(self.buffer.len());
                            body.left -= take as u64;
                            // The chunk's trailing CRLF is skipped with the next size line.
                            return Ok(Some(self.buffer.drain(..take).collect()));
                        }
                    } else if let Some(pos) = memchr::memmem::find(&self.buffer, b"\r\n") {
                        let line: Vec<u8> = self.buffer.drain(..pos + 2).collect();
                        let line = String::from_utf8_lossy(&line[..pos]).trim().to_string();
                        if line.is_empty() {
                            continue; // the CRLF after a chunk's data
                        }
                        let size = u64::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
                            .map_err(|_| invalid(&format!("bad chunk size line {line:?}")))?;
                        if size == 0 {
                            self.skip_trailers().await?;
                            body.complete = true;
                            continue;
                        }
                        body.left = size;
                        continue;
                    }
                    if self.fill().await? == 0 {
                        body.truncated = true;
                    }
                }
            }
        }
    }

    /// After the 0-chunk: trailers up to the empty line.
    async fn skip_trailers(&mut self) -> std::io::Result<()> {
        loop {
            if let Some(pos) = memchr::memmem::find(&self.buffer, b"\r\n") {
                let empty = pos == 0;
                self.buffer.drain(..pos + 2);
                if empty {
                    return Ok(());
                }
                continue;
            }
            if self.fill().await? == 0 {
                return Ok(());
            }
        }
    }

    /// Reads the rest of the body, at most `MAX_BODY` bytes of it (the rest is left unread).
    pub async fn read_body(&mut self, body: &mut Body) -> std::io::Result<Vec<u8>> {
        let mut all = Vec::new();
        while let Some(piece) = self.next_piece(body).await? {
            all.extend_from_slice(&piece);
            if all.len() >= MAX_BODY {
                all.truncate(MAX_BODY);
                break;
            }
        }
        Ok(all)
    }

    /// Waits, up to `limit`, for the server to close this (idle) connection; the time it took.
    pub async fn closed_within(&mut self, limit: Duration) -> Option<Duration> {
        let started = tokio::time::Instant::now();
        if self.eof {
            return Some(Duration::ZERO);
        }
        let wait = async {
            loop {
                match self.fill().await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        };
        tokio::time::timeout(limit, wait).await.ok().map(|()| started.elapsed())
    }

    /// Whether the server has closed its side (seen by a read).
    pub fn at_eof(&self) -> bool {
        self.eof
    }
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

/// One request on a fresh connection, its whole response (capped): head, body, and the
/// connection.
pub async fn exchange(
    target: &Target,
    method: &str,
    path: &str,
    body: &[u8],
) -> std::io::Result<(Head, Vec<u8>, Connection)> {
    exchange_with(target, method, path, body, &[]).await
}

/// `exchange` with extra headers.
pub async fn exchange_with(
    target: &Target,
    method: &str,
    path: &str,
    body: &[u8],
    extra: &[(&str, &str)],
) -> std::io::Result<(Head, Vec<u8>, Connection)> {
    let mut conn = Connection::open(target).await?;
    conn.send_with(target, method, path, body, extra).await?;
    let (head, mut state) = conn.read_head().await?;
    let bytes = conn.read_body(&mut state).await?;
    Ok((head, bytes, conn))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_or_without_v1() {
        let t = Target::parse("http://127.0.0.1:8080/v1/").expect("url");
        assert_eq!((t.host.as_str(), t.port, t.prefix.as_str()), ("127.0.0.1", 8080, ""));
        let t = Target::parse("http://localhost/api/v1").expect("url");
        assert_eq!((t.host.as_str(), t.port, t.prefix.as_str()), ("localhost", 80, "/api"));
        assert_eq!(t.base_url(), "http://localhost/api");
        let t = Target::parse("HTTP://[::1]:9000/v1").expect("url");
        assert_eq!((t.host.as_str(), t.port, t.prefix.as_str()), ("[::1]", 9000, ""));
        assert!(t.loopback());
        let t = Target::parse("http://[::1]").expect("url");
        assert_eq!((t.host.as_str(), t.port), ("[::1]", 80));
        let t = Target::parse("http://h/apiv1").expect("url");
        assert_eq!(t.prefix, "/apiv1");
        assert!(Target::parse("https://x").is_err());
        assert!(Target::parse("http://x:99999").is_err());
    }

    #[tokio::test]
    async fn chunked_bodies_are_unframed_in_any_split() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.expect("accept");
            let mut buf = [0u8; 1024];
            let _ = tcp.read(&mut buf).await;
            let reply = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\ndata: \r\n3\r\nab\n\r\n0\r\n\r\n";
            for byte in reply {
                let _ = tcp.write_all(&[*byte]).await;
            }
        });
        let target = Target::parse(&format!("http://{addr}")).expect("url");
        let (head, body, _) = exchange(&target, "GET", "/x", b"").await.expect("exchange");
        assert_eq!((head.version.as_str(), head.status, head.framing), ("HTTP/1.1", 200, Framing::Chunked));
        assert_eq!(body, b"data: ab\n");
    }
}
