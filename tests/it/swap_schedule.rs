//! GPU swaps never thrash (issue 7, "swap livelock").
//!
//! - `random_schedules_never_thrash`: a small discrete-event world of 2–3 GPU backends (random
//!   start times, service times, max_concurrency, drain timeouts, idle timeouts, crashes during
//!   start-up, delays before a supervisor picks a command up) driven by the real
//!   [`Scheduler`] over seeded random arrival schedules. It checks: never two GPU processes alive;
//!   never a stop sent to a starting backend; every request served or timed out on its own
//!   `max_wait` (or cut by a drain only when it runs longer than the drain timeout); swaps at most
//!   one per request; and, when the load is feasible, every request served.
//! - `issue_7_schedule_serves_both_waiting_requests`: the reported schedule with real
//!   `mlxgate-sim` processes behind the in-process gateway.

use std::collections::VecDeque;
use std::time::Duration;

use crate::common::*;
use mlxgate::backend::supervisor::Phase;
use mlxgate::dispatch::queue::QueueView;
use mlxgate::dispatch::scheduler::{Action, BackendView, Policy, Scheduler};
use serde_json::{Value, json};

// ---- The simulated world ----

/// One simulated tick, the world's unit of time.
const TICK_MS: u64 = 100;

fn ticks(n: u64) -> Duration {
    Duration::from_millis(n * TICK_MS)
}

/// SplitMix64: a seeded generator, so a failing schedule can be replayed from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `low..=high`.
    fn range(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

#[derive(Debug, Clone)]
struct BackendSpec {
    max_concurrency: usize,
    start: u64,
    drain: u64,
    idle_timeout: Option<u64>,
}

#[derive(Debug, Clone)]
struct RequestSpec {
    arrival: u64,
    backend: usize,
    service: u64,
    max_wait: u64,
}

/// One random schedule (all times in ticks).
#[derive(Debug, Clone)]
struct Case {
    seed: u64,
    swap_after: u64,
    backends: Vec<BackendSpec>,
    requests: Vec<RequestSpec>,
    /// Percent chance that a start-up crashes (0 for feasible cases).
    crash_percent: u64,
    /// Every request is served when this holds (see `feasible_case`).
    feasible: bool,
}

/// Feasible: no crashes; every request shorter than its backend's drain timeout and than
/// `swap_after` (so neither a drain nor the stalled rule ever cuts one); and every `max_wait` at
/// least one full round per request: a start, `swap_after`, a drain, a service and some ticks of
/// command delay. Each request gets the GPU within one such round once it is the oldest waiting
/// one, so this bound is generous.
fn feasible_case(seed: u64) -> Case {
    let mut rng = Rng(seed);
    let swap_after = rng.range(10, 30);
    let backends: Vec<BackendSpec> = (0..rng.range(2, 3))
        .map(|_| BackendSpec {
            max_concurrency: rng.range(1, 2) as usize,
            start: rng.range(2, 40),
            drain: rng.range(5, 20),
            idle_timeout: rng.chance(30).then(|| rng.range(5, 50)),
        })
        .collect();
    let n = rng.range(1, 10);
    let round = 40 + swap_after + 20 + 20 + 10;
    let requests = (0..n)
        .map(|_| {
            let backend = rng.range(0, backends.len() as u64 - 1) as usize;
            let longest = backends[backend].drain.min(swap_after) - 2;
            RequestSpec {
                arrival: rng.range(0, 300),
                backend,
                service: rng.range(1, longest),
                max_wait: n * round + rng.range(0, 100),
            }
        })
        .collect();
    Case { seed, swap_after, backends, requests, crash_percent: 0, feasible: true }
}

/// Anything goes: long requests, short waits, crashing start-ups.
fn any_case(seed: u64) -> Case {
    let mut rng = Rng(seed);
    let swap_after = rng.range(5, 30);
    let backends: Vec<BackendSpec> = (0..rng.range(2, 3))
        .map(|_| BackendSpec {
            max_concurrency: rng.range(1, 2) as usize,
            start: rng.range(1, 40),
            drain: rng.range(1, 20),
            idle_timeout: rng.chance(30).then(|| rng.range(1, 50)),
        })
        .collect();
    let requests = (0..rng.range(1, 16))
        .map(|_| RequestSpec {
            arrival: rng.range(0, 300),
            backend: rng.range(0, backends.len() as u64 - 1) as usize,
            service: rng.range(1, 120),
            max_wait: rng.range(5, 600),
        })
        .collect();
    let crash_percent = if rng.chance(50) { rng.range(10, 50) } else { 0 };
    Case { seed: seed ^ 1, swap_after, backends, requests, crash_percent, feasible: false }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum SimPhase {
    Stopped,
    Starting { ready_at: u64 },
    Ready { since: u64 },
    Draining { until: u64 },
    Restarting { until: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum SimCommand {
    Start,
    Stop,
}

/// A backend as its supervisor runs it: the same reactions to commands as
/// `backend::supervisor` (a stop while starting kills the start, none is read while draining,
/// a crash backs off and starts again by itself).
struct SimBackend {
    name: String,
    spec: BackendSpec,
    phase: SimPhase,
    generation: u64,
    crashes: u32,
    /// Commands sent and when the supervisor picks each up.
    inbox: VecDeque<(u64, SimCommand)>,
    waiting: VecDeque<usize>,
    /// Requests holding a slot, and when each ends.
    in_flight: Vec<(usize, u64)>,
    last_activity: u64,
    last_progress: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Outcome {
    Served,
    TimedOut,
    /// Still running when the drain timeout ended its backend.
    Cut,
}

struct World {
    case: Case,
    rng: Rng,
    now: u64,
    backends: Vec<SimBackend>,
    outcomes: Vec<Option<Outcome>>,
    scheduler: Scheduler,
    swaps: usize,
    /// What went wrong, if anything.
    violations: Vec<String>,
}

impl World {
    fn new(case: Case) -> Self {
        let backends = case
            .backends
            .iter()
            .enumerate()
            .map(|(i, spec)| SimBackend {
                name: format!("b{i}"),
                spec: spec.clone(),
                phase: SimPhase::Stopped,
                generation: 0,
                crashes: 0,
                inbox: VecDeque::new(),
                waiting: VecDeque::new(),
                in_flight: Vec::new(),
                last_activity: 0,
                last_progress: 0,
            })
            .collect();
        World {
            rng: Rng(case.seed.wrapping_mul(31)),
            now: 0,
            backends,
            outcomes: vec![None; case.requests.len()],
            scheduler: Scheduler::new(Policy {
                swap_after: ticks(case.swap_after),
                loading_share: 0.2,
                gpu_memory_budget: None,
            }),
            swaps: 0,
            violations: Vec::new(),
            case,
        }
    }

    /// Runs until every request has had its chance: the last arrival plus the longest wait,
    /// service, drain and start.
    fn run(mut self) -> Self {
        let r = &self.case.requests;
        let end = r.iter().map(|q| q.arrival + q.max_wait + q.service).max().unwrap_or(0) + 200;
        while self.now <= end {
            self.tick();
            self.now += 1;
        }
        self
    }

    fn tick(&mut self) {
        self.arrivals();
        for b in 0..self.backends.len() {
            self.supervise(b);
            self.read_commands(b);
            self.complete_and_grant(b);
            self.time_out(b);
        }
        let views: Vec<BackendView> = self.backends.iter().map(|b| self.view(b)).collect();
        for action in self.scheduler.step(&views) {
            let (name, command) = match &action {
                Action::Start(name) => (name, SimCommand::Start),
                Action::Swap { running, .. } => {
                    self.swaps += 1;
                    (running, SimCommand::Stop)
                }
                Action::StopIdle(name) => (name, SimCommand::Stop),
            };
            let delay = self.rng.range(1, 8);
            let now = self.now;
            let Some(b) = self.backends.iter_mut().find(|b| b.name == *name) else { continue };
            let start_pending = b.inbox.iter().any(|(_, c)| *c == SimCommand::Start);
            if command == SimCommand::Stop && (matches!(b.phase, SimPhase::Starting { .. }) || start_pending) {
                self.violations.push(format!("{} told to stop while starting at tick {now}", b.name));
            }
            b.inbox.push_back((now + delay, command));
        }
        let alive: Vec<&str> = self
            .backends
            .iter()
            .filter(|b| {
                matches!(b.phase, SimPhase::Starting { .. } | SimPhase::Ready { .. } | SimPhase::Draining { .. })
            })
            .map(|b| b.name.as_str())
            .collect();
        if alive.len() > 1 {
            self.violations.push(format!("two GPU processes alive at tick {}: {alive:?}", self.now));
        }
    }

    fn arrivals(&mut self) {
        for (id, r) in self.case.requests.iter().enumerate() {
            if r.arrival != self.now {
                continue;
            }
            let b = &mut self.backends[r.backend];
            b.last_activity = self.now;
            let open = matches!(b.phase, SimPhase::Ready { .. });
            if open && b.waiting.is_empty() && b.in_flight.len() < b.spec.max_concurrency {
                b.in_flight.push((id, self.now + r.service));
                b.last_progress = self.now;
            } else {
                b.waiting.push_back(id);
            }
        }
    }

    /// What the supervisor does by itself: become ready (or crash), end a drain, restart.
    fn supervise(&mut self, index: usize) {
        let now = self.now;
        let crash = self.rng.chance(self.case.crash_percent);
        let b = &mut self.backends[index];
        match b.phase {
            SimPhase::Starting { ready_at } if now >= ready_at && crash => {
                b.crashes += 1;
                let backoff = (10 << b.crashes.min(3)).min(80);
                b.phase = SimPhase::Restarting { until: now + backoff };
            }
            SimPhase::Starting { ready_at } if now >= ready_at => {
                b.crashes = 0;
                b.phase = SimPhase::Ready { since: now };
                b.last_progress = now;
            }
            SimPhase::Restarting { until } if now >= until => {
                b.generation += 1;
                b.phase = SimPhase::Starting { ready_at: now + b.spec.start };
            }
            SimPhase::Draining { until } if b.in_flight.is_empty() || now >= until => {
                for (id, _) in b.in_flight.drain(..) {
                    self.outcomes[id] = Some(Outcome::Cut);
                }
                b.phase = SimPhase::Stopped;
            }
            _ => {}
        }
    }

    /// The commands the supervisor has picked up by now (none while it drains).
    fn read_commands(&mut self, index: usize) {
        let now = self.now;
        let b = &mut self.backends[index];
        while !matches!(b.phase, SimPhase::Draining { .. }) && b.inbox.front().is_some_and(|(at, _)| *at <= now) {
            let Some((_, command)) = b.inbox.pop_front() else { break };
            match (command, b.phase) {
                (SimCommand::Start, SimPhase::Stopped) => {
                    b.generation += 1;
                    b.phase = SimPhase::Starting { ready_at: now + b.spec.start };
                }
                // Only when the stop was sent during a crash backoff that ended before the
                // supervisor read it (the scheduler never sends one to a starting backend).
                (SimCommand::Stop, SimPhase::Starting { .. }) => b.phase = SimPhase::Stopped,
                (SimCommand::Stop, SimPhase::Ready { .. }) => {
                    b.phase = SimPhase::Draining { until: now + b.spec.drain };
                }
                (SimCommand::Stop, SimPhase::Restarting { .. }) => b.phase = SimPhase::Stopped,
                _ => {}
            }
        }
    }

    fn complete_and_grant(&mut self, index: usize) {
        let now = self.now;
        let b = &mut self.backends[index];
        let before = b.in_flight.len();
        b.in_flight.retain(|&(id, ends)| {
            if ends <= now {
                self.outcomes[id] = Some(Outcome::Served);
            }
            ends > now
        });
        if b.in_flight.len() < before {
            b.last_activity = now;
            b.last_progress = now;
        }
        while matches!(b.phase, SimPhase::Ready { .. }) && b.in_flight.len() < b.spec.max_concurrency {
            let Some(id) = b.waiting.pop_front() else { break };
            b.in_flight.push((id, now + self.case.requests[id].service));
            b.last_progress = now;
        }
    }

    fn time_out(&mut self, index: usize) {
        let now = self.now;
        let requests = &self.case.requests;
        let b = &mut self.backends[index];
        b.waiting.retain(|&id| {
            let expired = now - requests[id].arrival >= requests[id].max_wait;
            if expired {
                self.outcomes[id] = Some(Outcome::TimedOut);
            }
            !expired
        });
    }

    /// What `scheduler::run` reads from a supervisor and its queue.
    fn view(&self, b: &SimBackend) -> BackendView {
        let since = |t: u64| ticks(self.now - t);
        let phase = match b.phase {
            SimPhase::Stopped => Phase::Stopped,
            SimPhase::Starting { .. } => Phase::Starting,
            SimPhase::Ready { .. } => Phase::Ready,
            SimPhase::Draining { .. } => Phase::Draining,
            SimPhase::Restarting { .. } => Phase::Restarting,
        };
        BackendView {
            name: b.name.clone(),
            gpu: true,
            phase,
            generation: b.generation,
            ready_for: match b.phase {
                SimPhase::Ready { since: t } => Some(since(t)),
                _ => None,
            },
            queue: QueueView {
                waiting: b.waiting.len(),
                in_flight: b.in_flight.len(),
                abandoned: 0,
                oldest_wait: b.waiting.iter().map(|&id| since(self.case.requests[id].arrival)).max(),
                idle_for: since(b.last_activity),
                since_progress: since(b.last_progress),
                max_wait: Duration::MAX,
            },
            idle_timeout: b.spec.idle_timeout.map(ticks),
            // Started once at least: its start time is known (the supervisor measures it).
            start_cost: (b.generation > 0).then(|| ticks(b.spec.start)),
            footprint: None,
            last_residency: None,
        }
    }

    /// Every property the schedule must have; empty when it has them all.
    fn problems(&self) -> Vec<String> {
        let mut problems = self.violations.clone();
        let requests = &self.case.requests;
        for (id, outcome) in self.outcomes.iter().enumerate() {
            let r = &requests[id];
            let drain = self.case.backends[r.backend].drain;
            match outcome {
                None => problems.push(format!("request {id} neither served nor timed out")),
                Some(Outcome::Cut) if r.service <= drain => {
                    problems.push(format!("request {id} ({} ticks) cut by a drain of {drain}", r.service));
                }
                Some(Outcome::Served) => {}
                Some(other) if self.case.feasible => {
                    problems.push(format!("request {id} {other:?} in a feasible schedule"));
                }
                Some(_) => {}
            }
        }
        if self.swaps > requests.len() {
            problems.push(format!("{} swaps for {} requests", self.swaps, requests.len()));
        }
        problems
    }
}

#[test]
fn random_schedules_never_thrash() {
    let mut failures = Vec::new();
    let (mut served, mut total, mut swaps) = (0, 0, 0);
    for seed in 0..300 {
        for case in [feasible_case(seed), any_case(seed)] {
            let world = World::new(case).run();
            total += world.outcomes.len();
            served += world.outcomes.iter().filter(|o| **o == Some(Outcome::Served)).count();
            swaps += world.swaps;
            let problems = world.problems();
            if !problems.is_empty() {
                let first: Vec<&String> = problems.iter().take(5).collect();
                failures.push(format!("{:?}\n  -> {} problems: {first:?}", world.case, problems.len()));
            }
        }
    }
    eprintln!("{served} of {total} requests served, {swaps} swaps, {} failing schedules", failures.len());
    assert!(failures.is_empty(), "{} failing schedules; first:\n{}", failures.len(), failures[0]);
}

// ---- Issue 7's schedule with real processes ----

const SIM: &str = env!("CARGO_BIN_EXE_mlxgate-sim");

/// A GPU backend whose server takes 3 s to start, as in the report.
fn slow_sim_backend(name: &str, port: u16) -> String {
    format!(
        "  {name}:\n    kind: custom\n    command: ['sh', '-c', 'sleep 3; exec {SIM} --port {{port}}']\n    \
         port: {port}\n    max_concurrency: 1\n    drain_timeout: 1s\n    stop_timeout: 5s\n"
    )
}

fn ask(model: &str, stream: bool, sim: Value) -> Value {
    json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}], "sim": sim})
}

/// Sends `body` and returns the status and the whole body.
fn send(gw: &Gateway, body: Value) -> tokio::task::JoinHandle<(u16, String)> {
    let url = gw.url("/v1/chat/completions");
    tokio::spawn(async move {
        let r = client().post(url).json(&body).send().await.expect("send");
        (r.status().as_u16(), text_of(r).await)
    })
}

/// A long stream on `ma`, a second `ma` request 5 s later, an `mb` request 1 s after that
/// (swap_after 2 s, drain_timeout 1 s, max_concurrency 1). The old scheduler stopped `a` for
/// `b`, started `a` again (its waiter was older), stopped it while starting, forever: 4172 swaps
/// in 20 s and both waiting requests 503 after their max_wait.
#[tokio::test]
async fn issue_7_schedule_serves_both_waiting_requests() {
    let (pa, pb) = (free_port(), free_port());
    let config = format!(
        "swap_after: 2s\nbackends:\n{}{}models:\n  ma: {{backend: a, max_wait: 60s}}\n  mb: {{backend: b, max_wait: 60s}}\n",
        slow_sim_backend("a", pa),
        slow_sim_backend("b", pb)
    );
    let gw = gateway(&config).await;
    let watcher = ServerWatch::start(SIM, vec![pa.to_string(), pb.to_string()]);

    // The arrival schedule of the report (times are part of the scenario, not synchronisation:
    // each step also waits until the previous one is in place).
    let begin = tokio::time::Instant::now();
    let long = send(&gw, ask("ma", true, json!({"hold_after": 1, "hold_key": "long"})));
    eventually("the long stream runs on a", || async {
        let stats = client().get(format!("http://127.0.0.1:{pa}/sim/stats")).send().await;
        match stats {
            Ok(r) => r.json::<Value>().await.is_ok_and(|s| s["active"] == 1),
            Err(_) => false,
        }
    })
    .await;
    tokio::time::sleep_until(begin + Duration::from_secs(5)).await;
    let second_a = send(&gw, ask("ma", false, json!({})));
    eventually("the second ma request queued", || async { backend_state(&gw, "a").await["queue"] == 1 }).await;
    tokio::time::sleep_until(begin + Duration::from_secs(6)).await;
    let first_b = send(&gw, ask("mb", false, json!({})));

    let (status_b, body_b) = first_b.await.expect("task");
    let (status_a, body_a) = second_a.await.expect("task");
    let peak = watcher.peak();
    assert_eq!(status_b, 200, "{body_b}");
    assert_eq!(status_a, 200, "{body_a}");
    for body in [&body_a, &body_b] {
        let answer: Value = serde_json::from_str(body).expect("a whole JSON answer");
        let choice = &answer["choices"][0];
        assert!(choice["finish_reason"].is_string() && choice["message"]["content"].is_string(), "{body}");
    }
    let swaps = metric_sum(&gw, "mlxgate_backend_swaps_total").await.expect("swaps metric");
    eprintln!("swaps: {swaps}; peak GPU servers alive: {peak}");
    assert!(swaps <= 3.0, "{swaps} swaps");
    assert_eq!(peak, 1, "at most one GPU backend process at any moment");
    // The long stream was preempted for b (it would hold a's only slot forever).
    let (_, long_text) = long.await.expect("task");
    assert!(!long_text.contains("[DONE]"), "{long_text}");
}
