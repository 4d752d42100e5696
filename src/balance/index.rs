//! What the gateway believes one backend's prompt cache holds: the prompts it served last, as
//! chained segment hashes ([`Prompt`]), at most `capacity` of them (the server's
//! `prompt_cache_sequences`), newest first. mlx_lm.server keeps an LRU of whole sequences and,
//! on inserting one, drops the stored sequences that are prefixes of it; the index does the same,
//! so one conversation takes one place.
//!
//! A prediction ([`PrefixIndex::predict`]) is the longest prefix of a prompt that a stored
//! sequence shares (a binary search on the chained hashes: equal at `i` means equal up to `i`).
//! Each answer corrects the index ([`PrefixIndex::observe`]): the server's reported
//! `cached_tokens`, turned into segments with this answer's own tokens per byte, bounds what it
//! held; every sequence believed at the plan that shares more with the prompt than that is gone
//! from the server and is dropped (a sequence inserted since the plan is newer evidence and
//! stays). Then the prompt just served is inserted at the front: the server holds it now.
//!
//! The server stores a prompt with the answer it generated, which the client sends back as the
//! next turn's assistant message. Whether that message's tokens are the ones generated depends
//! on the chat template (one that strips earlier turns' reasoning renders them anew), so the
//! index learns, per backend, the fraction of such an answer the reports show held (an
//! [`Ewma`], prior ½) and expects that much of it ([`Match::expected_bytes`]).
//!
//! A server may keep fewer sequences than the gateway was told (a `--prompt-cache-size` it was
//! not given, a byte limit that evicts early): the index learns how many from the reports
//! ([`PrefixIndex::learnt_capacity`]) — a sequence proven gone with `d` newer ones before it
//! says the server keeps at most `d`; one proven held past that (kept as a *ghost*, not
//! predicted from) says it keeps more — and predicts from the newest that many only.

use std::collections::VecDeque;

use super::prompt::Prompt;
use super::rates::Ewma;

/// The largest capacity an index takes, whatever a configuration says.
pub const MAX_CAPACITY: usize = 1024;

/// A reported count is taken as up to this fraction larger, and [`SLACK_TOKENS`] more, before
/// it contradicts a prediction: a prompt's tokens are not spread evenly over its bytes (the
/// chat template's own tokens, dense JSON in tools).
pub const TOLERANCE: f64 = 0.25;

/// See [`TOLERANCE`]; also covers mlx_lm.server's one token held back on an exact match.
pub const SLACK_TOKENS: f64 = 64.0;

/// The tokens per byte taken when an answer reports no prompt count.
pub const DEFAULT_TOKENS_PER_BYTE: f64 = 1.0 / 3.5;

/// The prefix of a prompt a backend is believed to hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Match {
    /// Whole segments shared with a stored sequence.
    pub segments: usize,
    /// Their size in bytes.
    pub bytes: u64,
    /// The size of the assistant message after them, when a stored sequence ends there: the
    /// answer the server generated after it.
    pub answer_bytes: u64,
    /// What the server is expected to hold: `bytes`, and of `answer_bytes` the fraction this
    /// server was found to hold.
    pub expected_bytes: u64,
    /// The index's clock at the prediction: only sequences inserted before it are judged by the
    /// answer's report.
    pub clock: u64,
}

/// What an answer's report did to the index.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Correction {
    /// The segments the report accounts for (`None`: no report, the guess stands).
    pub reported_segments: Option<usize>,
    /// Stored sequences the report proved gone.
    pub dropped: usize,
}

/// One stored sequence.
#[derive(Debug, Clone)]
struct Stored {
    chain: Box<[u64]>,
    /// When it was inserted ([`PrefixIndex::clock`]).
    stamp: u64,
}

/// One backend's index (see the module's header).
#[derive(Debug, Clone)]
pub struct PrefixIndex {
    capacity: usize,
    /// How many of the newest sequences the server is found to keep (≤ `capacity`): the
    /// predictions look at these only; the older ones are kept as ghosts, so that a report
    /// proving the server holds one of them grows it back.
    learnt: usize,
    /// Newest first.
    stored: VecDeque<Stored>,
    /// Counts insertions.
    clock: u64,
    /// The fraction of an answer sent back that the server is found to hold.
    answers_held: Ewma,
}

/// How many leading hashes `a` and `b` share (binary search: chained hashes are equal up to
/// some index and different after it).
fn shared(a: &[u64], b: &[u64]) -> usize {
    let (mut low, mut high) = (0, a.len().min(b.len()));
    while low < high {
        let mid = (low + high).div_ceil(2);
        if a[mid - 1] == b[mid - 1] {
            low = mid;
        } else {
            high = mid - 1;
        }
    }
    low
}

impl PrefixIndex {
    /// An empty index of at most `capacity` sequences (clamped to 1..=[`MAX_CAPACITY`]).
    pub fn new(capacity: usize) -> PrefixIndex {
        let capacity = capacity.clamp(1, MAX_CAPACITY);
        PrefixIndex {
            capacity,
            learnt: capacity,
            stored: VecDeque::with_capacity(capacity),
            clock: 0,
            answers_held: Ewma::new(0.5),
        }
    }

    /// How many sequences it believes the server holds (ghosts apart).
    pub fn len(&self) -> usize {
        self.stored.len().min(self.learnt)
    }

    /// Whether it believes the server holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many sequences the server is found to keep (at most its configured capacity).
    pub fn learnt_capacity(&self) -> usize {
        self.learnt
    }

    /// The sequences believed held, newest first.
    fn believed(&self) -> impl Iterator<Item = &Stored> {
        self.stored.iter().take(self.learnt)
    }

    /// The longest prefix of `prompt` a stored sequence shares (and the answer after it).
    pub fn predict(&self, prompt: &Prompt) -> Match {
        let mut segments = 0;
        let mut whole = false;
        // `whole`: a stored sequence of the longest match ends there (its answer may follow).
        for s in self.believed() {
            let n = shared(&s.chain, prompt.chain());
            if n > segments {
                segments = n;
                whole = n == s.chain.len();
            } else if n == segments && n == s.chain.len() {
                whole = true;
            }
        }
        let bytes = prompt.bytes_of(segments);
        let answer_bytes = match whole && segments > 0 && prompt.is_assistant(segments) {
            true => prompt.bytes_of(segments + 1) - bytes,
            false => 0,
        };
        let expected_bytes = bytes + (answer_bytes as f64 * self.answers_held.value()) as u64;
        Match { segments, bytes, answer_bytes, expected_bytes, clock: self.clock }
    }

    /// The fraction of an answer sent back that the server is found to hold.
    pub fn answers_held(&self) -> f64 {
        self.answers_held.value()
    }

    /// After an answer to `prompt` predicted as `predicted`: corrects the index by the server's
    /// report (`reported_cached_tokens` of `prompt_tokens`; see the module's header), then
    /// inserts `prompt`. A server that reports nothing leaves the guess.
    pub fn observe(
        &mut self,
        prompt: &Prompt,
        predicted: Match,
        reported_cached_tokens: Option<u64>,
        prompt_tokens: Option<u64>,
    ) -> Correction {
        let mut correction = Correction::default();
        if let Some(cached) = reported_cached_tokens {
            let per_byte = match prompt_tokens {
                Some(tokens) if tokens > 0 && prompt.bytes() > 0 => tokens as f64 / prompt.bytes() as f64,
                _ => DEFAULT_TOKENS_PER_BYTE,
            };
            let held_bytes = (cached as f64 * (1.0 + TOLERANCE) + SLACK_TOKENS) / per_byte;
            let held = prompt.segments_within(held_bytes);
            // The report is beyond the prediction by more than the tolerance: the server held
            // more than any sequence believed held could give it.
            let beyond = cached as f64 > predicted.bytes as f64 * per_byte * (1.0 + TOLERANCE) + SLACK_TOKENS;
            if predicted.answer_bytes > 0 && held >= predicted.segments {
                let beyond = cached as f64 / per_byte - predicted.bytes as f64;
                self.answers_held.add((beyond / predicted.answer_bytes as f64).clamp(0.0, 1.0));
            }
            correction.reported_segments = Some(held);
            self.learn_capacity(prompt, held, beyond, predicted);
            correction.dropped = self.correct(prompt, held, predicted.clock);
        }
        self.insert(prompt);
        correction
    }

    /// What a report says of how many sequences the server keeps. A sequence believed held
    /// that the report proves gone (it shares more with the prompt than the server held), with
    /// `d` newer sequences before it: the server keeps at most `d` (the newest believed one
    /// judged). A ghost that the report proves held (the server held more than predicted, and
    /// the ghost shares that much), with `d` newer before it: the server keeps at least `d + 1`.
    /// `held`: the segments the report allows (a sequence sharing more is gone); `beyond`: the
    /// report exceeds the prediction by more than its tolerance (only then is a ghost proven
    /// held: a report within it is what the believed sequences give).
    fn learn_capacity(&mut self, prompt: &Prompt, held: usize, beyond: bool, predicted: Match) {
        let judged = |s: &Stored| s.stamp <= predicted.clock;
        if held < predicted.segments {
            let gone = self.believed().position(|s| judged(s) && shared(&s.chain, prompt.chain()) > held);
            if let Some(depth) = gone {
                self.learnt = self.learnt.min(depth.max(1));
            }
        } else if beyond {
            let ghost = self.stored.iter().enumerate().skip(self.learnt).find_map(|(depth, s)| {
                let n = shared(&s.chain, prompt.chain());
                (n > predicted.segments && n <= held).then_some(depth)
            });
            if let Some(depth) = ghost {
                self.learnt = (depth + 1).clamp(self.learnt, self.capacity);
            }
        }
    }

    /// Drops every sequence inserted by `clock` (a prediction's) that shares more than `held` segments with
    /// `prompt`: the server has none of them. Returns how many.
    pub fn correct(&mut self, prompt: &Prompt, held: usize, clock: u64) -> usize {
        let before = self.stored.len();
        self.stored.retain(|s| s.stamp > clock || shared(&s.chain, prompt.chain()) <= held);
        before - self.stored.len()
    }

    /// `prompt` at the front; the sequences it extends (or repeats) go, as the server drops
    /// the stored prefixes of what it inserts; the oldest beyond the capacity go.
    pub fn insert(&mut self, prompt: &Prompt) {
        if prompt.segments() == 0 {
            return;
        }
        self.stored.retain(|s| shared(&s.chain, prompt.chain()) < s.chain.len());
        self.clock += 1;
        self.stored.push_front(Stored { chain: prompt.chain().into(), stamp: self.clock });
        self.stored.truncate(self.capacity);
    }

    /// Forgets everything (the server restarted: its cache is gone; what it was found to keep
    /// stands, the same server with the same settings).
    pub fn clear(&mut self) {
        self.stored.clear();
        self.clock += 1;
    }
}

#[cfg(test)]
mod tests;
