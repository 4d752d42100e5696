//! Errors in Anthropic's shape, `{"type": "error", "error": {"type", "message"}, "request_id"}`,
//! from the OpenAI-shaped errors the pipeline makes (the gateway's own refusals and backends'
//! errors, kept on the response as an [`ErrorBody`](crate::error::ErrorBody)). Pure functions:
//! status and body in, status and body out.
//!
//! | pipeline | Messages face |
//! |---|---|
//! | 400 (a prompt over the context cap: "prompt is too long: N tokens > M maximum", which Claude Code reacts to) | 400 `invalid_request_error` |
//! | 401 | 401 `authentication_error` |
//! | 403 | 403 `permission_error` |
//! | 404 | 404 `not_found_error` |
//! | 413 | 413 `request_too_large` |
//! | 429 | 429 `rate_limit_error` (the headers kept: `Retry-After`, `x-ratelimit-*`) |
//! | 503 a full queue or a wait too long (`server_overloaded`) | **529** `overloaded_error` |
//! | any other 4xx | its status, `invalid_request_error` |
//! | 5xx (502, 503, 504, 500) | its status, `api_error` |
//!
//! Mid-stream, a failure is `event: error` with the same object: `overloaded_error` for an
//! overloaded backend, else `api_error`.

use axum::http::StatusCode;
use serde_json::{Value, json};

/// Anthropic's status for an overloaded API (the SDKs' `OverloadedError`; Claude Code retries it).
pub const OVERLOADED: u16 = 529;

/// The Anthropic status and body of a refusal whose OpenAI-shaped body is `openai`.
pub fn refusal(status: StatusCode, openai: &Value) -> (StatusCode, Value) {
    let error = openai.get("error").unwrap_or(&Value::Null);
    let openai_type = error.get("type").and_then(Value::as_str).unwrap_or_default();
    let mut message = match error {
        Value::String(text) => text.clone(),
        _ => error.get("message").and_then(Value::as_str).map_or_else(|| openai.to_string(), str::to_string),
    };
    let (status, kind) = match status.as_u16() {
        400 => {
            if let Some((requested, cap)) = context_numbers(&message) {
                message = format!("prompt is too long: {requested} tokens > {cap} maximum");
            }
            (status, "invalid_request_error")
        }
        401 => (status, "authentication_error"),
        403 => (status, "permission_error"),
        404 => (status, "not_found_error"),
        413 => (status, "request_too_large"),
        429 => (status, "rate_limit_error"),
        503 if openai_type == "server_overloaded" => {
            (StatusCode::from_u16(OVERLOADED).unwrap_or(status), "overloaded_error")
        }
        s if (400..500).contains(&s) => (status, "invalid_request_error"),
        _ => (status, "api_error"),
    };
    let mut body = json!({"type": "error", "error": {"type": kind, "message": message}});
    if let Some(id) = error.get("request_id").and_then(Value::as_str) {
        body["request_id"] = Value::from(id);
    }
    (status, body)
}

/// The body of a mid-stream `event: error` (or of a whole answer that carried an error):
/// `overloaded_error` when the chat error's type says the server is overloaded, else
/// `api_error`.
pub fn stream_error(message: &str, openai_type: Option<&str>, request_id: Option<&str>) -> Value {
    let kind = match openai_type {
        Some("server_overloaded" | "overloaded_error") => "overloaded_error",
        _ => "api_error",
    };
    let mut body = json!({"type": "error", "error": {"type": kind, "message": message}});
    if let Some(id) = request_id {
        body["request_id"] = Value::from(id);
    }
    body
}

/// The requested total and the cap of an over-the-cap refusal in OpenAI's words (the gateway's
/// and the servers' that use them): "maximum context length is M tokens. However, your
/// messages resulted in N tokens" or "… you requested N tokens (…)".
fn context_numbers(message: &str) -> Option<(u64, u64)> {
    let number_after = |marker: &str| -> Option<u64> {
        let rest = &message[message.find(marker)? + marker.len()..];
        let digits: String = rest.trim_start().chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    let cap = number_after("maximum context length is ")?;
    let requested = number_after("resulted in ").or_else(|| number_after("you requested "))?;
    Some((requested, cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn openai(kind: &str, message: &str) -> Value {
        json!({"error": {"message": message, "type": kind, "param": null, "code": null, "request_id": "req_1"}})
    }

    #[test]
    fn every_refusal_has_anthropics_type_and_status() {
        let cases = [
            (400, "invalid_request_error", 400, "invalid_request_error"),
            (401, "invalid_request_error", 401, "authentication_error"),
            (403, "invalid_request_error", 403, "permission_error"),
            (404, "invalid_request_error", 404, "not_found_error"),
            (408, "invalid_request_error", 408, "invalid_request_error"),
            (413, "invalid_request_error", 413, "request_too_large"),
            (422, "invalid_request_error", 422, "invalid_request_error"),
            (429, "requests", 429, "rate_limit_error"),
            (503, "server_overloaded", 529, "overloaded_error"),
            (503, "gateway_shutdown", 503, "api_error"),
            (503, "backend_error", 503, "api_error"),
            (502, "backend_error", 502, "api_error"),
            (504, "backend_timeout", 504, "api_error"),
            (500, "server_error", 500, "api_error"),
        ];
        for (status, openai_type, want_status, want_type) in cases {
            let status = StatusCode::from_u16(status).expect("status");
            let (got, body) = refusal(status, &openai(openai_type, "words"));
            assert_eq!(got.as_u16(), want_status, "{status} {openai_type}");
            assert_eq!(
                body,
                json!({"type": "error", "error": {"type": want_type, "message": "words"}, "request_id": "req_1"})
            );
        }
        // A body without an OpenAI error object (a backend's plain text, normalised upstream
        // anyway): its text as the message.
        let (_, body) = refusal(StatusCode::BAD_GATEWAY, &json!({"error": "boom"}));
        assert_eq!(body["error"]["message"], "boom");
        assert!(body.get("request_id").is_none());
    }

    #[test]
    fn a_prompt_over_the_cap_is_said_in_anthropics_words() {
        let prompt_only = "This model's maximum context length is 2048 tokens. However, your messages resulted in \
                           3000 tokens. Please reduce the length of the messages.";
        let (status, body) = refusal(StatusCode::BAD_REQUEST, &openai("invalid_request_error", prompt_only));
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body["error"]["message"], "prompt is too long: 3000 tokens > 2048 maximum");
        let with_completion = "This model's maximum context length is 32768 tokens. However, you requested 64000 \
                               tokens (32000 in the messages, 32000 in the completion). Please reduce the length \
                               of the messages or completion.";
        let (_, body) = refusal(StatusCode::BAD_REQUEST, &openai("invalid_request_error", with_completion));
        assert_eq!(body["error"]["message"], "prompt is too long: 64000 tokens > 32768 maximum");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        // Other 400s keep their words.
        let (_, body) = refusal(StatusCode::BAD_REQUEST, &openai("invalid_request_error", "messages: required"));
        assert_eq!(body["error"]["message"], "messages: required");
    }

    #[test]
    fn a_stream_error_is_api_error_or_overloaded() {
        assert_eq!(
            stream_error("cut", Some("backend_error"), Some("req_9")),
            json!({"type": "error", "error": {"type": "api_error", "message": "cut"}, "request_id": "req_9"})
        );
        assert_eq!(stream_error("busy", Some("server_overloaded"), None)["error"]["type"], "overloaded_error");
        assert!(stream_error("x", None, None).get("request_id").is_none());
    }
}
