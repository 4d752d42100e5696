use super::*;

fn models(names: &[&str]) -> BTreeMap<String, ModelConfig> {
    let yaml = format!(
        "backends: {{local: {{url: 'http://127.0.0.1:9'}}}}\nmodels: {{{}}}\n",
        names.iter().map(|n| format!("{n}: {{backend: local}}")).collect::<Vec<_>>().join(", ")
    );
    crate::config::Config::parse(&yaml, &|_| None).expect("config").models
}

fn aliases(yaml: &str, names: &[&str]) -> (Aliases, Vec<Problem>) {
    let raw: Value = serde_yaml::from_str(yaml).expect("yaml");
    let mut problems = Vec::new();
    let aliases = Aliases::validate(Some(raw), &models(names), &mut problems);
    (aliases, problems)
}

#[test]
fn a_star_stands_for_any_run_of_characters() {
    for (pattern, name) in [
        ("claude-*", "claude-haiku-4-5"),
        ("claude-*", "claude-"),
        ("*", ""),
        ("*", "anything"),
        ("*-haiku-*", "claude-haiku-4-5"),
        ("claude-*-4-5", "claude-sonnet-4-5"),
        ("a*b*c", "abcbc"),
        ("**", "x"),
        ("exact", "exact"),
    ] {
        assert!(matches(pattern, name), "{pattern} should match {name}");
    }
    for (pattern, name) in [
        ("claude-*", "claude"),
        ("claude-*", "xclaude-haiku"),
        ("*-4-5", "claude-4-5-x"),
        ("a*a", "a"),
        ("a*b*c", "acb"),
        ("exact", "exactly"),
        ("exact", "Exact"),
    ] {
        assert!(!matches(pattern, name), "{pattern} should not match {name}");
    }
}

#[test]
fn exact_names_win_then_the_longest_pattern() {
    let yaml = "{'claude-*': big, 'claude-haiku-*': small, 'claude-haiku-4-5': tiny, '*': big}";
    let (aliases, problems) = aliases(yaml, &["big", "small", "tiny"]);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(aliases.resolve("claude-haiku-4-5"), Some("tiny"));
    assert_eq!(aliases.resolve("claude-haiku-5-5"), Some("small"));
    assert_eq!(aliases.resolve("claude-opus-5-5"), Some("big"));
    assert_eq!(aliases.resolve("gpt-4o"), Some("big"), "the catch-all");
}

#[test]
fn patterns_of_one_length_go_in_byte_order() {
    // Both match `ab`; same length: the first in byte order (`*b` < `a*`) wins, whatever the file says.
    for yaml in ["{'a*': one, '*b': two}", "{'*b': two, 'a*': one}"] {
        let (aliases, problems) = aliases(yaml, &["one", "two"]);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(aliases.resolve("ab"), Some("two"), "{yaml}");
        assert_eq!(aliases.resolve("ac"), Some("one"), "{yaml}");
    }
}

#[test]
fn no_alias_no_model() {
    let (aliases, problems) = aliases("{'claude-haiku-*': small}", &["small"]);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(aliases.resolve("claude-opus-5-5"), None);
    assert_eq!(aliases.resolve("small"), None, "a model's own name is the caller's to try first");
    assert!(Aliases::default().is_empty() && Aliases::default().resolve("x").is_none());
}

#[test]
fn bad_aliases_are_refused_at_their_path() {
    let (aliases, problems) = aliases("{'claude-*': nowhere, qwen: small, '': small, ok: small}", &["qwen", "small"]);
    let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(paths, [r#"aliases."""#, r#"aliases."claude-*""#, r#"aliases."qwen""#], "{problems:?}");
    assert!(problems[1].reason.contains("no model named \"nowhere\" (models: qwen, small"), "{problems:?}");
    assert!(problems[2].reason.contains("configured model's own name"), "{problems:?}");
    assert_eq!(aliases.resolve("ok"), Some("small"), "the good ones are kept");
    let (_, problems) = self::aliases("[a, b]", &["qwen"]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].path.starts_with("aliases"), "{problems:?}");
}

#[test]
fn a_models_own_name_wins_over_every_pattern() {
    let yaml = "backends: {local: {url: 'http://127.0.0.1:9'}}\nmodels: {qwen: {backend: local}, \
                claude-x: {backend: local}}\naliases: {'claude-*': qwen}\n";
    let config = crate::config::Config::parse(yaml, &|_| None).expect("config");
    assert_eq!(config.model_named("claude-x"), "claude-x", "a model's own name");
    assert_eq!(config.model_named("claude-y"), "qwen", "an alias");
    assert_eq!(config.model_named("gpt-4o"), "gpt-4o", "no model: the name itself, for the 404");
}

#[test]
fn a_pattern_matches_no_name_longer_than_its_bound() {
    // The answer repeats the name sent in every chunk: `*` must not take a name as long as a body.
    let (aliases, problems) = aliases("{'*': big, 'claude-*': small}", &["big", "small"]);
    assert!(problems.is_empty(), "{problems:?}");
    let longest = format!("claude-{}", "x".repeat(MAX_PATTERN_MATCHED - "claude-".len()));
    assert_eq!(aliases.resolve(&longest), Some("small"));
    assert_eq!(aliases.resolve(&format!("{longest}x")), None);
    assert_eq!(aliases.resolve(&"y".repeat(1 << 20)), None, "a megabyte name is no model");
}

#[test]
fn no_pattern_matches_an_empty_name() {
    // `"model": ""` through `*` reached the backend, and the answer named the backend's own
    // model (`upstream_model`, a path on disk): an empty name is no model's.
    let (aliases, problems) = aliases("{'*': big}", &["big"]);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(aliases.resolve(""), None);
    assert_eq!(aliases.resolve("x"), Some("big"));
}
