//! What became of a request, recorded exactly once and in this one place: ok, client_closed,
//! stream_error, backend_rejected, or a `GatewayError`.
//!
//! A [`RequestRecord`] is made when a request arrives. It learns the model and backend once
//! the request is routed, travels with the request (into the response body for streams), and is
//! finished with one [`Outcome`]. A record dropped before it was finished — the client went away
//! while the request waited, was sent, or streamed — counts as `client_closed`. Nothing else
//! touches `mlxgate_requests_total`.
//!
//! The record also carries the client's rate-limit [`Admission`] (charged before the queue), so
//! that the charge is settled where the request ends, exactly once: finished with the backend's
//! [`Usage`] (an answer, whole or streamed, or cut by the client), it is corrected to what was
//! used; finished without (refused before any backend saw it: queue full, shutdown, a client
//! gone while it waited), it is cancelled and costs nothing.
//!
//! The record names the client (its configured name, or `anonymous`) for the `client` label:
//! a request refused before its key identified anyone (401) is `anonymous`, never the key's
//! text. The backend requests a map-reduce makes for one client request (its map pieces) are
//! records of their own for the metrics, made with [`RequestRecord::piece`]; what they used is
//! added to the client's request with [`RequestRecord::add_pieces_used`], so that its one
//! admission is settled to the pieces' usage plus the reduce's (or, when no reduce answered, to
//! the pieces' alone).
//!
//! Finishing the record is also where every metric of the finished request is recorded, once,
//! for every request `mlxgate_requests_total` counts — refusals included: its duration
//! (`mlxgate_request_duration_seconds`, by model, backend and outcome), and for an answer the
//! [`Measured`] figures its stream meter or its whole-answer reading handed over (time to first
//! token, tokens, decode speed, bursts, usage mismatch). No other module records them.
//!
//! Finishing the record also writes the request's one access-log line (`access_log.rs`): the
//! record carries the line's fields, filled on the way (status at the headers, queue wait,
//! time to first token, tokens). A record the access layer made for a request that no API
//! handler takes (`/health`, `/ready`, `/metrics`, `/admin/*`, `/v1/models`) writes its line
//! but is not counted in `mlxgate_requests_total`, which counts API requests only. An API
//! request's summary (and, for a model with `capture: true`, its body) goes beside its line into
//! the gateway's [`Activity`] rings, the `/ui` page's activity feed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::HeaderMap;

use crate::activity::{Activity, Capture, RequestSummary};

use crate::access_log::{self, AccessLine, Ending, Face, RequestId};
use crate::config::ANONYMOUS;
use crate::error::GatewayError;
use crate::limits::Admission;
use crate::metrics::Metrics;
use crate::metrics::series::RequestSeries;

/// How a request ended, as the `outcome` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The backend answered and the answer reached its end.
    Ok,
    /// The client went away first.
    ClientClosed,
    /// The stream carried an `{"error": …}` event (whatever `finish_reason` followed).
    StreamError,
    /// The backend refused the request (a 4xx of its own).
    BackendRejected,
    /// The gateway's own failure, by its error type (`backend_error`, `backend_timeout`,
    /// `server_overloaded`, `invalid_request_error`).
    Failed(&'static str),
}

impl Outcome {
    /// The `outcome` label.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ClientClosed => "client_closed",
            Outcome::StreamError => "stream_error",
            Outcome::BackendRejected => "backend_rejected",
            Outcome::Failed(kind) => kind,
        }
    }
}

impl From<&GatewayError> for Outcome {
    /// The error's type, except a 429: its OpenAI types (`requests`, `tokens`) would read as
    /// something else among outcomes; it is `rate_limited` (the limit is in
    /// `mlxgate_rate_limited_total`).
    fn from(e: &GatewayError) -> Self {
        match e {
            GatewayError::RateLimited(_) => Outcome::Failed("rate_limited"),
            _ => Outcome::Failed(e.error_type()),
        }
    }
}

/// What a backend's answer used, for the client's token limit (`None`: not told).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// The backend's `usage.prompt_tokens`.
    pub prompt_tokens: Option<u64>,
    /// Tokens generated: the backend's `usage.completion_tokens`, or for a stream cut before its
    /// usage, what it showed of them.
    pub generated_tokens: Option<u64>,
}

impl Usage {
    /// Prompt and generated tokens together (what the token limit is charged).
    fn total(self) -> u64 {
        self.prompt_tokens.unwrap_or(0).saturating_add(self.generated_tokens.unwrap_or(0))
    }
}

/// What an answer showed, handed to its record to be recorded with its outcome: made of the
/// stream meter's figures, or of a whole answer's usage (`stream::figures`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Measured {
    /// When the first generated token reached the gateway: a stream's first output frame, a
    /// whole answer's end; `None`: no time to first token (none came, or nothing is timed).
    pub first_token: Option<Instant>,
    /// The answer was streamed (the `streaming` label of the time to first token).
    pub streaming: bool,
    /// The backend's `usage`, as it reported it.
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// A generation endpoint's answer: a generated count the backend did not report is counted
    /// as unknown (embeddings generate nothing: no count is missing).
    pub generates: bool,
    /// Decode speed, for a spread-out stream with known tokens only.
    pub decode_tokens_per_second: Option<f64>,
    /// Most of the stream's tokens came in one read.
    pub burst: bool,
    /// The stream's usage disagrees with what it showed.
    pub usage_mismatch: bool,
    /// What the client's token limit is settled to.
    pub used: Usage,
}

/// Told what the answer of a request showed, once, when its record is finished with one (the
/// balancer of a model of several backends learns from it); the `Duration` is the time from
/// the request's arrival to its first token, when there was one.
pub type AnswerHook = Box<dyn FnOnce(&Measured, Option<Duration>) + Send + Sync>;

/// The one record of a request ([`Record`]), boxed: it goes through every step of the pipeline
/// and into its response's body, and its 800 bytes copied at each move (and kept twice in each
/// step's future) cost more than its one allocation. Finished once: by [`finish`](Self::finish),
/// [`finish_answered`](Self::finish_answered), or as `client_closed` when dropped unfinished.
pub struct RequestRecord(Box<Record>);

impl std::ops::Deref for RequestRecord {
    type Target = Record;

    fn deref(&self) -> &Record {
        &self.0
    }
}

impl std::ops::DerefMut for RequestRecord {
    fn deref_mut(&mut self) -> &mut Record {
        &mut self.0
    }
}

/// What a request's record holds. Labels hold configured names only: before a request is
/// routed (bad JSON, unknown model, unknown path) model and backend are empty, never the
/// client's text; before its key identified a client (and with auth off) the client is
/// `anonymous`.
pub struct Record {
    metrics: Metrics,
    pub model: String,
    /// The name the client asked for when it was an alias of `model` (`aliases:`): the answer
    /// carries it, the labels `model`.
    pub alias: Option<String>,
    pub backend: String,
    /// The configured client name, or `anonymous`.
    pub client: String,
    /// The conversation the request belongs to, when the client names it (the Responses API's
    /// `prompt_cache_key`: Codex's session id), for routing a conversation to the backend that
    /// holds its prompt cache.
    pub conversation: Option<String>,
    /// The client's address, when the request came over a connection (the fair queue's key for
    /// a client that sends no key to a gateway without auth).
    pub peer: Option<std::net::IpAddr>,
    /// When the gateway received the request.
    pub arrived: Instant,
    finished: bool,
    /// The client's rate-limit charge, settled or cancelled when the record is finished.
    admission: Option<Admission>,
    /// The admission's `x-ratelimit-*` headers (kept when the admission moves on with `take`).
    rate_limit_headers: HeaderMap,
    /// Tokens used by the request's map pieces (prompt + generated), added to its settlement.
    /// Atomic: the pieces run at once and each adds its own.
    pieces_used: AtomicU64,
    /// Set once the request is handed to a backend: from then on it costs backend time, and a
    /// client that leaves before the answer is charged its prompt, not refunded.
    sent: Arc<AtomicBool>,
    /// The estimate of the prompt last sent (a map-reduce's reduce), charged for it when the
    /// backend does not tell its count; `None`: the up-front charge stands.
    prompt_estimate: Option<u64>,
    /// The request's access-log line, written when the record is finished.
    access: AccessLine,
    /// Counted in `mlxgate_requests_total` (an API request, as opposed to an operator one).
    metered: bool,
    /// Told the answer's figures when the record is finished with one.
    on_answer: Option<AnswerHook>,
    /// Where its summary goes when it is finished (an API request the access layer saw).
    activity: Option<Arc<Activity>>,
    /// Its body, kept for the activity's details (a model with `capture: true`).
    capture: Option<Capture>,
}

impl RequestRecord {
    /// A record for a request that arrived just now, not yet routed.
    pub fn new(metrics: Metrics) -> Self {
        RequestRecord::with_line(metrics, AccessLine::none(), true)
    }

    /// The record of a request as it arrives at the router, with its access-log `line`. It is
    /// not counted in `mlxgate_requests_total` until an API handler takes it
    /// ([`metered`](Self::metered)). An API request's summary goes to `activity` when it is
    /// finished.
    pub fn at_arrival(metrics: Metrics, line: AccessLine, activity: Option<Arc<Activity>>) -> Self {
        let mut record = RequestRecord::with_line(metrics, line, false);
        record.activity = activity;
        record
    }

    fn with_line(metrics: Metrics, access: AccessLine, metered: bool) -> Self {
        RequestRecord(Box::new(Record {
            metrics,
            model: String::new(),
            alias: None,
            backend: String::new(),
            client: ANONYMOUS.to_string(),
            conversation: None,
            peer: None,
            arrived: Instant::now(),
            finished: false,
            admission: None,
            rate_limit_headers: HeaderMap::new(),
            pieces_used: AtomicU64::new(0),
            sent: Arc::default(),
            prompt_estimate: None,
            access,
            metered,
            on_answer: None,
            activity: None,
            capture: None,
        }))
    }

    /// Counts the request in `mlxgate_requests_total` when it is finished (an API request).
    pub fn metered(&mut self) {
        self.metered = true;
    }

    /// The request's id (`x-request-id`).
    pub fn request_id(&self) -> &RequestId {
        &self.access.id
    }

    /// Sets the API face the request spoke (the Responses API's handler, say, over the chat
    /// pipeline).
    pub fn set_face(&mut self, face: Face) {
        self.access.face = face;
    }

    /// The status of the response's headers (the first one given stays: a stream's headers
    /// go out before its end is known).
    pub fn responded(&mut self, status: u16) {
        self.access.responded(status);
    }

    /// The model name the client asked for, logged when it names no configured model.
    pub fn asked(&mut self, model: &str) {
        self.access.asked(model);
    }

    /// Keeps the request's body (bounded) for the activity's details.
    pub fn capture(&mut self, body: &[u8]) {
        self.capture = Some(Capture::of(body));
    }

    /// What the gateway did to fit the prompt (the answer's `x-mlxgate-transform`).
    pub fn transformed(&mut self, transform: Option<&str>) {
        self.access.transform = transform.map(Into::into);
    }

    /// The time the request waited for slots.
    pub fn queued(&mut self, wait: std::time::Duration) {
        self.access.queue_wait = Some(wait);
    }

    /// Names the client the request's key identified (a configured name, or `anonymous`).
    pub fn identified(&mut self, client: &str) {
        self.client = client.to_string();
    }

    /// A record for one backend request made on this request's behalf (a map piece): same
    /// model, backend and client, arriving now, with no admission of its own (the client's
    /// request holds it; the piece's usage goes there with
    /// [`add_pieces_used`](Self::add_pieces_used)).
    pub fn piece(&self) -> RequestRecord {
        let mut piece = RequestRecord::with_line(self.metrics.clone(), self.access.piece(), true);
        piece.routed(&self.model, &self.backend);
        piece.identified(&self.client);
        piece
    }

    /// The estimated prompt tokens of the request as it is finally sent (a map-reduce's
    /// reduce, not the client's document that the up-front charge estimated), charged when the
    /// backend does not tell its count.
    pub fn reestimated(&mut self, prompt_tokens: u64) {
        self.prompt_estimate = Some(prompt_tokens);
    }

    /// The flag the dispatcher sets when it hands the request (or one of its pieces) to a
    /// backend.
    pub fn sent_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.sent)
    }

    /// Adds what one of the request's map pieces used, to be settled with the request.
    pub fn add_pieces_used(&self, used: Usage) {
        self.pieces_used.fetch_add(used.total(), Ordering::Relaxed);
    }

    /// Holds the client's admission until the request ends.
    pub fn admitted(&mut self, admission: Admission) {
        self.rate_limit_headers = admission.headers().clone();
        self.admission = Some(admission);
    }

    /// The `x-ratelimit-*` headers for the client's response (empty when it has no limits).
    pub fn rate_limit_headers(&self) -> &HeaderMap {
        &self.rate_limit_headers
    }

    /// Names the configured model and backend the request was routed to.
    pub fn routed(&mut self, model: &str, backend: &str) {
        self.model = model.to_string();
        self.backend = backend.to_string();
    }

    /// Names the backend that answered, when the model has several (the one routed to until
    /// then is its first).
    pub fn served_by(&mut self, backend: &str) {
        if self.backend != backend {
            self.backend = backend.to_string();
        }
    }

    /// Why a model of several backends was routed to the backend that answered, and the
    /// cached tokens its balancer predicted there (for the access line).
    pub fn route_decided(&mut self, reason: &'static str, predicted_cached_tokens: u64) {
        self.access.route = Some((reason, predicted_cached_tokens));
    }

    /// Sets who is told the answer's figures when the record is finished with one.
    pub fn on_answer(&mut self, hook: AnswerHook) {
        self.on_answer = Some(hook);
    }

    /// Notes that the request's model, `from`, fell back to the model it is now routed to
    /// (logged as `fallback_from=`; counted in `mlxgate_model_fallbacks_total`). The answer
    /// still carries the name the client asked for, `asked` (as an alias's does): the
    /// `x-mlxgate-fallback` header names the model that answered.
    pub fn fell_back(&mut self, from: &str, asked: &str) {
        self.metrics.model_fallbacks.with_label_values(&[from, &self.model]).inc();
        self.access.fallback_from = Some(from.into());
        self.alias = Some(asked.to_string());
    }

    /// The model the request's own model fell back from, if it did.
    pub fn fallback_from(&self) -> Option<&str> {
        self.access.fallback_from.as_deref()
    }

    /// Notes that the client asked for `model` by an alias, `asked` (logged as `alias=`).
    pub fn aliased(&mut self, asked: &str) {
        self.alias = Some(asked.to_string());
        self.access.aliased(asked);
    }

    /// The model name the answer carries: the one the client asked for (an alias), else the
    /// configured model's.
    pub fn public_model(&self) -> &str {
        self.alias.as_deref().unwrap_or(&self.model)
    }

    /// The metrics the record writes to (for the figures recorded beside the outcome).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Moves the record out (to a task that finishes it), leaving a spent one in its place.
    pub fn take(&mut self) -> RequestRecord {
        let taken = RequestRecord(Box::new(Record {
            metrics: self.metrics.clone(),
            model: self.model.clone(),
            alias: self.alias.clone(),
            backend: self.backend.clone(),
            client: self.client.clone(),
            conversation: self.conversation.clone(),
            peer: self.peer,
            arrived: self.arrived,
            finished: self.finished,
            admission: self.admission.take(),
            rate_limit_headers: self.rate_limit_headers.clone(),
            pieces_used: AtomicU64::new(self.pieces_used.swap(0, Ordering::Relaxed)),
            sent: Arc::clone(&self.sent),
            prompt_estimate: self.prompt_estimate,
            access: std::mem::replace(&mut self.access, AccessLine::none()),
            metered: self.metered,
            on_answer: self.on_answer.take(),
            activity: self.activity.take(),
            capture: self.capture.take(),
        }));
        self.finished = true;
        taken
    }

    /// Records `outcome` of a request no backend answered (a refusal, a failure before any
    /// answer) with its duration: its rate-limit charge is given back, except what its map
    /// pieces used (they were answered). The record is spent.
    pub fn finish(mut self, outcome: Outcome) {
        self.count(outcome, None);
    }

    /// Records `outcome` of a request a backend answered, with what its answer showed
    /// (`measured`), and settles the client's token charge to what the answer used plus what
    /// its map pieces used (a prompt count not told is the prompt's estimate: the up-front
    /// charge, or a reduce's own). The record is spent.
    pub fn finish_answered(mut self, outcome: Outcome, measured: &Measured) {
        if let Some(hook) = self.on_answer.take() {
            hook(measured, measured.first_token.map(|first| first.duration_since(self.arrived)));
        }
        let used = measured.used;
        // A client without a token limit has nothing to settle: no task is spawned for it.
        if let Some(mut admission) = self.admission.take().filter(Admission::settles_tokens) {
            admission.leave();
            let estimate = self.prompt_estimate.unwrap_or_else(|| admission.tokens_charged());
            let prompt = used.prompt_tokens.unwrap_or(estimate);
            let generated = used.generated_tokens.unwrap_or(0);
            let pieces = self.pieces_used.load(Ordering::Relaxed);
            spawn_charge(async move { admission.settle(prompt.saturating_add(pieces), generated).await });
        }
        self.count(outcome, Some(measured));
    }

    /// Ends the record, once: the answer's figures (`measured`) and the request's duration
    /// recorded, the request counted, its access line written.
    fn count(&mut self, outcome: Outcome, measured: Option<&Measured>) {
        if let Some(mut admission) = self.admission.take() {
            admission.leave();
            let pieces = self.pieces_used.load(Ordering::Relaxed);
            // A task is spawned only when the store has something to change.
            if self.sent.load(Ordering::SeqCst) {
                // A backend has it (the client left before the answer, or the answer broke):
                // the prompt was charged up front and stays charged.
                let prompt = self.prompt_estimate.unwrap_or_else(|| admission.tokens_charged());
                if admission.settles_tokens() {
                    spawn_charge(async move { admission.settle(prompt.saturating_add(pieces), 0).await });
                }
            } else {
                match pieces {
                    0 if admission.refunds_anything() => spawn_charge(admission.cancel()),
                    0 => {}
                    pieces if admission.settles_tokens() => {
                        spawn_charge(async move { admission.settle(pieces, 0).await });
                    }
                    _ => {}
                }
            }
        }
        if !self.finished {
            self.finished = true;
            let duration = self.arrived.elapsed();
            if let Some(measured) = measured {
                self.access.ttft = measured.first_token.map(|first| first.duration_since(self.arrived));
                self.access.prompt_tokens = measured.prompt_tokens;
                self.access.cached_tokens = measured.cached_tokens;
                self.access.completion_tokens = measured.completion_tokens;
            }
            if self.metered {
                self.record(outcome, measured, duration);
            }
            let end = Ending {
                model: &self.model,
                backend: &self.backend,
                client: &self.client,
                outcome: outcome.label(),
                duration,
            };
            access_log::write(&self.access, &end);
            if let Some(activity) = self.activity.take().filter(|_| self.metered && !self.access.piece) {
                let summary = self.summary(outcome, measured, duration);
                activity.finished(summary, self.capture.take());
            }
        }
    }

    /// The finished request's summary for the activity feed (its names moved out: the record
    /// is spent).
    fn summary(&mut self, outcome: Outcome, measured: Option<&Measured>, duration: Duration) -> RequestSummary {
        // The fields themselves (not through `Deref`): several are borrowed at once.
        let this = &mut *self.0;
        let ms = |d: Duration| (d.as_secs_f64() * 10_000.0).round() / 10.0;
        let line = &mut this.access;
        let at = crate::activity::now_ms();
        RequestSummary {
            seq: 0,
            id: crate::activity::Id(line.id.header_value()),
            at,
            started: at.saturating_sub(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)),
            client: std::mem::take(&mut this.client),
            // A request routed nowhere (404): the name it asked for, as its access line says.
            model: match std::mem::take(&mut this.model) {
                model if model.is_empty() => line.asked_model.as_deref().unwrap_or_default().to_owned(),
                model => model,
            },
            alias: line.alias.take(),
            fallback_from: line.fallback_from.take(),
            backend: std::mem::take(&mut this.backend),
            face: line.face.as_str(),
            method: line.method.clone(),
            path: std::mem::take(&mut line.path),
            status: line.status.unwrap_or(499),
            outcome: outcome.label(),
            streaming: measured.is_some_and(|m| m.streaming),
            queue_ms: line.queue_wait.map(ms),
            ttft_ms: line.ttft.map(ms),
            decode_tps: measured.and_then(|m| m.decode_tokens_per_second).map(|t| (t * 10.0).round() / 10.0),
            burst: measured.is_some_and(|m| m.burst),
            prompt_tokens: line.prompt_tokens,
            cached_tokens: line.cached_tokens,
            completion_tokens: line.completion_tokens,
            transform: line.transform.take(),
            route: line.route.map(|(reason, _)| reason),
            predicted_cached_tokens: line.route.map(|(_, tokens)| tokens),
            duration_ms: ms(duration),
            captured: this.capture.is_some(),
        }
    }
}

impl RequestRecord {
    /// Records the metrics of the finished request: what its answer showed, if it had one,
    /// its duration, and the request itself.
    fn record(&self, outcome: Outcome, measured: Option<&Measured>, duration: Duration) {
        let m = &self.metrics;
        let series = m.request_series(&self.model, &self.backend, &self.client);
        if let Some(measured) = measured {
            record_answer(m, &series, self.arrived, measured);
        }
        series.finished(m, outcome.label(), duration.as_secs_f64());
    }
}

/// The metrics of an answer (`labels`: model, backend, client): time to first token from
/// `arrived`, the backend's token counts — or that the generated count is unknown; a reported
/// cache count of 0 still makes its series (a backend that reports misses shows a hit ratio of
/// 0, not no data) —, and for a stream its burst, decode speed and usage mismatch.
fn record_answer(m: &Metrics, series: &RequestSeries, arrived: Instant, measured: &Measured) {
    if let Some(first) = measured.first_token {
        let ttft = first.duration_since(arrived).as_secs_f64();
        series.time_to_first_token(m, measured.streaming).observe(ttft);
    }
    if let Some(prompt) = measured.prompt_tokens {
        series.prompt_tokens(m).inc_by(prompt);
    }
    if let Some(cached) = measured.cached_tokens {
        series.prompt_cached_tokens(m).inc_by(cached);
    }
    match measured.completion_tokens {
        Some(generated) => series.generation_tokens(m).inc_by(generated),
        None if measured.generates => series.generation_tokens_unknown(m).inc(),
        None => {}
    }
    if measured.burst {
        series.stream_bursts(m).inc();
    }
    if let Some(tps) = measured.decode_tokens_per_second {
        series.tokens_per_second(m).observe(tps);
        series.inter_token_latency(m).observe(1.0 / tps);
    }
    if measured.usage_mismatch {
        series.usage_mismatch(m).inc();
    }
}

/// Runs a settlement or a refund on its own (a shared store may take a round trip; the
/// response does not wait for it). The client has left its requests in flight before it.
fn spawn_charge(charge: impl std::future::Future<Output = ()> + Send + 'static) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(charge);
        }
        // Only at the very end of the process: the charge no longer matters.
        Err(_) => tracing::debug!("no runtime left to settle a rate-limit charge"),
    }
}

impl Drop for RequestRecord {
    fn drop(&mut self) {
        self.count(Outcome::ClientClosed, None);
    }
}

#[cfg(test)]
mod tests {
    use prometheus::core::Collector;

    use super::*;

    fn count(m: &Metrics, model: &str, backend: &str, outcome: &str) -> u64 {
        m.requests.with_label_values(&[model, backend, "anonymous", outcome]).get()
    }

    #[test]
    fn a_request_is_counted_once_and_a_dropped_one_as_client_closed() {
        let m = Metrics::new();
        let mut r = RequestRecord::new(m.clone());
        r.routed("qwen", "native");
        r.finish(Outcome::StreamError);
        assert_eq!(count(&m, "qwen", "native", "stream_error"), 1);
        assert_eq!(count(&m, "qwen", "native", "client_closed"), 0);

        let mut r = RequestRecord::new(m.clone());
        r.routed("qwen", "native");
        drop(r);
        assert_eq!(count(&m, "qwen", "native", "client_closed"), 1);

        RequestRecord::new(m.clone()).finish(Outcome::from(&GatewayError::ModelNotFound("gpt-9".into())));
        assert_eq!(count(&m, "", "", "invalid_request_error"), 1, "unrouted: no client text in labels");
    }

    fn timed(m: &Metrics, model: &str, backend: &str, outcome: &str) -> u64 {
        m.request_duration.with_label_values(&[model, backend, outcome]).get_sample_count()
    }

    #[test]
    fn every_counted_request_records_its_duration_refusals_included() {
        let m = Metrics::new();
        // Refused before it was routed (an unknown model, bad JSON, a wrong key).
        RequestRecord::new(m.clone()).finish(Outcome::from(&GatewayError::ModelNotFound("gpt-9".into())));
        assert_eq!(timed(&m, "", "", "invalid_request_error"), 1, "unrouted: empty labels");
        // Refused once routed (its queue full), and gone while it waited.
        let mut r = RequestRecord::new(m.clone());
        r.routed("qwen", "native");
        r.finish(Outcome::Failed("server_overloaded"));
        let mut r = RequestRecord::new(m.clone());
        r.routed("qwen", "native");
        drop(r);
        assert_eq!(timed(&m, "qwen", "native", "server_overloaded"), 1);
        assert_eq!(timed(&m, "qwen", "native", "client_closed"), 1);
        // An answer: its duration, and what it showed.
        let mut r = RequestRecord::new(m.clone());
        r.routed("qwen", "native");
        let shown = Measured {
            first_token: Some(Instant::now()),
            streaming: true,
            completion_tokens: Some(3),
            generates: true,
            ..Measured::default()
        };
        r.finish_answered(Outcome::Ok, &shown);
        assert_eq!(timed(&m, "qwen", "native", "ok"), 1);
        assert_eq!(m.time_to_first_token.with_label_values(&["qwen", "native", "true"]).get_sample_count(), 1);
        assert_eq!(m.generation_tokens.with_label_values(&["qwen", "native", "anonymous"]).get(), 3);
        // Each request once: as many durations as requests counted.
        let counted: u64 =
            m.requests.collect()[0].get_metric().iter().map(|s| s.get_counter().get_value() as u64).sum();
        let durations: u64 =
            m.request_duration.collect()[0].get_metric().iter().map(|s| s.get_histogram().get_sample_count()).sum();
        assert_eq!((counted, durations), (4, 4));
        // An operator request (`/health`) is neither counted nor timed.
        RequestRecord::at_arrival(m.clone(), AccessLine::none(), None).finish(Outcome::Ok);
        assert_eq!(timed(&m, "", "", "ok"), 0);
    }
}

#[cfg(test)]
mod access_tests {
    use http::Method;

    use super::*;

    fn ok(m: &Metrics) -> u64 {
        m.requests.with_label_values(&["", "", "anonymous", "ok"]).get()
    }

    #[test]
    fn an_operator_request_is_not_counted_nor_fed_and_one_an_api_handler_took_is() {
        let m = Metrics::new();
        let activity = Arc::new(Activity::default());
        let line = AccessLine::new(false, RequestId::new(), Method::GET, "/health");
        RequestRecord::at_arrival(m.clone(), line.clone(), Some(Arc::clone(&activity))).finish(Outcome::Ok);
        drop(RequestRecord::at_arrival(m.clone(), line.clone(), Some(Arc::clone(&activity))));
        assert_eq!(ok(&m), 0);
        assert_eq!(m.requests.with_label_values(&["", "", "anonymous", "client_closed"]).get(), 0);
        assert!(activity.recent(10).is_empty(), "operator requests are not the activity");
        let mut taken = RequestRecord::at_arrival(m.clone(), line, Some(Arc::clone(&activity)));
        taken.metered();
        taken.routed("qwen", "local");
        taken.capture(b"{\"messages\": \"the prompt\"}");
        taken.transformed(Some("max_tokens=100"));
        taken.finish(Outcome::Ok);
        assert_eq!(m.requests.with_label_values(&["qwen", "local", "anonymous", "ok"]).get(), 1);
        let recent = activity.recent(10);
        assert_eq!(recent.len(), 1);
        let (summary, capture) = activity.request(recent[0].id.as_str(), None).expect("in the ring");
        assert_eq!((summary.model.as_str(), summary.backend.as_str(), summary.outcome), ("qwen", "local", "ok"));
        assert_eq!(
            (summary.status, summary.transform.as_deref(), summary.captured),
            (499, Some("max_tokens=100"), true)
        );
        assert!(capture.is_some_and(|c| c.body.contains("the prompt")));
    }

    #[test]
    fn a_piece_carries_its_requests_id_and_a_taken_record_leaves_nothing_behind() {
        let m = Metrics::new();
        let activity = Arc::new(Activity::default());
        let id = RequestId::new();
        let mut record = RequestRecord::at_arrival(
            m.clone(),
            AccessLine::new(false, id.clone(), Method::POST, "/v1/chat/completions"),
            Some(Arc::clone(&activity)),
        );
        record.metered();
        record.responded(200);
        let piece = record.piece();
        assert_eq!(piece.request_id(), &id);
        assert!(piece.access.piece && piece.access.status.is_none());
        drop(piece);
        let taken = record.take();
        assert_eq!(taken.request_id(), &id);
        assert_eq!(taken.access.status, Some(200));
        assert!(record.finished && !record.access.enabled, "the spent record writes no line");
        drop(record);
        assert!(activity.recent(10).is_empty(), "pieces and spent records are not fed");
        drop(taken);
        let fed = activity.recent(10);
        assert_eq!((fed.len(), fed[0].id.as_str(), fed[0].outcome), (1, id.as_str(), "client_closed"));
    }
}

#[cfg(test)]
mod charge_tests {
    //! The settlement of a request's admission, on the memory store with a clock that does not
    //! move (no refill between the charge and the reading).

    use std::num::NonZeroU32;
    use std::sync::Arc;

    use super::*;
    use crate::limits::{Limiter, Limits, ManualClock, MemoryStore};

    const TPM: u32 = 1000;

    fn limiter() -> Arc<Limiter> {
        let limiter = Limiter::new(Arc::new(MemoryStore::new(Arc::new(ManualClock::default()))));
        let limits = Limits { tpm: NonZeroU32::new(TPM), ..Limits::default() };
        limiter.configure([("aider".to_owned(), limits)], Limits::default());
        Arc::new(limiter)
    }

    /// A record of `aider`'s holding an admission charged `prompt` tokens up front.
    async fn admitted(limiter: &Limiter, prompt: u64) -> RequestRecord {
        let mut record = RequestRecord::new(Metrics::new());
        record.routed("qwen", "native");
        record.identified("aider");
        record.admitted(limiter.admit("aider", prompt).await.expect("within the limit"));
        record
    }

    /// The tokens left once the spawned settlement has run (read with a free admission).
    async fn settled_to(limiter: &Limiter, left: u64) {
        let mut seen = None;
        for _ in 0..1000 {
            let probe = limiter.admit("aider", 0).await.expect("a free probe");
            seen = probe.headers().get("x-ratelimit-remaining-tokens").and_then(|v| v.to_str().ok()?.parse().ok());
            probe.cancel().await;
            if seen == Some(left) {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the bucket never held {left} tokens: {seen:?}");
    }

    #[tokio::test]
    async fn a_request_is_settled_to_its_pieces_and_its_answer() {
        let limiter = limiter();
        let record = admitted(&limiter, 400).await;
        let piece = record.piece();
        assert_eq!((piece.model.as_str(), piece.backend.as_str(), piece.client.as_str()), ("qwen", "native", "aider"));
        piece.finish(Outcome::Ok);
        record.add_pieces_used(Usage { prompt_tokens: Some(300), generated_tokens: Some(40) });
        record.add_pieces_used(Usage { prompt_tokens: Some(250), generated_tokens: None });
        // The reduce's usage: 60 + 20; with the pieces' 590, 670 in all.
        let used = Usage { prompt_tokens: Some(60), generated_tokens: Some(20) };
        record.finish_answered(Outcome::Ok, &Measured { used, ..Measured::default() });
        settled_to(&limiter, u64::from(TPM) - 670).await;
    }

    #[tokio::test]
    async fn a_request_that_fails_after_its_pieces_is_charged_what_they_used() {
        let limiter = limiter();
        let record = admitted(&limiter, 400).await;
        record.add_pieces_used(Usage { prompt_tokens: Some(300), generated_tokens: Some(40) });
        record.finish(Outcome::Failed("backend_error"));
        settled_to(&limiter, u64::from(TPM) - 340).await;

        // Cut by its client (the record dropped) after its pieces: the same.
        let record = admitted(&limiter, 100).await;
        record.add_pieces_used(Usage { prompt_tokens: Some(10), generated_tokens: Some(5) });
        drop(record);
        settled_to(&limiter, u64::from(TPM) - 340 - 15).await;

        // No piece answered: the charge is given back.
        let record = admitted(&limiter, 100).await;
        record.finish(Outcome::Failed("server_overloaded"));
        settled_to(&limiter, u64::from(TPM) - 355).await;
    }
}
