//! The rate-limit arithmetic: one bucket of a GCRA / token-bucket limit, pure and clock-free.
//!
//! A [`Rate`] of `per_minute` cells (requests, or tokens) refills **continuously**: one cell every
//! `60 s / per_minute`, never in window-sized steps, so there is no burst at a window's edge. The
//! bucket holds `burst` cells; by default `burst == per_minute`, as OpenAI's limits behave: a
//! client that was idle for a minute may spend its whole minute's allowance at once, then goes on
//! at the steady rate. OpenAI's headers follow from that: the limit is the burst, the remaining
//! count is what the bucket holds now, and the reset time is how long until it is full again.
//!
//! The state is how much of the bucket is spent (`level`) as of a time (`at`). `level` is kept
//! exactly, in integer units of 1/60 000 000 000 of a cell-minute (a cell is
//! `60 s in ns` units, and the bucket drains `per_minute` units each nanosecond), so a burst of
//! `per_minute` single charges fits exactly whatever `per_minute` is, with no rounding drift.
//! The Redis store runs the same arithmetic in a Lua script, in microseconds
//! (`limits::redis_store::GCRA_SCRIPT`).
//!
//! Time is a `Duration` since any fixed origin, passed in by the caller (a clock in production,
//! a number in tests); a `now` earlier than the last update counts as no time passed.

use std::time::Duration;

/// Units of `level` in one cell: nanoseconds in a minute.
const CELL: u128 = 60_000_000_000;

/// A limit: `per_minute` cells refilled continuously, at most `burst` held.
///
/// `per_minute == 0` admits nothing that costs anything (a client switched off); a cost above
/// `burst` can never be admitted (see [`Decision::too_large`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Cells earned back per minute.
    pub per_minute: u64,
    /// Most cells the bucket holds: the largest cost that can ever be admitted at once.
    pub burst: u64,
}

impl Rate {
    /// `n` cells a minute with a bucket of one minute's worth (OpenAI's behaviour).
    pub const fn per_minute(n: u64) -> Self {
        Self { per_minute: n, burst: n }
    }

    fn capacity(self) -> u128 {
        u128::from(self.burst) * CELL
    }
}

/// What a check found: whether the cost was admitted, and the bucket's state afterwards, as
/// OpenAI's `x-ratelimit-*` headers report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// The cost was admitted (and charged).
    pub allowed: bool,
    /// The limit as clients see it (`x-ratelimit-limit-*`): the bucket's size.
    pub limit: u64,
    /// Whole cells left in the bucket after this decision (`x-ratelimit-remaining-*`).
    pub remaining: u64,
    /// Time until the bucket is full again (`x-ratelimit-reset-*`); zero when it is full.
    pub reset_after: Duration,
    /// When denied: how long until this same cost would fit. `None` when allowed, and when it
    /// never fits (see [`Decision::too_large`]).
    pub retry_after: Option<Duration>,
}

impl Decision {
    /// Denied for good: the cost is above the burst (or the rate is zero); waiting cannot help.
    pub fn too_large(&self) -> bool {
        !self.allowed && self.retry_after.is_none()
    }
}

/// The spent part of one client's bucket for one limit. `Default` is a full bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bucket {
    /// Spent amount, in units of 1/`CELL` cell; may exceed the capacity after a forced charge.
    level: u128,
    /// When `level` was last brought up to date.
    at: Duration,
}

impl Bucket {
    /// Admits `cost` cells at `now` if they fit, charging them; otherwise changes nothing and
    /// says when they would fit. A cost of zero is always admitted and changes nothing: it reads
    /// the state for the headers.
    pub fn check(&mut self, rate: Rate, cost: u64, now: Duration) -> Decision {
        let peeked = self.peek(rate, cost, now);
        if !peeked.allowed {
            return peeked;
        }
        let level = self.level_at(rate, now) + units(cost);
        self.set(level, now);
        decision(rate, level, true, None)
    }

    /// Whether `cost` would fit at `now`, with the bucket's state as it is (nothing charged).
    pub fn peek(&self, rate: Rate, cost: u64, now: Duration) -> Decision {
        let level = self.level_at(rate, now);
        match fit(rate, level, cost) {
            Fit::Yes => decision(rate, level, true, None),
            Fit::After(wait) => decision(rate, level, false, Some(wait)),
            Fit::Never => decision(rate, level, false, None),
        }
    }

    /// Charges `cost` cells whether they fit or not: a correction after the fact (tokens
    /// generated beyond the up-front estimate). The bucket may go into debt; later checks wait
    /// for it to be paid off at the steady rate.
    pub fn charge(&mut self, rate: Rate, cost: u64, now: Duration) -> Decision {
        let level = self.level_at(rate, now) + units(cost);
        self.set(level, now);
        decision(rate, level, true, None)
    }

    /// Gives `cost` cells back (charged up front but not used); never beyond a full bucket.
    pub fn refund(&mut self, rate: Rate, cost: u64, now: Duration) -> Decision {
        let level = self.level_at(rate, now).saturating_sub(units(cost));
        self.set(level, now);
        decision(rate, level, true, None)
    }

    /// The spent level drained up to `now`.
    fn level_at(&self, rate: Rate, now: Duration) -> u128 {
        let elapsed = now.saturating_sub(self.at).as_nanos();
        self.level.saturating_sub(elapsed.saturating_mul(u128::from(rate.per_minute)))
    }

    fn set(&mut self, level: u128, now: Duration) {
        self.level = level;
        self.at = self.at.max(now);
    }

    /// True when the bucket is full at `now`: its state can be forgotten.
    pub fn is_full(&self, rate: Rate, now: Duration) -> bool {
        self.level_at(rate, now) == 0
    }
}

enum Fit {
    Yes,
    After(Duration),
    Never,
}

fn fit(rate: Rate, level: u128, cost: u64) -> Fit {
    if cost == 0 {
        return Fit::Yes;
    }
    if rate.per_minute == 0 || cost > rate.burst {
        return Fit::Never;
    }
    let needed = level + units(cost);
    if needed <= rate.capacity() { Fit::Yes } else { Fit::After(drain_time(rate, needed - rate.capacity())) }
}

fn units(cost: u64) -> u128 {
    u128::from(cost) * CELL
}

/// Time for `amount` units to drain, rounded up to the nanosecond.
fn drain_time(rate: Rate, amount: u128) -> Duration {
    if rate.per_minute == 0 {
        return Duration::ZERO;
    }
    let nanos = amount.div_ceil(u128::from(rate.per_minute));
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

fn decision(rate: Rate, level: u128, allowed: bool, retry_after: Option<Duration>) -> Decision {
    let spent_cells = u64::try_from(level.div_ceil(CELL)).unwrap_or(u64::MAX);
    Decision {
        allowed,
        limit: rate.burst,
        remaining: rate.burst.saturating_sub(spent_cells),
        reset_after: drain_time(rate, level),
        retry_after,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn a_full_minute_burst_then_one_cell_every_interval() {
        let rate = Rate::per_minute(5);
        let mut b = Bucket::default();
        let t0 = secs(100);
        for left in (0..5).rev() {
            let d = b.check(rate, 1, t0);
            assert!(d.allowed);
            assert_eq!(d.remaining, left);
        }
        let denied = b.check(rate, 1, t0);
        assert!(!denied.allowed);
        assert_eq!(denied.remaining, 0);
        assert_eq!(denied.retry_after, Some(secs(12)), "one cell every 60/5 s");
        assert_eq!(denied.reset_after, secs(60), "empty bucket: a minute to full");
        // Just short of the interval: still denied, and told the rest of the wait.
        let early = b.check(rate, 1, t0 + secs(12) - S / 1000);
        assert_eq!(early.retry_after, Some(S / 1000));
        let d = b.check(rate, 1, t0 + secs(12));
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.reset_after, secs(60));
        assert!(!b.check(rate, 1, t0 + secs(12)).allowed);
    }

    #[test]
    fn refill_is_continuous_not_windowed() {
        let rate = Rate::per_minute(60);
        let mut b = Bucket::default();
        assert!(b.check(rate, 60, secs(0)).allowed);
        // Half a minute later half the bucket is back: no window edge to wait for.
        let d = b.peek(rate, 0, secs(30));
        assert_eq!(d.remaining, 30);
        assert_eq!(d.reset_after, secs(30));
        assert!(b.check(rate, 30, secs(30)).allowed);
        assert!(!b.check(rate, 1, secs(30)).allowed);
    }

    #[test]
    fn odd_rates_keep_their_whole_burst() {
        // 60 s / 7 is not a whole number of nanoseconds: the burst must still be exactly 7.
        for n in [1, 3, 7, 13, 997, 200_000] {
            let rate = Rate::per_minute(n);
            let mut b = Bucket::default();
            let admitted = (0..n + 1).filter(|_| b.check(rate, 1, secs(5)).allowed).count();
            assert_eq!(admitted as u64, n, "rate {n}");
            // And after exactly a minute the bucket is full again.
            assert_eq!(b.peek(rate, 0, secs(65)).remaining, n);
            assert_eq!(b.peek(rate, 0, secs(5)).reset_after, secs(60));
        }
    }

    #[test]
    fn a_burst_smaller_than_the_rate() {
        let rate = Rate { per_minute: 60, burst: 10 };
        let mut b = Bucket::default();
        assert!(b.check(rate, 10, secs(0)).allowed);
        let d = b.check(rate, 1, secs(0));
        assert_eq!(d.retry_after, Some(secs(1)));
        assert_eq!(d.reset_after, secs(10));
        assert_eq!(d.limit, 10);
        assert!(b.check(rate, 1, secs(1)).allowed);
    }

    #[test]
    fn weighted_costs_wait_for_the_whole_cost() {
        let rate = Rate::per_minute(1000); // tokens per minute
        let mut b = Bucket::default();
        let d = b.check(rate, 700, secs(0));
        assert!(d.allowed);
        assert_eq!(d.remaining, 300);
        assert_eq!(d.reset_after, Duration::from_millis(42_000));
        let d = b.check(rate, 500, secs(0));
        assert!(!d.allowed);
        assert_eq!(d.remaining, 300, "a denied check charges nothing");
        assert_eq!(d.retry_after, Some(secs(12)), "200 tokens at 1000/min");
        assert!(b.check(rate, 500, secs(12)).allowed);
    }

    #[test]
    fn a_cost_above_the_burst_never_fits() {
        let rate = Rate::per_minute(100);
        let mut b = Bucket::default();
        let d = b.check(rate, 101, secs(0));
        assert!(!d.allowed);
        assert!(d.too_large());
        assert_eq!(d.remaining, 100, "nothing charged");
        assert!(b.check(rate, 100, secs(0)).allowed, "the whole burst does fit");
    }

    #[test]
    fn a_zero_rate_admits_nothing_that_costs() {
        let rate = Rate::per_minute(0);
        let mut b = Bucket::default();
        let d = b.check(rate, 1, secs(0));
        assert!(d.too_large());
        assert_eq!((d.limit, d.remaining, d.reset_after), (0, 0, Duration::ZERO));
        assert!(b.check(rate, 0, secs(0)).allowed, "a zero cost reads the state");
    }

    #[test]
    fn refunds_give_back_what_was_not_used_but_never_more_than_full() {
        let rate = Rate::per_minute(1000);
        let mut b = Bucket::default();
        assert!(b.check(rate, 800, secs(0)).allowed);
        let d = b.refund(rate, 500, secs(0));
        assert_eq!(d.remaining, 700);
        let d = b.refund(rate, 5000, secs(0));
        assert_eq!(d.remaining, 1000);
        assert_eq!(d.reset_after, Duration::ZERO);
        assert!(b.check(rate, 1000, secs(0)).allowed, "a refund never lends beyond the bucket");
        assert!(!b.check(rate, 1, secs(0)).allowed);
    }

    #[test]
    fn a_forced_charge_goes_into_debt_and_is_paid_off_at_the_rate() {
        let rate = Rate::per_minute(1000);
        let mut b = Bucket::default();
        assert!(b.check(rate, 900, secs(0)).allowed);
        let d = b.charge(rate, 600, secs(0)); // generated more than estimated
        assert_eq!(d.remaining, 0);
        assert_eq!(d.reset_after, secs(90), "1500 tokens spent at 1000/min");
        let d = b.check(rate, 100, secs(0));
        assert_eq!(d.retry_after, Some(secs(36)), "600 over the bucket: 500 to pay off + 100");
        assert!(b.check(rate, 100, secs(36)).allowed);
    }

    #[test]
    fn a_clock_going_backwards_counts_as_no_time() {
        let rate = Rate::per_minute(5);
        let mut b = Bucket::default();
        assert!(b.check(rate, 5, secs(100)).allowed);
        let d = b.check(rate, 1, secs(50));
        assert_eq!(d.retry_after, Some(secs(12)));
        assert!(b.check(rate, 1, secs(112)).allowed);
    }

    #[test]
    fn full_buckets_can_be_forgotten() {
        let rate = Rate::per_minute(6);
        let mut b = Bucket::default();
        assert!(b.is_full(rate, secs(0)));
        b.check(rate, 3, secs(0));
        assert!(!b.is_full(rate, secs(29)));
        assert!(b.is_full(rate, secs(30)));
    }
    proptest::proptest! {
        /// Whatever the rate and the traffic: never more admitted than the burst plus what the
        /// elapsed time refilled, and a refusal's `retry_after` is exact to the nanosecond.
        #[test]
        fn admits_no_more_than_burst_plus_refill_and_retry_after_is_exact(
            per_minute in 1u64..10_000,
            steps in proptest::collection::vec((0u64..5_000, 0u64..50), 1..200),
        ) {
            let rate = Rate::per_minute(per_minute);
            let mut b = Bucket::default();
            let mut now = Duration::ZERO;
            let mut admitted: u128 = 0;
            for (advance_ms, cost) in steps {
                now += Duration::from_millis(advance_ms);
                let d = b.check(rate, cost, now);
                if d.allowed {
                    admitted += u128::from(cost);
                } else if let Some(wait) = d.retry_after {
                    let just_before = b.peek(rate, cost, now + wait - Duration::from_nanos(1));
                    proptest::prop_assert!(!just_before.allowed);
                    proptest::prop_assert!(b.peek(rate, cost, now + wait).allowed);
                } else {
                    proptest::prop_assert!(cost > rate.burst);
                }
                let refilled = (now.as_nanos() * u128::from(per_minute)).div_ceil(CELL);
                proptest::prop_assert!(admitted <= u128::from(rate.burst) + refilled);
            }
        }
    }
}
