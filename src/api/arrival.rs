//! The access layer, around every route of the router: it gives each request its id
//! (`x-request-id`, the client's own when sane) and its one [`RequestRecord`], which an API
//! handler takes (and which then writes the request's access-log line wherever the request
//! ends: a stream's at its end); a request no handler takes (`/health`, `/ready`, `/metrics`,
//! `/admin/*`, `/v1/models`) has its line written here, from its response. On the way out it
//! sets `x-request-id` on every response and puts the id into every error body the gateway
//! made ([`ErrorBody`]).

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;

use super::AppState;
use crate::access_log::{AccessLine, REQUEST_ID_HEADER, RequestId};
use crate::error::{ErrorBody, with_request_id};
use crate::outcome::{Outcome, RequestRecord};

/// A request's record while the access layer holds it, in the request's extensions.
#[derive(Clone)]
pub struct Arrival(Arc<Mutex<Option<RequestRecord>>>);

impl Arrival {
    fn take_record(&self) -> Option<RequestRecord> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }

    /// Changes the record while the layer holds it (names the client of `/v1/models`).
    pub fn with(&self, change: impl FnOnce(&mut RequestRecord)) {
        if let Some(record) = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).as_mut() {
            change(record);
        }
    }
}

/// The record of `request` for an API handler, counted in `mlxgate_requests_total` from now on:
/// the one the access layer made, or (a router without the layer) a new one.
pub fn take_record(state: &AppState, request: &Request) -> RequestRecord {
    let taken = request.extensions().get::<Arrival>().and_then(Arrival::take_record);
    let mut record = taken.unwrap_or_else(|| RequestRecord::new(state.metrics.clone()));
    record.metered();
    record
}

/// The layer: see the module's header.
pub async fn layer(State(state): State<Arc<AppState>>, mut request: Request, next: Next) -> Response {
    let id = RequestId::of(request.headers());
    let line = AccessLine::new(state.config.access_log, id.clone(), request.method().clone(), request.uri().path());
    let arrival = Arrival(Arc::new(Mutex::new(Some(RequestRecord::at_arrival(
        state.metrics.clone(),
        line,
        Some(Arc::clone(&state.activity)),
    )))));
    request.extensions_mut().insert(arrival.clone());
    let span = tracing::debug_span!("request", request_id = %id.as_str(), method = %request.method(), path = %request.uri().path());
    let mut response = tracing::Instrument::instrument(next.run(request), span.clone()).await;
    span.in_scope(|| tracing::debug!(status = response.status().as_u16(), "finished processing request"));
    let error = response.extensions_mut().remove::<ErrorBody>();
    if let Some(mut record) = arrival.take_record() {
        // No API handler took it: an operator request, ended with its response.
        record.responded(response.status().as_u16());
        record.finish(error.as_ref().map_or(Outcome::Ok, |e| Outcome::Failed(e.outcome)));
    }
    if let Some(ErrorBody { mut body, .. }) = error {
        with_request_id(&mut body, id.as_str());
        response.headers_mut().remove(header::CONTENT_LENGTH);
        *response.body_mut() = Body::from(body.to_string());
    }
    response.headers_mut().insert(REQUEST_ID_HEADER, id.header_value());
    response
}
