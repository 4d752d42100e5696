//! Claude Code's recorded first request (tests/data/agents/claude-code-messages.json) through
//! the Messages face to each real server kind the gateway manages, streamed and whole. Claude
//! Code always sends `thinking: {type: "adaptive"}`, which the face sends to every kind as
//! `chat_template_kwargs: {"enable_thinking": true}` (src/api/messages/request/tests.rs asserts
//! the translation), with `stream_options` when streamed, 12 tools and no `tool_choice`: each
//! server accepts that chat body (200, an answer in the Anthropic shape; measured on every kind,
//! so the catalogue has no per-kind switch for it). The request's `max_tokens` (128000) is
//! lowered to keep each answer short; the tiny model's 2048 positions are raised with
//! `context_cap` (the prompt is ~13k tokens). Rapid-MLX and mlx-vlm check the prompt against the
//! model's own length: they refuse the full prompt (400, `invalid_request_error`) and get the
//! same request with the system prompt and tools cut down to fit (`fitted`).
//!
//! Measured beside it (the servers' own ways, not asserted): Rapid-MLX with `enable_thinking`
//! on a template without `<think>` streams the answer as `reasoning_content` (a `thinking`
//! block) and, cut at `max_tokens`, a content piece of its own
//! ("[truncated — reasoning incomplete; raise max_tokens]"); its whole answer repeats the
//! reasoning as `content` (a thinking and a text block with the same text). mlx-vlm's whole
//! answer with tools has `content: null` (no content blocks) with or without the switch.
//!
//! Like the other real-server tests, a missing venv fails the test under CI=true (see
//! `prerequisites`).

use crate::common::*;
use serde_json::{Value, json};

/// The backend's name in every gateway here.
const BACKEND: &str = "b";

/// The recorded request's body, its model renamed to the gateway's `m` and `max_tokens` low.
fn claude_code_body() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/agents/claude-code-messages.json");
    let recorded: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("recording")).expect("json");
    let mut body = recorded["body"].clone();
    assert_eq!(body["thinking"]["type"], "adaptive", "the recording is Claude Code's");
    assert!(body.get("tool_choice").is_none() && body["tools"].as_array().is_some_and(|t| !t.is_empty()));
    body["model"] = json!("m");
    body["max_tokens"] = json!(8);
    body
}

/// The same request within the tiny model's 2048 positions, for servers that check the prompt
/// against the model's length: a short system prompt and two of its tools (Bash and Read), the
/// fields that shape the chat body (`thinking`, `metadata`, tools without `tool_choice`) kept.
fn fitted(mut body: Value) -> Value {
    body["system"] = json!([{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}]);
    let tools = body["tools"].as_array().expect("tools").clone();
    let kept: Vec<Value> = tools.into_iter().filter(|t| t["name"] == "Bash" || t["name"] == "Read").collect();
    assert_eq!(kept.len(), 2);
    body["tools"] = Value::Array(kept);
    body["messages"] = json!([{"role": "user", "content": [{"type": "text", "text": "say hello"}]}]);
    body
}

/// A gateway managing one `kind` server for the model `m`, the context cap raised over the
/// recorded prompt.
async fn managed(kind: &str) -> Option<Gateway> {
    // mlx-lm: the tiny model is generated with it.
    let model = prerequisites(&[kind, "mlx-lm"])?;
    let cap = "    context_cap: 30000\n";
    Some(gateway(&config(&[backend(BACKEND, kind, &model, free_port(), cap)], &[("m", BACKEND)], "")).await)
}

/// Sends `body` to `/v1/messages` streamed and whole: both answer 200 in the Anthropic shape.
async fn accepted(gw: &Gateway, kind: &str, body: &Value) {
    for stream in [true, false] {
        let mut body = body.clone();
        body["stream"] = json!(stream);
        let r = post(gw, "/v1/messages", &body).await;
        let status = r.status();
        let text = text_of(r).await;
        let head: String = text.chars().take(200).collect();
        eprintln!("{kind} stream={stream}: {status} {head:?}");
        assert_eq!(status, 200, "{kind} stream={stream}: {text}; backend: {}", backend_state(gw, BACKEND).await);
        if stream {
            assert!(text.starts_with("event: message_start"), "{kind}: {head}");
            assert!(text.contains("event: message_stop"), "{kind}: the stream completes: {text}");
            assert!(!text.contains("event: error"), "{kind}: {text}");
        } else {
            let answer: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{kind}: {e}: {text}"));
            assert_eq!(answer["type"], "message", "{kind}: {answer}");
            assert!(answer["usage"]["output_tokens"].as_u64().is_some_and(|n| n > 0), "{kind}: {answer}");
        }
    }
}

/// The recorded ~13k-token prompt, whole, to a server that checks it against the tiny model's
/// 2048 positions itself: refused for its length as the client's error (400
/// `invalid_request_error`, the server's words), not for the chat body's fields.
async fn refused_for_length(gw: &Gateway, kind: &str) {
    let mut body = claude_code_body();
    body["stream"] = json!(false);
    let r = post(gw, "/v1/messages", &body).await;
    let status = r.status();
    let text = text_of(r).await;
    eprintln!("{kind} whole, the full prompt: {status} {text}");
    assert_eq!(status, 400, "{kind}: {text}");
    let error: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{kind}: {e}: {text}"));
    assert_eq!(error["error"]["type"], "invalid_request_error", "{kind}: {error}");
}

#[tokio::test]
async fn mlx_lm_accepts_claude_codes_request() {
    let Some(gw) = managed("mlx-lm").await else { return };
    accepted(&gw, "mlx-lm", &claude_code_body()).await;
}

#[tokio::test]
async fn mlx_openai_server_accepts_claude_codes_request() {
    let Some(gw) = managed("mlx-openai-server").await else { return };
    accepted(&gw, "mlx-openai-server", &claude_code_body()).await;
}

#[tokio::test]
async fn vllm_mlx_accepts_claude_codes_request() {
    let Some(gw) = managed("vllm-mlx").await else { return };
    accepted(&gw, "vllm-mlx", &claude_code_body()).await;
}

#[tokio::test]
async fn rapid_mlx_accepts_claude_codes_request() {
    let Some(gw) = managed("rapid-mlx").await else { return };
    refused_for_length(&gw, "rapid-mlx").await;
    accepted(&gw, "rapid-mlx", &fitted(claude_code_body())).await;
}

#[tokio::test]
async fn mlx_vlm_accepts_claude_codes_request() {
    let Some(gw) = managed("mlx-vlm").await else { return };
    refused_for_length(&gw, "mlx-vlm").await;
    accepted(&gw, "mlx-vlm", &fitted(claude_code_body())).await;
}

#[tokio::test]
async fn mlx_omni_server_accepts_claude_codes_request() {
    let Some(gw) = managed("mlx-omni-server").await else { return };
    accepted(&gw, "mlx-omni-server", &claude_code_body()).await;
}
