//! The pool: every backend's slots and every model's bounded queue, under one lock (the state
//! and its rules are `pool.rs`; this is its async side: waiting, grants, permits).
//!
//! A backend has `max_concurrency` slots. A request takes a free slot at once when nobody is
//! waiting for it; otherwise it waits in its model's queue (at most `max_queue` waiting, at most
//! `max_wait` long, else 503). When a slot frees, it passes straight to the next waiter that may
//! take it: round robin across the backend's models, and within a model round robin across
//! clients, so one agent with ten queued requests cannot starve another with one. A model
//! served by several backends has one queue; its waiter is bound to a backend only when one has
//! a slot for it (late binding), or, when the router chose to wait for one backend (it holds
//! the prompt's prefix), to that one until the preference's deadline, when it takes any.
//!
//! A managed backend's queue has a gate: closed while its process is stopped, starting or
//! draining (requests wait, they do not fail), open once it is ready. A failed backend's
//! requests are refused at once with the failure's reason when no other backend of their model
//! can serve them. A drained backend (admin) takes no new request; an ejected one (health)
//! none until its half-open trial.
//!
//! The slot is a [`Permit`] that releases on drop. It travels inside the response body (not
//! tower's `ConcurrencyLimit`, which frees it at the headers while a stream lasts minutes), so a
//! stream holds its slot until its last byte or until the client goes.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, oneshot};

use super::pool::{Arrival, Change, Core, Granted, HealthPolicy};
use crate::backend::gate::Gate;
use crate::error::GatewayError;
use crate::metrics::Metrics;

pub use super::pool::{Ask, MAX_BACKENDS_PER_MODEL, bit};

/// Who a waiting request belongs to, for fairness: the API key if one was sent, else the peer IP.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClientId(pub String);

/// Told when a backend of a model has a new process (its gate opened again) or came back from
/// an ejection: whatever it had cached is gone. Gets the backend's position in the model.
pub type Restarted = Arc<dyn Fn(usize) + Send + Sync>;

/// Every backend's slots and every model's queue. Clones share them.
#[derive(Clone)]
pub struct Pool {
    shared: Arc<Shared>,
}

struct Shared {
    metrics: Metrics,
    state: Mutex<Core<oneshot::Sender<Permit>>>,
    /// Woken whenever a request arrives or a slot frees (the scheduler listens).
    changed: Arc<Notify>,
    /// Who is told of a backend's restart: (backend, its position in the model, whom).
    restarted: Mutex<Vec<(usize, usize, Restarted)>>,
}

/// One backend's slots in the pool. Clones share them.
#[derive(Clone)]
pub struct BackendQueue {
    shared: Arc<Shared>,
    index: usize,
}

/// Where a model's requests queue: the pool and the model's index there.
#[derive(Clone)]
pub struct ModelSlot {
    shared: Arc<Shared>,
    index: usize,
}

/// A held slot at a backend. Dropping it frees the slot (or hands it to the next waiter).
pub struct Permit {
    shared: Option<Arc<Shared>>,
    backend: usize,
    position: usize,
    granted: Instant,
    abandoned: bool,
    /// Set when the answer ended normally (not abandoned, cut or failed).
    finished: bool,
    /// It is a half-open backend's one trial.
    trial: bool,
    /// The backend's previous request, as it was when this slot was granted.
    previous: Option<Previous>,
}

/// How the backend's previous request ended, seen from a slot's grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Previous {
    /// How long before the grant it ended.
    pub ended_ago: Duration,
    /// Whether its answer had ended normally (else: abandoned, cut or failed).
    pub finished: bool,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.release(self.backend, self.granted.elapsed(), self.abandoned, self.finished, self.trial);
        }
    }
}

impl Permit {
    /// How the backend's previous request ended, and how long before this slot was granted: a
    /// backend still busy a moment after a request (vllm-mlx's serialized route, after a client
    /// aborted a stream) can only be busy with that one when this is short.
    pub fn previous(&self) -> Option<Previous> {
        self.previous
    }

    /// The slot's backend: its position in the model's list of backends.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Marks the answer as ended normally (its stream complete, its whole body read).
    pub fn finish(&mut self) {
        self.finished = true;
    }

    /// Marks the slot as held for an answer its client abandoned: it stays in flight (the
    /// backend is busy with it) but is no work anybody waits for ([`QueueView::abandoned`]).
    pub fn abandon(&mut self) {
        if self.abandoned {
            return;
        }
        self.abandoned = true;
        if let Some(shared) = &self.shared {
            shared.lock().backends[self.backend].abandoned += 1;
            shared.changed.notify_one();
        }
    }
}

/// A snapshot of a backend's queue for scheduling decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueView {
    /// Requests waiting that this backend would serve: those that may take its slot and
    /// prefer it or have no other backend of their model taking requests.
    pub waiting: usize,
    pub in_flight: usize,
    /// Of `in_flight`, the slots held for abandoned answers (see [`Permit::abandon`]).
    pub abandoned: usize,
    /// How long the oldest of `waiting` has waited.
    pub oldest_wait: Option<Duration>,
    /// Time since the last arrival or release.
    pub idle_for: Duration,
    /// Time since a slot was last handed out or freed, or the gate opened: how long the
    /// backend has made no progress through its queue (its slots held by long requests).
    pub since_progress: Duration,
    /// The shortest `max_wait` of the models it serves: how long its waiters may wait.
    pub max_wait: Duration,
    /// How long its requests held a slot, on average (a moving mean; zero before the first).
    pub mean_service: Duration,
}

/// A backend's drain and health, for `/admin/backends`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStatus {
    pub drained: bool,
    /// `healthy`, `ejected` or `half_open`.
    pub health: &'static str,
    /// Times it was ejected.
    pub ejections: u64,
}

impl Pool {
    /// An empty pool; `changed` is woken whenever a request arrives or a slot frees.
    pub fn new(metrics: Metrics, changed: Arc<Notify>) -> Self {
        Pool {
            shared: Arc::new(Shared {
                metrics,
                state: Mutex::new(Core::default()),
                changed,
                restarted: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Adds a backend with `max_concurrency` slots; `open` says whether slots may be handed
    /// out (a managed backend starts closed).
    pub fn add_backend(&self, name: &str, max_concurrency: usize, open: bool) -> BackendQueue {
        self.shared.metrics.inflight.with_label_values(&[name]).set(0);
        let index = self.shared.lock().add_backend(name, max_concurrency, open, Instant::now());
        BackendQueue { shared: Arc::clone(&self.shared), index }
    }

    /// Adds a model served by `backends` (this pool's, in the model's order) and returns where
    /// its requests queue.
    pub fn add_model(&self, name: &str, max_queue: usize, max_wait: Duration, backends: &[&BackendQueue]) -> ModelSlot {
        self.shared.metrics.queue_depth.with_label_values(&[name]).set(0);
        let indices: Vec<usize> = backends.iter().map(|b| b.index).collect();
        let index = self.shared.lock().add_model(name, max_queue, max_wait, &indices);
        ModelSlot { shared: Arc::clone(&self.shared), index }
    }
}

impl BackendQueue {
    /// A pool of one backend with `max_concurrency` slots and no models yet; `open` says
    /// whether slots may be handed out (a managed backend starts closed).
    pub fn new(backend: &str, max_concurrency: usize, open: bool, metrics: Metrics, changed: Arc<Notify>) -> Self {
        Pool::new(metrics, changed).add_backend(backend, max_concurrency, open)
    }

    /// Adds a model served by this backend alone and returns where its requests queue.
    pub fn add_model(&self, name: &str, max_queue: usize, max_wait: Duration) -> ModelSlot {
        Pool { shared: Arc::clone(&self.shared) }.add_model(name, max_queue, max_wait, &[self])
    }

    /// Its backend's name.
    pub fn name(&self) -> String {
        self.shared.lock().backends[self.index].name.clone()
    }

    /// Opens the gate (backend ready, a new process): waiters get free slots in fair order, and
    /// whoever listens is told of the restart.
    pub fn open(&self) {
        self.shared.lock().open(self.index, Instant::now());
        self.shared.health_gauge(self.index);
        self.shared.tell_restarted(self.index);
        self.shared.dispatch_free_slots(self.index);
    }

    /// Closes the gate (backend stopping or restarting): requests wait (or go to the model's
    /// other backends); in-flight ones go on. During the gateway's shutdown nobody waits
    /// behind a closed gate.
    pub fn close(&self) {
        let refused = self.shared.lock().close(self.index);
        self.shared.refused(refused);
        self.shared.dispatch_all();
    }

    /// Marks the backend failed: its waiting and new requests that no other backend can serve
    /// are refused with `reason` until [`BackendQueue::open`] or [`BackendQueue::clear_failure`].
    pub fn fail(&self, reason: &str) {
        let refused = self.shared.lock().fail(self.index, reason);
        self.shared.refused(refused);
        self.shared.dispatch_all();
    }

    /// The gateway begins to shut down: requests waiting behind a closed gate (a backend that
    /// is not serving and will not start again) that no other backend can serve are refused
    /// with `gateway_shutdown`, and so is any new one that would wait there.
    pub fn shut_down(&self) {
        let refused = self.shared.lock().shut_down(self.index);
        self.shared.refused(refused);
    }

    /// Forgets a failure without opening (the backend will be started again on demand).
    pub fn clear_failure(&self) {
        self.shared.lock().backends[self.index].failure = None;
    }

    /// Drains the backend (`true`: no new requests, running ones go on; its waiters go to the
    /// model's other backends) or ends the drain.
    pub fn drain(&self, drained: bool) {
        self.shared.lock().set_drained(self.index, drained);
        self.shared.dispatch_all();
        self.shared.changed.notify_one();
    }

    /// Sets when requests eject this backend (`None`: never; the default).
    pub fn set_health_policy(&self, policy: Option<HealthPolicy>) {
        self.shared.lock().backends[self.index].policy = policy;
        if policy.is_some() {
            self.shared.health_gauge(self.index);
            let name = self.name();
            self.shared.metrics.backend_ejections.with_label_values(&[&name]);
        }
    }

    /// A probe of its ready path failed `failures` times in a row: ejected for `eject_for`.
    pub fn probe_failed(&self, eject_for: Duration) {
        let change = self.shared.lock().eject(self.index, eject_for, true, Instant::now());
        self.shared.changed_health(self.index, change);
    }

    /// A probe of its ready path passed: an ejection the probes made ends.
    pub fn probe_passed(&self) {
        let change = self.shared.lock().probe_passed(self.index);
        self.shared.changed_health(self.index, change);
    }

    /// Its drain and health.
    pub fn status(&self) -> PoolStatus {
        let state = self.shared.lock();
        let backend = &state.backends[self.index];
        PoolStatus {
            drained: backend.drained,
            health: backend.health.label(Instant::now()),
            ejections: backend.ejections,
        }
    }

    /// What the scheduler needs to know.
    pub fn view(&self) -> QueueView {
        let state = self.shared.lock();
        let (waiting, oldest) = state.waiting_for(self.index, Instant::now());
        let backend = &state.backends[self.index];
        QueueView {
            waiting,
            in_flight: backend.in_flight,
            abandoned: backend.abandoned,
            oldest_wait: oldest.map(|t| t.elapsed()),
            idle_for: backend.last_activity.elapsed(),
            since_progress: backend.last_progress.elapsed(),
            max_wait: backend.models.iter().map(|&m| state.models[m].max_wait).min().unwrap_or(Duration::MAX),
            mean_service: backend.mean_service,
        }
    }
}

/// The supervisor works the queue through its gate.
impl Gate for BackendQueue {
    fn open(&self) {
        BackendQueue::open(self);
    }

    fn close(&self) {
        BackendQueue::close(self);
    }

    fn fail(&self, reason: &str) {
        BackendQueue::fail(self, reason);
    }

    fn clear_failure(&self) {
        BackendQueue::clear_failure(self);
    }

    fn working(&self) -> bool {
        let state = self.shared.lock();
        let backend = &state.backends[self.index];
        backend.in_flight > backend.abandoned
    }
}

impl crate::backend::probe_remote::Probed for BackendQueue {
    fn failed(&self, eject_for: Duration) {
        self.probe_failed(eject_for);
    }

    fn passed(&self) {
        self.probe_passed();
    }
}

impl ModelSlot {
    /// Waits for a slot for `client`, failing fast when the queue is full and after `max_wait`.
    /// Dropping the returned future (client gone) leaves the queue clean.
    pub async fn acquire(&self, client: ClientId) -> Result<Permit, GatewayError> {
        self.acquire_within(client, Duration::MAX).await
    }

    /// As [`ModelSlot::acquire`], waiting at most `limit` (when less than `max_wait`): a
    /// request that is queued again after a retry keeps what is left of its first wait.
    pub async fn acquire_within(&self, client: ClientId, limit: Duration) -> Result<Permit, GatewayError> {
        self.acquire_with(Ask { client, limit, excluded: 0, router: None }).await
    }

    /// Waits for a slot on the terms of `ask`: at one of the model's backends it did not
    /// exclude, chosen by its router at arrival, else the first to have a slot for it.
    pub async fn acquire_with(&self, ask: Ask<'_>) -> Result<Permit, GatewayError> {
        let excluded = ask.excluded;
        let arrived = Instant::now();
        let shared = &self.shared;
        let mut receiver = None;
        let (id, prefer_until, max_wait) = {
            let mut state = shared.lock();
            let make = || {
                let (grant, r) = oneshot::channel();
                receiver = Some(r);
                grant
            };
            match state.arrive(self.index, ask, arrived, make)? {
                Arrival::Granted { position, backend, trial } => {
                    let in_flight = state.backends[backend].in_flight;
                    let name = &state.backends[backend].name;
                    shared.metrics.inflight.with_label_values(&[name]).set(in_flight as i64);
                    let previous = state.backends[backend].previous();
                    drop(state);
                    return Ok(shared.permit(backend, position, trial, previous));
                }
                Arrival::Queued { id, prefer_until, max_wait } => {
                    let model = &state.models[self.index];
                    shared.metrics.queue_depth.with_label_values(&[&model.name]).set(model.waiting as i64);
                    (id, prefer_until, max_wait)
                }
            }
        };
        shared.changed.notify_one();
        let Some(mut receiver) = receiver else {
            return Err(self.closed_error(excluded, arrived));
        };

        let mut guard = WaitGuard { slot: self, id, armed: true };
        let timeout = tokio::time::sleep(max_wait);
        tokio::pin!(timeout);
        let mut prefer_until = prefer_until;
        let outcome = loop {
            let preference = async {
                match prefer_until {
                    Some(until) => tokio::time::sleep_until(tokio::time::Instant::from_std(until)).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                granted = &mut receiver => break Some(granted),
                () = &mut timeout => break None,
                () = preference => {
                    prefer_until = None;
                    if let Some(permit) = self.preference_over(id) {
                        guard.armed = false;
                        return Ok(permit);
                    }
                }
            }
        };
        guard.armed = false;
        match outcome {
            Some(Ok(permit)) => Ok(permit),
            // The sender is dropped unsent only when no backend can serve the request any more.
            Some(Err(_)) => Err(self.closed_error(excluded, arrived)),
            None => {
                if self.remove_waiter(id) {
                    return Err(self.shared.lock().timeout_error(self.index, arrived.elapsed()));
                }
                // Already dequeued: the permit is on its way (sent just after the lock).
                receiver.await.map_err(|_| self.closed_error(excluded, arrived))
            }
        }
    }

    /// Whether the model has a backend, other than those in `excluded`, that may take a failed
    /// attempt ([`super::pool::Backend::takes_a_failover`]): where it may go next.
    pub fn has_other(&self, excluded: u64) -> bool {
        let state = self.shared.lock();
        let model = &state.models[self.index];
        let now = Instant::now();
        model
            .backends
            .iter()
            .enumerate()
            .any(|(p, &b)| excluded & bit(p) == 0 && state.backends[b].takes_a_failover(now))
    }

    /// A request at the model's backend at `position` succeeded (`ok`: an answer that is not a
    /// 5xx) or failed before its first byte: its health learns it (see [`HealthPolicy`]).
    pub fn report(&self, position: usize, ok: bool) {
        let (b, change) = {
            let mut state = self.shared.lock();
            let Some(&b) = state.models[self.index].backends.get(position) else { return };
            (b, state.report(b, ok, Instant::now()))
        };
        self.shared.changed_health(b, change);
    }

    /// Calls `restarted` with a backend's position whenever one of the model's backends has a
    /// new process or comes back from an ejection (its prompt cache is gone).
    pub fn on_restart(&self, restarted: Restarted) {
        let backends = self.shared.lock().models[self.index].backends.clone();
        let mut listeners = self.shared.restarted.lock().unwrap_or_else(|p| p.into_inner());
        for (position, b) in backends.into_iter().enumerate() {
            listeners.push((b, position, Arc::clone(&restarted)));
        }
    }

    /// The waiter's preference ran out: a free slot of any backend it may take, else `None`
    /// (it waits on for any).
    fn preference_over(&self, id: u64) -> Option<Permit> {
        let mut state = self.shared.lock();
        let (position, backend, trial) = state.preference_over(self.index, id, Instant::now())?;
        let model = &state.models[self.index];
        self.shared.metrics.queue_depth.with_label_values(&[&model.name]).set(model.waiting as i64);
        let name = &state.backends[backend].name;
        self.shared.metrics.inflight.with_label_values(&[name]).set(state.backends[backend].in_flight as i64);
        let previous = state.backends[backend].previous();
        drop(state);
        Some(self.shared.permit(backend, position, trial, previous))
    }

    /// Why a waiter's grant channel closed: its backends failed or the gateway shuts down.
    fn closed_error(&self, excluded: u64, arrived: Instant) -> GatewayError {
        self.shared.lock().closed_error(self.index, excluded, arrived.elapsed())
    }

    /// Removes a still-queued waiter; false when it was already handed a slot.
    fn remove_waiter(&self, id: u64) -> bool {
        let mut state = self.shared.lock();
        let removed = state.remove_waiter(self.index, id).is_some();
        if removed {
            let model = &state.models[self.index];
            self.shared.metrics.queue_depth.with_label_values(&[&model.name]).set(model.waiting as i64);
        }
        removed
    }
}

/// Takes a waiter out of the queue when its request is dropped before it got a slot.
struct WaitGuard<'a> {
    slot: &'a ModelSlot,
    id: u64,
    armed: bool,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.slot.remove_waiter(self.id);
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Core<oneshot::Sender<Permit>>> {
        // A panic while holding this lock leaves counters that are still consistent.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn permit(self: &Arc<Self>, backend: usize, position: usize, trial: bool, previous: Option<Previous>) -> Permit {
        Permit {
            shared: Some(Arc::clone(self)),
            backend,
            position,
            granted: Instant::now(),
            abandoned: false,
            finished: false,
            trial,
            previous,
        }
    }

    /// Frees a slot: hands it to the next waiter in fair order, or returns it to the pool.
    fn release(self: &Arc<Self>, b: usize, held: Duration, abandoned: bool, finished: bool, trial: bool) {
        self.lock().released(b, held, abandoned, finished, trial, Instant::now());
        self.hand_over(b);
        self.changed.notify_one();
    }

    /// Gives backend `b`'s free slots to waiters while it takes requests and has free slots.
    fn dispatch_free_slots(self: &Arc<Self>, b: usize) {
        loop {
            let granted = {
                let mut state = self.lock();
                let granted = state.grant_free(b, Instant::now());
                self.gauges(&state, b, granted.as_ref());
                granted
            };
            match granted {
                Some(granted) => self.deliver(b, granted),
                None => return,
            }
        }
    }

    /// Every backend's free slots to waiters (after a change that may let waiters move).
    fn dispatch_all(self: &Arc<Self>) {
        let n = self.lock().backends.len();
        for b in 0..n {
            self.dispatch_free_slots(b);
        }
    }

    /// Passes one held slot of backend `b` to the next waiter that may take it, or frees it.
    fn hand_over(self: &Arc<Self>, b: usize) {
        let granted = {
            let mut state = self.lock();
            let granted = state.hand_over(b, Instant::now());
            self.gauges(&state, b, granted.as_ref());
            granted
        };
        if let Some(granted) = granted {
            self.deliver(b, granted);
        }
    }

    /// Sends a slot of `b` to the waiter `granted` took out of the queue; a waiter gone hands
    /// it over again (a trial not taken is free again).
    fn deliver(self: &Arc<Self>, b: usize, granted: Granted<oneshot::Sender<Permit>>) {
        let mut next = Some(granted);
        while let Some(Granted { waiter, position, trial, previous, .. }) = next.take() {
            // The slot moves to the waiter; `in_flight` is unchanged.
            let permit = self.permit(b, position, trial, previous);
            let Err(mut unclaimed) = waiter.grant.send(permit) else { return };
            // That waiter is gone: disarm the returned permit and try the next one.
            unclaimed.shared = None;
            let mut state = self.lock();
            if trial {
                state.trial_untaken(b);
            }
            next = state.hand_over(b, Instant::now());
            self.gauges(&state, b, next.as_ref());
        }
    }

    /// The gauges of backend `b` (slots in flight) and of the model a grant came from.
    fn gauges(
        &self,
        state: &Core<oneshot::Sender<Permit>>,
        b: usize,
        granted: Option<&Granted<oneshot::Sender<Permit>>>,
    ) {
        let backend = &state.backends[b];
        self.metrics.inflight.with_label_values(&[&backend.name]).set(backend.in_flight as i64);
        if let Some(granted) = granted {
            let model = &state.models[granted.model];
            self.metrics.queue_depth.with_label_values(&[&model.name]).set(model.waiting as i64);
        }
    }

    /// Wakes refused waiters (their grants dropped): they read why.
    fn refused(&self, refused: Vec<super::pool::Waiter<oneshot::Sender<Permit>>>) {
        if refused.is_empty() {
            return;
        }
        let state = self.lock();
        for model in &state.models {
            self.metrics.queue_depth.with_label_values(&[&model.name]).set(model.waiting as i64);
        }
        drop(state);
        drop(refused);
    }

    /// After a health report: an ejected backend's waiters move on, and its slots are offered
    /// again at its half-open deadline; a healed one takes waiters (and whoever listens is told:
    /// a backend that was down may have restarted).
    fn changed_health(self: &Arc<Self>, b: usize, change: Change) {
        match change {
            Change::None => {}
            Change::Ejected(until) => {
                let name = self.lock().backends[b].name.clone();
                tracing::warn!(backend = %name, "backend ejected: its models' requests go to their other backends");
                self.metrics.backend_ejections.with_label_values(&[&name]).inc();
                self.health_gauge(b);
                self.dispatch_all();
                let shared = Arc::clone(self);
                tokio::spawn(async move {
                    tokio::time::sleep_until(tokio::time::Instant::from_std(until)).await;
                    shared.health_gauge(b);
                    shared.dispatch_free_slots(b);
                    shared.changed.notify_one();
                });
            }
            Change::Healed => {
                self.health_gauge(b);
                self.tell_restarted(b);
                self.dispatch_free_slots(b);
            }
        }
        self.changed.notify_one();
    }

    /// `mlxgate_backend_health` one-hot on backend `b`'s health now (backends with a health
    /// policy only).
    fn health_gauge(&self, b: usize) {
        let (name, label) = {
            let state = self.lock();
            let backend = &state.backends[b];
            if backend.policy.is_none() {
                return;
            }
            (backend.name.clone(), backend.health.label(Instant::now()))
        };
        for each in ["healthy", "ejected", "half_open"] {
            self.metrics.backend_health.with_label_values(&[&name, each]).set(i64::from(each == label));
        }
    }

    /// Tells whoever listens that backend `b` has a new process.
    fn tell_restarted(&self, b: usize) {
        let listeners: Vec<(usize, Restarted)> = {
            let listeners = self.restarted.lock().unwrap_or_else(|p| p.into_inner());
            listeners.iter().filter(|(x, _, _)| *x == b).map(|(_, p, f)| (*p, Arc::clone(f))).collect()
        };
        for (position, listener) in listeners {
            listener(position);
        }
    }
}

#[cfg(test)]
mod tests;
