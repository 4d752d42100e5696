//! The real binaries: `mlxgate check`, `mlxgate serve` with a graceful SIGTERM, and the
//! `mlxgate-sim` process.

use std::process::Command;

use crate::common::*;
use serde_json::json;

const MLXGATE: &str = env!("CARGO_BIN_EXE_mlxgate");

fn write_config(dir: &tempfile::TempDir, text: &str) -> std::path::PathBuf {
    let path = dir.path().join("gateway.yaml");
    std::fs::write(&path, text).expect("write config");
    path
}

#[test]
fn check_names_every_bad_field_and_accepts_the_shipped_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = write_config(
        &dir,
        "backends:\n  local: {url: 'http://127.0.0.1:8101', max_concurrency: 2}\n\
         models:\n  qwen: {backend: qwen-local, max_wait: soon}\n",
    );
    let out = Command::new(MLXGATE).args(["check", "--config"]).arg(&bad).output().expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("models.qwen.max_wait:"), "{stderr}");

    let bad = write_config(
        &dir,
        "backends:\n  local: {url: 'http://127.0.0.1:8101'}\nmodels:\n  qwen: {backend: qwen-local}\n  other: {backend: local, colour: red}\n",
    );
    let out = Command::new(MLXGATE).args(["check", "--config"]).arg(&bad).output().expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("models.qwen.backend: no backend named \"qwen-local\""), "{stderr}");
    assert!(stderr.contains("models.other.colour: unknown field"), "{stderr}");

    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/gateway.yaml");
    let out = Command::new(MLXGATE).args(["check", "--config", shipped]).output().expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The shipped file's servers run from the venvs scripts/setup-backends builds: check
    // accepts it once they are built, and names each missing one with its build command.
    let missing: Vec<&str> = ["mlx-lm"]
        .into_iter()
        .filter(|kind| !std::path::Path::new(ROOT).join(format!(".venv-{kind}")).is_dir())
        .collect();
    assert_eq!(out.status.success(), missing.is_empty(), "{stderr}");
    for kind in missing {
        let named = format!(".venv-{kind} does not exist (build it with: scripts/setup-backends {kind})");
        assert!(stderr.contains(&named), "{stderr}");
    }
}

#[test]
fn check_takes_a_model_of_several_backends_and_names_what_is_wrong_with_the_list() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backends = "backends:\n  studio: {url: 'http://127.0.0.1:8101'}\n  mini: {url: 'http://127.0.0.1:8102'}\n";
    let good = write_config(&dir, &format!("{backends}models:\n  qwen: {{backends: [studio, mini]}}\n"));
    let out = Command::new(MLXGATE).args(["check", "--config"]).arg(&good).output().expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("ok (2 backends, 1 models"), "{stdout}");

    let bad = write_config(
        &dir,
        &format!(
            "{backends}models:\n  both: {{backend: studio, backends: [studio]}}\n  \
             twice: {{backends: [mini, laptop, mini]}}\n"
        ),
    );
    let out = Command::new(MLXGATE).args(["check", "--config"]).arg(&bad).output().expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for expected in [
        "models.both: give either backend (one) or backends (a list), not both",
        "models.twice.backends[1]: no backend named \"laptop\" (backends: mini, studio)",
        "models.twice.backends[2]: \"mini\" is named twice",
    ] {
        assert!(stderr.contains(expected), "{expected:?} not in {stderr}");
    }
}

#[tokio::test]
async fn sigterm_lets_a_running_stream_finish_then_exits() {
    let (_sim, sim_url) = spawn_sim(&[]);
    let mut gateway = gateway_binary(&format!("shutdown_grace: 60s\n{}", one_model_yaml(&sim_url, 1, 1)), None);
    let url = gateway.url.clone();
    let body = chat(true, json!({"tokens": 3, "hold_after": 1, "hold_key": "term"}));
    let mut stream = client().post(format!("{url}/v1/chat/completions")).json(&body).send().await.expect("send");
    read_until(&mut stream, "t0 ").await;

    let pid = gateway.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().expect("kill").success());
    // New connections are refused once the gateway stops accepting.
    eventually("listener closed", || {
        let url = url.clone();
        async move { client().get(format!("{url}/health")).send().await.is_err() }
    })
    .await;
    assert!(gateway.child.try_wait().expect("wait").is_none(), "must wait for the running stream");

    client().post(format!("{sim_url}/sim/release/term")).send().await.expect("release");
    let rest = text_of(stream).await;
    assert!(rest.contains("t2 ") && rest.contains("[DONE]"), "{rest}");
    let status = gateway.exit_status().await;
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn the_sim_process_exits_when_a_request_says_so() {
    let (mut sim, url) = spawn_sim(&["--style", "mlx-lm", "--tokens", "5"]);
    let r = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&json!({"model": "m", "stream": true, "messages": [], "sim": {"exit_after": 2}}))
        .send()
        .await
        .expect("send");
    let text = text_of(r).await;
    assert!(text.contains("t1 ") && !text.contains("[DONE]"), "{text}");
    let status = tokio::task::spawn_blocking(move || sim.0.wait().expect("wait")).await.expect("join");
    assert_eq!(status.code(), Some(137));
}
