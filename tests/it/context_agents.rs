//! What today's agents really send, against a 32k model: OpenCode's `max_tokens: 32000` and Qwen
//! Code's 32768 (their recorded request bodies, tests/data/agents) on a 32768-token cap counted
//! with Qwen3.6's real vocabulary. Served, with the limit cut to the room the prompt leaves and
//! the header saying so; a prompt that truly does not fit gets OpenAI's exact body in both its
//! wordings.

use std::path::Path;

use crate::common::*;
use mlxgate::tokens::counter::Counter;
use mlxgate::tokens::{ChatPrompt, Count};
use serde_json::{Value, json};

const QWEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/.cache/qwen3.6-tokenizer");
const CAP: usize = 32768;

fn yaml(sim_url: &str) -> String {
    format!(
        "backends:\n  local: {{url: '{sim_url}', max_concurrency: 2, context_cap: {CAP}}}\n\
         models:\n  qwen: {{backend: local, upstream_model: tiny-qwen3, on_overflow: reject, tokenizer: '{QWEN}'}}\n"
    )
}

fn recorded(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/agents").join(name);
    serde_json::from_slice(&std::fs::read(&path).expect("the recorded body")).expect("JSON")
}

/// The prompt's tokens as the servers render it (text parts joined by newlines, a null content
/// empty, tool-call arguments parsed), with the request's tools: the count the gateway makes.
fn prompt_tokens(counter: &Counter, body: &Value) -> usize {
    let mut messages = body["messages"].as_array().expect("messages").clone();
    for message in &mut messages {
        if message["content"].is_null() {
            message["content"] = Value::String(String::new());
        }
        if let Some(parts) = message["content"].as_array() {
            let text: Vec<&str> = parts.iter().filter_map(|p| p["text"].as_str()).collect();
            message["content"] = Value::String(text.join("\n"));
        }
        if let Some(calls) = message["tool_calls"].as_array_mut() {
            for call in calls {
                let arguments = &mut call["function"]["arguments"];
                if let Some(parsed) = arguments.as_str().and_then(|a| serde_json::from_str::<Value>(a).ok()) {
                    *arguments = parsed;
                }
            }
        }
    }
    let tools = body["tools"].as_array().cloned();
    let prompt = ChatPrompt { messages: &messages, tools: tools.as_deref(), template_kwargs: None };
    counter.chat_tokens(prompt).expect("the template renders")
}

fn with_last_user_padded(body: &Value, words: usize) -> Value {
    let mut body = body.clone();
    let messages = body["messages"].as_array_mut().expect("messages");
    let user = messages.iter_mut().rev().find(|m| m["role"] == "user").expect("a user message");
    let pad: String = (0..words).map(|i| ["alpha ", "beta ", "gamma ", "delta "][i % 4]).collect();
    match &mut user["content"] {
        Value::Array(parts) => parts.insert(0, json!({"type": "text", "text": pad})),
        content => *content = Value::String(format!("{pad}{}", content.as_str().unwrap_or(""))),
    }
    body
}

/// `body` with its last user message padded until the prompt counts `target` tokens, give or
/// take a few (the padding's words are not one token each at every boundary).
fn padded_to(counter: &Counter, body: &Value, target: usize) -> (Value, usize) {
    let mut words = target.saturating_sub(prompt_tokens(counter, body));
    for _ in 0..6 {
        let padded = with_last_user_padded(body, words);
        let tokens = prompt_tokens(counter, &padded);
        if tokens.abs_diff(target) <= 8 {
            return (padded, tokens);
        }
        words = (words as isize + target as isize - tokens as isize).max(0) as usize;
    }
    panic!("could not pad the prompt to {target} tokens");
}

#[tokio::test]
async fn opencode_and_qwen_code_turns_on_a_32k_model_are_served_with_the_room_left() {
    assert!(Path::new(QWEN).join("tokenizer.json").is_file(), "needs {QWEN}: run scripts/setup-backends tokens");
    let counter = Counter::load(Path::new(QWEN)).expect("Qwen3.6's tokenizer");
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url())).await;
    for (file, asked) in [("opencode-chat.json", 32000), ("qwen-code-chat.json", 32768)] {
        let body = recorded(file);
        assert_eq!(body["max_tokens"], asked, "{file}: the recorded limit");
        assert!(body["tools"].as_array().expect("tools").len() >= 10, "{file}");
        let prompt = prompt_tokens(&counter, &body);
        assert!(prompt + asked > CAP && prompt + 256 <= CAP, "{file}: prompt {prompt}");
        let response = post(&gw, "/v1/chat/completions", &body).await;
        assert_eq!(response.status(), 200, "{file}");
        let room = CAP - prompt;
        assert_eq!(response.headers()["x-mlxgate-transform"], format!("max_tokens={room}").as_str(), "{file}");
        let text = text_of(response).await;
        assert!(text.trim_end().ends_with("data: [DONE]") && !text.contains("\"error\""), "{file}: {text}");
        let seen = sim_requests(&sim).await;
        assert_eq!(seen.last().expect("sent")["max_tokens"], room, "{file}: the backend got the room left");

        // Padded to leave less than min_room (256): OpenAI's "you requested" wording.
        let (near, near_prompt) = padded_to(&counter, &body, CAP - 100);
        assert!(near_prompt < CAP && CAP - near_prompt < 256, "{file}: {near_prompt}");
        let response = post(&gw, "/v1/chat/completions", &near).await;
        assert_eq!(response.status(), 400, "{file}");
        let refused: Value = response.json().await.expect("json");
        assert_eq!(
            without_request_id(refused),
            json!({"error": {
                "message": format!("This model's maximum context length is {CAP} tokens. However, you requested {} tokens ({near_prompt} in the messages, {asked} in the completion). Please reduce the length of the messages or completion.", near_prompt + asked),
                "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}),
            "{file}"
        );
        // Over the cap by itself: "your messages resulted in N tokens".
        let (over, over_prompt) = padded_to(&counter, &body, CAP + 1000);
        let response = post(&gw, "/v1/chat/completions", &over).await;
        assert_eq!(response.status(), 400, "{file}");
        let refused: Value = response.json().await.expect("json");
        assert_eq!(
            refused["error"]["message"],
            format!(
                "This model's maximum context length is {CAP} tokens. However, your messages resulted in {over_prompt} tokens. Please reduce the length of the messages."
            ),
            "{file}"
        );
    }
    assert_eq!(sim_stats(&sim).await["total"], 2, "only the two that fit reached the backend");
}
