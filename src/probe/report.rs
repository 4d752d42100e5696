//! What `mlxgate probe` found, as JSON (`--json`, the keys the issue names) or as text, and the
//! gateway.yaml backend stanza those facts call for.

use indexmap::IndexMap;
use serde::Serialize;

use super::checks::ErrorCase;

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
    /// within the probe's limit, or no keep-alive).
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
    pub cancels_on_disconnect: Option<bool>,
    /// `batched`, `serialized`, `error_event` or `busy_status`.
    pub concurrent_streams: Option<String>,
    pub speedup_2: Option<f64>,
    /// Per case (`unknown_model`, `invalid_json`, `negative_max_tokens`, `prompt_over_context`).
    pub errors: IndexMap<String, ErrorCase>,
    /// The gateway.yaml backend stanza.
    pub profile: String,
    /// What else was seen, and why a case was skipped.
    pub notes: Vec<String>,
}

/// What the stanza needs beyond the report.
pub struct StanzaInput<'a> {
    pub url: &'a str,
    pub model: &'a str,
    pub kind: Option<&'a str>,
    pub context: Option<u64>,
    pub finish_chunks: usize,
}

impl Report {
    /// The backend stanza for gateway.yaml, with the facts that decided each line as comments.
    pub fn stanza(&self, input: &StanzaInput<'_>) -> String {
        let mut out = String::from("backends:\n  probed:\n");
        out.push_str(&format!("    url: '{}'\n", input.url));
        match input.kind {
            Some(kind) => out.push_str(&format!("    # kind: {kind}   (recognised from its response headers)\n")),
            None => out.push_str("    # kind: custom   (not recognised from its headers)\n"),
        }
        let concurrency = match self.concurrent_streams.as_deref() {
            Some("batched") => 2,
            _ => 1,
        };
        out.push_str(&format!(
            "    max_concurrency: {concurrency}   # two concurrent streams: {}{}\n",
            self.concurrent_streams.as_deref().unwrap_or("not measured"),
            self.speedup_2.map_or(String::new(), |s| format!(", speedup {s}x"))
        ));
        if let Some(context) = input.context {
            out.push_str(&format!("    context_cap: {context}\n"));
        }
        let mut facts = vec![format!("{} {}", self.http_version, self.framing)];
        facts.push(match (self.keep_alive, self.idle_timeout_s) {
            (false, _) => "no keep-alive".into(),
            (true, Some(t)) => format!("keep-alive closed after {t} s idle: pool idle timeout below it"),
            (true, None) => "keep-alive".into(),
        });
        if !self.done_marker {
            facts.push("no [DONE]: the end of a stream is its finish_reason".into());
        }
        match self.usage_placement.as_str() {
            "both" => facts.push("usage sent twice: count it once".into()),
            "none" => facts.push("no usage in streams: tokens counted with the tokenizer".into()),
            _ => {}
        }
        if input.finish_chunks > 1 {
            facts.push(format!("finish chunk sent {} times: count it once", input.finish_chunks));
        }
        if self.finish_reason_at_max_tokens.as_deref() == Some("stop") {
            facts.push("says stop when cut by max_tokens: correct to length".into());
        }
        if self.reasoning_field.as_deref() == Some("both") {
            facts.push("reasoning and reasoning_content both sent: count once".into());
        }
        if self.cancels_on_disconnect == Some(false) {
            facts.push("generates on after the client leaves: hold the slot until it ends".into());
        }
        for fact in facts {
            out.push_str(&format!("    # {fact}\n"));
        }
        let name = input.model.rsplit('/').next().filter(|n| !n.is_empty()).unwrap_or("model");
        out.push_str(&format!("models:\n  {name}:\n    backend: probed\n    upstream_model: '{}'\n", input.model));
        out
    }

    /// The report for people: one fact a line, then the stanza.
    pub fn text(&self) -> String {
        let value = serde_json::to_value(self).unwrap_or_default();
        let mut out = String::new();
        if let Some(map) = value.as_object() {
            for (key, v) in map {
                match key.as_str() {
                    "profile" | "notes" => {}
                    "errors" => {
                        for (case, answer) in v.as_object().into_iter().flatten() {
                            let line = match (answer.get("skipped").and_then(|s| s.as_str()), answer.get("status")) {
                                (Some(why), _) => format!("skipped: {why}"),
                                (None, status) => format!(
                                    "{} {}{}",
                                    status.map_or("-".into(), ToString::to_string),
                                    if answer["openai_shape"] == true { "openai-shaped" } else { "not openai-shaped" },
                                    answer
                                        .get("body")
                                        .and_then(|b| b.as_str())
                                        .map_or(String::new(), |b| format!("  {b}"))
                                ),
                            };
                            out.push_str(&format!("error {case:<22} {line}\n"));
                        }
                    }
                    _ => out.push_str(&format!("{key:<28} {v}\n")),
                }
            }
        }
        for note in &self.notes {
            out.push_str(&format!("note: {note}\n"));
        }
        out.push_str("\n# gateway.yaml\n");
        out.push_str(&self.profile);
        out
    }
}
