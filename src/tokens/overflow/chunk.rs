//! Chunk plans: the over-long last user message split into pieces, one map request per piece
//! quoting the message's request, and the reduce request over the partial answers
//! ([`ChunkPlan`], built by [`chunk`]); with the piece ranges and the map/reduce prompts' texts.

use std::ops::Range;

use serde_json::Value;

use super::Budget;
use super::cut::{CUT_MARKER, clean_boundary, clean_boundary_forward, clean_within, piece_end};
use super::messages::{is_instruction, role, text_only, user_message};
use crate::tokens::{ChatPrompt, Count, CountError};

/// The overlap between consecutive chunk pieces: at most this many tokens, and at most
/// [`OVERLAP_PERCENT`] of a piece.
pub(super) const MAX_OVERLAP: usize = 64;
const OVERLAP_PERCENT: usize = 5;
/// A chunk plan whose partial answers would get fewer tokens than this is rejected.
pub const MIN_PARTIAL_TOKENS: usize = 32;
/// A chunk piece shorter than this is not worth a request: reject.
const MIN_PIECE_TOKENS: usize = 64;
/// The message's "request" quoted in every map request and in the reduce request: this many
/// tokens from each end of the message (its head and its tail, where a request is usually
/// stated), tried in this order (see [`Split::request`] for the limits).
const REQUEST_SIDE_TOKENS: [usize; 3] = [128, 32, 0];
/// Tokens kept free in the reduce prompt, as a whole and per partial answer: a model's answer
/// re-tokenized inside a prompt can merge differently from how it was generated.
const REDUCE_SLACK: usize = 16;
const PARTIAL_SLACK: usize = 4;
/// The widest "Part i of P" label the map framing is measured with (digits tokenize one by
/// one in the Qwen vocabulary, so this bounds any real label).
const WIDEST_PART_LABEL: usize = 9999;

/// A map-reduce over the pieces of an over-long last user message.
///
/// The message's "request" is quoted whole in every request: its first and its last tokens
/// (up to 128 each, fewer when the cap is small, never the whole message), where a request such
/// as a trailing `QUESTION: …` is stated.
///
/// Map requests carry the system/developer messages and one user message, "The request: <head>
/// … <tail>" then "Part i of P of the text it refers to: <piece>", without the client's
/// `tools` (a partial answer must be text) and with its `chat_template_kwargs`; the earlier
/// conversation is not sent. The reduce request carries the system/developer messages (always),
/// the most recent earlier turns that fit in a quarter of its room (newest first, whole turns
/// from a user message to the next, so tool calls keep their answers; dropped when the plan
/// would not fit with them), the client's `tools` and kwargs, and one user message with the
/// request and the partial answers labelled by part, built by [`ChunkPlan::reduce_messages`].
/// Every map prompt fits with `map_max_tokens`, and the reduce prompt with partial answers of
/// `map_max_tokens` each fits with `reduce_max_tokens` (≥ [`Budget::reserve`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkPlan {
    /// One map request per piece, in order.
    pub pieces: Vec<Piece>,
    /// `max_tokens` for each map request: the reduce prompt with every partial answer this long
    /// still fits with `reduce_max_tokens`.
    pub map_max_tokens: usize,
    /// `max_tokens` for the reduce request: the room left, at most the client's.
    pub reduce_max_tokens: usize,
    /// Whether `reduce_max_tokens` is less than the client's `max_tokens` (the header says so).
    pub max_tokens_cut: bool,
    /// Tokens of the original message that was split.
    pub message_tokens: usize,
    /// The reduce request's messages before its user message: the system/developer messages and
    /// the earlier turns kept.
    pub(super) reduce_context: Vec<Value>,
    /// The quoted request (head and tail of the message around [`CUT_MARKER`]), or empty.
    pub(super) request: String,
}

/// One piece of the split message and its map request.
#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    /// The map request's messages: the system/developer messages, then a user message with the
    /// request and the piece.
    pub messages: Vec<Value>,
    /// The piece's text (the decoded tokens).
    pub text: String,
    /// Which tokens of the original message's text this piece holds; consecutive pieces
    /// overlap by a few tokens.
    pub tokens: Range<usize>,
    /// The map request's prompt tokens as counted.
    pub prompt_tokens: usize,
}

impl ChunkPlan {
    /// The reduce request's messages for these partial answers (one per piece, in order).
    pub fn reduce_messages(&self, partials: &[String]) -> Vec<Value> {
        let mut messages = self.reduce_context.clone();
        messages.push(user_message(reduce_text(&self.request, self.pieces.len(), partials)));
        messages
    }

    /// How many map requests the plan makes.
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Whether the plan has no piece (never true for a plan from [`plan_chat`](super::plan_chat)).
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }
}

/// `None` when chunk does not apply (middle-out does); `Some(None)` when it applies but no
/// plan fits (reject).
///
/// Plans are tried in this order until one fits: the request quoted with
/// [`REQUEST_SIDE_TOKENS`] tokens from each end of the message, first with the earlier turns in
/// the reduce request and then without them, each size in turn.
pub(super) fn chunk(
    counter: &dyn Count,
    prompt: ChatPrompt<'_>,
    budget: Budget,
) -> Result<Option<Option<ChunkPlan>>, CountError> {
    let Some(last) = prompt.messages.last().filter(|m| role(m) == "user") else {
        return Ok(None);
    };
    let Some(text) = text_only(last) else {
        return Ok(None);
    };
    let instructions: Vec<Value> = prompt.messages.iter().filter(|m| is_instruction(m)).cloned().collect();
    let ids = counter.encode(&text);
    let mut alone = instructions.clone();
    alone.push(user_message(String::new()));
    let instructions_tokens = counter.chat_tokens(ChatPrompt { messages: &alone, ..prompt })?;
    if instructions_tokens.saturating_add(ids.len()) <= budget.prompt_limit() {
        return Ok(None);
    }
    let split = Split { counter, prompt, budget, instructions, ids };
    for side in REQUEST_SIDE_TOKENS {
        let request = split.request(side);
        let context = split.reduce_context(&request)?;
        if let Some(plan) = split.plan(&request, &context)? {
            return Ok(Some(Some(plan)));
        }
        let had_turns = context.len() > split.instructions.len();
        if had_turns && let Some(plan) = split.plan(&request, &split.instructions)? {
            return Ok(Some(Some(plan)));
        }
    }
    Ok(Some(None))
}

/// The pieces of one message being planned.
struct Split<'a> {
    counter: &'a dyn Count,
    prompt: ChatPrompt<'a>,
    budget: Budget,
    /// The system/developer messages, in order.
    instructions: Vec<Value>,
    /// The over-long last user message's tokens.
    ids: Vec<u32>,
}

impl Split<'_> {
    /// The message's request: its first and its last `side` tokens around [`CUT_MARKER`]; less
    /// when the budget is small (each end at most an eighth of the room left by the reserve, so
    /// the whole quote at most a quarter), never more than a quarter of the message per end (so
    /// never the whole message). Empty when that leaves nothing.
    fn request(&self, side: usize) -> String {
        let side = side.min(self.budget.prompt_limit() / 8).min(self.ids.len() / 4);
        if side == 0 {
            return String::new();
        }
        let head_end = clean_boundary(self.counter, &self.ids, side, 0);
        let tail_start = clean_boundary_forward(self.counter, &self.ids, self.ids.len() - side).max(head_end);
        format!(
            "{}{CUT_MARKER}{}",
            self.counter.decode(&self.ids[..head_end]),
            self.counter.decode(&self.ids[tail_start..])
        )
    }

    /// The messages the reduce request puts before its user message: the system/developer
    /// messages, and the most recent earlier turns that fit in a quarter of the reduce prompt's
    /// room (whole turns, each from a user message up to the next one, so tool calls keep their
    /// answers), in their original order.
    fn reduce_context(&self, request: &str) -> Result<Vec<Value>, CountError> {
        let earlier = &self.prompt.messages[..self.prompt.messages.len() - 1];
        let starts = turn_starts(earlier);
        if starts.is_empty() {
            return Ok(self.instructions.clone());
        }
        let base = self.reduce_tokens(&self.instructions, request, 2)?;
        let room =
            self.budget.cap.saturating_sub(self.budget.reserve().saturating_add(base).saturating_add(REDUCE_SLACK));
        let history_limit = room / 4;
        // Binary search for the oldest start that fits: an older start only adds messages.
        let (mut fits, mut over) = (starts.len(), 0);
        while over < fits {
            let middle = over + (fits - over) / 2;
            let tokens = self.reduce_tokens(&context_from(earlier, starts[middle]), request, 2)?;
            if tokens.saturating_sub(base) <= history_limit {
                fits = middle;
            } else {
                over = middle + 1;
            }
        }
        Ok(match starts.get(fits) {
            Some(&start) => context_from(earlier, start),
            None => self.instructions.clone(),
        })
    }

    /// A plan quoting `request` in every map request and in the reduce request, whose reduce
    /// request starts with `context`, or `None` when it does not fit.
    fn plan(&self, request: &str, context: &[Value]) -> Result<Option<ChunkPlan>, CountError> {
        let cap = self.budget.cap;
        let reserve = self.budget.reserve();
        let framing_tokens = self.map_tokens(&map_text(request, WIDEST_PART_LABEL, WIDEST_PART_LABEL, ""))?;
        let Some(mut room) = cap.checked_sub(framing_tokens) else {
            return Ok(None);
        };
        let mut parts = 2;
        // `parts` only grows and `room` only shrinks: the loop ends.
        for _ in 0..256 {
            let reduce_base = self.reduce_tokens(context, request, parts)?;
            let Some(answers) = cap.checked_sub(reserve.saturating_add(reduce_base).saturating_add(REDUCE_SLACK))
            else {
                return Ok(None);
            };
            let map_max = (answers / parts).saturating_sub(PARTIAL_SLACK).min(room / 4);
            if map_max < MIN_PARTIAL_TOKENS || room - map_max < MIN_PIECE_TOKENS {
                return Ok(None);
            }
            let piece_tokens = room - map_max;
            let overlap = MAX_OVERLAP.min(piece_tokens * OVERLAP_PERCENT / 100);
            let ranges = piece_ranges(self.counter, &self.ids, piece_tokens, overlap);
            if ranges.len() > parts {
                parts = ranges.len();
                continue;
            }
            let pieces = self.pieces(request, &ranges)?;
            let over = pieces
                .iter()
                .map(|piece| piece.prompt_tokens.saturating_add(map_max).saturating_sub(cap))
                .max()
                .unwrap_or(0);
            if over > 0 {
                room -= over.min(room);
                continue;
            }
            // `parts * (map_max + PARTIAL_SLACK) <= answers`: the reduce keeps the reserve.
            let room_left = cap.saturating_sub(reduce_base + REDUCE_SLACK + parts * (map_max + PARTIAL_SLACK)).max(1);
            let reduce_max_tokens = room_left.min(self.budget.max_tokens.unwrap_or(usize::MAX));
            return Ok(Some(ChunkPlan {
                pieces,
                map_max_tokens: map_max,
                reduce_max_tokens,
                max_tokens_cut: self.budget.max_tokens.is_some_and(|max| reduce_max_tokens < max),
                message_tokens: self.ids.len(),
                reduce_context: context.to_vec(),
                request: request.to_string(),
            }));
        }
        Ok(None)
    }

    fn pieces(&self, request: &str, ranges: &[Range<usize>]) -> Result<Vec<Piece>, CountError> {
        let total = ranges.len();
        ranges
            .iter()
            .enumerate()
            .map(|(index, range)| {
                let text = self.counter.decode(&self.ids[range.clone()]);
                let mut messages = self.instructions.clone();
                messages.push(user_message(map_text(request, index + 1, total, &text)));
                let prompt_tokens = self.counter.chat_tokens(ChatPrompt {
                    messages: &messages,
                    tools: None,
                    template_kwargs: self.prompt.template_kwargs,
                })?;
                Ok(Piece { messages, text, tokens: range.clone(), prompt_tokens })
            })
            .collect()
    }

    /// Tokens of a map prompt whose user message is `text` (no tools).
    fn map_tokens(&self, text: &str) -> Result<usize, CountError> {
        let mut messages = self.instructions.clone();
        messages.push(user_message(text.to_string()));
        self.counter.chat_tokens(ChatPrompt {
            messages: &messages,
            tools: None,
            template_kwargs: self.prompt.template_kwargs,
        })
    }

    /// Tokens of a reduce prompt after `context` with `parts` empty partial answers (with the
    /// client's tools).
    fn reduce_tokens(&self, context: &[Value], request: &str, parts: usize) -> Result<usize, CountError> {
        let mut messages = context.to_vec();
        messages.push(user_message(reduce_text(request, parts, &vec![String::new(); parts])));
        self.counter.chat_tokens(ChatPrompt { messages: &messages, ..self.prompt })
    }
}

/// Where the turns of an earlier conversation may start, oldest first: each user message whose
/// following messages do not answer a tool call made before it.
fn turn_starts(earlier: &[Value]) -> Vec<usize> {
    (0..earlier.len())
        .filter(|&start| role(&earlier[start]) == "user")
        .filter(|&start| {
            let after = earlier[start + 1..].iter().map(role).filter(|r| !matches!(*r, "system" | "developer"));
            after.take_while(|r| *r != "assistant").all(|r| r != "tool")
        })
        .collect()
}

/// The system/developer messages of `earlier` and its messages from `start` on, in order.
fn context_from(earlier: &[Value], start: usize) -> Vec<Value> {
    earlier
        .iter()
        .enumerate()
        .filter(|(index, m)| *index >= start || is_instruction(m))
        .map(|(_, m)| m.clone())
        .collect()
}

/// The user message of map request `index` (from 1) of `total`: the request, then the piece.
fn map_text(request: &str, index: usize, total: usize, piece: &str) -> String {
    if request.is_empty() {
        return format!(
            "Part {index} of {total} of a long message. Answer the message's request about this part \
             only; you will not see the other parts.\n\n{piece}"
        );
    }
    format!(
        "A long message was split into {total} parts. Answer its request about part {index} only; \
         you will not see the other parts.\n\nThe request (the message's beginning and end): \
         {request}\n\nPart {index} of {total} of the text it refers to:\n{piece}"
    )
}

/// The user message of the reduce request: the request, then the partial answers by part.
fn reduce_text(request: &str, total: usize, partials: &[String]) -> String {
    let mut text = format!("A long message was split into {total} parts, and each part was answered on its own.");
    if !request.is_empty() {
        text.push_str("\n\nThe request (the message's beginning and end): ");
        text.push_str(request);
    }
    text.push_str("\n\nThe answers for each part:");
    for (index, partial) in partials.iter().enumerate() {
        text.push_str(&format!("\n\n[Part {} of {total}]\n{partial}", index + 1));
    }
    text.push_str(
        "\n\nUsing these partial answers, answer the request of the long message as if you had \
         read it whole.",
    );
    text
}

/// Token ranges of at most `piece_tokens` tokens covering `ids`, consecutive ones overlapping
/// by about `overlap` tokens, cut on character boundaries where the tokenizer allows it.
pub(super) fn piece_ranges(counter: &dyn Count, ids: &[u32], piece_tokens: usize, overlap: usize) -> Vec<Range<usize>> {
    let mut ranges = Vec::new();
    let mut start = 0;
    loop {
        let end = piece_end(counter, ids, start, piece_tokens);
        ranges.push(start..end);
        if end >= ids.len() {
            return ranges;
        }
        // The next piece starts `overlap` tokens back, a little more or less to start clean.
        let at = end.saturating_sub(overlap).max(start + 1);
        start = clean_within(counter, ids, at, start + 1..=end);
    }
}
