//! Managed backends with `mlxgate-sim` as the server process (`kind: custom`): start on demand,
//! crash and restart, retry before the first byte, failed after too many crashes, GPU swaps with
//! never two processes alive, idle stop, and no child outliving the gateway. The same behaviour
//! against real MLX servers is in `managed_real.rs`.

use std::process::Command;

use crate::common::*;
use serde_json::{Value, json};

const SIM: &str = env!("CARGO_BIN_EXE_mlxgate-sim");

/// A managed sim backend named `name` on `port`, serving model `name`.
fn sim_backend(name: &str, port: u16, extra: &str) -> String {
    format!(
        "  {name}:\n    kind: custom\n    command: ['{SIM}', '--port', '{{port}}', '--style', 'mlx-lm']\n    \
         port: {port}\n    max_concurrency: 2\n    stop_timeout: 5s\n{extra}"
    )
}

fn yaml(backends: &[String], models: &[(&str, &str)], top: &str) -> String {
    let models: String = models.iter().map(|(m, b)| format!("  {m}: {{backend: {b}, max_wait: 120s}}\n")).collect();
    format!("{top}backends:\n{}models:\n{models}", backends.concat())
}

/// A gateway with GPU backends `a` and `b` (models `ma`, `mb`); returns it and their ports.
async fn two_gpu_backends(swap_after: &str) -> (Gateway, u16, u16) {
    let (pa, pb) = (free_port(), free_port());
    let config = yaml(
        &[sim_backend("a", pa, ""), sim_backend("b", pb, "")],
        &[("ma", "a"), ("mb", "b")],
        &format!("swap_after: {swap_after}\n"),
    );
    (gateway(&config).await, pa, pb)
}

fn ask(model: &str, stream: bool, sim: Value) -> Value {
    json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}], "sim": sim})
}

fn pid_of(state: &Value) -> u32 {
    state["pid"].as_u64().and_then(|p| u32::try_from(p).ok()).expect("a pid")
}

fn kill9(pid: u32) {
    assert!(Command::new("kill").args(["-9", &pid.to_string()]).status().expect("kill").success());
}

#[tokio::test]
async fn first_request_starts_the_backend_and_it_is_reported() {
    let port = free_port();
    let gw = gateway(&yaml(&[sim_backend("a", port, "")], &[("a", "a")], "")).await;
    assert_eq!(backend_state(&gw, "a").await["state"], "stopped");
    eventually("a stopped backend's state is exported", || async {
        metric(&gw, "mlxgate_backend_state{backend=\"a\",state=\"stopped\"}").await == Some(1.0)
    })
    .await;
    let ready = client().get(gw.url("/ready")).send().await.expect("send");
    assert_eq!(ready.status(), 200, "a stopped managed backend starts on demand: the gateway is ready");
    assert!(servers(SIM, &port.to_string()).is_empty());

    let r = post(&gw, "/v1/chat/completions", &ask("a", false, json!({"tokens": 2}))).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.expect("json")["model"], "a", "upstream_model defaults to the backend's model");
    let state = backend_state(&gw, "a").await;
    assert_eq!(state["state"], "ready");
    assert_eq!(state["restarts"], 0);
    // The phase is exported one-hot, for dashboards and alerts.
    let phase = |s: &str| format!("mlxgate_backend_state{{backend=\"a\",state=\"{s}\"}}");
    eventually("mlxgate_backend_state follows the phase", || async {
        metric(&gw, &phase("ready")).await == Some(1.0) && metric(&gw, &phase("stopped")).await == Some(0.0)
    })
    .await;
    for other in ["starting", "draining", "restarting", "failed"] {
        assert_eq!(metric(&gw, &phase(other)).await, Some(0.0), "{other}");
    }
    let pid = pid_of(&state);
    assert_eq!(servers(SIM, &port.to_string()), [pid], "the reported pid is the server's");
    let logs = client().get(gw.url("/admin/backends/a/logs")).send().await.expect("send").text().await.expect("text");
    assert!(logs.contains("mlxgate-sim listening on"), "{logs}");
    assert_eq!(metric(&gw, "mlxgate_backend_up{backend=\"a\"}").await, Some(1.0));

    // An operator's restart of a running backend replaces its process now.
    let r = client().post(gw.url("/admin/backends/a/restart")).send().await.expect("send");
    assert_eq!(r.status(), 202);
    eventually("a new process", || async {
        let s = backend_state(&gw, "a").await;
        s["state"] == "ready" && s["pid"].as_u64().is_some_and(|p| p != u64::from(pid))
    })
    .await;
    assert!(servers(SIM, &port.to_string()).len() == 1);
}

#[tokio::test]
async fn a_crash_mid_stream_ends_that_stream_with_an_error_and_the_next_request_is_served_by_a_restart() {
    let port = free_port();
    let gw = gateway(&yaml(&[sim_backend("a", port, "")], &[("a", "a")], "")).await;
    let r = post(&gw, "/v1/chat/completions", &ask("a", true, json!({"tokens": 6, "exit_after": 2}))).await;
    assert_eq!(r.status(), 200);
    let text = text_of(r).await;
    assert!(text.contains("t1 "), "{text}");
    let last: Value = serde_json::from_str(data_lines(&text).last().expect("event")).expect("json");
    assert_eq!(last["error"]["type"], "backend_error", "{text}");

    let r = post(&gw, "/v1/chat/completions", &ask("a", false, json!({"tokens": 2}))).await;
    assert_eq!(r.status(), 200, "waits for the restart instead of failing");
    let state = backend_state(&gw, "a").await;
    assert_eq!(state["restarts"], 1);
    assert!(state["last_error"].as_str().expect("reason").contains("exited with status 137"), "{state}");
    assert_eq!(metric(&gw, "mlxgate_backend_restarts_total{backend=\"a\",reason=\"crash\"}").await, Some(1.0));
}

#[tokio::test]
async fn a_request_that_got_no_byte_yet_is_retried_on_the_restarted_process() {
    let port = free_port();
    let gw = gateway(&yaml(&[sim_backend("a", port, "")], &[("a", "a")], "")).await;
    assert_eq!(post(&gw, "/v1/chat/completions", &ask("a", false, json!({}))).await.status(), 200);
    let pid = pid_of(&backend_state(&gw, "a").await);

    // A long prefill: the server holds the request without sending a byte, then dies.
    let slow = tokio::spawn({
        let url = gw.url("/v1/chat/completions");
        async move {
            let body = ask("a", true, json!({"ttft_ms": 600_000, "keepalive": "none", "tokens": 3}));
            let r = client().post(url).json(&body).send().await.expect("send");
            (r.status(), text_of(r).await)
        }
    });
    // Watch the request arrive, kill the server, and see the request arrive again at the new
    // process while the client has seen nothing.
    let sim_url = format!("http://127.0.0.1:{port}");
    eventually("request at the server", || async {
        let stats = client().get(format!("{sim_url}/sim/stats")).send().await;
        match stats {
            Ok(r) => r.json::<Value>().await.is_ok_and(|s| s["active"] == 1),
            Err(_) => false,
        }
    })
    .await;
    kill9(pid);
    eventually("request re-sent to the new process", || async {
        let state = backend_state(&gw, "a").await;
        if state["state"] != "ready" || state["pid"].as_u64() == Some(u64::from(pid)) {
            return false;
        }
        let stats = client().get(format!("{sim_url}/sim/stats")).send().await;
        match stats {
            Ok(r) => r.json::<Value>().await.is_ok_and(|s| s["active"] == 1),
            Err(_) => false,
        }
    })
    .await;
    assert!(!slow.is_finished(), "the client saw nothing of the crash");
    slow.abort();
}

#[tokio::test]
async fn too_many_crashes_fail_the_backend_until_an_operator_restarts_it() {
    let port = free_port();
    let dir = tempfile::tempdir().expect("tempdir");
    let flag = dir.path().join("fixed");
    let script = format!("test -f '{}' && exec '{SIM}' --port {port} || exit 3", flag.display());
    let backend = format!(
        "  flaky:\n    kind: custom\n    command: ['sh', '-c', \"{script}\"]\n    port: {port}\n    \
         max_restarts: 1\n    restart_window: 5m\n"
    );
    let gw = gateway(&yaml(&[backend], &[("m", "flaky")], "")).await;
    let r = post(&gw, "/v1/chat/completions", &ask("m", false, json!({}))).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let e: Value = r.json().await.expect("json");
    assert_eq!(e["error"]["code"], "backend_failed");
    let message = e["error"]["message"].as_str().expect("message");
    assert!(message.contains("crashed 2 times") && message.contains("/admin/backends/flaky/restart"), "{message}");
    assert_eq!(backend_state(&gw, "flaky").await["state"], "failed");
    let ready = client().get(gw.url("/ready")).send().await.expect("send");
    assert_eq!(ready.status(), 503, "a failed backend makes the gateway unready");
    assert_eq!(ready.json::<Value>().await.expect("json")["backends"]["flaky"]["state"], "failed");
    // Refused at once while failed.
    let again = post(&gw, "/v1/chat/completions", &ask("m", false, json!({}))).await;
    assert_eq!(again.status(), 503);

    std::fs::write(&flag, "").expect("flag");
    let restart = client().post(gw.url("/admin/backends/flaky/restart")).send().await.expect("send");
    assert_eq!(restart.status(), 202);
    let ok = post(&gw, "/v1/chat/completions", &ask("m", false, json!({}))).await;
    assert_eq!(ok.status(), 200);
    assert_eq!(client().get(gw.url("/ready")).send().await.expect("send").status(), 200);
    let unknown = client().post(gw.url("/admin/backends/nope/restart")).send().await.expect("send");
    assert_eq!(unknown.status(), 404);
}

#[tokio::test]
async fn alternating_models_swap_gpu_backends_and_two_never_run_at_once() {
    let (gw, pa, pb) = two_gpu_backends("1s").await;
    let watcher = ServerWatch::start(SIM, vec![pa.to_string(), pb.to_string()]);
    for round in 0..3 {
        for model in ["ma", "mb"] {
            let r = post(&gw, "/v1/chat/completions", &ask(model, true, json!({"tokens": 3}))).await;
            assert_eq!(r.status(), 200, "round {round} {model}");
            assert!(text_of(r).await.contains("[DONE]"));
        }
    }
    assert_eq!(watcher.peak(), 1, "at most one GPU backend process at any moment");
    assert_eq!(metric_sum(&gw, "mlxgate_backend_swaps_total").await, Some(5.0));
}

#[tokio::test]
async fn requests_for_the_loaded_model_keep_flowing_until_swap_after() {
    let (gw, pa, _) = two_gpu_backends("60s").await;
    // a is busy with a held stream when b's request arrives.
    let mut held = post(&gw, "/v1/chat/completions", &ask("ma", true, json!({"hold_after": 1, "hold_key": "h"}))).await;
    read_until(&mut held, "t0 ").await;
    let waiting_b = tokio::spawn({
        let url = gw.url("/v1/chat/completions");
        async move { client().post(url).json(&ask("mb", false, json!({}))).send().await.expect("send").status() }
    });
    eventually("b queued", || async { backend_state(&gw, "b").await["queue"] == 1 }).await;
    // a's own requests still go straight through: no swap before swap_after.
    for _ in 0..3 {
        assert_eq!(post(&gw, "/v1/chat/completions", &ask("ma", false, json!({}))).await.status(), 200);
    }
    assert_eq!(backend_state(&gw, "b").await["state"], "stopped");
    // Once a has nothing left to do, b gets the GPU at once.
    client().post(format!("http://127.0.0.1:{pa}/sim/release/h")).send().await.expect("release");
    assert!(text_of(held).await.contains("[DONE]"));
    assert_eq!(waiting_b.await.expect("task"), 200);
    assert_eq!(backend_state(&gw, "a").await["state"], "stopped");
}

#[tokio::test]
async fn an_idle_backend_is_stopped_after_its_idle_timeout() {
    let port = free_port();
    let gw = gateway(&yaml(&[sim_backend("a", port, "    idle_timeout: 1s\n")], &[("a", "a")], "")).await;
    assert_eq!(post(&gw, "/v1/chat/completions", &ask("a", false, json!({}))).await.status(), 200);
    eventually("idle stop", || async { backend_state(&gw, "a").await["state"] == "stopped" }).await;
    eventually("process gone", || async { servers(SIM, &port.to_string()).is_empty() }).await;
    // And it comes back on demand.
    assert_eq!(post(&gw, "/v1/chat/completions", &ask("a", false, json!({}))).await.status(), 200);
}

#[tokio::test]
async fn no_backend_outlives_the_gateway_after_sigterm_or_sigkill() {
    for signal in ["-TERM", "-KILL"] {
        let port = free_port();
        let gateway = gateway_binary(&yaml(&[sim_backend("a", port, "    preload: true\n")], &[("a", "a")], ""), None);
        let url = gateway.url.clone();
        let body = ask("a", false, json!({}));
        let r = client().post(format!("{url}/v1/chat/completions")).json(&body).send().await.expect("send");
        assert_eq!(r.status(), 200);
        let needle = port.to_string();
        assert_eq!(servers(SIM, &needle).len(), 1);
        assert!(Command::new("kill").args([signal, &gateway.child.id().to_string()]).status().expect("kill").success());
        gateway.exit_status().await;
        eventually(&format!("no server after {signal}"), || async { servers(SIM, &needle).is_empty() }).await;
        eventually("no keeper left either", || async { processes_with(&["mlxgate keep", &needle]).is_empty() }).await;
    }
}

/// The live page's view of a managed backend, through the admin API it reads: a crash and a
/// restart are marked in the backend's log between the server's own lines; the Stop button
/// (`POST /admin/backends/{name}/stop`) drains and stops it, is noted as a swap for `admin`,
/// and the next request starts it again; swaps between two GPU backends are noted with their
/// reason; `/admin/state` says which backend holds the GPU.
#[tokio::test]
async fn crashes_restarts_and_stops_are_marked_and_the_stop_button_stops() {
    let (gw, pa, _) = two_gpu_backends("1s").await;
    assert_eq!(post(&gw, "/v1/chat/completions", &ask("ma", false, json!({}))).await.status(), 200);
    let state: Value = client().get(gw.url("/admin/state")).send().await.expect("send").json().await.expect("json");
    let entry = |state: &Value, name: &str| {
        state["backends"].as_array().expect("backends").iter().find(|b| b["name"] == name).cloned().expect("backend")
    };
    assert_eq!(entry(&state, "a")["holds_gpu"], true, "{state}");
    assert_eq!(entry(&state, "b")["holds_gpu"], false, "{state}");
    assert_eq!(state["models"].as_array().map(Vec::len), Some(2), "{state}");

    // A crash, then the restart: both marked among the server's lines, in order.
    kill9(pid_of(&backend_state(&gw, "a").await));
    assert_eq!(post(&gw, "/v1/chat/completions", &ask("ma", false, json!({}))).await.status(), 200);
    let logs = client().get(gw.url("/admin/backends/a/logs?lines=1000")).send().await.expect("send");
    let logs = logs.text().await.expect("text");
    let marks: Vec<&str> = logs.lines().filter(|l| l.starts_with("mlxgate: ")).collect();
    let kinds: Vec<&str> = marks.iter().map(|m| m.split_whitespace().nth(1).unwrap_or("")).collect();
    assert_eq!(kinds, ["starting", "ready", "ended", "starting", "ready"], "{logs}");
    assert!(marks[2].contains("signal 9"), "{}", marks[2]);
    assert!(logs.contains("mlxgate-sim listening on"), "the server's own lines stay: {logs}");

    // The other model's request swaps a out: noted with its reason.
    assert_eq!(post(&gw, "/v1/chat/completions", &ask("mb", false, json!({}))).await.status(), 200);
    let state: Value = client().get(gw.url("/admin/state")).send().await.expect("send").json().await.expect("json");
    assert_eq!(state["swaps"][0]["backend"], "a", "{state}");
    assert_eq!(state["swaps"][0]["next"], "b", "{state}");
    assert!(["no_work", "due"].contains(&state["swaps"][0]["reason"].as_str().unwrap_or("")), "{state}");
    assert_eq!(entry(&state, "b")["holds_gpu"], true, "{state}");

    // The Stop button: b drains and stops; noted; the next request starts it again.
    let r = client().post(gw.url("/admin/backends/b/stop")).send().await.expect("send");
    assert_eq!(r.status(), 202);
    eventually("b stopped", || async { backend_state(&gw, "b").await["state"] == "stopped" }).await;
    let state: Value = client().get(gw.url("/admin/state")).send().await.expect("send").json().await.expect("json");
    assert_eq!((&state["swaps"][0]["backend"], &state["swaps"][0]["reason"]), (&json!("b"), &json!("admin")));
    assert!(servers(SIM, &pa.to_string()).is_empty());
    assert_eq!(post(&gw, "/v1/chat/completions", &ask("mb", false, json!({}))).await.status(), 200);
    assert_eq!(backend_state(&gw, "b").await["state"], "ready");
    let unknown = client().post(gw.url("/admin/backends/nope/stop")).send().await.expect("send");
    assert_eq!(unknown.status(), 404);
}
