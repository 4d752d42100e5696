//! Which backend of a model serves a request: the routing policy, pure and bounded. A leaf
//! beside `kinds`: it imports nothing else of the crate (the pool hands it [`Candidate`]s and
//! the answers' figures; it hands back a [`Choice`]).
//!
//! - [`prompt`]: a request body as chained segment hashes ([`Prompt`]).
//! - [`index`]: per backend, the prompts it is believed to hold, corrected after every answer
//!   from the `cached_tokens` the server reports ([`PrefixIndex`]).
//! - [`rates`]: per backend, learnt prefill and decode rates, tokens per byte ([`Rates`]).
//! - [`policy`]: the choice, a pure function of the candidates and the estimates ([`choose`]).
//! - [`rendezvous`]: highest-random-weight hashing over backend names, so that several
//!   gateways in front of the same backends agree without shared state.
//!
//! [`Balancer`], one per model, holds each backend's index and rates behind one mutex: the pool
//! calls [`Balancer::plan`] on a request's arrival, [`Balancer::observe_answer`] when its answer
//! ends, and [`Balancer::backend_restarted`] when a backend's server lost its cache.

pub mod index;
pub mod policy;
pub mod prompt;
pub mod rates;
pub mod rendezvous;

use std::sync::{Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

pub use index::{Correction, Match, PrefixIndex};
pub use policy::{Candidate, Choice, Estimate, Inputs, Reason, choose};
pub use prompt::Prompt;
pub use rates::{Ewma, Observed, Rates};

/// How a model with several backends chooses one (`balance: policy:` in gateway.yaml).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// The cheapest in seconds: the prompt tokens it would prefill (less the prefix it is
    /// believed to hold) at its prefill rate, plus its wait for a slot.
    #[default]
    CacheAware,
    /// The most free slots, then the fewest requests in flight.
    LeastLoaded,
    /// Each backend in turn.
    RoundRobin,
    /// A rendezvous hash of the request's session key (else of its conversation's opening).
    Session,
}

impl Policy {
    /// Its name in gateway.yaml and in metrics.
    pub fn label(self) -> &'static str {
        match self {
            Policy::CacheAware => "cache_aware",
            Policy::LeastLoaded => "least_loaded",
            Policy::RoundRobin => "round_robin",
            Policy::Session => "session",
        }
    }
}

/// One backend of a model, as the balancer is told of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSpec {
    pub name: String,
    /// How many whole prompts its server's cache keeps (`prompt_cache_sequences`).
    pub cache_sequences: usize,
}

/// What one answer taught, for the metrics: the prediction against the report.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Feedback {
    /// The cached tokens predicted at the plan (its expected bytes at this answer's tokens per
    /// byte).
    pub predicted_tokens: u64,
    /// The cached tokens the server reported (`None`: it reports none).
    pub reported_tokens: Option<u64>,
    /// What the report did to the index.
    pub correction: Correction,
    /// The backend's index size after it.
    pub sequences: usize,
}

struct Backend {
    index: PrefixIndex,
    rates: Rates,
}

struct State {
    backends: Vec<Backend>,
    round_robin: u64,
    /// The model's prompt tokens per byte (its tokenizer's, whichever backend answered).
    tokens_per_byte: Ewma,
}

/// One model's balancer (see the module's header). Its memory is bounded: per backend at most
/// its cache's sequences (≤ [`index::MAX_CAPACITY`]) of at most [`prompt::MAX_SEGMENTS`]
/// hashes.
pub struct Balancer {
    policy: Policy,
    state: Mutex<State>,
}

impl Balancer {
    /// A balancer for a model's backends, in the model's order (a [`Candidate::backend`] is an
    /// index in it).
    pub fn new(policy: Policy, backends: &[BackendSpec]) -> Balancer {
        let backends = backends
            .iter()
            .map(|b| Backend { index: PrefixIndex::new(b.cache_sequences), rates: Rates::default() })
            .collect();
        let tokens_per_byte = Ewma::until_sampled(rates::PRIOR_TOKENS_PER_BYTE);
        Balancer { policy, state: Mutex::new(State { backends, round_robin: 0, tokens_per_byte }) }
    }

    /// Its policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The state stays consistent at every step: a panic elsewhere leaves nothing half-done.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Where a request with `prompt` goes among `candidates`; and, per backend of the model (in
    /// its order), the prefix each is believed to hold — the one of the backend that serves it
    /// goes back to [`Balancer::observe_answer`]. `session_key`: the request's session key
    /// (`session` policy), if it has one.
    pub fn plan(&self, prompt: &Prompt, candidates: &[Candidate], session_key: Option<&str>) -> (Choice, Vec<Match>) {
        let mut state = self.state();
        let matches: Vec<Match> = state.backends.iter().map(|b| b.index.predict(prompt)).collect();
        let per_byte = state.tokens_per_byte.value();
        let model_prefill = model_prefill_per_s(&state.backends);
        let estimates: Vec<Estimate> = candidates
            .iter()
            .map(|c| {
                let rates = state.backends.get(c.backend).map(|b| b.rates).unwrap_or_default();
                let matched = matches.get(c.backend).copied().unwrap_or_default();
                Estimate {
                    prompt_tokens: (prompt.bytes() as f64 * per_byte) as u64,
                    cached_tokens: (matched.expected_bytes as f64 * per_byte) as u64,
                    prefill_per_s: rates.learnt_prefill_per_s().or(model_prefill).unwrap_or(rates.prefill_per_s()),
                    service: if c.mean_service.is_zero() { rates.service() } else { c.mean_service },
                    held_sequences: state.backends.get(c.backend).map_or(0, |b| b.index.len()),
                }
            })
            .collect();
        let round_robin = state.round_robin;
        state.round_robin = state.round_robin.wrapping_add(1);
        let cold = candidates
            .iter()
            .filter(|c| c.usable)
            .all(|c| matches.get(c.backend).map_or(0, |m| m.segments) < prompt.opening_segments());
        let inputs = Inputs {
            estimates: &estimates,
            session: session_key.map(rendezvous::key_of),
            // No prompt (embeddings, a malformed body): ties spread by the counter.
            conversation: match prompt.segments() {
                0 => round_robin.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                _ => prompt.conversation_key(),
            },
            round_robin,
            cold,
        };
        (choose(self.policy, candidates, &inputs), matches)
    }

    /// `backend` answered `prompt` (predicted to hold `predicted` at the plan): its rates learn,
    /// its index is corrected by the report and holds `prompt` now. Call it once per answer
    /// the server generated (its usage seen, or at least its first token: the server then holds
    /// the prompt); not for a request that failed before it. An unknown `backend` is ignored.
    pub fn observe_answer(&self, backend: usize, prompt: &Prompt, predicted: Match, observed: &Observed) -> Feedback {
        let mut state = self.state();
        if backend >= state.backends.len() {
            return Feedback::default();
        }
        let per_byte = match observed.prompt_tokens {
            Some(tokens) if tokens > 0 && prompt.bytes() > 0 => {
                let per_byte = tokens as f64 / prompt.bytes() as f64;
                state.tokens_per_byte.add(per_byte);
                per_byte
            }
            _ => state.tokens_per_byte.value(),
        };
        let b = &mut state.backends[backend];
        b.rates.observe(observed);
        let correction = b.index.observe(prompt, predicted, observed.cached_tokens, observed.prompt_tokens);
        Feedback {
            predicted_tokens: (predicted.expected_bytes as f64 * per_byte) as u64,
            reported_tokens: observed.cached_tokens,
            correction,
            sequences: b.index.len(),
        }
    }

    /// `backend`'s server restarted, crashed or was swapped out: its cache is gone.
    pub fn backend_restarted(&self, backend: usize) {
        if let Some(b) = self.state().backends.get_mut(backend) {
            b.index.clear();
        }
    }

    /// Each backend's index size, in the model's order (a gauge).
    pub fn sequences(&self) -> Vec<usize> {
        self.state().backends.iter().map(|b| b.index.len()).collect()
    }

    /// Each backend's learnt rates, in the model's order (for `/admin/backends`).
    pub fn rates(&self) -> Vec<Rates> {
        self.state().backends.iter().map(|b| b.rates).collect()
    }

    /// The model's learnt prompt tokens per byte.
    pub fn tokens_per_byte(&self) -> f64 {
        self.state().tokens_per_byte.value()
    }
}

/// The mean of the prefill rates the model's backends learnt (`None`: none learnt one yet): the
/// estimate of a backend that has not, since the same model runs on each.
fn model_prefill_per_s(backends: &[Backend]) -> Option<f64> {
    let learnt: Vec<f64> = backends.iter().filter_map(|b| b.rates.learnt_prefill_per_s()).collect();
    (!learnt.is_empty()).then(|| learnt.iter().sum::<f64>() / learnt.len() as f64)
}

#[cfg(test)]
mod tests;
