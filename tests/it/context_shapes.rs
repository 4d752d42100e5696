//! Context caps against `mlxgate-sim` where shortcuts could lie: middle-out forwards the
//! client's own message shapes (not the ones rewritten for counting), and a prompt whose bytes
//! grow under the tokenizer's NFC is still counted exactly.

use std::path::Path;

use crate::common::*;
use serde_json::json;

const QWEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/.cache/qwen3.6-tokenizer");

fn yaml(sim_url: &str, tokenizer: &Path, on_overflow: &str, cap: usize) -> String {
    format!(
        "backends:\n  local: {{url: '{sim_url}', max_concurrency: 2, context_cap: {cap}}}\n\
         models:\n  qwen: {{backend: local, upstream_model: tiny-qwen3, on_overflow: {on_overflow}, \
         tokenizer: '{}', default_max_tokens: 64}}\n",
        tokenizer.display()
    )
}

fn words(n: usize) -> String {
    (0..n).map(|i| ["model", "token", "stream", "cache"][i % 4]).collect::<Vec<_>>().join(" ")
}

/// Middle-out counts messages rewritten as the servers render them, but forwards the client's:
/// a tool call's `arguments` stays a JSON string, text parts stay parts.
#[tokio::test]
async fn middle_out_forwards_the_client_s_message_shapes() {
    let Some(model) = prerequisites(&[]) else { return };
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), &model, "middle_out", 256)).await;
    let messages = json!([
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": words(150)},
        {"role": "user", "content": words(150)},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {"role": "user", "content": [{"type": "text", "text": "and"}, {"type": "text", "text": " now?"}]},
    ]);
    let body = json!({"model": "qwen", "messages": messages, "max_tokens": 16});
    let response = post(&gw, "/v1/chat/completions", &body).await;
    assert_eq!(response.status(), 200, "{}", text_of(response).await);
    let seen = sim_requests(&sim).await;
    let sent = &seen[0]["messages"];
    let call = sent.as_array().unwrap().iter().find(|m| m.get("tool_calls").is_some()).expect("tool call kept");
    assert_eq!(
        call["tool_calls"][0]["function"]["arguments"],
        json!("{\"x\": 1}"),
        "arguments must stay a JSON string: {sent}"
    );
    assert!(sent.as_array().unwrap().last().unwrap()["content"].is_array(), "content parts as sent: {sent}");
}

/// U+1D160 is 4 bytes and 3 code points (12 bytes) after NFC: Qwen3.6 makes 9 tokens of each,
/// the bytes bound says 8, so an over-cap prompt is forwarded instead of rejected.
#[tokio::test]
async fn an_over_cap_prompt_of_nfc_expanding_characters_is_rejected() {
    assert!(Path::new(QWEN).join("tokenizer.json").is_file(), "needs {QWEN}: run scripts/setup-backends tokens");
    let sim = sim().await;
    // 200 × U+1D160: 1808 tokens exactly, bound 1651.
    let gw = gateway(&yaml(&sim.url(), Path::new(QWEN), "reject", 1800)).await;
    let body = json!({"model": "qwen", "max_tokens": 16,
        "messages": [{"role": "user", "content": "\u{1D160}".repeat(200)}]});
    let response = post(&gw, "/v1/chat/completions", &body).await;
    let status = response.status();
    let text = text_of(response).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("context_length_exceeded"), "{text}");
    assert_eq!(sim_stats(&sim).await["total"], 0, "nothing reaches the backend");
}
