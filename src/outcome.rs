//! What became of a request, recorded exactly once (DESIGN.md rule 10).
//!
//! A [`RequestRecord`] is made when a request arrives. It learns the model and backend once
//! the request is routed, travels with the request (into the response body for streams), and is
//! finished with one [`Outcome`]. A record dropped before it was finished — the client went away
//! while the request waited, was sent, or streamed — counts as `client_closed`. Nothing else
//! touches `mlxgate_requests_total`.

use std::time::Instant;

use crate::error::GatewayError;
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
    fn from(e: &GatewayError) -> Self {
        Outcome::Failed(e.error_type())
    }
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
        }
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
        };
        self.finished = true;
        taken
    }

    /// Records `outcome`; the record is spent.
    pub fn finish(mut self, outcome: Outcome) {
        self.count(outcome);
    }

    fn count(&mut self, outcome: Outcome) {
        if !self.finished {
            self.finished = true;
            self.metrics.requests.with_label_values(&[&self.model, &self.backend, outcome.label()]).inc();
        }
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
