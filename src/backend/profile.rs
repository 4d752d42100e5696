//! What mlxgate knows about each kind of server (DESIGN.md's backend table): how to launch it,
//! which path says it is up, and whether `/health` can be trusted before the model is loaded.

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
}
