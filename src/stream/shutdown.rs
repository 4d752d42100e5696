//! The shutdown cut: the end of the shutdown grace, as the running streams and the requests
//! still waiting for their answer see it. `serve()` cuts it once the grace is over; each meter
//! then ends its stream with a final error event, each waiting request gets 503, and the reading
//! of an abandoned answer stops.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

/// The end of the shutdown grace, as the running streams see it: once cut, each ends itself
/// with a final error event (counted as `gateway_shutdown`) instead of being dropped mid-frame
/// with its connection.
#[derive(Default)]
pub struct Cutoff {
    notify: Arc<Notify>,
    cut: AtomicBool,
}

impl Cutoff {
    /// Ends every running stream.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// A future that resolves at the cut; registered from its creation on.
    pub fn notified(&self) -> Pin<Box<OwnedNotified>> {
        Box::pin(Arc::clone(&self.notify).notified_owned())
    }

    /// Whether the cut has happened.
    pub fn is_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }
}
