//! Context caps in front of a real mlx_lm.server (tiny model, a small cap): reject gives
//! OpenAI's body and the `openai` Python SDK raises `BadRequestError` with code
//! `context_length_exceeded`; middle-out and chunk succeed, and a recording proxy between the
//! gateway and the server shows that no request it received was over the cap — counted with the
//! tokenizer, and cross-checked with the server's own `usage.prompt_tokens`.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use crate::common::*;
use mlxgate::tokens::counter::Counter;
use mlxgate::tokens::{ChatPrompt, Count};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const CAP: usize = 200;

/// mlx_lm.server on a free port, killed when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn mlx_lm_server(model: &Path) -> Server {
    let port = free_port();
    let child = Command::new(format!("{ROOT}/.venv-mlx-lm/bin/mlx_lm.server"))
        .args(["--model", &model.display().to_string(), "--host", "127.0.0.1", "--port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("mlx_lm.server starts");
    let url = format!("http://127.0.0.1:{port}");
    let server = Server { child, url };
    let warm =
        json!({"model": model.display().to_string(), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    eventually("mlx_lm.server answers a completion", || {
        let url = format!("{}/v1/chat/completions", server.url);
        let warm = warm.clone();
        async move { client().post(url).json(&warm).send().await.is_ok_and(|r| r.status().is_success()) }
    })
    .await;
    server
}

/// A TCP proxy that records every byte the gateway sends to the server.
struct Recorder {
    url: String,
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
}

async fn recorder(upstream: &str) -> Recorder {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let seen: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let target = upstream.trim_start_matches("http://").to_string();
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let target = target.clone();
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let Ok(outbound) = TcpStream::connect(&target).await else { return };
                let (mut ri, mut wi) = inbound.into_split();
                let (mut ro, mut wo) = outbound.into_split();
                let index = {
                    let mut log = log.lock().unwrap();
                    log.push(Vec::new());
                    log.len() - 1
                };
                let up = async {
                    let mut buf = vec![0u8; 65536];
                    while let Ok(n) = ri.read(&mut buf).await {
                        if n == 0 || wo.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        log.lock().unwrap()[index].extend_from_slice(&buf[..n]);
                    }
                    let _ = wo.shutdown().await;
                };
                let down = async {
                    let _ = tokio::io::copy(&mut ro, &mut wi).await;
                    let _ = wi.shutdown().await;
                };
                tokio::join!(up, down);
            });
        }
    });
    Recorder { url, seen }
}

impl Recorder {
    /// The JSON bodies of every request received so far.
    fn bodies(&self) -> Vec<Value> {
        let log = self.seen.lock().unwrap();
        let mut bodies = Vec::new();
        for connection in log.iter() {
            let mut rest = &connection[..];
            while let Some(end) = rest.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&rest[..end]).to_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                let body = &rest[end + 4..(end + 4 + length).min(rest.len())];
                if let Ok(v) = serde_json::from_slice(body) {
                    bodies.push(v);
                }
                rest = &rest[(end + 4 + length).min(rest.len())..];
            }
        }
        bodies
    }
}

fn words(n: usize, seed: usize) -> String {
    const W: [&str; 10] =
        ["model", "token", "stream", "server", "gateway", "queue", "request", "answer", "cache", "swap"];
    (0..n).map(|i| W[(i * 3 + seed) % W.len()]).collect::<Vec<_>>().join(" ")
}

fn tokens_of(counter: &Counter, request: &Value) -> usize {
    let messages = request["messages"].as_array().expect("messages");
    counter.chat_tokens(ChatPrompt { messages, tools: None, template_kwargs: None }).expect("renders")
}

struct Setup {
    _server: Server,
    recorder: Recorder,
    model: std::path::PathBuf,
}

async fn setup() -> Option<Setup> {
    let model = prerequisites(&["mlx-lm"])?;
    let server = mlx_lm_server(&model).await;
    let recorder = recorder(&server.url).await;
    Some(Setup { _server: server, recorder, model })
}

fn yaml(s: &Setup, on_overflow: &str, cap: usize) -> String {
    format!(
        "backends:\n  native: {{url: '{}', context_cap: {cap}, max_concurrency: 2}}\n\
         models:\n  qwen: {{backend: native, upstream_model: '{}', tokenizer: '{}', on_overflow: {on_overflow}, \
         default_max_tokens: 16}}\n",
        s.recorder.url,
        s.model.display(),
        s.model.display()
    )
}

#[tokio::test]
async fn mlx_lm_server_behind_a_small_cap() {
    let Some(s) = setup().await else { return };
    let counter = Counter::load(&s.model).expect("tokenizer");

    // reject: the exact body, and the openai SDK's own exception.
    let gw = gateway(&yaml(&s, "reject", CAP)).await;
    let long = vec![json!({"role": "user", "content": words(300, 0)})];
    let prompt = counter.chat_tokens(ChatPrompt { messages: &long, tools: None, template_kwargs: None }).unwrap();
    let response =
        post(&gw, "/v1/chat/completions", &json!({"model": "qwen", "messages": long, "max_tokens": 10})).await;
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "context_length_exceeded");
    assert_eq!(
        body["error"]["message"],
        format!(
            "This model's maximum context length is {CAP} tokens. However, your messages resulted in {prompt} tokens. \
             Please reduce the length of the messages."
        )
    );
    let (base, content) = (gw.url("/v1"), words(300, 0));
    let sdk = tokio::task::spawn_blocking(move || openai_sdk(&base, &content)).await.expect("sdk call");
    assert_eq!(sdk["exception"], "BadRequestError", "{sdk}");
    assert_eq!(sdk["status_code"], 400, "{sdk}");
    assert_eq!(sdk["code"], "context_length_exceeded", "{sdk}");
    assert!(s.recorder.bodies().is_empty(), "nothing reached mlx_lm.server: {:?}", s.recorder.bodies());

    // middle_out: the server gets a prompt under the cap, and its own count agrees with ours.
    let gw = gateway(&yaml(&s, "middle_out", CAP)).await;
    let mut messages =
        vec![json!({"role": "system", "content": "be brief"}), json!({"role": "user", "content": words(20, 1)})];
    for i in 0..10 {
        messages.push(json!({"role": "assistant", "content": words(25, i)}));
        messages.push(json!({"role": "user", "content": words(25, i + 1)}));
    }
    let response =
        post(&gw, "/v1/chat/completions", &json!({"model": "qwen", "messages": messages, "max_tokens": 8})).await;
    assert_eq!(response.status(), 200);
    assert!(response.headers()["x-mlxgate-transform"].to_str().unwrap().starts_with("middle-out; removed_tokens="));
    let answer: Value = response.json().await.expect("json");
    let bodies = s.recorder.bodies();
    assert_eq!(bodies.len(), 1);
    let sent = tokens_of(&counter, &bodies[0]);
    assert!(sent + 8 <= CAP, "{sent} + 8 over {CAP}");
    assert_eq!(answer["usage"]["prompt_tokens"], sent, "mlx_lm.server counted the prompt as the gateway did");

    // An agent's max_tokens (OpenCode: 32000) on a small prompt: served, the limit cut to the
    // room left; the real server stops there and says `length`, with usage to match.
    let gw = gateway(&yaml(&s, "reject", CAP)).await;
    let hello = vec![json!({"role": "user", "content": words(5, 3)})];
    let small = counter.chat_tokens(ChatPrompt { messages: &hello, tools: None, template_kwargs: None }).unwrap();
    let body = json!({"model": "qwen", "messages": hello, "max_tokens": 32000, "temperature": 0});
    let response = post(&gw, "/v1/chat/completions", &body).await;
    assert_eq!(response.status(), 200);
    let room = CAP - small;
    assert_eq!(response.headers()["x-mlxgate-transform"], format!("max_tokens={room}").as_str());
    let answer: Value = response.json().await.expect("json");
    let bodies = s.recorder.bodies();
    assert_eq!(bodies.last().expect("sent")["max_tokens"], room, "mlx_lm.server got the room left");
    let generated = answer["usage"]["completion_tokens"].as_u64().expect("usage") as usize;
    assert!(generated <= room, "{answer}");
    if generated == room {
        assert_eq!(answer["choices"][0]["finish_reason"], "length", "{answer}");
    }
    assert_eq!(answer["usage"]["prompt_tokens"], small, "mlx_lm.server counted the prompt as the gateway did");
    let cut_requests = bodies.len();

    // chunk: every request the server got fits; the streamed reduce ends with [DONE].
    // Map-reduce needs room for the partial answers in the reduce prompt: a larger cap.
    const CHUNK_CAP: usize = 1024;
    let gw = gateway(&yaml(&s, "chunk", CHUNK_CAP)).await;
    let doc = vec![
        json!({"role": "system", "content": "summarise"}),
        json!({"role": "user", "content": format!("summarise: {}", words(3000, 2))}),
    ];
    let response =
        post(&gw, "/v1/chat/completions", &json!({"model": "qwen", "messages": doc, "max_tokens": 16, "stream": true}))
            .await;
    assert_eq!(response.status(), 200);
    let pieces: usize = response.headers()["x-mlxgate-transform"]
        .to_str()
        .unwrap()
        .strip_prefix("chunk; pieces=")
        .expect("chunk header")
        .parse()
        .unwrap();
    assert!(pieces >= 2, "3000 words over a {CHUNK_CAP}-token cap: {pieces} pieces");
    let text = text_of(response).await;
    assert!(text.contains("[DONE]"), "{text}");
    let bodies = s.recorder.bodies();
    assert_eq!(bodies.len(), cut_requests + pieces + 1, "the earlier requests, P maps and the reduce");
    for body in &bodies[cut_requests..] {
        let sent = tokens_of(&counter, body);
        let max_tokens = body["max_tokens"].as_u64().unwrap() as usize;
        assert!(sent + max_tokens <= CHUNK_CAP, "a request over the cap reached the server: {sent} + {max_tokens}");
    }
}

/// The openai Python SDK (from mlx-openai-server's venv) against the gateway: what it raises.
fn openai_sdk(base_url: &str, content: &str) -> Value {
    let python = format!("{ROOT}/.venv-mlx-openai-server/bin/python");
    assert!(Path::new(&python).exists(), "needs .venv-mlx-openai-server (scripts/setup-backends mlx-openai-server)");
    let script = r#"
import json, sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="none", max_retries=0)
try:
    client.chat.completions.create(model="qwen", messages=[{"role": "user", "content": sys.argv[2]}], max_tokens=10)
    print(json.dumps({"exception": None}))
except openai.APIStatusError as e:
    print(json.dumps({"exception": type(e).__name__, "status_code": e.status_code, "code": e.code, "message": e.message}))
"#;
    let out = Command::new(python).args(["-c", script, base_url, content]).output().expect("python runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("json from the script")
}
