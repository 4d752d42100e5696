//! Claude Code's recorded first request (tests/data/agents/claude-code-messages.json) through
//! the Messages face to each real server kind the gateway manages, streamed and whole. Claude
//! Code always sends `thinking: {type: "adaptive"}`, which the face sends on as
//! `chat_template_kwargs: {"enable_thinking": true}`, with 12 tools and `tool_choice` absent:
//! each server must accept that chat body (200, an answer in the Anthropic shape). The
//! request's `max_tokens` (128000) is lowered to keep each answer short; the tiny model's 2048
//! positions are raised with `context_cap` (the prompt is ~13k tokens), and servers that check
//! the prompt against the model's own length get the same request with a system prompt and
//! tools cut down to fit (`fitted`). Like the other real-server tests, a missing venv fails the
//! test under CI=true (see `prerequisites`).

mod common;

use common::*;
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
    // It refuses the recorded ~13k-token prompt on its own (400: the model's 2048 positions).
    accepted(&gw, "rapid-mlx", &fitted(claude_code_body())).await;
}

#[tokio::test]
async fn mlx_vlm_accepts_claude_codes_request() {
    let Some(gw) = managed("mlx-vlm").await else { return };
    // It refuses the recorded ~13k-token prompt on its own (400: the model's 2048 positions).
    accepted(&gw, "mlx-vlm", &fitted(claude_code_body())).await;
}

#[tokio::test]
async fn mlx_omni_server_accepts_claude_codes_request() {
    let Some(gw) = managed("mlx-omni-server").await else { return };
    accepted(&gw, "mlx-omni-server", &claude_code_body()).await;
}
