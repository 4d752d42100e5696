//! Every Prometheus metric the gateway exports, declared once on one `Registry` that travels in
//! the application state. Names follow DESIGN.md ("Streams and metrics"): prefix `mlxgate_`,
//! seconds as the unit, labels from bounded sets only (configured model and backend names,
//! error types).

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
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
}

impl Metrics {
    /// Declares every metric on a fresh registry.
    pub fn new() -> Self {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "mlxgate_requests_total",
                "Requests answered, by model, backend and outcome.",
            ),
            &["model", "backend", "outcome"],
        )
        .expect("static metric definition");
        let queue_depth = IntGaugeVec::new(
            Opts::new(
                "mlxgate_queue_depth",
                "Requests waiting in the model's queue.",
            ),
            &["model"],
        )
        .expect("static metric definition");
        let inflight = IntGaugeVec::new(
            Opts::new(
                "mlxgate_inflight_requests",
                "Requests holding a slot at the backend.",
            ),
            &["backend"],
        )
        .expect("static metric definition");
        let queue_wait = HistogramVec::new(
            HistogramOpts::new(
                "mlxgate_queue_wait_seconds",
                "Time a request waited for a slot.",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                300.0, 600.0,
            ]),
            &["model"],
        )
        .expect("static metric definition");
        for collector in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(queue_depth.clone()),
            Box::new(inflight.clone()),
            Box::new(queue_wait.clone()),
        ] {
            registry
                .register(collector)
                .expect("metric names are unique");
        }
        Metrics {
            registry,
            requests,
            queue_depth,
            inflight,
            queue_wait,
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
