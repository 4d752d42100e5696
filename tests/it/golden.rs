//! The golden set: for each API face (OpenAI chat completions, legacy completions, embeddings,
//! the Responses API, the Anthropic Messages API, `/v1/models`) and each refusal, requests and
//! the exact answer a client receives from the gateway in front of `mlxgate-sim` (status, every
//! header but `date`, the body byte for byte: every SSE event in order, error bodies), over
//! several of the simulator's server styles (mlx_lm.server's HTTP/1.0 close-delimited bodies,
//! the uvicorn servers' chunked ones, their quirks). Recorded once from the code before a
//! redesign, replayed after it: a difference fails with a diff. What changes from run to run
//! (ids, Unix times, timings) is masked (`golden/mask.rs`).
//!
//! One recording per case in `tests/data/golden/{case}.txt`. `GOLDEN_RECORD=1` records them
//! again (only when a change to what clients see is meant); a missing one is written and said
//! so, and fails under `CI=true`.

mod mask;
mod transcript;

use crate::common::*;
use mlxgate::sim::{self, Behaviour, Script, SimConfig, SimHandle, Style};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use transcript::{Request, Transcript, check};

/// The key of the client `app` in the configurations that require one.
const KEY: &str = "sk-golden-3f9c2a7d51e04b86";

/// Model `qwen` (upstream `tiny-qwen3`) on backend `local` at `sim`, with `backend` and `model`
/// keys added to their stanzas and `top` before them.
fn yaml(sim: &SimHandle, backend: &str, model: &str, top: &str) -> String {
    format!(
        "{top}backends:\n  local: {{url: '{}'{backend}}}\n\
         models:\n  qwen: {{backend: local, upstream_model: tiny-qwen3, max_queue: 4, max_wait: 120s{model}}}\n",
        sim.url()
    )
}

/// `auth: required` and the client `app` (key [`KEY`]) with `limits` when given.
fn auth(limits: &str) -> String {
    let digest: String = Sha256::digest(KEY.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    format!("auth: required\nclients:\n  app: {{key_sha256: {digest}{limits}}}\n")
}

async fn sim_of(defaults: Behaviour) -> SimHandle {
    sim_with(defaults).await
}

fn style(style: Style) -> Behaviour {
    Behaviour { style: Some(style), ..Default::default() }
}

/// The tool loop the scripted simulator plays: a call to `get_weather` (with a line of text
/// before it), then a text answer once the result is back.
async fn scripted(defaults: Behaviour) -> SimHandle {
    let script: Script = serde_json::from_value(json!({
        "turns": [
            {"text": "Let me check.", "calls": [{"tool": "get_weather", "arguments": {"city": "Paris"}}]},
            {"text": "It is sunny in Paris."}
        ]
    }))
    .expect("script");
    sim::spawn(SimConfig { defaults, script: Some(script), ..Default::default() }).await.expect("sim starts")
}

fn weather_parameters() -> Value {
    json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
}

// ---- request bodies ----

fn chat(stream: bool, max_tokens: u32) -> Value {
    let mut body = json!({"model": "qwen", "stream": stream, "max_tokens": max_tokens,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]});
    if stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

fn chat_tools(stream: bool, messages: Value) -> Value {
    json!({"model": "qwen", "stream": stream, "max_tokens": 64, "messages": messages, "tool_choice": "auto",
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
            "parameters": weather_parameters()}}]})
}

fn responses(stream: bool) -> Value {
    json!({"model": "qwen", "stream": stream, "instructions": "Be brief.", "input": "hello there",
        "max_output_tokens": 16})
}

fn responses_tools(stream: bool, input: Value) -> Value {
    json!({"model": "qwen", "stream": stream, "store": false, "input": input, "tool_choice": "auto",
        "tools": [{"type": "function", "name": "get_weather", "description": "The weather in a city.",
            "parameters": weather_parameters()}]})
}

fn messages(stream: bool) -> Value {
    json!({"model": "qwen", "max_tokens": 16, "stream": stream, "system": "Be brief.",
        "messages": [{"role": "user", "content": "hello there"}]})
}

fn messages_tools(stream: bool, conversation: Value) -> Value {
    json!({"model": "qwen", "max_tokens": 64, "stream": stream, "messages": conversation,
        "tools": [{"name": "get_weather", "description": "The weather in a city.",
            "input_schema": weather_parameters()}]})
}

fn post(path: &str, body: &Value) -> Request {
    Request::post(path, body)
}

fn anthropic(body: &Value) -> Request {
    Request::post("/v1/messages", body).anthropic()
}

// ---- the cases ----

/// A chat stream (with usage), a stream cut by `max_tokens`, and a whole answer, from a server
/// of `style`, configured as `kind` when given (its normalisations on).
async fn chat_style(style_: Style, kind: Option<&str>) -> Transcript {
    let sim = sim_of(style(style_)).await;
    let kind = kind.map_or(String::new(), |k| format!(", kind: {k}"));
    // vllm-mlx without continuous batching is served one request at a time.
    let concurrency = if kind.contains("vllm-mlx") { 1 } else { 2 };
    let gw = gateway(&yaml(&sim, &format!(", max_concurrency: {concurrency}{kind}"), "", "")).await;
    let mut t = Transcript::default();
    t.send(&gw, post("/v1/chat/completions", &chat(true, 16))).await;
    t.send(&gw, post("/v1/chat/completions", &chat(true, 4))).await;
    t.send(&gw, post("/v1/chat/completions", &chat(false, 16))).await;
    t.send(&gw, post("/v1/chat/completions", &chat(false, 4))).await;
    t
}

async fn chat_openai_chunked() -> Transcript {
    chat_style(Style::Openai, None).await
}

async fn chat_mlx_lm_http10() -> Transcript {
    chat_style(Style::MlxLm, Some("mlx-lm")).await
}

async fn chat_mlx_openai_server() -> Transcript {
    chat_style(Style::MlxOpenaiServer, Some("mlx-openai-server")).await
}

async fn chat_vllm_mlx() -> Transcript {
    chat_style(Style::VllmMlx, Some("vllm-mlx")).await
}

async fn chat_rapid_mlx() -> Transcript {
    chat_style(Style::RapidMlx, Some("rapid-mlx")).await
}

async fn chat_omlx() -> Transcript {
    chat_style(Style::Omlx, Some("omlx")).await
}

async fn chat_mlx_omni_server() -> Transcript {
    chat_style(Style::MlxOmni, Some("mlx-omni-server")).await
}

/// A tool round trip on the chat face: the call streamed and whole, then the answer to the
/// result, from the scripted simulator (chunked, then mlx_lm.server's HTTP/1.0).
async fn chat_tools_case(defaults: Behaviour, kind: &str) -> Transcript {
    let sim = scripted(defaults).await;
    let gw = gateway(&yaml(&sim, &format!(", max_concurrency: 2{kind}"), "", "")).await;
    let user = json!({"role": "user", "content": "What is the weather in Paris?"});
    let mut t = Transcript::default();
    t.send(&gw, post("/v1/chat/completions", &chat_tools(true, json!([user])))).await;
    t.send(&gw, post("/v1/chat/completions", &chat_tools(false, json!([user])))).await;
    let history = json!([user,
        {"role": "assistant", "content": "Let me check.", "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]);
    t.send(&gw, post("/v1/chat/completions", &chat_tools(true, history.clone()))).await;
    t.send(&gw, post("/v1/chat/completions", &chat_tools(false, history))).await;
    t
}

async fn chat_tools_chunked() -> Transcript {
    chat_tools_case(Behaviour::default(), "").await
}

async fn chat_tools_mlx_lm_http10() -> Transcript {
    chat_tools_case(style(Style::MlxLm), ", kind: mlx-lm").await
}

/// Legacy completions, streamed (with usage) and whole.
async fn completions() -> Transcript {
    let sim = sim_of(Behaviour::default()).await;
    let gw = gateway(&yaml(&sim, ", max_concurrency: 2", "", "")).await;
    let mut t = Transcript::default();
    let body = |stream: bool| {
        let mut b = json!({"model": "qwen", "prompt": "Once upon a time", "max_tokens": 16, "stream": stream});
        if stream {
            b["stream_options"] = json!({"include_usage": true});
        }
        b
    };
    t.send(&gw, post("/v1/completions", &body(true))).await;
    t.send(&gw, post("/v1/completions", &body(false))).await;
    t
}

async fn embeddings() -> Transcript {
    let sim = sim_of(Behaviour::default()).await;
    let gw = gateway(&yaml(&sim, ", max_concurrency: 2", "", "")).await;
    let mut t = Transcript::default();
    t.send(&gw, post("/v1/embeddings", &json!({"model": "qwen", "input": "hello there"}))).await;
    t.send(&gw, post("/v1/embeddings", &json!({"model": "qwen", "input": ["hello there", "general kenobi"]}))).await;
    t
}

/// The Responses API, streamed and whole, from a chunked server and from mlx_lm.server.
async fn responses_text() -> Transcript {
    let mut t = Transcript::default();
    let sim = sim_of(Behaviour::default()).await;
    let gw = gateway(&yaml(&sim, ", max_concurrency: 2", "", "")).await;
    t.send(&gw, post("/v1/responses", &responses(true))).await;
    t.send(&gw, post("/v1/responses", &responses(false))).await;
    let sim = sim_of(style(Style::MlxLm)).await;
    let gw = gateway(&yaml(&sim, ", max_concurrency: 2, kind: mlx-lm", "", "")).await;
    t.send(&gw, post("/v1/responses", &responses(true))).await;
    t.send(&gw, post("/v1/responses", &responses(false))).await;
    t
}

/// A function call round trip on the Responses face, streamed and whole.
async fn responses_tool_round_trip() -> Transcript {
    let sim = scripted(Behaviour::default()).await;
    let gw = gateway(&yaml(&sim, ", max_concurrency: 2", "", "")).await;
    let user = json!({"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "What is the weather in Paris?"}]});
    let mut t = Transcript::default();
    t.send(&gw, post("/v1/responses", &responses_tools(true, json!([user])))).await;
    t.send(&gw, post("/v1/responses", &responses_tools(false, json!([user])))).await;
    let history = json!([user,
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"}]);
    t.send(&gw, post("/v1/responses", &responses_tools(true, history.clone()))).await;
    t.send(&gw, post("/v1/responses", &responses_tools(false, history))).await;
    t
}

/// The Anthropic Messages API, streamed and whole, from a chunked server and from
/// mlx_lm.server, and a thinking answer (the server's `reasoning_content`).
async fn messages_text() -> Transcript {
    let mut t = Transcript::default();
    let sim = sim_of(Behaviour::default()).await;
    let gw = gateway(&yaml(&sim, ", max_concurrency: 2", "", "")).await;
    t.send(&gw, anthropic(&messages(true))).await;
    t.send(&gw, anthropic(&messages(false))).await;
    let sim = sim_of(style(Style::MlxLm)).await;
    let gw = gateway(&yaml(&sim, ", max_concurrency: 2, kind: mlx-lm", "", "")).await;
    t.send(&gw, anthropic(&messages(true))).await;
    t.send(&gw, anthropic(&messages(false))).await;
    let thinking = sim_of(Behaviour {
        content_field: Some(mlxgate::sim::behaviour::ContentField::ReasoningContent),
        ..Default::default()
    })
    .await;
    let gw = gateway(&yaml(&thinking, ", max_concurrency: 2", "", "")).await;
    t.send(&gw, anthropic(&messages(true))).await;
    t.send(&gw, anthropic(&messages(false))).await;
    t
}

/// A tool round trip on the Messages face, as Claude Code sends it (`?beta=true`, a beta list).
async fn messages_tool_round_trip() -> Transcript {
    let sim = scripted(Behaviour::default()).await;
    let gw = gateway(&yaml(&sim, ", max_concurrency: 2", "", "")).await;
    let user = json!({"role": "user", "content": "What is the weather in Paris?"});
    let claude = |body: &Value| {
        Request::post("/v1/messages?beta=true", body)
            .anthropic()
            .header("anthropic-beta", "claude-code-20250219,interleaved-thinking-2025-05-14")
            .header("x-api-key", "unused")
    };
    let mut t = Transcript::default();
    t.send(&gw, claude(&messages_tools(true, json!([user])))).await;
    t.send(&gw, claude(&messages_tools(false, json!([user])))).await;
    let history = json!([user,
        {"role": "assistant", "content": [{"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "sunny, 21 C"}]}]);
    t.send(&gw, claude(&messages_tools(true, history.clone()))).await;
    t.send(&gw, claude(&messages_tools(false, history))).await;
    t
}

async fn messages_count_tokens() -> Transcript {
    let sim = sim_of(Behaviour::default()).await;
    let gw = gateway(&yaml(&sim, ", max_concurrency: 2", "", "")).await;
    let mut t = Transcript::default();
    let body =
        json!({"model": "qwen", "system": "Be brief.", "messages": [{"role": "user", "content": "hello there"}]});
    t.send(&gw, Request::post("/v1/messages/count_tokens", &body).anthropic()).await;
    let body = messages_tools(false, json!([{"role": "user", "content": "What is the weather in Paris?"}]));
    t.send(&gw, Request::post("/v1/messages/count_tokens", &body).anthropic()).await;
    let body = json!({"model": "nope", "messages": [{"role": "user", "content": "hi"}]});
    t.send(&gw, Request::post("/v1/messages/count_tokens", &body).anthropic()).await;
    t
}

/// `/v1/models` and `/v1/models/{id}` in OpenAI's shape and, to an `anthropic-version`
/// request, Anthropic's; an unknown id in both.
async fn models() -> Transcript {
    let sim = sim_of(Behaviour::default()).await;
    let gw = gateway(&yaml(&sim, ", max_concurrency: 2, context_cap: 4096", "", "")).await;
    let mut t = Transcript::default();
    t.send(&gw, Request::get("/v1/models")).await;
    t.send(&gw, Request::get("/v1/models").anthropic()).await;
    t.send(&gw, Request::get("/v1/models/qwen")).await;
    t.send(&gw, Request::get("/v1/models/qwen").anthropic()).await;
    t.send(&gw, Request::get("/v1/models/nope")).await;
    t.send(&gw, Request::get("/v1/models/nope").anthropic()).await;
    t
}

/// 401: no key, and a wrong one, on each face.
async fn refusal_401_no_key() -> Transcript {
    let sim = sim_of(Behaviour::default()).await;
    let gw = gateway(&yaml(&sim, ", max_concurrency: 2", "", &auth(""))).await;
    let mut t = Transcript::default();
    t.send(&gw, post("/v1/chat/completions", &chat(false, 16))).await;
    t.send(&gw, post("/v1/chat/completions", &chat(true, 16)).header("authorization", "Bearer sk-wrong")).await;
    t.send(&gw, post("/v1/responses", &responses(true))).await;
    t.send(&gw, anthropic(&messages(true))).await;
    t.send(&gw, anthropic(&messages(false)).header("x-api-key", "sk-wrong")).await;
    t.send(&gw, Request::get("/v1/models")).await;
    t
}

/// 404: a model that does not exist, on each face.
async fn refusal_404_unknown_model() -> Transcript {
    let sim = sim_of(Behaviour::default()).await;
    let gw = gateway(&yaml(&sim, ", max_concurrency: 2", "", "")).await;
    let mut t = Transcript::default();
    let mut body = chat(true, 16);
    body["model"] = json!("nope");
    t.send(&gw, post("/v1/chat/completions", &body)).await;
    t.send(&gw, post("/v1/completions", &json!({"model": "nope", "prompt": "hi"}))).await;
    t.send(&gw, post("/v1/embeddings", &json!({"model": "nope", "input": "hi"}))).await;
    let mut body = responses(true);
    body["model"] = json!("nope");
    t.send(&gw, post("/v1/responses", &body)).await;
    let mut body = messages(true);
    body["model"] = json!("nope");
    t.send(&gw, anthropic(&body)).await;
    t
}

/// 400: a prompt over the backend's context cap (counted with the estimate), in OpenAI's words
/// and Anthropic's.
async fn refusal_400_prompt_too_long() -> Transcript {
    let sim = sim_of(Behaviour::default()).await;
    let gw = gateway(&yaml(&sim, ", max_concurrency: 2, context_cap: 64", "", "")).await;
    let long = "the quick brown fox jumps over the lazy dog ".repeat(20);
    let mut t = Transcript::default();
    let body = json!({"model": "qwen", "max_tokens": 8, "messages": [{"role": "user", "content": long}]});
    t.send(&gw, post("/v1/chat/completions", &body)).await;
    let body = json!({"model": "qwen", "max_output_tokens": 8, "input": long, "stream": true});
    t.send(&gw, post("/v1/responses", &body)).await;
    let body =
        json!({"model": "qwen", "max_tokens": 8, "stream": true, "messages": [{"role": "user", "content": long}]});
    t.send(&gw, anthropic(&body)).await;
    t
}

/// 400: a body that is not JSON, or not the object the endpoint needs.
async fn refusal_400_bad_json() -> Transcript {
    let sim = sim_of(Behaviour::default()).await;
    let gw = gateway(&yaml(&sim, ", max_concurrency: 2", "", "")).await;
    let mut t = Transcript::default();
    t.send(&gw, Request::post_raw("/v1/chat/completions", b"{\"model\": \"qwen\",".to_vec())).await;
    t.send(&gw, post("/v1/chat/completions", &json!({"messages": []}))).await;
    t.send(&gw, post("/v1/chat/completions", &json!({"model": "qwen", "messages": "hello"}))).await;
    t.send(&gw, Request::post_raw("/v1/responses", b"not json".to_vec())).await;
    t.send(&gw, Request::post_raw("/v1/messages", b"{\"model\": \"qwen\",".to_vec()).anthropic()).await;
    t.send(&gw, anthropic(&json!({"model": "qwen", "max_tokens": 8}))).await;
    t
}

/// 413: a body over `max_body`.
async fn refusal_413_body_too_big() -> Transcript {
    let sim = sim_of(Behaviour::default()).await;
    let gw = gateway(&yaml(&sim, ", max_concurrency: 2", "", "max_body: 1KiB\n")).await;
    let pad = "x".repeat(1500);
    let mut t = Transcript::default();
    let body = json!({"model": "qwen", "messages": [{"role": "user", "content": pad}]});
    t.send(&gw, post("/v1/chat/completions", &body)).await;
    t.send(&gw, post("/v1/responses", &json!({"model": "qwen", "input": pad}))).await;
    let body = json!({"model": "qwen", "max_tokens": 8, "messages": [{"role": "user", "content": pad}]});
    t.send(&gw, anthropic(&body)).await;
    t
}

/// 429: the client's one request a minute used, the next refused with the limiter's headers, on
/// each face.
async fn refusal_429_rate_limited() -> Transcript {
    let sim = sim_of(Behaviour::default()).await;
    let gw = gateway(&yaml(&sim, ", max_concurrency: 2", "", &auth(", limits: {rpm: 1}"))).await;
    let bearer = format!("Bearer {KEY}");
    let mut t = Transcript::default();
    t.send(&gw, post("/v1/chat/completions", &chat(false, 16)).header("authorization", &bearer)).await;
    t.send(&gw, post("/v1/chat/completions", &chat(true, 16)).header("authorization", &bearer)).await;
    t.send(&gw, post("/v1/responses", &responses(true)).header("authorization", &bearer)).await;
    t.send(&gw, anthropic(&messages(true)).header("x-api-key", KEY)).await;
    t
}

/// 503 on the OpenAI faces and 529 on Messages: the model's queue (`max_queue: 0`) is full while
/// a held stream has the only slot.
async fn refusal_503_queue_full() -> Transcript {
    let sim = sim_of(Behaviour::default()).await;
    let gw = gateway(&format!(
        "backends:\n  local: {{url: '{}', max_concurrency: 1}}\n\
         models:\n  qwen: {{backend: local, upstream_model: tiny-qwen3, max_queue: 0, max_wait: 120s}}\n",
        sim.url()
    ))
    .await;
    let mut held = chat(true, 16);
    held["sim"] = json!({"hold_after": 1, "hold_key": "golden"});
    let mut stream = client().post(gw.url("/v1/chat/completions")).json(&held).send().await.expect("send");
    read_until(&mut stream, "\"content\"").await;
    let mut t = Transcript::default();
    t.send(&gw, post("/v1/chat/completions", &chat(false, 16))).await;
    t.send(&gw, post("/v1/chat/completions", &chat(true, 16))).await;
    t.send(&gw, post("/v1/responses", &responses(true))).await;
    t.send(&gw, anthropic(&messages(true))).await;
    t.send(&gw, anthropic(&messages(false))).await;
    client().post(format!("{}/sim/release/golden", sim.url())).send().await.expect("release");
    let rest = text_of(stream).await;
    assert!(rest.contains("[DONE]"), "the held stream ends: {rest}");
    t
}

/// A backend's own error status and body, passed on (normalised to OpenAI's shape, or
/// Anthropic's), streamed and whole.
async fn backend_error_status() -> Transcript {
    let mut t = Transcript::default();
    for status in [500, 422] {
        let sim = sim_of(Behaviour { fail_status: Some(status), ..Default::default() }).await;
        let gw = gateway(&yaml(&sim, ", max_concurrency: 2", "", "")).await;
        t.send(&gw, post("/v1/chat/completions", &chat(false, 16))).await;
        t.send(&gw, post("/v1/chat/completions", &chat(true, 16))).await;
        t.send(&gw, post("/v1/responses", &responses(true))).await;
        t.send(&gw, anthropic(&messages(true))).await;
    }
    t
}

/// A stream cut by the backend's crash after three tokens (the process dies: connections cut,
/// port closed), from a server of `defaults`, on `face`.
async fn crash(defaults: Behaviour, kind: &str, face: &str) -> Transcript {
    let sim = sim_of(Behaviour { tokens: Some(8), exit_after: Some(3), ..defaults }).await;
    let gw = gateway(&yaml(&sim, &format!(", max_concurrency: 1{kind}"), "", "")).await;
    let request = match face {
        "chat" => post("/v1/chat/completions", &chat(true, 16)),
        "responses" => post("/v1/responses", &responses(true)),
        _ => anthropic(&messages(true)),
    };
    let mut t = Transcript::default();
    t.send(&gw, request).await;
    t
}

async fn crash_chat_stream_chunked() -> Transcript {
    crash(Behaviour::default(), "", "chat").await
}

async fn crash_chat_stream_mlx_lm_http10() -> Transcript {
    crash(style(Style::MlxLm), ", kind: mlx-lm", "chat").await
}

async fn crash_responses_stream() -> Transcript {
    crash(Behaviour::default(), "", "responses").await
}

async fn crash_messages_stream() -> Transcript {
    crash(Behaviour::default(), "", "messages").await
}

macro_rules! golden {
    ($($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                check(stringify!($case), &super::$case().await);
            }
        )*
        /// Every case's name (its recording's file name).
        const CASES: &[&str] = &[$(stringify!($case)),*];
    };
}

mod replay {
    use super::check;

    golden!(
        chat_openai_chunked,
        chat_mlx_lm_http10,
        chat_mlx_openai_server,
        chat_vllm_mlx,
        chat_rapid_mlx,
        chat_omlx,
        chat_mlx_omni_server,
        chat_tools_chunked,
        chat_tools_mlx_lm_http10,
        completions,
        embeddings,
        responses_text,
        responses_tool_round_trip,
        messages_text,
        messages_tool_round_trip,
        messages_count_tokens,
        models,
        refusal_401_no_key,
        refusal_404_unknown_model,
        refusal_400_prompt_too_long,
        refusal_400_bad_json,
        refusal_413_body_too_big,
        refusal_429_rate_limited,
        refusal_503_queue_full,
        backend_error_status,
        crash_chat_stream_chunked,
        crash_chat_stream_mlx_lm_http10,
        crash_responses_stream,
        crash_messages_stream,
    );

    /// Every recording has its case (a case renamed or removed leaves no stale file behind).
    #[test]
    fn every_recording_has_a_case() {
        let dir = super::transcript::golden_dir();
        let entries = std::fs::read_dir(&dir).expect("tests/data/golden/ exists");
        let mut stale: Vec<String> = entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|name| name.strip_suffix(".txt").map(str::to_string))
            .filter(|name| !CASES.contains(&name.as_str()))
            .collect();
        stale.sort();
        assert!(stale.is_empty(), "recordings without a case in tests/it/golden.rs: {stale:?}");
    }
}
