//! How every answer can end, against backends that misbehave the way real ones do: HTTP/1.0
//! close-delimited bodies cut by a crash (mlx_lm.server), connections dropped by a live server,
//! silent backends, endless SSE lines, error bodies in every shape, and what the client's
//! connection sees (HTTP/1.1, `Accept-Encoding`, an over-long `Content-Length`). Each outcome is
//! checked in `mlxgate_requests_total` too.

use std::sync::{Arc, Mutex};

use crate::common::*;
use mlxgate::sim::{Behaviour, Framing, SimConfig, Style};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A simulator in mlx_lm.server's style: HTTP/1.0, bodies end at the close.
async fn mlx_lm_sim() -> mlxgate::sim::SimHandle {
    let defaults = Behaviour { style: Some(Style::MlxLm), ..Default::default() };
    let sim = mlxgate::sim::spawn(SimConfig { defaults, ..Default::default() }).await.expect("sim");
    assert_eq!(sim.state.framing(), Framing::Close);
    sim
}

/// A backend that answers every connection with `answer` (raw bytes) and closes it, keeping the
/// request heads it read.
async fn raw_backend(answer: Vec<u8>) -> (String, Arc<Mutex<Vec<String>>>) {
    raw_backend_closing(answer, true).await
}

/// As [`raw_backend`]; with `close` false the connection stays open (and silent) afterwards.
async fn raw_backend_closing(answer: Vec<u8>, close: bool) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&heads);
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let answer = answer.clone();
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let head = read_head(&mut tcp).await;
                seen.lock().expect("lock").push(head);
                let _ = tcp.write_all(&answer).await;
                if close {
                    let _ = tcp.shutdown().await;
                } else {
                    // Silent, open, until the gateway lets go.
                    let _ = tcp.read(&mut [0u8; 1]).await;
                }
            });
        }
    });
    (url, heads)
}

/// Reads a request head and the body its Content-Length announces; returns the head.
async fn read_head(tcp: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match tcp.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let text = String::from_utf8_lossy(&buf).into_owned();
    let end = text.find("\r\n\r\n").map_or(text.len(), |p| p + 4);
    let length: usize = text
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0)))
        .unwrap_or(0);
    let mut have = buf.len() - end.min(buf.len());
    while have < length {
        match tcp.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => have += n,
        }
    }
    text[..end].to_string()
}

async fn outcome(gw: &Gateway, backend: &str, outcome: &str) -> f64 {
    metric(
        gw,
        &format!(
            "mlxgate_requests_total{{backend=\"{backend}\",client=\"anonymous\",model=\"qwen\",outcome=\"{outcome}\"}}"
        ),
    )
    .await
    .unwrap_or(0.0)
}

fn last_event(text: &str) -> Value {
    serde_json::from_str(data_lines(text).last().expect("an event")).expect("json event")
}

#[tokio::test]
async fn an_http10_stream_cut_by_a_crash_ends_with_an_error_event_and_is_no_success() {
    let sim = mlx_lm_sim().await;
    let gw = gateway(&one_model_yaml(&sim.url(), 1, 4)).await;
    let r = post(&gw, "/v1/chat/completions", &chat(true, json!({"tokens": 6, "exit_after": 2}))).await;
    assert_eq!(r.status(), 200);
    let text = text_of(r).await;
    assert!(text.contains("t1 "), "the tokens before the crash arrive: {text}");
    assert!(!text.contains("data: [DONE]"), "{text}");
    let last = last_event(&text);
    assert_eq!(last["error"]["type"], "backend_error", "{text}");
    assert!(last["error"]["message"].as_str().is_some_and(|m| m.contains("no finish_reason")), "{text}");
    assert_eq!(outcome(&gw, "local", "ok").await, 0.0);
    assert_eq!(outcome(&gw, "local", "backend_error").await, 1.0);
}

#[tokio::test]
async fn a_complete_http10_stream_is_a_success_and_reaches_the_client_as_http11() {
    let sim = mlx_lm_sim().await;
    let gw = gateway(&one_model_yaml(&sim.url(), 1, 4)).await;
    // A raw client: what goes over the wire.
    let body = chat(true, json!({"tokens": 3})).to_string();
    let mut tcp = TcpStream::connect(gw.addr).await.expect("connect");
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(request.as_bytes()).await.expect("write");
    let mut seen = Vec::new();
    let mut chunk = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\r\n0\r\n\r\n") {
        let n = tcp.read(&mut chunk).await.expect("read");
        assert!(n > 0, "the gateway closed the connection: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&seen).into_owned();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.to_ascii_lowercase().contains("transfer-encoding: chunked"), "{text}");
    assert!(text.contains("data: [DONE]"), "{text}");
    assert_eq!(outcome(&gw, "local", "ok").await, 1.0);
}

#[tokio::test]
async fn a_live_backend_that_drops_the_connection_is_not_sent_the_prompt_again() {
    let sim = sim().await;
    let gw = gateway(&one_model_yaml(&sim.url(), 1, 4)).await;
    for stream in [true, false] {
        let before = sim_stats(&sim).await["total"].as_u64().expect("total");
        let r = post(&gw, "/v1/chat/completions", &chat(stream, json!({"drop_after": 0}))).await;
        assert_eq!(r.status(), 502, "stream {stream}");
        let e: Value = r.json().await.expect("json");
        assert_eq!(e["error"]["type"], "backend_error");
        assert_eq!(sim_stats(&sim).await["total"].as_u64(), Some(before + 1), "sent once, stream {stream}");
    }
    // Dropped mid-stream: the client's stream ends with the error event.
    let r = post(&gw, "/v1/chat/completions", &chat(true, json!({"tokens": 5, "drop_after": 2}))).await;
    let text = text_of(r).await;
    assert_eq!(last_event(&text)["error"]["type"], "backend_error", "{text}");
    assert_eq!(outcome(&gw, "local", "backend_error").await, 3.0);
}

#[tokio::test]
async fn a_silent_backend_is_cut_after_stream_idle_timeout_and_its_slot_freed() {
    let sim = sim().await;
    let yaml = format!(
        "backends:\n  local: {{url: '{}', max_concurrency: 1, stream_idle_timeout: 1s, first_byte_timeout: 2s}}\n\
         models:\n  qwen: {{backend: local, max_queue: 4, max_wait: 120s}}\n",
        sim.url()
    );
    let gw = gateway(&yaml).await;
    let r = post(&gw, "/v1/chat/completions", &chat(true, json!({"tokens": 5, "hang_after": 2}))).await;
    let text = text_of(r).await;
    assert!(text.contains("t1 "), "{text}");
    let last = last_event(&text);
    assert_eq!(last["error"]["type"], "backend_timeout", "{text}");
    assert!(last["error"]["message"].as_str().is_some_and(|m| m.contains("sent nothing for 1s")), "{text}");
    // The one slot is free again.
    let r = post(&gw, "/v1/chat/completions", &chat(false, json!({"tokens": 2}))).await;
    assert_eq!(r.status(), 200);
    // A backend that never answers: 504 after first_byte_timeout.
    let r = post(&gw, "/v1/chat/completions", &chat(true, json!({"hang": true}))).await;
    assert_eq!(r.status(), 504);
    assert_eq!(outcome(&gw, "local", "backend_timeout").await, 2.0);
}

#[tokio::test]
async fn an_sse_line_that_never_ends_is_cut_at_the_event_cap() {
    let mut answer =
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: {\"choices\":[{\"delta\":{\"content\":\""
            .to_vec();
    answer.extend(std::iter::repeat_n(b'a', 17 << 20));
    let (url, _) = raw_backend(answer).await;
    let gw = gateway(&one_model_yaml(&url, 1, 4)).await;
    let r = post(&gw, "/v1/chat/completions", &chat(true, json!({}))).await;
    let text = text_of(r).await;
    assert!(text.len() < 4096, "the unfinished event is not forwarded: {} bytes", text.len());
    let last = last_event(&text);
    assert!(last["error"]["message"].as_str().is_some_and(|m| m.contains("without ending an SSE event")), "{text}");
    assert_eq!(outcome(&gw, "local", "backend_error").await, 1.0);
}

#[tokio::test]
async fn backend_errors_reach_the_client_in_openai_shape_with_status_and_words() {
    let cases: [(&str, &str, u16, &str); 3] = [
        (
            "HTTP/1.0 404 Not Found\r\nContent-type: application/json\r\n\r\n",
            r#"{"error": "Got: ConnectError: the model is not on the Hub"}"#,
            404,
            "Got: ConnectError: the model is not on the Hub",
        ),
        (
            "HTTP/1.1 422 Unprocessable Entity\r\ncontent-type: application/json\r\n",
            r#"{"detail":[{"type":"greater_than","loc":["body","max_tokens"],"msg":"Input should be greater than 0"}]}"#,
            422,
            "body.max_tokens: Input should be greater than 0",
        ),
        (
            "HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\n\r\n",
            "Internal Server Error",
            500,
            "Internal Server Error",
        ),
    ];
    for (head, body, status, message) in cases {
        // The FastAPI answer says its length (uvicorn); the others end at the close.
        let head = if head.ends_with("\r\n\r\n") {
            head.to_string()
        } else {
            format!("{head}content-length: {}\r\n\r\n", body.len())
        };
        let (url, heads) = raw_backend(format!("{head}{body}").into_bytes()).await;
        let gw = gateway(&one_model_yaml(&url, 1, 4)).await;
        let mut request = chat(true, json!({}));
        request["max_tokens"] = json!(3);
        let r = client()
            .post(gw.url("/v1/chat/completions"))
            .header("accept-encoding", "gzip, br")
            .json(&request)
            .send()
            .await
            .expect("send");
        assert_eq!(r.status().as_u16(), status);
        assert_eq!(r.version(), reqwest::Version::HTTP_11);
        let e: Value = r.json().await.expect("an OpenAI error body");
        assert_eq!(e["error"]["message"], message, "{e}");
        let kind = if status < 500 { "invalid_request_error" } else { "backend_error" };
        assert_eq!(e["error"]["type"], kind);
        assert!(e["error"].get("param").is_some() && e["error"].get("code").is_some());
        let outcome_label = if status < 500 { "backend_rejected" } else { "backend_error" };
        assert_eq!(outcome(&gw, "local", outcome_label).await, 1.0);
        let sent = heads.lock().expect("lock").join("\n").to_ascii_lowercase();
        assert!(sent.contains("accept-encoding: identity"), "{sent}");
        assert!(!sent.contains("gzip"), "{sent}");
    }
}

#[tokio::test]
async fn a_body_announced_over_max_body_is_refused_from_its_header() {
    let sim = sim().await;
    let gw = gateway(&format!("max_body: 1MiB\n{}", one_model_yaml(&sim.url(), 1, 4))).await;
    let mut tcp = TcpStream::connect(gw.addr).await.expect("connect");
    let request = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                   Content-Length: 67108864\r\nExpect: 100-continue\r\n\r\n";
    tcp.write_all(request.as_bytes()).await.expect("write");
    let mut seen = Vec::new();
    let mut chunk = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("request_too_large") {
        let n = tcp.read(&mut chunk).await.expect("read");
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&seen);
    assert!(text.starts_with("HTTP/1.1 413"), "no 100 Continue first, no body read: {text}");
    assert_eq!(sim_stats(&sim).await["total"], 0);
}

#[tokio::test]
async fn refusals_before_a_route_is_known_are_counted_without_client_text() {
    let sim = sim().await;
    let gw = gateway(&one_model_yaml(&sim.url(), 1, 4)).await;
    let r = client().post(gw.url("/v1/chat/completions")).body("{not json").send().await.expect("send");
    assert_eq!(r.status(), 400);
    let r = post(&gw, "/v1/chat/completions", &json!({"model": "gpt-secret-name", "messages": []})).await;
    assert_eq!(r.status(), 404);
    let r = client().get(gw.url("/v1/nothing-here")).send().await.expect("send");
    assert_eq!(r.status(), 404);
    let series =
        "mlxgate_requests_total{backend=\"\",client=\"anonymous\",model=\"\",outcome=\"invalid_request_error\"}";
    assert_eq!(metric(&gw, series).await, Some(3.0));
    let text = client().get(gw.url("/metrics")).send().await.expect("send").text().await.expect("text");
    assert!(!text.contains("gpt-secret-name"), "a client's model name never becomes a label");
}

#[tokio::test]
async fn a_client_that_leaves_while_queued_is_counted_as_client_closed() {
    let sim = sim().await;
    let gw = gateway(&one_model_yaml(&sim.url(), 1, 4)).await;
    let mut held = post(&gw, "/v1/chat/completions", &chat(true, json!({"hold_after": 1, "hold_key": "q"}))).await;
    read_until(&mut held, "t0 ").await;
    let waiting = tokio::spawn({
        let url = gw.url("/v1/chat/completions");
        async move { client().post(url).json(&chat(false, json!({}))).send().await }
    });
    eventually("one waiting", || async { metric(&gw, "mlxgate_queue_depth{model=\"qwen\"}").await == Some(1.0) }).await;
    waiting.abort();
    let _ = waiting.await;
    eventually("client_closed counted", || async { outcome(&gw, "local", "client_closed").await == 1.0 }).await;
    client().post(format!("{}/sim/release/q", sim.url())).send().await.expect("release");
    assert!(text_of(held).await.contains("[DONE]"));
    assert_eq!(outcome(&gw, "local", "ok").await, 1.0);
}

#[tokio::test]
async fn a_cut_multi_choice_stream_is_no_success_even_after_one_choice_finished() {
    // n=2 over HTTP/1.0: choice 0 finishes, choice 1 is cut by the close.
    let event = |i: u32, finish: &str| {
        format!(
            "data: {{\"choices\":[{{\"index\":{i},\"delta\":{{\"content\":\"x\"}},\"finish_reason\":{finish}}}]}}\n\n"
        )
    };
    let answer = format!(
        "HTTP/1.0 200 OK\r\nContent-type: text/event-stream\r\n\r\n{}{}{}{}",
        event(0, "null"),
        event(1, "null"),
        event(0, "\"stop\""),
        event(1, "null")
    );
    let (url, _) = raw_backend(answer.into_bytes()).await;
    let gw = gateway(&one_model_yaml(&url, 1, 4)).await;
    let mut body = chat(true, json!({}));
    body["n"] = json!(2);
    let text = text_of(post(&gw, "/v1/chat/completions", &body).await).await;
    assert_eq!(last_event(&text)["error"]["type"], "backend_error", "{text}");
    assert_eq!(outcome(&gw, "local", "ok").await, 0.0);
}

#[tokio::test]
async fn an_sse_answer_with_a_content_length_reaches_the_client_whole_less_the_usage_chunk() {
    let events = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\n\
                  data: {\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n";
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{events}",
        events.len()
    );
    let (url, _) = raw_backend(answer.into_bytes()).await;
    let gw = gateway(&one_model_yaml(&url, 1, 4)).await;
    let r = post(&gw, "/v1/chat/completions", &chat(true, json!({}))).await;
    assert!(r.headers().get("content-length").is_none(), "{:?}", r.headers());
    let text = text_of(r).await;
    assert!(text.contains("\"hi\"") && text.contains("data: [DONE]"), "{text}");
    assert!(!text.contains("usage"), "the client did not ask for usage: {text}");
    assert_eq!(outcome(&gw, "local", "ok").await, 1.0);
}

#[tokio::test]
async fn a_body_that_never_arrives_gets_408_and_frees_the_connection() {
    let sim = sim().await;
    let gw = gateway(&format!("body_read_timeout: 1s\n{}", one_model_yaml(&sim.url(), 1, 4))).await;
    let mut tcp = TcpStream::connect(gw.addr).await.expect("connect");
    let head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{";
    tcp.write_all(head.as_bytes()).await.expect("write");
    let mut seen = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match tcp.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => seen.extend_from_slice(&chunk[..n]),
        }
    }
    let text = String::from_utf8_lossy(&seen);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.to_ascii_lowercase().contains("connection: close"), "{text}");
    assert!(text.contains("request_timeout"), "{text}");
    let series =
        "mlxgate_requests_total{backend=\"\",client=\"anonymous\",model=\"\",outcome=\"invalid_request_error\"}";
    assert_eq!(metric(&gw, series).await, Some(1.0));
}

#[tokio::test]
async fn a_backend_silent_after_done_is_a_success_not_a_stall() {
    let events = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\n\
                  data: [DONE]\n\n";
    // Chunked, and the last chunk never comes.
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{events}\r\n",
        events.len()
    );
    let (url, _) = raw_backend_closing(answer.into_bytes(), false).await;
    let yaml = format!(
        "backends:\n  local: {{url: '{url}', stream_idle_timeout: 1s}}\nmodels:\n  qwen: {{backend: local, max_wait: 60s}}\n"
    );
    let gw = gateway(&yaml).await;
    let text = text_of(post(&gw, "/v1/chat/completions", &chat(true, json!({}))).await).await;
    assert!(text.contains("data: [DONE]"), "{text}");
    assert!(!text.contains("\"error\""), "no error event after a complete answer: {text}");
    assert_eq!(outcome(&gw, "local", "ok").await, 1.0);
}
