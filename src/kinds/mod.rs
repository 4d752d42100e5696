//! The catalogue of server kinds: every fact mlxgate knows about each kind of OpenAI-compatible
//! server, in one table ([`Kind::facts`]) — how to launch it ([`launch`]), which path says it is
//! up and whether it needs a warm-up, the context cap it enforces itself, the quirks the gateway
//! normalises ([`Normalise`]), which `max_tokens` field it reads, how it joins text parts, how
//! it takes a model name it does not serve, and what `mlxgate probe` may send it.
//!
//! A leaf: it imports no other module of the crate, so `config` (which keeps a backend's
//! [`Kind`] as data), `backend`, `api` and `probe` all read it. Nothing outside this module
//! matches on a kind: code asks the catalogue, or tests a switch in [`Normalise`].

pub mod launch;
mod normalise;

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

pub use launch::fill_template;
pub use normalise::{Normalise, POOL_IDLE_TIMEOUT};

/// A kind of OpenAI-compatible server (the `kind:` of a backend, `mlxgate probe --kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, clap::ValueEnum, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[value(rename_all = "kebab-case")]
pub enum Kind {
    /// mlx-lm's own `mlx_lm.server`, the native engine.
    MlxLm,
    /// `mlx-openai-server launch`.
    MlxOpenaiServer,
    /// `vllm-mlx serve` (one request at a time unless `--continuous-batching`).
    VllmMlx,
    /// `rapid-mlx serve`.
    RapidMlx,
    /// mlx-vlm's `mlx_vlm.server` (also serves text-only models such as Qwen3).
    MlxVlm,
    /// `mlx-omni-server`: no `--model`; it loads the model the request's `model` field names
    /// (a Hugging Face id, or a path that must be absolute: it looks a relative one up on the
    /// Hub), so the upstream model name is the configured model path.
    MlxOmniServer,
    /// oMLX's `omlx serve` (macOS only): serves every model directory under `--model-dir`.
    Omlx,
    /// `higgs serve` (macOS only, a Rust binary).
    Higgs,
    /// `mlx-serve` (macOS only, a Zig binary).
    MlxServe,
    /// Any OpenAI-compatible server; `command` says how to launch it.
    Custom,
}

/// Which field a server reads its token limit from when a request carries both `max_tokens`
/// and `max_completion_tokens` (read in the servers' sources).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxTokensField {
    /// `max_tokens` unless it is null (mlx-openai-server 1.6.3, `app/models/mlx_lm.py`).
    MaxTokensFirst,
    /// `max_completion_tokens or max_tokens`: a 0 or null falls through (mlx-omni-server 0.5.3,
    /// `openai_adapter.py`).
    CompletionFirst,
    /// Unknown precedence: the larger of the two, which can only miss a cut (the server's own
    /// `stop`, as without `finish_length`), where the smaller could turn a finished answer into
    /// `length` (and agents continue it).
    Larger,
}

/// What a server does when asked for a model it does not serve, which decides whether the
/// gateway may send it the public name when `upstream_model` is not written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamModel {
    /// Any name does (it serves what it loaded, or a managed backend's model path is sent).
    Any,
    /// It drops its model or looks the name up on the Hub: a running server's model must be
    /// named exactly as it loaded it; `how` says where to find that name.
    AsLoaded { how: &'static str },
    /// It serves each model directory under its `--model-dir` by the directory's name (omlx):
    /// always named in the file.
    DirectoryName,
}

/// What a server does with `max_tokens: -1` (wire-facts §4), which decides whether the probe
/// may send it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NegativeMaxTokens {
    /// Refused before generating (mlx_lm 400, vllm-mlx 422, Rapid-MLX 400, mlx-vlm 400).
    Refused,
    /// Taken as unlimited (200, generated until EOS).
    Unlimited,
    /// Not known.
    Unknown,
}

/// Which `model` the probe names in its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeModel {
    /// None: the server uses its launch `--model` (mlx_lm.server, which lists it last as an
    /// absolute path; any other name, even that path, makes it load the model again).
    Launch,
    /// The one `/v1/models` lists as `loaded` (mlx-vlm: any other name unloads its model).
    Loaded,
    /// The only one `/v1/models` lists.
    Listed,
}

/// Every fact about one kind of server: a row of the catalogue.
#[derive(Debug, Clone, Copy)]
pub struct Facts {
    /// The `kind:` name, as in logs and `/admin/backends`.
    pub name: &'static str,
    /// The launch command with `{model}`, `{host}` and `{port}` placeholders; `None` for custom.
    pub launch: Option<&'static [&'static str]>,
    /// The server learns its model only from each request's `model` field, so the backend
    /// needs `model` even though its command does not use it (mlx-omni-server).
    pub model_from_request: bool,
    /// The context cap the server enforces by itself, when it has one of its own.
    pub context_cap: Option<usize>,
    /// The path that answers 2xx once the server is up.
    pub ready_path: &'static str,
    /// A warm-up completion must succeed before the server counts as ready.
    pub warmup: bool,
    /// `max_tokens` of the warm-up completion.
    pub warmup_max_tokens: u32,
    /// Pooled connections idle longer than this are not reused (below the server's keep-alive).
    pub pool_idle_timeout: Duration,
    /// `Normalise::loopback_host` by default.
    pub loopback_host: bool,
    /// `Normalise::serialize` by default, unless the command carries this flag.
    pub serialize_unless: Option<&'static str>,
    /// Why a serialized backend of this kind must keep `max_concurrency` at 1 (said when the
    /// file writes more).
    pub serialize_reason: Option<&'static str>,
    /// `Normalise::hold_abandoned` by default.
    pub hold_abandoned: bool,
    /// `Normalise::finish_length` by default.
    pub finish_length: bool,
    /// `Normalise::single_finish` by default.
    pub single_finish: bool,
    /// Which token limit the server applies.
    pub max_tokens_field: MaxTokensField,
    /// It reports one token less for an answer cut at `max_tokens` (mlx-omni-server drops the
    /// last token, the one mlx-lm yields with the finish: 29 for `max_tokens` 30, measured).
    pub counts_cut_one_short: bool,
    /// What joins a message's text parts in the server's rendering (mlx_lm.server's
    /// `process_message_content` joins them with nothing, vLLM-style servers with newlines).
    pub content_joiner: &'static str,
    /// How it takes a model name it does not serve.
    pub upstream_model: UpstreamModel,
    /// `scripts/setup-backends` builds its venv.
    pub setup_script: bool,
    /// What it does with `max_tokens: -1`.
    pub negative_max_tokens: NegativeMaxTokens,
    /// It checks the prompt's length before generating (wire-facts §4: 400).
    pub checks_context: bool,
    /// It unloads its model when asked for an unknown one (mlx_lm.server 404, mlx-vlm 400).
    pub unloads_on_unknown_model: bool,
    /// Which `model` the probe sends it.
    pub probe_model: ProbeModel,
    /// How many whole prompts the server keeps in its prompt cache by default (mlx_lm.server's
    /// `--prompt-cache-size`, an LRU of 10 sequences); `None` when unknown (the balancer then
    /// assumes [`ASSUMED_PROMPT_CACHE_SEQUENCES`]).
    pub prompt_cache_sequences: Option<usize>,
    /// The launch flag that sets that number, when the server has one.
    pub prompt_cache_flag: Option<&'static str>,
}

/// The prompt cache's size, in whole sequences, assumed for a server whose kind does not know
/// it: mlx_lm.server's default, which most MLX servers reuse.
pub const ASSUMED_PROMPT_CACHE_SEQUENCES: usize = 10;

/// The idle timeout of Rapid-MLX's pooled connections: it keeps idle connections for 30 s
/// (measured).
const RAPID_MLX_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(25);

/// The facts most kinds share; each row says where it differs.
const DEFAULT: Facts = Facts {
    name: "",
    launch: None,
    model_from_request: false,
    // The others take what the model takes (Rapid-MLX and mlx-vlm check against the model's own
    // length, measured), so the gateway falls back to the model's `max_position_embeddings`.
    context_cap: None,
    ready_path: "/health",
    // mlx_lm.server's `/health` says ok before the model is loaded; the others answer 503 while
    // loading, but a first completion also compiles kernels (vllm-mlx's first one takes seconds
    // before any token), so every known server is warmed.
    warmup: true,
    warmup_max_tokens: 1,
    pool_idle_timeout: POOL_IDLE_TIMEOUT,
    loopback_host: false,
    serialize_unless: None,
    serialize_reason: None,
    hold_abandoned: false,
    finish_length: false,
    single_finish: false,
    max_tokens_field: MaxTokensField::Larger,
    counts_cut_one_short: false,
    content_joiner: "\n",
    upstream_model: UpstreamModel::Any,
    setup_script: true,
    negative_max_tokens: NegativeMaxTokens::Unknown,
    checks_context: false,
    unloads_on_unknown_model: false,
    probe_model: ProbeModel::Listed,
    prompt_cache_sequences: None,
    prompt_cache_flag: None,
};

impl Kind {
    /// Every kind, in the order they are listed to users.
    pub const ALL: [Kind; 10] = [
        Kind::MlxLm,
        Kind::MlxOpenaiServer,
        Kind::VllmMlx,
        Kind::RapidMlx,
        Kind::MlxVlm,
        Kind::MlxOmniServer,
        Kind::Omlx,
        Kind::Higgs,
        Kind::MlxServe,
        Kind::Custom,
    ];

    /// The catalogue's row for this kind: the one place that matches on a kind.
    pub const fn facts(self) -> &'static Facts {
        match self {
            Kind::MlxLm => &Facts {
                name: "mlx-lm",
                launch: Some(&["mlx_lm.server", "--model", "{model}", "--host", "{host}", "--port", "{port}"]),
                content_joiner: "",
                upstream_model: UpstreamModel::AsLoaded { how: " (its --model, or default_model)" },
                negative_max_tokens: NegativeMaxTokens::Refused,
                unloads_on_unknown_model: true,
                probe_model: ProbeModel::Launch,
                // Its `--prompt-cache-size` default (mlx_lm/server.py, LRUPromptCache).
                prompt_cache_sequences: Some(10),
                prompt_cache_flag: Some("--prompt-cache-size"),
                ..DEFAULT
            },
            Kind::MlxOpenaiServer => &Facts {
                name: "mlx-openai-server",
                launch: Some(&[
                    "mlx-openai-server",
                    "launch",
                    "--model-path",
                    "{model}",
                    "--model-type",
                    "lm",
                    "--host",
                    "{host}",
                    "--port",
                    "{port}",
                    // mlxgate keeps its console output; no logs/app.log in the working directory.
                    "--no-log-file",
                ]),
                hold_abandoned: true,
                finish_length: true,
                max_tokens_field: MaxTokensField::MaxTokensFirst,
                negative_max_tokens: NegativeMaxTokens::Unlimited,
                ..DEFAULT
            },
            Kind::VllmMlx => &Facts {
                name: "vllm-mlx",
                launch: Some(&["vllm-mlx", "serve", "{model}", "--host", "{host}", "--port", "{port}"]),
                serialize_unless: Some("--continuous-batching"),
                serialize_reason: Some(
                    "vllm-mlx without --continuous-batching serves one request at a time (a second concurrent \
                     stream gets an error event): leave max_concurrency at 1, or set normalise.serialize: false \
                     for a server run with --continuous-batching",
                ),
                negative_max_tokens: NegativeMaxTokens::Refused,
                ..DEFAULT
            },
            Kind::RapidMlx => &Facts {
                name: "rapid-mlx",
                launch: Some(&["rapid-mlx", "serve", "{model}", "--host", "{host}", "--port", "{port}"]),
                ready_path: "/health/ready",
                pool_idle_timeout: RAPID_MLX_POOL_IDLE_TIMEOUT,
                loopback_host: true,
                negative_max_tokens: NegativeMaxTokens::Refused,
                checks_context: true,
                ..DEFAULT
            },
            Kind::MlxVlm => &Facts {
                name: "mlx-vlm",
                // Its host defaults to 0.0.0.0, so --host is needed (measured, mlx-vlm 0.7.10).
                launch: Some(&["mlx_vlm.server", "--model", "{model}", "--host", "{host}", "--port", "{port}"]),
                upstream_model: UpstreamModel::AsLoaded { how: "" },
                negative_max_tokens: NegativeMaxTokens::Refused,
                checks_context: true,
                unloads_on_unknown_model: true,
                probe_model: ProbeModel::Loaded,
                ..DEFAULT
            },
            Kind::MlxOmniServer => &Facts {
                name: "mlx-omni-server",
                // No --model: the warm-up completion names {model}, which loads it (mlx-omni-server 0.5.3).
                launch: Some(&["mlx-omni-server", "--host", "{host}", "--port", "{port}"]),
                model_from_request: true,
                // It has no /health (404); /v1/models answers 200 (an empty list) once it listens.
                ready_path: "/v1/models",
                // It answers 500 "No tokens generated" to any completion with `max_tokens: 1` (it
                // withholds the last token; measured).
                warmup_max_tokens: 2,
                finish_length: true,
                single_finish: true,
                max_tokens_field: MaxTokensField::CompletionFirst,
                counts_cut_one_short: true,
                upstream_model: UpstreamModel::AsLoaded { how: "" },
                negative_max_tokens: NegativeMaxTokens::Unlimited,
                ..DEFAULT
            },
            // Not run here (macOS only). From jundot/omlx's README and omlx/cli.py: `omlx serve
            // --model-dir DIR` with --host/--port; DIR holds one directory per model, and a
            // model is requested by its directory's name, so `model` is the parent directory and
            // the model's `upstream_model` must be set to the subdirectory's name. It writes the
            // flags to ~/.omlx/settings.json.
            Kind::Omlx => &Facts {
                name: "omlx",
                launch: Some(&["omlx", "serve", "--model-dir", "{model}", "--host", "{host}", "--port", "{port}"]),
                // Its default `max_context_window`.
                context_cap: Some(32768),
                upstream_model: UpstreamModel::DirectoryName,
                ..DEFAULT
            },
            // Not run here (macOS only). From panbanda/higgs's README and CLI source: `higgs serve
            // --model M` (a Hugging Face id or a local path) with --host/--port; /health.
            Kind::Higgs => &Facts {
                name: "higgs",
                launch: Some(&["higgs", "serve", "--model", "{model}", "--host", "{host}", "--port", "{port}"]),
                ..DEFAULT
            },
            // Not run here (macOS only). From ddalcu/mlx-serve's docs/cli.md: `mlx-serve --model
            // PATH --serve --host ADDR --port N` (host defaults to 0.0.0.0); docs/api.md: /health.
            Kind::MlxServe => &Facts {
                name: "mlx-serve",
                launch: Some(&["mlx-serve", "--model", "{model}", "--serve", "--host", "{host}", "--port", "{port}"]),
                ..DEFAULT
            },
            Kind::Custom => &Facts { name: "custom", warmup: false, setup_script: false, ..DEFAULT },
        }
    }

    /// The name used in `kind:`, logs and `/admin/backends`.
    pub fn name(self) -> &'static str {
        self.facts().name
    }

    /// The launch command with `{model}`, `{host}` and `{port}` placeholders; `None` for custom.
    pub fn launch_template(self) -> Option<&'static [&'static str]> {
        self.facts().launch
    }

    /// Whether the server learns its model only from each request's `model` field, so the
    /// backend needs `model` even though its command does not use it (mlx-omni-server).
    pub fn model_from_request(self) -> bool {
        self.facts().model_from_request
    }

    /// The context cap the server enforces by itself, when it has one of its own: oMLX's
    /// default `max_context_window` is 32768. The others take what the model takes, so the
    /// gateway falls back to the model's `max_position_embeddings`.
    pub fn context_cap(self) -> Option<usize> {
        self.facts().context_cap
    }

    /// The path that answers 2xx once the server is up.
    pub fn ready_path(self) -> &'static str {
        self.facts().ready_path
    }

    /// Whether a warm-up completion must succeed before the server counts as ready.
    pub fn needs_warmup(self) -> bool {
        self.facts().warmup
    }

    /// `max_tokens` of the warm-up completion.
    pub fn warmup_max_tokens(self) -> u32 {
        self.facts().warmup_max_tokens
    }

    /// What joins a message's text parts when the server renders it for its chat template.
    pub fn content_joiner(self) -> &'static str {
        self.facts().content_joiner
    }

    /// How the server takes a model name it does not serve.
    pub fn upstream_model(self) -> UpstreamModel {
        self.facts().upstream_model
    }

    /// Why a serialized backend of this kind must keep `max_concurrency` at 1, when the kind
    /// says more than the switch does.
    pub fn serialize_reason(self) -> Option<&'static str> {
        self.facts().serialize_reason
    }

    /// The `scripts/setup-backends` argument that builds this kind's venv (`None`: custom).
    pub fn setup_name(self) -> Option<&'static str> {
        self.facts().setup_script.then_some(self.name())
    }

    /// What the server does with `max_tokens: -1`.
    pub fn negative_max_tokens(self) -> NegativeMaxTokens {
        self.facts().negative_max_tokens
    }

    /// Whether the server checks the prompt's length before generating.
    pub fn checks_context(self) -> bool {
        self.facts().checks_context
    }

    /// Whether the server unloads its model when asked for an unknown one.
    pub fn unloads_on_unknown_model(self) -> bool {
        self.facts().unloads_on_unknown_model
    }

    /// Which `model` the probe sends the server.
    pub fn probe_model(self) -> ProbeModel {
        self.facts().probe_model
    }

    /// How many whole prompts the server keeps in its prompt cache, when known: the number
    /// after the kind's flag in a managed server's launch command (`--prompt-cache-size 4`,
    /// or `--prompt-cache-size=4`), else the kind's default.
    pub fn prompt_cache_sequences(self, command: Option<&[String]>) -> Option<usize> {
        let facts = self.facts();
        let written = facts.prompt_cache_flag.zip(command).and_then(|(flag, command)| {
            let inline = format!("{flag}=");
            command.iter().enumerate().find_map(|(i, arg)| match arg.strip_prefix(&inline) {
                Some(n) => n.parse().ok(),
                None if arg == flag => command.get(i + 1)?.parse().ok(),
                None => None,
            })
        });
        written.or(facts.prompt_cache_sequences)
    }

    /// The token limit the server applies to a request, read from the body as it goes to the
    /// backend (the gateway always sends one to a generation endpoint): see [`MaxTokensField`].
    pub fn max_tokens_of(self, body: &[u8]) -> Option<u64> {
        #[derive(Deserialize)]
        struct Limits {
            max_tokens: Option<u64>,
            max_completion_tokens: Option<u64>,
        }
        let Limits { max_tokens, max_completion_tokens } = serde_json::from_slice(body).ok()?;
        match self.facts().max_tokens_field {
            MaxTokensField::MaxTokensFirst => max_tokens.or(max_completion_tokens),
            MaxTokensField::CompletionFirst => max_completion_tokens.filter(|&n| n > 0).or(max_tokens),
            MaxTokensField::Larger => max_tokens.max(max_completion_tokens),
        }
    }

    /// The completion tokens the server reports for an answer cut at `max_tokens`.
    pub fn length_at(self, max_tokens: u64) -> u64 {
        if self.facts().counts_cut_one_short { max_tokens.saturating_sub(1).max(1) } else { max_tokens }
    }

    /// The names of the kinds `pick` selects, in catalogue order, joined with `, `.
    pub fn names_where(pick: impl Fn(Kind) -> bool) -> String {
        Kind::ALL.into_iter().filter(|k| pick(*k)).map(Kind::name).collect::<Vec<_>>().join(", ")
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests;
