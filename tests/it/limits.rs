//! Per-client rate limits on the request path, against the simulator: 429 with OpenAI's headers
//! while another client is still served, tokens charged from the backend's usage, requests in
//! flight, refusals before the limits that cost nothing, and the x-ratelimit-* headers on a
//! stream.

use crate::common::*;
use mlxgate::tokens::Count;
use mlxgate::tokens::counter::Estimate;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const AIDER_KEY: &str = "sk-aider-0c7e5b9a13f24d86";
const CURSOR_KEY: &str = "sk-cursor-a4d29f61e07b3c58";

fn sha256_hex(key: &str) -> String {
    Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// Model `qwen` on the simulator, model `capped` on the same simulator behind a 64-token
/// context cap (counted with the estimate); `aider` has `aider_limits`, `cursor` none.
fn yaml(sim_url: &str, aider_limits: &str) -> String {
    format!(
        "backends:\n  local: {{url: '{sim_url}', max_concurrency: 4}}\n  \
         capped: {{url: '{sim_url}', max_concurrency: 4, context_cap: 64}}\n\
         models:\n  qwen: {{backend: local}}\n  capped: {{backend: capped}}\n\
         auth: required\n\
         clients:\n  aider: {{key_sha256: {}, limits: {aider_limits}}}\n  cursor: {{key_sha256: {}}}\n",
        sha256_hex(AIDER_KEY),
        sha256_hex(CURSOR_KEY),
    )
}

fn chat_for(model: &str, stream: bool, sim: Value) -> Value {
    json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hello there"}],
           "max_tokens": 8, "sim": sim})
}

async fn send(gw: &Gateway, key: &str, body: &Value) -> reqwest::Response {
    client().post(gw.url("/v1/chat/completions")).bearer_auth(key).json(body).send().await.expect("send")
}

fn header(response: &reqwest::Response, name: &str) -> Option<String> {
    response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

async fn rate_limited(gw: &Gateway, client: &str, limit: &str) -> f64 {
    metric(gw, &format!("mlxgate_rate_limited_total{{client=\"{client}\",limit=\"{limit}\"}}")).await.unwrap_or(0.0)
}

#[tokio::test]
async fn the_sixth_request_in_a_minute_is_429_with_headers_while_another_client_is_served() {
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), "{rpm: 5}")).await;
    for left in (0..5).rev() {
        let response = send(&gw, AIDER_KEY, &chat_for("qwen", false, json!({}))).await;
        assert_eq!(response.status(), 200);
        assert_eq!(header(&response, "x-ratelimit-limit-requests").as_deref(), Some("5"));
        assert_eq!(header(&response, "x-ratelimit-remaining-requests"), Some(left.to_string()));
        assert!(header(&response, "x-ratelimit-reset-requests").is_some());
        assert_eq!(header(&response, "x-ratelimit-limit-tokens"), None, "no token limit, no token headers");
        response.text().await.expect("body");
    }
    let refused = send(&gw, AIDER_KEY, &chat_for("qwen", false, json!({}))).await;
    assert_eq!(refused.status(), 429);
    let retry_after: u64 = header(&refused, "retry-after").and_then(|v| v.parse().ok()).expect("Retry-After");
    assert!((1..=12).contains(&retry_after), "one request back every 12 s: {retry_after}");
    let retry_ms: u64 = header(&refused, "retry-after-ms").and_then(|v| v.parse().ok()).expect("retry-after-ms");
    assert!(retry_ms > 0 && retry_ms <= 12_000, "{retry_ms}");
    assert_eq!(header(&refused, "x-ratelimit-limit-requests").as_deref(), Some("5"));
    assert_eq!(header(&refused, "x-ratelimit-remaining-requests").as_deref(), Some("0"));
    assert!(header(&refused, "x-ratelimit-reset-requests").is_some());
    let body: Value = refused.json().await.expect("json");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    assert_eq!(body["error"]["type"], "requests");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("requests per min (RPM)") && message.contains("aider"), "{message}");

    let other = send(&gw, CURSOR_KEY, &chat_for("qwen", false, json!({}))).await;
    assert_eq!(other.status(), 200, "another client is still served");
    assert_eq!(header(&other, "x-ratelimit-limit-requests"), None, "cursor has no limits");
    assert_eq!(rate_limited(&gw, "aider", "rpm").await, 1.0);
    assert_eq!(sim_stats(&sim).await["total"], 6, "the refused request reached no backend");
    assert_eq!(
        metric(
            &gw,
            "mlxgate_requests_total{backend=\"local\",client=\"aider\",model=\"qwen\",outcome=\"rate_limited\"}"
        )
        .await,
        Some(1.0)
    );
}

#[tokio::test]
async fn tokens_are_charged_from_the_backends_usage() {
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), "{tpm: 1000}")).await;
    // The prompt is a few tokens (its up-front charge); the answer's usage says 5000 generated.
    let big = json!({"model": "qwen", "messages": [{"role": "user", "content": "hello there"}],
                     "max_tokens": 5000, "sim": {"tokens": 5000, "tokens_per_second": 1_000_000.0}});
    let first = send(&gw, AIDER_KEY, &big).await;
    assert_eq!(first.status(), 200);
    let up_front: u64 =
        header(&first, "x-ratelimit-remaining-tokens").and_then(|v| v.parse().ok()).expect("token headers");
    assert!(up_front > 900, "only the prompt was charged up front: {up_front} left of 1000");
    let answer: Value = first.json().await.expect("json");
    assert_eq!(answer["usage"]["completion_tokens"], 5000);
    let aider_tokens = "mlxgate_generation_tokens_total{backend=\"local\",client=\"aider\",model=\"qwen\"}";
    assert_eq!(metric(&gw, aider_tokens).await, Some(5000.0), "the tokens are counted under the client's name");
    // The settlement runs when the answer has ended: a small request is refused once it did.
    let refusal = std::sync::Mutex::new(None);
    eventually("a request refused for tokens after the usage was charged", || {
        let (gw, refusal) = (&gw, &refusal);
        async move {
            let response = send(gw, AIDER_KEY, &chat_for("qwen", false, json!({}))).await;
            if response.status() != 429 {
                return false;
            }
            let seen = (header(&response, "retry-after"), response.json::<Value>().await.expect("json"));
            *refusal.lock().expect("lock") = Some(seen);
            true
        }
    })
    .await;
    let (retry_after, body) = refusal.into_inner().expect("lock").expect("refused");
    assert_eq!(body["error"]["type"], "tokens");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    let retry_after: u64 = retry_after.and_then(|v| v.parse().ok()).expect("Retry-After: the debt is paid off in time");
    assert!(retry_after > 60, "about 4000 tokens of debt at 1000/min: {retry_after}");
    assert!(rate_limited(&gw, "aider", "tpm").await >= 1.0);
    assert_eq!(send(&gw, CURSOR_KEY, &chat_for("qwen", false, json!({}))).await.status(), 200);
    let cursor_ok = "mlxgate_requests_total{backend=\"local\",client=\"cursor\",model=\"qwen\",outcome=\"ok\"}";
    assert_eq!(metric(&gw, cursor_ok).await, Some(1.0), "each client has its own series");
}

#[tokio::test]
async fn a_second_request_in_flight_is_429_until_the_first_ends() {
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), "{concurrency: 1}")).await;
    let mut held = send(&gw, AIDER_KEY, &chat_for("qwen", true, json!({"hold_after": 1, "hold_key": "one"}))).await;
    assert_eq!(held.status(), 200);
    read_until(&mut held, "t0 ").await;

    let second = send(&gw, AIDER_KEY, &chat_for("qwen", false, json!({}))).await;
    assert_eq!(second.status(), 429);
    assert_eq!(header(&second, "retry-after").as_deref(), Some("1"));
    let body: Value = second.json().await.expect("json");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    assert_eq!(body["error"]["type"], "requests");
    assert_eq!(rate_limited(&gw, "aider", "concurrency").await, 1.0);
    assert_eq!(send(&gw, CURSOR_KEY, &chat_for("qwen", false, json!({}))).await.status(), 200, "others served");

    client().post(format!("{}/sim/release/one", sim.url())).send().await.expect("release");
    assert!(text_of(held).await.contains("[DONE]"));
    eventually("a new request admitted once the first ended", || async {
        send(&gw, AIDER_KEY, &chat_for("qwen", false, json!({}))).await.status() == 200
    })
    .await;
}

#[tokio::test]
async fn refusals_before_the_limits_charge_nothing() {
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), "{rpm: 1}")).await;
    for _ in 0..3 {
        let wrong = send(&gw, "sk-not-a-client-key-0000", &chat_for("qwen", false, json!({}))).await;
        assert_eq!(wrong.status(), 401);
        assert_eq!(header(&wrong, "x-ratelimit-limit-requests"), None, "nobody's limits");
    }
    // Over the 64-token cap: rejected before the limits are asked.
    let long = json!({"model": "capped", "max_tokens": 8,
                      "messages": [{"role": "user", "content": "many words ".repeat(200)}]});
    for _ in 0..3 {
        let rejected = send(&gw, AIDER_KEY, &long).await;
        assert_eq!(rejected.status(), 400);
        let body: Value = rejected.json().await.expect("json");
        assert_eq!(body["error"]["code"], "context_length_exceeded");
    }
    let unknown = send(&gw, AIDER_KEY, &chat_for("gpt-9", false, json!({}))).await;
    assert_eq!(unknown.status(), 404);

    let served = send(&gw, AIDER_KEY, &chat_for("capped", false, json!({}))).await;
    assert_eq!(served.status(), 200, "the one request of the minute was still there");
    assert_eq!(header(&served, "x-ratelimit-remaining-requests").as_deref(), Some("0"));
    assert_eq!(send(&gw, AIDER_KEY, &chat_for("qwen", false, json!({}))).await.status(), 429, "rpm 1 holds");
}

#[tokio::test]
async fn a_stream_carries_the_rate_limit_headers_and_anonymous_shares_the_defaults() {
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), "{rpm: 100, tpm: 100000}")).await;
    let stream = send(&gw, AIDER_KEY, &chat_for("qwen", true, json!({}))).await;
    assert_eq!(stream.status(), 200);
    assert!(header(&stream, "content-type").is_some_and(|v| v.starts_with("text/event-stream")));
    assert_eq!(header(&stream, "x-ratelimit-limit-requests").as_deref(), Some("100"));
    assert_eq!(header(&stream, "x-ratelimit-remaining-requests").as_deref(), Some("99"));
    assert_eq!(header(&stream, "x-ratelimit-limit-tokens").as_deref(), Some("100000"));
    let left: u64 = header(&stream, "x-ratelimit-remaining-tokens").and_then(|v| v.parse().ok()).expect("tokens");
    assert!(left < 100_000, "the prompt was charged up front: {left}");
    assert!(header(&stream, "x-ratelimit-reset-tokens").is_some());
    assert!(text_of(stream).await.contains("[DONE]"));

    // Auth off: every request is `anonymous`, under default_limits.
    let open = format!(
        "backends:\n  local: {{url: '{}', max_concurrency: 4}}\nmodels:\n  qwen: {{backend: local}}\n\
         default_limits: {{rpm: 2}}\n",
        sim.url()
    );
    let gw = gateway(&open).await;
    for _ in 0..2 {
        assert_eq!(post(&gw, "/v1/chat/completions", &chat_for("qwen", false, json!({}))).await.status(), 200);
    }
    let refused = post(&gw, "/v1/chat/completions", &chat_for("qwen", true, json!({}))).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(rate_limited(&gw, "anonymous", "rpm").await, 1.0);
}

#[tokio::test]
async fn a_request_refused_by_a_full_queue_gives_its_charge_back() {
    let sim = sim().await;
    let yaml = format!(
        "backends:\n  local: {{url: '{}', max_concurrency: 1}}\nmodels:\n  qwen: {{backend: local, max_queue: 0}}\n\
         auth: required\nclients:\n  aider: {{key_sha256: {}, limits: {{rpm: 1, tpm: 1000}}}}\n  \
         cursor: {{key_sha256: {}}}\n",
        sim.url(),
        sha256_hex(AIDER_KEY),
        sha256_hex(CURSOR_KEY),
    );
    let gw = gateway(&yaml).await;
    let mut held = send(&gw, CURSOR_KEY, &chat_for("qwen", true, json!({"hold_after": 1, "hold_key": "busy"}))).await;
    read_until(&mut held, "t0 ").await;
    for _ in 0..3 {
        let full = send(&gw, AIDER_KEY, &chat_for("qwen", false, json!({}))).await;
        assert_eq!(full.status(), 503, "the backend's one slot is taken and the queue holds none");
        assert_eq!(header(&full, "x-ratelimit-limit-requests").as_deref(), Some("1"), "admitted, then refused");
    }
    client().post(format!("{}/sim/release/busy", sim.url())).send().await.expect("release");
    assert!(text_of(held).await.contains("[DONE]"));
    // The refunds are spawned when each 503 is recorded: the one request of the minute comes back.
    eventually("the request slot given back", || async {
        send(&gw, AIDER_KEY, &chat_for("qwen", false, json!({}))).await.status() == 200
    })
    .await;
    assert_eq!(send(&gw, AIDER_KEY, &chat_for("qwen", false, json!({}))).await.status(), 429, "rpm 1 holds");
}

/// The token limit of the map-reduce tests: its refill (100 tokens a second) is small beside
/// what a map-reduce's pieces use.
const CHUNK_TPM: u64 = 6000;

/// Model `chunked` behind a 1024-token cap (counted with the estimate), whose over-long prompts
/// are map-reduced, and model `qwen` without a cap; `aider` may use CHUNK_TPM tokens a minute
/// and one request at a time (its permit is held until its charge is settled, so a request
/// admitted after it sees the settled bucket).
fn chunk_yaml(sim_url: &str) -> String {
    format!(
        "backends:\n  local: {{url: '{sim_url}', max_concurrency: 2}}\n  \
         chunky: {{url: '{sim_url}', max_concurrency: 2, context_cap: 1024}}\n\
         models:\n  qwen: {{backend: local}}\n  chunked: {{backend: chunky, on_overflow: chunk, default_max_tokens: 32}}\n\
         auth: required\n\
         clients:\n  aider: {{key_sha256: {}, limits: {{tpm: {CHUNK_TPM}, concurrency: 1}}}}\n",
        sha256_hex(AIDER_KEY),
    )
}

/// The tokens left in `aider`'s bucket once its last request was settled, read with a probe
/// larger than the whole bucket: refused (charging nothing) for concurrency while that request
/// still holds its permit, then for tokens, with the bucket's state in its headers.
async fn settled_tokens(gw: &Gateway) -> u64 {
    let probe =
        json!({"model": "qwen", "messages": [{"role": "user", "content": "x ".repeat(CHUNK_TPM as usize * 2)}]});
    let left = std::sync::Mutex::new(None);
    eventually("the map-reduce's charge settled", || {
        let (probe, left) = (&probe, &left);
        async move {
            let refused = send(gw, AIDER_KEY, probe).await;
            assert_eq!(refused.status(), 429, "a probe larger than the bucket is never admitted");
            let remaining = header(&refused, "x-ratelimit-remaining-tokens").and_then(|v| v.parse::<u64>().ok());
            let body: Value = refused.json().await.expect("json");
            if body["error"]["type"] != "tokens" {
                return false;
            }
            *left.lock().expect("lock") = remaining;
            true
        }
    })
    .await;
    left.into_inner().expect("lock").expect("x-ratelimit-remaining-tokens")
}

/// Tokens `aider` used on model `chunked` by the backend's usage: every piece and the reduce.
async fn chunked_usage(gw: &Gateway) -> u64 {
    let labels = "backend=\"chunky\",client=\"aider\",model=\"chunked\"";
    let prompt = metric(gw, &format!("mlxgate_prompt_tokens_total{{{labels}}}")).await.unwrap_or(0.0);
    let generated = metric(gw, &format!("mlxgate_generation_tokens_total{{{labels}}}")).await.unwrap_or(0.0);
    (prompt + generated) as u64
}

/// What a map-reduce of `aider`'s was charged, and what to compare it with.
struct MapReduce {
    /// Tokens taken from the bucket: CHUNK_TPM less what is left (this much too low at most,
    /// for the refill meanwhile).
    charged: u64,
    refill: u64,
    /// Every piece's and the reduce's usage, as the token counters say.
    used: u64,
    /// The estimate of the reduce's prompt (as the gateway estimates: the `messages` JSON text).
    reduce_estimate: u64,
}

/// Sends `aider`'s map-reduce (the `sim` knobs apply to the reduce's stream) and reads what it
/// was charged once it is settled.
async fn map_reduce(stream: bool, sim_knobs: Value, reduce_outcome: &str) -> MapReduce {
    let sim = sim().await;
    let gw = gateway(&chunk_yaml(&sim.url())).await;
    let words: Vec<&str> = ["model", "token", "stream", "queue"].iter().copied().cycle().take(1000).collect();
    let body = json!({"model": "chunked", "stream": stream, "max_tokens": 16, "sim": sim_knobs, "messages": [
        {"role": "system", "content": "summarise"},
        {"role": "user", "content": format!("summarise this: {}", words.join(" "))}]});
    let started = std::time::Instant::now();
    let response = send(&gw, AIDER_KEY, &body).await;
    assert_eq!(response.status(), 200);
    let transform = header(&response, "x-mlxgate-transform").expect("a chunked request");
    let pieces: u64 = transform.strip_prefix("chunk; pieces=").and_then(|p| p.parse().ok()).expect("pieces");
    assert!(pieces >= 2, "{transform}");
    response.text().await.expect("body");
    let left = settled_tokens(&gw).await;
    let refill = (started.elapsed().as_secs_f64() * CHUNK_TPM as f64 / 60.0).ceil() as u64 + 1;
    let seen: Vec<Value> =
        client().get(format!("{}/sim/requests", sim.url())).send().await.expect("requests").json().await.expect("json");
    assert_eq!(seen.len() as u64, pieces + 1, "P pieces and the reduce reached the backend");
    let ok = "mlxgate_requests_total{backend=\"chunky\",client=\"aider\",model=\"chunked\",outcome=\"ok\"}";
    let expected_ok = if reduce_outcome == "ok" { pieces + 1 } else { pieces };
    assert_eq!(metric(&gw, ok).await, Some(expected_ok as f64), "every piece counted under its client");
    let used = chunked_usage(&gw).await;
    assert!(used > 1000, "the pieces' prompts alone hold the document's 1000 words: {used}");
    let reduce = seen.last().map(|r| r["messages"].to_string()).unwrap_or_default();
    let reduce_estimate = Estimate.text_tokens(&reduce) as u64;
    let figures = MapReduce { charged: CHUNK_TPM - left, refill, used, reduce_estimate };
    println!(
        "{pieces} pieces: charged {}, refill {refill}, used {used}, reduce estimate {reduce_estimate}",
        figures.charged
    );
    figures
}

#[tokio::test]
async fn a_map_reduce_is_charged_its_pieces_usage_too() {
    let MapReduce { charged, refill, used, .. } = map_reduce(false, json!({}), "ok").await;
    assert!(charged <= used, "charged no more than the usage: {charged} of {used}");
    assert!(charged + refill >= used, "charged every piece's usage and the reduce's: {charged} of {used}");
}

#[tokio::test]
async fn a_streamed_map_reduce_whose_reduce_fails_is_charged_its_pieces_usage() {
    // The reduce's stream carries an error event after 2 tokens, and no usage; the map pieces,
    // whole answers, are not touched by it. Charged: the pieces' usage, the reduce's prompt
    // by its estimate and the 2 tokens it showed.
    let knobs = json!({"error_after": 2, "after_error": "stop_and_done"});
    let MapReduce { charged, refill, used, reduce_estimate } = map_reduce(true, knobs, "stream_error").await;
    let expected = used + reduce_estimate + 2;
    // The estimate here is of the JSON the simulator received, re-encoded: a few tokens apart.
    assert!(charged + refill + 8 >= expected, "charged the pieces' usage: {charged}, expected {expected}");
    assert!(charged <= expected + 8, "the reduce charged by its own estimate, not the document's: {charged}");
}

/// A client that hangs up after its request reached the backend (a short client timeout) is
/// charged for it: leaving before the answer is no way around the limits.
#[tokio::test]
async fn a_client_that_leaves_after_the_backend_got_its_request_is_still_charged() {
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), "{rpm: 3}")).await;
    // The backend holds the answer; the client gives up waiting for its headers.
    let body = chat_for("qwen", false, json!({"ttft_ms": 60_000}));
    let hasty = reqwest::Client::builder().timeout(std::time::Duration::from_millis(300)).build().expect("client");
    for sent in 1..=2u64 {
        let gone = hasty.post(gw.url("/v1/chat/completions")).bearer_auth(AIDER_KEY).json(&body).send().await;
        assert!(gone.is_err(), "the client timed out");
        eventually("the backend got the request", || async { sim_stats(&sim).await["total"].as_u64() == Some(sent) })
            .await;
    }
    eventually("the gone requests were recorded", || async {
        metric(
            &gw,
            "mlxgate_requests_total{backend=\"local\",client=\"aider\",model=\"qwen\",outcome=\"client_closed\"}",
        )
        .await
            == Some(2.0)
    })
    .await;
    let response = send(&gw, AIDER_KEY, &chat_for("qwen", false, json!({}))).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        header(&response, "x-ratelimit-remaining-requests").as_deref(),
        Some("0"),
        "the two requests the backend got were charged"
    );
}

#[tokio::test]
async fn a_client_looping_on_its_429s_is_refused_before_its_prompt_is_counted() {
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), "{rpm: 2, tpm: 100000}")).await;
    let counted = || async { metric(&gw, "mlxgate_prompt_count_seconds_count{model=\"capped\"}").await.unwrap_or(0.0) };
    for _ in 0..2 {
        assert_eq!(send(&gw, AIDER_KEY, &chat_for("capped", false, json!({}))).await.status(), 200);
    }
    let refused = send(&gw, AIDER_KEY, &chat_for("capped", false, json!({}))).await;
    assert_eq!(refused.status(), 429, "the third in a minute: counted, then refused by the rpm");
    assert_eq!(counted().await, 3.0, "the prompts of the two served and the first refused were counted");
    // The same client keeps asking: refused at once, its prompt never tokenized.
    for _ in 0..5 {
        let again = send(&gw, AIDER_KEY, &chat_for("capped", false, json!({}))).await;
        assert_eq!(again.status(), 429);
        assert_eq!(header(&again, "x-ratelimit-remaining-requests").as_deref(), Some("0"));
        let wait: f64 = header(&again, "retry-after").expect("Retry-After").parse().expect("seconds");
        assert!((1.0..=30.0).contains(&wait), "about half a minute for rpm 2: {wait}");
        let body: Value = again.json().await.expect("json");
        assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    }
    assert_eq!(counted().await, 3.0, "no prompt counted for a client still refused");
    assert_eq!(rate_limited(&gw, "aider", "rpm").await, 6.0);
    // Another client of the same model is counted and served as before.
    assert_eq!(send(&gw, CURSOR_KEY, &chat_for("capped", false, json!({}))).await.status(), 200);
    assert_eq!(counted().await, 4.0);
    let outcome =
        "mlxgate_requests_total{backend=\"capped\",client=\"aider\",model=\"capped\",outcome=\"rate_limited\"}";
    assert_eq!(metric(&gw, outcome).await, Some(6.0), "refusals keep their model and backend labels");
}

/// A client that leaves a map-reduce during its map is charged what the finished pieces used:
/// not also the document's up-front estimate (the pieces' prompts are that document).
#[tokio::test]
async fn a_map_reduce_left_during_its_map_is_charged_its_finished_pieces_only() {
    let sim = sim().await;
    let gw = gateway(&chunk_yaml(&sim.url())).await;
    let words: Vec<&str> = ["model", "token", "stream", "queue"].iter().copied().cycle().take(1000).collect();
    // Each piece takes 400 ms at the backend, two at a time: the client leaves after the first two.
    let body = json!({"model": "chunked", "max_tokens": 16, "sim": {"ttft_ms": 400}, "messages": [
        {"role": "system", "content": "summarise"},
        {"role": "user", "content": format!("summarise this: {}", words.join(" "))}]});
    let started = std::time::Instant::now();
    let hasty = reqwest::Client::builder().timeout(std::time::Duration::from_millis(650)).build().expect("client");
    let gone = hasty.post(gw.url("/v1/chat/completions")).bearer_auth(AIDER_KEY).json(&body).send().await;
    assert!(gone.is_err(), "the client left during the map");
    eventually("the left request recorded", || async {
        let closed =
            "mlxgate_requests_total{backend=\"chunky\",client=\"aider\",model=\"chunked\",outcome=\"client_closed\"}";
        metric(&gw, closed).await.is_some_and(|n| n >= 1.0)
    })
    .await;
    let left = settled_tokens(&gw).await;
    let refill = (started.elapsed().as_secs_f64() * CHUNK_TPM as f64 / 60.0).ceil() as u64 + 1;
    let charged = CHUNK_TPM - left;
    let used = chunked_usage(&gw).await;
    let finished =
        metric(&gw, "mlxgate_requests_total{backend=\"chunky\",client=\"aider\",model=\"chunked\",outcome=\"ok\"}")
            .await
            .unwrap_or(0.0);
    println!("{finished} pieces finished: charged {charged}, refill {refill}, used {used}");
    assert!(finished >= 1.0, "some pieces were answered before the client left");
    assert!(used > 0, "their usage is known");
    assert!(charged <= used + 2, "charged the finished pieces, not the document on top: {charged} for {used} used");
    assert!(charged + refill >= used, "charged every finished piece: {charged} for {used} used");
}

/// A client with `concurrency: 1` that sends one request after another on one connection is
/// never refused: its slot is free as soon as it has its answer, not when the charge settles.
#[tokio::test]
async fn one_request_after_another_at_concurrency_1_is_never_refused() {
    let sim = sim().await;
    // The real binary, with its worker threads: the charge's settling races the next request.
    let (gw, _log) =
        gateway_binary_logged(&yaml(&sim.url(), "{concurrency: 1, rpm: 100000, tpm: 100000000}"), &[], "info");
    let http = client();
    let mut refused = 0;
    for i in 0..300 {
        let stream = i % 3 == 0;
        let response = http
            .post(format!("{}/v1/chat/completions", gw.url))
            .bearer_auth(AIDER_KEY)
            .json(&chat_for("qwen", stream, json!({})))
            .send()
            .await
            .expect("send");
        if response.status() == 429 {
            refused += 1;
        }
        response.bytes().await.expect("the whole answer");
    }
    assert_eq!(refused, 0, "of 300 sequential requests (every third streamed)");
}

/// An embeddings answer ends the request (outcome ok) and settles the client's token charge
/// to the backend's usage, as a chat answer does.
#[tokio::test]
async fn an_embeddings_request_is_recorded_and_charged_by_its_usage() {
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), "{tpm: 1000000}")).await;
    let text = "alpha beta gamma ".repeat(500);
    let body = json!({"model": "qwen", "input": text});
    let first = client().post(gw.url("/v1/embeddings")).bearer_auth(AIDER_KEY).json(&body).send().await.expect("send");
    assert_eq!(first.status(), 200);
    let answer: Value = first.json().await.expect("json");
    let usage = answer["usage"]["prompt_tokens"].as_u64().expect("the backend's usage");
    let ok = "mlxgate_requests_total{backend=\"local\",client=\"aider\",model=\"qwen\",outcome=\"ok\"}";
    eventually("recorded as served", || async { metric(&gw, ok).await == Some(1.0) }).await;
    let prompt = "mlxgate_prompt_tokens_total{backend=\"local\",client=\"aider\",model=\"qwen\"}";
    assert_eq!(metric(&gw, prompt).await, Some(usage as f64));
    // Settled: a tiny request's headers show the bucket spent by the usage (plus its own
    // charge), not by the up-front estimate of the body.
    let estimate = Estimate.text_tokens(&serde_json::to_string(&body["input"]).expect("json")) as u64;
    assert!(estimate > usage + 100, "the estimate overcounts this text: {estimate} vs {usage}");
    eventually("the charge settled to the usage", || async {
        let probe = send(&gw, AIDER_KEY, &chat_for("qwen", false, json!({}))).await;
        let remaining: u64 =
            header(&probe, "x-ratelimit-remaining-tokens").and_then(|v| v.parse().ok()).expect("header");
        remaining + usage + 200 >= 1_000_000
    })
    .await;
}

/// A prompt larger than the client's whole token rate is counted once: sent again (an agent
/// looping on it), the same body is refused before its prompt is counted.
#[tokio::test]
async fn a_prompt_too_large_for_the_token_rate_is_counted_once() {
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), "{tpm: 30}")).await;
    let counted = || async { metric(&gw, "mlxgate_prompt_count_seconds_count{model=\"capped\"}").await.unwrap_or(0.0) };
    let big =
        json!({"model": "capped", "max_tokens": 4, "messages": [{"role": "user", "content": "word ".repeat(12)}]});
    for attempt in 0..4 {
        let refused = send(&gw, AIDER_KEY, &big).await;
        assert_eq!(refused.status(), 429, "attempt {attempt}");
        assert_eq!(header(&refused, "x-should-retry").as_deref(), Some("false"));
        let body: Value = refused.json().await.expect("json");
        assert!(body["error"]["message"].as_str().is_some_and(|m| m.starts_with("Request too large")), "{body}");
    }
    assert_eq!(counted().await, 1.0, "counted the first time only");
    assert_eq!(rate_limited(&gw, "aider", "tpm").await, 4.0);
    // A different, small prompt is counted and served.
    let small = json!({"model": "capped", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(send(&gw, AIDER_KEY, &small).await.status(), 200);
    assert_eq!(counted().await, 2.0);
}
