//! What `mlxgate probe` found, as JSON (`--json`, the keys the issue names plus the Host and
//! Origin checks) or as text (with notes on what was seen and why a case was skipped), and the
//! gateway.yaml backend stanza those facts call for: `url`, `kind`, `max_concurrency`,
//! `context_cap`, `tokenizer` and a `normalise:` map with the field names of
//! [`crate::kinds::Normalise`], in which only what a measurement shows the server needs
//! is written (always as `true`, or `stream_options: false`): the kind's defaults apply to the rest.

use std::fmt::Write as _;

use indexmap::IndexMap;
use serde::Serialize;
use serde_json::Value;

use super::checks::{ErrorCase, HeaderCheck};
use crate::kinds::{Kind, Normalise};

/// Every measured wire fact of one server.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// `HTTP/1.0` or `HTTP/1.1`, from a stream's status line.
    pub http_version: String,
    /// `chunked`, `close` or `content-length` (a stream's body).
    pub framing: String,
    /// A second request on the same connection was answered.
    pub keep_alive: bool,
    /// Seconds after which the server closed an idle keep-alive connection (null: it did not
    /// within the probe's idle wait — see the notes — or no keep-alive).
    pub idle_timeout_s: Option<f64>,
    /// `first`, `every` or `none`.
    pub role_chunk: String,
    /// `comment`, `data` or `none`.
    pub keepalive: String,
    /// `finish`, `separate`, `both` or `none` (with include_usage true).
    pub usage_placement: String,
    pub usage_without_include_usage: bool,
    pub done_marker: bool,
    /// `reasoning`, `reasoning_content`, `both`, or null when no delta had either.
    pub reasoning_field: Option<String>,
    pub finish_reason_at_max_tokens: Option<String>,
    /// `usage.prompt_tokens_details.cached_tokens` of a repeated prompt (null: not reported).
    pub cached_tokens: Option<u64>,
    /// Null when no request after the abandoned one produced output (see the notes).
    pub cancels_on_disconnect: Option<bool>,
    /// `batched`, `serialized`, `error_event` or `busy_status`.
    pub concurrent_streams: Option<String>,
    pub speedup_2: Option<f64>,
    /// Per case (`unknown_model`, `invalid_json`, `prompt_over_context`, `negative_max_tokens`).
    pub errors: IndexMap<String, ErrorCase>,
    /// `GET /v1/models` with a foreign `Host`.
    pub host_check: Option<HeaderCheck>,
    /// `GET /v1/models` with a browser's `Origin`.
    pub origin_check: Option<HeaderCheck>,
    /// The gateway.yaml backend stanza.
    pub profile: String,
    /// What else was seen, and why a case was skipped (text output only).
    #[serde(skip)]
    pub notes: Vec<String>,
}

/// What the stanza needs beyond the report.
pub struct StanzaInput<'a> {
    /// The URL without `/v1`.
    pub base_url: String,
    /// The `model` the probe sent (`None`: left out, mlx_lm.server's launch model).
    pub model: Option<&'a str>,
    /// The recognised kind, or the one `--kind` named.
    pub kind: Option<Kind>,
    /// `kind` was named with `--kind`, not recognised from the server's answers.
    pub kind_given: bool,
    pub context: Option<u64>,
    pub finish_chunks: usize,
    /// `stream_options` was accepted.
    pub stream_options: bool,
    /// The model's local directory, when it has a `tokenizer.json` (absolute path).
    pub tokenizer: Option<&'a str>,
}

/// A YAML scalar: a JSON string is a valid YAML double-quoted one.
fn quoted(s: &str) -> String {
    Value::from(s).to_string()
}

/// What the probe saw about one `normalise:` switch.
enum Measured {
    /// The server needs it on: why.
    Needed(String),
    /// The server was seen not to need it: what was seen.
    NotNeeded(String),
    /// Not measured: why.
    Unknown(String),
}

/// One `normalise:` switch, its measurement and the kind's default.
struct Switch {
    key: &'static str,
    measured: Measured,
    default: fn(&Normalise) -> bool,
}

impl Switch {
    /// Its stanza lines: `key: true` when needed, else at most a comment (the kind's default
    /// applies: a measurement that can be wrong never switches a default off).
    fn lines(&self, defaults: &Normalise) -> Option<String> {
        let on = (self.default)(defaults);
        let key = self.key;
        match &self.measured {
            Measured::Needed(why) => Some(format!("{key}: true   # {why}")),
            Measured::NotNeeded(seen) if on => Some(format!("# {key}: the kind's default (on) stays, although {seen}")),
            Measured::NotNeeded(_) => None,
            Measured::Unknown(why) => {
                Some(format!("# {key}: not measured ({why}): the kind's default ({})", if on { "on" } else { "off" }))
            }
        }
    }
}

/// The normalisations of `kind` (`custom`'s when none), for a `url:` backend.
fn kind_defaults(kind: Option<Kind>) -> Normalise {
    kind.unwrap_or(Kind::Custom).normalise(None)
}

impl Report {
    /// The backend stanza for gateway.yaml, with the facts that decided each line as comments.
    /// A `normalise:` switch is written only as `true`, when a measurement shows the server
    /// needs it; one not measured, or measured as not needed, is left out so that the kind's
    /// default applies (a comment says so where a measurement disagrees with the default).
    pub fn stanza(&self, input: &StanzaInput<'_>) -> String {
        let defaults = kind_defaults(input.kind);
        let mut out = String::from("backends:\n  probed:\n");
        let _ = writeln!(out, "    url: {}", quoted(&input.base_url));
        let _ = match input.kind {
            Some(kind) if input.kind_given => writeln!(out, "    kind: {kind}   # kind given with --kind"),
            Some(kind) => writeln!(out, "    kind: {kind}   # recognised from its answers"),
            None => writeln!(out, "    kind: custom   # not recognised (mlxgate probe --kind names it)"),
        };
        self.max_concurrency(&mut out, &defaults, input.kind);
        if let Some(context) = input.context {
            let _ = writeln!(out, "    context_cap: {context}");
        }
        let mut lines = self.pool_idle_timeout();
        for switch in self.switches(input) {
            lines.extend(switch.lines(&defaults));
        }
        if !input.stream_options {
            lines.push("stream_options: false   # a request with stream_options was refused".into());
        }
        if lines.iter().any(|l| !l.starts_with('#')) {
            out.push_str("    normalise:\n");
        } else {
            out.push_str("    # normalise: nothing measured calls for a switch: the kind's defaults\n");
        }
        for line in lines {
            let _ = writeln!(out, "      {line}");
        }
        for fact in self.facts() {
            let _ = writeln!(out, "    # {fact}");
        }
        let upstream = input.model.unwrap_or("default_model");
        let name = input
            .model
            .and_then(|m| m.trim_end_matches('/').rsplit('/').next())
            .filter(|n| !n.is_empty())
            .unwrap_or("model");
        let _ = writeln!(
            out,
            "models:\n  {}:\n    backend: probed\n    upstream_model: {}",
            quoted(name),
            quoted(upstream)
        );
        if input.model.is_none() {
            out.push_str("    # default_model: mlx_lm.server's launch --model (or write that exact string)\n");
        }
        if let Some(dir) = input.tokenizer {
            let _ = writeln!(out, "    tokenizer: {}   # the model's local directory", quoted(dir));
        }
        out
    }

    /// 2 for a batching server, else 1; also 1 when the kind serializes by default (vllm-mlx's
    /// simple mode), with a comment when the server was measured batching.
    fn max_concurrency(&self, out: &mut String, defaults: &Normalise, kind: Option<Kind>) {
        let measured = format!(
            "two concurrent streams: {}{}",
            self.concurrent_streams.as_deref().unwrap_or("not measured"),
            self.speedup_2.map_or(String::new(), |s| format!(", speedup {s}x"))
        );
        let batched = self.concurrent_streams.as_deref() == Some("batched");
        let _ = match (batched, defaults.serialize) {
            (true, false) => writeln!(out, "    max_concurrency: 2   # {measured}"),
            (true, true) => writeln!(
                out,
                "    max_concurrency: 1   # {measured}; but {} serializes by default (a server started with \
                 --continuous-batching batches: then write normalise.serialize: false and max_concurrency: 2)",
                kind.map_or("the kind", Kind::name)
            ),
            (false, _) => writeln!(out, "    max_concurrency: 1   # {measured}"),
        };
    }

    /// Each switch with what was measured about it.
    fn switches(&self, input: &StanzaInput<'_>) -> Vec<Switch> {
        let header = |check: &Option<HeaderCheck>| check.as_ref().map(|c| (c.status.is_some(), c.refused));
        let loopback = match (header(&self.host_check), header(&self.origin_check)) {
            (Some((_, true)), _) | (_, Some((_, true))) => {
                Measured::Needed("a foreign Host or an Origin was refused".into())
            }
            (Some((true, false)), Some((true, false))) => {
                Measured::NotNeeded("a foreign Host and an Origin were accepted".into())
            }
            _ => Measured::Unknown("the Host or Origin check had no answer".into()),
        };
        let serialize = match self.concurrent_streams.as_deref() {
            Some(v @ ("error_event" | "busy_status")) => {
                Measured::Needed(format!("a second concurrent stream got {}", v.replace('_', " ")))
            }
            Some(v) => Measured::NotNeeded(format!("two concurrent streams were {v}")),
            None => Measured::Unknown("two concurrent streams: see the notes".into()),
        };
        let hold = match self.cancels_on_disconnect {
            Some(false) => Measured::Needed("it generates on after the client leaves".into()),
            Some(true) => Measured::NotNeeded(
                "a request after a disconnect was served at once; a server that batches and generates on looks the same"
                    .into(),
            ),
            None => Measured::Unknown("disconnect: see the notes".into()),
        };
        let finish_length = match self.finish_reason_at_max_tokens.as_deref() {
            Some("stop") => Measured::Needed("it says stop when cut by max_tokens".into()),
            Some(other) => Measured::NotNeeded(format!("it said {other} when cut by max_tokens")),
            None => Measured::Unknown("no finish_reason".into()),
        };
        let single_finish = match input.finish_chunks {
            0 => Measured::Unknown("no finish chunk".into()),
            1 => Measured::NotNeeded("one finish chunk".into()),
            n => Measured::Needed(format!("finish chunk sent {n} times")),
        };
        vec![
            Switch { key: "loopback_host", measured: loopback, default: |d| d.loopback_host },
            Switch { key: "serialize", measured: serialize, default: |d| d.serialize },
            Switch { key: "hold_abandoned", measured: hold, default: |d| d.hold_abandoned },
            Switch { key: "finish_length", measured: finish_length, default: |d| d.finish_length },
            Switch { key: "single_finish", measured: single_finish, default: |d| d.single_finish },
        ]
    }

    /// `pool_idle_timeout` below the measured idle timeout (5/6 of it); left to the kind's
    /// default when none was measured.
    fn pool_idle_timeout(&self) -> Vec<String> {
        let line = match (self.keep_alive, self.idle_timeout_s) {
            (true, Some(idle)) => {
                let below = (idle * 1000.0 * 5.0 / 6.0).max(100.0) as u64;
                let value = if below >= 2000 { format!("{}s", below / 1000) } else { format!("{below}ms") };
                format!("pool_idle_timeout: {value}   # it closed an idle connection after {idle} s")
            }
            (true, None) => "# pool_idle_timeout: the kind's default (no idle close seen within the wait)".into(),
            (false, _) => "# pool_idle_timeout: the kind's default (no keep-alive)".into(),
        };
        vec![line]
    }

    /// The facts the gateway handles whatever the switches, as comments.
    fn facts(&self) -> Vec<String> {
        let mut facts = vec![format!("{} {}", self.http_version, self.framing)];
        if !self.done_marker {
            facts.push("no [DONE]: the end of a stream is its finish_reason".into());
        }
        match self.usage_placement.as_str() {
            "both" => facts.push("usage sent twice (finish chunk and a separate one): counted once".into()),
            "none" => facts.push("no usage in streams: tokens counted with the tokenizer".into()),
            _ => {}
        }
        if self.reasoning_field.as_deref() == Some("both") {
            facts.push("reasoning and reasoning_content both sent: counted once".into());
        }
        facts
    }

    /// The report for people: one fact a line, the checks, notes, then the stanza.
    pub fn text(&self) -> String {
        let value = serde_json::to_value(self).unwrap_or_default();
        let mut out = String::new();
        for (key, v) in value.as_object().into_iter().flatten() {
            match key.as_str() {
                "profile" => {}
                "errors" => {
                    for (case, answer) in v.as_object().into_iter().flatten() {
                        let _ = writeln!(out, "error {case:<22} {}", case_line(answer));
                    }
                }
                "host_check" | "origin_check" => {
                    let line = match (v["status"].as_u64(), v["refused"] == true) {
                        (Some(status), true) => format!("refused {status}: {}", plain(&v["body"])),
                        (Some(status), false) => format!("accepted ({status})"),
                        (None, _) => format!("no answer: {}", plain(&v["body"])),
                    };
                    let _ = writeln!(out, "{key:<28} {}  ->  {line}", plain(&v["sent"]));
                }
                _ => {
                    let _ = writeln!(out, "{key:<28} {}", plain(v));
                }
            }
        }
        for note in &self.notes {
            let _ = writeln!(out, "note: {note}");
        }
        out.push_str("\n# gateway.yaml\n");
        out.push_str(&self.profile);
        out
    }
}

/// A JSON value without quotes around a string.
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// One error case for people.
fn case_line(answer: &Value) -> String {
    if let Some(why) = answer.get("skipped").and_then(Value::as_str) {
        return match answer["status"].as_u64() {
            Some(status) => format!("{status}; {why}"),
            None => format!("skipped: {why}"),
        };
    }
    match answer["status"].as_u64() {
        Some(200) => "200 accepted".into(),
        Some(status) => format!(
            "{status} {}  {}",
            if answer["openai_shape"] == true { "openai-shaped" } else { "not openai-shaped" },
            plain(&answer["body"])
        ),
        None => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn refused() -> HeaderCheck {
        HeaderCheck { sent: "Host: x".into(), status: Some(400), refused: true, body: Some("Invalid host".into()) }
    }

    #[test]
    fn the_stanza_is_a_gateway_config_with_the_measured_normalisations() {
        let report = Report {
            http_version: "HTTP/1.1".into(),
            framing: "chunked".into(),
            keep_alive: true,
            idle_timeout_s: Some(5.0),
            concurrent_streams: Some("error_event".into()),
            cancels_on_disconnect: Some(false),
            finish_reason_at_max_tokens: Some("stop".into()),
            host_check: Some(refused()),
            done_marker: true,
            usage_placement: "both".into(),
            ..Report::default()
        };
        let input = StanzaInput {
            base_url: "http://127.0.0.1:9/pre".into(),
            model: Some("/m/it's \"quoted\": tiny"),
            kind: Some(Kind::VllmMlx),
            kind_given: false,
            context: Some(2048),
            finish_chunks: 2,
            stream_options: false,
            tokenizer: Some("/m/tiny"),
        };
        let stanza = report.stanza(&input);
        let config = Config::parse(&stanza, &|_| None).unwrap_or_else(|e| panic!("{e:?}\n{stanza}"));
        let backend = &config.backends["probed"];
        assert_eq!(backend.url, "http://127.0.0.1:9/pre", "{stanza}");
        assert_eq!(backend.kind.name(), "vllm-mlx");
        assert_eq!((backend.max_concurrency, backend.context_cap), (1, Some(2048)), "{stanza}");
        let n = &backend.normalise;
        assert_eq!(n.pool_idle_timeout, std::time::Duration::from_secs(4), "{stanza}");
        assert!(n.loopback_host && n.serialize && n.hold_abandoned && n.finish_length && n.single_finish, "{stanza}");
        assert!(!n.stream_options, "{stanza}");
        let model = config.models.values().next().expect("a model");
        assert_eq!(model.upstream_model.as_deref(), Some("/m/it's \"quoted\": tiny"), "{stanza}");
        assert_eq!(model.tokenizer.as_deref(), Some(std::path::Path::new("/m/tiny")), "{stanza}");

        // Nothing to normalise, mlx_lm.server (no model sent): no switch written, default_model.
        let calm = Report {
            concurrent_streams: Some("batched".into()),
            cancels_on_disconnect: Some(true),
            finish_reason_at_max_tokens: Some("length".into()),
            host_check: Some(accepted()),
            origin_check: Some(accepted()),
            ..Report::default()
        };
        let stanza = calm.stanza(&plain_input("mlx-lm"));
        let config = Config::parse(&stanza, &|_| None).unwrap_or_else(|e| panic!("{e:?}\n{stanza}"));
        let backend = &config.backends["probed"];
        assert_eq!(backend.max_concurrency, 2, "{stanza}");
        assert_eq!(backend.normalise, Kind::MlxLm.normalise(None), "{stanza}");
        assert!(!stanza.contains("normalise:\n") && !stanza.contains(": false"), "{stanza}");
        let model = config.models.values().next().expect("model");
        assert_eq!((model.upstream_model.as_deref(), model.tokenizer.as_ref()), (Some("default_model"), None));
    }

    fn accepted() -> HeaderCheck {
        HeaderCheck { sent: "Host: x".into(), status: Some(200), refused: false, body: None }
    }

    fn plain_input(kind: &str) -> StanzaInput<'_> {
        StanzaInput {
            base_url: "http://127.0.0.1:9".into(),
            model: None,
            kind: Some(<Kind as clap::ValueEnum>::from_str(kind, false).expect("a kind")),
            kind_given: false,
            context: None,
            finish_chunks: 1,
            stream_options: true,
            tokenizer: None,
        }
    }

    /// M3: a measurement that can be wrong never switches a kind's default off, and a fact not
    /// measured is never written as a value.
    #[test]
    fn the_stanza_never_switches_a_kinds_default_off() {
        // mlx-openai-server measured as cancelling (a batching server that generates on looks so).
        let cancelling = Report {
            cancels_on_disconnect: Some(true),
            finish_reason_at_max_tokens: Some("length".into()),
            ..Report::default()
        };
        let stanza = cancelling.stanza(&plain_input("mlx-openai-server"));
        let config = Config::parse(&stanza, &|_| None).unwrap_or_else(|e| panic!("{e:?}\n{stanza}"));
        assert_eq!(config.backends["probed"].normalise, Kind::MlxOpenaiServer.normalise(None), "{stanza}");
        assert!(!stanza.contains(": false"), "{stanza}");
        assert!(stanza.contains("# hold_abandoned: the kind's default (on) stays, although"), "{stanza}");
        assert!(stanza.contains("batches and generates on"), "{stanza}");
        assert!(stanza.contains("kind: mlx-openai-server   # recognised from its answers"), "{stanza}");
        // L4b: a kind named with --kind says so.
        let given = cancelling.stanza(&StanzaInput { kind_given: true, ..plain_input("custom") });
        assert!(given.contains("kind: custom   # kind given with --kind"), "{given}");
        assert!(!given.contains("recognised"), "{given}");

        // vllm-mlx: nothing measured (no concurrency, no disconnect, no header checks).
        let unmeasured = Report::default();
        let stanza = unmeasured.stanza(&plain_input("vllm-mlx"));
        let config = Config::parse(&stanza, &|_| None).unwrap_or_else(|e| panic!("{e:?}\n{stanza}"));
        let backend = &config.backends["probed"];
        assert_eq!((backend.max_concurrency, &backend.normalise), (1, &Kind::VllmMlx.normalise(None)), "{stanza}");
        assert!(stanza.contains("# serialize: not measured"), "{stanza}");
        assert!(stanza.contains("# hold_abandoned: not measured"), "{stanza}");
        assert!(!stanza.contains(": false") && !stanza.contains(": true"), "{stanza}");

        // vllm-mlx measured batching (--continuous-batching): the profile's serialize stays and
        // max_concurrency with it, the comment says what to write.
        let batching = Report { concurrent_streams: Some("batched".into()), speedup_2: Some(1.8), ..Report::default() };
        let stanza = batching.stanza(&plain_input("vllm-mlx"));
        let config = Config::parse(&stanza, &|_| None).unwrap_or_else(|e| panic!("{e:?}\n{stanza}"));
        let backend = &config.backends["probed"];
        assert!(backend.normalise.serialize && backend.max_concurrency == 1, "{stanza}");
        assert!(stanza.contains("write normalise.serialize: false and max_concurrency: 2"), "{stanza}");
    }
}
