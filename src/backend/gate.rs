//! The gate in front of a backend, as its supervisor works it: a small trait the request queue
//! implements (`dispatch::queue::BackendQueue`) and the supervisor is handed, so that `backend`
//! knows no queue. Closed while the process is stopped, starting or draining (requests wait),
//! open once it is ready, failed with a reason (requests are refused with it).

/// What a supervisor does to the requests in front of its backend.
pub trait Gate: Send + Sync {
    /// The backend is ready: waiting requests get free slots.
    fn open(&self);
    /// The backend stops or restarts: requests wait; those in flight go on.
    fn close(&self);
    /// The backend failed: waiting and new requests are refused with `reason` until it opens
    /// again or the failure is cleared.
    fn fail(&self, reason: &str);
    /// Forgets a failure without opening (the backend will be started again on demand).
    fn clear_failure(&self);
    /// Whether requests still hold slots that somebody waits for (slots held for answers
    /// their clients abandoned do not count: a stop ends them): what a drain waits out.
    fn working(&self) -> bool;
}
