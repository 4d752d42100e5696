//! The validated configuration: the plain data the gateway reads ([`Config`] and what it holds),
//! built once by [`super::validate`] before binding and never mutated.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http::HeaderName;
use schemars::JsonSchema;
use serde::Deserialize;

use super::aliases::Aliases;
use super::clients::{AuthMode, ClientConfig, KeyHash, Limits, RateLimitStore};
use crate::kinds::{Kind, Normalise};
use crate::tokens::OnOverflow;

/// The default `loading_share`: a loaded backend is kept 4× the next one's start time.
pub const DEFAULT_LOADING_SHARE: f64 = 0.2;

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
    /// Threads that serve the connections: 0, one per core (the default); 1, one event loop.
    pub worker_threads: usize,
    /// Longest time a request's body may take to arrive once its headers are in (408 beyond):
    /// a client that announces a body and sends it slowly, or never, holds a connection.
    pub body_read_timeout: Duration,
    /// How long a request for a stopped GPU backend may wait before the running one is swapped
    /// out for it (requests for the running model flow until then).
    pub swap_after: Duration,
    /// The largest share of the GPU's time starting servers may take under alternating demand
    /// (`loading_share`, in (0, 1]; default [`DEFAULT_LOADING_SHARE`]).
    pub loading_share: f64,
    /// Bytes GPU backends may hold at once (`gpu_memory_budget`); `None`: one at a time.
    pub gpu_memory_budget: Option<u64>,
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
    /// Host names the /ui page and the admin API answer to from a browser beyond IP addresses,
    /// localhost and this machine's name (`admin_hosts:`, lowercase).
    pub admin_hosts: Vec<String>,
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
    /// A running (`url:`) server's probe and ejection rules, defaults filled in (`None` for a
    /// managed one: its supervisor probes and restarts it). The probe runs only when one of
    /// the backend's models has more than one backend, so a single-backend model behaves as
    /// before.
    pub health: Option<RemoteHealth>,
    /// How many whole prompts the server keeps in its prompt cache (the file's
    /// `prompt_cache_sequences`, else a managed server's launch flag or its kind's default, else
    /// [`crate::kinds::ASSUMED_PROMPT_CACHE_SEQUENCES`]): the size of the balancer's index of
    /// what it holds. 0: it keeps none.
    pub prompt_cache_sequences: usize,
}

/// A running server's health rules: its ready path probed every `probe.interval` (`probe.
/// failures` failed probes in a row eject it), `request_failures` failed requests in a row
/// eject it too; an ejected backend rests `eject_for`, then one request tries it (half-open):
/// a success takes it back, a failure ejects it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteHealth {
    pub probe: HealthCheck,
    /// How long an ejected backend rests before its half-open trial.
    pub eject_for: Duration,
    /// Requests in a row that fail before their first byte (refused, reset, 5xx, connect
    /// timeout) that eject the backend.
    pub request_failures: u32,
}

/// A backend whose process mlxgate starts, watches, restarts and stops.
#[derive(Debug, Clone)]
pub struct ManagedConfig {
    /// `{model}` in the launch command; also the default `upstream_model`.
    pub model: String,
    pub port: u16,
    /// The launch command as written: the file's `command`, else the kind's template, with its
    /// `{model}`, `{host}` and `{port}` placeholders; they are filled when the server starts
    /// ([`crate::kinds::launch::command`]).
    pub template: Vec<String>,
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
    /// Holds the Metal context: at most one such backend runs at a time (or as many as fit
    /// `gpu_memory_budget`).
    pub gpu: bool,
    /// The bytes it holds when loaded, as written (`footprint:`); else measured once ready.
    pub footprint: Option<u64>,
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
    /// The backends that serve it, in the file's order: `backends: [studio, mini]`, or the one
    /// of `backend: studio`. Never empty, each configured, none twice (validation guarantees it).
    pub backends: Vec<String>,
    /// The `model` value every backend is sent, when the file writes `upstream_model:`; else
    /// each backend has its own ([`ModelConfig::upstream_model_for`]).
    pub upstream_model: Option<String>,
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
    /// How a request is given one of `backends` (`balance:`; no effect with one backend).
    pub balance: BalanceConfig,
    /// A configured model that serves this one's requests while this one's backends are not
    /// loaded and the GPU is busy with the fallback's (`fallback:`; one hop, never itself).
    pub fallback: Option<String>,
    /// Each request's body kept in memory (bounded) for the /ui page's details (`capture:`).
    pub capture: bool,
}

/// A model's `balance:`: which policy picks a backend for each request, and where the session
/// policy finds its key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BalanceConfig {
    pub policy: BalancePolicy,
    /// A request header whose value is the session key (`x-claude-code-session-id`); without
    /// it (or when a request lacks it) the key is the body's `prompt_cache_key`, else `user`,
    /// else `metadata.user_id`.
    pub session_header: Option<HeaderName>,
}

/// How a backend is chosen for a request among a model's usable backends. Plain data: the
/// dispatch maps it onto the balancer's own policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BalancePolicy {
    /// The least cost in seconds: the prompt tokens a backend would prefill (less the prefix it
    /// is believed to hold) at its measured rate, plus its expected wait.
    #[default]
    CacheAware,
    /// The backend with the most free slots, then the fewest requests in flight.
    LeastLoaded,
    /// Each usable backend in turn.
    RoundRobin,
    /// A rendezvous hash of the request's session key: one session, one backend.
    Session,
}

impl BalancePolicy {
    /// The name written in the file (`cache_aware`), for logs and `/admin/backends`.
    pub fn label(self) -> &'static str {
        match self {
            BalancePolicy::CacheAware => "cache_aware",
            BalancePolicy::LeastLoaded => "least_loaded",
            BalancePolicy::RoundRobin => "round_robin",
            BalancePolicy::Session => "session",
        }
    }
}

impl ModelConfig {
    /// The `model` value `backend` expects for this model: the file's `upstream_model:` when
    /// written (it applies to every backend), else a managed backend's own model (the path or
    /// id it loaded), else the public name.
    pub fn upstream_model_for<'a>(&'a self, backend: &'a BackendConfig) -> &'a str {
        match (&self.upstream_model, &backend.managed) {
            (Some(written), _) => written,
            (None, Some(managed)) => &managed.model,
            (None, None) => &self.name,
        }
    }
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
}
