//! `GatewayError`: every failure a client can see. One `match` decides the HTTP status, the
//! OpenAI-shaped body `{"error": {"message", "type", "param", "code"}}` and the metric label,
//! so the three never disagree (the table of them all: docs/errors.md).
//!
//! Every error body the gateway makes carries the request's id as an extra member of `error`,
//! `request_id` (the OpenAI SDKs keep members they do not know; the message stays OpenAI's own
//! words, which clients match on): the access layer adds it to a response that carries an
//! [`ErrorBody`], and a stream's final error event is made with [`GatewayError::sse_event_for`].

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::json;

use crate::limits::{Denied, Limit};
use crate::tokens::overflow::Requested;

/// A request's failure, as the client sees it.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The body is not the JSON object the endpoint needs.
    #[error("{message}")]
    InvalidRequest { message: String, param: Option<&'static str> },
    /// The body is larger than `max_body`.
    #[error("request body is larger than the gateway's limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    /// The body did not arrive within `body_read_timeout` of the headers.
    #[error("The request body did not arrive within {}s.", after.as_secs())]
    BodyTimeout { after: Duration },
    /// The prompt leaves too little room under the backend's context cap. OpenAI's own two
    /// wordings (Aider and LiteLLM recognise them by this text and the code): "your messages
    /// resulted in N tokens" when the prompt alone is over, "you requested N tokens (P in the
    /// messages, C in the completion)" when the completion is counted.
    #[error("{}", context_length_message(*cap, *requested, *what))]
    ContextLengthExceeded { cap: usize, requested: Requested, what: PromptPart },
    /// A bug or a broken invariant inside the gateway (logged).
    #[error("The gateway failed on this request: {0}")]
    Internal(String),
    /// The request carries no configured client's key (auth required), or not the admin key.
    /// The message never quotes the key sent.
    #[error("{}", .0.message())]
    InvalidApiKey(KeyProblem),
    /// `/admin/*` from another machine while no `admin_key_sha256` is set.
    #[error(
        "The admin API answers only clients on the gateway's own machine, not through a proxy; set \
         admin_key_sha256 in gateway.yaml to use it from elsewhere."
    )]
    AdminForbidden,
    /// A browser's request to `/ui` or `/admin/*` from a page of another origin (`Origin`, or
    /// `Sec-Fetch-Site: cross-site`): no web page may act on the gateway.
    #[error("Cross-site requests to the admin API and /ui are refused (Origin {origin:?} is not this gateway's).")]
    CrossSite { origin: String },
    /// `/ui` or `/admin/*` admitted by loopback or a session with a `Host` this gateway does not
    /// answer to (a DNS rebinding would send one).
    #[error(
        "Host {0:?} is not a name this gateway answers to for /ui and the admin API (IP addresses, \
         localhost and this machine's name are; add it to admin_hosts in gateway.yaml)."
    )]
    ForeignHost(String),
    /// Too many wrong admin keys from one address lately (`/ui/login` or `/admin/*`).
    #[error("Too many wrong admin keys from this address; try again in a minute.")]
    TooManySignIns,
    /// The client is over one of its rate limits (429 `rate_limit_exceeded`, with OpenAI's
    /// `x-ratelimit-*` headers and `Retry-After`/`retry-after-ms` or `x-should-retry: false`).
    #[error("{}", .0.message)]
    RateLimited(Box<Denied>),
    /// `model` names no configured model.
    #[error("The model `{0}` does not exist or you do not have access to it.")]
    ModelNotFound(String),
    /// The model's queue already holds `max_queue` waiting requests.
    #[error(
        "The queue for model `{model}` is full ({waiting} requests waiting, {in_flight} in flight); retry after {}s.",
        retry_after.as_secs()
    )]
    QueueFull { model: String, waiting: usize, in_flight: usize, retry_after: Duration },
    /// The request waited `max_wait` without getting a slot.
    #[error(
        "The request for model `{model}` waited {}s in the queue without a free slot; retry after {}s.",
        waited.as_secs(),
        retry_after.as_secs()
    )]
    QueueTimeout { model: String, waited: Duration, retry_after: Duration },
    /// An admin call names no managed backend.
    #[error("No managed backend named `{0}`.")]
    UnknownBackend(String),
    /// `/admin/requests/{id}` of a request not (or no longer) in the activity ring.
    #[error("No request {0:?} among the last ones kept (the ring holds the last 500).")]
    UnknownRequest(String),
    /// No endpoint at this path.
    #[error("Invalid URL ({method} {path})")]
    UnknownUrl { method: String, path: String },
    /// The backend refused the connection, reset it, or answered with something unusable.
    #[error("Backend `{backend}` failed: {reason}")]
    Backend { backend: String, reason: String },
    /// A managed backend crashed too often and waits for an operator.
    #[error("Backend `{backend}` is failed: {reason}. Fix it, then POST /admin/backends/{backend}/restart.")]
    BackendFailed { backend: String, reason: String },
    /// The backend did not answer within its `response_timeout` or `first_byte_timeout`.
    #[error("Backend `{backend}` did not answer within {}s.", after.as_secs())]
    BackendTimeout { backend: String, after: Duration },
    /// The gateway is shutting down and its grace period is over.
    #[error("The gateway is shutting down; the answer was cut at the end of its grace period.")]
    ShuttingDown,
    /// The backend's answer had begun, then nothing came for its `stream_idle_timeout`.
    #[error("Backend `{backend}` sent nothing for {}s in the middle of its answer; the answer was cut.", after.as_secs())]
    BackendStalled { backend: String, after: Duration },
}

impl GatewayError {
    /// Builds an `invalid_request_error` naming the offending parameter.
    pub fn invalid(message: impl Into<String>, param: Option<&'static str>) -> Self {
        GatewayError::InvalidRequest { message: message.into(), param }
    }

    /// The one place that maps a failure to (status, type, code). `type` doubles as the
    /// metric label.
    fn classify(&self) -> (StatusCode, &'static str, Option<&'static str>) {
        match self {
            GatewayError::InvalidRequest { .. } => (StatusCode::BAD_REQUEST, "invalid_request_error", None),
            GatewayError::BodyTooLarge { .. } => {
                (StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", Some("request_too_large"))
            }
            GatewayError::BodyTimeout { .. } => {
                (StatusCode::REQUEST_TIMEOUT, "invalid_request_error", Some("request_timeout"))
            }
            GatewayError::ContextLengthExceeded { .. } => {
                (StatusCode::BAD_REQUEST, "invalid_request_error", Some("context_length_exceeded"))
            }
            GatewayError::InvalidApiKey(_) => {
                (StatusCode::UNAUTHORIZED, "invalid_request_error", Some("invalid_api_key"))
            }
            GatewayError::AdminForbidden => (StatusCode::FORBIDDEN, "invalid_request_error", Some("admin_forbidden")),
            GatewayError::CrossSite { .. } => (StatusCode::FORBIDDEN, "invalid_request_error", Some("cross_site")),
            GatewayError::ForeignHost(_) => (StatusCode::FORBIDDEN, "invalid_request_error", Some("foreign_host")),
            GatewayError::TooManySignIns => {
                (StatusCode::TOO_MANY_REQUESTS, "rate_limit_exceeded", Some("too_many_sign_ins"))
            }
            GatewayError::ModelNotFound(_) => (StatusCode::NOT_FOUND, "invalid_request_error", Some("model_not_found")),
            // OpenAI's types: `requests` for a request limit, `tokens` for a token limit.
            GatewayError::RateLimited(denied) => {
                let kind = if denied.limit == Limit::Tpm { "tokens" } else { "requests" };
                (StatusCode::TOO_MANY_REQUESTS, kind, Some("rate_limit_exceeded"))
            }
            GatewayError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "server_error", Some("internal_error")),
            GatewayError::UnknownBackend(_) => {
                (StatusCode::NOT_FOUND, "invalid_request_error", Some("backend_not_found"))
            }
            GatewayError::UnknownUrl { .. } => (StatusCode::NOT_FOUND, "invalid_request_error", Some("unknown_url")),
            GatewayError::UnknownRequest(_) => {
                (StatusCode::NOT_FOUND, "invalid_request_error", Some("request_not_found"))
            }
            GatewayError::QueueFull { .. } | GatewayError::QueueTimeout { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "server_overloaded", Some("server_overloaded"))
            }
            GatewayError::ShuttingDown => {
                (StatusCode::SERVICE_UNAVAILABLE, "gateway_shutdown", Some("gateway_shutting_down"))
            }
            GatewayError::BackendFailed { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "backend_error", Some("backend_failed"))
            }
            GatewayError::Backend { .. } => (StatusCode::BAD_GATEWAY, "backend_error", Some("backend_error")),
            GatewayError::BackendTimeout { .. } | GatewayError::BackendStalled { .. } => {
                (StatusCode::GATEWAY_TIMEOUT, "backend_timeout", Some("backend_timeout"))
            }
        }
    }

    /// HTTP status the client gets.
    pub fn status(&self) -> StatusCode {
        self.classify().0
    }

    /// OpenAI `error.type`; also the `outcome`/`error_type` metric label.
    pub fn error_type(&self) -> &'static str {
        self.classify().1
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            GatewayError::QueueFull { retry_after, .. } | GatewayError::QueueTimeout { retry_after, .. } => {
                Some(*retry_after)
            }
            GatewayError::BackendFailed { .. } | GatewayError::ShuttingDown => Some(Duration::from_secs(30)),
            _ => None,
        }
    }

    /// The OpenAI error object.
    pub fn body(&self) -> serde_json::Value {
        let (_, kind, code) = self.classify();
        let param = match self {
            GatewayError::InvalidRequest { param, .. } => *param,
            GatewayError::ModelNotFound(_) => Some("model"),
            GatewayError::ContextLengthExceeded { what, .. } => Some(what.param()),
            _ => None,
        };
        json!({"error": {"message": self.to_string(), "type": kind, "param": param, "code": code}})
    }

    /// The final SSE event sent when a stream fails after it began.
    pub fn sse_event(&self) -> Bytes {
        Bytes::from(format!("data: {}\n\n", self.body()))
    }

    /// [`sse_event`](Self::sse_event) with the request's id in the error.
    pub fn sse_event_for(&self, request_id: &str) -> Bytes {
        let mut body = self.body();
        with_request_id(&mut body, request_id);
        Bytes::from(format!("data: {body}\n\n"))
    }
}

/// An OpenAI-shaped error body the gateway made, kept in its response's extensions so that the
/// access layer can add the request's id (and read the outcome of a request no API handler
/// recorded).
#[derive(Debug, Clone)]
pub struct ErrorBody {
    pub body: serde_json::Value,
    /// The `outcome` label of the failure.
    pub outcome: &'static str,
}

/// Adds `request_id` to an OpenAI error body's `error` object (nothing when it has none), or
/// beside it in an Anthropic error body (`"type": "error"`, as Anthropic's API puts it).
pub fn with_request_id(body: &mut serde_json::Value, request_id: &str) {
    if body.get("type").and_then(serde_json::Value::as_str) == Some("error")
        && let Some(object) = body.as_object_mut()
    {
        object.insert("request_id".into(), serde_json::Value::from(request_id));
        return;
    }
    if let Some(error) = body.get_mut("error").and_then(serde_json::Value::as_object_mut) {
        error.insert("request_id".into(), serde_json::Value::from(request_id));
    }
}

/// OpenAI's text for a prompt over the cap, in its two forms.
fn context_length_message(cap: usize, requested: Requested, what: PromptPart) -> String {
    let Requested { prompt, completion } = requested;
    match completion {
        None => format!(
            "This model's maximum context length is {cap} tokens. However, your {what} resulted in {prompt} tokens. \
             Please reduce the length of the {what}."
        ),
        Some(completion) => format!(
            "This model's maximum context length is {cap} tokens. However, you requested {} tokens ({prompt} in the \
             {what}, {completion} in the completion). Please reduce the length of the {what} or completion.",
            requested.total()
        ),
    }
}

/// What is wrong with the key of a refused request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyProblem {
    /// No `Authorization: Bearer …` nor `x-api-key` header.
    Missing,
    /// A key that is no configured client's (or not the admin key).
    Incorrect,
}

impl KeyProblem {
    /// OpenAI's words, without the key (OpenAI quotes part of it; a gateway's log and a proxy's
    /// error page should not).
    fn message(self) -> &'static str {
        match self {
            KeyProblem::Missing => {
                "You didn't provide an API key. You need to provide your API key in an Authorization header using \
                 Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or in an x-api-key header."
            }
            KeyProblem::Incorrect => {
                "Incorrect API key provided. Ask the operator of this gateway for a key (clients: in gateway.yaml)."
            }
        }
    }
}

/// The part of a request a context cap measures, as the error message and `param` name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptPart {
    /// `/v1/chat/completions`: "your messages", param `messages`.
    Messages,
    /// `/v1/completions`: "your prompt", param `prompt`.
    Prompt,
    /// `/v1/embeddings`: "your input", param `input`.
    Input,
}

impl PromptPart {
    /// The request field that is too long.
    pub fn param(self) -> &'static str {
        match self {
            PromptPart::Messages => "messages",
            PromptPart::Prompt => "prompt",
            PromptPart::Input => "input",
        }
    }
}

impl std::fmt::Display for PromptPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.param())
    }
}

/// Longest backend error text put in a message.
const MAX_BACKEND_TEXT: usize = 4096;

/// A backend's own error answer in OpenAI's shape, whatever shape it came in: mlx_lm.server's
/// `{"error": "…"}`, FastAPI's `{"detail": "…" | [{loc, msg}] | {…}}` (mlx-openai-server,
/// vllm-mlx, mlx-vlm), plain text (mlx-omni-server's 500), or nothing. The status is kept by
/// the caller; the backend's own words go in the message, unchanged, so clients that match on
/// them (a context-length error, say) still can. A body already in OpenAI's shape is kept as it
/// is, with any missing member added.
pub fn backend_error_body(backend: &str, status: StatusCode, body: &[u8]) -> serde_json::Value {
    let kind = if status.is_client_error() { "invalid_request_error" } else { "backend_error" };
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let (message, code) = match parsed.as_ref() {
        Some(v) if v.get("error").is_some_and(|e| e.get("message").is_some_and(serde_json::Value::is_string)) => {
            let mut error = v["error"].clone();
            for (key, default) in [("type", json!(kind)), ("param", json!(null)), ("code", json!(null))] {
                if error.get(key).is_none() {
                    error[key] = default;
                }
            }
            return json!({"error": error});
        }
        Some(v) => match (v.get("error"), v.get("detail"), v.get("message")) {
            (Some(serde_json::Value::String(text)), _, _) => (text.clone(), None),
            (_, Some(detail), _) => describe_detail(detail),
            (_, _, Some(serde_json::Value::String(text))) => (text.clone(), None),
            _ => (v.to_string(), None),
        },
        None => (String::from_utf8_lossy(body).trim().to_string(), None),
    };
    let mut message =
        if message.is_empty() { format!("Backend `{backend}` answered {status} with an empty body.") } else { message };
    if message.len() > MAX_BACKEND_TEXT {
        let mut end = MAX_BACKEND_TEXT;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push('…');
    }
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}

/// FastAPI's `detail`: a string, a list of validation errors (`loc` + `msg`), or an object
/// (vllm-mlx's busy answer: `{"error": code, "message": …}`). Returns the text and a code.
fn describe_detail(detail: &serde_json::Value) -> (String, Option<String>) {
    match detail {
        serde_json::Value::String(text) => (text.clone(), None),
        serde_json::Value::Array(items) => {
            let lines: Vec<String> = items
                .iter()
                .map(|item| {
                    let msg = item.get("msg").and_then(serde_json::Value::as_str);
                    let loc = item.get("loc").and_then(serde_json::Value::as_array).map(|parts| {
                        parts
                            .iter()
                            .map(|p| p.as_str().map_or_else(|| p.to_string(), str::to_string))
                            .collect::<Vec<_>>()
                    });
                    match (loc, msg) {
                        (Some(loc), Some(msg)) => format!("{}: {msg}", loc.join(".")),
                        (None, Some(msg)) => msg.to_string(),
                        _ => item.to_string(),
                    }
                })
                .collect();
            (lines.join("; "), None)
        }
        serde_json::Value::Object(map) => {
            let text = map
                .get("message")
                .and_then(serde_json::Value::as_str)
                .map_or_else(|| detail.to_string(), str::to_string);
            let code =
                map.get("error").or_else(|| map.get("code")).and_then(serde_json::Value::as_str).map(str::to_string);
            (text, code)
        }
        other => (other.to_string(), None),
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let body = self.body();
        let mut response = (self.status(), axum::Json(&body)).into_response();
        let outcome = crate::outcome::Outcome::from(&self).label();
        response.extensions_mut().insert(ErrorBody { body, outcome });
        if matches!(self, GatewayError::BodyTooLarge { .. } | GatewayError::BodyTimeout { .. }) {
            // The body was not read: the connection cannot carry another request.
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if matches!(self, GatewayError::InvalidApiKey(_)) {
            // RFC 9110: a 401 names the scheme that would be accepted.
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let GatewayError::RateLimited(denied) = &self {
            // x-ratelimit-*, Retry-After and retry-after-ms (or x-should-retry: false).
            response.headers_mut().extend(denied.headers.clone());
        }
        if let Some(after) = self.retry_after() {
            let secs = after.as_secs().max(1);
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_has_the_openai_shape() {
        let cases = [
            GatewayError::invalid("bad", Some("messages")),
            GatewayError::BodyTooLarge { limit: 10 },
            GatewayError::BodyTimeout { after: Duration::from_secs(60) },
            GatewayError::ModelNotFound("x".into()),
            GatewayError::QueueFull {
                model: "q".into(),
                waiting: 5,
                in_flight: 2,
                retry_after: Duration::from_secs(3),
            },
            GatewayError::QueueTimeout {
                model: "q".into(),
                waited: Duration::from_secs(9),
                retry_after: Duration::ZERO,
            },
            GatewayError::UnknownUrl { method: "GET".into(), path: "/v1/x".into() },
            GatewayError::UnknownBackend("b".into()),
            GatewayError::Backend { backend: "b".into(), reason: "refused".into() },
            GatewayError::BackendFailed { backend: "b".into(), reason: "crashed".into() },
            GatewayError::BackendTimeout { backend: "b".into(), after: Duration::from_secs(5) },
            GatewayError::BackendStalled { backend: "b".into(), after: Duration::from_secs(5) },
            GatewayError::ShuttingDown,
            GatewayError::InvalidApiKey(KeyProblem::Missing),
            GatewayError::InvalidApiKey(KeyProblem::Incorrect),
            GatewayError::AdminForbidden,
            GatewayError::CrossSite { origin: "http://evil.example".into() },
            GatewayError::ForeignHost("evil.example".into()),
            GatewayError::TooManySignIns,
            GatewayError::UnknownRequest("req_1".into()),
        ];
        for e in cases {
            let body = e.body();
            let err = &body["error"];
            assert!(err["message"].as_str().is_some_and(|m| !m.is_empty()));
            assert_eq!(err["type"], e.error_type());
            assert!(err.get("param").is_some() && err.get("code").is_some());
            let response = e.into_response();
            let has_retry = response.headers().contains_key(header::RETRY_AFTER);
            assert_eq!(has_retry, response.status() == StatusCode::SERVICE_UNAVAILABLE);
        }
    }

    #[test]
    fn every_backend_error_shape_becomes_openai_shaped_with_the_original_text() {
        let bad = StatusCode::BAD_REQUEST;
        // mlx_lm.server
        let v = backend_error_body("native", bad, br#"{"error": "max_tokens must be at least 1"}"#);
        assert_eq!(v["error"]["message"], "max_tokens must be at least 1");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"].get("param").is_some() && v["error"].get("code").is_some());
        // FastAPI validation list (vllm-mlx, mlx-openai-server)
        let v = backend_error_body(
            "v",
            StatusCode::UNPROCESSABLE_ENTITY,
            br#"{"detail":[{"type":"greater_than","loc":["body","max_tokens"],"msg":"Input should be greater than 0","input":-1}]}"#,
        );
        assert_eq!(v["error"]["message"], "body.max_tokens: Input should be greater than 0");
        // vllm-mlx busy, a 503 with an object detail
        let v = backend_error_body(
            "v",
            StatusCode::SERVICE_UNAVAILABLE,
            br#"{"detail":{"error":"text_generation_busy","message":"SimpleEngine serialized route is busy; retry later"}}"#,
        );
        assert_eq!(v["error"]["message"], "SimpleEngine serialized route is busy; retry later");
        assert_eq!(v["error"]["code"], "text_generation_busy");
        assert_eq!(v["error"]["type"], "backend_error");
        // mlx-vlm string detail, mlx-omni-server's plain text, an empty body
        let v = backend_error_body(
            "m",
            bad,
            br#"{"detail":"Protected conversation exceeds the available context budget."}"#,
        );
        assert_eq!(v["error"]["message"], "Protected conversation exceeds the available context budget.");
        let v = backend_error_body("o", StatusCode::INTERNAL_SERVER_ERROR, b"Internal Server Error");
        assert_eq!(v["error"]["message"], "Internal Server Error");
        let v = backend_error_body("o", StatusCode::BAD_GATEWAY, b"");
        assert_eq!(v["error"]["message"], "Backend `o` answered 502 Bad Gateway with an empty body.");
        // Already OpenAI-shaped (Rapid-MLX): kept as it is.
        let rapid = br#"{"error":{"message":"This model's maximum context length is 2048 tokens.","type":"invalid_request_error","code":"context_length_exceeded","param":"messages"}}"#;
        let v = backend_error_body("r", bad, rapid);
        assert_eq!(v, serde_json::from_slice::<serde_json::Value>(rapid).expect("json"));
    }

    #[tokio::test]
    async fn a_rate_limited_request_is_429_with_the_limiters_headers() {
        use std::num::NonZeroU32;

        use crate::limits::{Limiter, Limits, MemoryStore};
        let limiter = Limiter::new(std::sync::Arc::new(MemoryStore::default()));
        let limits = Limits { tpm: NonZeroU32::new(100), ..Limits::default() };
        limiter.configure([("agent".to_owned(), limits)], Limits::default());
        let _first = limiter.admit("agent", 100).await.expect("fits");
        let denied = limiter.admit("agent", 10).await.expect_err("spent");
        let e = GatewayError::RateLimited(Box::new(denied));
        assert_eq!(e.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.body()["error"]["type"], "tokens");
        assert_eq!(e.body()["error"]["code"], "rate_limit_exceeded");
        assert!(e.body()["error"]["message"].as_str().is_some_and(|m| m.contains("tokens per min (TPM)")));
        assert_eq!(crate::outcome::Outcome::from(&e).label(), "rate_limited");
        let response = e.into_response();
        let value = |name: &str| response.headers()[name].to_str().ok().and_then(|v| v.parse::<u64>().ok());
        assert!(value("retry-after").is_some_and(|s| (1..=6).contains(&s)), "10 tokens at 100/min: 6 s at most");
        assert!(value("retry-after-ms").is_some_and(|ms| (1..=6000).contains(&ms)));
        assert_eq!(response.headers()["x-ratelimit-limit-tokens"], "100");
        assert_eq!(response.headers().get_all(header::RETRY_AFTER).iter().count(), 1);
    }

    #[test]
    fn the_request_id_goes_into_the_error_object_and_the_stream_event() {
        let e = GatewayError::ModelNotFound("x".into());
        let event = e.sse_event_for("req_1");
        let data = std::str::from_utf8(&event).ok().and_then(|t| t.strip_prefix("data: ")).expect("an event");
        let body: serde_json::Value = serde_json::from_str(data.trim_end()).expect("json");
        assert_eq!(body["error"]["request_id"], "req_1");
        assert_eq!(body["error"]["message"], e.body()["error"]["message"], "OpenAI's words unchanged");
        let response = GatewayError::RateLimited(Box::new(crate::limits::Denied {
            limit: Limit::Rpm,
            retry_after: None,
            headers: axum::http::HeaderMap::new(),
            message: "over".into(),
        }))
        .into_response();
        let kept = response.extensions().get::<ErrorBody>().expect("the body is kept for the access layer");
        assert_eq!(kept.outcome, "rate_limited");
        assert_eq!(kept.body["error"]["code"], "rate_limit_exceeded");
        let mut not_openai = json!({"detail": "x"});
        with_request_id(&mut not_openai, "r");
        assert_eq!(not_openai, json!({"detail": "x"}), "a body without an error object is left alone");
        let mut anthropic = json!({"type": "error", "error": {"type": "not_found_error", "message": "m"}});
        with_request_id(&mut anthropic, "r");
        assert_eq!(anthropic["request_id"], "r", "Anthropic's shape: beside the error");
        assert!(anthropic["error"].get("request_id").is_none());
    }

    #[test]
    fn model_not_found_uses_openai_wording() {
        let e = GatewayError::ModelNotFound("gpt-9".into());
        assert_eq!(e.status(), StatusCode::NOT_FOUND);
        assert_eq!(e.body()["error"]["code"], "model_not_found");
        assert_eq!(e.body()["error"]["message"], "The model `gpt-9` does not exist or you do not have access to it.");
    }

    #[test]
    fn a_refused_key_is_401_invalid_api_key_with_www_authenticate() {
        for problem in [KeyProblem::Missing, KeyProblem::Incorrect] {
            let e = GatewayError::InvalidApiKey(problem);
            assert_eq!(e.status(), StatusCode::UNAUTHORIZED);
            assert_eq!(e.body()["error"]["code"], "invalid_api_key");
            assert_eq!(e.body()["error"]["type"], "invalid_request_error");
            let response = e.into_response();
            assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Bearer");
        }
        assert_eq!(GatewayError::AdminForbidden.status(), StatusCode::FORBIDDEN);
    }
}
