//! One backend's keys: either `url` (a server that is already running) or `kind`/`command` (one
//! mlxgate runs), its timeouts, its health probe (a url backend's with its ejection rules), its
//! `normalise:` switches and its prompt cache's size, checked into one [`BackendConfig`].

use std::path::PathBuf;
use std::time::Duration;

use super::problem::{Problem, push_at};
use super::raw::{RawBackend, RawHealth, RawNormalise};
use super::types::{BackendConfig, HealthCheck, ManagedConfig, RemoteHealth};
use super::validate::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_DRAIN_TIMEOUT, DEFAULT_HEALTH, DEFAULT_MAX_CONCURRENCY, DEFAULT_MAX_RESTARTS,
    DEFAULT_READY_TIMEOUT, DEFAULT_REMOTE_HEALTH, DEFAULT_RESPONSE_TIMEOUT, DEFAULT_RESTART_WINDOW,
    DEFAULT_STOP_TIMEOUT, DEFAULT_STREAM_IDLE_TIMEOUT, memory, positive,
};
use crate::kinds::launch::MANAGED_HOST;
use crate::kinds::{ASSUMED_PROMPT_CACHE_SEQUENCES, Kind, Normalise};

/// Checks one backend: either `url` (a running server) or `kind`/`command` (a managed one).
pub(super) fn validate_backend(
    name: String,
    path: &str,
    b: RawBackend,
    problems: &mut Vec<Problem>,
) -> Option<BackendConfig> {
    let max_concurrency = b.max_concurrency.unwrap_or(DEFAULT_MAX_CONCURRENCY);
    if max_concurrency == 0 {
        push_at(problems, path, "max_concurrency", "must be at least 1");
    }
    let timeouts = Timeouts::check(&b, path, problems);
    if b.context_cap == Some(0) {
        push_at(
            problems,
            path,
            "context_cap",
            "must be at least 1 token (leave it out for the kind's or the model's own limit)",
        );
    }
    let context_cap = b.context_cap.filter(|c| *c > 0);
    let kind = b.kind.unwrap_or(Kind::Custom);
    // With url, the server is already running and `kind` only names its profile; without
    // url, mlxgate runs it from `kind` or `command`.
    let managed_keys = b.url.is_none() && b.kind.is_some() || b.command.is_some();
    let (url, managed) = match (&b.url, managed_keys) {
        (Some(_), true) => {
            push_at(
                problems,
                path,
                "",
                "give either url (a server that is already running) or command (one mlxgate runs), not both",
            );
            return None;
        }
        (None, false) => {
            let kinds = Kind::names_where(|_| true);
            push_at(problems, path, "", format!("needs url (a running server) or kind ({kinds})"));
            return None;
        }
        (Some(url), false) => (remote_url(url, &b, path, problems), None),
        (None, true) => {
            let managed = validate_managed(&name, kind, path, &b, problems)?;
            (format!("http://{MANAGED_HOST}:{}", managed.port), Some(managed))
        }
    };
    let ready_path = match (b.ready.and_then(|r| r.path), &managed) {
        (Some(p), Some(_)) if !p.starts_with('/') => format!("/{p}"),
        (Some(p), _) => p,
        (None, _) => kind.ready_path().to_string(),
    };
    let command = managed.as_ref().map(|m| m.template.as_slice());
    let normalise = normalise_of(kind, command, b.normalise, max_concurrency, path, problems);
    let health = managed.is_none().then(|| validate_remote_health(b.health.as_ref(), path, problems));
    let prompt_cache_sequences = b
        .prompt_cache_sequences
        .or_else(|| kind.prompt_cache_sequences(command))
        .unwrap_or(ASSUMED_PROMPT_CACHE_SEQUENCES);
    Some(BackendConfig {
        name,
        url,
        max_concurrency,
        connect_timeout: timeouts.connect,
        response_timeout: timeouts.response,
        first_byte_timeout: timeouts.first_byte,
        stream_idle_timeout: timeouts.stream_idle,
        kind,
        ready_path,
        managed,
        context_cap,
        normalise,
        health,
        prompt_cache_sequences,
    })
}

/// A running server's `url`, without a trailing slash; the keys only a managed backend has are
/// problems.
fn remote_url(url: &str, b: &RawBackend, path: &str, problems: &mut Vec<Problem>) -> String {
    let url = url.trim_end_matches('/').to_string();
    match url.parse::<http::Uri>() {
        Ok(uri) if uri.scheme_str() == Some("http") && uri.host().is_some() => {}
        Ok(uri) if uri.scheme_str() == Some("https") => {
            push_at(problems, path, "url", "https backends are not supported yet; use http:// (MLX servers on a LAN)")
        }
        _ => push_at(problems, path, "url", format!("{url:?} is not a URL like http://127.0.0.1:8101")),
    }
    let ready = b.ready.as_ref();
    for (set, key) in [
        (b.port.is_some(), "port"),
        (b.model.is_some(), "model"),
        (!b.env.is_empty(), "env"),
        (b.venv.is_some(), "venv"),
        (b.idle_timeout.is_some(), "idle_timeout"),
        (b.preload.is_some(), "preload"),
        (b.gpu.is_some(), "gpu"),
        (b.footprint.is_some(), "footprint"),
        (b.drain_timeout.is_some(), "drain_timeout"),
        (b.stop_timeout.is_some(), "stop_timeout"),
        (b.max_restarts.is_some(), "max_restarts"),
        (b.restart_window.is_some(), "restart_window"),
        (ready.is_some_and(|r| r.timeout.is_some()), "ready.timeout"),
        (ready.is_some_and(|r| r.warmup.is_some()), "ready.warmup"),
    ] {
        if set {
            push_at(
                problems,
                path,
                key,
                "only for managed backends (no url); this one has a url, so mlxgate does not run it",
            );
        }
    }
    url
}

/// A managed backend's process: port, command, model, start-up and life; `None` when one of
/// them cannot be filled in (the problem is recorded).
fn validate_managed(
    name: &str,
    kind: Kind,
    path: &str,
    b: &RawBackend,
    problems: &mut Vec<Problem>,
) -> Option<ManagedConfig> {
    let Some(port) = b.port.filter(|p| *p != 0) else {
        push_at(problems, path, "port", "a managed backend needs a port (1-65535) for its server");
        return None;
    };
    let template: Vec<String> = match (&b.command, kind.launch_template()) {
        (Some(c), _) if c.is_empty() => {
            push_at(problems, path, "command", "must name a program");
            return None;
        }
        (Some(c), _) => c.clone(),
        (None, Some(t)) => t.iter().map(|s| s.to_string()).collect(),
        (None, None) => {
            push_at(problems, path, "command", "kind: custom needs a command, e.g. [my-server, --port, \"{port}\"]");
            return None;
        }
    };
    let uses_model = template.iter().any(|a| a.contains("{model}"));
    let model = match (&b.model, uses_model || kind.model_from_request()) {
        (Some(m), _) => m.clone(),
        (None, true) => {
            let why = if uses_model {
                "the launch command uses {model}"
            } else {
                "this kind loads the model each request names"
            };
            push_at(problems, path, "model", format!("{why}: name a model path or Hugging Face id"));
            return None;
        }
        (None, false) => name.to_string(),
    };
    let ready = b.ready.as_ref();
    let health = validate_health(b.health.as_ref(), path, problems);
    let ejection = b
        .health
        .as_ref()
        .map(|h| [(h.eject_for.is_some(), "eject_for"), (h.request_failures.is_some(), "request_failures")]);
    for (_, key) in ejection.into_iter().flatten().filter(|(set, _)| *set) {
        push_at(
            problems,
            path,
            &format!("health.{key}"),
            "only for url backends: mlxgate restarts a managed server that fails, and its model's other backends \
             serve while it starts",
        );
    }
    let mut positive_at = |field: &str, d, default| positive(d, default, &format!("{path}.{field}"), problems);
    let ready_timeout = positive_at("ready.timeout", ready.and_then(|r| r.timeout), DEFAULT_READY_TIMEOUT);
    let stop_timeout = positive_at("stop_timeout", b.stop_timeout, DEFAULT_STOP_TIMEOUT);
    let restart_window = positive_at("restart_window", b.restart_window, DEFAULT_RESTART_WINDOW);
    let idle_timeout = b.idle_timeout.map(|d| positive_at("idle_timeout", Some(d), Duration::ZERO));
    Some(ManagedConfig {
        template,
        model,
        port,
        env: b.env.clone(),
        venv: b.venv.as_ref().map(PathBuf::from),
        workdir: PathBuf::from("."),
        ready_timeout,
        warmup: ready.and_then(|r| r.warmup).unwrap_or(kind.needs_warmup()),
        idle_timeout,
        preload: b.preload.unwrap_or(false),
        gpu: b.gpu.unwrap_or(true),
        footprint: memory(b.footprint.as_ref(), &format!("{path}.footprint"), problems),
        drain_timeout: b.drain_timeout.map_or(DEFAULT_DRAIN_TIMEOUT, |d| d.0),
        stop_timeout,
        max_restarts: b.max_restarts.unwrap_or(DEFAULT_MAX_RESTARTS),
        restart_window,
        health,
    })
}

/// The kind's normalisations with the file's switches; a serialized backend (vllm-mlx without
/// `--continuous-batching`) written with `max_concurrency` above 1 is a problem, not a silent cap.
fn normalise_of(
    kind: Kind,
    command: Option<&[String]>,
    raw: Option<RawNormalise>,
    max_concurrency: usize,
    path: &str,
    problems: &mut Vec<Problem>,
) -> Normalise {
    let normalise = apply_switches(raw.unwrap_or_default(), kind.normalise(command), path, problems);
    if normalise.serialize && max_concurrency > 1 {
        push_at(
            problems,
            path,
            "max_concurrency",
            kind.serialize_reason().unwrap_or(
                "normalise.serialize sends one request at a time: leave max_concurrency at 1, or switch serialize off",
            ),
        );
    }
    normalise
}

/// The kind's defaults `n` with the file's `normalise:` switches applied.
fn apply_switches(raw: RawNormalise, mut n: Normalise, path: &str, problems: &mut Vec<Problem>) -> Normalise {
    if let Some(d) = raw.pool_idle_timeout {
        n.pool_idle_timeout =
            positive(Some(d), n.pool_idle_timeout, &format!("{path}.normalise.pool_idle_timeout"), problems);
    }
    let switches = [
        (raw.loopback_host, &mut n.loopback_host),
        (raw.serialize, &mut n.serialize),
        (raw.hold_abandoned, &mut n.hold_abandoned),
        (raw.finish_length, &mut n.finish_length),
        (raw.single_finish, &mut n.single_finish),
        (raw.stream_options, &mut n.stream_options),
    ];
    for (set, field) in switches {
        if let Some(on) = set {
            *field = on;
        }
    }
    n
}

/// The timeouts every backend has, managed or remote.
struct Timeouts {
    connect: Duration,
    response: Duration,
    first_byte: Duration,
    stream_idle: Duration,
}

impl Timeouts {
    fn check(b: &RawBackend, path: &str, problems: &mut Vec<Problem>) -> Timeouts {
        let at = |field: &str| format!("{path}.{field}");
        let connect = positive(b.connect_timeout, DEFAULT_CONNECT_TIMEOUT, &at("connect_timeout"), problems);
        let response = positive(b.response_timeout, DEFAULT_RESPONSE_TIMEOUT, &at("response_timeout"), problems);
        // The first byte comes with or after the headers: by default it may take as long.
        let first_byte = positive(b.first_byte_timeout, response, &at("first_byte_timeout"), problems);
        let stream_idle =
            positive(b.stream_idle_timeout, DEFAULT_STREAM_IDLE_TIMEOUT, &at("stream_idle_timeout"), problems);
        Timeouts { connect, response, first_byte, stream_idle }
    }
}

/// A url backend's `health` block: the probe's keys and its ejection rules, defaults filled.
fn validate_remote_health(raw: Option<&RawHealth>, path: &str, problems: &mut Vec<Problem>) -> RemoteHealth {
    let probe = validate_health(raw, path, problems);
    let Some(raw) = raw else { return DEFAULT_REMOTE_HEALTH };
    let eject_for =
        positive(raw.eject_for, DEFAULT_REMOTE_HEALTH.eject_for, &format!("{path}.health.eject_for"), problems);
    let request_failures = raw.request_failures.unwrap_or(DEFAULT_REMOTE_HEALTH.request_failures);
    if request_failures == 0 {
        push_at(problems, path, "health.request_failures", "must be at least 1");
    }
    RemoteHealth { probe, eject_for, request_failures }
}

/// The probe's keys of a `health` block (a managed or a url backend's), defaults filled; zero
/// durations or failures are problems.
fn validate_health(raw: Option<&RawHealth>, path: &str, problems: &mut Vec<Problem>) -> HealthCheck {
    let Some(raw) = raw else { return DEFAULT_HEALTH };
    let health = HealthCheck {
        interval: raw.interval.map_or(DEFAULT_HEALTH.interval, |d| d.0),
        timeout: raw.timeout.map_or(DEFAULT_HEALTH.timeout, |d| d.0),
        failures: raw.failures.unwrap_or(DEFAULT_HEALTH.failures),
    };
    for (value, field) in [(health.interval, "health.interval"), (health.timeout, "health.timeout")] {
        if value.is_zero() {
            push_at(problems, path, field, "must be longer than 0s");
        }
    }
    if health.failures == 0 {
        push_at(problems, path, "health.failures", "must be at least 1");
    }
    health
}
