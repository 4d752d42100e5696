//! What is wrong with a file: [`ConfigError`], the [`Problem`]s it lists (each at its dotted
//! YAML path), and the two ways validation records one: [`typed`] for a value serde refuses and
//! [`push_at`] for a rule a value breaks.

use std::fmt;

use serde::de::DeserializeOwned;
use serde_yaml::Value;

/// Why a configuration could not be loaded: every problem found, each at its YAML path.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{}", format_problems(.0))]
    Invalid(Vec<Problem>),
}

/// One thing wrong with the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted YAML path (`models.qwen.max_wait`), or `(file)` for syntax errors.
    pub path: String,
    pub reason: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.reason)
    }
}

fn format_problems(problems: &[Problem]) -> String {
    let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
    lines.join("\n")
}

/// Records `reason` at `field` under `path` (`backends.local` + `port`), or at `path` itself
/// when `field` is empty.
pub(super) fn push_at(problems: &mut Vec<Problem>, path: &str, field: &str, reason: impl Into<String>) {
    let at = if field.is_empty() { path.to_string() } else { format!("{path}.{field}") };
    problems.push(Problem { path: at, reason: reason.into() });
}

/// Deserializes `value` into `T`, recording the first problem with its full path.
pub(super) fn typed<T: DeserializeOwned>(value: Value, prefix: &str, problems: &mut Vec<Problem>) -> Option<T> {
    match serde_path_to_error::deserialize::<_, T>(value) {
        Ok(v) => Some(v),
        Err(err) => {
            let inner = err.path().to_string();
            let path = match (prefix.is_empty(), inner.as_str()) {
                (true, ".") => "(root)".to_string(),
                (true, _) => inner,
                (false, ".") => prefix.to_string(),
                (false, _) => format!("{prefix}.{inner}"),
            };
            let reason = err.into_inner().to_string();
            // serde_yaml appends " at line N column M" for positions inside the source text;
            // the path already says where.
            problems.push(Problem { path, reason });
            None
        }
    }
}
