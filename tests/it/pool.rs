//! One model served by two backends (`backends: [a, b]`): late binding (a waiting request goes
//! to whichever backend frees a slot first), failover before the first byte (a backend that
//! answers 503, hangs, or refuses connections: the other serves the request), drain (a running
//! stream completes, new requests go to the other), and `kill -9` of one managed backend
//! mid-stream (that stream ends with the error event, later requests are served).

use std::process::Command;

use crate::common::*;
use mlxgate::sim::{Behaviour, SimHandle};
use serde_json::{Value, json};

const SIM: &str = env!("CARGO_BIN_EXE_mlxgate-sim");

/// A gateway whose model `qwen` is served by remote backends `a` (`a_url`) and `b` (`b_url`),
/// one slot each, with `extra` keys on both. The model is balanced `round_robin`, so that which
/// backend a request is offered first is known (the counter's turn, from `a`): these tests
/// are about the pool's binding, failover and drain, not about the policy.
fn two_remote_yaml(a_url: &str, b_url: &str, extra: &str) -> String {
    two_remote_yaml_with(a_url, b_url, 1, extra)
}

/// As [`two_remote_yaml`] with `slots` slots each.
fn two_remote_yaml_with(a_url: &str, b_url: &str, slots: usize, extra: &str) -> String {
    format!(
        "backends:\n  a: {{url: '{a_url}', max_concurrency: {slots}{extra}}}\n  b: {{url: '{b_url}', max_concurrency: {slots}{extra}}}\n\
         models:\n  qwen: {{backends: [a, b], upstream_model: tiny-qwen3, max_queue: 8, max_wait: 120s, balance: {{policy: round_robin}}}}\n"
    )
}

async fn total(sim: &SimHandle) -> u64 {
    sim_stats(sim).await["total"].as_u64().expect("total")
}

async fn held(sim: &SimHandle) -> u64 {
    sim_stats(sim).await["held"].as_u64().expect("held")
}

async fn release(sim: &SimHandle, key: &str) {
    let r = client().post(format!("{}/sim/release/{key}", sim.url())).send().await.expect("release");
    assert!(r.status().is_success());
}

/// A streaming request held at its backend after its first token, until `key` is released.
fn held_stream(gw: &Gateway, key: &str) -> tokio::task::JoinHandle<(u16, String)> {
    let url = gw.url("/v1/chat/completions");
    let body = chat(true, json!({"tokens": 3, "hold_after": 1, "hold_key": key}));
    tokio::spawn(async move {
        let r = client().post(url).json(&body).send().await.expect("send");
        (r.status().as_u16(), text_of(r).await)
    })
}

#[tokio::test]
async fn a_waiting_request_goes_to_whichever_backend_frees_a_slot_first() {
    let (a, b) = (sim().await, sim().await);
    let gw = gateway(&two_remote_yaml(&a.url(), &b.url(), "")).await;
    // One slot each, both taken (round robin: the first to a, the second to b).
    let first = held_stream(&gw, "k1");
    eventually("the first held at a", || async { held(&a).await == 1 }).await;
    let second = held_stream(&gw, "k2");
    eventually("the second held at b", || async { held(&b).await == 1 }).await;
    // The third waits in the model's one queue, bound to no backend yet.
    let third = tokio::spawn({
        let url = gw.url("/v1/chat/completions");
        async move { client().post(url).json(&chat(false, json!({"tokens": 2}))).send().await.expect("send").status() }
    });
    eventually("the third waits", || async { metric(&gw, "mlxgate_queue_depth{model=\"qwen\"}").await == Some(1.0) })
        .await;
    release(&b, "k2").await;
    assert_eq!(third.await.expect("task"), 200);
    assert_eq!((total(&a).await, total(&b).await), (1, 2), "b freed first and served the waiting request");
    release(&a, "k1").await;
    for task in [first, second] {
        let (status, text) = task.await.expect("task");
        assert_eq!(status, 200);
        assert!(text.contains("[DONE]"), "{text}");
    }
}

#[tokio::test]
async fn a_backend_answering_503_before_its_first_byte_is_failed_over_then_ejected() {
    let bad = sim_with(Behaviour { fail_status: Some(503), ..Default::default() }).await;
    let good = sim().await;
    let gw = gateway(&two_remote_yaml(&bad.url(), &good.url(), "")).await;
    for stream in [false, true, false, true, false, false] {
        let r = post(&gw, "/v1/chat/completions", &chat(stream, json!({"tokens": 2}))).await;
        assert_eq!(r.status(), 200, "served by the other backend");
        let text = text_of(r).await;
        assert!(!text.contains("\"error\""), "{text}");
    }
    assert_eq!(total(&good).await, 6, "every request served by the good backend");
    // Three failures in a row eject the bad one: it is no longer tried.
    assert_eq!(total(&bad).await, 3, "tried until ejected, then left alone");
    assert_eq!(backend_state(&gw, "a").await["health"], "ejected");
}

#[tokio::test]
async fn a_backend_that_hangs_before_its_first_byte_is_failed_over() {
    let hung = sim_with(Behaviour { hang: Some(true), ..Default::default() }).await;
    let good = sim().await;
    let gw = gateway(&two_remote_yaml(&hung.url(), &good.url(), ", first_byte_timeout: 1s")).await;
    let r = post(&gw, "/v1/chat/completions", &chat(false, json!({"tokens": 2}))).await;
    assert_eq!(r.status(), 200, "served by the other after the first one's first_byte_timeout");
    assert_eq!((total(&hung).await, total(&good).await), (1, 1));
}

#[tokio::test]
async fn a_backend_refusing_connections_is_failed_over() {
    let good = sim().await;
    let closed = format!("http://127.0.0.1:{}", free_port());
    let gw = gateway(&two_remote_yaml(&closed, &good.url(), "")).await;
    for stream in [false, true] {
        let r = post(&gw, "/v1/chat/completions", &chat(stream, json!({"tokens": 2}))).await;
        assert_eq!(r.status(), 200, "served by the other");
        assert!(text_of(r).await.contains("t1"), "the answer's text");
    }
    assert_eq!(total(&good).await, 2);
}

#[tokio::test]
async fn a_drained_backend_finishes_its_stream_and_takes_no_new_request() {
    let (a, b) = (sim().await, sim().await);
    let gw = gateway(&two_remote_yaml_with(&a.url(), &b.url(), 4, "")).await;
    let running = held_stream(&gw, "d1");
    eventually("the stream held at a", || async { held(&a).await == 1 }).await;
    let drained = client().post(gw.url("/admin/backends/a/drain")).send().await.expect("drain");
    assert_eq!(drained.status(), 200);
    assert_eq!(drained.json::<Value>().await.expect("json")["drained"], true);
    assert_eq!(backend_state(&gw, "a").await["drained"], true);
    for _ in 0..3 {
        assert_eq!(post(&gw, "/v1/chat/completions", &chat(false, json!({"tokens": 2}))).await.status(), 200);
    }
    assert_eq!((total(&a).await, total(&b).await), (1, 3), "new requests went to b");
    release(&a, "d1").await;
    let (status, text) = running.await.expect("task");
    assert_eq!(status, 200);
    assert!(text.contains("[DONE]"), "the drained backend's stream completed: {text}");
    let undrained = client().post(gw.url("/admin/backends/a/undrain")).send().await.expect("undrain");
    assert_eq!(undrained.json::<Value>().await.expect("json")["drained"], false);
    assert_eq!(post(&gw, "/v1/chat/completions", &chat(false, json!({"tokens": 2}))).await.status(), 200);
    assert_eq!(total(&a).await, 2, "undrained: a serves again (round robin's turn)");
}

#[tokio::test]
async fn kill_9_of_one_managed_backend_mid_stream_ends_that_stream_and_the_other_serves() {
    let (pa, pb) = (free_port(), free_port());
    let backend = |name: &str, port: u16| {
        format!(
            "  {name}:\n    kind: custom\n    command: ['{SIM}', '--port', '{{port}}', '--style', 'mlx-lm']\n    \
             port: {port}\n    max_concurrency: 2\n    stop_timeout: 5s\n    gpu: false\n    preload: true\n"
        )
    };
    let yaml = format!(
        "backends:\n{}{}models:\n  qwen: {{backends: [a, b], upstream_model: tiny-qwen3, max_wait: 120s, balance: {{policy: round_robin}}}}\n",
        backend("a", pa),
        backend("b", pb)
    );
    let gw = gateway(&yaml).await;
    for name in ["a", "b"] {
        eventually("both ready", || async { backend_state(&gw, name).await["state"] == "ready" }).await;
    }
    let pid = backend_state(&gw, "a").await["pid"].as_u64().expect("pid");
    // The first request goes to a (round robin's first turn); it is held after a token.
    let mut stream =
        post(&gw, "/v1/chat/completions", &chat(true, json!({"tokens": 5, "hold_after": 1, "hold_key": "x"}))).await;
    assert_eq!(stream.status(), 200);
    read_until(&mut stream, "t0").await;
    assert!(Command::new("kill").args(["-9", &pid.to_string()]).status().expect("kill").success());
    let text = text_of(stream).await;
    let last: Value = serde_json::from_str(data_lines(&text).last().expect("an event")).expect("json");
    assert_eq!(last["error"]["type"], "backend_error", "the cut stream ends with the error event: {text}");
    // Requests sent now are served (by b while a restarts).
    for _ in 0..4 {
        assert_eq!(post(&gw, "/v1/chat/completions", &chat(false, json!({"tokens": 2}))).await.status(), 200);
    }
    eventually("a rejoins", || async { backend_state(&gw, "a").await["state"] == "ready" }).await;
}

#[tokio::test]
async fn a_remote_backend_whose_ready_path_fails_is_ejected_by_its_probe_alone() {
    let (a, b) = (sim().await, sim().await);
    let health = ", health: {interval: 200ms, timeout: 1s, failures: 2, eject_for: 60s}";
    let gw = gateway(&two_remote_yaml(&a.url(), &b.url(), health)).await;
    assert_eq!(backend_state(&gw, "a").await["health"], "healthy");
    a.kill();
    eventually("a's failed probes eject it", || async { backend_state(&gw, "a").await["health"] == "ejected" }).await;
    assert_eq!(backend_state(&gw, "b").await["health"], "healthy");
    for _ in 0..3 {
        assert_eq!(post(&gw, "/v1/chat/completions", &chat(false, json!({"tokens": 2}))).await.status(), 200);
    }
    assert_eq!(total(&b).await, 3, "b serves everything while a is out");
}

#[tokio::test]
async fn a_failure_with_no_other_backend_taking_requests_is_the_clients_at_once() {
    // b drained: a's 503 has nowhere to go. The client gets a's own error, not the queue's
    // timeout after waiting out max_wait behind a backend that takes nothing.
    let bad = sim_with(Behaviour { fail_status: Some(503), ..Default::default() }).await;
    let other = sim().await;
    let yaml = format!(
        "backends:\n  a: {{url: '{}', max_concurrency: 1}}\n  b: {{url: '{}', max_concurrency: 1}}\n\
         models:\n  qwen: {{backends: [a, b], upstream_model: tiny-qwen3, max_wait: 3s, balance: {{policy: round_robin}}}}\n",
        bad.url(),
        other.url()
    );
    let gw = gateway(&yaml).await;
    assert_eq!(client().post(gw.url("/admin/backends/b/drain")).send().await.expect("drain").status(), 200);
    let r = post(&gw, "/v1/chat/completions", &chat(false, json!({"tokens": 2}))).await;
    assert_eq!(r.status(), 503);
    let text = text_of(r).await;
    assert!(text.contains("simulated failure"), "a's own error, not the queue's: {text}");
    assert_eq!((total(&bad).await, total(&other).await), (1, 0));
}
