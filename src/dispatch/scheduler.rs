//! Which managed backend runs. Metal gives every process its own GPU context and MLX servers do
//! not share one, so at most one backend with `gpu: true` runs at a time.
//!
//! The rules, applied by the pure [`decide`] (unit-tested here with made-up views) and carried
//! out by the supervisors:
//! - a stopped backend with waiting requests is started, if the GPU is free (or it needs none);
//! - the running GPU backend keeps serving its own requests until another GPU backend's oldest
//!   waiting request has waited `swap_after` (requests are grouped by model, no thrashing) or
//!   until it has nothing left to do; then it is drained and stopped and the other one starts;
//!   the one whose request has waited longest goes next, so nobody starves;
//! - a ready backend with nothing to do for its `idle_timeout` is stopped.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::queue::QueueView;
use crate::backend::supervisor::{Command, Phase, Supervisor};
use crate::metrics::Metrics;

/// What the scheduler knows of one managed backend.
#[derive(Debug, Clone)]
pub struct BackendView {
    pub name: String,
    pub gpu: bool,
    pub phase: Phase,
    pub queue: QueueView,
    pub idle_timeout: Option<Duration>,
}

/// Why a backend is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// Another GPU backend's requests are due.
    Swap,
    /// Unused for its idle_timeout.
    Idle,
}

/// A decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Start(String),
    Stop(String, StopReason),
}

/// The scheduling rules over a snapshot of every managed backend.
pub fn decide(views: &[BackendView], swap_after: Duration) -> Vec<Action> {
    let mut actions = Vec::new();
    let has_work = |v: &BackendView| v.queue.waiting > 0 || v.queue.in_flight > 0;
    for v in views {
        let idle = v.idle_timeout.is_some_and(|t| v.queue.idle_for >= t);
        if v.phase == Phase::Ready && !has_work(v) && idle {
            actions.push(Action::Stop(v.name.clone(), StopReason::Idle));
        }
        if !v.gpu && v.phase == Phase::Stopped && v.queue.waiting > 0 {
            actions.push(Action::Start(v.name.clone()));
        }
    }

    let gpu: Vec<&BackendView> = views.iter().filter(|v| v.gpu).collect();
    // The one waiting longest goes first.
    let mut due: Vec<&&BackendView> = gpu.iter().filter(|v| v.phase == Phase::Stopped && v.queue.waiting > 0).collect();
    due.sort_by_key(|v| std::cmp::Reverse(v.queue.oldest_wait.unwrap_or_default()));
    let Some(next) = due.first() else { return actions };
    match gpu.iter().find(|v| v.phase.is_running()) {
        None => actions.push(Action::Start(next.name.clone())),
        // A swap is under way: wait for it to finish.
        Some(running) if running.phase == Phase::Draining => {}
        Some(running) => {
            let waited = next.queue.oldest_wait.unwrap_or_default();
            let already_stopping = actions.iter().any(|a| matches!(a, Action::Stop(n, _) if *n == running.name));
            if !already_stopping && (!has_work(running) || waited >= swap_after) {
                actions.push(Action::Stop(running.name.clone(), StopReason::Swap));
            }
        }
    }
    actions
}

/// Runs the rules whenever a queue or a backend changes (and on a short tick for timers).
pub async fn run(supervisors: Vec<Arc<Supervisor>>, swap_after: Duration, changed: Arc<Notify>, metrics: Metrics) {
    let mut sent: HashMap<String, Phase> = HashMap::new();
    let mut stopping: HashSet<String> = HashSet::new();
    let by_name: HashMap<String, Arc<Supervisor>> =
        supervisors.iter().map(|s| (s.config.name.clone(), Arc::clone(s))).collect();
    loop {
        let views: Vec<BackendView> = supervisors
            .iter()
            .filter_map(|s| {
                let managed = s.config.managed.as_ref()?;
                Some(BackendView {
                    name: s.config.name.clone(),
                    gpu: managed.gpu,
                    phase: s.status().phase,
                    queue: s.queue.view(),
                    idle_timeout: managed.idle_timeout,
                })
            })
            .collect();
        // Forget commands once the backend has moved on from the phase they were sent in.
        for v in &views {
            if sent.get(&v.name).is_some_and(|p| *p != v.phase) {
                sent.remove(&v.name);
            }
            if matches!(v.phase, Phase::Stopped | Phase::Failed) {
                stopping.remove(&v.name);
            }
        }
        for action in decide(&views, swap_after) {
            let (name, command) = match &action {
                Action::Start(name) => (name, Command::Start),
                Action::Stop(name, _) => (name, Command::Stop),
            };
            let phase = views.iter().find(|v| &v.name == name).map(|v| v.phase);
            let duplicate = match command {
                Command::Stop => stopping.contains(name),
                _ => sent.contains_key(name),
            };
            let (Some(phase), Some(supervisor), false) = (phase, by_name.get(name), duplicate) else { continue };
            match action {
                Action::Stop(_, StopReason::Swap) => {
                    metrics.backend_swaps.inc();
                    tracing::info!(backend = %name, "swapping out: another model's requests are due");
                }
                Action::Stop(_, StopReason::Idle) => tracing::info!(backend = %name, "stopping idle backend"),
                Action::Start(_) => {}
            }
            if command == Command::Stop {
                stopping.insert(name.clone());
            }
            sent.insert(name.clone(), phase);
            supervisor.send(command);
        }
        tokio::select! {
            () = changed.notified() => {}
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SWAP_AFTER: Duration = Duration::from_secs(10);

    fn view(name: &str, phase: Phase, waiting: usize, in_flight: usize, oldest_secs: Option<u64>) -> BackendView {
        BackendView {
            name: name.into(),
            gpu: true,
            phase,
            queue: QueueView {
                waiting,
                in_flight,
                oldest_wait: oldest_secs.map(Duration::from_secs),
                idle_for: Duration::ZERO,
            },
            idle_timeout: None,
        }
    }

    fn start(n: &str) -> Action {
        Action::Start(n.into())
    }

    fn swap(n: &str) -> Action {
        Action::Stop(n.into(), StopReason::Swap)
    }

    #[test]
    fn starts_the_backend_a_request_waits_for_when_the_gpu_is_free() {
        let views = [view("a", Phase::Stopped, 1, 0, Some(0)), view("b", Phase::Stopped, 0, 0, None)];
        assert_eq!(decide(&views, SWAP_AFTER), [start("a")]);
    }

    #[test]
    fn never_starts_a_second_gpu_backend() {
        for phase in [Phase::Starting, Phase::Ready, Phase::Restarting, Phase::Draining] {
            let views = [view("a", phase, 3, 1, Some(1)), view("b", Phase::Stopped, 1, 0, Some(1))];
            assert!(!decide(&views, SWAP_AFTER).contains(&start("b")), "{phase:?}");
        }
    }

    #[test]
    fn groups_requests_for_the_loaded_model_until_swap_after() {
        // a is busy and has more queued; b's request has waited less than swap_after.
        let views = [view("a", Phase::Ready, 4, 2, Some(3)), view("b", Phase::Stopped, 2, 0, Some(9))];
        assert_eq!(decide(&views, SWAP_AFTER), []);
        // Once b's oldest has waited swap_after, a is drained and stopped.
        let views = [view("a", Phase::Ready, 4, 2, Some(3)), view("b", Phase::Stopped, 2, 0, Some(10))];
        assert_eq!(decide(&views, SWAP_AFTER), [swap("a")]);
        // While a drains nothing else happens; once stopped, b starts.
        let views = [view("a", Phase::Draining, 4, 1, Some(3)), view("b", Phase::Stopped, 2, 0, Some(11))];
        assert_eq!(decide(&views, SWAP_AFTER), []);
        let views = [view("a", Phase::Stopped, 4, 0, Some(4)), view("b", Phase::Stopped, 2, 0, Some(12))];
        assert_eq!(decide(&views, SWAP_AFTER), [start("b")]);
    }

    #[test]
    fn swaps_at_once_when_the_running_backend_has_nothing_to_do() {
        let views = [view("a", Phase::Ready, 0, 0, None), view("b", Phase::Stopped, 1, 0, Some(0))];
        assert_eq!(decide(&views, SWAP_AFTER), [swap("a")]);
    }

    #[test]
    fn the_longest_waiting_backend_goes_next_so_nobody_starves() {
        let views = [
            view("a", Phase::Stopped, 1, 0, Some(30)),
            view("b", Phase::Stopped, 5, 0, Some(2)),
            view("c", Phase::Stopped, 1, 0, Some(12)),
        ];
        assert_eq!(decide(&views, SWAP_AFTER), [start("a")]);
        // Alternating demand: whoever runs is swapped out once the other has waited swap_after,
        // however many requests keep arriving for the running one.
        let mut running = "a";
        let mut other = "b";
        for _ in 0..4 {
            let views = [view(running, Phase::Ready, 50, 2, Some(1)), view(other, Phase::Stopped, 1, 0, Some(10))];
            assert_eq!(decide(&views, SWAP_AFTER), [swap(running)]);
            std::mem::swap(&mut running, &mut other);
        }
    }

    #[test]
    fn idle_backends_stop_and_gpu_free_backends_start_independently() {
        let mut idle = view("a", Phase::Ready, 0, 0, None);
        idle.idle_timeout = Some(Duration::from_secs(60));
        idle.queue.idle_for = Duration::from_secs(61);
        let mut cpu = view("emb", Phase::Stopped, 1, 0, Some(0));
        cpu.gpu = false;
        let actions = decide(&[idle.clone(), cpu], SWAP_AFTER);
        assert_eq!(actions, [Action::Stop("a".into(), StopReason::Idle), start("emb")]);
        idle.queue.idle_for = Duration::from_secs(59);
        assert_eq!(decide(&[idle], SWAP_AFTER), []);
    }

    #[test]
    fn a_failed_backend_does_not_hold_the_gpu() {
        let views = [view("a", Phase::Failed, 0, 0, None), view("b", Phase::Stopped, 1, 0, Some(0))];
        assert_eq!(decide(&views, SWAP_AFTER), [start("b")]);
    }
}
