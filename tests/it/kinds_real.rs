//! The kinds mlx-vlm and mlx-omni-server against their real servers (venvs from
//! `scripts/setup-backends mlx-vlm mlx-omni-server`, the generated tiny model), each managed by
//! the gateway: the same checks as the other real servers get (a stream completes, the tokens the
//! gateway counts equal the usage the server reported, kill -9 mid-stream ends the client's
//! stream with an error event, and the server is restarted for the next request). Like the other
//! real-server tests, a missing venv fails the test (see `prerequisites`).

use std::process::Command;

use crate::common::*;
use serde_json::{Value, json};

/// The backend's name in every gateway here.
const BACKEND: &str = "b";

/// A gateway managing one `kind` server (its venv is `.venv-{kind}`) for the model `m`, with
/// the context cap raised so that a 20000-token stream is accepted (the tiny model has 2048
/// positions; the servers generate past them).
async fn managed(kind: &str) -> Option<(Gateway, u16)> {
    // mlx-lm: the tiny model is generated with it.
    let model = prerequisites(&[kind, "mlx-lm"])?;
    let port = free_port();
    let cap = "    context_cap: 30000\n";
    let gw = gateway(&config(&[backend(BACKEND, kind, &model, port, cap)], &[("m", BACKEND)], "")).await;
    Some((gw, port))
}

/// The completion tokens of the last usage in a stream's events, or of a whole answer.
fn usage_of(text: &str, stream: bool) -> Option<u64> {
    if !stream {
        return serde_json::from_str::<Value>(text).ok()?["usage"]["completion_tokens"].as_u64();
    }
    data_lines(text)
        .iter()
        .rev()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|v| v["usage"]["completion_tokens"].as_u64())
}

/// Streams (with usage) and one whole answer through the gateway: each completes, and the
/// generated tokens the gateway counts equal the sum of the usage the server reported.
async fn streams_and_counts(gw: &Gateway, kind: &str) {
    let mut reported = 0;
    for (i, stream) in [true, true, false].into_iter().enumerate() {
        let body = json!({"model": "m", "stream": stream, "max_tokens": 5 + i,
            "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": format!("hello number {i}")}]});
        let r = post(gw, "/v1/chat/completions", &body).await;
        let status = r.status();
        let text = text_of(r).await;
        assert_eq!(status, 200, "{kind}: {text}; backend: {}", backend_state(gw, BACKEND).await);
        if stream {
            assert!(text.trim_end().ends_with("data: [DONE]"), "{kind}: the stream completes: {text}");
        }
        reported += usage_of(&text, stream).unwrap_or_else(|| panic!("{kind} reported no usage: {text}"));
    }
    let series = format!("mlxgate_generation_tokens_total{{backend=\"{BACKEND}\",client=\"anonymous\",model=\"m\"}}");
    assert_eq!(metric(gw, &series).await, Some(reported as f64), "{kind}: gateway count vs the server's usage");
}

/// Kills the server (kill -9) while it streams a long answer: the client's stream ends with an
/// error event and no `[DONE]`, the request counts as a backend error, and the next request is
/// served by a restarted server.
async fn killed_mid_stream(gw: &Gateway, kind: &str) {
    let long = json!({"model": "m", "stream": true, "max_tokens": 20000, "temperature": 0,
        "messages": [{"role": "user", "content": "hello there"}]});
    let mut r = post(gw, "/v1/chat/completions", &long).await;
    assert_eq!(r.status(), 200, "{kind}");
    let first = read_until(&mut r, "\"content\"").await;
    let state = backend_state(gw, BACKEND).await;
    let pid = state["pid"].as_u64().unwrap_or_else(|| panic!("{kind}: no pid in {state}"));
    let restarts = state["restarts"].as_u64().unwrap_or(0);
    assert!(Command::new("kill").args(["-9", &pid.to_string()]).status().expect("kill").success());
    let text = format!("{first}{}", text_of(r).await);
    assert!(!text.contains("data: [DONE]"), "{kind} was killed before its end: {text}");
    let last: Value = serde_json::from_str(data_lines(&text).last().expect("events")).expect("json");
    assert_eq!(last["error"]["type"], "backend_error", "{kind}: {}", &text[text.len().saturating_sub(600)..]);
    let series = format!(
        "mlxgate_requests_total{{backend=\"{BACKEND}\",client=\"anonymous\",model=\"m\",outcome=\"backend_error\"}}"
    );
    assert_eq!(metric(gw, &series).await, Some(1.0), "{kind}");

    let next = json!({"model": "m", "stream": true, "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello again"}]});
    let r = post(gw, "/v1/chat/completions", &next).await;
    let status = r.status();
    let text = text_of(r).await;
    assert_eq!(status, 200, "{kind} after the restart: {text}");
    assert!(text.contains("data: [DONE]"), "{kind} after the restart: {text}");
    let state = backend_state(gw, BACKEND).await;
    assert_eq!(state["restarts"].as_u64(), Some(restarts + 1), "{kind}: {state}");
    assert_ne!(state["pid"].as_u64(), Some(pid), "{kind}: a new process");
}

#[tokio::test]
async fn mlx_vlm_streams_counts_usage_and_survives_kill_9() {
    let Some((gw, port)) = managed("mlx-vlm").await else { return };
    streams_and_counts(&gw, "mlx-vlm").await;
    let pid = backend_state(&gw, BACKEND).await["pid"].as_u64().expect("pid");
    assert_eq!(servers("mlx_vlm.server", &port.to_string()), [pid as u32]);
    killed_mid_stream(&gw, "mlx-vlm").await;
}

#[tokio::test]
async fn mlx_omni_server_streams_counts_usage_and_survives_kill_9() {
    // Started without a model: the warm-up completion names the configured path, which loads it,
    // and every request is forwarded with that path as its model.
    let Some((gw, port)) = managed("mlx-omni-server").await else { return };
    streams_and_counts(&gw, "mlx-omni-server").await;
    let pid = backend_state(&gw, BACKEND).await["pid"].as_u64().expect("pid");
    assert_eq!(servers("mlx-omni-server", &port.to_string()), [pid as u32]);
    killed_mid_stream(&gw, "mlx-omni-server").await;
}
