use std::time::Duration;

use super::raw::parse_size;
use super::validate::DEFAULT_MAX_QUEUE;
use super::{BalanceConfig, BalancePolicy, Config, ConfigError, HealthCheck, RemoteHealth};
use crate::kinds::{Kind, launch};

fn no_env(_: &str) -> Option<String> {
    None
}

/// The `model` value `model`'s first backend is sent.
fn upstream<'a>(c: &'a Config, model: &str) -> &'a str {
    let m = &c.models[model];
    m.upstream_model_for(&c.backends[&m.backends[0]])
}

fn parse(text: &str) -> Config {
    Config::parse(text, &no_env).unwrap_or_else(|e| panic!("{e}"))
}

fn problems(text: &str) -> Vec<String> {
    match Config::parse(text, &no_env) {
        Ok(_) => vec![],
        Err(ConfigError::Invalid(p)) => p.iter().map(ToString::to_string).collect(),
        Err(e) => vec![e.to_string()],
    }
}

const GOOD: &str = "
listen: 127.0.0.1:9000
backends:
  local: {url: 'http://127.0.0.1:8101/', max_concurrency: 2}
models:
  qwen: {backend: local, upstream_model: tiny-qwen3, max_queue: 5, max_wait: 2m}
  other: {backend: local}
";

#[test]
fn the_access_log_is_on_unless_switched_off() {
    assert!(Config::parse(GOOD, &no_env).expect("valid").access_log);
    let off = format!("access_log: false\n{GOOD}");
    assert!(!Config::parse(&off, &no_env).expect("valid").access_log);
    assert!(!problems(&format!("access_log: maybe\n{GOOD}")).is_empty());
}

#[test]
fn parses_the_documented_shape_with_defaults() {
    let c = Config::parse(GOOD, &no_env).expect("valid");
    assert_eq!(c.listen.port(), 9000);
    assert_eq!(c.backends["local"].url, "http://127.0.0.1:8101");
    assert_eq!(c.backends["local"].max_concurrency, 2);
    assert_eq!(upstream(&c, "qwen"), "tiny-qwen3");
    assert_eq!(c.models["qwen"].max_wait, Duration::from_secs(120));
    assert_eq!(upstream(&c, "other"), "other");
    assert_eq!(c.models["other"].max_queue, DEFAULT_MAX_QUEUE);
}

#[test]
fn lists_every_problem_with_its_path() {
    let p = problems(
        "
backends:
  local: {url: 'ftp://x', max_concurrency: 0}
models:
  qwen: {backend: qwen-local}
  bad: {backend: local, max_wait: 30}
  typo: {backend: local, max_queu: 3}
",
    );
    assert!(p.iter().any(|l| l.starts_with("backends.local.url:")), "{p:?}");
    assert!(p.iter().any(|l| l == "backends.local.max_concurrency: must be at least 1"), "{p:?}");
    assert!(p.iter().any(|l| l.starts_with("models.qwen.backend: no backend named \"qwen-local\"")), "{p:?}");
    assert!(p.iter().any(|l| l.starts_with("models.bad.max_wait:") && l.contains("30s")), "{p:?}");
    assert!(p.iter().any(|l| l.starts_with("models.typo.max_queu: unknown field")), "{p:?}");
    assert_eq!(p.len(), 5, "{p:?}");
}

#[test]
fn unknown_top_level_key_is_an_error() {
    let p = problems(&format!("{GOOD}\nlisten_port: 3\n"));
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].contains("listen_port"), "{p:?}");
}

#[test]
fn substitutes_environment_variables_with_defaults_and_types() {
    let env = |name: &str| match name {
        "PORT" => Some("8202".to_string()),
        "QUEUE" => Some("7".to_string()),
        _ => None,
    };
    let text = "
listen: 127.0.0.1:${GW_PORT:-8123}
backends:
  local: {url: 'http://127.0.0.1:${PORT}'}
models:
  qwen: {backend: local, max_queue: '${QUEUE}', upstream_model: 'a$${b}'}
";
    let c = Config::parse(text, &env).expect("valid");
    assert_eq!(c.listen.port(), 8123);
    assert_eq!(c.backends["local"].url, "http://127.0.0.1:8202");
    assert_eq!(c.models["qwen"].max_queue, 7);
    assert_eq!(upstream(&c, "qwen"), "a${b}");
}

#[test]
fn unset_variable_is_reported_at_its_path() {
    let text = "
backends:
  local: {url: '${BACKEND_URL}'}
models:
  qwen: {backend: local}
";
    let p = problems(text);
    assert!(p[0].starts_with("backends.local.url: environment variable BACKEND_URL is not set"), "{p:?}");
}

#[test]
fn managed_backends_are_checked_and_filled_in() {
    let c = Config::parse(
        "
backends:
  native: {kind: mlx-lm, model: /m, port: 8101, idle_timeout: 10m}
  tool: {kind: custom, command: [srv, --port, '{port}'], port: 8102, gpu: false}
models:
  qwen: {backend: native}
  t: {backend: tool}
",
        &no_env,
    )
    .expect("valid");
    let native = c.backends["native"].managed.as_ref().expect("managed");
    assert_eq!(
        launch::command(&native.template, &native.model, native.port),
        ["mlx_lm.server", "--model", "/m", "--host", "127.0.0.1", "--port", "8101"]
    );
    assert!(native.warmup && native.gpu && !native.preload);
    assert_eq!(native.idle_timeout, Some(Duration::from_secs(600)));
    assert_eq!(c.backends["native"].url, "http://127.0.0.1:8101");
    assert_eq!(upstream(&c, "qwen"), "/m", "a managed server knows its model by its path");
    let tool = c.backends["tool"].managed.as_ref().expect("managed");
    assert_eq!(launch::command(&tool.template, &tool.model, tool.port), ["srv", "--port", "8102"]);
    assert!(!tool.warmup && !tool.gpu);

    let p = problems(
        "
listen: 127.0.0.1:8101
backends:
  both: {url: 'http://x:1', kind: mlx-lm, model: m, port: 9000}
  noport: {kind: mlx-lm, model: m}
  nocmd: {kind: custom, port: 9001}
  nomodel: {kind: mlx-openai-server, port: 9002}
  a: {kind: mlx-lm, model: m, port: 8101, preload: true}
  b: {kind: mlx-lm, model: m, port: 8101, preload: true}
  remote: {url: 'http://x:1', idle_timeout: 5m}
models:
  m: {backend: a}
",
    );
    for expected in [
        "backends.both.port: only for managed backends",
        "backends.both.model: only for managed backends",
        "backends.noport.port: a managed backend needs a port",
        "backends.nocmd.command: kind: custom needs a command",
        "backends.nomodel.model: the launch command uses {model}",
        "backends.b.port: port 8101 is also backend \"a\"'s",
        "backends.a.port: port 8101 is the gateway's own listen port",
        "backends.b.preload: only one GPU backend can run at a time",
        "backends.remote.idle_timeout: only for managed backends",
    ] {
        assert!(p.iter().any(|l| l.starts_with(expected)), "{expected:?} not in {p:#?}");
    }
}

#[test]
fn omni_server_needs_a_model_and_requests_name_its_path() {
    let c = Config::parse(
        "backends:\n  omni: {kind: mlx-omni-server, model: .cache/tiny-qwen3, port: 9101}\n\
             models:\n  q: {backend: omni}\n",
        &no_env,
    )
    .expect("valid");
    let omni = c.backends["omni"].managed.as_ref().expect("managed");
    assert_eq!(
        launch::command(&omni.template, &omni.model, omni.port),
        ["mlx-omni-server", "--host", "127.0.0.1", "--port", "9101"]
    );
    assert!(omni.warmup, "the warm-up completion is what loads its model");
    assert_eq!(upstream(&c, "q"), ".cache/tiny-qwen3");
    let p = problems("backends:\n  omni: {kind: mlx-omni-server, port: 9101}\nmodels:\n  q: {backend: omni}\n");
    assert!(
        p.iter().any(|l| l.starts_with("backends.omni.model: this kind loads the model each request names")),
        "{p:#?}"
    );
}

#[test]
fn omni_server_relative_model_becomes_absolute_when_loaded_from_a_file() {
    let dir = std::env::temp_dir().join(format!("mlxgate-omni-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("models/tiny")).expect("dir");
    let file = dir.join("gateway.yaml");
    std::fs::write(
        &file,
        "backends:\n  omni: {kind: mlx-omni-server, model: models/tiny, port: 9101}\n\
             models:\n  q: {backend: omni}\n  named: {backend: omni, upstream_model: other}\n",
    )
    .expect("write");
    let c = Config::load(&file).expect("valid");
    let absolute = std::fs::canonicalize(dir.join("models/tiny")).expect("canonical").display().to_string();
    assert_eq!(c.backends["omni"].managed.as_ref().expect("managed").model, absolute, "the warm-up names it");
    assert_eq!(upstream(&c, "q"), absolute);
    assert_eq!(upstream(&c, "named"), "other", "a name written in the file is kept");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_running_server_of_a_kind_that_drops_unknown_models_is_never_sent_the_public_name() {
    let c = Config::parse(
        "backends:\n  vlm: {url: 'http://127.0.0.1:9102', kind: mlx-vlm}\n\
             models:\n  v: {backend: vlm, upstream_model: mlx-community/Qwen3-4B}\n",
        &no_env,
    )
    .expect("valid");
    assert_eq!(upstream(&c, "v"), "mlx-community/Qwen3-4B");
    let p = problems(
        "backends:\n  lm: {url: 'http://127.0.0.1:9101', kind: mlx-lm}\n  \
             vlm: {url: 'http://127.0.0.1:9102', kind: mlx-vlm}\n  \
             omni: {url: 'http://127.0.0.1:9103', kind: mlx-omni-server}\n  \
             o: {kind: omlx, model: /models, port: 9104}\n\
             models:\n  a: {backend: vlm}\n  b: {backend: omni}\n  c: {backend: o}\n  qwen: {backend: lm}\n",
    );
    for expected in [
        "models.qwen.upstream_model: mlx-lm drops its model",
        "models.a.upstream_model: mlx-vlm drops its model",
        "models.b.upstream_model: mlx-omni-server drops its model",
        "models.c.upstream_model: omlx serves each model directory",
    ] {
        assert!(p.iter().any(|l| l.starts_with(expected)), "{expected:?} not in {p:#?}");
    }
}

#[test]
fn normalise_defaults_come_from_the_kind_and_the_file_switches_them() {
    let c = Config::parse(
            "backends:\n  rapid: {url: 'http://10.0.0.2:8000', kind: rapid-mlx}\n  \
             v: {kind: vllm-mlx, model: m, port: 9101}\n  \
             cb: {kind: vllm-mlx, model: m, port: 9102, command: [vllm-mlx, serve, m, --continuous-batching], max_concurrency: 4}\n  \
             o: {kind: mlx-openai-server, model: m, port: 9103, normalise: {hold_abandoned: false, pool_idle_timeout: 2s}}\n\
             models:\n  a: {backend: rapid}\n",
            &no_env,
        )
        .expect("valid");
    let rapid = &c.backends["rapid"];
    assert!(rapid.managed.is_none() && rapid.kind == Kind::RapidMlx, "url + kind: a running server's profile");
    assert!(rapid.normalise.loopback_host);
    assert_eq!(rapid.ready_path, "/health/ready");
    assert!(c.backends["v"].normalise.serialize);
    assert!(!c.backends["cb"].normalise.serialize);
    let o = &c.backends["o"].normalise;
    assert!(!o.hold_abandoned && o.finish_length);
    assert_eq!(o.pool_idle_timeout, Duration::from_secs(2));
    let p = problems(
        "backends:\n  v: {kind: vllm-mlx, model: m, port: 9101, max_concurrency: 2}\n  \
             w: {url: 'http://x:1', command: [s]}\n  \
             z: {url: 'http://x:2', normalise: {pool_idle_timeout: 0s, bogus: true}}\n\
             models:\n  a: {backend: v}\n",
    );
    assert!(
        p.iter()
            .any(|l| l
                .starts_with("backends.v.max_concurrency: vllm-mlx without --continuous-batching serves one request")),
        "{p:#?}"
    );
    assert!(p.iter().any(|l| l.starts_with("backends.w: give either url")), "{p:#?}");
    assert!(p.iter().any(|l| l.contains("bogus")), "{p:#?}");
}

#[test]
fn health_probe_defaults_and_checks() {
    let c = Config::parse(
        "backends:\n  a: {kind: custom, command: [s], port: 9001, health: {interval: 2s, failures: 5}}\n\
             models:\n  m: {backend: a}\n",
        &no_env,
    )
    .expect("valid");
    let health = c.backends["a"].managed.as_ref().expect("managed").health;
    assert_eq!(health, HealthCheck { interval: Duration::from_secs(2), timeout: Duration::from_secs(5), failures: 5 });
    assert_eq!(c.backends["a"].health, None, "a managed server's supervisor probes it");
    let p = problems(
        "backends:\n  a: {kind: custom, command: [s], port: 9001, health: {interval: 0s, timeout: 0s, failures: 0}}\n  \
             e: {kind: custom, command: [s], port: 9002, health: {eject_for: 5s, request_failures: 2}}\n  \
             r: {url: 'http://x:1', health: {interval: 0s, eject_for: 0s, request_failures: 0}}\n\
             models:\n  m: {backend: a}\n",
    );
    for expected in [
        "backends.a.health.interval: must be longer than 0s",
        "backends.a.health.timeout: must be longer than 0s",
        "backends.a.health.failures: must be at least 1",
        "backends.e.health.eject_for: only for url backends",
        "backends.e.health.request_failures: only for url backends",
        "backends.r.health.interval: must be longer than 0s",
        "backends.r.health.eject_for: must be longer than 0s",
        "backends.r.health.request_failures: must be at least 1",
    ] {
        assert!(p.iter().any(|l| l.starts_with(expected)), "{expected:?} not in {p:#?}");
    }
}

#[test]
fn refuses_configs_that_cannot_work() {
    let p = problems(
        "
swap_after: 30s
backends:
  a: {kind: custom, command: [srv, '{port}'], port: 9101, stop_timeout: 0s, idle_timeout: 0s, ready: {timeout: 0s}}
  b: {kind: custom, command: [srv, '{port}'], port: 9102, restart_window: 0s}
  cpu: {kind: custom, command: [srv, '{port}'], port: 9103, gpu: false}
  remote:
    url: 'http://127.0.0.1:9000'
    connect_timeout: 0s
    stream_idle_timeout: 0s
    first_byte_timeout: 0s
    drain_timeout: 10s
    stop_timeout: 5s
    max_restarts: 2
    restart_window: 1m
    ready: {path: /health, timeout: 10s, warmup: false}
models:
  closed: {backend: a, max_queue: 0}
  short: {backend: b, max_wait: 30s}
  cpu_short: {backend: cpu, max_wait: 5s}
  remote_empty: {backend: remote, max_queue: 0, max_wait: 0s}
",
    );
    for expected in [
        "backends.a.stop_timeout: must be longer than 0s",
        "backends.a.idle_timeout: must be longer than 0s",
        "backends.a.ready.timeout: must be longer than 0s",
        "backends.b.restart_window: must be longer than 0s",
        "backends.remote.connect_timeout: must be longer than 0s",
        "backends.remote.stream_idle_timeout: must be longer than 0s",
        "backends.remote.first_byte_timeout: must be longer than 0s",
        "backends.remote.drain_timeout: only for managed backends",
        "backends.remote.stop_timeout: only for managed backends",
        "backends.remote.max_restarts: only for managed backends",
        "backends.remote.restart_window: only for managed backends",
        "backends.remote.ready.timeout: only for managed backends",
        "backends.remote.ready.warmup: only for managed backends",
        "models.closed.max_queue: must be at least 1",
        "models.short.max_wait: must be longer than swap_after (30s)",
        "models.remote_empty.max_wait: must be longer than 0s",
    ] {
        assert!(p.iter().any(|l| l.starts_with(expected)), "{expected:?} not in {p:#?}");
    }
    // A CPU backend never waits for a swap, a remote one has no gate to be closed, and the
    // ready path is a remote backend's too.
    for fine in ["models.cpu_short", "models.remote_empty.max_queue", "backends.remote.ready.path"] {
        assert!(!p.iter().any(|l| l.starts_with(fine)), "{fine} refused: {p:#?}");
    }
    assert_eq!(p.len(), 16, "{p:#?}");
    let zero_swap = problems("swap_after: 0s\nbackends: {r: {url: 'http://127.0.0.1:9'}}\nmodels: {m: {backend: r}}\n");
    assert_eq!(zero_swap, ["swap_after: must be longer than 0s"]);
    let zero_body = problems(
        "max_body: 0\nbody_read_timeout: 0s\nbackends: {r: {url: 'http://127.0.0.1:9'}}\nmodels: {m: {backend: r}}\n",
    );
    assert_eq!(
        zero_body,
        ["body_read_timeout: must be longer than 0s", "max_body: must be larger than 0 (every request has a body)"]
    );
}

#[test]
fn sizes_and_empty_models() {
    assert_eq!(parse_size("64MiB"), Some(64 << 20));
    assert_eq!(parse_size("512KB"), Some(512_000));
    assert_eq!(parse_size("12"), Some(12));
    assert_eq!(parse_size("3 parsecs"), None);
    let p = problems("backends: {}\n");
    assert_eq!(p, vec!["models: no models configured: clients need at least one public model name"]);
}

#[test]
fn a_model_names_one_backend_or_a_list_of_them() {
    let c = Config::parse(
        "backends:\n  studio: {url: 'http://10.0.0.2:8080'}\n  mini: {url: 'http://10.0.0.3:8080'}\n\
         models:\n  both: {backends: [studio, mini]}\n  one: {backend: mini}\n  listed: {backends: [mini]}\n",
        &no_env,
    )
    .expect("valid");
    assert_eq!(c.models["both"].backends, ["studio", "mini"], "the file's order");
    assert_eq!(c.models["one"].backends, ["mini"]);
    assert_eq!(c.models["listed"].backends, ["mini"]);

    let p = problems(
        "backends:\n  studio: {url: 'http://10.0.0.2:8080'}\n  mini: {url: 'http://10.0.0.3:8080'}\n\
         models:\n  twice: {backend: studio, backends: [studio, mini]}\n  neither: {max_queue: 3}\n  \
         empty: {backends: []}\n  unknown: {backends: [studio, laptop]}\n  repeated: {backends: [mini, studio, mini]}\n",
    );
    for expected in [
        "models.twice: give either backend (one) or backends (a list), not both",
        "models.neither: needs backend: NAME, or backends: [NAME, ...] for several",
        "models.empty.backends: must name at least one backend",
        "models.unknown.backends[1]: no backend named \"laptop\" (backends: mini, studio)",
        "models.repeated.backends[2]: \"mini\" is named twice",
    ] {
        assert!(p.iter().any(|l| l == expected), "{expected:?} not in {p:#?}");
    }
    assert_eq!(p.len(), 5, "{p:#?}");
}

#[test]
fn upstream_model_is_the_files_for_every_backend_else_each_backends_own() {
    let c = Config::parse(
        "backends:\n  studio: {kind: mlx-lm, model: /models/qwen, port: 9101}\n  \
         mini: {url: 'http://10.0.0.3:8080'}\n\
         models:\n  q: {backends: [studio, mini]}\n  named: {backends: [studio, mini], upstream_model: qwen}\n",
        &no_env,
    )
    .expect("valid");
    let (studio, mini) = (&c.backends["studio"], &c.backends["mini"]);
    assert_eq!(c.models["q"].upstream_model_for(studio), "/models/qwen", "the managed backend's own model");
    assert_eq!(c.models["q"].upstream_model_for(mini), "q", "a custom url backend: the public name");
    assert_eq!(c.models["named"].upstream_model_for(studio), "qwen");
    assert_eq!(c.models["named"].upstream_model_for(mini), "qwen");

    // A remote mlx-lm among the backends must be told the name: the file's upstream_model.
    let p = problems(
        "backends:\n  studio: {kind: mlx-lm, model: /m, port: 9101}\n  \
         mini: {url: 'http://10.0.0.3:8080', kind: mlx-lm}\n  mini2: {url: 'http://10.0.0.4:8080', kind: mlx-lm}\n\
         models:\n  q: {backends: [studio, mini, mini2]}\n",
    );
    assert_eq!(p.len(), 1, "once per kind: {p:#?}");
    assert!(p[0].starts_with("models.q.upstream_model: mlx-lm drops its model"), "{p:#?}");
}

#[test]
fn a_url_backend_has_health_rules_with_defaults() {
    let c = Config::parse(
        "backends:\n  plain: {url: 'http://10.0.0.2:8080'}\n  \
         tuned: {url: 'http://10.0.0.3:8080', health: {interval: 2s, eject_for: 30s, request_failures: 1}}\n\
         models:\n  m: {backends: [plain, tuned]}\n",
        &no_env,
    )
    .expect("valid");
    let defaults = RemoteHealth {
        probe: HealthCheck { interval: Duration::from_secs(10), timeout: Duration::from_secs(5), failures: 3 },
        eject_for: Duration::from_secs(10),
        request_failures: 3,
    };
    assert_eq!(c.backends["plain"].health, Some(defaults), "filled in whether written or not");
    let tuned = c.backends["tuned"].health.expect("health");
    assert_eq!((tuned.probe.interval, tuned.probe.timeout), (Duration::from_secs(2), Duration::from_secs(5)));
    assert_eq!((tuned.eject_for, tuned.request_failures), (Duration::from_secs(30), 1));
}

#[test]
fn the_prompt_cache_size_is_the_files_else_the_servers() {
    let c = Config::parse(
        "backends:\n  lm: {url: 'http://10.0.0.2:8080', kind: mlx-lm}\n  \
         small: {kind: mlx-lm, model: /m, port: 9101, command: [mlx_lm.server, --model, '{model}', --port, '{port}', \
         --prompt-cache-size, '4']}\n  \
         other: {url: 'http://10.0.0.3:8080', kind: vllm-mlx}\n  \
         written: {url: 'http://10.0.0.4:8080', kind: mlx-lm, prompt_cache_sequences: 0}\n\
         models:\n  m: {backends: [lm, small, other, written], upstream_model: qwen}\n",
        &no_env,
    )
    .expect("valid");
    let sequences = |b: &str| c.backends[b].prompt_cache_sequences;
    assert_eq!(sequences("lm"), 10, "mlx_lm.server's default");
    assert_eq!(sequences("small"), 4, "its launch command's --prompt-cache-size");
    assert_eq!(sequences("other"), crate::kinds::ASSUMED_PROMPT_CACHE_SEQUENCES, "unknown: assumed");
    assert_eq!(sequences("written"), 0, "the file's, even none");
}

#[test]
fn balance_has_a_policy_and_a_session_header() {
    let c = Config::parse(
        "backends:\n  a: {url: 'http://10.0.0.2:8080'}\n  b: {url: 'http://10.0.0.3:8080'}\n\
         models:\n  plain: {backends: [a, b]}\n  \
         sessions: {backends: [a, b], balance: {policy: session, session_header: X-Claude-Code-Session-Id}}\n  \
         rr: {backends: [a, b], balance: {policy: round_robin}}\n",
        &no_env,
    )
    .expect("valid");
    assert_eq!(c.models["plain"].balance, BalanceConfig::default());
    assert_eq!(c.models["plain"].balance.policy, BalancePolicy::CacheAware, "the default");
    let sessions = &c.models["sessions"].balance;
    assert_eq!(sessions.policy, BalancePolicy::Session);
    assert_eq!(sessions.session_header.as_ref().map(|h| h.as_str()), Some("x-claude-code-session-id"));
    assert_eq!(c.models["rr"].balance.policy.label(), "round_robin");

    let p = problems(
        "backends:\n  a: {url: 'http://10.0.0.2:8080'}\n\
         models:\n  m: {backend: a, balance: {policy: fastest}}\n  \
         h: {backend: a, balance: {session_header: 'bad header'}}\n  k: {backend: a, balance: {polcy: session}}\n",
    );
    assert!(p.iter().any(|l| l.starts_with("models.m.balance.policy: unknown variant `fastest`")), "{p:#?}");
    assert!(p.iter().any(|l| l == "models.h.balance.session_header: \"bad header\" is not a header name"), "{p:#?}");
    assert!(p.iter().any(|l| l.starts_with("models.k.balance.polcy: unknown field")), "{p:#?}");
    assert_eq!(p.len(), 3, "{p:#?}");
}

#[test]
fn the_swap_costing_keys_are_read_and_checked() {
    let ok = parse(
        "
loading_share: 0.25
gpu_memory_budget: 48GB
backends:
  big: {kind: custom, command: [srv, '{port}'], port: 9101, footprint: 20GB, preload: true}
  small: {kind: custom, command: [srv, '{port}'], port: 9102, footprint: 6GB, preload: true}
models:
  coder: {backend: big}
  haiku: {backend: small, fallback: coder}
",
    );
    assert_eq!(ok.loading_share, 0.25);
    assert_eq!(ok.gpu_memory_budget, Some(48_000_000_000));
    assert_eq!(ok.backends["big"].managed.as_ref().and_then(|m| m.footprint), Some(20_000_000_000));
    assert_eq!(ok.models["haiku"].fallback.as_deref(), Some("coder"));
    let defaults = parse("backends: {r: {url: 'http://127.0.0.1:9'}}\nmodels: {m: {backend: r}}\n");
    assert_eq!((defaults.loading_share, defaults.gpu_memory_budget), (0.2, None));

    let p = problems(
        "
loading_share: 1.5
gpu_memory_budget: 20GB
backends:
  big: {kind: custom, command: [srv, '{port}'], port: 9101, footprint: 20GB, preload: true}
  small: {kind: custom, command: [srv, '{port}'], port: 9102, footprint: 6GB, preload: true}
  remote: {url: 'http://127.0.0.1:9000', footprint: 1GB}
models:
  coder: {backend: big, fallback: coder}
  haiku: {backend: small, fallback: nobody}
  lan: {backend: remote, fallback: coder}
  mini: {backend: small, fallback: lan}
  twin: {backends: [small, remote]}
  tiny: {backend: small, fallback: twin}
",
    );
    for expected in [
        "loading_share: 1.5 is not a share of time in (0, 1]",
        "backends.small.preload: only one GPU backend can run at a time",
        "backends.remote.footprint: only for managed backends",
        "models.coder.fallback: a model cannot fall back to itself",
        "models.haiku.fallback: \"nobody\" is not a configured model",
        "models.lan.fallback: only a model served by managed backends falls back",
        "models.mini.fallback: \"lan\" is served by url backends only",
        "models.tiny.fallback: \"twin\" runs only on this model's own backends",
    ] {
        assert!(p.iter().any(|l| l.starts_with(expected)), "{expected:?} not in {p:#?}");
    }
    assert_eq!(p.len(), 8, "{p:#?}");
    let zero =
        problems("gpu_memory_budget: 0\nbackends: {r: {url: 'http://127.0.0.1:9'}}\nmodels: {m: {backend: r}}\n");
    assert_eq!(zero, ["gpu_memory_budget: 0 is 0 bytes, less than any server holds: write a unit, like 48GB"]);
    // A bare number is bytes: `footprint: 6` meant 6GB, and would fit beside anything.
    let bare = problems(
        "gpu_memory_budget: 48\nbackends: {a: {kind: custom, command: [srv, '{port}'], port: 9101, footprint: 6}}\n\
         models: {m: {backend: a}}\n",
    );
    assert_eq!(
        bare,
        [
            "backends.a.footprint: 6 is 6 bytes, less than any server holds: write a unit, like 48GB",
            "gpu_memory_budget: 48 is 48 bytes, less than any server holds: write a unit, like 48GB",
        ]
    );
}
