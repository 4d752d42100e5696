//! `GatewayError`: every failure a client can see. One `match` decides the HTTP status, the
//! OpenAI-shaped body `{"error": {"message", "type", "param", "code"}}` and the metric label,
//! so the three never disagree (DESIGN.md, "Errors clients see").

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::json;

/// A request's failure, as the client sees it.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The body is not the JSON object the endpoint needs.
    #[error("{message}")]
    InvalidRequest { message: String, param: Option<&'static str> },
    /// The body is larger than `max_body`.
    #[error("request body is larger than the gateway's limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
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
    /// No endpoint at this path.
    #[error("Invalid URL ({method} {path})")]
    UnknownUrl { method: String, path: String },
    /// The backend refused the connection, reset it, or answered with something unusable.
    #[error("Backend `{backend}` failed: {reason}")]
    Backend { backend: String, reason: String },
    /// A managed backend crashed too often and waits for an operator.
    #[error("Backend `{backend}` is failed: {reason}. Fix it, then POST /admin/backends/{backend}/restart.")]
    BackendFailed { backend: String, reason: String },
    /// The backend did not answer within its `response_timeout`.
    #[error("Backend `{backend}` did not answer within {}s.", after.as_secs())]
    BackendTimeout { backend: String, after: Duration },
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
            GatewayError::ModelNotFound(_) => (StatusCode::NOT_FOUND, "invalid_request_error", Some("model_not_found")),
            GatewayError::UnknownBackend(_) => {
                (StatusCode::NOT_FOUND, "invalid_request_error", Some("backend_not_found"))
            }
            GatewayError::UnknownUrl { .. } => (StatusCode::NOT_FOUND, "invalid_request_error", Some("unknown_url")),
            GatewayError::QueueFull { .. } | GatewayError::QueueTimeout { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "server_overloaded", Some("server_overloaded"))
            }
            GatewayError::BackendFailed { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "backend_error", Some("backend_failed"))
            }
            GatewayError::Backend { .. } => (StatusCode::BAD_GATEWAY, "backend_error", Some("backend_error")),
            GatewayError::BackendTimeout { .. } => {
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
            GatewayError::BackendFailed { .. } => Some(Duration::from_secs(30)),
            _ => None,
        }
    }

    /// The OpenAI error object.
    pub fn body(&self) -> serde_json::Value {
        let (_, kind, code) = self.classify();
        let param = match self {
            GatewayError::InvalidRequest { param, .. } => *param,
            GatewayError::ModelNotFound(_) => Some("model"),
            _ => None,
        };
        json!({"error": {"message": self.to_string(), "type": kind, "param": param, "code": code}})
    }

    /// The final SSE event sent when a stream fails after it began.
    pub fn sse_event(&self) -> Bytes {
        Bytes::from(format!("data: {}\n\n", self.body()))
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), axum::Json(self.body())).into_response();
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
    fn model_not_found_uses_openai_wording() {
        let e = GatewayError::ModelNotFound("gpt-9".into());
        assert_eq!(e.status(), StatusCode::NOT_FOUND);
        assert_eq!(e.body()["error"]["code"], "model_not_found");
        assert_eq!(e.body()["error"]["message"], "The model `gpt-9` does not exist or you do not have access to it.");
    }
}
