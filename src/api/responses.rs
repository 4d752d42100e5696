//! `POST /v1/responses`: the Responses API face. A request is translated onto the backend's
//! chat completions (`request`) and goes through the pipeline every face shares
//! ([`pipeline::serve`]: auth, body limits, rate limits, the context cap, queue, send, retry,
//! the stream meter, metrics, the outcome); its answer is translated back (`events`), a
//! stream event by event as the metered chat stream delivers them (`stream`: the state
//! machine the shared [`TranslatedBody`] drives), a whole answer as one `response` object. Refusals and backend errors keep OpenAI's error shape, which the
//! Responses API shares; a prompt over the context cap is refused on `input` (the field the
//! client sent), not on the `messages` it became.
//!
//! Only stateless requests are served: `store: true`, `previous_response_id` and
//! `conversation` get a 400 (Codex sends `store: false` and the whole conversation each turn).

mod events;
mod request;
mod stream;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Uri, header};
use axum::response::Response;
use http_body_util::BodyExt;
use serde_json::Value;

use super::AppState;
use super::pipeline;
use super::translate::TranslatedBody;
use crate::access_log::Face;
use crate::error::ErrorBody;
use crate::outcome::RequestRecord;
use events::Translator;
use request::Shape;

/// POST `/v1/responses` (matched by the front), with the request's `record`.
pub async fn create(state: Arc<AppState>, mut request: Request, record: RequestRecord) -> Response {
    // The pipeline serves it as the chat completion it becomes (the context cap counts its
    // messages; the backend gets it at its chat path).
    *request.uri_mut() = Uri::from_static(pipeline::CHAT_PATH);
    let mut shape = None;
    let response = pipeline::serve(&state, request, Face::Responses, record, |bytes, record| {
        let translated = request::translate(bytes)?;
        if let Some(key) = translated.session {
            record.conversation = Some(key);
        }
        shape = Some(translated.shape);
        Ok(translated.fields)
    })
    .await;
    match shape {
        Some(shape) if response.status().is_success() => answer(response, shape).await,
        // A refusal (here or by the backend): OpenAI's error body, as the Responses API has it.
        _ => about_input(response),
    }
}

/// A refusal as the Responses request's client knows it: a prompt over the context cap was
/// measured on the chat `messages` it became, but the client sent `input`.
fn about_input(mut response: Response) -> Response {
    let Some(kept) = response.extensions_mut().get_mut::<ErrorBody>() else { return response };
    if !context_error_on_input(&mut kept.body) {
        return response;
    }
    let body = kept.body.to_string();
    response.headers_mut().remove(header::CONTENT_LENGTH);
    *response.body_mut() = Body::from(body);
    response
}

/// Rewrites a `context_length_exceeded` error on `messages` (the gateway's or a backend's) as
/// one on `input`: its `param`, and "messages" in its message. Whether it did.
fn context_error_on_input(body: &mut Value) -> bool {
    let Some(error) = body.get_mut("error").and_then(Value::as_object_mut) else { return false };
    let on_messages = error.get("code").and_then(Value::as_str) == Some("context_length_exceeded")
        && error.get("param").and_then(Value::as_str) == Some("messages");
    if !on_messages {
        return false;
    }
    error.insert("param".into(), Value::from("input"));
    if let Some(message) = error.get("message").and_then(Value::as_str) {
        let message = message.replace("messages", "input");
        error.insert("message".into(), Value::from(message));
    }
    true
}

/// The client's answer: a chat stream wrapped in the Responses events, a whole chat
/// completion as one `response` object.
async fn answer(response: Response, shape: Shape) -> Response {
    let (mut parts, body) = response.into_parts();
    let sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    parts.headers.remove(header::CONTENT_LENGTH);
    if sse {
        let stream = TranslatedBody::new(body, Translator::new(shape), None);
        return Response::from_parts(parts, Body::new(stream));
    }
    // A whole answer is already read (and recorded) by the pipeline: collecting it copies
    // memory, it waits on nothing.
    let Ok(collected) = body.collect().await else {
        return Response::from_parts(parts, Body::empty());
    };
    let bytes = collected.to_bytes();
    match events::whole(shape, &bytes) {
        Some(object) => {
            parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            Response::from_parts(parts, Body::from(object.to_string()))
        }
        None => Response::from_parts(parts, Body::from(bytes)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_context_error_on_messages_is_one_on_input() {
        let mut body = json!({"error": {"message": "This model's maximum context length is 2048 tokens. However, \
            your messages resulted in 3000 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}});
        assert!(context_error_on_input(&mut body));
        assert_eq!(body["error"]["param"], "input");
        assert_eq!(
            body["error"]["message"],
            "This model's maximum context length is 2048 tokens. However, your input resulted in 3000 tokens. \
             Please reduce the length of the input."
        );
        // Other errors are left as they are.
        let other = json!({"error": {"message": "messages", "param": "messages", "code": null}});
        let mut same = other.clone();
        assert!(!context_error_on_input(&mut same));
        assert_eq!(same, other);
        assert!(!context_error_on_input(&mut json!("not an error")));
    }
}
