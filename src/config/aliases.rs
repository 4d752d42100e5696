//! `aliases:` in gateway.yaml: other names for configured models, checked into plain data, and
//! the pure lookup of the model a requested name means.
//!
//! A key is a name (`claude-haiku-4-5`) or a pattern with `*` standing for any run of
//! characters, none included (`claude-haiku-*`, `claude-*`, `*`); its value is a configured
//! model's public name. A requested name resolves to:
//! 1. itself, when it is a configured model's name (a model's own name is never an alias);
//! 2. else the model of the alias of exactly that name;
//! 3. else the model of the longest matching pattern (the most specific: `claude-haiku-*` before
//!    `claude-*`); patterns of the same length are tried in byte order of the pattern, so the
//!    choice never depends on the file's order. A pattern matches names of 1 to
//!    [`MAX_PATTERN_MATCHED`] bytes: the answer repeats the name sent (in every chunk of a
//!    stream), and `*` would otherwise let a client make each chunk as large as its body, or,
//!    for `""`, leave the backend's own model name (a path on disk) in the answer;
//! 4. else nothing (the request's 404 names what it asked for).
//!
//! Start-up refuses an alias whose target is not a configured model (aliases do not chain), a
//! key that is a configured model's own name (it would never apply), and an empty key.

use std::collections::BTreeMap;

use serde_yaml::Value;

use super::{ModelConfig, Problem, typed};

/// The longest name a pattern matches (model names are short: Claude's are under 40 bytes).
pub const MAX_PATTERN_MATCHED: usize = 256;

/// The aliases, ready for [`Aliases::resolve`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Aliases {
    /// Names without `*`, to their model.
    exact: BTreeMap<String, String>,
    /// Patterns with at least one `*` and their model, longest pattern first, then in byte order.
    patterns: Vec<(String, String)>,
}

impl Aliases {
    /// The configured model `requested` means through an alias (see the module header): `None`
    /// when no alias names or matches it. A configured model's own name is the caller's to try
    /// first (this looks at aliases only).
    pub fn resolve(&self, requested: &str) -> Option<&str> {
        if let Some(model) = self.exact.get(requested) {
            return Some(model);
        }
        if requested.is_empty() || requested.len() > MAX_PATTERN_MATCHED {
            return None;
        }
        self.patterns.iter().find(|(pattern, _)| matches(pattern, requested)).map(|(_, model)| model.as_str())
    }

    /// Whether no alias is configured.
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.patterns.is_empty()
    }

    /// From `aliases:`'s raw value, each problem at its path (`aliases."claude-*"`).
    pub(super) fn validate(
        raw: Option<Value>,
        models: &BTreeMap<String, ModelConfig>,
        problems: &mut Vec<Problem>,
    ) -> Aliases {
        let Some(raw) = raw else { return Aliases::default() };
        let Some(raw) = typed::<BTreeMap<String, String>>(raw, "aliases", problems) else {
            return Aliases::default();
        };
        let mut aliases = Aliases::default();
        for (name, model) in raw {
            let path = format!("aliases.{name:?}");
            if name.is_empty() {
                problems.push(Problem { path, reason: "an alias needs a name or a pattern".into() });
                continue;
            }
            if models.contains_key(&name) {
                problems.push(Problem {
                    path,
                    reason: format!("{name:?} is a configured model's own name, which always means that model"),
                });
                continue;
            }
            if !models.contains_key(&model) {
                let known: Vec<&str> = models.keys().map(String::as_str).collect();
                problems.push(Problem {
                    path,
                    reason: format!(
                        "no model named {model:?} (models: {}; an alias names a model, not another alias)",
                        if known.is_empty() { "none".to_string() } else { known.join(", ") }
                    ),
                });
                continue;
            }
            if name.contains('*') {
                aliases.patterns.push((name, model));
            } else {
                aliases.exact.insert(name, model);
            }
        }
        aliases.patterns.sort_by(|(a, _), (b, _)| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        aliases
    }
}

/// Whether `name` matches `pattern`, where `*` stands for any run of characters (none
/// included) and every other character for itself.
fn matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    // split always yields a first part: the literal prefix.
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else { return false };
    let middle: Vec<&str> = parts.collect();
    let Some((last, middle)) = middle.split_last() else {
        // No `*`: the whole name must be the pattern.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests;
