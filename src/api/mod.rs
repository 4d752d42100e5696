//! The HTTP surface: the shared state every handler sees and `app()`, the one router that both
//! `mlxgate serve` and the integration tests run.

pub mod admin;
mod answer;
pub mod arrival;
mod body;
mod chunk;
mod completion;
mod fields;
mod fit;
pub mod front;
pub mod messages;
pub mod models;
mod normalise;
pub mod openai;
mod outgoing;
mod pipeline;
pub mod responses;
mod translate;
pub mod ui;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::SystemTime;

use axum::Router;
use axum::middleware;
use axum::routing::{get, post};
pub use front::Front;

use crate::activity::Activity;
use crate::auth::Access;
use crate::auth::browser::Hosts;
use crate::auth::session::Sessions;
use crate::backend::upstream::Upstream;
use crate::config::Config;
use crate::dispatch::Dispatch;
use crate::limits::Limiter;
use crate::log_throttle::LogThrottle;
use crate::metrics::Metrics;
use crate::stream::shutdown::Cutoff;
use crate::tokens::registry::Registry;

/// State shared by all handlers. Immutable after start-up apart from queues, metrics and the
/// [`Access`] snapshot (keys, clients, limits) that a reload replaces.
pub struct AppState {
    /// The configuration as loaded at start-up. Its `auth`, `clients`, `default_limits` and
    /// `admin_key` are those of start-up: read [`AppState::access`] for the ones in force.
    pub config: Config,
    /// Keys, clients and limits in force. A `std` lock rather than `arc-swap`: a read is one
    /// uncontended lock and an `Arc` clone per request, writes happen only on reload, and the
    /// lock is never held across an await.
    access: RwLock<Arc<Access>>,
    pub dispatch: Dispatch,
    pub metrics: Metrics,
    /// For `/ready` probes, separate from the request pools.
    pub prober: Upstream,
    /// Ends every running stream with an error event when the shutdown grace is over.
    pub cutoff: Arc<Cutoff>,
    pub started: SystemTime,
    /// Each model's tokenizer, context cap and overflow action.
    pub tokens: Registry,
    /// Every client's rate limits (`anonymous` shares `default_limits`).
    pub limiter: Limiter,
    /// Keeps log lines that clients can cause at will (429s, refused admin calls) to one per
    /// minute per client or peer.
    pub log_throttle: LogThrottle,
    /// The last requests, swaps and captures (the `/ui` page's feeds, `/admin/requests`).
    pub activity: Arc<Activity>,
    /// The `/ui` page's sign-in sessions.
    pub sessions: Sessions,
    /// The host names a browser may reach the admin side by (`admin_hosts:` and this machine's).
    pub hosts: Hosts,
    /// Set when the gateway begins to shut down: the `/ui` page's live feeds end at once
    /// (a stream that never ends would hold the shutdown for its whole grace).
    pub closing: Arc<Cutoff>,
    /// The file the configuration was loaded from (`mlxgate serve`), which `/admin/reload`
    /// reads again; unset when the gateway was given a configuration in code.
    config_file: OnceLock<PathBuf>,
    /// The last snapshot of the state as JSON and when it was made: the open pages' feeds
    /// share one per tick (see `admin::snapshot_text`).
    snapshot: std::sync::Mutex<Option<(std::time::Instant, Snapshot)>>,
}

impl AppState {
    /// Builds routes, queues, clients and backend supervisors from a validated configuration.
    /// `keeper` is the mlxgate executable (it runs `mlxgate keep` for each managed server);
    /// `limiter` holds the clients' limits (see [`Limiter::for_config`]).
    pub fn new(config: Config, keeper: PathBuf, tokens: Registry, limiter: Limiter) -> Arc<Self> {
        let metrics = Metrics::new();
        declare_series(&metrics, &config, &limiter);
        let activity = Arc::new(Activity::default());
        let dispatch = Dispatch::new(&config, &metrics, &activity, keeper);
        Arc::new(AppState {
            hosts: Hosts::of_machine(&config.admin_hosts),
            access: RwLock::new(Arc::new(Access::of(&config))),
            config,
            dispatch,
            metrics,
            prober: Upstream::new(std::time::Duration::from_secs(2)),
            cutoff: Arc::new(Cutoff::default()),
            started: SystemTime::now(),
            tokens,
            limiter,
            log_throttle: LogThrottle::default(),
            activity,
            sessions: Sessions::default(),
            closing: Arc::new(Cutoff::default()),
            config_file: OnceLock::new(),
            snapshot: std::sync::Mutex::default(),
        })
    }

    /// Names the file the configuration came from (once; `mlxgate serve`).
    pub fn loaded_from(&self, path: &Path) {
        let absolute = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let _ = self.config_file.set(absolute);
    }

    /// The state's snapshot as JSON, made at most once per `fresh` for all who ask.
    pub(crate) fn snapshot_text(&self, fresh: std::time::Duration) -> Snapshot {
        let mut cache = self.snapshot.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((at, snapshot)) = cache.as_ref()
            && at.elapsed() < fresh
        {
            return snapshot.clone();
        }
        let mut value = admin::snapshot(self);
        let text: Arc<str> = serde_json::to_string(&value).unwrap_or_default().into();
        // Uptimes move every second by themselves (the page counts them on from the last
        // state): what changed is the rest.
        value.as_object_mut().map(|o| o.remove("uptime_seconds"));
        for backend in value["backends"].as_array_mut().into_iter().flatten() {
            backend.as_object_mut().map(|b| b.remove("uptime_seconds"));
        }
        let changes: Arc<str> = serde_json::to_string(&value).unwrap_or_default().into();
        let snapshot = Snapshot { text, changes };
        *cache = Some((std::time::Instant::now(), snapshot.clone()));
        snapshot
    }

    /// The file the configuration came from, when it came from one.
    pub fn config_file(&self) -> Option<&Path> {
        self.config_file.get().map(PathBuf::as_path)
    }
}

impl AppState {
    /// The keys, clients and limits in force now. A request takes one snapshot and keeps it:
    /// a reload while it runs changes nothing for it.
    pub fn access(&self) -> Arc<Access> {
        Arc::clone(&self.access.read().unwrap_or_else(|poisoned| poisoned.into_inner()))
    }

    /// Puts `config`'s keys, clients, admin key and limits in force (a reload). The limiter's
    /// limits change while the snapshot is locked, so no request identifies its client under
    /// the new keys and then finds the old limits; buckets keep their state.
    pub fn reload_access(&self, config: &Config) {
        let mut access = self.access.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        let same_admin_key = match (&access.admin_key, &config.admin_key) {
            (Some(old), Some(new)) => bool::from(subtle::ConstantTimeEq::ct_eq(old, new)),
            (old, new) => old.is_none() && new.is_none(),
        };
        if !same_admin_key {
            // A new admin key ends every /ui session (and one changed back revives none).
            self.sessions.close_all();
        }
        self.limiter.configure_clients(config);
        *access = Arc::new(Access::of(config));
        declare_client_series(&self.metrics, config, &self.limiter);
    }
}

/// The state as the live page's feed sends it: the JSON, and the part of it that changes only
/// when something happened (the uptimes left out), to compare with the last one sent.
#[derive(Clone)]
pub(crate) struct Snapshot {
    pub text: Arc<str>,
    pub changes: Arc<str>,
}

/// Creates at 0 the series of events that may happen to what the configuration names: a
/// counter's first event is then an increase Prometheus sees (`increase()` and `rate()` do not
/// count a series that appears at 1), so the first restart marks the dashboard and the first
/// 429 shows in its panel. Bounded by the configuration, as every label is.
fn declare_series(metrics: &Metrics, config: &Config, limiter: &Limiter) {
    for backend in config.backends.values() {
        metrics.backend_info.with_label_values(&[&backend.name, backend.kind.name()]).set(1);
        metrics.abandoned_held.with_label_values(&[&backend.name]);
        metrics.stream_bursts.with_label_values(&[&backend.name]);
        metrics.usage_mismatch.with_label_values(&[&backend.name]);
        if let Some(managed) = &backend.managed {
            for reason in ["crash", "health"] {
                metrics.backend_restarts.with_label_values(&[&backend.name, reason]);
            }
            metrics.backend_starting_seconds.with_label_values(&[&backend.name]);
            if let Some(bytes) = managed.footprint {
                metrics.backend_footprint_bytes.with_label_values(&[&backend.name]).set(bytes as i64);
            }
            if managed.gpu {
                for reason in crate::dispatch::scheduler::SwapReason::ALL {
                    metrics.backend_swaps.with_label_values(&[&backend.name, reason.label()]);
                }
            }
        }
    }
    for model in config.models.values() {
        if let Some(fallback) = &model.fallback {
            metrics.model_fallbacks.with_label_values(&[&model.name, fallback]);
        }
        for action in [crate::tokens::OnOverflow::Reject, model.on_overflow] {
            metrics.context_overflow.with_label_values(&[&model.name, action.label()]);
        }
    }
    declare_client_series(metrics, config, limiter);
}

/// The rate-limit refusals of every configured client (`anonymous` with auth off), for the
/// limits it has, and its 503s and backend errors per model.
fn declare_client_series(metrics: &Metrics, config: &Config, limiter: &Limiter) {
    let anonymous = (config.auth == crate::config::AuthMode::Off).then_some("anonymous");
    let names = config.clients.keys().map(String::as_str).chain(anonymous);
    for client in names {
        // 503s and backend failures per model: the first burst is an increase the alerts see.
        for model in config.models.values() {
            for (backend, outcome) in
                model.backends.iter().flat_map(|b| [(b, "server_overloaded"), (b, "backend_error")])
            {
                metrics.requests.with_label_values(&[&model.name, backend, client, outcome]);
            }
        }
        let limits = limiter.limits_of(client);
        let has = [
            ("rpm", limits.rpm.is_some()),
            ("tpm", limits.tpm.is_some()),
            ("concurrency", limits.concurrency.is_some()),
        ];
        for (limit, _) in has.iter().filter(|(_, set)| *set) {
            metrics.rate_limited.with_label_values(&[client, limit]);
        }
    }
}

/// The router of the optional `metrics_listen` address: `/metrics` only.
pub fn metrics_app(state: Arc<AppState>) -> Front {
    Front::new(Router::new().route("/metrics", get(admin::metrics)).with_state(state), None)
}

/// The gateway: its front ([`front`]: the faces' routes — `POST /v1/chat/completions`,
/// `/v1/completions`, `/v1/embeddings`, `/v1/responses`, `/v1/messages` — matched by hand and
/// served without a router) and its router, for every other request.
///
/// The router's layers, outermost first:
/// - `arrival::layer`: the request's id and record, and its access-log line (see
///   `arrival.rs`); `x-request-id` on every response, the id in every error body. The log lines
///   a request causes name its `request_id` (the access line's key); at `debug` each request
///   also has a span (its id, method and path) — none at the default `info`, where a span per
///   request would cost more than the proxying itself.
/// - `/admin/*` and the `/ui` page's feeds (`/ui/events…`): `admin::require_admin` (a route
///   layer: an unknown `/admin/…` path gets the same 404 as any other) — the admin key, a `/ui`
///   session, or loopback, and no cross-site or DNS-rebound request; `/metrics` the same rule
///   when `auth: required`. The page itself (`/ui`) applies the rule to choose what it shows
///   (the page, a sign-in form, or why not); its script and style are public.
///
/// There is deliberately no body-limit or timeout layer: the body limit is applied by the proxy
/// handler so that a too-large body gets an OpenAI-shaped 413, and a timeout layer would cut
/// streams that legitimately last many minutes (timeouts live in `backend::upstream`).
pub fn app(state: Arc<AppState>) -> Front {
    let admin = Router::new()
        .route("/admin/backends", get(admin::backends))
        .route("/admin/backends/{name}/logs", get(admin::logs))
        .route("/admin/backends/{name}/restart", post(admin::restart))
        .route("/admin/backends/{name}/drain", post(admin::drain))
        .route("/admin/backends/{name}/undrain", post(admin::undrain))
        .route("/admin/backends/{name}/stop", post(admin::stop))
        .route("/admin/state", get(admin::state))
        .route("/admin/requests", get(admin::requests))
        .route("/admin/requests/{id}", get(admin::request))
        .route("/admin/reload", post(admin::reload))
        .route("/ui/events", get(ui::feed::activity))
        .route("/ui/events/logs/{name}", get(ui::feed::logs))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&state), admin::require_admin));
    let router = Router::new()
        // The front serves these POSTs without the router; here they answer other methods as
        // every route does (OpenAI's 404, with `allow: POST`), and serve a POST when the router
        // is served alone.
        .route("/v1/chat/completions", post(front::openai_route))
        .route("/v1/completions", post(front::openai_route))
        .route("/v1/embeddings", post(front::openai_route))
        .route("/v1/responses", post(front::responses_route))
        .route("/v1/messages", post(front::messages_route))
        .route("/v1/messages/count_tokens", post(messages::count::count_tokens))
        .route("/v1/models", get(models::list))
        .route("/v1/models/{*id}", get(models::retrieve))
        .route("/", get(models::hello))
        .route("/api/hello", get(models::hello))
        .route("/health", get(admin::health))
        .route("/ready", get(admin::ready))
        .route("/ui", get(ui::page))
        .route("/ui/", get(ui::page))
        .route("/ui/app.js", get(ui::script))
        .route("/ui/style.css", get(ui::style))
        .route("/ui/login", post(ui::sign_in))
        .route("/ui/logout", post(ui::sign_out))
        .route(
            "/metrics",
            get(admin::metrics)
                .route_layer(middleware::from_fn_with_state(Arc::clone(&state), admin::require_metrics_access)),
        )
        .merge(admin)
        .fallback(openai::not_found)
        // GET /v1/chat/completions and the like: OpenAI's "Invalid URL" body, not an empty 405.
        .method_not_allowed_fallback(openai::not_found)
        .layer(middleware::from_fn_with_state(Arc::clone(&state), arrival::layer))
        .with_state(Arc::clone(&state));
    Front::new(router, Some(state))
}
