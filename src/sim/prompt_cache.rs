//! The simulator's prompt cache: mlx_lm.server's `LRUPromptCache` (mlx_lm 0.32,
//! `models/cache.py`, and the calls in `server.py`), on the simulator's tokens (a prompt's
//! whitespace-separated words). Pure: `mod.rs` looks a prompt up when it arrives, inserts the
//! system-prompt checkpoint during prefill and the whole sequence when the answer ends.
//!
//! The rules reproduced, from the source:
//! - At most `capacity` sequences (`--prompt-cache-size`, default 10). Each has a kind
//!   (`assistant`: a finished request's prompt + generated tokens; `system`: the checkpoint saved
//!   when a chat prompt's leading system messages are prefilled; `user`: a thinking model's
//!   checkpoint, never made here). Over capacity, ONE sequence is evicted per insertion: the
//!   oldest of the first kind, in the order assistant, user, system, that holds at least as many
//!   sequences as the next kind (so system checkpoints go last).
//! - A lookup does not refresh a sequence; inserting the same tokens again moves it to the back.
//! - Inserting removes every stored sequence that is a proper prefix of the new one (they "just
//!   take space": a trimmable cache serves them from the longer one).
//! - A prompt is served by (a) a stored sequence equal to it: all of it is cached; else (b) when
//!   the deepest prefix shared with any stored sequence is longer than the longest stored
//!   sequence that is a prefix of the prompt (of at least 2 tokens): a longer sequence trimmed to
//!   min(prompt − 1, shared prefix); else (c) that stored prefix, whole; else nothing.
//! - `usage.prompt_tokens_details.cached_tokens` is that count, in the stream's usage chunk and in
//!   whole answers alike.
//!
//! Observed on the real server (mlx_lm 0.32.2, `.cache/tiny-qwen3`, 2026-12-01; chat requests
//! with `max_tokens` 8, temperature 0, streamed and whole answers reporting alike; a system
//! message of 60 words, a user message of 10):
//!
//! | request | prompt_tokens | cached_tokens |
//! |---|---|---|
//! | conversation A, turn 1, cold | 83 | 0 |
//! | the same again (whole, whole, streamed, streamed) | 83 | 82 each time |
//! | A turn 2: turn 1 + its own 8-token answer + a user message (streamed) | 111 | 91 (= 83 + 8) |
//! | the same again (whole) | 111 | 110 |
//! | A turn 2': turn 1 + another answer + the user message | 107 | 83 |
//! | an unrelated conversation (another system prompt) | 25 | 3 (ChatML's `<\|im_start\|>system\n`) |
//! | conversation B: A's system prompt, another user message (streamed) | 76 | 68 |
//! | A turn 3: turn 2 + a recorded answer + a user message | 123 | 111 |
//! | A turn 1 again, after B and the unrelated one | 83 | 82 |
//! | `--prompt-cache-size 2`: three conversations, then the first again | 29 | 3 (evicted) |
//! | then the third again | 29 | 28 |
//!
//! The simulator reproduces these shapes in its own tokens (words, no template tokens: an
//! unrelated prompt gets 0 where the real server shares its 3 template tokens);
//! tests/it/sim.rs replays them.

use std::collections::VecDeque;

use serde_json::{Value, json};

use super::behaviour::PromptCache;

/// The kind of a stored sequence (mlx_lm's `cache_type`), in eviction order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A finished request's prompt and generated tokens.
    Assistant = 0,
    /// A checkpoint before a thinking tail (never made by the simulator; kept for the order).
    User = 1,
    /// The prefix of a chat prompt's leading system messages, saved during its prefill.
    System = 2,
}

/// What a lookup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Found {
    /// Tokens served from the cache, as mlx_lm.server counts and reports them.
    pub cached: usize,
    /// The longest prefix the prompt shares with any stored sequence (what a server reporting
    /// its whole match, as Rapid-MLX does, would count).
    pub shared: usize,
}

/// An LRU of token sequences, by kind.
#[derive(Debug, Clone)]
pub struct LruPromptCache {
    capacity: usize,
    /// Per kind (indexed by `Kind as usize`), oldest first.
    lrus: [VecDeque<Vec<String>>; 3],
}

impl LruPromptCache {
    /// An empty cache of at most `capacity` sequences (0: nothing is kept).
    pub fn new(capacity: usize) -> Self {
        LruPromptCache { capacity, lrus: Default::default() }
    }

    /// How many sequences it holds.
    pub fn len(&self) -> usize {
        self.lrus.iter().map(VecDeque::len).sum()
    }

    /// True when it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its capacity in sequences.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forgets everything (a restarted server).
    pub fn clear(&mut self) {
        self.lrus.iter_mut().for_each(VecDeque::clear);
    }

    fn entries(&self) -> impl Iterator<Item = &Vec<String>> {
        self.lrus.iter().flatten()
    }

    /// `fetch_nearest_cache`: how much of `prompt` the cache serves. Does not touch the order.
    pub fn fetch(&self, prompt: &[String]) -> Found {
        if prompt.is_empty() {
            return Found::default();
        }
        let shared = self.entries().map(|e| common_prefix(e, prompt)).max().unwrap_or(0);
        if self.entries().any(|e| e.as_slice() == prompt) {
            return Found { cached: prompt.len(), shared };
        }
        let shorter = self
            .entries()
            .filter(|e| e.len() >= 2 && e.len() < prompt.len() && prompt.starts_with(e))
            .map(Vec::len)
            .max()
            .unwrap_or(0);
        let cached = if shared > shorter { shared.min(prompt.len() - 1) } else { shorter };
        Found { cached, shared }
    }

    /// `insert_cache`: stores `tokens` as the newest sequence of its kind, drops the stored
    /// sequences that are proper prefixes of it, then evicts one sequence if over capacity.
    pub fn insert(&mut self, tokens: Vec<String>, kind: Kind) {
        for lru in &mut self.lrus {
            if let Some(i) = lru.iter().position(|e| *e == tokens) {
                lru.remove(i);
                break;
            }
        }
        for lru in &mut self.lrus {
            lru.retain(|e| !(e.len() < tokens.len() && tokens.starts_with(e)));
        }
        self.lrus[kind as usize].push_back(tokens);
        if self.len() > self.capacity {
            self.evict_one();
        }
    }

    /// `CacheOrder.pop`: the oldest assistant sequence when there are at least as many of them as
    /// user ones, else the oldest user one when at least as many as system ones, else the oldest
    /// system one.
    fn evict_one(&mut self) {
        for i in 0..2 {
            if !self.lrus[i].is_empty() && self.lrus[i].len() >= self.lrus[i + 1].len() {
                self.lrus[i].pop_front();
                return;
            }
        }
        self.lrus[2].pop_front();
    }

    /// The stored sequences, oldest first within each kind (assistant, user, system): tests.
    pub fn sequences(&self) -> Vec<(Kind, &[String])> {
        let kinds = [Kind::Assistant, Kind::User, Kind::System];
        kinds.iter().flat_map(|k| self.lrus[*k as usize].iter().map(move |e| (*k, e.as_slice()))).collect()
    }
}

/// A simulator's prompt cache: the previous prompt alone (the default), or mlx_lm.server's LRU;
/// with the counters `/sim/stats` shows.
#[derive(Debug)]
pub struct SimCache {
    store: Store,
    lookups: u64,
    /// Lookups that spared some prefill.
    hits: u64,
}

#[derive(Debug)]
enum Store {
    Previous(Vec<String>),
    Lru(LruPromptCache),
}

impl SimCache {
    /// mlx_lm.server's LRU of `size` sequences, or (`None`) the previous prompt alone.
    pub fn new(size: Option<usize>) -> Self {
        let store = match size {
            Some(n) => Store::Lru(LruPromptCache::new(n)),
            None => Store::Previous(Vec::new()),
        };
        SimCache { store, lookups: 0, hits: 0 }
    }

    /// Looks `prompt` up when it arrives. Returns the tokens the style reports as cached (`None`:
    /// it reports none) and the tokens the cache spares the prefill. The previous-prompt cache
    /// takes `prompt` in place of the previous one at once; the LRU gets it when the answer ends
    /// (`remember`).
    pub fn lookup(&mut self, prompt: &[String], report: PromptCache) -> (Option<u32>, u32) {
        let to_u32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let (less_last, shared) = match &mut self.store {
            Store::Previous(previous) => {
                let shared = common_prefix(previous, prompt);
                *previous = prompt.to_vec();
                (shared.min(prompt.len().saturating_sub(1)), shared)
            }
            Store::Lru(lru) => {
                let found = lru.fetch(prompt);
                (found.cached, found.shared)
            }
        };
        self.lookups += 1;
        let reported = match report {
            PromptCache::Unreported => None,
            PromptCache::LessLastToken => Some(to_u32(less_last)),
            PromptCache::Whole => Some(to_u32(shared)),
        };
        let reused = reported.unwrap_or(to_u32(less_last));
        if reused > 0 {
            self.hits += 1;
        }
        (reported, reused)
    }

    /// Stores a sequence in the LRU (a no-op for the previous-prompt cache).
    pub fn remember(&mut self, tokens: Vec<String>, kind: Kind) {
        if let Store::Lru(lru) = &mut self.store {
            lru.insert(tokens, kind);
        }
    }

    /// Empties the cache (`POST /sim/prompt-cache/reset`; a restart does too).
    pub fn reset(&mut self) {
        match &mut self.store {
            Store::Previous(previous) => previous.clear(),
            Store::Lru(lru) => lru.clear(),
        }
    }

    /// `{size, sequences, lookups, hits}` for `/sim/stats` (`size` null: the previous prompt).
    pub fn stats(&self) -> Value {
        let (size, sequences) = match &self.store {
            Store::Previous(previous) => (Value::Null, usize::from(!previous.is_empty())),
            Store::Lru(lru) => (json!(lru.capacity()), lru.len()),
        };
        json!({"size": size, "sequences": sequences, "lookups": self.lookups, "hits": self.hits})
    }
}

/// What mlx_lm.server stores when an answer ends: the prompt and every generated token (its batch
/// generator feeds a token back before it hands it out, so the last one is in the cache too: a
/// next turn carrying the 8-token answer back was served the first prompt + 8, observed). `text`:
/// the answer's text, a token a word.
pub fn stored_sequence(mut prompt: Vec<String>, text: &str) -> Vec<String> {
    prompt.extend(text.split_whitespace().map(str::to_string));
    prompt
}

/// mlx_lm.server's system-prompt checkpoint: the first `system` tokens of a chat prompt that ends
/// with a user message, when they are not all served from the cache (`reused`) and are not the
/// whole prompt; `None` otherwise.
pub fn system_checkpoint(prompt: &[String], system: usize, reused: usize) -> Option<Vec<String>> {
    (system > 0 && system < prompt.len() && reused < system).then(|| prompt[..system].to_vec())
}

fn common_prefix(a: &[String], b: &[String]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests;
