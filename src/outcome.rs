//! What became of a request, recorded exactly once (DESIGN.md rule 10).
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

use std::time::Instant;

use http::HeaderMap;

use crate::error::GatewayError;
use crate::limits::Admission;
use crate::metrics::Metrics;

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

/// The one record of a request. Labels hold configured names only: before a request is routed
/// (bad JSON, unknown model, unknown path) both are empty, never the client's text.
pub struct RequestRecord {
    metrics: Metrics,
    pub model: String,
    pub backend: String,
    /// When the gateway received the request.
    pub arrived: Instant,
    finished: bool,
    /// The client's rate-limit charge, settled or cancelled when the record is finished.
    admission: Option<Admission>,
    /// The admission's `x-ratelimit-*` headers (kept when the admission moves on with `take`).
    rate_limit_headers: HeaderMap,
}

impl RequestRecord {
    /// A record for a request that arrived just now, not yet routed.
    pub fn new(metrics: Metrics) -> Self {
        RequestRecord {
            metrics,
            model: String::new(),
            backend: String::new(),
            arrived: Instant::now(),
            finished: false,
            admission: None,
            rate_limit_headers: HeaderMap::new(),
        }
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

    /// The metrics the record writes to (for the figures recorded beside the outcome).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Moves the record out (to a task that finishes it), leaving a spent one in its place.
    pub fn take(&mut self) -> RequestRecord {
        let taken = RequestRecord {
            metrics: self.metrics.clone(),
            model: self.model.clone(),
            backend: self.backend.clone(),
            arrived: self.arrived,
            finished: self.finished,
            admission: self.admission.take(),
            rate_limit_headers: self.rate_limit_headers.clone(),
        };
        self.finished = true;
        taken
    }

    /// Records `outcome` of a request no backend answered: its rate-limit charge is given
    /// back. The record is spent.
    pub fn finish(mut self, outcome: Outcome) {
        self.count(outcome);
    }

    /// Records `outcome` of a request a backend answered, and settles the client's token charge
    /// to `used` (a prompt count not told keeps the up-front charge). The record is spent.
    pub fn finish_used(mut self, outcome: Outcome, used: Usage) {
        if let Some(mut admission) = self.admission.take() {
            let prompt = used.prompt_tokens.unwrap_or_else(|| admission.tokens_charged());
            let generated = used.generated_tokens.unwrap_or(0);
            spawn_charge(async move { admission.settle(prompt, generated).await });
        }
        self.count(outcome);
    }

    fn count(&mut self, outcome: Outcome) {
        if let Some(admission) = self.admission.take() {
            spawn_charge(admission.cancel());
        }
        if !self.finished {
            self.finished = true;
            self.metrics.requests.with_label_values(&[&self.model, &self.backend, outcome.label()]).inc();
        }
    }
}

/// Runs a settlement or a refund on its own (a shared store may take a round trip; the
/// response does not wait for it). The admission's concurrency permit goes when it is done.
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
        self.count(Outcome::ClientClosed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(m: &Metrics, model: &str, backend: &str, outcome: &str) -> u64 {
        m.requests.with_label_values(&[model, backend, outcome]).get()
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
}
