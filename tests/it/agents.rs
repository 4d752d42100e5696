//! Real coding agents, each running one headless turn through the `mlxgate` binary in front of
//! `mlxgate-sim` scripted as their backend: the script makes the agent call its own shell tool
//! (or, for llm, a built-in tool; for Aider, which calls no tools, an edit block), the agent runs
//! it and sends the result back, and the simulator then answers in text with a marker. Each test
//! checks what the agent printed, what the tool did, and what the backend received.
//!
//! The agents are installed pinned by `scripts/setup-agents` (npm packages in `.agents/` — Claude
//! Code among them, which speaks the Anthropic Messages API —, Aider in
//! `.venv-aider`, llm in `.venv-agents`). A missing agent fails the test, saying how to install
//! it; with `MLXGATE_SKIP_AGENTS=1` (never under `CI`) the test says why it does not run instead.
//! Every agent runs with a temp HOME and work directory, no standard input, its telemetry,
//! update checks and network fetches switched off, and a bound on its run time.
//!
//! `MLXGATE_AGENTS_RECORD=DIR` writes every request body the backend received to
//! `DIR/AGENT-N.json` (unscrubbed: tests/data/agents/README.md says how the committed ones were
//! scrubbed).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::common::*;
use serde_json::{Value, json};

/// The most one agent's turn may take: a hung agent fails the test instead of hanging CI. A turn
/// takes 2–15 s here (Aider's imports are the slowest).
const AGENT_TIMEOUT: Duration = Duration::from_secs(300);

/// What the scripted shell command prints (and writes to `tool-output.txt`): the tool result
/// the agent must send back.
const TOOL_RESULT: &str = "sim-tool-result-5c1e";

/// The text the simulator answers with once the tool result is back.
const MARKER: &str = "AGENT-MARKER-7f3a";

/// The shell command every shell-tool script asks for.
fn shell_command() -> String {
    format!("echo {TOOL_RESULT} | tee tool-output.txt")
}

/// A script: call `tool` (any of the names) with `arguments`, then answer with the marker;
/// side requests get a plain title.
fn call_then_answer(tool: &[&str], arguments: Value) -> String {
    json!({
        "turns": [
            {"calls": [{"tool": tool, "arguments": arguments}]},
            {"text": format!("The tool ran and printed its result. {MARKER}")}
        ],
        "text": "Scripted side answer",
        "json": {"next_speaker": "user", "reasoning": "the turn is complete"}
    })
    .to_string()
}

/// An agent's program under the repository, if installed; see the module header for a missing one.
fn agent(relative: &str) -> Option<PathBuf> {
    let program = Path::new(ROOT).join(relative);
    if program.is_file() {
        return Some(program);
    }
    let why = format!("{relative} is missing: run scripts/setup-agents");
    let skip = std::env::var_os("MLXGATE_SKIP_AGENTS").is_some_and(|v| v == "1");
    assert!(skip && std::env::var_os("CI").is_none(), "this test needs the agent: {why}");
    eprintln!("SKIPPED (MLXGATE_SKIP_AGENTS=1): {why}");
    None
}

/// The simulator with `script`, the gateway in front of it (model `qwen`), and a temp HOME and
/// work directory.
struct Rig {
    _sim: KillOnDrop,
    sim_url: String,
    gateway: GatewayBinary,
    log: LogLines,
    dir: tempfile::TempDir,
}

impl Rig {
    fn new(script: &str) -> Rig {
        Rig::with_config(script, "")
    }

    /// The same with `extra` appended to the gateway's configuration.
    fn with_config(script: &str, extra: &str) -> Rig {
        let (sim, sim_url) = spawn_sim(&["--ttft-ms", "0", "--tokens-per-second", "1000", "--script-json", script]);
        let config = format!("{}{extra}", one_model_yaml(&sim_url, 4, 16));
        let (gateway, log) = gateway_binary_logged(&config, &[], "info");
        let dir = tempfile::tempdir().expect("tempdir");
        for sub in ["home", "work"] {
            std::fs::create_dir(dir.path().join(sub)).expect("mkdir");
        }
        Rig { _sim: sim, sim_url, gateway, log, dir }
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// The gateway's OpenAI base URL (`…/v1`); Anthropic clients take the bare [`GatewayBinary::url`].
    fn base_url(&self) -> String {
        format!("{}/v1", self.gateway.url)
    }

    /// Runs `program` in the work directory with only PATH, HOME, LANG and `env` set, no
    /// standard input, bounded by [`AGENT_TIMEOUT`].
    async fn run(&self, name: &str, program: &Path, args: &[&str], env: &[(&str, String)]) -> Run {
        let out = self.dir.path().join(format!("{name}.stdout"));
        let err = self.dir.path().join(format!("{name}.stderr"));
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .current_dir(self.work())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.home())
            .env("LANG", "C.UTF-8")
            .env("TERM", "dumb")
            .env("NO_COLOR", "1")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).expect("stdout file"))
            .stderr(std::fs::File::create(&err).expect("stderr file"))
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("{name} ({}) does not start: {e}", program.display()));
        let status = tokio::time::timeout(AGENT_TIMEOUT, child.wait()).await;
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        let (stdout, stderr) = (read(&out), read(&err));
        let Ok(status) = status else {
            let _ = child.kill().await;
            panic!("{name} did not finish its turn in {AGENT_TIMEOUT:?}\nstdout:\n{stdout}\nstderr:\n{stderr}");
        };
        let status = status.expect("wait");
        let requests: Vec<Value> = client()
            .get(format!("{}/sim/requests", self.sim_url))
            .send()
            .await
            .expect("sim requests")
            .json()
            .await
            .expect("json");
        record(name, &requests);
        let run = Run { name: name.to_string(), status, stdout, stderr, requests };
        assert!(run.status.success(), "{name} failed ({}): {}", run.status, run.output());
        run
    }

    /// The gateway's access log checked against what the backend served: one line per request
    /// the agent sent (each a request the backend answered: the scripted backend never
    /// refuses), at the agent's API path (`/v1/chat/completions`, `/v1/responses` for Codex),
    /// 200, `ok`, the public model `qwen`, a request id; and no log line holds the agent's key,
    /// the answer's or the tool's text.
    async fn check_access_log(&self, run: &Run, path: &str, key: &str) {
        assert!(!run.requests.is_empty(), "{}: the backend received nothing", run.name);
        let access = || -> Vec<HashMap<String, Value>> {
            let lines = self.log.lock().expect("log lines");
            // Not the test's own /sim/requests, nor a reachability check (Claude Code's
            // `HEAD /api/hello`: face `health`), which reaches no backend.
            lines
                .iter()
                .filter_map(|l| access_fields(l))
                .filter(|f| f["path"] != "/sim/requests" && f["face"] != "health")
                .collect()
        };
        // A stream's line is written at its end, which the agent may not have waited for.
        eventually(&format!("{}: one access line per request", run.name), || async {
            access().len() >= run.requests.len()
        })
        .await;
        let access = access();
        assert_eq!(access.len(), run.requests.len(), "{}: {access:?}", run.name);
        for line in &access {
            let field = |k: &str| line.get(k).cloned().unwrap_or(Value::Null);
            assert_eq!(field("path"), path, "{}: {line:?}", run.name);
            assert_eq!(field("status"), 200, "{}: {line:?}", run.name);
            assert_eq!(field("outcome"), "ok", "{}: {line:?}", run.name);
            assert_eq!(field("model"), "qwen", "{}: {line:?}", run.name);
            assert!(field("request_id").as_str().is_some_and(|id| !id.is_empty()), "{}: {line:?}", run.name);
        }
        let lines = self.log.lock().expect("log lines").clone();
        assert!(
            lines.iter().all(|l| !l.contains(MARKER) && !l.contains(TOOL_RESULT) && !l.contains(key)),
            "{}: the gateway logged a key, answer or tool text: {lines:?}",
            run.name
        );
    }
}

/// What one agent run left behind.
struct Run {
    name: String,
    status: std::process::ExitStatus,
    stdout: String,
    stderr: String,
    /// The request bodies the simulator received (through the gateway), oldest first.
    requests: Vec<Value>,
}

impl Run {
    fn output(&self) -> String {
        format!("\nstdout:\n{}\nstderr:\n{}", self.stdout, self.stderr)
    }

    /// The agent printed the simulator's final answer.
    fn printed_the_marker(&self) {
        assert!(self.stdout.contains(MARKER), "{}: no marker in what it printed{}", self.name, self.output());
    }

    /// The main requests: those that offer tools.
    fn with_tools(&self) -> Vec<&Value> {
        self.requests.iter().filter(|r| r["tools"].as_array().is_some_and(|t| !t.is_empty())).collect()
    }

    /// The tool round trip: a request offered `tool`, the simulator called it, and a later request
    /// carries the call and a `tool` message whose content holds `result`.
    fn round_tripped(&self, tool: &str, result: &str) {
        let offered: Vec<&str> = self
            .with_tools()
            .first()
            .map(|r| tools_of(r))
            .unwrap_or_else(|| panic!("{}: no request offered tools: {:?}", self.name, self.requests));
        assert!(offered.contains(&tool), "{}: {tool} not among the tools it sends: {offered:?}", self.name);
        let back = self.requests.iter().find(|r| {
            let messages = r["messages"].as_array().map_or(&[][..], Vec::as_slice);
            let called = messages
                .iter()
                .any(|m| m["tool_calls"].as_array().is_some_and(|c| c.iter().any(|c| c["function"]["name"] == tool)));
            called && messages.iter().any(|m| m["role"] == "tool" && m["content"].to_string().contains(result))
        });
        assert!(back.is_some(), "{}: no request sent the {tool} result back: {:#?}", self.name, self.requests);
    }

    /// Prints what the agent sends, for the record (`--no-capture` shows it).
    fn describe(&self) {
        for r in &self.requests {
            eprintln!(
                "{}: {} bytes, stream {}, max_tokens {}, {} messages, tools {:?}, response_format {}",
                self.name,
                r.to_string().len(),
                r["stream"],
                r.get("max_tokens").or_else(|| r.get("max_completion_tokens")).unwrap_or(&Value::Null),
                r["messages"].as_array().map_or(0, Vec::len),
                tools_of(r),
                r.get("response_format").unwrap_or(&Value::Null),
            );
        }
    }
}

fn tools_of(request: &Value) -> Vec<&str> {
    request["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
        .collect()
}

/// With `MLXGATE_AGENTS_RECORD=DIR`, writes each request body to `DIR/AGENT-N.json`.
fn record(agent: &str, requests: &[Value]) {
    let Some(dir) = std::env::var_os("MLXGATE_AGENTS_RECORD") else { return };
    std::fs::create_dir_all(&dir).expect("record dir");
    for (n, r) in requests.iter().enumerate() {
        let mut body = r.clone();
        if let Some(o) = body.as_object_mut() {
            o.remove("_path");
            o.remove("_authorization");
        }
        let path = Path::new(&dir).join(format!("{agent}-{}.json", n + 1));
        std::fs::write(path, serde_json::to_string_pretty(&body).expect("json")).expect("write");
    }
}

/// Checks that the shell command really ran in the work directory.
fn tool_ran(rig: &Rig, run: &Run) {
    let written = std::fs::read_to_string(rig.work().join("tool-output.txt")).unwrap_or_default();
    assert_eq!(written.trim(), TOOL_RESULT, "{}: the shell tool did not run{}", run.name, run.output());
}

#[tokio::test]
async fn opencode_runs_a_turn_with_its_bash_tool() {
    let Some(opencode) = agent(".agents/node_modules/.bin/opencode") else { return };
    let rig = Rig::new(&call_then_answer(
        &["bash"],
        json!({"command": shell_command(), "description": "Print and save the tool result"}),
    ));
    // No `limit` on the model: with a context limit under prompt + its 32000-token output cap,
    // OpenCode compacts the conversation before every turn.
    let config = json!({
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": false,
        "share": "disabled",
        "model": "mlxgate/qwen",
        "small_model": "mlxgate/qwen",
        "provider": {"mlxgate": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "mlxgate",
            "options": {"baseURL": rig.base_url(), "apiKey": "sk-opencode-test"},
            "models": {"qwen": {"name": "qwen", "tool_call": true}}
        }},
        "permission": {"bash": "allow", "edit": "allow"}
    });
    // At start OpenCode runs `npm install @opencode-ai/plugin` (types for plugins) in the background in
    // each config directory unless it finds node_modules and a package.json + lock naming it.
    let config_dir = rig.home().join(".config/opencode");
    std::fs::create_dir_all(config_dir.join("node_modules")).expect("mkdir");
    let plugin = json!({"@opencode-ai/plugin": "1.18.33"});
    std::fs::write(config_dir.join("package.json"), json!({"dependencies": plugin}).to_string()).expect("write");
    let lock = json!({"lockfileVersion": 3, "packages": {"": {"dependencies": plugin}}});
    std::fs::write(config_dir.join("package-lock.json"), lock.to_string()).expect("write");
    let home = rig.home().display().to_string();
    let env = [
        ("OPENCODE_CONFIG_CONTENT", config.to_string()),
        // models.dev's catalogue, self-update, LSP server downloads, sharing, default plugins.
        ("OPENCODE_DISABLE_MODELS_FETCH", "1".into()),
        ("OPENCODE_DISABLE_AUTOUPDATE", "1".into()),
        ("OPENCODE_DISABLE_LSP_DOWNLOAD", "1".into()),
        ("OPENCODE_DISABLE_SHARE", "1".into()),
        ("OPENCODE_DISABLE_DEFAULT_PLUGINS", "1".into()),
        ("XDG_CONFIG_HOME", format!("{home}/.config")),
        ("XDG_DATA_HOME", format!("{home}/.local/share")),
        ("XDG_CACHE_HOME", format!("{home}/.cache")),
        ("XDG_STATE_HOME", format!("{home}/.local/state")),
    ];
    let run =
        rig.run("opencode", &opencode, &["run", "Run the shell command that prints the tool result."], &env).await;
    run.describe();
    run.printed_the_marker();
    tool_ran(&rig, &run);
    run.round_tripped("bash", TOOL_RESULT);
    // Its side request: a title, with no tools.
    assert!(run.requests.iter().any(|r| r["tools"].is_null() && r.to_string().contains("title")), "{:?}", run.requests);
    rig.check_access_log(&run, "/v1/chat/completions", "sk-opencode-test").await;
}

#[tokio::test]
async fn qwen_code_runs_a_turn_with_its_shell_tool() {
    let Some(qwen) = agent(".agents/node_modules/.bin/qwen") else { return };
    let rig = Rig::new(&call_then_answer(
        &["run_shell_command"],
        json!({"command": shell_command(), "description": "Print and save the tool result"}),
    ));
    let settings = json!({
        "security": {"auth": {"selectedType": "openai"}},
        "model": {"name": "qwen"},
        "privacy": {"usageStatisticsEnabled": false},
        "telemetry": {"enabled": false},
        "general": {"disableAutoUpdate": true, "disableUpdateNag": true}
    });
    std::fs::create_dir(rig.home().join(".qwen")).expect("mkdir");
    std::fs::write(rig.home().join(".qwen/settings.json"), settings.to_string()).expect("settings");
    let env = [
        ("OPENAI_BASE_URL", rig.base_url()),
        ("OPENAI_API_KEY", "sk-qwen-test".into()),
        ("OPENAI_MODEL", "qwen".into()),
        ("QWEN_CODE_SUPPRESS_YOLO_WARNING", "1".into()),
    ];
    let run = rig
        .run("qwen-code", &qwen, &["-p", "Run the shell command that prints the tool result.", "--yolo"], &env)
        .await;
    run.describe();
    run.printed_the_marker();
    tool_ran(&rig, &run);
    run.round_tripped("run_shell_command", TOOL_RESULT);
    rig.check_access_log(&run, "/v1/chat/completions", "sk-qwen-test").await;
}

#[tokio::test]
async fn codex_runs_a_turn_with_its_exec_tool_over_the_responses_api() {
    let Some(codex) = agent(".agents/node_modules/.bin/codex") else { return };
    let rig = Rig::new(&call_then_answer(&["exec_command", "shell_command", "shell"], json!({"cmd": shell_command()})));
    // Codex speaks only the Responses API: say so plainly while the gateway lacks it.
    let probe = client()
        .post(format!("{}/responses", rig.base_url()))
        .json(&json!({"model": "qwen", "input": "hi"}))
        .send()
        .await
        .expect("probe");
    assert_ne!(
        probe.status(),
        404,
        "Codex CLI needs POST /v1/responses, and this gateway answers 404 (issue 18 item 2, the Responses API, is not here yet)"
    );
    let codex_home = rig.home().join(".codex");
    std::fs::create_dir(&codex_home).expect("mkdir");
    let config = format!(
        "model = \"qwen\"\nmodel_provider = \"mlxgate\"\ncheck_for_update_on_startup = false\n\n\
         [model_providers.mlxgate]\nname = \"mlxgate\"\nbase_url = \"{}\"\nwire_api = \"responses\"\n\
         env_key = \"MLXGATE_API_KEY\"\nrequest_max_retries = 0\nstream_max_retries = 0\n\n\
         [analytics]\nenabled = false\n\n\
         [features]\nplugins = false\nremote_plugin = false\napps = false\n",
        rig.base_url()
    );
    // Its plugins, remote plugins and apps reach github.com and chatgpt.com at start: off.
    std::fs::write(codex_home.join("config.toml"), config).expect("config");
    let env = [("CODEX_HOME", codex_home.display().to_string()), ("MLXGATE_API_KEY", "sk-codex-test".into())];
    let args = [
        "exec",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "Run the shell command that prints the tool result.",
    ];
    let run = rig.run("codex", &codex, &args, &env).await;
    run.describe();
    run.printed_the_marker();
    tool_ran(&rig, &run);
    run.round_tripped("exec_command", TOOL_RESULT);
    rig.check_access_log(&run, "/v1/responses", "sk-codex-test").await;
}

#[tokio::test]
async fn aider_applies_an_edit_from_the_answer() {
    let Some(aider) = agent(".venv-aider/bin/aider") else { return };
    // Aider sends no tools: its "tool" is the edit block in the answer, which it applies.
    let edit =
        format!("I will create the file.\n\nnotes.txt\n```\n<<<<<<< SEARCH\n=======\n{MARKER}\n>>>>>>> REPLACE\n```\n");
    let rig = Rig::new(&json!({"text": edit}).to_string());
    // Its model metadata given locally, so that Aider does not fetch litellm's price list.
    let metadata = rig.dir.path().join("model-metadata.json");
    let model = json!({"openai/qwen": {"max_input_tokens": 32768, "max_output_tokens": 4096, "max_tokens": 4096,
        "input_cost_per_token": 0, "output_cost_per_token": 0, "litellm_provider": "openai", "mode": "chat"}});
    std::fs::write(&metadata, model.to_string()).expect("metadata");
    let base = rig.base_url();
    let args = [
        "--model",
        "openai/qwen",
        "--model-metadata-file",
        metadata.to_str().expect("utf-8 path"),
        "--openai-api-base",
        &base,
        "--openai-api-key",
        "sk-aider-test",
        "--edit-format",
        "diff",
        "--message",
        "Create notes.txt holding the marker.",
        "--yes-always",
        "--no-git",
        "--no-check-update",
        "--no-show-release-notes",
        "--analytics-disable",
        "--no-pretty",
        "--no-show-model-warnings",
        "--no-detect-urls",
    ];
    let run = rig.run("aider", &aider, &args, &[("LITELLM_LOCAL_MODEL_COST_MAP", "True".into())]).await;
    run.describe();
    run.printed_the_marker();
    assert!(run.stdout.contains("Applied edit to notes.txt"), "{}", run.output());
    let notes = std::fs::read_to_string(rig.work().join("notes.txt")).unwrap_or_default();
    assert_eq!(notes.trim(), MARKER, "the edit was applied");
    assert!(run.requests.iter().all(|r| r["tools"].is_null()), "Aider sends no tools");
    rig.check_access_log(&run, "/v1/chat/completions", "sk-aider-test").await;
}

#[tokio::test]
async fn llm_runs_a_tool_chain() {
    let Some(llm) = agent(".venv-agents/bin/llm") else { return };
    let rig = Rig::new(&call_then_answer(&["llm_version"], json!({})));
    let config = rig.home().join("llm");
    std::fs::create_dir(&config).expect("mkdir");
    let models = format!(
        "- model_id: mlxgate-qwen\n  model_name: qwen\n  api_base: \"{}\"\n  api_key_name: mlxgate\n  supports_tools: true\n",
        rig.base_url()
    );
    std::fs::write(config.join("extra-openai-models.yaml"), models).expect("models");
    std::fs::write(config.join("keys.json"), json!({"mlxgate": "sk-llm-test"}).to_string()).expect("keys");
    let env = [("LLM_USER_PATH", config.display().to_string())];
    let args = ["-m", "mlxgate-qwen", "-T", "llm_version", "--td", "Which version of llm is this?"];
    let run = rig.run("llm", &llm, &args, &env).await;
    run.describe();
    run.printed_the_marker();
    run.round_tripped("llm_version", "0.36");
    rig.check_access_log(&run, "/v1/chat/completions", "sk-llm-test").await;
}

#[tokio::test]
async fn claude_code_runs_a_turn_with_its_bash_tool_over_the_messages_api() {
    let Some(claude) = agent(".agents/node_modules/.bin/claude") else { return };
    let rig = Rig::new(&call_then_answer(
        &["Bash"],
        json!({"command": shell_command(), "description": "Print and save the tool result"}),
    ));
    let env = [
        ("ANTHROPIC_BASE_URL", rig.gateway.url.clone()),
        ("ANTHROPIC_API_KEY", "sk-claude-test".into()),
        // A local model's name (an unknown one: Claude Code then takes the window below and
        // says so on stderr), the small model the same.
        ("ANTHROPIC_MODEL", "qwen".into()),
        ("ANTHROPIC_SMALL_FAST_MODEL", "qwen".into()),
        ("ANTHROPIC_DEFAULT_HAIKU_MODEL", "qwen".into()),
        ("CLAUDE_CODE_MAX_CONTEXT_TOKENS", "32768".into()),
        // Update checks, telemetry, error reports. Not CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC:
        // it would also drop the `HEAD /api/hello` reachability check this test wants to see.
        ("DISABLE_AUTOUPDATER", "1".into()),
        ("DISABLE_TELEMETRY", "1".into()),
        ("DISABLE_ERROR_REPORTING", "1".into()),
    ];
    // `--allowedTools Bash` lets the scripted command run without a prompt
    // (`--dangerously-skip-permissions` is refused to root, as CI containers often are).
    let args = ["-p", "Run the shell command that prints the tool result.", "--allowedTools", "Bash"];
    let run = rig.run("claude-code", &claude, &args, &env).await;
    run.describe();
    run.printed_the_marker();
    tool_ran(&rig, &run);
    // The tool_use went out as a Bash call, and its tool_result came back as the tool message.
    run.round_tripped("Bash", TOOL_RESULT);
    // Streamed all through, with no non-streaming fallback (which would be a request with
    // `stream` false after a stream that Claude Code could not read).
    assert!(run.requests.iter().all(|r| r["stream"] == true), "{:#?}", run.requests);
    assert_eq!(run.with_tools().len(), 2, "one request per turn: {}", run.output());
    rig.check_access_log(&run, "/v1/messages", "sk-claude-test").await;
    // Its reachability check (sent at start, not awaited), answered without a key.
    let hello = || {
        let lines = rig.log.lock().expect("log lines");
        lines.iter().filter_map(|l| access_fields(l)).find(|f| f["path"] == "/api/hello" || f["path"] == "/")
    };
    eventually(&format!("a reachability check in the access log{}", run.output()), || async { hello().is_some() })
        .await;
    let hello = hello().expect("seen");
    assert_eq!((&hello["method"], &hello["status"]), (&json!("HEAD"), &json!(200)), "{hello:?}");
}

#[tokio::test]
async fn claude_code_runs_on_its_own_model_names_through_aliases() {
    let Some(claude) = agent(".agents/node_modules/.bin/claude") else { return };
    let rig = Rig::with_config(
        &call_then_answer(&["Bash"], json!({"command": shell_command(), "description": "Print the tool result"})),
        "aliases:\n  claude-*: qwen\n",
    );
    // No model named: Claude Code sends its default Claude name, which the alias maps to qwen.
    let env = [
        ("ANTHROPIC_BASE_URL", rig.gateway.url.clone()),
        ("ANTHROPIC_API_KEY", "sk-claude-test".into()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
        ("DISABLE_AUTOUPDATER", "1".into()),
        ("DISABLE_TELEMETRY", "1".into()),
        ("DISABLE_ERROR_REPORTING", "1".into()),
    ];
    let args = ["-p", "Run the shell command that prints the tool result.", "--allowedTools", "Bash"];
    let run = rig.run("claude-code-aliased", &claude, &args, &env).await;
    run.printed_the_marker();
    tool_ran(&rig, &run);
    run.round_tripped("Bash", TOOL_RESULT);
    rig.check_access_log(&run, "/v1/messages", "sk-claude-test").await;
    let aliases: Vec<Value> = rig
        .log
        .lock()
        .expect("log lines")
        .iter()
        .filter_map(|l| access_fields(l))
        .filter(|f| f["path"] == "/v1/messages")
        .map(|f| f.get("alias").cloned().unwrap_or(Value::Null))
        .collect();
    assert!(
        aliases.len() == 2 && aliases.iter().all(|a| a.as_str().is_some_and(|a| a.starts_with("claude-"))),
        "every request came by a Claude name: {aliases:?}"
    );
}
