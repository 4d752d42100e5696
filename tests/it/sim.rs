//! `mlxgate-sim` reproduces the quirks of the real servers (DESIGN.md's table); these tests pin
//! each one down so that gateway tests built on it mean what they say.

use crate::common::*;
use mlxgate::sim::{self, Behaviour, SimConfig, Style};
use serde_json::{Value, json};

async fn stream_text(base: &str, sim_knobs: Value, include_usage: bool) -> String {
    let body = json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "a b c"}],
        "stream_options": {"include_usage": include_usage}, "sim": sim_knobs});
    let r = client().post(format!("{base}/v1/chat/completions")).json(&body).send().await.expect("send");
    assert_eq!(r.status(), 200);
    text_of(r).await
}

fn events(text: &str) -> Vec<Value> {
    data_lines(text).iter().filter(|d| *d != "[DONE]").map(|d| serde_json::from_str(d).expect("json event")).collect()
}

#[tokio::test]
async fn mlx_lm_style_sends_keepalive_comments_and_a_usage_chunk_with_no_choices() {
    let s = sim_with(Behaviour { style: Some(Style::MlxLm), ..Default::default() }).await;
    let text = stream_text(&s.url(), json!({"ttft_ms": 120, "keepalive_ms": 30, "tokens": 2}), true).await;
    assert!(text.lines().any(|l| l.starts_with(": keepalive ") && l.ends_with("/3")), "{text}");
    let ev = events(&text);
    let usage = ev.last().expect("usage chunk");
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 2);
    assert_eq!(usage["usage"]["prompt_tokens"], 3);
}

#[tokio::test]
async fn omlx_style_sends_a_fake_keepalive_chunk_first_and_refuses_long_prompts() {
    let s = sim_with(Behaviour { style: Some(Style::Omlx), ..Default::default() }).await;
    let text = stream_text(&s.url(), json!({"ttft_ms": 50, "tokens": 2, "prompt_cap": 100}), false).await;
    let ev = events(&text);
    assert_eq!(ev[0]["id"], "chatcmpl-keepalive");
    assert_eq!(ev[0]["choices"][0]["delta"]["content"], "");

    let long = "w ".repeat(40_000);
    let r = client()
        .post(format!("{}/v1/chat/completions", s.url()))
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": long}]}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.expect("json");
    assert_eq!(e["error"]["message"], "Prompt too long: 40000 tokens exceeds max context window of 32768 tokens");
    assert_eq!(e["error"]["code"], Value::Null);
}

#[tokio::test]
async fn usage_placements_and_the_vllm_double_usage() {
    let s = sim_with(Behaviour { style: Some(Style::VllmMlx), ..Default::default() }).await;
    let ev = events(&stream_text(&s.url(), json!({"tokens": 3}), true).await);
    let with_usage: Vec<&Value> = ev.iter().filter(|e| e.get("usage").is_some()).collect();
    assert_eq!(with_usage.len(), 2, "finish chunk and usage-only chunk: {ev:?}");
    assert_eq!(with_usage[0]["choices"][0]["finish_reason"], "stop");

    let s = sim_with(Behaviour { style: Some(Style::MlxOpenaiServer), ..Default::default() }).await;
    let ev = events(&stream_text(&s.url(), json!({"tokens": 3}), false).await);
    assert_eq!(ev[0]["choices"][0]["delta"], json!({"role": "assistant"}), "role-only first chunk");
    assert!(ev.last().expect("finish")["usage"].is_object(), "usage always on the finish chunk");
    let none = events(&stream_text(&s.url(), json!({"tokens": 3, "usage": "none"}), true).await);
    assert!(none.iter().all(|e| e.get("usage").is_none()));
}

#[tokio::test]
async fn error_events_end_the_stream_in_each_servers_way() {
    let s = sim_with(Behaviour { style: Some(Style::MlxOpenaiServer), ..Default::default() }).await;
    let text = stream_text(&s.url(), json!({"tokens": 5, "error_after": 2}), false).await;
    let ev = events(&text);
    let err_at = ev.iter().position(|e| e.get("error").is_some()).expect("error event");
    assert_eq!(ev[err_at + 1]["choices"][0]["finish_reason"], "stop");
    assert!(text.ends_with("data: [DONE]\n\n"));

    let s = sim_with(Behaviour { style: Some(Style::MlxOmni), ..Default::default() }).await;
    let text = stream_text(&s.url(), json!({"tokens": 5, "error_after": 2}), false).await;
    assert!(events(&text).last().expect("last")["error"].is_object());
    assert!(!text.contains("[DONE]"));
    assert!(
        events(&text)
            .iter()
            .filter(|e| e.get("choices").is_some())
            .all(|e| e["choices"][0]["delta"]["role"] == "assistant")
    );
}

#[tokio::test]
async fn byte_splitting_bursts_and_reasoning_only_streams_keep_the_same_events() {
    let s = sim().await;
    let whole = stream_text(&s.url(), json!({"tokens": 4}), true).await;
    let split = stream_text(&s.url(), json!({"tokens": 4, "bytes_per_write": 1}), true).await;
    let strip = |t: &str| -> Vec<Value> {
        events(t)
            .into_iter()
            .map(|mut e| {
                e["id"] = json!(null);
                e["created"] = json!(null);
                e
            })
            .collect()
    };
    assert_eq!(strip(&whole), strip(&split));
    let burst = stream_text(&s.url(), json!({"tokens": 4, "burst": true}), false).await;
    assert_eq!(events(&burst).len(), events(&whole).len() - 1, "same frames less the usage chunk");

    let hidden =
        events(&stream_text(&s.url(), json!({"tokens": 4, "content_field": "none", "usage": "finish"}), true).await);
    assert!(hidden.iter().all(|e| e["choices"][0]["delta"].get("content").is_none()));
    assert_eq!(hidden.last().expect("finish")["usage"]["completion_tokens"], 4);
}

#[tokio::test]
async fn batching_capacity_and_speedup_curve() {
    let s = sim::spawn(SimConfig { capacity: 2, speedup: vec![1.0, 2.0], ..Default::default() }).await.expect("sim");
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let url = s.url();
        tasks.push(tokio::spawn(async move {
            stream_text(&url, json!({"tokens": 2, "hold_after": 1, "hold_key": "cap"}), false).await
        }));
    }
    eventually("two generating", || async { sim_stats(&s).await["held"] == 2 }).await;
    assert_eq!(sim_stats(&s).await["total"], 3, "the third request arrived and waits for capacity");
    assert_eq!(s.state.active(), 2);
    client().post(format!("{}/sim/release/cap", s.url())).send().await.expect("release");
    for t in tasks {
        assert!(t.await.expect("task").contains("[DONE]"));
    }
    assert_eq!(s.state.peak(), 2);
}

#[tokio::test]
async fn fail_status_and_hang_before_headers() {
    let s = sim().await;
    let r = client()
        .post(format!("{}/v1/chat/completions", s.url()))
        .json(&json!({"model": "m", "messages": [], "sim": {"fail_status": 500}}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 500);
    let hung = client()
        .post(format!("{}/v1/chat/completions", s.url()))
        .timeout(std::time::Duration::from_millis(200))
        .json(&json!({"model": "m", "messages": [], "sim": {"hang": true}}))
        .send()
        .await;
    assert!(hung.is_err_and(|e| e.is_timeout()));
}

/// The script of an agent's turn: two calls in one message, then text with a marker.
const TOOL_SCRIPT: &str = r#"{"turns": [
    {"calls": [{"tool": ["bash", "run_shell_command"], "arguments": {"command": "echo sim-tool-ran"}},
               {"tool": "read", "arguments": {"filePath": "/tmp/x"}}]},
    {"text": "All done: MARKER-42."}],
  "text": "A title"}"#;

fn tool_request(stream: bool, messages: Value) -> Value {
    let tool = |name: &str| json!({"type": "function", "function": {"name": name, "parameters": {"type": "object"}}});
    json!({"model": "qwen", "stream": stream, "stream_options": {"include_usage": true}, "messages": messages,
        "tools": [tool("read"), tool("run_shell_command")]})
}

/// Rebuilds the tool calls of a stream's deltas as a client does: by `index`, the name from the
/// first delta, the arguments concatenated.
fn assembled_calls(events: &[Value]) -> Vec<(String, String, String)> {
    let mut calls: Vec<(String, String, String)> = Vec::new();
    for e in events {
        for d in e["choices"][0]["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let k = d["index"].as_u64().expect("every tool-call delta has an index") as usize;
            if k == calls.len() {
                assert!(d["function"]["name"].is_string() && d["id"].is_string(), "first delta names the call: {d}");
                calls.push((
                    d["id"].as_str().expect("id").into(),
                    d["function"]["name"].as_str().expect("name").into(),
                    String::new(),
                ));
            } else {
                assert!(
                    d.get("id").is_none() && d["function"].get("name").is_none(),
                    "later deltas carry arguments only: {d}"
                );
            }
            calls[k].2 += d["function"]["arguments"].as_str().expect("arguments");
        }
    }
    calls
}

#[tokio::test]
async fn scripted_turns_call_tools_as_real_servers_stream_them_then_answer_after_the_results() {
    let (_sim, url) =
        spawn_sim(&["--style", "mlx-lm", "--framing", "chunked", "--ttft-ms", "0", "--script-json", TOOL_SCRIPT]);
    let gw = gateway(&one_model_yaml(&url, 2, 4)).await;
    let user = json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "run it"}]);

    // Turn 1, streamed through the gateway: two calls by index, arguments in pieces.
    let r = post(&gw, "/v1/chat/completions", &tool_request(true, user.clone())).await;
    assert_eq!(r.status(), 200);
    let ev = events(&text_of(r).await);
    let argument_deltas = ev
        .iter()
        .filter(|e| {
            e["choices"][0]["delta"]["tool_calls"][0]["function"].get("name").is_none()
                && e["choices"][0]["delta"].get("tool_calls").is_some()
        })
        .count();
    assert!(argument_deltas >= 6, "arguments streamed in several pieces per call: {ev:?}");
    let calls = assembled_calls(&ev);
    assert_eq!(calls.len(), 2, "{ev:?}");
    assert_eq!(
        (calls[0].1.as_str(), calls[1].1.as_str()),
        ("run_shell_command", "read"),
        "the offered name of each call"
    );
    assert_eq!(
        serde_json::from_str::<Value>(&calls[0].2).expect("arguments are JSON"),
        json!({"command": "echo sim-tool-ran"})
    );
    assert_eq!(serde_json::from_str::<Value>(&calls[1].2).expect("arguments are JSON"), json!({"filePath": "/tmp/x"}));
    assert_ne!(calls[0].0, calls[1].0, "each call its own id");
    let finish = ev.iter().find(|e| e["choices"][0]["finish_reason"].is_string()).expect("finish chunk");
    assert_eq!(finish["choices"][0]["finish_reason"], "tool_calls");
    let usage = &ev.last().expect("usage chunk")["usage"];
    assert_eq!(
        usage["completion_tokens"].as_u64(),
        Some(2 + argument_deltas as u64),
        "a name or argument piece per token"
    );
    assert!(
        ev.iter()
            .all(|e| e["choices"].as_array().is_none_or(|c| c.is_empty())
                || e["choices"][0]["delta"]["role"] == "assistant"),
        "the mlx-lm style's role on every delta"
    );

    // The same turn whole: message.tool_calls.
    let r = post(&gw, "/v1/chat/completions", &tool_request(false, user.clone())).await;
    let whole: Value = r.json().await.expect("json");
    assert_eq!(whole["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(whole["choices"][0]["message"]["content"], Value::Null);
    assert_eq!(whole["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "run_shell_command");
    assert_eq!(whole["choices"][0]["message"]["tool_calls"][1]["function"]["arguments"], r#"{"filePath":"/tmp/x"}"#);

    // Turn 2, after both results: the text, streamed as words.
    let mut after = user.as_array().expect("messages").clone();
    after.push(
        json!({"role": "assistant", "content": null, "tool_calls": whole["choices"][0]["message"]["tool_calls"]}),
    );
    after.push(json!({"role": "tool", "tool_call_id": calls[0].0, "content": "sim-tool-ran"}));
    after.push(json!({"role": "tool", "tool_call_id": calls[1].0, "content": "x"}));
    let ev = events(&text_of(post(&gw, "/v1/chat/completions", &tool_request(true, json!(after))).await).await);
    let text: String = ev.iter().filter_map(|e| e["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, "All done: MARKER-42.");
    assert!(ev.iter().filter(|e| e["choices"][0]["delta"]["content"].is_string()).count() >= 3, "in pieces");
    assert_eq!(
        ev.iter().find(|e| e["choices"][0]["finish_reason"].is_string()).expect("finish")["choices"][0]["finish_reason"],
        "stop"
    );

    // Side requests: no tools → the script's text; JSON when asked, to the schema.
    let side = json!({"model": "qwen", "messages": [{"role": "user", "content": "title?"}]});
    let r: Value = post(&gw, "/v1/chat/completions", &side).await.json().await.expect("json");
    assert_eq!(r["choices"][0]["message"]["content"], "A title");
    let schema =
        json!({"type": "object", "properties": {"next_speaker": {"type": "string", "enum": ["user", "model"]}}});
    let asks = json!({"model": "qwen", "messages": [{"role": "user", "content": "who next?"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}});
    let r: Value = post(&gw, "/v1/chat/completions", &asks).await.json().await.expect("json");
    let answer: Value =
        serde_json::from_str(r["choices"][0]["message"]["content"].as_str().expect("text")).expect("JSON text");
    assert_eq!(answer, json!({"next_speaker": "user"}));
}

#[tokio::test]
async fn a_bad_script_stops_the_simulator_with_a_message() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mlxgate-sim"))
        .args(["--script-json", r#"{"turns": [{"calls": [{"tool": "x", "args": {}}]}]}"#])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad script in --script-json"), "{stderr}");
}

#[tokio::test]
async fn posts_to_unknown_paths_get_404_and_are_recorded() {
    let s = sim().await;
    let body = json!({"model": "m", "input": "hi", "store": false});
    let r =
        client().post(format!("{}/v1/responses", s.url())).bearer_auth("sk-x").json(&body).send().await.expect("send");
    assert_eq!(r.status(), 404);
    let r = client().get(format!("{}/v1/nothing", s.url())).send().await.expect("send");
    assert_eq!(r.status(), 404);
    let seen = sim_requests(&s).await;
    assert_eq!(seen.len(), 1, "the POST only: {seen:?}");
    assert_eq!(seen[0]["_path"], "/v1/responses");
    assert_eq!(seen[0]["input"], "hi");
    assert_eq!(seen[0]["_authorization"], "Bearer sk-x");
    assert_eq!(sim_stats(&s).await["total"], 0, "not counted as a generation request");
}

/// A simulator in mlx_lm.server's style keeping its prompt cache of `size` sequences.
async fn mlx_lm_with_cache(size: usize, defaults: Behaviour) -> sim::SimHandle {
    let defaults = Behaviour { style: Some(Style::MlxLm), ..defaults };
    sim::spawn(SimConfig { defaults, prompt_cache_size: Some(size), ..Default::default() }).await.expect("sim")
}

/// Sends `messages` (streamed or whole, 4 tokens at most) and returns the answer's text and
/// `(prompt_tokens, cached_tokens)`.
async fn turn(base: &str, messages: &Value, stream: bool) -> (String, (u64, u64)) {
    let body = json!({"model": "m", "stream": stream, "max_tokens": 4, "messages": messages,
        "stream_options": {"include_usage": true}});
    let r = client().post(format!("{base}/v1/chat/completions")).json(&body).send().await.expect("send");
    assert_eq!(r.status(), 200);
    let text = text_of(r).await;
    let (content, usage) = if stream {
        let ev = events(&text);
        let content: String =
            ev.iter().filter_map(|e| e.pointer("/choices/0/delta/content").and_then(Value::as_str)).collect();
        (content, ev.last().expect("usage chunk")["usage"].clone())
    } else {
        let answer: Value = serde_json::from_str(&text).expect("json");
        (answer["choices"][0]["message"]["content"].as_str().expect("content").to_string(), answer["usage"].clone())
    };
    let cached = usage.pointer("/prompt_tokens_details/cached_tokens").and_then(Value::as_u64).expect("cached");
    (content, (usage["prompt_tokens"].as_u64().expect("prompt_tokens"), cached))
}

fn words(n: usize, tag: &str) -> String {
    (0..n).map(|i| format!("{tag}{i}")).collect::<Vec<_>>().join(" ")
}

/// The shapes checked against the real mlx_lm.server (src/sim/prompt_cache.rs's header): a
/// repeated prompt, a growing conversation carrying the answer back, an unrelated conversation,
/// and the first conversation again (still cached: the LRU holds several sequences).
#[tokio::test]
async fn the_lru_prompt_cache_reports_cached_tokens_as_mlx_lm_server_does() {
    let s = mlx_lm_with_cache(10, Behaviour::default()).await;
    let system = json!({"role": "system", "content": words(30, "s")});
    let first = json!([system, {"role": "user", "content": words(10, "u")}]);
    for stream in [false, true] {
        let s = mlx_lm_with_cache(10, Behaviour::default()).await;
        assert_eq!(turn(&s.url(), &first, stream).await.1, (40, 0), "a cold cache");
        assert_eq!(turn(&s.url(), &first, stream).await.1, (40, 39), "the same prompt: all but its last token");
    }
    let (answer, _) = turn(&s.url(), &first, false).await;
    assert_eq!(answer, "t0 t1 t2 t3 ");
    let mut second = first.as_array().expect("array").clone();
    second.push(json!({"role": "assistant", "content": answer}));
    second.push(json!({"role": "user", "content": words(5, "v")}));
    // Stored: the prompt and every generated token (the real server: 83 + 8 = 91 of 111).
    assert_eq!(turn(&s.url(), &json!(second), true).await.1, (49, 44), "the previous prompt and its answer");
    let other = json!([system, {"role": "user", "content": words(10, "o")}]);
    assert_eq!(turn(&s.url(), &other, false).await.1, (40, 30), "the shared system prompt");
    let mut third = second.clone();
    third.push(json!({"role": "assistant", "content": "recorded answer"}));
    third.push(json!({"role": "user", "content": "next"}));
    assert_eq!(turn(&s.url(), &json!(third), false).await.1, (52, 49), "the second turn's prompt, still cached");
    let stats = sim_stats(&s).await;
    assert_eq!(stats["prompt_cache"]["size"], 10);
    assert_eq!(stats["prompt_cache"]["lookups"], 4);
    assert_eq!(stats["prompt_cache"]["hits"], 3);
    // The first turn's sequence went when the second's (which it prefixes) was stored; the
    // second's stays beside the third's, which carries another answer than the generated one.
    assert_eq!(stats["prompt_cache"]["sequences"], 3, "{stats}");
    let reset = client().post(format!("{}/sim/prompt-cache/reset", s.url())).send().await.expect("reset");
    assert_eq!(reset.status(), 204);
    assert_eq!(sim_stats(&s).await["prompt_cache"]["sequences"], 0);
    assert_eq!(turn(&s.url(), &json!(third), false).await.1, (52, 0), "emptied");
}

#[tokio::test]
async fn the_least_recently_stored_sequence_is_evicted() {
    let s = mlx_lm_with_cache(2, Behaviour::default()).await;
    let conv = |tag: &str| json!([{"role": "user", "content": words(20, tag)}]);
    for tag in ["a", "b", "c"] {
        assert_eq!(turn(&s.url(), &conv(tag), false).await.1, (20, 0));
    }
    assert_eq!(sim_stats(&s).await["prompt_cache"]["sequences"], 2);
    assert_eq!(turn(&s.url(), &conv("c"), false).await.1, (20, 19), "c is held");
    assert_eq!(turn(&s.url(), &conv("a"), false).await.1, (20, 0), "a, the oldest of three, is gone");
    // a was stored again, in place of b (the oldest now).
    assert_eq!(turn(&s.url(), &conv("b"), false).await.1, (20, 0));
}

/// Prefill takes `prefill_ms_per_token` per token the cache did not spare: a long uncached prompt
/// sends mlx_lm's prefill keepalives, the same prompt served from the cache none (no clock read:
/// the keepalive loop only sends while the prefill lasts).
#[tokio::test]
async fn prefill_time_follows_the_uncached_tokens() {
    let s = mlx_lm_with_cache(10, Behaviour { prefill_ms_per_token: Some(4.0), ..Default::default() }).await;
    let body = json!({"model": "m", "stream": true, "max_tokens": 2,
        "messages": [{"role": "user", "content": words(100, "w")}],
        "sim": {"ttft_ms": 0, "keepalive_ms": 20}});
    let mut keepalives = Vec::new();
    for _ in 0..2 {
        let r = client().post(format!("{}/v1/chat/completions", s.url())).json(&body).send().await.expect("send");
        let text = text_of(r).await;
        keepalives.push(text.lines().filter(|l| l.starts_with(": keepalive")).count());
    }
    assert!(keepalives[0] >= 1, "400 ms of prefill: {keepalives:?}");
    assert_eq!(keepalives[1], 0, "4 ms of prefill (1 uncached token): {keepalives:?}");
}

/// mlx_lm.server's system checkpoint: while one conversation's answer is still generating (its
/// sequence not stored yet), another with the same system prompt is served that system prompt;
/// once both answers are stored, the checkpoint (a prefix of both) is gone.
#[tokio::test]
async fn a_system_prompt_is_checkpointed_during_prefill() {
    let s = mlx_lm_with_cache(10, Behaviour::default()).await;
    let system = json!({"role": "system", "content": words(30, "s")});
    let held = json!({"model": "m", "stream": true, "max_tokens": 4, "sim": {"hold_after": 1, "hold_key": "a"},
        "messages": [system, {"role": "user", "content": words(10, "u")}]});
    let mut a = client().post(format!("{}/v1/chat/completions", s.url())).json(&held).send().await.expect("send");
    read_until(&mut a, "t0").await;
    let other = json!([system, {"role": "user", "content": words(10, "o")}]);
    assert_eq!(turn(&s.url(), &other, false).await.1, (40, 30), "the system prompt, from the checkpoint");
    client().post(format!("{}/sim/release/a", s.url())).send().await.expect("release");
    assert!(text_of(a).await.contains("[DONE]"));
    let stats = sim_stats(&s).await;
    assert_eq!(stats["prompt_cache"]["sequences"], 2, "the two answers, not the checkpoint: {stats}");
}
