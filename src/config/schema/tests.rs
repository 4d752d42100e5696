use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{json_schema, json_schema_text};
use crate::config::{Config, ConfigError};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn validator() -> jsonschema::Validator {
    jsonschema::draft7::new(&json_schema()).expect("the schema compiles")
}

/// The schema's complaints about a YAML text, one line each (empty: valid).
fn complaints(validator: &jsonschema::Validator, yaml: &str) -> Vec<String> {
    let instance: Value = serde_yaml::from_str(yaml).expect("YAML");
    validator.iter_errors(&instance).map(|e| format!("{}: {e}", e.instance_path())).collect()
}

/// Whether `text` is a whole configuration: the parser takes it, perhaps but for environment
/// variables this test does not set.
fn whole_config(text: &str) -> bool {
    match Config::parse(text, &|_| None) {
        Ok(_) => true,
        Err(ConfigError::Invalid(problems)) => {
            problems.iter().all(|p| p.reason.starts_with("environment variable") && p.reason.contains("is not set"))
        }
        Err(_) => false,
    }
}

/// The ```yaml blocks of a Markdown file.
fn yaml_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim_start()) {
            (None, l) if l.starts_with("```yaml") || l.starts_with("```yml") => current = Some(String::new()),
            (Some(_), l) if l.starts_with("```") => blocks.extend(current.take()),
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

/// The repository's Markdown files that hold configuration examples: the README and docs/.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![Path::new(ROOT).join("README.md")];
    let mut dirs = vec![Path::new(ROOT).join("docs")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for path in entries.flatten().map(|e| e.path()) {
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files
}

#[test]
fn the_shipped_schema_is_what_the_generator_writes() {
    let shipped = std::fs::read_to_string(Path::new(ROOT).join("gateway.schema.json")).unwrap_or_default();
    assert!(
        shipped == json_schema_text(),
        "gateway.schema.json is not what `mlxgate schema` writes: run `cargo run -- schema > gateway.schema.json`"
    );
}

#[test]
fn the_shipped_gateway_yaml_and_every_example_config_pass_the_schema() {
    let validator = validator();
    let shipped = std::fs::read_to_string(Path::new(ROOT).join("gateway.yaml")).expect("gateway.yaml");
    assert!(
        shipped.starts_with("# yaml-language-server: $schema=./gateway.schema.json\n"),
        "gateway.yaml names its schema on its first line"
    );
    assert!(whole_config(&shipped), "gateway.yaml is valid");
    assert_eq!(complaints(&validator, &shipped), Vec::<String>::new(), "gateway.yaml");
    // Every example written at the file's top level — a whole file or the part of one a section
    // of the docs is about — passes: the schema requires no key, so a part is a file too.
    let keys: Vec<String> = json_schema()["properties"].as_object().expect("properties").keys().cloned().collect();
    let mut checked = 0;
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).expect("readable");
        for (i, block) in yaml_blocks(&text).iter().enumerate() {
            let at = format!("{} yaml block {}", file.display(), i + 1);
            let top: Vec<String> = match serde_yaml::from_str::<Value>(block) {
                Ok(Value::Object(map)) => map.keys().cloned().collect(),
                _ => {
                    eprintln!("{at}: skipped, not a YAML mapping");
                    continue;
                }
            };
            if let Some(other) = top.iter().find(|k| !keys.contains(k)) {
                eprintln!("{at}: skipped, {other:?} is not a gateway.yaml key (another file's example)");
                continue;
            }
            let found = complaints(&validator, block);
            assert!(found.is_empty(), "{at}: {found:#?}\n{block}");
            checked += 1;
        }
    }
    eprintln!("{checked} example configs in README.md and docs/ pass the schema");
    assert!(checked >= 3, "the README's example configs were found ({checked})");
}

#[test]
fn the_schema_rejects_a_misspelled_key_and_a_wrong_type_and_takes_a_variable_for_any_scalar() {
    let validator = validator();
    let good =
        "backends:\n  local: {url: 'http://127.0.0.1:8101', max_concurrency: 2}\nmodels:\n  q: {backend: local}\n";
    assert_eq!(complaints(&validator, good), Vec::<String>::new());
    for (bad, at) in [
        (format!("{good}listen_port: 3\n"), ""),
        (good.replace("max_concurrency", "max_concurency"), "/backends/local"),
        (good.replace("{backend: local}", "{backend: local, max_queu: 3}"), "/models/q"),
        (good.replace("max_concurrency: 2", "max_concurrency: lots"), "/backends/local/max_concurrency"),
        (good.replace("{backend: local}", "{backend: local, max_wait: 30}"), "/models/q/max_wait"),
        (good.replace("{backend: local}", "{backend: local, on_overflow: truncate}"), "/models/q/on_overflow"),
        (good.replace("max_concurrency: 2", "kind: mlx-lmm"), "/backends/local/kind"),
        (format!("{good}access_log: maybe\n"), "/access_log"),
        (format!("{good}auth: sometimes\n"), "/auth"),
    ] {
        let found = complaints(&validator, &bad);
        assert!(!found.is_empty(), "accepted:\n{bad}");
        assert!(found.iter().any(|c| c.starts_with(&format!("{at}:"))), "{at}: {found:#?}");
        assert!(!whole_config(&bad), "the parser refuses it too:\n{bad}");
    }
    let variables = "
listen: 127.0.0.1:${PORT:-8000}
max_body: ${MAX_BODY}
access_log: ${ACCESS_LOG}
backends:
  local:
    kind: ${KIND}
    port: ${BACKEND_PORT}
    model: ${MODEL}
    gpu: ${GPU:-true}
    idle_timeout: ${IDLE}
    normalise: {serialize: '${SERIALIZE}'}
models:
  q: {backend: local, max_queue: '${QUEUE}', max_wait: '${WAIT:-2m}', on_overflow: '${OVERFLOW}'}
auth: ${AUTH}
default_limits: {rpm: '${RPM}'}
";
    assert_eq!(complaints(&validator, variables), Vec::<String>::new());
    assert!(!complaints(&validator, &variables.replace("${QUEUE}", "$QUEUE")).is_empty(), "not a variable");
}
