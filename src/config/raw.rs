//! gateway.yaml as serde reads it: the raw types (`deny_unknown_fields`, every key optional
//! where the file may leave it out), durations (`30s`) and sizes (`64MiB`). Sections whose
//! entries are checked one by one (`backends`, `models`, `clients`, …) stay YAML values here,
//! so that a mistake in one entry does not hide the problems of the others.

use std::collections::BTreeMap;
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_yaml::Value;

use super::clients::{AuthMode, RawClient, RawLimits, RawSecret};
use super::schema::StoreText;
use super::types::BalancePolicy;

use crate::kinds::Kind;
use crate::tokens::OnOverflow;

/// gateway.yaml: mlxgate's configuration (`mlxgate check` validates a file; `mlxgate schema`
/// prints this schema).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "gateway.yaml")]
pub(super) struct RawConfig {
    /// The gateway's address (default 127.0.0.1:8000).
    pub(super) listen: Option<String>,
    /// A second listener serving only /metrics, e.g. 127.0.0.1:9464.
    pub(super) metrics_listen: Option<String>,
    /// How long running streams may go on after SIGINT/SIGTERM (default 30s).
    pub(super) shutdown_grace: Option<RawDuration>,
    /// Largest request body: bytes, or like 64MiB (default 64MiB).
    pub(super) max_body: Option<RawSize>,
    /// How long a request for a stopped GPU backend waits before the running one is swapped out (default 10s).
    pub(super) swap_after: Option<RawDuration>,
    /// The largest share of the GPU's time starting servers may take when requests alternate
    /// between GPU backends: a loaded backend is kept (1 − share) ÷ share times the next one's
    /// measured start time before it is swapped out (default 0.2: 4× the start time; 1: keep it only swap_after).
    pub(super) loading_share: Option<f64>,
    /// The memory GPU backends may hold at once (like 48GB). Unset (default): one GPU backend
    /// runs at a time. Set: GPU backends whose footprints fit run side by side.
    pub(super) gpu_memory_budget: Option<RawSize>,
    /// A connection that has not sent a whole request head within this time is closed (default 30s).
    pub(super) header_read_timeout: Option<RawDuration>,
    /// Connections one client address may hold open at once (default 128).
    pub(super) max_connections_per_client: Option<usize>,
    /// Longest time a request body may take to arrive (default 60s).
    pub(super) body_read_timeout: Option<RawDuration>,
    /// Threads that serve the connections (default 0: one per core; at most 1024). 1: one event
    /// loop, as nginx's one worker: the least CPU per request, but one large body (parsed and
    /// translated on that thread) holds every other request meanwhile. Counting prompts runs on
    /// threads of its own either way. A change takes effect at the next start.
    pub(super) worker_threads: Option<usize>,
    /// Whether each request's access-log line is written (default true).
    pub(super) access_log: Option<bool>,
    /// Host names the /ui page and the admin API answer to from a browser, besides IP
    /// addresses, localhost and this machine's own name (`mac`, `mac.local`): a name a DNS
    /// rebinding could point at this machine is refused (403) unless listed here.
    pub(super) admin_hosts: Option<Vec<String>>,
    /// The servers requests go to, by name: `url:` (running) or `kind:`/`command:` (managed).
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, RawBackend>")]
    pub(super) backends: BTreeMap<String, Value>,
    /// The public model names clients send, each with its backend.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, RawModel>")]
    pub(super) models: BTreeMap<String, Value>,
    /// Whether requests must carry a configured client's key (default: required when clients are configured).
    #[schemars(with = "Option<AuthMode>")]
    pub(super) auth: Option<Value>,
    /// The clients, by name: their key, models and limits.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, RawClient>")]
    pub(super) clients: BTreeMap<String, Value>,
    /// The limits of a client that sets none, and of every request when auth is off.
    #[schemars(with = "Option<RawLimits>")]
    pub(super) default_limits: Option<Value>,
    /// SHA-256 of the key /admin/* requires (64 hex digits); without one, loopback only.
    #[schemars(with = "Option<RawSecret>")]
    pub(super) admin_key_sha256: Option<Value>,
    /// Where rate-limit state lives: memory (default) or redis://host:port.
    #[schemars(with = "Option<StoreText>")]
    pub(super) rate_limit_store: Option<Value>,
    /// Other names (and `*` patterns) for configured models: name -> model.
    #[schemars(with = "Option<BTreeMap<String, String>>")]
    pub(super) aliases: Option<Value>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBackend {
    /// A running server's base URL (http://host:port): mlxgate does not run it.
    pub(super) url: Option<String>,
    /// The kind of server: its launch template, readiness and quirks.
    pub(super) kind: Option<Kind>,
    /// A managed server's model path or Hugging Face id ({model} in its command).
    pub(super) model: Option<String>,
    /// The port a managed server listens on.
    pub(super) port: Option<u16>,
    /// The launch command, overriding the kind's template ({model}, {host}, {port} filled in).
    pub(super) command: Option<Vec<String>>,
    /// Environment variables of a managed server.
    #[serde(default)]
    pub(super) env: BTreeMap<String, String>,
    /// A Python venv whose bin/ is put first on a managed server's PATH.
    pub(super) venv: Option<String>,
    /// How readiness is checked.
    pub(super) ready: Option<RawReady>,
    /// Stop a managed server after this long without requests.
    pub(super) idle_timeout: Option<RawDuration>,
    /// Start a managed server at gateway start-up (default false).
    pub(super) preload: Option<bool>,
    /// The server holds the Metal context: at most one such backend runs at a time (default true).
    pub(super) gpu: Option<bool>,
    /// The memory a GPU backend holds when loaded (like 20GB), for gpu_memory_budget (default:
    /// measured from its server's resident memory once it is ready).
    pub(super) footprint: Option<RawSize>,
    /// How long in-flight requests may go on when a managed server is swapped out or stopped (default 60s).
    pub(super) drain_timeout: Option<RawDuration>,
    /// SIGTERM to SIGKILL (default 10s).
    pub(super) stop_timeout: Option<RawDuration>,
    /// Crashes allowed within restart_window before the backend is marked failed (default 5).
    pub(super) max_restarts: Option<u32>,
    /// The window max_restarts counts crashes in (default 5m).
    pub(super) restart_window: Option<RawDuration>,
    /// How the server is probed: a hung managed server is restarted; a url one is ejected for a
    /// while (probed only when its model has several backends).
    pub(super) health: Option<RawHealth>,
    /// How many whole prompts the server keeps in its prompt cache (default: mlx-lm's 10, or its
    /// --prompt-cache-size; unknown kinds: 10). The size of the gateway's index of what it holds.
    pub(super) prompt_cache_sequences: Option<usize>,
    /// Requests in flight at this backend at once (default 1).
    pub(super) max_concurrency: Option<usize>,
    /// Longest wait for the TCP connection (default 5s).
    pub(super) connect_timeout: Option<RawDuration>,
    /// Longest wait for the response headers (default 30m).
    pub(super) response_timeout: Option<RawDuration>,
    /// Longest wait for the first byte of the answer's body (default: response_timeout).
    pub(super) first_byte_timeout: Option<RawDuration>,
    /// Longest silence within an answer's body before it is cut (default 10m).
    pub(super) stream_idle_timeout: Option<RawDuration>,
    /// Largest prompt + max_tokens the server takes, in tokens (default: the kind's or the model's own).
    pub(super) context_cap: Option<usize>,
    /// Switches for the server's measured quirks; each one left out keeps the kind's default.
    pub(super) normalise: Option<RawNormalise>,
}

/// A backend's `normalise:` switches; each one left out keeps the kind's default.
#[derive(Deserialize, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNormalise {
    /// Pooled connections idle longer than this are not reused.
    pub(super) pool_idle_timeout: Option<RawDuration>,
    /// Host is 127.0.0.1:<port> and Origin is removed.
    pub(super) loopback_host: Option<bool>,
    /// One request at a time, whatever max_concurrency says.
    pub(super) serialize: Option<bool>,
    /// An abandoned stream holds its slot until the backend ends it.
    pub(super) hold_abandoned: Option<bool>,
    /// finish_reason stop at max_tokens becomes length.
    pub(super) finish_length: Option<bool>,
    /// A repeated finish chunk reaches the client once.
    pub(super) single_finish: Option<bool>,
    /// The backend is asked for usage with stream_options.include_usage.
    pub(super) stream_options: Option<bool>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReady {
    /// The path that answers 2xx when the server is up (default: the kind's).
    pub(super) path: Option<String>,
    /// Longest start-up of a managed server, warm-up included (default 300s).
    pub(super) timeout: Option<RawDuration>,
    /// Whether a warm-up completion must succeed before a managed server counts as ready.
    pub(super) warmup: Option<bool>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHealth {
    /// Time between probes (default 10s).
    pub(super) interval: Option<RawDuration>,
    /// A probe slower than this fails (default 5s).
    pub(super) timeout: Option<RawDuration>,
    /// Failed probes in a row that restart a managed server, or eject a url one (default 3).
    pub(super) failures: Option<u32>,
    /// url backends: how long an ejected backend rests before one request tries it (default 10s).
    pub(super) eject_for: Option<RawDuration>,
    /// url backends: requests in a row failing before their first byte that eject it (default 3).
    pub(super) request_failures: Option<u32>,
}

/// A public model: its backend (or backends) and its request settings.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("oneOf" = [{"required": ["backend"]}, {"required": ["backends"]}]))]
pub(super) struct RawModel {
    /// The backend this model's requests go to (or `backends:` for several; one of the two).
    pub(super) backend: Option<String>,
    /// The backends that serve this model, in order (instead of `backend:`): each request goes
    /// to one of them, chosen by `balance:`.
    #[schemars(length(min = 1), extend("uniqueItems" = true))]
    pub(super) backends: Option<Vec<String>>,
    /// max_tokens sent when a request gives none (default 4096).
    pub(super) default_max_tokens: Option<u32>,
    /// The model value every backend is sent (default: per backend, a managed backend's model, else this name).
    pub(super) upstream_model: Option<String>,
    /// Requests waiting beyond those in flight; more get 503 (default 64).
    pub(super) max_queue: Option<usize>,
    /// Longest time a request waits for a slot (default 120s).
    pub(super) max_wait: Option<RawDuration>,
    /// What to do with a prompt over the context cap (default reject).
    pub(super) on_overflow: Option<OnOverflow>,
    /// The least room under the cap a prompt must leave for its answer (default 256).
    pub(super) min_room: Option<u32>,
    /// A directory with the model's tokenizer.json, when the backend's model is not local.
    pub(super) tokenizer: Option<String>,
    /// How each request is given one of several backends.
    pub(super) balance: Option<RawBalance>,
    /// A model that serves this one's requests when this one's backend is not loaded and the
    /// GPU is busy with the other's (no swap; the answer says so in x-mlxgate-fallback).
    pub(super) fallback: Option<String>,
    /// Keep each request's body (its prompt; at most 64 KiB, the last 32 requests) in memory for
    /// the /ui page's request details (default false: no prompt is kept anywhere).
    pub(super) capture: Option<bool>,
}

/// A model's `balance:`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBalance {
    /// cache_aware (default: where the prompt is cached, by cost in seconds), least_loaded, round_robin or session.
    pub(super) policy: Option<BalancePolicy>,
    /// A request header holding the session key for policy session, e.g. x-claude-code-session-id
    /// (default: the body's prompt_cache_key, else user, else metadata.user_id).
    pub(super) session_header: Option<String>,
}

/// A duration written as `30s`, `5m`, `1h 30m`.
#[derive(Clone, Copy)]
pub(super) struct RawDuration(pub(super) Duration);

impl<'de> Deserialize<'de> for RawDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)
            .map_err(|_| serde::de::Error::custom("a duration is written with its unit, like 30s or 5m"))?;
        humantime::parse_duration(text.trim())
            .map(RawDuration)
            .map_err(|e| serde::de::Error::custom(format!("{text:?} is not a duration ({e}); write it like 30s or 5m")))
    }
}

impl JsonSchema for RawDuration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": DURATION_PATTERN,
            "description": "A duration with its unit: 30s, 5m, 1h 30m, 500ms.",
            "examples": ["30s", "5m", "1h 30m"],
        })
    }
}

/// What a duration looks like to the schema: numbers each with a unit (humantime's grammar,
/// loosely: the parser has the last word).
pub(super) const DURATION_PATTERN: &str = r"^\s*([0-9]+\s*[a-zA-Zµ]+\s*)+$";

/// A size written as `64MiB`, `512KB` or a number of bytes.
pub(super) struct RawSize(pub(super) usize);

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

impl JsonSchema for RawSize {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Size".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": ["integer", "string"],
            "minimum": 0,
            "pattern": r"^\s*[0-9]+\s*(B|KB|kB|KiB|MB|MiB|GB|GiB)?\s*$",
            "description": "A number of bytes, or with its unit: 512KB, 64MiB, 1GiB.",
        })
    }
}

/// A size written as gateway.yaml writes them: bytes, or like `64MiB`, `512KB`.
pub fn parse_size(text: &str) -> Option<usize> {
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
