//! `GET /v1/models` and `GET /v1/models/{id}`: the configured public names a client may use, in
//! OpenAI's shape, or in Anthropic's when the request carries `anthropic-version` (the anthropic
//! SDKs and Claude Code send it on every request). Also the cheap `GET`/`HEAD /` (and
//! `/api/hello`) a client checks the gateway is there with.
//!
//! Anthropic's list: `{"data":[{"type":"model","id","display_name","created_at"}],"has_more":
//! false,"first_id","last_id"}`, `created_at` in RFC 3339 (the gateway's start). Every model is on
//! one page: `limit`, `after_id` and `before_id` are not read (a gateway serves a handful).
//! Aliases are not listed: they are other names for the listed models; `/v1/models/{id}` answers
//! one by the name asked for.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::AppState;
use super::arrival::Arrival;
use crate::auth;
use crate::error::GatewayError;

/// The header that marks an Anthropic client.
const ANTHROPIC_VERSION: &str = "anthropic-version";

/// Which API's shape the answer takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    OpenAi,
    Anthropic,
}

impl Shape {
    fn of(headers: &HeaderMap) -> Shape {
        if headers.contains_key(ANTHROPIC_VERSION) { Shape::Anthropic } else { Shape::OpenAi }
    }
}

/// One listed model: its public name and context cap when known.
#[derive(Debug, Clone, PartialEq)]
struct Listed<'a> {
    id: &'a str,
    context_length: Option<usize>,
}

/// GET `/v1/models`. With auth required, 401 without a key (in Anthropic's error shape to an
/// Anthropic client).
pub async fn list(
    State(state): State<Arc<AppState>>,
    arrival: Option<axum::Extension<Arrival>>,
    headers: HeaderMap,
) -> Response {
    let shape = Shape::of(&headers);
    let access = state.access();
    let caller = match identified(&access, arrival, &headers) {
        Ok(caller) => caller,
        Err(e) => return refusal(shape, e),
    };
    let listed: Vec<Listed<'_>> = state
        .config
        .models
        .keys()
        .filter(|name| caller.may_use(&access, name))
        .map(|name| Listed { id: name, context_length: state.tokens.get(name).and_then(|t| t.cap) })
        .collect();
    Json(list_body(shape, &listed, state.started)).into_response()
}

/// The caller named by the request's key, written on its arrival record for the access log.
fn identified(
    access: &crate::auth::Access,
    arrival: Option<axum::Extension<Arrival>>,
    headers: &HeaderMap,
) -> Result<crate::auth::Client, crate::error::GatewayError> {
    let caller = auth::identify(access, headers)?;
    if let Some(axum::Extension(arrival)) = arrival {
        arrival.with(|record| record.identified(caller.name()));
    }
    Ok(caller)
}

/// GET `/v1/models/{id}`: one model the client may use, by its name or an alias of it (the
/// answer's `id` is the name asked for); else 404 as for a request naming it.
pub async fn retrieve(
    State(state): State<Arc<AppState>>,
    arrival: Option<axum::Extension<Arrival>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let shape = Shape::of(&headers);
    let access = state.access();
    let caller = match identified(&access, arrival, &headers) {
        Ok(caller) => caller,
        Err(e) => return refusal(shape, e),
    };
    let model = state.config.model_named(&id);
    if !state.config.models.contains_key(model) || !caller.may_use(&access, model) {
        return refusal(shape, GatewayError::ModelNotFound(id));
    }
    let listed = Listed { id: &id, context_length: state.tokens.get(model).and_then(|t| t.cap) };
    Json(entry(shape, &listed, state.started)).into_response()
}

/// GET and HEAD `/` and `/api/hello`: 200, no key needed. Claude Code checks the gateway is
/// reachable with one of them before its first request (2.1.332: `HEAD /api/hello`, its
/// preconnect, sent without a key). Anthropic's API answers it without a key too; it says no
/// more than `/health` does: its very answer (not even the gateway's name, to a caller without
/// a key).
pub async fn hello() -> Json<Value> {
    super::admin::health().await
}

/// A refusal in the shape of the client's API (Anthropic's made as the Messages face makes it).
fn refusal(shape: Shape, e: GatewayError) -> Response {
    match shape {
        Shape::OpenAi => e.into_response(),
        Shape::Anthropic => super::messages::anthropic_error(e.into_response()),
    }
}

/// The list's body in `shape`.
fn list_body(shape: Shape, listed: &[Listed<'_>], started: SystemTime) -> Value {
    let data: Vec<Value> = listed.iter().map(|m| entry(shape, m, started)).collect();
    match shape {
        Shape::OpenAi => json!({"object": "list", "data": data}),
        Shape::Anthropic => json!({
            "data": data,
            "has_more": false,
            "first_id": listed.first().map(|m| m.id),
            "last_id": listed.last().map(|m| m.id),
        }),
    }
}

/// One model in `shape`; `created` is the gateway's start.
fn entry(shape: Shape, model: &Listed<'_>, started: SystemTime) -> Value {
    match shape {
        Shape::OpenAi => {
            let created = started.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
            let mut entry = json!({"id": model.id, "object": "model", "created": created, "owned_by": "mlxgate"});
            if let Some(cap) = model.context_length {
                entry["context_length"] = json!(cap);
            }
            entry
        }
        Shape::Anthropic => json!({
            "type": "model",
            "id": model.id,
            "display_name": model.id,
            "created_at": humantime::format_rfc3339_seconds(started).to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + std::time::Duration::from_secs(secs)
    }

    #[test]
    fn anthropic_clients_get_anthropics_list() {
        let listed = [Listed { id: "qwen", context_length: Some(32768) }, Listed { id: "small", context_length: None }];
        let body = list_body(Shape::Anthropic, &listed, at(1_764_597_600));
        assert_eq!(
            body,
            json!({
                "data": [
                    {"type": "model", "id": "qwen", "display_name": "qwen", "created_at": "2025-12-01T14:00:00Z"},
                    {"type": "model", "id": "small", "display_name": "small", "created_at": "2025-12-01T14:00:00Z"},
                ],
                "has_more": false,
                "first_id": "qwen",
                "last_id": "small",
            })
        );
        let empty = list_body(Shape::Anthropic, &[], at(0));
        assert_eq!(empty, json!({"data": [], "has_more": false, "first_id": null, "last_id": null}));
    }

    #[test]
    fn others_get_openais_list() {
        let listed = [Listed { id: "qwen", context_length: Some(32768) }, Listed { id: "small", context_length: None }];
        let body = list_body(Shape::OpenAi, &listed, at(1_764_597_600));
        assert_eq!(
            body,
            json!({"object": "list", "data": [
                {"id": "qwen", "object": "model", "created": 1_764_597_600, "owned_by": "mlxgate", "context_length": 32768},
                {"id": "small", "object": "model", "created": 1_764_597_600, "owned_by": "mlxgate"},
            ]})
        );
    }

    #[test]
    fn the_shape_follows_anthropic_version() {
        let mut headers = HeaderMap::new();
        assert_eq!(Shape::of(&headers), Shape::OpenAi);
        headers.insert(ANTHROPIC_VERSION, "2023-06-01".parse().expect("header"));
        assert_eq!(Shape::of(&headers), Shape::Anthropic);
    }
}
