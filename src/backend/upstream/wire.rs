//! HTTP/1.1 on the wire, the client's side, with no socket here (`pool.rs` reads and writes):
//! a request's head written in one pass, a response's head parsed (`httparse`, its header values
//! kept as slices of the bytes read, not copied), and its body's framing decoded — a length, the
//! chunked coding, or to the connection's close (RFC 9112 §6.3) — a piece at a time, so a
//! chunk of a stream is handed on as soon as its bytes are in.

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version};

/// The largest response head read (status line and headers).
pub const MAX_HEAD: usize = 64 << 10;

/// The most headers a response head may have.
const MAX_HEADERS: usize = 100;

/// The longest chunk-size line or trailer line.
const MAX_LINE: usize = 4 << 10;

/// The most trailer bytes read (and dropped) after a chunked body's last chunk.
const MAX_TRAILERS: usize = 16 << 10;

/// What is wrong with a backend's answer or its connection.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Reading or writing the socket failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The connection closed before the answer's head was whole.
    #[error("the connection closed before a response{}", if *.0 == 0 { String::new() } else { format!(" ({} bytes of its head had come)", .0) })]
    ClosedBeforeHead(usize),
    /// The head is larger than [`MAX_HEAD`].
    #[error("its response head is larger than {} KiB", MAX_HEAD >> 10)]
    HeadTooLarge,
    /// The head is not HTTP/1.x.
    #[error("a malformed response head: {0}")]
    BadHead(String),
    /// The body's framing is broken (a bad chunk size, a missing line end, a bad length).
    #[error("a malformed body: {0}")]
    BadBody(&'static str),
    /// The connection closed before the body's framing ended.
    #[error("the connection closed before the answer's end")]
    ClosedInBody,
}

/// How a response's body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (a HEAD request's answer, 1xx, 204, 304).
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// The chunked coding.
    Chunked,
    /// At the connection's close (no length, or a coding other than chunked last).
    Close,
}

/// A response's head.
#[derive(Debug)]
pub struct Head {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub framing: Framing,
    /// Whether the connection may carry another request after this answer's end.
    pub keep_alive: bool,
}

/// Writes a request's head: `METHOD target HTTP/1.1`, `headers` (valid by construction: a
/// `HeaderValue` holds no line end) and, for a body or a method that carries one, its
/// `content-length`. A target with a space or a control character is refused: it would split
/// the request line.
pub fn encode_request(
    out: &mut Vec<u8>,
    method: &Method,
    target: &str,
    headers: &HeaderMap,
    body_len: usize,
) -> Result<(), WireError> {
    if target.is_empty() || target.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(WireError::BadHead(format!("cannot send the request target {target:?}")));
    }
    out.reserve(64 + target.len() + headers.len() * 32);
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if body_len > 0 || matches!(*method, Method::POST | Method::PUT | Method::PATCH) {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(itoa::Buffer::new().format(body_len).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// Parses the response head at the start of `buf`: `None` while it is not whole (more bytes are
/// needed); else its bytes are taken off `buf`. `head_request`: the request was `HEAD` (its
/// answer has no body whatever its headers say).
pub fn parse_head(buf: &mut BytesMut, head_request: bool) -> Result<Option<Head>, WireError> {
    // Each header's name and value as offsets into the head, so that the values can be slices of
    // the head's bytes once it is taken off the buffer.
    let mut spans = [(0usize, 0usize, 0usize, 0usize); MAX_HEADERS];
    let (len, status, minor, count) = {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut response = httparse::Response::new(&mut headers);
        let len = match response.parse(buf) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => return Err(WireError::HeadTooLarge),
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => {
                return Err(WireError::BadHead(format!("more than {MAX_HEADERS} headers")));
            }
            Err(e) => return Err(WireError::BadHead(e.to_string())),
        };
        if len > MAX_HEAD {
            return Err(WireError::HeadTooLarge);
        }
        let base = buf.as_ptr() as usize;
        let count = response.headers.len();
        for (span, h) in spans.iter_mut().zip(response.headers.iter()) {
            let name = h.name.as_ptr() as usize - base;
            let value = h.value.as_ptr() as usize - base;
            *span = (name, name + h.name.len(), value, value + h.value.len());
        }
        (len, response.code.unwrap_or(0), response.version.unwrap_or(1), count)
    };
    let bytes = buf.split_to(len).freeze();
    let status = StatusCode::from_u16(status).map_err(|_| WireError::BadHead(format!("status {status}")))?;
    let mut headers = HeaderMap::with_capacity(count);
    for &(name_start, name_end, value_start, value_end) in &spans[..count] {
        let name = HeaderName::from_bytes(&bytes[name_start..name_end])
            .map_err(|_| WireError::BadHead(format!("the header name {:?}", &bytes[name_start..name_end])))?;
        let value = HeaderValue::from_maybe_shared(bytes.slice(value_start..value_end))
            .map_err(|_| WireError::BadHead(format!("the value of {name}")))?;
        headers.append(name, value);
    }
    let version = if minor == 0 { Version::HTTP_10 } else { Version::HTTP_11 };
    let framing = framing(status, &headers, head_request)?;
    let keep_alive = keeps_alive(version, &headers)
        && framing != Framing::Close
        && !(headers.contains_key(http::header::TRANSFER_ENCODING)
            && headers.contains_key(http::header::CONTENT_LENGTH));
    Ok(Some(Head { status, version, headers, framing, keep_alive }))
}

/// How the body of an answer with `status` and `headers` ends (RFC 9112 §6.3).
fn framing(status: StatusCode, headers: &HeaderMap, head_request: bool) -> Result<Framing, WireError> {
    if head_request
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok(Framing::Empty);
    }
    if headers.contains_key(http::header::TRANSFER_ENCODING) {
        let last = headers
            .get_all(http::header::TRANSFER_ENCODING)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .rfind(|c| !c.is_empty());
        return Ok(if last.is_some_and(|c| c.eq_ignore_ascii_case("chunked")) {
            Framing::Chunked
        } else {
            Framing::Close
        });
    }
    let mut length = None;
    for value in headers.get_all(http::header::CONTENT_LENGTH) {
        for part in value.to_str().unwrap_or("x").split(',') {
            let part = part.trim();
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(WireError::BadBody("a content-length that is not a number"));
            }
            let n: u64 = part.parse().map_err(|_| WireError::BadBody("a content-length out of range"))?;
            if length.is_some_and(|l| l != n) {
                return Err(WireError::BadBody("two different content-lengths"));
            }
            length = Some(n);
        }
    }
    Ok(length.map_or(Framing::Close, Framing::Length))
}

/// Whether the connection stays open after the answer: HTTP/1.1 unless `Connection: close`,
/// HTTP/1.0 only with `Connection: keep-alive`.
fn keeps_alive(version: Version, headers: &HeaderMap) -> bool {
    let mut close = false;
    let mut keep = false;
    for token in headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
    {
        close |= token.eq_ignore_ascii_case("close");
        keep |= token.eq_ignore_ascii_case("keep-alive");
    }
    !close && (version == Version::HTTP_11 || keep)
}

/// What the body's decoder found in the bytes read so far.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// A piece of the body.
    Data(Bytes),
    /// The body has ended.
    End,
    /// More bytes are needed.
    More,
}

/// The state of a body being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoder {
    /// This many bytes are left.
    Length(u64),
    /// The chunked coding, at this point.
    Chunked(Chunk),
    /// Everything until the connection's close.
    Close,
    /// Ended.
    Done,
}

/// Where a chunked body's decoder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunk {
    /// Before a chunk-size line.
    Size,
    /// Inside a chunk's data, with this many bytes left.
    Data(u64),
    /// After a chunk's data, before its line end.
    DataEnd,
    /// After the last chunk: trailer lines until an empty one (this many bytes of them read).
    Trailers(usize),
}

impl Decoder {
    /// The decoder of a body with `framing`.
    pub fn new(framing: Framing) -> Self {
        match framing {
            Framing::Empty | Framing::Length(0) => Decoder::Done,
            Framing::Length(n) => Decoder::Length(n),
            Framing::Chunked => Decoder::Chunked(Chunk::Size),
            Framing::Close => Decoder::Close,
        }
    }

    /// Whether the body has ended.
    pub fn is_done(&self) -> bool {
        *self == Decoder::Done
    }

    /// The body's bytes left, when its length says.
    pub fn left(&self) -> Option<u64> {
        match self {
            Decoder::Length(n) => Some(*n),
            Decoder::Done => Some(0),
            _ => None,
        }
    }

    /// The next step with the bytes of `buf` (what it uses is taken off it).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Step, WireError> {
        loop {
            match *self {
                Decoder::Done => return Ok(Step::End),
                Decoder::Close if buf.is_empty() => return Ok(Step::More),
                Decoder::Close => return Ok(Step::Data(buf.split().freeze())),
                Decoder::Length(_) if buf.is_empty() => return Ok(Step::More),
                Decoder::Length(left) => {
                    let n = left.min(buf.len() as u64);
                    *self = if n == left { Decoder::Done } else { Decoder::Length(left - n) };
                    return Ok(Step::Data(buf.split_to(n as usize).freeze()));
                }
                Decoder::Chunked(Chunk::Size) => {
                    let Some(line) = take_line(buf)? else { return Ok(Step::More) };
                    let size = chunk_size(&line)?;
                    *self = Decoder::Chunked(if size == 0 { Chunk::Trailers(0) } else { Chunk::Data(size) });
                }
                Decoder::Chunked(Chunk::Data(_)) if buf.is_empty() => return Ok(Step::More),
                Decoder::Chunked(Chunk::Data(left)) => {
                    let n = left.min(buf.len() as u64);
                    *self = Decoder::Chunked(if n == left { Chunk::DataEnd } else { Chunk::Data(left - n) });
                    return Ok(Step::Data(buf.split_to(n as usize).freeze()));
                }
                Decoder::Chunked(Chunk::DataEnd) => match buf.first() {
                    None => return Ok(Step::More),
                    Some(b'\n') => {
                        buf.advance(1);
                        *self = Decoder::Chunked(Chunk::Size);
                    }
                    Some(b'\r') if buf.len() < 2 => return Ok(Step::More),
                    Some(b'\r') if buf[1] == b'\n' => {
                        buf.advance(2);
                        *self = Decoder::Chunked(Chunk::Size);
                    }
                    Some(_) => return Err(WireError::BadBody("a chunk longer than its size")),
                },
                Decoder::Chunked(Chunk::Trailers(read)) => {
                    let Some(line) = take_line(buf)? else { return Ok(Step::More) };
                    if line.is_empty() {
                        *self = Decoder::Done;
                    } else if read + line.len() > MAX_TRAILERS {
                        return Err(WireError::BadBody("trailers larger than 16 KiB"));
                    } else {
                        *self = Decoder::Chunked(Chunk::Trailers(read + line.len()));
                    }
                }
            }
        }
    }

    /// The connection closed: the body's end when it ends at the close, else an error.
    pub fn closed(&mut self) -> Result<Step, WireError> {
        match self {
            Decoder::Close | Decoder::Done => {
                *self = Decoder::Done;
                Ok(Step::End)
            }
            _ => Err(WireError::ClosedInBody),
        }
    }
}

/// A line (without its `\r\n` or `\n`) taken off `buf`: `None` while it is not whole.
fn take_line(buf: &mut BytesMut) -> Result<Option<Bytes>, WireError> {
    let Some(end) = memchr::memchr(b'\n', buf) else {
        return if buf.len() > MAX_LINE { Err(WireError::BadBody("a chunk line longer than 4 KiB")) } else { Ok(None) };
    };
    if end > MAX_LINE {
        return Err(WireError::BadBody("a chunk line longer than 4 KiB"));
    }
    let mut line = buf.split_to(end + 1);
    line.truncate(end);
    if line.last() == Some(&b'\r') {
        line.truncate(end - 1);
    }
    Ok(Some(line.freeze()))
}

/// The size of a chunk-size line (hex digits, then perhaps `;` extensions, which are ignored).
fn chunk_size(line: &[u8]) -> Result<u64, WireError> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    let rest = &line[digits..];
    let rest_ok = rest.iter().find(|b| **b != b' ' && **b != b'\t').is_none_or(|b| *b == b';');
    if digits == 0 || digits > 15 || !rest_ok {
        return Err(WireError::BadBody("a bad chunk size"));
    }
    let hex = std::str::from_utf8(&line[..digits]).map_err(|_| WireError::BadBody("a bad chunk size"))?;
    u64::from_str_radix(hex, 16).map_err(|_| WireError::BadBody("a bad chunk size"))
}

#[cfg(test)]
mod tests;
