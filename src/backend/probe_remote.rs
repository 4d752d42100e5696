//! The health probe of a remote (`url:`) backend that serves a model together with others: its
//! ready path every `interval`; `failures` failed probes in a row take it out of the model's
//! choice for `eject_for` (then it is probed on, and a passing probe brings it back). It reports
//! through [`Probed`], which the request pool implements, so `backend` knows no queue (as with
//! the supervisor's [`Gate`](super::gate::Gate)).

use std::sync::Arc;
use std::time::Duration;

use super::upstream::Upstream;
use crate::config::BackendConfig;

/// What the probe does to the requests in front of its backend.
pub trait Probed: Send + Sync {
    /// The ready path failed `failures` times in a row: out for `eject_for`.
    fn failed(&self, eject_for: Duration);
    /// The ready path answered: an ejection the probes made ends.
    fn passed(&self);
}

/// How a remote backend is probed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    pub interval: Duration,
    pub timeout: Duration,
    /// Failed probes in a row that eject it.
    pub failures: u32,
    pub eject_for: Duration,
}

/// Counts probes in a row: whether this one ejects (the `failures`-th failure in a row, and
/// every one after it while it stays down, so that the ejection lasts) or heals.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Streak {
    failed: u32,
}

/// What one probe's result means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Eject,
    Pass,
    Wait,
}

impl Streak {
    /// One probe's result under `failures`.
    pub fn probed(&mut self, ok: bool, failures: u32) -> Verdict {
        if ok {
            self.failed = 0;
            return Verdict::Pass;
        }
        self.failed = self.failed.saturating_add(1);
        if self.failed >= failures.max(1) { Verdict::Eject } else { Verdict::Wait }
    }
}

/// Probes `config`'s ready path through `upstream` forever (the task is aborted with the
/// gateway), telling `probed`.
pub fn spawn(
    config: Arc<BackendConfig>,
    terms: Terms,
    upstream: Upstream,
    probed: Arc<dyn Probed>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut streak = Streak::default();
        let mut tick = tokio::time::interval(terms.interval.max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let ok = upstream.probe(&config, &config.ready_path, terms.timeout).await.is_ok();
            match streak.probed(ok, terms.failures) {
                Verdict::Eject => {
                    tracing::warn!(backend = %config.name, "its ready path failed: taken out of its models' choice");
                    probed.failed(terms.eject_for.max(terms.interval));
                }
                Verdict::Pass => probed.passed(),
                Verdict::Wait => {}
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streak_ejects_at_its_failures_and_heals_on_a_pass() {
        let mut streak = Streak::default();
        assert_eq!(streak.probed(false, 3), Verdict::Wait);
        assert_eq!(streak.probed(false, 3), Verdict::Wait);
        assert_eq!(streak.probed(false, 3), Verdict::Eject);
        assert_eq!(streak.probed(false, 3), Verdict::Eject, "still down: the ejection goes on");
        assert_eq!(streak.probed(true, 3), Verdict::Pass);
        assert_eq!(streak.probed(false, 3), Verdict::Wait, "the count starts again");
        assert_eq!(Streak::default().probed(false, 0), Verdict::Eject, "0 means 1");
    }
}
