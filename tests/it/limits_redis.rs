//! Limits shared through a real `redis-server` (Debian's package, installed by
//! scripts/setup-system): two limiters stand for two gateways. They share one client's limit
//! while Redis answers, each enforce the whole limit on its own while it is down, and share
//! again once it is back. The Lua script keeps the same books as the in-process arithmetic.
//!
//! Buckets refill continuously (rpm 5: one request every 12 s), so where a count is checked the
//! bound allows for the refills the elapsed time could have given: no wall-clock bound.

use std::num::NonZeroU32;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use mlxgate::limits::redis_store::{RedisOptions, RedisStore};
use mlxgate::limits::{Limit, Limiter, Limits, StoreHealth};
use tokio::process::{Child, Command};

/// A `redis-server` of this test's own, on `port`, keeping nothing on disk.
struct Redis {
    port: u16,
    child: Child,
}

impl Redis {
    async fn start(port: u16) -> Redis {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server starts");
        let url = format!("redis://127.0.0.1:{port}");
        eventually("redis-server answers PING", || ping(&url)).await;
        Redis { port, child }
    }

    async fn stop(&mut self) {
        self.child.kill().await.expect("redis-server killed");
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

async fn ping(url: &str) -> bool {
    let Ok(client) = redis::Client::open(url) else { return false };
    let Ok(mut connection) = client.get_multiplexed_async_connection().await else { return false };
    redis::cmd("PING").query_async::<String>(&mut connection).await.is_ok()
}

/// Whether `redis-server` is installed; when it is not, outside CI the test says why it does
/// not run, and in CI it fails (scripts/setup-system installs it there).
fn redis_installed() -> bool {
    let found = std::process::Command::new("redis-server").arg("--version").output().is_ok_and(|o| o.status.success());
    if !found {
        assert!(std::env::var_os("CI").is_none(), "redis-server missing in CI: scripts/setup-system installs it");
        eprintln!("SKIPPED: redis-server is not installed (run scripts/setup-system as root)");
    }
    found
}

/// A gateway's limiter on `url`: generous timeouts (a loaded machine must not look like an
/// outage), a quick probe so that the return of Redis is seen soon.
fn gateway_limiter(url: &str) -> Limiter {
    let options = RedisOptions { probe_every: Duration::from_millis(100), timeout: Duration::from_secs(10) };
    let limiter = Limiter::new(Arc::new(RedisStore::open(url, options).expect("redis url")));
    let rpm5 = Limits { rpm: NonZeroU32::new(5), ..Limits::default() };
    let clients = ["before", "during", "after"].map(|c| (c.to_owned(), rpm5));
    let probe = ("probe".to_owned(), Limits { rpm: NonZeroU32::new(1_000_000), ..Limits::default() });
    limiter.configure(clients.into_iter().chain([probe]), Limits::default());
    limiter
}

/// `per_gateway` requests of `client` sent through each of `gateways`, all at once (a script
/// that read and then wrote the bucket in two steps would admit more than the limit): how many
/// each admitted, and the most refills at rpm 5 that the time taken could have given.
async fn send(gateways: &[&Limiter], client: &str, per_gateway: usize) -> (Vec<usize>, usize) {
    let started = Instant::now();
    let requests = gateways.iter().enumerate().flat_map(|(i, gateway)| {
        (0..per_gateway).map(move |_| async move {
            match gateway.admit(client, 0).await {
                Ok(_) => Some(i),
                Err(denied) => {
                    assert_eq!(denied.limit, Limit::Rpm);
                    None
                }
            }
        })
    });
    let answers = futures_util::future::join_all(requests).await;
    let mut admitted = vec![0; gateways.len()];
    for i in answers.into_iter().flatten() {
        admitted[i] += 1;
    }
    let refills = (started.elapsed().as_secs() / 12) as usize;
    (admitted, refills)
}

#[tokio::test]
async fn two_gateways_share_limits_through_redis_and_fall_back_to_local_ones() {
    if !redis_installed() {
        return;
    }
    let mut redis = Redis::start(free_port()).await;
    let a = gateway_limiter(&redis.url());
    let b = gateway_limiter(&redis.url());

    let (admitted, refills) = send(&[&a, &b], "before", 10).await;
    let total: usize = admitted.iter().sum();
    assert!((5..=5 + refills).contains(&total), "shared rpm 5: {admitted:?} admitted, {refills} refills");
    assert_eq!((a.store_health(), b.store_health()), (StoreHealth::Shared, StoreHealth::Shared));

    redis.stop().await;
    let (admitted, refills) = send(&[&a, &b], "during", 10).await;
    for (gateway, n) in admitted.iter().enumerate() {
        assert!(
            (5..=5 + refills).contains(n),
            "gateway {gateway} alone enforces rpm 5: {admitted:?}, {refills} refills"
        );
    }
    assert_eq!((a.store_health(), b.store_health()), (StoreHealth::Fallback, StoreHealth::Fallback));

    let redis = Redis::start(redis.port).await;
    for gateway in [&a, &b] {
        eventually("the gateway shares its limits again", || async {
            let _ = gateway.admit("probe", 0).await;
            gateway.store_health() == StoreHealth::Shared
        })
        .await;
    }
    let (admitted, refills) = send(&[&a, &b], "after", 10).await;
    let total: usize = admitted.iter().sum();
    assert!((5..=5 + refills).contains(&total), "shared again: {admitted:?} admitted, {refills} refills");
    drop(redis);
}

#[tokio::test]
async fn the_script_keeps_the_same_books_as_the_memory_store() {
    if !redis_installed() {
        return;
    }
    let redis = Redis::start(free_port()).await;
    let store = RedisStore::open(&redis.url(), RedisOptions::default()).expect("redis url");
    let limiter = Limiter::new(Arc::new(store));
    let limits = |rpm, tpm, concurrency| Limits {
        rpm: NonZeroU32::new(rpm),
        tpm: NonZeroU32::new(tpm),
        concurrency: NonZeroU32::new(concurrency),
    };
    limiter.configure(
        [
            ("odd".to_owned(), limits(7, 0, 0)),
            ("tokens".to_owned(), limits(0, 1000, 0)),
            ("one-at-a-time".to_owned(), limits(0, 0, 1)),
        ],
        Limits::default(),
    );
    let header = |h: &http::HeaderMap, name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);

    // An odd rate keeps its whole burst: 60 s / 7 is not a whole number of microseconds.
    let started = Instant::now();
    let mut odd = 0;
    for _ in 0..8 {
        odd += usize::from(limiter.admit("odd", 0).await.is_ok());
    }
    let refills = (started.elapsed().as_secs_f64() / (60.0 / 7.0)) as usize;
    assert!((7..=7 + refills).contains(&odd), "{odd} admitted, {refills} refills");

    // Tokens: charged up front, refunded to the real usage, then short by exactly the charge
    // (less what refilled meanwhile: one token every 60 ms).
    let started = Instant::now();
    let mut first = limiter.admit("tokens", 600).await.expect("600 of 1000");
    assert_eq!(header(first.headers(), "x-ratelimit-remaining-tokens").as_deref(), Some("400"));
    first.settle(450, 50).await;
    let second = limiter.admit("tokens", 500).await.expect("the refund made room");
    let remaining: u64 =
        header(second.headers(), "x-ratelimit-remaining-tokens").and_then(|v| v.parse().ok()).expect("header");
    let denied = limiter.admit("tokens", 100).await.expect_err("spent");
    let refilled = started.elapsed().as_millis() as u64 / 60;
    assert!(remaining <= refilled, "{remaining} left after 1000 charged, {refilled} refilled");
    assert_eq!(denied.limit, Limit::Tpm);
    let wait = denied.retry_after.expect("fits later");
    let six = Duration::from_secs(6); // 100 tokens at 1000 a minute
    assert!(wait <= six && wait + started.elapsed() >= six, "retry after {wait:?}");
    let retry_after = mlxgate::limits::headers::retry_after_secs(wait).to_string();
    assert_eq!(header(&denied.headers, "retry-after"), Some(retry_after));
    let too_large = limiter.admit("tokens", 1001).await.expect_err("never fits");
    assert_eq!(too_large.retry_after, None);

    // Concurrency is counted in this process, Redis or not.
    let running = limiter.admit("one-at-a-time", 0).await.expect("first");
    assert_eq!(limiter.admit("one-at-a-time", 0).await.map(drop).map_err(|d| d.limit), Err(Limit::Concurrency));
    drop(running);
    assert!(limiter.admit("one-at-a-time", 0).await.is_ok());
    assert_eq!(limiter.store_health(), StoreHealth::Shared, "every answer came from Redis");
}

/// Clients `c0`…`c{n-1}` (key `key-{i}`) with rpm 5 each, on two gateways sharing `redis_url`.
fn shared_yaml(sim_url: &str, redis_url: &str, n: usize) -> String {
    use sha2::{Digest, Sha256};
    let clients: String = (0..n)
        .map(|i| {
            let digest: String =
                Sha256::digest(format!("key-{i}").as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
            format!("  c{i}: {{key_sha256: {digest}, limits: {{rpm: 5}}}}\n")
        })
        .collect();
    format!(
        "rate_limit_store: {redis_url}\nauth: required\nclients:\n{clients}\
         backends:\n  local: {{url: '{sim_url}', max_concurrency: 64}}\n\
         models:\n  qwen: {{backend: local, max_queue: 64}}\n"
    )
}

/// Ten requests of client `i`, alternating between the gateways: how many each answered 200
/// (anything else must be a 429: the gateways keep answering whatever Redis does).
async fn ten_requests(gateways: [&Gateway; 2], i: usize) -> [usize; 2] {
    let body = serde_json::json!({"model": "qwen", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]});
    let mut ok = [0, 0];
    for n in 0..10 {
        let response = client()
            .post(gateways[n % 2].url("/v1/chat/completions"))
            .bearer_auth(format!("key-{i}"))
            .json(&body)
            .send()
            .await
            .expect("the gateway answers");
        match response.status().as_u16() {
            200 => ok[n % 2] += 1,
            429 => {}
            other => panic!("client c{i}: status {other} from gateway {}", n % 2),
        }
    }
    ok
}

#[tokio::test]
async fn two_gateway_instances_share_rpm_through_redis_and_keep_answering_without_it() {
    if !redis_installed() {
        return;
    }
    const CLIENTS: usize = 1000;
    let sim = sim().await;
    let mut redis = Redis::start(free_port()).await;
    let yaml = shared_yaml(&sim.url(), &redis.url(), CLIENTS);
    let (a, b) = (gateway(&yaml).await, gateway(&yaml).await);
    assert_ne!(a.addr.port(), b.addr.port());

    // Shared: client c0's rpm 5 holds across both gateways (a bucket refills one request every
    // 12 s: at most one more while ten requests are sent).
    let started = Instant::now();
    let ok = ten_requests([&a, &b], 0).await;
    let refills = (started.elapsed().as_secs() / 12) as usize;
    assert!((5..=5 + refills).contains(&(ok[0] + ok[1])), "shared rpm 5 across two gateways: {ok:?}");
    assert!(ok[0] > 0 && ok[1] > 0, "both gateways served some: {ok:?}");

    // Redis stopped: both keep answering, each with its own local limits.
    redis.stop().await;
    let ok = ten_requests([&a, &b], 1).await;
    assert!(ok[0] >= 1 && ok[1] >= 1, "both gateways keep serving without Redis: {ok:?}");

    // Redis back: once both gateways have found it, a client's limit is shared again. Each try
    // takes a fresh client, so that a try made while one gateway still counts locally leaves
    // no state behind.
    let redis = Redis::start(redis.port).await;
    let mut next = 2;
    eventually("the gateways share their limits again", || {
        let i = next;
        next += 1;
        assert!(i < CLIENTS, "the gateways did not share limits again after {} tries", CLIENTS - 2);
        let gateways = [&a, &b];
        async move {
            let started = Instant::now();
            let ok = ten_requests(gateways, i).await;
            let refills = (started.elapsed().as_secs() / 12) as usize;
            (5..=5 + refills).contains(&(ok[0] + ok[1]))
        }
    })
    .await;
    drop(redis);
}
