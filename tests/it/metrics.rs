//! Streaming metrics through the gateway with `mlxgate-sim` playing each server's style: true
//! TTFT behind fake keepalives, bursts, double usage, byte-at-a-time delivery, error events, the
//! usage chunk removed for clients that did not ask, explicit max_tokens, and the stats line.

use crate::common::*;
use mlxgate::sim::{Behaviour, Style};
use serde_json::{Value, json};

/// Sum of the `_count` and `_sum` of a histogram series with these labels.
async fn histogram(gw: &Gateway, name: &str, labels: &str) -> (f64, f64) {
    let count = metric(gw, &format!("{name}_count{{{labels}}}")).await.unwrap_or(0.0);
    let sum = metric(gw, &format!("{name}_sum{{{labels}}}")).await.unwrap_or(0.0);
    (count, sum)
}

async fn stream(gw: &Gateway, sim: Value, include_usage: bool) -> String {
    let mut body = chat(true, sim);
    body["stream_options"] = json!({"include_usage": include_usage});
    let r = post(gw, "/v1/chat/completions", &body).await;
    assert_eq!(r.status(), 200);
    text_of(r).await
}

const MB: &str = "backend=\"local\",model=\"qwen\"";
/// The labels of the request and token counters (no key: the client is `anonymous`).
const MBC: &str = "backend=\"local\",client=\"anonymous\",model=\"qwen\"";
const MBS: &str = "backend=\"local\",model=\"qwen\",streaming=\"true\"";

#[tokio::test]
async fn ttft_is_the_first_real_token_not_the_fake_keepalive_chunk() {
    let sim = sim_with(Behaviour { style: Some(Style::Omlx), ..Default::default() }).await;
    let gw = gateway(&one_model_yaml(&sim.url(), 2, 4)).await;
    // omlx sends its fake chunk at once; the first token comes 600 ms later.
    let text = stream(&gw, json!({"ttft_ms": 600, "keepalive_ms": 100, "tokens": 3}), false).await;
    assert!(text.contains("chatcmpl-keepalive"), "the client still gets the backend's bytes");
    let (count, sum) = histogram(&gw, "mlxgate_time_to_first_token_seconds", MBS).await;
    assert_eq!(count, 1.0);
    assert!(sum >= 0.6, "TTFT {sum}s must include the whole prefill, not stop at the keepalive");
    let le = |b: &str| format!("mlxgate_time_to_first_token_seconds_bucket{{{MB},streaming=\"true\",le=\"{b}\"}}");
    assert_eq!(metric(&gw, &le("0.5")).await, Some(0.0), "not in a bucket below the real delay");
    assert_eq!(metric(&gw, &le("1800")).await, Some(1.0));
}

#[tokio::test]
async fn a_burst_gives_no_decode_speed_sample_and_is_counted() {
    let sim = sim().await;
    let gw = gateway(&one_model_yaml(&sim.url(), 2, 4)).await;
    stream(&gw, json!({"tokens": 8, "burst": true}), true).await;
    assert_eq!(metric(&gw, "mlxgate_stream_bursts_total{backend=\"local\"}").await, Some(1.0));
    assert_eq!(histogram(&gw, "mlxgate_generation_tokens_per_second", MB).await.0, 0.0);
    assert_eq!(metric(&gw, &format!("mlxgate_generation_tokens_total{{{MBC}}}")).await, Some(8.0));

    // The same answer spread out gives one true sample.
    stream(&gw, json!({"tokens": 8, "tokens_per_second": 50}), true).await;
    let (count, sum) = histogram(&gw, "mlxgate_generation_tokens_per_second", MB).await;
    assert_eq!(count, 1.0);
    assert!(sum > 5.0 && sum <= 50.5, "decode speed {sum} cannot beat the backend's 50 tokens/s");
}

#[tokio::test]
async fn usage_sent_twice_is_counted_once() {
    let sim = sim_with(Behaviour { style: Some(Style::VllmMlx), ..Default::default() }).await;
    let gw = gateway(&one_model_yaml(&sim.url(), 2, 4)).await;
    let text = stream(&gw, json!({"tokens": 5}), true).await;
    assert_eq!(data_lines(&text).iter().filter(|d| d.contains("\"usage\"")).count(), 2);
    assert_eq!(metric(&gw, &format!("mlxgate_generation_tokens_total{{{MBC}}}")).await, Some(5.0));
    assert_eq!(metric(&gw, &format!("mlxgate_prompt_tokens_total{{{MBC}}}")).await, Some(2.0));
}

#[tokio::test]
async fn byte_at_a_time_gives_the_same_metrics_and_bytes_as_whole_frames() {
    let sim = sim().await;
    let whole_gw = gateway(&one_model_yaml(&sim.url(), 2, 4)).await;
    let split_gw = gateway(&one_model_yaml(&sim.url(), 2, 4)).await;
    let whole = stream(&whole_gw, json!({"tokens": 6, "tokens_per_second": 100}), true).await;
    let split = stream(&split_gw, json!({"tokens": 6, "tokens_per_second": 100, "bytes_per_write": 1}), true).await;
    let strip = |t: &str| -> Vec<Value> {
        data_lines(t)
            .iter()
            .filter(|d| *d != "[DONE]")
            .map(|d| {
                let mut v: Value = serde_json::from_str(d).expect("json");
                v["id"] = Value::Null;
                v["created"] = Value::Null;
                v
            })
            .collect()
    };
    assert_eq!(strip(&whole), strip(&split));
    for gw in [&whole_gw, &split_gw] {
        assert_eq!(metric(gw, &format!("mlxgate_generation_tokens_total{{{MBC}}}")).await, Some(6.0));
        assert_eq!(histogram(gw, "mlxgate_time_to_first_token_seconds", MBS).await.0, 1.0);
        assert_eq!(histogram(gw, "mlxgate_generation_tokens_per_second", MB).await.0, 1.0);
        // The series exists from start-up (at 0); no stream was a burst.
        assert_eq!(metric(gw, "mlxgate_stream_bursts_total{backend=\"local\"}").await, Some(0.0));
    }
}

#[tokio::test]
async fn an_error_event_fails_the_request_whatever_follows() {
    let sim = sim_with(Behaviour { style: Some(Style::MlxOpenaiServer), ..Default::default() }).await;
    let gw = gateway(&one_model_yaml(&sim.url(), 2, 4)).await;
    let text = stream(&gw, json!({"tokens": 6, "error_after": 2}), true).await;
    assert!(text.contains("\"finish_reason\":\"stop\"") && text.contains("[DONE]"), "{text}");
    let series = format!("mlxgate_requests_total{{{MBC},outcome=\"stream_error\"}}");
    assert_eq!(metric(&gw, &series).await, Some(1.0));
    assert_eq!(metric(&gw, &format!("mlxgate_requests_total{{{MBC},outcome=\"ok\"}}")).await, None);
}

#[tokio::test]
async fn usage_is_asked_for_and_removed_for_clients_that_did_not_ask() {
    let sim = sim_with(Behaviour { style: Some(Style::MlxLm), ..Default::default() }).await;
    let gw = gateway(&one_model_yaml(&sim.url(), 2, 4)).await;
    let mut body = chat(true, json!({"tokens": 3}));
    body.as_object_mut().expect("object").remove("stream_options");
    let text = text_of(post(&gw, "/v1/chat/completions", &body).await).await;
    assert!(!text.contains("\"usage\""), "the client did not ask for usage: {text}");
    assert!(text.ends_with("data: [DONE]\n\n"));
    let seen = &sim.state.requests()[0];
    assert_eq!(seen["stream_options"]["include_usage"], true, "the backend was asked");
    assert_eq!(seen["max_tokens"], 4096, "an explicit max_tokens (mlx_lm.server would stop at 512)");
    assert_eq!(metric(&gw, &format!("mlxgate_generation_tokens_total{{{MBC}}}")).await, Some(3.0));

    let with = stream(&gw, json!({"tokens": 3}), true).await;
    assert!(with.contains("\"usage\""), "a client that asked gets it");
    assert_eq!(sim.state.requests()[1]["max_tokens"], 4096);
}

#[tokio::test]
async fn no_usage_means_the_token_count_is_unknown_not_guessed() {
    let sim = sim().await;
    let gw = gateway(&one_model_yaml(&sim.url(), 2, 4)).await;
    stream(&gw, json!({"tokens": 4, "usage": "none"}), true).await;
    assert_eq!(metric(&gw, &format!("mlxgate_generation_tokens_total{{{MBC}}}")).await, None);
    assert_eq!(metric(&gw, &format!("mlxgate_generation_tokens_unknown_total{{{MBC}}}")).await, Some(1.0));
    assert_eq!(histogram(&gw, "mlxgate_generation_tokens_per_second", MB).await.0, 0.0);
}

#[tokio::test]
async fn usage_without_output_frames_is_a_mismatch() {
    let sim = sim_with(Behaviour { style: Some(Style::RapidMlx), ..Default::default() }).await;
    let gw = gateway(&one_model_yaml(&sim.url(), 2, 4)).await;
    stream(&gw, json!({"tokens": 4, "content_field": "none"}), true).await;
    assert_eq!(metric(&gw, "mlxgate_usage_mismatch_total{backend=\"local\"}").await, Some(1.0));
    assert_eq!(metric(&gw, &format!("mlxgate_generation_tokens_total{{{MBC}}}")).await, Some(4.0));
}

#[tokio::test]
async fn stats_for_clients_and_benchmarks() {
    let sim = sim().await;
    let gw = gateway(&one_model_yaml(&sim.url(), 2, 4)).await;
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .header("x-mlxgate-stats", "1")
        .json(&chat(true, json!({"tokens": 4, "tokens_per_second": 100})))
        .send()
        .await
        .expect("send");
    let text = text_of(r).await;
    let line = text.lines().find(|l| l.starts_with(": mlxgate ")).expect("stats comment");
    assert!(
        line.contains("queue_ms=") && line.contains("ttft_ms=") && line.contains("tokens=4") && line.contains("tps=")
    );
    assert!(!stream(&gw, json!({}), false).await.contains(": mlxgate "), "only when asked");

    let r = post(&gw, "/v1/chat/completions", &chat(false, json!({"tokens": 5}))).await;
    for h in ["x-mlxgate-queue-ms", "x-mlxgate-ttft-ms", "x-mlxgate-tokens-per-second"] {
        assert!(r.headers().contains_key(h), "{h}");
    }
    // Over the backend's whole time (20 ms prefill + 4 tokens at 200/s), never over the
    // moment it took to read an answer that arrived complete.
    let tps: f64 = r.headers()["x-mlxgate-tokens-per-second"].to_str().expect("ascii").parse().expect("number");
    assert!(tps > 0.0 && tps <= 200.0, "{tps} tokens/s is faster than the backend generated");
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["usage"]["completion_tokens"], 5);
    let whole = "backend=\"local\",model=\"qwen\",streaming=\"false\"";
    assert_eq!(histogram(&gw, "mlxgate_time_to_first_token_seconds", whole).await.0, 1.0);
}

#[tokio::test]
async fn metrics_on_their_own_listener() {
    let sim = sim().await;
    let port = free_port();
    let gw = gateway(&format!("metrics_listen: 127.0.0.1:{port}\n{}", one_model_yaml(&sim.url(), 2, 4))).await;
    stream(&gw, json!({"tokens": 2}), true).await;
    let url = format!("http://127.0.0.1:{port}/metrics");
    eventually("metrics listener up", || {
        let url = url.clone();
        async move { client().get(url).send().await.is_ok() }
    })
    .await;
    let text = client().get(&url).send().await.expect("send").text().await.expect("text");
    assert!(text.contains("mlxgate_generation_tokens_total"), "{text}");
}

#[tokio::test]
async fn a_refusal_records_its_duration_under_its_outcome() {
    let sim = sim().await;
    let gw = gateway(&one_model_yaml(&sim.url(), 2, 4)).await;
    // Refused before it was routed (a model nobody configured): its duration, unrouted.
    let unknown = json!({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(post(&gw, "/v1/chat/completions", &unknown).await.status(), 404);
    let refused = "backend=\"\",model=\"\",outcome=\"invalid_request_error\"";
    assert_eq!(histogram(&gw, "mlxgate_request_duration_seconds", refused).await.0, 1.0);
    // An answer's duration goes under its own outcome.
    stream(&gw, json!({"tokens": 2}), true).await;
    let answered = format!("{MB},outcome=\"ok\"");
    assert_eq!(histogram(&gw, "mlxgate_request_duration_seconds", &answered).await.0, 1.0);
}
