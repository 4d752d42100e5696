//! Operator endpoints: `/health` (the gateway lives), `/ready` (which models' backends answer)
//! and `/metrics` (Prometheus text).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use futures_util::future::join_all;
use serde_json::json;

use super::AppState;

/// How long `/ready` waits for each backend.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// GET `/health`: 200 while the process serves HTTP.
pub async fn health() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// GET `/ready`: probes every backend's `/v1/models` at once; 200 when all answer, else 503,
/// with each model and backend's state in the body.
pub async fn ready(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let probes = state.config.backends.values().map(|backend| {
        let prober = state.prober.clone();
        async move {
            (
                backend.name.clone(),
                prober.probe(backend, "/v1/models", PROBE_TIMEOUT).await,
            )
        }
    });
    let results: BTreeMap<String, Result<(), String>> =
        join_all(probes).await.into_iter().collect();
    let backends: serde_json::Map<String, serde_json::Value> = results
        .iter()
        .map(|(name, r)| {
            let url = state.config.backends.get(name).map(|b| b.url.clone());
            (
                name.clone(),
                json!({"url": url, "ready": r.is_ok(), "error": r.as_ref().err()}),
            )
        })
        .collect();
    let models: serde_json::Map<String, serde_json::Value> = state
        .config
        .models
        .values()
        .map(|m| {
            let ready = results.get(&m.backend).is_some_and(Result::is_ok);
            (
                m.name.clone(),
                json!({"backend": m.backend, "ready": ready}),
            )
        })
        .collect();
    let all_ready = results.values().all(Result::is_ok);
    let status = if all_ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(json!({"ready": all_ready, "models": models, "backends": backends})),
    )
}

/// GET `/metrics`: Prometheus text exposition.
pub async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
}
