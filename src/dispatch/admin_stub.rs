//! STUB on branch b21-config only — the pool (branch b21-pool) writes the real ones in
//! `dispatch/mod.rs`; delete this file when merging it. What `/admin/backends` and the drain
//! calls need of the dispatch: draining a backend, and each backend's drained flag and health.
//! Until the pool, no backend is ever drained or ejected, so the two views are true as written.

use super::Dispatch;
use crate::error::GatewayError;

impl Dispatch {
    /// Drains (`true`: no new requests, running ones finish) or undrains a backend;
    /// [`GatewayError::UnknownBackend`] when no backend has that name.
    pub fn drain(&self, name: &str, drained: bool) -> Result<(), GatewayError> {
        if !self.queues.contains_key(name) {
            return Err(GatewayError::UnknownBackend(name.to_string()));
        }
        todo!("the pool's Dispatch::drain({name}, {drained})")
    }

    /// Whether the backend is drained (admin).
    pub fn drained(&self, _name: &str) -> bool {
        false
    }

    /// The backend's health as `/admin/backends` shows it: `healthy`, `ejected` or `half_open`.
    pub fn health_label(&self, _name: &str) -> &'static str {
        "healthy"
    }
}
