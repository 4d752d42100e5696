//! The pool's rules on a manual clock: examples, and a property test over random schedules of
//! arrivals, releases, cancellations, drains, gates, failures, health reports and time (which
//! fires preference deadlines and the ends of ejections), driven the way `queue.rs` drives the
//! pool.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;
use crate::dispatch::route::{Reason, Router};

const POLICY: HealthPolicy = HealthPolicy { request_failures: 2, eject_for: Duration::from_secs(5) };

fn client(n: u8) -> ClientId {
    ClientId(format!("c{n}"))
}

/// A held slot, as the test keeps it.
#[derive(Debug, Clone, Copy)]
struct Slot {
    backend: usize,
    trial: bool,
}

/// The pool with a manual clock and the slots it handed out.
struct Harness {
    core: Core<u64>,
    now: Instant,
    held: Vec<Slot>,
    /// Queued waiters by their tag: (model, id).
    queued: HashMap<u64, (usize, u64)>,
    next_tag: u64,
    /// Ejections' ends, when the pool offers the backend's slots again.
    timers: Vec<(Instant, usize)>,
    refused: usize,
}

impl Harness {
    fn new(caps: &[usize], models: &[Vec<usize>]) -> Self {
        let now = Instant::now();
        let mut core = Core::default();
        for (b, &cap) in caps.iter().enumerate() {
            core.add_backend(&format!("b{b}"), cap, true, now);
        }
        for (m, backends) in models.iter().enumerate() {
            core.add_model(&format!("m{m}"), 8, Duration::from_secs(600), backends);
            if backends.len() > 1 {
                for &b in backends {
                    core.backends[b].policy = Some(POLICY);
                }
            }
        }
        Harness { core, now, held: Vec::new(), queued: HashMap::new(), next_tag: 0, timers: Vec::new(), refused: 0 }
    }

    /// Checks a grant the pool just made, and keeps its slot.
    fn granted(&mut self, g: Granted<u64>, b: usize) {
        let backend = &self.core.backends[b];
        assert!(
            backend.open && !backend.drained && backend.failure.is_none(),
            "granted {} while not taking",
            backend.name
        );
        assert!(g.waiter.excluded & bit(g.position) == 0, "granted an excluded backend");
        assert!(g.waiter.may_take(g.position, self.now), "granted past a live preference for another backend");
        assert_eq!(self.core.models[g.model].backends[g.position], b);
        self.queued.remove(&g.waiter.grant).expect("a queued waiter");
        self.held.push(Slot { backend: b, trial: g.trial });
    }

    fn hand_over(&mut self, b: usize) {
        if let Some(g) = self.core.hand_over(b, self.now) {
            self.granted(g, b);
        }
    }

    fn dispatch(&mut self, b: usize) {
        while let Some(g) = self.core.grant_free(b, self.now) {
            self.granted(g, b);
        }
    }

    fn dispatch_all(&mut self) {
        for b in 0..self.core.backends.len() {
            self.dispatch(b);
        }
    }

    fn refuse(&mut self, refused: Vec<Waiter<u64>>) {
        for w in refused {
            self.queued.remove(&w.grant).expect("a refused waiter was queued");
            self.refused += 1;
        }
    }

    fn health(&mut self, b: usize, change: Change) {
        match change {
            Change::None => {}
            Change::Ejected(until) => {
                self.dispatch_all();
                self.timers.push((until, b));
            }
            Change::Healed => self.dispatch(b),
        }
    }

    fn arrive(&mut self, m: usize, c: u8, excluded: u64, choice: Option<Choice>) -> bool {
        let tag = self.next_tag;
        self.next_tag += 1;
        let mut router =
            |_: &[Candidate<'_>]| choice.unwrap_or(Choice { now: None, prefer: None, reason: Reason::LeastLoaded });
        let router: Option<Router<'_>> = if choice.is_some() { Some(&mut router) } else { None };
        let ask = Ask { client: client(c), limit: Duration::MAX, excluded, router };
        match self.core.arrive(m, ask, self.now, || tag) {
            Ok(Arrival::Granted { position, backend, trial }) => {
                let b = self.core.backends[backend].name.clone();
                assert!(excluded & bit(position) == 0, "arrival granted an excluded backend {b}");
                let state = &self.core.backends[backend];
                assert!(state.open && !state.drained && state.failure.is_none(), "arrival granted {b} not taking");
                self.held.push(Slot { backend, trial });
                true
            }
            Ok(Arrival::Queued { id, .. }) => {
                self.queued.insert(tag, (m, id));
                false
            }
            Err(_) => {
                self.refused += 1;
                false
            }
        }
    }

    fn release(&mut self, k: usize, report: Option<bool>) {
        if self.held.is_empty() {
            return;
        }
        let slot = self.held.swap_remove(k % self.held.len());
        if let Some(ok) = report {
            let change = self.core.report(slot.backend, ok, self.now);
            self.health(slot.backend, change);
        }
        self.core.released(slot.backend, Duration::from_millis(10), false, true, slot.trial, self.now);
        self.hand_over(slot.backend);
    }

    fn cancel(&mut self, k: usize) {
        let mut tags: Vec<u64> = self.queued.keys().copied().collect();
        tags.sort_unstable();
        let Some(&tag) = tags.get(k % tags.len().max(1)) else { return };
        let (m, id) = self.queued[&tag];
        assert!(self.core.remove_waiter(m, id).is_some(), "a queued waiter is in the queue");
        self.queued.remove(&tag);
    }

    /// Time passes: preference deadlines (each waiter's own task) and ejections' ends fire.
    fn advance(&mut self, by: Duration) {
        self.now += by;
        let due: Vec<(usize, u64, u64)> = self
            .core
            .models
            .iter()
            .enumerate()
            .flat_map(|(m, model)| model.clients.iter().flat_map(move |(_, fifo)| fifo.iter().map(move |w| (m, w))))
            .filter(|(_, w)| w.prefer.is_some_and(|(_, until)| until <= self.now))
            .map(|(m, w)| (m, w.id, w.grant))
            .collect();
        for (m, id, tag) in due {
            if let Some((_, backend, trial)) = self.core.preference_over(m, id, self.now) {
                self.queued.remove(&tag).expect("queued");
                self.held.push(Slot { backend, trial });
            }
        }
        let (fired, pending): (Vec<_>, Vec<_>) = self.timers.iter().partition(|(until, _)| *until <= self.now);
        self.timers = pending;
        for (_, b) in fired {
            self.dispatch(b);
        }
    }

    /// The invariants: no slot leaks or overflows; the queue's count is its waiters; no waiter
    /// waits while a slot it may take is free (a preference never outlives its deadline).
    fn check(&self) {
        for (b, backend) in self.core.backends.iter().enumerate() {
            let held = self.held.iter().filter(|s| s.backend == b).count();
            assert_eq!(backend.in_flight, held, "{}: in_flight is the slots held", backend.name);
            assert!(backend.in_flight <= backend.max_concurrency, "{}: over max_concurrency", backend.name);
        }
        let mut queued = 0;
        for model in &self.core.models {
            let waiters: usize = model.clients.iter().map(|(_, fifo)| fifo.len()).sum();
            assert_eq!(model.waiting, waiters, "{}: waiting is its waiters", model.name);
            assert!(model.clients.iter().all(|(_, fifo)| !fifo.is_empty()), "no empty client FIFO");
            queued += waiters;
            for w in model.clients.iter().flat_map(|(_, fifo)| fifo.iter()) {
                for (p, &b) in model.backends.iter().enumerate() {
                    let backend = &self.core.backends[b];
                    let free = backend.takes_new(self.now) && backend.in_flight < backend.max_concurrency;
                    assert!(
                        !(w.may_take(p, self.now) && free),
                        "{} waits while {} has a slot for it",
                        model.name,
                        backend.name
                    );
                }
            }
        }
        assert_eq!(queued, self.queued.len(), "every waiter is queued, granted or refused");
    }

    /// Everything reopened, undrained and healed, time past every deadline, every slot
    /// released: every waiter has been served.
    fn finish(&mut self) {
        for b in 0..self.core.backends.len() {
            self.core.set_drained(b, false);
            self.core.open(b, self.now);
            let change = self.core.report(b, true, self.now);
            self.health(b, change);
            self.dispatch(b);
        }
        self.advance(Duration::from_secs(3600));
        self.check();
        let mut rounds = 0;
        while !self.held.is_empty() {
            self.release(0, Some(true));
            self.check();
            rounds += 1;
            assert!(rounds < 10_000, "the queue drains");
        }
        assert!(self.queued.is_empty(), "every waiter was granted or refused");
        assert!(self.core.backends.iter().all(|b| b.in_flight == 0));
    }
}

#[test]
fn a_waiter_is_bound_late_to_whichever_backend_frees_first() {
    let mut h = Harness::new(&[1, 1], &[vec![0, 1]]);
    assert!(h.arrive(0, 1, 0, None));
    assert!(h.arrive(0, 1, 0, None));
    assert_eq!((h.core.backends[0].in_flight, h.core.backends[1].in_flight), (1, 1), "spread");
    assert!(!h.arrive(0, 2, 0, None), "queued in the model's one queue");
    let second = h.held.iter().position(|s| s.backend == 1).expect("b1 held");
    h.release(second, None);
    assert_eq!(h.held.iter().filter(|s| s.backend == 1).count(), 1, "b1's slot went to the waiter");
    h.check();
    h.finish();
}

#[test]
fn a_preference_holds_until_its_deadline_then_any_slot_serves() {
    let mut h = Harness::new(&[1, 1], &[vec![0, 1]]);
    assert!(h.arrive(0, 1, 0, Some(Choice { now: Some(0), prefer: None, reason: Reason::CacheHit })));
    let prefer = Choice { now: None, prefer: Some((0, Duration::from_secs(2))), reason: Reason::CacheHit };
    assert!(!h.arrive(0, 2, 0, Some(prefer)), "b0 is busy: it waits for b0 although b1 is free");
    assert_eq!(h.core.backends[1].in_flight, 0);
    h.check();
    h.advance(Duration::from_secs(1));
    assert_eq!(h.core.backends[1].in_flight, 0, "still preferring");
    h.advance(Duration::from_secs(1));
    assert_eq!(h.core.backends[1].in_flight, 1, "at the deadline it takes b1");
    h.check();
    h.finish();
}

#[test]
fn a_drained_or_excluded_backend_gets_nobody_and_its_waiters_go_elsewhere() {
    let mut h = Harness::new(&[1, 1], &[vec![0, 1]]);
    h.core.set_drained(0, true);
    assert!(h.arrive(0, 1, 0, None));
    assert_eq!(h.core.backends[1].in_flight, 1, "not the drained one");
    assert!(!h.arrive(0, 2, bit(1), None), "b1 excluded, b0 drained: it waits");
    h.check();
    h.core.set_drained(0, false);
    h.dispatch_all();
    assert_eq!(h.core.backends[0].in_flight, 1, "undrained: it serves the waiter");
    h.check();
    h.finish();
}

#[test]
fn failures_in_a_row_eject_and_the_half_open_trial_decides() {
    let mut h = Harness::new(&[2, 2], &[vec![0, 1]]);
    for _ in 0..2 {
        let change = h.core.report(0, false, h.now);
        h.health(0, change);
    }
    assert_eq!(h.core.backends[0].health.label(h.now), "ejected");
    for c in 0..2 {
        assert!(h.arrive(0, c, 0, None));
    }
    assert_eq!(h.core.backends[0].in_flight, 0, "an ejected backend gets nothing");
    h.advance(Duration::from_secs(5));
    assert_eq!(h.core.backends[0].health.label(h.now), "half_open");
    assert!(h.arrive(0, 3, 0, Some(Choice { now: Some(0), prefer: None, reason: Reason::LeastLoaded })));
    assert_eq!(h.core.backends[0].in_flight, 1, "one trial");
    assert!(!h.core.backends[0].takes_new(h.now), "only one");
    let trial = h.held.iter().position(|s| s.backend == 0).expect("trial held");
    h.release(trial, Some(true));
    assert_eq!(h.core.backends[0].health, Health::Healthy, "the trial healed it");
    h.finish();
}

#[test]
fn a_model_whose_backends_all_failed_is_refused_and_its_waiters_too() {
    let mut h = Harness::new(&[1, 1], &[vec![0, 1], vec![0]]);
    assert!(h.arrive(1, 1, 0, None));
    assert!(!h.arrive(1, 2, 0, None));
    let refused = h.core.fail(0, "crashed 5 times");
    h.refuse(refused);
    assert_eq!(h.refused, 1, "the single-backend model's waiter");
    assert!(h.arrive(0, 3, 0, None), "the model of two goes on with b1");
    let refused = h.core.fail(1, "gone");
    h.refuse(refused);
    assert!(!h.arrive(0, 4, 0, None));
    assert_eq!(h.refused, 2);
    h.check();
}

#[test]
fn the_scheduler_counts_a_waiter_for_a_stopped_backend_only_when_no_other_serves_it() {
    let mut h = Harness::new(&[1, 1], &[vec![0, 1]]);
    h.core.close(0);
    assert!(h.arrive(0, 1, 0, None));
    assert!(!h.arrive(0, 2, 0, None));
    assert_eq!(h.core.waiting_for(0, h.now).0, 0, "b1 serves it: b0 is not started for it");
    h.core.close(1);
    assert_eq!(h.core.waiting_for(0, h.now).0, 1, "nobody else: b0 is needed");
}

/// One step of a random schedule.
#[derive(Debug, Clone)]
enum Op {
    Arrive { model: usize, client: u8, exclude: usize, choice: u8, target: usize, wait_ms: u64 },
    Release { k: usize, report: Option<bool> },
    Cancel { k: usize },
    Advance { ms: u64 },
    Drain { b: usize, on: bool },
    Gate { b: usize, open: bool },
    Fail { b: usize },
    Report { b: usize, ok: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, 0..3u8, 0..4usize, 0..4u8, 0..3usize, 0..3000u64).prop_map(
            |(model, client, exclude, choice, target, wait_ms)| Op::Arrive { model, client, exclude, choice, target, wait_ms }
        ),
        3 => (any::<usize>(), prop::option::of(any::<bool>())).prop_map(|(k, report)| Op::Release { k, report }),
        1 => any::<usize>().prop_map(|k| Op::Cancel { k }),
        2 => (0..4000u64).prop_map(|ms| Op::Advance { ms }),
        1 => (0..3usize, any::<bool>()).prop_map(|(b, on)| Op::Drain { b, on }),
        1 => (0..3usize, any::<bool>()).prop_map(|(b, open)| Op::Gate { b, open }),
        1 => (0..3usize).prop_map(|b| Op::Fail { b }),
        1 => (0..3usize, any::<bool>()).prop_map(|(b, ok)| Op::Report { b, ok }),
    ]
}

fn run(caps: &[usize], serves: &[Vec<bool>], ops: &[Op]) {
    let models: Vec<Vec<usize>> = serves
        .iter()
        .map(|row| {
            let backends: Vec<usize> = (0..caps.len()).filter(|&b| row[b]).collect();
            if backends.is_empty() { vec![0] } else { backends }
        })
        .collect();
    let mut h = Harness::new(caps, &models);
    for op in ops {
        match *op {
            Op::Arrive { model, client, exclude, choice, target, wait_ms } => {
                let m = model % models.len();
                let positions = models[m].len();
                // A request never excludes every backend (the call stops failing over first).
                let excluded = if positions > 1 && exclude < positions { bit(exclude) } else { 0 };
                let target = target % positions;
                let choice = match choice {
                    0 => None,
                    1 => Some(Choice { now: Some(target), prefer: None, reason: Reason::CacheHit }),
                    2 => Some(Choice {
                        now: None,
                        prefer: Some((target, Duration::from_millis(wait_ms))),
                        reason: Reason::CacheHit,
                    }),
                    _ => Some(Choice { now: None, prefer: None, reason: Reason::Cold }),
                };
                h.arrive(m, client, excluded, choice);
            }
            Op::Release { k, report } => h.release(k, report),
            Op::Cancel { k } => h.cancel(k),
            Op::Advance { ms } => h.advance(Duration::from_millis(ms)),
            Op::Drain { b, on } => {
                let b = b % caps.len();
                h.core.set_drained(b, on);
                h.dispatch_all();
            }
            Op::Gate { b, open } => {
                let b = b % caps.len();
                if open {
                    h.core.open(b, h.now);
                    h.dispatch(b);
                } else {
                    let refused = h.core.close(b);
                    h.refuse(refused);
                    h.dispatch_all();
                }
            }
            Op::Fail { b } => {
                let refused = h.core.fail(b % caps.len(), "failed");
                h.refuse(refused);
                h.dispatch_all();
            }
            Op::Report { b, ok } => {
                let b = b % caps.len();
                let change = h.core.report(b, ok, h.now);
                h.health(b, change);
            }
        }
        h.check();
    }
    h.finish();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn no_schedule_leaks_a_slot_overfills_a_backend_or_strands_a_waiter(
        caps in prop::collection::vec(1..=3usize, 1..=3),
        serves in prop::collection::vec(prop::collection::vec(any::<bool>(), 3), 1..=3),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        run(&caps, &serves, &ops);
    }
}

/// Found by review (issue 21): one outage is one ejection; a drained backend is nobody's wait.
mod reviewed {
    use super::*;

    fn plain(core: &mut Core<u64>, m: usize, c: u8, now: Instant) -> Arrival {
        let ask = Ask { client: client(c), limit: Duration::MAX, excluded: 0, router: None };
        core.arrive(m, ask, now, || 0).unwrap_or_else(|e| panic!("refused: {e}"))
    }

    /// A probe that keeps failing re-ejects every interval: one outage counts as many ejections
    /// (mlxgate_backend_ejections_total climbs every probe interval while a Mac is off).
    #[test]
    fn one_outage_is_one_ejection() {
        let now = Instant::now();
        let mut core: Core<u64> = Core::default();
        let a = core.add_backend("a", 1, true, now);
        for i in 0..6 {
            core.eject(a, Duration::from_secs(10), true, now + Duration::from_secs(10 * i));
        }
        assert_eq!(core.backends[a].ejections, 1, "the probe never passed in between: one outage");
    }

    /// A drained, stopped managed backend with waiters is counted for the scheduler, which
    /// starts it (or swaps the GPU to it, stopping another model's server) though it takes nothing.
    #[test]
    fn a_drained_backend_is_not_counted_for_the_scheduler() {
        let now = Instant::now();
        let mut core: Core<u64> = Core::default();
        let a = core.add_backend("a", 1, false, now);
        let solo = core.add_model("solo", 8, Duration::from_secs(600), &[a]);
        core.set_drained(a, true);
        assert!(matches!(plain(&mut core, solo, 1, now), Arrival::Queued { .. }));
        assert_eq!(core.waiting_for(a, now).0, 0, "the scheduler would start a drained backend");
    }
}
