//! Every Prometheus metric the gateway exports, declared once on one `Registry` that travels in
//! the application state. Names follow DESIGN.md ("Streams and metrics"): prefix `mlxgate_`,
//! seconds as the unit, labels from bounded sets only (configured model and backend names,
//! error types).

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The gateway's metrics. Cheap to clone (every field is an `Arc` inside).
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// Finished requests by `outcome` (`ok` or an error type).
    pub requests: IntCounterVec,
    /// Requests waiting for a slot, per model.
    pub queue_depth: IntGaugeVec,
    /// Requests holding a slot at a backend (from dispatch until the response body ends).
    pub inflight: IntGaugeVec,
    /// Time from arrival to getting a slot, per model.
    pub queue_wait: HistogramVec,
    /// 1 while a managed backend is ready.
    pub backend_up: IntGaugeVec,
    /// Restarts of a managed backend, by reason (`crash`).
    pub backend_restarts: IntCounterVec,
    /// Times the scheduler stopped one GPU backend to start another.
    pub backend_swaps: IntCounter,
    /// Spawn-to-ready time of a managed backend (warm-up included).
    pub backend_start_seconds: HistogramVec,
}

impl Metrics {
    /// Declares every metric on a fresh registry.
    pub fn new() -> Self {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new("mlxgate_requests_total", "Requests answered, by model, backend and outcome."),
            &["model", "backend", "outcome"],
        )
        .expect("static metric definition");
        let queue_depth =
            IntGaugeVec::new(Opts::new("mlxgate_queue_depth", "Requests waiting in the model's queue."), &["model"])
                .expect("static metric definition");
        let inflight = IntGaugeVec::new(
            Opts::new("mlxgate_inflight_requests", "Requests holding a slot at the backend."),
            &["backend"],
        )
        .expect("static metric definition");
        let queue_wait = HistogramVec::new(
            HistogramOpts::new("mlxgate_queue_wait_seconds", "Time a request waited for a slot.").buckets(vec![
                0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
            ]),
            &["model"],
        )
        .expect("static metric definition");
        let backend_up = IntGaugeVec::new(
            Opts::new("mlxgate_backend_up", "1 while the managed backend is ready, else 0."),
            &["backend"],
        )
        .expect("static metric definition");
        let backend_restarts = IntCounterVec::new(
            Opts::new("mlxgate_backend_restarts_total", "Restarts of a managed backend, by reason."),
            &["backend", "reason"],
        )
        .expect("static metric definition");
        let backend_swaps =
            IntCounter::new("mlxgate_backend_swaps_total", "GPU backend swaps (one stopped for another to start).")
                .expect("static metric definition");
        let backend_start_seconds = HistogramVec::new(
            HistogramOpts::new("mlxgate_backend_start_seconds", "Time from spawn to ready, warm-up included.")
                .buckets(vec![0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0]),
            &["backend"],
        )
        .expect("static metric definition");
        for collector in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(queue_depth.clone()),
            Box::new(inflight.clone()),
            Box::new(queue_wait.clone()),
            Box::new(backend_up.clone()),
            Box::new(backend_restarts.clone()),
            Box::new(backend_swaps.clone()),
            Box::new(backend_start_seconds.clone()),
        ] {
            registry.register(collector).expect("metric names are unique");
        }
        Metrics {
            registry,
            requests,
            queue_depth,
            inflight,
            queue_wait,
            backend_up,
            backend_restarts,
            backend_swaps,
            backend_start_seconds,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for the text format.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
