//! `POST /v1/messages/count_tokens` against `mlxgate-sim`, counted with the tiny model's own
//! tokenizer and chat template: the count is the one the context cap takes (a `/v1/messages`
//! request with a huge `max_tokens` reaches the backend with exactly `cap − count`), the
//! billing block counts nothing, nothing reaches the backend, a key is needed where auth is
//! required, an unknown model (or one the client may not use) is Anthropic's `not_found_error`,
//! a model without a tokenizer gets the estimate its cap uses, counting spends none of the
//! client's rate, many big counts at once leave a core to a turn's own count, and each count
//! is a request in `mlxgate_requests_total` (under its model, no backend) and the access log.

use std::path::Path;

use crate::common::*;
use mlxgate::tokens::counter::Counter;
use mlxgate::tokens::{ChatPrompt, Count};
use serde_json::{Value, json};

const CAP: usize = 4096;
const KEY: &str = "sk-count-test";

/// One sim backend with `context_cap: CAP`; `qwen` counted with the tiny tokenizer, `guess`
/// with no tokenizer (the estimate); `tops` is put before `backends:`.
fn yaml(sim_url: &str, model_dir: &Path, top: &str) -> String {
    format!(
        "{top}backends:\n  local: {{url: '{sim_url}', max_concurrency: 2, context_cap: {CAP}}}\n\
         models:\n  qwen: {{backend: local, upstream_model: tiny-qwen3, tokenizer: '{}'}}\n  \
         guess: {{backend: local, upstream_model: no-such-model-on-disk}}\n",
        model_dir.display()
    )
}

/// A Messages request the way Claude Code shapes one (billing block first, system blocks with
/// `cache_control`, a tool, a tool round trip), without `max_tokens`.
fn request(model: &str, billing: Option<&str>) -> Value {
    let mut system = vec![
        json!({"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}),
        json!({"type": "text", "text": "Answer in one line."}),
    ];
    if let Some(line) = billing {
        system.insert(0, json!({"type": "text", "text": line}));
    }
    json!({
        "model": model,
        "system": system,
        "tools": [{"name": "Bash", "description": "Runs a command.",
                   "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}],
        "tool_choice": {"type": "auto"},
        "messages": [
            {"role": "user", "content": "list the files"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Listing them."},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt\nb.txt"},
                {"type": "text", "text": "and now?"}]},
        ],
    })
}

/// The chat messages that request becomes, translated by hand (the system blocks joined by a
/// blank line, the tool call's arguments parsed as the servers render them).
fn translated_by_hand() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "You are a coding agent.\n\nAnswer in one line."}),
        json!({"role": "user", "content": "list the files"}),
        json!({"role": "assistant", "content": "Listing them.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}}]}),
        json!({"role": "tool", "tool_call_id": "toolu_1", "content": "a.txt\nb.txt"}),
        json!({"role": "user", "content": "and now?"}),
    ]
}

async fn count(gw: &Gateway, body: &Value, key: Option<&str>) -> reqwest::Response {
    let mut r = client()
        .post(gw.url("/v1/messages/count_tokens"))
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "token-counting-2024-11-01")
        .json(body);
    if let Some(key) = key {
        r = r.header("x-api-key", key);
    }
    r.send().await.expect("send")
}

async fn input_tokens(gw: &Gateway, body: &Value) -> usize {
    let r = count(gw, body, None).await;
    let status = r.status();
    let id = r.headers().get("request-id").expect("Anthropic's request-id header").clone();
    assert_eq!(Some(&id), r.headers().get("x-request-id"));
    let text = text_of(r).await;
    assert_eq!(status, 200, "{text}");
    let answer: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(answer.as_object().map(|o| o.len()), Some(1), "only input_tokens: {answer}");
    answer["input_tokens"].as_u64().unwrap_or_else(|| panic!("no input_tokens: {answer}")) as usize
}

#[tokio::test]
async fn the_count_is_the_templates_and_the_caps_and_the_billing_block_counts_nothing() {
    let Some(model) = prerequisites(&[]) else { return };
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), &model, "aliases: {'claude-*': qwen}\n")).await;
    let counted = input_tokens(&gw, &request("qwen", None)).await;
    // Claude Code counts under the name it sends, which an alias maps to the model.
    assert_eq!(input_tokens(&gw, &request("claude-opus-5-5", None)).await, counted);

    // The tiny model's own tokenizer and template on the same conversation.
    let counter = Counter::load(&model).expect("tokenizer");
    let messages = translated_by_hand();
    let tools = [json!({"type": "function", "function": {"name": "Bash", "description": "Runs a command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}})];
    let by_hand = counter
        .chat_tokens(ChatPrompt { messages: &messages, tools: Some(&tools), template_kwargs: None })
        .expect("renders");
    assert_eq!(counted, by_hand);

    // Claude Code's billing line, whatever its nonce, is not part of the prompt.
    for nonce in ["a1b2c", "ffff0"] {
        let line = format!("x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=cli; cch={nonce};");
        assert_eq!(input_tokens(&gw, &request("qwen", Some(&line))).await, counted);
    }
    // Counting asked nothing of the backend.
    assert!(sim_requests(&sim).await.is_empty(), "count_tokens reached the backend");

    // The cap counts the same: a /v1/messages request asking for far more than the cap reaches
    // the backend with the room the prompt leaves, cap − count.
    let mut whole = request("qwen", Some("x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=cli;"));
    whole["max_tokens"] = json!(128000);
    let r = post(&gw, "/v1/messages", &whole).await;
    let status = r.status();
    let text = text_of(r).await;
    assert_eq!(status, 200, "{text}");
    let sent = sim_requests(&sim).await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["max_tokens"], json!(CAP - counted), "{}", sent[0]);

    // Each count is one request, ok, under its model and no backend (none was asked); the
    // /v1/messages request under its backend.
    let series = |backend: &str| {
        format!("mlxgate_requests_total{{backend=\"{backend}\",client=\"anonymous\",model=\"qwen\",outcome=\"ok\"}}")
    };
    assert_eq!(metric(&gw, &series("")).await, Some(4.0));
    assert_eq!(metric(&gw, &series("local")).await, Some(1.0));
}

#[tokio::test]
async fn a_model_without_a_tokenizer_is_counted_with_the_estimate_its_cap_uses() {
    let Some(model) = prerequisites(&[]) else { return };
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), &model, "")).await;
    let estimated = input_tokens(&gw, &request("guess", None)).await;
    assert!(estimated > 0);
    let mut whole = request("guess", None);
    whole["max_tokens"] = json!(128000);
    let r = post(&gw, "/v1/messages", &whole).await;
    assert_eq!(r.status(), 200, "{}", text_of(r).await);
    let sent = sim_requests(&sim).await;
    assert_eq!(sent[0]["max_tokens"], json!(CAP - estimated), "{}", sent[0]);
}

#[tokio::test]
async fn a_key_is_needed_and_a_model_the_client_cannot_use_does_not_exist() {
    let Some(model) = prerequisites(&[]) else { return };
    let sim = sim().await;
    let top = format!("auth: required\nclients:\n  claude: {{key: '{KEY}', models: [qwen]}}\n");
    let gw = gateway(&yaml(&sim.url(), &model, &top)).await;
    let r = count(&gw, &request("qwen", None), None).await;
    assert_eq!(r.status(), 401);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "authentication_error", "{body}");

    let r = count(&gw, &request("qwen", None), Some(KEY)).await;
    assert_eq!(r.status(), 200);
    for model in ["guess", "claude-no-such-model"] {
        let r = count(&gw, &request(model, None), Some(KEY)).await;
        assert_eq!(r.status(), 404, "{model}");
        let body: Value = r.json().await.expect("json");
        assert_eq!(body["type"], "error", "{body}");
        assert_eq!(body["error"]["type"], "not_found_error", "{body}");
    }
    // A body that is not a Messages request: Anthropic's invalid_request_error.
    let r = count(&gw, &json!({"model": "qwen"}), Some(KEY)).await;
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    assert!(sim_requests(&sim).await.is_empty(), "count_tokens reached the backend");
}

/// The access log (the mlxgate binary's own): one line per count, face `messages`, its path,
/// status and outcome, the client's request id; no prompt text in any line.
#[tokio::test]
async fn each_count_has_one_access_line() {
    let Some(model) = prerequisites(&[]) else { return };
    let sim = sim().await;
    let (gw, lines) = gateway_binary_logged(&yaml(&sim.url(), &model, ""), &[], "info");
    for (id, model, status) in [("ct-ok", "qwen", 200), ("ct-unknown", "claude-nope", 404)] {
        let response = client()
            .post(format!("{}/v1/messages/count_tokens?beta=true", gw.url))
            .header("x-request-id", id)
            .header("anthropic-version", "2023-06-01")
            .json(&request(model, None))
            .send()
            .await
            .expect("send");
        assert_eq!(response.status(), status, "{id}");
        assert_eq!(response.headers()["request-id"], id);
        let _ = text_of(response).await;
    }
    let mut logged = Vec::new();
    eventually("two access lines", || {
        logged = lines.lock().expect("lines").iter().filter_map(|l| access_fields(l)).collect::<Vec<_>>();
        let done = logged.len() >= 2;
        async move { done }
    })
    .await;
    assert_eq!(logged.len(), 2, "{logged:#?}");
    for (id, status, outcome) in [("ct-ok", 200, "ok"), ("ct-unknown", 404, "invalid_request_error")] {
        let line = logged.iter().find(|l| l["request_id"] == id).unwrap_or_else(|| panic!("{id}: {logged:#?}"));
        assert_eq!(line["path"], "/v1/messages/count_tokens", "{id}");
        assert_eq!(line["face"], "messages", "{id}");
        assert_eq!(line["status"], status, "{id}");
        assert_eq!(line["outcome"], outcome, "{id}");
    }
    let all = lines.lock().expect("lines").join("\n");
    assert!(!all.contains("list the files"), "prompt text in the log");
}

/// Counting charges no rate limit: a client with `rpm: 1` counts three times and still has its
/// one request of the minute.
#[tokio::test]
async fn counting_spends_none_of_the_clients_rate() {
    let Some(model) = prerequisites(&[]) else { return };
    let sim = sim().await;
    let top = format!("auth: required\nclients:\n  claude: {{key: '{KEY}', limits: {{rpm: 1}}}}\n");
    let gw = gateway(&yaml(&sim.url(), &model, &top)).await;
    for _ in 0..3 {
        assert_eq!(count(&gw, &request("qwen", None), Some(KEY)).await.status(), 200);
    }
    let mut whole = request("qwen", None);
    whole["max_tokens"] = json!(8);
    let send = || client().post(gw.url("/v1/messages")).header("x-api-key", KEY).json(&whole).send();
    let first = send().await.expect("send");
    assert_eq!(first.status(), 200, "{}", text_of(first).await);
    let second = send().await.expect("send");
    assert_eq!(second.status(), 429, "rpm 1 holds");
}

/// Counts are exempt from the client's limits, so they take at most all of the counting pool's
/// cores but one: a turn sent while a client's many big counts wait for the pool is counted on
/// the core left, not after every count sent before it (it waited for all of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_leave_a_core_to_the_turns() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let Some(model) = prerequisites(&[]) else { return };
    let sim = sim().await;
    let gw = Arc::new(gateway(&yaml(&sim.url(), &model, "")).await);
    // Each count tokenizes 100 kB of text: long enough that the others queue.
    let big = Arc::new(json!({"model": "qwen", "messages": [{"role": "user", "content": "word ".repeat(20_000)}]}));
    const COUNTS: usize = 8;
    let done = Arc::new(AtomicUsize::new(0));
    let counts: Vec<_> = (0..COUNTS)
        .map(|_| {
            let (gw, big, done) = (Arc::clone(&gw), Arc::clone(&big), Arc::clone(&done));
            tokio::spawn(async move {
                let r = count(&gw, &big, None).await;
                assert_eq!(r.status(), 200, "{}", text_of(r).await);
                done.fetch_add(1, Ordering::SeqCst);
            })
        })
        .collect();
    // Once one count has ended, the others have long arrived and wait for the pool.
    eventually("a count ends", || async { done.load(Ordering::SeqCst) >= 1 }).await;
    let mut turn = request("qwen", None);
    turn["max_tokens"] = json!(8);
    let answered = client().post(gw.url("/v1/messages")).json(&turn).send().await.expect("send");
    let ended_before = done.load(Ordering::SeqCst);
    assert_eq!(answered.status(), 200, "{}", text_of(answered).await);
    for count in counts {
        count.await.expect("count");
    }
    assert!(ended_before <= COUNTS / 2, "the turn waited for {ended_before} of the {COUNTS} counts sent before it");
}
