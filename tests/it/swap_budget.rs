//! Swaps that cost what they must (issue 22), with `mlxgate-sim` as the GPU servers:
//! - a loaded backend is kept 4× a round trip's measured starts (`loading_share: 0.2`),
//!   read from the gateway's own figures (`/admin/backends`), and the swap is counted by reason;
//! - backends whose footprints fit `gpu_memory_budget` run side by side with no swap, and never
//!   more than fit, sampled throughout alternating demand and `kill -9`s of the servers;
//! - a footprint not written is measured from the server's resident memory once it is ready;
//! - a model's `fallback:` serves its requests while its backend would need a swap, and says so.
//!
//! The pure rules and their random schedules are `dispatch::scheduler`'s unit tests and
//! `swap_schedule.rs`; the real servers, `bench/swaps`.

use std::process::Command;

use crate::common::*;
use serde_json::{Value, json};

const SIM: &str = env!("CARGO_BIN_EXE_mlxgate-sim");

/// A managed GPU sim backend named `name` on `port` that takes `start_secs` to start (a shell
/// sleeps, then becomes the server), with `extra` keys.
pub(crate) fn slow_sim(name: &str, port: u16, start_secs: u32, extra: &str) -> String {
    let command = if start_secs == 0 {
        format!("['{SIM}', '--port', '{{port}}', '--style', 'mlx-lm']")
    } else {
        format!("['sh', '-c', 'sleep {start_secs}; exec {SIM} --port {{port}} --style mlx-lm']")
    };
    format!(
        "  {name}:\n    kind: custom\n    command: {command}\n    port: {port}\n    max_concurrency: 2\n    \
         stop_timeout: 5s\n{extra}"
    )
}

pub(crate) fn yaml(top: &str, backends: &[String], models: &str) -> String {
    format!("{top}backends:\n{}models:\n{models}", backends.concat())
}

pub(crate) fn ask(model: &str, sim: Value) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "sim": sim})
}

async fn chat(gw: &Gateway, model: &str) -> reqwest::Response {
    post(gw, "/v1/chat/completions", &ask(model, json!({"tokens": 2}))).await
}

fn pid_of(state: &Value) -> Option<u32> {
    state["pid"].as_u64().and_then(|p| u32::try_from(p).ok())
}

#[tokio::test]
async fn a_loaded_backend_is_kept_four_times_the_round_trips_starts_before_a_swap() {
    let (pa, pb) = (free_port(), free_port());
    let models = "  ma: {backend: a, max_wait: 120s}\n  mb: {backend: b, max_wait: 120s}\n";
    let gw = gateway(&yaml("swap_after: 1s\n", &[slow_sim("a", pa, 2, ""), slow_sim("b", pb, 2, "")], models)).await;
    // Each starts once, so that its start time is known.
    for model in ["ma", "mb", "ma"] {
        assert_eq!(chat(&gw, model).await.status(), 200, "{model}");
    }
    let b = backend_state(&gw, "b").await;
    let b_start = b["start_seconds"].as_f64().expect("b's start was measured");
    let b_stay = b["last_residency_seconds"].as_f64().expect("b served, then was swapped out");
    let a_start = backend_state(&gw, "a").await["start_seconds"].as_f64().expect("a's start was measured");
    assert!(b_start >= 2.0 && a_start >= 2.0, "each sleeps 2 s before it serves: {a_start} {b_start}");
    // a is ready and busy with a held stream (no slot moves: stalled) when b's request comes.
    let held = held_stream(&gw, "ma", "h").await;
    let waiting = tokio::spawn({
        let url = gw.url("/v1/chat/completions");
        async move { client().post(url).json(&ask("mb", json!({}))).send().await.expect("send").status() }
    });
    eventually("a is drained for b", || async { backend_state(&gw, "a").await["state"] == "draining" }).await;
    let a = backend_state(&gw, "a").await;
    let kept = a["uptime_seconds"].as_u64().expect("a's uptime") as f64;
    // The round trip (b started, a started again) costs a_start + b_start; b stayed b_stay the
    // last time; a stays the rest of four times the two starts.
    let owed = 4.0 * (a_start + b_start) - b_stay;
    assert!(
        kept >= owed.floor(),
        "a was swapped out after {kept} s of service; the starts take {a_start} + {b_start} s and b stayed \
         {b_stay} s: loading would be over a fifth"
    );
    client().post(format!("http://127.0.0.1:{pa}/sim/release/h")).send().await.expect("release");
    assert!(text_of(held).await.contains("[DONE]"));
    assert_eq!(waiting.await.expect("task"), 200);
    // b's request was due and a had served its residency (a had no waiter of its own).
    let due = "mlxgate_backend_swaps_total{backend=\"a\",reason=\"due\"}";
    assert_eq!(metric(&gw, due).await, Some(1.0), "the swap is counted by its reason");
    let starting = metric_sum(&gw, "mlxgate_backend_starting_seconds_total").await.expect("starting seconds");
    assert!(starting >= 8.0, "four starts of at least 2 s each: {starting}");
}

#[tokio::test]
async fn backends_that_fit_the_budget_run_side_by_side_and_never_more_than_fit_through_kills() {
    let ports = [free_port(), free_port(), free_port()];
    let footprint = "    footprint: 10GB\n";
    let backends: Vec<String> = ["a", "b", "c"].iter().zip(ports).map(|(n, p)| slow_sim(n, p, 0, footprint)).collect();
    let models = "  ma: {backend: a, max_wait: 120s}\n  mb: {backend: b, max_wait: 120s}\n  \
                  mc: {backend: c, max_wait: 120s}\n";
    // Two fit (20 GB of 25), three do not.
    let gw = gateway(&yaml("swap_after: 1s\ngpu_memory_budget: 25GB\n", &backends, models)).await;
    let watcher = ServerWatch::start(SIM, ports.iter().map(u16::to_string).collect());
    for round in 0..3 {
        for model in ["ma", "mb"] {
            assert_eq!(chat(&gw, model).await.status(), 200, "round {round} {model}");
        }
    }
    assert_eq!(backend_state(&gw, "a").await["state"], "ready");
    assert_eq!(backend_state(&gw, "b").await["state"], "ready");
    assert_eq!(metric_sum(&gw, "mlxgate_backend_swaps_total").await, Some(0.0), "a and b fit: no swap");
    // A third one does not fit: a swap makes room, and never are three alive.
    let mut kills = 0;
    for round in 0..4 {
        for model in ["mc", "ma", "mb"] {
            assert_eq!(chat(&gw, model).await.status(), 200, "round {round} {model}");
            // kill -9 whatever server serves `model` every other turn: its restart must respect the budget too.
            if (round + kills) % 2 == 0 {
                let name = &model[1..];
                if let Some(pid) = pid_of(&backend_state(&gw, name).await) {
                    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
                    kills += 1;
                }
            }
        }
    }
    assert!(kills >= 4, "{kills} kills");
    let peak = watcher.peak();
    assert!(peak <= 2, "{peak} GPU servers alive at once: only two fit the budget");
    assert!(metric_sum(&gw, "mlxgate_backend_swaps_total").await.is_some_and(|s| s >= 1.0), "c needed room");
    let admin: Value = client().get(gw.url("/admin/backends")).send().await.expect("send").json().await.expect("json");
    assert_eq!(admin["scheduler"]["gpu_memory_budget_bytes"], 25_000_000_000u64);
    let a = backend_state(&gw, "a").await;
    assert_eq!(a["footprint_bytes"], 10_000_000_000u64);
    assert_eq!(a["footprint_source"], "configured");
}

#[tokio::test]
async fn a_footprint_not_written_is_measured_once_the_server_is_ready() {
    let port = free_port();
    let gw = gateway(&yaml("gpu_memory_budget: 64GB\n", &[slow_sim("a", port, 0, "")], "  ma: {backend: a}\n")).await;
    assert_eq!(backend_state(&gw, "a").await["footprint_source"], "unknown");
    assert_eq!(chat(&gw, "ma").await.status(), 200);
    eventually("a measured footprint", || async { backend_state(&gw, "a").await["footprint_source"] == "measured" })
        .await;
    let bytes = backend_state(&gw, "a").await["footprint_bytes"].as_u64().expect("bytes");
    assert!(bytes > 1 << 20, "a running simulator holds more than 1 MiB resident: {bytes}");
    let gauge = metric(&gw, "mlxgate_backend_footprint_bytes{backend=\"a\"}").await.expect("gauge");
    assert!(gauge >= bytes as f64 * 0.5, "the gauge follows the most measured: {gauge} vs {bytes}");
}

#[tokio::test]
async fn a_fallback_serves_the_model_whose_backend_would_need_a_swap_and_says_so() {
    let (pa, pb) = (free_port(), free_port());
    let models = "  coder: {backend: a, max_wait: 120s}\n  haiku: {backend: b, max_wait: 120s, fallback: coder}\n";
    let config = yaml("swap_after: 1s\n", &[slow_sim("a", pa, 0, ""), slow_sim("b", pb, 0, "")], models);
    let gw = gateway(&config).await;
    assert_eq!(chat(&gw, "coder").await.status(), 200);
    for _ in 0..3 {
        let r = chat(&gw, "haiku").await;
        assert_eq!(r.status(), 200);
        let header = r.headers().get("x-mlxgate-fallback").map(|v| v.to_str().expect("ascii").to_string());
        assert_eq!(header.as_deref(), Some("coder"), "the answer says which model served it");
        assert_eq!(r.json::<Value>().await.expect("json")["model"], "haiku", "the answer carries the name asked for");
    }
    assert_eq!(backend_state(&gw, "b").await["state"], "stopped", "haiku's backend was never started");
    assert_eq!(metric_sum(&gw, "mlxgate_backend_swaps_total").await, Some(0.0));
    let fallbacks = "mlxgate_model_fallbacks_total{fallback=\"coder\",model=\"haiku\"}";
    assert_eq!(metric(&gw, fallbacks).await, Some(3.0));
    let admin: Value = client().get(gw.url("/admin/backends")).send().await.expect("send").json().await.expect("json");
    assert_eq!(admin["models"]["haiku"]["fallback"], "coder");

    // With the GPU free, haiku's own backend starts for it: no fallback.
    let gw = gateway(&config).await;
    let r = chat(&gw, "haiku").await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("x-mlxgate-fallback").is_none());
    assert_eq!(r.json::<Value>().await.expect("json")["model"], "haiku");
}

#[tokio::test]
async fn a_fallback_answer_is_logged_with_the_model_it_stood_in_for() {
    let (pa, pb) = (free_port(), free_port());
    let models = "  coder: {backend: a, max_wait: 120s}\n  haiku: {backend: b, max_wait: 120s, fallback: coder}\n";
    let config = yaml("swap_after: 1s\n", &[slow_sim("a", pa, 0, ""), slow_sim("b", pb, 0, "")], models);
    let (gw, lines) = gateway_binary_logged(&config, &[], "info");
    let url = format!("{}/v1/chat/completions", gw.url);
    for model in ["coder", "haiku"] {
        let r = client().post(&url).json(&ask(model, json!({"tokens": 2}))).send().await.expect("send");
        assert_eq!(r.status(), 200, "{model}");
    }
    eventually("two access lines", || async {
        lines.lock().expect("log").iter().filter(|l| l.contains("mlxgate::access")).count() >= 2
    })
    .await;
    let access: Vec<String> =
        lines.lock().expect("log").iter().filter(|l| l.contains("mlxgate::access")).cloned().collect();
    assert!(!access[0].contains("fallback_from"), "{}", access[0]);
    assert!(access[1].contains("fallback_from=\"haiku\"") && access[1].contains("model=\"coder\""), "{}", access[1]);
    assert!(access[1].contains("backend=a"), "{}", access[1]);
}
