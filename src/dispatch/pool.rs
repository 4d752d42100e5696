//! The pool's state, as plain data under the queue's one lock: every backend's slots, gate,
//! drain and health, and every model's bounded fair queue. Pure (no channels, no clock of its
//! own: `now` is passed in; a waiter's grant is a type parameter), so that the property test
//! drives it over random schedules.
//!
//! The rules:
//! - **late binding**: a model's waiter is bound to a backend only when one of its backends has
//!   a slot for it. A freed slot goes to the next waiter that may take it: round robin across
//!   the backend's models, then across each model's clients (a client's first waiter that may
//!   take it);
//! - a waiter may **prefer** one backend until a deadline (the router said waiting for it costs
//!   less than prefilling elsewhere): until then only that backend's slot is given to it; a
//!   waiter never gets a backend it **excluded** (tried already);
//! - a backend takes new requests while its gate is open, it is not **drained** and its
//!   **health** allows: healthy, or half-open with its one trial not yet out (an ejection ends
//!   in half-open at its deadline);
//! - a model's request is refused at once only when none of its backends can ever serve it
//!   (failed, or closed while the gateway shuts down); a waiter left with no such backend is
//!   refused too; behind drained, closed or ejected backends it waits, bounded by `max_wait`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::queue::{ClientId, Previous};
use super::route::{Candidate, Choice, Router, least_loaded};
use crate::error::GatewayError;

/// A model's backends are told apart in a 64-bit mask (the backends a waiter excluded): a model
/// has at most this many (more are never excluded).
pub const MAX_BACKENDS_PER_MODEL: usize = 64;

/// The mask bit of the backend at `position` in a model's list.
pub fn bit(position: usize) -> u64 {
    if position < MAX_BACKENDS_PER_MODEL { 1 << position } else { 0 }
}

/// A backend's health, as requests and probes have shown it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Healthy,
    /// Taken out until then; half-open after.
    Ejected {
        until: Instant,
    },
    /// One trial request allowed (`trial`: it is out); its outcome heals or ejects again.
    HalfOpen {
        trial: bool,
    },
}

impl Health {
    /// Its name in `/admin/backends` at `now`.
    pub fn label(self, now: Instant) -> &'static str {
        match self {
            Health::Healthy => "healthy",
            Health::Ejected { until } if now < until => "ejected",
            _ => "half_open",
        }
    }
}

/// When a backend is ejected: after `request_failures` failed requests in a row, for `eject_for`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthPolicy {
    pub request_failures: u32,
    pub eject_for: Duration,
}

/// What a health report changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    None,
    /// Ejected until then (slots free again then, for one trial).
    Ejected(Instant),
    /// Healthy again.
    Healed,
}

/// One backend's slots, gate, drain and health.
pub struct Backend {
    pub name: String,
    pub max_concurrency: usize,
    /// Slots are handed out only while open.
    pub open: bool,
    /// Set while the backend is failed: requests it alone could serve are refused with it.
    pub failure: Option<String>,
    /// The gateway is shutting down: behind a closed gate nobody waits (it will not start again).
    pub shutting_down: bool,
    /// Drained (admin): no new requests; running ones go on.
    pub drained: bool,
    pub health: Health,
    /// `None`: never ejected (a backend of single-backend models only).
    pub policy: Option<HealthPolicy>,
    pub failures_in_row: u32,
    /// The ejection was a probe's (a passing probe ends it; a request's is ended by its trial).
    pub ejected_by_probe: bool,
    pub ejections: u64,
    /// How many times the gate opened on a new process (a restart: its prompt cache is gone).
    pub opened: u64,
    /// Last time a request arrived or a slot was freed (for idle stops).
    pub last_activity: Instant,
    /// Last time a slot was handed out or freed, or the gate opened (for stalled backends).
    pub last_progress: Instant,
    pub in_flight: usize,
    /// Of `in_flight`, the slots held for answers their clients abandoned.
    pub abandoned: usize,
    /// When a slot was last freed, and whether its answer had ended normally.
    pub last_release: Option<(Instant, bool)>,
    /// Smoothed time a request holds a slot, for `Retry-After` estimates and routers.
    pub mean_service: Duration,
    /// The models it serves (indices into [`Core::models`]), and whose turn is next.
    pub models: Vec<usize>,
    next_model: usize,
}

impl Backend {
    /// It may be handed a new request at `now`.
    pub fn takes_new(&self, now: Instant) -> bool {
        self.open
            && !self.drained
            && self.failure.is_none()
            && match self.health {
                Health::Healthy => true,
                Health::Ejected { until } => now >= until,
                Health::HalfOpen { trial } => !trial,
            }
    }

    /// A request that failed elsewhere before its first byte may be sent here: not dead, not
    /// drained, not ejected now (a backend starting or busy will take it in its turn; one that
    /// takes nothing would leave the request to wait out its `max_wait` for a late 503 instead
    /// of the first backend's own error).
    pub fn takes_a_failover(&self, now: Instant) -> bool {
        !self.dead() && !self.drained && !matches!(self.health, Health::Ejected { until } if until > now)
    }

    /// It can never serve a waiting request: failed, or closed while the gateway shuts down.
    pub fn dead(&self) -> bool {
        self.failure.is_some() || (self.shutting_down && !self.open)
    }

    /// A slot of it was just granted: returns whether it is the half-open trial.
    fn mark_grant(&mut self, now: Instant) -> bool {
        self.last_progress = now;
        match self.health {
            Health::Healthy => false,
            _ => {
                self.health = Health::HalfOpen { trial: true };
                true
            }
        }
    }

    /// The previous request's end, as a slot granted now sees it.
    pub fn previous(&self) -> Option<Previous> {
        self.last_release.map(|(at, finished)| Previous { ended_ago: at.elapsed(), finished })
    }

    fn observe_service(&mut self, held: Duration) {
        self.mean_service = if self.mean_service.is_zero() { held } else { (self.mean_service * 7 + held) / 8 };
    }
}

/// One model's bounded fair queue.
pub struct Model<G> {
    pub name: String,
    pub max_queue: usize,
    pub max_wait: Duration,
    pub waiting: usize,
    /// Clients with waiting requests, in turn order; each with its own FIFO.
    pub clients: VecDeque<(ClientId, VecDeque<Waiter<G>>)>,
    /// Its backends (indices into [`Core::backends`]) in the model's order: a position in this
    /// list is what routers, preferences and exclusions name.
    pub backends: Vec<usize>,
}

/// A waiting request.
pub struct Waiter<G> {
    pub id: u64,
    pub since: Instant,
    pub grant: G,
    /// Only this position's slot until then.
    pub prefer: Option<(usize, Instant)>,
    /// Positions it must not be given (a mask of [`bit`]s).
    pub excluded: u64,
}

impl<G> Waiter<G> {
    /// It may take a slot of the backend at `position` at `now`.
    pub fn may_take(&self, position: usize, now: Instant) -> bool {
        self.excluded & bit(position) == 0
            && match self.prefer {
                Some((preferred, until)) if now < until => preferred == position,
                _ => true,
            }
    }

    /// Its live preference at `now`.
    pub fn preferring(&self, now: Instant) -> Option<usize> {
        self.prefer.filter(|&(_, until)| now < until).map(|(position, _)| position)
    }
}

/// A request's terms at the queue.
pub struct Ask<'a> {
    pub client: ClientId,
    /// Waits at most this long (when less than the model's `max_wait`).
    pub limit: Duration,
    /// Positions of backends it must not be given (a mask of [`bit`]s): those tried already.
    pub excluded: u64,
    /// Chooses among a model's several backends (`None`: the least loaded).
    pub router: Option<Router<'a>>,
}

/// What an arrival came to.
pub enum Arrival {
    /// A slot now, at the model's backend at this position (`trial`: a half-open backend's).
    Granted { position: usize, backend: usize, trial: bool },
    /// Queued (its grant kept) with this id, preferring a backend until then.
    Queued { id: u64, prefer_until: Option<Instant>, max_wait: Duration },
}

/// A grant taken from the queue for a backend's slot.
pub struct Granted<G> {
    pub waiter: Waiter<G>,
    pub model: usize,
    pub position: usize,
    pub trial: bool,
    /// The backend's previous request, as the grant sees it.
    pub previous: Option<Previous>,
}

/// Every backend and every model.
pub struct Core<G> {
    pub backends: Vec<Backend>,
    pub models: Vec<Model<G>>,
    next_waiter_id: u64,
}

impl<G> Default for Core<G> {
    fn default() -> Self {
        Core { backends: Vec::new(), models: Vec::new(), next_waiter_id: 0 }
    }
}

impl<G> Core<G> {
    /// Adds a backend with `max_concurrency` slots, its gate `open` or not; returns its index.
    pub fn add_backend(&mut self, name: &str, max_concurrency: usize, open: bool, now: Instant) -> usize {
        self.backends.push(Backend {
            name: name.to_string(),
            max_concurrency,
            open,
            failure: None,
            shutting_down: false,
            drained: false,
            health: Health::Healthy,
            policy: None,
            failures_in_row: 0,
            ejected_by_probe: false,
            ejections: 0,
            opened: 0,
            last_activity: now,
            last_progress: now,
            in_flight: 0,
            abandoned: 0,
            last_release: None,
            mean_service: Duration::ZERO,
            models: Vec::new(),
            next_model: 0,
        });
        self.backends.len() - 1
    }

    /// Adds a model served by `backends` (indices, in the model's order); returns its index.
    pub fn add_model(&mut self, name: &str, max_queue: usize, max_wait: Duration, backends: &[usize]) -> usize {
        let index = self.models.len();
        self.models.push(Model {
            name: name.to_string(),
            max_queue,
            max_wait,
            waiting: 0,
            clients: VecDeque::new(),
            backends: backends.to_vec(),
        });
        for &b in backends {
            self.backends[b].models.push(index);
        }
        index
    }

    /// Opens backend `b`'s gate (a new process is ready): a failure is forgotten, and so is its
    /// health (the process that failed is gone).
    pub fn open(&mut self, b: usize, now: Instant) {
        let backend = &mut self.backends[b];
        backend.open = true;
        backend.failure = None;
        backend.health = Health::Healthy;
        backend.failures_in_row = 0;
        backend.ejected_by_probe = false;
        backend.opened += 1;
        backend.last_progress = now;
    }

    /// Closes backend `b`'s gate: its waiters go to other backends; during the gateway's
    /// shutdown, those no other backend can serve are refused (returned).
    pub fn close(&mut self, b: usize) -> Vec<Waiter<G>> {
        self.backends[b].open = false;
        self.drop_preferences_for(b);
        self.refuse_hopeless()
    }

    /// Marks backend `b` failed with `reason`: waiters no other backend can serve are refused
    /// (returned).
    pub fn fail(&mut self, b: usize, reason: &str) -> Vec<Waiter<G>> {
        let backend = &mut self.backends[b];
        backend.open = false;
        backend.failure = Some(reason.to_string());
        self.drop_preferences_for(b);
        self.refuse_hopeless()
    }

    /// The gateway shuts down: behind `b`'s closed gate nobody waits who has nowhere else to
    /// go (returned).
    pub fn shut_down(&mut self, b: usize) -> Vec<Waiter<G>> {
        self.backends[b].shutting_down = true;
        self.refuse_hopeless()
    }

    /// Drains backend `b` or ends its drain.
    pub fn set_drained(&mut self, b: usize, drained: bool) {
        self.backends[b].drained = drained;
        if drained {
            self.drop_preferences_for(b);
        }
    }

    /// Whether any queued waiter may take backend `b`'s slot at `now`.
    pub fn anyone_for(&self, b: usize, now: Instant) -> bool {
        self.backends[b].models.iter().any(|&m| {
            let model = &self.models[m];
            if model.waiting == 0 {
                return false;
            }
            if model.backends.len() == 1 {
                return true;
            }
            let Some(position) = model.backends.iter().position(|&x| x == b) else { return false };
            model.clients.iter().any(|(_, fifo)| fifo.iter().any(|w| w.may_take(position, now)))
        })
    }

    /// Whether backend `b` can hand a new request a slot at `now`: it takes new requests, has a
    /// free slot, and no waiter may take that slot (it would be theirs).
    pub fn grantable(&self, b: usize, now: Instant) -> bool {
        let backend = &self.backends[b];
        backend.takes_new(now) && backend.in_flight < backend.max_concurrency && !self.anyone_for(b, now)
    }

    /// A request of model `m` arrives on the terms of `ask` (`excluded`: positions it must not
    /// be given). A model of one backend takes its free slot; a model of several asks its router
    /// (under this lock).
    /// Queued, it keeps the grant `make` returns. Refused: none of its backends can serve it,
    /// or its queue is full.
    pub fn arrive(
        &mut self,
        m: usize,
        ask: Ask<'_>,
        now: Instant,
        make: impl FnOnce() -> G,
    ) -> Result<Arrival, GatewayError> {
        let Ask { client, limit, excluded, router: choose } = ask;
        self.refuse_if_hopeless(m, excluded)?;
        let positions = self.models[m].backends.len();
        let (take, prefer) = if positions == 1 {
            let b = self.models[m].backends[0];
            self.backends[b].last_activity = now;
            (self.grantable(b, now).then_some(0), None)
        } else {
            self.choose(m, excluded, choose, now)
        };
        if let Some(position) = take {
            let b = self.models[m].backends[position];
            let backend = &mut self.backends[b];
            backend.last_activity = now;
            backend.in_flight += 1;
            let trial = backend.mark_grant(now);
            return Ok(Arrival::Granted { position, backend: b, trial });
        }
        let id = self.next_waiter_id;
        self.next_waiter_id += 1;
        let retry_after = self.retry_after(m);
        let in_flight = self.models[m].backends.iter().map(|&b| self.backends[b].in_flight).sum();
        let model = &mut self.models[m];
        if model.waiting >= model.max_queue {
            return Err(GatewayError::QueueFull {
                model: model.name.clone(),
                waiting: model.waiting,
                in_flight,
                retry_after,
            });
        }
        // A preference never outlasts half of what is left of the request's wait: after it, the
        // request may still take any backend's slot before its max_wait runs out.
        let patience_cap = model.max_wait.min(limit) / 2;
        let prefer = prefer.map(|(position, wait)| (position, now + wait.min(patience_cap)));
        let waiter = Waiter { id, since: now, grant: make(), prefer, excluded };
        match model.clients.iter_mut().find(|(c, _)| *c == client) {
            Some((_, fifo)) => fifo.push_back(waiter),
            None => model.clients.push_back((client, VecDeque::from([waiter]))),
        }
        model.waiting += 1;
        let max_wait = model.max_wait.min(limit);
        Ok(Arrival::Queued { id, prefer_until: prefer.map(|(_, until)| until), max_wait })
    }

    /// Refuses a request of model `m` none of whose backends (less `excluded`) can ever serve
    /// it: the first failure's reason, else the gateway's shutdown.
    fn refuse_if_hopeless(&self, m: usize, excluded: u64) -> Result<(), GatewayError> {
        let backends = &self.models[m].backends;
        let mut live = backends.iter().enumerate().filter(|&(p, _)| excluded & bit(p) == 0).map(|(_, &b)| b);
        if live.clone().any(|b| !self.backends[b].dead()) {
            return Ok(());
        }
        Err(self.dead_error(&mut live))
    }

    /// Why requests of backends that are all dead are refused.
    fn dead_error(&self, backends: &mut dyn Iterator<Item = usize>) -> GatewayError {
        for b in backends {
            let backend = &self.backends[b];
            if let Some(reason) = &backend.failure {
                return GatewayError::BackendFailed { backend: backend.name.clone(), reason: reason.clone() };
            }
        }
        // Dead without a failure: closed while the gateway shuts down.
        GatewayError::ShuttingDown
    }

    /// The candidates of model `m` for a request excluding `excluded`, at `now`.
    pub fn candidates(&self, m: usize, excluded: u64, now: Instant) -> Vec<Candidate<'_>> {
        let model = &self.models[m];
        let queued =
            model.clients.iter().flat_map(|(_, fifo)| fifo.iter()).filter(|w| w.preferring(now).is_none()).count();
        model
            .backends
            .iter()
            .enumerate()
            .map(|(position, &b)| {
                let backend = &self.backends[b];
                let usable = excluded & bit(position) == 0 && backend.takes_new(now);
                let free = usable && self.grantable(b, now);
                let waiting_for = model
                    .clients
                    .iter()
                    .flat_map(|(_, fifo)| fifo.iter())
                    .filter(|w| w.preferring(now) == Some(position))
                    .count();
                Candidate {
                    backend: position,
                    name: &backend.name,
                    usable,
                    free_slots: if free { backend.max_concurrency - backend.in_flight } else { 0 },
                    in_flight: backend.in_flight,
                    waiting_for,
                    queued,
                    max_concurrency: backend.max_concurrency,
                    mean_service: backend.mean_service,
                }
            })
            .collect()
    }

    /// A model of several backends: the router's choice, kept to what holds — a slot taken
    /// only where one is free for it, a preference only for a usable backend; a router that
    /// takes nothing and prefers nothing while slots are free gets the least loaded one.
    fn choose(
        &mut self,
        m: usize,
        excluded: u64,
        choose: Option<Router<'_>>,
        now: Instant,
    ) -> (Option<usize>, Option<(usize, Duration)>) {
        let candidates = self.candidates(m, excluded, now);
        let choice = match choose {
            Some(choose) => choose(&candidates),
            None => least_loaded(&candidates),
        };
        let free = |p: usize| candidates.get(p).is_some_and(|c| c.free_slots > 0);
        let usable = |p: usize| candidates.get(p).is_some_and(|c| c.usable);
        let decided = match choice {
            Choice { now: Some(p), .. } if free(p) => (Some(p), None),
            Choice { prefer: Some((p, _)), .. } if free(p) => (Some(p), None),
            Choice { prefer: Some((p, wait)), .. } if usable(p) && !wait.is_zero() => (None, Some((p, wait))),
            _ => (least_loaded(&candidates).now, None),
        };
        drop(candidates);
        for &b in &self.models[m].backends {
            self.backends[b].last_activity = now;
        }
        decided
    }

    /// Takes the next waiter that may take backend `b`'s slot at `now` out of the queue: round
    /// robin across `b`'s models, then across each model's clients.
    pub fn next_for(&mut self, b: usize, now: Instant) -> Option<Granted<G>> {
        let n = self.backends[b].models.len();
        for step in 0..n {
            let k = (self.backends[b].next_model + step) % n;
            let m = self.backends[b].models[k];
            let model = &mut self.models[m];
            if model.waiting == 0 {
                continue;
            }
            let Some(position) = model.backends.iter().position(|&x| x == b) else { continue };
            let found = model
                .clients
                .iter()
                .enumerate()
                .find_map(|(c, (_, fifo))| fifo.iter().position(|w| w.may_take(position, now)).map(|w| (c, w)));
            let Some((c, w)) = found else { continue };
            let (client, mut fifo) = model.clients.remove(c)?;
            let waiter = fifo.remove(w)?;
            if !fifo.is_empty() {
                model.clients.push_back((client, fifo));
            }
            model.waiting -= 1;
            self.backends[b].next_model = (k + 1) % n;
            let trial = self.backends[b].mark_grant(now);
            let previous = self.backends[b].previous();
            return Some(Granted { waiter, model: m, position, trial, previous });
        }
        None
    }

    /// Passes a held slot of backend `b` to the next waiter that may take it, or frees it
    /// (`None`): `in_flight` is unchanged by a hand-over.
    pub fn hand_over(&mut self, b: usize, now: Instant) -> Option<Granted<G>> {
        let next = if self.backends[b].takes_new(now) { self.next_for(b, now) } else { None };
        if next.is_none() {
            self.backends[b].in_flight -= 1;
        }
        next
    }

    /// A free slot of backend `b` for the next waiter that may take it, if it takes requests,
    /// has a free slot and such a waiter exists.
    pub fn grant_free(&mut self, b: usize, now: Instant) -> Option<Granted<G>> {
        let backend = &self.backends[b];
        if !backend.takes_new(now) || backend.in_flight >= backend.max_concurrency || !self.anyone_for(b, now) {
            return None;
        }
        self.backends[b].in_flight += 1;
        self.hand_over(b, now)
    }

    /// A half-open backend's trial was granted to a waiter that was gone: another may take it.
    pub fn trial_untaken(&mut self, b: usize) {
        let backend = &mut self.backends[b];
        if backend.health == (Health::HalfOpen { trial: true }) {
            backend.health = Health::HalfOpen { trial: false };
        }
    }

    /// A slot of `b` freed after `held` (`abandoned`: it was held for an abandoned answer;
    /// `finished`: its answer ended normally; `trial`: it was the half-open trial, which ends
    /// unjudged when no report came). The slot stays counted: the caller hands it over.
    pub fn released(&mut self, b: usize, held: Duration, abandoned: bool, finished: bool, trial: bool, now: Instant) {
        let backend = &mut self.backends[b];
        if abandoned {
            backend.abandoned -= 1;
        }
        if trial && backend.health == (Health::HalfOpen { trial: true }) {
            backend.health = Health::HalfOpen { trial: false };
        }
        backend.last_release = Some((now, finished));
        backend.observe_service(held);
        backend.last_activity = now;
        backend.last_progress = now;
    }

    /// Removes a still-queued waiter; `None` when it was already handed a slot.
    pub fn remove_waiter(&mut self, m: usize, id: u64) -> Option<Waiter<G>> {
        let model = &mut self.models[m];
        let c = model.clients.iter().position(|(_, fifo)| fifo.iter().any(|w| w.id == id))?;
        let fifo = &mut model.clients[c].1;
        let w = fifo.iter().position(|w| w.id == id)?;
        let waiter = fifo.remove(w);
        if fifo.is_empty() {
            model.clients.remove(c);
        }
        model.waiting -= 1;
        waiter
    }

    /// A waiter's preference ran out: it takes any free slot it may take now (the least loaded),
    /// leaving the queue; else it waits on for any backend. Returns the grant (the waiter's own
    /// grant channel is dropped with it).
    pub fn preference_over(&mut self, m: usize, id: u64, now: Instant) -> Option<(usize, usize, bool)> {
        let model = &mut self.models[m];
        let waiter = model.clients.iter_mut().flat_map(|(_, fifo)| fifo.iter_mut()).find(|w| w.id == id)?;
        waiter.prefer = None;
        let excluded = waiter.excluded;
        let candidates = self.candidates_free_for(m, excluded, now);
        let position = least_loaded(&candidates).now?;
        drop(candidates);
        self.remove_waiter(m, id)?;
        let b = self.models[m].backends[position];
        let backend = &mut self.backends[b];
        backend.in_flight += 1;
        let trial = backend.mark_grant(now);
        Some((position, b, trial))
    }

    /// As [`Core::candidates`], a slot counted free wherever the backend takes new requests
    /// and has one (the waiter asking is one of the queue's).
    fn candidates_free_for(&self, m: usize, excluded: u64, now: Instant) -> Vec<Candidate<'_>> {
        let mut candidates = self.candidates(m, excluded, now);
        for c in &mut candidates {
            let backend = &self.backends[self.models[m].backends[c.backend]];
            c.free_slots = if c.usable { backend.max_concurrency.saturating_sub(backend.in_flight) } else { 0 };
        }
        candidates
    }

    /// Waiters preferring backend `b` (no longer usable) wait for any backend from now on.
    pub fn drop_preferences_for(&mut self, b: usize) {
        for &m in &self.backends[b].models {
            let model = &mut self.models[m];
            let Some(position) = model.backends.iter().position(|&x| x == b) else { continue };
            for (_, fifo) in &mut model.clients {
                for w in fifo.iter_mut().filter(|w| w.prefer.is_some_and(|(p, _)| p == position)) {
                    w.prefer = None;
                }
            }
        }
    }

    /// Takes out every waiter none of whose backends (less its exclusions) can ever serve it;
    /// dropping their grants wakes them, and they read why ([`Core::closed_error`]).
    pub fn refuse_hopeless(&mut self) -> Vec<Waiter<G>> {
        let mut refused = Vec::new();
        for model in &mut self.models {
            let backends = &self.backends;
            let dead = |w: &Waiter<G>| {
                model.backends.iter().enumerate().all(|(p, &b)| w.excluded & bit(p) != 0 || backends[b].dead())
            };
            if !model.clients.iter().any(|(_, fifo)| fifo.iter().any(dead)) {
                continue;
            }
            for (_, fifo) in &mut model.clients {
                let (gone, kept): (VecDeque<_>, VecDeque<_>) = fifo.drain(..).partition(dead);
                *fifo = kept;
                refused.extend(gone);
            }
            model.clients.retain(|(_, fifo)| !fifo.is_empty());
            model.waiting = model.clients.iter().map(|(_, fifo)| fifo.len()).sum();
        }
        refused
    }

    /// Why a waiter of model `m` (excluding `excluded`) lost its grant channel: its backends
    /// failed or the gateway shuts down (else, defensively, a timeout).
    pub fn closed_error(&self, m: usize, excluded: u64, waited: Duration) -> GatewayError {
        match self.refuse_if_hopeless(m, excluded) {
            Err(e) => e,
            Ok(()) => self.timeout_error(m, waited),
        }
    }

    /// The 503 of a request that waited `waited` in vain.
    pub fn timeout_error(&self, m: usize, waited: Duration) -> GatewayError {
        GatewayError::QueueTimeout { model: self.models[m].name.clone(), waited, retry_after: self.retry_after(m) }
    }

    /// A rough time until a slot is likely free for model `m`: its soonest backend's mean slot
    /// time × queued rounds ahead.
    pub fn retry_after(&self, m: usize) -> Duration {
        let model = &self.models[m];
        model
            .backends
            .iter()
            .map(|&b| {
                let backend = &self.backends[b];
                let waiting: usize = backend.models.iter().map(|&m| self.models[m].waiting).sum();
                let rounds = (waiting / backend.max_concurrency.max(1)) as u32 + 1;
                (backend.mean_service * rounds).clamp(Duration::from_secs(1), Duration::from_secs(600))
            })
            .min()
            .unwrap_or(Duration::from_secs(1))
    }

    /// A request on backend `b` succeeded (`ok`) or failed: a success heals, `request_failures`
    /// failures in a row (or a half-open trial's failure) eject for `eject_for`.
    pub fn report(&mut self, b: usize, ok: bool, now: Instant) -> Change {
        let backend = &mut self.backends[b];
        let Some(policy) = backend.policy else { return Change::None };
        if ok {
            backend.failures_in_row = 0;
            if backend.health == Health::Healthy {
                return Change::None;
            }
            backend.health = Health::Healthy;
            backend.ejected_by_probe = false;
            return Change::Healed;
        }
        backend.failures_in_row = backend.failures_in_row.saturating_add(1);
        let eject = match backend.health {
            Health::Healthy => backend.failures_in_row >= policy.request_failures.max(1),
            // A failure of the trial, or of a request granted before the ejection.
            Health::HalfOpen { .. } => true,
            Health::Ejected { .. } => false,
        };
        if !eject {
            return Change::None;
        }
        self.eject(b, policy.eject_for, false, now)
    }

    /// Takes backend `b` out for `eject_for` (`by_probe`: its ready path failed).
    pub fn eject(&mut self, b: usize, eject_for: Duration, by_probe: bool, now: Instant) -> Change {
        let backend = &mut self.backends[b];
        let until = now + eject_for;
        // An outage the probes keep seeing is one ejection: extended, not counted again.
        if by_probe && backend.ejected_by_probe && matches!(backend.health, Health::Ejected { .. }) {
            backend.health = Health::Ejected { until };
            return Change::None;
        }
        backend.health = Health::Ejected { until };
        backend.ejected_by_probe = by_probe;
        backend.ejections += 1;
        self.drop_preferences_for(b);
        Change::Ejected(until)
    }

    /// A probe of backend `b` passed: ends an ejection the probes made.
    pub fn probe_passed(&mut self, b: usize) -> Change {
        let backend = &mut self.backends[b];
        if !backend.ejected_by_probe || backend.health == Health::Healthy {
            return Change::None;
        }
        backend.health = Health::Healthy;
        backend.ejected_by_probe = false;
        backend.failures_in_row = 0;
        Change::Healed
    }

    /// The waiters counted for backend `b` in the scheduler's view at `now`: those that may take
    /// its slot and either prefer it or have no other backend taking new requests (a managed
    /// backend swapped out is not brought back while another can serve them). Returns their
    /// count and the oldest one's arrival.
    pub fn waiting_for(&self, b: usize, now: Instant) -> (usize, Option<Instant>) {
        let mut count = 0;
        let mut oldest: Option<Instant> = None;
        // A drained backend takes nothing: nobody waits for it (the scheduler must not start
        // it, or swap the GPU to it).
        if self.backends[b].drained {
            return (0, None);
        }
        for &m in &self.backends[b].models {
            let model = &self.models[m];
            let Some(position) = model.backends.iter().position(|&x| x == b) else { continue };
            let others_serve =
                |w: &Waiter<G>| {
                    model.backends.iter().enumerate().any(|(p, &other)| {
                        p != position && w.excluded & bit(p) == 0 && self.backends[other].takes_new(now)
                    })
                };
            for w in model.clients.iter().flat_map(|(_, fifo)| fifo.iter()) {
                let counted = model.backends.len() == 1
                    || (w.may_take(position, now) && (w.preferring(now) == Some(position) || !others_serve(w)));
                if counted {
                    count += 1;
                    oldest = Some(oldest.map_or(w.since, |o| o.min(w.since)));
                }
            }
        }
        (count, oldest)
    }
}

#[cfg(test)]
mod tests;
