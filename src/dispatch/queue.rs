//! Per-model bounded queues in front of each backend's slots.
//!
//! A backend has `max_concurrency` slots. A request takes a free slot at once when nobody is
//! waiting; otherwise it waits in its model's queue (at most `max_queue` waiting, at most
//! `max_wait` long, else 503). When a slot frees, it passes straight to the next waiter: round
//! robin across the backend's models, and within a model round robin across clients, so one
//! agent with ten queued requests cannot starve another with one.
//!
//! A managed backend's queue has a gate: closed while its process is stopped, starting or
//! draining (requests wait, they do not fail), open once it is ready. A failed backend's queue
//! refuses at once with the failure's reason.
//!
//! The slot is a [`Permit`] that releases on drop. It travels inside the response body (not
//! tower's `ConcurrencyLimit`, which frees it at the headers while a stream lasts minutes), so a
//! stream holds its slot until its last byte or until the client goes.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, oneshot};

use crate::backend::gate::Gate;
use crate::error::GatewayError;
use crate::metrics::Metrics;

/// Who a waiting request belongs to, for fairness: the API key if one was sent, else the peer IP.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClientId(pub String);

/// The slots of one backend and the queues of the models it serves. Clones share them.
#[derive(Clone)]
pub struct BackendQueue {
    shared: Arc<Shared>,
}

struct Shared {
    backend: String,
    max_concurrency: usize,
    metrics: Metrics,
    state: Mutex<State>,
    /// Woken whenever a request arrives or a slot frees (the scheduler listens).
    changed: Arc<Notify>,
}

struct State {
    /// Slots are handed out only while open.
    open: bool,
    /// Set while the backend is failed: requests are refused with this reason.
    failure: Option<String>,
    /// The gateway is shutting down: while the gate is closed nobody waits (the backend will not
    /// start again); an open gate goes on serving for the shutdown grace.
    shutting_down: bool,
    /// Last time a request arrived or a slot was freed (for idle stops).
    last_activity: Instant,
    /// Last time a slot was handed out or freed, or the gate opened (for stalled backends).
    last_progress: Instant,
    in_flight: usize,
    /// Of `in_flight`, the slots held for answers their clients abandoned (`hold_abandoned`):
    /// the backend is still busy with them, but nobody waits for them, so a swap or a stop does
    /// not wait for them (stopping the server is what ends them).
    abandoned: usize,
    /// When a slot was last freed, and whether its answer had ended normally.
    last_release: Option<(Instant, bool)>,
    models: Vec<ModelQueue>,
    /// Index of the model whose turn is next when a slot frees.
    next_model: usize,
    next_waiter_id: u64,
    /// Smoothed time a request holds a slot, for `Retry-After` estimates.
    mean_service: Duration,
}

struct ModelQueue {
    name: String,
    max_queue: usize,
    max_wait: Duration,
    waiting: usize,
    /// Clients with waiting requests, in turn order; each with its own FIFO.
    clients: VecDeque<(ClientId, VecDeque<Waiter>)>,
}

struct Waiter {
    id: u64,
    since: Instant,
    grant: oneshot::Sender<Permit>,
}

/// Where a model's requests queue: its backend's queue and its own index there.
#[derive(Clone)]
pub struct ModelSlot {
    queue: Arc<Shared>,
    index: usize,
}

/// A held slot at a backend. Dropping it frees the slot (or hands it to the next waiter).
pub struct Permit {
    shared: Option<Arc<Shared>>,
    granted: Instant,
    abandoned: bool,
    /// Set when the answer ended normally (not abandoned, cut or failed).
    finished: bool,
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
            shared.release(self.granted.elapsed(), self.abandoned, self.finished);
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
            shared.lock().abandoned += 1;
            shared.changed.notify_one();
        }
    }
}

/// A snapshot of a backend's queue for scheduling decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueView {
    pub waiting: usize,
    pub in_flight: usize,
    /// Of `in_flight`, the slots held for abandoned answers (see [`Permit::abandon`]).
    pub abandoned: usize,
    /// How long the oldest waiting request has waited.
    pub oldest_wait: Option<Duration>,
    /// Time since the last arrival or release.
    pub idle_for: Duration,
    /// Time since a slot was last handed out or freed, or the gate opened: how long the
    /// backend has made no progress through its queue (its slots held by long requests).
    pub since_progress: Duration,
}

impl BackendQueue {
    /// A queue for `backend` with `max_concurrency` slots and no models yet; `open` says
    /// whether slots may be handed out (a managed backend starts closed).
    pub fn new(backend: &str, max_concurrency: usize, open: bool, metrics: Metrics, changed: Arc<Notify>) -> Self {
        metrics.inflight.with_label_values(&[backend]).set(0);
        BackendQueue {
            shared: Arc::new(Shared {
                backend: backend.to_string(),
                max_concurrency,
                metrics,
                changed,
                state: Mutex::new(State {
                    open,
                    failure: None,
                    shutting_down: false,
                    last_activity: Instant::now(),
                    last_progress: Instant::now(),
                    in_flight: 0,
                    abandoned: 0,
                    last_release: None,
                    models: Vec::new(),
                    next_model: 0,
                    next_waiter_id: 0,
                    mean_service: Duration::ZERO,
                }),
            }),
        }
    }

    /// Adds a model served by this backend and returns where its requests queue.
    pub fn add_model(&self, name: &str, max_queue: usize, max_wait: Duration) -> ModelSlot {
        self.shared.metrics.queue_depth.with_label_values(&[name]).set(0);
        let mut state = self.shared.lock();
        state.models.push(ModelQueue {
            name: name.to_string(),
            max_queue,
            max_wait,
            waiting: 0,
            clients: VecDeque::new(),
        });
        ModelSlot { queue: Arc::clone(&self.shared), index: state.models.len() - 1 }
    }

    /// Opens the gate (backend ready): waiters get free slots in fair order.
    pub fn open(&self) {
        let mut state = self.shared.lock();
        state.open = true;
        state.failure = None;
        state.last_progress = Instant::now();
        drop(state);
        self.shared.dispatch_free_slots();
    }

    /// Closes the gate (backend stopping or restarting): requests wait; in-flight ones go on.
    /// During the gateway's shutdown nobody waits behind a closed gate.
    pub fn close(&self) {
        self.shared.lock().open = false;
        self.refuse_if_shutting_down();
    }

    /// Marks the backend failed: waiting and new requests are refused with `reason` until
    /// [`BackendQueue::open`] or [`BackendQueue::clear_failure`].
    pub fn fail(&self, reason: &str) {
        let mut state = self.shared.lock();
        state.open = false;
        state.failure = Some(reason.to_string());
        for model in &mut state.models {
            // Dropping the senders wakes each waiter, which then reads `failure`.
            model.clients.clear();
            model.waiting = 0;
            self.shared.metrics.queue_depth.with_label_values(&[&model.name]).set(0);
        }
    }

    /// The gateway begins to shut down: requests waiting behind a closed gate (a backend that
    /// is not serving and will not start again) are refused with `gateway_shutdown`, and so is
    /// any new one that would wait there.
    pub fn shut_down(&self) {
        let mut state = self.shared.lock();
        state.shutting_down = true;
        if !state.open {
            for model in &mut state.models {
                // Dropping the senders wakes each waiter, which then reads `shutting_down`.
                model.clients.clear();
                model.waiting = 0;
                self.shared.metrics.queue_depth.with_label_values(&[&model.name]).set(0);
            }
        }
    }

    /// Closes the gate and, when the gateway is shutting down, refuses whoever waits behind it.
    fn refuse_if_shutting_down(&self) {
        let shutting_down = self.shared.lock().shutting_down;
        if shutting_down {
            self.shut_down();
        }
    }

    /// Forgets a failure without opening (the backend will be started again on demand).
    pub fn clear_failure(&self) {
        self.shared.lock().failure = None;
    }

    /// What the scheduler needs to know.
    pub fn view(&self) -> QueueView {
        let state = self.shared.lock();
        let oldest =
            state.models.iter().flat_map(|m| m.clients.iter().flat_map(|(_, fifo)| fifo.iter().map(|w| w.since))).min();
        QueueView {
            waiting: state.models.iter().map(|m| m.waiting).sum(),
            in_flight: state.in_flight,
            abandoned: state.abandoned,
            oldest_wait: oldest.map(|t| t.elapsed()),
            idle_for: state.last_activity.elapsed(),
            since_progress: state.last_progress.elapsed(),
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
        state.in_flight > state.abandoned
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
        let arrived = Instant::now();
        let shared = &self.queue;
        let (id, receiver, max_wait) = {
            let mut state = shared.lock();
            if let Some(reason) = &state.failure {
                return Err(GatewayError::BackendFailed { backend: shared.backend.clone(), reason: reason.clone() });
            }
            if state.shutting_down && !state.open {
                return Err(GatewayError::ShuttingDown);
            }
            state.last_activity = Instant::now();
            let nobody_waiting = state.models.iter().all(|m| m.waiting == 0);
            if state.open && nobody_waiting && state.in_flight < shared.max_concurrency {
                state.in_flight += 1;
                state.last_progress = Instant::now();
                shared.metrics.inflight.with_label_values(&[&shared.backend]).set(state.in_flight as i64);
                drop(state);
                return Ok(shared.permit());
            }
            let in_flight = state.in_flight;
            let retry_after = state.retry_after(shared.max_concurrency);
            let id = state.next_waiter_id;
            state.next_waiter_id += 1;
            let model = &mut state.models[self.index];
            if model.waiting >= model.max_queue {
                return Err(GatewayError::QueueFull {
                    model: model.name.clone(),
                    waiting: model.waiting,
                    in_flight,
                    retry_after,
                });
            }
            let (grant, receiver) = oneshot::channel();
            let waiter = Waiter { id, since: arrived, grant };
            match model.clients.iter_mut().find(|(c, _)| *c == client) {
                Some((_, fifo)) => fifo.push_back(waiter),
                None => model.clients.push_back((client, VecDeque::from([waiter]))),
            }
            model.waiting += 1;
            shared.metrics.queue_depth.with_label_values(&[&model.name]).set(model.waiting as i64);
            let max_wait = model.max_wait.min(limit);
            drop(state);
            shared.changed.notify_one();
            (id, receiver, max_wait)
        };

        let mut guard = WaitGuard { slot: self, id, armed: true };
        let mut receiver = receiver;
        let outcome = tokio::time::timeout(max_wait, &mut receiver).await;
        guard.armed = false;
        match outcome {
            Ok(Ok(permit)) => Ok(permit),
            // The sender is dropped unsent only when the backend is marked failed.
            Ok(Err(_)) => Err(self.closed_error(arrived)),
            Err(_) => {
                if self.remove_waiter(id) {
                    return Err(self.timeout_error(arrived));
                }
                // Already dequeued: the permit is on its way (sent just after the lock).
                receiver.await.map_err(|_| self.closed_error(arrived))
            }
        }
    }

    /// Why a waiter's grant channel closed: the backend failed (or, defensively, a timeout).
    fn closed_error(&self, arrived: Instant) -> GatewayError {
        let (failure, shutting_down) = {
            let state = self.queue.lock();
            (state.failure.clone(), state.shutting_down)
        };
        match failure {
            Some(reason) => GatewayError::BackendFailed { backend: self.queue.backend.clone(), reason },
            None if shutting_down => GatewayError::ShuttingDown,
            None => self.timeout_error(arrived),
        }
    }

    fn timeout_error(&self, arrived: Instant) -> GatewayError {
        let state = self.queue.lock();
        GatewayError::QueueTimeout {
            model: state.models[self.index].name.clone(),
            waited: arrived.elapsed(),
            retry_after: state.retry_after(self.queue.max_concurrency),
        }
    }

    /// Removes a still-queued waiter; false when it was already handed a slot.
    fn remove_waiter(&self, id: u64) -> bool {
        let mut state = self.queue.lock();
        let model = &mut state.models[self.index];
        let Some(pos) = model.clients.iter().position(|(_, fifo)| fifo.iter().any(|w| w.id == id)) else {
            return false;
        };
        let fifo = &mut model.clients[pos].1;
        fifo.retain(|w| w.id != id);
        if fifo.is_empty() {
            model.clients.remove(pos);
        }
        model.waiting -= 1;
        self.queue.metrics.queue_depth.with_label_values(&[&model.name]).set(model.waiting as i64);
        true
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
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves counters that are still consistent.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn permit(self: &Arc<Self>) -> Permit {
        let previous = self.lock().previous();
        Permit { shared: Some(Arc::clone(self)), granted: Instant::now(), abandoned: false, finished: false, previous }
    }

    /// Frees a slot: hands it to the next waiter in fair order, or returns it to the pool.
    fn release(self: &Arc<Self>, held: Duration, abandoned: bool, finished: bool) {
        {
            let mut state = self.lock();
            if abandoned {
                state.abandoned -= 1;
            }
            state.last_release = Some((Instant::now(), finished));
            state.observe_service(held);
            state.last_activity = Instant::now();
            state.last_progress = Instant::now();
        }
        self.hand_over();
        self.changed.notify_one();
    }

    /// Gives free slots to waiters while the gate is open and slots are free.
    fn dispatch_free_slots(self: &Arc<Self>) {
        loop {
            {
                let mut state = self.lock();
                let anyone = state.models.iter().any(|m| m.waiting > 0);
                if !state.open || !anyone || state.in_flight >= self.max_concurrency {
                    return;
                }
                state.in_flight += 1;
                self.metrics.inflight.with_label_values(&[&self.backend]).set(state.in_flight as i64);
            }
            // The new slot goes to the next waiter (or back, if that waiter just left).
            self.hand_over();
        }
    }

    /// Passes one held slot to the next waiter in fair order, or frees it.
    fn hand_over(self: &Arc<Self>) {
        loop {
            let (next, previous) = {
                let mut state = self.lock();
                let next = if state.open { state.pop_next() } else { None };
                match next {
                    Some((waiter, model)) => {
                        self.metrics
                            .queue_depth
                            .with_label_values(&[&model])
                            .set(state.models.iter().find(|m| m.name == model).map_or(0, |m| m.waiting as i64));
                        (waiter, state.previous())
                    }
                    None => {
                        state.in_flight -= 1;
                        self.metrics.inflight.with_label_values(&[&self.backend]).set(state.in_flight as i64);
                        return;
                    }
                }
            };
            // The slot moves to the waiter; `in_flight` is unchanged.
            let permit = Permit {
                shared: Some(Arc::clone(self)),
                granted: Instant::now(),
                abandoned: false,
                finished: false,
                previous,
            };
            match next.grant.send(permit) {
                Ok(()) => return,
                // That waiter is gone; disarm the returned permit and try the next one.
                Err(mut unclaimed) => unclaimed.shared = None,
            }
        }
    }
}

impl State {
    /// The previous request's end, as a slot granted now sees it.
    fn previous(&self) -> Option<Previous> {
        self.last_release.map(|(at, finished)| Previous { ended_ago: at.elapsed(), finished })
    }

    /// Next waiter: round robin across models, then across clients within the model.
    fn pop_next(&mut self) -> Option<(Waiter, String)> {
        let n = self.models.len();
        for step in 0..n {
            let index = (self.next_model + step) % n;
            let model = &mut self.models[index];
            let Some((client, mut fifo)) = model.clients.pop_front() else {
                continue;
            };
            let waiter = fifo.pop_front()?;
            if !fifo.is_empty() {
                model.clients.push_back((client, fifo));
            }
            model.waiting -= 1;
            self.next_model = (index + 1) % n;
            return Some((waiter, model.name.clone()));
        }
        None
    }

    fn observe_service(&mut self, held: Duration) {
        self.mean_service = if self.mean_service.is_zero() { held } else { (self.mean_service * 7 + held) / 8 };
    }

    /// A rough time until a slot is likely free: mean slot time × queued rounds ahead.
    fn retry_after(&self, max_concurrency: usize) -> Duration {
        let waiting: usize = self.models.iter().map(|m| m.waiting).sum();
        let rounds = (waiting / max_concurrency.max(1)) as u32 + 1;
        (self.mean_service * rounds).clamp(Duration::from_secs(1), Duration::from_secs(600))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(max_concurrency: usize) -> BackendQueue {
        BackendQueue::new("b", max_concurrency, true, Metrics::new(), Arc::new(Notify::new()))
    }

    fn queue(max_concurrency: usize, max_queue: usize) -> (BackendQueue, ModelSlot) {
        let q = backend(max_concurrency);
        let slot = q.add_model("m", max_queue, Duration::from_secs(60));
        (q, slot)
    }

    fn client(name: &str) -> ClientId {
        ClientId(name.to_string())
    }

    /// Polls until `n` requests wait in the model's queue.
    async fn until_waiting(slot: &ModelSlot, n: usize) {
        while slot.queue.lock().models[slot.index].waiting != n {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn grants_up_to_capacity_then_queues_then_rejects() {
        let (_q, slot) = queue(2, 1);
        let a = slot.acquire(client("a")).await.expect("slot 1");
        let _b = slot.acquire(client("a")).await.expect("slot 2");
        let s2 = slot.clone();
        let waiting = tokio::spawn(async move { s2.acquire(client("a")).await });
        until_waiting(&slot, 1).await;
        let full = slot.acquire(client("a")).await.err().expect("queue full");
        assert!(matches!(full, GatewayError::QueueFull { waiting: 1, in_flight: 2, .. }), "{full:?}");
        drop(a);
        let third = waiting.await.expect("task").expect("slot handed over");
        assert_eq!(slot.queue.lock().in_flight, 2);
        drop(third);
        assert_eq!(slot.queue.lock().in_flight, 1);
    }

    #[tokio::test]
    async fn round_robin_across_clients() {
        let (_q, slot) = queue(1, 16);
        let held = slot.acquire(client("hog")).await.expect("slot");
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        let enqueue = |name: &'static str, n: usize, tasks: &mut Vec<_>| {
            for _ in 0..n {
                let s = slot.clone();
                let order = Arc::clone(&order);
                tasks.push(tokio::spawn(async move {
                    let permit = s.acquire(client(name)).await.expect("slot");
                    order.lock().expect("lock").push(name);
                    drop(permit);
                }));
            }
        };
        enqueue("hog", 5, &mut tasks);
        until_waiting(&slot, 5).await;
        enqueue("small", 2, &mut tasks);
        until_waiting(&slot, 7).await;
        drop(held);
        for t in tasks {
            t.await.expect("task");
        }
        let order = order.lock().expect("lock").clone();
        assert_eq!(order, ["hog", "small", "hog", "small", "hog", "hog", "hog"]);
    }

    #[tokio::test]
    async fn cancelled_waiter_leaves_no_trace_and_times_out() {
        let q = backend(1);
        let slot = q.add_model("m", 4, Duration::from_millis(50));
        let held = slot.acquire(client("a")).await.expect("slot");
        let s2 = slot.clone();
        let task = tokio::spawn(async move { s2.acquire(client("b")).await });
        until_waiting(&slot, 1).await;
        task.abort();
        let _ = task.await;
        assert_eq!(slot.queue.lock().models[0].waiting, 0);
        let timed_out = slot.acquire(client("c")).await.err().expect("times out");
        assert!(matches!(timed_out, GatewayError::QueueTimeout { .. }), "{timed_out:?}");
        drop(held);
        assert_eq!(slot.queue.lock().in_flight, 0);
        let _again = slot.acquire(client("c")).await.expect("free again");
    }

    #[tokio::test]
    async fn round_robin_across_models_of_one_backend() {
        let q = backend(1);
        let m1 = q.add_model("m1", 8, Duration::from_secs(60));
        let m2 = q.add_model("m2", 8, Duration::from_secs(60));
        let held = m1.acquire(client("a")).await.expect("slot");
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (slot, name) in [(&m1, "m1"), (&m1, "m1"), (&m1, "m1"), (&m2, "m2")] {
            let s = slot.clone();
            let order = Arc::clone(&order);
            tasks.push(tokio::spawn(async move {
                let p = s.acquire(client("a")).await.expect("slot");
                order.lock().expect("lock").push(name);
                drop(p);
            }));
            while slot.queue.lock().models.iter().map(|m| m.waiting).sum::<usize>() != tasks.len() {
                tokio::task::yield_now().await;
            }
        }
        drop(held);
        for t in tasks {
            t.await.expect("task");
        }
        assert_eq!(order.lock().expect("lock")[..2], ["m1", "m2"]);
    }
}

#[cfg(test)]
mod gate_tests {
    use super::*;

    #[tokio::test]
    async fn a_closed_gate_queues_and_opening_dispatches_up_to_capacity() {
        let q = BackendQueue::new("b", 2, false, Metrics::new(), Arc::new(Notify::new()));
        let slot = q.add_model("m", 8, Duration::from_secs(60));
        let mut tasks = Vec::new();
        for i in 0..3 {
            let s = slot.clone();
            tasks.push(tokio::spawn(async move { s.acquire(ClientId(format!("c{i}"))).await }));
        }
        while q.view().waiting != 3 {
            tokio::task::yield_now().await;
        }
        assert!(q.view().oldest_wait.is_some());
        q.open();
        assert_eq!((q.view().waiting, q.view().in_flight), (1, 2));
        let first = tasks.remove(0).await.expect("task").expect("permit");
        q.close();
        drop(first);
        assert_eq!(q.view().in_flight, 1, "a closed gate does not hand the slot on");
        assert_eq!(q.view().waiting, 1);
        q.fail("crashed 5 times");
        let results = [tasks.remove(0).await.expect("task"), tasks.remove(0).await.expect("task")];
        let refused = results.into_iter().filter_map(Result::err).next().expect("the waiter is refused");
        assert!(matches!(refused, GatewayError::BackendFailed { .. }), "{refused:?}");
        let now = slot.acquire(ClientId("x".into())).await.err().expect("refused at once");
        assert!(now.to_string().contains("crashed 5 times"), "{now}");
    }

    #[tokio::test]
    async fn the_gate_is_working_while_a_slot_is_held_for_somebody() {
        let q = BackendQueue::new("b", 2, true, Metrics::new(), Arc::new(Notify::new()));
        let slot = q.add_model("m", 8, Duration::from_secs(60));
        assert!(!Gate::working(&q), "no slot held");
        let mut held = slot.acquire(ClientId("a".into())).await.expect("permit");
        assert!(Gate::working(&q));
        held.abandon();
        assert!(!Gate::working(&q), "a slot held for an abandoned answer is no work a drain waits for");
        drop(held);
        assert!(!Gate::working(&q));
    }
}
