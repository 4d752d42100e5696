//! The counter exact where it takes shortcuts: the split count against the whole count, the
//! bytes bound against the exact count, a tokenizer.json with truncation.

use std::path::Path;

use mlxgate::tokens::counter::Counter;
use mlxgate::tokens::{ChatPrompt, Count};
use serde_json::json;
use tokenizers::Tokenizer;

const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/.cache/tiny-qwen3");
const QWEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/.cache/qwen3.6-tokenizer");

/// xorshift: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a>(&mut self, items: &'a [&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }
}

const ATOMS: &[&str] = &[
    "a",
    "word",
    " the",
    "Zeta",
    "é",
    "e\u{301}",
    "\u{301}",
    "\u{345}",
    "\u{93e}",
    "क",
    "\u{93f}",
    "漢字",
    "😀",
    "👍🏽",
    "1",
    "42",
    "3.14",
    " ",
    "  ",
    "\t",
    "\n",
    "\n",
    "\n\n",
    "\r\n",
    "\r",
    "\u{a0}",
    "\u{2028}",
    "\u{85}",
    "\u{3000}",
    "'s",
    "'S",
    "'ll",
    "-",
    ".",
    "!!",
    "(",
    "```",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "\u{1D160}",
    "\u{FB2C}",
    "\u{F73}",
    "Ⅻ",
    "ǅ",
    "ß",
    "İ",
    "\u{200d}",
    "\u{feff}",
    "ᄀ",
    "ᅡ",
    "ᆨ",
    "\u{1100}\u{1161}",
    "x\ny",
    "\nA",
    "\nб",
    "\n\u{93e}",
    "\nⅫ",
];

fn random_text(rng: &mut Rng, min_bytes: usize) -> String {
    let mut s = String::new();
    while s.len() < min_bytes {
        s.push_str(rng.pick(ATOMS));
    }
    s
}

fn check(dir: &str, seeds: u64) {
    let counter = Counter::load(Path::new(dir)).unwrap();
    let tokenizer = Tokenizer::from_file(Path::new(dir).join("tokenizer.json")).unwrap();
    let mut failures = Vec::new();
    for seed in 1..=seeds {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let extra = (rng.next() % 8192) as usize;
        let text = random_text(&mut rng, 17 * 1024 + extra);
        let whole = tokenizer.encode_fast(text.as_str(), true).unwrap().len();
        let split = counter.text_tokens(&text);
        if whole != split {
            failures.push((seed, whole, split));
        }
        let messages = [json!({"role": "user", "content": text})];
        let prompt = ChatPrompt { messages: &messages, tools: None, template_kwargs: None };
        let rendered = counter.render(prompt).unwrap();
        let exact = tokenizer.encode_fast(rendered.as_str(), false).unwrap().len();
        assert_eq!(counter.chat_tokens(prompt).unwrap(), exact, "seed {seed}: chat count");
    }
    assert!(failures.is_empty(), "{dir}: split != whole for (seed, whole, split) {failures:?}");
}

#[test]
fn split_count_equals_whole_count_on_random_texts_tiny() {
    check(TINY, 60);
}

#[test]
fn split_count_equals_whole_count_on_random_texts_qwen() {
    assert!(Path::new(QWEN).join("tokenizer.json").is_file(), "needs {QWEN}: run scripts/setup-backends tokens");
    check(QWEN, 30);
}

/// NFC turns U+1D160 (4 bytes) into three code points (12 bytes): Qwen3.6 makes 9 tokens of
/// each, the bound allows 8.
#[test]
fn bytes_bound_is_at_least_the_exact_count_under_nfc_expansion() {
    assert!(Path::new(QWEN).join("tokenizer.json").is_file(), "needs {QWEN}: run scripts/setup-backends tokens");
    let counter = Counter::load(Path::new(QWEN)).unwrap();
    let messages = [json!({"role": "user", "content": "\u{1D160}".repeat(200)})];
    let prompt = ChatPrompt { messages: &messages, tools: None, template_kwargs: None };
    let exact = counter.chat_tokens(prompt).unwrap();
    let bound = counter.chat_tokens_at_most(prompt).unwrap();
    assert!(bound >= exact, "bound {bound} < exact {exact}");
}

/// A tokenizer.json saved with truncation enabled (common for embedding models): transformers
/// disables it when counting; the counter must too.
#[test]
fn a_tokenizer_json_with_truncation_is_not_truncated_when_counting() {
    let dir = tempfile::tempdir().unwrap();
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(Path::new(TINY).join("tokenizer.json")).unwrap()).unwrap();
    json["truncation"] = json!({"direction": "Right", "max_length": 16, "strategy": "LongestFirst", "stride": 0});
    std::fs::write(dir.path().join("tokenizer.json"), json.to_string()).unwrap();
    let counter = Counter::load(dir.path()).unwrap();
    let text = "hello world ".repeat(100);
    let reference = Counter::load(Path::new(TINY)).unwrap().text_tokens(&text);
    assert_eq!(counter.text_tokens(&text), reference);
}
