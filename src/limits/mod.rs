//! Per-client rate limits: requests per minute, tokens per minute and requests in flight.
//!
//! The handler asks [`Limiter::admit`] before anything costly, with the prompt's token count
//! (or an estimate). An [`Admission`] charges the request and its prompt tokens up front, holds
//! the client's concurrency permit until it is dropped (with the response body, when the stream
//! ends), and is [`settle`](Admission::settle)d at the end with the backend's usage: a refund
//! when fewer tokens were used, a further charge when more. A request refused later, before the
//! backend saw it, is [`cancel`](Admission::cancel)led and costs nothing. A [`Denied`] says which
//! limit refused, when to retry, and carries the 429's headers.
//!
//! The arithmetic is in `gcra` (continuous refill, burst = one minute's allowance, as OpenAI),
//! the headers in `headers`, the shared state in `store` (in process) or `redis_store` (shared between
//! gateways, with an in-process fallback). Concurrency is always counted in this process: a
//! permit must be released when a stream ends, and a permit held in Redis by a gateway that died
//! would never be; a client with `concurrency: 2` behind two gateways may run two on each.

pub mod gcra;
pub mod headers;
pub mod redis_store;
pub mod store;

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use http::HeaderMap;
use tokio::time::Instant;

pub use crate::config::Limits;
use crate::config::{Config, RateLimitStore};
pub use gcra::{Bucket, Decision, Rate};
pub use store::{Clock, ManualClock, MemoryStore, Mode, MonotonicClock, Op, RateStore, StoreHealth};

/// Prefix of every bucket's key in a shared store.
const KEY_PREFIX: &str = "mlxgate:limits:";

/// Which limit refused a request (the `limit` label of `mlxgate_rate_limited_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// Requests per minute.
    Rpm,
    /// Tokens per minute.
    Tpm,
    /// Requests in flight.
    Concurrency,
}

impl Limit {
    /// The metric label and the name in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Rpm => "rpm",
            Limit::Tpm => "tpm",
            Limit::Concurrency => "concurrency",
        }
    }

    fn described(self) -> &'static str {
        match self {
            Limit::Rpm => "requests per min (RPM)",
            Limit::Tpm => "tokens per min (TPM)",
            Limit::Concurrency => "requests in flight",
        }
    }
}

/// A request refused by a limit: answer 429 `rate_limit_exceeded` with `headers`.
#[derive(Debug)]
pub struct Denied {
    /// The limit that refused.
    pub limit: Limit,
    /// How long until the same request would fit; `None` when it never will (more tokens than
    /// the client's whole bucket).
    pub retry_after: Option<Duration>,
    /// `x-ratelimit-*` plus `Retry-After`/`retry-after-ms` (or `x-should-retry: false`).
    pub headers: HeaderMap,
    /// The error message, in OpenAI's wording.
    pub message: String,
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Denied {}

/// An admitted request: its charges and its concurrency permit (released when dropped).
pub struct Admission {
    store: Arc<dyn RateStore>,
    /// The request bucket's charge (cost 1), to give back if cancelled.
    requests: Option<Op>,
    /// The token bucket's charge so far.
    tokens: Option<Op>,
    headers: HeaderMap,
    _in_flight: Option<InFlight>,
}

/// One request counted in its client's requests in flight, until dropped.
struct InFlight(Arc<AtomicU32>);

impl InFlight {
    /// Counts one more request in `count` if fewer than `most` are in flight (`u32::MAX`: no
    /// limit; it is counted all the same, for a reload that sets one).
    fn try_enter(count: &Arc<AtomicU32>, most: u32) -> Option<InFlight> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < most).then_some(n + 1))
            .ok()
            .map(|_| InFlight(Arc::clone(count)))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl fmt::Debug for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission").field("tokens_charged", &self.tokens_charged()).finish_non_exhaustive()
    }
}

impl Admission {
    /// The `x-ratelimit-*` headers as of the admission, for the response.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// Leaves the client's requests in flight now, before the charge is settled: the request
    /// has ended for the client, whose next request must not meet it (a settlement through
    /// Redis takes a round trip, and a one-at-a-time client is already sending again).
    pub fn leave(&mut self) {
        self._in_flight = None;
    }

    /// Tokens charged to the client's token bucket so far (0 without a token limit).
    pub fn tokens_charged(&self) -> u64 {
        self.tokens.as_ref().map_or(0, |op| op.cost)
    }

    /// Whether [`settle`](Self::settle) can change anything: a token bucket was charged.
    pub fn settles_tokens(&self) -> bool {
        self.tokens.is_some()
    }

    /// Whether [`cancel`](Self::cancel) gives anything back.
    pub fn refunds_anything(&self) -> bool {
        self.requests.iter().chain(self.tokens.iter()).any(|op| op.cost > 0)
    }

    /// Corrects the token charge to what the request really used, once its response has ended
    /// (or was cut: charge what was generated): refunds the difference when fewer tokens were
    /// used than charged, charges it when more (the bucket may go into debt). May be called
    /// again; each call corrects against the previous one.
    pub async fn settle(&mut self, prompt_tokens: u64, generated_tokens: u64) {
        let Some(charged) = self.tokens.as_mut() else { return };
        let used = prompt_tokens.saturating_add(generated_tokens);
        let (mode, delta) = match used.cmp(&charged.cost) {
            std::cmp::Ordering::Equal => return,
            std::cmp::Ordering::Greater => (Mode::Charge, used - charged.cost),
            std::cmp::Ordering::Less => (Mode::Refund, charged.cost - used),
        };
        let correction = [Op { cost: delta, ..charged.clone() }];
        charged.cost = used;
        self.store.apply(mode, &correction).await;
    }

    /// Gives back everything charged: the request was refused before any backend saw it
    /// (context too long, queue full), and such a request costs the client nothing.
    pub async fn cancel(self) {
        let refunds: Vec<Op> =
            self.requests.iter().chain(self.tokens.iter()).filter(|op| op.cost > 0).cloned().collect();
        if !refunds.is_empty() {
            self.store.apply(Mode::Refund, &refunds).await;
        }
    }
}

/// Every client's limits and the store of their buckets.
pub struct Limiter {
    store: Arc<dyn RateStore>,
    table: RwLock<LimitTable>,
    /// Each client's requests in flight, compared with its limit as it is at each admission:
    /// a reload that lowers `concurrency` counts the requests already running.
    in_flight: Mutex<HashMap<String, Arc<AtomicU32>>>,
    /// Clients refused by their request or token rate, until a request of one token would fit
    /// again: [`precheck`](Limiter::precheck) refuses their next requests before they are
    /// counted. A hint only: it is confirmed against the store before it refuses.
    refused: Mutex<HashMap<String, Refusal>>,
    /// Each client's last request body refused by its token rate (by fingerprint): the same
    /// body sent again (an agent looping on a prompt too large for it) is refused before it is
    /// counted, until it would fit.
    refused_bodies: Mutex<HashMap<String, BodyRefusal>>,
}

/// A body refused by a client's token rate: its count, and until when (`None`: never fits).
#[derive(Debug, Clone, Copy)]
struct BodyRefusal {
    fingerprint: u64,
    cost: u64,
    until: Option<Instant>,
}

/// A cheap fingerprint of a request body, to know the same body again (not a secret: a
/// collision only ever refuses the client's own request, for at most its retry time).
pub fn body_fingerprint(body: &[u8]) -> u64 {
    use std::hash::{DefaultHasher, Hasher};
    let mut hasher = DefaultHasher::new();
    hasher.write(body);
    hasher.finish()
}

/// A recent refusal by a rate: which limit, and when the smallest request fits again.
#[derive(Debug, Clone, Copy)]
struct Refusal {
    limit: Limit,
    until: Instant,
}

#[derive(Debug, Default)]
struct LimitTable {
    clients: HashMap<String, Limits>,
    default: Limits,
}

impl Limiter {
    /// A limiter over `store` with no limits until [`configure`](Limiter::configure)d.
    pub fn new(store: Arc<dyn RateStore>) -> Self {
        Self {
            store,
            table: RwLock::new(LimitTable::default()),
            in_flight: Mutex::new(HashMap::new()),
            refused: Mutex::new(HashMap::new()),
            refused_bodies: Mutex::new(HashMap::new()),
        }
    }

    /// Sets every client's limits (at start-up and on reload); clients not named get
    /// `default`. Buckets keep their state across a reload, and so does the count of requests
    /// in flight: lowering `concurrency` below it refuses new requests until enough have ended.
    pub fn configure(&self, clients: impl IntoIterator<Item = (String, Limits)>, default: Limits) {
        let table = LimitTable { clients: clients.into_iter().collect(), default };
        *self.table.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = table;
        // A raised limit must not keep refusing on the old one's word.
        self.refused.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clear();
        self.refused_bodies.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clear();
    }

    /// A limiter over the configured `rate_limit_store`, with every client's limits and
    /// `default_limits` (which the `anonymous` client of auth off shares).
    pub fn for_config(config: &Config) -> Result<Limiter, redis_store::StoreError> {
        let spec = match &config.rate_limit_store {
            RateLimitStore::Memory => "memory",
            RateLimitStore::Redis(url) => url.as_str(),
        };
        let limiter = Limiter::new(open_store(spec)?);
        limiter.configure_clients(config);
        Ok(limiter)
    }

    /// Sets the limits of `config`'s clients and its `default_limits` (see
    /// [`configure`](Limiter::configure)).
    pub fn configure_clients(&self, config: &Config) {
        let clients = config.clients.values().map(|c| (c.name.to_string(), c.limits));
        self.configure(clients, config.default_limits);
    }

    /// The limits that apply to `client`.
    pub fn limits_of(&self, client: &str) -> Limits {
        let table = self.table.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        table.clients.get(client).copied().unwrap_or(table.default)
    }

    /// Whether the limits are shared between gateways right now.
    pub fn store_health(&self) -> StoreHealth {
        self.store.health()
    }

    /// Admits one request of `client` with a prompt of `prompt_tokens` (charged now against
    /// the token limit; correct it later with [`Admission::settle`]), or says which limit refuses.
    pub async fn admit(&self, client: &str, prompt_tokens: u64) -> Result<Admission, Denied> {
        self.admit_body(client, prompt_tokens, None).await
    }

    /// As [`admit`](Limiter::admit), for a request whose body has `fingerprint` (see
    /// [`body_fingerprint`]): refused by the token rate, the same body is refused by
    /// [`precheck`](Limiter::precheck) until it would fit, without being counted again.
    pub async fn admit_body(
        &self,
        client: &str,
        prompt_tokens: u64,
        fingerprint: Option<u64>,
    ) -> Result<Admission, Denied> {
        let limits = self.limits_of(client);
        let requests = limits.rpm.map(|rpm| bucket_op(client, Limit::Rpm, rpm.get().into(), 1));
        let tokens = limits.tpm.map(|tpm| bucket_op(client, Limit::Tpm, tpm.get().into(), prompt_tokens));
        // Every request is counted, limit or not: a reload that sets a limit counts those
        // already running.
        let most = limits.concurrency.map_or(u32::MAX, NonZeroU32::get);
        let in_flight = match InFlight::try_enter(&self.in_flight_count(client), most) {
            Some(entered) => Some(entered),
            None => return Err(self.deny_concurrency(client, most, &limits).await),
        };
        let ops: Vec<Op> = requests.iter().chain(tokens.iter()).cloned().collect();
        let decisions = if ops.is_empty() { Vec::new() } else { self.store.apply(Mode::Admit, &ops).await };
        let (request_decision, token_decision) = split(&decisions, requests.is_some(), tokens.is_some());
        let headers = headers::rate_limit_headers(request_decision, token_decision);
        if let Some((limit, decision)) = refusal(request_decision, token_decision) {
            self.remember_refusal(client, limit, decision, &limits, prompt_tokens);
            if let (Limit::Tpm, Some(fingerprint)) = (limit, fingerprint) {
                let until = decision.retry_after.map(|wait| Instant::now() + wait);
                let refused = BodyRefusal { fingerprint, cost: prompt_tokens, until };
                self.refused_bodies
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .insert(client.to_owned(), refused);
            }
            return Err(denied(client, limit, decision, &ops, headers));
        }
        Ok(Admission { store: Arc::clone(&self.store), requests, tokens, headers, _in_flight: in_flight })
    }

    /// A cheap look before a request is counted (its prompt tokenized): refuses it at once when
    /// the client has its `concurrency` in flight, was refused by its request or token rate and
    /// not even a one-token request fits yet, or sends again the body (`fingerprint`) its token
    /// rate refused, before it would fit. Charges nothing; [`admit`](Limiter::admit) still
    /// decides. A runaway client looping on 429s so costs a store read, not a count.
    pub async fn precheck(&self, client: &str, fingerprint: Option<u64>) -> Result<(), Denied> {
        let limits = self.limits_of(client);
        if let Some(most) = limits.concurrency.map(NonZeroU32::get)
            && self.in_flight_count(client).load(Ordering::Acquire) >= most
        {
            return Err(self.deny_concurrency(client, most, &limits).await);
        }
        if let Some(fingerprint) = fingerprint {
            self.precheck_body(client, fingerprint, &limits).await?;
        }
        let memo = self.refused.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(client).copied();
        let Some(Refusal { limit, until }) = memo else { return Ok(()) };
        let wait = until.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            // Confirmed against the store: a refund or another gateway's view may have made room.
            let (reads, requests, tokens) = reads_of(client, &limits);
            let decisions = if reads.is_empty() { Vec::new() } else { self.store.apply(Mode::Admit, &reads).await };
            let (r, t) = split(&decisions, requests, tokens);
            let spent = match limit {
                Limit::Rpm => r,
                Limit::Tpm => t,
                Limit::Concurrency => None,
            };
            if let Some(spent) = spent.filter(|d| d.remaining == 0) {
                let mut headers = headers::rate_limit_headers(r, t);
                headers::add_retry_headers(&mut headers, Some(wait));
                let message = format!(
                    "Rate limit reached for {} for client {client}: limit {}, remaining 0. Please try again in {}.",
                    limit.described(),
                    spent.limit,
                    headers::openai_duration(wait),
                );
                return Err(Denied { limit, retry_after: Some(wait), headers, message });
            }
        }
        self.refused.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(client);
        Ok(())
    }

    /// The body refused last by the client's token rate, sent again: refused while it cannot fit.
    async fn precheck_body(&self, client: &str, fingerprint: u64, limits: &Limits) -> Result<(), Denied> {
        let memo = self.refused_bodies.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(client).copied();
        let Some(refused) = memo.filter(|r| r.fingerprint == fingerprint) else { return Ok(()) };
        let wait = refused.until.map(|until| until.saturating_duration_since(Instant::now()));
        if wait != Some(Duration::ZERO) {
            let (reads, requests, tokens) = reads_of(client, limits);
            let decisions = if reads.is_empty() { Vec::new() } else { self.store.apply(Mode::Admit, &reads).await };
            let (r, t) = split(&decisions, requests, tokens);
            // Confirmed against the store: room may have come back sooner (a refund).
            if let Some(bucket) = t.filter(|d| d.remaining < refused.cost) {
                let mut headers = headers::rate_limit_headers(r, t);
                headers::add_retry_headers(&mut headers, wait);
                let message = match wait {
                    Some(wait) => format!(
                        "Rate limit reached for {} for client {client}: limit {}, remaining {}, requested {}. Please try again in {}.",
                        Limit::Tpm.described(),
                        bucket.limit,
                        bucket.remaining,
                        refused.cost,
                        headers::openai_duration(wait),
                    ),
                    None => format!(
                        "Request too large for {} for client {client}: limit {}, requested {}. Send fewer tokens.",
                        Limit::Tpm.described(),
                        bucket.limit,
                        refused.cost,
                    ),
                };
                return Err(Denied { limit: Limit::Tpm, retry_after: wait, headers, message });
            }
        }
        self.refused_bodies.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(client);
        Ok(())
    }

    /// Notes a refusal by a rate for [`precheck`](Limiter::precheck): the time until a request
    /// of one token (of one request, for rpm) fits, from the refused cost's wait.
    fn remember_refusal(&self, client: &str, limit: Limit, decision: &Decision, limits: &Limits, cost: u64) {
        let Some(wait) = decision.retry_after else { return };
        let smallest = match (limit, limits.tpm) {
            // The bucket drains at a steady rate: one token fits sooner than `cost` by the time
            // that `cost - 1` tokens take to drain.
            (Limit::Tpm, Some(tpm)) => {
                let earlier = Duration::from_secs_f64(60.0 * cost.saturating_sub(1) as f64 / f64::from(tpm.get()));
                wait.saturating_sub(earlier)
            }
            _ => wait,
        };
        if !smallest.is_zero() {
            let until = Instant::now() + smallest;
            self.refused
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .insert(client.to_owned(), Refusal { limit, until });
        }
    }

    /// The client's count of requests in flight, made on first use.
    /// How many of `client`'s requests are admitted and not finished (queued or at a backend).
    pub fn in_flight_of(&self, client: &str) -> u32 {
        let in_flight = self.in_flight.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        in_flight.get(client).map_or(0, |count| count.load(Ordering::Acquire))
    }

    fn in_flight_count(&self, client: &str) -> Arc<AtomicU32> {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // The client's name is copied only the first time.
        if let Some(count) = in_flight.get(client) {
            return Arc::clone(count);
        }
        Arc::clone(in_flight.entry(client.to_owned()).or_default())
    }

    async fn deny_concurrency(&self, client: &str, most: u32, limits: &Limits) -> Denied {
        // The rate headers still go out: read the buckets without charging them.
        let (reads, requests, tokens) = reads_of(client, limits);
        let decisions = if reads.is_empty() { Vec::new() } else { self.store.apply(Mode::Admit, &reads).await };
        let (r, t) = split(&decisions, requests, tokens);
        let mut headers = headers::rate_limit_headers(r, t);
        // A slot frees when a running request ends; there is no schedule to promise, so ask
        // for a short pause rather than none.
        let retry_after = Some(Duration::from_secs(1));
        headers::add_retry_headers(&mut headers, retry_after);
        let message = format!(
            "Rate limit reached for {} for client {client}: limit {most}. Please try again when a request has finished.",
            Limit::Concurrency.described()
        );
        Denied { limit: Limit::Concurrency, retry_after, headers, message }
    }
}

/// The store operation for one of a client's rate limits.
fn bucket_op(client: &str, limit: Limit, per_minute: u64, cost: u64) -> Op {
    Op { key: format!("{KEY_PREFIX}{client}:{}", limit.as_str()), rate: Rate::per_minute(per_minute), cost }
}

/// Reads (cost 0: nothing charged) of the client's request and token buckets, and which of
/// the two are in the batch.
fn reads_of(client: &str, limits: &Limits) -> (Vec<Op>, bool, bool) {
    let requests = limits.rpm.map(|rpm| bucket_op(client, Limit::Rpm, rpm.get().into(), 0));
    let tokens = limits.tpm.map(|tpm| bucket_op(client, Limit::Tpm, tpm.get().into(), 0));
    let (r, t) = (requests.is_some(), tokens.is_some());
    (requests.into_iter().chain(tokens).collect(), r, t)
}

/// The request and token decisions out of a batch that holds those present, in that order.
fn split(decisions: &[Decision], requests: bool, tokens: bool) -> (Option<&Decision>, Option<&Decision>) {
    let mut it = decisions.iter();
    let r = if requests { it.next() } else { None };
    let t = if tokens { it.next() } else { None };
    (r, t)
}

/// The limit that refused, if any: one that can never fit first, else the longest wait.
fn refusal<'a>(requests: Option<&'a Decision>, tokens: Option<&'a Decision>) -> Option<(Limit, &'a Decision)> {
    [(Limit::Rpm, requests), (Limit::Tpm, tokens)]
        .into_iter()
        .filter_map(|(limit, d)| d.filter(|d| !d.allowed).map(|d| (limit, d)))
        .max_by_key(|(_, d)| d.retry_after.unwrap_or(Duration::MAX))
}

fn denied(client: &str, limit: Limit, decision: &Decision, ops: &[Op], mut headers: HeaderMap) -> Denied {
    let requested = match limit {
        Limit::Tpm => ops.last().map_or(0, |op| op.cost),
        _ => 1,
    };
    let message = match decision.retry_after {
        Some(wait) => format!(
            "Rate limit reached for {} for client {client}: limit {}, remaining {}, requested {requested}. Please try again in {}.",
            limit.described(),
            decision.limit,
            decision.remaining,
            headers::openai_duration(wait),
        ),
        None => format!(
            "Request too large for {} for client {client}: limit {}, requested {requested}. Send fewer tokens.",
            limit.described(),
            decision.limit,
        ),
    };
    headers::add_retry_headers(&mut headers, decision.retry_after);
    Denied { limit, retry_after: decision.retry_after, headers, message }
}

/// The store named by `rate_limit_store`: `memory` (the default), or `redis://host:port` shared
/// between gateways (with a local fallback while Redis is unreachable).
pub fn open_store(spec: &str) -> Result<Arc<dyn RateStore>, redis_store::StoreError> {
    if spec == "memory" {
        return Ok(Arc::new(MemoryStore::default()));
    }
    Ok(Arc::new(redis_store::RedisStore::open(spec, redis_store::RedisOptions::default())?))
}

#[cfg(test)]
mod tests;
