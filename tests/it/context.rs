//! Context caps against `mlxgate-sim`, counted with the tiny model's own tokenizer: reject with
//! OpenAI's body before anything reaches the backend, middle-out, chunk (map-reduce, streamed
//! reduce), embeddings chunked and averaged, completions prompts, `/v1/models`.

use std::path::Path;

use crate::common::*;
use mlxgate::tokens::counter::Counter;
use mlxgate::tokens::{ChatPrompt, Count};
use serde_json::{Value, json};

const CAP: usize = 256;

/// One sim backend with `context_cap: CAP` and model `qwen` counted with the tiny tokenizer.
fn yaml(sim_url: &str, model_dir: &Path, on_overflow: &str, extra_model: &str) -> String {
    yaml_with_cap(sim_url, model_dir, on_overflow, extra_model, CAP)
}

fn yaml_with_cap(sim_url: &str, model_dir: &Path, on_overflow: &str, extra_model: &str, cap: usize) -> String {
    format!(
        "backends:\n  local: {{url: '{sim_url}', max_concurrency: 2, context_cap: {cap}}}\n\
         models:\n  qwen: {{backend: local, upstream_model: tiny-qwen3, on_overflow: {on_overflow}, \
         tokenizer: '{}', default_max_tokens: 64{extra_model}}}\n",
        model_dir.display()
    )
}

fn counter(model_dir: &Path) -> Counter {
    Counter::load(model_dir).expect("the tiny model's tokenizer loads")
}

/// Words the tiny tokenizer knows (it was trained on them): about one token each.
fn words(n: usize, seed: usize) -> String {
    const W: [&str; 12] = [
        "model", "token", "stream", "server", "gateway", "queue", "request", "answer", "cache", "prompt", "swap",
        "metal",
    ];
    (0..n).map(|i| W[(i * 7 + seed) % W.len()]).collect::<Vec<_>>().join(" ")
}

fn chat_tokens(counter: &Counter, messages: &[Value]) -> usize {
    counter.chat_tokens(ChatPrompt { messages, tools: None, template_kwargs: None }).expect("renders")
}

#[tokio::test]
async fn reject_gives_openai_body_in_both_wordings_and_nothing_reaches_the_backend() {
    let Some(model) = prerequisites(&[]) else { return };
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), &model, "reject", ", min_room: 64")).await;
    let tok = counter(&model);
    let messages = vec![json!({"role": "user", "content": words(400, 0)})];
    let prompt = chat_tokens(&tok, &messages);
    assert!(prompt > CAP, "the test prompt must be over the cap: {prompt}");
    let response =
        post(&gw, "/v1/chat/completions", &json!({"model": "qwen", "messages": messages, "max_tokens": 10})).await;
    assert_eq!(response.status(), 400);
    let mut body: Value = response.json().await.expect("json");
    let id = body["error"].as_object_mut().and_then(|e| e.remove("request_id"));
    assert!(id.is_some_and(|id| id.as_str().is_some_and(|id| id.starts_with("req_"))), "{body}");
    // The messages alone are over: OpenAI's first wording, the completion not counted.
    assert_eq!(
        body,
        json!({"error": {
            "message": format!("This model's maximum context length is {CAP} tokens. However, your messages resulted in {prompt} tokens. Please reduce the length of the messages."),
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}})
    );
    assert!(!body.to_string().to_lowercase().contains("rate limit"));

    // Under the cap but leaving less than min_room (64): OpenAI's second wording, with the
    // client's max_tokens as the completion.
    let near = vec![json!({"role": "user", "content": words(215, 3)})];
    let near_tokens = chat_tokens(&tok, &near);
    assert!(near_tokens < CAP && CAP - near_tokens < 64, "{near_tokens} must leave less than min_room");
    let response =
        post(&gw, "/v1/chat/completions", &json!({"model": "qwen", "messages": near, "max_tokens": 100})).await;
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.expect("json");
    assert_eq!(
        without_request_id(body),
        json!({"error": {
            "message": format!("This model's maximum context length is {CAP} tokens. However, you requested {} tokens ({near_tokens} in the messages, 100 in the completion). Please reduce the length of the messages or completion.", near_tokens + 100),
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}})
    );
    // Without max_tokens, the completion is the room the gateway keeps (min_room).
    let response = post(&gw, "/v1/chat/completions", &json!({"model": "qwen", "messages": near})).await;
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.expect("json");
    let message = body["error"]["message"].as_str().expect("a message");
    assert!(message.contains(&format!("({near_tokens} in the messages, 64 in the completion)")), "{message}");

    assert_eq!(sim_stats(&sim).await["total"], 0, "the backend saw nothing");
    assert_eq!(metric(&gw, "mlxgate_context_overflow_total{action=\"reject\",model=\"qwen\"}").await, Some(3.0));
    assert_eq!(
        metric(&gw, "mlxgate_queue_wait_seconds_count{model=\"qwen\"}").await.unwrap_or(0.0),
        0.0,
        "no rejected request took a queue slot"
    );
    let models: Value = client().get(gw.url("/v1/models")).send().await.expect("models").json().await.expect("json");
    assert_eq!(models["data"][0]["context_length"], CAP);
}

/// OpenCode sends `max_tokens: 32000`, Qwen Code 8000, on any model: a prompt that fits is
/// served with its limit cut to the room left, and the header says so.
#[tokio::test]
async fn a_max_tokens_over_the_room_left_is_cut_to_it_not_refused() {
    let Some(model) = prerequisites(&[]) else { return };
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), &model, "reject", ", min_room: 64")).await;
    let tok = counter(&model);
    let small = vec![json!({"role": "user", "content": "hello"})];
    let small_tokens = chat_tokens(&tok, &small);
    for (field, stream) in [("max_tokens", false), ("max_completion_tokens", true)] {
        let body = json!({"model": "qwen", "messages": small, field: 32000, "stream": stream});
        let response = post(&gw, "/v1/chat/completions", &body).await;
        assert_eq!(response.status(), 200, "{field}");
        let room = CAP - small_tokens;
        assert_eq!(response.headers()["x-mlxgate-transform"], format!("max_tokens={room}").as_str());
        let text = text_of(response).await;
        assert!(!text.contains("error"), "{text}");
        let seen = sim_requests(&sim).await;
        assert_eq!(seen.last().expect("sent")[field], room, "the backend got the room left in {field}");
    }
    // Both limits sent: each is cut on its own, a smaller one is never raised.
    let body = json!({"model": "qwen", "messages": small, "max_completion_tokens": 32000, "max_tokens": 100});
    let response = post(&gw, "/v1/chat/completions", &body).await;
    assert_eq!(response.status(), 200);
    let room = CAP - small_tokens;
    assert_eq!(response.headers()["x-mlxgate-transform"], format!("max_tokens={room}").as_str());
    let sent = sim_requests(&sim).await.last().cloned().expect("sent");
    assert_eq!((sent["max_completion_tokens"].clone(), sent["max_tokens"].clone()), (json!(room), json!(100)));
    // A limit that fits is sent as it is, without the header.
    let response =
        post(&gw, "/v1/chat/completions", &json!({"model": "qwen", "messages": small, "max_tokens": 50})).await;
    assert_eq!(response.status(), 200);
    assert!(response.headers().get("x-mlxgate-transform").is_none());
    assert_eq!(sim_requests(&sim).await.last().expect("sent")["max_tokens"], 50);
    // The answer that reaches the cut says `length` (the sim generates max_tokens tokens).
    let body = json!({"model": "qwen", "messages": small, "max_tokens": 32000, "sim": {"tokens": 100000}});
    let answer: Value = post(&gw, "/v1/chat/completions", &body).await.json().await.expect("json");
    assert_eq!(answer["choices"][0]["finish_reason"], "length", "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], CAP - small_tokens);
}

#[tokio::test]
async fn a_prompt_that_fits_without_max_tokens_gets_the_room_that_is_left() {
    let Some(model) = prerequisites(&[]) else { return };
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), &model, "reject", ", min_room: 16")).await;
    let tok = counter(&model);
    let messages = vec![json!({"role": "user", "content": words(220, 1)})];
    let prompt = chat_tokens(&tok, &messages);
    assert!(prompt < CAP && CAP - prompt < 64, "prompt {prompt} must leave less than the default 64");
    let response = post(&gw, "/v1/chat/completions", &json!({"model": "qwen", "messages": messages})).await;
    assert_eq!(response.status(), 200);
    let seen = sim_requests(&sim).await;
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0]["max_tokens"], CAP - prompt, "max_tokens cut to the room under the cap");
}

#[tokio::test]
async fn middle_out_keeps_system_first_and_last_and_fits() {
    let Some(model) = prerequisites(&[]) else { return };
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), &model, "middle_out", "")).await;
    let tok = counter(&model);
    let mut messages = vec![
        json!({"role": "system", "content": "you are a gateway"}),
        json!({"role": "user", "content": format!("first {}", words(30, 2))}),
    ];
    for i in 0..12 {
        messages.push(json!({"role": "assistant", "content": words(30, i)}));
        messages.push(json!({"role": "user", "content": words(30, i + 3)}));
    }
    messages.push(json!({"role": "user", "content": "last question"}));
    let before = chat_tokens(&tok, &messages);
    assert!(before > CAP);
    let response =
        post(&gw, "/v1/chat/completions", &json!({"model": "qwen", "messages": messages, "max_tokens": 32})).await;
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
    let transform = response.headers()["x-mlxgate-transform"].to_str().expect("ascii").to_string();
    let seen = sim_requests(&sim).await;
    assert_eq!(seen.len(), 1);
    let sent: Vec<Value> = seen[0]["messages"].as_array().expect("messages").clone();
    let after = chat_tokens(&tok, &sent);
    assert!(after + 32 <= CAP, "sent {after} tokens + 32 over the cap {CAP}");
    assert_eq!(transform, format!("middle-out; removed_tokens={}", before - after));
    assert_eq!(sent[0], messages[0], "system kept");
    assert_eq!(sent[1], messages[1], "first user message kept");
    assert_eq!(sent.last(), messages.last(), "last message kept");
    assert_eq!(metric(&gw, "mlxgate_context_overflow_total{action=\"middle_out\",model=\"qwen\"}").await, Some(1.0));
}

#[tokio::test]
async fn chunk_maps_pieces_through_the_queue_and_streams_the_reduce() {
    let Some(model) = prerequisites(&[]) else { return };
    let sim = sim().await;
    // Map-reduce needs room for the partial answers in the reduce prompt: a larger cap.
    const CHUNK_CAP: usize = 1024;
    let gw = gateway(&yaml_with_cap(&sim.url(), &model, "chunk", "", CHUNK_CAP)).await;
    let tok = counter(&model);
    let messages = vec![
        json!({"role": "system", "content": "summarise"}),
        json!({"role": "user", "content": format!("summarise this document: {}", words(3000, 5))}),
    ];
    let body = json!({"model": "qwen", "messages": messages, "max_tokens": 40, "stream": true});
    let response = post(&gw, "/v1/chat/completions", &body).await;
    assert_eq!(response.status(), 200);
    let transform = response.headers()["x-mlxgate-transform"].to_str().expect("ascii").to_string();
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let text = text_of(response).await;
    assert!(text.contains("[DONE]"), "the reduce answer is streamed: {text}");
    let pieces: usize = transform.strip_prefix("chunk; pieces=").expect("chunk header").parse().expect("number");
    assert!(pieces >= 4, "3000 words over a {CHUNK_CAP}-token cap take several pieces: {pieces}");
    let seen = sim_requests(&sim).await;
    assert_eq!(seen.len(), pieces + 1, "P map requests and one reduce");
    for (i, request) in seen.iter().enumerate() {
        let sent: Vec<Value> = request["messages"].as_array().expect("messages").clone();
        let max_tokens = request["max_tokens"].as_u64().expect("max_tokens") as usize;
        let prompt = chat_tokens(&tok, &sent);
        assert!(prompt + max_tokens <= CHUNK_CAP, "request {i}: {prompt} + {max_tokens} over the cap");
        assert_eq!(sent[0], messages[0], "request {i} keeps the instructions");
        let last = i == seen.len() - 1;
        assert_eq!(request["stream"], json!(last), "only the reduce streams");
    }
    assert_eq!(metric(&gw, "mlxgate_context_overflow_total{action=\"chunk\",model=\"qwen\"}").await, Some(1.0));
}

#[tokio::test]
async fn embeddings_over_the_cap_are_chunked_and_averaged() {
    let Some(model) = prerequisites(&[]) else { return };
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), &model, "chunk", "")).await;
    let long = words(700, 3);
    let body = json!({"model": "qwen", "input": ["short one", long]});
    let response = post(&gw, "/v1/embeddings", &body).await;
    assert_eq!(response.status(), 200);
    let transform = response.headers()["x-mlxgate-transform"].to_str().expect("ascii").to_string();
    let answer: Value = response.json().await.expect("json");
    let data = answer["data"].as_array().expect("data");
    assert_eq!(data.len(), 2, "one vector per input");
    assert_eq!(data[1]["index"], 1);
    assert_eq!(data[1]["embedding"].as_array().expect("vector").len(), 8);
    let seen = sim_requests(&sim).await;
    assert_eq!(seen.len(), 1, "one backend request for every piece");
    let inputs = seen[0]["input"].as_array().expect("input");
    assert!(inputs.len() >= 4, "700 words in pieces of {CAP}: {}", inputs.len());
    assert_eq!(transform, format!("chunk; pieces={}", inputs.len()));
    let tok = counter(&model);
    for piece in inputs {
        assert!(tok.text_tokens(piece.as_str().expect("text")) <= CAP);
    }
    // One client request and one backend request: counted once, with the backend's usage once.
    let text = client().get(gw.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    let served: Vec<&str> =
        text.lines().filter(|l| l.starts_with("mlxgate_requests_total{") && !l.ends_with(" 0")).collect();
    assert_eq!(served.len(), 1, "{served:?}");
    assert!(served[0].contains("outcome=\"ok\"") && served[0].ends_with(" 1"), "{served:?}");
    let prompt_tokens = text.lines().find(|l| l.starts_with("mlxgate_prompt_tokens_total{")).expect("prompt tokens");
    let reported: f64 = prompt_tokens.rsplit(' ').next().and_then(|v| v.parse().ok()).expect("a number");
    let sent: usize = inputs.iter().map(|p| tok.text_tokens(p.as_str().expect("text"))).sum();
    assert!(reported > 0.0 && reported <= 2.0 * sent as f64 + 16.0, "counted once: {reported} for {sent} sent");

    // With reject, the same input is refused with the input's wording.
    let gw = gateway(&yaml(&sim.url(), &model, "reject", "")).await;
    let response = post(&gw, "/v1/embeddings", &body).await;
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["param"], "input");
    assert_eq!(body["error"]["code"], "context_length_exceeded");
}

#[tokio::test]
async fn completions_prompts_of_every_shape_are_capped() {
    let Some(model) = prerequisites(&[]) else { return };
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), &model, "reject", "")).await;
    for prompt in
        [json!(words(400, 0)), json!(["short", words(400, 1)]), json!(vec![5; 300]), json!([[1, 2], vec![7; 300]])]
    {
        let response = post(&gw, "/v1/completions", &json!({"model": "qwen", "prompt": prompt, "max_tokens": 8})).await;
        assert_eq!(response.status(), 400, "prompt {prompt}");
        let body: Value = response.json().await.expect("json");
        assert_eq!(body["error"]["code"], "context_length_exceeded");
        assert_eq!(body["error"]["param"], "prompt");
    }
    let response =
        post(&gw, "/v1/completions", &json!({"model": "qwen", "prompt": vec![5; 100], "max_tokens": 8})).await;
    assert_eq!(response.status(), 200);
    assert_eq!(sim_stats(&sim).await["total"], 1, "only the prompt that fits reached the backend");

    let gw = gateway(&yaml(&sim.url(), &model, "middle_out", "")).await;
    let response =
        post(&gw, "/v1/completions", &json!({"model": "qwen", "prompt": words(400, 2), "max_tokens": 8})).await;
    assert_eq!(response.status(), 200);
    assert!(response.headers()["x-mlxgate-transform"].to_str().unwrap().starts_with("middle-out; removed_tokens="));
    let seen = sim_requests(&sim).await;
    let sent = seen.last().expect("a request")["prompt"].as_str().expect("text").to_string();
    assert!(counter(&model).text_tokens(&sent) + 8 <= CAP);
}

#[tokio::test]
async fn a_rejected_prompt_never_starts_or_swaps_a_managed_backend() {
    let Some(model) = prerequisites(&[]) else { return };
    let sim_bin = env!("CARGO_BIN_EXE_mlxgate-sim");
    let port = free_port();
    let config = format!(
        "backends:\n  managed:\n    kind: custom\n    command: ['{sim_bin}', '--port', '{{port}}']\n    port: {port}\n    \
         context_cap: {CAP}\n    stop_timeout: 5s\n\
         models:\n  qwen: {{backend: managed, tokenizer: '{}', max_wait: 60s}}\n",
        model.display()
    );
    let gw = gateway(&config).await;
    let response = post(
        &gw,
        "/v1/chat/completions",
        &json!({"model": "qwen", "messages": [{"role": "user", "content": words(400, 0)}]}),
    )
    .await;
    assert_eq!(response.status(), 400);
    assert_eq!(backend_state(&gw, "managed").await["state"], "stopped", "the rejection started nothing");
    assert!(processes_with(&[sim_bin, &port.to_string()]).is_empty(), "no server process was spawned");
}

#[tokio::test]
async fn shapes_the_real_qwen_template_cannot_render_still_reach_the_backend() {
    // Qwen3's template calls string methods on every content: text parts, a null content
    // beside tool calls and image parts must neither fail counting nor be refused.
    let Some(_) = prerequisites(&[]) else { return };
    let qwen = Path::new(ROOT).join(".cache/qwen3.6-tokenizer");
    assert!(qwen.join("tokenizer.json").is_file(), "needs .cache/qwen3.6-tokenizer: run scripts/setup-backends tokens");
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), &qwen, "reject", "")).await;
    let bodies = [
        json!({"model": "qwen", "max_tokens": 8, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "there"}]}]}),
        json!({"model": "qwen", "max_tokens": 8, "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]}),
        json!({"model": "qwen", "max_tokens": 8, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}),
    ];
    for body in &bodies {
        let response = post(&gw, "/v1/chat/completions", body).await;
        assert_eq!(response.status(), 200, "{body}: {:?}", response.text().await);
    }
    assert_eq!(sim_stats(&sim).await["total"], 3);
    let seen = sim_requests(&sim).await;
    assert!(seen[0]["messages"][0]["content"].is_array(), "a prompt that fits is forwarded as the client sent it");
}

#[tokio::test]
async fn a_streamed_chunk_sends_headers_and_keepalives_while_mapping_and_a_gone_client_stops_it() {
    let Some(model) = prerequisites(&[]) else { return };
    let sim = sim().await;
    const CHUNK_CAP: usize = 1024;
    let gw = gateway(&yaml_with_cap(&sim.url(), &model, "chunk", "", CHUNK_CAP)).await;
    let messages = vec![
        json!({"role": "system", "content": "summarise"}),
        json!({"role": "user", "content": format!("summarise this document: {}", words(3000, 5))}),
    ];
    // Every map request takes 2 s before its answer: the client hears from the gateway first.
    let body = json!({"model": "qwen", "messages": messages, "max_tokens": 40, "stream": true,
        "sim": {"ttft_ms": 2000}});
    let mut response = post(&gw, "/v1/chat/completions", &body).await;
    assert_eq!(response.status(), 200);
    assert!(response.headers()["x-mlxgate-transform"].to_str().unwrap().starts_with("chunk; pieces="));
    let first = read_until(&mut response, ": mlxgate chunk: mapping").await;
    assert!(!first.contains("data:"), "nothing but the comment yet: {first}");
    let pieces: u64 = response.headers()["x-mlxgate-transform"].to_str().unwrap()[14..].parse().unwrap();
    assert!(sim_stats(&sim).await["total"].as_u64().unwrap() <= pieces, "the reduce waits for every piece");
    // The client leaves during the map phase: the gateway stops mapping and frees the slots.
    drop(response);
    eventually("the map requests stop", || async {
        sim_stats(&sim).await["active"] == 0
            && metric(&gw, "mlxgate_inflight_requests{backend=\"local\"}").await == Some(0.0)
    })
    .await;
    eventually("the chunked request counted as client_closed", || async {
        metric(
            &gw,
            "mlxgate_requests_total{backend=\"local\",client=\"anonymous\",model=\"qwen\",outcome=\"client_closed\"}",
        )
        .await
            >= Some(1.0)
    })
    .await;
    let total = sim_stats(&sim).await["total"].as_u64().unwrap();
    assert!(total <= pieces, "no reduce was sent for a client that left: {total} requests");
}

/// An agent's `max_tokens: 32000` on a chunked prompt: the pieces and the reduce get limits that
/// fit, and the header says the client's limit was cut (as middle-out's does).
#[tokio::test]
async fn a_chunked_answer_whose_limit_was_cut_says_so_in_the_header() {
    let Some(model) = prerequisites(&[]) else { return };
    let sim = sim().await;
    let gw = gateway(&yaml_with_cap(&sim.url(), &model, "chunk", "", 2048)).await;
    let body = json!({"model": "qwen", "max_tokens": 32000, "messages": [{"role": "user", "content": words(3000, 4)}]});
    let response = post(&gw, "/v1/chat/completions", &body).await;
    assert_eq!(response.status(), 200);
    let transform = response.headers()["x-mlxgate-transform"].to_str().expect("ascii").to_string();
    let seen = sim_requests(&sim).await;
    let reduce = seen.last().expect("the reduce")["max_tokens"].as_u64().expect("a limit");
    assert!(seen.iter().all(|r| r["max_tokens"].as_u64().is_some_and(|m| m < 2048)), "{seen:?}");
    assert!(
        transform.starts_with("chunk; pieces=") && transform.ends_with(&format!(", max_tokens={reduce}")),
        "{transform}"
    );
}

/// A client that sent both limits, the smaller one `max_completion_tokens` (review): a chunked
/// answer gets at most that, and the header reports no cut of a limit that was not cut.
#[tokio::test]
async fn a_chunked_answer_never_raises_the_smaller_of_two_limits() {
    let Some(model) = prerequisites(&[]) else { return };
    let sim = sim().await;
    let gw = gateway(&yaml_with_cap(&sim.url(), &model, "chunk", "", 2048)).await;
    let body = json!({"model": "qwen", "max_tokens": 32000, "max_completion_tokens": 50,
        "messages": [{"role": "user", "content": words(3000, 4)}]});
    let response = post(&gw, "/v1/chat/completions", &body).await;
    assert_eq!(response.status(), 200);
    let transform = response.headers()["x-mlxgate-transform"].to_str().expect("ascii").to_string();
    let seen = sim_requests(&sim).await;
    let reduce = seen.last().expect("the reduce")["max_tokens"].as_u64().expect("a limit");
    assert_eq!(reduce, 50, "the client's smaller limit; header {transform}");
    assert!(transform.starts_with("chunk; pieces=") && !transform.contains("max_tokens="), "{transform}");
}
