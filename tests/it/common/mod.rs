//! Shared helpers: start the real router on port 0 in front of in-process simulators, and read
//! what comes back.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt;
use mlxgate::Config;
use mlxgate::sim::{self, Behaviour, SimConfig, SimHandle};
use serde_json::Value;
use tokio::sync::oneshot;

pub mod browser;

/// Longest a test waits for something that must happen; a failure, not a speed bound.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// A gateway running in this process.
pub struct Gateway {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    pub task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Gateway {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Sends the shutdown signal (as SIGTERM would).
    pub fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts the gateway from YAML text (listen is forced to 127.0.0.1:0).
pub async fn gateway(yaml: &str) -> Gateway {
    gateway_on(yaml, SocketAddr::from(([127, 0, 0, 1], 0))).await
}

/// A simulator with `defaults` and otherwise default settings.
pub async fn sim_with(defaults: Behaviour) -> SimHandle {
    sim::spawn(SimConfig { defaults, ..Default::default() }).await.expect("sim starts")
}

pub async fn sim() -> SimHandle {
    sim_with(Behaviour::default()).await
}

/// A gateway with one backend at `url` and one model `qwen` → `tiny-qwen3`.
pub fn one_model_yaml(url: &str, max_concurrency: usize, max_queue: usize) -> String {
    format!(
        "backends:\n  local: {{url: '{url}', max_concurrency: {max_concurrency}}}\n\
         models:\n  qwen: {{backend: local, upstream_model: tiny-qwen3, max_queue: {max_queue}, max_wait: 120s}}\n"
    )
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().build().expect("client")
}

/// A chat request body for `qwen`, streaming or not, with a `sim` object.
pub fn chat(stream: bool, sim: Value) -> Value {
    serde_json::json!({
        "model": "qwen",
        "stream": stream,
        "messages": [{"role": "user", "content": "hello there"}],
        "sim": sim,
    })
}

/// Reads a response body until `needle` appears; returns everything read.
pub async fn read_until(response: &mut reqwest::Response, needle: &str) -> String {
    let mut seen = String::new();
    let found = tokio::time::timeout(PATIENCE, async {
        while !seen.contains(needle) {
            match response.chunk().await {
                Ok(Some(chunk)) => seen.push_str(&String::from_utf8_lossy(&chunk)),
                _ => return false,
            }
        }
        true
    })
    .await;
    assert!(matches!(found, Ok(true)), "never saw {needle:?}; got {seen:?}");
    seen
}

/// Polls `f` until it returns true (bounded by PATIENCE).
pub async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !f().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The value of a metric line `name{labels} value` in the gateway's /metrics.
pub async fn metric(gw: &Gateway, series: &str) -> Option<f64> {
    let text = client().get(gw.url("/metrics")).send().await.ok()?.text().await.ok()?;
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The sum of every series of a metric family (`name` alone or with any labels).
pub async fn metric_sum(gw: &Gateway, name: &str) -> Option<f64> {
    let text = client().get(gw.url("/metrics")).send().await.ok()?.text().await.ok()?;
    let values: Vec<f64> = text
        .lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{')))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// The simulator's /sim/stats.
pub async fn sim_stats(sim: &SimHandle) -> Value {
    client().get(format!("{}/sim/stats", sim.url())).send().await.expect("stats").json().await.expect("json")
}

/// Collects an SSE body into its `data:` payloads.
pub fn data_lines(body: &str) -> Vec<String> {
    body.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_string).collect()
}

/// Collects a whole streamed body as text.
pub async fn text_of(response: reqwest::Response) -> String {
    let mut stream = response.bytes_stream();
    let mut out = Vec::new();
    while let Some(Ok(chunk)) = stream.next().await {
        out.extend_from_slice(&chunk);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// POSTs `body` as JSON to the gateway's `path`.
pub async fn post(gw: &Gateway, path: &str, body: &Value) -> reqwest::Response {
    client().post(gw.url(path)).json(body).send().await.expect("send")
}

/// Pids of live processes whose command line contains every one of `needles`
/// (from /proc; zombies, which hold no resources, are not counted).
pub fn processes_with(needles: &[&str]) -> Vec<u32> {
    live_processes(|cmdline| needles.iter().all(|n| cmdline.contains(n))).into_iter().map(|(pid, _)| pid).collect()
}

/// `(pid, process group)` of the live processes whose command line (its arguments joined by
/// spaces) passes `wanted`. Each process is judged on one reading of its command line: read
/// twice, a process could pass the first reading and exit before the second, and a process
/// that has exited (a zombie) reads as an empty command line, which tells nothing about it.
fn live_processes(wanted: impl Fn(&str) -> bool) -> Vec<(u32, u32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return vec![] };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
            if cmdline.is_empty() || !wanted(&cmdline) {
                return None;
            }
            // Fields after the command name: state, ppid, pgrp.
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let mut fields = stat.rsplit(')').next()?.split_whitespace();
            let state = fields.next()?;
            let group: u32 = fields.nth(1)?.parse().ok()?;
            // A process being torn down (state X, or Z) reads as group 0: never a server's.
            (state != "Z" && state != "X" && group > 1).then_some((pid, group))
        })
        .collect()
}

/// SIGKILL to the process group `group` — only when it is a live group a test may kill: its
/// leader alive and leading it, and not this test's own group. A bogus group is refused, never
/// signalled: `kill(-0)` is the caller's own group (in CI, the test runner's), and `kill(-1)`
/// every process the caller may signal (as root: the whole machine, the CI run included).
pub fn kill_group(group: u32) {
    let leads = |pid: u32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let mut fields = stat.rsplit(')').next()?.split_whitespace();
        let dead = matches!(fields.next()?, "Z" | "X");
        let group: u32 = fields.nth(1)?.parse().ok()?;
        Some((dead, group))
    };
    let own = leads(std::process::id()).map(|(_, g)| g);
    let Some((dead, leader_group)) = leads(group) else { return };
    if group <= 1 || Some(group) == own || leader_group != group || dead {
        return;
    }
    let Ok(raw) = i32::try_from(group) else { return };
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(raw), nix::sys::signal::Signal::SIGKILL);
}

/// A TCP port on 127.0.0.1 that no other test takes, for a server a test starts later.
///
/// Ports come from 20000–32767, below Linux's ephemeral range (32768–60999), so no port-0 bind
/// or outgoing connection of a concurrently running test is handed the same number between this
/// call and the server's bind. Each port is claimed with a lock file (created exclusively) that
/// holds for an hour, so tests running in parallel processes never share one; and it is free
/// (bindable) when this returns.
pub fn free_port() -> u16 {
    use std::time::SystemTime;
    let dir = std::env::temp_dir().join("mlxgate-test-ports");
    std::fs::create_dir_all(&dir).expect("port lock directory");
    let seed = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let mut candidate = 20_000 + (seed ^ std::process::id().wrapping_mul(7919)) % 12_768;
    for _ in 0..12_768 {
        candidate = 20_000 + (candidate - 20_000 + 7) % 12_768;
        let port = candidate as u16;
        let lock = dir.join(port.to_string());
        let stale = std::fs::metadata(&lock)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > Duration::from_secs(3600)));
        if stale {
            let _ = std::fs::remove_file(&lock);
        }
        if std::fs::OpenOptions::new().write(true).create_new(true).open(&lock).is_err() {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port left in 20000-32767");
}

/// GET `/admin/backends` entry for `name`.
pub async fn backend_state(gw: &Gateway, name: &str) -> Value {
    let all: Value = client().get(gw.url("/admin/backends")).send().await.expect("send").json().await.expect("json");
    all["backends"].as_array().and_then(|l| l.iter().find(|b| b["name"] == name).cloned()).unwrap_or(Value::Null)
}

/// Live servers: the process groups of processes whose command line contains `program` and
/// `arg`. Each managed server leads a group of its own, so a server that forks (a subprocess
/// call between fork and exec has the parent's command line) still counts once, and the group
/// id is the server's pid. Keepers, whose command lines contain the server's, are not counted:
/// told apart on the same reading of the command line that matched them (a keeper that exited
/// between two readings read as an empty command line the second time, and so as no keeper,
/// and was counted as a server: the flaky failure of
/// `lifecycle::during_the_shutdown_grace_a_crash_is_not_restarted…`).
pub fn servers(program: &str, arg: &str) -> Vec<u32> {
    let mut groups: Vec<u32> = live_processes(|cmdline| {
        cmdline.contains(program) && cmdline.contains(arg) && !cmdline.contains(" keep --grace ")
    })
    .into_iter()
    .map(|(_, group)| group)
    .collect();
    groups.sort_unstable();
    groups.dedup();
    groups
}

/// `pid ppid state cmdline` of a process, for failure messages.
pub fn describe_process(pid: u32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("").split_whitespace().take(3).collect::<Vec<_>>().join(" ");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    format!("{pid} [{after}] {}", String::from_utf8_lossy(&cmdline).replace('\0', " "))
}

// ---- Real MLX servers (venvs from scripts/setup-backends, the generated tiny model) ----

/// The repository root.
pub const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The tiny model's directory, if the venvs for `servers` and the model exist. A missing piece
/// fails the test, saying how to build it (`scripts/test` builds them all); only with
/// `MLXGATE_SKIP_REAL_SERVERS=1` (and never in CI) does the test print why it does not run and
/// return `None`.
pub fn prerequisites(servers: &[&str]) -> Option<PathBuf> {
    let model = Path::new(ROOT).join(".cache/tiny-qwen3");
    let mut missing: Vec<String> = servers
        .iter()
        .filter(|s| !Path::new(ROOT).join(format!(".venv-{s}/bin")).is_dir())
        .map(|s| format!(".venv-{s}"))
        .collect();
    if !model.join("model.safetensors").is_file() {
        missing.push(".cache/tiny-qwen3".into());
    }
    if missing.is_empty() {
        return Some(model);
    }
    let why = format!("missing {}: run scripts/setup-backends {}", missing.join(", "), servers.join(" "));
    let skip = std::env::var_os("MLXGATE_SKIP_REAL_SERVERS").is_some_and(|v| v == "1");
    assert!(skip && std::env::var_os("CI").is_none(), "this test needs the real servers: {why}");
    eprintln!("SKIPPED (MLXGATE_SKIP_REAL_SERVERS=1, no real server here): {why}");
    None
}

pub fn backend(name: &str, kind: &str, model: &Path, port: u16, extra: &str) -> String {
    // vllm-mlx without --continuous-batching serves one request at a time (its profile refuses more).
    let max_concurrency = if kind == "vllm-mlx" { 1 } else { 2 };
    format!(
        "  {name}:\n    kind: {kind}\n    model: '{}'\n    venv: '{ROOT}/.venv-{kind}'\n    port: {port}\n    \
         max_concurrency: {max_concurrency}\n    stop_timeout: 10s\n    ready: {{timeout: 180s}}\n{extra}",
        model.display()
    )
}

pub fn config(backends: &[String], models: &[(&str, &str)], top: &str) -> String {
    let models: String = models.iter().map(|(m, b)| format!("  {m}: {{backend: {b}, max_wait: 300s}}\n")).collect();
    format!("{top}backends:\n{}models:\n{models}", backends.concat())
}

/// `mlxgate serve` as a separate process (for signals), killed when dropped.
pub struct GatewayBinary {
    pub child: std::process::Child,
    pub url: String,
    /// The log lines written up to the one the start waited for.
    pub startup_log: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Drop for GatewayBinary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl GatewayBinary {
    /// Waits (off the async runtime) for the process to exit, and returns its status.
    pub async fn exit_status(mut self) -> std::process::ExitStatus {
        tokio::task::spawn_blocking(move || self.child.wait().expect("wait")).await.expect("join")
    }
}

/// Starts `mlxgate serve` on `config` (listening on a free port), reading its log until it
/// serves and, if given, until a line containing `wait_for`; the rest of the log is drained.
pub fn gateway_binary(config: &str, wait_for: Option<&str>) -> GatewayBinary {
    gateway_binary_under(config, wait_for, None)
}

/// As [`gateway_binary`], in a shell that first runs `ulimit {ulimit}` when given (for example
/// `-n 256`, soft and hard, or `-Sn 256`, soft only).
pub fn gateway_binary_under(config: &str, wait_for: Option<&str>, ulimit: Option<&str>) -> GatewayBinary {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gateway.yaml");
    std::fs::write(&path, format!("listen: 127.0.0.1:0\n{config}")).expect("write config");
    let mut command = std::process::Command::new("sh");
    command
        .arg("-c")
        .arg(format!(
            "{}exec \"$0\" serve --config \"$1\"",
            ulimit.map_or(String::new(), |u| format!("ulimit {u} && "))
        ))
        .arg(env!("CARGO_BIN_EXE_mlxgate"))
        .arg(&path);
    let mut child =
        command.env("RUST_LOG", "info").stderr(std::process::Stdio::piped()).spawn().expect("gateway starts");
    let mut reader = BufReader::new(child.stderr.take().expect("stderr"));
    let mut startup_log: Vec<String> = Vec::new();
    let mut url = None;
    while url.is_none() || wait_for.is_some_and(|w| !startup_log.last().is_some_and(|l| l.contains(w))) {
        let mut line = String::new();
        assert!(reader.read_line(&mut line).expect("log") > 0, "gateway exited early: {startup_log:?}");
        if let Some(rest) = line.split("listen=").nth(1) {
            url = rest.split_whitespace().next().map(|addr| format!("http://{addr}"));
        }
        startup_log.push(line);
    }
    // Keep draining the log so the gateway never blocks on a full pipe.
    std::thread::spawn(move || for _ in reader.lines() {});
    GatewayBinary { child, url: url.expect("url"), startup_log, _dir: dir }
}

/// Counts, on a thread of its own, the most servers seen alive at once: processes whose command
/// line contains `program` and one of `args` (see [`servers`]), until [`ServerWatch::peak`].
pub struct ServerWatch {
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    peak: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServerWatch {
    pub fn start(program: &'static str, args: Vec<String>) -> Self {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let peak = std::sync::Arc::new(AtomicUsize::new(0));
        let thread = std::thread::spawn({
            let (done, peak) = (std::sync::Arc::clone(&done), std::sync::Arc::clone(&peak));
            move || {
                while !done.load(Ordering::SeqCst) {
                    let alive: usize = args.iter().map(|a| servers(program, a).len()).sum();
                    peak.fetch_max(alive, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        });
        ServerWatch { done, peak, thread: Some(thread) }
    }

    /// Stops watching; the most servers seen alive at once.
    pub fn peak(mut self) -> usize {
        use std::sync::atomic::Ordering;
        self.done.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().expect("watcher");
        }
        self.peak.load(Ordering::SeqCst)
    }
}

/// As [`gateway`], listening on `bind` (an address of this machine, port 0 for any).
pub async fn gateway_on(yaml: &str, bind: SocketAddr) -> Gateway {
    let config = Config::parse(yaml, &|_| None).expect("test config is valid");
    let listener = tokio::net::TcpListener::bind(bind).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let keeper = std::path::PathBuf::from(env!("CARGO_BIN_EXE_mlxgate"));
    let task = tokio::spawn(mlxgate::serve(
        config,
        listener,
        async move {
            let _ = stopped.await;
        },
        keeper,
    ));
    Gateway { addr, stop: Some(stop), task }
}

/// This machine's address on the interface of its default route (not loopback), if it has one:
/// a client connecting to it from here is seen as that address, not as 127.0.0.1.
pub fn non_loopback_address() -> Option<std::net::IpAddr> {
    // A UDP connect sends nothing; it only picks the source address of the route.
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.1:9").or_else(|_| socket.connect("10.255.255.1:9")).ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// The log lines of a [`gateway_binary_logged`], as they arrive.
pub type LogLines = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// `mlxgate serve` on `config` (listening on a free port) with `RUST_LOG={rust_log}` and the
/// extra environment `env`; every log line is kept, for tests of what is (not) logged.
pub fn gateway_binary_logged(config: &str, env: &[(&str, &str)], rust_log: &str) -> (GatewayBinary, LogLines) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gateway.yaml");
    std::fs::write(&path, format!("listen: 127.0.0.1:0\n{config}")).expect("write config");
    serve_logged(&path, env, rust_log, dir)
}

/// `mlxgate serve --config {path}` (a file the test writes, and may rewrite to reload it) with
/// `RUST_LOG=info` and the extra environment `env`; every log line is kept.
pub fn gateway_binary_at(path: &Path, env: &[(&str, &str)]) -> (GatewayBinary, LogLines) {
    serve_logged(path, env, "info", tempfile::tempdir().expect("tempdir"))
}

/// Starts `mlxgate serve --config {path}` and keeps its log lines (read on a thread of their
/// own) until it says where it listens; `dir` lives as long as the gateway.
fn serve_logged(
    path: &Path,
    env: &[(&str, &str)],
    rust_log: &str,
    dir: tempfile::TempDir,
) -> (GatewayBinary, LogLines) {
    use std::io::{BufRead, BufReader};
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mlxgate"))
        .arg("serve")
        .arg("--config")
        .arg(path)
        .envs(env.iter().copied())
        .env("RUST_LOG", rust_log)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("gateway starts");
    let reader = BufReader::new(child.stderr.take().expect("stderr"));
    let lines: LogLines = Default::default();
    let (found, url) = std::sync::mpsc::channel();
    std::thread::spawn({
        let lines = std::sync::Arc::clone(&lines);
        move || {
            for line in reader.lines().map_while(Result::ok) {
                // `listen=…` in text lines, `"listen":"…"` in JSON ones (--log-format json).
                let text = line.split("listen=").nth(1).and_then(|r| r.split_whitespace().next());
                let json = || line.split("\"listen\":\"").nth(1).and_then(|r| r.split('"').next());
                if let Some(addr) = text.or_else(json) {
                    let _ = found.send(format!("http://{addr}"));
                }
                lines.lock().expect("log lines").push(line);
            }
        }
    });
    let Ok(url) = url.recv_timeout(PATIENCE) else {
        // Not left running behind a failed test.
        let _ = child.kill();
        let _ = child.wait();
        panic!("gateway never served: {:?}", lines.lock());
    };
    (GatewayBinary { child, url, startup_log: vec![], _dir: dir }, lines)
}

/// The request bodies the simulator received last (its `/sim/requests`).
pub async fn sim_requests(sim: &SimHandle) -> Vec<Value> {
    client().get(format!("{}/sim/requests", sim.url())).send().await.expect("requests").json().await.expect("json")
}

/// A child process killed and reaped when dropped.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the `mlxgate-sim` binary with `args` (port 0 unless given); the process and the base
/// URL it prints.
pub fn spawn_sim(args: &[&str]) -> (KillOnDrop, String) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mlxgate-sim"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sim starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line).expect("address line");
    let url = line.trim().rsplit(' ').next().expect("url").to_string();
    (KillOnDrop(child), url)
}

/// An error body with its `error.request_id` removed, after checking it is there (every error
/// the gateway makes carries the request's id): what is left is OpenAI's own shape.
pub fn without_request_id(mut body: Value) -> Value {
    let id = body["error"].as_object_mut().and_then(|e| e.remove("request_id"));
    assert!(id.as_ref().and_then(Value::as_str).is_some_and(|id| !id.is_empty()), "no request_id in {body}");
    body
}

/// A plain access-log line's `key=value` fields (`None` for any other line) (values quoted with `"` when they are strings with
/// escapes, else bare).
pub fn access_fields(line: &str) -> Option<HashMap<String, Value>> {
    let rest = line.split_once("mlxgate::access: ")?.1;
    let mut fields = HashMap::new();
    let mut chars = rest.chars().peekable();
    while chars.peek().is_some() {
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            value.push(chars.next().expect("quote"));
            while let Some(c) = chars.next() {
                value.push(c);
                if c == '\\' {
                    value.extend(chars.next());
                } else if c == '"' {
                    break;
                }
            }
            chars.next_if_eq(&' ');
            fields.insert(key.trim().to_string(), serde_json::from_str(&value).expect("quoted value"));
        } else {
            value = chars.by_ref().take_while(|&c| c != ' ').collect();
            let parsed = serde_json::from_str::<Value>(&value).ok().filter(|v| v.is_number() || v.is_boolean());
            fields.insert(key.trim().to_string(), parsed.unwrap_or(Value::String(value)));
        }
    }
    Some(fields)
}

/// The Python of `venv` (a directory at the repository's root) when it can import the openai
/// SDK. Missing, the test fails saying to run `setup` (the script that builds the venv), unless
/// `MLXGATE_SKIP_REAL_SERVERS=1` (never in CI): then it prints why it does not run.
pub fn openai_sdk_python(venv: &str, setup: &str) -> Option<PathBuf> {
    let python = PathBuf::from(ROOT).join(venv).join("bin/python");
    let has_sdk = python.is_file()
        && std::process::Command::new(&python).args(["-c", "import openai"]).status().is_ok_and(|s| s.success());
    if has_sdk {
        return Some(python);
    }
    let why = format!("no {venv} with the openai SDK: run {setup}");
    let skip = std::env::var_os("MLXGATE_SKIP_REAL_SERVERS").is_some_and(|v| v == "1");
    assert!(skip && std::env::var_os("CI").is_none(), "this test needs the openai SDK: {why}");
    eprintln!("SKIPPED (MLXGATE_SKIP_REAL_SERVERS=1): {why}");
    None
}

/// The tiny model's files in `dir`, its chat template replaced by Qwen3's (the real template's
/// tool, reasoning and system rendering, on the tiny model's weights).
pub fn model_with_qwen3_template(model: &Path, dir: &Path) {
    for entry in std::fs::read_dir(model).expect("model dir") {
        let entry = entry.expect("entry");
        let name = entry.file_name();
        if name != "tokenizer_config.json" {
            std::os::unix::fs::symlink(entry.path(), dir.join(&name)).expect("symlink");
        }
    }
    let config = std::fs::read_to_string(model.join("tokenizer_config.json")).expect("tokenizer_config");
    let mut config: Value = serde_json::from_str(&config).expect("json");
    let template =
        std::fs::read_to_string(Path::new(ROOT).join("scripts/qwen3-chat-template.jinja")).expect("template");
    config["chat_template"] = Value::from(template);
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).expect("write");
}

/// Runs `bench/NAME --self-test` (a benchmark's pure pieces: their unit tests on canned figures,
/// no process started) and checks it passed with at least `least` tests.
pub fn bench_self_test(name: &str, least: usize) {
    let out = std::process::Command::new("python3")
        .arg(format!("{ROOT}/bench/{name}"))
        .arg("--self-test")
        .output()
        .expect("python3 runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench/{name} --self-test failed:\n{stderr}");
    let ran: usize = stderr
        .lines()
        .find_map(|l| l.strip_prefix("Ran ")?.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no test count in:\n{stderr}"));
    assert!(ran >= least, "{ran} tests ran:\n{stderr}");
}

/// A streamed chat request for `model` that the simulator holds after its first token until
/// `POST /sim/release/{key}`: the answer's first token is read, the rest waits.
pub async fn held_stream(gw: &Gateway, model: &str, key: &str) -> reqwest::Response {
    let body = serde_json::json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "hi"}],
                      "sim": {"hold_after": 1, "hold_key": key}});
    let mut held = post(gw, "/v1/chat/completions", &body).await;
    read_until(&mut held, "t0 ").await;
    held
}
