use proptest::prelude::*;

use super::*;

const NAMES: [&str; 4] = ["studio", "mini", "air", "pro"];

fn idle(backend: usize) -> Candidate<'static> {
    Candidate {
        backend,
        name: NAMES[backend],
        usable: true,
        free_slots: 2,
        in_flight: 0,
        waiting_for: 0,
        queued: 0,
        max_concurrency: 2,
        mean_service: Duration::from_secs(10),
    }
}

fn busy(backend: usize) -> Candidate<'static> {
    Candidate { free_slots: 0, in_flight: 2, ..idle(backend) }
}

fn estimate(prompt: u64, cached: u64) -> Estimate {
    Estimate {
        prompt_tokens: prompt,
        cached_tokens: cached,
        prefill_per_s: 1000.0,
        service: Duration::from_secs(10),
        held_sequences: 0,
    }
}

fn inputs(estimates: &[Estimate]) -> Inputs<'_> {
    Inputs { estimates, session: None, conversation: 7, round_robin: 0, cold: false }
}

#[test]
fn the_backend_holding_the_prefix_wins() {
    let candidates = [idle(0), idle(1)];
    let estimates = [estimate(50_000, 0), estimate(50_000, 49_000)];
    let choice = choose(Policy::CacheAware, &candidates, &inputs(&estimates));
    assert_eq!(choice, Choice { now: Some(1), prefer: None, reason: Reason::CacheHit });
    assert_eq!(choice.reason.label(), "cache_hit");
}

#[test]
fn a_cold_conversation_goes_by_rendezvous_and_two_gateways_agree() {
    let candidates = [idle(0), idle(1)];
    let estimates = [estimate(5_000, 1_000), estimate(5_000, 1_000)]; // the shared system prompt
    let mut seen = [0; 2];
    for conversation in 0..200u64 {
        let inputs = Inputs { conversation, ..inputs(&estimates) };
        let a = choose(Policy::CacheAware, &candidates, &inputs);
        let b = choose(Policy::CacheAware, &[idle(1), idle(0)], &Inputs { estimates: &estimates, ..inputs });
        assert_eq!(a.reason, Reason::Cold);
        assert_eq!(a.now, b.now, "the candidates' order does not matter");
        seen[a.now.expect("free")] += 1;
    }
    assert!(seen.iter().all(|&n| n > 60), "conversations spread: {seen:?}");
}

#[test]
fn a_cold_conversation_ignores_the_shared_prefix_and_goes_to_the_lighter() {
    // Backend 0 holds the system prompt (another conversation's), and runs one request.
    let candidates = [Candidate { in_flight: 1, free_slots: 1, ..idle(0) }, idle(1)];
    let estimates = [estimate(10_000, 8_000), estimate(10_000, 0)];
    let warm = choose(Policy::CacheAware, &candidates, &inputs(&estimates));
    assert_eq!(warm.now, Some(0), "counted, the shared prefix wins");
    let cold = choose(Policy::CacheAware, &candidates, &Inputs { cold: true, ..inputs(&estimates) });
    assert_eq!(cold, Choice { now: Some(1), prefer: None, reason: Reason::LeastLoaded });
    // Both idle: rendezvous.
    let cold = choose(Policy::CacheAware, &[idle(0), idle(1)], &Inputs { cold: true, ..inputs(&estimates) });
    assert_eq!(cold.reason, Reason::Cold);
}

#[test]
fn a_cold_conversation_goes_to_a_backend_within_the_bound() {
    let with_held = |held: [usize; 2]| [0, 1].map(|i| Estimate { held_sequences: held[i], ..estimate(5_000, 0) });
    // Rendezvous alone would send this conversation to `first`.
    let estimates = with_held([0, 0]);
    let first = choose(Policy::CacheAware, &[idle(0), idle(1)], &Inputs { cold: true, ..inputs(&estimates) })
        .now
        .expect("free");
    let other = 1 - first;
    // Even: rendezvous still.
    let mut held = [1, 1];
    let estimates = with_held(held);
    assert_eq!(
        choose(Policy::CacheAware, &[idle(0), idle(1)], &Inputs { cold: true, ..inputs(&estimates) }).now,
        Some(first)
    );
    // `first` holding one more: the other.
    held[first] = 2;
    held[other] = 1;
    let estimates = with_held(held);
    assert_eq!(
        choose(Policy::CacheAware, &[idle(0), idle(1)], &Inputs { cold: true, ..inputs(&estimates) }).now,
        Some(other)
    );
    // A warm conversation stays where it is cached, whatever the counts.
    let mut estimates = with_held([9, 0]);
    estimates[0].cached_tokens = 4_000;
    assert_eq!(choose(Policy::CacheAware, &[idle(0), idle(1)], &inputs(&estimates)).now, Some(0));
}

#[test]
fn a_near_tie_goes_to_the_lighter() {
    let candidates = [Candidate { in_flight: 1, free_slots: 1, ..idle(0) }, idle(1)];
    // 5.0 s against 5.1 s of prefill (and a short service: a small wait): within the tie fraction.
    let quick = |prompt| Estimate { service: Duration::from_millis(10), ..estimate(prompt, 0) };
    let estimates = [quick(5_000), quick(5_100)];
    let choice = choose(Policy::CacheAware, &candidates, &inputs(&estimates));
    assert_eq!(choice, Choice { now: Some(1), prefer: None, reason: Reason::LeastLoaded });
}

#[test]
fn a_busy_holder_is_waited_for_while_waiting_beats_prefilling_elsewhere() {
    let candidates = [idle(0), busy(1)];
    // Backend 1 holds 49k of 50k: 1 s of prefill plus a 5 s wait (one ahead: 10 s ÷ 2 slots),
    // against 50 s of prefill on backend 0.
    let estimates = [estimate(50_000, 0), estimate(50_000, 49_000)];
    let choice = choose(Policy::CacheAware, &candidates, &inputs(&estimates));
    assert_eq!(choice.now, None);
    assert_eq!(choice.reason, Reason::CacheHit);
    let (backend, patience) = choice.prefer.expect("prefers");
    assert_eq!(backend, 1);
    // As long as its prefill (1 s) plus the wait stays under 50 s.
    assert!((patience.as_secs_f64() - 49.0).abs() < 1e-6, "{patience:?}");
}

#[test]
fn a_long_wait_sends_it_elsewhere() {
    let candidates = [idle(0), Candidate { waiting_for: 20, ..busy(1) }];
    let estimates = [estimate(5_000, 0), estimate(5_000, 4_900)];
    let choice = choose(Policy::CacheAware, &candidates, &inputs(&estimates));
    assert_eq!(choice, Choice { now: Some(0), prefer: None, reason: Reason::LeastLoaded });
}

#[test]
fn all_busy_prefers_the_cheapest_for_a_while() {
    let candidates = [busy(0), busy(1)];
    let estimates = [estimate(5_000, 0), estimate(5_000, 4_000)];
    let choice = choose(Policy::CacheAware, &candidates, &inputs(&estimates));
    assert_eq!(choice.now, None);
    assert_eq!(choice.prefer.map(|p| p.0), Some(1));
}

#[test]
fn no_usable_backend_or_only_one() {
    let estimates = [estimate(10, 0), estimate(10, 0)];
    for policy in [Policy::CacheAware, Policy::LeastLoaded, Policy::RoundRobin, Policy::Session] {
        let none = [Candidate { usable: false, ..idle(0) }, Candidate { usable: false, ..idle(1) }];
        assert_eq!(choose(policy, &none, &inputs(&estimates)), Choice::wait_for_any(Reason::NoneUsable));
        let one = [Candidate { usable: false, ..idle(0) }, idle(1)];
        assert_eq!(
            choose(policy, &one, &inputs(&estimates)),
            Choice { now: Some(1), prefer: None, reason: Reason::OnlyChoice }
        );
        let one_busy = [Candidate { usable: false, ..idle(0) }, busy(1)];
        assert_eq!(choose(policy, &one_busy, &inputs(&estimates)), Choice::wait_for_any(Reason::OnlyChoice));
    }
}

#[test]
fn least_loaded_takes_the_most_free_slots_then_the_fewest_in_flight() {
    let estimates = [estimate(10, 0); 3];
    let candidates =
        [Candidate { free_slots: 1, in_flight: 1, ..idle(0) }, idle(1), Candidate { free_slots: 1, ..idle(2) }];
    let choice = choose(Policy::LeastLoaded, &candidates, &inputs(&estimates));
    assert_eq!(choice, Choice { now: Some(1), prefer: None, reason: Reason::LeastLoaded });
    let all_busy = [busy(0), busy(1)];
    assert_eq!(choose(Policy::LeastLoaded, &all_busy, &inputs(&estimates)), Choice::wait_for_any(Reason::LeastLoaded));
}

#[test]
fn round_robin_takes_each_in_turn_skipping_a_full_one() {
    let estimates = [estimate(10, 0); 3];
    let candidates = [idle(0), Candidate { usable: false, ..idle(1) }, idle(2)];
    let turns: Vec<Option<usize>> = (0..4)
        .map(|round_robin| choose(Policy::RoundRobin, &candidates, &Inputs { round_robin, ..inputs(&estimates) }).now)
        .collect();
    assert_eq!(turns, [Some(0), Some(2), Some(0), Some(2)]);
    let one_full = [busy(0), idle(1)];
    assert_eq!(choose(Policy::RoundRobin, &one_full, &inputs(&estimates)).now, Some(1));
}

#[test]
fn session_sticks_to_its_key_and_waits_for_it() {
    let estimates = [estimate(10, 0); 2];
    let with_key = |key: &str| Inputs { session: Some(rendezvous::key_of(key)), ..inputs(&estimates) };
    let first = choose(Policy::Session, &[idle(0), idle(1)], &with_key("session-a"));
    let target = first.now.expect("free");
    assert_eq!(first.reason, Reason::Session);
    let mut candidates = [idle(0), idle(1)];
    candidates[target] = busy(target);
    let again = choose(Policy::Session, &candidates, &with_key("session-a"));
    assert_eq!(again.now, None);
    assert_eq!(again.prefer, Some((target, SESSION_PATIENCE)));
    // Without a key: the conversation's.
    let a = choose(Policy::Session, &[idle(0), idle(1)], &inputs(&estimates));
    let b = choose(Policy::Session, &[idle(0), idle(1)], &Inputs { conversation: 7, ..inputs(&estimates) });
    assert_eq!(a, b);
}

fn candidate() -> impl Strategy<Value = (Candidate<'static>, Estimate)> {
    (
        any::<bool>(),
        0usize..3,
        0usize..4,
        0usize..6,
        1usize..4,
        0u64..20_000,
        0u64..20_000,
        1u64..30,
        0usize..6,
        0usize..6,
    )
        .prop_map(|(usable, free, in_flight, waiting, slots, prompt, cached, service, held, queued)| {
            (
                Candidate {
                    backend: 0,
                    name: "",
                    usable,
                    free_slots: free.min(slots),
                    in_flight,
                    waiting_for: waiting,
                    queued,
                    max_concurrency: slots,
                    mean_service: Duration::from_secs(service),
                },
                Estimate {
                    prompt_tokens: prompt,
                    cached_tokens: cached.min(prompt),
                    prefill_per_s: 500.0,
                    service: Duration::from_secs(service),
                    held_sequences: held,
                },
            )
        })
}

fn policy() -> impl Strategy<Value = Policy> {
    prop_oneof![Just(Policy::CacheAware), Just(Policy::LeastLoaded), Just(Policy::RoundRobin), Just(Policy::Session)]
}

proptest! {
    /// Whatever the state: a backend taken now is usable with a free slot; a preferred one is
    /// usable; nothing is chosen when none is usable.
    #[test]
    fn a_choice_is_always_usable(
        policy in policy(),
        drawn in proptest::collection::vec(candidate(), 1..5),
        conversation in any::<u64>(),
        round_robin in any::<u64>(),
        cold in any::<bool>(),
    ) {
        let candidates: Vec<Candidate> = drawn.iter().enumerate().map(|(i, (c, _))| Candidate { backend: i, name: NAMES[i], ..*c }).collect();
        let estimates: Vec<Estimate> = drawn.iter().map(|(_, e)| *e).collect();
        let choice = choose(policy, &candidates, &Inputs { estimates: &estimates, session: None, conversation, round_robin, cold });
        if let Some(b) = choice.now {
            prop_assert!(candidates[b].usable && candidates[b].free_slots > 0);
        }
        if let Some((b, _)) = choice.prefer {
            prop_assert!(candidates[b].usable);
            prop_assert!(choice.now.is_none());
        }
        if candidates.iter().all(|c| !c.usable) {
            prop_assert_eq!(choice, Choice::wait_for_any(Reason::NoneUsable));
        }
        // Two gateways fed alike choose alike; the candidates' order does not matter.
        let reversed: Vec<Candidate> = candidates.iter().rev().copied().collect();
        let reversed_estimates: Vec<Estimate> = estimates.iter().rev().copied().collect();
        let other = choose(policy, &reversed, &Inputs { estimates: &reversed_estimates, session: None, conversation, round_robin, cold });
        if policy != Policy::RoundRobin {
            prop_assert_eq!(choice.backend(), other.backend());
        }
    }

    /// `session` (and a cold `cache_aware` conversation on even backends): a backend leaving
    /// (drained, ejected) moves only the sessions it had.
    #[test]
    fn a_backend_leaving_moves_only_its_sessions(
        policy in prop_oneof![Just(Policy::Session), Just(Policy::CacheAware)],
        leaving in 0usize..4,
        keys in proptest::collection::vec(any::<u64>(), 1..50),
    ) {
        let estimates = [estimate(1_000, 0); 4];
        let all = [idle(0), idle(1), idle(2), idle(3)];
        let mut rest = all;
        rest[leaving].usable = false;
        for key in keys {
            let inputs = Inputs { session: Some(key), conversation: key, cold: true, ..inputs(&estimates) };
            let before = choose(policy, &all, &inputs).now.expect("free");
            let after = choose(policy, &rest, &inputs).now.expect("free");
            if before != leaving {
                prop_assert_eq!(before, after);
            }
        }
    }

    /// Cost rises with the uncached tokens and with the wait.
    #[test]
    fn cost_is_monotone_in_uncached_tokens_and_wait(
        (c, e) in candidate(),
        more_cached in 0u64..5_000,
        more_waiting in 0usize..5,
    ) {
        let base = cost(&c, &e);
        let cached = Estimate { cached_tokens: (e.cached_tokens + more_cached).min(e.prompt_tokens), ..e };
        prop_assert!(cost(&c, &cached) <= base);
        let waiting = Candidate { waiting_for: c.waiting_for + more_waiting, ..c };
        prop_assert!(cost(&waiting, &e) >= base);
        let queued = Candidate { queued: c.queued + more_waiting, ..c };
        prop_assert!(cost(&queued, &e) >= base);
        let full = Candidate { free_slots: 0, ..c };
        prop_assert!(cost(&full, &e) >= base);
    }

    /// Two idle backends, one holding more of the prompt: cache_aware takes it (beyond a tie).
    #[test]
    fn more_cached_wins_when_idle(prompt in 1_000u64..100_000, a in 0u64..100_000, b in 0u64..100_000) {
        let (a, b) = (a.min(prompt), b.min(prompt));
        let estimates = [estimate(prompt, a), estimate(prompt, b)];
        let choice = choose(Policy::CacheAware, &[idle(0), idle(1)], &inputs(&estimates));
        let gap = (estimates[0].prefill_seconds() - estimates[1].prefill_seconds()).abs();
        let faster = estimates[0].prefill_seconds().min(estimates[1].prefill_seconds());
        if gap > (faster * TIE_FRACTION).max(TIE_SECONDS) {
            prop_assert_eq!(choice.now, Some(if a > b { 0 } else { 1 }));
            prop_assert_eq!(choice.reason, Reason::CacheHit);
        }
    }
}

/// Both backends busy, the conversation held by the one with a request already waiting for
/// it: with no other request waiting, it waits for the other backend if that is sooner even with
/// the whole prefill (its own latency is all there is); with the model's queue full of other
/// requests, a whole prefill would lengthen all their waits, and it waits where it is cached.
#[test]
fn a_saturated_pool_keeps_a_conversation_where_it_is_cached() {
    // 3000 tokens, 2500 cached on backend 0; at 1000/s: 0.5 s there, 3 s on backend 1.
    // Both busy (2 slots, 10 s a request); one request already waits for backend 0.
    let estimates = [estimate(3000, 2500), estimate(3000, 0)];
    let busy = |c: Candidate<'static>| Candidate { free_slots: 0, in_flight: 2, max_concurrency: 2, ..c };
    let held = busy(Candidate { waiting_for: 1, ..idle(0) });
    let other = busy(idle(1));
    let alone = choose(Policy::CacheAware, &[held, other], &inputs(&estimates));
    assert_eq!(alone.prefer.map(|(b, _)| b), Some(1), "0.5 s + 10 s against 3 s + 5 s: {alone:?}");
    let queue = |c: Candidate<'static>| Candidate { queued: 4, ..c };
    let saturated = choose(Policy::CacheAware, &[queue(held), queue(other)], &inputs(&estimates));
    assert_eq!(saturated.prefer.map(|(b, _)| b), Some(0), "{saturated:?}");
    assert_eq!(saturated.reason, Reason::CacheHit, "{saturated:?}");
}
