//! The Grafana dashboard and the alert rules in `dashboards/`, proven against a real Prometheus
//! (Debian's `prometheus` package, from `scripts/setup-system`): a gateway serves real traffic
//! (managed simulator backends with GPU swaps, a crash and a request its fallback model serves, a
//! remote simulator, context caps, a rate-limited client, a full queue, and a real mlx_lm.server
//! answering a repeated prefix);
//! Prometheus scrapes it every second and loads the rules; then every panel target, every
//! annotation and every alert's signal (its expression without the trailing threshold) must
//! return at least one series through Prometheus's HTTP API (those reading what the GPU's time
//! goes to — swaps, starts, residency, footprint, fallbacks — a value other than zero), and
//! `promtool` must accept the rules and the shipped scrape config.
//!
//! `MLXGATE_DASHBOARDS=DIR` reads the three files from DIR instead of `dashboards/` (to try a
//! draft). `MLXGATE_DASHBOARD_PICTURE=out.png` also draws the dashboard with the traffic's data
//! through `scripts/render-dashboard` (Python and matplotlib; not run in CI).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::*;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const PROMETHEUS: &str = "/usr/bin/prometheus";
const PROMTOOL: &str = "/usr/bin/promtool";
const SIM: &str = env!("CARGO_BIN_EXE_mlxgate-sim");
/// A client without limits, and one allowed RATE_LIMITED_RPM requests a minute.
const AGENT_KEY: &str = "sk-agent-5d1c9e2f7a3b4e60";
const HASTY_KEY: &str = "sk-hasty-8b2e6f0a1c9d7e43";
const RATE_LIMITED_RPM: usize = 2;
/// The context cap of the `strict` (reject) and `squeeze` (middle_out) models' backend.
const CAP: usize = 256;
/// Rounds of steady traffic before the queries (each about a second or more: several scrapes).
const ROUNDS: usize = 6;

// ---- The files under test ----

fn dashboards_dir() -> PathBuf {
    std::env::var_os("MLXGATE_DASHBOARDS").map_or_else(|| Path::new(ROOT).join("dashboards"), PathBuf::from)
}

/// One query the dashboard or the rules make, with where it comes from (for failure messages).
#[derive(Debug, Clone)]
struct Query {
    origin: String,
    promql: String,
    /// Labels its legend names (`{{model}}`): each series returned must carry them (a query
    /// grouped by a misspelt label returns series without it). Checked with the variables set
    /// to `.+`, where every series was routed.
    legend: Vec<String>,
    /// What its values must be, by the panel's kind.
    values: Values,
}

/// The values a panel's query may return.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Values {
    Any,
    /// A ratio (unit percentunit): 0 to 1.
    Ratio,
    /// The state timeline's code: an integer 0 to 5, one state at a time.
    State,
}

/// Panels, with those nested in collapsed rows.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        out.push(panel);
        out.extend(panel["panels"].as_array().into_iter().flatten());
    }
    out
}

/// The labels a legend format names: `{{model}} p95` → `model`.
fn legend_labels(format: &str) -> Vec<String> {
    format.split("{{").skip(1).filter_map(|rest| rest.split("}}").next()).map(|l| l.trim().to_string()).collect()
}

/// Every panel target's and every annotation's expression, twice: variables at "All" (`.*`,
/// which also matches a label a series lacks) and at "any value" (`.+`, which a filter on a
/// misspelt label never matches).
fn dashboard_queries(dashboard: &Value) -> Vec<Query> {
    let mut out = Vec::new();
    for panel in panels(dashboard).into_iter().filter(|p| p["type"] != "row") {
        let values = if panel["type"] == "state-timeline" {
            Values::State
        } else if panel["fieldConfig"]["defaults"]["unit"] == "percentunit" {
            Values::Ratio
        } else {
            Values::Any
        };
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                let origin = format!("panel {:?} target {}", panel["title"].as_str().unwrap_or("?"), target["refId"]);
                let legend = legend_labels(target["legendFormat"].as_str().unwrap_or(""));
                for any in [".*", ".+"] {
                    let origin = format!("{origin} (variables {any})");
                    out.push(Query { origin, promql: substitute(expr, any), legend: legend.clone(), values });
                }
            }
        }
    }
    for annotation in dashboard["annotations"]["list"].as_array().into_iter().flatten() {
        if let Some(expr) = annotation["expr"].as_str() {
            let origin = format!("annotation {:?}", annotation["name"].as_str().unwrap_or("?"));
            let legend = legend_labels(annotation["textFormat"].as_str().unwrap_or(""));
            for any in [".*", ".+"] {
                let origin = format!("{origin} (variables {any})");
                out.push(Query { origin, promql: substitute(expr, any), legend: legend.clone(), values: Values::Any });
            }
        }
    }
    out
}

/// Grafana's variables as Grafana fills them with `any` for the model, backend and client
/// ("All" is `.*`) and a 5-minute view.
fn substitute(expr: &str, any: &str) -> String {
    let mut out = expr.to_string();
    for var in ["model", "backend", "client"] {
        for form in [format!("${{{var}:regex}}"), format!("${{{var}}}"), format!("[[{var}]]"), format!("${var}")] {
            out = out.replace(&form, any);
        }
    }
    for (var, value) in [
        ("$__rate_interval", "1m"),
        ("${__rate_interval}", "1m"),
        ("$__interval_ms", "15000"),
        ("${__interval}", "15s"),
        ("$__interval", "15s"),
        ("$__range_ms", "300000"),
        ("$__range_s", "300"),
        ("${__range}", "5m"),
        ("$__range", "5m"),
    ] {
        out = out.replace(var, value);
    }
    out
}

/// An alert's expression without its trailing ` OP NUMBER`: what it watches.
fn signal(expr: &str) -> String {
    let trimmed = expr.trim_end();
    let number = trimmed.trim_end_matches(|c: char| c.is_ascii_digit() || "+-.eE".contains(c));
    let before_op = number.trim_end();
    for op in [">=", "<=", "==", "!=", ">", "<"] {
        if number.len() < trimmed.len()
            && let Some(rest) = before_op.strip_suffix(op)
        {
            return rest.trim_end().to_string();
        }
    }
    panic!("alert expression without a trailing comparison to a number: {expr:?}");
}

/// Every alert's signal, from a rules file.
fn alert_signals(rules: &serde_yaml::Value) -> Vec<Query> {
    let mut out = Vec::new();
    for group in rules["groups"].as_sequence().into_iter().flatten() {
        for rule in group["rules"].as_sequence().into_iter().flatten() {
            let (Some(alert), Some(expr)) = (rule["alert"].as_str(), rule["expr"].as_str()) else { continue };
            let origin = format!("alert {alert}");
            out.push(Query { origin, promql: signal(expr), legend: Vec::new(), values: Values::Any });
        }
    }
    out
}

#[test]
fn signals_drop_only_the_trailing_threshold() {
    assert_eq!(signal("mlxgate_backend_up == 0"), "mlxgate_backend_up");
    assert_eq!(signal("sum(rate(x[5m])) > 0.5\n"), "sum(rate(x[5m]))");
    assert_eq!(signal("histogram_quantile(0.95, y) >= 1e1"), "histogram_quantile(0.95, y)");
    assert_eq!(substitute("rate(a{model=~\"$model\"}[$__rate_interval])", ".*"), "rate(a{model=~\".*\"}[1m])");
    assert_eq!(substitute("increase(b[$__range]) / $__interval_ms", ".+"), "increase(b[5m]) / 15000");
    assert_eq!(legend_labels("{{client}} {{ limit }}"), ["client", "limit"]);
}

// ---- promtool and Prometheus ----

/// Whether Prometheus is here: in CI it must be (scripts/setup-system installs it); elsewhere
/// the test says why it does not run.
fn prometheus_installed() -> bool {
    if Path::new(PROMETHEUS).is_file() && Path::new(PROMTOOL).is_file() {
        return true;
    }
    let why =
        format!("{PROMETHEUS} or {PROMTOOL} missing: run scripts/setup-system as root (Debian package prometheus)");
    assert!(std::env::var_os("CI").is_none(), "this test needs a real Prometheus: {why}");
    eprintln!("SKIPPED (no Prometheus here): {why}");
    false
}

fn promtool(args: &[&str]) {
    let out = std::process::Command::new(PROMTOOL).args(args).output().expect("promtool runs");
    assert!(
        out.status.success(),
        "promtool {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A Prometheus server on a free port of 127.0.0.1, killed when dropped.
struct Prometheus {
    child: std::process::Child,
    url: String,
    dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Starts one that scrapes `target` (host:port) every second and evaluates `rules`.
    fn start(target: &str, rules: &Path) -> Prometheus {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: ['{}']\n\
                 scrape_configs:\n  - job_name: mlxgate\n    static_configs: [{{targets: ['{target}']}}]\n",
                rules.display()
            ),
        )
        .expect("write config");
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
        let child = std::process::Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus starts");
        Prometheus { child, url: format!("http://127.0.0.1:{port}"), dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `/api/v1/query_range` over [start, now] at one-second steps: the series returned.
    async fn range(&self, promql: &str, start: f64) -> Result<Vec<Value>, String> {
        let end = now();
        let url = format!(
            "{}/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step=1",
            self.url,
            percent_encode(promql)
        );
        let body: Value =
            client().get(url).send().await.map_err(|e| e.to_string())?.json().await.map_err(|e| e.to_string())?;
        if body["status"] != "success" {
            return Err(format!("{}: {}", body["errorType"], body["error"]));
        }
        Ok(body["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// Waits until Prometheus is ready and has scraped the gateway.
    async fn wait_scraping(&self) {
        eventually("prometheus ready", || async {
            client().get(format!("{}/-/ready", self.url)).send().await.is_ok_and(|r| r.status() == 200)
        })
        .await;
        let start = now() - 60.0;
        eventually("the gateway scraped", || async {
            self.range("up{job=\"mlxgate\"} == 1", start).await.is_ok_and(|r| !r.is_empty())
        })
        .await;
    }
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

// ---- The gateway and its traffic ----

fn sha256_hex(key: &str) -> String {
    Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// A managed `mlxgate-sim` (a GPU backend, as managed backends are by default).
fn sim_backend(name: &str, port: u16) -> String {
    format!(
        "  {name}:\n    kind: custom\n    command: ['{SIM}', '--port', '{{port}}', '--style', 'mlx-lm']\n    \
         port: {port}\n    max_concurrency: 2\n    stop_timeout: 5s\n"
    )
}

/// GPU models `ma`/`mb` (managed sims on `ports`) and `mc` (on `mb`'s backend, falling back to
/// `ma`), `plain` on the remote `sim`, `strict` and `squeeze` behind a context cap, `narrow` with
/// a queue of one, and `qwen` on a real mlx_lm.server (off the GPU rotation, so the swaps do not
/// reload it).
fn gateway_yaml(sim_url: &str, ports: (u16, u16, u16), model_dir: &Path) -> String {
    let native = backend("native", "mlx-lm", model_dir, ports.2, "    gpu: false\n");
    let tokenizer = model_dir.display();
    format!(
        "swap_after: 1s\nauth: required\nclients:\n  agent: {{key_sha256: {}}}\n  \
         hasty: {{key_sha256: {}, limits: {{rpm: {RATE_LIMITED_RPM}}}}}\n\
         backends:\n{}{}{native}  \
         sim: {{url: '{sim_url}', max_concurrency: 4}}\n  \
         capped: {{url: '{sim_url}', max_concurrency: 4, context_cap: {CAP}}}\n  \
         single: {{url: '{sim_url}', max_concurrency: 1}}\n  \
         pa: {{url: '{sim_url}', max_concurrency: 2}}\n  \
         pb: {{url: '{sim_url}', max_concurrency: 2}}\n\
         models:\n  ma: {{backend: gpu-a, max_wait: 120s}}\n  mb: {{backend: gpu-b, max_wait: 120s}}\n  \
         mc: {{backend: gpu-b, max_wait: 120s, fallback: ma}}\n  \
         plain: {{backend: sim, upstream_model: tiny-qwen3}}\n  \
         strict: {{backend: capped, upstream_model: tiny-qwen3, on_overflow: reject, tokenizer: '{tokenizer}', default_max_tokens: 32}}\n  \
         squeeze: {{backend: capped, upstream_model: tiny-qwen3, on_overflow: middle_out, tokenizer: '{tokenizer}', default_max_tokens: 32}}\n  \
         narrow: {{backend: single, upstream_model: tiny-qwen3, max_queue: 1}}\n  \
         pair: {{backends: [pa, pb], upstream_model: tiny-qwen3}}\n  \
         qwen: {{backend: native, max_wait: 300s}}\n",
        sha256_hex(AGENT_KEY),
        sha256_hex(HASTY_KEY),
        sim_backend("gpu-a", ports.0),
        sim_backend("gpu-b", ports.1),
    )
}

fn ask(model: &str, stream: bool, content: &str, sim: Value) -> Value {
    json!({"model": model, "stream": stream, "max_tokens": 8, "stream_options": {"include_usage": true},
           "messages": [{"role": "user", "content": content}], "sim": sim})
}

async fn send(gw: &Gateway, key: &str, body: &Value) -> reqwest::Response {
    client().post(gw.url("/v1/chat/completions")).bearer_auth(key).json(body).send().await.expect("send")
}

/// Sends as the agent and reads the whole answer: its status and text.
async fn exchange(gw: &Gateway, body: &Value) -> (u16, String) {
    let r = send(gw, AGENT_KEY, body).await;
    let status = r.status().as_u16();
    (status, text_of(r).await)
}

async fn expect(gw: &Gateway, body: &Value, want: u16) -> String {
    let (status, text) = exchange(gw, body).await;
    assert_eq!(status, want, "{}: {text}", body["model"]);
    text
}

/// Words the tiny tokenizer knows: about one token each.
fn words(n: usize, seed: usize) -> String {
    const W: [&str; 8] = ["model", "token", "stream", "server", "gateway", "queue", "request", "cache"];
    (0..n).map(|i| W[(i * 5 + seed) % W.len()]).collect::<Vec<_>>().join(" ")
}

/// One round of the steady traffic: streams and whole answers on the remote simulator, a burst,
/// a usage mismatch, an answer without usage, a request of the rate-limited client, a prompt over
/// the cap refused and one cut middle-out, and the repeated prefix to the real mlx_lm.server.
/// Each event recurs in every round: a labelled counter appears at its first increment, and
/// `rate()` only sees the ones after Prometheus has scraped it once.
async fn traffic_round(gw: &Gateway, round: usize) {
    for stream in [true, false] {
        let body = ask("plain", stream, "hello", json!({"tokens": 6, "tokens_per_second": 200, "ttft_ms": 20}));
        expect(gw, &body, 200).await;
    }
    expect(gw, &ask("plain", true, "burst", json!({"tokens": 8, "burst": true})), 200).await;
    expect(gw, &ask("plain", true, "hidden", json!({"tokens": 4, "content_field": "none"})), 200).await;
    expect(gw, &ask("plain", true, "no usage", json!({"tokens": 4, "usage": "none"})), 200).await;
    let r = send(gw, HASTY_KEY, &ask("plain", false, "quick", json!({"tokens": 2}))).await;
    assert!([200, 429].contains(&r.status().as_u16()), "{}", r.status());
    text_of(r).await;
    overflows(gw).await;
    repeated_prefix(gw, round).await;
    conversation_on_two_backends(gw, round).await;
}

/// Two turns of a growing conversation to `pair`, a model of two backends (the simulator in
/// mlx_lm.server's style reports the prefix it shares with the previous prompt as cached): routing decisions, predicted and reported cached
/// tokens, the index and the backends' health.
async fn conversation_on_two_backends(gw: &Gateway, round: usize) {
    let mut messages = vec![
        json!({"role": "system", "content": format!("You are a coding agent. {}", words(80, 1))}),
        json!({"role": "user", "content": format!("task {round}: {}", words(20, round))}),
    ];
    for turn in 0..2 {
        let body = json!({"model": "pair", "stream": true, "max_tokens": 4, "stream_options": {"include_usage": true},
            "messages": messages, "sim": {"tokens": 3, "style": "mlx-lm"}});
        let text = expect(gw, &body, 200).await;
        assert!(text.contains("[DONE]"), "{text}");
        messages.push(json!({"role": "assistant", "content": "t0 t1 t2"}));
        messages.push(json!({"role": "user", "content": format!("next {turn}: {}", words(10, turn))}));
    }
}

/// Alternates the two GPU models (swaps: each start counted, each stop a residency, each server
/// measured), then kills gpu-a's server and is served by its restart; then asks for `mc`, whose
/// backend is stopped while the GPU serves `ma`: its fallback answers, without a swap.
async fn swap_and_crash(gw: &Gateway) {
    for model in ["ma", "mb", "ma", "mb", "ma"] {
        expect(gw, &ask(model, true, "hi", json!({"tokens": 4, "tokens_per_second": 100})), 200).await;
    }
    let pid = backend_state(gw, "gpu-a").await["pid"].as_u64().expect("gpu-a runs");
    let killed = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().expect("kill");
    assert!(killed.success());
    expect(gw, &ask("ma", false, "again", json!({"tokens": 3})), 200).await;
    let state = backend_state(gw, "gpu-a").await;
    assert!(state["restarts"].as_u64().is_some_and(|n| n >= 1), "{state}");
    let swaps = metric_sum(gw, "mlxgate_backend_swaps_total").await;
    let r = send(gw, AGENT_KEY, &ask("mc", false, "small and fast", json!({"tokens": 2}))).await;
    assert_eq!(r.status().as_u16(), 200);
    let served_by = r.headers().get("x-mlxgate-fallback").and_then(|v| v.to_str().ok()).map(str::to_owned);
    assert_eq!(served_by.as_deref(), Some("ma"), "mc's fallback answered");
    text_of(r).await;
    assert_eq!(metric_sum(gw, "mlxgate_backend_swaps_total").await, swaps, "a fallback, not a swap");
}

/// A prompt over the cap refused, and a long conversation cut middle-out.
async fn overflows(gw: &Gateway) {
    let long = ask("strict", false, &words(CAP * 2, 0), json!({}));
    expect(gw, &long, 400).await;
    let mut messages = vec![json!({"role": "system", "content": "you are a gateway"})];
    for i in 0..12 {
        messages.push(json!({"role": "user", "content": words(30, i)}));
        messages.push(json!({"role": "assistant", "content": words(30, i + 1)}));
    }
    messages.push(json!({"role": "user", "content": "last question"}));
    let squeezed = json!({"model": "squeeze", "max_tokens": 16, "messages": messages, "sim": {"tokens": 3}});
    expect(gw, &squeezed, 200).await;
}

/// One request held at the single-slot backend, one queued, and one refused with 503.
async fn queue_full(gw: &Gateway, sim: &mlxgate::sim::SimHandle) {
    let mut held = send(gw, AGENT_KEY, &ask("narrow", true, "hold", json!({"hold_after": 1, "hold_key": "q"}))).await;
    read_until(&mut held, "t0 ").await;
    let queued = tokio::spawn({
        let (url, body) = (gw.url("/v1/chat/completions"), ask("narrow", false, "wait", json!({"tokens": 2})));
        async move { client().post(url).bearer_auth(AGENT_KEY).json(&body).send().await.map(|r| r.status()) }
    });
    eventually("one queued", || async { metric(gw, "mlxgate_queue_depth{model=\"narrow\"}").await == Some(1.0) }).await;
    expect(gw, &ask("narrow", false, "full", json!({})), 503).await;
    client().post(format!("{}/sim/release/q", sim.url())).send().await.expect("release");
    assert!(text_of(held).await.contains("[DONE]"));
    assert_eq!(queued.await.expect("join").expect("send").as_u16(), 200);
}

/// The same long prefix to the real mlx_lm.server, with a different last question each time.
async fn repeated_prefix(gw: &Gateway, round: usize) {
    let prefix = format!("You are a coding agent. Project notes: {}", words(300, 3));
    let body = json!({"model": "qwen", "stream": round.is_multiple_of(2), "max_tokens": 4,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "system", "content": prefix}, {"role": "user", "content": format!("step {round}")}]});
    let (status, text) = exchange(gw, &body).await;
    assert_eq!(status, 200, "mlx_lm.server: {text}; backend: {}", backend_state(gw, "native").await);
}

// ---- The check ----

/// Polls every query (range queries over [start, now], as Grafana sends for time series and
/// annotations) until each returns a series or PATIENCE runs out, sending a little traffic
/// between rounds so rates have fresh samples; returns the queries still empty, with why.
async fn still_empty(prom: &Prometheus, gw: &Gateway, queries: &[Query], start: f64) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut pending: Vec<&Query> = queries.iter().collect();
    let mut why = std::collections::HashMap::new();
    let mut round = ROUNDS + 1;
    loop {
        let mut left = Vec::new();
        for q in pending {
            match prom.range(&q.promql, start).await {
                Ok(series) if !series.is_empty() => {}
                Ok(_) => {
                    why.insert(q.origin.clone(), "no series".to_string());
                    left.push(q);
                }
                Err(e) => {
                    why.insert(q.origin.clone(), format!("error {e}"));
                    left.push(q);
                }
            }
        }
        pending = left;
        if pending.is_empty() || tokio::time::Instant::now() >= deadline {
            break;
        }
        traffic_round(gw, round).await;
        round += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    pending.iter().map(|q| format!("{} [{}]: {}", q.origin, why[&q.origin], q.promql)).collect()
}

/// What is wrong with the series each query returns: a legend label missing from a series
/// (checked with the variables at `.+`), a ratio outside 0..1, a state code that is not one of
/// the six (or two states at once).
async fn wrong_values(prom: &Prometheus, queries: &[Query], start: f64) -> Vec<String> {
    let mut wrong = Vec::new();
    for q in queries {
        let Ok(series) = prom.range(&q.promql, start).await else { continue };
        for one in &series {
            let labels = &one["metric"];
            if q.origin.ends_with("(variables .+)") {
                for label in &q.legend {
                    if labels[label].as_str().is_none_or(str::is_empty) {
                        wrong.push(format!("{}: a series without its legend's label {label:?}: {labels}", q.origin));
                    }
                }
            }
            let values = one["values"].as_array().into_iter().flatten().filter_map(|v| v[1].as_str());
            for value in values.filter_map(|v| v.parse::<f64>().ok()).filter(|v| !v.is_nan()) {
                let fine = match q.values {
                    Values::Any => true,
                    Values::Ratio => (0.0..=1.0 + 1e-9).contains(&value),
                    Values::State => value.fract() == 0.0 && (0.0..=5.0).contains(&value),
                };
                if !fine {
                    wrong.push(format!("{}: value {value} out of range for {:?}: {labels}", q.origin, q.values));
                    break;
                }
            }
        }
    }
    wrong
}

/// The metrics of what the GPU's time goes to (swaps by reason, time spent starting, residency,
/// footprint, fallbacks): series of them exist from the start at 0, so returning data proves
/// little; the traffic makes each move, and every query reading one must show it.
const MOVED_BY_THE_TRAFFIC: [&str; 5] = [
    "mlxgate_backend_swaps_total",
    "mlxgate_backend_starting_seconds_total",
    "mlxgate_backend_residency_seconds",
    "mlxgate_backend_footprint_bytes",
    "mlxgate_model_fallbacks_total",
];

/// The queries reading one of MOVED_BY_THE_TRAFFIC (variables at "All") that never show a value
/// other than zero.
async fn never_moved(prom: &Prometheus, queries: &[Query], start: f64) -> Vec<String> {
    let mut flat = Vec::new();
    for q in queries.iter().filter(|q| !q.origin.ends_with("(variables .+)")) {
        if !MOVED_BY_THE_TRAFFIC.iter().any(|m| q.promql.contains(m)) {
            continue;
        }
        let series = prom.range(&q.promql, start).await.unwrap_or_default();
        let moved = series
            .iter()
            .flat_map(|one| one["values"].as_array().cloned().unwrap_or_default())
            .any(|v| v[1].as_str().and_then(|v| v.parse::<f64>().ok()).is_some_and(|v| v.is_finite() && v != 0.0));
        if !moved {
            flat.push(format!("{}: {}", q.origin, q.promql));
        }
    }
    flat
}

fn render_picture(prom: &Prometheus, dashboard: &Path, start: f64, out: &Path) {
    let status = std::process::Command::new(Path::new(ROOT).join("scripts/render-dashboard"))
        .args(["--prometheus", &prom.url, "--dashboard"])
        .arg(dashboard)
        .args(["--start", &format!("{start:.0}"), "--end", &format!("{:.0}", now()), "--out"])
        .arg(out)
        .status()
        .expect("scripts/render-dashboard runs");
    assert!(status.success(), "scripts/render-dashboard failed");
    eprintln!("dashboard picture: {}", out.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_annotation_and_alert_query_returns_data_from_a_real_prometheus() {
    if !prometheus_installed() {
        return;
    }
    let Some(model_dir) = prerequisites(&["mlx-lm"]) else { return };
    let dir = dashboards_dir();
    let (dashboard_path, rules_path) = (dir.join("mlxgate.json"), dir.join("alerts.yml"));
    promtool(&["check", "rules", &rules_path.to_string_lossy()]);
    promtool(&["check", "config", &dir.join("prometheus.yml").to_string_lossy()]);
    if dir.join("alerts_test.yml").is_file() {
        promtool(&["test", "rules", &dir.join("alerts_test.yml").to_string_lossy()]);
    }
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(&dashboard_path).expect("dashboard")).expect("dashboard JSON");
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&rules_path).expect("rules")).expect("rules YAML");
    let mut queries = dashboard_queries(&dashboard);
    queries.extend(alert_signals(&rules));
    assert!(queries.len() > 10, "the dashboard and rules hold queries: {queries:?}");

    let sim = sim().await;
    let gw = gateway(&gateway_yaml(&sim.url(), (free_port(), free_port(), free_port()), &model_dir)).await;
    let prom = Prometheus::start(&gw.addr.to_string(), &rules_path);
    let start = now() - 5.0;
    prom.wait_scraping().await;

    traffic_round(&gw, 0).await;
    swap_and_crash(&gw).await;
    queue_full(&gw, &sim).await;
    for round in 1..=ROUNDS {
        traffic_round(&gw, round).await;
    }
    let refused = metric(&gw, "mlxgate_rate_limited_total{client=\"hasty\",limit=\"rpm\"}").await;
    assert!(refused.is_some_and(|n| n >= 1.0), "the hasty client was refused: {refused:?}");

    let empty = still_empty(&prom, &gw, &queries, start).await;
    let wrong = wrong_values(&prom, &queries, start).await;
    let flat = never_moved(&prom, &queries, start).await;
    if let Some(out) = std::env::var_os("MLXGATE_DASHBOARD_PICTURE") {
        // For the picture, a few minutes of the same traffic (MLXGATE_DASHBOARD_SECONDS, 180 by
        // default), with a swap and a crash every minute, so the panels show a session.
        let seconds: u64 = std::env::var("MLXGATE_DASHBOARD_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(180);
        let until = tokio::time::Instant::now() + Duration::from_secs(seconds);
        let mut round = 100;
        while tokio::time::Instant::now() < until {
            traffic_round(&gw, round).await;
            if round % 40 == 0 {
                swap_and_crash(&gw).await;
            }
            round += 1;
            tokio::time::sleep(Duration::from_millis(400 + 600 * (round % 3) as u64)).await;
        }
        render_picture(&prom, &dashboard_path, start, Path::new(&out));
    }
    assert!(
        empty.is_empty(),
        "{} of {} queries returned no data:\n{}\n(prometheus log tail: {})",
        empty.len(),
        queries.len(),
        empty.join("\n"),
        prom.log().lines().rev().take(5).collect::<Vec<_>>().join(" | ")
    );
    assert!(wrong.is_empty(), "queries whose series are wrong:\n{}", wrong.join("\n"));
    assert!(flat.is_empty(), "queries the traffic should have moved, flat at zero:\n{}", flat.join("\n"));
}
