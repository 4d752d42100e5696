//! Where a request goes: the public model name's route (its model and backend settings and its
//! place in the backend's queue).

pub mod queue;

use std::collections::HashMap;
use std::sync::Arc;

use crate::backend::upstream::Upstream;
use crate::config::{BackendConfig, Config, ModelConfig};
use crate::metrics::Metrics;
use queue::{BackendQueue, ModelSlot};

/// Everything needed to send one model's requests.
pub struct Route {
    pub model: ModelConfig,
    pub backend: Arc<BackendConfig>,
    pub upstream: Upstream,
    pub slot: ModelSlot,
}

/// The routing table, built once from the configuration.
pub struct Dispatch {
    routes: HashMap<String, Route>,
}

impl Dispatch {
    /// One queue and one pooled client per backend; one route per public model name.
    pub fn new(config: &Config, metrics: &Metrics) -> Self {
        let mut per_backend: HashMap<&str, (Arc<BackendConfig>, BackendQueue, Upstream)> =
            HashMap::new();
        for (name, backend) in &config.backends {
            per_backend.insert(
                name,
                (
                    Arc::new(backend.clone()),
                    BackendQueue::new(name, backend.max_concurrency, metrics.clone()),
                    Upstream::new(backend.connect_timeout),
                ),
            );
        }
        let mut routes = HashMap::new();
        for (name, model) in &config.models {
            // `Config::validate` guarantees every model's backend exists.
            let Some((backend, queue, upstream)) = per_backend.get(model.backend.as_str()) else {
                continue;
            };
            let slot = queue.add_model(name, model.max_queue, model.max_wait);
            routes.insert(
                name.clone(),
                Route {
                    model: model.clone(),
                    backend: Arc::clone(backend),
                    upstream: upstream.clone(),
                    slot,
                },
            );
        }
        Dispatch { routes }
    }

    /// The route for a public model name.
    pub fn route(&self, model: &str) -> Option<&Route> {
        self.routes.get(model)
    }
}
