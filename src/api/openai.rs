//! `/v1/*`: the OpenAI endpoints. The proxy handler parses only what it needs from the body
//! (`model`; other top-level fields stay raw JSON text), rewrites `model` to the backend's name,
//! waits for a slot in the model's queue and streams the backend's answer back untouched.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use axum::Json;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use indexmap::IndexMap;
use serde_json::json;
use serde_json::value::RawValue;

use super::AppState;
use crate::backend::upstream::strip_hop_by_hop;
use crate::config::BackendConfig;
use crate::dispatch::queue::{ClientId, Permit};
use crate::error::GatewayError;
use crate::stream::meter::{Mode, RequestInfo, StreamMeter, figures_of_whole, record_whole};

/// A request body: top-level fields in their original order, values left as raw JSON.
type RawBody = IndexMap<String, Box<RawValue>>;

/// POST `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`.
pub async fn proxy(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, GatewayError> {
    let arrived = Instant::now();
    let (parts, body) = request.into_parts();
    let bytes = read_body(body, state.config.max_body_bytes).await?;
    let mut fields: RawBody = serde_json::from_slice(&bytes)
        .map_err(|e| GatewayError::invalid(format!("The request body is not a JSON object: {e}."), None))?;
    let model = requested_model(&fields)?;
    let route = state.dispatch.route(&model).ok_or_else(|| GatewayError::ModelNotFound(model.clone()))?;
    let upstream_model = serde_json::value::to_raw_value(&route.model.upstream_model)
        .map_err(|e| GatewayError::invalid(format!("cannot encode the model name: {e}"), Some("model")))?;
    fields.insert("model".to_string(), upstream_model);
    let generates = matches!(parts.uri.path(), "/v1/chat/completions" | "/v1/completions");
    let mut client_wants_usage = true;
    if generates {
        let streaming = fields.get("stream").is_some_and(|v| v.get() == "true");
        if streaming {
            client_wants_usage = ask_for_usage(&mut fields)?;
        }
        // mlx_lm.server stops at 512 tokens when none is given: say it explicitly.
        if !fields.contains_key("max_tokens") && !fields.contains_key("max_completion_tokens") {
            let default = serde_json::value::to_raw_value(&route.model.default_max_tokens)
                .map_err(|e| GatewayError::invalid(format!("cannot encode max_tokens: {e}"), None))?;
            fields.insert("max_tokens".to_string(), default);
        }
    }
    let stats_comment = parts.headers.get("x-mlxgate-stats").is_some_and(|v| v.as_bytes() == b"1");
    let forwarded = serde_json::to_vec(&fields)
        .map_err(|e| GatewayError::invalid(format!("cannot re-encode the body: {e}"), None))?;

    let client = client_id(&parts);
    let record_failure = |e: GatewayError| {
        state.metrics.requests.with_label_values(&[&model, &route.backend.name, e.error_type()]).inc();
        e
    };
    let path = parts.uri.path_and_query().map_or(parts.uri.path(), |p| p.as_str());
    let forwarded = Bytes::from(forwarded);
    let mut retries = 0;
    let (permit, upstream, first, sent_at) = loop {
        let permit = route.slot.acquire(client.clone()).await.map_err(record_failure)?;
        if retries == 0 {
            state.metrics.queue_wait.with_label_values(&[&model]).observe(permit.queue_wait().as_secs_f64());
        }
        let generation = route.supervisor.as_ref().map(|s| s.status().generation);
        let sent_at = Instant::now();
        let sent =
            route.upstream.send(&route.backend, parts.method.clone(), path, &parts.headers, forwarded.clone()).await;
        // A managed backend's answer is held until its first body bytes: if the process dies
        // before then (a crash during prefill), nothing has reached the client and the request
        // is sent again to the restarted process.
        let sent = match (sent, &route.supervisor) {
            (Ok(response), Some(_)) => first_bytes(response, &route.backend).await,
            (Ok(response), None) => Ok((response, None)),
            (Err(e), _) => Err(e),
        };
        match (sent, &route.supervisor, generation) {
            (Ok((response, first)), _, _) => break (permit, response, first, sent_at),
            (Err(e @ GatewayError::Backend { .. }), Some(supervisor), Some(generation)) if retries < MAX_RETRIES => {
                retries += 1;
                tracing::warn!(backend = %route.backend.name, error = %e, retries, "backend failed before the first byte; retrying");
                drop(permit);
                supervisor.replaced(generation, REPLACEMENT_WAIT).await;
            }
            (Err(e), _, _) => return Err(record_failure(e)),
        }
    };

    let (mut head, incoming) = upstream.into_parts();
    strip_hop_by_hop(&mut head.headers);
    let sse = head
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if sse {
        // Tell nginx-style proxies in front of us not to buffer, and caches not to keep it.
        head.headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
        head.headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    }
    let info = RequestInfo {
        metrics: state.metrics.clone(),
        model,
        backend: route.backend.name.clone(),
        arrived,
        queue_wait: permit.queue_wait(),
        client_wants_usage,
        stats_comment,
    };
    if sse {
        let body = StreamMeter::new(incoming, Mode::Sse, first, permit, info);
        return Ok(Response::from_parts(head, Body::new(body)));
    }
    if !generates {
        let body = StreamMeter::new(incoming, Mode::Raw, first, permit, info);
        return Ok(Response::from_parts(head, Body::new(body)));
    }
    whole_answer(head, incoming, first, permit, info, sent_at).await
}

/// A whole (non-streaming) answer: read it (it is complete when the backend sends it) to take
/// its usage, record it, and add the per-request figures as headers. `sent_at` is when the
/// request went to the backend: the answer's tokens per second are over the backend's time.
async fn whole_answer(
    mut head: hyper::http::response::Parts,
    incoming: Incoming,
    first: Option<Bytes>,
    permit: Permit,
    info: RequestInfo,
    sent_at: Instant,
) -> Result<Response, GatewayError> {
    let mut whole = first.map(|b| b.to_vec()).unwrap_or_default();
    let rest = Limited::new(incoming, MAX_WHOLE_ANSWER.saturating_sub(whole.len())).collect().await.map_err(|e| {
        let e =
            GatewayError::Backend { backend: info.backend.clone(), reason: format!("reading the answer failed: {e}") };
        info.metrics.requests.with_label_values(&[&info.model, &info.backend, e.error_type()]).inc();
        e
    })?;
    whole.extend_from_slice(&rest.to_bytes());
    drop(permit);
    let figures = figures_of_whole(&whole);
    let outcome = match head.status.as_u16() {
        200..=299 => "ok",
        400..=499 => "backend_rejected",
        _ => "backend_error",
    };
    record_whole(&info, &figures, outcome);
    let headers = &mut head.headers;
    headers.remove(header::CONTENT_LENGTH);
    headers.insert("x-mlxgate-queue-ms", HeaderValue::from(info.queue_wait.as_millis() as u64));
    headers.insert("x-mlxgate-ttft-ms", HeaderValue::from(info.arrived.elapsed().as_millis() as u64));
    if let Some(tokens) = figures.tokens() {
        let seconds = sent_at.elapsed().as_secs_f64().max(1e-6);
        let tps = format!("{:.1}", tokens as f64 / seconds);
        if let Ok(v) = HeaderValue::from_str(&tps) {
            headers.insert("x-mlxgate-tokens-per-second", v);
        }
    }
    Ok(Response::from_parts(head, Body::from(whole)))
}

/// Largest whole (non-streaming) answer the gateway reads to meter it.
const MAX_WHOLE_ANSWER: usize = 64 << 20;

/// Sets `stream_options.include_usage: true` (mlxgate always wants usage) and returns whether
/// the client had asked for it itself.
fn ask_for_usage(fields: &mut RawBody) -> Result<bool, GatewayError> {
    let mut options: serde_json::Map<String, serde_json::Value> = match fields.get("stream_options") {
        None => serde_json::Map::new(),
        Some(raw) if raw.get() == "null" => serde_json::Map::new(),
        Some(raw) => serde_json::from_str(raw.get())
            .map_err(|_| GatewayError::invalid("`stream_options` must be an object", Some("stream_options")))?,
    };
    let asked = options.get("include_usage").and_then(serde_json::Value::as_bool).unwrap_or(false);
    options.insert("include_usage".into(), serde_json::Value::Bool(true));
    let raw = serde_json::value::to_raw_value(&options)
        .map_err(|e| GatewayError::invalid(format!("cannot encode stream_options: {e}"), None))?;
    fields.insert("stream_options".to_string(), raw);
    Ok(asked)
}

/// Sends to a restarted managed backend at most this many times.
const MAX_RETRIES: u32 = 2;
/// How long a retry waits to see the crashed process replaced before it tries anyway.
const REPLACEMENT_WAIT: Duration = Duration::from_secs(5);

/// Waits for the first body bytes (bounded by the backend's response_timeout). A body that
/// fails before any byte is a backend failure, which the caller may retry.
async fn first_bytes(
    response: hyper::Response<Incoming>,
    backend: &BackendConfig,
) -> Result<(hyper::Response<Incoming>, Option<Bytes>), GatewayError> {
    let (head, mut body) = response.into_parts();
    let failed = |reason: String| GatewayError::Backend { backend: backend.name.clone(), reason };
    match tokio::time::timeout(backend.response_timeout, body.frame()).await {
        Err(_) => Err(GatewayError::BackendTimeout { backend: backend.name.clone(), after: backend.response_timeout }),
        Ok(None) => Ok((hyper::Response::from_parts(head, body), None)),
        Ok(Some(Err(e))) => Err(failed(format!("the response broke before its first byte: {e}"))),
        Ok(Some(Ok(frame))) => {
            let first = frame.into_data().ok();
            Ok((hyper::Response::from_parts(head, body), first))
        }
    }
}

/// GET `/v1/models`: the configured public names, in OpenAI's list shape.
pub async fn list_models(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let created = state.started.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let data: Vec<_> = state
        .config
        .models
        .keys()
        .map(|name| json!({"id": name, "object": "model", "created": created, "owned_by": "mlxgate"}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// Any other path: OpenAI's 404 shape rather than an empty body.
pub async fn not_found(request: Request) -> Response {
    GatewayError::UnknownUrl { method: request.method().to_string(), path: request.uri().path().to_string() }
        .into_response()
}

/// Reads the whole request body, refusing more than `limit` bytes.
async fn read_body(body: Body, limit: usize) -> Result<Bytes, GatewayError> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(GatewayError::BodyTooLarge { limit }),
        Err(e) => Err(GatewayError::invalid(format!("cannot read the request body: {e}"), None)),
    }
}

fn requested_model(fields: &RawBody) -> Result<String, GatewayError> {
    let raw = fields
        .get("model")
        .ok_or_else(|| GatewayError::invalid("you must provide a model parameter", Some("model")))?;
    serde_json::from_str::<String>(raw.get())
        .map_err(|_| GatewayError::invalid("`model` must be a string", Some("model")))
}

/// The identity used for fair queueing: the bearer key if sent, else the peer's IP address.
fn client_id(parts: &axum::http::request::Parts) -> ClientId {
    let bearer = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
        .filter(|k| !k.is_empty());
    if let Some(key) = bearer {
        return ClientId(format!("key:{key}"));
    }
    let peer = parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip().to_string());
    ClientId(format!("ip:{}", peer.unwrap_or_else(|| "unknown".into())))
}
