//! The stream-side normalisations against the real servers that need them (issue 12), each
//! with its switch on (the kind's default) and off (which shows the server's own quirk):
//!
//! - `hold_abandoned` (mlx-openai-server keeps generating after its client left): the request
//!   after an abandoned stream waits for its slot in the gateway's queue, where its wait shows,
//!   not hidden in its time to first token at the backend;
//! - `finish_length` (mlx-openai-server, mlx-omni-server say `stop` at `max_tokens`): `length`;
//! - `single_finish` (mlx-omni-server sends its finish chunk twice, a tool call in the first):
//!   one finish chunk, the first, and the repeat's usage as a usage-only chunk when asked (real
//!   server, and the simulator for a tool call: the tiny model calls no tool);
//! - doubled usage (vllm-mlx) counted once, and mlx-vlm's reasoning text sent under both
//!   `reasoning` and `reasoning_content` counted once (with the simulator: the tiny model has no
//!   reasoning).
//!
//! A missing venv fails the test (see `prerequisites`).

use crate::common::*;
use serde_json::{Value, json};

/// The backend's name in every gateway here.
const BACKEND: &str = "b";

/// A gateway managing one `kind` server for the model `m`, one request at a time, with `extra`
/// lines in its backend stanza (a `normalise:` key). The context cap is raised so that a
/// 3000-token answer is accepted (the tiny model has 2048 positions; the servers generate past
/// them).
async fn managed(kind: &str, extra: &str) -> Option<Gateway> {
    // mlx-lm: the tiny model is generated with it.
    let model = prerequisites(&[kind, "mlx-lm"])?;
    let stanza = format!(
        "  {BACKEND}:\n    kind: {kind}\n    model: '{}'\n    venv: '{ROOT}/.venv-{kind}'\n    port: {}\n    \
         max_concurrency: 1\n    stop_timeout: 10s\n    ready: {{timeout: 180s}}\n    context_cap: 30000\n{extra}",
        model.display(),
        free_port(),
    );
    Some(gateway(&config(&[stanza], &[("m", BACKEND)], "")).await)
}

/// A chat request for `m` with `max_tokens`, streamed or not, asking for usage when streamed.
fn ask(stream: bool, max_tokens: u32, include_usage: bool) -> Value {
    let mut body = json!({"model": "m", "stream": stream, "max_tokens": max_tokens, "temperature": 0,
        "messages": [{"role": "user", "content": "hello there"}]});
    if stream && include_usage {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

/// The `(finish_reason, carries usage)` of every event of a stream that has a finish reason.
fn finishes(text: &str) -> Vec<(String, bool)> {
    data_lines(text)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| Some((v["choices"][0]["finish_reason"].as_str()?.to_string(), v["usage"].is_object())))
        .collect()
}

/// The `finish_reason` of a whole answer.
fn whole_finish(text: &str) -> String {
    let answer: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    answer["choices"][0]["finish_reason"].as_str().unwrap_or_else(|| panic!("no finish_reason: {text}")).to_string()
}

/// Sends `body`, expects 200, returns the text.
async fn answer(gw: &Gateway, body: &Value) -> String {
    let r = post(gw, "/v1/chat/completions", body).await;
    let status = r.status();
    let text = text_of(r).await;
    assert_eq!(status, 200, "{text}; backend: {}", backend_state(gw, BACKEND).await);
    text
}

/// The finish reasons of a stream (with usage) and of a whole answer, both cut at 5 tokens,
/// and the completion tokens their usage reported, together.
async fn finish_at_max_tokens(gw: &Gateway) -> (Vec<(String, bool)>, String, u64) {
    let streamed = answer(gw, &ask(true, 5, true)).await;
    assert!(streamed.trim_end().ends_with("data: [DONE]"), "{streamed}");
    let whole = answer(gw, &ask(false, 5, false)).await;
    let streamed_usage = data_lines(&streamed)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|v| v["usage"]["completion_tokens"].as_u64());
    let whole_usage = serde_json::from_str::<Value>(&whole).ok().and_then(|v| v["usage"]["completion_tokens"].as_u64());
    let reported = streamed_usage.expect("stream usage") + whole_usage.expect("whole usage");
    (finishes(&streamed), whole_finish(&whole), reported)
}

/// The generated tokens the gateway counted for backend `b`.
async fn counted(gw: &Gateway) -> Option<f64> {
    metric(gw, &format!("mlxgate_generation_tokens_total{{backend=\"{BACKEND}\",client=\"anonymous\",model=\"m\"}}"))
        .await
}

/// The `queue_ms` and `ttft_ms` of a stream's `x-mlxgate-stats` line.
fn stats_of(text: &str) -> (u64, u64) {
    let line = text.lines().find(|l| l.starts_with(": mlxgate ")).unwrap_or_else(|| panic!("no stats: {text}"));
    let field = |name: &str| -> u64 {
        line.split(' ')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {line}"))
    };
    (field("queue_ms"), field("ttft_ms"))
}

/// Abandons a long answer (~3000 tokens: several seconds of generation on the tiny model at
/// ~450 tokens/s here) — a stream after its first content, a whole answer once it holds its
/// slot — sends the next request at once and returns that request's (queue wait, time to first
/// token less the queue wait) in ms.
async fn next_after_abandoned(gw: &Gateway, stream: bool, abandoned_before: f64) -> (u64, u64) {
    if stream {
        let mut long = post(gw, "/v1/chat/completions", &ask(true, 3000, false)).await;
        assert_eq!(long.status(), 200);
        read_until(&mut long, "\"content\"").await;
    } else {
        let url = gw.url("/v1/chat/completions");
        let long = tokio::spawn(async move { client().post(url).json(&ask(false, 3000, false)).send().await });
        let inflight = format!("mlxgate_inflight_requests{{backend=\"{BACKEND}\"}}");
        eventually("the whole answer holds its slot", || async { metric(gw, &inflight).await == Some(1.0) }).await;
        long.abort();
    }
    let next = client()
        .post(gw.url("/v1/chat/completions"))
        .header("x-mlxgate-stats", "1")
        .json(&ask(true, 5, false))
        .send()
        .await
        .expect("send");
    assert_eq!(next.status(), 200);
    let text = text_of(next).await;
    assert!(text.contains("data: [DONE]"), "{text}");
    let (queue_ms, ttft_ms) = stats_of(&text);
    let closed = format!(
        "mlxgate_requests_total{{backend=\"{BACKEND}\",client=\"anonymous\",model=\"m\",outcome=\"client_closed\"}}"
    );
    assert_eq!(metric(gw, &closed).await, Some(abandoned_before + 1.0), "the abandoned answer is the client's close");
    (queue_ms, ttft_ms.saturating_sub(queue_ms))
}

#[tokio::test]
async fn mlx_openai_server_abandoned_stream_holds_its_slot_and_stop_at_max_tokens_says_length() {
    let held_gauge = format!("mlxgate_abandoned_streams_held{{backend=\"{BACKEND}\"}}");
    // The kind's defaults: hold_abandoned and finish_length on.
    let Some(gw) = managed("mlx-openai-server", "").await else { return };
    let (finished, whole, _) = finish_at_max_tokens(&gw).await;
    assert_eq!(finished, [("length".to_string(), true)], "one finish, in the usage chunk, corrected");
    assert_eq!(whole, "length");
    for (stream, before) in [(true, 0.0), (false, 1.0)] {
        let (queue_ms, after_queue_ms) = next_after_abandoned(&gw, stream, before).await;
        eprintln!(
            "hold_abandoned on, stream {stream}: next request queue_ms={queue_ms}, ttft less queue={after_queue_ms}"
        );
        assert!(
            queue_ms > after_queue_ms,
            "the wait behind the abandoned answer is in the queue: queue {queue_ms} ms, then {after_queue_ms} ms"
        );
    }
    assert_eq!(metric(&gw, &held_gauge).await, Some(0.0), "the slot was freed once the backend ended it");
    drop(gw);

    // Both switched off: the server's own answers, and the wait hidden at the backend.
    let off = "    normalise: {hold_abandoned: false, finish_length: false}\n";
    let Some(gw) = managed("mlx-openai-server", off).await else { return };
    let (finished, whole, _) = finish_at_max_tokens(&gw).await;
    assert_eq!(finished, [("stop".to_string(), true)], "mlx-openai-server says stop at max_tokens");
    assert_eq!(whole, "stop");
    for (stream, before) in [(true, 0.0), (false, 1.0)] {
        let (queue_ms, after_queue_ms) = next_after_abandoned(&gw, stream, before).await;
        eprintln!(
            "hold_abandoned off, stream {stream}: next request queue_ms={queue_ms}, ttft less queue={after_queue_ms}"
        );
        assert!(
            after_queue_ms > queue_ms,
            "the wait is hidden in the time to first token: queue {queue_ms} ms, then {after_queue_ms} ms"
        );
    }
    assert_eq!(metric(&gw, &held_gauge).await, Some(0.0), "no stream was held (the gauge exists at 0)");
}

#[tokio::test]
async fn mlx_omni_server_finishes_once_and_says_length_at_max_tokens() {
    let Some(gw) = managed("mlx-omni-server", "").await else { return };
    let (finished, whole, reported) = finish_at_max_tokens(&gw).await;
    assert_eq!(finished, [("length".to_string(), false)], "one finish chunk (the first), corrected");
    assert_eq!(whole, "length");
    eprintln!("mlx-omni-server: usage reported {reported} tokens, gateway counted {:?}", counted(&gw).await);
    assert_eq!(counted(&gw).await, Some(reported as f64), "the usage of the repeated finish, counted once");
    // With include_usage, the repeat's usage follows the finish as a usage-only chunk.
    let text = answer(&gw, &ask(true, 5, true)).await;
    let usage_only = data_lines(&text)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| v["usage"].is_object())
        .map(|v| v["choices"] == json!([]))
        .collect::<Vec<_>>();
    assert_eq!(usage_only, [true], "one usage, in a usage-only chunk: {text}");
    // Without include_usage: still one finish chunk, without the usage the client did not ask for.
    let text = answer(&gw, &ask(true, 5, false)).await;
    assert_eq!(finishes(&text), [("length".to_string(), false)], "{text}");
    drop(gw);

    let off = "    normalise: {finish_length: false, single_finish: false}\n";
    let Some(gw) = managed("mlx-omni-server", off).await else { return };
    let (finished, whole, _) = finish_at_max_tokens(&gw).await;
    assert_eq!(
        finished,
        [("stop".to_string(), false), ("stop".to_string(), true)],
        "mlx-omni-server's own stream: the finish twice, stop at max_tokens"
    );
    assert_eq!(whole, "stop");
}

#[tokio::test]
async fn vllm_mlx_doubled_usage_is_counted_once() {
    let Some(gw) = managed("vllm-mlx", "").await else { return };
    let text = answer(&gw, &ask(true, 8, true)).await;
    let usages: Vec<u64> = data_lines(&text)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v["usage"]["completion_tokens"].as_u64())
        .collect();
    assert_eq!(usages.len(), 2, "vllm-mlx sends its usage twice: {text}");
    assert_eq!(usages[0], usages[1], "{text}");
    eprintln!("vllm-mlx: usage {usages:?}, counted {:?}", counted(&gw).await);
    assert_eq!(counted(&gw).await, Some(usages[0] as f64), "one usage's tokens, not the sum");
}

#[tokio::test]
async fn reasoning_sent_under_both_names_counts_once() {
    // mlx-vlm's synced aliases: the same text in `reasoning_content` and `reasoning`.
    let sim = sim().await;
    let gw = gateway(&one_model_yaml(&sim.url(), 1, 4)).await;
    let mut body = chat(true, json!({"content_field": "both_reasoning", "tokens": 6}));
    body["stream_options"] = json!({"include_usage": true});
    let text = answer_local(&gw, &body).await;
    let both = data_lines(&text)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| {
            let delta = &v["choices"][0]["delta"];
            delta["reasoning"].is_string() && delta["reasoning"] == delta["reasoning_content"]
        })
        .count();
    assert_eq!(both, 6, "every token under both names: {text}");
    let local = "backend=\"local\"";
    let tokens = format!("mlxgate_generation_tokens_total{{{local},client=\"anonymous\",model=\"qwen\"}}");
    assert_eq!(metric(&gw, &tokens).await, Some(6.0));
    let mismatch = format!("mlxgate_usage_mismatch_total{{{local}}}");
    assert_eq!(metric(&gw, &mismatch).await.unwrap_or(0.0), 0.0, "6 output frames for 6 tokens: no mismatch");
    let ttft = format!("mlxgate_time_to_first_token_seconds_count{{{local},model=\"qwen\",streaming=\"true\"}}");
    assert_eq!(metric(&gw, &ttft).await, Some(1.0), "reasoning is output: its first token is timed");
}

/// Sends `body` to a gateway in front of the simulator; expects 200.
async fn answer_local(gw: &Gateway, body: &Value) -> String {
    let r = post(gw, "/v1/chat/completions", body).await;
    assert_eq!(r.status(), 200);
    text_of(r).await
}

/// A gateway in front of the simulator, one request at a time, with `normalise` switches.
async fn simulated(sim: &mlxgate::sim::SimHandle, normalise: &str, stream_idle_timeout: &str) -> Gateway {
    let yaml = format!(
        "backends:\n  local: {{url: '{}', max_concurrency: 1, stream_idle_timeout: {stream_idle_timeout}, \
         normalise: {normalise}}}\nmodels:\n  qwen: {{backend: local, upstream_model: tiny-qwen3, max_queue: 4, max_wait: 120s}}\n",
        sim.url()
    );
    gateway(&yaml).await
}

/// Starts a stream the simulator holds after its first token (until `/sim/release/{key}`),
/// reads that token and abandons the stream.
async fn abandon_held_stream(gw: &Gateway, key: &str) {
    let held = chat(true, json!({"tokens": 4, "hold_after": 1, "hold_key": key}));
    let mut r = post(gw, "/v1/chat/completions", &held).await;
    assert_eq!(r.status(), 200);
    read_until(&mut r, "\"content\"").await;
}

const HELD_GAUGE: &str = "mlxgate_abandoned_streams_held{backend=\"local\"}";
const QUEUED: &str = "mlxgate_queue_depth{model=\"qwen\"}";

#[tokio::test]
async fn an_abandoned_stream_holds_its_slot_until_the_backend_ends_it() {
    let sim = sim().await;
    let gw = simulated(&sim, "{hold_abandoned: true}", "60s").await;
    abandon_held_stream(&gw, "a").await;
    eventually("the abandoned stream holds its slot", || async { metric(&gw, HELD_GAUGE).await == Some(1.0) }).await;
    let next = tokio::spawn({
        let url = gw.url("/v1/chat/completions");
        async move { client().post(url).json(&chat(true, json!({"tokens": 2}))).send().await.expect("send") }
    });
    eventually("the next request waits in the queue", || async { metric(&gw, QUEUED).await == Some(1.0) }).await;
    assert_eq!(metric(&gw, HELD_GAUGE).await, Some(1.0), "still held while the backend generates");
    // The backend goes on with the abandoned answer and ends it: the slot is free.
    let released = client().post(format!("{}/sim/release/a", sim.url())).send().await.expect("release");
    assert!(released.status().is_success());
    let text = text_of(next.await.expect("next")).await;
    assert!(text.contains("data: [DONE]"), "{text}");
    assert_eq!(metric(&gw, HELD_GAUGE).await, Some(0.0));
    let closed =
        "mlxgate_requests_total{backend=\"local\",client=\"anonymous\",model=\"qwen\",outcome=\"client_closed\"}";
    assert_eq!(metric(&gw, closed).await, Some(1.0), "the abandoned request is the client's close");
}

#[tokio::test]
async fn an_abandoned_stream_is_let_go_when_its_backend_stalls_or_the_switch_is_off() {
    // Held, but the backend never ends it: the slot is freed after the idle timeout (1 s here).
    let sim = sim().await;
    let gw = simulated(&sim, "{hold_abandoned: true}", "1s").await;
    abandon_held_stream(&gw, "never").await;
    eventually("the abandoned stream holds its slot", || async { metric(&gw, HELD_GAUGE).await == Some(1.0) }).await;
    let next = async { text_of(post(&gw, "/v1/chat/completions", &chat(true, json!({"tokens": 2}))).await).await };
    let text = tokio::time::timeout(PATIENCE, next).await.expect("the stalled stream's slot is freed");
    assert!(text.contains("data: [DONE]"), "served once the stalled stream was let go: {text}");
    assert_eq!(metric(&gw, HELD_GAUGE).await, Some(0.0));

    // Off: the connection is dropped and the slot freed at once; nothing is held.
    let gw = simulated(&sim, "{hold_abandoned: false}", "60s").await;
    abandon_held_stream(&gw, "off").await;
    let text = text_of(post(&gw, "/v1/chat/completions", &chat(true, json!({"tokens": 2}))).await).await;
    assert!(text.contains("data: [DONE]"), "{text}");
    assert_eq!(metric(&gw, HELD_GAUGE).await, Some(0.0), "no stream held (the gauge exists at 0)");
}

#[tokio::test]
async fn an_answer_abandoned_before_its_first_byte_holds_its_slot_until_the_backend_answers() {
    // The backend never answers: the attempt ends at its first_byte_timeout (2 s here), and only
    // then is the slot free.
    let sim = sim().await;
    let yaml = format!(
        "backends:\n  local: {{url: '{}', max_concurrency: 1, first_byte_timeout: 2s, \
         normalise: {{hold_abandoned: true}}}}\nmodels:\n  qwen: {{backend: local, upstream_model: tiny-qwen3, max_queue: 4, max_wait: 120s}}\n",
        sim.url()
    );
    let gw = gateway(&yaml).await;
    let url = gw.url("/v1/chat/completions");
    let hung = tokio::spawn(async move { client().post(url).json(&chat(false, json!({"hang": true}))).send().await });
    let inflight = "mlxgate_inflight_requests{backend=\"local\"}";
    eventually("the answer holds its slot", || async { metric(&gw, inflight).await == Some(1.0) }).await;
    hung.abort();
    eventually("the abandoned answer still holds its slot", || async { metric(&gw, HELD_GAUGE).await == Some(1.0) })
        .await;
    let next = async { text_of(post(&gw, "/v1/chat/completions", &chat(true, json!({"tokens": 2}))).await).await };
    let text = tokio::time::timeout(PATIENCE, next).await.expect("the slot is freed at the first-byte timeout");
    assert!(text.contains("data: [DONE]"), "{text}");
    assert_eq!(metric(&gw, HELD_GAUGE).await, Some(0.0));
}

/// The events of a stream that parse as JSON.
fn events(text: &str) -> Vec<Value> {
    data_lines(text).iter().filter_map(|d| serde_json::from_str(d).ok()).collect()
}

#[tokio::test]
async fn a_tool_call_in_mlx_omni_servers_first_finish_chunk_reaches_the_client_once() {
    // mlx-omni-server streams a tool call in its finish chunk, then sends the finish again with
    // only the role and the usage (the gateway always asks for usage): the review's H1, where
    // a client that asked for usage got the repeat alone, without the tool call.
    let sim =
        sim_with(mlxgate::sim::Behaviour { style: Some(mlxgate::sim::Style::MlxOmni), ..Default::default() }).await;
    let gw = simulated(&sim, "{single_finish: true, finish_length: true}", "60s").await;
    for include_usage in [true, false] {
        let mut body = chat(true, json!({"tokens": 3, "tool_call": true}));
        if include_usage {
            body["stream_options"] = json!({"include_usage": true});
        }
        let text = answer_local(&gw, &body).await;
        let events = events(&text);
        let tool_calls = events
            .iter()
            .filter(|e| e["choices"][0]["delta"]["tool_calls"].as_array().is_some_and(|t| !t.is_empty()))
            .count();
        assert_eq!(tool_calls, 1, "include_usage {include_usage}: the tool call once: {text}");
        assert_eq!(finishes(&text), [("tool_calls".to_string(), false)], "one finish chunk: {text}");
        let usages: Vec<&Value> = events.iter().filter(|e| e["usage"].is_object()).collect();
        assert_eq!(usages.len(), usize::from(include_usage), "usage only when asked: {text}");
        for usage in usages {
            assert_eq!(usage["choices"], json!([]), "a usage-only chunk: {text}");
            assert_eq!(usage["usage"]["completion_tokens"], 3, "{text}");
        }
        assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    }
    // An answer cut at max_tokens: the first finish says length, judged on the repeat's usage.
    for include_usage in [true, false] {
        let mut body = chat(true, json!({"tokens": 10}));
        body["max_tokens"] = json!(4);
        if include_usage {
            body["stream_options"] = json!({"include_usage": true});
        }
        let text = answer_local(&gw, &body).await;
        assert_eq!(finishes(&text), [("length".to_string(), false)], "{text}");
        let usage = events(&text).into_iter().find(|e| e["usage"].is_object());
        assert_eq!(usage.map(|u| u["usage"]["completion_tokens"].clone()), include_usage.then(|| json!(4)), "{text}");
    }
    let tokens = "mlxgate_generation_tokens_total{backend=\"local\",client=\"anonymous\",model=\"qwen\"}";
    assert_eq!(metric(&gw, tokens).await, Some(3.0 + 3.0 + 4.0 + 4.0), "every repeat's usage counted once");
}
