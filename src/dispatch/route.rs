//! The seam between the pool and the routing policy: at a request's arrival, under the pool's
//! lock, the model's backends are offered as [`Candidate`]s and a router answers a [`Choice`]
//! (take this backend's free slot now, or wait for this one at most so long, or wait for any).
//!
//! The types are the balance module's (`balance::policy`), defined here with the same fields
//! until it is merged; [`least_loaded`] is the built-in choice a model uses without a balancer:
//! the usable backend with the most free slots, then the fewest in flight, then the first.

use std::time::Duration;

/// One backend of a model as a router sees it at a request's arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate<'a> {
    /// Its index in the model's list of backends.
    pub backend: usize,
    pub name: &'a str,
    /// It may be given the request: open, not drained, not ejected (a half-open one counts
    /// once, for its one trial), not excluded (tried already by this request).
    pub usable: bool,
    /// Slots it could hand this request now (0 when not usable).
    pub free_slots: usize,
    pub in_flight: usize,
    /// Waiting requests that prefer it.
    pub waiting_for: usize,
    pub max_concurrency: usize,
    /// Smoothed time a request holds one of its slots.
    pub mean_service: Duration,
}

/// Why a backend was chosen (a label for metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    CacheHit,
    /// A cold conversation, placed by rendezvous hashing.
    Cold,
    LeastLoaded,
    RoundRobin,
    Session,
    /// Only one backend could take it.
    OnlyChoice,
}

impl Reason {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Reason::CacheHit => "cache_hit",
            Reason::Cold => "cold",
            Reason::LeastLoaded => "least_loaded",
            Reason::RoundRobin => "round_robin",
            Reason::Session => "session",
            Reason::OnlyChoice => "only_choice",
        }
    }
}

/// Chooses among a model's backends at a request's arrival, under the pool's lock.
pub type Router<'a> = &'a mut (dyn FnMut(&[Candidate<'_>]) -> Choice + Send);

/// A router's answer for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    /// Take this candidate's free slot now.
    pub now: Option<usize>,
    /// Wait for this candidate's slot, at most this long; then any backend's.
    pub prefer: Option<(usize, Duration)>,
    pub reason: Reason,
}

/// The built-in choice: the usable candidate with the most free slots, then the fewest in
/// flight, then the first in the model's order; none free: wait for whichever frees first.
pub fn least_loaded(candidates: &[Candidate<'_>]) -> Choice {
    let usable = || candidates.iter().filter(|c| c.usable);
    let reason = if usable().count() == 1 { Reason::OnlyChoice } else { Reason::LeastLoaded };
    let best = usable()
        .filter(|c| c.free_slots > 0)
        .min_by_key(|c| (std::cmp::Reverse(c.free_slots), c.in_flight, c.backend))
        .map(|c| c.backend);
    Choice { now: best, prefer: None, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(backend: usize, usable: bool, free_slots: usize, in_flight: usize) -> Candidate<'static> {
        Candidate {
            backend,
            name: "b",
            usable,
            free_slots,
            in_flight,
            waiting_for: 0,
            max_concurrency: 4,
            mean_service: Duration::ZERO,
        }
    }

    #[test]
    fn least_loaded_takes_the_most_free_then_the_fewest_in_flight_then_the_first() {
        let pick = |c: &[Candidate<'_>]| least_loaded(c).now;
        assert_eq!(pick(&[candidate(0, true, 1, 3), candidate(1, true, 2, 2)]), Some(1));
        assert_eq!(pick(&[candidate(0, true, 2, 3), candidate(1, true, 2, 1)]), Some(1));
        assert_eq!(pick(&[candidate(0, true, 2, 1), candidate(1, true, 2, 1)]), Some(0));
        assert_eq!(pick(&[candidate(0, false, 4, 0), candidate(1, true, 1, 3)]), Some(1), "unusable is skipped");
        assert_eq!(pick(&[candidate(0, true, 0, 4), candidate(1, true, 0, 4)]), None, "none free: wait");
        assert_eq!(least_loaded(&[candidate(0, false, 0, 0), candidate(1, true, 1, 0)]).reason, Reason::OnlyChoice);
    }
}
