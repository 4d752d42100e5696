//! mlxgate: an OpenAI-compatible gateway in front of local MLX servers.
//!
//! The request's path and the module layout are described in DESIGN.md; `app()` is the one
//! router used by `mlxgate serve` and by the integration tests alike.
#![forbid(unsafe_code)]

pub mod api;
pub mod backend;
pub mod config;
pub mod dispatch;
pub mod error;
pub mod metrics;
pub mod outcome;
pub mod sim;
pub mod stream;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;

use axum::serve::ListenerExt;
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
    let grace = config.shutdown_grace;
    let metrics_listen = config.metrics_listen;
    let state = AppState::new(config, keeper);
    let metrics_server = match metrics_listen {
        Some(addr) => {
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr} (metrics_listen): {e}")))?;
            tracing::info!(metrics_listen = %addr, "serving /metrics");
            Some(tokio::spawn(axum::serve(listener, api::metrics_app(state.clone())).into_future()))
        }
        None => None,
    };
    let result = serve_http(app(state.clone()), listener, shutdown, grace).await;
    if let Some(server) = metrics_server {
        server.abort();
    }
    state.dispatch.shutdown().await;
    result
}

async fn serve_http(
    router: axum::Router,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: std::time::Duration,
) -> std::io::Result<()> {
    // Small SSE frames must leave at once, not after Nagle's 40 ms.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on a client connection");
        }
    });
    let (stop_accepting, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(async move {
            let _ = stopped.await;
        });
    let mut server = tokio::spawn(server.into_future());
    tokio::select! {
        finished = &mut server => return finished.map_err(std::io::Error::other)?,
        () = shutdown => {}
    }
    tracing::info!(grace_seconds = grace.as_secs(), "shutting down: no new connections, waiting for running requests");
    let _ = stop_accepting.send(());
    match tokio::time::timeout(grace, &mut server).await {
        Ok(finished) => finished.map_err(std::io::Error::other)?,
        Err(_) => {
            tracing::warn!("grace period over: cutting the requests still running");
            server.abort();
            Ok(())
        }
    }
}
