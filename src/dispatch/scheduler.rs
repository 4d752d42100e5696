//! Which managed backend runs. Metal gives every process its own GPU context and MLX servers do
//! not share one, so at most one backend with `gpu: true` runs at a time — or, with a
//! `gpu_memory_budget`, as many as their footprints fit.
//!
//! The rules, applied by the pure [`decide`] over a snapshot of every managed backend, with what
//! the loop must remember between rounds kept in the pure [`Scheduler`] (both driven by tests
//! without processes), and carried out by the supervisors:
//! - a stopped backend with waiting requests is started, if the GPU is free (or it needs none,
//!   or its footprint fits the budget beside every running GPU backend's, all of them known);
//!   a `Start` sent but not yet picked up by the supervisor counts as starting, and a `Stop`
//!   not yet picked up as draining, so the GPU is never promised twice;
//! - otherwise the running GPU backend keeps serving its own requests until another GPU backend
//!   (the one whose oldest request has waited longest) is due, and then it is drained and
//!   stopped (with a budget: as many running backends as the other needs room from, all or
//!   none). That other backend is due when its oldest request has waited `swap_after` (requests
//!   are grouped by model) **and** longer than the running backend's oldest waiting request
//!   (else the swap would be undone at once for the older one), or when the running backend is
//!   stalled: no slot handed out or freed for `swap_after` (its slots are held by long requests,
//!   so its own waiters would not move anyway). A running backend with no work at all is swapped
//!   out at once, unless its clients are between requests (an agent running a tool): its last
//!   request is less than `swap_after` old and it has not yet served the round trip's cost (its
//!   residency below, without the `swap_after` floor);
//! - a backend is never stopped while it is starting: stopping it there throws away the start
//!   and, when its own waiters are the older ones, brings it straight back (the livelock of
//!   issue 7: a stopped and started every 0.5 s, forever);
//! - a backend that became ready keeps the GPU for its residency before it can be swapped out
//!   for another one's requests (unless it has nothing to do): at least `swap_after`, and at
//!   least `(1 − loading_share) ÷ loading_share` times the next one's measured start, so that
//!   under alternating demand starting servers takes at most `loading_share` of the GPU's time;
//!   cut short (never below `swap_after`) when the next one's oldest request would otherwise
//!   miss its `max_wait`. Once it has served its residency, it still serves the requests that
//!   waited for it to start (older than its time ready) before a swap back, unless it is stalled;
//! - a backend in crash backoff (`Restarting`) holds no process and serves nothing, so nothing is
//!   lost by stopping it: it is swapped out under the same rules as a ready one, without the
//!   residency (it was never ready) and without the stalled rule (its own waiters, if older,
//!   keep their turn: it will be back in at most one backoff);
//! - after a swap the backend it was made for starts next, even if the stopped one's own
//!   waiters are older: picking by age again here would restart the one just stopped;
//! - a ready backend with nothing to do for its `idle_timeout` is stopped;
//! - with a budget, while the running GPU backends' footprints are over it (a measured one
//!   grows as the server's caches fill), the idle ones (nothing to do for `swap_after`) are
//!   stopped, longest idle first, never the last one running.
//!
//! [`stands_in`] is the fallback rule the request path asks: a model whose backends are not
//! running, and would need a swap to run, is served by its `fallback:` model when that one's
//! backend is starting or ready.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::queue::{BackendQueue, QueueView};
use crate::activity::Activity;
use crate::backend::supervisor::{Command, Phase, Supervisor};
use crate::metrics::Metrics;

/// What the scheduler knows of one managed backend.
#[derive(Debug, Clone)]
pub struct BackendView {
    pub name: String,
    pub gpu: bool,
    pub phase: Phase,
    /// The supervisor's process generation: a `Start` was picked up once it changes.
    pub generation: u64,
    /// How long the current process has been ready (set only while `Ready`).
    pub ready_for: Option<Duration>,
    pub queue: QueueView,
    pub idle_timeout: Option<Duration>,
    /// How long its last start took (None: never started here).
    pub start_cost: Option<Duration>,
    /// The bytes it holds when loaded: written in the file, else measured (None: unknown, so
    /// it never runs beside another GPU backend).
    pub footprint: Option<u64>,
    /// How long its last process served, ready to stop (None: never ready here).
    pub last_residency: Option<Duration>,
    /// How long its requests in flight may go on once it is told to stop (`drain_timeout`).
    pub drain_timeout: Duration,
}

impl BackendView {
    /// Requests wait or run. Slots held for abandoned answers are not work: nobody waits for
    /// them, and stopping the server is what ends them.
    fn has_work(&self) -> bool {
        self.queue.waiting > 0 || self.queue.in_flight > self.queue.abandoned
    }
}

/// The scheduler's terms, from the configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// How long a request for a stopped GPU backend waits before a swap is considered, and the
    /// least time a backend keeps the GPU once ready (`swap_after`).
    pub swap_after: Duration,
    /// The largest share of the GPU's time starting servers may take under alternating demand
    /// (`loading_share`, in (0, 1]).
    pub loading_share: f64,
    /// Bytes GPU backends may hold at once (`gpu_memory_budget`); `None`: one at a time.
    pub gpu_memory_budget: Option<u64>,
}

impl Policy {
    /// One GPU backend at a time, kept only `swap_after`: the rules before loading was costed.
    pub fn by_timer(swap_after: Duration) -> Self {
        Policy { swap_after, loading_share: 1.0, gpu_memory_budget: None }
    }
}

/// Why a running GPU backend was swapped out (the label of `mlxgate_backend_swaps_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SwapReason {
    /// It had nothing to do.
    NoWork,
    /// The other's requests were due and it had kept the GPU its residency.
    Due,
    /// The other's oldest request would miss its `max_wait` unless it started now.
    MaxWait,
    /// No slot of it moved for `swap_after`: its own waiters were not moving either.
    Stalled,
    /// It was in crash backoff, holding no process.
    Backoff,
}

impl SwapReason {
    pub const ALL: [SwapReason; 5] =
        [SwapReason::NoWork, SwapReason::Due, SwapReason::MaxWait, SwapReason::Stalled, SwapReason::Backoff];

    pub fn label(self) -> &'static str {
        match self {
            SwapReason::NoWork => "no_work",
            SwapReason::Due => "due",
            SwapReason::MaxWait => "max_wait",
            SwapReason::Stalled => "stalled",
            SwapReason::Backoff => "backoff",
        }
    }
}

/// A decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Start(String),
    /// Drain and stop `running` so that `next`, whose requests are due, gets the GPU (or the
    /// room in the memory budget it needs).
    Swap {
        running: String,
        next: String,
        reason: SwapReason,
    },
    /// Stop a ready backend unused for its `idle_timeout`.
    StopIdle(String),
}

/// The scheduling rules over a snapshot of every managed backend. `swap_target` is the backend
/// the last swap was made for, while it has not started yet.
pub fn decide(views: &[BackendView], swap_target: Option<&str>, policy: &Policy) -> Vec<Action> {
    let mut actions = Vec::new();
    for v in views {
        let idle = v.idle_timeout.is_some_and(|t| v.queue.idle_for >= t);
        if v.phase == Phase::Ready && !v.has_work() && idle {
            actions.push(Action::StopIdle(v.name.clone()));
        }
        if !v.gpu && v.phase == Phase::Stopped && v.queue.waiting > 0 {
            actions.push(Action::Start(v.name.clone()));
        }
    }

    over_budget(views, policy, &mut actions);
    let gpu: Vec<&BackendView> = views.iter().filter(|v| v.gpu).collect();
    let Some(next) = next_gpu_backend(&gpu, swap_target) else { return actions };
    let running: Vec<&BackendView> = gpu.iter().copied().filter(|v| v.phase.is_running()).collect();
    if running.is_empty() || fits(next, &running, policy.gpu_memory_budget) {
        actions.push(Action::Start(next.name.clone()));
        return actions;
    }
    // Room for `next`: the running backends that may give the GPU up for it, those with nothing
    // to do first, then the longest ready; all of them or none (a partial eviction frees
    // nothing `next` can use).
    let mut candidates: Vec<(&BackendView, SwapReason)> = running
        .iter()
        .filter(|r| !actions.contains(&Action::StopIdle(r.name.clone())))
        .filter_map(|r| may_swap_out(r, next, policy).map(|why| (*r, why)))
        .collect();
    candidates.sort_by_key(|(r, _)| (r.has_work(), std::cmp::Reverse(r.ready_for)));
    let mut staying = running;
    let mut swaps = Vec::new();
    for (r, reason) in candidates {
        staying.retain(|s| s.name != r.name);
        swaps.push(Action::Swap { running: r.name.clone(), next: next.name.clone(), reason });
        if staying.is_empty() || fits(next, &staying, policy.gpu_memory_budget) {
            actions.extend(swaps);
            break;
        }
    }
    actions
}

/// Footprints grow after a backend started beside another (a measured one is the most measured
/// so far: the server's caches fill). While the running GPU backends' footprints are over the
/// budget, the idle ones (nothing to do for `swap_after`: not between their clients' requests)
/// are stopped, longest idle first, until what runs fits again — never the last one running.
/// Found by the review of issue 22.
fn over_budget(views: &[BackendView], policy: &Policy, actions: &mut Vec<Action>) {
    let Some(budget) = policy.gpu_memory_budget else { return };
    let running: Vec<&BackendView> = views.iter().filter(|v| v.gpu && v.phase.is_running()).collect();
    let Some(mut total) = running.iter().map(|v| v.footprint).sum::<Option<u64>>() else { return };
    let mut idle: Vec<&BackendView> = running
        .iter()
        .copied()
        .filter(|v| v.phase == Phase::Ready && !v.has_work() && v.queue.idle_for >= policy.swap_after)
        .collect();
    idle.sort_by_key(|v| std::cmp::Reverse(v.queue.idle_for));
    let mut left = running.len();
    for v in idle {
        if total <= budget || left <= 1 {
            break;
        }
        let stop = Action::StopIdle(v.name.clone());
        if !actions.contains(&stop) {
            actions.push(stop);
        }
        total = total.saturating_sub(v.footprint.unwrap_or_default());
        left -= 1;
    }
}

/// Whether `next` may run beside `running` within the memory budget: a budget is set and
/// every footprint is known and their sum fits it.
pub fn fits(next: &BackendView, running: &[&BackendView], budget: Option<u64>) -> bool {
    let (Some(budget), Some(own)) = (budget, next.footprint) else { return false };
    let others: Option<u64> = running.iter().map(|r| r.footprint).sum();
    others.is_some_and(|others| own.saturating_add(others) <= budget)
}

/// Whether a model served by `own` backends (all managed) is better served now by its
/// fallback, served by `fallback`: none of its own runs, starting one would need a swap (the
/// GPU is busy and it does not fit the budget beside what runs), and one of the fallback's
/// backends is starting or ready. Requests of the model already waiting for its own backend
/// (queued before the fallback's was loaded) still wait for it, and may swap it in; new ones go
/// to the fallback. Pure, over the supervisors' latest views.
pub fn stands_in(views: &[BackendView], own: &[&str], fallback: &[&str], budget: Option<u64>) -> bool {
    let view = |name: &&str| views.iter().find(|v| v.name == *name);
    let own: Vec<&BackendView> = own.iter().filter_map(view).collect();
    let loaded = |v: &&BackendView| matches!(v.phase, Phase::Starting | Phase::Ready);
    if own.is_empty() || own.iter().any(|v| v.phase.is_running() || !v.gpu) {
        return false;
    }
    let running: Vec<&BackendView> = views.iter().filter(|v| v.gpu && v.phase.is_running()).collect();
    let needs_swap = !running.is_empty() && own.iter().all(|v| !fits(v, &running, budget));
    needs_swap && fallback.iter().filter_map(view).any(|v| loaded(&v))
}

/// The stopped GPU backend that gets the GPU next: the swap's target while it still has
/// waiting requests, else the one whose oldest request has waited longest.
fn next_gpu_backend<'a>(gpu: &[&'a BackendView], swap_target: Option<&str>) -> Option<&'a BackendView> {
    let due = || gpu.iter().copied().filter(|v| v.phase == Phase::Stopped && v.queue.waiting > 0);
    let target = swap_target.and_then(|t| due().find(|v| v.name == t));
    target.or_else(|| due().min_by_key(|v| std::cmp::Reverse(v.queue.oldest_wait.unwrap_or_default())))
}

/// How long `running`, ready, keeps the GPU before it may be swapped out for `next`: at least
/// `swap_after`, and long enough that the round trip — `next` started, and `running` started
/// again when its requests come back — costs at most `loading_share` of the GPU's time:
/// `(1 − s) ÷ s × (next's start + running's start)`, less the time `next` stayed the last time
/// it was loaded (its stay is the other part of the round trip; a model with little to do
/// stays briefly, so the one it interrupts carries the round trip's cost). At 20 %: 4× the two
/// starts. A start never measured counts 0.
pub fn residency(running: &BackendView, next: &BackendView, policy: &Policy) -> Duration {
    policy.swap_after.max(round_trip_cost(running, next, policy))
}

/// The residency by cost alone (without its `swap_after` floor).
fn round_trip_cost(running: &BackendView, next: &BackendView, policy: &Policy) -> Duration {
    let share = policy.loading_share.clamp(f64::MIN_POSITIVE, 1.0);
    let starts = next.start_cost.unwrap_or_default() + running.start_cost.unwrap_or_default();
    // Saturating: a tiny share (or a huge start) must not overflow `Duration` (a panic would
    // end the scheduler's task, and nothing would start again).
    let round_trip = Duration::try_from_secs_f64(starts.as_secs_f64() * (1.0 - share) / share).unwrap_or(Duration::MAX);
    round_trip.saturating_sub(next.last_residency.unwrap_or_default())
}

/// Whether `next`'s oldest request can be served within its `max_wait` only if `next` starts
/// now: it has waited as long as its bound less the time the swap takes — `running`'s drain
/// ([`drain_allowance`]), `next`'s start and a round of the scheduler.
pub fn due_by_max_wait(running: &BackendView, next: &BackendView) -> bool {
    let waited = next.queue.oldest_wait.unwrap_or_default();
    let swap_takes = drain_allowance(running) + next.start_cost.unwrap_or_default() + TICK;
    waited.saturating_add(swap_takes) >= next.queue.max_wait
}

/// How long `running`'s requests in flight are expected to go on once it is told to stop: twice
/// its mean request time and a second, never more than its `drain_timeout`. An estimate: a request far longer than its backend's usual ones can
/// still make the next one's request miss its `max_wait`; `drain_timeout` bounds the wait.
pub fn drain_allowance(running: &BackendView) -> Duration {
    // Also with nothing in flight: a backend kept while its clients are between requests may
    // be busy again by the time the next one's request is due.
    (running.queue.mean_service * 2 + Duration::from_secs(1)).min(running.drain_timeout)
}

/// The run loop's period when nothing wakes it.
const TICK: Duration = Duration::from_millis(250);

/// Whether the running GPU backend gives the GPU up for `next` now, and why (see the module's
/// rules).
fn may_swap_out(running: &BackendView, next: &BackendView, policy: &Policy) -> Option<SwapReason> {
    let swap_after = policy.swap_after;
    let can_stop = matches!(running.phase, Phase::Ready | Phase::Restarting);
    if !running.has_work() {
        // Its clients may be between requests (an agent runs a tool, then asks again): a swap
        // now would bring it back at once, its round trip unpaid. Found by the simulation
        // (tests/it/swap_schedule.rs): agents sending side calls to a small model spent 66 % of
        // the GPU's time starting servers, 22 % with this rule.
        let between_requests = running.phase == Phase::Ready
            && running.queue.idle_for < policy.swap_after
            && running.ready_for.is_some_and(|r| r < round_trip_cost(running, next, policy))
            && !due_by_max_wait(running, next);
        return (can_stop && !between_requests).then_some(SwapReason::NoWork);
    }
    let waited = next.queue.oldest_wait.unwrap_or_default();
    let due = waited >= swap_after;
    let older = waited > running.queue.oldest_wait.unwrap_or_default();
    match running.phase {
        Phase::Ready => {
            let stalled = running.queue.since_progress >= swap_after;
            // After a swap, the backend serves the queue that waited for it to start before a
            // swap back is considered (a waiter older than its residency came before it was
            // ready) — unless it is stalled, and not serving that queue anyway.
            let backlog =
                |t: Duration| !stalled && running.queue.waiting > 0 && running.queue.oldest_wait.is_some_and(|w| w > t);
            let ready_for = running.ready_for.unwrap_or(Duration::MAX);
            let served = ready_for >= residency(running, next, policy) && !backlog(ready_for);
            let last_chance = ready_for >= swap_after && due_by_max_wait(running, next);
            if !due || !(older || stalled) {
                return None;
            }
            if served {
                Some(if stalled && !older { SwapReason::Stalled } else { SwapReason::Due })
            } else if last_chance {
                Some(SwapReason::MaxWait)
            } else {
                None
            }
        }
        Phase::Restarting => (due && older).then_some(SwapReason::Backoff),
        // Starting: never (see the module's rules); draining: a swap is under way.
        _ => None,
    }
}

/// What the run loop remembers between rounds, pure so that tests can drive it: commands sent
/// but not yet seen carried out, and the target of the last swap.
#[derive(Debug, Clone)]
pub struct Scheduler {
    policy: Policy,
    /// Backends sent `Start` while stopped, with the generation they had then.
    starting: HashMap<String, u64>,
    /// Backends sent a stop that are not yet stopped.
    stopping: HashSet<String>,
    /// The backend the last swap was made for, until it starts.
    swap_target: Option<String>,
}

impl Scheduler {
    pub fn new(policy: Policy) -> Self {
        Scheduler { policy, starting: HashMap::new(), stopping: HashSet::new(), swap_target: None }
    }

    /// One round over the supervisors' latest status: returns the commands to send now.
    pub fn step(&mut self, observed: &[BackendView]) -> Vec<Action> {
        let views = self.as_commanded(observed);
        let target = self
            .swap_target
            .clone()
            .filter(|t| views.iter().any(|v| v.name == *t && v.phase == Phase::Stopped && v.queue.waiting > 0));
        let actions: Vec<Action> = decide(&views, target.as_deref(), &self.policy)
            .into_iter()
            .filter(|a| match a {
                Action::Start(n) => !self.starting.contains_key(n),
                Action::Swap { running: n, .. } | Action::StopIdle(n) => !self.stopping.contains(n),
            })
            .collect();
        if target.is_none() {
            self.swap_target = None;
        }
        for action in &actions {
            match action {
                Action::Start(name) => {
                    let generation = views.iter().find(|v| v.name == *name).map_or(0, |v| v.generation);
                    self.starting.insert(name.clone(), generation);
                }
                Action::Swap { running, next, .. } => {
                    self.stopping.insert(running.clone());
                    self.swap_target = Some(next.clone());
                }
                Action::StopIdle(name) => {
                    self.stopping.insert(name.clone());
                }
            }
        }
        actions
    }

    /// The views as they will be once the commands already sent are picked up: a backend sent
    /// `Start` that still reads stopped is starting; one sent a stop that still runs is draining.
    /// Forgets the commands the supervisors have carried out.
    fn as_commanded(&mut self, observed: &[BackendView]) -> Vec<BackendView> {
        let mut views = observed.to_vec();
        for v in &mut views {
            let pending_start = self.starting.get(&v.name).is_some_and(|g| *g == v.generation);
            if pending_start && v.phase == Phase::Stopped {
                v.phase = Phase::Starting;
            } else {
                self.starting.remove(&v.name);
            }
            if matches!(v.phase, Phase::Stopped | Phase::Failed) {
                self.stopping.remove(&v.name);
            } else if self.stopping.contains(&v.name) && v.phase != Phase::Starting {
                v.phase = Phase::Draining;
                v.ready_for = None;
            }
        }
        views
    }
}

/// A managed backend as the scheduler sees it: its supervisor, and its queue (from `Dispatch`).
pub struct Managed {
    pub supervisor: Arc<Supervisor>,
    pub queue: BackendQueue,
}

/// Runs the rules whenever a queue or a backend changes (and on a short tick for timers).
pub async fn run(
    managed: Vec<Managed>,
    policy: Policy,
    changed: Arc<Notify>,
    metrics: Metrics,
    activity: Arc<Activity>,
) {
    let mut scheduler = Scheduler::new(policy);
    let by_name: HashMap<String, Arc<Supervisor>> =
        managed.iter().map(|m| (m.supervisor.config.name.clone(), Arc::clone(&m.supervisor))).collect();
    loop {
        let mut views = views_of(&managed);
        // A backend that cannot start (its program or venv is gone) is failed at once, before
        // any healthy backend is swapped out for it.
        for v in views.iter_mut().filter(|v| v.phase == Phase::Stopped && v.queue.waiting > 0) {
            if let Some(supervisor) = by_name.get(&v.name)
                && supervisor.preflight().is_err()
            {
                supervisor.send(Command::Refuse);
                v.queue.waiting = 0;
                v.queue.oldest_wait = None;
            }
        }
        for action in scheduler.step(&views) {
            let (name, command) = match &action {
                Action::Start(name) => (name, Command::Start),
                Action::Swap { running, next, reason } => {
                    metrics.backend_swaps.with_label_values(&[running.as_str(), reason.label()]).inc();
                    tracing::info!(backend = %running, next = %next, reason = reason.label(), "swapping out: another model's requests are due");
                    activity.swapped(running, Some(next), reason.label());
                    (running, Command::Stop)
                }
                Action::StopIdle(name) => {
                    tracing::info!(backend = %name, "stopping idle backend");
                    activity.swapped(name, None, "idle");
                    (name, Command::Stop)
                }
            };
            if let Some(supervisor) = by_name.get(name) {
                supervisor.send(command);
            }
        }
        tokio::select! {
            () = changed.notified() => {}
            () = tokio::time::sleep(TICK) => {}
        }
    }
}

/// The scheduler's views of the managed backends, now.
fn views_of(managed: &[Managed]) -> Vec<BackendView> {
    managed.iter().filter_map(|m| view_of(&m.supervisor, &m.queue)).collect()
}

/// The scheduler's view of a managed backend (None for a backend mlxgate does not run).
pub fn view_of(supervisor: &Supervisor, queue: &BackendQueue) -> Option<BackendView> {
    let managed = supervisor.config.managed.as_ref()?;
    let status = supervisor.status();
    Some(BackendView {
        name: supervisor.config.name.clone(),
        gpu: managed.gpu,
        phase: status.phase,
        generation: status.generation,
        ready_for: status.ready_since.filter(|_| status.phase == Phase::Ready).map(|t| t.elapsed()),
        queue: queue.view(),
        idle_timeout: managed.idle_timeout,
        start_cost: status.last_start,
        footprint: status.footprint,
        last_residency: status.last_residency,
        drain_timeout: managed.drain_timeout,
    })
}

#[cfg(test)]
mod tests;
