//! The `openai` Python SDK against mlxgate's 429: the SDK reads `retry-after-ms`/`Retry-After`
//! (and `x-should-retry`), waits, sends again by itself (its default `max_retries`, 2) and
//! succeeds once the client's limit lets it through. The SDK is the one in
//! `.venv-mlx-openai-server` (scripts/setup-backends installs it).

use std::path::PathBuf;
use std::process::Command;

use crate::common::*;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const AIDER_KEY: &str = "sk-aider-0c7e5b9a13f24d86";

/// One chat completion through the SDK with its default retries; prints the answer as JSON.
/// The SDK logs each wait before a retry ("Retrying request to … in S seconds") at INFO.
const SDK_CALL: &str = r#"
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], timeout=120.0)
assert client.max_retries == 2, client.max_retries
answer = client.chat.completions.create(
    model="qwen", messages=[{"role": "user", "content": "hello there"}], max_tokens=4)
print(json.dumps({"content": answer.choices[0].message.content, "finish_reason": answer.choices[0].finish_reason}))
"#;

/// Model `qwen` on the simulator, and the one client `aider` with `limits`.
fn aider_yaml(sim_url: &str, limits: &str) -> String {
    format!(
        "backends:\n  local: {{url: '{sim_url}', max_concurrency: 4}}\nmodels:\n  qwen: {{backend: local}}\n\
         auth: required\nclients:\n  aider: {{key_sha256: {}, limits: {limits}}}\n",
        sha256_hex(AIDER_KEY),
    )
}

/// The waits the SDK logged before its retries ("Retrying request to … in S seconds").
fn retry_waits(stderr: &str) -> Vec<f64> {
    stderr
        .lines()
        .filter_map(|l| l.split("Retrying request to ").nth(1))
        .filter_map(|l| l.split(" in ").nth(1)?.split(' ').next()?.parse().ok())
        .collect()
}

fn sha256_hex(key: &str) -> String {
    Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

fn sdk_python() -> Option<PathBuf> {
    openai_sdk_python(".venv-mlx-openai-server", "scripts/setup-backends mlx-openai-server")
}

#[tokio::test]
async fn the_openai_sdk_backs_off_on_429_and_succeeds_when_the_limit_allows() {
    let Some(python) = sdk_python() else { return };
    let sim = sim().await;
    let gw = gateway(&aider_yaml(&sim.url(), "{concurrency: 1}")).await;
    // aider's one request in flight: a stream held by the simulator after its first token.
    let mut held = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(AIDER_KEY)
        .json(&json!({"model": "qwen", "stream": true, "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 8, "sim": {"hold_after": 1, "hold_key": "held"}}))
        .send()
        .await
        .expect("send");
    assert_eq!(held.status(), 200);
    read_until(&mut held, "t0 ").await;

    // The SDK's first attempt meets the limit (429, Retry-After: 1); it waits and sends again.
    let (base_url, key) = (gw.url("/v1"), AIDER_KEY.to_string());
    let sdk = tokio::task::spawn_blocking(move || {
        Command::new(python).args(["-c", SDK_CALL, &base_url, &key]).output().expect("python runs")
    });
    let limited = "mlxgate_rate_limited_total{client=\"aider\",limit=\"concurrency\"}";
    eventually("the SDK's first attempt refused with 429", || async {
        metric(&gw, limited).await.is_some_and(|n| n >= 1.0)
    })
    .await;
    // The held request ends: the SDK's retry finds the client's slot free.
    client().post(format!("{}/sim/release/held", sim.url())).send().await.expect("release");
    assert!(text_of(held).await.contains("[DONE]"));

    let output = sdk.await.expect("the SDK's thread");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the SDK call failed: {stderr}");
    let answer: Value = serde_json::from_str(stdout.trim()).expect("the SDK printed its answer");
    assert!(answer["content"].as_str().is_some_and(|c| c.starts_with("t0")), "{answer}");
    // The SDK waited as the headers said (retry-after-ms: 1000), not its own backoff (0.375 to
    // 0.5 s for a first retry without them).
    let waits = retry_waits(&stderr);
    assert!(!waits.is_empty(), "the SDK retried: {stderr}");
    assert!(waits.iter().all(|w| (*w - 1.0).abs() < 1e-6), "waited the Retry-After: {waits:?}");
    let refusals = metric(&gw, limited).await.unwrap_or(0.0);
    assert!((1.0..=2.0).contains(&refusals), "refused, then served within the SDK's 2 retries: {refusals}");
    let outcome = |o: &str| {
        format!("mlxgate_requests_total{{backend=\"local\",client=\"aider\",model=\"qwen\",outcome=\"{o}\"}}")
    };
    assert_eq!(metric(&gw, &outcome("rate_limited")).await, Some(refusals));
    assert_eq!(metric(&gw, &outcome("ok")).await, Some(2.0), "the held stream and the SDK's retry");
    println!("the SDK was refused {refusals} time(s), waited {waits:?} s, then served: {answer}");
}

/// Spends the client's requests per minute with `max_retries=0` until the SDK raises its
/// `RateLimitError`, then asks once more with the SDK's default retries; prints the answer.
const SDK_RPM_WINDOW: &str = r#"
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
import openai
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], timeout=120.0)
ask = dict(model="qwen", messages=[{"role": "user", "content": "hello there"}], max_tokens=4)
spent = 0
while True:
    try:
        client.with_options(max_retries=0).chat.completions.create(**ask)
        spent += 1
    except openai.RateLimitError as e:
        refused = {k: e.response.headers.get(k) for k in
                   ("retry-after", "retry-after-ms", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests")}
        break
    assert spent < 100, "never refused"
answer = client.chat.completions.create(**ask)
print(json.dumps({"spent": spent, "refused": refused, "content": answer.choices[0].message.content}))
"#;

#[tokio::test]
async fn the_openai_sdk_waits_out_a_requests_per_minute_window_and_succeeds() {
    let Some(python) = sdk_python() else { return };
    let sim = sim().await;
    // 6 a minute: one request's worth comes back every 10 s.
    let gw = gateway(&aider_yaml(&sim.url(), "{rpm: 6}")).await;
    let (base_url, key) = (gw.url("/v1"), AIDER_KEY.to_string());
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python).args(["-c", SDK_RPM_WINDOW, &base_url, &key]).output().expect("python runs")
    })
    .await
    .expect("the SDK's thread");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the SDK call failed: {stderr}");
    let answer: Value = serde_json::from_str(stdout.trim()).expect("the SDK printed its answer");
    assert_eq!(answer["spent"], 6, "a burst of one minute's allowance, then 429: {answer}");
    assert_eq!(answer["refused"]["x-ratelimit-remaining-requests"], "0", "{answer}");
    let told: f64 = answer["refused"]["retry-after-ms"].as_str().and_then(|v| v.parse().ok()).expect("retry-after-ms");
    assert!((1000.0..=10_000.0).contains(&told), "at most the 10 s one request takes to come back: {answer}");
    assert!(answer["content"].as_str().is_some_and(|c| c.starts_with("t0")), "{answer}");
    let waits = retry_waits(&stderr);
    // The SDK's own back-off for a first retry is 0.5 s or less; it waited what the headers said.
    assert!(!waits.is_empty() && waits.len() <= 2, "the SDK retried by itself: {stderr}");
    assert!(waits[0] > 1.0 && waits[0] <= 10.0, "waited the window out, as told: {waits:?}");
    let served = "mlxgate_requests_total{backend=\"local\",client=\"aider\",model=\"qwen\",outcome=\"ok\"}";
    assert_eq!(metric(&gw, served).await, Some(7.0), "six, then the SDK's retried request");
    println!("spent {}, told {told} ms, the SDK waited {waits:?} s, then served", answer["spent"]);
}
