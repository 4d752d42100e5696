//! The choice of a backend for one request, pure: candidates and estimates in, a [`Choice`]
//! out. The pool calls it under its lock on arrival ([`super::Balancer::plan`] fills the
//! estimates); nothing here waits, locks or reads a clock.
//!
//! `cache_aware` (the default) ranks by a cost in seconds: the tokens the backend would have to
//! prefill (the prompt less the prefix it is believed to hold) ÷ its prefill rate — counted once
//! more per request waiting behind it per slot, whose wait that prefill lengthens
//! ([`prefill_cost`]) — plus its expected wait for a slot (none with a free slot; else the
//! requests ahead × its mean service ÷ its slots). The cheapest wins; costs within [`TIE_FRACTION`] (or
//! [`TIE_SECONDS`]) of the cheapest are ties, broken by load, then by a rendezvous hash of the
//! conversation (so that two gateways agree). A *cold* conversation — one no backend holds past
//! the prefix conversations share (tools, system prompt) — is placed as if none held any: the shared
//! prefix is a one-time cost on a backend that lacks it, and counting it would pile every new
//! conversation onto the first backend that served one. And since a conversation then stays
//! where it is cached, where it starts decides the balance for good: a cold one goes only to a
//! backend holding no more than [`BOUNDED_LOAD`] over the average of the conversations the
//! backends hold or run (consistent hashing with bounded loads: while the backends are even,
//! pure rendezvous, so gateways agree). When the chosen backend has no free slot, the request
//! prefers it for as long as waiting still costs less than prefilling on the best free one.
//!
//! This is SGLang's cache-aware router (prefix match; load when unbalanced) and Dynamo's KV
//! router cost (uncached prefill + load) put in one unit, seconds.

use std::time::Duration;

use super::Policy;
use super::rendezvous;

/// A cold conversation goes to a backend holding fewer than this fraction over the average of
/// the conversations the backends hold (the new one counted), if any does.
pub const BOUNDED_LOAD: f64 = 0.25;
/// Costs within this fraction of the cheapest are ties.
pub const TIE_FRACTION: f64 = 0.05;
/// Costs within this many seconds of the cheapest are ties.
pub const TIE_SECONDS: f64 = 0.05;
/// How long a `session` request waits for its backend before taking any (the queue's
/// `max_wait` bounds it anyway).
pub const SESSION_PATIENCE: Duration = Duration::from_secs(3600);

/// One backend of the model as the pool sees it at the request's arrival.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate<'a> {
    /// Its index in the model's list of backends.
    pub backend: usize,
    /// Its name (rendezvous hashes names, so gateways agree).
    pub name: &'a str,
    /// Open, not drained, not ejected (half-open counts once), not excluded for this request.
    pub usable: bool,
    pub free_slots: usize,
    pub in_flight: usize,
    /// Waiters preferring it.
    pub waiting_for: usize,
    /// Waiters of the model preferring no backend (they take the first slot freed anywhere).
    pub queued: usize,
    pub max_concurrency: usize,
    /// How long a request holds one of its slots, on average (zero: unknown, the learnt
    /// rates' estimate is taken).
    pub mean_service: Duration,
}

/// What the balancer estimates of one candidate for this prompt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// The prompt's tokens.
    pub prompt_tokens: u64,
    /// Those the backend is believed to hold (≤ `prompt_tokens`).
    pub cached_tokens: u64,
    pub prefill_per_s: f64,
    /// How long a request holds a slot.
    pub service: Duration,
    /// How many conversations (prompts) the backend is believed to hold.
    pub held_sequences: usize,
}

impl Estimate {
    /// The tokens it would prefill.
    pub fn uncached_tokens(&self) -> u64 {
        self.prompt_tokens.saturating_sub(self.cached_tokens)
    }

    /// Seconds of prefill.
    pub fn prefill_seconds(&self) -> f64 {
        self.uncached_tokens() as f64 / self.prefill_per_s.max(f64::MIN_POSITIVE)
    }
}

/// What [`choose`] decides on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Inputs<'a> {
    /// One per candidate, in the candidates' order.
    pub estimates: &'a [Estimate],
    /// The session key's rendezvous key (`session`), if the request has one.
    pub session: Option<u64>,
    /// [`super::Prompt::conversation_key`].
    pub conversation: u64,
    /// A counter, one step per request (`round_robin`).
    pub round_robin: u64,
    /// No backend holds the conversation past the prefix conversations share: ignore the cache.
    pub cold: bool,
}

/// Why a backend was chosen (a metric label: [`Reason::label`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Its cached prefix made it the cheapest.
    CacheHit,
    /// A tie broken by the conversation's rendezvous hash (a cold conversation, or one held
    /// equally).
    Cold,
    /// The least loaded (by policy, or as a tie-break, or its shorter wait made it cheapest).
    LeastLoaded,
    RoundRobin,
    Session,
    /// One usable backend.
    OnlyChoice,
    /// None usable: the request waits for any.
    NoneUsable,
}

impl Reason {
    /// The label for metrics.
    pub fn label(self) -> &'static str {
        match self {
            Reason::CacheHit => "cache_hit",
            Reason::Cold => "cold",
            Reason::LeastLoaded => "least_loaded",
            Reason::RoundRobin => "round_robin",
            Reason::Session => "session",
            Reason::OnlyChoice => "only_choice",
            Reason::NoneUsable => "none_usable",
        }
    }
}

/// The decision. Both `now` and `prefer` empty: wait for any usable backend's slot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    /// Take this backend's free slot now.
    pub now: Option<usize>,
    /// Wait for this backend, at most this long; then take any.
    pub prefer: Option<(usize, Duration)>,
    pub reason: Reason,
}

impl Choice {
    /// The backend chosen, now or preferred.
    pub fn backend(&self) -> Option<usize> {
        self.now.or(self.prefer.map(|(b, _)| b))
    }

    fn at(candidate: &Candidate, reason: Reason) -> Choice {
        let now = (candidate.free_slots > 0).then_some(candidate.backend);
        Choice { now, prefer: None, reason }
    }

    fn wait_for_any(reason: Reason) -> Choice {
        Choice { now: None, prefer: None, reason }
    }
}

/// Seconds until a slot of `candidate` is free for the request: none with a free slot; else
/// the requests ahead of it (those waiting for it, and itself) × `service` ÷ its slots.
pub fn wait_seconds(candidate: &Candidate, service: Duration) -> f64 {
    if candidate.free_slots > 0 {
        return 0.0;
    }
    let ahead = candidate.waiting_for as f64 + 1.0;
    ahead * service.as_secs_f64() / candidate.max_concurrency.max(1) as f64
}

/// The seconds of prefill sending the request to `candidate` costs: its own, and the same again
/// for each request waiting behind it per slot — those preferring the backend and those of the
/// model waiting for any — since a prefill holds the slot (and the server's compute) they wait
/// for. With nobody waiting this is the request's own prefill; on a saturated pool re-prefilling
/// a whole conversation elsewhere costs everyone, and keeping it where it is cached costs little.
pub fn prefill_cost(candidate: &Candidate, estimate: &Estimate) -> f64 {
    let behind = (candidate.waiting_for + candidate.queued) as f64 / candidate.max_concurrency.max(1) as f64;
    estimate.prefill_seconds() * (1.0 + behind)
}

/// The cost in seconds of sending the request to `candidate`: [`prefill_cost`] and the wait
/// for a slot.
pub fn cost(candidate: &Candidate, estimate: &Estimate) -> f64 {
    prefill_cost(candidate, estimate) + wait_seconds(candidate, estimate.service)
}

/// Decides where a request goes (see the module's header).
pub fn choose(policy: Policy, candidates: &[Candidate], inputs: &Inputs) -> Choice {
    let usable: Vec<usize> = (0..candidates.len()).filter(|&i| candidates[i].usable).collect();
    match usable.as_slice() {
        [] => return Choice::wait_for_any(Reason::NoneUsable),
        [only] => return Choice::at(&candidates[*only], Reason::OnlyChoice),
        _ => {}
    }
    match policy {
        Policy::CacheAware => cache_aware(candidates, inputs, &usable),
        Policy::LeastLoaded => {
            let best = least_loaded(candidates, inputs.conversation, &usable);
            Choice::at(&candidates[best], Reason::LeastLoaded)
        }
        Policy::RoundRobin => round_robin(candidates, inputs.round_robin, &usable),
        Policy::Session => {
            let key = inputs.session.unwrap_or(inputs.conversation);
            let target = &candidates[by_rendezvous(candidates, key, &usable)];
            match target.free_slots {
                0 => Choice { now: None, prefer: Some((target.backend, SESSION_PATIENCE)), reason: Reason::Session },
                _ => Choice::at(target, Reason::Session),
            }
        }
    }
}

/// The position among `among` (positions in `candidates`) that `key` goes to.
fn by_rendezvous(candidates: &[Candidate], key: u64, among: &[usize]) -> usize {
    let at = rendezvous::pick(key, among.iter().map(|&i| candidates[i].name)).unwrap_or(0);
    among[at]
}

/// A candidate's load, lower is lighter: requests in it or waiting for it per slot.
fn load(c: &Candidate) -> f64 {
    (c.in_flight + c.waiting_for) as f64 / c.max_concurrency.max(1) as f64
}

/// Most free slots, then the lightest load, then rendezvous.
fn least_loaded(candidates: &[Candidate], key: u64, among: &[usize]) -> usize {
    let most_free = among.iter().map(|&i| candidates[i].free_slots).max().unwrap_or(0);
    let free: Vec<usize> = among.iter().copied().filter(|&i| candidates[i].free_slots == most_free).collect();
    lightest(candidates, key, &free).0
}

/// The lightest of `among`, ties by rendezvous; and whether rendezvous decided.
fn lightest(candidates: &[Candidate], key: u64, among: &[usize]) -> (usize, bool) {
    let least = among.iter().map(|&i| load(&candidates[i])).fold(f64::INFINITY, f64::min);
    let light: Vec<usize> = among.iter().copied().filter(|&i| load(&candidates[i]) <= least).collect();
    match light.as_slice() {
        [one] => (*one, false),
        _ => (by_rendezvous(candidates, key, &light), true),
    }
}

/// The counter's turn among the usable; if it has no free slot, the next that has one.
fn round_robin(candidates: &[Candidate], counter: u64, usable: &[usize]) -> Choice {
    let start = (counter % usable.len() as u64) as usize;
    (0..usable.len())
        .map(|step| &candidates[usable[(start + step) % usable.len()]])
        .find(|c| c.free_slots > 0)
        .map_or(Choice::wait_for_any(Reason::RoundRobin), |c| Choice::at(c, Reason::RoundRobin))
}

/// The usable backends whose conversations — those held, and the requests in them or waiting
/// for them (a new conversation placed a moment ago is not held yet) — stay under the bound
/// (see [`BOUNDED_LOAD`]); all of them if none does.
fn within_bound(candidates: &[Candidate], inputs: &Inputs, usable: &[usize]) -> Vec<usize> {
    let load = |i: usize| {
        let c = &candidates[i];
        inputs.estimates.get(i).map_or(0, |e| e.held_sequences) + c.in_flight + c.waiting_for
    };
    let total: usize = usable.iter().map(|&i| load(i)).sum();
    let average = (total + 1) as f64 / usable.len().max(1) as f64;
    let bound = ((average * (1.0 + BOUNDED_LOAD)).floor() as usize).max(1);
    let under: Vec<usize> = usable.iter().copied().filter(|&i| load(i) < bound).collect();
    if under.is_empty() { usable.to_vec() } else { under }
}

fn cache_aware(candidates: &[Candidate], inputs: &Inputs, usable: &[usize]) -> Choice {
    // Cold: every backend counted as holding what the one holding least does.
    let least_held = usable.iter().filter_map(|&i| inputs.estimates.get(i)).map(|e| e.cached_tokens).min();
    let estimate = |i: usize| {
        inputs.estimates.get(i).map(|e| match (inputs.cold, least_held) {
            (true, Some(held)) => Estimate { cached_tokens: held.min(e.prompt_tokens), ..*e },
            _ => *e,
        })
    };
    let costs: Vec<f64> =
        (0..candidates.len()).map(|i| estimate(i).map_or(f64::INFINITY, |e| cost(&candidates[i], &e))).collect();
    let open = if inputs.cold { within_bound(candidates, inputs, usable) } else { usable.to_vec() };
    let cheapest = open.iter().map(|&i| costs[i]).fold(f64::INFINITY, f64::min);
    let bound = cheapest + (cheapest * TIE_FRACTION).max(TIE_SECONDS);
    let near: Vec<usize> = open.iter().copied().filter(|&i| costs[i] <= bound).collect();
    let uncached = |i: usize| estimate(i).map_or(u64::MAX, |e| e.uncached_tokens());
    let (chosen, reason) = match near.as_slice() {
        [one] => {
            let fewest_elsewhere = usable.iter().filter(|&&i| i != *one).map(|&i| uncached(i)).min();
            let by_cache = fewest_elsewhere.is_some_and(|other| uncached(*one) < other);
            (*one, if by_cache { Reason::CacheHit } else { Reason::LeastLoaded })
        }
        _ => match lightest(candidates, inputs.conversation, &near) {
            (i, true) => (i, Reason::Cold),
            (i, false) => (i, Reason::LeastLoaded),
        },
    };
    let target = &candidates[chosen];
    if target.free_slots > 0 {
        return Choice { now: Some(target.backend), prefer: None, reason };
    }
    // Waiting for it is worth as long as it still beats the best other backend.
    let prefill = estimate(chosen).map_or(0.0, |e| prefill_cost(target, &e));
    let cheapest_of = |free: bool| {
        usable
            .iter()
            .copied()
            .filter(|&i| i != chosen && (!free || candidates[i].free_slots > 0))
            .min_by(|&a, &b| costs[a].total_cmp(&costs[b]).then_with(|| candidates[a].name.cmp(candidates[b].name)))
    };
    let best_free = cheapest_of(true);
    let patience = best_free.or_else(|| cheapest_of(false)).map_or(f64::INFINITY, |i| costs[i]) - prefill;
    if patience.is_finite() && patience > 0.0 {
        let patience = Duration::from_secs_f64(patience.min(SESSION_PATIENCE.as_secs_f64()));
        return Choice { now: None, prefer: Some((target.backend, patience)), reason };
    }
    match best_free {
        Some(i) => Choice { now: Some(candidates[i].backend), prefer: None, reason: Reason::LeastLoaded },
        None => Choice::wait_for_any(reason),
    }
}

#[cfg(test)]
mod tests;
