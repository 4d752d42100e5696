//! Where the buckets live: the [`RateStore`] trait, the clocks, and the in-process
//! [`MemoryStore`] (the default, and the Redis store's fallback).
//!
//! A store applies a batch of bucket operations atomically: an admission checks a client's
//! request and token buckets together and charges both or neither, so a request refused for its
//! tokens does not use up a request slot.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use super::gcra::{Bucket, Decision, Rate};

/// Buckets kept before the full ones are swept out of a [`MemoryStore`].
const SWEEP_ABOVE: usize = 4096;

/// One bucket operation of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// The bucket's name, unique per client and limit (`mlxgate:limits:{client}:rpm`).
    pub key: String,
    /// The limit's rate.
    pub rate: Rate,
    /// Cells to check, charge or refund.
    pub cost: u64,
}

/// What a batch does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Charge every op if every op fits, else charge nothing. Each decision says whether its own
    /// op fits; the batch was admitted when all of them do (the decisions of a refused batch
    /// show the buckets as they are).
    Admit,
    /// Charge whether it fits or not (a correction after the fact: tokens generated).
    Charge,
    /// Give cells back (charged up front, not used).
    Refund,
}

/// Whether the limits are shared between gateways right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreHealth {
    /// In-process only, by configuration.
    Local,
    /// Shared through Redis.
    Shared,
    /// Redis is configured but unreachable: local limits until it answers again.
    Fallback,
}

/// Shared state of every client's buckets. Infallible by contract: a store that loses its
/// backing service answers from a local fallback rather than failing a request.
pub trait RateStore: Send + Sync {
    /// Applies `ops` as one atomic batch (see [`Mode`]); one decision per op, in order.
    fn apply<'a>(&'a self, mode: Mode, ops: &'a [Op]) -> BoxFuture<'a, Vec<Decision>>;

    /// Whether decisions are shared right now.
    fn health(&self) -> StoreHealth;
}

/// A source of "now" for the memory store: a `Duration` since a fixed origin.
pub trait Clock: Send + Sync {
    /// The current time since this clock's origin.
    fn now(&self) -> Duration;
}

/// The real, monotonic clock.
#[derive(Debug)]
pub struct MonotonicClock {
    origin: Instant,
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self { origin: Instant::now() }
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now(&self) -> Duration {
        (**self).now()
    }
}

/// A clock that moves only when told: tests of the limits never sleep.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: Mutex<Duration>,
}

impl ManualClock {
    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *now += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        *self.now.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Buckets in this process, behind one mutex (a batch is a few arithmetic operations).
pub struct MemoryStore {
    clock: Box<dyn Clock>,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl MemoryStore {
    /// An empty store reading time from `clock`.
    pub fn new(clock: impl Clock + 'static) -> Self {
        Self { clock: Box::new(clock), buckets: Mutex::new(HashMap::new()) }
    }

    /// Applies a batch now; the synchronous core of [`RateStore::apply`].
    pub fn apply_now(&self, mode: Mode, ops: &[Op]) -> Vec<Decision> {
        let now = self.clock.now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if buckets.len() > SWEEP_ABOVE {
            sweep(&mut buckets, ops, now);
        }
        let fits = mode != Mode::Admit
            || ops
                .iter()
                .all(|op| buckets.get(&op.key).copied().unwrap_or_default().peek(op.rate, op.cost, now).allowed);
        ops.iter()
            .map(|op| {
                let bucket = buckets.entry(op.key.clone()).or_default();
                match mode {
                    Mode::Admit if fits => bucket.check(op.rate, op.cost, now),
                    Mode::Admit => bucket.peek(op.rate, op.cost, now),
                    Mode::Charge => bucket.charge(op.rate, op.cost, now),
                    Mode::Refund => bucket.refund(op.rate, op.cost, now),
                }
            })
            .collect()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new(MonotonicClock::default())
    }
}

/// Forgets full buckets (a full bucket and a missing one are the same state). Rates are per
/// op, so only buckets of the keys in hand can be judged; the others are judged by the
/// slowest plausible rate: kept unless a minute's worth of nothing has passed.
fn sweep(buckets: &mut HashMap<String, Bucket>, ops: &[Op], now: Duration) {
    buckets.retain(|key, bucket| match ops.iter().find(|op| &op.key == key) {
        Some(op) => !bucket.is_full(op.rate, now),
        None => !bucket.is_full(Rate::per_minute(1), now),
    });
}

impl RateStore for MemoryStore {
    fn apply<'a>(&'a self, mode: Mode, ops: &'a [Op]) -> BoxFuture<'a, Vec<Decision>> {
        let decisions = self.apply_now(mode, ops);
        Box::pin(std::future::ready(decisions))
    }

    fn health(&self) -> StoreHealth {
        StoreHealth::Local
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn op(key: &str, per_minute: u64, cost: u64) -> Op {
        Op { key: key.into(), rate: Rate::per_minute(per_minute), cost }
    }

    #[test]
    fn an_admission_charges_every_bucket_or_none() {
        let clock = Arc::new(ManualClock::default());
        let store = MemoryStore::new(clock.clone());
        let batch = [op("a:rpm", 5, 1), op("a:tpm", 100, 60)];
        let first = store.apply_now(Mode::Admit, &batch);
        assert!(first.iter().all(|d| d.allowed));
        let second = store.apply_now(Mode::Admit, &batch);
        assert!(second[0].allowed && !second[1].allowed, "requests fit, tokens do not");
        assert_eq!(second[0].remaining, 4, "the state as it is: nothing charged");
        let reads = store.apply_now(Mode::Admit, &[op("a:rpm", 5, 0)]);
        assert_eq!(reads[0].remaining, 4, "the refused admission took no request slot");
        clock.advance(Duration::from_secs(24));
        assert!(store.apply_now(Mode::Admit, &batch).iter().all(|d| d.allowed), "40 tokens back after 24 s");
    }

    #[test]
    fn charges_and_refunds_correct_a_bucket() {
        let store = MemoryStore::new(ManualClock::default());
        store.apply_now(Mode::Admit, &[op("t", 100, 50)]);
        assert_eq!(store.apply_now(Mode::Refund, &[op("t", 100, 20)])[0].remaining, 70);
        assert_eq!(store.apply_now(Mode::Charge, &[op("t", 100, 90)])[0].remaining, 0);
        assert!(store.apply_now(Mode::Admit, &[op("t", 100, 1)])[0].retry_after.is_some());
    }

    #[test]
    fn full_buckets_are_swept_and_spent_ones_kept() {
        let clock = Arc::new(ManualClock::default());
        let store = MemoryStore::new(clock.clone());
        for i in 0..=SWEEP_ABOVE {
            store.apply_now(Mode::Admit, &[op(&format!("k{i}"), 60, 1)]);
        }
        store.apply_now(Mode::Admit, &[op("spent", 2, 2)]);
        clock.advance(Duration::from_secs(61));
        store.apply_now(Mode::Admit, &[op("other", 60, 1)]);
        let kept = store.buckets.lock().map(|b| b.len()).unwrap_or_default();
        assert_eq!(kept, 2, "the one judged by the slowest rate (2 cells: 120 s) and the one just charged");
    }
}
