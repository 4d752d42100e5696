//! A managed backend's process lifecycle under faults: its keeper killed with SIGKILL, another
//! process on its port, a venv or program that is missing (at `check`, at `serve`, and after
//! start), a server that hangs (its health probe restarts it), a server that writes invalid
//! UTF-8 and endless lines, and an operator's restart during the crash backoff. Servers are
//! `mlxgate-sim` processes (`kind: custom`), and mlx_lm.server once for the keeper's death.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::common::*;
use serde_json::{Value, json};

const SIM: &str = env!("CARGO_BIN_EXE_mlxgate-sim");
const MLXGATE: &str = env!("CARGO_BIN_EXE_mlxgate");

/// A managed sim backend named `name` on `port`, serving model `name`.
fn sim_backend(name: &str, port: u16, extra: &str) -> String {
    format!(
        "  {name}:\n    kind: custom\n    command: ['{SIM}', '--port', '{{port}}', '--style', 'mlx-lm']\n    \
         port: {port}\n    max_concurrency: 2\n    stop_timeout: 5s\n{extra}"
    )
}

/// A managed backend `name` on `port` whose server is the shell `script` (`{port}` filled in).
fn shell_backend(name: &str, port: u16, script: &str) -> String {
    format!("  {name}:\n    kind: custom\n    command: [sh, -c, '{script}']\n    port: {port}\n")
}

fn yaml(backends: &[String], models: &[(&str, &str)]) -> String {
    let models: String = models.iter().map(|(m, b)| format!("  {m}: {{backend: {b}, max_wait: 120s}}\n")).collect();
    format!("backends:\n{}models:\n{models}", backends.concat())
}

fn ask(model: &str) -> Value {
    json!({"model": model, "stream": false, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
}

fn pid_of(state: &Value) -> u32 {
    state["pid"].as_u64().and_then(|p| u32::try_from(p).ok()).expect("a pid")
}

fn signal(name: &str, pid: u32) {
    // `kill 0` would be this test's whole group, and `kill -9 1` is never meant.
    assert!(pid > 1 && pid != std::process::id(), "refusing to signal pid {pid}");
    assert!(Command::new("kill").args([name, &pid.to_string()]).status().expect("kill").success());
}

/// Whether `pid` is a live process (a zombie holds nothing).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| !stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')))
}

/// The one keeper of the server on `port`.
fn keeper_of(port: u16) -> u32 {
    let keepers = processes_with(&[" keep --grace ", &format!("--port {port} ")]);
    assert_eq!(keepers.len(), 1, "one keeper for port {port}: {keepers:?}");
    keepers[0]
}

/// `kill -9` of the keeper: its server must die with it (while the gateway runs), never two
/// servers run at once, and the next request is served by a new process.
async fn keeper_killed(gw: &Gateway, backend: &str, model: &str, program: &'static str, port: u16) {
    let r = post(gw, "/v1/chat/completions", &ask(model)).await;
    let status = r.status();
    assert_eq!(status, 200, "{}", r.text().await.unwrap_or_default());
    let server = pid_of(&backend_state(gw, backend).await);
    let needle = format!("--port {port} ");
    assert_eq!(servers(program, &needle), [server]);
    let watcher = ServerWatch::start(program, vec![needle.clone()]);

    signal("-9", keeper_of(port));
    eventually("the killed keeper's server gone", || async { !alive(server) }).await;
    let r = post(gw, "/v1/chat/completions", &ask(model)).await;
    let status = r.status();
    assert_eq!(status, 200, "{}", r.text().await.unwrap_or_default());
    let state = backend_state(gw, backend).await;
    assert_eq!(state["state"], "ready", "{state}");
    let replacement = pid_of(&state);
    assert_ne!(replacement, server, "a new process");
    assert_eq!(servers(program, &needle), [replacement], "only the new server runs");
    assert_eq!(watcher.peak(), 1, "never two servers on port {port} at once");
}

#[tokio::test]
async fn the_server_dies_with_its_keeper_killed_by_sigkill() {
    let port = free_port();
    let gw = gateway(&yaml(&[sim_backend("a", port, "")], &[("a", "a")])).await;
    keeper_killed(&gw, "a", "a", SIM, port).await;
}

#[tokio::test]
async fn a_real_mlx_lm_server_dies_with_its_keeper_killed_by_sigkill() {
    let Some(model) = prerequisites(&["mlx-lm"]) else { return };
    let port = free_port();
    let gw = gateway(&config(&[backend("native", "mlx-lm", &model, port, "")], &[("qwen", "native")], "")).await;
    keeper_killed(&gw, "native", "qwen", "mlx_lm.server", port).await;
}

#[tokio::test]
async fn a_backend_whose_port_another_process_answers_on_never_reads_as_ready() {
    // A stranger (say, an orphaned server) answers on the port, /health included.
    let stranger = sim().await;
    let port = stranger.addr.port();
    // A held port is retried like a crash (an earlier gateway may still be stopping its server);
    // with no restarts allowed the first try fails the backend.
    let gw = gateway(&yaml(&[sim_backend("a", port, "    max_restarts: 0\n")], &[("a", "a")])).await;
    let saw_ready = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let watch = tokio::spawn({
        let (saw_ready, done, url) = (Arc::clone(&saw_ready), Arc::clone(&done), gw.url("/admin/backends"));
        async move {
            while !done.load(Ordering::SeqCst) {
                if let Ok(r) = client().get(&url).send().await
                    && let Ok(all) = r.json::<Value>().await
                    && all["backends"][0]["state"] == "ready"
                {
                    saw_ready.store(true, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    });
    let r = post(&gw, "/v1/chat/completions", &ask("a")).await;
    done.store(true, Ordering::SeqCst);
    watch.await.expect("watcher");
    assert_eq!(r.status(), 503);
    let e: Value = r.json().await.expect("json");
    assert_eq!(e["error"]["code"], "backend_failed", "{e}");
    let message = e["error"]["message"].as_str().expect("message");
    assert!(message.contains(&format!("port {port} is in use")), "{message}");
    assert!(!saw_ready.load(Ordering::SeqCst), "reported ready while a stranger owned its port");
    let state = backend_state(&gw, "a").await;
    assert_eq!(state["state"], "failed", "{state}");
    assert!(servers(SIM, &format!("--port {port} ")).is_empty(), "no server was started");
    assert_eq!(sim_stats(&stranger).await["total"].as_u64().unwrap_or(0), 0, "nothing was sent to the stranger");
}

/// A config with the shipped openai-server backend's missing venv and a custom backend whose
/// program does not exist.
fn missing_pieces_config(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("gateway.yaml");
    std::fs::write(
        &path,
        "listen: 127.0.0.1:0\nbackends:\n  openai-server:\n    kind: mlx-openai-server\n    model: m\n    \
         venv: .venv-mlx-openai-server\n    port: 8102\n  tool:\n    kind: custom\n    \
         command: [./bin/no-such-server, --port, '{port}']\n    port: 8103\n\
         models:\n  qwen-oai: {backend: openai-server}\n  t: {backend: tool}\n",
    )
    .expect("write config");
    path
}

#[test]
fn check_and_serve_refuse_a_missing_venv_or_program() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = missing_pieces_config(dir.path());
    for command in ["check", "serve"] {
        let out = Command::new(MLXGATE).args([command, "--config"]).arg(&path).output().expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{command}: {stderr}");
        assert!(
            stderr.contains(
                "backends.openai-server.venv: .venv-mlx-openai-server does not exist \
                 (build it with: scripts/setup-backends mlx-openai-server)"
            ),
            "{command}: {stderr}"
        );
        assert!(
            stderr.contains("backends.tool.command: ./bin/no-such-server does not exist or is not executable"),
            "{command}: {stderr}"
        );
    }
}

/// A venv with `bin/srv`, a script that runs the simulator.
fn sim_venv(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let venv = dir.join("venv");
    std::fs::create_dir_all(venv.join("bin")).expect("mkdir");
    let srv = venv.join("bin/srv");
    std::fs::write(&srv, format!("#!/bin/sh\nexec '{SIM}' \"$@\"\n")).expect("write");
    std::fs::set_permissions(&srv, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    venv
}

#[tokio::test]
async fn a_venv_deleted_after_start_fails_the_backend_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let venv = sim_venv(dir.path());
    let port = free_port();
    let backend = format!(
        "  a:\n    kind: custom\n    venv: '{}'\n    command: [srv, --port, '{{port}}']\n    port: {port}\n    \
         idle_timeout: 1s\n",
        venv.display()
    );
    let gw = gateway(&yaml(&[backend], &[("a", "a")])).await;
    assert_eq!(post(&gw, "/v1/chat/completions", &ask("a")).await.status(), 200);
    eventually("idle stop", || async { backend_state(&gw, "a").await["state"] == "stopped" }).await;

    std::fs::remove_dir_all(&venv).expect("rm venv");
    let r = post(&gw, "/v1/chat/completions", &ask("a")).await;
    assert_eq!(r.status(), 503);
    let e: Value = r.json().await.expect("json");
    assert_eq!(e["error"]["code"], "backend_failed", "{e}");
    let message = e["error"]["message"].as_str().expect("message");
    assert!(message.contains(&format!("backends.a.venv: {} does not exist", venv.display())), "{message}");
    let state = backend_state(&gw, "a").await;
    assert_eq!(state["state"], "failed", "{state}");
    assert_eq!(state["restarts"], 0, "no crash loop: {state}");
}

#[tokio::test]
async fn a_healthy_backend_is_not_swapped_out_for_one_that_cannot_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let venv = sim_venv(dir.path());
    let (pa, pb) = (free_port(), free_port());
    let broken = format!(
        "  b:\n    kind: custom\n    venv: '{}'\n    command: [srv, --port, '{{port}}']\n    port: {pb}\n",
        venv.display()
    );
    let gw =
        gateway(&format!("swap_after: 1s\n{}", yaml(&[sim_backend("a", pa, ""), broken], &[("a", "a"), ("b", "b")])))
            .await;
    assert_eq!(post(&gw, "/v1/chat/completions", &ask("a")).await.status(), 200);
    let pid = pid_of(&backend_state(&gw, "a").await);
    std::fs::remove_dir_all(&venv).expect("rm venv");
    let r = post(&gw, "/v1/chat/completions", &ask("b")).await;
    assert_eq!(r.status(), 503);
    let e: Value = r.json().await.expect("json");
    assert!(e["error"]["message"].as_str().is_some_and(|m| m.contains("does not exist")), "{e}");
    assert_eq!(backend_state(&gw, "b").await["state"], "failed");
    let a = backend_state(&gw, "a").await;
    assert_eq!((a["state"].as_str(), pid_of(&a)), (Some("ready"), pid), "a kept the GPU: {a}");
    assert_eq!(metric_sum(&gw, "mlxgate_backend_swaps_total").await, Some(0.0));
    assert_eq!(post(&gw, "/v1/chat/completions", &ask("a")).await.status(), 200);
}

#[tokio::test]
async fn a_program_that_cannot_be_started_fails_the_backend_at_once() {
    // The shell cannot run its program: it exits 127, as the keeper does when it cannot.
    let port = free_port();
    let backend = shell_backend("a", port, "exec /nonexistent/server --port {port}");
    let gw = gateway(&yaml(&[backend], &[("a", "a")])).await;
    let r = post(&gw, "/v1/chat/completions", &ask("a")).await;
    assert_eq!(r.status(), 503);
    let e: Value = r.json().await.expect("json");
    let message = e["error"]["message"].as_str().expect("message");
    assert!(message.contains("cannot start") && message.contains("status 127"), "{message}");
    let state = backend_state(&gw, "a").await;
    assert_eq!(state["state"], "failed", "{state}");
    assert_eq!(state["restarts"], 0, "no crash loop: {state}");
}

#[tokio::test]
async fn a_hung_server_is_restarted_by_its_health_probe() {
    let port = free_port();
    let health = "    health: {interval: 100ms, timeout: 300ms, failures: 2}\n";
    let gw = gateway(&yaml(&[sim_backend("a", port, health)], &[("a", "a")])).await;
    assert_eq!(post(&gw, "/v1/chat/completions", &ask("a")).await.status(), 200);
    let hung = pid_of(&backend_state(&gw, "a").await);
    // A hung process: alive, its port open, answering nothing.
    signal("-STOP", hung);
    eventually("a new process after the hang", || async {
        let s = backend_state(&gw, "a").await;
        s["state"] == "ready" && s["pid"].as_u64().is_some_and(|p| p != u64::from(hung))
    })
    .await;
    assert!(!alive(hung), "the hung process was killed");
    let state = backend_state(&gw, "a").await;
    assert!(state["last_error"].as_str().is_some_and(|e| e.contains("health probes")), "{state}");
    assert_eq!(metric(&gw, "mlxgate_backend_restarts_total{backend=\"a\",reason=\"health\"}").await, Some(1.0));
    assert_eq!(post(&gw, "/v1/chat/completions", &ask("a")).await.status(), 200);
}

#[tokio::test]
async fn the_log_reader_survives_invalid_utf8_and_caps_a_long_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("server.sh");
    std::fs::write(
        &script,
        format!(
            "printf 'before \\377\\376 after\\n'\nhead -c 100000 /dev/zero | tr '\\0' a\necho\n\
             exec '{SIM}' --port \"$1\"\n"
        ),
    )
    .expect("write");
    let port = free_port();
    let backend =
        format!("  a:\n    kind: custom\n    command: [sh, '{}', '{{port}}']\n    port: {port}\n", script.display());
    let gw = gateway(&yaml(&[backend], &[("a", "a")])).await;
    assert_eq!(post(&gw, "/v1/chat/completions", &ask("a")).await.status(), 200);
    let logs = client().get(gw.url("/admin/backends/a/logs")).send().await.expect("send").text().await.expect("text");
    assert!(logs.contains("before \u{fffd}\u{fffd} after"), "invalid UTF-8 is replaced: {logs:.300}");
    assert!(logs.contains("mlxgate-sim listening on"), "later lines still arrive: {logs:.300}");
    let long = logs.lines().find(|l| l.starts_with("aaaa")).expect("the long line");
    assert!(long.ends_with("[line truncated by mlxgate]"), "{:.100}", &long[long.len().saturating_sub(100)..]);
    assert!(long.len() < 17 * 1024, "capped: {} bytes", long.len());
    // The server still writes into a live pipe and serves.
    assert_eq!(post(&gw, "/v1/chat/completions", &ask("a")).await.status(), 200);
    assert_eq!(backend_state(&gw, "a").await["restarts"], 0);
}

/// The parent pid of `pid`.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()
}

/// Runs a gateway on `config`, has `model` served, and kills the gateway and the keeper of the
/// server on `port` with SIGKILL, as `pkill -9 mlxgate` does: returns the orphaned server. So
/// that the keeper cannot see its gateway's pipe close and stop the server first (a race that
/// `pkill` may or may not win), the keeper is stopped (SIGSTOP) before the gateway dies and
/// killed after.
async fn orphan_of(config: &str, model: &str, port: u16) -> u32 {
    let needle = format!("--port {port} ");
    let first = gateway_binary(config, None);
    let r = client().post(format!("{}/v1/chat/completions", first.url)).json(&ask(model)).send().await;
    assert_eq!(r.expect("send").status(), 200);
    let orphan = match servers(SIM, &needle)[..] {
        [one] => one,
        ref many => panic!("one server on port {port}: {many:?}"),
    };
    let (gateway, keeper) = (first.child.id(), keeper_of(port));
    signal("-STOP", keeper);
    signal("-9", gateway);
    eventually("the gateway dead", || async { !alive(gateway) }).await;
    signal("-9", keeper);
    // Dead, and the server handed to a reaper (a killed process's threads may still be exiting
    // while it already reads as a zombie).
    eventually("the keeper dead", || async { !alive(keeper) && parent_of(orphan) != Some(keeper) }).await;
    drop(first);
    assert!(alive(orphan), "the reproduction: the server outlives its gateway and keeper");
    orphan
}

/// `pkill -9 mlxgate`: the gateway and the keeper killed at the same moment leave the server
/// running with no keeper. The next gateway on the same config recognises it as its own orphan,
/// stops it before starting its own server, and serves; never two servers at once.
#[tokio::test]
async fn an_orphan_of_a_gateway_killed_with_its_keeper_is_reclaimed_by_the_next_gateway() {
    let port = free_port();
    let config = yaml(&[sim_backend("a", port, "")], &[("a", "a")]);
    let needle = format!("--port {port} ");
    let _cleanup = KillServersOnDrop(needle.clone());
    let orphan = orphan_of(&config, "a", port).await;
    assert_eq!(servers(SIM, &needle), [orphan], "the reproduction: the server outlives both");

    let watcher = ServerWatch::start(SIM, vec![needle.clone()]);
    let second = gateway_binary(&config, None);
    let r = client().post(format!("{}/v1/chat/completions", second.url)).json(&ask("a")).send().await.expect("send");
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    assert!(!alive(orphan), "the orphan was reclaimed: {}", describe_process(orphan));
    let now = servers(SIM, &needle);
    assert!(now.len() == 1 && now[0] != orphan, "only the new gateway's server runs: {now:?}");
    assert_eq!(watcher.peak(), 1, "never two servers on port {port} at once");
}

/// Kills, when the test ends (a failed one included), any sim server still on its port.
struct KillServersOnDrop(String);

impl Drop for KillServersOnDrop {
    fn drop(&mut self) {
        for group in servers(SIM, &self.0) {
            kill_group(group);
        }
    }
}

#[tokio::test]
async fn orphans_are_reclaimed_when_the_next_gateway_starts_before_any_other_backend_runs() {
    // The orphan is `a`'s; the next gateway's first request is for `b`: without a reclaim at
    // start-up, b would run beside the orphan (two GPU servers).
    let (pa, pb) = (free_port(), free_port());
    let config = format!(
        "swap_after: 1s\n{}",
        yaml(&[sim_backend("a", pa, ""), sim_backend("b", pb, "")], &[("a", "a"), ("b", "b")])
    );
    let needle = format!("--port {pa} ");
    let _cleanup = KillServersOnDrop(needle.clone());
    let orphan = orphan_of(&config, "a", pa).await;

    let watcher = ServerWatch::start(SIM, vec![needle.clone(), format!("--port {pb} ")]);
    let second = gateway_binary(&config, None);
    assert!(
        !alive(orphan),
        "reclaimed before the gateway serves: {}; its log: {:?}",
        describe_process(orphan),
        second.startup_log
    );
    let r = client().post(format!("{}/v1/chat/completions", second.url)).json(&ask("b")).send().await.expect("send");
    assert_eq!(r.status(), 200);
    assert_eq!(watcher.peak(), 1, "never two GPU servers at once");
}

#[tokio::test]
async fn an_operators_restart_of_a_start_that_hangs_starts_a_new_process() {
    let port = free_port();
    let backend = shell_backend("a", port, &format!("sleep 600; exec {SIM} --port {{port}}"));
    let gw = gateway(&yaml(&[backend], &[("a", "a")])).await;
    let waiting = tokio::spawn({
        let url = gw.url("/v1/chat/completions");
        async move { client().post(url).json(&ask("a")).send().await.map(|r| r.status()) }
    });
    eventually("starting with a pid", || async {
        let s = backend_state(&gw, "a").await;
        s["state"] == "starting" && s["pid"].is_u64()
    })
    .await;
    let first = pid_of(&backend_state(&gw, "a").await);
    let r = client().post(gw.url("/admin/backends/a/restart")).send().await.expect("send");
    assert_eq!(r.status(), 202);
    eventually("a new process", || async {
        let s = backend_state(&gw, "a").await;
        s["state"] == "starting" && s["pid"].as_u64().is_some_and(|p| p != u64::from(first))
    })
    .await;
    assert!(!alive(first), "the hung start's process is gone");
    waiting.abort();
}

#[tokio::test]
async fn nothing_is_swapped_or_started_once_shutdown_begins() {
    let (pa, pb) = (free_port(), free_port());
    let config = format!(
        "swap_after: 4s\nshutdown_grace: 8s\n{}",
        yaml(&[sim_backend("a", pa, ""), sim_backend("b", pb, "    drain_timeout: 1s\n")], &[("a", "a"), ("b", "b")])
    );
    let mut gw = gateway(&config).await;
    let stream = json!({"model": "b", "stream": true, "messages": [{"role": "user", "content": "hi"}],
        "sim": {"hold_after": 1, "hold_key": "s"}});
    let mut held = post(&gw, "/v1/chat/completions", &stream).await;
    read_until(&mut held, "t0 ").await;
    let watch_a = ServerWatch::start(SIM, vec![format!("--port {pa} ")]);
    // A request for `a` waits for b's stream or for swap_after (4s); the shutdown begins first.
    // Before, the scheduler swapped b out for it 4s into the 8s grace, cutting b's stream.
    let waiting = tokio::spawn({
        let url = gw.url("/v1/chat/completions");
        async move { client().post(url).json(&ask("a")).send().await.map(|r| r.status()) }
    });
    eventually("a's request queued", || async { backend_state(&gw, "a").await["queue"] == 1 }).await;
    gw.stop();
    // `a` will not start: its waiting request is answered at once, not held to the grace's end.
    let refused = waiting.await.expect("task").expect("an answer");
    assert_eq!(refused.as_u16(), 503);
    let ended = (&mut gw.task).await;
    assert!(ended.is_ok(), "the gateway ended");
    assert_eq!(watch_a.peak(), 0, "a was never started during the shutdown");
    let text = text_of(held).await;
    assert!(!text.contains("data: [DONE]"), "the held stream was cut at the grace, not finished: {text}");
    let last: Value = serde_json::from_str(data_lines(&text).last().expect("events")).expect("json");
    assert_eq!(last["error"]["type"], "gateway_shutdown", "cut at the grace's end with a last event: {text}");
}

#[tokio::test]
async fn a_second_ctrl_c_exits_at_once_and_the_servers_still_stop() {
    let port = free_port();
    let config = format!("shutdown_grace: 10m\n{}", yaml(&[sim_backend("a", port, "")], &[("a", "a")]));
    let gateway = gateway_binary(&config, None);
    let stream = json!({"model": "a", "stream": true, "messages": [{"role": "user", "content": "hi"}],
        "sim": {"hold_after": 1, "hold_key": "s"}});
    let mut held =
        client().post(format!("{}/v1/chat/completions", gateway.url)).json(&stream).send().await.expect("send");
    read_until(&mut held, "t0 ").await;
    let pid = gateway.child.id();
    signal("-INT", pid);
    // The first one waits for the running stream (up to 10 minutes); the second does not.
    eventually("the first signal seen", || async {
        client().get(format!("{}/health", gateway.url)).send().await.is_err()
    })
    .await;
    signal("-INT", pid);
    let status = gateway.exit_status().await;
    assert_eq!(status.code(), Some(130), "{status:?}");
    let needle = format!("--port {port} ");
    eventually("the server stopped by its keeper", || async { servers(SIM, &needle).is_empty() }).await;
}

#[tokio::test]
async fn a_keeper_whose_gateway_is_gone_before_it_reports_still_stops_its_server() {
    // The gateway dies while the keeper starts: the keeper's report line meets a closed pipe. It
    // must not die of it (eprintln! panics there) and leave the server running.
    let port = free_port();
    let mut keeper = std::process::Command::new(MLXGATE)
        .args(["keep", "--grace", "2s", "--", SIM, "--port", &port.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("keeper starts");
    drop(keeper.stderr.take());
    let needle = format!("--port {port}");
    let _cleanup = KillServersOnDrop(needle.clone());
    eventually("the server started", || async { !servers(SIM, &needle).is_empty() }).await;
    drop(keeper.stdin.take());
    eventually("the server stopped by its keeper", || async { servers(SIM, &needle).is_empty() }).await;
    let status = tokio::task::spawn_blocking(move || keeper.wait()).await.expect("join").expect("wait");
    assert!(status.success(), "the keeper stopped cleanly: {status:?}");
}

#[tokio::test]
async fn during_the_shutdown_grace_a_crash_is_not_restarted_and_waiting_answers_get_503() {
    let port = free_port();
    // A remote backend's held stream keeps the gateway in its 3s grace after the crash.
    let remote = sim().await;
    let backends = [sim_backend("a", port, ""), format!("  r: {{url: '{}'}}\n", remote.url())];
    let config = format!("shutdown_grace: 3s\n{}", yaml(&backends, &[("a", "a"), ("r", "r")]));
    let mut gw = gateway(&config).await;
    let stream = |model: &str| {
        json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "hi"}],
            "sim": {"hold_after": 1, "hold_key": "s"}})
    };
    let mut held = post(&gw, "/v1/chat/completions", &stream("a")).await;
    read_until(&mut held, "t0 ").await;
    let mut held_remote = post(&gw, "/v1/chat/completions", &stream("r")).await;
    read_until(&mut held_remote, "t0 ").await;
    // A whole answer still being generated when the grace ends.
    let whole = tokio::spawn({
        let url = gw.url("/v1/chat/completions");
        let body = json!({"model": "a", "messages": [{"role": "user", "content": "hi"}], "sim": {"ttft_ms": 600_000}});
        async move {
            let r = client().post(url).json(&body).send().await.expect("send");
            (r.status().as_u16(), r.text().await.unwrap_or_default())
        }
    });
    eventually("both at the server", || async { backend_state(&gw, "a").await["in_flight"] == 2 }).await;
    let server = pid_of(&backend_state(&gw, "a").await);
    gw.stop();
    // The crash must fall inside the shutdown: a crash seen before the gateway took the stop is
    // restarted, rightly. The listener closes after the backends are told (a full suite's load
    // once let the kill overtake the stop).
    let addr = gw.addr;
    eventually("the gateway stopped accepting", || async move { tokio::net::TcpStream::connect(addr).await.is_err() })
        .await;
    signal("-9", server);
    let needle = format!("--port {port} ");
    // The killed server stays listed for a moment while the kernel tears it down: watch for a
    // restart once it is gone, not for the dying one.
    eventually("the killed server gone", || async { !servers(SIM, &needle).contains(&server) }).await;
    let watch = ServerWatch::start(SIM, vec![needle]);
    let (status, body) = whole.await.expect("task");
    assert_eq!(status, 503, "{body}");
    let e: Value = serde_json::from_str(&body).expect("json");
    assert!(e["error"]["type"] == "gateway_shutdown" || e["error"]["type"] == "backend_error", "{e}");
    let ended = (&mut gw.task).await;
    assert!(ended.is_ok());
    assert_eq!(watch.peak(), 0, "the crashed backend was not restarted during the shutdown");
    let cut = text_of(held_remote).await;
    assert!(cut.contains("gateway_shutdown"), "the remote stream ran to the grace's end: {cut}");
    drop(held);
}

/// The helper that watches for restarts counts a server, never a keeper: not while the keeper
/// runs, not as it exits, not once it is a zombie (whose command line reads empty). It once
/// read a command line twice, and a keeper exiting between the readings was counted as a
/// server: `during_the_shutdown_grace…` failed now and then under load, its watch seeing the
/// crashed server's keeper go.
#[test]
fn a_keeper_is_never_counted_as_a_server_alive_exiting_or_exited() {
    let port = free_port();
    // A stand-in keeper: the keeper's marker and the server's command line in its own; it
    // exits after 50 ms and stays a zombie until waited for.
    let mut keeper = Command::new("sh")
        .args(["-c", "sleep 0.05; exit 0", "mlxgate", "keep", "--grace", "1s", "--", SIM])
        .args(["--port", &port.to_string(), "--style", "mlx-lm"])
        .spawn()
        .expect("sh");
    let needle = format!("--port {port} ");
    let mut seen_running = false;
    while !std::fs::read_to_string(format!("/proc/{}/stat", keeper.id()))
        .is_ok_and(|stat| stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')))
    {
        seen_running |= processes_with(&[SIM, &needle]).contains(&keeper.id());
        assert_eq!(servers(SIM, &needle), Vec::<u32>::new(), "a running or exiting keeper counted as a server");
    }
    assert_eq!(servers(SIM, &needle), Vec::<u32>::new(), "a zombie keeper counted as a server");
    assert!(seen_running, "the stand-in keeper was seen running");
    let _ = keeper.wait();
}
