//! Metrics against the real servers (mlx_lm.server, mlx-openai-server, vllm-mlx, Rapid-MLX,
//! each managed by the gateway, serving the generated tiny model): the generated tokens the
//! gateway counts equal the usage each backend reported to the client, and no TTFT sample is
//! longer than the end-to-end time the client measured.

use std::time::Instant;

use crate::common::*;
use serde_json::{Value, json};

const REQUESTS: usize = 3;

/// Sends REQUESTS chat requests (streams with usage, and one whole answer) through a gateway
/// managing one `kind` server, then checks the gateway's figures against the client's.
async fn check_against(kind: &str) {
    let Some(model) = prerequisites(&[kind, "mlx-lm"]) else { return };
    let port = free_port();
    let gw = gateway(&config(&[backend("b", kind, &model, port, "")], &[("m", "b")], "")).await;
    let mut reported = 0u64;
    let mut e2e_total = 0.0;
    // The answers that showed generated output (a whole answer always does): each has one
    // TTFT sample. A stream of the tiny model may carry none (Rapid-MLX's reasoning parser can
    // hold back every token), and then it has none.
    let mut with_output = 0usize;
    for i in 0..REQUESTS {
        let stream = i + 1 < REQUESTS;
        let body = json!({"model": "m", "stream": stream, "max_tokens": 6 + i,
            "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": format!("hello number {i}")}]});
        let started = Instant::now();
        let r = client()
            .post(gw.url("/v1/chat/completions"))
            .header("x-mlxgate-stats", "1")
            .json(&body)
            .send()
            .await
            .expect("send");
        let status = r.status();
        let headers = r.headers().clone();
        let text = text_of(r).await;
        assert_eq!(status, 200, "{kind}: {text}; backend: {}", backend_state(&gw, "b").await);
        let e2e_ms = started.elapsed().as_secs_f64() * 1000.0;
        e2e_total += e2e_ms / 1000.0;
        let (usage, ttft_ms) = if stream {
            // The last usage the backend sent (vllm-mlx sends it twice).
            let usage = data_lines(&text)
                .iter()
                .rev()
                .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                .find_map(|v| v["usage"]["completion_tokens"].as_u64());
            let output = |v: &Value| {
                let delta = &v["delta"];
                ["content", "reasoning_content", "reasoning"]
                    .iter()
                    .any(|k| delta[*k].as_str().is_some_and(|t| !t.is_empty()))
                    || delta["tool_calls"].as_array().is_some_and(|c| !c.is_empty())
            };
            let streamed_output = data_lines(&text)
                .iter()
                .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                .any(|v| v["choices"].as_array().is_some_and(|c| c.iter().any(output)));
            with_output += usize::from(streamed_output);
            let stats = text.lines().find(|l| l.starts_with(": mlxgate ")).expect("stats line");
            let ttft = stats.split_whitespace().find_map(|w| w.strip_prefix("ttft_ms=")).expect("ttft_ms");
            (usage, ttft.parse::<f64>().ok())
        } else {
            with_output += 1;
            let v: Value = serde_json::from_str(&text).expect("json");
            let ttft = headers.get("x-mlxgate-ttft-ms").and_then(|h| h.to_str().ok()).and_then(|h| h.parse().ok());
            (v["usage"]["completion_tokens"].as_u64(), ttft)
        };
        reported += usage.unwrap_or_else(|| panic!("{kind} reported no usage: {text}"));
        if let Some(ttft) = ttft_ms {
            assert!(ttft <= e2e_ms, "{kind}: TTFT {ttft} ms > the client's end-to-end {e2e_ms} ms");
        }
    }
    let counted = metric(&gw, "mlxgate_generation_tokens_total{backend=\"b\",client=\"anonymous\",model=\"m\"}").await;
    assert_eq!(counted, Some(reported as f64), "{kind}: gateway count vs the usage the backend reported");
    let mut ttft_count = 0.0;
    let mut ttft_sum = 0.0;
    for streaming in ["true", "false"] {
        let labels = format!("backend=\"b\",model=\"m\",streaming=\"{streaming}\"");
        ttft_count +=
            metric(&gw, &format!("mlxgate_time_to_first_token_seconds_count{{{labels}}}")).await.unwrap_or(0.0);
        ttft_sum += metric(&gw, &format!("mlxgate_time_to_first_token_seconds_sum{{{labels}}}")).await.unwrap_or(0.0);
    }
    assert!(with_output >= 1, "{kind}: the whole answer has output");
    assert_eq!(ttft_count, with_output as f64, "{kind}: one TTFT sample per answer that showed output");
    assert!(ttft_sum <= e2e_total, "{kind}: TTFT total {ttft_sum}s > client end-to-end total {e2e_total}s");
}

#[tokio::test]
async fn mlx_lm_server_tokens_and_ttft() {
    check_against("mlx-lm").await;
}

#[tokio::test]
async fn mlx_openai_server_tokens_and_ttft() {
    check_against("mlx-openai-server").await;
}

#[tokio::test]
async fn vllm_mlx_tokens_and_ttft() {
    check_against("vllm-mlx").await;
}

#[tokio::test]
async fn rapid_mlx_tokens_and_ttft() {
    check_against("rapid-mlx").await;
}
