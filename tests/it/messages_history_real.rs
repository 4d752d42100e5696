//! `POST /v1/messages`' history translation against a real mlx_lm.server managed by the gateway,
//! serving the tiny model with Qwen3's real chat template (scripts/qwen3-chat-template.jinja:
//! tools, tool calls, tool responses, `<think>`, `enable_thinking`): a Claude-Code-shaped turn (its
//! billing block, system blocks with `cache_control`, a system message inside `messages`, thinking
//! passed back, two tool calls and their results, one an error, `thinking: adaptive`) is translated
//! into messages the server renders and answers, streamed and whole; Anthropic's usage
//! (`input_tokens` + `cache_read_input_tokens`) equals the prompt the gateway's metrics counted,
//! and the same turn sent again is served from the server's prompt cache although its billing nonce
//! changed.

use crate::common::*;
use serde_json::{Value, json};

/// A Claude-Code-shaped request after one tool round trip; `nonce` is the billing line's.
fn claude_turn(stream: bool, nonce: &str) -> Value {
    json!({
        "model": "m", "max_tokens": 8, "stream": stream,
        "system": [
            {"type": "text", "text": format!("x-anthropic-billing-header: cc_version=2.1.332.{nonce}; cc_entrypoint=sdk-cli; cch={nonce};")},
            {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Use the tools.", "cache_control": {"type": "ephemeral"}},
        ],
        "tools": [
            {"name": "Bash", "description": "Runs a command.",
             "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}},
            {"name": "Read", "description": "Reads a file.", "defer_loading": true,
             "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
        ],
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "metadata": {"user_id": "{\"device_id\":\"d\",\"account_uuid\":\"\",\"session_id\":\"s\"}"},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>r</system-reminder>"},
                                         {"type": "text", "text": "list and read the files"}]},
            {"role": "system", "content": [{"type": "text", "text": "# Environment\nPlatform: linux"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "I list, then read.", "signature": ""},
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
                {"type": "tool_use", "id": "toolu_2", "name": "Read", "input": {"path": "a.txt"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true,
                 "content": [{"type": "text", "text": "permission denied"}], "cache_control": {"type": "ephemeral"}},
            ]},
        ],
    })
}

/// The final `message` of a streamed answer (its `message_start` with the content rebuilt and
/// `message_delta`'s stop reason and usage), checked to end with `message_stop`.
fn streamed_message(text: &str) -> Value {
    let events: Vec<Value> = text
        .split("\n\n")
        .filter(|b| b.starts_with("event: "))
        .map(|b| {
            serde_json::from_str(b.lines().nth(1).and_then(|l| l.strip_prefix("data: ")).expect("data")).expect("json")
        })
        .collect();
    assert_eq!(events.last().map(|e| e["type"].clone()), Some(json!("message_stop")), "{text}");
    let mut message = events[0]["message"].clone();
    let delta = events.iter().find(|e| e["type"] == "message_delta").expect("message_delta");
    message["stop_reason"] = delta["delta"]["stop_reason"].clone();
    message["usage"] = delta["usage"].clone();
    message["content"] = json!(events.iter().filter(|e| e["type"] == "content_block_start").count());
    message
}

#[tokio::test]
async fn mlx_lm_server_answers_a_translated_claude_code_turn_with_anthropics_usage() {
    let Some(model) = prerequisites(&["mlx-lm"]) else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    model_with_qwen3_template(&model, dir.path());
    let port = free_port();
    let gw = gateway(&config(&[backend("b", "mlx-lm", dir.path(), port, "")], &[("m", "b")], "")).await;
    let mut prompt_tokens = 0;
    let mut cached_tokens = Vec::new();
    for (stream, nonce) in [(true, "a1"), (false, "b2"), (true, "c3")] {
        let r = client()
            .post(gw.url("/v1/messages?beta=true"))
            .header("x-api-key", "unused")
            .header("anthropic-version", "2023-06-01")
            .json(&claude_turn(stream, nonce))
            .send()
            .await
            .expect("send");
        let status = r.status();
        let text = text_of(r).await;
        assert_eq!(status, 200, "{text}; backend: {}", backend_state(&gw, "b").await);
        let message: Value = if stream { streamed_message(&text) } else { serde_json::from_str(&text).expect("json") };
        eprintln!("stream {stream}: stop {} usage {}", message["stop_reason"], message["usage"]);
        assert_eq!(message["model"], "m");
        // A random-weight model runs to its limit or stops: either way the turn is complete.
        assert!(
            ["end_turn", "max_tokens", "tool_use"].contains(&message["stop_reason"].as_str().unwrap_or_default()),
            "{message}"
        );
        let usage = &message["usage"];
        let input = usage["input_tokens"].as_u64().expect("input_tokens");
        let cached = usage["cache_read_input_tokens"].as_u64().expect("cache_read_input_tokens");
        assert!((1..=8).contains(&usage["output_tokens"].as_u64().expect("output_tokens")), "{usage}");
        // The conversation reached the prompt: far more than the last message's few tokens.
        assert!(input + cached > 80, "{usage}");
        prompt_tokens += input + cached;
        cached_tokens.push(cached);
    }
    // The same turn again with another billing nonce: mlx_lm.server's prompt cache served it
    // (the whole prompt but its last token, as it reports).
    assert!(cached_tokens[1] > 80 && cached_tokens[2] > 80, "{cached_tokens:?}");
    let labels = "backend=\"b\",client=\"anonymous\",model=\"m\"";
    let prompt = metric(&gw, &format!("mlxgate_prompt_tokens_total{{{labels}}}")).await;
    assert_eq!(prompt, Some(prompt_tokens as f64), "input + cache reads are the prompt the metrics count");
    let ok = metric(&gw, &format!("mlxgate_requests_total{{{labels},outcome=\"ok\"}}")).await;
    assert_eq!(ok, Some(3.0));
}
