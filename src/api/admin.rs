//! Operator endpoints: `/health` (the gateway lives), `/ready` (which models' backends answer),
//! `/metrics` (Prometheus text) and `/admin/*`: `backends…` (state, logs, restart, stop, drain
//! and undrain of each backend), `state` (everything the `/ui` page's Now view shows),
//! `requests` (the last finished requests), `reload` (the configuration checked, and its keys
//! and limits put in force), all behind [`require_admin`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::future::join_all;
use serde_json::json;

use super::AppState;
use crate::auth::browser::{self, AdminBy};
use crate::auth::session;
use crate::backend::supervisor::{Command, Phase, Supervisor};
use crate::config::BackendConfig;
use crate::error::GatewayError;

/// How long `/ready` waits for each backend.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// GET `/health`: 200 while the process serves HTTP.
pub async fn health() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// GET `/ready`: 200 when every model can be served, else 503, with each model and backend in
/// the body. A remote backend must answer its ready path (probed at once, all in parallel); a
/// managed one must not be failed (stopped or starting is fine: requests wait for it).
pub async fn ready(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let probes = state.config.backends.values().map(|backend| {
        let prober = state.prober.clone();
        let supervisor = state.dispatch.supervisors.get(&backend.name).cloned();
        async move {
            let verdict = match supervisor {
                Some(s) => {
                    let status = s.status();
                    match status.phase {
                        Phase::Failed => {
                            (Err(status.last_error.unwrap_or_else(|| "failed".into())), json!(status.phase))
                        }
                        phase => (Ok(()), json!(phase)),
                    }
                }
                None => (prober.probe(backend, &backend.ready_path, PROBE_TIMEOUT).await, json!("remote")),
            };
            (backend.name.clone(), verdict)
        }
    });
    let results: BTreeMap<String, (Result<(), String>, serde_json::Value)> =
        join_all(probes).await.into_iter().collect();
    let backends: serde_json::Map<String, serde_json::Value> = results
        .iter()
        .map(|(name, (r, phase))| {
            let url = state.config.backends.get(name).map(|b| b.url.clone());
            (name.clone(), json!({"url": url, "state": phase, "ready": r.is_ok(), "error": r.as_ref().err()}))
        })
        .collect();
    let answers = |name: &String| results.get(name).is_some_and(|(r, _)| r.is_ok());
    let models: serde_json::Map<String, serde_json::Value> = state
        .config
        .models
        .values()
        .map(|m| {
            // A model is served while any of its backends answers.
            let ready = m.backends.iter().any(answers);
            let entry = match m.backends.as_slice() {
                [one] => json!({"backend": one, "ready": ready}),
                several => json!({"backends": several, "ready": ready}),
            };
            (m.name.clone(), entry)
        })
        .collect();
    // Every model servable, and every backend no model uses answering (as before several
    // backends per model: one Mac down does not make a model of two unready).
    let used = |name: &String| state.config.models.values().any(|m| m.backends.contains(name));
    let all_ready = models.values().all(|m| m["ready"] == true) && results.keys().filter(|n| !used(n)).all(answers);
    let status = if all_ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(json!({"ready": all_ready, "models": models, "backends": backends})))
}

/// GET `/metrics`: Prometheus text exposition.
pub async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], state.metrics.render())
}

/// Guards every `/admin/*` route: the admin key when `admin_key_sha256` is set (401 without
/// it), else a peer on this machine's loopback (403 from anywhere else). It runs before the
/// route's handler, so a refused call restarts nothing and reads no log.
pub async fn require_admin(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let peer = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0);
    match admit(&state, request.headers(), peer) {
        Ok(_) => next.run(request).await,
        Err(e) => {
            // Anyone on the network can cause this line: one per peer per minute.
            let who = peer.map_or_else(|| "unknown".to_owned(), |p| p.ip().to_string());
            if let Some(suppressed) = state.log_throttle.allow(&format!("admin refused {who}")) {
                tracing::warn!(peer = %who, path = %request.uri().path(), error = %e, suppressed, "admin call refused");
            }
            e.into_response()
        }
    }
}

/// The admin rule for a request's `headers` from `peer`: the admin key, an open `/ui` session's
/// cookie, or (no admin key set) this machine; then the browser rules (no cross-site request; a
/// `Host` of this gateway's unless the key itself came).
///
/// Wrong admin keys count as wrong sign-ins do (see `auth::session`): an address that sent ten
/// this minute is refused (429) before its key is compared.
pub(super) fn admit(state: &AppState, headers: &HeaderMap, peer: Option<SocketAddr>) -> Result<AdminBy, GatewayError> {
    let access = state.access();
    let ip = peer.map(|p| p.ip());
    let keyed = access.admin_key.is_some() && crate::auth::presented_key(headers).is_some();
    if keyed && !state.sessions.may_try(ip) {
        return Err(GatewayError::TooManySignIns);
    }
    let session = session::token(headers).is_some_and(|t| state.sessions.valid(t, access.admin_key.as_ref()));
    let by = crate::auth::admit_admin(&access, headers, peer, session).inspect_err(|e| {
        if matches!(e, GatewayError::InvalidApiKey(crate::error::KeyProblem::Incorrect)) && keyed {
            state.sessions.failed(ip);
        }
    })?;
    browser::check(headers, by, &state.hosts)?;
    Ok(by)
}

/// Guards `/metrics` on the main listener when `auth: required`: it names every client and
/// what each used, so it follows the admin rule (admin key, or this machine). Without auth it
/// is open, as is the `metrics_listen` listener, which the user exposes on purpose.
pub async fn require_metrics_access(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if state.access().auth == crate::config::AuthMode::Off {
        return next.run(request).await;
    }
    require_admin(State(state), request, next).await
}

/// GET `/admin/backends`: every backend's kind, state, process, queue, drain and health, and the
/// normalisations its profile has in force (one line each: `key: what the gateway does`); and
/// every model's backends and balancing policy.
pub async fn backends(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let list: Vec<serde_json::Value> = state.config.backends.values().map(|b| backend_entry(&state, b)).collect();
    let models: serde_json::Map<String, serde_json::Value> = state
        .config
        .models
        .values()
        .map(|m| {
            let balance = &m.balance;
            let session_header = balance.session_header.as_ref().map(|h| h.as_str());
            let entry = json!({
                "backends": m.backends,
                "policy": balance.policy.label(),
                "session_header": session_header,
                "fallback": m.fallback,
            });
            (m.name.clone(), entry)
        })
        .collect();
    let config = &state.config;
    let scheduler = json!({
        "swap_after_seconds": config.swap_after.as_secs_f64(),
        "loading_share": config.loading_share,
        "gpu_memory_budget_bytes": config.gpu_memory_budget,
    });
    Json(json!({"backends": list, "models": models, "scheduler": scheduler}))
}

/// One backend as `/admin/backends` lists it (and the drain calls answer it).
fn backend_entry(state: &AppState, b: &BackendConfig) -> serde_json::Value {
    let queue = state.dispatch.queues.get(&b.name).map(|q| q.view());
    let mut entry = json!({
        "name": b.name,
        "kind": b.kind.name(),
        "url": b.url,
        "managed": b.managed.is_some(),
        "max_concurrency": b.max_concurrency,
        "in_flight": queue.map(|q| q.in_flight),
        // Of in_flight, the slots held for answers their clients abandoned (hold_abandoned).
        "abandoned": queue.map(|q| q.abandoned),
        "queue": queue.map(|q| q.waiting),
        // Drained (admin): no new requests; the running ones finish.
        "drained": state.dispatch.drained(&b.name),
        // healthy, ejected (failed probes or requests; resting) or half_open (one request tries it).
        "health": state.dispatch.health_label(&b.name),
        "prompt_cache_sequences": b.prompt_cache_sequences,
        "normalise": b.normalise.active(),
    });
    match (state.dispatch.supervisors.get(&b.name), &b.managed) {
        (Some(supervisor), Some(managed)) => {
            let status = supervisor.status();
            entry["state"] = json!(status.phase);
            entry["pid"] = json!(status.pid);
            entry["uptime_seconds"] = json!(status.ready_since.map(|t| t.elapsed().as_secs()));
            entry["restarts"] = json!(status.restarts);
            entry["last_error"] = json!(status.last_error);
            entry["model"] = json!(managed.model);
            entry["gpu"] = json!(managed.gpu);
            // The one GPU context this backend's process holds (or is loading into).
            entry["holds_gpu"] =
                json!(managed.gpu && matches!(status.phase, Phase::Starting | Phase::Ready | Phase::Draining));
            // Its last start, spawn to ready (the cost the scheduler weighs a swap by).
            entry["start_seconds"] = json!(status.last_start.map(|d| (d.as_secs_f64() * 1000.0).round() / 1000.0));
            // How long its last process served, ready to stop (the scheduler's guess of its next stay).
            entry["last_residency_seconds"] =
                json!(status.last_residency.map(|d| (d.as_secs_f64() * 1000.0).round() / 1000.0));
            // The bytes it holds loaded: written (`footprint:`), else the most measured.
            entry["footprint_bytes"] = json!(status.footprint);
            entry["footprint_source"] = json!(match (managed.footprint, status.footprint) {
                (Some(_), _) => "configured",
                (None, Some(_)) => "measured",
                (None, None) => "unknown",
            });
        }
        _ => entry["state"] = json!("remote"),
    }
    entry
}

/// POST `/admin/backends/{name}/drain`: the backend takes no new request (its models' other
/// backends serve them; a model with no other waits, as behind a stopped backend); running
/// requests finish. Answers the backend's entry as `/admin/backends` shows it.
pub async fn drain(
    State(state): State<Arc<AppState>>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<serde_json::Value>, GatewayError> {
    set_drained(&state, name, true)
}

/// POST `/admin/backends/{name}/undrain`: the backend takes requests again.
pub async fn undrain(
    State(state): State<Arc<AppState>>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<serde_json::Value>, GatewayError> {
    set_drained(&state, name, false)
}

fn set_drained(
    state: &AppState,
    name: Result<Path<String>, PathRejection>,
    drained: bool,
) -> Result<Json<serde_json::Value>, GatewayError> {
    let Path(name) = name.map_err(bad_path)?;
    let backend = state.config.backends.get(&name).ok_or_else(|| GatewayError::UnknownBackend(name.clone()))?;
    state.dispatch.drain(&name, drained)?;
    tracing::info!(backend = %name, drained, "drain set through the admin API");
    Ok(Json(backend_entry(state, backend)))
}

/// Query of `/admin/backends/{name}/logs`.
#[derive(serde::Deserialize)]
pub struct LogQuery {
    /// How many of the last lines (default 200). More than the backend's log buffer holds gives
    /// the whole buffer: the number only selects, it never sizes an allocation.
    lines: Option<usize>,
}

/// GET `/admin/backends/{name}/logs`: the managed server's last output lines, as plain text.
pub async fn logs(
    State(state): State<Arc<AppState>>,
    name: Result<Path<String>, PathRejection>,
    query: Result<Query<LogQuery>, QueryRejection>,
) -> Result<impl IntoResponse, GatewayError> {
    let Path(name) = name.map_err(bad_path)?;
    let Query(query) = query.map_err(|e| GatewayError::invalid(e.body_text(), Some("lines")))?;
    let supervisor = managed(&state, &name)?;
    let mut text = String::new();
    for line in supervisor.logs.recent(query.lines.unwrap_or(200)) {
        text.push_str(&line.text);
        text.push('\n');
    }
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text))
}

/// POST `/admin/backends/{name}/restart`: clears a failure (the backend starts again on the
/// next request, when the GPU is free), or restarts it now if it runs.
pub async fn restart(
    State(state): State<Arc<AppState>>,
    name: Result<Path<String>, PathRejection>,
) -> Result<impl IntoResponse, GatewayError> {
    let Path(name) = name.map_err(bad_path)?;
    let supervisor = managed(&state, &name)?;
    tracing::info!(backend = %name, "restart asked through the admin API");
    supervisor.send(Command::Restart);
    Ok((StatusCode::ACCEPTED, Json(json!({"backend": name, "state": supervisor.status().phase}))))
}

/// POST `/admin/backends/{name}/stop`: drains and stops a managed backend now (its running
/// requests finish first, up to its `drain_timeout`); the next request for it starts it again,
/// as after an idle stop. Noted as a swap with the reason `admin`.
pub async fn stop(
    State(state): State<Arc<AppState>>,
    name: Result<Path<String>, PathRejection>,
) -> Result<impl IntoResponse, GatewayError> {
    let Path(name) = name.map_err(bad_path)?;
    let supervisor = managed(&state, &name)?;
    tracing::info!(backend = %name, "stop asked through the admin API");
    if matches!(supervisor.status().phase, Phase::Starting | Phase::Ready | Phase::Restarting) {
        state.activity.swapped(&name, None, "admin");
    }
    supervisor.send(Command::Stop);
    Ok((StatusCode::ACCEPTED, Json(json!({"backend": name, "state": supervisor.status().phase}))))
}

/// GET `/admin/state`: what the `/ui` page's Now view shows (its live feed sends the same).
pub async fn state(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(snapshot(&state))
}

/// Everything going on now: the gateway, each backend (as `/admin/backends` lists it), each
/// model's requests in flight and waiting, each client's requests in flight and rate-limit
/// refusals, the last swaps, the scheduler's terms.
pub(super) fn snapshot(state: &AppState) -> serde_json::Value {
    let config = &state.config;
    let backends: Vec<serde_json::Value> = config.backends.values().map(|b| backend_entry(state, b)).collect();
    let models: Vec<serde_json::Value> = config
        .models
        .values()
        .map(|m| {
            let in_flight: usize =
                m.backends.iter().filter_map(|b| state.dispatch.queues.get(b)).map(|q| q.view().in_flight).sum();
            json!({
                "name": m.name,
                "backends": m.backends,
                "in_flight": in_flight,
                "queued": state.metrics.queue_depth.with_label_values(&[&m.name]).get(),
                "fallback": m.fallback,
                "policy": m.balance.policy.label(),
                "capture": m.capture,
            })
        })
        .collect();
    let access = state.access();
    let anonymous = (access.auth == crate::config::AuthMode::Off).then_some(crate::config::ANONYMOUS);
    let clients: Vec<serde_json::Value> = access
        .clients
        .keys()
        .map(String::as_str)
        .chain(anonymous)
        .map(|name| {
            let limits = state.limiter.limits_of(name);
            let refused: u64 = ["rpm", "tpm", "concurrency"]
                .iter()
                .filter_map(|limit| state.metrics.rate_limited.get_metric_with_label_values(&[name, limit]).ok())
                .map(|c| c.get())
                .sum();
            json!({
                "name": name,
                "in_flight": state.limiter.in_flight_of(name),
                "rpm": limits.rpm,
                "tpm": limits.tpm,
                "concurrency": limits.concurrency,
                "rate_limited": refused,
            })
        })
        .collect();
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_seconds": state.started.elapsed().map_or(0, |d| d.as_secs()),
        "config": state.config_file(),
        "auth": if access.auth == crate::config::AuthMode::Off { "off" } else { "required" },
        "admin_key": access.admin_key.is_some(),
        "backends": backends,
        "models": models,
        "clients": clients,
        "swaps": state.activity.swaps(),
        "scheduler": {
            "swap_after_seconds": config.swap_after.as_secs_f64(),
            "loading_share": config.loading_share,
            "gpu_memory_budget_bytes": config.gpu_memory_budget,
        },
    })
}

/// Query of `/admin/requests`.
#[derive(serde::Deserialize)]
pub struct RequestsQuery {
    /// How many of the last finished requests (default and most: all the ring holds).
    limit: Option<usize>,
}

/// GET `/admin/requests`: the last finished API requests, newest first (no prompt, no key).
pub async fn requests(
    State(state): State<Arc<AppState>>,
    query: Result<Query<RequestsQuery>, QueryRejection>,
) -> Result<Json<serde_json::Value>, GatewayError> {
    let Query(query) = query.map_err(|e| GatewayError::invalid(e.body_text(), Some("limit")))?;
    let recent = state.activity.recent(query.limit.unwrap_or(usize::MAX));
    Ok(Json(json!({"requests": recent})))
}

/// Query of `/admin/requests/{id}`.
#[derive(serde::Deserialize)]
pub struct RequestQuery {
    /// The gateway's number of the request, when a client sent the same id twice.
    seq: Option<u64>,
}

/// GET `/admin/requests/{id}[?seq=N]`: one request still in the ring (the newest of that id,
/// or the one numbered `seq`), with its body when its model has `capture: true`.
pub async fn request(
    State(state): State<Arc<AppState>>,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<RequestQuery>, QueryRejection>,
) -> Result<Json<serde_json::Value>, GatewayError> {
    let Path(id) = id.map_err(bad_path)?;
    let Query(query) = query.map_err(|e| GatewayError::invalid(e.body_text(), Some("seq")))?;
    let (summary, capture) =
        state.activity.request(&id, query.seq).ok_or_else(|| GatewayError::UnknownRequest(id.clone()))?;
    let mut entry = json!(summary);
    entry["capture"] = json!(capture);
    Ok(Json(entry))
}

/// Query of `/admin/reload`.
#[derive(serde::Deserialize)]
pub struct ReloadQuery {
    /// Check only: say what a reload would do, change nothing.
    #[serde(default)]
    dry_run: bool,
}

/// POST `/admin/reload[?dry_run=true]`: reads the gateway's file again and checks it as `mlxgate
/// check` does. With problems: 422 and every problem, nothing changed. Without: which changed
/// keys a reload puts in force now (`applies_now`: auth, clients, default limits, the admin
/// key) and which need a restart (`needs_restart`), and — unless `dry_run` — puts them in force
/// (as SIGHUP does).
pub async fn reload(
    State(state): State<Arc<AppState>>,
    query: Result<Query<ReloadQuery>, QueryRejection>,
) -> Result<Response, GatewayError> {
    let Query(query) = query.map_err(|e| GatewayError::invalid(e.body_text(), Some("dry_run")))?;
    let path = state
        .config_file()
        .ok_or_else(|| GatewayError::invalid("this gateway was not started from a file: nothing to reload", None))?
        .to_path_buf();
    let reading = path.clone();
    let checked = tokio::task::spawn_blocking(move || crate::reload::check_for_reload(&reading))
        .await
        .map_err(|e| GatewayError::Internal(format!("the check did not finish: {e}")))?;
    let new = match checked {
        Ok(new) => new,
        Err(problems) => {
            let body = json!({"ok": false, "problems": problems, "applied": false, "applies_now": [],
                              "needs_restart": [], "config": path});
            return Ok((StatusCode::UNPROCESSABLE_ENTITY, Json(body)).into_response());
        }
    };
    let applies_now = crate::reload::applied_changes(&state.access(), &new);
    let needs_restart = crate::reload::unapplied_changes(&state.config, &new);
    if !query.dry_run {
        tracing::info!(config = %path.display(), "reload asked through the admin API");
        crate::reload::apply(&state, &path, Ok(new));
    }
    let body = json!({"ok": true, "problems": [], "applied": !query.dry_run, "applies_now": applies_now,
                      "needs_restart": needs_restart, "config": path});
    Ok(Json(body).into_response())
}

/// A backend name that is not text (`%FF`): OpenAI's error shape, not axum's plain text.
fn bad_path(rejection: PathRejection) -> GatewayError {
    GatewayError::invalid(rejection.body_text(), None)
}

fn managed<'a>(state: &'a AppState, name: &str) -> Result<&'a Arc<Supervisor>, GatewayError> {
    state.dispatch.supervisors.get(name).ok_or_else(|| GatewayError::UnknownBackend(name.to_string()))
}
