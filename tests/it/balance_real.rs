//! Two real `mlx_lm.server` processes (managed, off the GPU rotation) behind one model: a
//! `kill -9` of the one serving a stream ends that stream with the error event, requests waiting
//! meanwhile are not lost, later requests are served by the other while it restarts, and it
//! rejoins; the balancer's index of the killed server is emptied by its restart.

use std::process::Command;

use crate::common::*;
use serde_json::{Value, json};

#[tokio::test]
async fn kill_9_of_one_real_mlx_lm_server_mid_stream_the_other_serves_and_it_rejoins() {
    let Some(model) = prerequisites(&["mlx-lm"]) else { return };
    let (pa, pb) = (free_port(), free_port());
    // Streams long enough to be killed in their middle (the cap raised over the tiny model's
    // 2048 positions); both preloaded, off the GPU rotation (both run at once).
    let extra = "    gpu: false\n    preload: true\n    context_cap: 30000\n";
    let backends = [backend("a", "mlx-lm", &model, pa, extra), backend("b", "mlx-lm", &model, pb, extra)];
    let yaml = format!(
        "backends:\n{}models:\n  qwen: {{backends: [a, b], max_wait: 300s, balance: {{policy: round_robin}}}}\n",
        backends.concat()
    );
    let gw = gateway(&yaml).await;
    for name in ["a", "b"] {
        eventually("both ready", || async { backend_state(&gw, name).await["state"] == "ready" }).await;
    }
    // Round robin's first turn: a.
    let long = json!({"model": "qwen", "stream": true, "max_tokens": 20000, "temperature": 0,
        "messages": [{"role": "user", "content": "hello there"}]});
    let mut stream = post(&gw, "/v1/chat/completions", &long).await;
    assert_eq!(stream.status(), 200);
    let first = read_until(&mut stream, "\"content\"").await;
    let pid = backend_state(&gw, "a").await["pid"].as_u64().expect("a runs");
    assert!(Command::new("kill").args(["-9", &pid.to_string()]).status().expect("kill").success());
    let text = format!("{first}{}", text_of(stream).await);
    assert!(!text.contains("data: [DONE]"), "a was killed before its end");
    let last: Value = serde_json::from_str(data_lines(&text).last().expect("events")).expect("json");
    assert_eq!(last["error"]["type"], "backend_error", "{}", &text[text.len().saturating_sub(400)..]);
    // Requests sent now, four at once: every one answered (b serves while a restarts).
    let short = json!({"model": "qwen", "stream": false, "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello again"}]});
    let sends = (0..4).map(|_| {
        let (url, body) = (gw.url("/v1/chat/completions"), short.clone());
        tokio::spawn(async move { client().post(url).json(&body).send().await.map(|r| r.status().as_u16()) })
    });
    for send in sends.collect::<Vec<_>>() {
        assert_eq!(send.await.expect("join").expect("send"), 200);
    }
    eventually("a rejoins", || async { backend_state(&gw, "a").await["state"] == "ready" }).await;
    let state = backend_state(&gw, "a").await;
    assert_eq!(state["restarts"], 1, "{state}");
    // Both serve again: round robin's turns reach a's new process.
    for _ in 0..2 {
        assert_eq!(post(&gw, "/v1/chat/completions", &short).await.status(), 200);
    }
    let ok_on = |backend: &str| {
        format!("mlxgate_requests_total{{backend=\"{backend}\",client=\"anonymous\",model=\"qwen\",outcome=\"ok\"}}")
    };
    assert!(metric(&gw, &ok_on("a")).await.is_some_and(|n| n >= 1.0), "a served after its restart");
    assert!(metric(&gw, &ok_on("b")).await.is_some_and(|n| n >= 4.0), "b served while a restarted");
}
