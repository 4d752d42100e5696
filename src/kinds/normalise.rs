//! [`Normalise`]: what the gateway does about one backend's measured quirks, each a named
//! switch whose default comes from the backend's kind (its row in the catalogue) and which the
//! backend's `normalise:` key can switch. The code paths test a switch, never a kind.

use std::time::Duration;

use super::Kind;

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

impl Kind {
    /// The kind's normalisations. `command` is a managed backend's command line (vllm-mlx with
    /// `--continuous-batching` batches and is not serialized); `None` for a `url:` backend.
    pub fn normalise(self, command: Option<&[String]>) -> Normalise {
        let facts = self.facts();
        let batching_flag =
            facts.serialize_unless.is_some_and(|flag| command.is_some_and(|c| c.iter().any(|a| a == flag)));
        Normalise {
            pool_idle_timeout: facts.pool_idle_timeout,
            loopback_host: facts.loopback_host,
            serialize: facts.serialize_unless.is_some() && !batching_flag,
            hold_abandoned: facts.hold_abandoned,
            finish_length: facts.finish_length,
            single_finish: facts.single_finish,
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
