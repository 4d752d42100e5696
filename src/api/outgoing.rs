//! The outgoing request: the client's fields rewritten for the backend ([`rewrite`]: `model`
//! to the backend's name, usage asked for, an explicit `max_tokens`), then encoded once
//! ([`encode`]); [`prepare`] does both. The client's own bytes and the parsed fields are gone
//! before the request waits in the queue.

use bytes::Bytes;

use super::fields::RawBody;
use crate::backend::handle::Outbound;
use crate::dispatch::Route;
use crate::error::GatewayError;

/// What the client asked for, ready to send: the body encoded once, and what the answer's
/// wrapping needs to know of the request.
pub(crate) struct Outgoing {
    pub(crate) outbound: Outbound,
    /// Generation endpoints (chat, completions): their answers are metered.
    pub(crate) generates: bool,
    pub(crate) client_wants_usage: bool,
    pub(crate) stats_comment: bool,
    /// `x-mlxgate-transform` for the client's response (middle-out, chunk).
    pub(crate) transform: Option<String>,
}

/// What [`rewrite`] learnt of the request on the way.
pub(crate) struct Rewritten {
    /// A generation endpoint (chat, completions).
    pub(crate) generates: bool,
    /// Whether the client asked for usage itself (the gateway always does).
    pub(crate) client_wants_usage: bool,
}

/// The client's ask for the stats comment at a stream's end (`x-mlxgate-stats: 1`).
const STATS_HEADER: axum::http::HeaderName = axum::http::HeaderName::from_static("x-mlxgate-stats");

/// The request for `route`'s first backend: [`rewrite`], then [`encode`].
pub(crate) fn prepare(
    parts: &axum::http::request::Parts,
    fields: &mut RawBody,
    route: &Route,
) -> Result<Outgoing, GatewayError> {
    prepare_for(parts, fields, route, 0)
}

/// The request for `route`'s backend at `position` (in the model's list): [`rewrite`], then
/// [`encode`].
pub(crate) fn prepare_for(
    parts: &axum::http::request::Parts,
    fields: &mut RawBody,
    route: &Route,
    position: usize,
) -> Result<Outgoing, GatewayError> {
    let Rewritten { generates, client_wants_usage } = rewrite(parts.uri.path(), fields, route, position)?;
    let outbound = encode(parts, fields)?;
    Ok(Outgoing {
        outbound,
        generates,
        client_wants_usage,
        stats_comment: parts.headers.get(STATS_HEADER).is_some_and(|v| v.as_bytes() == b"1"),
        transform: None,
    })
}

/// Whether the backend at `position` takes the request built for the model's first backend as
/// it is: the same upstream model name and the same `stream_options` rule.
pub(crate) fn same_request(route: &Route, position: usize) -> bool {
    let (Some(first), Some(other)) = (route.backends.first(), route.backends.get(position)) else { return true };
    route.model.upstream_model_for(&first.config) == route.model.upstream_model_for(&other.config)
        && first.config.normalise.stream_options == other.config.normalise.stream_options
}

/// The request for the model's backend at `position`, built again from the client's `pristine`
/// fields when that backend takes another request than the first one's (another upstream model
/// name, another `stream_options` rule); `None`: it takes the first one's as it is.
pub(crate) fn for_position(
    parts: &axum::http::request::Parts,
    route: &Route,
    pristine: Option<&RawBody>,
    position: usize,
) -> Option<Result<Outbound, GatewayError>> {
    if same_request(route, position) {
        return None;
    }
    let mut fields = pristine?.clone();
    Some(prepare_for(parts, &mut fields, route, position).map(|o| o.outbound))
}

/// Rewrites `model` for the backend at `position` of `route`, and on generation endpoints
/// (`path`) asks for usage and an explicit `max_tokens`.
pub(crate) fn rewrite(
    path: &str,
    fields: &mut RawBody,
    route: &Route,
    position: usize,
) -> Result<Rewritten, GatewayError> {
    let backend = route.backends.get(position).unwrap_or(&route.backend);
    let upstream_model = serde_json::value::to_raw_value(route.model.upstream_model_for(&backend.config))
        .map_err(|e| GatewayError::invalid(format!("cannot encode the model name: {e}"), Some("model")))?;
    fields.insert("model".to_string(), upstream_model);
    let generates = matches!(path, "/v1/chat/completions" | "/v1/completions");
    let mut client_wants_usage = true;
    if generates {
        let streaming = fields.get("stream").is_some_and(|v| v.get() == "true");
        if streaming {
            client_wants_usage = ask_for_usage(fields, backend.config.normalise.stream_options)?;
        } else if !backend.config.normalise.stream_options {
            // Some SDKs send it on every request: a backend that refuses it gets none.
            fields.shift_remove("stream_options");
        }
        // mlx_lm.server stops at 512 tokens when none is given: say it explicitly.
        if !fields.contains_key("max_tokens") && !fields.contains_key("max_completion_tokens") {
            let default = serde_json::value::to_raw_value(&route.model.default_max_tokens)
                .map_err(|e| GatewayError::invalid(format!("cannot encode max_tokens: {e}"), None))?;
            fields.insert("max_tokens".to_string(), default);
        }
    }
    Ok(Rewritten { generates, client_wants_usage })
}

/// The request as it goes to the backend: the client's method, path and headers, `fields`
/// encoded once.
pub(crate) fn encode(parts: &axum::http::request::Parts, fields: &RawBody) -> Result<Outbound, GatewayError> {
    let body = serde_json::to_vec(fields)
        .map_err(|e| GatewayError::invalid(format!("cannot re-encode the body: {e}"), None))?;
    let path_and_query = parts.uri.path_and_query().map_or(parts.uri.path(), |p| p.as_str()).to_string();
    Ok(Outbound {
        method: parts.method.clone(),
        path_and_query,
        headers: parts.headers.clone(),
        body: Bytes::from(body),
    })
}

/// Sets `stream_options.include_usage: true` (mlxgate always wants usage) and returns whether
/// the client had asked for it itself. Towards a backend that refuses `stream_options`
/// (`normalise.stream_options: false`), the field is removed instead, the client's too (the
/// backend would refuse the client's as it refuses the gateway's): the stream is metered without
/// usage.
fn ask_for_usage(fields: &mut RawBody, backend_takes_it: bool) -> Result<bool, GatewayError> {
    let mut options: serde_json::Map<String, serde_json::Value> = match fields.get("stream_options") {
        None => serde_json::Map::new(),
        Some(raw) if raw.get() == "null" => serde_json::Map::new(),
        Some(raw) => serde_json::from_str(raw.get())
            .map_err(|_| GatewayError::invalid("`stream_options` must be an object", Some("stream_options")))?,
    };
    let asked = options.get("include_usage").and_then(serde_json::Value::as_bool).unwrap_or(false);
    if !backend_takes_it {
        fields.shift_remove("stream_options");
        return Ok(asked);
    }
    options.insert("include_usage".into(), serde_json::Value::Bool(true));
    let raw = serde_json::value::to_raw_value(&options)
        .map_err(|e| GatewayError::invalid(format!("cannot encode stream_options: {e}"), None))?;
    fields.insert("stream_options".to_string(), raw);
    Ok(asked)
}
