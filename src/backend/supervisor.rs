//! The life of one managed backend: start (check that its program exists and that no other
//! process holds its port, reclaiming a server orphaned by an earlier gateway, spawn, wait for readiness, warm up), watch (its process, and its
//! health probe while ready), restart after a crash or a hang with exponential backoff, give up
//! (`failed`) after too many crashes in a window or at once when it cannot be started at all,
//! drain and stop when told. The scheduler decides *when* a backend runs; this module
//! carries it out and publishes the backend's [`Status`].
//!
//! While the backend is not ready its [`Gate`] (the request queue's, handed to it) is closed,
//! so requests wait instead of failing; when it is failed the gate refuses them with the reason.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, Method};
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use serde::Serialize;
use tokio::sync::{Notify, mpsc, watch};

use super::gate::Gate;
use super::logs::{LogBuffer, Mark};
use super::process::{ServerProcess, describe_exit};
use super::upstream::Upstream;
use super::{keeper, preflight};
use crate::config::{BackendConfig, HealthCheck, ManagedConfig};
use crate::metrics::Metrics;

/// Where a managed backend is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Stopped,
    /// Spawned, not yet ready.
    Starting,
    Ready,
    /// No new requests; in-flight ones finishing before a stop.
    Draining,
    /// Crashed; waiting out the backoff before starting again.
    Restarting,
    /// Crashed too often; waits for `POST /admin/backends/{name}/restart`.
    Failed,
}

impl Phase {
    /// Every phase, in the order of a backend's life.
    pub const ALL: [Phase; 6] =
        [Phase::Stopped, Phase::Starting, Phase::Ready, Phase::Draining, Phase::Restarting, Phase::Failed];

    /// The `state` label of `mlxgate_backend_state`.
    pub fn label(self) -> &'static str {
        match self {
            Phase::Stopped => "stopped",
            Phase::Starting => "starting",
            Phase::Ready => "ready",
            Phase::Draining => "draining",
            Phase::Restarting => "restarting",
            Phase::Failed => "failed",
        }
    }

    /// Whether the backend holds (or is about to hold) its resources, the GPU above all.
    pub fn is_running(self) -> bool {
        matches!(self, Phase::Starting | Phase::Ready | Phase::Draining | Phase::Restarting)
    }
}

/// What `/admin/backends` and the scheduler see.
#[derive(Debug, Clone)]
pub struct Status {
    pub phase: Phase,
    pub pid: Option<u32>,
    /// When the current process became ready.
    pub ready_since: Option<Instant>,
    pub restarts: u64,
    /// How long its last start took, from the spawn to ready (the cost of loading it).
    pub last_start: Option<Duration>,
    /// The bytes it holds when loaded: its `footprint:`, else the most its server's process
    /// group was measured holding while ready (None until then).
    pub footprint: Option<u64>,
    /// How long its last process served, from ready to its stop or crash.
    pub last_residency: Option<Duration>,
    /// Incremented at each process start.
    pub generation: u64,
    pub last_error: Option<String>,
}

/// What the scheduler or an operator asks of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Run it (no effect while running or failed).
    Start,
    /// Drain and stop it.
    Stop,
    /// Stop now without draining (gateway shutdown).
    Shutdown,
    /// Clear a failure (it starts again on demand); restart it now if it runs.
    Restart,
    /// A stopped backend whose program or venv is missing: fail it at once with the reason
    /// (the scheduler sends this instead of swapping a healthy backend out for it).
    Refuse,
}

/// Handle to one managed backend.
pub struct Supervisor {
    pub config: Arc<BackendConfig>,
    pub logs: Arc<LogBuffer>,
    status: watch::Sender<Status>,
    commands: mpsc::Sender<Command>,
    changed: Arc<Notify>,
    /// Set when the gateway begins to shut down: the backend is not started or restarted again.
    shutting_down: Arc<AtomicBool>,
}

/// Everything the supervisor task needs, moved into it.
struct Task {
    config: Arc<BackendConfig>,
    managed: ManagedConfig,
    /// The gate in front of the backend's requests (its queue's).
    gate: Arc<dyn Gate>,
    logs: Arc<LogBuffer>,
    status: watch::Sender<Status>,
    commands: mpsc::Receiver<Command>,
    upstream: Upstream,
    keeper: PathBuf,
    metrics: Metrics,
    changed: Arc<Notify>,
    crashes: VecDeque<Instant>,
    shutting_down: Arc<AtomicBool>,
}

/// How one run of the process ended.
enum RunEnd {
    Stopped,
    Restart,
    /// The process died or hung; `cause` labels `mlxgate_backend_restarts_total`.
    Crashed {
        reason: String,
        cause: &'static str,
    },
    /// It cannot be started at all (missing program, port taken): no point in retrying.
    CannotStart(String),
}

/// How a ready process is to be stopped: why its run ends, and whether its requests in flight
/// are let finish first (a stop or restart asked for) or not (a hung server finishes nothing;
/// the gateway's shutdown has its own grace).
struct RunStop {
    end: RunEnd,
    drain: bool,
}

impl RunEnd {
    fn crashed(reason: String) -> Self {
        RunEnd::Crashed { reason, cause: "crash" }
    }
}

/// The keeper's exit status when it could not start the server's program.
const CANNOT_START: i32 = 127;
/// How long a start waits, beyond the backend's `stop_timeout`, for another process to let go
/// of the backend's port before it fails: a server just killed takes a moment to release it,
/// and one whose keeper is still stopping it (an earlier gateway killed alone) may take the
/// whole `stop_timeout` if it ignores SIGTERM.
const PORT_WAIT: Duration = Duration::from_secs(5);

/// How often a ready server's memory is measured, when its footprint is not configured.
const FOOTPRINT_EVERY: Duration = Duration::from_secs(5);

/// Adds the time from its creation to its drop to a counter or a histogram: a start's time
/// (however it ends) and a process's time serving.
struct Clock<M: ClockMetric> {
    since: Instant,
    metric: M,
}

impl<M: ClockMetric> Clock<M> {
    fn new(metric: M) -> Self {
        Clock { since: Instant::now(), metric }
    }
}

impl<M: ClockMetric> Drop for Clock<M> {
    fn drop(&mut self) {
        self.metric.add(self.since.elapsed().as_secs_f64());
    }
}

trait ClockMetric {
    fn add(&self, seconds: f64);
}

impl ClockMetric for prometheus::Counter {
    fn add(&self, seconds: f64) {
        self.inc_by(seconds);
    }
}

impl ClockMetric for prometheus::Histogram {
    fn add(&self, seconds: f64) {
        self.observe(seconds);
    }
}

impl Supervisor {
    /// Starts the supervisor task for a managed backend (it stays stopped until told).
    /// `gate`: the gate in front of its requests, which the task opens, closes and fails.
    /// `upstream` is the backend's pooled client, shared with the request path.
    pub fn spawn(
        config: Arc<BackendConfig>,
        managed: ManagedConfig,
        gate: Arc<dyn Gate>,
        upstream: Upstream,
        keeper: PathBuf,
        metrics: Metrics,
        changed: Arc<Notify>,
    ) -> Arc<Self> {
        let (status, states) = watch::channel(Status {
            phase: Phase::Stopped,
            pid: None,
            ready_since: None,
            last_start: None,
            footprint: managed.footprint,
            last_residency: None,
            restarts: 0,
            generation: 0,
            last_error: None,
        });
        let (commands, receiver) = mpsc::channel(16);
        let logs = Arc::new(LogBuffer::new(&config.ready_path));
        metrics.backend_up.with_label_values(&[&config.name]).set(0);
        let task = Task {
            upstream,
            config: Arc::clone(&config),
            managed,
            gate,
            logs: Arc::clone(&logs),
            status: status.clone(),
            commands: receiver,
            keeper,
            metrics,
            changed: Arc::clone(&changed),
            crashes: VecDeque::new(),
            shutting_down: Arc::new(AtomicBool::new(false)),
        };
        let shutting_down = Arc::clone(&task.shutting_down);
        tokio::spawn(export_phase(states, task.metrics.clone(), config.name.clone()));
        tokio::spawn(task.run());
        Arc::new(Supervisor { config, logs, status, commands, changed, shutting_down })
    }

    /// The gateway begins to shut down: a backend that serves goes on serving (for the shutdown
    /// grace); one that is not serving yet is stopped, and none is started or restarted again.
    pub fn shut_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        if matches!(self.status().phase, Phase::Starting | Phase::Restarting) {
            self.send(Command::Stop);
        }
    }

    /// The backend's current status.
    pub fn status(&self) -> Status {
        self.status.borrow().clone()
    }

    /// A receiver that sees every status change.
    pub fn watch(&self) -> watch::Receiver<Status> {
        self.status.subscribe()
    }

    /// Sends a command; a full command queue means the same request is already pending.
    /// A `Start` of a stopped backend reads as `Starting` at once: while the backend is
    /// `Stopped` its task waits for commands only, so the start it is sent will run.
    pub fn send(&self, command: Command) {
        if command == Command::Start && self.shutting_down.load(Ordering::SeqCst) {
            return;
        }
        if self.commands.try_send(command).is_ok()
            && command == Command::Start
            && self.status.send_if_modified(|s| {
                let stopped = s.phase == Phase::Stopped;
                if stopped {
                    s.phase = Phase::Starting;
                }
                stopped
            })
        {
            self.changed.notify_one();
        }
    }

    /// Whether the backend's program and venv are there to start it (the scheduler asks before
    /// it swaps a healthy backend out for this one). The error says what is missing, at its
    /// configuration path.
    pub fn preflight(&self) -> Result<(), String> {
        let Some(managed) = &self.config.managed else { return Ok(()) };
        let problems = preflight::managed_problems(&self.config.name, self.config.kind, managed);
        match problems.is_empty() {
            true => Ok(()),
            false => Err(problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")),
        }
    }

    /// After a request failed on process `generation`: waits (up to `limit`) until that process
    /// is known gone — replaced, restarting, stopped or failed — and says whether it is.
    pub async fn replaced(&self, generation: u64, limit: Duration) -> bool {
        let mut rx = self.watch();
        let gone = rx.wait_for(|s| s.generation != generation || s.phase != Phase::Ready);
        matches!(tokio::time::timeout(limit, gone).await, Ok(Ok(_)))
    }

    /// Waits until the backend is stopped or failed (after a `Stop` or `Shutdown`).
    pub async fn stopped(&self) {
        let mut rx = self.watch();
        let _ = rx.wait_for(|s| matches!(s.phase, Phase::Stopped | Phase::Failed)).await;
    }
}

impl Task {
    async fn run(mut self) {
        loop {
            let Some(command) = self.commands.recv().await else { return };
            let failed = self.status.borrow().phase == Phase::Failed;
            match command {
                Command::Start if !failed && !self.shutting_down.load(Ordering::SeqCst) => {}
                Command::Refuse if self.status.borrow().phase == Phase::Stopped => {
                    let missing = preflight::managed_problems(&self.config.name, self.config.kind, &self.managed);
                    if !missing.is_empty() {
                        let reason = missing.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
                        self.fail(format!("cannot start: {reason}"));
                    }
                    continue;
                }
                Command::Restart => {
                    // Not started from here: the scheduler starts it when a request waits and
                    // the GPU is free.
                    self.crashes.clear();
                    self.gate.clear_failure();
                    self.set(|s| {
                        s.phase = Phase::Stopped;
                        s.last_error = None;
                    });
                    continue;
                }
                _ => continue,
            }
            loop {
                if self.shutting_down.load(Ordering::SeqCst) {
                    // The gateway began to shut down during a backoff: no new process.
                    self.set(|s| {
                        s.phase = Phase::Stopped;
                        s.pid = None;
                        s.ready_since = None;
                    });
                    break;
                }
                let end = self.run_once().await;
                self.mark_end(&end);
                match end {
                    RunEnd::Stopped => {
                        self.set(|s| {
                            s.phase = Phase::Stopped;
                            s.pid = None;
                            s.ready_since = None;
                        });
                        break;
                    }
                    RunEnd::Restart => continue,
                    RunEnd::Crashed { reason, cause } => {
                        if !self.after_crash(reason, cause).await {
                            break;
                        }
                    }
                    RunEnd::CannotStart(reason) => {
                        self.fail(format!("cannot start: {reason}"));
                        break;
                    }
                }
            }
        }
    }

    /// The log's mark of how a run ended (the server's own last lines are already above it).
    fn mark_end(&self, end: &RunEnd) {
        let own = |reason: &str| reason.split("; last output:").next().unwrap_or_default().to_owned();
        match end {
            RunEnd::Stopped => self.logs.mark(Mark::Stop, "stopped"),
            RunEnd::Restart => self.logs.mark(Mark::Stop, "stopped for a restart"),
            RunEnd::Crashed { reason, cause } => {
                self.logs.mark(Mark::Exit, format_args!("ended ({cause}): {}", own(reason)))
            }
            RunEnd::CannotStart(reason) => self.logs.mark(Mark::Exit, format_args!("cannot start: {}", own(reason))),
        }
    }

    /// Records a crash (or a hang: `cause` labels the restart metric); waits out the backoff.
    /// False when the backend is now failed or was stopped during the backoff; an operator's
    /// `Restart` during the backoff ends it at once (and forgets the crashes).
    async fn after_crash(&mut self, reason: String, cause: &str) -> bool {
        if self.shutting_down.load(Ordering::SeqCst) {
            tracing::warn!(backend = %self.config.name, %reason, "backend ended during the gateway's shutdown; not restarted");
            self.set(|s| {
                s.phase = Phase::Stopped;
                s.pid = None;
                s.ready_since = None;
                s.last_error = Some(reason.clone());
            });
            return false;
        }
        let now = Instant::now();
        self.crashes.push_back(now);
        while self.crashes.front().is_some_and(|t| now.duration_since(*t) > self.managed.restart_window) {
            self.crashes.pop_front();
        }
        self.metrics.backend_restarts.with_label_values(&[&self.config.name, cause]).inc();
        let crashes = self.crashes.len() as u32;
        tracing::warn!(backend = %self.config.name, crashes, %reason, cause, "backend crashed");
        if crashes > self.managed.max_restarts {
            self.fail(format!(
                "it crashed {crashes} times within {} (last: {reason})",
                humantime::format_duration(self.managed.restart_window)
            ));
            return false;
        }
        let backoff = Duration::from_secs(1 << (crashes - 1).min(5)).min(Duration::from_secs(30));
        self.set(|s| {
            s.phase = Phase::Restarting;
            s.pid = None;
            s.ready_since = None;
            s.restarts += 1;
            s.last_error = Some(reason.clone());
        });
        let deadline = tokio::time::sleep(backoff);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                () = &mut deadline => return true,
                command = self.commands.recv() => match command {
                    Some(Command::Stop | Command::Shutdown) | None => {
                        self.set(|s| s.phase = Phase::Stopped);
                        return false;
                    }
                    Some(Command::Restart) => {
                        tracing::info!(backend = %self.config.name, "restart asked during the crash backoff: restarting now");
                        self.crashes.clear();
                        return true;
                    }
                    Some(Command::Start | Command::Refuse) => {}
                },
            }
        }
    }

    /// Marks the backend failed with `why`: waiting and new requests get it until an operator's
    /// restart.
    fn fail(&mut self, why: String) {
        tracing::error!(backend = %self.config.name, %why, "backend failed; it stays down until POST /admin/backends/{}/restart", self.config.name);
        self.gate.fail(&why);
        self.set(|s| {
            s.phase = Phase::Failed;
            s.pid = None;
            s.ready_since = None;
            s.last_error = Some(why);
        });
    }

    /// Spawns the process, waits until it is ready, serves until it crashes, hangs or is
    /// stopped.
    async fn run_once(&mut self) -> RunEnd {
        let started = Instant::now();
        let starting = Clock::new(self.metrics.backend_starting_seconds.with_label_values(&[&self.config.name]));
        self.set(|s| {
            s.phase = Phase::Starting;
            s.generation += 1;
        });
        let missing = preflight::managed_problems(&self.config.name, self.config.kind, &self.managed);
        if !missing.is_empty() {
            return RunEnd::CannotStart(missing.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "));
        }
        if let Some(end) = self.until_port_free().await {
            return end;
        }
        tracing::info!(backend = %self.config.name, command = ?super::process::launch_command(&self.managed), "starting backend");
        let mut process =
            match ServerProcess::spawn(&self.keeper, &self.config.name, &self.managed, Arc::clone(&self.logs)) {
                Ok(p) => p,
                Err(e) => return RunEnd::crashed(format!("cannot start the keeper process: {e}")),
            };
        self.set(|s| s.pid = process.pid());
        let restarts = self.status.borrow().restarts;
        self.logs.mark(Mark::Start, format_args!("starting (restarts so far: {restarts})"));

        let readiness = tokio::time::timeout(
            self.managed.ready_timeout,
            wait_ready(
                self.upstream.clone(),
                Arc::clone(&self.config),
                self.managed.model.clone(),
                self.managed.warmup,
            ),
        );
        tokio::pin!(readiness);
        let ready = loop {
            tokio::select! {
                r = &mut readiness => break r,
                status = process.wait() => {
                    let why = format!("{} during start-up{}", describe_exit(&status), self.last_log());
                    return match status {
                        Ok(s) if s.code() == Some(CANNOT_START) => RunEnd::CannotStart(why),
                        _ => RunEnd::crashed(why),
                    };
                }
                command = self.commands.recv() => match command {
                    Some(Command::Stop | Command::Shutdown) | None => {
                        process.stop(self.managed.stop_timeout).await;
                        return RunEnd::Stopped;
                    }
                    // An operator's restart of a start that hangs: a new process now.
                    Some(Command::Restart) => {
                        process.stop(self.managed.stop_timeout).await;
                        return RunEnd::Restart;
                    }
                    Some(_) => {}
                },
            }
        };
        match ready {
            Ok(Ok(())) => {}
            Ok(Err(reason)) => {
                process.stop(self.managed.stop_timeout).await;
                return RunEnd::crashed(reason);
            }
            Err(_) => {
                process.stop(self.managed.stop_timeout).await;
                return RunEnd::crashed(format!(
                    "not ready within {}{}",
                    humantime::format_duration(self.managed.ready_timeout),
                    self.last_log()
                ));
            }
        }
        let took = started.elapsed();
        drop(starting);
        self.metrics.backend_start_seconds.with_label_values(&[&self.config.name]).observe(took.as_secs_f64());
        self.metrics.backend_up.with_label_values(&[&self.config.name]).set(1);
        tracing::info!(backend = %self.config.name, pid = ?process.pid(), seconds = took.as_secs_f64(), "backend ready");
        let pid = process.pid().map_or_else(|| "?".to_owned(), |p| p.to_string());
        self.logs.mark(Mark::Ready, format_args!("ready in {:.1} s (pid {pid})", took.as_secs_f64()));
        self.set(|s| {
            s.phase = Phase::Ready;
            s.pid = process.pid();
            s.ready_since = Some(Instant::now());
            s.last_start = Some(took);
        });
        self.gate.open();
        process.record().await;
        let serving = Clock::new(self.metrics.backend_residency_seconds.with_label_values(&[&self.config.name]));

        let health = watch_health(self.upstream.clone(), Arc::clone(&self.config), self.managed.health);
        tokio::pin!(health);
        let mut measure = tokio::time::interval(FOOTPRINT_EVERY);
        let end: RunStop = loop {
            tokio::select! {
                _ = measure.tick(), if self.managed.footprint.is_none() => self.measure_footprint(&process).await,
                status = process.wait() => {
                    self.served(serving);
                    self.gate.close();
                    self.metrics.backend_up.with_label_values(&[&self.config.name]).set(0);
                    return RunEnd::crashed(format!("{}{}", describe_exit(&status), self.last_log()));
                }
                reason = &mut health => {
                    // A hung server finishes nothing: stop it without draining.
                    tracing::warn!(backend = %self.config.name, %reason, "backend is not healthy; restarting it");
                    break RunStop { end: RunEnd::Crashed { reason, cause: "health" }, drain: false };
                }
                command = self.commands.recv() => match command {
                    Some(Command::Stop) => break RunStop { end: RunEnd::Stopped, drain: true },
                    Some(Command::Restart) => break RunStop { end: RunEnd::Restart, drain: true },
                    Some(Command::Shutdown) | None => break RunStop { end: RunEnd::Stopped, drain: false },
                    Some(Command::Start | Command::Refuse) => {}
                },
            }
        };
        self.served(serving);
        self.gate.close();
        self.metrics.backend_up.with_label_values(&[&self.config.name]).set(0);
        if end.drain {
            self.drain(&mut process).await;
        }
        tracing::info!(backend = %self.config.name, "stopping backend");
        process.stop(self.managed.stop_timeout).await;
        end.end
    }

    /// The process stopped serving (stopped, crashed or hung): its residency is recorded, and
    /// kept for the scheduler (the other part of a swap's round trip).
    fn served(&mut self, serving: Clock<prometheus::Histogram>) {
        let took = serving.since.elapsed();
        drop(serving);
        self.set(|s| s.last_residency = Some(took));
    }

    /// Measures the resident memory of the server's process group; the footprint is the most
    /// ever measured (a server's memory grows with its caches; the budget must hold the most).
    async fn measure_footprint(&mut self, process: &ServerProcess) {
        let Some(pid) = process.pid() else { return };
        let measured = tokio::task::spawn_blocking(move || super::footprint::group_resident_bytes(pid)).await;
        let Ok(Some(bytes)) = measured else { return };
        let most = self.status.borrow().footprint.map_or(bytes, |known| known.max(bytes));
        self.metrics.backend_footprint_bytes.with_label_values(&[&self.config.name]).set(most as i64);
        if self.status.borrow().footprint != Some(most) {
            self.set(|s| s.footprint = Some(most));
        }
    }

    /// Waits until the backend's port is free, first stopping the process that holds it if that
    /// is a server an earlier gateway left orphaned (see [`keeper::reclaim_orphan`]); what ends
    /// this run instead, if anything does first (the port stays taken, or a stop).
    async fn until_port_free(&mut self) -> Option<RunEnd> {
        let (name, port, grace) = (self.config.name.clone(), self.managed.port, self.managed.stop_timeout);
        let port_free = async {
            // A server of an earlier gateway killed together with its keeper: ours to stop.
            if port_holder(port).await.is_some() {
                keeper::reclaim_orphan(&name, port, grace).await;
            }
            wait_port_free(&name, port, grace + PORT_WAIT).await
        };
        tokio::pin!(port_free);
        loop {
            tokio::select! {
                // A port still held (an earlier gateway still stopping its server in its
                // shutdown grace, say) is retried with the crash backoff, not failed for good.
                free = &mut port_free => return free.err().map(|reason| RunEnd::Crashed { reason, cause: "port_in_use" }),
                command = self.commands.recv() => match command {
                    Some(Command::Stop | Command::Shutdown) | None => return Some(RunEnd::Stopped),
                    // An operator's restart: begin the start again (the wait starts over).
                    Some(Command::Restart) => return Some(RunEnd::Restart),
                    Some(_) => {}
                },
            }
        }
    }

    /// Lets in-flight requests finish, up to `drain_timeout` (or until the process exits). Slots
    /// held for abandoned answers are not waited for: nobody reads them, and the stop ends them.
    async fn drain(&mut self, process: &mut ServerProcess) {
        self.set(|s| s.phase = Phase::Draining);
        let deadline = Instant::now() + self.managed.drain_timeout;
        while self.gate.working() && Instant::now() < deadline {
            tokio::select! {
                _ = process.wait() => return,
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
    }

    fn last_log(&self) -> String {
        let tail = self.logs.tail(3);
        if tail.is_empty() { String::new() } else { format!("; last output: {}", tail.join(" | ")) }
    }

    fn set(&self, change: impl FnOnce(&mut Status)) {
        self.status.send_modify(change);
        self.changed.notify_one();
    }
}

/// Keeps `mlxgate_backend_state{backend,state}` one-hot on the backend's phase, through every
/// change of its status (whoever makes it), until the supervisor is gone.
async fn export_phase(mut states: watch::Receiver<Status>, metrics: Metrics, backend: String) {
    loop {
        let phase = states.borrow_and_update().phase;
        for each in Phase::ALL {
            metrics.backend_state.with_label_values(&[&backend, each.label()]).set(i64::from(each == phase));
        }
        if states.changed().await.is_err() {
            return;
        }
    }
}

/// Waits until nothing holds 127.0.0.1:`port` (up to `limit`): a server started while another
/// process answers on its port would fail to bind while the other answered its readiness
/// probe, so the backend would read as ready with a stranger behind it.
async fn wait_port_free(backend: &str, port: u16, limit: Duration) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut warned = false;
    loop {
        match port_holder(port).await {
            None => return Ok(()),
            Some(why) if tokio::time::Instant::now() >= deadline => {
                return Err(format!(
                    "port {port} is in use by another process ({why}); stop that process or change backends.{backend}.port"
                ));
            }
            Some(why) => {
                if !std::mem::replace(&mut warned, true) {
                    tracing::warn!(backend, port, %why, "the backend's port is in use; waiting for it to be freed");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Why 127.0.0.1:`port` is not free, if it is not: a process accepts connections on it, or it
/// cannot be bound. Binding alone does not see a wildcard listener on macOS, where the address
/// reuse a server sets allows a more specific bind; a connection does.
async fn port_holder(port: u16) -> Option<String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let connect = tokio::time::timeout(Duration::from_millis(500), tokio::net::TcpStream::connect(addr)).await;
    if let Ok(Ok(_)) = connect {
        return Some("it accepts connections".into());
    }
    // As the servers bind: with SO_REUSEADDR, so that connections of a previous server in
    // TIME_WAIT do not count.
    match std::net::TcpListener::bind(addr) {
        Ok(_) => None,
        Err(e) => Some(format!("cannot bind it: {e}")),
    }
}

/// Probes the ready path every `interval` while the server is ready; resolves with the reason
/// once `failures` probes in a row failed or took longer than `timeout`.
async fn watch_health(upstream: Upstream, config: Arc<BackendConfig>, health: HealthCheck) -> String {
    let mut failed = 0;
    loop {
        tokio::time::sleep(health.interval).await;
        match upstream.probe(&config, &config.ready_path, health.timeout).await {
            Ok(()) => failed = 0,
            Err(why) => {
                failed += 1;
                if failed >= health.failures {
                    return format!(
                        "{failed} health probes in a row failed (GET {} every {}, timeout {}; last: {why})",
                        config.ready_path,
                        humantime::format_duration(health.interval),
                        humantime::format_duration(health.timeout),
                    );
                }
            }
        }
    }
}

/// Polls the ready path, then runs the warm-up completion if the profile needs one.
async fn wait_ready(upstream: Upstream, config: Arc<BackendConfig>, model: String, warmup: bool) -> Result<(), String> {
    let probe_timeout = Duration::from_secs(5);
    while upstream.probe(&config, &config.ready_path, probe_timeout).await.is_err() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if !warmup {
        return Ok(());
    }
    let body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": config.kind.warmup_max_tokens(),
        "stream": false,
    });
    let body = Bytes::from(body.to_string());
    loop {
        let sent = upstream.send(&config, Method::POST, "/v1/chat/completions", &HeaderMap::new(), body.clone()).await;
        match sent {
            Ok(response) if response.status().is_success() => {
                let _ = response.into_body().collect().await;
                return Ok(());
            }
            Ok(response) => {
                let status = response.status();
                let text = match Limited::new(response.into_body(), 2048).collect().await {
                    Ok(c) => String::from_utf8_lossy(&c.to_bytes()).into_owned(),
                    Err(_) => String::new(),
                };
                return Err(format!("warm-up completion answered {status}: {text}"));
            }
            // Not listening yet (some servers answer /health before the API is up).
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// A gate that nobody waits behind.
    struct NoRequests;

    impl Gate for NoRequests {
        fn open(&self) {}
        fn close(&self) {}
        fn fail(&self, _: &str) {}
        fn clear_failure(&self) {}
        fn working(&self) -> bool {
            false
        }
    }

    /// A backend `b` whose program does not exist, with its gate, client and metrics.
    fn parts() -> (Arc<BackendConfig>, Arc<dyn Gate>, Upstream, Metrics, Arc<Notify>) {
        let text = "backends:\n  b: {kind: custom, command: [/nonexistent/srv], port: 9, max_restarts: 3}\n\
                    models:\n  m: {backend: b}\n";
        let config = Config::parse(text, &|_| None).expect("valid");
        let backend = Arc::new(config.backends["b"].clone());
        let metrics = Metrics::new();
        let changed = Arc::new(Notify::new());
        (backend, Arc::new(NoRequests), Upstream::new(Duration::from_secs(1)), metrics, changed)
    }

    #[tokio::test]
    async fn a_start_reads_as_starting_before_the_task_picks_it_up() {
        let (backend, gate, upstream, metrics, changed) = parts();
        let managed = backend.managed.clone().expect("managed");
        let supervisor =
            Supervisor::spawn(backend, managed, gate, upstream, PathBuf::from("/nonexistent"), metrics, changed);
        assert_eq!(supervisor.status().phase, Phase::Stopped);
        supervisor.send(Command::Start);
        // Nothing has yielded to the task yet (one-threaded runtime).
        assert_eq!(supervisor.status().phase, Phase::Starting);
        // And the start does run: here it fails at once, its program missing.
        let mut rx = supervisor.watch();
        let failed = rx.wait_for(|s| s.phase == Phase::Failed).await.expect("status").clone();
        assert!(failed.last_error.is_some_and(|e| e.contains("/nonexistent/srv does not exist")));
        assert_eq!(failed.restarts, 0, "no crash loop");
        // A failed backend is not flipped by a Start.
        supervisor.send(Command::Start);
        assert_eq!(supervisor.status().phase, Phase::Failed);
    }

    #[tokio::test]
    async fn a_restart_during_the_crash_backoff_restarts_now() {
        let (backend, gate, upstream, metrics, changed) = parts();
        let (status, _) = watch::channel(Status {
            phase: Phase::Ready,
            pid: None,
            ready_since: None,
            last_start: None,
            footprint: None,
            last_residency: None,
            restarts: 0,
            generation: 1,
            last_error: None,
        });
        let (commands, receiver) = mpsc::channel(4);
        let mut task = Task {
            managed: backend.managed.clone().expect("managed"),
            config: backend,
            gate,
            logs: Arc::default(),
            status,
            commands: receiver,
            upstream,
            keeper: PathBuf::from("/nonexistent"),
            metrics,
            changed,
            crashes: VecDeque::new(),
            shutting_down: Arc::default(),
        };
        // Two earlier crashes: this third one would wait 4 s.
        task.crashes.extend([Instant::now(), Instant::now()]);
        commands.try_send(Command::Restart).expect("send");
        assert!(task.after_crash("exited with status 1".into(), "crash").await, "starts again");
        assert!(task.crashes.is_empty(), "the backoff and the crash count are cleared");
        assert_eq!(task.status.borrow().phase, Phase::Restarting);
    }
}
