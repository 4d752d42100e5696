//! The JSON Schema of gateway.yaml, generated from the raw serde types ([`super::raw`]) with
//! `schemars`, for editors (`# yaml-language-server: $schema=./gateway.schema.json`) to complete
//! and check keys as they do for docker-compose files. `mlxgate schema` prints it; the repository
//! ships it as `gateway.schema.json`, and a test keeps the two equal.
//!
//! What the schema adds to the derived one: a `${VAR}` may stand for any scalar (it is
//! substituted before the file is typed), so every scalar that is not free text — numbers,
//! booleans, durations, sizes, kinds and other enums — also accepts a string containing one.
//! Unknown keys are rejected where the parser rejects them (`deny_unknown_fields`). The parser
//! stays the judge: the schema checks shapes, `mlxgate check` every rule.

use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use super::raw::RawConfig;

/// The name of the definition a scalar's `${VAR}` alternative refers to.
const ENV_VAR: &str = "EnvVar";
/// A string containing a `${VAR}` or `${VAR:-default}`.
pub const ENV_VAR_PATTERN: &str = r"\$\{[A-Za-z_][A-Za-z0-9_]*(:-[^}]*)?\}";

/// `rate_limit_store`: `memory` or a Redis URL.
pub(super) struct StoreText;

impl schemars::JsonSchema for StoreText {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "RateLimitStore".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": r"^\s*(memory|redis://\S+)\s*$",
            "description": "memory, or redis://[:password@]host[:port][/db]",
        })
    }
}

/// The schema of gateway.yaml (JSON Schema draft-07, which editors' YAML and JSON language
/// servers support best).
pub fn json_schema() -> Value {
    let generator = SchemaSettings::draft07().into_generator();
    let mut schema = generator.into_root_schema_for::<RawConfig>().to_value();
    accept_env_vars(&mut schema);
    if let Some(definitions) = schema.get_mut("definitions").and_then(Value::as_object_mut) {
        definitions.insert(
            ENV_VAR.into(),
            json!({
                "type": "string",
                "pattern": ENV_VAR_PATTERN,
                "description": "${VAR} or ${VAR:-default}: substituted from the environment before the file is read",
            }),
        );
    }
    // `$schema`, title and description first, where a reader of the file looks.
    let Value::Object(mut rest) = schema else { return schema };
    let mut ordered = Map::new();
    for key in ["$schema", "title", "description"] {
        if let Some(v) = rest.remove(key) {
            ordered.insert(key.into(), v);
        }
    }
    ordered.append(&mut rest);
    Value::Object(ordered)
}

/// [`json_schema`] as the shipped file holds it: pretty-printed, with a final newline.
pub fn json_schema_text() -> String {
    let mut text = serde_json::to_string_pretty(&json_schema()).unwrap_or_default();
    text.push('\n');
    text
}

/// Walks a schema and makes every restricted scalar also accept a `${VAR}` string.
fn accept_env_vars(schema: &mut Value) {
    let Some(object) = schema.as_object_mut() else { return };
    if restricted_scalar(object) {
        let mut inner = std::mem::take(object);
        for key in ["title", "description", "default", "examples"] {
            if let Some(v) = inner.remove(key) {
                object.insert(key.into(), v);
            }
        }
        let env_var = json!({"$ref": format!("#/definitions/{ENV_VAR}")});
        object.insert("anyOf".into(), Value::Array(vec![Value::Object(inner), env_var]));
        return;
    }
    for key in ["definitions", "properties"] {
        if let Some(Value::Object(map)) = object.get_mut(key) {
            map.values_mut().for_each(accept_env_vars);
        }
    }
    for key in ["additionalProperties", "items"] {
        if let Some(sub) = object.get_mut(key) {
            accept_env_vars(sub);
        }
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(subs)) = object.get_mut(key) {
            subs.iter_mut().for_each(accept_env_vars);
        }
    }
}

/// A scalar a `${VAR}` string would not pass: a number, a boolean, a string with a pattern or
/// a set of values, or a choice among constants (an enum whose values have descriptions).
fn restricted_scalar(object: &Map<String, Value>) -> bool {
    let types: Vec<&str> = match object.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    let constants = |key: &str| {
        object.get(key).and_then(Value::as_array).is_some_and(|subs| {
            !subs.is_empty() && subs.iter().all(|s| s.get("const").is_some() || s.get("enum").is_some())
        })
    };
    types.iter().any(|t| matches!(*t, "integer" | "number" | "boolean"))
        || (types.contains(&"string") && ["pattern", "enum", "const", "format"].iter().any(|k| object.contains_key(*k)))
        || constants("oneOf")
        || constants("anyOf")
}

#[cfg(test)]
mod tests;
