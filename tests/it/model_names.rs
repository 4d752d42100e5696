//! Model names as clients other than OpenAI's see them, through the real `mlxgate serve` binary
//! in front of the simulator: `aliases:` (exact names and `*` patterns route to configured
//! models, on the chat and the Messages faces; the answer, whole and streamed, carries the name
//! the client sent; the access log says
//! `model=` the configured one and `alias=` the one sent; a bad alias stops start-up at its path),
//! `GET /v1/models` and `/v1/models/{id}` in Anthropic's shape to a client sending
//! `anthropic-version`, and `HEAD`/`GET /` and `/api/hello` answered 200 without a key.

use std::collections::HashMap;

use crate::common::*;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const KEY: &str = "sk-names-KEY-41c9";

fn yaml(sim_url: &str) -> String {
    let digest: String = Sha256::digest(KEY.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "auth: required\nclients:\n  agent: {{key_sha256: {digest}}}\n\
         backends:\n  local: {{url: '{sim_url}', max_concurrency: 4}}\n\
         models:\n  qwen: {{backend: local, upstream_model: /models/qwen}}\n  \
         small: {{backend: local, upstream_model: /models/small}}\n\
         aliases:\n  claude-haiku-*: small\n  claude-*: qwen\n  sonnet: qwen\n"
    )
}

fn body(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
}

/// The access lines of `path`, oldest first.
fn access(log: &LogLines, path: &str) -> Vec<HashMap<String, Value>> {
    let lines = log.lock().expect("log lines");
    lines.iter().filter_map(|l| access_fields(l)).filter(|f| f["path"] == path).collect()
}

#[tokio::test]
async fn aliases_route_and_the_answer_carries_the_name_sent() {
    let (_sim, sim_url) = spawn_sim(&["--ttft-ms", "0", "--tokens-per-second", "1000"]);
    let (gw, log) = gateway_binary_logged(&yaml(&sim_url), &[], "info");
    let send = |model: &str, stream: bool| {
        client().post(format!("{}/v1/chat/completions", gw.url)).bearer_auth(KEY).json(&body(model, stream)).send()
    };
    // Whole answers, each naming the model as sent (the models they reach: the backend's
    // requests below).
    for sent in ["claude-haiku-4-5", "claude-opus-5-5", "sonnet", "qwen", "small"] {
        let answer: Value = send(sent, false).await.expect("send").json().await.expect("json");
        assert_eq!(answer["model"], sent, "{answer}");
    }
    // A stream: every chunk names the model as sent.
    let streamed = text_of(send("claude-haiku-4-5", true).await.expect("send")).await;
    let chunks: Vec<Value> = data_lines(&streamed)
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("json"))
        .collect();
    assert!(!chunks.is_empty() && chunks.iter().all(|c| c["model"] == "claude-haiku-4-5"), "{streamed}");
    // No alias matches: 404 naming what was asked.
    let refused = send("gpt-4o", false).await.expect("send");
    assert_eq!(refused.status(), 404);
    let refused: Value = refused.json().await.expect("json");
    assert!(refused["error"]["message"].as_str().is_some_and(|m| m.contains("gpt-4o")), "{refused}");

    // What the backend was asked for: the configured model's upstream name.
    let requests: Vec<Value> =
        client().get(format!("{sim_url}/sim/requests")).send().await.expect("sim").json().await.expect("json");
    let upstream: Vec<&str> = requests.iter().filter_map(|r| r["model"].as_str()).collect();
    assert_eq!(
        upstream,
        ["/models/small", "/models/qwen", "/models/qwen", "/models/qwen", "/models/small", "/models/small"],
        "{requests:?}"
    );

    let wanted = [
        ("small", Some("claude-haiku-4-5")),
        ("qwen", Some("claude-opus-5-5")),
        ("qwen", Some("sonnet")),
        ("qwen", None),
        ("small", None),
        ("small", Some("claude-haiku-4-5")),
        ("gpt-4o", None),
    ];
    eventually("an access line per request", || async { access(&log, "/v1/chat/completions").len() >= wanted.len() })
        .await;
    let lines = access(&log, "/v1/chat/completions");
    let got: Vec<(Value, Option<Value>)> =
        lines.iter().map(|l| (l["model"].clone(), l.get("alias").cloned())).collect();
    let wanted: Vec<(Value, Option<Value>)> = wanted.iter().map(|(m, a)| (json!(m), a.map(|a| json!(a)))).collect();
    assert_eq!(got, wanted, "{lines:?}");
}

#[tokio::test]
async fn claude_names_reach_the_messages_face_through_aliases() {
    let (_sim, sim_url) = spawn_sim(&["--ttft-ms", "0", "--tokens-per-second", "1000"]);
    let (gw, log) = gateway_binary_logged(&yaml(&sim_url), &[], "info");
    let send = |stream: bool| {
        let body = json!({"model": "claude-haiku-4-5", "max_tokens": 8, "stream": stream,
                          "messages": [{"role": "user", "content": "hi"}]});
        client()
            .post(format!("{}/v1/messages?beta=true", gw.url))
            .header("x-api-key", KEY)
            .header("anthropic-version", "2023-06-01")
            .json(&body)
            .send()
    };
    let whole: Value = send(false).await.expect("send").json().await.expect("json");
    assert_eq!((&whole["type"], &whole["model"]), (&json!("message"), &json!("claude-haiku-4-5")), "{whole}");
    let streamed = text_of(send(true).await.expect("send")).await;
    let start: Value = data_lines(&streamed)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|e| e["type"] == "message_start")
        .unwrap_or_else(|| panic!("no message_start: {streamed}"));
    assert_eq!(start["message"]["model"], "claude-haiku-4-5", "{start}");
    let requests: Vec<Value> =
        client().get(format!("{sim_url}/sim/requests")).send().await.expect("sim").json().await.expect("json");
    assert!(requests.len() == 2 && requests.iter().all(|r| r["model"] == "/models/small"), "{requests:?}");
    eventually("the access lines", || async { access(&log, "/v1/messages").len() >= 2 }).await;
    for line in access(&log, "/v1/messages") {
        assert_eq!((&line["model"], &line["alias"]), (&json!("small"), &json!("claude-haiku-4-5")), "{line:?}");
    }
}

#[test]
fn an_alias_of_no_model_stops_start_up_at_its_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gateway.yaml");
    let config = "backends: {local: {url: 'http://127.0.0.1:9'}}\nmodels: {qwen: {backend: local}}\n\
                  aliases: {'claude-*': qwen3}\n";
    std::fs::write(&path, config).expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mlxgate"))
        .args(["serve", "--config"])
        .arg(&path)
        .output()
        .expect("mlxgate runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(r#"aliases."claude-*": no model named "qwen3""#), "{stderr}");
}

#[tokio::test]
async fn anthropic_clients_get_anthropics_model_list() {
    let (_sim, sim_url) = spawn_sim(&[]);
    let (gw, log) = gateway_binary_logged(&yaml(&sim_url), &[], "info");
    let get = |path: &str, anthropic: bool, key: Option<&str>| {
        let mut request = client().get(format!("{}{path}", gw.url));
        if anthropic {
            request = request.header("anthropic-version", "2023-06-01");
        }
        if let Some(key) = key {
            request = request.header("x-api-key", key);
        }
        request.send()
    };
    let list: Value = get("/v1/models", true, Some(KEY)).await.expect("send").json().await.expect("json");
    let ids: Vec<&str> = list["data"].as_array().expect("data").iter().filter_map(|m| m["id"].as_str()).collect();
    assert_eq!(ids, ["qwen", "small"], "{list}");
    assert_eq!(
        (&list["has_more"], &list["first_id"], &list["last_id"]),
        (&json!(false), &json!("qwen"), &json!("small"))
    );
    for model in list["data"].as_array().expect("data") {
        assert_eq!(model["type"], "model", "{model}");
        assert_eq!(model["display_name"], model["id"], "{model}");
        let created = model["created_at"].as_str().expect("created_at");
        assert!(humantime::parse_rfc3339(created).is_ok(), "{created}");
    }
    // One model, by its name or an alias (named as asked); none by another name.
    let one: Value =
        get("/v1/models/claude-haiku-4-5", true, Some(KEY)).await.expect("send").json().await.expect("json");
    assert_eq!((&one["type"], &one["id"]), (&json!("model"), &json!("claude-haiku-4-5")), "{one}");
    // A name with a slash (as Hugging Face ids have) is one id.
    let slashed: Value =
        get("/v1/models/claude-org/x", true, Some(KEY)).await.expect("send").json().await.expect("json");
    assert_eq!(slashed["id"], "claude-org/x", "{slashed}");
    let openai: Value = get("/v1/models/qwen", false, Some(KEY)).await.expect("send").json().await.expect("json");
    assert_eq!((&openai["object"], &openai["id"]), (&json!("model"), &json!("qwen")), "{openai}");
    let missing = get("/v1/models/gpt-4o", true, Some(KEY)).await.expect("send");
    assert_eq!(missing.status(), 404);
    let missing: Value = missing.json().await.expect("json");
    assert_eq!(
        (&missing["type"], &missing["error"]["type"]),
        (&json!("error"), &json!("not_found_error")),
        "{missing}"
    );
    // Without a key: Anthropic's 401 to an Anthropic client, OpenAI's to the others.
    let refused = get("/v1/models", true, None).await.expect("send");
    assert_eq!(refused.status(), 401);
    let refused: Value = refused.json().await.expect("json");
    assert_eq!(refused["error"]["type"], "authentication_error", "{refused}");
    let refused: Value = get("/v1/models", false, None).await.expect("send").json().await.expect("json");
    assert_eq!(refused["object"], Value::Null, "{refused}");
    assert_eq!(refused["error"]["code"], "invalid_api_key", "{refused}");
    // OpenAI's list to the others.
    let list: Value = get("/v1/models", false, Some(KEY)).await.expect("send").json().await.expect("json");
    assert_eq!(list["object"], "list", "{list}");
    eventually("the access lines", || async { access(&log, "/v1/models").len() >= 4 }).await;
    let statuses: Vec<Value> = access(&log, "/v1/models").iter().map(|l| l["status"].clone()).collect();
    assert_eq!(statuses, [json!(200), json!(401), json!(401), json!(200)]);
}

#[tokio::test]
async fn the_root_answers_200_without_a_key() {
    let (_sim, sim_url) = spawn_sim(&[]);
    let (gw, log) = gateway_binary_logged(&yaml(&sim_url), &[], "info");
    for path in ["/", "/api/hello"] {
        let head = client().head(format!("{}{path}", gw.url)).send().await.expect("head");
        assert_eq!(head.status(), 200, "HEAD {path}");
        let get = client().get(format!("{}{path}", gw.url)).send().await.expect("get");
        assert_eq!(get.status(), 200, "GET {path}");
        let body: Value = get.json().await.expect("json");
        assert_eq!(body, json!({"status": "ok"}), "no more than /health says, to anyone");
    }
    // Another path still gets the 404, and a POST to the root the method's 404.
    let other = client().get(format!("{}/api/other", gw.url)).send().await.expect("get");
    assert_eq!(other.status(), 404);
    let post = client().post(format!("{}/", gw.url)).send().await.expect("post");
    assert_eq!(post.status(), 404);
    eventually("the access lines", || async { access(&log, "/").len() >= 3 }).await;
    let faces: Vec<(Value, Value, Value)> =
        access(&log, "/").iter().map(|l| (l["method"].clone(), l["status"].clone(), l["face"].clone())).collect();
    assert_eq!(
        faces,
        [
            (json!("HEAD"), json!(200), json!("health")),
            (json!("GET"), json!(200), json!("health")),
            (json!("POST"), json!(404), json!("none"))
        ]
    );
}
