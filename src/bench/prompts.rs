//! The prompts of `mlxgate bench`, made here (nothing is downloaded): the words of a fixed list,
//! each run of the list's length the whole list in an order shuffled with each prompt's tag as
//! the seed, the tag itself first, so that every prompt differs from the others from its first
//! token on (a server's prompt cache cannot turn a repeat into a cache hit) while its tokens
//! per word stay the list's. Each prompt is sized to its target with the model's
//! tokenizer and chat template when one is found (`--tokenizer DIR`, else the model's id in the
//! local Hugging Face cache); else from the server's own count (a [`Calibration`]: its
//! `usage.prompt_tokens` for two prompts made here, of different lengths, give the tokens per
//! word and the fixed tokens around them); else, when the server counts nothing, by a rule: a
//! token per listed word, mlxgate's estimate for the other pieces (the tag) and
//! `CHAT_FRAMING` for the chat template (a rule 5× off for a small vocabulary). The servers'
//! own `usage.prompt_tokens` is reported beside the size asked for.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
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
    /// Its tokens (the chat template included) as the tokenizer counts them, as the
    /// calibration predicts them, or as the rule estimates them.
    pub tokens: usize,
}

/// How the prompts' sizes are known, as the report states it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "method", rename_all = "snake_case")]
pub enum Sizing {
    /// Counted with the model's tokenizer and chat template, loaded from `path`.
    Tokenizer { path: String },
    /// Predicted from the server's own `usage.prompt_tokens` for two prompts made here, of
    /// different lengths: a line through them gives the tokens of each body word and the fixed
    /// tokens around the words (the chat template, the tag, the closing request).
    Calibrated {
        /// The endpoint measured (`A`).
        against: String,
        tokens_per_word: f64,
        fixed_tokens: f64,
    },
    /// The rule for these prompts (a token per listed word), and why nothing better was had.
    Estimate { why: String },
}

impl fmt::Display for Sizing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Sizing::Tokenizer { path } => write!(f, "counting with the tokenizer in {path}"),
            Sizing::Calibrated { against, tokens_per_word, fixed_tokens } => write!(
                f,
                "calibration against the server ({against}): {tokens_per_word:.2} tokens per word, \
                 {fixed_tokens:.0} fixed tokens (chat template, tag, request)"
            ),
            Sizing::Estimate { why } => write!(f, "estimate, a token per word ({why})"),
        }
    }
}

/// A server's tokens for the prompts made here: `fixed_tokens + tokens_per_word × words`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    pub tokens_per_word: f64,
    pub fixed_tokens: f64,
}

impl Calibration {
    /// The line through two prompts' (body words, the server's prompt tokens); an error when
    /// the longer prompt did not count more tokens (a server that does not count them).
    pub fn through(short: (usize, u64), long: (usize, u64)) -> Result<Calibration, String> {
        let words = long.0 as f64 - short.0 as f64;
        let tokens = long.1 as f64 - short.1 as f64;
        if words <= 0.0 || tokens <= 0.0 {
            return Err(format!(
                "the server counted {} prompt tokens for {} words and {} for {}: no usable calibration",
                short.1, short.0, long.1, long.0
            ));
        }
        let tokens_per_word = tokens / words;
        let fixed_tokens = (short.1 as f64 - tokens_per_word * short.0 as f64).max(0.0);
        Ok(Calibration { tokens_per_word, fixed_tokens })
    }

    /// Body words for a prompt of `target` tokens (at least one).
    fn words_for(&self, target: usize) -> usize {
        ((target as f64 - self.fixed_tokens) / self.tokens_per_word).round().max(1.0) as usize
    }

    /// The tokens predicted for a prompt of `words` body words.
    fn tokens(&self, words: usize) -> usize {
        (self.fixed_tokens + self.tokens_per_word * words as f64).round() as usize
    }
}

/// How prompts are sized now.
enum Sizer {
    /// The model's tokenizer, and where it was loaded from.
    Tokenizer { counter: Arc<dyn Count>, dir: PathBuf },
    /// The server's count, calibrated against endpoint `against`.
    Calibrated { calibration: Calibration, against: String },
    /// The rule, and why.
    Rule { why: String },
}

/// Makes prompts of a given size in tokens.
pub struct PromptMaker {
    sizer: Sizer,
    /// Body words found to give each target size.
    words_for: HashMap<usize, usize>,
}

impl PromptMaker {
    /// Counts with the tokenizer in `tokenizer` (an error when it cannot be loaded: the user
    /// asked for it), else the one of `model` when it is a local directory or a Hugging Face id
    /// in the local cache, else the rule until a calibration replaces it.
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
        let sizer = match counter {
            Some((counter, dir)) => Sizer::Tokenizer { counter, dir },
            None => Sizer::Rule { why: "not calibrated".into() },
        };
        PromptMaker { sizer, words_for: HashMap::new() }
    }

    /// Whether the model's tokenizer sizes the prompts (then no calibration is needed).
    pub fn has_tokenizer(&self) -> bool {
        matches!(self.sizer, Sizer::Tokenizer { .. })
    }

    /// Sizes prompts with `calibration` from now on, unless a tokenizer does.
    pub fn calibrated(&mut self, calibration: Calibration, against: &str) {
        if !self.has_tokenizer() {
            self.sizer = Sizer::Calibrated { calibration, against: against.to_string() };
            self.words_for.clear();
        }
    }

    /// Keeps the rule, because of `why` (the calibration could not be made).
    pub fn uncalibrated(&mut self, why: String) {
        if let Sizer::Rule { why: reason } = &mut self.sizer {
            *reason = why;
        }
    }

    /// How the prompts are sized, for the report.
    pub fn sizing(&self) -> Sizing {
        match &self.sizer {
            Sizer::Tokenizer { dir, .. } => Sizing::Tokenizer { path: dir.display().to_string() },
            Sizer::Calibrated { calibration, against } => Sizing::Calibrated {
                against: against.clone(),
                tokens_per_word: calibration.tokens_per_word,
                fixed_tokens: calibration.fixed_tokens,
            },
            Sizer::Rule { why } => Sizing::Estimate { why: why.clone() },
        }
    }

    /// A prompt of about `target` tokens that starts with `tag`: its words are drawn with
    /// `tag` as the seed, so distinct tags give prompts distinct from their start.
    pub fn make(&mut self, target: usize, tag: &str) -> Prompt {
        let words = match self.words_for.get(&target) {
            Some(&words) => words,
            None => {
                let words = self.body_words(target, tag);
                self.words_for.insert(target, words);
                words
            }
        };
        let text = compose(tag, words);
        let tokens = match &self.sizer {
            Sizer::Calibrated { calibration, .. } => calibration.tokens(words),
            _ => self.count(&text),
        };
        Prompt { text, tokens }
    }

    /// Body words that make a prompt of `target` tokens: from the calibration's line, or, by
    /// counting, from the tokens of an empty body and of a trial one, a few corrections (each
    /// a count of the whole prompt).
    fn body_words(&self, target: usize, tag: &str) -> usize {
        if let Sizer::Calibrated { calibration, .. } = &self.sizer {
            return calibration.words_for(target);
        }
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

    /// Tokens of `text` as a one-message chat prompt, with the tokenizer or the rule.
    fn count(&self, text: &str) -> usize {
        let Sizer::Tokenizer { counter, .. } = &self.sizer else { return rule_count(text) };
        let messages = [json!({"role": "user", "content": text})];
        let prompt = ChatPrompt { messages: &messages, tools: None, template_kwargs: None };
        counter.chat_tokens(prompt).unwrap_or_else(|_| counter.text_tokens(text))
    }
}

/// Body words of the two prompts sizes are calibrated with: none (the fixed tokens) and the
/// whole word list once (its tokens per word, exactly: each run of that many words is the list).
pub const CALIBRATION_WORDS: [usize; 2] = [0, WORDS.len()];

/// The text of a calibration prompt: `tag`, then `words` body words, as every prompt is made.
pub fn calibration_text(tag: &str, words: usize) -> String {
    compose(tag, words)
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
    // Every run of `WORDS.len()` words is the whole list, shuffled: a prompt's tokens per word
    // are the list's (what a calibration measures), not those of a lucky draw.
    let mut order: Vec<usize> = (0..WORDS.len()).collect();
    for i in 0..words {
        let slot = i % WORDS.len();
        if slot == 0 {
            shuffle(&mut order, &mut state);
        }
        if i > 0 {
            text.push(if i % 16 == 0 { '\n' } else { ' ' });
        }
        text.push_str(WORDS[order[slot]]);
    }
    text.push_str("\n\n");
    text.push_str(ASK);
    text
}

/// Fisher–Yates with xorshift64*: cheap, and the same order for the same seed on every machine.
fn shuffle(order: &mut [usize], state: &mut u64) {
    for j in (1..order.len()).rev() {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        let pick = state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33;
        order.swap(j, (pick % (j as u64 + 1)) as usize);
    }
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

    #[test]
    fn a_calibration_sizes_prompts_by_the_servers_count() {
        // A server with a small vocabulary: 5 tokens a word (its tag's too) and 12 of template.
        let server = |text: &str| 12 + 5 * text.split_whitespace().count() as u64;
        let tag = |words: usize| format!("Request 1a2b3c-A-calibrate-{words}-0.");
        let [short, long] = CALIBRATION_WORDS.map(|words| (words, server(&calibration_text(&tag(words), words))));
        let calibration = Calibration::through(short, long).expect("calibrated");
        assert!((calibration.tokens_per_word - 5.0).abs() < 1e-9, "{calibration:?}");
        let mut maker = PromptMaker::counting_with(None);
        maker.make(50, "Warm-up 1a2b3c A 0."); // sized by the rule before the calibration
        maker.calibrated(calibration, "A");
        // (Its fixed tokens are 107: the template, the tag, the hash and the ask.)
        for target in [300, 1000, 10_000] {
            let prompt = maker.make(target, "Request 1a2b3c-A-single-1000-0.");
            let counted = server(&prompt.text);
            assert!(counted.abs_diff(target as u64) <= 5, "{target}: the server counts {counted}");
            assert!(prompt.tokens.abs_diff(counted as usize) <= 1, "{target}: predicted {}", prompt.tokens);
        }
        assert!(matches!(maker.sizing(), Sizing::Calibrated { tokens_per_word, .. } if tokens_per_word == 5.0));
        assert!(maker.sizing().to_string().contains("5.00 tokens per word"), "{}", maker.sizing());
        // A server whose count does not grow with the prompt calibrates nothing.
        assert!(Calibration::through((32, 40), (256, 40)).is_err());
        maker.uncalibrated("ignored once calibrated".into());
        assert!(matches!(maker.sizing(), Sizing::Calibrated { .. }));
        let mut rule = PromptMaker::counting_with(None);
        rule.uncalibrated("the server reports no usage.prompt_tokens".into());
        assert_eq!(rule.sizing().to_string(), "estimate, a token per word (the server reports no usage.prompt_tokens)");
    }

    #[test]
    fn each_run_of_the_lists_length_is_the_whole_list() {
        let text = compose("Request 1a2b3c-A-single-1000-0.", 2 * WORDS.len() + 7);
        let body: Vec<&str> = text.split_whitespace().skip(3).take(2 * WORDS.len()).collect();
        for run in body.chunks(WORDS.len()) {
            let mut sorted = run.to_vec();
            sorted.sort_unstable();
            let mut list = WORDS.to_vec();
            list.sort_unstable();
            assert_eq!(sorted, list);
        }
        assert_ne!(body[..WORDS.len()], body[WORDS.len()..], "each run shuffled anew");
    }
}
