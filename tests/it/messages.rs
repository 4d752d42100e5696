//! `POST /v1/messages` (the Anthropic Messages face) through the gateway in front of
//! mlxgate-sim: the streamed event sequence (strictly checked) and the whole `message`, pings
//! from the backend's keep-alives, tool round trips (one call, several calls) reaching the
//! backend as chat `tool_calls` and `tool` messages, thinking blocks, a backend failing
//! mid-stream (`event: error`, no `message_stop`), every refusal in Anthropic's shape and
//! status (400, 401 with either key header, 404, 429, 529, 500, a prompt over the cap), the
//! billing block never reaching the backend, and byte-identical chat prefixes across two turns
//! whose billing nonces differ.

use crate::common::*;
use mlxgate::sim::{self, Behaviour, Script, SimConfig, SimHandle, Style};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// A simulator with `defaults` that plays `script`.
async fn scripted(script: Value, defaults: Behaviour) -> SimHandle {
    let script: Script = serde_json::from_value(script).expect("script");
    sim::spawn(SimConfig { defaults, script: Some(script), ..Default::default() }).await.expect("sim starts")
}

async fn gateway_for(sim: &SimHandle) -> Gateway {
    gateway(&one_model_yaml(&sim.url(), 4, 16)).await
}

/// Sends a Messages request as Claude Code does (`?beta=true`, `anthropic-version`, a beta list).
async fn messages(gw: &Gateway, body: &Value) -> reqwest::Response {
    client()
        .post(gw.url("/v1/messages?beta=true"))
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "claude-code-20250219,interleaved-thinking-2025-05-14,some-future-beta")
        .header("x-api-key", "unused")
        .json(body)
        .send()
        .await
        .expect("send")
}

async fn messages_text(gw: &Gateway, body: &Value) -> (u16, String) {
    let r = messages(gw, body).await;
    let status = r.status().as_u16();
    (status, text_of(r).await)
}

/// The events of a streamed body, each checked (its `event:` line is its `type`) and the
/// sequence checked: `message_start` first; blocks one at a time, their indices 0, 1, 2, … in
/// order; each delta inside its open block; `message_delta` after every block stopped; the
/// stream ends with `message_stop` or `error`, and nothing follows.
fn parse_events(body: &str) -> Vec<Value> {
    let events: Vec<Value> = body
        .split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let mut lines = block.lines();
            let name = lines.next().and_then(|l| l.strip_prefix("event: ")).unwrap_or_else(|| panic!("{body}"));
            let data = lines.next().and_then(|l| l.strip_prefix("data: ")).expect("data line");
            let event: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"));
            assert_eq!(event["type"], name);
            event
        })
        .collect();
    assert_eq!(events[0]["type"], "message_start", "{body}");
    let (mut open, mut next, mut ended) = (None, 0, false);
    for event in &events[1..] {
        assert!(!ended, "nothing after the end: {body}");
        match event["type"].as_str().expect("type") {
            "content_block_start" => {
                assert_eq!(open, None, "one block at a time: {body}");
                assert_eq!(event["index"], next);
                open = Some(next);
                next += 1;
            }
            "content_block_delta" => assert_eq!(event["index"].as_u64(), open, "{body}"),
            "content_block_stop" => {
                assert_eq!(event["index"].as_u64(), open);
                open = None;
            }
            "message_delta" => assert_eq!(open, None),
            "message_stop" | "error" => ended = true,
            "ping" => {}
            other => panic!("unknown event {other}"),
        }
    }
    assert!(ended, "{body}");
    events
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().expect("type")).collect()
}

/// The content blocks a client rebuilds from the events (the SDK's accumulator, simplified):
/// text and thinking concatenated, each tool's JSON pieces parsed at its stop.
fn rebuilt(events: &[Value]) -> Vec<Value> {
    let mut blocks: Vec<Value> = Vec::new();
    let mut pieces: Vec<String> = Vec::new();
    for event in events {
        match event["type"].as_str() {
            Some("content_block_start") => {
                blocks.push(event["content_block"].clone());
                pieces.push(String::new());
            }
            Some("content_block_delta") => {
                let at = event["index"].as_u64().expect("index") as usize;
                let delta = &event["delta"];
                let append = |block: &mut Value, key: &str, more: &Value| {
                    let text = format!("{}{}", block[key].as_str().unwrap_or(""), more.as_str().unwrap_or(""));
                    block[key] = json!(text);
                };
                match delta["type"].as_str() {
                    Some("text_delta") => append(&mut blocks[at], "text", &delta["text"]),
                    Some("thinking_delta") => append(&mut blocks[at], "thinking", &delta["thinking"]),
                    Some("signature_delta") => blocks[at]["signature"] = delta["signature"].clone(),
                    Some("input_json_delta") => pieces[at].push_str(delta["partial_json"].as_str().expect("piece")),
                    other => panic!("unknown delta {other:?}"),
                }
            }
            Some("content_block_stop") => {
                let at = event["index"].as_u64().expect("index") as usize;
                if blocks[at]["type"] == "tool_use" {
                    blocks[at]["input"] = serde_json::from_str(&pieces[at]).expect("valid JSON at the stop");
                }
            }
            _ => {}
        }
    }
    blocks
}

/// The last request the backend received.
async fn last_backend_request(sim: &SimHandle) -> Value {
    sim_requests(sim).await.last().cloned().expect("the backend got a request")
}

const LABELS: &str = "backend=\"local\",client=\"anonymous\",model=\"qwen\"";

#[tokio::test]
async fn a_streamed_answer_is_the_strict_event_sequence_with_pings_and_anthropics_usage() {
    // mlx_lm.server's wire: keep-alive comments during prefill, role on every delta, a usage
    // chunk with `choices: []`, HTTP/1.0 close-delimited, cached tokens reported.
    let behaviour = Behaviour {
        style: Some(Style::MlxLm),
        tokens: Some(5),
        ttft_ms: Some(200),
        keepalive_ms: Some(40),
        ..Default::default()
    };
    let sim = sim_with(behaviour).await;
    let gw = gateway_for(&sim).await;
    let body = json!({"model": "qwen", "max_tokens": 64, "stream": true, "system": "Be brief.",
        "messages": [{"role": "user", "content": "hello there"}],
        // Fields a chat backend has no use for: tolerated.
        "context_management": {"edits": [{"type": "clear_thinking_20251015"}]}, "output_config": {"effort": "low"},
        "metadata": {"user_id": "user_1_account__session_2"}});
    let response = messages(&gw, &body).await;
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"].to_str().is_ok_and(|t| t.starts_with("text/event-stream")),
        "{:?}",
        response.headers()
    );
    let text = text_of(response).await;
    let events = parse_events(&text);
    let kinds = types(&events);
    // The backend's keep-alives are pings, before the content.
    let first_block = kinds.iter().position(|k| *k == "content_block_start").expect("a block");
    assert!(kinds[..first_block].contains(&"ping"), "{kinds:?}");
    assert_eq!(kinds[kinds.len() - 3..], ["content_block_stop", "message_delta", "message_stop"]);
    let start = &events[0]["message"];
    assert_eq!(start["model"], "qwen");
    assert_eq!(start["content"], json!([]));
    // The prompt as the gateway counted it, before the backend's figures.
    assert!(start["usage"]["input_tokens"].as_u64().is_some_and(|n| n > 0), "{start}");
    let blocks = rebuilt(&events);
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0]["type"], "text");
    assert_eq!(blocks[0]["text"].as_str().map(|t| t.split_whitespace().count()), Some(5));
    let end = events.iter().find(|e| e["type"] == "message_delta").expect("message_delta");
    assert_eq!(end["delta"], json!({"stop_reason": "end_turn", "stop_sequence": null}));
    let usage = &end["usage"];
    assert_eq!(usage["output_tokens"], 5);
    // Anthropic's way: input without the cached tokens; both together are the prompt the
    // gateway's metrics counted.
    let input = usage["input_tokens"].as_f64().expect("input");
    let cached = usage["cache_read_input_tokens"].as_f64().expect("cached");
    let prompt = metric(&gw, &format!("mlxgate_prompt_tokens_total{{{LABELS}}}")).await;
    assert_eq!(prompt, Some(input + cached), "{usage}");
    assert!(input > 0.0, "{usage}");
    assert_eq!(usage["cache_creation_input_tokens"], 0);

    // The backend got a chat completion: the system and user messages, usage asked for, an
    // explicit limit, none of the Messages fields.
    let sent = last_backend_request(&sim).await;
    assert_eq!(
        sent["messages"],
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}])
    );
    assert_eq!(sent["stream_options"], json!({"include_usage": true}));
    assert_eq!(sent["model"], "tiny-qwen3");
    assert_eq!(sent["max_tokens"], 64);
    assert_eq!(sent["_path"], "/v1/chat/completions");
    for field in ["system", "context_management", "output_config", "metadata"] {
        assert!(sent.get(field).is_none(), "{field} reached the backend: {sent}");
    }
    let requests = metric(&gw, &format!("mlxgate_requests_total{{{LABELS},outcome=\"ok\"}}")).await;
    assert_eq!(requests, Some(1.0));
}

#[tokio::test]
async fn a_whole_answer_is_one_message_object() {
    let sim = sim_with(Behaviour { tokens: Some(4), ..Default::default() }).await;
    let gw = gateway_for(&sim).await;
    let (status, body) = messages_text(
        &gw,
        &json!({"model": "qwen", "max_tokens": 50, "temperature": 0.5, "top_k": 20,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let message: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(message["type"], "message");
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["model"], "qwen");
    assert!(message["id"].as_str().is_some_and(|id| id.starts_with("msg_")));
    assert_eq!(message["content"].as_array().map(Vec::len), Some(1));
    assert_eq!(message["content"][0]["text"].as_str().map(|t| t.split_whitespace().count()), Some(4));
    assert_eq!(message["stop_reason"], "end_turn");
    assert_eq!(message["stop_sequence"], Value::Null);
    assert_eq!(message["usage"]["output_tokens"], 4);
    let sent = last_backend_request(&sim).await;
    assert_eq!(
        (sent["max_tokens"].clone(), sent["temperature"].clone(), sent["top_k"].clone()),
        (json!(50), json!(0.5), json!(20))
    );
    assert_eq!(sent["stream"], false);
    // Cut by max_tokens: `max_tokens`.
    let (_, body) = messages_text(
        &gw,
        &json!({"model": "qwen", "max_tokens": 2,
        "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    let message: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(message["stop_reason"], "max_tokens", "{body}");
}

fn bash_tool() -> Value {
    json!({"name": "Bash", "description": "Runs a shell command.", "cache_control": {"type": "ephemeral"},
           "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}})
}

fn read_tool() -> Value {
    json!({"name": "Read", "description": "Reads a file.",
           "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}})
}

#[tokio::test]
async fn a_tool_round_trip_with_several_calls_reaches_the_backend_as_tool_calls_and_tool_messages() {
    let sim = scripted(
        json!({"turns": [
            {"text": "Let me look.", "calls": [
                {"tool": "Bash", "arguments": {"command": "ls -la"}},
                {"tool": "Read", "arguments": {"path": "a.txt"}},
            ]},
            {"text": "There are two files."},
        ]}),
        Behaviour::default(),
    )
    .await;
    let gw = gateway_for(&sim).await;
    let user = json!({"role": "user", "content": [{"type": "text", "text": "list files"}]});
    let first = json!({"model": "qwen", "max_tokens": 200, "stream": true, "tools": [bash_tool(), read_tool()],
                       "tool_choice": {"type": "auto"}, "messages": [user]});
    let (status, body) = messages_text(&gw, &first).await;
    assert_eq!(status, 200, "{body}");
    let events = parse_events(&body);
    let blocks = rebuilt(&events);
    assert_eq!(blocks.len(), 3, "{body}");
    assert_eq!(blocks[0], json!({"type": "text", "text": "Let me look."}));
    assert_eq!((blocks[1]["name"].as_str(), &blocks[1]["input"]), (Some("Bash"), &json!({"command": "ls -la"})));
    assert_eq!((blocks[2]["name"].as_str(), &blocks[2]["input"]), (Some("Read"), &json!({"path": "a.txt"})));
    // The arguments came in several pieces each, as the backend streamed them.
    let pieces = events.iter().filter(|e| e["delta"]["type"] == "input_json_delta" && e["index"] == 1).count();
    assert!(pieces > 1, "{body}");
    let end = events.iter().find(|e| e["type"] == "message_delta").expect("message_delta");
    assert_eq!(end["delta"]["stop_reason"], "tool_use");
    let sent = last_backend_request(&sim).await;
    assert_eq!(sent["tools"][0]["function"]["name"], "Bash");
    assert!(
        sent["tools"][0].get("cache_control").is_none() && sent["tools"][0]["function"].get("cache_control").is_none()
    );
    assert_eq!(sent["tool_choice"], "auto");

    // The next turn: the assistant's blocks as the client got them, then the results.
    let (id1, id2) = (blocks[1]["id"].as_str().expect("id"), blocks[2]["id"].as_str().expect("id"));
    assert_ne!(id1, id2);
    let mut second = first.clone();
    second["stream"] = json!(false);
    second["messages"] = json!([user, {"role": "assistant", "content": blocks},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": id1, "content": "a.txt\nb.txt"},
        {"type": "tool_result", "tool_use_id": id2, "is_error": true, "content": [{"type": "text", "text": "denied"}]},
    ]}]);
    let (status, body) = messages_text(&gw, &second).await;
    assert_eq!(status, 200, "{body}");
    let message: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(message["content"], json!([{"type": "text", "text": "There are two files."}]));
    assert_eq!(message["stop_reason"], "end_turn");
    let sent = last_backend_request(&sim).await;
    let messages = sent["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 4, "{sent}");
    assert_eq!(messages[0], json!({"role": "user", "content": "list files"}));
    assert_eq!(messages[1]["content"], "Let me look.");
    assert_eq!(messages[1]["tool_calls"][0]["id"], id1);
    assert_eq!(
        messages[1]["tool_calls"][0]["function"],
        json!({"name": "Bash", "arguments": "{\"command\":\"ls -la\"}"})
    );
    assert_eq!(messages[1]["tool_calls"][1]["id"], id2);
    assert_eq!(messages[2], json!({"role": "tool", "tool_call_id": id1, "content": "a.txt\nb.txt"}));
    assert_eq!(messages[3], json!({"role": "tool", "tool_call_id": id2, "content": "Error: denied"}));
}

#[tokio::test]
async fn reasoning_is_a_thinking_block_with_its_signature() {
    let behaviour: Behaviour =
        serde_json::from_value(json!({"tokens": 3, "content_field": "reasoning_content"})).expect("behaviour");
    let sim = sim_with(behaviour).await;
    let gw = gateway_for(&sim).await;
    let body = json!({"model": "qwen", "max_tokens": 50, "stream": true, "thinking": {"type": "adaptive"},
                      "messages": [{"role": "user", "content": "think"}]});
    let (status, text) = messages_text(&gw, &body).await;
    assert_eq!(status, 200, "{text}");
    let events = parse_events(&text);
    let kinds: Vec<String> = events
        .iter()
        .map(|e| e["delta"]["type"].as_str().or(e["type"].as_str()).unwrap_or_default().to_string())
        .collect();
    let signature = kinds.iter().position(|k| k == "signature_delta").expect("a signature_delta");
    assert_eq!(kinds[signature + 1], "content_block_stop", "{kinds:?}");
    let blocks = rebuilt(&events);
    assert_eq!(blocks[0]["type"], "thinking");
    assert_eq!(blocks[0]["signature"], "");
    assert_eq!(blocks[0]["thinking"].as_str().map(|t| t.split_whitespace().count()), Some(3));
    assert_eq!(last_backend_request(&sim).await["chat_template_kwargs"], json!({"enable_thinking": true}));
}

#[tokio::test]
async fn a_backend_failing_mid_stream_is_an_error_event_and_no_message_stop() {
    // The connection drops after 3 tokens: the meter cuts the chat stream with its error event.
    let sim = sim_with(Behaviour { tokens: Some(8), drop_after: Some(3), ..Default::default() }).await;
    let gw = gateway_for(&sim).await;
    let body =
        json!({"model": "qwen", "max_tokens": 50, "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let response = messages(&gw, &body).await;
    assert_eq!(response.status(), 200);
    let request_id = response.headers()["x-request-id"].to_str().expect("id").to_string();
    assert_eq!(response.headers()["request-id"], request_id.as_str(), "Anthropic's header too");
    let text = text_of(response).await;
    let events = parse_events(&text);
    let kinds = types(&events);
    assert_eq!(kinds.last(), Some(&"error"), "{text}");
    assert!(!kinds.contains(&"message_stop") && !kinds.contains(&"message_delta"));
    assert!(kinds.contains(&"content_block_delta"));
    let error = events.last().expect("error");
    assert_eq!(error["error"]["type"], "api_error");
    assert!(error["error"]["message"].as_str().is_some_and(|m| m.contains("local")), "{error}");
    assert_eq!(error["request_id"], request_id.as_str());
    let failed = metric(&gw, &format!("mlxgate_requests_total{{{LABELS},outcome=\"backend_error\"}}")).await;
    assert_eq!(failed, Some(1.0));

    // An error event from the backend itself (mlx-openai-server: then a normal stop and [DONE]).
    let sim =
        sim_with(Behaviour { style: Some(Style::MlxOpenaiServer), error_after: Some(2), ..Default::default() }).await;
    let gw = gateway_for(&sim).await;
    let (_, text) = messages_text(&gw, &body).await;
    let events = parse_events(&text);
    assert_eq!(types(&events).last(), Some(&"error"), "{text}");
    assert!(!types(&events).contains(&"message_stop"));
}

/// The body of an Anthropic error, checked: its shape, and the request id beside the error
/// (the same as the `x-request-id` header).
async fn anthropic_error(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let id = response.headers().get("x-request-id").and_then(|v| v.to_str().ok()).map(str::to_string);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["type"], "error", "{body}");
    assert!(body["error"]["type"].is_string() && body["error"]["message"].is_string(), "{body}");
    assert_eq!(body["request_id"].as_str(), id.as_deref(), "{body}");
    assert!(body["error"].get("request_id").is_none());
    (status, body)
}

fn hello(model: &str) -> Value {
    json!({"model": model, "max_tokens": 10, "messages": [{"role": "user", "content": "hello"}]})
}

#[tokio::test]
async fn refusals_are_in_anthropics_shape_and_status() {
    let sim = sim().await;
    let failing = sim_with(Behaviour { fail_status: Some(500), ..Default::default() }).await;
    let refusing = sim_with(Behaviour { fail_status: Some(404), ..Default::default() }).await;
    let gw = gateway(&format!(
        "backends:\n  local: {{url: '{url}', max_concurrency: 1}}\n  \
         failing: {{url: '{failing}', max_concurrency: 1}}\n  \
         refusing: {{url: '{refusing}', max_concurrency: 1}}\n  \
         capped: {{url: '{url}', max_concurrency: 1, context_cap: 64}}\n\
         models:\n  qwen: {{backend: local, upstream_model: tiny-qwen3, max_queue: 4, max_wait: 300ms}}\n  \
         broken: {{backend: failing}}\n  refused: {{backend: refusing}}\n  capped: {{backend: capped}}\n",
        url = sim.url(),
        failing = failing.url(),
        refusing = refusing.url(),
    ))
    .await;
    // An unknown model: 404 not_found_error.
    let (status, body) = anthropic_error(messages(&gw, &hello("claude-nope")).await).await;
    assert_eq!((status, body["error"]["type"].as_str()), (404, Some("not_found_error")));
    // No messages: 400 invalid_request_error, nothing sent.
    let (status, body) = anthropic_error(messages(&gw, &json!({"model": "qwen", "max_tokens": 5})).await).await;
    assert_eq!((status, body["error"]["type"].as_str()), (400, Some("invalid_request_error")));
    assert!(sim_requests(&sim).await.is_empty());
    // The backend's own 500: api_error, its status kept.
    let (status, body) = anthropic_error(messages(&gw, &hello("broken")).await).await;
    assert_eq!((status, body["error"]["type"].as_str()), (500, Some("api_error")));
    // A backend's 404 (mlx_lm.server refuses every bad request so) is a refused request, not a
    // model that does not exist (which Claude Code would tell the user).
    let (status, body) = anthropic_error(messages(&gw, &hello("refused")).await).await;
    assert_eq!((status, body["error"]["type"].as_str()), (400, Some("invalid_request_error")));
    assert_eq!(body["error"]["message"], "simulated failure");
    // Over the context cap (64 tokens, counted by the estimate): Anthropic's words, which
    // Claude Code reacts to.
    let long = json!({"model": "capped", "max_tokens": 10, "stream": true,
        "messages": [{"role": "user", "content": "word ".repeat(400)}]});
    let (status, body) = anthropic_error(messages(&gw, &long).await).await;
    assert_eq!((status, body["error"]["type"].as_str()), (400, Some("invalid_request_error")));
    let message = body["error"]["message"].as_str().expect("message");
    let numbers: Vec<u64> = message
        .strip_prefix("prompt is too long: ")
        .and_then(|rest| rest.strip_suffix(" maximum"))
        .map(|rest| rest.split(" tokens > ").filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_default();
    assert!(numbers.len() == 2 && numbers[1] == 64 && numbers[0] > 64, "{message}");
    // A full slot and a wait longer than max_wait: 529 overloaded_error, with Retry-After.
    let mut holder = post(&gw, "/v1/chat/completions", &chat(true, json!({"hold_after": 1, "hold_key": "w"}))).await;
    read_until(&mut holder, "t0 ").await;
    let response = messages(&gw, &hello("qwen")).await;
    assert!(response.headers().contains_key("retry-after"));
    let (status, body) = anthropic_error(response).await;
    assert_eq!((status, body["error"]["type"].as_str()), (529, Some("overloaded_error")));
    client().post(format!("{}/sim/release/w", sim.url())).send().await.expect("release");
    assert!(text_of(holder).await.contains("[DONE]"));
}

const KEY: &str = "sk-claude-7f3e2a91c0b4d5e6";

#[tokio::test]
async fn keys_from_x_api_key_or_bearer_and_refusals_401_and_429() {
    let sim = sim().await;
    let digest: String = Sha256::digest(KEY.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    let gw = gateway(&format!(
        "backends:\n  local: {{url: '{}', max_concurrency: 2}}\n\
         models:\n  qwen: {{backend: local}}\n\
         auth: required\n\
         clients:\n  claude: {{key_sha256: {digest}, limits: {{rpm: 2}}}}\n",
        sim.url()
    ))
    .await;
    let url = gw.url("/v1/messages");
    // No key, a wrong key: 401 authentication_error.
    let r = client().post(&url).json(&hello("qwen")).send().await.expect("send");
    let (status, body) = anthropic_error(r).await;
    assert_eq!((status, body["error"]["type"].as_str()), (401, Some("authentication_error")));
    let r = client().post(&url).header("x-api-key", "sk-wrong").json(&hello("qwen")).send().await.expect("send");
    assert_eq!(anthropic_error(r).await.0, 401);
    // x-api-key (the anthropic SDKs, Claude Code) and Bearer (ANTHROPIC_AUTH_TOKEN) both work.
    let r = client().post(&url).header("x-api-key", KEY).json(&hello("qwen")).send().await.expect("send");
    assert_eq!(r.status(), 200);
    let r = client().post(&url).bearer_auth(KEY).json(&hello("qwen")).send().await.expect("send");
    assert_eq!(r.status(), 200);
    // Over its rpm: 429 rate_limit_error, with the limiter's headers.
    let r = client().post(&url).header("x-api-key", KEY).json(&hello("qwen")).send().await.expect("send");
    assert!(r.headers().contains_key("retry-after") && r.headers().contains_key("x-ratelimit-limit-requests"));
    let (status, body) = anthropic_error(r).await;
    assert_eq!((status, body["error"]["type"].as_str()), (429, Some("rate_limit_error")));
}

/// Claude Code's system blocks, with the billing line and its nonce.
fn claude_system(nonce: &str) -> Value {
    json!([
        {"type": "text", "text": format!("x-anthropic-billing-header: cc_version=2.1.12.{nonce}; cc_entrypoint=cli; cch={nonce};")},
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Use the tools to help the user.", "cache_control": {"type": "ephemeral"}},
    ])
}

#[tokio::test]
async fn the_billing_block_never_reaches_the_backend_and_turns_share_their_prefix() {
    let sim = scripted(
        json!({"turns": [{"calls": [{"tool": "Bash", "arguments": {"command": "ls"}}]}, {"text": "Done."}]}),
        Behaviour { style: Some(Style::MlxLm), ..Default::default() },
    )
    .await;
    let gw = gateway_for(&sim).await;
    let user =
        json!({"role": "user", "content": [{"type": "text", "text": "list", "cache_control": {"type": "ephemeral"}}]});
    let first = json!({"model": "qwen", "max_tokens": 32000, "stream": true, "system": claude_system("a1f"),
        "tools": [bash_tool(), read_tool()], "thinking": {"type": "adaptive"}, "messages": [user]});
    let (status, text) = messages_text(&gw, &first).await;
    assert_eq!(status, 200, "{text}");
    let blocks = rebuilt(&parse_events(&text));
    let call = blocks.iter().find(|b| b["type"] == "tool_use").expect("a call").clone();
    let turn1 = last_backend_request(&sim).await;
    // Turn 2: a new nonce, the cache mark moved to the last message, as Claude Code does.
    let second = json!({"model": "qwen", "max_tokens": 32000, "stream": true, "system": claude_system("9c2"),
    "tools": [bash_tool(), read_tool()], "thinking": {"type": "adaptive"}, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "list"}]},
        {"role": "assistant", "content": blocks},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "a.txt",
                                      "cache_control": {"type": "ephemeral"}}]},
    ]});
    let (status, text) = messages_text(&gw, &second).await;
    assert_eq!(status, 200, "{text}");
    let turn2 = last_backend_request(&sim).await;
    for sent in [&turn1, &turn2] {
        let text = sent.to_string();
        assert!(!text.contains("x-anthropic-billing-header") && !text.contains("cch="), "{text}");
        assert!(!text.contains("cache_control"), "{text}");
        assert_eq!(
            sent["messages"][0]["content"],
            "You are Claude Code, Anthropic's official CLI for Claude.\n\nUse the tools to help the user."
        );
    }
    // Byte for byte: turn 1's messages are the start of turn 2's, its tools the same.
    let m1 = turn1["messages"].to_string();
    let m2 = turn2["messages"].to_string();
    assert!(m2.starts_with(&m1[..m1.len() - 1]), "{m1}\n{m2}");
    assert_eq!(turn1["tools"].to_string(), turn2["tools"].to_string());
    let stripped = metric(&gw, "mlxgate_anthropic_billing_blocks_stripped_total").await;
    assert_eq!(stripped, Some(2.0));
}

/// Claude Code 2.1.332's first request as recorded (tests/data/agents/claude-code-messages.json:
/// its headers and body), its model renamed to the gateway's: served as a stream, its billing
/// block and its Messages-only fields absent from what the backend got, its 12 tools offered.
#[tokio::test]
async fn claude_codes_recorded_request_is_served() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/agents/claude-code-messages.json");
    let recorded: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("the recording")).expect("json");
    let mut body = recorded["body"].clone();
    body["model"] = json!("qwen");
    let sim = sim_with(Behaviour { style: Some(Style::MlxLm), tokens: Some(3), ..Default::default() }).await;
    let gw = gateway_for(&sim).await;
    let mut request = client().post(gw.url(recorded["path"].as_str().expect("path")));
    for (name, value) in recorded["headers"].as_object().expect("headers") {
        let skip = ["host", "content-length", "accept-encoding"].contains(&name.to_lowercase().as_str());
        if !skip && let Some(value) = value.as_str() {
            request = request.header(name.as_str(), value);
        }
    }
    let response = request.json(&body).send().await.expect("send");
    assert_eq!(response.status(), 200);
    let text = text_of(response).await;
    let events = parse_events(&text);
    assert_eq!(types(&events).last(), Some(&"message_stop"), "{text}");
    let sent = last_backend_request(&sim).await;
    let sent_text = sent.to_string();
    assert!(!sent_text.contains("x-anthropic-billing-header") && !sent_text.contains("cache_control"));
    for field in ["system", "metadata", "thinking", "context_management", "output_config"] {
        assert!(sent.get(field).is_none(), "{field} reached the backend");
    }
    assert_eq!(sent["tools"].as_array().map(Vec::len), Some(12));
    assert_eq!(sent["messages"][0]["role"], "system");
    assert_eq!(metric(&gw, "mlxgate_anthropic_billing_blocks_stripped_total").await, Some(1.0));
}

/// The access log: one line per Messages request, its path without the query, face
/// `messages`, status, outcome and the client's request id (the mlxgate binary's own log).
#[tokio::test]
async fn each_messages_request_has_one_access_line() {
    let sim = sim().await;
    let (gw, lines) = gateway_binary_logged(&one_model_yaml(&sim.url(), 2, 4), &[], "info");
    for (id, body, status) in [
        (
            "ml-stream",
            json!({"model": "qwen", "max_tokens": 5, "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
            200,
        ),
        ("ml-whole", hello("qwen"), 200),
        ("ml-unknown", hello("claude-nope"), 404),
    ] {
        let response = client()
            .post(format!("{}/v1/messages?beta=true", gw.url))
            .header("x-request-id", id)
            .header("anthropic-version", "2023-06-01")
            .json(&body)
            .send()
            .await
            .expect("send");
        assert_eq!(response.status(), status, "{id}");
        assert_eq!(response.headers()["request-id"], id);
        let _ = text_of(response).await;
    }
    let mut logged = Vec::new();
    eventually("three access lines", || {
        logged = lines.lock().expect("lines").iter().filter_map(|l| access_fields(l)).collect::<Vec<_>>();
        let done = logged.len() >= 3;
        async move { done }
    })
    .await;
    assert_eq!(logged.len(), 3, "{logged:#?}");
    for (id, status, outcome) in
        [("ml-stream", 200, "ok"), ("ml-whole", 200, "ok"), ("ml-unknown", 404, "invalid_request_error")]
    {
        let line = logged.iter().find(|l| l["request_id"] == id).unwrap_or_else(|| panic!("{id}: {logged:#?}"));
        assert_eq!(line["path"], "/v1/messages", "{id}");
        assert_eq!(line["face"], "messages", "{id}");
        assert_eq!(line["status"], status, "{id}");
        assert_eq!(line["outcome"], outcome, "{id}");
    }
}
