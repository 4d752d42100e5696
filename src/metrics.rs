//! Every Prometheus metric the gateway exports, declared once on one `Registry` that travels in
//! the application state. Names follow vLLM's and the OpenTelemetry GenAI conventions (the
//! list: docs/metrics.md): prefix `mlxgate_`, seconds as the unit, labels from bounded sets only
//! (configured model, backend and client names, `anonymous`, error types).

pub mod series;

use prometheus::{
    CounterVec, Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// The gateway's metrics, shared: a clone is one reference count (every request's record
/// holds one; cloning each of the handles below was 2 % of a saturated gateway's time). Reads
/// as the [`Declared`] metrics it points to.
#[derive(Clone)]
pub struct Metrics(std::sync::Arc<Declared>);

impl std::ops::Deref for Metrics {
    type Target = Declared;

    fn deref(&self) -> &Declared {
        &self.0
    }
}

/// Every metric handle, declared once on one registry.
pub struct Declared {
    registry: Registry,
    /// Each (model, backend, client)'s request series, resolved once.
    series: series::Cache,
    /// The name of every metric family declared, series or not yet.
    families: Vec<String>,
    /// Finished requests by model, backend, client (a configured name or `anonymous`) and
    /// `outcome` (`ok` or an error type).
    pub requests: IntCounterVec,
    /// Requests waiting for a slot, per model.
    pub queue_depth: IntGaugeVec,
    /// Requests holding a slot at a backend (from dispatch until the response body ends).
    pub inflight: IntGaugeVec,
    /// Time from arrival to getting a slot, per model.
    pub queue_wait: HistogramVec,
    /// 1 while a managed backend is ready.
    pub backend_up: IntGaugeVec,
    /// 1 for every configured backend, labelled with its kind (`mlx-lm`, `rapid-mlx`, …): the
    /// dashboard joins it to the per-backend series to name each backend's server.
    pub backend_info: IntGaugeVec,
    /// A managed backend's phase, one-hot: 1 for the `state` it is in (stopped, starting, ready,
    /// draining, restarting, failed), 0 for the others.
    pub backend_state: IntGaugeVec,
    /// Restarts of a managed backend, by reason (`crash`).
    pub backend_restarts: IntCounterVec,
    /// Times the scheduler stopped a GPU backend (`backend`) to start another, by `reason`
    /// (`no_work`, `due`, `max_wait`, `stalled`, `backoff`: the scheduler's `SwapReason`).
    pub backend_swaps: IntCounterVec,
    /// Seconds a managed backend spent starting (spawn to ready, or to a start that failed):
    /// the share of the GPU's time spent loading is its rate summed over the GPU backends.
    pub backend_starting_seconds: CounterVec,
    /// How long a managed backend's process served, from ready to its stop or crash.
    pub backend_residency_seconds: HistogramVec,
    /// Requests of `model` served by its `fallback` model (its backend was not loaded and the
    /// GPU was busy with the fallback's).
    pub model_fallbacks: IntCounterVec,
    /// The bytes a managed backend holds when loaded: its `footprint:`, else the most its
    /// server's process group was measured holding (resident memory).
    pub backend_footprint_bytes: IntGaugeVec,
    /// A backend's health, one-hot (healthy, ejected, half_open), for backends of models of
    /// several backends (the only ones ever ejected).
    pub backend_health: IntGaugeVec,
    /// Ejections of a backend (failed requests or probes in a row, or a failed trial).
    pub backend_ejections: IntCounterVec,
    /// Spawn-to-ready time of a managed backend (warm-up included).
    pub backend_start_seconds: HistogramVec,
    /// Requests of models of several backends, by model, the backend granted and the reason
    /// (`cache_hit`, `cold`, `least_loaded`, `round_robin`, `session`, `only_choice`,
    /// `none_usable`, `rebound`: granted another backend than the one named).
    pub route_decisions: IntCounterVec,
    /// Cached prompt tokens the balancer predicted for the backend that served the request.
    pub route_predicted_cached_tokens: IntCounterVec,
    /// Cached prompt tokens that backend reported for the same requests (answers without a
    /// report are not counted in either).
    pub route_reported_cached_tokens: IntCounterVec,
    /// |predicted − reported| cached tokens, per answer with a report.
    pub route_prediction_error_tokens: HistogramVec,
    /// Prompts the balancer believes a backend's cache holds.
    pub route_index_sequences: IntGaugeVec,
    /// Arrival to the first frame carrying output; `streaming="false"`: to the whole answer.
    pub time_to_first_token: HistogramVec,
    /// Mean time between tokens of one stream (spread-out streams with known tokens only).
    pub inter_token_latency: HistogramVec,
    /// Decode speed of one stream: (tokens − 1) / (last token − first token).
    pub tokens_per_second: HistogramVec,
    /// Arrival to the last byte, of every request `requests` counts (refusals too), by model,
    /// backend and `outcome` (the same label values).
    pub request_duration: HistogramVec,
    /// Prompt tokens from the backend's usage, by model, backend and client.
    pub prompt_tokens: IntCounterVec,
    /// Prompt tokens served from the backend's prompt cache (`usage.prompt_tokens_details.
    /// cached_tokens` as it reports them), by model and backend; no series for a backend that
    /// does not report them.
    pub prompt_cached_tokens: IntCounterVec,
    /// From the backend's usage, never from the frame count (by model, backend and client).
    pub generation_tokens: IntCounterVec,
    /// Answers whose generated token count is unknown (no usage, no tokenizer).
    pub generation_tokens_unknown: IntCounterVec,
    /// Streams whose tokens mostly arrived in one read (no decode-speed sample taken).
    pub stream_bursts: IntCounterVec,
    /// Streams whose usage disagrees with what they showed.
    pub usage_mismatch: IntCounterVec,
    /// Prompts over their backend's context cap, by the action taken.
    pub context_overflow: IntCounterVec,
    /// Time to count a prompt's tokens (chat template + tokenizer), by model.
    pub prompt_count_seconds: HistogramVec,
    /// Requests refused with 429, by client (a configured name or `anonymous`) and limit
    /// (`rpm`, `tpm`, `concurrency`).
    pub rate_limited: IntCounterVec,
    /// Answers their clients abandoned, waited for and read to their end while they hold their
    /// slot (`hold_abandoned`), by backend.
    pub abandoned_held: IntGaugeVec,
    /// Claude Code's billing-header system blocks dropped from Messages requests (they change
    /// every request and would defeat the backend's prompt cache).
    pub anthropic_billing_blocks_stripped: IntCounter,
}

/// TTFT buckets: 10 ms to 30 min (a 52k-token prefill took 31 minutes on one server).
const TTFT_BUCKETS: [f64; 18] =
    [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0];
/// Decode speed buckets: 1 to 20000 tokens/s.
const TPS_BUCKETS: [f64; 16] =
    [1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 50.0, 75.0, 100.0, 150.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 20000.0];
/// Inter-token latency buckets: 0.5 ms to 5 s.
const ITL_BUCKETS: [f64; 14] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];

fn histogram(name: &str, help: &str, buckets: &[f64], labels: &[&str]) -> HistogramVec {
    HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets.to_vec()), labels)
        .expect("static metric definition")
}

fn counter(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition")
}

impl Metrics {
    /// Declares every metric on a fresh registry.
    pub fn new() -> Self {
        let registry = Registry::new();
        let mut families = Vec::new();
        let requests = IntCounterVec::new(
            Opts::new("mlxgate_requests_total", "Requests answered, by model, backend, client and outcome."),
            &["model", "backend", "client", "outcome"],
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
        let backend_info = IntGaugeVec::new(
            Opts::new("mlxgate_backend_info", "1 for each configured backend, labelled with the kind of server it is."),
            &["backend", "kind"],
        )
        .expect("static metric definition");
        let backend_state = IntGaugeVec::new(
            Opts::new(
                "mlxgate_backend_state",
                "A managed backend's phase: 1 for the state it is in (stopped, starting, ready, draining, restarting, failed).",
            ),
            &["backend", "state"],
        )
        .expect("static metric definition");
        let backend_restarts = IntCounterVec::new(
            Opts::new("mlxgate_backend_restarts_total", "Restarts of a managed backend, by reason."),
            &["backend", "reason"],
        )
        .expect("static metric definition");
        let backend_swaps = counter(
            "mlxgate_backend_swaps_total",
            "GPU backend swaps (backend: the one stopped for another to start), by reason.",
            &["backend", "reason"],
        );
        let backend_starting_seconds = CounterVec::new(
            Opts::new(
                "mlxgate_backend_starting_seconds_total",
                "Seconds a managed backend spent starting (spawn to ready, or to a failed start).",
            ),
            &["backend"],
        )
        .expect("static metric definition");
        let backend_residency_seconds = histogram(
            "mlxgate_backend_residency_seconds",
            "How long a managed backend's process served, from ready to its stop or crash.",
            &[1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 14400.0],
            &["backend"],
        );
        let model_fallbacks = counter(
            "mlxgate_model_fallbacks_total",
            "Requests of a model served by its fallback model instead of swapping its backend in.",
            &["model", "fallback"],
        );
        let backend_footprint_bytes = IntGaugeVec::new(
            Opts::new(
                "mlxgate_backend_footprint_bytes",
                "The memory a managed backend holds when loaded: its footprint, else the most measured.",
            ),
            &["backend"],
        )
        .expect("static metric definition");
        let backend_health = IntGaugeVec::new(
            Opts::new(
                "mlxgate_backend_health",
                "A backend's health, for backends of models of several: 1 for the state it is in (healthy, ejected, half_open).",
            ),
            &["backend", "state"],
        )
        .expect("static metric definition");
        let backend_ejections = IntCounterVec::new(
            Opts::new(
                "mlxgate_backend_ejections_total",
                "Times a backend was taken out of its models' choice (failed requests or probes in a row, or a failed trial).",
            ),
            &["backend"],
        )
        .expect("static metric definition");
        let backend_start_seconds = HistogramVec::new(
            HistogramOpts::new("mlxgate_backend_start_seconds", "Time from spawn to ready, warm-up included.")
                .buckets(vec![0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0]),
            &["backend"],
        )
        .expect("static metric definition");
        let mb = ["model", "backend"];
        let route_decisions = counter(
            "mlxgate_route_decisions_total",
            "Requests of models of several backends, by the backend that got them and why (rebound: not the one the balancer named).",
            &["model", "backend", "reason"],
        );
        let route_predicted_cached_tokens = counter(
            "mlxgate_route_predicted_cached_tokens_total",
            "Cached prompt tokens the balancer predicted for the backend that served the request (answers with a report).",
            &mb,
        );
        let route_reported_cached_tokens = counter(
            "mlxgate_route_reported_cached_tokens_total",
            "Cached prompt tokens the serving backend reported, for the answers counted in the predicted total.",
            &mb,
        );
        let route_prediction_error_tokens = histogram(
            "mlxgate_route_prediction_error_tokens",
            "Per answer: |predicted - reported| cached prompt tokens.",
            &[0.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0],
            &mb,
        );
        let route_index_sequences = IntGaugeVec::new(
            Opts::new("mlxgate_route_index_sequences", "Prompts the balancer believes a backend's prompt cache holds."),
            &mb,
        )
        .expect("static metric definition");
        let time_to_first_token = histogram(
            "mlxgate_time_to_first_token_seconds",
            "Arrival to the first frame with generated output (streaming=\"false\": to the whole answer).",
            &TTFT_BUCKETS,
            &["model", "backend", "streaming"],
        );
        let inter_token_latency = histogram(
            "mlxgate_inter_token_latency_seconds",
            "Mean time between tokens of a stream.",
            &ITL_BUCKETS,
            &mb,
        );
        let tokens_per_second = histogram(
            "mlxgate_generation_tokens_per_second",
            "Decode speed of a stream: (tokens - 1) / (last token - first token).",
            &TPS_BUCKETS,
            &mb,
        );
        let request_duration = histogram(
            "mlxgate_request_duration_seconds",
            "Arrival to the last byte, by outcome (refusals included).",
            &TTFT_BUCKETS,
            &["model", "backend", "outcome"],
        );
        let mbc = ["model", "backend", "client"];
        let prompt_tokens = counter("mlxgate_prompt_tokens_total", "Prompt tokens, from the backend's usage.", &mbc);
        let prompt_cached_tokens = counter(
            "mlxgate_prompt_cached_tokens_total",
            "Prompt tokens served from the backend's prompt cache: usage.prompt_tokens_details.cached_tokens \
             as the backend reports it (absent when it does not).",
            &mb,
        );
        let generation_tokens =
            counter("mlxgate_generation_tokens_total", "Generated tokens, from the backend's usage.", &mbc);
        let generation_tokens_unknown = counter(
            "mlxgate_generation_tokens_unknown_total",
            "Answers whose generated token count is unknown (the backend sent no usage).",
            &mbc,
        );
        let stream_bursts = counter(
            "mlxgate_stream_bursts_total",
            "Streams whose tokens mostly arrived in one read (no decode-speed sample).",
            &["backend"],
        );
        let usage_mismatch = counter(
            "mlxgate_usage_mismatch_total",
            "Streams whose usage disagrees with the output frames they carried.",
            &["backend"],
        );
        let context_overflow = counter(
            "mlxgate_context_overflow_total",
            "Prompts over their backend's context cap, by action (reject, middle_out, chunk).",
            &["model", "action"],
        );
        let prompt_count_seconds = histogram(
            "mlxgate_prompt_count_seconds",
            "Time to count a prompt's tokens with the model's tokenizer and chat template.",
            &[0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0],
            &["model"],
        );
        let rate_limited = counter(
            "mlxgate_rate_limited_total",
            "Requests refused with 429 by a client's rate limit, by client and limit (rpm, tpm, concurrency).",
            &["client", "limit"],
        );
        let abandoned_held = IntGaugeVec::new(
            Opts::new(
                "mlxgate_abandoned_streams_held",
                "Answers their clients abandoned, read to their end while they hold their slot (hold_abandoned).",
            ),
            &["backend"],
        )
        .expect("static metric definition");
        let anthropic_billing_blocks_stripped = IntCounter::new(
            "mlxgate_anthropic_billing_blocks_stripped_total",
            "Claude Code billing-header system blocks (x-anthropic-billing-header) dropped from Messages requests.",
        )
        .expect("static metric definition");
        for collector in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(queue_depth.clone()),
            Box::new(inflight.clone()),
            Box::new(queue_wait.clone()),
            Box::new(backend_up.clone()),
            Box::new(backend_info.clone()),
            Box::new(backend_state.clone()),
            Box::new(backend_restarts.clone()),
            Box::new(backend_swaps.clone()),
            Box::new(backend_starting_seconds.clone()),
            Box::new(backend_residency_seconds.clone()),
            Box::new(backend_footprint_bytes.clone()),
            Box::new(model_fallbacks.clone()),
            Box::new(backend_health.clone()),
            Box::new(backend_ejections.clone()),
            Box::new(backend_start_seconds.clone()),
            Box::new(route_decisions.clone()),
            Box::new(route_predicted_cached_tokens.clone()),
            Box::new(route_reported_cached_tokens.clone()),
            Box::new(route_prediction_error_tokens.clone()),
            Box::new(route_index_sequences.clone()),
            Box::new(time_to_first_token.clone()),
            Box::new(inter_token_latency.clone()),
            Box::new(tokens_per_second.clone()),
            Box::new(request_duration.clone()),
            Box::new(prompt_tokens.clone()),
            Box::new(prompt_cached_tokens.clone()),
            Box::new(generation_tokens.clone()),
            Box::new(generation_tokens_unknown.clone()),
            Box::new(stream_bursts.clone()),
            Box::new(usage_mismatch.clone()),
            Box::new(context_overflow.clone()),
            Box::new(prompt_count_seconds.clone()),
            Box::new(rate_limited.clone()),
            Box::new(abandoned_held.clone()),
            Box::new(anthropic_billing_blocks_stripped.clone()),
        ] {
            families.extend(collector.desc().iter().map(|d| d.fq_name.clone()));
            registry.register(collector).expect("metric names are unique");
        }
        Metrics(std::sync::Arc::new(Declared {
            series: series::Cache::default(),
            registry,
            families,
            requests,
            queue_depth,
            inflight,
            queue_wait,
            backend_up,
            backend_info,
            backend_state,
            backend_restarts,
            backend_swaps,
            backend_starting_seconds,
            backend_residency_seconds,
            backend_footprint_bytes,
            model_fallbacks,
            backend_health,
            backend_ejections,
            backend_start_seconds,
            route_decisions,
            route_predicted_cached_tokens,
            route_reported_cached_tokens,
            route_prediction_error_tokens,
            route_index_sequences,
            time_to_first_token,
            inter_token_latency,
            tokens_per_second,
            request_duration,
            prompt_tokens,
            prompt_cached_tokens,
            generation_tokens,
            generation_tokens_unknown,
            stream_bursts,
            usage_mismatch,
            context_overflow,
            prompt_count_seconds,
            rate_limited,
            abandoned_held,
            anthropic_billing_blocks_stripped,
        }))
    }
}

impl Declared {
    /// The series a finished request of `model`, `backend` and `client` records into.
    pub fn request_series(&self, model: &str, backend: &str, client: &str) -> std::sync::Arc<series::RequestSeries> {
        self.series.get(model, backend, client)
    }

    /// The name of every metric family the gateway declares (a family appears in `/metrics`
    /// from its first series on), for the dashboards' check that every name they use exists.
    pub fn family_names(&self) -> &[String] {
        &self.families
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
