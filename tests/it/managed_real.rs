//! Managed backends against the real servers: mlx_lm.server (the native engine) and
//! mlx-openai-server, from the venvs `scripts/setup-backends` builds, serving the tiny model it
//! generates. CI (`scripts/test`) builds them first; elsewhere these tests say why they did not
//! run when the venvs are missing.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::common::*;
use serde_json::{Value, json};

/// Backend kinds (also the venv names).
const MLX_LM: &str = "mlx-lm";
const MLX_OPENAI: &str = "mlx-openai-server";
/// What their processes' command lines contain.
const MLX_LM_PROC: &str = "mlx_lm.server";
const MLX_OPENAI_PROC: &str = "mlx-openai-server launch";

fn chat(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream, "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello there"}]})
}

/// Asserts a completed chat answer (streamed or whole) and returns its text.
async fn answered(gw: &Gateway, model: &str, stream: bool) -> String {
    let r = post(gw, "/v1/chat/completions", &chat(model, stream)).await;
    let status = r.status();
    let text = text_of(r).await;
    assert_eq!(status, 200, "{model}: {text}");
    if stream {
        assert!(text.contains("data: [DONE]"), "{model}: {text}");
    } else {
        let v: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["object"], "chat.completion", "{text}");
        assert!(v["usage"]["completion_tokens"].as_u64().is_some_and(|n| n >= 1), "{text}");
    }
    text
}

#[tokio::test]
async fn mlx_lm_starts_on_the_first_request_and_comes_back_after_kill_9() {
    let Some(model) = prerequisites(&[MLX_LM]) else { return };
    let port = free_port();
    let gw = gateway(&config(&[backend("native", MLX_LM, &model, port, "")], &[("qwen", "native")], "")).await;
    assert!(servers(MLX_LM_PROC, &port.to_string()).is_empty());

    answered(&gw, "qwen", true).await;
    answered(&gw, "qwen", false).await;
    let state = backend_state(&gw, "native").await;
    assert_eq!(state["state"], "ready", "{state}");
    let pid = state["pid"].as_u64().expect("pid");
    assert_eq!(servers(MLX_LM_PROC, &port.to_string()), [pid as u32]);
    let logs =
        client().get(gw.url("/admin/backends/native/logs")).send().await.expect("send").text().await.expect("text");
    assert!(!logs.trim().is_empty(), "the server's output is kept");

    assert!(Command::new("kill").args(["-9", &pid.to_string()]).status().expect("kill").success());
    answered(&gw, "qwen", true).await;
    let state = backend_state(&gw, "native").await;
    assert_eq!(state["restarts"], 1, "{state}");
    assert_ne!(state["pid"].as_u64(), Some(pid), "a new process");
}

#[tokio::test]
async fn a_real_mlx_lm_server_killed_mid_stream_ends_the_stream_with_an_error_not_a_success() {
    // mlx_lm.server answers in HTTP/1.0: its body ends when the connection closes, so a crash
    // looks like a normal end unless the gateway checks for `[DONE]` or a finish_reason.
    let Some(model) = prerequisites(&[MLX_LM]) else { return };
    let port = free_port();
    // A stream long enough to be killed in its middle: 20000 tokens, over the tiny model's own
    // 2048 positions (the gateway's default cap for it), so the cap is raised.
    let cap = "    context_cap: 30000\n";
    let gw = gateway(&config(&[backend("native", MLX_LM, &model, port, cap)], &[("qwen", "native")], "")).await;
    let long = json!({"model": "qwen", "stream": true, "max_tokens": 20000, "temperature": 0,
        "messages": [{"role": "user", "content": "hello there"}]});
    let mut r = post(&gw, "/v1/chat/completions", &long).await;
    assert_eq!(r.status(), 200);
    let first = read_until(&mut r, "\"content\"").await;
    let pid = backend_state(&gw, "native").await["pid"].as_u64().expect("pid");
    assert!(Command::new("kill").args(["-9", &pid.to_string()]).status().expect("kill").success());
    let text = format!("{first}{}", text_of(r).await);
    assert!(!text.contains("data: [DONE]"), "the server was killed before its end: {text}");
    let last: Value = serde_json::from_str(data_lines(&text).last().expect("events")).expect("json");
    assert_eq!(last["error"]["type"], "backend_error", "{}", &text[text.len().saturating_sub(600)..]);
    let series = |outcome: &str| {
        format!(
            "mlxgate_requests_total{{backend=\"native\",client=\"anonymous\",model=\"qwen\",outcome=\"{outcome}\"}}"
        )
    };
    assert_eq!(metric(&gw, &series("ok")).await, None, "a cut stream is no success");
    assert_eq!(metric(&gw, &series("backend_error")).await, Some(1.0));
    // And the restarted server serves the next request.
    answered(&gw, "qwen", true).await;
}

#[tokio::test]
async fn mlx_openai_server_starts_on_the_first_request() {
    let Some(model) = prerequisites(&[MLX_OPENAI, MLX_LM]) else { return };
    let port = free_port();
    let gw = gateway(&config(&[backend("omni", MLX_OPENAI, &model, port, "")], &[("qwen", "omni")], "")).await;
    answered(&gw, "qwen", true).await;
    answered(&gw, "qwen", false).await;
    assert_eq!(backend_state(&gw, "omni").await["state"], "ready");
    assert_eq!(servers(MLX_OPENAI_PROC, &port.to_string()).len(), 1);
}

#[tokio::test]
async fn alternating_between_two_real_servers_never_runs_both() {
    let Some(model) = prerequisites(&[MLX_LM, MLX_OPENAI]) else { return };
    let (pa, pb) = (free_port(), free_port());
    let gw = gateway(&config(
        &[backend("native", MLX_LM, &model, pa, ""), backend("omni", MLX_OPENAI, &model, pb, "")],
        &[("a", "native"), ("b", "omni")],
        "swap_after: 2s\n",
    ))
    .await;
    let done = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicUsize::new(0));
    let watcher = std::thread::spawn({
        let (done, peak) = (Arc::clone(&done), Arc::clone(&peak));
        let (sa, sb) = (pa.to_string(), pb.to_string());
        move || {
            let mut seen = String::new();
            while !done.load(Ordering::SeqCst) {
                let alive: Vec<u32> =
                    servers(MLX_LM_PROC, &sa).into_iter().chain(servers(MLX_OPENAI_PROC, &sb)).collect();
                if alive.len() > 1 && seen.is_empty() {
                    seen = alive.iter().map(|p| describe_process(*p)).collect::<Vec<_>>().join("\n");
                }
                peak.fetch_max(alive.len(), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(10));
            }
            seen
        }
    });
    for _ in 0..2 {
        answered(&gw, "a", true).await;
        answered(&gw, "b", true).await;
    }
    done.store(true, Ordering::SeqCst);
    let seen = watcher.join().expect("watcher");
    assert_eq!(peak.load(Ordering::SeqCst), 1, "two MLX servers were alive at once:\n{seen}");
    assert_eq!(metric_sum(&gw, "mlxgate_backend_swaps_total").await, Some(3.0));
}

#[tokio::test]
async fn an_idle_mlx_lm_is_unloaded() {
    let Some(model) = prerequisites(&[MLX_LM]) else { return };
    let port = free_port();
    let gw = gateway(&config(
        &[backend("native", MLX_LM, &model, port, "    idle_timeout: 2s\n")],
        &[("qwen", "native")],
        "",
    ))
    .await;
    answered(&gw, "qwen", false).await;
    eventually("idle unload", || async { backend_state(&gw, "native").await["state"] == "stopped" }).await;
    eventually("process gone", || async { servers(MLX_LM_PROC, &port.to_string()).is_empty() }).await;
}

#[tokio::test]
async fn no_mlx_server_outlives_the_gateway_after_sigterm_or_sigkill() {
    let Some(model) = prerequisites(&[MLX_LM]) else { return };
    for signal in ["-TERM", "-KILL"] {
        let port = free_port();
        let text = config(&[backend("native", MLX_LM, &model, port, "    preload: true\n")], &[("qwen", "native")], "");
        // Preload starts the server without any request: wait for it in the log.
        let gateway = gateway_binary(&text, Some("backend ready"));
        let needle = port.to_string();
        assert_eq!(servers(MLX_LM_PROC, &needle).len(), 1);
        assert!(Command::new("kill").args([signal, &gateway.child.id().to_string()]).status().expect("kill").success());
        gateway.exit_status().await;
        eventually(&format!("no mlx_lm.server after {signal}"), || async { servers(MLX_LM_PROC, &needle).is_empty() })
            .await;
    }
}
