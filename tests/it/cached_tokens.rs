//! `mlxgate_prompt_cached_tokens_total{model,backend}`: the prompt tokens a backend reports in
//! `usage.prompt_tokens_details.cached_tokens`, counted once per answer (streamed or whole),
//! with a series from the first report on (0 included) and none for a backend that never
//! reports them (vllm-mlx). Checked against `mlxgate-sim` in each server's style and against a
//! real mlx_lm.server answering a repeated prompt.

use crate::common::*;
use mlxgate::sim::{Behaviour, Style};
use serde_json::{Value, json};

/// The gateway's series for model `qwen` at backend `local` (the sim tests' names).
const SIM_SERIES: &str = "mlxgate_prompt_cached_tokens_total{backend=\"local\",model=\"qwen\"}";

/// A prompt of 40 words (40 tokens to the simulator), the same every time.
fn long_prompt() -> String {
    (0..40).map(|i| format!("word{i}")).collect::<Vec<_>>().join(" ")
}

fn request(model: &str, stream: bool, content: &str, include_usage: bool) -> Value {
    json!({"model": model, "stream": stream, "max_tokens": 4,
        "stream_options": {"include_usage": include_usage},
        "messages": [{"role": "user", "content": content}]})
}

/// The `usage` object of an answer: a whole answer's, or a stream's last one.
fn usage_of(text: &str, stream: bool) -> Value {
    if !stream {
        let answer: Value = serde_json::from_str(text).unwrap_or_else(|_| panic!("not JSON: {text}"));
        return answer["usage"].clone();
    }
    data_lines(text)
        .iter()
        .rev()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|v| v.get("usage").filter(|u| u.is_object()).cloned())
        .unwrap_or_else(|| panic!("no usage in the stream: {text}"))
}

fn cached_of(usage: &Value) -> Option<u64> {
    usage.pointer("/prompt_tokens_details/cached_tokens").and_then(Value::as_u64)
}

/// Sends `body` to `url` (a gateway's or a sim's) and returns the answer's usage.
async fn ask(url: &str, body: &Value) -> Value {
    let r = client().post(url).json(body).send().await.expect("send");
    let status = r.status();
    let text = text_of(r).await;
    assert_eq!(status, 200, "{text}");
    usage_of(&text, body["stream"].as_bool().unwrap_or(false))
}

/// Waits until `series` reads `want` (bounded by PATIENCE; the failure says what it read).
async fn series_reaches(gw: &Gateway, series: &str, want: f64) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let read = metric(gw, series).await;
        if read == Some(want) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{series} is {read:?}, not {want}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn the_simulator_reports_the_prefix_shared_with_the_previous_prompt() {
    let sim = sim_with(Behaviour { style: Some(Style::MlxLm), ..Default::default() }).await;
    let chat = format!("{}/v1/chat/completions", sim.url());
    let prompt = long_prompt();
    let first = ask(&chat, &request("m", false, &prompt, false)).await;
    assert_eq!(first["prompt_tokens"], 40);
    assert_eq!(cached_of(&first), Some(0), "a cold cache reports 0: {first}");
    let again = ask(&chat, &request("m", true, &prompt, true)).await;
    assert_eq!(cached_of(&again), Some(39), "mlx_lm processes the last token again: {again}");
    let longer = ask(&chat, &request("m", false, &format!("{prompt} and more"), false)).await;
    assert_eq!((longer["prompt_tokens"].as_u64(), cached_of(&longer)), (Some(42), Some(40)));
    let other = ask(&chat, &request("m", false, "something else entirely", false)).await;
    assert_eq!(cached_of(&other), Some(0));
    let completions = format!("{}/v1/completions", sim.url());
    let text = json!({"model": "m", "prompt": "something else entirely"});
    assert_eq!(cached_of(&ask(&completions, &text).await), Some(2));

    let rapid = sim_with(Behaviour { style: Some(Style::RapidMlx), ..Default::default() }).await;
    let chat = format!("{}/v1/chat/completions", rapid.url());
    ask(&chat, &request("m", true, &prompt, true)).await;
    assert_eq!(cached_of(&ask(&chat, &request("m", true, &prompt, true)).await), Some(40), "Rapid-MLX: all of it");

    let vllm = sim_with(Behaviour { style: Some(Style::VllmMlx), ..Default::default() }).await;
    let chat = format!("{}/v1/chat/completions", vllm.url());
    ask(&chat, &request("m", false, &prompt, false)).await;
    let usage = ask(&chat, &request("m", false, &prompt, false)).await;
    assert!(usage.get("prompt_tokens_details").is_none(), "vllm-mlx reports no cache: {usage}");
}

#[tokio::test]
async fn cached_tokens_of_whole_and_streamed_answers_are_counted_once_each() {
    let sim = sim_with(Behaviour { style: Some(Style::MlxLm), ..Default::default() }).await;
    let gw = gateway(&one_model_yaml(&sim.url(), 1, 8)).await;
    let chat = gw.url("/v1/chat/completions");
    let prompt = long_prompt();
    let first = ask(&chat, &request("qwen", false, &prompt, false)).await;
    assert_eq!(cached_of(&first), Some(0));
    series_reaches(&gw, SIM_SERIES, 0.0).await;
    let mut total = 0;
    for stream in [false, true] {
        let usage = ask(&chat, &request("qwen", stream, &prompt, true)).await;
        let cached = cached_of(&usage).unwrap_or_else(|| panic!("no cached_tokens: {usage}"));
        assert!(cached > 0, "a repeated prompt is served from the cache: {usage}");
        total += cached;
        series_reaches(&gw, SIM_SERIES, total as f64).await;
    }
    // A client that did not ask for usage does not see it; the gateway still counts it (the
    // simulator reports the prompt less its last token).
    ask_without_usage(&chat, &prompt).await;
    total += 39;
    series_reaches(&gw, SIM_SERIES, total as f64).await;
}

/// Streams `prompt` without `include_usage`: the answer carries no usage for the client.
async fn ask_without_usage(url: &str, prompt: &str) {
    let r = client().post(url).json(&request("qwen", true, prompt, false)).send().await.expect("send");
    assert_eq!(r.status(), 200);
    let text = text_of(r).await;
    assert!(text.contains("[DONE]") && !text.contains("\"usage\""), "{text}");
}

#[tokio::test]
async fn a_backend_that_reports_no_cache_has_no_series() {
    let sim = sim_with(Behaviour { style: Some(Style::VllmMlx), ..Default::default() }).await;
    let gw = gateway(&one_model_yaml(&sim.url(), 1, 8)).await;
    let chat = gw.url("/v1/chat/completions");
    let prompt = long_prompt();
    let mut prompt_tokens = 0;
    for stream in [false, true, false, true] {
        let usage = ask(&chat, &request("qwen", stream, &prompt, true)).await;
        prompt_tokens += usage["prompt_tokens"].as_u64().expect("prompt_tokens");
    }
    // Every answer recorded (its prompt tokens counted) before looking for the cache series.
    let prompt_series = "mlxgate_prompt_tokens_total{backend=\"local\",client=\"anonymous\",model=\"qwen\"}";
    series_reaches(&gw, prompt_series, prompt_tokens as f64).await;
    let text = client().get(gw.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    assert!(!text.contains("mlxgate_prompt_cached_tokens_total{"), "no series without a report: {text}");
}

/// A real mlx_lm.server (managed by the gateway, the tiny model) answering the same long chat
/// prompt three times: the counter is the sum of the `cached_tokens` its answers carried, and
/// grows once the prompt repeats.
#[tokio::test]
async fn a_real_mlx_lm_server_reports_its_prompt_cache() {
    let Some(model) = prerequisites(&["mlx-lm"]) else { return };
    let port = free_port();
    let gw = gateway(&config(&[backend("b", "mlx-lm", &model, port, "")], &[("m", "b")], "")).await;
    let series = "mlxgate_prompt_cached_tokens_total{backend=\"b\",model=\"m\"}";
    let chat = gw.url("/v1/chat/completions");
    let system = "You are a careful assistant who answers questions about the weather in long detailed \
                  paragraphs, with many words, citing the mountains, the valleys and the rivers.";
    let user = "Tell me about the rain in the mountains and the valleys this week, please.";
    let mut reported = Vec::new();
    for stream in [false, false, true] {
        let mut body = request("m", stream, user, true);
        body["messages"] = json!([{"role": "system", "content": system}, {"role": "user", "content": user}]);
        let r = client().post(&chat).json(&body).send().await.expect("send");
        let status = r.status();
        let text = text_of(r).await;
        assert_eq!(status, 200, "{text}; backend: {}", backend_state(&gw, "b").await);
        let usage = usage_of(&text, stream);
        let cached = cached_of(&usage).unwrap_or_else(|| panic!("mlx_lm.server reported no cached_tokens: {usage}"));
        let prompt_tokens = usage["prompt_tokens"].as_u64().expect("prompt_tokens");
        eprintln!("stream={stream}: prompt_tokens {prompt_tokens}, cached_tokens {cached}");
        reported.push(cached);
        series_reaches(&gw, series, reported.iter().sum::<u64>() as f64).await;
    }
    assert!(reported[1] > 0 && reported[2] > 0, "the repeated prompt hit the cache: {reported:?}");
}

/// Through the gateway, a simulator keeping mlx_lm.server's LRU prompt cache: a repeated prompt
/// reports all but its last token, a conversation's next turn its previous prompt and the answer
/// it carries back, an unrelated prompt nothing; the counter sums what was reported.
#[tokio::test]
async fn the_lru_simulator_reports_through_the_gateway_what_mlx_lm_server_reports() {
    let defaults = Behaviour { style: Some(Style::MlxLm), ..Default::default() };
    let sim =
        mlxgate::sim::spawn(mlxgate::sim::SimConfig { defaults, prompt_cache_size: Some(10), ..Default::default() })
            .await
            .expect("sim");
    let gw = gateway(&one_model_yaml(&sim.url(), 1, 8)).await;
    let chat = gw.url("/v1/chat/completions");
    let prompt = long_prompt();
    let mut total = 0;
    for (stream, want) in [(false, 0), (true, 39)] {
        let usage = ask(&chat, &request("qwen", stream, &prompt, true)).await;
        assert_eq!((usage["prompt_tokens"].as_u64(), cached_of(&usage)), (Some(40), Some(want)), "{usage}");
        total += want;
    }
    let mut next = request("qwen", false, &prompt, true);
    next["messages"] = json!([{"role": "user", "content": prompt},
        {"role": "assistant", "content": "t0 t1 t2 t3 "}, {"role": "user", "content": "and then"}]);
    let usage = ask(&chat, &next).await;
    assert_eq!((usage["prompt_tokens"].as_u64(), cached_of(&usage)), (Some(46), Some(44)), "{usage}");
    total += 44;
    let usage = ask(&chat, &request("qwen", true, "something else entirely", true)).await;
    assert_eq!(cached_of(&usage), Some(0));
    series_reaches(&gw, SIM_SERIES, total as f64).await;
}
