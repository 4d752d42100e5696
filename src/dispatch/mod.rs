//! Where a request goes: the public model name's route (its model, its backends' settings and
//! supervisors, its place in the pool of slots: `queue.rs` over `pool.rs`, the router seam
//! `route.rs`), the call (`call.rs`), the scheduler that decides which managed backend runs, and
//! the drain and health of backends.

pub mod balancing;
pub mod call;
pub mod pool;
pub mod queue;
pub mod route;
pub mod scheduler;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::activity::Activity;
use crate::backend::handle::BackendHandle;
use crate::backend::probe_remote;
use crate::backend::supervisor::{Command, Supervisor};
use crate::backend::upstream::Upstream;
use crate::balance::Balancer;
use crate::config::{BackendConfig, Config, ModelConfig};
use crate::error::GatewayError;
use crate::metrics::Metrics;
use pool::HealthPolicy;
use queue::{BackendQueue, ModelSlot, Pool};

/// Everything needed to send one model's requests.
pub struct Route {
    pub model: ModelConfig,
    /// Where its requests wait for a slot (at any of its backends).
    pub slot: ModelSlot,
    /// Its first backend: what is decided before a backend is chosen (the context cap, the
    /// chat template the prompt is counted with) is decided for it.
    pub backend: BackendHandle,
    /// Every backend, in the model's order: a permit's position names one.
    pub backends: Vec<BackendHandle>,
    /// A model of several backends: its balancer, and its backends' names in its order.
    pub balancer: Option<(Arc<Balancer>, Arc<[String]>)>,
}

/// The routing table and the managed backends, built once from the configuration.
pub struct Dispatch {
    routes: HashMap<String, Route>,
    /// Every backend's queue, by name (for `/admin/backends`).
    pub queues: BTreeMap<String, BackendQueue>,
    /// Managed backends, by name.
    pub supervisors: BTreeMap<String, Arc<Supervisor>>,
    /// The scheduler's task, when there are managed backends.
    scheduler: Option<tokio::task::JoinHandle<()>>,
    /// The probes of remote backends that serve a model with others.
    probes: Vec<tokio::task::JoinHandle<()>>,
    /// The memory GPU backends may hold at once (for the fallback rule).
    gpu_memory_budget: Option<u64>,
}

impl Dispatch {
    /// One pool of slots for every backend and one pooled client per backend, a supervisor per
    /// managed backend, one route per public model name; starts the scheduler, any `preload`
    /// backends and the probes of remote backends that share a model. `keeper` is the mlxgate
    /// executable that runs `mlxgate keep`; the scheduler notes its swaps in `activity`.
    pub fn new(config: &Config, metrics: &Metrics, activity: &Arc<Activity>, keeper: PathBuf) -> Self {
        let changed = Arc::new(Notify::new());
        let pool = Pool::new(metrics.clone(), Arc::clone(&changed));
        let mut queues = BTreeMap::new();
        let mut supervisors = BTreeMap::new();
        let mut upstreams = HashMap::new();
        let mut backends = HashMap::new();
        for (name, backend) in &config.backends {
            let backend = Arc::new(backend.clone());
            let queue = pool.add_backend(name, backend.max_concurrency, backend.managed.is_none());
            let upstream = Upstream::new(backend.connect_timeout);
            if let Some(managed) = &backend.managed {
                let supervisor = Supervisor::spawn(
                    Arc::clone(&backend),
                    managed.clone(),
                    Arc::new(queue.clone()),
                    upstream.clone(),
                    keeper.clone(),
                    metrics.clone(),
                    Arc::clone(&changed),
                );
                if managed.preload {
                    supervisor.send(Command::Start);
                }
                supervisors.insert(name.clone(), supervisor);
            }
            upstreams.insert(name.clone(), upstream);
            backends.insert(name.clone(), backend);
            queues.insert(name.clone(), queue);
        }
        // The remote backends of models of several: their health is watched (a single-backend
        // model's backend is never taken out: there is nowhere else to go; a managed one is
        // watched and restarted by its supervisor).
        // A backend that also serves a model of one backend is never taken out either: that
        // model would have nowhere to go (and its requests would take the half-open trials).
        let alone: HashSet<&String> =
            config.models.values().filter(|m| m.backends.len() == 1).flat_map(|m| &m.backends).collect();
        let shared: HashSet<&String> = config
            .models
            .values()
            .filter(|m| m.backends.len() > 1)
            .flat_map(|m| &m.backends)
            .filter(|b| !alone.contains(b))
            .collect();
        let mut probes = Vec::new();
        for name in shared {
            let (Some(queue), Some(backend), Some(upstream)) =
                (queues.get(name), backends.get(name), upstreams.get(name))
            else {
                continue;
            };
            let Some((policy, terms)) = health_of(backend) else { continue };
            queue.set_health_policy(Some(policy));
            probes.push(probe_remote::spawn(Arc::clone(backend), terms, upstream.clone(), Arc::new(queue.clone())));
        }
        let mut routes = HashMap::new();
        for (name, model) in &config.models {
            // `Config::validate` guarantees every model's backends exist (at least one).
            let handles: Vec<BackendHandle> = model
                .backends
                .iter()
                .filter_map(|b| {
                    let (backend, upstream) = (backends.get(b)?, upstreams.get(b)?);
                    Some(BackendHandle::new(Arc::clone(backend), upstream.clone(), supervisors.get(b).cloned()))
                })
                .collect();
            let served_by: Vec<&BackendQueue> = model.backends.iter().filter_map(|b| queues.get(b)).collect();
            let Some(first) = handles.first().cloned() else { continue };
            if served_by.len() != handles.len() {
                continue;
            }
            let slot = pool.add_model(name, model.max_queue, model.max_wait, &served_by);
            let balancer = (handles.len() > 1).then(|| {
                let configs: Vec<&BackendConfig> = handles.iter().map(|h| h.config.as_ref()).collect();
                let balancer = Arc::new(balancing::balancer_for(model, &configs));
                let names: Arc<[String]> = model.backends.iter().cloned().collect();
                for backend in names.iter() {
                    metrics.route_index_sequences.with_label_values(&[name, backend]).set(0);
                }
                // A backend's new process (or its return from an ejection) holds no prompt.
                let (forget, model_name, labels) = (Arc::clone(&balancer), name.clone(), Arc::clone(&names));
                let metrics = metrics.clone();
                slot.on_restart(Arc::new(move |position| {
                    forget.backend_restarted(position);
                    if let Some(backend) = labels.get(position) {
                        metrics.route_index_sequences.with_label_values(&[&model_name, backend]).set(0);
                    }
                }));
                (balancer, names)
            });
            routes.insert(
                name.clone(),
                Route { model: model.clone(), slot, backend: first, backends: handles, balancer },
            );
        }
        let scheduler = (!supervisors.is_empty()).then(|| {
            let managed = supervisors
                .iter()
                .filter_map(|(name, supervisor)| {
                    let queue = queues.get(name)?.clone();
                    Some(scheduler::Managed { supervisor: Arc::clone(supervisor), queue })
                })
                .collect();
            let policy = scheduler::Policy {
                swap_after: config.swap_after,
                loading_share: config.loading_share,
                gpu_memory_budget: config.gpu_memory_budget,
            };
            tokio::spawn(scheduler::run(managed, policy, changed, metrics.clone(), Arc::clone(activity)))
        });
        Dispatch { routes, queues, supervisors, scheduler, probes, gpu_memory_budget: config.gpu_memory_budget }
    }

    /// Drains backend `name` (`true`: no new requests, running ones finish; its models' waiting
    /// requests go to their other backends) or ends its drain. An unknown backend is 404.
    pub fn drain(&self, name: &str, drained: bool) -> Result<(), GatewayError> {
        let queue = self.queues.get(name).ok_or_else(|| GatewayError::UnknownBackend(name.to_string()))?;
        queue.drain(drained);
        tracing::info!(backend = %name, drained, "backend drain changed");
        Ok(())
    }

    /// Whether backend `name` is drained (false for an unknown one).
    pub fn drained(&self, name: &str) -> bool {
        self.queues.get(name).is_some_and(|q| q.status().drained)
    }

    /// Backend `name`'s health: `healthy`, `ejected` or `half_open` (`healthy` for an unknown one).
    pub fn health_label(&self, name: &str) -> &'static str {
        self.queues.get(name).map_or("healthy", |q| q.status().health)
    }

    /// The route for a public model name.
    pub fn route(&self, model: &str) -> Option<&Route> {
        self.routes.get(model)
    }

    /// The model that serves `model`'s requests now instead of it: its `fallback:`, while none
    /// of its backends runs, starting one would need a swap, and one of the fallback's
    /// backends is starting or ready ([`scheduler::stands_in`]) and not drained for
    /// maintenance. None: `model` serves them.
    pub fn fallback_for(&self, model: &str) -> Option<&str> {
        let route = self.routes.get(model)?;
        let fallback = route.model.fallback.as_deref()?;
        let instead = self.routes.get(fallback)?;
        let views: Vec<scheduler::BackendView> = self
            .supervisors
            .iter()
            .filter_map(|(name, supervisor)| scheduler::view_of(supervisor, self.queues.get(name)?))
            .collect();
        let own: Vec<&str> = route.model.backends.iter().map(String::as_str).collect();
        // A backend drained for maintenance takes no new request: it cannot stand in.
        let theirs: Vec<&str> =
            instead.model.backends.iter().map(String::as_str).filter(|b| !self.drained(b)).collect();
        scheduler::stands_in(&views, &own, &theirs, self.gpu_memory_budget).then_some(fallback)
    }

    /// Stops starting, swapping and idling backends (the gateway is shutting down): running
    /// backends keep serving for the whole shutdown grace, nothing starts or restarts, and
    /// requests waiting for a backend that is not serving get 503 `gateway_shutdown` at once.
    pub fn stop_scheduling(&self) {
        if let Some(task) = &self.scheduler {
            task.abort();
        }
        for probe in &self.probes {
            probe.abort();
        }
        for (name, supervisor) in &self.supervisors {
            supervisor.shut_down();
            if let Some(queue) = self.queues.get(name) {
                queue.shut_down();
            }
        }
    }

    /// Stops every managed backend (SIGTERM, SIGKILL after its stop_timeout) and waits.
    pub async fn shutdown(&self) {
        for s in self.supervisors.values() {
            s.send(Command::Shutdown);
        }
        let all = futures_util::future::join_all(self.supervisors.values().map(|s| async move {
            let bound = s.config.managed.as_ref().map_or(Duration::ZERO, |m| m.stop_timeout) + Duration::from_secs(10);
            if tokio::time::timeout(bound, s.stopped()).await.is_err() {
                tracing::warn!(backend = %s.config.name, "backend did not stop in time");
            }
        }));
        all.await;
    }
}

/// When a remote backend of a model of several is ejected, and how it is probed: its `health:`
/// (defaults filled in by the configuration; `None` for a managed backend, which its
/// supervisor's health check restarts instead).
fn health_of(backend: &BackendConfig) -> Option<(HealthPolicy, probe_remote::Terms)> {
    let health = backend.health.as_ref().filter(|_| backend.managed.is_none())?;
    let policy = HealthPolicy { request_failures: health.request_failures, eject_for: health.eject_for };
    let terms = probe_remote::Terms {
        interval: health.probe.interval,
        timeout: health.probe.timeout,
        failures: health.probe.failures,
        eject_for: health.eject_for,
    };
    Some((policy, terms))
}
