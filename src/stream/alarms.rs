//! The two alarms of a running stream: the backend's silence past the idle timeout, and the
//! gateway's shutdown cut. They are polled each time the backend has nothing to read, i.e.
//! once or more per streamed chunk, so they are kept cheap there: the idle timer is not reset
//! at each read (its deadline moves on only when it fires early, from the time of the last
//! read), and both are registered again only when the waker changes (the cut itself is seen
//! by its flag, [`Cutoff::is_cut`], which the meter reads before each backend read).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use tokio::sync::futures::OwnedNotified;
use tokio::time::{Instant, Sleep};

use super::shutdown::Cutoff;

/// What rang.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rang {
    /// The gateway's shutdown grace is over.
    Shutdown,
    /// The backend has been silent for the idle timeout.
    Idle,
}

/// The idle and shutdown alarms of one stream.
pub(super) struct Alarms {
    /// Fires at (or after) the idle deadline: `last_read + timeout`.
    idle: Pin<Box<Sleep>>,
    /// Fires at the shutdown cut; registered from its creation on.
    shutdown: Pin<Box<OwnedNotified>>,
    timeout: Duration,
    /// When the backend last sent something.
    last_read: Instant,
    /// The waker both alarms were last polled with.
    waker: Option<Waker>,
}

impl Alarms {
    pub(super) fn new(timeout: Duration, cutoff: &Arc<Cutoff>) -> Self {
        let now = Instant::now();
        Alarms {
            idle: Box::pin(tokio::time::sleep_until(now + timeout)),
            shutdown: cutoff.notified(),
            timeout,
            last_read: now,
            waker: None,
        }
    }

    /// The backend sent something at `now`: the idle deadline is from then on.
    pub(super) fn read_at(&mut self, now: std::time::Instant) {
        self.last_read = Instant::from_std(now);
    }

    /// Polls both alarms (the backend had nothing to read): what rang, if anything. When
    /// nothing did, the task is woken when one does.
    pub(super) fn poll(&mut self, cx: &mut Context<'_>) -> Option<Rang> {
        let registered = self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker()));
        if !registered && self.shutdown.as_mut().poll(cx).is_ready() {
            return Some(Rang::Shutdown);
        }
        if registered && !self.idle.is_elapsed() {
            return None;
        }
        // A timer polled out of the task's budget is not registered (the task is woken at once
        // to poll it again).
        let budget = tokio::task::coop::has_budget_remaining();
        while self.idle.as_mut().poll(cx).is_ready() {
            let due = self.last_read + self.timeout;
            if due <= Instant::now() {
                return Some(Rang::Idle);
            }
            // Fired early: the backend has sent something since the deadline was set.
            self.idle.as_mut().reset(due);
        }
        if !budget {
            self.waker = None;
        } else if !registered {
            self.waker = Some(cx.waker().clone());
        }
        None
    }
}
