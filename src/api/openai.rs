//! `/v1/*`: the OpenAI face. Its requests need no translation: the body's top-level fields go
//! to the pipeline as they are ([`pipeline::serve`]), and so does its answer. Any other path
//! gets OpenAI's 404.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::arrival;
use super::pipeline;
use crate::access_log::Face;
use crate::error::GatewayError;
use crate::outcome::{Outcome, RequestRecord};

/// POST `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings` (matched by the front):
/// the pipeline, the body's fields as they are.
pub async fn proxy(state: Arc<AppState>, request: Request, record: RequestRecord) -> Response {
    let face = Face::of_path(request.uri().path());
    pipeline::serve(&state, request, face, record, |bytes, _| {
        serde_json::from_slice(bytes)
            .map_err(|e| GatewayError::invalid(format!("The request body is not a JSON object: {e}."), None))
    })
    .await
}

/// Any other path: OpenAI's 404 shape rather than an empty body (counted, unrouted).
pub async fn not_found(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let e = GatewayError::UnknownUrl { method: request.method().to_string(), path: request.uri().path().to_string() };
    let mut record = arrival::take_record(&state, &request);
    record.set_face(Face::None);
    record.responded(e.status().as_u16());
    record.finish(Outcome::from(&e));
    e.into_response()
}
