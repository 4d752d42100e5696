//! The prompt counter against the Python reference: `scripts/token-reference.py` renders and
//! counts every entry of `tests/data/chat-corpus.json` with transformers (`apply_chat_template`,
//! jinja2, tokenizers), and mlxgate's `Counter` must render the same bytes and count the same
//! tokens: on the tiny test model (plain ChatML), on the tiny tokenizer with a Qwen3-style
//! template exercising tools, thinking and jinja's Python-isms, and on the real Qwen vocabulary
//! with its real chat template. The conservative `Estimate` must over-count the real vocabulary.

use std::path::{Path, PathBuf};
use std::process::Command;

use mlxgate::tokens::counter::{Counter, Estimate};
use mlxgate::tokens::{ChatPrompt, Count};
use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The Python with transformers and jinja2: `.venv-tokens` when it exists, else the mlx-lm venv.
fn python() -> PathBuf {
    let root = Path::new(ROOT);
    let tokens = root.join(".venv-tokens/bin/python");
    let python = if tokens.exists() { tokens } else { root.join(".venv-mlx-lm/bin/python") };
    assert!(python.exists(), "no Python with transformers: run scripts/setup-backends mlx-lm");
    python
}

/// A directory the test needs, or a failure naming the command that makes it.
fn prerequisite(dir: &str, command: &str) -> PathBuf {
    let path = Path::new(ROOT).join(dir);
    assert!(path.join("tokenizer.json").is_file(), "this test needs {dir}: run {command}");
    path
}

fn corpus() -> Value {
    let text = std::fs::read_to_string(Path::new(ROOT).join("tests/data/chat-corpus.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The reference's answer for a tokenizer directory (and a template overriding the model's).
fn reference(dir: &Path, template: Option<&Path>) -> Value {
    let mut command = Command::new(python());
    command.arg(Path::new(ROOT).join("scripts/token-reference.py")).arg(dir);
    command.arg(Path::new(ROOT).join("tests/data/chat-corpus.json"));
    if let Some(template) = template {
        command.arg("--template").arg(template);
    }
    let out = command.output().unwrap();
    assert!(out.status.success(), "token-reference.py failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn prompt(entry: &Value) -> ChatPrompt<'_> {
    ChatPrompt {
        messages: entry["messages"].as_array().unwrap(),
        tools: entry.get("tools").and_then(Value::as_array).map(Vec::as_slice),
        template_kwargs: entry.get("chat_template_kwargs").and_then(Value::as_object),
    }
}

/// Asserts byte-identical renderings and equal counts for every corpus entry; returns how
/// many chats rendered (the rest raised in both).
fn assert_matches(counter: &Counter, reference: &Value) -> usize {
    let corpus = corpus();
    let mut mismatches = Vec::new();
    let mut rendered = 0;
    for (entry, want) in corpus["chats"].as_array().unwrap().iter().zip(reference["chats"].as_array().unwrap()) {
        let name = entry["name"].as_str().unwrap();
        assert_eq!(want["name"], entry["name"]);
        let got = counter.render(prompt(entry));
        match (got, want.get("error")) {
            (Err(_), Some(_)) => {}
            (Ok(text), None) => {
                rendered += 1;
                if text != want["text"].as_str().unwrap() {
                    mismatches.push(format!(
                        "{name}: rendering differs\n--- jinja2:\n{}\n--- mlxgate:\n{text}",
                        want["text"]
                    ));
                    continue;
                }
                let tokens = counter.chat_tokens(prompt(entry)).unwrap();
                if tokens != want["tokens"].as_u64().unwrap() as usize {
                    mismatches.push(format!("{name}: {tokens} tokens, transformers says {}", want["tokens"]));
                }
            }
            (Ok(_), Some(error)) => mismatches.push(format!("{name}: rendered, but jinja2 raised {error}")),
            (Err(e), None) => mismatches.push(format!("{name}: failed ({e}), jinja2 rendered it")),
        }
    }
    for (entry, want) in corpus["texts"].as_array().unwrap().iter().zip(reference["texts"].as_array().unwrap()) {
        let text = entry["text"].as_str().unwrap().repeat(entry["repeat"].as_u64().unwrap_or(1) as usize);
        let tokens = counter.text_tokens(&text);
        if tokens != want["tokens"].as_u64().unwrap() as usize {
            mismatches.push(format!("text {}: {tokens} tokens, tokenizers says {}", entry["name"], want["tokens"]));
        }
    }
    assert!(mismatches.is_empty(), "{} mismatches:\n{}", mismatches.len(), mismatches.join("\n"));
    rendered
}

#[test]
fn tiny_model_renders_and_counts_as_transformers() {
    let dir = prerequisite(".cache/tiny-qwen3", "scripts/setup-backends mlx-lm");
    let counter = Counter::load(&dir).unwrap();
    let rendered = assert_matches(&counter, &reference(&dir, None));
    assert!(rendered >= 15, "only {rendered} chats rendered");
}

#[test]
fn qwen3_style_template_with_tools_and_thinking_renders_as_jinja2() {
    let tiny = prerequisite(".cache/tiny-qwen3", "scripts/setup-backends mlx-lm");
    let template = Path::new(ROOT).join("tests/data/qwen3-style-template.jinja");
    // The tiny tokenizer with the test template as its chat_template.jinja.
    let dir = tempfile::tempdir().unwrap();
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tiny.join(file), dir.path().join(file)).unwrap();
    }
    std::fs::copy(&template, dir.path().join("chat_template.jinja")).unwrap();
    let counter = Counter::load(dir.path()).unwrap();
    let rendered = assert_matches(&counter, &reference(&tiny, Some(&template)));
    assert!(rendered >= 18, "only {rendered} chats rendered");
}

#[test]
fn qwen_vocabulary_renders_and_counts_as_transformers() {
    let dir = prerequisite(".cache/qwen3.6-tokenizer", "scripts/make-qwen-tokenizer");
    let started = std::time::Instant::now();
    let counter = Counter::load(&dir).unwrap();
    eprintln!("loaded the Qwen vocabulary in {:?}", started.elapsed());
    let rendered = assert_matches(&counter, &reference(&dir, None));
    assert!(rendered >= 15, "only {rendered} chats rendered");

    // A long prompt for the record (no time limit here: the benchmark owns that figure).
    let corpus = corpus();
    let long = corpus["chats"].as_array().unwrap().iter().find(|c| c["name"] == "long content").unwrap();
    let content = long["messages"][1]["content"].as_str().unwrap().repeat(38);
    let messages = [serde_json::json!({"role": "user", "content": content})];
    let prompt = ChatPrompt { messages: &messages, tools: None, template_kwargs: None };
    let started = std::time::Instant::now();
    let tokens = counter.chat_tokens(prompt).unwrap();
    eprintln!("counted a {tokens}-token prompt in {:?} (this build's profile)", started.elapsed());
    assert!(tokens > 50_000, "{tokens}");
}

#[test]
fn estimate_over_counts_the_qwen_vocabulary() {
    let dir = prerequisite(".cache/qwen3.6-tokenizer", "scripts/make-qwen-tokenizer");
    let counter = Counter::load(&dir).unwrap();
    let corpus = corpus();
    let mut under = Vec::new();
    for entry in corpus["chats"].as_array().unwrap() {
        let Ok(exact) = counter.chat_tokens(prompt(entry)) else { continue };
        let estimate = Estimate.chat_tokens(prompt(entry)).unwrap();
        eprintln!("{}: {exact} tokens, estimate {estimate}", entry["name"]);
        if estimate < exact {
            under.push(format!("{}: estimate {estimate} < {exact}", entry["name"]));
        }
    }
    for entry in corpus["texts"].as_array().unwrap() {
        let text = entry["text"].as_str().unwrap();
        let (exact, estimate) = (counter.text_tokens(text), Estimate.text_tokens(text));
        eprintln!("text {}: {exact} tokens, estimate {estimate}", entry["name"]);
        if estimate < exact {
            under.push(format!("text {}: estimate {estimate} < {exact}", entry["name"]));
        }
    }
    // Numbers and base64 (an image or a file pasted in a prompt): many tokens per byte.
    let digits: String = (0..40_000).map(|i| char::from(b'0' + (i % 10) as u8)).collect();
    let base64: String = (0..20_000u32)
        .map(|i| {
            const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
            char::from(ALPHABET[(i.wrapping_mul(2_654_435_761) >> 7) as usize % 64])
        })
        .collect();
    for (name, text) in [("40k digits", digits), ("base64", base64)] {
        let (exact, estimate) = (counter.text_tokens(&text), Estimate.text_tokens(&text));
        eprintln!("{name}: {exact} tokens, estimate {estimate}");
        if estimate < exact {
            under.push(format!("{name}: estimate {estimate} < {exact}"));
        }
    }
    assert!(under.is_empty(), "the estimate under-counts:\n{}", under.join("\n"));
}
