//! A model of several backends as the admin API shows it, and draining a backend: the admin
//! calls (`POST /admin/backends/{name}/drain`, `…/undrain`) and `mlxgate drain`, which finds the
//! gateway by its file's `listen` or `--url` and sends the admin key it is given.

use std::process::{Command, Output};

use serde_json::{Value, json};

use crate::common::*;

const MLXGATE: &str = env!("CARGO_BIN_EXE_mlxgate");
const ADMIN_KEY: &str = "sk-admin-drain";

/// Two simulators' backends `a` and `b` behind one model `qwen`, plus `solo` alone behind `one`.
fn two_backends_yaml(a: &str, b: &str, top: &str) -> String {
    format!(
        "{top}backends:\n  a: {{url: '{a}', max_concurrency: 2}}\n  b: {{url: '{b}', max_concurrency: 2}}\n  \
         solo: {{url: '{a}'}}\n\
         models:\n  qwen: {{backends: [a, b], upstream_model: tiny-qwen3, balance: {{policy: least_loaded}}}}\n  \
         one: {{backend: solo, upstream_model: tiny-qwen3}}\n"
    )
}

fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// `mlxgate drain ARGS` with `MLXGATE_ADMIN_KEY` set to `key` or unset, off the runtime.
async fn drain_command(args: Vec<String>, key: Option<&str>) -> Output {
    let key = key.map(str::to_string);
    tokio::task::spawn_blocking(move || {
        let mut command = Command::new(MLXGATE);
        command.arg("drain").args(&args).env_remove("MLXGATE_ADMIN_KEY").env_remove("MLXGATE_CONFIG");
        if let Some(key) = key {
            command.env("MLXGATE_ADMIN_KEY", key);
        }
        command.output().expect("mlxgate drain runs")
    })
    .await
    .expect("join")
}

#[tokio::test]
async fn admin_backends_shows_each_models_backends_and_each_backends_drain_and_health() {
    let (a, b) = (sim().await, sim().await);
    let gw = gateway(&two_backends_yaml(&a.url(), &b.url(), "")).await;
    let listed: Value = client().get(gw.url("/admin/backends")).send().await.expect("send").json().await.expect("json");
    let names: Vec<&str> =
        listed["backends"].as_array().expect("list").iter().filter_map(|e| e["name"].as_str()).collect();
    assert_eq!(names, ["a", "b", "solo"]);
    for entry in listed["backends"].as_array().expect("list") {
        assert_eq!((&entry["drained"], &entry["health"]), (&json!(false), &json!("healthy")), "{entry}");
        assert_eq!(entry["prompt_cache_sequences"], 10, "unknown kind: 10 assumed: {entry}");
    }
    assert_eq!(
        listed["models"]["qwen"],
        json!({"backends": ["a", "b"], "policy": "least_loaded", "session_header": null, "fallback": null})
    );
    assert_eq!(listed["models"]["one"]["backends"], json!(["solo"]));
    assert_eq!(listed["models"]["one"]["policy"], "cache_aware", "the default");

    // /ready: a model of two backends is one entry with both names; one backend keeps its shape.
    let ready: Value = client().get(gw.url("/ready")).send().await.expect("send").json().await.expect("json");
    assert_eq!(ready["models"]["qwen"], json!({"backends": ["a", "b"], "ready": true}), "{ready}");
    assert_eq!(ready["models"]["one"], json!({"backend": "solo", "ready": true}), "{ready}");
    assert_eq!(ready["ready"], true, "{ready}");
}

#[tokio::test]
async fn a_model_of_two_backends_is_ready_while_one_answers() {
    let a = sim().await;
    // Nothing listens on b's port.
    let dead = format!("http://127.0.0.1:{}", free_port());
    let yaml = format!(
        "backends:\n  a: {{url: '{}'}}\n  b: {{url: '{dead}'}}\n\
         models:\n  qwen: {{backends: [a, b], upstream_model: tiny-qwen3}}\n",
        a.url()
    );
    let gw = gateway(&yaml).await;
    let response = client().get(gw.url("/ready")).send().await.expect("send");
    assert_eq!(response.status(), 200);
    let ready: Value = response.json().await.expect("json");
    assert_eq!(ready["backends"]["b"]["ready"], false, "{ready}");
    assert_eq!(ready["models"]["qwen"]["ready"], true, "{ready}");

    // A model whose only backend is down is not servable: 503.
    let alone = format!("{yaml}  solo: {{backend: b, upstream_model: tiny-qwen3}}\n");
    let gw = gateway(&alone).await;
    assert_eq!(client().get(gw.url("/ready")).send().await.expect("send").status(), 503);
}

#[tokio::test]
async fn an_unknown_backend_is_404_and_the_admin_rule_comes_first() {
    let (a, b) = (sim().await, sim().await);
    let top = format!("admin_key_sha256: {}\n", sha256_hex(ADMIN_KEY));
    let gw = gateway(&two_backends_yaml(&a.url(), &b.url(), &top)).await;
    for action in ["drain", "undrain"] {
        let call = |key: Option<&'static str>| {
            let request = client().post(gw.url(&format!("/admin/backends/nope/{action}")));
            match key {
                Some(key) => request.bearer_auth(key),
                None => request,
            }
        };
        let refused = call(None).send().await.expect("send");
        assert_eq!(refused.status(), 401, "the key is asked for before the name is looked up");
        let unknown = call(Some(ADMIN_KEY)).send().await.expect("send");
        assert_eq!(unknown.status(), 404);
        let body: Value = unknown.json().await.expect("json");
        assert_eq!(body["error"]["code"], "backend_not_found", "{body}");
    }
}

#[tokio::test]
async fn the_drain_command_finds_the_gateway_sends_the_key_and_says_why_it_failed() {
    let (a, b) = (sim().await, sim().await);
    let top = format!("admin_key_sha256: {}\n", sha256_hex(ADMIN_KEY));
    let gw = gateway(&two_backends_yaml(&a.url(), &b.url(), &top)).await;
    let url = gw.url("");

    // No key: the gateway's own 401 message.
    let out = drain_command(vec!["nope".into(), "--url".into(), url.clone()], None).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("nope not drained") && stderr.contains("401"), "{stderr}");

    // The key from the environment is sent: past the guard, the name is unknown.
    let out =
        drain_command(vec!["nope".into(), "--undrain".into(), "--url".into(), url.clone()], Some(ADMIN_KEY)).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("nope not undrained") && stderr.contains("404"), "{stderr}");
    assert!(stderr.contains("/admin/backends/nope/undrain"), "{stderr}");

    // Found by the file's listen: the gateway's own address, written in a config file.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("gateway.yaml");
    let yaml = two_backends_yaml(&a.url(), &b.url(), &format!("listen: {}\n{top}", gw.addr));
    std::fs::write(&file, yaml).expect("write");
    let args =
        vec!["nope".into(), "--config".into(), file.display().to_string(), "--admin-key".into(), ADMIN_KEY.into()];
    let out = drain_command(args, None).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("http://{}/admin/backends/nope/drain", gw.addr)), "{stderr}");
    assert!(stderr.contains("404"), "{stderr}");

    // Nobody listening: said so.
    let nobody = format!("http://127.0.0.1:{}", free_port());
    let out = drain_command(vec!["a".into(), "--url".into(), nobody], None).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("no gateway answers"), "{stderr}");
}

/// Needs the pool's `Dispatch::drain` (branch b21-pool): on b21-config alone it is a stub.
#[tokio::test]
async fn a_drained_backend_shows_it_and_undrain_takes_it_back() {
    let (a, b) = (sim().await, sim().await);
    let gw = gateway(&two_backends_yaml(&a.url(), &b.url(), "")).await;
    let out = drain_command(vec!["b".into(), "--url".into(), gw.url("")], None).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.starts_with("backend b drained"), "{stdout}");
    let entry: Value = serde_json::from_str(stdout.split_once('\n').expect("two parts").1).expect("the entry");
    assert_eq!((&entry["name"], &entry["drained"]), (&json!("b"), &json!(true)), "{entry}");
    assert_eq!(backend_state(&gw, "b").await["drained"], true);
    assert_eq!(backend_state(&gw, "a").await["drained"], false);

    // Every request goes to a while b is drained.
    let before = sim_stats(&b).await["total"].clone();
    for _ in 0..4 {
        let r = post(&gw, "/v1/chat/completions", &chat(false, json!({}))).await;
        assert_eq!(r.status(), 200);
    }
    assert_eq!(sim_stats(&b).await["total"], before, "a drained backend takes no new request");

    let undrained = client().post(gw.url("/admin/backends/b/undrain")).send().await.expect("send");
    assert_eq!(undrained.status(), 200);
    let entry: Value = undrained.json().await.expect("json");
    assert_eq!(entry["drained"], false, "{entry}");
}
