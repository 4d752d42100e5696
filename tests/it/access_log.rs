//! The access log, request ids and public model names, through the real `mlxgate serve` binary
//! (its log read line by line) in front of `mlxgate-sim`, whose backend model name is a path on
//! disk: one line per client request on every path (answers whole and streamed, every refusal,
//! unknown URLs, operator endpoints, a map-reduce whose pieces are marked), in JSON and plain
//! text; no line holds a key or the prompt; `x-request-id` echoed or generated and carried by
//! every error body; `model` in answers is the name the client sent. And against a real
//! `mlx_lm.server`: its answers, whole and streamed, name the public model.

use std::collections::HashMap;

use crate::common::*;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const KEY: &str = "sk-accesslog-KEY-7f3a2b91";
const LIMITED_KEY: &str = "sk-accesslog-LIMITED-55c0de";
const WRONG_KEY: &str = "sk-accesslog-WRONG-0b1e";
/// In every prompt sent: no log line may hold it.
const PROMPT: &str = "PROMPT-SECRET-e9f1 hello there";
/// The backend's own name for the model: a path, which clients must never see.
const UPSTREAM: &str = "/path/on/disk/tiny-qwen3";

fn sha256_hex(key: &str) -> String {
    Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// `qwen` (behind a 512-token cap, counted with the estimate), `narrow` (one slot, no queue) and
/// `chunked` (map-reduced over a 1024-token cap), all on the simulator under path-like upstream
/// names; `agent` without limits, `limited` at one request a minute; bodies up to 16 KB.
fn yaml(sim_url: &str, top: &str) -> String {
    format!(
        "{top}max_body: 16KB\nauth: required\n\
         clients:\n  agent: {{key_sha256: {}}}\n  limited: {{key_sha256: {}, limits: {{rpm: 1}}}}\n\
         backends:\n  local: {{url: '{sim_url}', max_concurrency: 4, context_cap: 512}}\n  \
         one: {{url: '{sim_url}', max_concurrency: 1}}\n  \
         chunky: {{url: '{sim_url}', max_concurrency: 2, context_cap: 1024}}\n\
         models:\n  qwen: {{backend: local, upstream_model: '{UPSTREAM}'}}\n  \
         narrow: {{backend: one, upstream_model: '{UPSTREAM}', max_queue: 0}}\n  \
         chunked: {{backend: chunky, upstream_model: '{UPSTREAM}', on_overflow: chunk, default_max_tokens: 16}}\n",
        sha256_hex(KEY),
        sha256_hex(LIMITED_KEY),
    )
}

fn chat_body(model: &str, stream: bool, sim: Value) -> Value {
    json!({"model": model, "stream": stream, "max_tokens": 8, "sim": sim,
           "messages": [{"role": "user", "content": PROMPT}]})
}

/// One request of the list: its id (sent as `x-request-id`, or `None`), method, path, key,
/// body, and the status expected.
struct Call {
    id: Option<&'static str>,
    method: reqwest::Method,
    path: &'static str,
    key: Option<&'static str>,
    body: Option<Value>,
    status: u16,
}

fn call(
    id: &'static str,
    method: &str,
    path: &'static str,
    key: Option<&'static str>,
    body: Option<Value>,
    status: u16,
) -> Call {
    Call { id: Some(id), method: method.parse().expect("method"), path, key, body, status }
}

async fn send(base: &str, c: &Call) -> reqwest::Response {
    let mut request = client().request(c.method.clone(), format!("{base}{}", c.path));
    if let Some(id) = c.id {
        request = request.header("x-request-id", id);
    }
    if let Some(key) = c.key {
        request = request.bearer_auth(key);
    }
    if let Some(body) = &c.body {
        request = request.json(body);
    }
    request.send().await.expect("send")
}

/// The access lines logged so far, as (request id, fields), read with `parse`.
fn access_lines(lines: &LogLines, parse: fn(&str) -> Option<HashMap<String, Value>>) -> Vec<HashMap<String, Value>> {
    lines.lock().expect("log").iter().filter(|l| l.contains("mlxgate::access")).filter_map(|l| parse(l)).collect()
}

/// A JSON log line's fields (the access target's only).
fn parse_json(line: &str) -> Option<HashMap<String, Value>> {
    let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    if v["target"] != "mlxgate::access" {
        return None;
    }
    Some(v["fields"].as_object().expect("fields").clone().into_iter().collect())
}

fn text(fields: &HashMap<String, Value>, key: &str) -> String {
    match fields.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    }
}

/// The lines with `id`, pieces apart.
fn lines_of<'a>(lines: &'a [HashMap<String, Value>], id: &str) -> (Vec<&'a HashMap<String, Value>>, usize) {
    let mine: Vec<_> = lines.iter().filter(|l| text(l, "request_id") == id).collect();
    let pieces = mine.iter().filter(|l| l.get("piece") == Some(&Value::Bool(true))).count();
    (mine.into_iter().filter(|l| l.get("piece").is_none()).collect(), pieces)
}

/// Waits until `count` client-request lines (pieces apart) are logged.
async fn wait_for_lines(
    lines: &LogLines,
    parse: fn(&str) -> Option<HashMap<String, Value>>,
    count: usize,
) -> Vec<HashMap<String, Value>> {
    eventually(&format!("{count} access lines"), || async {
        access_lines(lines, parse).iter().filter(|l| l.get("piece").is_none()).count() >= count
    })
    .await;
    access_lines(lines, parse)
}

/// No log line holds a key or the prompt.
fn assert_no_secret(lines: &LogLines) {
    for line in lines.lock().expect("log").iter() {
        for secret in [KEY, LIMITED_KEY, WRONG_KEY, "PROMPT-SECRET"] {
            assert!(!line.contains(secret), "a log line holds {secret:?}: {line}");
        }
    }
}

fn assert_request_id(body: &Value, id: &str) {
    assert_eq!(body["error"]["request_id"], id, "{body}");
    for member in ["message", "type", "param", "code"] {
        assert!(body["error"].get(member).is_some(), "OpenAI's shape kept: {body}");
    }
}

#[tokio::test]
async fn every_request_has_one_json_access_line_and_its_id() {
    let sim = sim().await;
    let (gw, lines) = gateway_binary_logged(&yaml(&sim.url(), ""), &[("MLXGATE_LOG_FORMAT", "json")], "info");
    let base = gw.url.clone();
    let long_prompt = "lorem ipsum dolor sit amet ".repeat(400);
    let too_long = json!({"model": "qwen", "messages": [{"role": "user", "content": format!("{PROMPT} {}", "word ".repeat(2000))}]});
    let document = format!("{PROMPT} summarise: {}", "alpha beta gamma delta ".repeat(600));
    let calls = vec![
        call("al-chat", "POST", "/v1/chat/completions", Some(KEY), Some(chat_body("qwen", false, json!({}))), 200),
        call("al-stream", "POST", "/v1/chat/completions", Some(KEY), Some(chat_body("qwen", true, json!({}))), 200),
        call(
            "al-completions",
            "POST",
            "/v1/completions",
            Some(KEY),
            Some(json!({"model": "qwen", "prompt": PROMPT, "max_tokens": 4})),
            200,
        ),
        call(
            "al-completions-stream",
            "POST",
            "/v1/completions",
            Some(KEY),
            Some(json!({"model": "qwen", "prompt": PROMPT, "max_tokens": 4, "stream": true})),
            200,
        ),
        call("al-embed", "POST", "/v1/embeddings", Some(KEY), Some(json!({"model": "qwen", "input": PROMPT})), 200),
        call("al-nokey", "POST", "/v1/chat/completions", None, Some(chat_body("qwen", false, json!({}))), 401),
        call(
            "al-badkey",
            "POST",
            "/v1/chat/completions",
            Some(WRONG_KEY),
            Some(chat_body("qwen", false, json!({}))),
            401,
        ),
        call(
            "al-unknown-model",
            "POST",
            "/v1/chat/completions",
            Some(KEY),
            Some(chat_body("gpt-9-al", false, json!({}))),
            404,
        ),
        call(
            "al-too-large",
            "POST",
            "/v1/chat/completions",
            Some(KEY),
            Some(
                json!({"model": "qwen", "messages": [{"role": "user", "content": format!("{PROMPT} {long_prompt}{long_prompt}")}]}),
            ),
            413,
        ),
        call("al-overflow", "POST", "/v1/chat/completions", Some(KEY), Some(too_long), 400),
        call(
            "al-limited-1",
            "POST",
            "/v1/chat/completions",
            Some(LIMITED_KEY),
            Some(chat_body("qwen", false, json!({}))),
            200,
        ),
        call(
            "al-limited-2",
            "POST",
            "/v1/chat/completions",
            Some(LIMITED_KEY),
            Some(chat_body("qwen", false, json!({}))),
            429,
        ),
        call(
            "al-cut",
            "POST",
            "/v1/chat/completions",
            Some(KEY),
            Some(chat_body("qwen", true, json!({"tokens": 6, "drop_after": 2}))),
            200,
        ),
        call(
            "al-backend-400",
            "POST",
            "/v1/chat/completions",
            Some(KEY),
            Some(chat_body("qwen", false, json!({"fail_status": 400}))),
            400,
        ),
        call("al-nowhere", "GET", "/v1/nowhere", Some(KEY), None, 404),
        call("al-get-chat", "GET", "/v1/chat/completions", Some(KEY), None, 404),
        call("al-models", "GET", "/v1/models", Some(KEY), None, 200),
        call("al-models-nokey", "GET", "/v1/models", None, None, 401),
        call("al-health", "GET", "/health", None, None, 200),
        // A key in a query string (some clients do) is logged nowhere.
        call("al-query", "GET", "/health?api_key=sk-accesslog-KEY-7f3a2b91", None, None, 200),
        call("al-ready", "GET", "/ready", None, None, 200),
        call("al-metrics", "GET", "/metrics", None, None, 200),
        call("al-admin", "GET", "/admin/backends", None, None, 200),
        call("al-admin-unknown", "GET", "/admin/backends/nope/logs", None, None, 404),
        call(
            "al-chunk",
            "POST",
            "/v1/chat/completions",
            Some(KEY),
            Some(json!({"model": "chunked", "max_tokens": 8, "messages": [{"role": "user", "content": document}]})),
            200,
        ),
        call(
            "al-chunk-stream",
            "POST",
            "/v1/chat/completions",
            Some(KEY),
            Some(json!({"model": "chunked", "max_tokens": 8, "stream": true,
                        "messages": [{"role": "user", "content": document}]})),
            200,
        ),
    ];
    let mut sent = 0;
    for c in &calls {
        let response = send(&base, c).await;
        sent += 1;
        let id = c.id.expect("an id");
        assert_eq!(response.status(), c.status, "{id}");
        assert_eq!(response.headers()["x-request-id"], id, "{id}: the client's id is echoed");
        let streamed =
            response.headers().get("content-type").is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        let body = text_of(response).await;
        let public = c.body.as_ref().and_then(|b| b["model"].as_str()).unwrap_or_default();
        if c.status >= 400 {
            // Every error the gateway sends carries the id (the backend's own 400 included).
            assert_request_id(&serde_json::from_str(&body).expect("an error body is JSON"), id);
        } else if streamed {
            let events: Vec<Value> = data_lines(&body).iter().filter_map(|d| serde_json::from_str(d).ok()).collect();
            assert!(!events.is_empty(), "{id}: {body}");
            for event in &events {
                match event.get("error") {
                    Some(_) => assert_request_id(event, id),
                    None => assert_eq!(event["model"], public, "{id}: every chunk names the public model: {event}"),
                }
            }
            if id == "al-cut" {
                assert!(events.last().is_some_and(|e| e.get("error").is_some()), "{id}: {body}");
            }
        } else if c.path.starts_with("/v1/") && c.method == reqwest::Method::POST {
            let answer: Value = serde_json::from_str(&body).expect("json");
            assert_eq!(answer["model"], public, "{id}: the answer names the model asked for: {answer}");
        }
        assert!(!body.contains(UPSTREAM), "{id}: the backend's name leaked: {body}");
    }

    // A client stream held by the backend, a request refused while it holds the one slot, and
    // the client leaving the stream.
    let held = call(
        "al-held",
        "POST",
        "/v1/chat/completions",
        Some(KEY),
        Some(chat_body("narrow", true, json!({"tokens": 50, "hold_after": 1, "hold_key": "al"}))),
        200,
    );
    let mut stream = send(&base, &held).await;
    assert_eq!(stream.status(), 200);
    read_until(&mut stream, "t0").await;
    let busy =
        call("al-busy", "POST", "/v1/chat/completions", Some(KEY), Some(chat_body("narrow", false, json!({}))), 503);
    let refused = send(&base, &busy).await;
    assert_eq!(refused.status(), 503);
    assert_request_id(&refused.json().await.expect("json"), "al-busy");
    drop(stream);
    client().post(format!("{}/sim/release/al", sim.url())).send().await.expect("release");

    // Without an id, or with one that is not sane: a generated one, in the header, the body
    // and the line.
    let mut generated = Vec::new();
    for header in [None, Some("has space"), Some("q\"uote")] {
        let mut request =
            client().post(format!("{base}/v1/chat/completions")).json(&chat_body("gpt-9-al", false, json!({})));
        request = request.bearer_auth(KEY);
        if let Some(h) = header {
            request = request.header("x-request-id", h);
        }
        let response = request.send().await.expect("send");
        assert_eq!(response.status(), 404);
        let id = response.headers()["x-request-id"].to_str().expect("ascii").to_string();
        assert!(id.starts_with("req_") && id.len() == 36 && id[4..].bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        assert_request_id(&response.json().await.expect("json"), &id);
        generated.push(id);
    }
    let sent = sent + 2 + generated.len();

    let logged = wait_for_lines(&lines, parse_json, sent).await;
    let clients: Vec<_> = logged.iter().filter(|l| l.get("piece").is_none()).collect();
    assert_eq!(clients.len(), sent, "one line per client request: {logged:#?}");
    for c in calls.iter().chain([&held, &busy]) {
        let id = c.id.expect("id");
        let (mine, pieces) = lines_of(&logged, id);
        assert_eq!(mine.len(), 1, "{id}: {mine:?}");
        let line = mine[0];
        assert_eq!(line["method"], c.method.as_str(), "{id}");
        assert_eq!(line["path"], c.path.split('?').next().unwrap_or_default(), "{id}: the path, not its query");
        if id == "al-held" {
            assert_eq!((line["status"].as_u64(), text(line, "outcome").as_str()), (Some(200), "client_closed"), "{id}");
        } else {
            assert_eq!(line["status"], c.status, "{id}: {line:?}");
        }
        if id.starts_with("al-chunk") {
            assert!(pieces >= 2, "{id}: the map pieces are logged, marked: {pieces}");
        } else {
            assert_eq!(pieces, 0, "{id}");
        }
        assert!(line["duration_ms"].as_f64().is_some(), "{id}: {line:?}");
    }
    let field = |id: &str, key: &str| text(lines_of(&logged, id).0[0], key);
    // Outcomes: the labels of mlxgate_requests_total.
    for (id, outcome) in [
        ("al-chat", "ok"),
        ("al-stream", "ok"),
        ("al-nokey", "invalid_request_error"),
        ("al-unknown-model", "invalid_request_error"),
        ("al-limited-2", "rate_limited"),
        ("al-cut", "backend_error"),
        ("al-backend-400", "backend_rejected"),
        ("al-busy", "server_overloaded"),
        ("al-health", "ok"),
        ("al-admin-unknown", "invalid_request_error"),
    ] {
        assert_eq!(field(id, "outcome"), outcome, "{id}");
    }
    // Faces, clients, models.
    for (id, face) in [
        ("al-chat", "chat"),
        ("al-completions", "completions"),
        ("al-embed", "embeddings"),
        ("al-models", "models"),
        ("al-health", "health"),
        ("al-ready", "ready"),
        ("al-metrics", "metrics"),
        ("al-admin", "admin"),
        ("al-nowhere", "none"),
        ("al-get-chat", "none"),
    ] {
        assert_eq!(field(id, "face"), face, "{id}");
    }
    assert_eq!(field("al-chat", "client"), "agent");
    assert_eq!(field("al-models", "client"), "agent");
    assert_eq!(field("al-limited-2", "client"), "limited");
    assert_eq!(field("al-badkey", "client"), "anonymous");
    assert_eq!(field("al-chat", "model"), "qwen");
    assert_eq!(field("al-chat", "backend"), "local");
    assert_eq!(field("al-unknown-model", "model"), "gpt-9-al", "the name asked for, for a model that does not exist");
    // Figures of the answers.
    let chat = lines_of(&logged, "al-chat").0[0];
    for key in ["queue_ms", "ttft_ms", "prompt_tokens", "completion_tokens"] {
        assert!(chat[key].as_f64().is_some(), "al-chat: {key}: {chat:?}");
    }
    let stream = lines_of(&logged, "al-stream").0[0];
    assert!(
        stream["ttft_ms"].as_f64().is_some_and(|t| t <= stream["duration_ms"].as_f64().unwrap_or(0.0)),
        "{stream:?}"
    );
    assert!(stream["completion_tokens"].as_u64().is_some_and(|t| t > 0), "{stream:?}");
    for id in &generated {
        assert_eq!(lines_of(&logged, id).0.len(), 1, "{id}");
    }
    assert_no_secret(&lines);
}

#[tokio::test]
async fn plain_lines_are_key_value_and_the_log_can_be_turned_off() {
    let sim = sim().await;
    let (gw, lines) = gateway_binary_logged(&yaml(&sim.url(), ""), &[], "info");
    let calls = [
        call("pl-chat", "POST", "/v1/chat/completions", Some(KEY), Some(chat_body("qwen", false, json!({}))), 200),
        call("pl-stream", "POST", "/v1/chat/completions", Some(KEY), Some(chat_body("qwen", true, json!({}))), 200),
        call(
            "pl-unknown",
            "POST",
            "/v1/chat/completions",
            Some(KEY),
            Some(chat_body("no \"such\" model", false, json!({}))),
            404,
        ),
        call("pl-nowhere", "DELETE", "/v1/x", None, None, 404),
        call("pl-health", "GET", "/health", None, None, 200),
    ];
    for c in &calls {
        let response = send(&gw.url, c).await;
        assert_eq!(response.status(), c.status, "{:?}", c.id);
        let _ = text_of(response).await;
    }
    // A client that gives up before the answer's headers: no status was sent (499, nginx's).
    let gone = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .bearer_auth(KEY)
        .header("x-request-id", "pl-gone")
        .timeout(std::time::Duration::from_millis(300))
        .json(&chat_body("qwen", false, json!({"hang": true})))
        .send()
        .await;
    assert!(gone.is_err_and(|e| e.is_timeout()));
    let logged = wait_for_lines(&lines, access_fields, calls.len() + 1).await;
    assert_eq!(logged.len(), calls.len() + 1, "{logged:#?}");
    let gone = lines_of(&logged, "pl-gone").0;
    assert_eq!(gone.len(), 1);
    assert_eq!((gone[0]["status"].as_u64(), text(gone[0], "outcome").as_str()), (Some(499), "client_closed"));
    for c in &calls {
        let id = c.id.expect("id");
        let (mine, _) = lines_of(&logged, id);
        assert_eq!(mine.len(), 1, "{id}: {logged:#?}");
        assert_eq!(mine[0]["status"], c.status, "{id}");
        assert_eq!(mine[0]["path"], c.path, "{id}");
    }
    assert_eq!(text(lines_of(&logged, "pl-unknown").0[0], "model"), "no \"such\" model", "quoted and escaped");
    assert_eq!(text(lines_of(&logged, "pl-stream").0[0], "outcome"), "ok");
    assert_no_secret(&lines);
    drop(gw);

    // `access_log: false`, and `--no-access-log` (through its variable): ids still given, no
    // line written.
    for (top, env) in [("access_log: false\n", None), ("", Some(("MLXGATE_NO_ACCESS_LOG", "true")))] {
        // The arrival layer's line at each response (debug) shows how far the log has come.
        let filter = "info,mlxgate::api::arrival=debug";
        let (gw, lines) = gateway_binary_logged(&yaml(&sim.url(), top), &Vec::from_iter(env), filter);
        let response = send(&gw.url, &calls[0]).await;
        assert_eq!(response.headers()["x-request-id"], "pl-chat");
        let _ = text_of(response).await;
        assert_eq!(send(&gw.url, &calls[4]).await.status(), 200);
        let marker = client().get(format!("{}/v1/none-marker", gw.url)).send().await.expect("send");
        assert_eq!(marker.status(), 404);
        eventually("the marker's response logged", || async {
            lines
                .lock()
                .expect("log")
                .iter()
                .any(|l| l.contains("/v1/none-marker") && l.contains("finished processing"))
        })
        .await;
        assert!(lines.lock().expect("log").iter().all(|l| !l.contains("mlxgate::access")), "{:?}", lines.lock());
    }
}

/// Real mlx_lm.server (managed, serving the tiny model by its path): whole and streamed answers
/// name the public model, never the path.
#[tokio::test]
async fn a_real_mlx_lm_server_answers_under_the_public_name() {
    let Some(model) = prerequisites(&["mlx-lm"]) else { return };
    let port = free_port();
    let gw = gateway(&config(&[backend("b", "mlx-lm", &model, port, "")], &[("m", "b")], "")).await;
    let path = model.display().to_string();
    for stream in [false, true] {
        let body = json!({"model": "m", "stream": stream, "max_tokens": 5,
            "messages": [{"role": "user", "content": "hello"}]});
        let response = client().post(gw.url("/v1/chat/completions")).json(&body).send().await.expect("send");
        assert_eq!(response.status(), 200);
        assert!(response.headers()["x-request-id"].to_str().is_ok_and(|id| id.starts_with("req_")));
        let text = text_of(response).await;
        assert!(!text.contains(&path), "the model's path leaked: {text}");
        if stream {
            let chunks: Vec<Value> = data_lines(&text).iter().filter_map(|d| serde_json::from_str(d).ok()).collect();
            assert!(!chunks.is_empty(), "{text}");
            assert!(chunks.iter().all(|c| c["model"] == "m"), "{text}");
        } else {
            let answer: Value = serde_json::from_str(&text).expect("json");
            assert_eq!(answer["model"], "m", "{answer}");
        }
    }
}
