//! gateway.yaml: raw serde types (`deny_unknown_fields`), `${VAR}` substitution, and one
//! `validate()` that turns them into the immutable [`Config`] the gateway runs on.
//!
//! Every problem in a file is reported at once, each with its YAML path
//! (`models.qwen.backend: no backend named "qwen-local"`), so a user fixes the file in one pass.
//! Clients, keys and limits are checked in [`clients`].

mod aliases;
mod clients;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_yaml::Value;

use crate::backend::profile::{Kind, Normalise, fill_template};
use crate::tokens::OnOverflow;

pub use aliases::Aliases;
pub use clients::{ANONYMOUS, AuthMode, ClientConfig, KeyHash, Limits, RateLimitStore, RedisUrl};

/// The validated configuration. Built once before binding; never mutated.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    /// A second listener serving only `/metrics` (e.g. for a Prometheus on another network).
    pub metrics_listen: Option<SocketAddr>,
    /// How long running streams may go on after SIGINT/SIGTERM before they are cut.
    pub shutdown_grace: Duration,
    /// Largest request body accepted, in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// A client connection that has not sent a whole request head (request line and headers)
    /// within this time is closed; so is a keep-alive connection idle that long between requests.
    pub header_read_timeout: Duration,
    /// Connections one client address may hold open at once; more are refused at accept.
    pub max_connections_per_client: usize,
    /// Longest time a request's body may take to arrive once its headers are in (408 beyond):
    /// a client that announces a body and sends it slowly, or never, holds a connection.
    pub body_read_timeout: Duration,
    /// How long a request for a stopped GPU backend may wait before the running one is swapped
    /// out for it (requests for the running model flow until then).
    pub swap_after: Duration,
    pub backends: BTreeMap<String, BackendConfig>,
    pub models: BTreeMap<String, ModelConfig>,
    /// Whether requests must carry a configured client's key (default: `Required` when
    /// clients are configured, else `Off`).
    pub auth: AuthMode,
    /// The configured clients, by name.
    pub clients: BTreeMap<String, ClientConfig>,
    /// The limits of a client that does not set them (each limit on its own), and of every
    /// request when auth is off.
    pub default_limits: Limits,
    /// The digest of the key `/admin/*` requires; without one, `/admin/*` answers loopback
    /// peers only.
    pub admin_key: Option<KeyHash>,
    /// Where rate-limit state lives (default: memory).
    pub rate_limit_store: RateLimitStore,
    /// Whether each request's access-log line is written (`access_log:`, default true).
    pub access_log: bool,
    /// Other names (and `*` patterns) for configured models (`aliases:`).
    pub aliases: Aliases,
}

/// An OpenAI-compatible server the gateway forwards to.
#[derive(Debug, Clone)]
pub struct BackendConfig {
    pub name: String,
    /// Base URL, without a trailing slash: `http://127.0.0.1:8101`.
    pub url: String,
    /// Requests in flight at this backend at once (its batching capacity).
    pub max_concurrency: usize,
    /// Longest wait for the TCP connection.
    pub connect_timeout: Duration,
    /// Longest wait for the response headers (a long prefill can take minutes).
    pub response_timeout: Duration,
    /// Longest wait from sending a request to the first byte of the answer's body.
    pub first_byte_timeout: Duration,
    /// Longest silence between two reads once the answer's body has begun: a backend that is
    /// alive but silent longer than this is cut (error event, slot freed).
    pub stream_idle_timeout: Duration,
    /// What kind of server it is (launch template, readiness rules).
    pub kind: Kind,
    /// Path that answers 2xx when the server is up (`/ready` and start-up probe it).
    pub ready_path: String,
    /// Set when mlxgate runs the server itself.
    pub managed: Option<ManagedConfig>,
    /// Largest prompt + `max_tokens` the server takes, in tokens, as written in the file. When
    /// not written, the gateway takes it from the kind (none of today's kinds has one) or from the model's own
    /// `config.json` (`max_position_embeddings`) at start-up.
    pub context_cap: Option<usize>,
    /// What the gateway does about this kind of server's quirks (the kind's defaults, then the
    /// file's `normalise:` switches).
    pub normalise: Normalise,
}

/// A backend whose process mlxgate starts, watches, restarts and stops.
#[derive(Debug, Clone)]
pub struct ManagedConfig {
    /// `{model}` in the launch command; also the default `upstream_model`.
    pub model: String,
    pub port: u16,
    /// The full command line, placeholders filled.
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// A Python venv whose `bin/` is put first on the server's PATH.
    pub venv: Option<PathBuf>,
    /// The server's working directory: the config file's directory, so that relative model
    /// paths and commands in the file mean the same wherever mlxgate is started.
    pub workdir: PathBuf,
    /// Longest start-up (process spawn to ready, warm-up included).
    pub ready_timeout: Duration,
    /// Whether a warm-up completion must succeed before the backend counts as ready.
    pub warmup: bool,
    /// Stop after this long without requests (frees unified memory).
    pub idle_timeout: Option<Duration>,
    /// Start at gateway start-up rather than on the first request.
    pub preload: bool,
    /// Holds the Metal context: at most one such backend runs at a time.
    pub gpu: bool,
    /// How long in-flight requests may go on when the backend is swapped out or stopped.
    pub drain_timeout: Duration,
    /// SIGTERM to SIGKILL.
    pub stop_timeout: Duration,
    /// Crashes allowed within `restart_window` before the backend is marked failed.
    pub max_restarts: u32,
    pub restart_window: Duration,
    /// How a ready server is probed; a hung one is restarted.
    pub health: HealthCheck,
}

/// The probe of a ready managed server's ready path: `failures` probes in a row that fail or
/// take longer than `timeout` restart it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthCheck {
    pub interval: Duration,
    pub timeout: Duration,
    pub failures: u32,
}

/// A public model name and where its requests go.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub name: String,
    pub backend: String,
    /// The `model` value the backend expects.
    pub upstream_model: String,
    /// Requests waiting beyond those in flight; more get 503.
    pub max_queue: usize,
    /// Longest time a request waits for a slot; then 503.
    pub max_wait: Duration,
    /// `max_tokens` sent when a generation request gives none (mlx_lm.server would stop at 512).
    pub default_max_tokens: u32,
    /// What to do with a prompt over the backend's context cap.
    pub on_overflow: OnOverflow,
    /// The least room under the cap a prompt must leave for its answer; less, and the prompt is
    /// over the cap (`on_overflow`). A client's `max_tokens` larger than the room left is cut to
    /// it, never refused.
    pub min_room: u32,
    /// A directory with the model's `tokenizer.json` (and chat template), when the backend's
    /// model is not a local directory or a Hugging Face id in the local cache.
    pub tokenizer: Option<PathBuf>,
}

/// Why a configuration could not be loaded: every problem found, each at its YAML path.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{}", format_problems(.0))]
    Invalid(Vec<Problem>),
}

/// One thing wrong with the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted YAML path (`models.qwen.max_wait`), or `(file)` for syntax errors.
    pub path: String,
    pub reason: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.reason)
    }
}

fn format_problems(problems: &[Problem]) -> String {
    let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
    lines.join("\n")
}

const DEFAULT_LISTEN: &str = "127.0.0.1:8000";
const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
const DEFAULT_MAX_BODY: usize = 64 * 1024 * 1024;
/// hyper's own default: ample for any client that means to send a request (agents on the same
/// machine or network send their headers in milliseconds), short enough that a socket held open
/// by a client that never finishes is freed long before the open-files limit matters.
const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// A coding agent holds a few connections; a machine running many of them, or a benchmark,
/// holds tens. 128 leaves room for that while one address can take at most half of macOS's
/// default soft limit of 256 open files (and a sliver of the raised one).
const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: usize = 128;
const DEFAULT_MAX_CONCURRENCY: usize = 1;
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
const DEFAULT_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(10 * 60);
const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_MAX_QUEUE: usize = 64;
const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(120);
const DEFAULT_MAX_TOKENS: u32 = 4096;
/// The least room for an answer a prompt must leave under the cap (`min_room`).
const DEFAULT_MIN_ROOM: u32 = 256;
const DEFAULT_SWAP_AFTER: Duration = Duration::from_secs(10);
const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(300);
const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_MAX_RESTARTS: u32 = 5;
const DEFAULT_RESTART_WINDOW: Duration = Duration::from_secs(300);
const DEFAULT_HEALTH: HealthCheck =
    HealthCheck { interval: Duration::from_secs(10), timeout: Duration::from_secs(5), failures: 3 };
/// Managed servers listen on loopback only: the gateway is their one client.
pub const MANAGED_HOST: &str = "127.0.0.1";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Option<String>,
    metrics_listen: Option<String>,
    shutdown_grace: Option<RawDuration>,
    max_body: Option<RawSize>,
    swap_after: Option<RawDuration>,
    header_read_timeout: Option<RawDuration>,
    max_connections_per_client: Option<usize>,
    body_read_timeout: Option<RawDuration>,
    access_log: Option<bool>,
    #[serde(default)]
    backends: BTreeMap<String, Value>,
    #[serde(default)]
    models: BTreeMap<String, Value>,
    auth: Option<Value>,
    #[serde(default)]
    clients: BTreeMap<String, Value>,
    default_limits: Option<Value>,
    admin_key_sha256: Option<Value>,
    rate_limit_store: Option<Value>,
    aliases: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    url: Option<String>,
    kind: Option<Kind>,
    model: Option<String>,
    port: Option<u16>,
    command: Option<Vec<String>>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    venv: Option<String>,
    ready: Option<RawReady>,
    idle_timeout: Option<RawDuration>,
    preload: Option<bool>,
    gpu: Option<bool>,
    drain_timeout: Option<RawDuration>,
    stop_timeout: Option<RawDuration>,
    max_restarts: Option<u32>,
    restart_window: Option<RawDuration>,
    health: Option<RawHealth>,
    max_concurrency: Option<usize>,
    connect_timeout: Option<RawDuration>,
    response_timeout: Option<RawDuration>,
    first_byte_timeout: Option<RawDuration>,
    stream_idle_timeout: Option<RawDuration>,
    context_cap: Option<usize>,
    normalise: Option<RawNormalise>,
}

/// A backend's `normalise:` switches; each one left out keeps the kind's default.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawNormalise {
    pool_idle_timeout: Option<RawDuration>,
    loopback_host: Option<bool>,
    serialize: Option<bool>,
    hold_abandoned: Option<bool>,
    finish_length: Option<bool>,
    single_finish: Option<bool>,
    stream_options: Option<bool>,
}

impl RawNormalise {
    /// The kind's defaults with the file's switches applied.
    fn apply(self, mut n: Normalise, path: &str, problems: &mut Vec<Problem>) -> Normalise {
        if let Some(d) = self.pool_idle_timeout {
            n.pool_idle_timeout =
                positive(Some(d), n.pool_idle_timeout, &format!("{path}.normalise.pool_idle_timeout"), problems);
        }
        let switches = [
            (self.loopback_host, &mut n.loopback_host),
            (self.serialize, &mut n.serialize),
            (self.hold_abandoned, &mut n.hold_abandoned),
            (self.finish_length, &mut n.finish_length),
            (self.single_finish, &mut n.single_finish),
            (self.stream_options, &mut n.stream_options),
        ];
        for (set, field) in switches {
            if let Some(on) = set {
                *field = on;
            }
        }
        n
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReady {
    path: Option<String>,
    timeout: Option<RawDuration>,
    warmup: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    interval: Option<RawDuration>,
    timeout: Option<RawDuration>,
    failures: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    backend: String,
    default_max_tokens: Option<u32>,
    upstream_model: Option<String>,
    max_queue: Option<usize>,
    max_wait: Option<RawDuration>,
    on_overflow: Option<OnOverflow>,
    min_room: Option<u32>,
    tokenizer: Option<String>,
}

/// A duration written as `30s`, `5m`, `1h 30m`.
#[derive(Clone, Copy)]
struct RawDuration(Duration);

impl<'de> Deserialize<'de> for RawDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)
            .map_err(|_| serde::de::Error::custom("a duration is written with its unit, like 30s or 5m"))?;
        humantime::parse_duration(text.trim())
            .map(RawDuration)
            .map_err(|e| serde::de::Error::custom(format!("{text:?} is not a duration ({e}); write it like 30s or 5m")))
    }
}

/// A size written as `64MiB`, `512KB` or a number of bytes.
struct RawSize(usize);

impl<'de> Deserialize<'de> for RawSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(d)?;
        let parsed = match &value {
            Value::Number(n) => n.as_u64().and_then(|n| usize::try_from(n).ok()),
            Value::String(s) => parse_size(s),
            _ => None,
        };
        parsed.map(RawSize).ok_or_else(|| serde::de::Error::custom("a size is a number of bytes or like 64MiB, 512KB"))
    }
}

fn parse_size(text: &str) -> Option<usize> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: usize = digits.parse().ok()?;
    let factor: usize = match unit.trim() {
        "" | "B" => 1,
        "KB" | "kB" => 1000,
        "KiB" => 1 << 10,
        "MB" => 1000 * 1000,
        "MiB" => 1 << 20,
        "GB" => 1000 * 1000 * 1000,
        "GiB" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(factor)
}

impl Config {
    /// The configured model a request's `model` names: itself when it is a model's own name,
    /// else the model of its alias ([`Aliases::resolve`]), else itself (a model nobody
    /// configured, which its caller answers 404).
    pub fn model_named<'a>(&'a self, requested: &'a str) -> &'a str {
        if self.models.contains_key(requested) {
            return requested;
        }
        self.aliases.resolve(requested).unwrap_or(requested)
    }

    /// Reads, substitutes `${VAR}` from the process environment, and validates a file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::load_with(path, None)
    }

    /// As [`load`](Config::load), for a file meant for another process's environment (`mlxgate
    /// reload` checks the running gateway's file): a `${VAR}` without a default that is unset
    /// here gets a placeholder and its name goes into `unset`, rather than being a problem.
    pub fn load_elsewhere(path: &Path, unset: &RefCell<BTreeSet<String>>) -> Result<Config, ConfigError> {
        Config::load_with(path, Some(unset))
    }

    fn load_with(path: &Path, unset: Option<&RefCell<BTreeSet<String>>>) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
        let env = Env { lookup: &|name| std::env::var(name).ok(), unset };
        let mut config = Config::parse_env(&text, &env)?;
        // Relative paths (venv, model, command) are relative to the file that names them.
        let base = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let base = std::fs::canonicalize(&base).unwrap_or(base);
        for tokenizer in config.models.values_mut().filter_map(|m| m.tokenizer.as_mut()) {
            if tokenizer.is_relative() {
                *tokenizer = base.join(&*tokenizer);
            }
        }
        let mut renamed = Vec::new();
        for backend in config.backends.values_mut() {
            let kind = backend.kind;
            let Some(managed) = backend.managed.as_mut() else { continue };
            managed.workdir = base.clone();
            if let Some(venv) = managed.venv.as_mut()
                && venv.is_relative()
            {
                *venv = base.join(&*venv);
            }
            // mlx-omni-server loads the model each request names, and looks a relative path up
            // on the Hub: a local model directory is named by its absolute path.
            let local = base.join(&managed.model);
            if kind.model_from_request() && Path::new(&managed.model).is_relative() && local.is_dir() {
                let absolute = std::fs::canonicalize(&local).unwrap_or(local).display().to_string();
                renamed.push((backend.name.clone(), std::mem::replace(&mut managed.model, absolute.clone()), absolute));
            }
        }
        for (backend, relative, absolute) in renamed {
            for model in config.models.values_mut().filter(|m| m.backend == backend && m.upstream_model == relative) {
                model.upstream_model = absolute.clone();
            }
        }
        Ok(config)
    }

    /// Parses YAML text; `env` answers `${VAR}` look-ups (tests pass their own).
    pub fn parse(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        Config::parse_env(text, &Env { lookup: env, unset: None })
    }

    fn parse_env(text: &str, env: &Env<'_>) -> Result<Config, ConfigError> {
        let mut problems = Vec::new();
        let mut root: Value = serde_yaml::from_str(text)
            .map_err(|e| ConfigError::Invalid(vec![Problem { path: "(file)".into(), reason: e.to_string() }]))?;
        if root.is_null() {
            root = Value::Mapping(Default::default());
        }
        substitute_env(&mut root, &mut Vec::new(), env, &mut problems);
        let raw: Option<RawConfig> = typed(root, "", &mut problems);
        let config = raw.and_then(|raw| validate(raw, &mut problems));
        match config {
            Some(config) if problems.is_empty() => Ok(config),
            _ => Err(ConfigError::Invalid(problems)),
        }
    }
}

/// Deserializes `value` into `T`, recording the first problem with its full path.
fn typed<T: DeserializeOwned>(value: Value, prefix: &str, problems: &mut Vec<Problem>) -> Option<T> {
    match serde_path_to_error::deserialize::<_, T>(value) {
        Ok(v) => Some(v),
        Err(err) => {
            let inner = err.path().to_string();
            let path = match (prefix.is_empty(), inner.as_str()) {
                (true, ".") => "(root)".to_string(),
                (true, _) => inner,
                (false, ".") => prefix.to_string(),
                (false, _) => format!("{prefix}.{inner}"),
            };
            let reason = err.into_inner().to_string();
            // serde_yaml appends " at line N column M" for positions inside the source text;
            // the path already says where.
            problems.push(Problem { path, reason });
            None
        }
    }
}

fn validate(raw: RawConfig, problems: &mut Vec<Problem>) -> Option<Config> {
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
    if gpu_preloads.len() > 1 {
        problems.push(Problem {
            path: format!("backends.{}.preload", gpu_preloads[1]),
            reason: format!("only one GPU backend can run at a time, and {} already preloads", gpu_preloads[0]),
        });
    }

    let swap_after = positive(raw.swap_after, DEFAULT_SWAP_AFTER, "swap_after", problems);
    let gpu_backends = backends.values().filter(|b| b.managed.as_ref().is_some_and(|m| m.gpu)).count();
    let mut models = BTreeMap::new();
    for (name, value) in raw.models {
        let path = format!("models.{name}");
        let Some(m) = typed::<RawModel>(value, &path, problems) else {
            continue;
        };
        if !backends.contains_key(&m.backend) {
            let known: Vec<&str> = backends.keys().map(String::as_str).collect();
            problems.push(Problem {
                path: format!("{path}.backend"),
                reason: format!(
                    "no backend named {:?} (backends: {})",
                    m.backend,
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                ),
            });
        }
        let max_wait = positive(m.max_wait, DEFAULT_MAX_WAIT, &format!("{path}.max_wait"), problems);
        let max_queue = m.max_queue.unwrap_or(DEFAULT_MAX_QUEUE);
        let managed = backends.get(&m.backend).and_then(|b| b.managed.as_ref());
        if managed.is_some() && max_queue == 0 {
            problems.push(Problem {
                path: format!("{path}.max_queue"),
                reason: "must be at least 1: requests for a managed backend wait while it starts, so with no \
                         room to wait every request would be refused"
                    .into(),
            });
        }
        if managed.is_some_and(|mc| mc.gpu) && gpu_backends > 1 && !max_wait.is_zero() && max_wait <= swap_after {
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
        // A managed server knows its model by the path it loaded (mlx_lm.server would try to
        // download any other name from the Hub).
        let backend = backends.get(&m.backend);
        let managed_model = backend.and_then(|b| b.managed.as_ref()).map(|mc| mc.model.clone());
        let upstream_model = match (m.upstream_model, managed_model, backend.map(|b| b.kind)) {
            (Some(upstream), _, _) => upstream,
            (None, _, Some(Kind::Omlx)) => {
                problems.push(Problem {
                    path: format!("{path}.upstream_model"),
                    reason: "omlx serves each model directory under its --model-dir by the directory's name: name it"
                        .into(),
                });
                name.clone()
            }
            (None, Some(model), _) => model,
            (None, None, Some(kind @ (Kind::MlxLm | Kind::MlxVlm | Kind::MlxOmniServer))) => {
                let how = if kind == Kind::MlxLm { " (its --model, or default_model)" } else { "" };
                problems.push(Problem {
                    path: format!("{path}.upstream_model"),
                    reason: format!(
                        "{} drops its model or looks the name up on the Hub when asked for a model it does not \
                         serve: name the model exactly as the server loaded it{how}",
                        kind.name()
                    ),
                });
                name.clone()
            }
            (None, None, _) => name.clone(),
        };
        models.insert(
            name.clone(),
            ModelConfig {
                upstream_model,
                name,
                backend: m.backend,
                max_queue,
                default_max_tokens: m.default_max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
                max_wait,
                on_overflow: m.on_overflow.unwrap_or_default(),
                min_room: m.min_room.unwrap_or(DEFAULT_MIN_ROOM),
                tokenizer: m.tokenizer.map(PathBuf::from),
            },
        );
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
    Some(Config {
        listen: listen?,
        metrics_listen,
        shutdown_grace: raw.shutdown_grace.map_or(DEFAULT_SHUTDOWN_GRACE, |d| d.0),
        max_body_bytes,
        body_read_timeout,
        swap_after,
        header_read_timeout,
        max_connections_per_client,
        backends,
        models,
        auth: access.auth,
        clients: access.clients,
        default_limits: access.default_limits,
        admin_key: access.admin_key,
        rate_limit_store: access.rate_limit_store,
        access_log: raw.access_log.unwrap_or(true),
        aliases,
    })
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

/// Checks one backend: either `url` (a running server) or `kind`/`command` (a managed one).
fn validate_backend(name: String, path: &str, b: RawBackend, problems: &mut Vec<Problem>) -> Option<BackendConfig> {
    let mut problem = |field: &str, reason: String| {
        let at = if field.is_empty() { path.to_string() } else { format!("{path}.{field}") };
        problems.push(Problem { path: at, reason });
    };
    let max_concurrency = b.max_concurrency.unwrap_or(DEFAULT_MAX_CONCURRENCY);
    if max_concurrency == 0 {
        problem("max_concurrency", "must be at least 1".into());
    }
    let timeouts = Timeouts::check(&b, path, problems);
    if b.context_cap == Some(0) {
        problems.push(Problem {
            path: format!("{path}.context_cap"),
            reason: "must be at least 1 token (leave it out for the kind's or the model's own limit)".into(),
        });
    }
    let context_cap = b.context_cap.filter(|c| *c > 0);
    let mut problem = |field: &str, reason: String| {
        let at = if field.is_empty() { path.to_string() } else { format!("{path}.{field}") };
        problems.push(Problem { path: at, reason });
    };
    // With url, the server is already running and `kind` only names its profile; without
    // url, mlxgate runs it from `kind` or `command`.
    let managed_keys = b.url.is_none() && b.kind.is_some() || b.command.is_some();
    let (url, managed) = match (&b.url, managed_keys) {
        (Some(_), true) => {
            problem(
                "",
                "give either url (a server that is already running) or command (one mlxgate runs), not both".into(),
            );
            return None;
        }
        (None, false) => {
            problem(
                "",
                "needs url (a running server) or kind (mlx-lm, mlx-openai-server, vllm-mlx, rapid-mlx, mlx-vlm, \
                 mlx-omni-server, omlx, higgs, mlx-serve, custom)"
                    .into(),
            );
            return None;
        }
        (Some(url), false) => {
            let url = url.trim_end_matches('/').to_string();
            match url.parse::<http::Uri>() {
                Ok(uri) if uri.scheme_str() == Some("http") && uri.host().is_some() => {}
                Ok(uri) if uri.scheme_str() == Some("https") => {
                    problem("url", "https backends are not supported yet; use http:// (MLX servers on a LAN)".into())
                }
                _ => problem("url", format!("{url:?} is not a URL like http://127.0.0.1:8101")),
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
                (b.drain_timeout.is_some(), "drain_timeout"),
                (b.stop_timeout.is_some(), "stop_timeout"),
                (b.max_restarts.is_some(), "max_restarts"),
                (b.restart_window.is_some(), "restart_window"),
                (ready.is_some_and(|r| r.timeout.is_some()), "ready.timeout"),
                (ready.is_some_and(|r| r.warmup.is_some()), "ready.warmup"),
                (b.health.is_some(), "health"),
            ] {
                if set {
                    problem(
                        key,
                        "only for managed backends (no url); this one has a url, so mlxgate does not run it".into(),
                    );
                }
            }
            (url, None)
        }
        (None, true) => {
            let kind = b.kind.unwrap_or(Kind::Custom);
            let Some(port) = b.port.filter(|p| *p != 0) else {
                problem("port", "a managed backend needs a port (1-65535) for its server".into());
                return None;
            };
            let template: Vec<String> = match (&b.command, kind.launch_template()) {
                (Some(c), _) if c.is_empty() => {
                    problem("command", "must name a program".into());
                    return None;
                }
                (Some(c), _) => c.clone(),
                (None, Some(t)) => t.iter().map(|s| s.to_string()).collect(),
                (None, None) => {
                    problem("command", "kind: custom needs a command, e.g. [my-server, --port, \"{port}\"]".into());
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
                    problem("model", format!("{why}: name a model path or Hugging Face id"));
                    return None;
                }
                (None, false) => name.clone(),
            };
            let ready = b.ready.unwrap_or(RawReady { path: None, timeout: None, warmup: None });
            let health = validate_health(b.health, &mut problem);
            let mut positive_at = |field: &str, d: Option<RawDuration>, default: Duration| {
                positive(d, default, &format!("{path}.{field}"), problems)
            };
            let ready_timeout = positive_at("ready.timeout", ready.timeout, DEFAULT_READY_TIMEOUT);
            let stop_timeout = positive_at("stop_timeout", b.stop_timeout, DEFAULT_STOP_TIMEOUT);
            let restart_window = positive_at("restart_window", b.restart_window, DEFAULT_RESTART_WINDOW);
            let idle_timeout = b.idle_timeout.map(|d| positive_at("idle_timeout", Some(d), Duration::ZERO));
            let managed = ManagedConfig {
                command: fill_template(&template, &model, MANAGED_HOST, port),
                model,
                port,
                env: b.env,
                venv: b.venv.map(PathBuf::from),
                workdir: PathBuf::from("."),
                ready_timeout,
                warmup: ready.warmup.unwrap_or(kind.needs_warmup()),
                idle_timeout,
                preload: b.preload.unwrap_or(false),
                gpu: b.gpu.unwrap_or(true),
                drain_timeout: b.drain_timeout.map_or(DEFAULT_DRAIN_TIMEOUT, |d| d.0),
                stop_timeout,
                max_restarts: b.max_restarts.unwrap_or(DEFAULT_MAX_RESTARTS),
                restart_window,
                health,
            };
            let ready_path = ready.path.unwrap_or_else(|| kind.ready_path().to_string());
            let normalise = normalise_of(kind, Some(&managed.command), b.normalise, max_concurrency, path, problems);
            return Some(BackendConfig {
                url: format!("http://{MANAGED_HOST}:{port}"),
                name,
                max_concurrency,
                connect_timeout: timeouts.connect,
                response_timeout: timeouts.response,
                first_byte_timeout: timeouts.first_byte,
                stream_idle_timeout: timeouts.stream_idle,
                kind,
                ready_path: if ready_path.starts_with('/') { ready_path } else { format!("/{ready_path}") },
                managed: Some(managed),
                context_cap,
                normalise,
            });
        }
    };
    let kind = b.kind.unwrap_or(Kind::Custom);
    let ready_path = b.ready.and_then(|r| r.path).unwrap_or_else(|| kind.ready_path().to_string());
    let normalise = normalise_of(kind, None, b.normalise, max_concurrency, path, problems);
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
    let normalise = raw.unwrap_or_default().apply(kind.normalise(command), path, problems);
    if normalise.serialize && max_concurrency > 1 {
        problems.push(Problem {
            path: format!("{path}.max_concurrency"),
            reason: if kind == Kind::VllmMlx {
                "vllm-mlx without --continuous-batching serves one request at a time (a second concurrent stream \
                 gets an error event): leave max_concurrency at 1, or set normalise.serialize: false for a server \
                 run with --continuous-batching"
                    .to_string()
            } else {
                "normalise.serialize sends one request at a time: leave max_concurrency at 1, or switch serialize off"
                    .to_string()
            },
        });
    }
    normalise
}

/// A duration that must be longer than zero (zero would refuse or cut everything at once).
fn positive(d: Option<RawDuration>, default: Duration, path: &str, problems: &mut Vec<Problem>) -> Duration {
    match d {
        Some(RawDuration(d)) if d.is_zero() => {
            problems.push(Problem { path: path.to_string(), reason: "must be longer than 0s".into() });
            default
        }
        Some(RawDuration(d)) => d,
        None => default,
    }
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

/// A managed backend's `health` block, defaults filled; zero durations or failures are problems.
fn validate_health(raw: Option<RawHealth>, problem: &mut impl FnMut(&str, String)) -> HealthCheck {
    let Some(raw) = raw else { return DEFAULT_HEALTH };
    let health = HealthCheck {
        interval: raw.interval.map_or(DEFAULT_HEALTH.interval, |d| d.0),
        timeout: raw.timeout.map_or(DEFAULT_HEALTH.timeout, |d| d.0),
        failures: raw.failures.unwrap_or(DEFAULT_HEALTH.failures),
    };
    for (value, field) in [(health.interval, "health.interval"), (health.timeout, "health.timeout")] {
        if value.is_zero() {
            problem(field, "must be longer than 0s".into());
        }
    }
    if health.failures == 0 {
        problem("health.failures", "must be at least 1".into());
    }
    health
}

/// Where `${VAR}` values come from.
struct Env<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
    /// `Some`: an unset variable without a default is noted here and replaced by a placeholder
    /// (the file is for another process's environment); `None`: it is a problem.
    unset: Option<&'a RefCell<BTreeSet<String>>>,
}

/// Replaces `${VAR}` and `${VAR:-default}` in every string value; `$${` stays a literal `${`.
/// A scalar that was only a placeholder is re-read as YAML, so `port: ${PORT}` gives a number.
fn substitute_env(value: &mut Value, path: &mut Vec<String>, env: &Env<'_>, problems: &mut Vec<Problem>) {
    match value {
        Value::String(s) if s.contains('$') => match expand(s, env) {
            Ok(expanded) => {
                let whole = s.starts_with("${")
                    && s.ends_with('}')
                    && s.matches("${").count() == 1
                    && !clients::is_clear_key(path);
                *value = if whole {
                    serde_yaml::from_str::<Value>(&expanded)
                        .ok()
                        .filter(|v| !matches!(v, Value::Mapping(_) | Value::Sequence(_) | Value::Null))
                        .unwrap_or(Value::String(expanded))
                } else {
                    Value::String(expanded)
                };
            }
            Err(reason) => problems.push(Problem { path: path.join("."), reason }),
        },
        Value::Mapping(map) => {
            for (k, v) in map.iter_mut() {
                path.push(k.as_str().map_or_else(|| format!("{k:?}"), str::to_string));
                substitute_env(v, path, env, problems);
                path.pop();
            }
        }
        Value::Sequence(items) => {
            for (i, v) in items.iter_mut().enumerate() {
                path.push(i.to_string());
                substitute_env(v, path, env, problems);
                path.pop();
            }
        }
        _ => {}
    }
}

fn expand(text: &str, env: &Env<'_>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        rest = &rest[pos..];
        if let Some(after) = rest.strip_prefix("$${") {
            out.push_str("${");
            rest = after;
        } else if let Some(after) = rest.strip_prefix("${") {
            let end = after.find('}').ok_or_else(|| format!("unclosed ${{ in {text:?}"))?;
            let inner = &after[..end];
            let (name, default) = match inner.split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (inner, None),
            };
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("${{{inner}}} is not a variable name"));
            }
            match ((env.lookup)(name).filter(|v| !v.is_empty() || default.is_none()), default) {
                (Some(v), _) => out.push_str(&v),
                (None, Some(d)) => out.push_str(d),
                (None, None) if env.unset.is_some() => {
                    if let Some(unset) = env.unset {
                        unset.borrow_mut().insert(name.to_owned());
                    }
                    out.push_str("unset-here-");
                    out.push_str(name);
                }
                (None, None) => {
                    return Err(format!(
                        "environment variable {name} is not set (write ${{{name}:-default}} for a default)"
                    ));
                }
            }
            rest = &after[end + 1..];
        } else {
            out.push('$');
            rest = &rest[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
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
        assert_eq!(c.models["qwen"].upstream_model, "tiny-qwen3");
        assert_eq!(c.models["qwen"].max_wait, Duration::from_secs(120));
        assert_eq!(c.models["other"].upstream_model, "other");
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
        assert_eq!(c.models["qwen"].upstream_model, "a${b}");
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
        assert_eq!(native.command, ["mlx_lm.server", "--model", "/m", "--host", "127.0.0.1", "--port", "8101"]);
        assert!(native.warmup && native.gpu && !native.preload);
        assert_eq!(native.idle_timeout, Some(Duration::from_secs(600)));
        assert_eq!(c.backends["native"].url, "http://127.0.0.1:8101");
        assert_eq!(c.models["qwen"].upstream_model, "/m", "a managed server knows its model by its path");
        let tool = c.backends["tool"].managed.as_ref().expect("managed");
        assert_eq!(tool.command, ["srv", "--port", "8102"]);
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
        assert_eq!(omni.command, ["mlx-omni-server", "--host", "127.0.0.1", "--port", "9101"]);
        assert!(omni.warmup, "the warm-up completion is what loads its model");
        assert_eq!(c.models["q"].upstream_model, ".cache/tiny-qwen3");
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
        assert_eq!(c.models["q"].upstream_model, absolute);
        assert_eq!(c.models["named"].upstream_model, "other", "a name written in the file is kept");
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
        assert_eq!(c.models["v"].upstream_model, "mlx-community/Qwen3-4B");
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
            p.iter().any(|l| l
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
        assert_eq!(
            health,
            HealthCheck { interval: Duration::from_secs(2), timeout: Duration::from_secs(5), failures: 5 }
        );
        let p = problems(
            "backends:\n  a: {kind: custom, command: [s], port: 9001, health: {interval: 0s, timeout: 0s, failures: 0}}\n  \
             r: {url: 'http://x:1', health: {interval: 1s}}\n\
             models:\n  m: {backend: a}\n",
        );
        for expected in [
            "backends.a.health.interval: must be longer than 0s",
            "backends.a.health.timeout: must be longer than 0s",
            "backends.a.health.failures: must be at least 1",
            "backends.r.health: only for managed backends",
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
        let zero_swap =
            problems("swap_after: 0s\nbackends: {r: {url: 'http://127.0.0.1:9'}}\nmodels: {m: {backend: r}}\n");
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
}
