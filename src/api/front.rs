//! The gateway's service on each client connection. The routes that carry the traffic —
//! `POST /v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, `/v1/responses` and
//! `/v1/messages` — are matched here by hand and served straight: [`arrival::arrive`], the
//! face's handler with the request's record, [`arrival::depart`]. Every other request goes
//! through axum's router ([`super::app`]'s routes and their layers), which costs a request
//! several allocations and boxed futures that the hot routes do without.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{Method, Request};
use axum::response::Response;
use hyper::body::Incoming;
use tower::ServiceExt;

use super::{AppState, arrival, messages, openai, responses};
use crate::accept::{Connections, OpenEnded};
use crate::outcome::RequestRecord;

/// The routes served without the router: the faces' handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hot {
    /// `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`.
    OpenAi,
    /// `/v1/responses`.
    Responses,
    /// `/v1/messages`.
    Messages,
}

impl Hot {
    /// The hot route of a request, if it is one: a POST to one of the faces' paths (exactly:
    /// another method or a longer path goes to the router, which answers it as before).
    fn of(method: &Method, path: &str) -> Option<Hot> {
        if method != Method::POST {
            return None;
        }
        match path {
            "/v1/chat/completions" | "/v1/completions" | "/v1/embeddings" => Some(Hot::OpenAi),
            "/v1/responses" => Some(Hot::Responses),
            "/v1/messages" => Some(Hot::Messages),
            _ => None,
        }
    }
}

/// The gateway's front: the hot routes (when it has the gateway's state) and the router.
#[derive(Clone)]
pub struct Front {
    router: Router,
    state: Option<Arc<AppState>>,
}

impl Front {
    /// The front of `router`, serving the hot routes with `state` (`None`: the router alone,
    /// as on the metrics listener).
    pub fn new(router: Router, state: Option<Arc<AppState>>) -> Front {
        Front { router, state }
    }
}

/// The front's service on one connection.
pub struct Connection {
    front: Front,
    peer: SocketAddr,
    open_ended: OpenEnded,
}

impl Connections for Front {
    type Service = Connection;

    fn connection(&self, peer: SocketAddr, open_ended: OpenEnded) -> Connection {
        Connection { front: self.clone(), peer, open_ended }
    }
}

/// A response on its way, boxed once.
type Responding = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for Connection {
    type Response = Response;
    type Error = Infallible;
    type Future = Responding;

    fn call(&self, mut request: Request<Incoming>) -> Responding {
        if let Some(state) = &self.front.state
            && let Some(hot) = Hot::of(request.method(), request.uri().path())
        {
            // One future per face, each of its own size (a match inside one future would
            // size all three as the largest, copied whole on every move).
            let (state, request, peer) = (Arc::clone(state), request.map(Body::new), self.peer);
            return match hot {
                Hot::OpenAi => Box::pin(serve_hot(state, request, peer, openai::proxy)),
                Hot::Responses => Box::pin(serve_hot(state, request, peer, responses::create)),
                Hot::Messages => Box::pin(serve_hot(state, request, peer, messages::create)),
            };
        }
        // The router's handlers read the peer as axum's `ConnectInfo`.
        request.extensions_mut().insert(ConnectInfo(self.peer));
        request.extensions_mut().insert(self.open_ended.clone());
        let router = self.front.router.clone();
        Box::pin(async move { router.oneshot(request).await })
    }
}

/// A hot route's request from `peer`: arrival, its face's `handler`, departure (see
/// `arrival.rs`).
async fn serve_hot<F>(
    state: Arc<AppState>,
    request: Request<Body>,
    peer: SocketAddr,
    handler: impl FnOnce(Arc<AppState>, Request<Body>, RequestRecord) -> F,
) -> Result<Response, Infallible>
where
    F: Future<Output = Response>,
{
    let (id, mut record) = arrival::arrive(&state, request.method(), request.uri().path(), request.headers());
    // The peer goes with the record, not into the request's extensions (a map made per request).
    record.peer = Some(peer.ip());
    let span = arrival::span(&id, request.method(), request.uri().path());
    let response = tracing::Instrument::instrument(handler(state, request, record), span.clone()).await;
    arrival::finished(&span, &response);
    Ok(arrival::depart(response, &id, None))
}

/// The router's route of the OpenAI face's paths (see [`super::app`]).
pub(super) async fn openai_route(State(state): State<Arc<AppState>>, request: Request<Body>) -> Response {
    let record = arrival::take_record(&state, &request);
    openai::proxy(state, request, record).await
}

/// The router's route of `/v1/responses`.
pub(super) async fn responses_route(State(state): State<Arc<AppState>>, request: Request<Body>) -> Response {
    let record = arrival::take_record(&state, &request);
    responses::create(state, request, record).await
}

/// The router's route of `/v1/messages`.
pub(super) async fn messages_route(State(state): State<Arc<AppState>>, request: Request<Body>) -> Response {
    let record = arrival::take_record(&state, &request);
    messages::create(state, request, record).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_post_to_a_face_path_is_hot() {
        assert_eq!(Hot::of(&Method::POST, "/v1/chat/completions"), Some(Hot::OpenAi));
        assert_eq!(Hot::of(&Method::POST, "/v1/completions"), Some(Hot::OpenAi));
        assert_eq!(Hot::of(&Method::POST, "/v1/embeddings"), Some(Hot::OpenAi));
        assert_eq!(Hot::of(&Method::POST, "/v1/responses"), Some(Hot::Responses));
        assert_eq!(Hot::of(&Method::POST, "/v1/messages"), Some(Hot::Messages));
        assert_eq!(Hot::of(&Method::GET, "/v1/chat/completions"), None);
        assert_eq!(Hot::of(&Method::POST, "/v1/messages/count_tokens"), None);
        assert_eq!(Hot::of(&Method::POST, "/v1/chat/completions/"), None);
        assert_eq!(Hot::of(&Method::POST, "/v1/models"), None);
    }
}
