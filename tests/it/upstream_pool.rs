//! The backend connections as a backend sees them (`backend/upstream/pool.rs`): a raw HTTP/1.1
//! server here counts the connections the gateway opens and records what each request says, so
//! keep-alive reuse, a server's close of an idle connection, a client that hangs up at `[DONE]`,
//! a URL's path and the `Host` header are checked on the wire, not in the gateway's own picture.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::common::*;

/// What the raw server saw.
#[derive(Default)]
struct Seen {
    connections: AtomicUsize,
    /// Each request's target and `Host`.
    requests: std::sync::Mutex<Vec<(String, String)>>,
}

/// A raw HTTP/1.1 backend: a whole chat answer or a chunked stream of three content events and
/// `[DONE]`, kept alive; with `close_after`, it closes each connection that long after its
/// answer (without saying so: the race of a server's idle close); with `tail`, a stream's last
/// chunk (the chunked body's end) comes that long after `[DONE]`.
async fn raw_backend(close_after: Option<Duration>, tail: Option<Duration>) -> (String, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let seen = Arc::new(Seen::default());
    let shared = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            shared.connections.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve_connection(tcp, Arc::clone(&shared), close_after, tail));
        }
    });
    (url, seen)
}

async fn serve_connection(mut tcp: TcpStream, seen: Arc<Seen>, close_after: Option<Duration>, tail: Option<Duration>) {
    let mut buffer = Vec::new();
    loop {
        let head_end = loop {
            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            let mut chunk = [0u8; 4096];
            match tcp.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_string();
        let header = |name: &str| {
            head.lines()
                .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.trim()))
                .unwrap_or("")
                .to_string()
        };
        let length: usize = header("content-length").parse().unwrap_or(0);
        while buffer.len() < head_end + length {
            let mut chunk = [0u8; 4096];
            match tcp.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        let body = String::from_utf8_lossy(&buffer[head_end..head_end + length]).to_string();
        buffer.drain(..head_end + length);
        let target = head.split_whitespace().nth(1).unwrap_or("").to_string();
        seen.requests.lock().expect("seen").push((target, header("host")));
        let answer = if body.contains("\"stream\":true") {
            let mut out = String::from(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
            );
            let mut events: Vec<String> = ["a", "b", "c"]
                .iter()
                .map(|t| format!("data: {}\n\n", json!({"id": "x", "model": "m", "choices": [{"index": 0, "delta": {"content": t}, "finish_reason": null}]})))
                .collect();
            events.push(format!("data: {}\n\n", json!({"id": "x", "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}})));
            events.push("data: [DONE]\n\n".to_string());
            for event in events {
                out.push_str(&format!("{:x}\r\n{event}\r\n", event.len()));
            }
            if let Some(tail) = tail {
                if tcp.write_all(out.as_bytes()).await.is_err() {
                    return;
                }
                tokio::time::sleep(tail).await;
                out = String::new();
            }
            out.push_str("0\r\n\r\n");
            out
        } else {
            let whole = json!({"id": "x", "object": "chat.completion", "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})
            .to_string();
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{whole}",
                whole.len()
            )
        };
        if tcp.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
        if let Some(after) = close_after {
            tokio::time::sleep(after).await;
            return;
        }
    }
}

fn config(url: &str) -> String {
    format!("backends:\n  raw: {{url: '{url}'}}\nmodels:\n  m: {{backend: raw}}\n")
}

/// Status and body of a chat request through the gateway.
async fn chat_through(gw: &Gateway, body: &serde_json::Value) -> (u16, String) {
    let response = client().post(gw.url("/v1/chat/completions")).json(body).send().await.expect("send");
    (response.status().as_u16(), response.text().await.expect("text"))
}

fn body(stream: bool) -> serde_json::Value {
    json!({"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
}

#[tokio::test]
async fn sequential_requests_reuse_one_connection_whole_and_streamed() {
    let (url, seen) = raw_backend(None, None).await;
    let gw = gateway(&config(&url)).await;
    let client = client();
    for i in 0..40 {
        let response = client.post(gw.url("/v1/chat/completions")).json(&body(i % 2 == 1)).send().await.expect("send");
        assert_eq!(response.status(), 200);
        let text = response.text().await.expect("text");
        assert!(text.contains("\"model\":\"m\""), "{text}");
    }
    assert_eq!(seen.requests.lock().expect("seen").len(), 40);
    assert_eq!(seen.connections.load(Ordering::SeqCst), 1, "every request on the one kept-alive connection");
}

#[tokio::test]
async fn a_server_that_closes_idle_connections_costs_no_request() {
    let (url, seen) = raw_backend(Some(Duration::from_millis(20)), None).await;
    let gw = gateway(&config(&url)).await;
    for i in 0..12 {
        let (status, text) = chat_through(&gw, &body(i % 2 == 1)).await;
        assert_eq!(status, 200, "request {i}: {text}");
        // Past the server's close: the next request finds the connection closed at checkout.
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    assert_eq!(seen.connections.load(Ordering::SeqCst), 12, "a new connection after each close");
}

#[tokio::test]
async fn a_client_that_hangs_up_at_done_leaves_the_connection_reusable() {
    // The body's end comes 200 ms after `[DONE]`: the client is gone by then.
    let (url, seen) = raw_backend(None, Some(Duration::from_millis(200))).await;
    let gw = gateway(&config(&url)).await;
    for _ in 0..5 {
        let mut response = client().post(gw.url("/v1/chat/completions")).json(&body(true)).send().await.expect("send");
        let mut text = String::new();
        while !text.contains("[DONE]") {
            let chunk = response.chunk().await.expect("chunk").expect("more");
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
        drop(response);
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let (status, _) = chat_through(&gw, &body(false)).await;
    assert_eq!(status, 200);
    assert!(
        seen.connections.load(Ordering::SeqCst) <= 2,
        "{} connections for 6 requests",
        seen.connections.load(Ordering::SeqCst)
    );
}

#[tokio::test]
async fn a_urls_path_is_kept_and_host_names_the_backend() {
    let (url, seen) = raw_backend(None, None).await;
    let gw = gateway(&config(&format!("{url}/prefix/"))).await;
    let (status, text) = chat_through(&gw, &body(false)).await;
    assert_eq!(status, 200, "{text}");
    let requests = seen.requests.lock().expect("seen").clone();
    let authority = url.trim_start_matches("http://");
    assert_eq!(requests, [("/prefix/v1/chat/completions".to_string(), authority.to_string())]);
}
