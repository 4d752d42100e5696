//! mlxgate: an OpenAI-compatible gateway in front of local MLX servers.
//!
//! The request's path and the module layout are described in ARCHITECTURE.md; `app()` is the one
//! router used by `mlxgate serve` and by the integration tests alike.
#![forbid(unsafe_code)]

pub mod accept;
pub mod access_log;
pub mod activity;
pub mod api;
pub mod auth;
pub mod backend;
pub mod balance;
pub mod bench;
pub mod config;
pub mod control;
pub mod dispatch;
pub mod error;
pub mod kinds;
pub mod limits;
pub mod log_file;
pub mod log_throttle;
pub mod metrics;
pub mod outcome;
pub mod probe;
pub mod reload;
pub mod service;
pub mod sim;
pub mod stream;
pub mod tokens;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpListener;

pub use api::{AppState, app};
pub use config::Config;

/// Serves `config` on `listener` until `shutdown` resolves; then stops accepting, lets running
/// requests finish for up to `shutdown_grace`, and cuts whatever is left.
///
/// `keeper` is the mlxgate executable, re-run as `mlxgate keep` around each managed server so
/// that servers die with the gateway. Managed backends are stopped before this returns.
pub async fn serve(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    keeper: PathBuf,
) -> std::io::Result<()> {
    serve_with(config, listener, shutdown, keeper, None).await
}

/// As [`serve`], for `mlxgate serve`: `config` was loaded from `path`, which is re-read on
/// SIGHUP to put new keys, clients and limits in force (see [`reload`]); the gateway's pid file
/// (for `mlxgate reload`) exists while it serves.
pub async fn serve_file(
    config: Config,
    path: PathBuf,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    keeper: PathBuf,
) -> std::io::Result<()> {
    // Before anything can find the gateway: SIGHUP's default action ends the process.
    let reloader = reload::Reloader::install(path)?;
    serve_with(config, listener, shutdown, keeper, Some(reloader)).await
}

async fn serve_with(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    keeper: PathBuf,
    reloader: Option<reload::Reloader>,
) -> std::io::Result<()> {
    let grace = config.shutdown_grace;
    let metrics_listen = config.metrics_listen;
    let limits = accept::ConnectionLimits {
        header_read_timeout: config.header_read_timeout,
        max_per_client: config.max_connections_per_client,
    };
    // Servers an earlier gateway left behind (it and their keepers killed at once, before they
    // could stop them) are stopped before any backend starts: never two GPU servers alive.
    let orphans = config.backends.values().filter_map(|b| {
        let managed = b.managed.as_ref()?;
        Some(backend::keeper::reclaim_orphan(&b.name, managed.port, managed.stop_timeout))
    });
    futures_util::future::join_all(orphans).await;
    tracing::info!(
        listen = %listener.local_addr()?,
        models = ?config.models.keys().collect::<Vec<_>>(),
        auth = ?config.auth,
        clients = config.clients.len(),
        "mlxgate serving"
    );
    if config.auth == config::AuthMode::Off && !listener.local_addr()?.ip().is_loopback() {
        tracing::warn!("auth is off on a non-loopback address: anyone who can reach it is served (configure clients)");
    }
    // Tokenizers load on a thread of their own that ends at once: the allocator returns what
    // parsing a 33 MB tokenizer.json left behind (470 MB resident for Qwen's vocabulary) when its
    // thread exits, not ten seconds later as with a pooled blocking thread.
    let tokens = {
        let config = config.clone();
        let (loaded, load) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || loaded.send(tokens::registry::Registry::load(&config)));
        load.await
            .map_err(std::io::Error::other)?
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?
    };
    // The store's error quotes the URL, password and all: say which store, redacted.
    let limiter = limits::Limiter::for_config(&config).map_err(|_| {
        let store = match &config.rate_limit_store {
            config::RateLimitStore::Memory => "memory".to_owned(),
            config::RateLimitStore::Redis(url) => url.redacted(),
        };
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("rate_limit_store: the Redis client refuses {store}"),
        )
    })?;
    let state = AppState::new(config, keeper, tokens, limiter);
    if let Some(reloader) = &reloader {
        state.loaded_from(reloader.path());
    }
    let reloading = reloader.map(|r| {
        let port = listener.local_addr().map_or(0, |a| a.port());
        let pid_file = reload::PidFile::create(port)
            .map_err(|e| tracing::warn!(port, "cannot write the pid file (mlxgate reload needs --pid): {e}"))
            .ok();
        (tokio::spawn(r.run(Arc::clone(&state))), pid_file)
    });
    let metrics_server = match metrics_listen {
        Some(addr) => {
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr} (metrics_listen): {e}")))?;
            tracing::info!(metrics_listen = %addr, "serving /metrics");
            let router = api::metrics_app(state.clone());
            // Never shut down gracefully: aborted (its connections with it) when the gateway stops.
            Some(tokio::spawn(accept::serve(router, listener, limits, std::future::pending(), grace, || {})))
        }
        None => None,
    };
    let scheduling = Arc::clone(&state);
    let shutdown = async move {
        shutdown.await;
        scheduling.closing.cut();
        scheduling.dispatch.stop_scheduling();
    };
    let cutoff = Arc::clone(&state.cutoff);
    accept::serve(app(state.clone()), listener, limits, shutdown, grace, move || cutoff.cut()).await;
    if let Some(server) = metrics_server {
        server.abort();
    }
    if let Some((task, pid_file)) = reloading {
        task.abort();
        drop(pid_file);
    }
    state.dispatch.shutdown().await;
    Ok(())
}
