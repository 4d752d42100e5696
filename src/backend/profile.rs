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
            Kind::Custom => None,
        }
    }

    /// The context cap the server enforces by itself, when it has one of its own (omlx's 32768
    /// arrives with its kind). None of the kinds known today caps prompts: mlx_lm.server,
    /// mlx-openai-server, vllm-mlx and Rapid-MLX take what the model takes, so the gateway
    /// falls back to the model's `max_position_embeddings`.
    pub fn context_cap(self) -> Option<usize> {
        match self {
            Kind::MlxLm | Kind::MlxOpenaiServer | Kind::VllmMlx | Kind::RapidMlx | Kind::Custom => None,
        }
    }

    /// The path that answers 2xx once the server is up.
    pub fn ready_path(self) -> &'static str {
        match self {
            Kind::RapidMlx => "/health/ready",
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

    /// The name used in logs and `/admin/backends`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::MlxLm => "mlx-lm",
            Kind::MlxOpenaiServer => "mlx-openai-server",
            Kind::VllmMlx => "vllm-mlx",
            Kind::RapidMlx => "rapid-mlx",
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
}
