//! The scheduler's rules, round by round over hand-made views (the random schedules are
//! `tests/it/swap_schedule.rs`).

use super::*;

const SWAP_AFTER: Duration = Duration::from_secs(10);

/// A GPU backend; a ready one has been ready for a minute and its queue moved just now.
fn view(name: &str, phase: Phase, waiting: usize, in_flight: usize, oldest_secs: Option<u64>) -> BackendView {
    BackendView {
        name: name.into(),
        gpu: true,
        phase,
        generation: 0,
        ready_for: (phase == Phase::Ready).then_some(Duration::from_secs(60)),
        queue: QueueView {
            waiting,
            in_flight,
            abandoned: 0,
            oldest_wait: oldest_secs.map(Duration::from_secs),
            idle_for: Duration::ZERO,
            since_progress: Duration::ZERO,
            max_wait: Duration::from_secs(300),
            mean_service: Duration::ZERO,
        },
        idle_timeout: None,
        start_cost: None,
        footprint: None,
        last_residency: None,
        drain_timeout: Duration::from_secs(60),
    }
}

fn start(n: &str) -> Action {
    Action::Start(n.into())
}

fn swap(running: &str, next: &str, reason: SwapReason) -> Action {
    Action::Swap { running: running.into(), next: next.into(), reason }
}

/// The default terms: one GPU backend at a time, loading at most a fifth of the time.
const POLICY: Policy = Policy { swap_after: SWAP_AFTER, loading_share: 0.2, gpu_memory_budget: None };

fn decide(views: &[BackendView]) -> Vec<Action> {
    super::decide(views, None, &POLICY)
}

#[test]
fn starts_the_backend_a_request_waits_for_when_the_gpu_is_free() {
    let views = [view("a", Phase::Stopped, 1, 0, Some(0)), view("b", Phase::Stopped, 0, 0, None)];
    assert_eq!(decide(&views), [start("a")]);
}

#[test]
fn never_starts_a_second_gpu_backend() {
    for phase in [Phase::Starting, Phase::Ready, Phase::Restarting, Phase::Draining] {
        let views = [view("a", phase, 3, 1, Some(1)), view("b", Phase::Stopped, 1, 0, Some(1))];
        assert!(!decide(&views).contains(&start("b")), "{phase:?}");
    }
}

#[test]
fn groups_requests_for_the_loaded_model_until_swap_after() {
    // a is busy and has more queued; b's request has waited less than swap_after.
    let views = [view("a", Phase::Ready, 4, 2, Some(3)), view("b", Phase::Stopped, 2, 0, Some(9))];
    assert_eq!(decide(&views), []);
    // Once b's oldest has waited swap_after (and longer than a's oldest), a is drained.
    let views = [view("a", Phase::Ready, 4, 2, Some(3)), view("b", Phase::Stopped, 2, 0, Some(10))];
    assert_eq!(decide(&views), [swap("a", "b", SwapReason::Due)]);
    // While a drains nothing else happens; once stopped, b starts.
    let views = [view("a", Phase::Draining, 4, 1, Some(3)), view("b", Phase::Stopped, 2, 0, Some(11))];
    assert_eq!(decide(&views), []);
    let views = [view("a", Phase::Stopped, 4, 0, Some(4)), view("b", Phase::Stopped, 2, 0, Some(12))];
    assert_eq!(decide(&views), [start("b")]);
}

#[test]
fn swaps_at_once_when_the_running_backend_has_nothing_to_do() {
    let mut a = view("a", Phase::Ready, 0, 0, None);
    // Even just after it became ready: the minimum time protects work, and it has none.
    a.ready_for = Some(Duration::ZERO);
    let views = [a, view("b", Phase::Stopped, 1, 0, Some(0))];
    assert_eq!(decide(&views), [swap("a", "b", SwapReason::NoWork)]);
}

#[test]
fn the_longest_waiting_backend_goes_next_so_nobody_starves() {
    let views = [
        view("a", Phase::Stopped, 1, 0, Some(30)),
        view("b", Phase::Stopped, 5, 0, Some(2)),
        view("c", Phase::Stopped, 1, 0, Some(12)),
    ];
    assert_eq!(decide(&views), [start("a")]);
    // Alternating demand: whoever runs is swapped out once the other has waited swap_after
    // and longer than the running one's oldest, however many requests it has queued.
    let mut running = "a";
    let mut other = "b";
    for _ in 0..4 {
        let views = [view(running, Phase::Ready, 50, 2, Some(1)), view(other, Phase::Stopped, 1, 0, Some(10))];
        assert_eq!(decide(&views), [swap(running, other, SwapReason::Due)]);
        std::mem::swap(&mut running, &mut other);
    }
}

#[test]
fn is_not_swapped_out_for_requests_younger_than_its_own_waiters() {
    // New rule (the old one swapped here): a works through its queue, whose oldest request
    // is older than b's; swapping would bring a straight back for it.
    let views = [view("a", Phase::Ready, 3, 1, Some(15)), view("b", Phase::Stopped, 1, 0, Some(12))];
    assert_eq!(decide(&views), []);
    // Unless a is stalled: no slot moved for swap_after (a long request holds it), so its
    // waiters would not move either.
    let mut stalled = view("a", Phase::Ready, 3, 1, Some(15));
    stalled.queue.since_progress = SWAP_AFTER;
    assert_eq!(decide(&[stalled, view("b", Phase::Stopped, 1, 0, Some(12))]), [swap("a", "b", SwapReason::Stalled)]);
}

#[test]
fn never_stops_a_backend_that_is_still_starting() {
    // New rule (the old one stopped a here: the livelock).
    for a_waiting in [0, 1] {
        let views = [view("a", Phase::Starting, a_waiting, 0, Some(1)), view("b", Phase::Stopped, 1, 0, Some(99))];
        assert_eq!(decide(&views), [], "a waiting {a_waiting}");
    }
}

#[test]
fn a_ready_backend_keeps_the_gpu_for_swap_after_before_a_swap() {
    let mut a = view("a", Phase::Ready, 0, 1, None);
    a.ready_for = Some(SWAP_AFTER - Duration::from_millis(1));
    a.queue.since_progress = SWAP_AFTER;
    let b = view("b", Phase::Stopped, 1, 0, Some(99));
    assert_eq!(decide(&[a.clone(), b.clone()]), []);
    a.ready_for = Some(SWAP_AFTER);
    assert_eq!(decide(&[a, b]), [swap("a", "b", SwapReason::Due)]);
}

#[test]
fn a_backend_in_crash_backoff_is_swapped_out_only_for_older_requests() {
    let b = view("b", Phase::Stopped, 1, 0, Some(12));
    // Nothing to do: at once.
    assert_eq!(decide(&[view("a", Phase::Restarting, 0, 0, None), b.clone()]), [swap("a", "b", SwapReason::NoWork)]);
    // Its own waiters are younger: swapped out once b has waited swap_after.
    assert_eq!(
        decide(&[view("a", Phase::Restarting, 2, 0, Some(5)), b.clone()]),
        [swap("a", "b", SwapReason::Backoff)]
    );
    let early = view("b", Phase::Stopped, 1, 0, Some(9));
    assert_eq!(decide(&[view("a", Phase::Restarting, 2, 0, Some(5)), early]), []);
    // Its own waiters are older: it keeps its turn.
    assert_eq!(decide(&[view("a", Phase::Restarting, 2, 0, Some(20)), b]), []);
}

#[test]
fn idle_backends_stop_and_gpu_free_backends_start_independently() {
    let mut idle = view("a", Phase::Ready, 0, 0, None);
    idle.idle_timeout = Some(Duration::from_secs(60));
    idle.queue.idle_for = Duration::from_secs(61);
    let mut cpu = view("emb", Phase::Stopped, 1, 0, Some(0));
    cpu.gpu = false;
    let actions = decide(&[idle.clone(), cpu]);
    assert_eq!(actions, [Action::StopIdle("a".into()), start("emb")]);
    idle.queue.idle_for = Duration::from_secs(59);
    assert_eq!(decide(&[idle]), []);
}

#[test]
fn a_failed_backend_does_not_hold_the_gpu() {
    let views = [view("a", Phase::Failed, 0, 0, None), view("b", Phase::Stopped, 1, 0, Some(0))];
    assert_eq!(decide(&views), [start("b")]);
}

#[test]
fn a_start_not_yet_picked_up_holds_the_gpu_and_is_sent_once() {
    let mut scheduler = Scheduler::new(POLICY);
    let a = view("a", Phase::Stopped, 1, 0, Some(0));
    assert_eq!(scheduler.step(&[a.clone(), view("b", Phase::Stopped, 0, 0, None)]), [start("a")]);
    // The supervisor has not picked the Start up yet (same generation, still stopped), and
    // b's request is now the older one: b must not start too, nor a be started twice.
    assert_eq!(scheduler.step(&[a.clone(), view("b", Phase::Stopped, 1, 0, Some(99))]), []);
    // Picked up, started, crashed and stopped again: a new generation, a new Start is due.
    let mut again = a;
    again.generation = 1;
    assert_eq!(scheduler.step(&[again, view("b", Phase::Stopped, 0, 0, None)]), [start("a")]);
}

#[test]
fn a_stop_not_yet_picked_up_is_sent_once() {
    let mut scheduler = Scheduler::new(POLICY);
    let views = [view("a", Phase::Ready, 0, 0, None), view("b", Phase::Stopped, 1, 0, Some(1))];
    assert_eq!(scheduler.step(&views), [swap("a", "b", SwapReason::NoWork)]);
    assert_eq!(scheduler.step(&views), []);
    let views = [view("a", Phase::Stopped, 0, 0, None), view("b", Phase::Stopped, 1, 0, Some(2))];
    assert_eq!(scheduler.step(&views), [start("b")]);
}

/// Issue 7's schedule, round by round: a long stream on a, a second request for a, then one
/// for b. The old rules started a again after stopping it for b, then stopped it again
/// while it was starting, forever.
#[test]
fn after_a_swap_its_target_starts_even_when_the_stopped_one_has_older_waiters() {
    let swap_after = Duration::from_secs(2);
    let mut scheduler = Scheduler::new(Policy { swap_after, ..POLICY });
    let mut a = view("a", Phase::Ready, 1, 1, Some(3));
    a.queue.since_progress = Duration::from_secs(5);
    let b = |secs| view("b", Phase::Stopped, 1, 0, Some(secs));
    // a is stalled behind its long stream: b's request is due after swap_after.
    assert_eq!(scheduler.step(&[a.clone(), b(1)]), []);
    assert_eq!(scheduler.step(&[a, b(2)]), [swap("a", "b", SwapReason::Stalled)]);
    // a drained and stopped; its waiter (4 s) is older than b's (3 s): b starts all the same.
    let a_stopped = view("a", Phase::Stopped, 1, 0, Some(4));
    assert_eq!(scheduler.step(&[a_stopped.clone(), b(3)]), [start("b")]);
    // b starting: not stopped, however long a's request has waited.
    let b_starting = view("b", Phase::Starting, 1, 0, Some(6));
    let mut a_old = a_stopped;
    a_old.queue.oldest_wait = Some(Duration::from_secs(7));
    assert_eq!(scheduler.step(&[a_old.clone(), b_starting]), []);
    // b ready and served its request: a's turn, at once since b has nothing left to do.
    let b_done = view("b", Phase::Ready, 0, 0, None);
    assert_eq!(scheduler.step(&[a_old, b_done]), [swap("b", "a", SwapReason::NoWork)]);
}

/// Issue 22: a backend that takes long to start is worth keeping loaded longer. The running
/// one keeps the GPU until the round trip's two starts (next's, and its own when it comes
/// back) are at most a fifth of the GPU's time: 4× the two starts, less what next stayed
/// the last time; unless next's oldest request would then miss its max_wait.
#[test]
fn a_ready_backend_keeps_the_gpu_four_times_the_round_trips_starts() {
    let mut a = view("a", Phase::Ready, 2, 1, Some(1));
    a.start_cost = Some(Duration::from_secs(10));
    let mut b = view("b", Phase::Stopped, 1, 0, Some(20));
    b.start_cost = Some(Duration::from_secs(20));
    assert_eq!(residency(&a, &b, &POLICY), Duration::from_secs(120));
    a.ready_for = Some(Duration::from_secs(119));
    assert_eq!(decide(&[a.clone(), b.clone()]), [], "the round trip's starts would be over a fifth");
    a.ready_for = Some(Duration::from_secs(120));
    assert_eq!(decide(&[a.clone(), b.clone()]), [swap("a", "b", SwapReason::Due)]);
    // b stayed 100 s last time: that part of the round trip is expected again.
    b.last_residency = Some(Duration::from_secs(100));
    assert_eq!(residency(&a, &b, &POLICY), Duration::from_secs(20));
    b.last_residency = Some(Duration::from_secs(1000));
    assert_eq!(residency(&a, &b, &POLICY), SWAP_AFTER, "never below swap_after");
    // Backends never started here: swap_after, as before.
    b.last_residency = None;
    b.start_cost = None;
    a.start_cost = None;
    assert_eq!(residency(&a, &b, &POLICY), SWAP_AFTER);
}

/// The loading share over a round trip stays within the bound whatever the two backends'
/// starts and however briefly the other one stays (it may run out of work at once).
#[test]
fn a_round_trip_spends_at_most_the_loading_share_starting() {
    for (sa, sb, stay_b) in [(1, 1, 0), (30, 2, 0), (2, 30, 5), (10, 10, 200), (60, 45, 1)] {
        let secs = Duration::from_secs;
        let mut a = view("a", Phase::Ready, 1, 1, Some(1));
        a.start_cost = Some(secs(sa));
        let mut b = view("b", Phase::Stopped, 1, 0, Some(1));
        b.start_cost = Some(secs(sb));
        b.last_residency = Some(secs(stay_b));
        let kept_a = residency(&a, &b, &POLICY);
        // b stays as long as it did (it has that much to do), then a comes back.
        let cycle = kept_a + secs(sb) + secs(stay_b) + secs(sa);
        let loading = secs(sa + sb).as_secs_f64() / cycle.as_secs_f64();
        assert!(loading <= 0.2 + 1e-9, "starts {sa}+{sb}, b stays {stay_b}: loading {loading}");
    }
}

#[test]
fn the_next_ones_max_wait_cuts_the_residency_short() {
    let mut a = view("a", Phase::Ready, 2, 1, Some(1));
    a.ready_for = Some(Duration::from_secs(60));
    let mut b = view("b", Phase::Stopped, 1, 0, Some(200));
    b.start_cost = Some(Duration::from_secs(30));
    b.queue.max_wait = Duration::from_secs(300);
    // 200 s waited + 30 s to start < 300 s: a keeps the GPU (its residency is 120 s).
    assert_eq!(decide(&[a.clone(), b.clone()]), []);
    // 270 s waited: starting b now is the last chance to serve it within 300 s.
    b.queue.oldest_wait = Some(Duration::from_secs(270));
    assert_eq!(decide(&[a.clone(), b.clone()]), [swap("a", "b", SwapReason::MaxWait)]);
    // Never before swap_after, whatever the wait.
    a.ready_for = Some(SWAP_AFTER - Duration::from_millis(1));
    assert_eq!(decide(&[a, b]), []);
}

#[test]
fn after_a_swap_the_queue_that_waited_for_it_is_served_before_a_swap_back() {
    // a became ready 150 s ago; its oldest waiter has waited 200 s: it came before a was
    // ready (the queue a was started for). b is due, but a serves that queue first.
    let mut a = view("a", Phase::Ready, 3, 2, Some(200));
    a.ready_for = Some(Duration::from_secs(150));
    let mut b = view("b", Phase::Stopped, 1, 0, Some(210));
    b.start_cost = Some(Duration::from_secs(30));
    assert_eq!(decide(&[a.clone(), b.clone()]), []);
    // Its backlog served (the oldest came after it was ready): b's turn.
    a.queue.oldest_wait = Some(Duration::from_secs(100));
    assert_eq!(decide(&[a.clone(), b.clone()]), [swap("a", "b", SwapReason::Due)]);
    // Unless b's oldest would miss its max_wait: then b goes first all the same.
    a.queue.oldest_wait = Some(Duration::from_secs(200));
    b.queue.max_wait = Duration::from_secs(240);
    assert_eq!(decide(&[a, b]), [swap("a", "b", SwapReason::MaxWait)]);
}

const GB: u64 = 1 << 30;

fn with_footprint(mut v: BackendView, gb: u64) -> BackendView {
    v.footprint = Some(gb * GB);
    v
}

fn budget(gb: u64) -> Policy {
    Policy { gpu_memory_budget: Some(gb * GB), ..POLICY }
}

#[test]
fn backends_that_fit_the_budget_run_side_by_side_without_a_swap() {
    let a = with_footprint(view("a", Phase::Ready, 2, 1, Some(1)), 20);
    let b = with_footprint(view("b", Phase::Stopped, 1, 0, Some(0)), 6);
    assert_eq!(super::decide(&[a.clone(), b.clone()], None, &budget(32)), [start("b")]);
    // Too big for what is left: the usual rules (b's request is not due yet: nothing).
    assert_eq!(super::decide(&[a.clone(), b.clone()], None, &budget(24)), []);
    // No budget: one at a time, whatever the footprints.
    assert_eq!(super::decide(&[a.clone(), b.clone()], None, &POLICY), []);
    // A footprint not known yet (never measured, not written) never runs beside another.
    let mut unknown = b.clone();
    unknown.footprint = None;
    assert_eq!(super::decide(&[a.clone(), unknown], None, &budget(32)), []);
    let mut a_unknown = a;
    a_unknown.footprint = None;
    assert_eq!(super::decide(&[a_unknown, b], None, &budget(32)), []);
}

#[test]
fn a_draining_backend_still_holds_its_memory() {
    let a = with_footprint(view("a", Phase::Draining, 0, 1, None), 20);
    let b = with_footprint(view("b", Phase::Stopped, 1, 0, Some(30)), 20);
    assert_eq!(super::decide(&[a, b], None, &budget(32)), []);
}

#[test]
fn room_is_made_by_stopping_as_many_as_needed_or_none() {
    // a and b run (10 GB each) in a 32 GB budget; c (20 GB) needs both gone.
    let mut a = with_footprint(view("a", Phase::Ready, 0, 0, None), 10);
    let mut b = with_footprint(view("b", Phase::Ready, 0, 0, None), 10);
    let c = with_footprint(view("c", Phase::Stopped, 1, 0, Some(30)), 20);
    // Stopping one (the idle a) is enough: 10 + 20 <= 32.
    b.queue.in_flight = 1;
    b.queue.oldest_wait = None;
    let got = super::decide(&[a.clone(), b.clone(), c.clone()], None, &budget(32));
    assert_eq!(got, [swap("a", "c", SwapReason::NoWork)]);
    // c of 30 GB needs both; b is busy and not yet due to give it up (ready 5 s): neither
    // is stopped, since stopping a alone frees nothing c can use.
    let c = with_footprint(c, 30);
    b.ready_for = Some(Duration::from_secs(5));
    b.queue.waiting = 1;
    b.queue.oldest_wait = Some(Duration::from_secs(1));
    assert_eq!(super::decide(&[a.clone(), b.clone(), c.clone()], None, &budget(32)), []);
    // Once b may give it up too, both are stopped for c.
    b.ready_for = Some(Duration::from_secs(60));
    a.ready_for = Some(Duration::from_secs(60));
    let got = super::decide(&[a, b, c], None, &budget(32));
    assert_eq!(got, [swap("a", "c", SwapReason::NoWork), swap("b", "c", SwapReason::Due)]);
}

/// Review of issue 22: a measured footprint grows (the server's caches fill) after another
/// backend started beside it; what runs is then over the budget.
#[test]
fn idle_backends_are_stopped_while_what_runs_is_over_the_budget_never_the_last() {
    let mut a = with_footprint(view("a", Phase::Ready, 0, 1, None), 26);
    a.queue.idle_for = Duration::ZERO;
    let mut b = with_footprint(view("b", Phase::Ready, 0, 0, None), 8);
    b.queue.idle_for = Duration::from_secs(60);
    assert_eq!(super::decide(&[a.clone(), b.clone()], None, &budget(40)), [], "34 GB fit 40");
    assert_eq!(super::decide(&[a.clone(), b.clone()], None, &budget(32)), [Action::StopIdle("b".into())]);
    // b between its clients' requests (idle less than swap_after), or busy: kept.
    let mut between = b.clone();
    between.queue.idle_for = SWAP_AFTER - Duration::from_millis(1);
    assert_eq!(super::decide(&[a.clone(), between], None, &budget(32)), []);
    // The last one running is never stopped for the budget, however big it grew.
    let mut alone = a.clone();
    alone.queue.in_flight = 0;
    alone.queue.idle_for = Duration::from_secs(60);
    assert_eq!(super::decide(&[alone], None, &budget(20)), []);
    // No budget, or a footprint not known: nothing to check.
    assert_eq!(super::decide(&[a.clone(), b.clone()], None, &POLICY), []);
    let mut unknown = b;
    unknown.footprint = None;
    assert_eq!(super::decide(&[a, unknown], None, &budget(32)), []);
}

#[test]
fn a_model_falls_back_only_while_its_backend_would_need_a_swap() {
    let coder = with_footprint(view("coder", Phase::Ready, 0, 1, None), 20);
    let haiku = with_footprint(view("haiku", Phase::Stopped, 0, 0, None), 6);
    let views = [coder.clone(), haiku.clone()];
    assert!(stands_in(&views, &["haiku"], &["coder"], None), "the GPU is busy with coder");
    assert!(!stands_in(&views, &["haiku"], &["coder"], Some(32 * GB)), "haiku fits beside coder: it starts");
    assert!(stands_in(&views, &["haiku"], &["coder"], Some(24 * GB)), "it does not fit");
    // The GPU is free: haiku starts for its own requests.
    let free = [view("coder", Phase::Stopped, 0, 0, None), haiku.clone()];
    assert!(!stands_in(&free, &["haiku"], &["coder"], None));
    // haiku is already starting or running: its own requests go to it.
    for phase in [Phase::Starting, Phase::Ready, Phase::Draining, Phase::Restarting] {
        let views = [coder.clone(), view("haiku", phase, 0, 0, None)];
        assert!(!stands_in(&views, &["haiku"], &["coder"], None), "{phase:?}");
    }
    // The fallback is starting: it will be loaded; draining or in backoff: it will not.
    for (phase, expected) in [(Phase::Starting, true), (Phase::Draining, false), (Phase::Restarting, false)] {
        let views = [view("coder", phase, 0, 0, None), haiku.clone()];
        assert_eq!(stands_in(&views, &["haiku"], &["coder"], None), expected, "{phase:?}");
    }
    // A failed own backend falls back too (better an answer than a 503).
    let failed = [coder, view("haiku", Phase::Failed, 0, 0, None)];
    assert!(stands_in(&failed, &["haiku"], &["coder"], None));
}

/// Issue 22, found by the simulation (`tests/it/swap_schedule.rs`, side calls, seed 12): an
/// agent between two requests (running a tool) leaves its model's backend without work for
/// a moment; swapping it out then for the small model's requests brings it back at once.
#[test]
fn a_backend_between_its_clients_requests_is_not_swapped_out_at_once() {
    let mut coder = view("coder", Phase::Ready, 0, 0, None);
    coder.start_cost = Some(Duration::from_secs(60));
    coder.ready_for = Some(Duration::from_secs(100));
    coder.queue.idle_for = Duration::from_secs(2);
    let mut haiku = view("haiku", Phase::Stopped, 1, 0, Some(30));
    haiku.start_cost = Some(Duration::from_secs(5));
    assert_eq!(decide(&[coder.clone(), haiku.clone()]), []);
    let no_work = [swap("coder", "haiku", SwapReason::NoWork)];
    // Nothing for swap_after: its clients are gone (or wait for haiku).
    let mut idle = coder.clone();
    idle.queue.idle_for = SWAP_AFTER;
    assert_eq!(decide(&[idle, haiku.clone()]), no_work);
    // Ready for the round trip's cost (4 × 65 s) already.
    let mut paid = coder.clone();
    paid.ready_for = Some(Duration::from_secs(260));
    assert_eq!(decide(&[paid, haiku.clone()]), no_work);
    // haiku's oldest request would miss its max_wait (300 s).
    let mut late = haiku.clone();
    late.queue.oldest_wait = Some(Duration::from_secs(296));
    assert_eq!(decide(&[coder.clone(), late]), no_work);
    // The rules before issue 22 (no cost): at once.
    assert_eq!(super::decide(&[coder, haiku], None, &Policy::by_timer(SWAP_AFTER)), no_work);
}

/// Review of issue 22: `loading_share: 1e-20` passes the configuration's check, and the
/// round trip's cost overflowed `Duration::mul_f64`, a panic in the scheduler's task.
#[test]
fn a_tiny_loading_share_keeps_a_backend_as_long_as_it_can_without_a_panic() {
    let mut a = view("a", Phase::Ready, 1, 1, Some(1));
    a.start_cost = Some(Duration::from_secs(10));
    let mut b = view("b", Phase::Stopped, 1, 0, Some(20));
    b.start_cost = Some(Duration::from_secs(30));
    let tiny = Policy { loading_share: 1e-20, ..POLICY };
    assert_eq!(residency(&a, &b, &tiny), Duration::MAX);
    assert_eq!(super::decide(&[a, b], None, &tiny), [], "kept: b's request is not yet at its max_wait");
}

#[test]
fn a_loading_share_of_one_keeps_a_backend_only_swap_after() {
    let a = view("a", Phase::Ready, 1, 1, Some(1));
    let mut b = view("b", Phase::Stopped, 1, 0, Some(20));
    b.start_cost = Some(Duration::from_secs(30));
    assert_eq!(residency(&a, &b, &Policy::by_timer(SWAP_AFTER)), SWAP_AFTER);
    assert_eq!(residency(&a, &b, &Policy { loading_share: 0.5, ..POLICY }), Duration::from_secs(30));
}
