//! A request's arrival and departure, around every request: it gives each request its id
//! (`x-request-id`, the client's own when sane) and its one [`RequestRecord`], which an API
//! handler takes (and which then writes the request's access-log line wherever the request
//! ends: a stream's at its end); a request no handler takes (`/health`, `/ready`, `/metrics`,
//! `/admin/*`, `/v1/models`) has its line written here, from its response. On the way out it
//! sets `x-request-id` on every response and puts the id into every error body the gateway
//! made ([`ErrorBody`]).
//!
//! The API routes (`front.rs`) call [`arrive`] and [`depart`] around their handler, which gets
//! the record as an argument; the router's routes get it through [`layer`], which keeps it in
//! the request's extensions for the handler that takes it ([`take_record`]).

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, header};
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

/// The record of `request` for a router handler that serves it, counted in
/// `mlxgate_requests_total` from now on: the one the access layer made, or (a router without
/// the layer) a new one.
pub fn take_record(state: &AppState, request: &Request) -> RequestRecord {
    let taken = request.extensions().get::<Arrival>().and_then(Arrival::take_record);
    let mut record = taken.unwrap_or_else(|| RequestRecord::new(state.metrics.clone()));
    record.metered();
    record
}

/// A request arrives: its id, and its record (its access line begun; not yet counted in
/// `mlxgate_requests_total`, see [`RequestRecord::metered`]).
pub fn arrive(state: &AppState, method: &Method, path: &str, headers: &HeaderMap) -> (RequestId, RequestRecord) {
    let id = RequestId::of(headers);
    let line = AccessLine::new(state.config.access_log, id.clone(), method.clone(), path);
    let record = RequestRecord::at_arrival(state.metrics.clone(), line, Some(Arc::clone(&state.activity)));
    (id, record)
}

/// The span of a request's lines at `debug` (none is made at the default `info`, where a span
/// per request would cost more than the proxying itself).
pub fn span(id: &RequestId, method: &Method, path: &str) -> tracing::Span {
    tracing::debug_span!("request", request_id = %id.as_str(), method = %method, path = %path)
}

/// The request's last line at `debug`, in its span.
pub fn finished(span: &tracing::Span, response: &Response) {
    span.in_scope(|| tracing::debug!(status = response.status().as_u16(), "finished processing request"));
}

/// A response departs: `x-request-id` on it, the id in the error body the gateway made; `left`,
/// the record no handler took, is finished from the response (an operator request).
pub fn depart(mut response: Response, id: &RequestId, left: Option<RequestRecord>) -> Response {
    let error = response.extensions_mut().remove::<ErrorBody>();
    if let Some(mut record) = left {
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

/// The router's layer: see the module's header.
pub async fn layer(State(state): State<Arc<AppState>>, mut request: Request, next: Next) -> Response {
    let (id, record) = arrive(&state, request.method(), request.uri().path(), request.headers());
    let arrival = Arrival(Arc::new(Mutex::new(Some(record))));
    request.extensions_mut().insert(arrival.clone());
    let span = span(&id, request.method(), request.uri().path());
    let response = tracing::Instrument::instrument(next.run(request), span.clone()).await;
    finished(&span, &response);
    depart(response, &id, arrival.take_record())
}
