//! The access log: one line per client request, at `info` under the target `mlxgate::access`,
//! written once when the request's [`RequestRecord`](crate::outcome::RequestRecord) is
//! finished (a stream's at its end). This module owns what the line says — the request id, the
//! API face, the figures gathered on the way — and how it is written; the record decides when.
//!
//! A line names configured things only (model, backend, client name) plus the method, the path
//! (never the query: some clients put keys there), the model a client asked for when it names no
//! configured one, or the alias it named a configured one by (`alias=`; both bounded), and the
//! request id. Never a key, a prompt or an answer.
//!
//! The request id is the client's own `x-request-id` when it is sane (1 to
//! [`MAX_CLIENT_ID`] visible ASCII characters, no `"` or `\`), else `req_` and 32 hex digits:
//! the SipHash (std's, keyed at random once per process) of a counter — unique in the process,
//! unguessable across processes, no dependency and two hashes per request.

use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Method};

pub mod text;

/// The header a request id comes in and goes back in.
pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client-sent request id kept (a longer one is replaced).
pub const MAX_CLIENT_ID: usize = 128;

/// Longest unknown model name a line quotes (the client's text; longer ones are cut).
const MAX_ASKED_MODEL: usize = 64;

/// A request's id: a header value of visible ASCII (cheap to clone: shared bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(HeaderValue);

impl RequestId {
    /// The client's `x-request-id` when it is sane, else a new one.
    pub fn of(headers: &HeaderMap) -> RequestId {
        headers.get(REQUEST_ID_HEADER).filter(|v| sane(v.as_bytes())).cloned().map_or_else(RequestId::new, RequestId)
    }

    /// A new id: `req_` and 32 hex digits, two keyed hashes of the process's request number
    /// (unique, and they tell no one how many requests came before).
    pub fn new() -> RequestId {
        static KEYS: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let keys = KEYS.get_or_init(std::collections::hash_map::RandomState::new);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let half = |salt: u64| {
            let mut h = keys.build_hasher();
            h.write_u64(n);
            h.write_u64(salt);
            h.finish()
        };
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut text = *b"req_00000000000000000000000000000000";
        for (i, byte) in half(0).to_be_bytes().into_iter().chain(half(1).to_be_bytes()).enumerate() {
            text[4 + 2 * i] = HEX[usize::from(byte >> 4)];
            text[5 + 2 * i] = HEX[usize::from(byte & 15)];
        }
        // Hex digits are always a valid header value.
        RequestId(HeaderValue::from_bytes(&text).unwrap_or_else(|_| HeaderValue::from_static("req_unknown")))
    }

    /// The id's text.
    pub fn as_str(&self) -> &str {
        // Only visible ASCII is ever kept (see `sane`), which is always text.
        self.0.to_str().unwrap_or("-")
    }

    /// The id as a response header value.
    pub fn header_value(&self) -> HeaderValue {
        self.0.clone()
    }
}

impl Default for RequestId {
    fn default() -> Self {
        RequestId::new()
    }
}

/// A client's id is kept when it is 1 to [`MAX_CLIENT_ID`] visible ASCII characters other than
/// `"` and `\` (it goes into log lines and JSON as it is).
fn sane(id: &[u8]) -> bool {
    (1..=MAX_CLIENT_ID).contains(&id.len()) && id.iter().all(|&b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
}

/// Which API a request spoke (the `face` of a line). Set from the path on arrival; a handler
/// that serves another face through the same pipeline (the Responses API) sets its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Face {
    Chat,
    Completions,
    Embeddings,
    Responses,
    /// The Anthropic Messages API (`/v1/messages`).
    Messages,
    Models,
    Health,
    Ready,
    Metrics,
    Admin,
    /// The `/ui` page, its files and its feeds.
    Ui,
    /// No endpoint (an unknown path, or a known one with the wrong method).
    None,
}

impl Face {
    /// The face of a path, as routed.
    pub fn of_path(path: &str) -> Face {
        match path {
            "/v1/chat/completions" => Face::Chat,
            "/v1/completions" => Face::Completions,
            "/v1/embeddings" => Face::Embeddings,
            "/v1/responses" => Face::Responses,
            "/v1/messages" => Face::Messages,
            "/v1/models" => Face::Models,
            p if p.starts_with("/v1/models/") => Face::Models,
            // Claude Code's reachability checks answer as /health does.
            "/health" | "/" | "/api/hello" => Face::Health,
            "/ready" => Face::Ready,
            "/metrics" => Face::Metrics,
            p if p.starts_with("/admin/") => Face::Admin,
            "/ui" => Face::Ui,
            p if p.starts_with("/ui/") => Face::Ui,
            _ => Face::None,
        }
    }

    /// Its name in the line.
    pub fn as_str(self) -> &'static str {
        match self {
            Face::Chat => "chat",
            Face::Completions => "completions",
            Face::Embeddings => "embeddings",
            Face::Responses => "responses",
            Face::Messages => "messages",
            Face::Models => "models",
            Face::Health => "health",
            Face::Ready => "ready",
            Face::Metrics => "metrics",
            Face::Admin => "admin",
            Face::Ui => "ui",
            Face::None => "none",
        }
    }
}

/// What a request's line says beside the record's labels, gathered on the way.
#[derive(Debug, Clone)]
pub struct AccessLine {
    /// Whether the line is written (`access_log: false` and records made outside a request
    /// write none).
    pub enabled: bool,
    pub id: RequestId,
    pub method: Method,
    /// The path, without the query.
    pub path: Box<str>,
    pub face: Face,
    /// The status of the response's headers (the first one set wins: a stream's headers are
    /// sent before its end is known).
    pub status: Option<u16>,
    /// The model the client asked for, kept only when it names no configured one.
    pub asked_model: Option<Box<str>>,
    /// The alias the client asked for a configured model by (cut as `asked_model` is).
    pub alias: Option<Box<str>>,
    /// The configured model whose request another (its `fallback:`) served.
    pub fallback_from: Option<Box<str>>,
    pub queue_wait: Option<Duration>,
    pub ttft: Option<Duration>,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// A model of several backends: why its balancer chose the backend (a reason label of
    /// `mlxgate_route_decisions_total`) and the cached tokens it predicted there.
    pub route: Option<(&'static str, u64)>,
    /// What the gateway did to fit the prompt (the answer's `x-mlxgate-transform`: middle-out,
    /// chunks, a `max_tokens` cut).
    pub transform: Option<Box<str>>,
    /// A backend request made for a client request (a map piece): its line says `piece=true`
    /// with the client request's id.
    pub piece: bool,
}

impl AccessLine {
    /// The line of a request that arrived with `method` at `path` (its face from the path).
    pub fn new(enabled: bool, id: RequestId, method: Method, path: &str) -> AccessLine {
        AccessLine {
            enabled,
            id,
            method,
            path: path.into(),
            face: Face::of_path(path),
            status: None,
            asked_model: None,
            alias: None,
            fallback_from: None,
            queue_wait: None,
            ttft: None,
            prompt_tokens: None,
            cached_tokens: None,
            completion_tokens: None,
            route: None,
            transform: None,
            piece: false,
        }
    }

    /// No line (a record made outside a request: tests, tools).
    pub fn none() -> AccessLine {
        AccessLine::new(false, RequestId(HeaderValue::from_static("-")), Method::GET, "")
    }

    /// The line of a piece made for this request: same id, method, path and face.
    pub fn piece(&self) -> AccessLine {
        AccessLine { piece: true, ..AccessLine::new(self.enabled, self.id.clone(), self.method.clone(), &self.path) }
            .with_face(self.face)
    }

    fn with_face(mut self, face: Face) -> AccessLine {
        self.face = face;
        self
    }

    /// Sets the status unless one is set already.
    pub fn responded(&mut self, status: u16) {
        self.status.get_or_insert(status);
    }

    /// Keeps the model name a client asked for that names no configured model (cut to
    /// [`MAX_ASKED_MODEL`] bytes on a character boundary).
    pub fn asked(&mut self, model: &str) {
        self.asked_model = Some(bounded(model).into());
    }

    /// Keeps the alias a client asked for a configured model by (cut as [`asked`](Self::asked)
    /// cuts).
    pub fn aliased(&mut self, alias: &str) {
        self.alias = Some(bounded(alias).into());
    }
}

/// `name` cut to [`MAX_ASKED_MODEL`] bytes on a character boundary.
fn bounded(name: &str) -> &str {
    let mut end = name.len().min(MAX_ASKED_MODEL);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// The record's part of a line: its labels and how it ended.
pub struct Ending<'a> {
    pub model: &'a str,
    pub backend: &'a str,
    pub client: &'a str,
    pub outcome: &'static str,
    pub duration: Duration,
}

/// Writes `line` (when enabled) as one event at `info` under `mlxgate::access`, outside any
/// span (its own fields say what the request was; at `debug`, JSON lines also carry the
/// request's span). Plain text to a file or a pipe goes straight to stderr (`text.rs`). Fields that are unknown or empty (model and backend of a
/// request never routed) are left out. A request with no status
/// (the client left before the headers) is logged with 499, nginx's status for it.
pub fn write(line: &AccessLine, end: &Ending<'_>) {
    if !line.enabled || text::write(line, end) {
        return;
    }
    traced(line, end);
}

/// The line as a tracing event (JSON lines, a terminal, in-process subscribers).
fn traced(line: &AccessLine, end: &Ending<'_>) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let rounded = |d: Duration| (ms(d) * 10.0).round() / 10.0;
    let model = if end.model.is_empty() { line.asked_model.as_deref().unwrap_or("") } else { end.model };
    tracing::info!(
        target: "mlxgate::access",
        parent: None,
        request_id = %line.id.as_str(),
        method = %line.method.as_str(),
        path = %line.path,
        face = %line.face.as_str(),
        status = line.status.unwrap_or(499),
        outcome = %end.outcome,
        model = (!model.is_empty()).then_some(model),
        alias = line.alias.as_deref(),
        fallback_from = line.fallback_from.as_deref(),
        backend = (!end.backend.is_empty()).then(|| tracing::field::display(end.backend)),
        client = %end.client,
        duration_ms = rounded(end.duration),
        queue_ms = line.queue_wait.map(rounded),
        ttft_ms = line.ttft.map(rounded),
        prompt_tokens = line.prompt_tokens,
        cached_tokens = line.cached_tokens,
        completion_tokens = line.completion_tokens,
        route = line.route.map(|(reason, _)| reason),
        predicted_cached_tokens = line.route.map(|(_, tokens)| tokens),
        transform = line.transform.as_deref(),
        piece = line.piece.then_some(true),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sane_client_id_is_kept_and_anything_else_replaced() {
        let id_of = |value: &[u8]| {
            let mut headers = HeaderMap::new();
            headers.insert(REQUEST_ID_HEADER, HeaderValue::from_bytes(value).expect("header value"));
            RequestId::of(&headers).as_str().to_string()
        };
        assert_eq!(id_of(b"trace-42/abc:1"), "trace-42/abc:1");
        let long = "x".repeat(MAX_CLIENT_ID);
        assert_eq!(id_of(long.as_bytes()), long);
        for bad in
            [&b"has space"[..], b"quote\"d", b"back\\slash", b"tab\there", &[b'x'; MAX_CLIENT_ID + 1], b"\xc3\xa9"]
        {
            let id = id_of(bad);
            assert!(id.starts_with("req_") && id.len() == 36, "{bad:?} → {id}");
        }
        assert!(RequestId::of(&HeaderMap::new()).as_str().starts_with("req_"));
    }

    /// Review of issue 24: the id goes to every client; its second half is the process's request
    /// number plus a constant, so two ids a client got tell it how many requests the gateway
    /// served in between (every client's traffic), and in which order. Before: both halves keyed.
    #[test]
    fn an_id_does_not_tell_how_many_requests_came_before_it() {
        let low = |id: &RequestId| u64::from_str_radix(&id.as_str()[20..], 16).expect("hex");
        let (a, b) = (RequestId::new(), RequestId::new());
        let between = low(&b).wrapping_sub(low(&a));
        assert!(
            between > 1_000_000,
            "consecutive ids {} and {} differ by {between} in their low half",
            a.as_str(),
            b.as_str()
        );
    }

    #[test]
    fn generated_ids_are_hex_and_distinct() {
        let ids: std::collections::HashSet<String> =
            (0..10_000).map(|_| RequestId::new().as_str().to_string()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids.iter().all(|id| id.len() == 36 && id[4..].bytes().all(|b| b.is_ascii_hexdigit())));
    }

    #[test]
    fn faces_follow_the_routes() {
        assert_eq!(Face::of_path("/v1/chat/completions"), Face::Chat);
        assert_eq!(Face::of_path("/v1/responses").as_str(), "responses");
        assert_eq!(Face::of_path("/v1/messages").as_str(), "messages");
        assert_eq!(Face::of_path("/admin/backends/x/logs"), Face::Admin);
        assert_eq!(Face::of_path("/v1/chat/completions/"), Face::None);
        assert_eq!(Face::of_path("/v2/whatever"), Face::None);
    }

    #[test]
    fn the_first_status_stays_and_an_asked_model_is_bounded() {
        let mut line = AccessLine::new(true, RequestId::new(), Method::POST, "/v1/completions");
        line.responded(200);
        line.responded(502);
        assert_eq!(line.status, Some(200));
        line.asked(&"é".repeat(100));
        assert!(line.asked_model.as_deref().is_some_and(|m| m.len() <= MAX_ASKED_MODEL && m.starts_with('é')));
        let piece = line.piece();
        assert!(piece.piece && piece.id == line.id && piece.face == Face::Completions && piece.status.is_none());
    }
}
