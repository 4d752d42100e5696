//! Reloading keys and limits (SIGHUP, `mlxgate reload`) on the real binary, against the
//! simulator: a held stream survives a reload that removes its client, new keys and limits are
//! in force for new requests, a broken file keeps the old ones and the log says why, and
//! `mlxgate reload` finds the gateway through its pid file or says why it cannot.

use std::path::{Path, PathBuf};

use crate::common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const AIDER_KEY: &str = "sk-aider-5d1c9e0b7a3f4e26";
const CURSOR_KEY: &str = "sk-cursor-81b0f4c2d6e9a357";
const ZED_KEY: &str = "sk-zed-3e7a90c1b5d24f68";
const ENV_KEY: &str = "sk-ops-from-the-environment-4c1d";

fn sha256_hex(key: &str) -> String {
    Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// A gateway.yaml with model `qwen` on the simulator (`max_queue` as given) and `clients`.
fn yaml(listen: &str, sim_url: &str, max_queue: usize, clients: &str) -> String {
    format!(
        "listen: {listen}\nbackends:\n  local: {{url: '{sim_url}', max_concurrency: 4}}\n\
         models:\n  qwen: {{backend: local, max_queue: {max_queue}}}\nauth: required\nclients:\n{clients}"
    )
}

fn client_line(name: &str, key: &str, limits: &str) -> String {
    format!("  {name}: {{key_sha256: {}, limits: {limits}}}\n", sha256_hex(key))
}

fn chat(stream: bool, sim: Value) -> Value {
    json!({"model": "qwen", "stream": stream, "messages": [{"role": "user", "content": "hello there"}],
           "max_tokens": 8, "sim": sim})
}

async fn status_for(gw: &GatewayBinary, key: &str) -> u16 {
    client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .bearer_auth(key)
        .json(&chat(false, json!({})))
        .send()
        .await
        .expect("send")
        .status()
        .as_u16()
}

fn hang_up(gw: &GatewayBinary) {
    let pid = i32::try_from(gw.child.id()).expect("pid");
    kill(Pid::from_raw(pid), Signal::SIGHUP).expect("SIGHUP");
}

fn log_lines_with(log: &LogLines, needle: &str) -> usize {
    log.lock().expect("log").iter().filter(|l| l.contains(needle)).count()
}

/// A directory of the test's own: the config file and `XDG_RUNTIME_DIR` (the pid file).
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        Setup { dir: tempfile::tempdir().expect("tempdir") }
    }
    fn config(&self) -> PathBuf {
        self.dir.path().join("gateway.yaml")
    }
    fn runtime(&self) -> String {
        self.dir.path().display().to_string()
    }
    fn write(&self, text: &str) {
        // Whole or not at all, as an editor saving the file: a reload never reads half of it.
        let partial = self.dir.path().join("gateway.yaml.partial");
        std::fs::write(&partial, text).expect("write");
        std::fs::rename(&partial, self.config()).expect("rename");
    }
    fn start(&self) -> (GatewayBinary, LogLines) {
        // The gateway's environment has a key the shell running `mlxgate reload` lacks.
        gateway_binary_at(&self.config(), &[("XDG_RUNTIME_DIR", &self.runtime()), ("RELOAD_TEST_KEY", ENV_KEY)])
    }
    fn reload_command(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(env!("CARGO_BIN_EXE_mlxgate"))
            .arg("reload")
            .args(args)
            .env("XDG_RUNTIME_DIR", self.runtime())
            .env_remove("MLXGATE_CONFIG")
            .env_remove("RELOAD_TEST_KEY")
            .output()
            .expect("mlxgate reload runs")
    }
}

#[tokio::test]
async fn a_held_stream_survives_a_reload_that_removes_its_client_and_new_keys_and_limits_apply() {
    let sim = sim().await;
    let setup = Setup::new();
    let clients = client_line("aider", AIDER_KEY, "{}") + &client_line("cursor", CURSOR_KEY, "{}");
    setup.write(&yaml("127.0.0.1:0", &sim.url(), 64, &clients));
    let (gw, log) = setup.start();

    let mut held = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .bearer_auth(AIDER_KEY)
        .json(&chat(true, json!({"hold_after": 1, "hold_key": "held"})))
        .send()
        .await
        .expect("send");
    assert_eq!(held.status(), 200);
    read_until(&mut held, "t0 ").await;
    assert_eq!(status_for(&gw, ZED_KEY).await, 401, "zed is not a client yet");

    // aider (whose stream is held) goes, zed comes with rpm 1; the model's queue changes too,
    // which a reload does not apply.
    let clients = client_line("cursor", CURSOR_KEY, "{}") + &client_line("zed", ZED_KEY, "{rpm: 1}");
    setup.write(&yaml("127.0.0.1:0", &sim.url(), 8, &clients));
    hang_up(&gw);
    eventually("zed's key accepted after the reload", || async { status_for(&gw, ZED_KEY).await == 200 }).await;
    assert_eq!(status_for(&gw, ZED_KEY).await, 429, "zed's rpm 1 is in force");
    assert_eq!(status_for(&gw, AIDER_KEY).await, 401, "aider's key is gone");
    assert_eq!(status_for(&gw, CURSOR_KEY).await, 200, "cursor stays");
    // The log is read on a thread of its own: it may lag behind the requests.
    eventually("the reload and the unapplied models change logged", || async {
        log_lines_with(&log, "reloaded keys, clients and limits") == 1
            && log_lines_with(&log, "apply only at a restart: models") == 1
    })
    .await;

    client().post(format!("{}/sim/release/held", sim.url())).send().await.expect("release");
    let rest = text_of(held).await;
    assert!(rest.contains("[DONE]"), "the held stream ends normally: {rest:?}");
    assert!(!rest.contains("\"error\""), "{rest:?}");
}

#[tokio::test]
async fn a_broken_file_keeps_the_keys_in_force_and_the_log_says_why() {
    let sim = sim().await;
    let setup = Setup::new();
    let good = yaml("127.0.0.1:0", &sim.url(), 64, &client_line("aider", AIDER_KEY, "{}"));
    setup.write(&good);
    let (gw, log) = setup.start();
    assert_eq!(status_for(&gw, AIDER_KEY).await, 200);

    // Not YAML at all.
    setup.write(&format!("{good}  zed: {{key_sha256: [unclosed\n"));
    hang_up(&gw);
    eventually("the first refusal logged", || async { log_lines_with(&log, "reload refused") == 1 }).await;
    assert!(log_lines_with(&log, "reload: (file):") >= 1, "the syntax error is logged: {:?}", log.lock());
    assert_eq!(status_for(&gw, AIDER_KEY).await, 200, "the old key still works");

    // YAML, but a client whose key_sha256 is a key pasted by mistake, and aider removed.
    let pasted = "sk-pasted-the-key-itself-7f3a";
    let invalid = yaml(
        "127.0.0.1:0",
        &sim.url(),
        64,
        &format!("  zed: {{key_sha256: '{pasted}'}}\n{}", client_line("cursor", CURSOR_KEY, "{}")),
    );
    setup.write(&invalid);
    hang_up(&gw);
    eventually("the second refusal logged", || async { log_lines_with(&log, "reload refused") == 2 }).await;
    assert_eq!(log_lines_with(&log, "reload: clients.zed.key_sha256:"), 1, "{:?}", log.lock());
    assert_eq!(status_for(&gw, AIDER_KEY).await, 200, "aider is still a client");
    assert_eq!(status_for(&gw, CURSOR_KEY).await, 401, "nothing of the invalid file applied");
    assert_eq!(log_lines_with(&log, pasted), 0, "a key is never logged");
    assert_eq!(log_lines_with(&log, "reloaded keys"), 0);
}

/// `POST /admin/reload[?dry_run=true]` (the live page's Check and Apply): the check changes
/// nothing and says which changed keys apply now and which need a restart; applying puts them in
/// force; a file with problems is 422 with every problem (never a key), and nothing changes.
#[tokio::test]
async fn the_admin_api_checks_the_file_says_what_would_change_then_applies_it() {
    let sim = sim().await;
    let setup = Setup::new();
    setup.write(&yaml("127.0.0.1:0", &sim.url(), 64, &client_line("aider", AIDER_KEY, "{}")));
    let (gw, log) = setup.start();
    let reload = |dry_run: bool| {
        let url = format!("{}/admin/reload{}", gw.url, if dry_run { "?dry_run=true" } else { "" });
        async move {
            let r = client().post(url).send().await.expect("send");
            (r.status().as_u16(), r.json::<Value>().await.expect("json"))
        }
    };
    let (status, same) = reload(true).await;
    assert_eq!(status, 200, "{same}");
    assert_eq!(
        (same["ok"].clone(), same["applies_now"].clone(), same["needs_restart"].clone()),
        (json!(true), json!([]), json!([]))
    );
    assert_eq!(same["config"], json!(std::fs::canonicalize(setup.config()).expect("path")));

    // zed comes, and the model's queue changes (a restart's business).
    let clients = client_line("aider", AIDER_KEY, "{}") + &client_line("zed", ZED_KEY, "{}");
    setup.write(&yaml("127.0.0.1:0", &sim.url(), 8, &clients));
    let (status, check) = reload(true).await;
    assert_eq!(status, 200, "{check}");
    assert_eq!(check["applies_now"], json!(["clients"]), "{check}");
    assert_eq!(check["needs_restart"], json!(["models"]), "{check}");
    assert_eq!(check["applied"], false);
    assert_eq!(status_for(&gw, ZED_KEY).await, 401, "a check changes nothing");
    let (status, applied) = reload(false).await;
    assert_eq!((status, applied["applied"].clone()), (200, json!(true)), "{applied}");
    assert_eq!(status_for(&gw, ZED_KEY).await, 200, "applied at once");
    eventually("the reload logged", || async { log_lines_with(&log, "reloaded keys, clients and limits") == 1 }).await;

    // A key pasted where its digest goes: 422, every problem, nothing changed, no key quoted.
    let pasted = "sk-pasted-the-key-itself-7f3a";
    setup.write(&yaml("127.0.0.1:0", &sim.url(), 8, &format!("  zed: {{key_sha256: '{pasted}'}}\n")));
    for dry_run in [true, false] {
        let (status, refused) = reload(dry_run).await;
        assert_eq!((status, refused["ok"].clone(), refused["applied"].clone()), (422, json!(false), json!(false)));
        let problems = refused["problems"].as_array().expect("problems");
        assert!(
            problems.iter().any(|p| p.as_str().is_some_and(|p| p.starts_with("clients.zed.key_sha256:"))),
            "{refused}"
        );
        assert!(!refused.to_string().contains(pasted), "a key is never quoted: {refused}");
    }
    assert_eq!(status_for(&gw, AIDER_KEY).await, 200, "the keys in force stay");
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn mlxgate_reload_signals_the_running_gateway_and_says_why_not_without_one() {
    let sim = sim().await;
    let setup = Setup::new();
    let listen = format!("127.0.0.1:{}", free_port());
    setup.write(&yaml(&listen, &sim.url(), 64, &client_line("aider", AIDER_KEY, "{}")));
    let config = setup.config().display().to_string();

    let none = setup.reload_command(&["--config", &config]);
    assert_eq!(none.status.code(), Some(1));
    assert!(text(&none.stderr).contains("no gateway is running on port"), "{}", text(&none.stderr));

    let (gw, log) = setup.start();
    let pid_file = Path::new(&setup.runtime()).join("mlxgate").join(format!("gateway-{}.pid", &listen[10..]));
    eventually("the pid file written", || async { pid_file.is_file() }).await;

    let clients = client_line("aider", AIDER_KEY, "{}") + &client_line("zed", ZED_KEY, "{}");
    setup.write(&yaml(&listen, &sim.url(), 64, &clients));
    let reloaded = setup.reload_command(&["--config", &config]);
    assert_eq!(reloaded.status.code(), Some(0), "{}", text(&reloaded.stderr));
    assert!(text(&reloaded.stdout).contains(&format!("pid {}", gw.child.id())), "{}", text(&reloaded.stdout));
    eventually("zed's key accepted", || async { status_for(&gw, ZED_KEY).await == 200 }).await;

    // A key from the environment: the gateway's, which this shell does not have. The command
    // says so and signals; the gateway resolves it from its own environment.
    let with_env = format!("{clients}  ops: {{key: '${{RELOAD_TEST_KEY}}'}}\n");
    setup.write(&yaml(&listen, &sim.url(), 64, &with_env));
    let from_env = setup.reload_command(&["--config", &config]);
    assert_eq!(from_env.status.code(), Some(0), "{}", text(&from_env.stderr));
    assert!(text(&from_env.stderr).contains("RELOAD_TEST_KEY is not set in this shell"), "{}", text(&from_env.stderr));
    eventually("the key from the gateway's environment accepted", || async { status_for(&gw, ENV_KEY).await == 200 })
        .await;
    setup.write(&yaml(&listen, &sim.url(), 64, &clients));
    assert_eq!(setup.reload_command(&["--config", &config]).status.code(), Some(0));
    eventually("and removed again", || async { status_for(&gw, ENV_KEY).await == 401 }).await;

    // An invalid file is refused before the gateway is bothered: it says so and what is wrong.
    let unknown_model = format!("{clients}  bad: {{key_sha256: {}, models: [nope]}}\n", sha256_hex(CURSOR_KEY));
    setup.write(&yaml(&listen, &sim.url(), 64, &unknown_model));
    let refused = setup.reload_command(&["--config", &config]);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = text(&refused.stderr);
    assert!(stderr.contains("not reloaded") && stderr.contains("clients.bad.models"), "{stderr}");
    eventually("the first reloads logged", || async { log_lines_with(&log, "reloaded keys") == 3 }).await;
    assert_eq!(log_lines_with(&log, "SIGHUP received"), 3, "not signalled for the invalid file");

    // --pid names a process that is no gateway: refused, not signalled.
    let stranger = setup.reload_command(&["--pid", &not_a_gateway_pid().to_string()]);
    assert_eq!(stranger.status.code(), Some(1));
    assert!(text(&stranger.stderr).contains("not an mlxgate gateway"), "{}", text(&stranger.stderr));

    // Stopped, the gateway takes its pid file with it.
    let pid = i32::try_from(gw.child.id()).expect("pid");
    kill(Pid::from_raw(pid), Signal::SIGTERM).expect("SIGTERM");
    assert!(gw.exit_status().await.success());
    assert!(!pid_file.exists(), "the pid file is removed at exit");
    setup.write(&yaml(&listen, &sim.url(), 64, &clients));
    let gone = setup.reload_command(&["--config", &config]);
    assert_eq!(gone.status.code(), Some(1));
    assert!(text(&gone.stderr).contains("no gateway is running on port"), "{}", text(&gone.stderr));
}

/// A live process that is not mlxgate: this test binary itself (named `reload-…`).
fn not_a_gateway_pid() -> u32 {
    std::process::id()
}
