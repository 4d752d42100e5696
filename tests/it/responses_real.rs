//! `POST /v1/responses` against a real mlx_lm.server managed by the gateway, serving the tiny
//! model with Qwen3's real chat template (scripts/qwen3-chat-template.jinja: tools, tool calls,
//! tool responses, `<think>`): a Codex-shaped conversation (instructions, a developer message,
//! reasoning passed back, a function call and its output, a custom tool) is translated into
//! messages the server renders and answers, streamed and whole, and the usage each answer
//! reports equals what the gateway's metrics counted; a call cut mid-arguments and sent back is
//! answered too.

use crate::common::*;
use serde_json::{Value, json};

/// A Codex-shaped request: its conversation after one tool round trip.
fn codex_turn(stream: bool) -> Value {
    json!({
        "model": "m", "stream": stream, "store": false, "max_output_tokens": 8,
        "instructions": "You are a coding agent.",
        "include": ["reasoning.encrypted_content"], "reasoning": {"summary": "auto"},
        "prompt_cache_key": "00000000-0000-7000-8000-000000000001", "tool_choice": "auto", "parallel_tool_calls": true,
        "tools": [
            {"type": "function", "name": "exec_command", "description": "Runs a command.", "strict": false,
             "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}},
            {"type": "custom", "name": "apply_patch", "description": "Edits files.",
             "format": {"type": "grammar", "syntax": "lark", "definition": "start: \"*** Begin Patch\""}},
            {"type": "web_search"},
        ],
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files"}]},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "I run ls."}]},
            {"type": "function_call", "name": "exec_command", "arguments": "{\"cmd\":\"ls\"}", "call_id": "call_1"},
            {"type": "function_call_output", "call_id": "call_1", "output": "a.txt\nb.txt"},
        ],
    })
}

#[tokio::test]
async fn mlx_lm_server_answers_a_translated_codex_turn_and_its_usage_is_the_metrics() {
    let Some(model) = prerequisites(&["mlx-lm"]) else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    model_with_qwen3_template(&model, dir.path());
    let port = free_port();
    let gw = gateway(&config(&[backend("b", "mlx-lm", dir.path(), port, "")], &[("m", "b")], "")).await;
    let mut input_tokens = 0;
    let mut output_tokens = 0;
    let mut cached_tokens = 0;
    for stream in [true, false, true] {
        let r = post(&gw, "/v1/responses", &codex_turn(stream)).await;
        let status = r.status();
        let text = text_of(r).await;
        assert_eq!(status, 200, "{text}; backend: {}", backend_state(&gw, "b").await);
        let response: Value = if stream {
            let last = text.split("\n\n").filter(|b| b.starts_with("event: ")).last().expect("events");
            let data = last.lines().nth(1).and_then(|l| l.strip_prefix("data: ")).expect("data");
            let event: Value = serde_json::from_str(data).expect("json");
            assert_eq!(event["type"], "response.completed", "{text}");
            assert!(text.starts_with("event: response.created"), "{text}");
            event["response"].clone()
        } else {
            serde_json::from_str(&text).expect("json")
        };
        assert_eq!(response["model"], "m");
        // A random-weight model runs to its limit or stops: either way the turn is complete.
        assert!(["completed", "incomplete"].contains(&response["status"].as_str().unwrap_or_default()), "{response}");
        let usage = &response["usage"];
        eprintln!("stream {stream}: status {} usage {usage}", response["status"]);
        let input = usage["input_tokens"].as_u64().expect("input_tokens");
        let output = usage["output_tokens"].as_u64().expect("output_tokens");
        // The conversation reached the prompt: far more than the last message's few tokens.
        assert!(input > 50, "{usage}");
        assert!((1..=8).contains(&output), "{usage}");
        if response["status"] == "incomplete" {
            assert_eq!(output, 8);
            assert_eq!(response["incomplete_details"]["reason"], "max_output_tokens");
        }
        input_tokens += input;
        output_tokens += output;
        cached_tokens += usage["input_tokens_details"]["cached_tokens"].as_u64().expect("cached_tokens");
    }
    // The same prompt three times: mlx_lm.server's prompt cache served most of the later ones.
    assert!(cached_tokens > 0, "no cached tokens reported");
    let labels = "backend=\"b\",client=\"anonymous\",model=\"m\"";
    let prompt = metric(&gw, &format!("mlxgate_prompt_tokens_total{{{labels}}}")).await;
    assert_eq!(prompt, Some(input_tokens as f64));
    let generated = metric(&gw, &format!("mlxgate_generation_tokens_total{{{labels}}}")).await;
    assert_eq!(generated, Some(output_tokens as f64));
    let cached = metric(&gw, "mlxgate_prompt_cached_tokens_total{backend=\"b\",model=\"m\"}").await;
    assert_eq!(cached, Some(cached_tokens as f64));
    let ok = metric(&gw, &format!("mlxgate_requests_total{{{labels},outcome=\"ok\"}}")).await;
    assert_eq!(ok, Some(3.0));

    // A call cut by `max_output_tokens` sent back as it was (arguments that are not JSON): the
    // server parses history arguments, and answered 404 "Unterminated string" before the
    // gateway made them JSON.
    let mut cut = codex_turn(false);
    cut["input"][3]["arguments"] = Value::from("{\"cmd\": \"ec");
    let r = post(&gw, "/v1/responses", &cut).await;
    let status = r.status();
    let text = text_of(r).await;
    assert_eq!(status, 200, "{text}");
}
