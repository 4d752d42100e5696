//! A model of several backends at work for one request: its [`Balancer`] built from the
//! configuration, the request's [`Plan`] — the prompt read once from the outgoing body, the
//! router the pool asks at the request's arrival (and again after a failover), the decision
//! counted — and what the serving backend's answer teaches the balancer (an [`AnswerHook`] on
//! the request's record: the index corrected by the reported cached tokens, the rates learnt,
//! the prediction's error counted).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::route::{Candidate, Choice};
use crate::balance::{BackendSpec, Balancer, Match, Observed, Policy, Prompt};
use crate::config::{BackendConfig, BalancePolicy, ModelConfig};
use crate::metrics::Metrics;
use crate::outcome::{AnswerHook, Measured};

/// A body at least this large is read into a [`Prompt`] on a blocking thread (about 1 ms of
/// hashing per megabyte, measured).
pub const OFFLOADED_BODY: usize = 1 << 20;

/// The balance module's policy for the configuration's.
pub fn policy_of(policy: BalancePolicy) -> Policy {
    match policy {
        BalancePolicy::CacheAware => Policy::CacheAware,
        BalancePolicy::LeastLoaded => Policy::LeastLoaded,
        BalancePolicy::RoundRobin => Policy::RoundRobin,
        BalancePolicy::Session => Policy::Session,
    }
}

/// The balancer of `model`, whose backends are `backends` in its order.
pub fn balancer_for(model: &ModelConfig, backends: &[&BackendConfig]) -> Balancer {
    let specs: Vec<BackendSpec> = backends
        .iter()
        .map(|b| BackendSpec { name: b.name.clone(), cache_sequences: b.prompt_cache_sequences })
        .collect();
    Balancer::new(policy_of(model.balance.policy), &specs)
}

/// The decision that bound a request to the backend that served it, for its access line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Routed {
    /// The reason's metric label (`cache_hit`, `cold`, `least_loaded`, …, `rebound`).
    pub reason: &'static str,
    /// The cached tokens the balancer believed that backend held of the prompt.
    pub predicted_cached_tokens: u64,
}

/// One request's routing by its model's balancer.
pub struct Plan {
    balancer: Arc<Balancer>,
    model: String,
    /// The model's backends' names, in its order (metric labels).
    names: Arc<[String]>,
    prompt: Prompt,
    session: Option<String>,
    /// Per backend, the prefix the balancer believed it held at the last decision.
    matches: Vec<Match>,
    /// The last decision (the pool may grant another backend than the one it named: a
    /// preference that ran out, a failover).
    choice: Option<Choice>,
    /// The backend the first decision named (a failover asks the router again).
    first: Option<usize>,
    metrics: Metrics,
}

impl Plan {
    /// The plan of a request whose outgoing body is `body`; `session`: its session key.
    pub fn new(
        balancer: Arc<Balancer>,
        model: &str,
        names: Arc<[String]>,
        body: &[u8],
        session: Option<String>,
        metrics: &Metrics,
    ) -> Plan {
        Plan::of_prompt(balancer, model, names, Prompt::of_chat(body), session, metrics)
    }

    /// [`Plan::new`], the body read off the async workers when it is large
    /// ([`OFFLOADED_BODY`]: reading 64 MB takes tens of milliseconds).
    pub async fn read(
        balancer: Arc<Balancer>,
        model: &str,
        names: Arc<[String]>,
        body: Bytes,
        session: Option<String>,
        metrics: &Metrics,
    ) -> Plan {
        let prompt = if body.len() < OFFLOADED_BODY {
            Prompt::of_chat(&body)
        } else {
            tokio::task::spawn_blocking(move || Prompt::of_chat(&body)).await.unwrap_or_default()
        };
        Plan::of_prompt(balancer, model, names, prompt, session, metrics)
    }

    fn of_prompt(
        balancer: Arc<Balancer>,
        model: &str,
        names: Arc<[String]>,
        prompt: Prompt,
        session: Option<String>,
        metrics: &Metrics,
    ) -> Plan {
        Plan {
            balancer,
            model: model.to_string(),
            names,
            prompt,
            session,
            matches: Vec::new(),
            choice: None,
            first: None,
            metrics: metrics.clone(),
        }
    }

    /// The router's answer for `candidates` (called by the pool under its lock: no await, no
    /// other lock than the balancer's).
    pub fn choose(&mut self, candidates: &[Candidate<'_>]) -> Choice {
        let (choice, matches) = self.balancer.plan(&self.prompt, candidates, self.session.as_deref());
        self.matches = matches;
        if self.choice.is_none() {
            self.first = choice.backend();
        }
        self.choice = Some(choice);
        choice
    }

    /// Counts the decision under the backend at `position`, which the request was granted,
    /// and returns what the access line says of it: `rebound` when the request was bound to
    /// another backend than the one first named (its preference ran out, or it failed over and
    /// the router was asked again); else the last decision's reason (one that named no backend
    /// — none usable, every slot taken — took the first slot freed).
    pub fn granted(&self, position: usize) -> Option<Routed> {
        let backend = self.names.get(position).map_or("", String::as_str);
        let reason = match self.choice {
            None => return None,
            Some(_) if self.first.is_some_and(|first| first != position) => "rebound",
            Some(choice) if choice.backend().is_some_and(|named| named != position) => "rebound",
            Some(choice) => choice.reason.label(),
        };
        self.metrics.route_decisions.with_label_values(&[&self.model, backend, reason]).inc();
        let predicted = self.matches.get(position).copied().unwrap_or_default();
        let predicted_cached_tokens = (predicted.expected_bytes as f64 * self.balancer.tokens_per_byte()) as u64;
        Some(Routed { reason, predicted_cached_tokens })
    }

    /// What the answer of the backend at `position` (to the attempt sent at `sent_at`) teaches
    /// the balancer, once the record is finished with it. Its prefill time is from that send
    /// to its first token: neither the queue, nor a failed attempt on another backend, nor a
    /// chunked request's map phase, nor a busy backend's pauses are its prefill.
    pub fn feedback(self, position: usize, sent_at: Instant) -> AnswerHook {
        Box::new(move |measured: &Measured, _ttft: Option<Duration>| self.learn(position, sent_at, measured))
    }

    fn learn(self, position: usize, sent_at: Instant, measured: &Measured) {
        // Only an answer the server generated says what it holds now (it prefilled the prompt).
        if measured.first_token.is_none() && measured.prompt_tokens.is_none() {
            return;
        }
        let predicted = self.matches.get(position).copied().unwrap_or_default();
        let observed = Observed {
            prompt_tokens: measured.prompt_tokens,
            cached_tokens: measured.cached_tokens,
            completion_tokens: measured.completion_tokens,
            // A whole answer's "first token" is its end (prefill and the whole decode): only a
            // stream's first token times the prefill.
            prefill_time: measured
                .first_token
                .filter(|_| measured.streaming)
                .map(|f| f.saturating_duration_since(sent_at)),
            decode_tokens_per_s: measured.decode_tokens_per_second,
        };
        let feedback = self.balancer.observe_answer(position, &self.prompt, predicted, &observed);
        let backend = self.names.get(position).map_or("", String::as_str);
        let labels = [self.model.as_str(), backend];
        if let Some(reported) = feedback.reported_tokens {
            let m = &self.metrics;
            m.route_predicted_cached_tokens.with_label_values(&labels).inc_by(feedback.predicted_tokens);
            m.route_reported_cached_tokens.with_label_values(&labels).inc_by(reported);
            let error = feedback.predicted_tokens.abs_diff(reported);
            m.route_prediction_error_tokens.with_label_values(&labels).observe(error as f64);
        }
        self.metrics.route_index_sequences.with_label_values(&labels).set(feedback.sequences as i64);
    }
}

/// Found by review (issue 21). A whole (non-streamed) answer's "first token" is its end
/// (`Figures::of_whole`), so its time is prefill + the whole decode: the balancer learns a
/// prefill rate many times too slow from every non-streamed answer.
#[cfg(test)]
mod reviewed {
    use super::*;
    use crate::balance::BackendSpec;

    /// A body over [`OFFLOADED_BODY`] is read on a blocking thread into the same prompt.
    #[tokio::test]
    async fn a_large_body_is_read_alike_off_the_async_workers() {
        let spec = |name: &str| BackendSpec { name: name.to_string(), cache_sequences: 10 };
        let balancer = Arc::new(Balancer::new(Policy::CacheAware, &[spec("a"), spec("b")]));
        let names: Arc<[String]> = vec!["a".to_string(), "b".to_string()].into();
        let text = "word ".repeat(OFFLOADED_BODY / 4);
        let body =
            serde_json::to_vec(&serde_json::json!({"messages": [{"role": "user", "content": text}]})).expect("json");
        assert!(body.len() >= OFFLOADED_BODY);
        let read = Plan::read(
            Arc::clone(&balancer),
            "m",
            Arc::clone(&names),
            Bytes::from(body.clone()),
            None,
            &Metrics::new(),
        )
        .await;
        assert_eq!(read.prompt, Prompt::of_chat(&body));
        assert!(read.prompt.bytes() >= text.len() as u64);
    }

    #[test]
    fn a_whole_answers_time_teaches_no_prefill_rate() {
        let spec = |name: &str| BackendSpec { name: name.to_string(), cache_sequences: 10 };
        let balancer = Arc::new(Balancer::new(Policy::CacheAware, &[spec("a"), spec("b")]));
        let names: Arc<[String]> = vec!["a".to_string(), "b".to_string()].into();
        let body = br#"{"messages":[{"role":"user","content":"hello"}]}"#;
        let plan = Plan::new(Arc::clone(&balancer), "m", names, body, None, &Metrics::new());
        let prior = balancer.rates()[0].prefill_per_s();
        // 4000 uncached prompt tokens, 1000 generated: a whole answer read after 60 s, of which
        // the prefill took 4 s (1000 tokens/s) and the decode 56 s.
        let measured = Measured {
            first_token: Some(Instant::now()),
            streaming: false,
            prompt_tokens: Some(4000),
            cached_tokens: Some(0),
            completion_tokens: Some(1000),
            generates: true,
            ..Measured::default()
        };
        (plan.feedback(0, Instant::now() - Duration::from_secs(60)))(&measured, Some(Duration::from_secs(60)));
        let learnt = balancer.rates()[0].prefill_per_s();
        assert!(learnt >= prior, "learnt {learnt:.0} tokens/s from a whole answer's end (prior {prior:.0})");
    }
}

/// Review of the access line's `route=` (and `mlxgate_route_decisions_total`'s reason):
/// docs/balancing.md, docs/metrics.md and the dashboard say `rebound` is a request bound to
/// another backend than the one chosen — "a preference that ran out, a failover" — and list
/// `none_usable` for a request that waited for any backend.
#[cfg(test)]
mod review_route {
    use super::*;
    use crate::balance::BackendSpec;

    const NAMES: [&str; 2] = ["a", "b"];

    fn plan(policy: Policy) -> Plan {
        let spec = |name: &str| BackendSpec { name: name.to_string(), cache_sequences: 10 };
        let balancer = Arc::new(Balancer::new(policy, &[spec("a"), spec("b")]));
        let names: Arc<[String]> = NAMES.iter().map(|n| n.to_string()).collect();
        let body =
            br#"{"messages":[{"role":"system","content":"you are a coding agent"},{"role":"user","content":"hello"}]}"#;
        Plan::new(balancer, "m", names, body, None, &Metrics::new())
    }

    fn candidate(backend: usize, usable: bool, free_slots: usize) -> Candidate<'static> {
        Candidate {
            backend,
            name: NAMES[backend],
            usable,
            free_slots,
            in_flight: 1 - free_slots.min(1),
            waiting_for: 0,
            queued: 0,
            max_concurrency: 1,
            mean_service: Duration::ZERO,
        }
    }

    /// A request that failed before its first byte on the backend chosen and was sent to the
    /// other: the call asks the router again with the failed one excluded, and the line says
    /// `only_choice` — the same as a request whose other backend is drained — never `rebound`.
    #[test]
    fn review_a_failover_is_logged_as_rebound() {
        let mut plan = plan(Policy::CacheAware);
        let tried = plan.choose(&[candidate(0, true, 1), candidate(1, true, 1)]).now.expect("a free slot");
        let other = 1 - tried;
        let mut again = [candidate(0, true, 1), candidate(1, true, 1)];
        again[tried] = Candidate { usable: false, free_slots: 0, ..again[tried] };
        plan.choose(&again);
        let routed = plan.granted(other).expect("a model of several backends says why");
        assert_eq!(routed.reason, "rebound", "failed over from {} to {}", NAMES[tried], NAMES[other]);
    }

    /// Every backend drained or ejected at arrival: the router says `none_usable`; the request
    /// later takes the first backend back. The label `none_usable` is never emitted: `granted`
    /// says `rebound` for every choice that named no backend.
    #[test]
    fn review_a_request_that_found_no_usable_backend_is_logged_as_none_usable() {
        let mut plan = plan(Policy::CacheAware);
        let choice = plan.choose(&[candidate(0, false, 0), candidate(1, false, 0)]);
        assert_eq!(choice.reason.label(), "none_usable");
        let routed = plan.granted(0).expect("a model of several backends says why");
        assert_eq!(routed.reason, "none_usable");
    }

    /// `least_loaded` with every slot taken: the request waits for whichever frees first and
    /// gets it — nothing was named, nothing rebound; the line says `rebound`.
    #[test]
    fn review_least_loaded_waiting_for_any_slot_is_not_rebound() {
        let mut plan = plan(Policy::LeastLoaded);
        plan.choose(&[candidate(0, true, 0), candidate(1, true, 0)]);
        let routed = plan.granted(1).expect("a model of several backends says why");
        assert_eq!(routed.reason, "least_loaded");
    }
}
