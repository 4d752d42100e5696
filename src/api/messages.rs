//! `POST /v1/messages` (also `?beta=true`, as Claude Code sends it: the query is not read): the
//! Anthropic Messages API face, for Claude Code and the anthropic SDKs. A request is
//! translated onto the backend's chat completions (`request`: the billing block dropped,
//! everything rendered deterministically for the backend's prompt cache) and goes through the
//! pipeline every face shares ([`pipeline::serve`]: auth — `x-api-key` or Bearer —, body
//! limits, rate limits, the context cap and room for `max_tokens`, queue, send, retry, the
//! stream meter, metrics, the outcome); its answer is translated back (`events`), a stream
//! event by event as the metered chat stream delivers them (`stream`: the state machine the
//! shared [`TranslatedBody`] drives, with its ping timer), a whole answer as one `message`
//! object. Every refusal, the gateway's or a backend's, is given in Anthropic's error shape
//! (`error`).
//!
//! The conversation's key (`record.conversation`, for routing): Claude Code's
//! `X-Claude-Code-Session-Id` header, else the body's `metadata.user_id`. Every answer carries
//! the request's id in Anthropic's `request-id` header too (beside `x-request-id`).

pub mod count;
pub(crate) mod error;
mod events;
pub(crate) mod request;
mod stream;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Uri, header};
use axum::response::Response;
use http_body_util::BodyExt;

use super::AppState;
use super::arrival::Arrival;
use super::pipeline;
use super::translate::TranslatedBody;
use crate::access_log::Face;
use crate::error::ErrorBody;
use crate::outcome::RequestRecord;
use events::{Translator, Whole};
use request::Shape;
use stream::PING_EVERY;

/// Claude Code's session header.
const SESSION_HEADER: &str = "x-claude-code-session-id";

/// Longest session key kept from a header (a client's text on the record: bounded).
const MAX_SESSION: usize = 256;

/// Anthropic's request id header.
const REQUEST_ID: &str = "request-id";

/// POST `/v1/messages` (matched by the front), with the request's `record`.
pub async fn create(state: Arc<AppState>, mut request: Request, record: RequestRecord) -> Response {
    let session_header = session_of(request.headers());
    let request_id = Some(record.request_id().header_value());
    // The pipeline serves it as the chat completion it becomes (the context cap counts its
    // messages; the backend gets it at its chat path).
    *request.uri_mut() = Uri::from_static(pipeline::CHAT_PATH);
    let mut shape = None;
    let response = pipeline::serve(&state, request, Face::Messages, record, |bytes, record| {
        let translated = request::translate(bytes)?;
        state.metrics.anthropic_billing_blocks_stripped.inc_by(translated.billing_blocks_stripped);
        if let Some(key) = session_header.or(translated.session) {
            record.conversation = Some(key);
        }
        shape = Some(translated.shape);
        Ok(translated.fields)
    })
    .await;
    let mut response = match shape {
        Some(shape) if response.status().is_success() => answer(response, shape).await,
        _ => anthropic_error(response),
    };
    if let Some(id) = request_id {
        // Anthropic's own header for it (the SDKs' `_request_id`), beside `x-request-id`.
        response.headers_mut().insert(REQUEST_ID, id);
    }
    response
}

/// The request's id, as the access layer gave it (`x-request-id`).
fn request_id_of(request: &Request) -> Option<HeaderValue> {
    let arrival = request.extensions().get::<Arrival>()?;
    let mut id = None;
    arrival.with(|record| id = Some(record.request_id().header_value()));
    id
}

/// Claude Code's session id, when sane (visible ASCII, bounded).
fn session_of(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(SESSION_HEADER)?.to_str().ok()?.trim();
    let sane = !value.is_empty() && value.len() <= MAX_SESSION && value.bytes().all(|b| b.is_ascii_graphic());
    sane.then(|| value.to_string())
}

/// A refusal (the gateway's or a backend's, kept OpenAI-shaped on the response) in Anthropic's
/// shape and status; the access layer then adds the request id (top-level `request_id`).
pub(crate) fn anthropic_error(mut response: Response) -> Response {
    let Some(kept) = response.extensions_mut().remove::<ErrorBody>() else { return response };
    let (status, body) = error::refusal(response.status(), &kept.body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.remove(header::CONTENT_LENGTH);
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    *response.body_mut() = Body::from(body.to_string());
    response.extensions_mut().insert(ErrorBody { body, outcome: kept.outcome });
    response
}

/// The client's answer: a chat stream wrapped in the Messages events, a whole chat completion
/// as one `message` object.
async fn answer(response: Response, shape: Shape) -> Response {
    let (mut parts, body) = response.into_parts();
    let sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    parts.headers.remove(header::CONTENT_LENGTH);
    if sse {
        let counted = parts.extensions.get::<pipeline::PromptTokens>().map_or(0, |p| p.0);
        let translator = Translator::new(shape).with_counted_prompt(counted);
        let stream = TranslatedBody::new(body, translator, Some(PING_EVERY));
        return Response::from_parts(parts, Body::new(stream));
    }
    // A whole answer is already read (and recorded) by the pipeline: collecting it copies
    // memory, it waits on nothing.
    let Ok(collected) = body.collect().await else {
        return Response::from_parts(parts, Body::empty());
    };
    let bytes = collected.to_bytes();
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    match events::whole(shape, &bytes) {
        Some(Whole::Message(message)) => Response::from_parts(parts, Body::from(message.to_string())),
        Some(Whole::Error(status, body)) => {
            parts.status = status;
            let mut response = Response::from_parts(parts, Body::from(body.to_string()));
            response.extensions_mut().insert(ErrorBody { body, outcome: "backend_error" });
            response
        }
        None => Response::from_parts(parts, Body::from(bytes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_header_is_kept_when_sane() {
        let of = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(SESSION_HEADER, HeaderValue::from_str(value).expect("value"));
            session_of(&headers)
        };
        assert_eq!(
            of(" 31e2309b-cfa4-4f81-85e6-354b91a0921b ").as_deref(),
            Some("31e2309b-cfa4-4f81-85e6-354b91a0921b")
        );
        assert_eq!(of(""), None);
        assert_eq!(of("a b"), None);
        assert_eq!(of(&"x".repeat(MAX_SESSION + 1)), None);
        assert_eq!(session_of(&HeaderMap::new()), None);
    }
}
