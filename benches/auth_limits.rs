//! Cost of clients, keys and rate limits on the request path: the latency a request gains at
//! concurrency 1 and the rate a gateway keeps at concurrency 32 when `auth: required` and
//! per-client limits (memory store) are on, against the same gateway without them.
//!
//! `cargo bench --bench auth_limits` starts, in this one process, a zero-delay simulator (an
//! immediate whole answer of one token) and two gateways in front of it: A with no clients (auth
//! off, no limits) and B with `auth: required` and two clients whose keys are checked and whose
//! `rpm`, `tpm` and `concurrency` are charged on every request but set too high ever to refuse.
//! A keep-alive client sends non-streaming chat requests to the simulator directly (the
//! baseline), to A and to B in interleaved rounds (the order reversed every other round, so a
//! drift of the machine's load falls on all three alike): N sequential requests (latency p50 and
//! p99) and M requests from 32 tasks at once (requests per second). The table gives the median
//! over rounds, and B − A paired within each round.
//!
//! `AUTH_LIMITS_ROUNDS`, `AUTH_LIMITS_SEQUENTIAL` and `AUTH_LIMITS_CONCURRENT` override the
//! number of rounds, N and M.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use mlxgate::Config;
use mlxgate::sim::{self, Behaviour, SimConfig};
use sha2::{Digest, Sha256};

/// The gateway's own allocator (src/main.rs), so the figures are the gateway's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The two clients of gateway B: (name, key).
const CLIENTS: [(&str, &str); 2] =
    [("bench-one", "sk-bench-one-5d0c8e2a9f174b63"), ("bench-two", "sk-bench-two-b81f46c07e3a92d5")];

/// Limits charged on every request and never reached (a billion requests a minute).
const NEVER_REFUSING: &str = "{rpm: 1000000000, tpm: 4000000000, concurrency: 100000}";

/// Requests in flight at once in the concurrent part.
const CONCURRENCY: usize = 32;

/// Requests to each target before the first round.
const WARM_UP: usize = 5_000;

/// What a run measures.
struct Settings {
    rounds: usize,
    sequential: usize,
    concurrent: usize,
}

impl Settings {
    fn from_env() -> Settings {
        let read = |name: &str, default: usize| {
            std::env::var(name).ok().and_then(|v| v.parse().ok()).filter(|n| *n > 0).unwrap_or(default)
        };
        Settings {
            rounds: read("AUTH_LIMITS_ROUNDS", 7),
            sequential: read("AUTH_LIMITS_SEQUENTIAL", 20_000),
            concurrent: read("AUTH_LIMITS_CONCURRENT", 40_000),
        }
    }
}

/// Where requests go, and the keys they carry (taken in turn; none for an open endpoint).
struct Target {
    label: &'static str,
    url: String,
    keys: Vec<&'static str>,
}

/// One round's figures for one target.
#[derive(Clone, Copy)]
struct Round {
    p50: Duration,
    p99: Duration,
    rate: f64,
}

fn main() {
    let settings = Settings::from_env();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    runtime.block_on(run(&settings));
}

async fn run(settings: &Settings) {
    let simulator = sim::spawn(SimConfig {
        defaults: Behaviour { ttft_ms: Some(0), tokens: Some(1), ..Default::default() },
        ..Default::default()
    })
    .await
    .expect("simulator starts");
    let open = start_gateway(&gateway_yaml(&simulator.url(), false)).await;
    let guarded = start_gateway(&gateway_yaml(&simulator.url(), true)).await;
    let targets = [
        Target { label: "simulator, direct", url: format!("{}/v1/chat/completions", simulator.url()), keys: vec![] },
        Target { label: "A: gateway, no auth/limits", url: format!("{open}/v1/chat/completions"), keys: vec![] },
        Target {
            label: "B: gateway, auth + limits",
            url: format!("{guarded}/v1/chat/completions"),
            keys: CLIENTS.iter().map(|(_, key)| *key).collect(),
        },
    ];
    let http = reqwest::Client::builder().pool_max_idle_per_host(2 * CONCURRENCY).build().expect("http client");
    let body = Bytes::from(
        serde_json::json!({"model": "qwen", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 1})
            .to_string(),
    );
    check_b_is_guarded(&http, &targets[2], &body).await;

    print_machine(settings);
    for target in &targets {
        concurrent(&http, target, &body, WARM_UP).await;
    }
    let mut rounds: Vec<[Round; 3]> = Vec::with_capacity(settings.rounds);
    for r in 0..settings.rounds {
        let mut order = [0, 1, 2];
        if r % 2 == 1 {
            order.reverse();
        }
        let mut round = [Round { p50: Duration::ZERO, p99: Duration::ZERO, rate: 0.0 }; 3];
        for &t in &order {
            let mut latencies = sequential(&http, &targets[t], &body, settings.sequential).await;
            latencies.sort_unstable();
            round[t].p50 = percentile(&latencies, 0.50);
            round[t].p99 = percentile(&latencies, 0.99);
        }
        for &t in &order {
            let elapsed = concurrent(&http, &targets[t], &body, settings.concurrent).await;
            round[t].rate = settings.concurrent as f64 / elapsed.as_secs_f64();
        }
        rounds.push(round);
    }
    print_table(&targets, &rounds);
}

/// Gateway YAML in front of `sim_url`: one model `qwen`; with `guarded`, `auth: required` and
/// the two clients of [`CLIENTS`] under [`NEVER_REFUSING`] limits in the memory store.
fn gateway_yaml(sim_url: &str, guarded: bool) -> String {
    let mut yaml = format!(
        "backends:\n  local: {{url: '{sim_url}', max_concurrency: 256}}\n\
         models:\n  qwen: {{backend: local, max_queue: 1024}}\n\
         max_connections_per_client: 1024\n"
    );
    if guarded {
        yaml.push_str("auth: required\nrate_limit_store: memory\nclients:\n");
        for (name, key) in CLIENTS {
            yaml.push_str(&format!("  {name}: {{key_sha256: {}, limits: {NEVER_REFUSING}}}\n", sha256_hex(key)));
        }
    }
    yaml
}

fn sha256_hex(key: &str) -> String {
    Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// Starts a gateway on 127.0.0.1:0 serving until the process ends; returns its base URL.
async fn start_gateway(yaml: &str) -> String {
    let config = Config::parse(yaml, &|_| None).expect("bench config is valid");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local address");
    let keeper = PathBuf::from(env!("CARGO_BIN_EXE_mlxgate"));
    tokio::spawn(mlxgate::serve(config, listener, std::future::pending(), keeper));
    format!("http://{addr}")
}

/// B refuses a request without a key and charges its clients' limits (the headers say so),
/// so the run measures what it claims to.
async fn check_b_is_guarded(http: &reqwest::Client, b: &Target, body: &Bytes) {
    let anonymous = http
        .post(&b.url)
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .expect("gateway B answers");
    assert_eq!(anonymous.status(), 401, "gateway B wants a key");
    let response = send(http, b, body, 0).await;
    let limit = response.headers().get("x-ratelimit-limit-requests").and_then(|v| v.to_str().ok());
    assert_eq!(limit, Some("1000000000"), "gateway B charges the client's rpm");
}

/// One request with the `i`-th key in turn; panics on anything but 200.
async fn send(http: &reqwest::Client, target: &Target, body: &Bytes, i: usize) -> reqwest::Response {
    let mut request = http.post(&target.url).header("content-type", "application/json").body(body.clone());
    if !target.keys.is_empty() {
        request = request.bearer_auth(target.keys[i % target.keys.len()]);
    }
    let response = request.send().await.expect("request sent");
    assert_eq!(response.status(), 200, "{}: {:?}", target.label, response.headers());
    response
}

/// A request and its whole body.
async fn exchange(http: &reqwest::Client, target: &Target, body: &Bytes, i: usize) {
    send(http, target, body, i).await.bytes().await.expect("whole body");
}

/// `n` requests one after another; the time of each.
async fn sequential(http: &reqwest::Client, target: &Target, body: &Bytes, n: usize) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(n);
    for i in 0..n {
        let started = Instant::now();
        exchange(http, target, body, i).await;
        latencies.push(started.elapsed());
    }
    latencies
}

/// `n` requests from [`CONCURRENCY`] tasks at once; the time until the last one ends.
async fn concurrent(http: &reqwest::Client, target: &Target, body: &Bytes, n: usize) -> Duration {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CONCURRENCY {
        let (http, next, body) = (http.clone(), next.clone(), body.clone());
        let target = Target { label: target.label, url: target.url.clone(), keys: target.keys.clone() };
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                exchange(&http, &target, &body, i).await;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("request task");
    }
    started.elapsed()
}

/// The `q` quantile of sorted `values` (nearest rank).
fn percentile(sorted: &[Duration], q: f64) -> Duration {
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 { values[mid] } else { (values[mid - 1] + values[mid]) / 2.0 }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn print_machine(settings: &Settings) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name").map(|m| m.trim_start_matches([' ', '\t', ':']).to_string()))
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let load = std::fs::read_to_string("/proc/loadavg")
        .map_or_else(|_| "?".into(), |l| l.split(' ').take(3).collect::<Vec<_>>().join(" "));
    println!("machine: {cores} cores, {cpu}; load average {load} (client, gateways and simulator share them)");
    println!(
        "{} rounds of: {} sequential requests (concurrency 1), then {} requests from {CONCURRENCY} tasks; \
         non-streaming chat, one-token answers, keep-alive; {WARM_UP} warm-up requests per target",
        settings.rounds, settings.sequential, settings.concurrent
    );
}

fn print_table(targets: &[Target; 3], rounds: &[[Round; 3]]) {
    let over = |f: &dyn Fn(&[Round; 3]) -> f64| median(rounds.iter().map(f).collect());
    println!();
    println!("{:<28} {:>10} {:>10} {:>12}", "median over rounds", "c1 p50", "c1 p99", "c32 req/s");
    for (t, target) in targets.iter().enumerate() {
        println!(
            "{:<28} {:>7.1} µs {:>7.1} µs {:>12.0}",
            target.label,
            over(&|r| micros(r[t].p50)),
            over(&|r| micros(r[t].p99)),
            over(&|r| r[t].rate)
        );
    }
    let added_p50 = |r: &[Round; 3]| micros(r[2].p50) - micros(r[1].p50);
    let added_p99 = |r: &[Round; 3]| micros(r[2].p99) - micros(r[1].p99);
    let ratio = |r: &[Round; 3]| r[2].rate / r[1].rate;
    println!(
        "{:<28} {:>+7.1} µs {:>+7.1} µs {:>11.3}×",
        "B − A (paired per round)",
        over(&added_p50),
        over(&added_p99),
        over(&ratio)
    );
    let spread = |f: &dyn Fn(&[Round; 3]) -> f64, precision: usize| {
        let values: Vec<f64> = rounds.iter().map(f).collect();
        let (lo, hi) = values.iter().fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
        format!("{lo:.precision$}..{hi:.precision$}")
    };
    println!(
        "B − A per round: p50 {} µs, p99 {} µs, rate ratio {}",
        spread(&added_p50, 1),
        spread(&added_p99, 1),
        spread(&ratio, 3)
    );
}
