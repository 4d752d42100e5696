//! The seam between the pool and the routing policy: at a request's arrival, under the pool's
//! lock, the model's backends are offered as [`Candidate`]s and a router answers a [`Choice`]
//! (take this backend's free slot now, or wait for this one at most so long, or wait for any).
//!
//! The types are the balance module's (`balance::policy`); [`least_loaded`] is the built-in
//! choice when a request has no balancer's plan (a model of one backend never asks):
//! the usable backend with the most free slots, then the fewest in flight, then the first.

pub use crate::balance::{Candidate, Choice, Reason};

/// Chooses among a model's backends at a request's arrival, under the pool's lock.
pub type Router<'a> = &'a mut (dyn FnMut(&[Candidate<'_>]) -> Choice + Send);

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
    use std::time::Duration;

    use super::*;

    fn candidate(backend: usize, usable: bool, free_slots: usize, in_flight: usize) -> Candidate<'static> {
        Candidate {
            backend,
            name: "b",
            usable,
            free_slots,
            in_flight,
            waiting_for: 0,
            queued: 0,
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
