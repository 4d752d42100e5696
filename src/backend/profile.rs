//! What mlxgate knows about each kind of server (docs/servers.md, "What each server does on the
//! wire"): how to launch it, which path says it is up, and whether `/health` can be trusted
//! before the model is loaded.

use std::time::Duration;

use serde::Deserialize;

/// A kind of OpenAI-compatible server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
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

impl Kind {
    /// The launch command with `{model}`, `{host}` and `{port}` placeholders; `None` for custom.
    pub fn launch_template(self) -> Option<&'static [&'static str]> {
        match self {
            Kind::MlxLm => Some(&["mlx_lm.server", "--model", "{model}", "--host", "{host}", "--port", "{port}"]),
            Kind::MlxOpenaiServer => Some(&[
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
            Kind::VllmMlx => Some(&["vllm-mlx", "serve", "{model}", "--host", "{host}", "--port", "{port}"]),
            Kind::RapidMlx => Some(&["rapid-mlx", "serve", "{model}", "--host", "{host}", "--port", "{port}"]),
            // Its host defaults to 0.0.0.0, so --host is needed (measured, mlx-vlm 0.7.10).
            Kind::MlxVlm => Some(&["mlx_vlm.server", "--model", "{model}", "--host", "{host}", "--port", "{port}"]),
            // No --model: the warm-up completion names {model}, which loads it (mlx-omni-server 0.5.3).
            Kind::MlxOmniServer => Some(&["mlx-omni-server", "--host", "{host}", "--port", "{port}"]),
            // Not run here (macOS only). From jundot/omlx's README and omlx/cli.py: `omlx serve
            // --model-dir DIR` with --host/--port; DIR holds one directory per model, and a
            // model is requested by its directory's name, so `model` is the parent directory and
            // the model's `upstream_model` must be set to the subdirectory's name. It writes the
            // flags to ~/.omlx/settings.json.
            Kind::Omlx => Some(&["omlx", "serve", "--model-dir", "{model}", "--host", "{host}", "--port", "{port}"]),
            // Not run here (macOS only). From panbanda/higgs's README and CLI source: `higgs serve
            // --model M` (a Hugging Face id or a local path) with --host/--port; /health.
            Kind::Higgs => Some(&["higgs", "serve", "--model", "{model}", "--host", "{host}", "--port", "{port}"]),
            // Not run here (macOS only). From ddalcu/mlx-serve's docs/cli.md: `mlx-serve --model
            // PATH --serve --host ADDR --port N` (host defaults to 0.0.0.0); docs/api.md: /health.
            Kind::MlxServe => {
                Some(&["mlx-serve", "--model", "{model}", "--serve", "--host", "{host}", "--port", "{port}"])
            }
            Kind::Custom => None,
        }
    }

    /// Whether the server learns its model only from each request's `model` field, so the
    /// backend needs `model` even though its command does not use it (mlx-omni-server).
    pub fn model_from_request(self) -> bool {
        matches!(self, Kind::MlxOmniServer)
    }

    /// The context cap the server enforces by itself, when it has one of its own: oMLX's
    /// default `max_context_window` is 32768. The others take what the model takes (Rapid-MLX
    /// and mlx-vlm check against the model's own length, measured), so the gateway falls back to
    /// the model's `max_position_embeddings`.
    pub fn context_cap(self) -> Option<usize> {
        match self {
            Kind::Omlx => Some(32768),
            Kind::MlxLm
            | Kind::MlxOpenaiServer
            | Kind::VllmMlx
            | Kind::RapidMlx
            | Kind::MlxVlm
            | Kind::MlxOmniServer
            | Kind::Higgs
            | Kind::MlxServe
            | Kind::Custom => None,
        }
    }

    /// The path that answers 2xx once the server is up.
    pub fn ready_path(self) -> &'static str {
        match self {
            Kind::RapidMlx => "/health/ready",
            // It has no /health (404); /v1/models answers 200 (an empty list) once it listens.
            Kind::MlxOmniServer => "/v1/models",
            _ => "/health",
        }
    }

    /// Whether a warm-up completion must succeed before the server counts as ready.
    /// mlx_lm.server's `/health` says ok before the model is loaded; the others answer 503 while
    /// loading, but a first completion also compiles kernels (vllm-mlx's first one takes seconds
    /// before any token), so every known server is warmed.
    pub fn needs_warmup(self) -> bool {
        !matches!(self, Kind::Custom)
    }

    /// `max_tokens` of the warm-up completion. mlx-omni-server 0.5.3 answers 500 "No tokens
    /// generated" to any completion with `max_tokens: 1` (it withholds the last token; measured).
    pub fn warmup_max_tokens(self) -> u32 {
        match self {
            Kind::MlxOmniServer => 2,
            _ => 1,
        }
    }

    /// The name used in logs and `/admin/backends`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::MlxLm => "mlx-lm",
            Kind::MlxOpenaiServer => "mlx-openai-server",
            Kind::VllmMlx => "vllm-mlx",
            Kind::RapidMlx => "rapid-mlx",
            Kind::MlxVlm => "mlx-vlm",
            Kind::MlxOmniServer => "mlx-omni-server",
            Kind::Omlx => "omlx",
            Kind::Higgs => "higgs",
            Kind::MlxServe => "mlx-serve",
            Kind::Custom => "custom",
        }
    }
}

/// What the gateway does about one backend's measured quirks (docs/wire-facts.md). Each
/// field defaults from the backend's kind ([`Kind::normalise`]) and can be switched under the
/// backend's `normalise:` key; `/admin/backends` lists the ones in force ([`Normalise::active`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Normalise {
    /// Pooled connections to the backend idle longer than this are not reused. uvicorn closes an
    /// idle keep-alive connection after 5 s (Rapid-MLX after 30 s): a request sent on one the
    /// server is closing fails before any answer.
    pub pool_idle_timeout: Duration,
    /// `Host: 127.0.0.1:<port>` and no `Origin` towards the backend: Rapid-MLX answers 400 to
    /// any other Host and 403 to any Origin, so a browser UI in front of the gateway breaks.
    pub loopback_host: bool,
    /// At most one request in flight, whatever `max_concurrency` says: vllm-mlx without
    /// `--continuous-batching` answers a second concurrent stream 200 and then an error event.
    pub serialize: bool,
    /// A stream the client abandons is read to its end (bounded) before its slot is freed:
    /// mlx-openai-server keeps generating after the client leaves, and the next request would
    /// wait behind it with the wait hidden in its time to first token.
    pub hold_abandoned: bool,
    /// `finish_reason: "stop"` on an answer cut at `max_tokens` becomes `"length"`
    /// (mlx-openai-server, mlx-omni-server say `stop`; agents continue only on `length`).
    pub finish_length: bool,
    /// A repeated finish chunk for the same choice is not forwarded (mlx-omni-server sends the
    /// finish chunk twice, the second with usage).
    pub single_finish: bool,
    /// The backend is asked for usage with `stream_options.include_usage` (a server that
    /// refuses unknown fields gets neither, and its streams are metered without usage).
    pub stream_options: bool,
}

/// The idle timeout of pooled connections, below uvicorn's 5 s keep-alive.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);
/// Rapid-MLX keeps idle connections for 30 s (measured).
const RAPID_MLX_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(25);

impl Kind {
    /// The kind's normalisations. `command` is a managed backend's command line (vllm-mlx with
    /// `--continuous-batching` batches and is not serialized); `None` for a `url:` backend.
    pub fn normalise(self, command: Option<&[String]>) -> Normalise {
        let batching_flag = command.is_some_and(|c| c.iter().any(|a| a == "--continuous-batching"));
        Normalise {
            pool_idle_timeout: match self {
                Kind::RapidMlx => RAPID_MLX_POOL_IDLE_TIMEOUT,
                _ => POOL_IDLE_TIMEOUT,
            },
            loopback_host: self == Kind::RapidMlx,
            serialize: self == Kind::VllmMlx && !batching_flag,
            hold_abandoned: self == Kind::MlxOpenaiServer,
            finish_length: matches!(self, Kind::MlxOpenaiServer | Kind::MlxOmniServer),
            single_finish: self == Kind::MlxOmniServer,
            stream_options: true,
        }
    }
}

impl Normalise {
    /// The normalisations in force, one line each, as `/admin/backends` and the start-up log
    /// show them: `key: what it does`.
    pub fn active(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "pool_idle_timeout: pooled connections idle over {} are not reused",
            humantime::format_duration(self.pool_idle_timeout)
        )];
        let switches = [
            (self.loopback_host, "loopback_host: Host is 127.0.0.1:<port> and Origin is removed"),
            (self.serialize, "serialize: one request at a time (max_concurrency 1)"),
            (self.hold_abandoned, "hold_abandoned: an abandoned stream holds its slot until the backend ends it"),
            (self.finish_length, "finish_length: finish_reason stop at max_tokens becomes length"),
            (
                self.single_finish,
                "single_finish: a repeated finish chunk reaches the client once (its usage as a usage chunk)",
            ),
            (!self.stream_options, "stream_options: not sent (the backend refuses it)"),
        ];
        lines.extend(switches.iter().filter(|(on, _)| *on).map(|(_, line)| line.to_string()));
        lines
    }
}

/// Replaces `{model}`, `{host}` and `{port}` in each argument.
pub fn fill_template(template: &[String], model: &str, host: &str, port: u16) -> Vec<String> {
    template
        .iter()
        .map(|arg| arg.replace("{model}", model).replace("{host}", host).replace("{port}", &port.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_fill_every_placeholder() {
        let t: Vec<String> = Kind::MlxLm.launch_template().expect("template").iter().map(|s| s.to_string()).collect();
        assert_eq!(
            fill_template(&t, "/m", "127.0.0.1", 8101),
            ["mlx_lm.server", "--model", "/m", "--host", "127.0.0.1", "--port", "8101"]
        );
    }

    #[test]
    fn every_managed_kind_has_a_template_with_host_and_port() {
        for kind in [
            Kind::MlxLm,
            Kind::MlxOpenaiServer,
            Kind::VllmMlx,
            Kind::RapidMlx,
            Kind::MlxVlm,
            Kind::MlxOmniServer,
            Kind::Omlx,
            Kind::Higgs,
            Kind::MlxServe,
        ] {
            let t = kind.launch_template().expect("template");
            assert!(t.contains(&"{host}") && t.contains(&"{port}"), "{}: {t:?}", kind.name());
            assert!(
                t.contains(&"{model}") != kind.model_from_request(),
                "{}: the model comes from the command or from each request",
                kind.name()
            );
        }
        assert_eq!(Kind::Omlx.context_cap(), Some(32768));
    }

    #[test]
    fn each_kind_gets_the_normalisations_its_wire_facts_call_for() {
        let cb: Vec<String> = ["vllm-mlx", "serve", "m", "--continuous-batching"].map(String::from).to_vec();
        assert!(Kind::VllmMlx.normalise(None).serialize);
        assert!(!Kind::VllmMlx.normalise(Some(&cb)).serialize, "--continuous-batching batches");
        assert!(Kind::RapidMlx.normalise(None).loopback_host);
        assert_eq!(Kind::RapidMlx.normalise(None).pool_idle_timeout, Duration::from_secs(25));
        assert!(Kind::MlxOpenaiServer.normalise(None).hold_abandoned);
        assert!(Kind::MlxOpenaiServer.normalise(None).finish_length);
        let omni = Kind::MlxOmniServer.normalise(None);
        assert!(omni.finish_length && omni.single_finish);
        let lm = Kind::MlxLm.normalise(None);
        assert!(!lm.loopback_host && !lm.serialize && !lm.hold_abandoned && !lm.finish_length && lm.stream_options);
        assert_eq!(lm.active().len(), 1, "{:?}", lm.active());
        assert!(omni.active().iter().any(|l| l.starts_with("single_finish:")));
    }
}
