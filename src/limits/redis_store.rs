//! The shared store: every gateway's buckets in one Redis, with a local fallback.
//!
//! Each batch is one Lua script run ([`GCRA_SCRIPT`]): Redis runs a script atomically, so two
//! gateways checking the same client at once cannot both read the same state and both admit (no
//! read-modify-write race). The script reads the time from Redis itself (`TIME`), so gateways on
//! Macs with different clocks share one clock; each bucket is a hash with an expiry set to the
//! time it takes to fill up again, after which a missing key and a full bucket are the same.
//!
//! When Redis does not answer (refused, reset, or no answer within `timeout`), the request is
//! decided by an in-process [`MemoryStore`] and a warning is logged once; from then on requests go
//! straight to the local store while a background probe (connect + `PING`, at most once every
//! `probe_every`) waits for Redis to come back, which is logged once too. During an outage each
//! gateway enforces each client's whole limit on its own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Script};

use super::gcra::{Decision, Rate};
use super::store::{MemoryStore, Mode, Op, RateStore, StoreHealth};

/// The GCRA of `gcra.rs`, in microseconds, over any number of buckets at once.
///
/// `KEYS`: one hash per bucket (`level`: spent amount in units of 1/60 000 000 cell, drained at
/// `per_minute` units a microsecond; `at`: when `level` was brought up to date, in Redis's
/// microseconds). `ARGV[1]`: `admit` (charge all if all fit, else nothing), `charge`, or
/// `refund`; then per bucket `per_minute`, `burst`, `cost`. Returns per bucket: allowed (1/0),
/// remaining, reset after (µs), retry after (µs; -1: none). Numbers stay below 2^53, where Lua's
/// doubles are exact integers, for bursts up to about 10^8.
pub const GCRA_SCRIPT: &str = r"
local CELL = 60000000
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local mode = ARGV[1]
local rate, burst, cost, level, at, wait = {}, {}, {}, {}, {}, {}
local all_fit = true
for i = 1, #KEYS do
  rate[i] = tonumber(ARGV[3 * i - 1])
  burst[i] = tonumber(ARGV[3 * i])
  cost[i] = tonumber(ARGV[3 * i + 1])
  local state = redis.call('HMGET', KEYS[i], 'level', 'at')
  local lv = tonumber(state[1]) or 0
  local last = tonumber(state[2]) or now
  if now > last then
    lv = math.max(0, lv - (now - last) * rate[i])
  end
  level[i] = lv
  at[i] = math.max(now, last)
  if cost[i] == 0 then
    wait[i] = 0
  elseif rate[i] == 0 or cost[i] > burst[i] then
    wait[i] = -1
  else
    local over = lv + cost[i] * CELL - burst[i] * CELL
    if over <= 0 then wait[i] = 0 else wait[i] = math.ceil(over / rate[i]) end
  end
  if wait[i] ~= 0 then all_fit = false end
end
local out = {}
for i = 1, #KEYS do
  local lv = level[i]
  local write = true
  if mode == 'admit' then
    write = all_fit and cost[i] > 0
    if write then lv = lv + cost[i] * CELL end
  elseif mode == 'charge' then
    lv = lv + cost[i] * CELL
  else
    lv = math.max(0, lv - cost[i] * CELL)
  end
  local refill = 60000000
  if rate[i] > 0 then refill = math.ceil(lv / rate[i]) end
  if write then
    redis.call('HSET', KEYS[i], 'level', lv, 'at', at[i])
    redis.call('PEXPIRE', KEYS[i], math.ceil(refill / 1000) + 1000)
  end
  local allowed, retry = 1, -1
  if mode == 'admit' and wait[i] ~= 0 then
    allowed = 0
    retry = wait[i]
  end
  local reset = 0
  if rate[i] > 0 then reset = refill end
  out[#out + 1] = allowed
  out[#out + 1] = math.max(0, burst[i] - math.ceil(lv / CELL))
  out[#out + 1] = reset
  out[#out + 1] = retry
end
return out
";

/// A `rate_limit_store` that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Neither `memory` nor a Redis URL Redis's client accepts.
    #[error("rate_limit_store: expected `memory` or `redis://host:port`, got `{spec}`: {reason}")]
    BadSpec {
        /// What was configured.
        spec: String,
        /// Why it was refused.
        reason: String,
    },
}

/// How patiently the store talks to Redis.
#[derive(Debug, Clone, Copy)]
pub struct RedisOptions {
    /// While Redis is unreachable, how often to try it again (connect + PING).
    pub probe_every: Duration,
    /// Longest wait for a connection or an answer before deciding locally.
    pub timeout: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self { probe_every: Duration::from_secs(3), timeout: Duration::from_secs(1) }
    }
}

/// Buckets shared through Redis; see the module header.
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    options: RedisOptions,
    script: Script,
    connection: tokio::sync::Mutex<Option<Linked>>,
    /// Numbers connections, so that a failure on one already replaced is not taken for news.
    opened: AtomicU64,
    link: Mutex<Link>,
    local: MemoryStore,
}

/// The open connection and its number.
#[derive(Clone)]
struct Linked {
    id: u64,
    connection: MultiplexedConnection,
}

/// What is known of the connection to Redis.
#[derive(Debug, Clone, Copy)]
enum Link {
    /// Not tried yet.
    Untried,
    /// The last command was answered.
    Up,
    /// Unreachable; the last probe started at this time.
    Down { probed: Instant },
}

/// A store URL fit for a message: its user and password (`redis://:pw@host`) replaced by `***`.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

impl RedisStore {
    /// A store on the Redis at `url` (`redis://host:port[/db]`). Connects on first use, so a
    /// gateway starts even while Redis is down.
    pub fn open(url: &str, options: RedisOptions) -> Result<Self, StoreError> {
        let bad = |reason: String| StoreError::BadSpec { spec: without_password(url), reason };
        if !url.starts_with("redis://") {
            return Err(bad("not a redis:// URL".into()));
        }
        let client = Client::open(url).map_err(|e| bad(e.to_string()))?;
        let inner = Inner {
            client,
            options,
            script: Script::new(GCRA_SCRIPT),
            connection: tokio::sync::Mutex::new(None),
            opened: AtomicU64::new(0),
            link: Mutex::new(Link::Untried),
            local: MemoryStore::default(),
        };
        Ok(Self { inner: Arc::new(inner) })
    }
}

impl RateStore for RedisStore {
    fn apply<'a>(&'a self, mode: Mode, ops: &'a [Op]) -> BoxFuture<'a, Vec<Decision>> {
        Box::pin(async move {
            match Arc::clone(&self.inner).shared(mode, ops).await {
                Some(decisions) => decisions,
                None => self.inner.local.apply_now(mode, ops),
            }
        })
    }

    fn health(&self) -> StoreHealth {
        match self.inner.link() {
            Link::Untried | Link::Up => StoreHealth::Shared,
            Link::Down { .. } => StoreHealth::Fallback,
        }
    }
}

impl Inner {
    fn link(&self) -> Link {
        *self.link.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Decides the batch in Redis, or `None` when Redis is (or has just become) unreachable.
    async fn shared(self: Arc<Self>, mode: Mode, ops: &[Op]) -> Option<Vec<Decision>> {
        if let Link::Down { probed } = self.link() {
            if probed.elapsed() >= self.options.probe_every {
                self.start_probe();
            }
            return None;
        }
        let Linked { id, mut connection } = self.connection().await?;
        let mut invocation = self.script.prepare_invoke();
        invocation.arg(mode_name(mode));
        for op in ops {
            invocation.key(&op.key).arg(op.rate.per_minute).arg(op.rate.burst).arg(op.cost);
        }
        let answer = tokio::time::timeout(self.options.timeout, invocation.invoke_async::<Vec<i64>>(&mut connection));
        match answer.await {
            Ok(Ok(flat)) => match decisions(ops, &flat) {
                Some(decisions) => Some(decisions),
                None => {
                    self.lost(Some(id), &format!("unexpected answer {flat:?}")).await;
                    None
                }
            },
            Ok(Err(e)) => {
                self.lost(Some(id), &e.to_string()).await;
                None
            }
            Err(_) => {
                self.lost(Some(id), "no answer in time").await;
                None
            }
        }
    }

    /// The open connection, or a new one (first use after start).
    async fn connection(&self) -> Option<Linked> {
        let mut slot = self.connection.lock().await;
        if let Some(linked) = slot.as_ref() {
            return Some(linked.clone());
        }
        match self.connect().await {
            Ok(connection) => {
                let linked = self.number(connection);
                *slot = Some(linked.clone());
                Some(linked)
            }
            Err(reason) => {
                drop(slot);
                self.lost(None, &reason).await;
                None
            }
        }
    }

    fn number(&self, connection: MultiplexedConnection) -> Linked {
        Linked { id: self.opened.fetch_add(1, Ordering::Relaxed), connection }
    }

    async fn connect(&self) -> Result<MultiplexedConnection, String> {
        let timeout = Some(self.options.timeout);
        let config = AsyncConnectionConfig::new().set_connection_timeout(timeout).set_response_timeout(timeout);
        let connecting = self.client.get_multiplexed_async_connection_with_config(&config);
        match tokio::time::timeout(self.options.timeout, connecting).await {
            Ok(Ok(connection)) => Ok(connection),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no connection in time".into()),
        }
    }

    /// Marks Redis unreachable (warning once per outage) and drops the broken connection
    /// `failed` (`None`: no connection could be made). A failure on a connection that a probe
    /// has already replaced is old news and changes nothing.
    async fn lost(&self, failed: Option<u64>, reason: &str) {
        let mut slot = self.connection.lock().await;
        if failed.is_some() && slot.as_ref().map(|linked| linked.id) != failed {
            return;
        }
        *slot = None;
        let was = std::mem::replace(
            &mut *self.link.lock().unwrap_or_else(|poisoned| poisoned.into_inner()),
            Link::Down { probed: Instant::now() },
        );
        if !matches!(was, Link::Down { .. }) {
            tracing::warn!(
                redis = %self.client.get_connection_info().addr(),
                reason,
                "rate-limit store unreachable: limits are local to this gateway until it answers"
            );
        }
    }

    /// Tries Redis again in the background (one probe at a time: the probe's start time is
    /// recorded first); requests go on being decided locally meanwhile.
    fn start_probe(self: Arc<Self>) {
        {
            let mut link = self.link.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            match *link {
                Link::Down { probed } if probed.elapsed() >= self.options.probe_every => {
                    *link = Link::Down { probed: Instant::now() };
                }
                _ => return,
            }
        }
        tokio::spawn(async move {
            let Ok(mut connection) = self.connect().await else { return };
            let ping = redis::cmd("PING");
            let answered = tokio::time::timeout(self.options.timeout, ping.query_async::<String>(&mut connection));
            if matches!(answered.await, Ok(Ok(_))) {
                *self.connection.lock().await = Some(self.number(connection));
                *self.link.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Link::Up;
                tracing::info!(
                    redis = %self.client.get_connection_info().addr(),
                    "rate-limit store reachable again: limits are shared"
                );
            }
        });
    }
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Admit => "admit",
        Mode::Charge => "charge",
        Mode::Refund => "refund",
    }
}

/// The script's flat answer, four numbers per op, as decisions.
fn decisions(ops: &[Op], flat: &[i64]) -> Option<Vec<Decision>> {
    if flat.len() != ops.len() * 4 {
        return None;
    }
    let micros = |n: i64| Duration::from_micros(u64::try_from(n).unwrap_or(0));
    let decided = ops.iter().zip(flat.chunks_exact(4)).map(|(op, n)| Decision {
        allowed: n[0] == 1,
        limit: limit_of(op.rate),
        remaining: u64::try_from(n[1]).unwrap_or(0),
        reset_after: micros(n[2]),
        retry_after: (n[3] >= 0).then(|| micros(n[3])),
    });
    Some(decided.collect())
}

fn limit_of(rate: Rate) -> u64 {
    rate.burst
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_store_url_is_shown_without_its_password() {
        assert_eq!(without_password("rediss://:hunter2@db.local:6380/1"), "rediss://***@db.local:6380/1");
        assert_eq!(without_password("redis://user:pw@h"), "redis://***@h");
        assert_eq!(without_password("redis://h:6379"), "redis://h:6379");
        let Err(e) = RedisStore::open("rediss://:hunter2@db.local:6380", RedisOptions::default()) else {
            panic!("rediss:// is refused")
        };
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }

    #[test]
    fn only_redis_urls_are_accepted() {
        assert!(RedisStore::open("redis://127.0.0.1:6379", RedisOptions::default()).is_ok());
        assert!(RedisStore::open("127.0.0.1:6379", RedisOptions::default()).is_err());
        assert!(RedisStore::open("redis://", RedisOptions::default()).is_err());
    }

    #[test]
    fn the_scripts_answer_reads_as_decisions() {
        let op = Op { key: "k".into(), rate: Rate::per_minute(5), cost: 1 };
        let got = decisions(std::slice::from_ref(&op), &[0, 0, 60_000_000, 12_000_000]);
        let want = Decision {
            allowed: false,
            limit: 5,
            remaining: 0,
            reset_after: Duration::from_secs(60),
            retry_after: Some(Duration::from_secs(12)),
        };
        assert_eq!(got, Some(vec![want]));
        let never = decisions(std::slice::from_ref(&op), &[0, 5, 0, -1]).unwrap_or_default();
        assert!(never.first().is_some_and(Decision::too_large));
        assert_eq!(decisions(&[op], &[1, 2, 3]), None, "a short answer is no answer");
    }
}
