//! Log lines that a client can cause at will (a refused admin call, a 429 loop) are written at
//! most once per interval per key, with the number left out since the last one: a flood of
//! refusals costs a counter, not the log.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Keys remembered at once. When every place is taken by a key logged within the interval, a
/// new key is left out (counted): a flood from ever-new peers (an IPv6 /64 has 2^64) logs at
/// most this many lines per interval.
const MOST_KEYS: usize = 4096;

/// Allows one log line per key per interval.
#[derive(Debug)]
pub struct LogThrottle {
    every: Duration,
    seen: Mutex<HashMap<String, (Instant, u64)>>,
}

impl LogThrottle {
    /// One line per key per `every`.
    pub fn new(every: Duration) -> Self {
        Self { every, seen: Mutex::new(HashMap::new()) }
    }

    /// `Some(n)` when a line for `key` may be written now, `n` being how many were left out
    /// since the last one; `None` when it is to be left out.
    pub fn allow(&self, key: &str) -> Option<u64> {
        self.allow_at(key, Instant::now())
    }

    fn allow_at(&self, key: &str, now: Instant) -> Option<u64> {
        let mut seen = self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((last, suppressed)) = seen.get_mut(key) {
            if now.duration_since(*last) < self.every {
                *suppressed += 1;
                return None;
            }
            let left_out = *suppressed;
            *last = now;
            *suppressed = 0;
            return Some(left_out);
        }
        if seen.len() >= MOST_KEYS {
            // Keys whose interval is over would be logged again anyway: forget those.
            seen.retain(|_, (last, _)| now.duration_since(*last) < self.every);
            if seen.len() >= MOST_KEYS {
                return None;
            }
        }
        seen.insert(key.to_owned(), (now, 0));
        Some(0)
    }
}

impl Default for LogThrottle {
    /// One line per key per minute.
    fn default() -> Self {
        Self::new(Duration::from_secs(60))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_key_per_interval_with_the_count_left_out() {
        let throttle = LogThrottle::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(throttle.allow_at("a", t0), Some(0));
        assert_eq!(throttle.allow_at("b", t0), Some(0), "keys are apart");
        for s in 1..=5 {
            assert_eq!(throttle.allow_at("a", t0 + Duration::from_secs(s)), None);
        }
        assert_eq!(throttle.allow_at("a", t0 + Duration::from_secs(60)), Some(5));
        assert_eq!(throttle.allow_at("a", t0 + Duration::from_secs(61)), None);
    }

    #[test]
    fn memory_and_lines_are_bounded_under_ever_new_keys() {
        let throttle = LogThrottle::new(Duration::from_secs(60));
        let t0 = Instant::now();
        let logged = (0..(3 * MOST_KEYS)).filter(|i| throttle.allow_at(&format!("peer {i}"), t0).is_some()).count();
        assert_eq!(logged, MOST_KEYS, "at most MOST_KEYS lines in one interval");
        assert!(throttle.seen.lock().unwrap().len() <= MOST_KEYS);
        // The interval over, new keys are logged again.
        assert_eq!(throttle.allow_at("a new peer", t0 + Duration::from_secs(60)), Some(0));
    }
}
