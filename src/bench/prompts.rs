//! The prompts of `mlxgate bench`, made here (nothing is downloaded): words drawn from a fixed
//! list by a generator seeded with each prompt's tag, the tag itself first, so that every
//! prompt differs from the others from its first token on and a server's prompt cache cannot
//! turn a repeat into a cache hit. Each prompt is sized to its target with the model's
//! tokenizer and chat template when one is found (`--tokenizer DIR`, else the model's id in the
//! local Hugging Face cache), else by a rule for these prompts: a token per listed word (each
//! is one token, with its leading space, in the vocabularies of today's models), mlxgate's
//! estimate for the other pieces (the tag) and `CHAT_FRAMING` for the chat template. The
//! servers' own `usage.prompt_tokens` is reported beside the size asked for.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;

use crate::tokens::counter::{Counter, Estimate, LoadError, locate};
use crate::tokens::{ChatPrompt, Count};

/// The words prompts are made of: common English words, which every tokenizer knows.
const WORDS: &[&str] = &[
    "time",
    "river",
    "garden",
    "winter",
    "market",
    "letter",
    "window",
    "silver",
    "harbor",
    "forest",
    "engine",
    "mountain",
    "village",
    "teacher",
    "picture",
    "morning",
    "evening",
    "journey",
    "kitchen",
    "library",
    "bridge",
    "station",
    "question",
    "answer",
    "history",
    "science",
    "music",
    "paper",
    "number",
    "family",
    "country",
    "island",
    "valley",
    "summer",
    "autumn",
    "spring",
    "doctor",
    "farmer",
    "sailor",
    "painter",
    "writer",
    "candle",
    "lantern",
    "blanket",
    "pocket",
    "basket",
    "ladder",
    "hammer",
    "button",
    "mirror",
    "pillow",
    "ribbon",
    "castle",
    "tower",
    "meadow",
    "orchard",
    "canyon",
    "desert",
    "glacier",
    "thunder",
    "shadow",
    "whisper",
    "promise",
    "reason",
    "season",
    "moment",
    "silence",
    "distance",
    "journal",
    "compass",
    "voyage",
    "harvest",
    "festival",
    "quiet",
    "bright",
    "gentle",
    "ancient",
    "narrow",
    "hollow",
    "golden",
    "frozen",
    "distant",
    "curious",
    "patient",
    "careful",
    "simple",
    "strange",
    "famous",
    "sudden",
    "walks",
    "carries",
    "builds",
    "finds",
    "opens",
    "remembers",
    "follows",
    "watches",
    "gathers",
    "counts",
    "draws",
    "sings",
    "travels",
    "returns",
    "writes",
    "listens",
    "under",
    "across",
    "beyond",
    "between",
    "toward",
    "after",
    "before",
    "during",
    "while",
    "because",
    "although",
    "with",
    "and",
    "the",
    "a",
    "of",
    "in",
    "on",
    "near",
    "every",
    "each",
    "some",
    "many",
    "old",
    "new",
];

/// Tokens a chat template adds around one user message and the generation prompt (Qwen's:
/// `<|im_start|>user\n … <|im_end|>\n<|im_start|>assistant\n`), when no tokenizer is found.
const CHAT_FRAMING: usize = 10;

/// What is asked after the words: a long answer, so that generation runs to `max_tokens`.
const ASK: &str = "Write a long, detailed story that uses as many of the words above as you can.";

/// One generated prompt.
#[derive(Debug, Clone)]
pub struct Prompt {
    /// The user message's text.
    pub text: String,
    /// Its tokens as counted here (the chat template included), with the tokenizer or estimate.
    pub tokens: usize,
}

/// Makes prompts of a given size in tokens.
pub struct PromptMaker {
    /// The model's tokenizer; `None`: the rule for these prompts.
    counter: Option<Arc<dyn Count>>,
    /// Where the tokenizer was loaded from; `None`: the estimate.
    pub source: Option<PathBuf>,
    /// Body words found to give each target size.
    words_for: HashMap<usize, usize>,
}

impl PromptMaker {
    /// Counts with the tokenizer in `tokenizer` (an error when it cannot be loaded: the user
    /// asked for it), else the one of `model` when it is a local directory or a Hugging Face id
    /// in the local cache, else the estimate.
    pub fn load(tokenizer: Option<&Path>, model: &str) -> Result<PromptMaker, LoadError> {
        let dir = match tokenizer {
            Some(dir) => Some(dir.to_path_buf()),
            None => locate(model),
        };
        let counter = match dir {
            Some(dir) => match Counter::load(&dir) {
                Ok(counter) => Some((Arc::new(counter) as Arc<dyn Count>, dir)),
                Err(e) if tokenizer.is_some() => return Err(e),
                Err(_) => None,
            },
            None => None,
        };
        Ok(PromptMaker::counting_with(counter))
    }

    /// Counts with `counter` (a tokenizer and where it was loaded from), else with the rule.
    pub fn counting_with(counter: Option<(Arc<dyn Count>, PathBuf)>) -> PromptMaker {
        let (counter, source) = counter.map_or((None, None), |(c, dir)| (Some(c), Some(dir)));
        PromptMaker { counter, source, words_for: HashMap::new() }
    }

    /// A prompt of about `target` tokens that starts with `tag`: its words are drawn with
    /// `tag` as the seed, so distinct tags give prompts distinct from their start.
    pub fn make(&mut self, target: usize, tag: &str) -> Prompt {
        let words = match self.words_for.get(&target) {
            Some(&words) => words,
            None => {
                let words = self.calibrate(target, tag);
                self.words_for.insert(target, words);
                words
            }
        };
        let text = compose(tag, words);
        let tokens = self.count(&text);
        Prompt { text, tokens }
    }

    /// Body words that make a prompt of `target` tokens: from the tokens of an empty body and
    /// of a trial one, a few corrections (each a count of the whole prompt).
    fn calibrate(&self, target: usize, tag: &str) -> usize {
        let base = self.count(&compose(tag, 0));
        let tolerance = (target / 200).max(2);
        let mut words = target.saturating_sub(base).max(1);
        for _ in 0..8 {
            let tokens = self.count(&compose(tag, words));
            if tokens.abs_diff(target) <= tolerance || (words == 1 && tokens > target) {
                break;
            }
            let per_word = tokens.saturating_sub(base).max(1) as f64 / words as f64;
            let next = (target.saturating_sub(base) as f64 / per_word).round().max(1.0) as usize;
            if next == words {
                break;
            }
            words = next;
        }
        words
    }

    /// Tokens of `text` as a one-message chat prompt.
    fn count(&self, text: &str) -> usize {
        let Some(counter) = &self.counter else { return rule_count(text) };
        let messages = [json!({"role": "user", "content": text})];
        let prompt = ChatPrompt { messages: &messages, tools: None, template_kwargs: None };
        counter.chat_tokens(prompt).unwrap_or_else(|_| counter.text_tokens(text))
    }
}

/// Tokens of a prompt made here, without its model's tokenizer: one per listed word, the
/// estimate for other pieces, and the chat template's framing.
fn rule_count(text: &str) -> usize {
    let piece = |word: &str| if WORDS.contains(&word) { 1 } else { Estimate::text(word) };
    CHAT_FRAMING + text.split_whitespace().map(piece).sum::<usize>()
}

/// A hash of `tag`, `tag`, then `words` words drawn with `tag` as the seed, then the ask.
fn compose(tag: &str, words: usize) -> String {
    let mut state = seed(tag);
    let mut text = String::with_capacity(tag.len() + words * 8 + ASK.len() + 16);
    // A hash of the tag first: tags that share their start (one run's) still differ within the
    // prompt's first characters, so a prompt cache holds nothing of another prompt.
    let _ = writeln!(text, "{:08x} {tag}", state >> 32);
    for i in 0..words {
        // xorshift64*: cheap, and the same words for the same tag on every machine.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let pick = state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33;
        if i > 0 {
            text.push(if i % 16 == 0 { '\n' } else { ' ' });
        }
        text.push_str(WORDS[(pick % WORDS.len() as u64) as usize]);
    }
    text.push_str("\n\n");
    text.push_str(ASK);
    text
}

/// FNV-1a of `tag`, never zero (xorshift's fixed point).
fn seed(tag: &str) -> u64 {
    let hash = tag.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    hash.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_reach_their_size_and_differ_from_their_start() {
        let mut maker = PromptMaker::counting_with(Some((Arc::new(Estimate), PathBuf::new())));
        for target in [100, 1000, 10_000] {
            let a = maker.make(target, "bench 1 A r0");
            let b = maker.make(target, "bench 1 A r1");
            assert!(a.tokens.abs_diff(target) <= (target / 50).max(6), "{target}: {}", a.tokens);
            assert!(b.tokens.abs_diff(target) <= (target / 50).max(6), "{target}: {}", b.tokens);
            assert_ne!(a.text.split_whitespace().nth(3), None);
            let first_difference = a.text.bytes().zip(b.text.bytes()).position(|(x, y)| x != y);
            assert!(first_difference.is_some_and(|at| at < 8), "distinct within the leading hash");
        }
        // The same tag gives the same prompt (a re-run is comparable).
        assert_eq!(maker.make(100, "t").text, maker.make(100, "t").text);
    }

    #[test]
    fn without_a_tokenizer_each_listed_word_is_a_token() {
        let mut maker = PromptMaker::counting_with(None);
        let prompt = maker.make(1000, "Request 7.");
        let words = prompt.text.split_whitespace().filter(|w| WORDS.contains(w)).count();
        let others = prompt.text.split_whitespace().filter(|w| !WORDS.contains(w)).map(Estimate::text).sum::<usize>();
        assert_eq!(prompt.tokens, CHAT_FRAMING + words + others);
        assert!(prompt.tokens.abs_diff(1000) <= 5, "{}", prompt.tokens);
    }
}
