//! The series a finished request records into, resolved once per (model, backend, client) and
//! kept: a request's end then costs one lookup here rather than a label lookup (hash, lock,
//! map) per metric. Each series is still made on its first use, so a series appears in
//! `/metrics` exactly when it did before (a counter nobody increments stays absent). Bounded:
//! every label is a configured name (or `anonymous`, or empty for an unrouted request).

use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec};

use super::Declared;

/// The series of one (model, backend, client), each made on first use.
pub struct RequestSeries {
    labels: [Box<str>; 3],
    time_to_first_token: [OnceLock<Histogram>; 2],
    prompt_tokens: OnceLock<IntCounter>,
    prompt_cached_tokens: OnceLock<IntCounter>,
    generation_tokens: OnceLock<IntCounter>,
    generation_tokens_unknown: OnceLock<IntCounter>,
    stream_bursts: OnceLock<IntCounter>,
    tokens_per_second: OnceLock<Histogram>,
    inter_token_latency: OnceLock<Histogram>,
    usage_mismatch: OnceLock<IntCounter>,
    /// `mlxgate_requests_total` and `mlxgate_request_duration_seconds` by outcome.
    outcomes: Mutex<Vec<(&'static str, IntCounter, Histogram)>>,
}

fn counter(vec: &IntCounterVec, labels: &[&str]) -> IntCounter {
    vec.with_label_values(labels)
}

fn histogram(vec: &HistogramVec, labels: &[&str]) -> Histogram {
    vec.with_label_values(labels)
}

impl RequestSeries {
    fn new(model: &str, backend: &str, client: &str) -> Self {
        RequestSeries {
            labels: [model.into(), backend.into(), client.into()],
            time_to_first_token: Default::default(),
            prompt_tokens: OnceLock::new(),
            prompt_cached_tokens: OnceLock::new(),
            generation_tokens: OnceLock::new(),
            generation_tokens_unknown: OnceLock::new(),
            stream_bursts: OnceLock::new(),
            tokens_per_second: OnceLock::new(),
            inter_token_latency: OnceLock::new(),
            usage_mismatch: OnceLock::new(),
            outcomes: Mutex::default(),
        }
    }

    fn model_backend(&self) -> [&str; 2] {
        [&self.labels[0], &self.labels[1]]
    }

    fn all(&self) -> [&str; 3] {
        [&self.labels[0], &self.labels[1], &self.labels[2]]
    }

    /// `mlxgate_time_to_first_token_seconds` of a streamed or a whole answer.
    pub fn time_to_first_token(&self, m: &Declared, streaming: bool) -> &Histogram {
        let [model, backend] = self.model_backend();
        let label = if streaming { "true" } else { "false" };
        self.time_to_first_token[usize::from(streaming)]
            .get_or_init(|| histogram(&m.time_to_first_token, &[model, backend, label]))
    }

    /// `mlxgate_prompt_tokens_total`.
    pub fn prompt_tokens(&self, m: &Declared) -> &IntCounter {
        self.prompt_tokens.get_or_init(|| counter(&m.prompt_tokens, &self.all()))
    }

    /// `mlxgate_prompt_cached_tokens_total` (model, backend).
    pub fn prompt_cached_tokens(&self, m: &Declared) -> &IntCounter {
        self.prompt_cached_tokens.get_or_init(|| counter(&m.prompt_cached_tokens, &self.model_backend()))
    }

    /// `mlxgate_generation_tokens_total`.
    pub fn generation_tokens(&self, m: &Declared) -> &IntCounter {
        self.generation_tokens.get_or_init(|| counter(&m.generation_tokens, &self.all()))
    }

    /// `mlxgate_generation_tokens_unknown_total`.
    pub fn generation_tokens_unknown(&self, m: &Declared) -> &IntCounter {
        self.generation_tokens_unknown.get_or_init(|| counter(&m.generation_tokens_unknown, &self.all()))
    }

    /// `mlxgate_stream_bursts_total` (backend).
    pub fn stream_bursts(&self, m: &Declared) -> &IntCounter {
        self.stream_bursts.get_or_init(|| counter(&m.stream_bursts, &[&self.labels[1]]))
    }

    /// `mlxgate_generation_tokens_per_second` (model, backend).
    pub fn tokens_per_second(&self, m: &Declared) -> &Histogram {
        self.tokens_per_second.get_or_init(|| histogram(&m.tokens_per_second, &self.model_backend()))
    }

    /// The inter-token latency histogram (model, backend).
    pub fn inter_token_latency(&self, m: &Declared) -> &Histogram {
        self.inter_token_latency.get_or_init(|| histogram(&m.inter_token_latency, &self.model_backend()))
    }

    /// `mlxgate_usage_mismatch_total` (backend).
    pub fn usage_mismatch(&self, m: &Declared) -> &IntCounter {
        self.usage_mismatch.get_or_init(|| counter(&m.usage_mismatch, &[&self.labels[1]]))
    }

    /// Counts a finished request with `outcome` and observes its duration.
    pub fn finished(&self, m: &Declared, outcome: &'static str, seconds: f64) {
        let mut outcomes = self.outcomes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let index = match outcomes.iter().position(|(o, _, _)| *o == outcome) {
            Some(index) => index,
            None => {
                let [model, backend, client] = self.all();
                let requests = counter(&m.requests, &[model, backend, client, outcome]);
                let duration = histogram(&m.request_duration, &[model, backend, outcome]);
                outcomes.push((outcome, requests, duration));
                outcomes.len() - 1
            }
        };
        let (_, requests, duration) = &outcomes[index];
        duration.observe(seconds);
        requests.inc();
    }
}

/// Every (model, backend, client)'s [`RequestSeries`], made on first use.
#[derive(Default)]
pub struct Cache {
    by_labels: RwLock<std::collections::HashMap<u64, Vec<Arc<RequestSeries>>>>,
}

impl Cache {
    /// The series of `model`, `backend` and `client`.
    pub fn get(&self, model: &str, backend: &str, client: &str) -> Arc<RequestSeries> {
        let key = foldhash::quality::FixedState::default().hash_one((model, backend, client));
        let same = |s: &&Arc<RequestSeries>| s.all() == [model, backend, client];
        {
            let map = self.by_labels.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(found) = map.get(&key).and_then(|list| list.iter().find(same)) {
                return Arc::clone(found);
            }
        }
        let mut map = self.by_labels.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let list = map.entry(key).or_default();
        if let Some(found) = list.iter().find(same) {
            return Arc::clone(found);
        }
        let made = Arc::new(RequestSeries::new(model, backend, client));
        list.push(Arc::clone(&made));
        made
    }
}
