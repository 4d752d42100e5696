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
//! Observed on the real server: OBSERVATIONS (filled in below after the check).

use std::collections::VecDeque;

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

fn common_prefix(a: &[String], b: &[String]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests;
