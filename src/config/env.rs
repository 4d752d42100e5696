//! `${VAR}` in gateway.yaml: `${VAR}` and `${VAR:-default}` replaced in every string value from
//! the environment (or a test's look-up), `$${` a literal `${`; a scalar that was only a
//! placeholder is re-read as YAML, so `port: ${PORT}` gives a number.

use std::cell::RefCell;
use std::collections::BTreeSet;

use serde_yaml::Value;

use super::clients;
use super::problem::Problem;

/// Where `${VAR}` values come from.
pub(super) struct Env<'a> {
    pub(super) lookup: &'a dyn Fn(&str) -> Option<String>,
    /// `Some`: an unset variable without a default is noted here and replaced by a placeholder
    /// (the file is for another process's environment); `None`: it is a problem.
    pub(super) unset: Option<&'a RefCell<BTreeSet<String>>>,
}

/// Replaces `${VAR}` and `${VAR:-default}` in every string value; `$${` stays a literal `${`.
/// A scalar that was only a placeholder is re-read as YAML, so `port: ${PORT}` gives a number.
pub(super) fn substitute_env(value: &mut Value, path: &mut Vec<String>, env: &Env<'_>, problems: &mut Vec<Problem>) {
    match value {
        Value::String(s) if s.contains('$') => match expand(s, env) {
            Ok(expanded) => {
                let whole = s.starts_with("${")
                    && s.ends_with('}')
                    && s.matches("${").count() == 1
                    && !clients::is_clear_key(path);
                *value = if whole {
                    serde_yaml::from_str::<Value>(&expanded)
                        .ok()
                        .filter(|v| !matches!(v, Value::Mapping(_) | Value::Sequence(_) | Value::Null))
                        .unwrap_or(Value::String(expanded))
                } else {
                    Value::String(expanded)
                };
            }
            Err(reason) => problems.push(Problem { path: path.join("."), reason }),
        },
        Value::Mapping(map) => {
            for (k, v) in map.iter_mut() {
                path.push(k.as_str().map_or_else(|| format!("{k:?}"), str::to_string));
                substitute_env(v, path, env, problems);
                path.pop();
            }
        }
        Value::Sequence(items) => {
            for (i, v) in items.iter_mut().enumerate() {
                path.push(i.to_string());
                substitute_env(v, path, env, problems);
                path.pop();
            }
        }
        _ => {}
    }
}

fn expand(text: &str, env: &Env<'_>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        rest = &rest[pos..];
        if let Some(after) = rest.strip_prefix("$${") {
            out.push_str("${");
            rest = after;
        } else if let Some(after) = rest.strip_prefix("${") {
            let end = after.find('}').ok_or_else(|| format!("unclosed ${{ in {text:?}"))?;
            let inner = &after[..end];
            let (name, default) = match inner.split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (inner, None),
            };
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("${{{inner}}} is not a variable name"));
            }
            match ((env.lookup)(name).filter(|v| !v.is_empty() || default.is_none()), default) {
                (Some(v), _) => out.push_str(&v),
                (None, Some(d)) => out.push_str(d),
                (None, None) if env.unset.is_some() => {
                    if let Some(unset) = env.unset {
                        unset.borrow_mut().insert(name.to_owned());
                    }
                    out.push_str("unset-here-");
                    out.push_str(name);
                }
                (None, None) => {
                    return Err(format!(
                        "environment variable {name} is not set (write ${{{name}:-default}} for a default)"
                    ));
                }
            }
            rest = &after[end + 1..];
        } else {
            out.push('$');
            rest = &rest[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}
