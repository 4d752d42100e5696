//! The Messages face in front of a real mlx_lm.server (the tiny model with Qwen3's real chat
//! template, so that tools, tool calls and tool results are rendered), through a recording
//! proxy that keeps every chat body the server received:
//!
//! - the official anthropic Python SDK (`.venv-agents`, pinned by scripts/setup-agents):
//!   `messages.create`, `messages.stream` (its accumulator takes every event, and at temperature
//!   0 its final message has the same content blocks and text as the non-streamed answer), a
//!   request with a tool definition accepted, and `messages.count_tokens` equal to
//!   `transformers`' count of the prompt, computed from the Anthropic request translated by hand
//!   in this test (`apply_chat_template(messages, tools=…, add_generation_prompt=True)`);
//! - a recorded-shape Claude Code conversation (tests/data/claude-code-replay.json: the billing
//!   line with a new `cc_version` suffix and `cch=` nonce on every request, the system prompt
//!   with `cache_control`, 4 tools, 10 tool turns) replayed streamed as Claude Code sends it: no
//!   billing text reaches the server, each body's `messages` are a byte-prefix of the next
//!   one's (and the tools the same bytes), each rendered prompt a prefix of the next, and the
//!   server's prompt cache (`cache_read_input_tokens`) covers at least the previous request's
//!   whole prompt — the re-rendered assistant turn starts right where that prompt ended (it
//!   ends with the generation prompt) — and no more than the prompt plus the tokens generated
//!   after it, which is all the cache held; `count_tokens` of each request is the prompt the
//!   server counted (`input_tokens + cache_read_input_tokens`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use crate::common::*;
use mlxgate::tokens::ChatPrompt;
use mlxgate::tokens::counter::Counter;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Far over the tiny model's 2048 positions: mlx_lm.server does not check them, and the
/// replay's prompts reach ~8k tokens.
const CAP: usize = 32768;

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

async fn mlx_lm_server(model: &Path, hf_cache: &Path) -> Server {
    let port = free_port();
    let child = Command::new(format!("{ROOT}/.venv-mlx-lm/bin/mlx_lm.server"))
        .args(["--model", &model.display().to_string(), "--host", "127.0.0.1", "--port", &port.to_string()])
        .env("HF_HUB_CACHE", hf_cache)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("mlx_lm.server starts");
    let server = Server { child, url: format!("http://127.0.0.1:{port}") };
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
                        if n == 0 {
                            break;
                        }
                        log.lock().unwrap()[index].extend_from_slice(&buf[..n]);
                        if wo.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
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
    /// The bodies of every request received so far, as sent.
    fn bodies(&self) -> Vec<Vec<u8>> {
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
                let to = (end + 4 + length).min(rest.len());
                bodies.push(rest[end + 4..to].to_vec());
                rest = &rest[to..];
            }
        }
        bodies
    }
}

struct Setup {
    _server: Server,
    _dir: tempfile::TempDir,
    recorder: Recorder,
    model: PathBuf,
    gw: Gateway,
}

/// mlx_lm.server with the Qwen3-templated tiny model, the recorder in front of it and a gateway
/// in front of that: model `qwen`, counted with the same model directory.
async fn setup() -> Option<Setup> {
    let tiny = prerequisites(&["mlx-lm"])?;
    let dir = tempfile::tempdir().expect("tempdir");
    let model = dir.path().join("model");
    let hf_cache = dir.path().join("hf");
    std::fs::create_dir_all(&model).expect("mkdir");
    std::fs::create_dir_all(&hf_cache).expect("mkdir");
    model_with_qwen3_template(&tiny, &model);
    let server = mlx_lm_server(&model, &hf_cache).await;
    let recorder = recorder(&server.url).await;
    let yaml = format!(
        "backends:\n  native: {{url: '{}', kind: mlx-lm, context_cap: {CAP}, max_concurrency: 1}}\n\
         models:\n  qwen: {{backend: native, upstream_model: '{}', tokenizer: '{}', max_wait: 600s}}\n",
        recorder.url,
        model.display(),
        model.display()
    );
    let gw = gateway(&yaml).await;
    Some(Setup { _server: server, _dir: dir, recorder, model, gw })
}

/// Runs `script` with `python` and `args`; its stdout as JSON (a failure shows its stderr).
async fn run_python(python: PathBuf, script: &'static str, args: Vec<String>) -> Value {
    let output = tokio::task::spawn_blocking(move || Command::new(python).arg("-c").arg(script).args(args).output())
        .await
        .expect("joined")
        .expect("python runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the script failed:\n{stderr}");
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stderr}"))
}

/// The Python with transformers: `.venv-tokens` (scripts/setup-backends tokens), else the
/// mlx-lm venv's (mlx_lm depends on transformers).
fn transformers_python() -> PathBuf {
    let tokens = Path::new(ROOT).join(".venv-tokens/bin/python");
    if tokens.exists() { tokens } else { Path::new(ROOT).join(".venv-mlx-lm/bin/python") }
}

/// The request whose tokens the SDK counts: Claude Code's shape in small (billing block,
/// system blocks with `cache_control`, a tool, a tool round trip, thinking on).
fn counted_request() -> Value {
    json!({
        "model": "qwen",
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=cli; cch=4f2a9;"},
            {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Answer briefly.\nUse the tools.", "cache_control": {"type": "ephemeral"}},
        ],
        "tools": [
            {"name": "Bash", "description": "Runs a shell command.",
             "input_schema": {"type": "object", "properties": {"command": {"type": "string", "description": "The command"},
                                                              "timeout": {"type": "number"}},
                              "required": ["command"], "additionalProperties": false}},
            {"name": "Read", "description": "Reads a file.",
             "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}},
        ],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>\nBe careful.\n</system-reminder>\n"},
                                         {"type": "text", "text": "What is in the project?"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "ls -la", "timeout": 5000}},
                {"type": "tool_use", "id": "toolu_02", "name": "Read", "input": {"file_path": "/p/README.md"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "README.md\nsrc"},
                {"type": "tool_result", "tool_use_id": "toolu_02", "content": [{"type": "text", "text": "# Project"},
                                                                                 {"type": "text", "text": "A parser."}]},
                {"type": "text", "text": "Summarise it."}]},
        ],
    })
}

/// The anthropic SDK against the gateway: create, stream, a tool definition, count_tokens.
const SDK_SCRIPT: &str = r#"
import json, sys
import anthropic

base_url, counted = sys.argv[1], json.loads(sys.argv[2])
client = anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=300.0)
out = {"version": anthropic.__version__}
# This SDK has no `temperature` argument: sent in the body (the Messages API takes it).
request = dict(model="qwen", max_tokens=12, extra_body={"temperature": 0}, system="You are brief.",
               messages=[{"role": "user", "content": "Say hello to the gateway."}])

whole = client.messages.create(**request)
out["whole"] = whole.model_dump(mode="json")

with client.messages.stream(**request) as stream:
    out["stream_events"] = [event.type for event in stream]
    final = stream.get_final_message()
out["final"] = final.model_dump(mode="json")

tools = counted["tools"]
with_tool = client.messages.create(model="qwen", max_tokens=12, extra_body={"temperature": 0}, tools=tools,
                                   tool_choice={"type": "auto"},
                                   messages=[{"role": "user", "content": "Run ls."}])
out["with_tool"] = with_tool.model_dump(mode="json")

counted_answer = client.messages.count_tokens(**{k: v for k, v in counted.items()})
out["count_tokens"] = counted_answer.input_tokens
print(json.dumps(out))
"#;

/// transformers' count of a Messages request's prompt, the request translated by hand into
/// the chat messages a chat completions server renders: the system blocks without the billing
/// line joined by a blank line, a user message's text blocks joined by a blank line after its
/// tool results (each a `tool` message, list contents joined by a newline), an assistant's text
/// and its `tool_use` blocks as `tool_calls` (arguments as objects, as mlx_lm.server passes
/// them), tools as functions, `thinking` as `enable_thinking`.
const TRANSFORMERS_SCRIPT: &str = r#"
import json, sys
from transformers import AutoTokenizer

model_dir, request = sys.argv[1], json.loads(sys.argv[2])
system = request.get("system", [])
if isinstance(system, str):
    system = [{"type": "text", "text": system}]
texts = [b["text"] for b in system if not b["text"].startswith("x-anthropic-billing-header:")]
messages = [{"role": "system", "content": "\n\n".join(texts)}] if texts else []
for message in request["messages"]:
    content = message["content"]
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if message["role"] == "assistant":
        text = "".join(b["text"] for b in content if b["type"] == "text")
        calls = [{"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": b["input"]}}
                 for b in content if b["type"] == "tool_use"]
        chat = {"role": "assistant", "content": text}
        if calls:
            chat["tool_calls"] = calls
        messages.append(chat)
        continue
    parts = []
    for block in content:
        if block["type"] == "tool_result":
            result = block["content"]
            if isinstance(result, list):
                result = "\n".join(b["text"] for b in result)
            messages.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": result})
        else:
            parts.append(block["text"])
    if parts:
        messages.append({"role": "user", "content": "\n\n".join(parts)})
tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                           "parameters": t["input_schema"]}} for t in request.get("tools", [])]
kwargs = {}
thinking = (request.get("thinking") or {}).get("type")
if thinking in ("enabled", "adaptive"):
    kwargs["enable_thinking"] = True
elif thinking == "disabled":
    kwargs["enable_thinking"] = False
tokenizer = AutoTokenizer.from_pretrained(model_dir)
ids = tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=True, **kwargs)
if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
    ids = ids["input_ids"]
print(json.dumps({"tokens": len(ids)}))
"#;

#[tokio::test]
async fn the_anthropic_sdk_creates_streams_offers_tools_and_counts_as_transformers_does() {
    let Some(python) = openai_sdk_python(".venv-agents", "scripts/setup-agents") else { return };
    let Some(setup) = setup().await else { return };
    let base_url = setup.gw.url("");
    let counted = counted_request();
    let seen = run_python(python, SDK_SCRIPT, vec![base_url, counted.to_string()]).await;
    eprintln!("anthropic {}", seen["version"]);

    // create and stream: the same message at temperature 0.
    let (whole, last) = (&seen["whole"], &seen["final"]);
    assert_eq!(whole["type"], "message", "{whole}");
    assert_eq!(whole["role"], "assistant");
    assert_eq!(whole["model"], "qwen");
    let shape = |m: &Value| -> Vec<(String, String)> {
        let blocks = m["content"].as_array().unwrap_or_else(|| panic!("no content: {m}"));
        blocks
            .iter()
            .map(|b| (b["type"].as_str().unwrap_or("").into(), b["text"].as_str().unwrap_or("").into()))
            .collect()
    };
    assert!(!shape(whole).is_empty(), "{whole}");
    assert_eq!(shape(whole), shape(last), "the streamed message differs from the whole one:\n{whole}\n{last}");
    assert_eq!(whole["stop_reason"], last["stop_reason"]);
    assert!(["end_turn", "max_tokens"].contains(&whole["stop_reason"].as_str().unwrap_or("")), "{whole}");
    assert_eq!(whole["usage"]["output_tokens"], last["usage"]["output_tokens"]);
    let events: Vec<&str> =
        seen["stream_events"].as_array().expect("events").iter().filter_map(Value::as_str).collect();
    assert_eq!(events.first(), Some(&"message_start"), "{events:?}");
    assert_eq!(events.last(), Some(&"message_stop"), "{events:?}");
    assert!(events.contains(&"content_block_start") && events.contains(&"content_block_stop"), "{events:?}");

    // A tool offered is accepted (the tiny model rarely calls it).
    let with_tool = &seen["with_tool"];
    assert_eq!(with_tool["type"], "message", "{with_tool}");
    for block in with_tool["content"].as_array().expect("content") {
        assert!(["text", "tool_use", "thinking"].contains(&block["type"].as_str().unwrap_or("")), "{block}");
    }
    let bodies = setup.recorder.bodies();
    let offered = bodies
        .iter()
        .filter_map(|b| serde_json::from_slice::<Value>(b).ok())
        .find(|b| b.get("tools").is_some())
        .expect("the request with the tool reached the server");
    assert_eq!(offered["tools"][0]["function"]["name"], "Bash", "{offered}");
    assert_eq!(offered["tool_choice"], "auto", "{offered}");
    let first: Value = serde_json::from_slice(&bodies[0]).expect("json");
    assert_eq!(first["temperature"], json!(0), "{first}");

    // count_tokens: transformers' own count of the prompt, translated by hand.
    let reference = run_python(
        transformers_python(),
        TRANSFORMERS_SCRIPT,
        vec![setup.model.display().to_string(), counted.to_string()],
    )
    .await;
    eprintln!("count_tokens {}, transformers {}; text {:?}", seen["count_tokens"], reference["tokens"], shape(whole));
    assert_eq!(seen["count_tokens"], reference["tokens"], "count_tokens vs transformers");
    // Nothing reached the server for the count: create, stream, the tool request.
    assert_eq!(bodies.len(), 3, "{} bodies", bodies.len());
}

/// The replay's requests, first to last (request n has the conversation's first n turns),
/// each with a fresh billing line, streamed as Claude Code sends them, asking for 8 tokens.
fn replay_requests() -> Vec<Value> {
    let text = std::fs::read_to_string(Path::new(ROOT).join("tests/data/claude-code-replay.json")).expect("data");
    let data: Value = serde_json::from_str(&text).expect("json");
    let turns = data["turns"].as_array().expect("turns");
    let mut messages = data["messages"].as_array().expect("messages").clone();
    let mut requests = Vec::new();
    for n in 0..=turns.len() {
        if n > 0 {
            messages.extend(turns[n - 1].as_array().expect("turn").iter().cloned());
        }
        let mut body = data.clone();
        let body_map = body.as_object_mut().expect("object");
        body_map.retain(|key, _| !key.starts_with('_') && key != "turns");
        let line = data["system"][0]["text"].as_str().expect("billing line");
        let line = line
            .replace("{VERSION}", &format!("{:03x}", 0x0b8 + n * 7))
            .replace("{NONCE}", &format!("{:05x}", n * 48271 % 1048576));
        body["system"][0]["text"] = Value::from(line);
        body["messages"] = Value::Array(messages.clone());
        // A local model's name, as docs/agents.md advises for Claude Code's main model.
        body["model"] = json!("qwen");
        body["max_tokens"] = json!(8);
        body["temperature"] = json!(0);
        body["stream"] = json!(true);
        requests.push(body);
    }
    requests
}

/// What one streamed answer said: its usage (message_start's, then message_delta's over it)
/// and its event names.
fn read_stream(text: &str) -> (Value, Vec<String>) {
    let mut usage = serde_json::Map::new();
    let mut events = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let name = block.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or_default().to_string();
        let Some(data) = block.lines().find_map(|l| l.strip_prefix("data: ")) else { continue };
        let data: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"));
        let found = match name.as_str() {
            "message_start" => data["message"]["usage"].as_object().cloned(),
            "message_delta" => data["usage"].as_object().cloned(),
            _ => None,
        };
        for (key, value) in found.into_iter().flatten().filter(|(_, v)| !v.is_null()) {
            usage.insert(key, value);
        }
        events.push(name);
    }
    (Value::Object(usage), events)
}

/// A chat body's `messages` and `tools` as the raw JSON text the server received.
fn raw_fields(body: &[u8]) -> (String, String) {
    let fields: std::collections::HashMap<String, Box<RawValue>> = serde_json::from_slice(body).expect("a JSON body");
    let get = |key: &str| fields.get(key).map(|v| v.get().to_string()).unwrap_or_default();
    (get("messages"), get("tools"))
}

#[tokio::test]
async fn a_claude_code_conversation_reaches_the_server_with_growing_prefixes_and_hits_its_cache() {
    let Some(setup) = setup().await else { return };
    let requests = replay_requests();
    let mut turns = Vec::new();
    for (n, request) in requests.iter().enumerate() {
        let mut count_body = request.clone();
        for key in ["stream", "max_tokens", "temperature"] {
            count_body.as_object_mut().expect("object").remove(key);
        }
        let r = post(&setup.gw, "/v1/messages/count_tokens", &count_body).await;
        let counted: Value = r.json().await.expect("json");
        let r = client()
            .post(setup.gw.url("/v1/messages?beta=true"))
            .header("anthropic-version", "2023-06-01")
            .header("anthropic-beta", "claude-code-20250219,interleaved-thinking-2025-05-14")
            .header("x-api-key", "unused")
            .json(request)
            .send()
            .await
            .expect("send");
        let status = r.status();
        let text = text_of(r).await;
        assert_eq!(status, 200, "request {n}: {text}");
        let (usage, events) = read_stream(&text);
        assert_eq!(events.first().map(String::as_str), Some("message_start"), "request {n}: {text}");
        assert_eq!(events.last().map(String::as_str), Some("message_stop"), "request {n}: {text}");
        let input = usage["input_tokens"].as_u64().unwrap_or_else(|| panic!("request {n}: no input_tokens: {text}"));
        let cached = usage["cache_read_input_tokens"].as_u64().unwrap_or(0);
        let output = usage["output_tokens"].as_u64().unwrap_or(0);
        let prompt = input + cached;
        eprintln!(
            "request {n}: prompt {prompt}, cached {cached}, prefilled {input}, output {output}, counted {counted}"
        );
        // The gateway's count is the server's.
        assert_eq!(counted["input_tokens"].as_u64(), Some(prompt), "request {n}: count_tokens vs the server");
        turns.push((prompt, cached, output));
    }

    let bodies = setup.recorder.bodies();
    assert_eq!(bodies.len(), requests.len(), "one chat body per request (count_tokens sends none)");
    let counter = Counter::load(&setup.model).expect("tokenizer");
    let mut previous: Option<(String, String, String)> = None;
    for (n, body) in bodies.iter().enumerate() {
        let text = String::from_utf8_lossy(body);
        for billing in ["x-anthropic-billing-header", "cc_version", "cch=", "cache_control"] {
            assert!(!text.contains(billing), "request {n}: {billing:?} reached the server");
        }
        let (messages, tools) = raw_fields(body);
        let chat: Value = serde_json::from_slice(body).expect("json");
        let rendered = counter
            .render(ChatPrompt {
                messages: chat["messages"].as_array().expect("messages"),
                tools: chat["tools"].as_array().map(Vec::as_slice),
                template_kwargs: chat["chat_template_kwargs"].as_object(),
            })
            .expect("renders");
        if let Some((before_messages, before_tools, before_rendered)) = &previous {
            // The same bytes, extended: the messages array without its closing bracket...
            let open = &before_messages[..before_messages.len() - 1];
            assert!(
                messages.starts_with(open) && messages[open.len()..].starts_with(','),
                "request {n}: the messages are not the previous ones extended:\n{before_messages}\n{messages}"
            );
            assert_eq!(&tools, before_tools, "request {n}: the tools changed");
            // ...and the prompt the template renders from them: the previous one, ending with the
            // generation prompt, is where this one's assistant turn starts.
            assert!(
                rendered.starts_with(before_rendered.as_str()),
                "request {n}: the rendered prompt is not an extension"
            );
        }
        previous = Some((messages, tools, rendered));
    }

    // The server's cache: each request's prompt covers the previous one whole (where the
    // re-rendered assistant turn starts), and no more than what the cache held (that prompt
    // and the tokens generated after it, which the scripted assistant turn does not repeat).
    for n in 1..turns.len() {
        let (prompt, cached, _) = turns[n];
        let (before, _, generated) = turns[n - 1];
        assert!(cached >= before, "request {n}: cached {cached} < the previous prompt {before}");
        assert!(cached <= before + generated, "request {n}: cached {cached} > {before} + {generated}");
        assert!(prompt > before, "request {n}: the prompt did not grow");
    }
}
