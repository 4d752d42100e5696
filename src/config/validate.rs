//! The one `validate()`: raw serde types in, the immutable [`Config`] out, every problem found
//! on the way listed with its YAML path. A backend's own keys are checked in [`super::backend`],
//! clients in [`super::clients`], aliases in [`super::aliases`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http::HeaderName;

use super::aliases::Aliases;
use super::backend_keys::validate_backend;
use super::clients;
use super::problem::{Problem, push_at, typed};
use super::raw::{RawBackend, RawBalance, RawConfig, RawDuration, RawModel, RawSize};
use super::types::{
    BackendConfig, BalanceConfig, Config, DEFAULT_LOADING_SHARE, HealthCheck, ModelConfig, RemoteHealth,
};
use crate::kinds::UpstreamModel;

pub(super) const DEFAULT_LISTEN: &str = "127.0.0.1:8000";
pub(super) const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
pub(super) const DEFAULT_MAX_BODY: usize = 64 * 1024 * 1024;
/// hyper's own default: ample for any client that means to send a request (agents on the same
/// machine or network send their headers in milliseconds), short enough that a socket held open
/// by a client that never finishes is freed long before the open-files limit matters.
pub(super) const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// A coding agent holds a few connections; a machine running many of them, or a benchmark,
/// holds tens. 128 leaves room for that while one address can take at most half of macOS's
/// default soft limit of 256 open files (and a sliver of the raised one).
pub(super) const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: usize = 128;
pub(super) const DEFAULT_MAX_CONCURRENCY: usize = 1;
pub(super) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub(super) const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
pub(super) const DEFAULT_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(10 * 60);
pub(super) const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);
pub(super) const DEFAULT_MAX_QUEUE: usize = 64;
pub(super) const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(120);
pub(super) const DEFAULT_MAX_TOKENS: u32 = 4096;
/// The least room for an answer a prompt must leave under the cap (`min_room`).
pub(super) const DEFAULT_MIN_ROOM: u32 = 256;
pub(super) const DEFAULT_SWAP_AFTER: Duration = Duration::from_secs(10);
pub(super) const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(300);
pub(super) const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
pub(super) const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(10);
pub(super) const DEFAULT_MAX_RESTARTS: u32 = 5;
pub(super) const DEFAULT_RESTART_WINDOW: Duration = Duration::from_secs(300);
pub(super) const DEFAULT_HEALTH: HealthCheck =
    HealthCheck { interval: Duration::from_secs(10), timeout: Duration::from_secs(5), failures: 3 };
/// A url backend's: the managed probe's keys, a rest of 10s once ejected (a Mac that rebooted
/// or lost Wi-Fi is back within a few trials), 3 failed requests in a row.
pub(super) const DEFAULT_REMOTE_HEALTH: RemoteHealth =
    RemoteHealth { probe: DEFAULT_HEALTH, eject_for: Duration::from_secs(10), request_failures: 3 };

pub(super) fn validate(raw: RawConfig, problems: &mut Vec<Problem>) -> Option<Config> {
    let listen_text = raw.listen.unwrap_or_else(|| DEFAULT_LISTEN.to_string());
    let listen = match listen_text.parse::<SocketAddr>() {
        Ok(addr) => Some(addr),
        Err(_) => {
            problems.push(Problem {
                path: "listen".into(),
                reason: format!("{listen_text:?} is not an address like 127.0.0.1:8000"),
            });
            None
        }
    };

    let mut backends = BTreeMap::new();
    for (name, value) in raw.backends {
        let path = format!("backends.{name}");
        let Some(b) = typed::<RawBackend>(value, &path, problems) else { continue };
        if let Some(backend) = validate_backend(name, &path, b, problems) {
            backends.insert(backend.name.clone(), backend);
        }
    }
    let mut ports: BTreeMap<u16, &str> = BTreeMap::new();
    for b in backends.values() {
        let Some(m) = &b.managed else { continue };
        if let Some(other) = ports.insert(m.port, &b.name) {
            problems.push(Problem {
                path: format!("backends.{}.port", b.name),
                reason: format!("port {} is also backend {other:?}'s", m.port),
            });
        }
        if listen.is_some_and(|l| l.port() == m.port) {
            problems.push(Problem {
                path: format!("backends.{}.port", b.name),
                reason: format!("port {} is the gateway's own listen port", m.port),
            });
        }
    }
    let gpu_preloads: Vec<&str> = backends
        .values()
        .filter(|b| b.managed.as_ref().is_some_and(|m| m.gpu && m.preload))
        .map(|b| b.name.as_str())
        .collect();
    let gpu_memory_budget = memory(raw.gpu_memory_budget.as_ref(), "gpu_memory_budget", problems);
    // With a budget, GPU backends that preload must fit it together by their written footprints.
    let preloads_fit = gpu_memory_budget.is_some_and(|budget| {
        let footprints: Option<Vec<u64>> = backends
            .values()
            .filter_map(|b| b.managed.as_ref())
            .filter(|m| m.gpu && m.preload)
            .map(|m| m.footprint)
            .collect();
        footprints.is_some_and(|f| f.iter().sum::<u64>() <= budget)
    });
    if gpu_preloads.len() > 1 && !preloads_fit {
        problems.push(Problem {
            path: format!("backends.{}.preload", gpu_preloads[1]),
            reason: format!(
                "only one GPU backend can run at a time, and {} already preloads (unless gpu_memory_budget \
                 is set and the preloading backends' footprints fit it)",
                gpu_preloads[0]
            ),
        });
    }

    let swap_after = positive(raw.swap_after, DEFAULT_SWAP_AFTER, "swap_after", problems);
    let loading_share = raw.loading_share.unwrap_or(DEFAULT_LOADING_SHARE);
    if !(loading_share > 0.0 && loading_share <= 1.0) {
        problems.push(Problem {
            path: "loading_share".into(),
            reason: format!("{loading_share} is not a share of time in (0, 1], like 0.2"),
        });
    }
    let mut models = BTreeMap::new();
    for (name, value) in raw.models {
        let path = format!("models.{name}");
        let Some(m) = typed::<RawModel>(value, &path, problems) else {
            continue;
        };
        let model = validate_model(name, &path, m, &backends, swap_after, problems);
        models.insert(model.name.clone(), model);
    }
    if models.is_empty() && !problems.iter().any(|p| p.path.starts_with("models")) {
        problems.push(Problem {
            path: "models".into(),
            reason: "no models configured: clients need at least one public model name".into(),
        });
    }

    let metrics_listen = match raw.metrics_listen.map(|t| (t.parse::<SocketAddr>(), t)) {
        None => None,
        Some((Ok(addr), _)) => Some(addr),
        Some((Err(_), text)) => {
            problems.push(Problem {
                path: "metrics_listen".into(),
                reason: format!("{text:?} is not an address like 127.0.0.1:9464"),
            });
            None
        }
    };
    let (header_read_timeout, max_connections_per_client) =
        connection_limits(raw.header_read_timeout.map(|d| d.0), raw.max_connections_per_client, problems);
    let body_read_timeout = positive(raw.body_read_timeout, DEFAULT_BODY_READ_TIMEOUT, "body_read_timeout", problems);
    let max_body_bytes = raw.max_body.map_or(DEFAULT_MAX_BODY, |s| s.0);
    if max_body_bytes == 0 {
        problems.push(Problem {
            path: "max_body".into(),
            reason: "must be larger than 0 (every request has a body)".into(),
        });
    }
    let access = clients::validate(
        clients::RawAccess {
            auth: raw.auth,
            clients: raw.clients,
            default_limits: raw.default_limits,
            admin_key_sha256: raw.admin_key_sha256,
            rate_limit_store: raw.rate_limit_store,
        },
        &models,
        problems,
    );
    let aliases = Aliases::validate(raw.aliases, &models, problems);
    validate_fallbacks(&models, &backends, problems);
    Some(Config {
        listen: listen?,
        metrics_listen,
        shutdown_grace: raw.shutdown_grace.map_or(DEFAULT_SHUTDOWN_GRACE, |d| d.0),
        max_body_bytes,
        body_read_timeout,
        swap_after,
        loading_share,
        gpu_memory_budget,
        header_read_timeout,
        max_connections_per_client,
        worker_threads: worker_threads(raw.worker_threads, problems),
        backends,
        models,
        auth: access.auth,
        clients: access.clients,
        default_limits: access.default_limits,
        admin_key: access.admin_key,
        rate_limit_store: access.rate_limit_store,
        access_log: raw.access_log.unwrap_or(true),
        admin_hosts: validate_admin_hosts(raw.admin_hosts.unwrap_or_default(), problems),
        aliases,
    })
}

/// The most `worker_threads` may be: beyond, a thread per connection would not help, and the
/// runtime would fail to start rather than say why.
const MOST_WORKER_THREADS: usize = 1024;

/// `worker_threads`, 0 (one per core) by default; more than [`MOST_WORKER_THREADS`] is refused.
fn worker_threads(threads: Option<usize>, problems: &mut Vec<Problem>) -> usize {
    let threads = threads.unwrap_or(0);
    if threads > MOST_WORKER_THREADS {
        problems.push(Problem {
            path: "worker_threads".into(),
            reason: format!("must be at most {MOST_WORKER_THREADS} (0: one per core)"),
        });
    }
    threads
}

/// `header_read_timeout` and `max_connections_per_client`, with their defaults; zero is refused
/// (it would close or refuse every connection).
fn connection_limits(
    timeout: Option<Duration>,
    per_client: Option<usize>,
    problems: &mut Vec<Problem>,
) -> (Duration, usize) {
    let timeout = timeout.unwrap_or(DEFAULT_HEADER_READ_TIMEOUT);
    if timeout.is_zero() {
        problems.push(Problem { path: "header_read_timeout".into(), reason: "must be longer than 0s".into() });
    }
    let per_client = per_client.unwrap_or(DEFAULT_MAX_CONNECTIONS_PER_CLIENT);
    if per_client == 0 {
        problems.push(Problem { path: "max_connections_per_client".into(), reason: "must be at least 1".into() });
    }
    (timeout, per_client)
}

/// Checks one model against the validated `backends`.
fn validate_model(
    name: String,
    path: &str,
    m: RawModel,
    backends: &BTreeMap<String, BackendConfig>,
    swap_after: Duration,
    problems: &mut Vec<Problem>,
) -> ModelConfig {
    let gpu_backends = backends.values().filter(|b| b.managed.as_ref().is_some_and(|m| m.gpu)).count();
    let names = model_backends(path, m.backend, m.backends, backends, problems);
    let served_by: Vec<&BackendConfig> = names.iter().filter_map(|n| backends.get(n)).collect();
    let max_wait = positive(m.max_wait, DEFAULT_MAX_WAIT, &format!("{path}.max_wait"), problems);
    let max_queue = m.max_queue.unwrap_or(DEFAULT_MAX_QUEUE);
    let managed = || served_by.iter().filter_map(|b| b.managed.as_ref());
    if managed().next().is_some() && max_queue == 0 {
        problems.push(Problem {
            path: format!("{path}.max_queue"),
            reason: "must be at least 1: requests for a managed backend wait while it starts, so with no \
                     room to wait every request would be refused"
                .into(),
        });
    }
    if managed().any(|mc| mc.gpu) && gpu_backends > 1 && !max_wait.is_zero() && max_wait <= swap_after {
        problems.push(Problem {
            path: format!("{path}.max_wait"),
            reason: format!(
                "must be longer than swap_after ({}): a request for a GPU backend that is not running waits \
                 swap_after before the running one is swapped out, so it would always time out first",
                humantime::format_duration(swap_after)
            ),
        });
    }
    if m.min_room == Some(0) {
        problems.push(Problem {
            path: format!("{path}.min_room"),
            reason: "must be at least 1: a prompt that leaves no room for its answer is over the cap".into(),
        });
    }
    if m.upstream_model.is_none() {
        upstream_model_needed(path, &served_by, problems);
    }
    let balance = validate_balance(m.balance, path, problems);
    ModelConfig {
        upstream_model: m.upstream_model,
        name,
        backends: names,
        max_queue,
        default_max_tokens: m.default_max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        max_wait,
        on_overflow: m.on_overflow.unwrap_or_default(),
        min_room: m.min_room.unwrap_or(DEFAULT_MIN_ROOM),
        tokenizer: m.tokenizer.map(PathBuf::from),
        balance,
        fallback: m.fallback,
        capture: m.capture.unwrap_or(false),
    }
}

/// `admin_hosts:`: host names as a browser sends them in `Host` (no scheme, port or path),
/// kept lowercase; `*` (any name: the DNS-rebinding check off) alone.
fn validate_admin_hosts(hosts: Vec<String>, problems: &mut Vec<Problem>) -> Vec<String> {
    let plain = |h: &str| {
        !h.is_empty() && h.len() <= 253 && h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    };
    for (i, host) in hosts.iter().enumerate() {
        if !(host == "*" || plain(host)) {
            problems.push(Problem {
                path: format!("admin_hosts[{i}]"),
                reason: format!(
                    "{host:?} is not a host name (letters, digits, '-' and '.', no port or scheme), nor '*'"
                ),
            });
        }
    }
    hosts.into_iter().map(|h| h.to_ascii_lowercase()).collect()
}

/// Each model's `fallback:` names another configured model, and the model it stands in for is
/// served by managed backends only (a url backend is always there: nothing to fall back from).
fn validate_fallbacks(
    models: &BTreeMap<String, ModelConfig>,
    backends: &BTreeMap<String, BackendConfig>,
    problems: &mut Vec<Problem>,
) {
    for model in models.values() {
        let Some(fallback) = &model.fallback else { continue };
        let path = format!("models.{}.fallback", model.name);
        let reason = if *fallback == model.name {
            "a model cannot fall back to itself".to_string()
        } else if !models.contains_key(fallback) {
            format!("{fallback:?} is not a configured model")
        } else if model.backends.iter().any(|b| backends.get(b).is_some_and(|b| b.managed.is_none())) {
            "only a model served by managed backends falls back (a url backend is never unloaded)".to_string()
        } else if models[fallback].backends.iter().all(|b| backends.get(b).is_some_and(|b| b.managed.is_none())) {
            // The fallback stands in while one of its managed backends is starting or ready: a
            // model of url backends only would never be used (the request would wait for a swap).
            format!("{fallback:?} is served by url backends only: a fallback stands in while it is loaded")
        } else if models[fallback]
            .backends
            .iter()
            .filter(|b| backends.get(*b).is_some_and(|b| b.managed.is_some()))
            .all(|b| model.backends.contains(b))
        {
            // Its managed backends are this model's own: whenever one is loaded, so is this model.
            format!("{fallback:?} runs only on this model's own backends: it would never stand in")
        } else {
            continue;
        };
        problems.push(Problem { path, reason });
    }
}

/// A model's `balance:`, defaults filled: `cache_aware`, the session key from the body.
fn validate_balance(raw: Option<RawBalance>, path: &str, problems: &mut Vec<Problem>) -> BalanceConfig {
    let Some(raw) = raw else { return BalanceConfig::default() };
    let session_header = raw.session_header.and_then(|text| match HeaderName::from_bytes(text.trim().as_bytes()) {
        Ok(name) => Some(name),
        Err(_) => {
            push_at(problems, path, "balance.session_header", format!("{text:?} is not a header name"));
            None
        }
    });
    BalanceConfig { policy: raw.policy.unwrap_or_default(), session_header }
}

/// The most backends one model may have (a request remembers the backends it tried in one
/// 64-bit set).
pub const MAX_BACKENDS_PER_MODEL: usize = 64;

/// A model's backends: `backend: a` or `backends: [a, b]` (exactly one of the two), at least
/// one, each configured, none twice. The names are kept in the file's order, the unknown ones
/// too (the problem is recorded, so no `Config` is made of them).
fn model_backends(
    path: &str,
    one: Option<String>,
    several: Option<Vec<String>>,
    backends: &BTreeMap<String, BackendConfig>,
    problems: &mut Vec<Problem>,
) -> Vec<String> {
    let (names, key) = match (one, several) {
        (Some(_), Some(several)) => {
            push_at(problems, path, "", "give either backend (one) or backends (a list), not both");
            (several, "backends")
        }
        (None, None) => {
            push_at(problems, path, "", "needs backend: NAME, or backends: [NAME, ...] for several");
            return Vec::new();
        }
        (Some(one), None) => (vec![one], "backend"),
        (None, Some(several)) => (several, "backends"),
    };
    if names.is_empty() {
        push_at(problems, path, "backends", "must name at least one backend");
    }
    if names.len() > MAX_BACKENDS_PER_MODEL {
        push_at(
            problems,
            path,
            "backends",
            format!("names {} backends: at most {MAX_BACKENDS_PER_MODEL} serve one model", names.len()),
        );
    }
    for (i, name) in names.iter().enumerate() {
        let at = if key == "backend" { key.to_string() } else { format!("{key}[{i}]") };
        if names[..i].contains(name) {
            push_at(problems, path, &at, format!("{name:?} is named twice"));
        } else if !backends.contains_key(name) {
            let known: Vec<&str> = backends.keys().map(String::as_str).collect();
            let known = if known.is_empty() { "none".to_string() } else { known.join(", ") };
            push_at(problems, path, &at, format!("no backend named {name:?} (backends: {known})"));
        }
    }
    names
}

/// A model without `upstream_model:` is sent, on each backend, that backend's managed model or
/// its own public name; a kind that must be told the name as it loaded it is a problem (once
/// per kind).
fn upstream_model_needed(path: &str, served_by: &[&BackendConfig], problems: &mut Vec<Problem>) {
    let mut told = Vec::new();
    for backend in served_by {
        let kind = backend.kind;
        // A managed server knows its model by the path it loaded (mlx_lm.server would try to
        // download any other name from the Hub).
        let reason = match (kind.upstream_model(), &backend.managed) {
            (UpstreamModel::DirectoryName, _) => {
                format!("{kind} serves each model directory under its --model-dir by the directory's name: name it")
            }
            (UpstreamModel::AsLoaded { how }, None) => format!(
                "{kind} drops its model or looks the name up on the Hub when asked for a model it does not serve: \
                 name the model exactly as the server loaded it{how}"
            ),
            _ => continue,
        };
        if !told.contains(&kind) {
            told.push(kind);
            push_at(problems, path, "upstream_model", reason);
        }
    }
}

/// A duration that must be longer than zero (zero would refuse or cut everything at once).
/// The least memory a `gpu_memory_budget` or a `footprint:` may be: a bare number is bytes, and
/// `footprint: 6` (meant as 6GB) would let that backend fit beside anything.
const LEAST_MEMORY: usize = 1 << 20;

/// A memory size (`gpu_memory_budget`, `footprint:`), at least [`LEAST_MEMORY`].
pub(super) fn memory(size: Option<&RawSize>, path: &str, problems: &mut Vec<Problem>) -> Option<u64> {
    let bytes = size?.0;
    if bytes < LEAST_MEMORY {
        problems.push(Problem {
            path: path.to_string(),
            reason: format!("{bytes} is {bytes} bytes, less than any server holds: write a unit, like 48GB"),
        });
        return None;
    }
    Some(bytes as u64)
}

pub(super) fn positive(d: Option<RawDuration>, default: Duration, path: &str, problems: &mut Vec<Problem>) -> Duration {
    match d {
        Some(RawDuration(d)) if d.is_zero() => {
            problems.push(Problem { path: path.to_string(), reason: "must be longer than 0s".into() });
            default
        }
        Some(RawDuration(d)) => d,
        None => default,
    }
}
