//! The gateway core against `mlxgate-sim`: streaming without buffering, queue limits and
//! fairness, slot release, rewriting, and every error a client can get.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::*;
use serde_json::{Value, json};

#[tokio::test]
async fn frames_arrive_at_the_pace_the_backend_sends_them() {
    let sim = sim().await;
    let gw = gateway(&one_model_yaml(&sim.url(), 2, 4)).await;
    let body = chat(true, json!({"tokens": 4, "hold_after": 1, "hold_key": "pace"}));
    let mut response = post(&gw, "/v1/chat/completions", &body).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-accel-buffering"], "no");
    assert!(response.headers()["content-type"].to_str().expect("ascii").starts_with("text/event-stream"));

    // The backend has written the first token and now waits: the client must already have it.
    let first = read_until(&mut response, "t0 ").await;
    assert!(!first.contains("t1 "), "the second token cannot have been written yet: {first:?}");
    assert_eq!(sim_stats(&sim).await["held"], 1, "the backend is still holding the second token");

    client().post(format!("{}/sim/release/pace", sim.url())).send().await.expect("release");
    let rest = text_of(response).await;
    let all = format!("{first}{rest}");
    for token in ["t1 ", "t2 ", "t3 ", "[DONE]"] {
        assert!(all.contains(token), "missing {token} in {all:?}");
    }
}

#[tokio::test]
async fn twenty_slow_streams_give_seven_successes_and_thirteen_503s() {
    let sim = sim().await;
    let gw = gateway(&one_model_yaml(&sim.url(), 2, 5)).await;
    let rejected = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let url = gw.url("/v1/chat/completions");
        let rejected = Arc::clone(&rejected);
        let body = chat(true, json!({"tokens": 3, "hold_after": 1, "hold_key": "slow"}));
        tasks.push(tokio::spawn(async move {
            let response = client().post(url).json(&body).send().await.expect("send");
            let status = response.status().as_u16();
            let retry_after = response.headers().get("retry-after").cloned();
            let text = text_of(response).await;
            if status == 503 {
                rejected.fetch_add(1, Ordering::SeqCst);
            }
            (status, retry_after, text)
        }));
    }
    // Every stream holds after its first token, so nothing finishes until all 20 are placed.
    eventually("13 rejections", || async { rejected.load(Ordering::SeqCst) == 13 }).await;
    assert_eq!(metric(&gw, "mlxgate_queue_depth{model=\"qwen\"}").await, Some(5.0));
    assert_eq!(metric(&gw, "mlxgate_inflight_requests{backend=\"local\"}").await, Some(2.0));
    client().post(format!("{}/sim/release/slow", sim.url())).send().await.expect("release");

    let mut ok = 0;
    for task in tasks {
        let (status, retry_after, text) = task.await.expect("task");
        match status {
            200 => {
                assert!(text.contains("t2 ") && text.contains("[DONE]"), "{text}");
                ok += 1;
            }
            503 => {
                let retry: u64 = retry_after.expect("Retry-After").to_str().expect("ascii").parse().expect("secs");
                assert!(retry >= 1);
                let body: Value = serde_json::from_str(&text).expect("json error body");
                assert_eq!(body["error"]["type"], "server_overloaded");
                assert!(body["error"]["message"].as_str().expect("message").contains("full"));
            }
            other => panic!("unexpected status {other}: {text}"),
        }
    }
    assert_eq!(ok, 7);
    assert_eq!(rejected.load(Ordering::SeqCst), 13);
    assert!(sim.state.peak() <= 2, "backend saw {} at once", sim.state.peak());
}

#[tokio::test]
async fn waiting_requests_are_served_round_robin_across_clients() {
    let sim = sim().await;
    let gw = gateway(&one_model_yaml(&sim.url(), 1, 16)).await;
    let send = |key: &'static str, tag: String, body: Value| {
        let url = gw.url("/v1/chat/completions");
        let mut body = body;
        body["user"] = json!(tag);
        tokio::spawn(async move {
            let r = client().post(url).bearer_auth(key).json(&body).send().await.expect("send");
            assert_eq!(r.status(), 200);
            text_of(r).await
        })
    };
    // a0 holds the only slot until everything else is queued.
    let mut tasks = vec![send("key-a", "a0".into(), chat(true, json!({"hold_after": 1, "hold_key": "fair"})))];
    eventually("a0 at the backend", || async { sim_stats(&sim).await["held"] == 1 }).await;
    for i in 1..=5 {
        tasks.push(send("key-a", format!("a{i}"), chat(false, json!({"ttft_ms": 0, "tokens": 1}))));
    }
    eventually("five of a queued", || async { metric(&gw, "mlxgate_queue_depth{model=\"qwen\"}").await == Some(5.0) })
        .await;
    for i in 1..=2 {
        tasks.push(send("key-b", format!("b{i}"), chat(false, json!({"ttft_ms": 0, "tokens": 1}))));
    }
    eventually("b queued", || async { metric(&gw, "mlxgate_queue_depth{model=\"qwen\"}").await == Some(7.0) }).await;
    client().post(format!("{}/sim/release/fair", sim.url())).send().await.expect("release");
    for t in tasks {
        t.await.expect("task");
    }
    let order: Vec<String> =
        sim.state.requests().iter().map(|r| r["user"].as_str().unwrap_or("?").to_string()).collect();
    assert_eq!(order, ["a0", "a1", "b1", "a2", "b2", "a3", "a4", "a5"]);
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_frees_its_slot_and_the_backend() {
    let sim = sim().await;
    let gw = gateway(&one_model_yaml(&sim.url(), 1, 0)).await;
    let body = chat(true, json!({"tokens": 100, "hold_after": 1, "hold_key": "never"}));
    let mut response = post(&gw, "/v1/chat/completions", &body).await;
    read_until(&mut response, "t0 ").await;
    assert_eq!(metric(&gw, "mlxgate_inflight_requests{backend=\"local\"}").await, Some(1.0));
    let busy = client().post(gw.url("/v1/chat/completions")).json(&chat(false, json!({}))).send().await.expect("send");
    assert_eq!(busy.status(), 503, "the only slot is taken and max_queue is 0");

    drop(response);
    eventually("slot released", || async {
        metric(&gw, "mlxgate_inflight_requests{backend=\"local\"}").await == Some(0.0)
    })
    .await;
    eventually("backend stream closed", || async { sim_stats(&sim).await["held"] == 0 }).await;
    let next = client().post(gw.url("/v1/chat/completions")).json(&chat(false, json!({}))).send().await.expect("send");
    assert_eq!(next.status(), 200);
}

#[tokio::test]
async fn model_is_rewritten_and_the_rest_of_the_body_kept() {
    let sim = sim().await;
    let gw = gateway(&one_model_yaml(&sim.url(), 2, 4)).await;
    let body = json!({"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.25,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]});
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("gateway-key")
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    let answer: Value = r.json().await.expect("json");
    assert_eq!(answer["object"], "chat.completion");
    assert!(answer["usage"]["completion_tokens"].as_u64().is_some());

    let emb = post(&gw, "/v1/embeddings", &json!({"model": "qwen", "input": ["a b", "c"]})).await;
    assert_eq!(emb.status(), 200);
    assert_eq!(emb.json::<Value>().await.expect("json")["data"].as_array().map(Vec::len), Some(2));
    let comp = post(&gw, "/v1/completions", &json!({"model": "qwen", "prompt": "x"})).await;
    assert_eq!(comp.json::<Value>().await.expect("json")["object"], "text_completion");

    let seen = sim.state.requests();
    assert_eq!(seen.len(), 3);
    for r in &seen {
        assert_eq!(r["model"], "tiny-qwen3", "{r}");
    }
    assert_eq!(seen[0]["temperature"], 0.25);
    assert_eq!(seen[0]["tools"], body["tools"]);
    assert_eq!(seen[0]["messages"], body["messages"]);
    assert_eq!(seen[0]["_authorization"], Value::Null, "the gateway's key is not forwarded to the backend");
    assert_eq!(seen[1]["_path"], "/v1/embeddings");
    assert_eq!(seen[2]["_path"], "/v1/completions");
}

#[tokio::test]
async fn models_health_and_ready() {
    let sim = sim().await;
    let dead = free_port();
    let yaml = format!(
        "backends:\n  up: {{url: '{}'}}\n  down: {{url: 'http://127.0.0.1:{dead}'}}\n\
         models:\n  qwen: {{backend: up}}\n  gone: {{backend: down}}\n",
        sim.url()
    );
    let gw = gateway(&yaml).await;
    let models: Value = client().get(gw.url("/v1/models")).send().await.expect("send").json().await.expect("json");
    assert_eq!(models["object"], "list");
    let ids: Vec<&str> = models["data"].as_array().expect("data").iter().filter_map(|m| m["id"].as_str()).collect();
    assert_eq!(ids, ["gone", "qwen"]);
    assert_eq!(client().get(gw.url("/health")).send().await.expect("send").status(), 200);
    let ready = client().get(gw.url("/ready")).send().await.expect("send");
    assert_eq!(ready.status(), 503);
    let ready: Value = ready.json().await.expect("json");
    assert_eq!(ready["models"]["qwen"]["ready"], true);
    assert_eq!(ready["models"]["gone"]["ready"], false);
    assert!(ready["backends"]["down"]["error"].as_str().expect("error").contains("connect"));
}

#[tokio::test]
async fn each_failure_has_its_status_and_openai_body() {
    let sim = sim().await;
    let hang = sim_with(mlxgate::sim::Behaviour { hang: Some(true), ..Default::default() }).await;
    let dead = free_port();
    let yaml = format!(
        "max_body: 4KiB\nbackends:\n  up: {{url: '{}'}}\n  down: {{url: 'http://127.0.0.1:{dead}'}}\n  \
         stuck: {{url: '{}', response_timeout: 1s}}\n\
         models:\n  qwen: {{backend: up}}\n  gone: {{backend: down}}\n  slow: {{backend: stuck}}\n",
        sim.url(),
        hang.url()
    );
    let gw = gateway(&yaml).await;
    let post = |path: &str, body: String| {
        client().post(gw.url(path)).header("content-type", "application/json").body(body).send()
    };
    let cases = [
        (
            "/v1/chat/completions",
            json!({"model": "nope", "messages": []}).to_string(),
            404,
            "invalid_request_error",
            Some("model_not_found"),
        ),
        ("/v1/chat/completions", "{\"model\": \"qwen\",".to_string(), 400, "invalid_request_error", None),
        ("/v1/chat/completions", json!({"messages": []}).to_string(), 400, "invalid_request_error", None),
        (
            "/v1/chat/completions",
            json!({"model": "gone", "messages": []}).to_string(),
            502,
            "backend_error",
            Some("backend_error"),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "slow", "messages": []}).to_string(),
            504,
            "backend_timeout",
            Some("backend_timeout"),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "qwen", "pad": "x".repeat(5000)}).to_string(),
            413,
            "invalid_request_error",
            Some("request_too_large"),
        ),
        ("/v1/nothing", "{}".to_string(), 404, "invalid_request_error", Some("unknown_url")),
    ];
    for (path, body, status, kind, code) in cases {
        let r = post(path, body.clone()).await.expect("send");
        assert_eq!(r.status().as_u16(), status, "{path} {body:.80}");
        let err: Value = r.json().await.expect("json body");
        let e = &err["error"];
        assert_eq!(e["type"], kind, "{err}");
        assert_eq!(e["code"], code.map_or(Value::Null, |c| json!(c)), "{err}");
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{err}");
        assert!(e.get("param").is_some(), "{err}");
    }
    let wrong_method = client().get(gw.url("/v1/chat/completions")).send().await.expect("send");
    assert_eq!(wrong_method.status(), 404);
    // Review of issue 24: the router answered a face's path in another method with `allow: POST`
    // (as it still does for /v1/messages/count_tokens); the front's router has no such route.
    assert_eq!(wrong_method.headers().get("allow").map(|v| v.as_bytes()), Some(&b"POST"[..]), "allow header");
    assert_eq!(wrong_method.json::<Value>().await.expect("json")["error"]["code"], "unknown_url");
    // The model-less request names the parameter, as OpenAI does.
    let r = post("/v1/chat/completions", json!({"messages": []}).to_string()).await.expect("send");
    assert_eq!(r.json::<Value>().await.expect("json")["error"]["param"], "model");
    assert_eq!(
        metric(
            &gw,
            "mlxgate_requests_total{backend=\"down\",client=\"anonymous\",model=\"gone\",outcome=\"backend_error\"}"
        )
        .await,
        Some(1.0)
    );
}

#[tokio::test]
async fn a_backend_that_dies_mid_stream_ends_the_stream_with_an_error_event() {
    let sim = sim().await;
    let gw = gateway(&one_model_yaml(&sim.url(), 1, 1)).await;
    let body = chat(true, json!({"tokens": 10, "exit_after": 3}));
    let r = post(&gw, "/v1/chat/completions", &body).await;
    assert_eq!(r.status(), 200);
    let text = text_of(r).await;
    let data = data_lines(&text);
    assert!(text.contains("t2 ") && !text.contains("t3 "), "{text}");
    let last: Value = serde_json::from_str(data.last().expect("an event")).expect("json");
    assert_eq!(last["error"]["type"], "backend_error", "{text}");
    assert!(!text.contains("[DONE]"));
    eventually("slot released", || async {
        metric(&gw, "mlxgate_inflight_requests{backend=\"local\"}").await == Some(0.0)
    })
    .await;
}

#[tokio::test]
async fn non_streaming_bodies_pass_through_with_their_length() {
    let sim = sim().await;
    let gw = gateway(&one_model_yaml(&sim.url(), 1, 1)).await;
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .json(&chat(false, json!({"tokens": 3})))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    let length: usize = r.headers()["content-length"].to_str().expect("ascii").parse().expect("number");
    assert!(r.headers().get("x-accel-buffering").is_none());
    let bytes = r.bytes().await.expect("body");
    assert_eq!(bytes.len(), length);
    let v: Value = serde_json::from_slice(&bytes).expect("json");
    assert_eq!(v["choices"][0]["message"]["content"], "t0 t1 t2 ");
    assert_eq!(v["model"], "qwen", "the name the client sent, not the backend's tiny-qwen3");
}

#[tokio::test]
async fn a_request_that_waits_longer_than_max_wait_gets_503_with_retry_after() {
    let sim = sim().await;
    let yaml = format!(
        "backends:\n  local: {{url: '{}', max_concurrency: 1}}\n\
         models:\n  qwen: {{backend: local, max_queue: 4, max_wait: 300ms}}\n",
        sim.url()
    );
    let gw = gateway(&yaml).await;
    let mut holder = post(&gw, "/v1/chat/completions", &chat(true, json!({"hold_after": 1, "hold_key": "wait"}))).await;
    read_until(&mut holder, "t0 ").await;
    let r = post(&gw, "/v1/chat/completions", &chat(false, json!({}))).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let e: Value = r.json().await.expect("json");
    assert_eq!(e["error"]["code"], "server_overloaded");
    assert!(e["error"]["message"].as_str().expect("message").contains("waited"), "{e}");
    assert_eq!(metric(&gw, "mlxgate_queue_depth{model=\"qwen\"}").await, Some(0.0));
    client().post(format!("{}/sim/release/wait", sim.url())).send().await.expect("release");
    assert!(text_of(holder).await.contains("[DONE]"));
}
