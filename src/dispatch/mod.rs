//! Where a request goes: the public model name's route (its model and backend settings, its
//! place in the backend's queue, and the backend's supervisor when mlxgate runs it), plus the
//! scheduler that decides which managed backend runs.

mod admin_stub;
pub mod call;
pub mod queue;
pub mod scheduler;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::backend::handle::BackendHandle;
use crate::backend::supervisor::{Command, Supervisor};
use crate::backend::upstream::Upstream;
use crate::config::{Config, ModelConfig};
use crate::metrics::Metrics;
use queue::{BackendQueue, ModelSlot};

/// Everything needed to send one model's requests.
pub struct Route {
    pub model: ModelConfig,
    /// Where its requests wait for a slot.
    pub slot: ModelSlot,
    /// Its backend: sends, waits for the first bytes, decides retries.
    pub backend: BackendHandle,
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
}

impl Dispatch {
    /// One queue and one pooled client per backend, a supervisor per managed backend, one
    /// route per public model name; starts the scheduler and any `preload` backends.
    /// `keeper` is the mlxgate executable that runs `mlxgate keep`.
    pub fn new(config: &Config, metrics: &Metrics, keeper: PathBuf) -> Self {
        let changed = Arc::new(Notify::new());
        let mut queues = BTreeMap::new();
        let mut supervisors = BTreeMap::new();
        let mut upstreams = HashMap::new();
        let mut backends = HashMap::new();
        for (name, backend) in &config.backends {
            let backend = Arc::new(backend.clone());
            let queue = BackendQueue::new(
                name,
                backend.max_concurrency,
                backend.managed.is_none(),
                metrics.clone(),
                Arc::clone(&changed),
            );
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
        let mut routes = HashMap::new();
        for (name, model) in &config.models {
            // `Config::validate` guarantees every model's backends exist (at least one).
            let first = &model.backends[0]; // single-backend until the pool
            let (Some(backend), Some(queue), Some(upstream)) =
                (backends.get(first), queues.get(first), upstreams.get(first))
            else {
                continue;
            };
            let handle = BackendHandle::new(Arc::clone(backend), upstream.clone(), supervisors.get(first).cloned());
            routes.insert(
                name.clone(),
                Route {
                    model: model.clone(),
                    slot: queue.add_model(name, model.max_queue, model.max_wait),
                    backend: handle,
                },
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
            tokio::spawn(scheduler::run(managed, config.swap_after, changed, metrics.clone()))
        });
        Dispatch { routes, queues, supervisors, scheduler }
    }

    /// The route for a public model name.
    pub fn route(&self, model: &str) -> Option<&Route> {
        self.routes.get(model)
    }

    /// Stops starting, swapping and idling backends (the gateway is shutting down): running
    /// backends keep serving for the whole shutdown grace, nothing starts or restarts, and
    /// requests waiting for a backend that is not serving get 503 `gateway_shutdown` at once.
    pub fn stop_scheduling(&self) {
        if let Some(task) = &self.scheduler {
            task.abort();
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
