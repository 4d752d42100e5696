//! What `mlxgate probe` found, as JSON (`--json`, the keys the issue names plus the Host and
//! Origin checks) or as text (with notes on what was seen and why a case was skipped), and the
//! gateway.yaml backend stanza those facts call for: `url`, `kind`, `max_concurrency`,
//! `context_cap` and a `normalise:` map with the field names of
//! [`crate::backend::profile::Normalise`].

use std::fmt::Write as _;

use indexmap::IndexMap;
use serde::Serialize;
use serde_json::Value;

use super::checks::{ErrorCase, HeaderCheck};

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
    /// The recognised kind (a `Kind` name).
    pub kind: Option<&'a str>,
    pub context: Option<u64>,
    pub finish_chunks: usize,
    /// `stream_options` was accepted.
    pub stream_options: bool,
}

/// A YAML scalar: a JSON string is a valid YAML double-quoted one.
fn quoted(s: &str) -> String {
    Value::from(s).to_string()
}

impl Report {
    /// The backend stanza for gateway.yaml, with the facts that decided each line as comments.
    pub fn stanza(&self, input: &StanzaInput<'_>) -> String {
        let mut out = String::from("backends:\n  probed:\n");
        let _ = writeln!(out, "    url: {}", quoted(&input.base_url));
        let _ = match input.kind {
            Some(kind) => writeln!(out, "    kind: {kind}   # recognised from its answers"),
            None => writeln!(out, "    kind: custom   # not recognised (mlxgate probe --kind names it)"),
        };
        let serialize = matches!(self.concurrent_streams.as_deref(), Some("error_event" | "busy_status"));
        let concurrency = if self.concurrent_streams.as_deref() == Some("batched") { 2 } else { 1 };
        let _ = writeln!(
            out,
            "    max_concurrency: {concurrency}   # two concurrent streams: {}{}",
            self.concurrent_streams.as_deref().unwrap_or("not measured"),
            self.speedup_2.map_or(String::new(), |s| format!(", speedup {s}x"))
        );
        if let Some(context) = input.context {
            let _ = writeln!(out, "    context_cap: {context}");
        }
        out.push_str("    normalise:\n");
        self.pool_idle_timeout(&mut out);
        let loopback = self.host_check.as_ref().is_some_and(|c| c.refused)
            || self.origin_check.as_ref().is_some_and(|c| c.refused);
        let switches = [
            ("loopback_host", loopback, "a foreign Host or an Origin was refused".to_string()),
            ("serialize", serialize, "a second concurrent stream got an error event or a busy status".into()),
            (
                "hold_abandoned",
                self.cancels_on_disconnect == Some(false),
                "it generates on after the client leaves".into(),
            ),
            (
                "finish_length",
                self.finish_reason_at_max_tokens.as_deref() == Some("stop"),
                "it says stop when cut by max_tokens".into(),
            ),
            ("single_finish", input.finish_chunks > 1, format!("finish chunk sent {} times", input.finish_chunks)),
        ];
        for (key, on, why) in switches {
            let because = if on { format!("   # {why}") } else { String::new() };
            let _ = writeln!(out, "      {key}: {on}{because}");
        }
        let _ = match input.stream_options {
            true => writeln!(out, "      stream_options: true"),
            false => writeln!(out, "      stream_options: false   # a request with stream_options was refused"),
        };
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
        out
    }

    /// `pool_idle_timeout` below the measured idle timeout (5/6 of it); left to the kind's
    /// default when none was measured.
    fn pool_idle_timeout(&self, out: &mut String) {
        match (self.keep_alive, self.idle_timeout_s) {
            (true, Some(idle)) => {
                let below = (idle * 1000.0 * 5.0 / 6.0).max(100.0) as u64;
                let value = if below >= 2000 { format!("{}s", below / 1000) } else { format!("{below}ms") };
                let _ =
                    writeln!(out, "      pool_idle_timeout: {value}   # it closed an idle connection after {idle} s");
            }
            (true, None) => {
                out.push_str("      # pool_idle_timeout: the kind's default (no idle close seen within the wait)\n");
            }
            (false, _) => out.push_str("      # pool_idle_timeout: the kind's default (no keep-alive)\n"),
        }
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
            kind: Some("vllm-mlx"),
            context: Some(2048),
            finish_chunks: 2,
            stream_options: false,
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
        assert_eq!(model.upstream_model, "/m/it's \"quoted\": tiny", "{stanza}");

        // Nothing to normalise, mlx_lm.server (no model sent): every switch off, default_model.
        let calm = Report {
            concurrent_streams: Some("batched".into()),
            cancels_on_disconnect: Some(true),
            finish_reason_at_max_tokens: Some("length".into()),
            ..Report::default()
        };
        let input = StanzaInput {
            base_url: "http://127.0.0.1:9".into(),
            model: None,
            kind: Some("mlx-lm"),
            context: None,
            finish_chunks: 1,
            stream_options: true,
        };
        let stanza = calm.stanza(&input);
        let config = Config::parse(&stanza, &|_| None).unwrap_or_else(|e| panic!("{e:?}\n{stanza}"));
        let backend = &config.backends["probed"];
        assert_eq!(backend.max_concurrency, 2, "{stanza}");
        let n = &backend.normalise;
        assert!(!n.loopback_host && !n.serialize && !n.hold_abandoned && !n.finish_length && !n.single_finish);
        assert_eq!(config.models.values().next().expect("model").upstream_model, "default_model");
    }
}
