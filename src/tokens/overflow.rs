//! Plans for a prompt over a backend's context cap: fits as it is, reject, middle-out (drop
//! middle messages, then cut the middle of the longest text) or chunk (map the over-long last
//! user message in pieces, then reduce the partial answers). Pure: the HTTP handler counts
//! nothing itself and carries the plan out (the map requests go through the same queue).
//!
//! Costs: a full `chat_tokens` count renders the template and tokenizes the whole prompt
//! (~20 ms for 53k tokens), so the planners work from per-message estimates (each text encoded
//! once) and verify with one full count at the end, looping only when the verification says
//! the prompt still does not fit.
//!
//! Numbers from the client (`max_tokens`, up to `u64::MAX`) are only ever added with checked or
//! saturating arithmetic: a sum that overflows is over any cap.

use std::ops::{Range, RangeInclusive};

use serde_json::{Value, json};

use super::{ChatPrompt, Count, CountError, OnOverflow};

/// The marker put where the middle of a text was cut.
pub const CUT_MARKER: &str = "\n…\n";
/// Tokens a truncated text keeps at least (head and tail together); a shorter one is not cut.
const MIN_KEPT_TOKENS: usize = 32;
/// Full counts a middle-out may spend verifying before it gives up (reject).
const MAX_VERIFICATIONS: usize = 4;
/// Room a transform makes for the answer: at most this, and at most a quarter of the cap (see
/// [`Budget::reserve`]).
const DEFAULT_ROOM: usize = 1024;
/// The overlap between consecutive chunk pieces: at most this many tokens, and at most
/// [`OVERLAP_PERCENT`] of a piece.
const MAX_OVERLAP: usize = 64;
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
/// How many tokens a cut may move to land on a character boundary.
const MAX_BOUNDARY_SHIFT: usize = 4;

/// The tokens a request may use: the backend's cap, what the client asked to generate and the
/// least room for an answer that makes a prompt worth sending.
///
/// A prompt under the cap is never refused for its `max_tokens`: when prompt + `max_tokens` is
/// over the cap, the answer gets the room left ([`Budget::fitting`]). Only a prompt that leaves
/// less than [`Budget::needed`] is over the cap, and goes to the model's `on_overflow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The backend's context cap (prompt + generated tokens).
    pub cap: usize,
    /// The client's `max_tokens` / `max_completion_tokens`; `None` when not given.
    pub max_tokens: Option<usize>,
    /// The model's `min_room`: the least room a prompt must leave for its answer (a client that
    /// asked for fewer tokens needs only those). Used as at most half the cap, at least 1.
    pub min_room: usize,
}

/// What a refusal reports, in OpenAI's two wordings: "your messages resulted in N tokens" (the
/// prompt alone is over the cap) or "you requested N tokens (P in the messages, C in the
/// completion)".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requested {
    /// The prompt's tokens.
    pub prompt: usize,
    /// The completion counted with the prompt: `None` when the prompt alone is over the cap;
    /// else the client's `max_tokens`, or when it gave none the room the gateway keeps.
    pub completion: Option<usize>,
}

impl Requested {
    /// Prompt and completion together, saturating.
    pub fn total(&self) -> usize {
        self.prompt.saturating_add(self.completion.unwrap_or(0))
    }
}

impl Budget {
    /// The least room a prompt must leave for its answer: the model's `min_room` (at most half
    /// the cap), or the client's `max_tokens` when smaller; at least 1.
    pub fn needed(&self) -> usize {
        let min_room = self.min_room.min(self.cap / 2);
        min_room.min(self.max_tokens.unwrap_or(usize::MAX)).max(1)
    }

    /// The room a transform (middle-out, chunk) makes for the answer: what the answer is likely
    /// to need, not what the client allowed (agents send `max_tokens: 32000` on a 32k model,
    /// which would leave nothing of the prompt): `min(1024, cap / 4)`, at least
    /// [`Budget::needed`], at most the client's `max_tokens`.
    pub fn reserve(&self) -> usize {
        let target = DEFAULT_ROOM.min(self.cap / 4).max(self.needed());
        target.min(self.max_tokens.unwrap_or(usize::MAX))
    }

    /// The largest prompt a transform may produce.
    fn prompt_limit(&self) -> usize {
        self.cap.saturating_sub(self.reserve())
    }

    /// The `max_tokens` to send with a prompt of `prompt_tokens` as it is, or `None` when it is
    /// over the cap (it leaves less than [`Budget::needed`]). The client's `max_tokens` when
    /// prompt + `max_tokens` fits (computed without overflow: a client may send `u64::MAX`), else
    /// the room left; without `max_tokens`, the room left (the handler caps it by the model's
    /// default).
    pub fn fitting(&self, prompt_tokens: usize) -> Option<usize> {
        let room = self.cap.checked_sub(prompt_tokens)?;
        match self.max_tokens {
            Some(max) if max <= room => Some(max),
            _ => (room >= self.needed()).then_some(room),
        }
    }

    /// What a rejection of a prompt of `prompt_tokens` reports.
    pub fn requested(&self, prompt_tokens: usize) -> Requested {
        let completion = (prompt_tokens <= self.cap).then(|| self.max_tokens.unwrap_or_else(|| self.needed()));
        Requested { prompt: prompt_tokens, completion }
    }

    /// The `max_tokens` to send after a transform left a prompt of `prompt_tokens`: the room
    /// left, at most the client's `max_tokens`.
    fn after_transform(&self, prompt_tokens: usize) -> usize {
        let room = self.cap.saturating_sub(prompt_tokens).max(1);
        room.min(self.max_tokens.unwrap_or(usize::MAX))
    }
}

/// What to do with a chat request.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatPlan {
    /// Send it as it is, with this `max_tokens` (when the client gave none: the room left).
    Fits { prompt_tokens: usize, max_tokens: usize },
    /// 400 `context_length_exceeded`, reporting what was requested.
    Reject(Requested),
    /// Send these messages instead (middle-out), with this `max_tokens`.
    MiddleOut {
        messages: Vec<Value>,
        prompt_tokens: usize,
        /// Original prompt tokens − `prompt_tokens` (the header's `removed_tokens`).
        removed_tokens: usize,
        max_tokens: usize,
    },
    /// Map each piece, then reduce the partial answers.
    Chunk(ChunkPlan),
}

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
    reduce_context: Vec<Value>,
    /// The quoted request (head and tail of the message around [`CUT_MARKER`]), or empty.
    request: String,
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

    /// Whether the plan has no piece (never true for a plan from [`plan_chat`]).
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }
}

/// What to do with a `/v1/completions` text prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextPlan {
    /// Send it as it is, with this `max_tokens`.
    Fits { prompt_tokens: usize, max_tokens: usize },
    /// 400 `context_length_exceeded` (see [`ChatPlan::Reject`]).
    Reject(Requested),
    /// Send this text instead: the head and tail of the prompt around [`CUT_MARKER`].
    MiddleOut { text: String, prompt_tokens: usize, removed_tokens: usize, max_tokens: usize },
}

/// Decides what to do with a chat prompt under `budget`.
///
/// - fits ([`Budget::fitting`]): [`ChatPlan::Fits`], whatever the action. The client's
///   `max_tokens` when prompt + `max_tokens` ≤ cap, else the room left — as long as the prompt
///   leaves [`Budget::needed`] (the model's `min_room`): a prompt is never refused or cut for
///   its `max_tokens` alone.
/// - over the cap (less room left than that), by the action:
/// - `reject`: [`ChatPlan::Reject`].
/// - `middle_out`: keep system/developer messages, the first user message, the last user
///   message (the latest instruction) and the last message; remove the others oldest first in
///   groups (an assistant message with the tool answers and user messages that follow it, so a
///   tool answer never loses its call and user/assistant alternation holds as long as
///   possible); then cut the middle of the longest text (never a system/developer message's,
///   never an image part) until the prompt fits with [`Budget::reserve`] left. A small excess
///   is cut before anything is removed: when it is at most a quarter of the longest cuttable
///   text, that text's middle is cut first. The last user message's texts are cut only as a
///   last resort, when no other text can be cut any more. Reject when even that does not fit.
/// - `chunk`: when the last message is a text-only user message that does not fit even with
///   the system/developer messages alone, a [`ChunkPlan`]; otherwise as `middle_out` (the
///   earlier conversation is what overflows, and the request itself survives middle-out).
pub fn plan_chat(
    counter: &dyn Count,
    prompt: ChatPrompt<'_>,
    budget: Budget,
    action: OnOverflow,
) -> Result<ChatPlan, CountError> {
    let prompt_tokens = counter.chat_tokens(prompt)?;
    if let Some(max_tokens) = budget.fitting(prompt_tokens) {
        return Ok(ChatPlan::Fits { prompt_tokens, max_tokens });
    }
    let transformed = match action {
        OnOverflow::Reject => None,
        OnOverflow::MiddleOut => middle_out(counter, prompt, budget, prompt_tokens)?,
        OnOverflow::Chunk => match chunk(counter, prompt, budget)? {
            Some(plan) => plan.map(ChatPlan::Chunk),
            None => middle_out(counter, prompt, budget, prompt_tokens)?,
        },
    };
    Ok(transformed.unwrap_or(ChatPlan::Reject(budget.requested(prompt_tokens))))
}

/// Decides what to do with a `/v1/completions` text prompt under `budget`.
///
/// `chunk` has no meaning for a text to be continued (a continuation of each piece is not a
/// continuation of the whole), so a `chunk` model middle-outs completion prompts: the head and
/// the tail, which the continuation depends on most, are kept. `reject` rejects. A prompt that
/// leaves [`Budget::needed`] fits as it is, with its `max_tokens` cut to the room left.
pub fn plan_text(counter: &dyn Count, text: &str, budget: Budget, action: OnOverflow) -> TextPlan {
    let prompt_tokens = counter.text_tokens(text);
    if let Some(max_tokens) = budget.fitting(prompt_tokens) {
        return TextPlan::Fits { prompt_tokens, max_tokens };
    }
    let transformed = match action {
        OnOverflow::Reject => None,
        OnOverflow::MiddleOut | OnOverflow::Chunk => middle_out_text(counter, text, budget, prompt_tokens),
    };
    transformed.unwrap_or(TextPlan::Reject(budget.requested(prompt_tokens)))
}

/// Splits an embedding input into pieces at token boundaries, each fitting `cap` as the server
/// counts it (special tokens included), without overlap. Returns each piece's text with its
/// token count (tokens of the text, no special tokens: the weights for
/// [`average_embeddings`]). A text that fits is returned whole; a cap no larger than the
/// special tokens gives one-token pieces (nothing can fit).
pub fn split_for_embedding(counter: &dyn Count, text: &str, cap: usize) -> Vec<(String, usize)> {
    let ids = counter.encode(text);
    let special = counter.text_tokens(text).saturating_sub(ids.len());
    if ids.len() + special <= cap {
        return vec![(text.to_string(), ids.len())];
    }
    let mut pieces = Vec::new();
    let mut start = 0;
    while start < ids.len() {
        let mut len = cap.saturating_sub(special).max(1);
        loop {
            let end = piece_end(counter, &ids, start, len);
            let piece = counter.decode(&ids[start..end]);
            let over = counter.text_tokens(&piece).saturating_sub(cap);
            if over == 0 || end - start == 1 {
                pieces.push((piece, end - start));
                start = end;
                break;
            }
            len = (end - start).saturating_sub(over).max(1);
        }
    }
    pieces
}

/// The embedding of a split input: the mean of its pieces' vectors weighted by their tokens
/// (equal weights when every weight is 0). When every piece is unit length (OpenAI-style
/// embeddings are) the mean is re-normalised to unit length, so it stays comparable by dot
/// product; otherwise it is the plain weighted mean. All vectors come from one model and have
/// one length; an empty input gives an empty vector.
pub fn average_embeddings(pieces: &[(Vec<f32>, usize)]) -> Vec<f32> {
    let Some((first, _)) = pieces.first() else {
        return Vec::new();
    };
    let total: usize = pieces.iter().map(|(_, tokens)| tokens).sum();
    let weight = |tokens: usize| {
        if total == 0 { 1.0 / pieces.len() as f64 } else { tokens as f64 / total as f64 }
    };
    let mut mean = vec![0f64; first.len()];
    for (vector, tokens) in pieces {
        for (sum, value) in mean.iter_mut().zip(vector) {
            *sum += f64::from(*value) * weight(*tokens);
        }
    }
    let all_unit = pieces.iter().all(|(vector, _)| (norm(vector.iter().map(|v| f64::from(*v))) - 1.0).abs() < 1e-3);
    let length = norm(mean.iter().copied());
    if all_unit && length > 0.0 {
        mean.iter_mut().for_each(|v| *v /= length);
    }
    mean.into_iter().map(|v| v as f32).collect()
}

fn norm(values: impl Iterator<Item = f64>) -> f64 {
    values.map(|v| v * v).sum::<f64>().sqrt()
}

// ---------------------------------------------------------------------------------------------
// Middle-out over a chat prompt.

/// Middle-out: `Some((messages, prompt tokens))` fitting `budget.prompt_limit()`, or `None`
/// when it can not fit.
fn middle_out(
    counter: &dyn Count,
    prompt: ChatPrompt<'_>,
    budget: Budget,
    prompt_tokens: usize,
) -> Result<Option<ChatPlan>, CountError> {
    let limit = budget.prompt_limit();
    let mut conversation = Conversation::new(counter, prompt.messages);
    let mut excess = prompt_tokens.saturating_sub(limit);
    for _ in 0..MAX_VERIFICATIONS {
        if conversation.cut_first(excess) {
            excess = conversation.cut_longest(counter, excess, false);
        }
        excess = conversation.remove_middle(excess);
        excess = conversation.cut_longest(counter, excess, true);
        if excess > 0 {
            return Ok(None);
        }
        let messages = conversation.kept();
        let counted = counter.chat_tokens(ChatPrompt { messages: &messages, ..prompt })?;
        if counted <= limit {
            return Ok(Some(ChatPlan::MiddleOut {
                messages,
                prompt_tokens: counted,
                removed_tokens: prompt_tokens.saturating_sub(counted),
                max_tokens: budget.after_transform(counted),
            }));
        }
        excess = counted - limit;
    }
    Ok(None)
}

/// A conversation being middle-outed: which messages are kept, and per-message estimates.
struct Conversation {
    messages: Vec<Value>,
    kept: Vec<bool>,
    /// Removable groups of message indexes, oldest first; `next_group` is the next to go.
    groups: Vec<Vec<usize>>,
    next_group: usize,
    /// Estimated tokens of each message's text and tool calls (template overhead not counted,
    /// so removals save at least this much).
    estimate: Vec<usize>,
    texts: Vec<TextSegment>,
}

/// One text of a message (its string content or one text part) that may be cut.
struct TextSegment {
    message: usize,
    part: Option<usize>,
    ids: Vec<u32>,
    /// Current tokens of the (possibly cut) text.
    tokens: usize,
    /// Tokens of `ids` currently kept (head + tail); `ids.len()` when uncut.
    kept: usize,
    /// System/developer texts are never cut; nor one that no longer shrinks.
    cuttable: bool,
    /// A text of the last user message: cut only when no other text can be.
    last_resort: bool,
}

impl Conversation {
    fn new(counter: &dyn Count, messages: &[Value]) -> Self {
        let protected = protected_messages(messages);
        let last_user = last_user(messages);
        let groups = removal_groups(messages, &protected);
        let mut estimate = Vec::with_capacity(messages.len());
        let mut texts = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            let mut tokens = tool_call_text(message).map_or(0, |calls| counter.encode(&calls).len());
            for (part, text) in text_segments(message) {
                let ids = counter.encode(text);
                tokens += ids.len();
                texts.push(TextSegment {
                    message: index,
                    part,
                    tokens: ids.len(),
                    kept: ids.len(),
                    ids,
                    cuttable: !is_instruction(message),
                    last_resort: Some(index) == last_user,
                });
            }
            estimate.push(tokens);
        }
        Conversation {
            messages: messages.to_vec(),
            kept: vec![true; messages.len()],
            groups,
            next_group: 0,
            estimate,
            texts,
        }
    }

    /// Removes groups oldest first until the estimated excess is gone; returns what is left.
    fn remove_middle(&mut self, mut excess: usize) -> usize {
        while excess > 0 && self.next_group < self.groups.len() {
            for &index in &self.groups[self.next_group] {
                self.kept[index] = false;
                excess = excess.saturating_sub(self.estimate[index]);
            }
            self.next_group += 1;
        }
        excess
    }

    /// Whether an estimated `excess` is small enough to cut from the longest text (other than
    /// the last user message's) rather than remove whole groups: at most a quarter of it.
    fn cut_first(&self, excess: usize) -> bool {
        let longest = self
            .texts
            .iter()
            .filter(|text| text.cuttable && !text.last_resort && self.kept[text.message])
            .map(|text| text.tokens)
            .max();
        longest.is_some_and(|tokens| excess > 0 && excess.saturating_mul(4) <= tokens)
    }

    /// Cuts the middle of the longest kept text, again and again, until the estimated excess is
    /// gone or nothing can be cut; returns what is left. The last user message's texts come
    /// after every other text, and only when `last_resort` allows them.
    fn cut_longest(&mut self, counter: &dyn Count, mut excess: usize, last_resort: bool) -> usize {
        let marker_tokens = counter.encode(CUT_MARKER).len();
        while excess > 0 {
            let Some(longest) = self
                .texts
                .iter_mut()
                .filter(|text| text.cuttable && self.kept[text.message] && (last_resort || !text.last_resort))
                .max_by_key(|text| (!text.last_resort, text.tokens))
            else {
                return excess;
            };
            let keep = longest.kept.saturating_sub(excess.saturating_add(marker_tokens)).max(MIN_KEPT_TOKENS);
            if keep >= longest.kept {
                longest.cuttable = false;
                continue;
            }
            let (text, kept) = cut_middle(counter, &longest.ids, keep);
            let tokens = counter.encode(&text).len();
            if tokens >= longest.tokens {
                longest.cuttable = false;
                continue;
            }
            let saved = longest.tokens - tokens;
            set_text(&mut self.messages[longest.message], longest.part, text);
            self.estimate[longest.message] -= saved;
            longest.tokens = tokens;
            longest.kept = kept;
            excess = excess.saturating_sub(saved);
        }
        excess
    }

    fn kept(&self) -> Vec<Value> {
        self.messages.iter().zip(&self.kept).filter(|(_, kept)| **kept).map(|(message, _)| message.clone()).collect()
    }
}

/// Messages middle-out never removes: system/developer messages, the first user message, the
/// last user message (the latest instruction) and the last message.
fn protected_messages(messages: &[Value]) -> Vec<bool> {
    let first_user = messages.iter().position(|m| role(m) == "user");
    let last_user = last_user(messages);
    (0..messages.len())
        .map(|i| {
            is_instruction(&messages[i]) || Some(i) == first_user || Some(i) == last_user || i + 1 == messages.len()
        })
        .collect()
}

/// The index of the last user message.
fn last_user(messages: &[Value]) -> Option<usize> {
    messages.iter().rposition(|m| role(m) == "user")
}

/// The groups middle-out removes, oldest first. A group starts at each assistant message and
/// takes the tool answers and user messages that follow it up to the next assistant message,
/// so a tool answer goes with its call and user/assistant alternation holds. A protected
/// message other than a tool answer starts a group of its own and ends it; a group holding
/// a protected message (a last message that is a tool answer) is not removable. System and
/// developer messages belong to no group.
fn removal_groups(messages: &[Value], protected: &[bool]) -> Vec<Vec<usize>> {
    let mut groups = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut current_protected = false;
    for (index, message) in messages.iter().enumerate() {
        if is_instruction(message) {
            continue;
        }
        let joins = match role(message) {
            "tool" => !current.is_empty(),
            "assistant" => false,
            _ => !current.is_empty() && !current_protected && !protected[index],
        };
        if !joins {
            if !current.is_empty() && !current_protected {
                groups.push(std::mem::take(&mut current));
            }
            current.clear();
            current_protected = false;
        }
        current.push(index);
        current_protected |= protected[index];
    }
    if !current.is_empty() && !current_protected {
        groups.push(current);
    }
    groups
}

// ---------------------------------------------------------------------------------------------
// Middle-out over a text prompt.

fn middle_out_text(counter: &dyn Count, text: &str, budget: Budget, prompt_tokens: usize) -> Option<TextPlan> {
    let limit = budget.prompt_limit();
    let ids = counter.encode(text);
    let special = prompt_tokens.saturating_sub(ids.len());
    let marker_tokens = counter.encode(CUT_MARKER).len();
    let mut keep = limit.checked_sub(special + marker_tokens)?;
    for _ in 0..MAX_VERIFICATIONS {
        if keep < MIN_KEPT_TOKENS.min(ids.len()) {
            return None;
        }
        let (cut, _) = cut_middle(counter, &ids, keep);
        let counted = counter.text_tokens(&cut);
        if counted <= limit {
            return Some(TextPlan::MiddleOut {
                text: cut,
                prompt_tokens: counted,
                removed_tokens: prompt_tokens.saturating_sub(counted),
                max_tokens: budget.after_transform(counted),
            });
        }
        keep = keep.checked_sub(counted - limit)?;
    }
    None
}

// ---------------------------------------------------------------------------------------------
// Chunk.

/// `None` when chunk does not apply (middle-out does); `Some(None)` when it applies but no
/// plan fits (reject).
///
/// Plans are tried in this order until one fits: the request quoted with
/// [`REQUEST_SIDE_TOKENS`] tokens from each end of the message, first with the earlier turns in
/// the reduce request and then without them, each size in turn.
fn chunk(counter: &dyn Count, prompt: ChatPrompt<'_>, budget: Budget) -> Result<Option<Option<ChunkPlan>>, CountError> {
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
fn piece_ranges(counter: &dyn Count, ids: &[u32], piece_tokens: usize, overlap: usize) -> Vec<Range<usize>> {
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

/// The end of a piece starting at `start` of at most `len` tokens (at least one).
fn piece_end(counter: &dyn Count, ids: &[u32], start: usize, len: usize) -> usize {
    let end = (start + len.max(1)).min(ids.len());
    if end == ids.len() { end } else { clean_boundary(counter, ids, end, start + 1) }
}

// ---------------------------------------------------------------------------------------------
// Cutting text at token boundaries.

/// The text of `ids` keeping about `keep` tokens, head and tail, around [`CUT_MARKER`], and
/// how many tokens it kept.
fn cut_middle(counter: &dyn Count, ids: &[u32], keep: usize) -> (String, usize) {
    if keep >= ids.len() {
        return (counter.decode(ids), ids.len());
    }
    let head = clean_boundary(counter, ids, keep / 2, 0);
    let tail_start = clean_boundary_forward(counter, ids, ids.len() - (keep - keep / 2));
    let text = format!("{}{CUT_MARKER}{}", counter.decode(&ids[..head]), counter.decode(&ids[tail_start..]));
    (text, head + ids.len() - tail_start)
}

/// `at`, or up to [`MAX_BOUNDARY_SHIFT`] tokens before it (not below `floor`), where the text
/// splits cleanly: decoding both sides apart gives the same text as decoding them together (a
/// byte-level BPE token may hold half a character).
fn clean_boundary(counter: &dyn Count, ids: &[u32], at: usize, floor: usize) -> usize {
    clean_within(counter, ids, at, floor..=at)
}

/// The clean boundary nearest `at` within `allowed` (at most [`MAX_BOUNDARY_SHIFT`] away,
/// earlier first on a tie); `at` when there is none.
fn clean_within(counter: &dyn Count, ids: &[u32], at: usize, allowed: RangeInclusive<usize>) -> usize {
    (0..=MAX_BOUNDARY_SHIFT)
        .flat_map(|shift| [at.checked_sub(shift), at.checked_add(shift)])
        .flatten()
        .filter(|b| allowed.contains(b))
        .find(|b| splits_cleanly(counter, ids, *b))
        .unwrap_or(at)
}

/// Like [`clean_boundary`], moving forward.
fn clean_boundary_forward(counter: &dyn Count, ids: &[u32], at: usize) -> usize {
    (0..=MAX_BOUNDARY_SHIFT)
        .map(|shift| at + shift)
        .take_while(|b| *b <= ids.len())
        .find(|b| splits_cleanly(counter, ids, *b))
        .unwrap_or(at)
}

fn splits_cleanly(counter: &dyn Count, ids: &[u32], at: usize) -> bool {
    if at == 0 || at >= ids.len() {
        return true;
    }
    let window = at.saturating_sub(MAX_BOUNDARY_SHIFT)..(at + MAX_BOUNDARY_SHIFT).min(ids.len());
    let apart = counter.decode(&ids[window.start..at]) + &counter.decode(&ids[at..window.end]);
    apart == counter.decode(&ids[window])
}

// ---------------------------------------------------------------------------------------------
// Messages.

fn role(message: &Value) -> &str {
    message.get("role").and_then(Value::as_str).unwrap_or("")
}

/// System and developer messages: the instructions, always kept and never cut.
fn is_instruction(message: &Value) -> bool {
    matches!(role(message), "system" | "developer")
}

fn user_message(content: String) -> Value {
    json!({"role": "user", "content": content})
}

/// A message's texts: its string content, or each text part (with its index).
fn text_segments(message: &Value) -> Vec<(Option<usize>, &str)> {
    match message.get("content") {
        Some(Value::String(text)) => vec![(None, text.as_str())],
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .filter(|(_, part)| part.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|(index, part)| part.get("text").and_then(Value::as_str).map(|text| (Some(index), text)))
            .collect(),
        _ => Vec::new(),
    }
}

/// The text of a message made of text only (string content, or text parts joined by a
/// newline); `None` when it has another part (an image).
fn text_only(message: &Value) -> Option<String> {
    match message.get("content")? {
        Value::String(text) => Some(text.clone()),
        Value::Array(parts) => {
            let texts = text_segments(message);
            (texts.len() == parts.len()).then(|| texts.iter().map(|(_, t)| *t).collect::<Vec<_>>().join("\n"))
        }
        _ => None,
    }
}

/// The names and arguments of a message's tool calls, for an estimate of their tokens.
fn tool_call_text(message: &Value) -> Option<String> {
    let calls = message.get("tool_calls")?.as_array()?;
    Some(
        calls
            .iter()
            .filter_map(|call| call.get("function"))
            .flat_map(|function| {
                ["name", "arguments"].into_iter().filter_map(|key| function.get(key).and_then(Value::as_str))
            })
            .collect::<Vec<_>>()
            .join(" "),
    )
}

fn set_text(message: &mut Value, part: Option<usize>, text: String) {
    let slot = match part {
        None => message.get_mut("content"),
        Some(index) => {
            message.get_mut("content").and_then(|content| content.get_mut(index)).and_then(|part| part.get_mut("text"))
        }
    };
    if let Some(slot) = slot {
        *slot = Value::String(text);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use proptest::prelude::*;
    use proptest::strategy::ValueTree;

    use super::*;

    /// Template tokens per message, for the generation prompt, per tool, per image, and the
    /// BOS a text prompt gets.
    const PER_MESSAGE: usize = 4;
    const GENERATION_PROMPT: usize = 3;
    const PER_TOOL: usize = 20;
    const PER_IMAGE: usize = 10;
    const BOS: usize = 1;

    /// A fake tokenizer: a token is a word with the whitespace before it (so decoding is
    /// concatenation and `decode(encode(t)) == t`); a chat prompt is its texts plus fixed
    /// overheads. Strict like a real template/server: a tool answer without its call, or a
    /// call without all its answers, is an error.
    #[derive(Default)]
    struct Words {
        vocabulary: Mutex<(HashMap<String, u32>, Vec<String>)>,
        chat_counts: AtomicUsize,
    }

    fn words(text: &str) -> Vec<&str> {
        let mut tokens = Vec::new();
        let mut start = 0;
        let mut previous_blank = true;
        for (index, c) in text.char_indices() {
            if !c.is_whitespace() && previous_blank && index > 0 && !text[start..index].trim().is_empty() {
                tokens.push(&text[start..index]);
                start = index;
            }
            previous_blank = c.is_whitespace();
        }
        if start < text.len() {
            tokens.push(&text[start..]);
        }
        tokens
    }

    impl Count for Words {
        fn chat_tokens(&self, prompt: ChatPrompt<'_>) -> Result<usize, CountError> {
            self.chat_counts.fetch_add(1, Ordering::Relaxed);
            let mut tokens = GENERATION_PROMPT + prompt.tools.map_or(0, |t| t.len() * PER_TOOL);
            let mut open_calls: Vec<String> = Vec::new();
            for message in prompt.messages {
                let call_ids = |m: &Value| -> Vec<String> {
                    m.get("tool_calls")
                        .and_then(Value::as_array)
                        .map(|calls| calls.iter().filter_map(|c| c["id"].as_str().map(String::from)).collect())
                        .unwrap_or_default()
                };
                if role(message) == "tool" {
                    let id = message["tool_call_id"].as_str().unwrap_or("");
                    let Some(at) = open_calls.iter().position(|c| c == id) else {
                        return Err(CountError::Template(format!("tool answer {id} without its call")));
                    };
                    open_calls.remove(at);
                } else if !open_calls.is_empty() {
                    return Err(CountError::Template(format!("calls {open_calls:?} not answered")));
                }
                open_calls.extend(call_ids(message));
                tokens += PER_MESSAGE;
                tokens += text_segments(message).iter().map(|(_, t)| words(t).len()).sum::<usize>();
                tokens += tool_call_text(message).map_or(0, |t| words(&t).len());
                if let Some(Value::Array(parts)) = message.get("content") {
                    tokens += PER_IMAGE * parts.iter().filter(|p| p["type"] == "image_url").count();
                }
            }
            Ok(tokens)
        }
        fn text_tokens(&self, text: &str) -> usize {
            BOS + words(text).len()
        }
        fn encode(&self, text: &str) -> Vec<u32> {
            let mut vocabulary = self.vocabulary.lock().unwrap();
            let (ids, strings) = &mut *vocabulary;
            words(text)
                .into_iter()
                .map(|word| {
                    *ids.entry(word.to_string()).or_insert_with(|| {
                        strings.push(word.to_string());
                        strings.len() as u32 - 1
                    })
                })
                .collect()
        }
        fn decode(&self, ids: &[u32]) -> String {
            let vocabulary = self.vocabulary.lock().unwrap();
            ids.iter().map(|id| vocabulary.1[*id as usize].as_str()).collect()
        }
        fn exact(&self) -> bool {
            true
        }
    }

    /// A byte-level fake: one token per byte, decoded lossily (like a byte-level BPE cut
    /// inside a character).
    struct Bytes;

    impl Count for Bytes {
        fn chat_tokens(&self, prompt: ChatPrompt<'_>) -> Result<usize, CountError> {
            Ok(prompt.messages.iter().map(|m| PER_MESSAGE + m["content"].as_str().unwrap_or("").len()).sum())
        }
        fn text_tokens(&self, text: &str) -> usize {
            text.len()
        }
        fn encode(&self, text: &str) -> Vec<u32> {
            text.bytes().map(u32::from).collect()
        }
        fn decode(&self, ids: &[u32]) -> String {
            String::from_utf8_lossy(&ids.iter().map(|b| *b as u8).collect::<Vec<_>>()).into_owned()
        }
        fn exact(&self) -> bool {
            true
        }
    }

    fn text(tag: &str, n: usize) -> String {
        (0..n).map(|i| format!("{tag}{i}")).collect::<Vec<_>>().join(" ")
    }

    fn msg(role: &str, content: String) -> Value {
        json!({"role": role, "content": content})
    }

    fn chat(messages: &[Value]) -> ChatPrompt<'_> {
        ChatPrompt { messages, tools: None, template_kwargs: None }
    }

    /// A budget that needs 1 token of room (the smallest `min_room`).
    fn budget(cap: usize, max_tokens: Option<usize>) -> Budget {
        Budget { cap, max_tokens, min_room: 1 }
    }

    fn budget_room(cap: usize, max_tokens: Option<usize>, min_room: usize) -> Budget {
        Budget { cap, max_tokens, min_room }
    }

    fn count(counter: &Words, messages: &[Value]) -> usize {
        counter.chat_tokens(chat(messages)).unwrap()
    }

    #[test]
    fn fits_up_to_the_cap_with_max_tokens_and_cuts_max_tokens_to_the_room_left_beyond() {
        let counter = Words::default();
        let messages = [msg("user", text("u", 10))];
        let prompt = count(&counter, &messages);
        assert_eq!(prompt, 10 + PER_MESSAGE + GENERATION_PROMPT);
        for action in [OnOverflow::Reject, OnOverflow::MiddleOut, OnOverflow::Chunk] {
            let fits = plan_chat(&counter, chat(&messages), budget(prompt + 50, Some(50)), action).unwrap();
            assert_eq!(fits, ChatPlan::Fits { prompt_tokens: prompt, max_tokens: 50 });
            // One over: the answer gets the room left, whatever the action (no transform).
            let cut = plan_chat(&counter, chat(&messages), budget_room(prompt + 49, Some(50), 49), action).unwrap();
            assert_eq!(cut, ChatPlan::Fits { prompt_tokens: prompt, max_tokens: 49 });
            // OpenCode's `max_tokens: 32000` on a 32k model.
            let agent = plan_chat(&counter, chat(&messages), budget_room(prompt + 1000, Some(32000), 256), action);
            assert_eq!(agent.unwrap(), ChatPlan::Fits { prompt_tokens: prompt, max_tokens: 1000 });
        }
        // Less than min_room left: over the cap, the completion counted in the refusal.
        // (min_room is at most half the cap: 13 here.)
        let over = plan_chat(&counter, chat(&messages), budget_room(prompt + 10, Some(50), 50), OnOverflow::Reject);
        assert_eq!(over.unwrap(), ChatPlan::Reject(Requested { prompt, completion: Some(50) }));
        // A client asking for fewer tokens than min_room needs only those.
        let small = plan_chat(&counter, chat(&messages), budget_room(prompt + 10, Some(10), 256), OnOverflow::Reject);
        assert_eq!(small.unwrap(), ChatPlan::Fits { prompt_tokens: prompt, max_tokens: 10 });
    }

    #[test]
    fn min_room_is_at_most_half_the_cap_and_at_least_one() {
        assert_eq!(budget_room(100, None, 256).needed(), 50);
        assert_eq!(budget_room(32768, None, 256).needed(), 256);
        assert_eq!(budget_room(32768, Some(100), 256).needed(), 100);
        assert_eq!(budget_room(1, None, 256).needed(), 1);
        assert_eq!(budget_room(32768, Some(0), 256).needed(), 1);
        // A transform makes room for what an answer is likely to need, not for max_tokens.
        assert_eq!(budget_room(32768, Some(32000), 256).reserve(), 1024);
        assert_eq!(budget_room(32768, Some(500), 256).reserve(), 500);
        assert_eq!(budget_room(2048, None, 256).reserve(), 512);
        assert_eq!(budget_room(2048, None, 900).reserve(), 900);
    }

    #[test]
    fn without_max_tokens_the_plan_gives_the_room_left_and_a_full_prompt_is_rejected() {
        let counter = Words::default();
        let messages = [msg("user", text("u", 10))];
        let prompt = count(&counter, &messages);
        let fits = plan_chat(&counter, chat(&messages), budget(prompt + 1, None), OnOverflow::Reject).unwrap();
        assert_eq!(fits, ChatPlan::Fits { prompt_tokens: prompt, max_tokens: 1 });
        let full = plan_chat(&counter, chat(&messages), budget(prompt, None), OnOverflow::Reject).unwrap();
        assert_eq!(full, ChatPlan::Reject(Requested { prompt, completion: Some(1) }));
        let over = plan_chat(&counter, chat(&messages), budget(prompt - 1, None), OnOverflow::Reject).unwrap();
        assert_eq!(over, ChatPlan::Reject(Requested { prompt, completion: None }));
    }

    #[test]
    fn max_tokens_alone_at_the_cap_is_cut_to_the_room_left_whatever_the_action() {
        let counter = Words::default();
        let messages = [msg("user", "hi".into())];
        let prompt = count(&counter, &messages);
        for action in [OnOverflow::Reject, OnOverflow::MiddleOut, OnOverflow::Chunk] {
            let plan = plan_chat(&counter, chat(&messages), budget_room(100, Some(100), 20), action).unwrap();
            assert_eq!(plan, ChatPlan::Fits { prompt_tokens: prompt, max_tokens: 100 - prompt });
            let text = plan_text(&counter, "hi", budget_room(100, Some(100), 20), action);
            assert_eq!(text, TextPlan::Fits { prompt_tokens: 1 + BOS, max_tokens: 100 - 1 - BOS });
        }
    }

    #[test]
    fn middle_out_removes_the_oldest_exchange_first_and_keeps_the_rest_whole() {
        let counter = Words::default();
        let messages = [
            msg("system", text("s", 20)),
            msg("user", text("first", 20)),
            msg("assistant", text("a1", 100)),
            msg("user", text("u2", 100)),
            msg("assistant", text("a2", 100)),
            msg("user", text("last", 20)),
        ];
        let original = count(&counter, &messages);
        // Room for everything but about 150 tokens: the (a1, u2) exchange goes, nothing is cut.
        let cap = original - 150 + 50;
        let plan = plan_chat(&counter, chat(&messages), budget(cap, Some(50)), OnOverflow::MiddleOut).unwrap();
        let expected = vec![messages[0].clone(), messages[1].clone(), messages[4].clone(), messages[5].clone()];
        let final_tokens = count(&counter, &expected);
        assert_eq!(
            plan,
            ChatPlan::MiddleOut {
                messages: expected,
                prompt_tokens: final_tokens,
                removed_tokens: original - final_tokens,
                max_tokens: 50,
            }
        );
    }

    #[test]
    fn middle_out_removes_a_tool_call_with_its_answers() {
        let counter = Words::default();
        let call = |id: &str| json!({"id": id, "type": "function", "function": {"name": "read", "arguments": "{\"path\": \"a\"}"}});
        let messages = [
            msg("user", text("first", 10)),
            json!({"role": "assistant", "content": null, "tool_calls": [call("c1"), call("c2")]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": text("r1", 200)}),
            json!({"role": "tool", "tool_call_id": "c2", "content": text("r2", 200)}),
            msg("assistant", text("a", 10)),
            msg("user", text("last", 10)),
        ];
        let original = count(&counter, &messages);
        let plan = plan_chat(&counter, chat(&messages), budget(original - 250, None), OnOverflow::MiddleOut).unwrap();
        let ChatPlan::MiddleOut { messages: kept, .. } = plan else {
            panic!("expected middle-out, got {plan:?}");
        };
        assert_eq!(kept, vec![messages[0].clone(), messages[4].clone(), messages[5].clone()]);
    }

    #[test]
    fn middle_out_cuts_the_middle_of_the_longest_text_but_never_the_system_message() {
        let counter = Words::default();
        let messages = [
            msg("system", text("s", 300)),
            msg("user", text("doc", 1000)),
            msg("assistant", text("a", 30)),
            msg("user", text("last", 20)),
        ];
        let plan = plan_chat(&counter, chat(&messages), budget(600, Some(100)), OnOverflow::MiddleOut).unwrap();
        let ChatPlan::MiddleOut { messages: kept, prompt_tokens, max_tokens, .. } = plan else {
            panic!("expected middle-out, got {plan:?}");
        };
        assert!(prompt_tokens + max_tokens <= 600);
        assert_eq!(kept.len(), 3, "the assistant message goes before any cut: {kept:?}");
        assert_eq!(kept[0], messages[0]);
        assert_eq!(kept[2], messages[3]);
        let cut = kept[1]["content"].as_str().unwrap();
        assert!(cut.starts_with("doc0 doc1 doc2") && cut.ends_with("doc998 doc999"), "{cut}");
        assert!(cut.contains(CUT_MARKER));
    }

    #[test]
    fn middle_out_rejects_when_the_system_message_alone_is_over() {
        let counter = Words::default();
        let messages = [msg("system", text("s", 500)), msg("user", text("u", 500))];
        let plan = plan_chat(&counter, chat(&messages), budget(400, Some(10)), OnOverflow::MiddleOut).unwrap();
        assert_eq!(plan, ChatPlan::Reject(Requested { prompt: count(&counter, &messages), completion: None }));
    }

    #[test]
    fn middle_out_never_cuts_an_image_part() {
        let counter = Words::default();
        let image = json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}});
        let messages = [json!({"role": "user", "content": [
            {"type": "text", "text": text("t", 800)}, image.clone(), {"type": "text", "text": "what is it?"}
        ]})];
        let plan = plan_chat(&counter, chat(&messages), budget(300, Some(50)), OnOverflow::MiddleOut).unwrap();
        let ChatPlan::MiddleOut { messages: kept, .. } = plan else {
            panic!("expected middle-out, got {plan:?}");
        };
        let parts = kept[0]["content"].as_array().unwrap();
        assert_eq!(parts[1], image);
        assert_eq!(parts[2]["text"], "what is it?");
        assert!(parts[0]["text"].as_str().unwrap().contains(CUT_MARKER));
    }

    #[test]
    fn middle_out_counts_the_whole_prompt_twice_at_most_when_the_estimate_holds() {
        let counter = Words::default();
        let mut messages = vec![msg("system", text("s", 100)), msg("user", text("first", 100))];
        for turn in 0..200 {
            messages.push(msg("assistant", text(&format!("a{turn}x"), 200)));
            messages.push(msg("user", text(&format!("u{turn}x"), 100)));
        }
        let plan = plan_chat(&counter, chat(&messages), budget(8000, Some(500)), OnOverflow::MiddleOut).unwrap();
        assert!(matches!(plan, ChatPlan::MiddleOut { .. }), "{plan:?}");
        assert_eq!(counter.chat_counts.load(Ordering::Relaxed), 2, "the first count and one verification");
    }

    fn chunk_plan(counter: &Words, messages: &[Value], budget: Budget) -> ChunkPlan {
        match plan_chat(counter, chat(messages), budget, OnOverflow::Chunk).unwrap() {
            ChatPlan::Chunk(plan) => plan,
            other => panic!("expected chunk, got {other:?}"),
        }
    }

    #[test]
    fn chunk_splits_the_last_message_into_map_requests_and_the_reduce_fits() {
        let counter = Words::default();
        let document = format!("Summarise this log. {}", text("line", 5000));
        let messages = [
            msg("system", text("s", 50)),
            msg("user", text("old", 300)),
            msg("assistant", "ok".into()),
            msg("user", document.clone()),
        ];
        let plan = chunk_plan(&counter, &messages, budget(1000, Some(200)));
        let planning_counts = counter.chat_counts.load(Ordering::Relaxed);
        check_chunk(&counter, &messages, None, budget(1000, Some(200)), &plan);
        assert_eq!(plan.reduce_max_tokens, 200);
        assert!(plan.len() >= 6, "{} pieces", plan.len());
        let first = plan.pieces[0].messages[1]["content"].as_str().unwrap();
        assert!(first.starts_with(&format!("A long message was split into {} parts.", plan.len())), "{first}");
        assert!(first.contains(&format!("Part 1 of {} of the text it refers to:\n", plan.len())), "{first}");
        assert!(first.ends_with(&plan.pieces[0].text));
        for piece in &plan.pieces {
            assert_eq!(piece.messages[0], messages[0], "the instructions go with each piece");
            assert_eq!(piece.messages.len(), 2, "the earlier conversation does not");
        }
        let reduce = plan.reduce_messages(&["one".into(), "two".into()]);
        let reduce = reduce[1]["content"].as_str().unwrap();
        assert!(reduce.contains("Summarise this log.") && reduce.contains("[Part 2 of"), "{reduce}");
        println!(
            "chunk: {} pieces, map max_tokens {}, {planning_counts} counts while planning",
            plan.len(),
            plan.map_max_tokens
        );
    }

    #[test]
    fn chunk_behaves_as_middle_out_when_the_last_message_fits_with_the_instructions() {
        let counter = Words::default();
        let messages = [
            msg("system", text("s", 50)),
            msg("user", text("old", 2000)),
            msg("assistant", "ok".into()),
            msg("user", text("q", 100)),
        ];
        let plan = plan_chat(&counter, chat(&messages), budget(1000, Some(200)), OnOverflow::Chunk).unwrap();
        assert!(matches!(plan, ChatPlan::MiddleOut { .. }), "{plan:?}");
    }

    #[test]
    fn chunk_rejects_when_partial_answers_would_get_too_few_tokens() {
        let counter = Words::default();
        let messages = [msg("user", text("doc", 20_000))];
        // 500 tokens kept for the client's answer (min_room 600, at most half the cap) leave too
        // little for dozens of partial answers.
        let budget = budget_room(1000, Some(600), 600);
        assert_eq!(budget.reserve(), 500);
        let plan = plan_chat(&counter, chat(&messages), budget, OnOverflow::Chunk).unwrap();
        assert_eq!(plan, ChatPlan::Reject(Requested { prompt: count(&counter, &messages), completion: None }));
    }

    /// Review issue 1: a `<doc>…</doc> QUESTION: …` message split in pieces; every map request
    /// and the reduce request must carry the question at its end, and the reduce request the
    /// turns before the long message that fit.
    #[test]
    fn chunk_carries_the_request_into_every_map_request_and_the_reduce_with_the_recent_turns() {
        let counter = Words::default();
        let question = "QUESTION: which region grew fastest?";
        let document = format!("<doc> {} </doc>\n{question}", text("report", 6000));
        let messages = [
            msg("system", "You are helpful.".into()),
            msg("user", text("old", 400)),
            msg("assistant", text("oldanswer", 400)),
            msg("user", "Now the quarterly report.".into()),
            msg("assistant", "Send it.".into()),
            msg("user", document.clone()),
        ];
        let budget = budget(2000, Some(300));
        let plan = chunk_plan(&counter, &messages, budget);
        check_chunk(&counter, &messages, None, budget, &plan);
        assert!(plan.len() >= 3, "{} pieces", plan.len());
        for piece in &plan.pieces {
            let map = piece.messages[1]["content"].as_str().unwrap();
            assert!(map.contains(question) && map.contains("<doc> report0 report1"), "{map}");
        }
        let reduce = plan.reduce_messages(&vec!["x".into(); plan.len()]);
        let reduce_text = reduce.last().unwrap()["content"].as_str().unwrap();
        assert!(reduce_text.contains(question) && reduce_text.contains("[Part 3 of"), "{reduce_text}");
        // The last exchange fits in a quarter of the reduce room; the 800-token one before does not.
        assert_eq!(reduce[..reduce.len() - 1], [messages[0].clone(), messages[3].clone(), messages[4].clone()]);
    }

    /// Review issue 2: five tokens over, the latest user instruction ("STOP") must stay and
    /// the 2.7k-token tool answer be cut instead.
    #[test]
    fn middle_out_cuts_a_long_tool_answer_rather_than_remove_the_latest_user_instruction() {
        let counter = Words::default();
        let call = json!({"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}});
        let messages = [
            msg("system", "sys".into()),
            msg("user", "task: refactor the module".into()),
            msg("assistant", "done with step one".into()),
            msg("user", "STOP. Do not touch the tests; revert instead.".into()),
            json!({"role": "assistant", "content": "", "tool_calls": [call]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": text("lorem", 2700)}),
        ];
        let total = count(&counter, &messages);
        let plan =
            plan_chat(&counter, chat(&messages), budget_room(total - 5 + 100, Some(100), 100), OnOverflow::MiddleOut)
                .unwrap();
        let ChatPlan::MiddleOut { messages: kept, prompt_tokens, removed_tokens, .. } = plan else {
            panic!("expected middle-out, got {plan:?}");
        };
        assert_eq!(kept[..5], messages[..5], "nothing removed: the excess is cut from the tool answer");
        assert!(kept[5]["content"].as_str().unwrap().contains(CUT_MARKER));
        assert!(prompt_tokens + 100 <= total - 5 + 100 && removed_tokens < 20, "removed {removed_tokens}");
        // A large excess removes groups, but never the last user message.
        let plan = plan_chat(&counter, chat(&messages), budget(1200, Some(100)), OnOverflow::MiddleOut).unwrap();
        let ChatPlan::MiddleOut { messages: kept, .. } = plan else {
            panic!("expected middle-out, got {plan:?}");
        };
        assert!(!kept.contains(&messages[2]) && kept.contains(&messages[3]), "{kept:?}");
    }

    #[test]
    fn middle_out_cuts_the_last_user_message_only_after_every_other_text() {
        let counter = Words::default();
        let messages = [msg("user", text("doc", 600)), msg("assistant", text("a", 30)), msg("user", text("ask", 1000))];
        let plan = plan_chat(&counter, chat(&messages), budget(800, Some(50)), OnOverflow::MiddleOut).unwrap();
        let ChatPlan::MiddleOut { messages: kept, prompt_tokens, .. } = plan else {
            panic!("expected middle-out, got {plan:?}");
        };
        assert!(prompt_tokens + 50 <= 800);
        assert_eq!(kept.len(), 2, "the assistant message goes first: {kept:?}");
        let doc = kept[0]["content"].as_str().unwrap();
        let ask = kept[1]["content"].as_str().unwrap();
        assert!(words(doc).len() <= MIN_KEPT_TOKENS + 2, "the first message is cut to its minimum first: {doc}");
        assert!(ask.starts_with("ask0 ") && ask.ends_with(" ask999") && ask.contains(CUT_MARKER));
        assert!(words(ask).len() > 600, "the last user message keeps all the room left: {}", words(ask).len());
    }

    /// Review issue 3: a prompt just under the cap must not go out with `max_tokens: 1`: less
    /// than `min_room` left is over the cap, and a transform makes room for the reserve.
    #[test]
    fn a_prompt_that_leaves_less_than_min_room_is_transformed_to_make_room_for_the_reserve() {
        let counter = Words::default();
        let messages = [msg("user", text("lorem", 500))];
        let total = count(&counter, &messages);
        for max_tokens in [None, Some(32000)] {
            let budget = budget_room(total + 1, max_tokens, 256);
            let reserve = budget.reserve();
            assert!(reserve > 100);
            match plan_chat(&counter, chat(&messages), budget, OnOverflow::MiddleOut).unwrap() {
                ChatPlan::MiddleOut { prompt_tokens, max_tokens, .. } => {
                    assert!(max_tokens >= reserve && prompt_tokens + max_tokens <= total + 1, "{max_tokens}");
                }
                other => panic!("expected middle-out, got {other:?}"),
            }
            match plan_chat(&counter, chat(&messages), budget, OnOverflow::Chunk).unwrap() {
                ChatPlan::Chunk(plan) => {
                    check_chunk(&counter, &messages, None, budget, &plan);
                    assert!(plan.reduce_max_tokens >= reserve);
                }
                other => panic!("expected chunk, got {other:?}"),
            }
            match plan_text(
                &counter,
                &text("lorem", 500),
                budget_room(500 + BOS + 1, max_tokens, 256),
                OnOverflow::Chunk,
            ) {
                TextPlan::MiddleOut { max_tokens, .. } => assert!(max_tokens >= 125, "{max_tokens}"),
                other => panic!("expected middle-out, got {other:?}"),
            }
            // Reject models refuse it, the room kept for the answer counted.
            let completion = Some(max_tokens.unwrap_or(budget.needed()));
            assert_eq!(
                plan_chat(&counter, chat(&messages), budget, OnOverflow::Reject).unwrap(),
                ChatPlan::Reject(Requested { prompt: total, completion })
            );
        }
        // With min_room 1, the one token left is room enough: sent as it is.
        let fits = ChatPlan::Fits { prompt_tokens: total, max_tokens: 1 };
        assert_eq!(plan_chat(&counter, chat(&messages), budget(total + 1, None), OnOverflow::MiddleOut).unwrap(), fits);
        // A transform that can not make room (the system message is what is long): refused.
        let instructions = [msg("system", text("s", 500)), msg("user", "hi".into())];
        let total = count(&counter, &instructions);
        let budget = budget_room(total + 10, None, 256);
        let plan = plan_chat(&counter, chat(&instructions), budget, OnOverflow::MiddleOut);
        assert_eq!(plan.unwrap(), ChatPlan::Reject(Requested { prompt: total, completion: Some(budget.needed()) }));
    }

    /// Review issues 4 and 5: a client's `max_tokens: u64::MAX` (or a huge cap) must not
    /// overflow.
    #[test]
    fn huge_numbers_never_overflow_whatever_the_action() {
        let counter = Words::default();
        let messages = [msg("system", text("s", 10)), msg("user", text("u", 300))];
        let total = count(&counter, &messages);
        let prompt = text("w", 300);
        for action in [OnOverflow::Reject, OnOverflow::MiddleOut, OnOverflow::Chunk] {
            let huge = budget(32768, Some(usize::MAX));
            assert_eq!(
                plan_chat(&counter, chat(&messages), huge, action).unwrap(),
                ChatPlan::Fits { prompt_tokens: total, max_tokens: 32768 - total }
            );
            assert_eq!(
                plan_text(&counter, &prompt, huge, action),
                TextPlan::Fits { prompt_tokens: 300 + BOS, max_tokens: 32768 - 300 - BOS }
            );
            // prompt + max_tokens overflows usize: the room left, never a wrapped sum.
            let almost = budget(usize::MAX, Some(usize::MAX - 1));
            assert_eq!(
                plan_chat(&counter, chat(&messages), almost, action).unwrap(),
                ChatPlan::Fits { prompt_tokens: total, max_tokens: usize::MAX - total }
            );
            assert_eq!(
                plan_text(&counter, &prompt, almost, action),
                TextPlan::Fits { prompt_tokens: 300 + BOS, max_tokens: usize::MAX - 300 - BOS }
            );
            // Refused, the completion's u64::MAX saturates the total.
            let full = budget_room(total + 10, Some(usize::MAX), 20);
            let Ok(ChatPlan::Reject(requested)) = plan_chat(&counter, chat(&messages), full, OnOverflow::Reject) else {
                panic!("expected a refusal");
            };
            assert_eq!(requested.total(), usize::MAX);
            let open = budget(usize::MAX, None);
            let plan = plan_chat(&counter, chat(&messages), open, action).unwrap();
            assert_eq!(plan, ChatPlan::Fits { prompt_tokens: total, max_tokens: usize::MAX - total });
            let plan = plan_text(&counter, &prompt, open, action);
            assert_eq!(plan, TextPlan::Fits { prompt_tokens: 300 + BOS, max_tokens: usize::MAX - 300 - BOS });
            let plan = plan_chat(&counter, chat(&messages), budget(usize::MAX, Some(usize::MAX / 2)), action).unwrap();
            assert_eq!(plan, ChatPlan::Fits { prompt_tokens: total, max_tokens: usize::MAX / 2 });
        }
        assert_eq!(split_for_embedding(&counter, &prompt, usize::MAX), vec![(prompt.clone(), 300)]);
    }

    #[test]
    fn text_prompts_fit_reject_or_middle_out_and_chunk_middle_outs() {
        let counter = Words::default();
        let prompt = text("w", 1000);
        assert_eq!(
            plan_text(&counter, &prompt, budget(2000, Some(10)), OnOverflow::Reject),
            TextPlan::Fits { prompt_tokens: 1000 + BOS, max_tokens: 10 }
        );
        assert_eq!(
            plan_text(&counter, &prompt, budget(500, Some(10)), OnOverflow::Reject),
            TextPlan::Reject(Requested { prompt: 1000 + BOS, completion: None })
        );
        for action in [OnOverflow::MiddleOut, OnOverflow::Chunk] {
            let TextPlan::MiddleOut { text, prompt_tokens, removed_tokens, max_tokens } =
                plan_text(&counter, &prompt, budget(500, Some(10)), action)
            else {
                panic!("expected middle-out");
            };
            assert_eq!(counter.text_tokens(&text), prompt_tokens);
            assert_eq!(prompt_tokens + removed_tokens, 1000 + BOS);
            assert_eq!(prompt_tokens + max_tokens, 500, "nothing is cut beyond what the cap needs");
            assert!(text.starts_with("w0 w1 ") && text.ends_with(" w998 w999"));
        }
    }

    #[test]
    fn embedding_inputs_split_into_pieces_that_fit_and_rebuild_the_text() {
        let counter = Words::default();
        let input = text("e", 1000);
        let pieces = split_for_embedding(&counter, &input, 300);
        assert_eq!(pieces.len(), 4);
        assert!(pieces.iter().all(|(piece, _)| counter.text_tokens(piece) <= 300));
        assert_eq!(pieces.iter().map(|(p, _)| p.as_str()).collect::<String>(), input);
        assert_eq!(pieces.iter().map(|(_, n)| n).sum::<usize>(), 1000);
        assert_eq!(split_for_embedding(&counter, "short one", 300), vec![("short one".to_string(), 2)]);
    }

    #[test]
    fn embeddings_average_by_tokens_and_stay_unit_length_when_the_pieces_are() {
        let unit = average_embeddings(&[(vec![1.0, 0.0], 3), (vec![0.0, 1.0], 1)]);
        let length = (unit[0] * unit[0] + unit[1] * unit[1]).sqrt();
        assert!((length - 1.0).abs() < 1e-6 && (unit[0] / unit[1] - 3.0).abs() < 1e-5, "{unit:?}");
        let plain = average_embeddings(&[(vec![2.0, 0.0], 3), (vec![0.0, 4.0], 1)]);
        assert_eq!(plain, vec![1.5, 1.0]);
        assert!(average_embeddings(&[]).is_empty());
    }

    #[test]
    fn a_cut_never_splits_a_character() {
        let ids = Bytes.encode(&"é".repeat(100));
        for keep in 2..40 {
            let (cut, kept) = cut_middle(&Bytes, &ids, keep);
            assert!(!cut.contains('\u{FFFD}'), "keep {keep}: {cut}");
            assert!(kept <= keep && kept + 2 >= keep, "keep {keep} kept {kept}");
        }
        for len in 2..9 {
            assert!(
                piece_ranges(&Bytes, &ids, len, 1).iter().all(|r| !Bytes.decode(&ids[r.clone()]).contains('\u{FFFD}'))
            );
        }
    }

    /// The chunk plan's promises, per the counter.
    fn check_chunk(counter: &Words, messages: &[Value], tools: Option<&[Value]>, budget: Budget, plan: &ChunkPlan) {
        let last = messages.last().unwrap();
        let ids = counter.encode(&text_only(last).unwrap());
        assert!(plan.map_max_tokens >= MIN_PARTIAL_TOKENS);
        let instructions: Vec<&Value> = messages.iter().filter(|m| is_instruction(m)).collect();
        let mut rebuilt = Vec::new();
        for piece in &plan.pieces {
            let tokens = count(counter, &piece.messages);
            assert_eq!(tokens, piece.prompt_tokens);
            assert!(tokens + plan.map_max_tokens <= budget.cap, "map prompt {tokens} + {}", plan.map_max_tokens);
            assert_eq!(counter.encode(&piece.text), ids[piece.tokens.clone()]);
            assert_eq!(piece.messages.iter().take(instructions.len()).collect::<Vec<_>>(), instructions);
            let start = piece.tokens.start;
            assert!(start <= rebuilt.len(), "a gap before {start}");
            let overlap = rebuilt.len() - start;
            assert!(overlap <= MAX_OVERLAP + MAX_BOUNDARY_SHIFT);
            rebuilt.extend_from_slice(&ids[piece.tokens.start + overlap..piece.tokens.end]);
        }
        assert_eq!(rebuilt, ids, "pieces minus overlaps re-create the message");
        // The request: the message's head and tail, never the whole message, in every request.
        if let Some((head, tail)) = plan.request.split_once(CUT_MARKER) {
            let message = text_only(last).unwrap();
            assert!(message.starts_with(head) && message.ends_with(tail) && !head.is_empty() && !tail.is_empty());
            assert!(counter.encode(head).len() + counter.encode(tail).len() < ids.len());
            for piece in &plan.pieces {
                assert!(piece.messages.last().unwrap()["content"].as_str().unwrap().contains(&plan.request));
            }
        } else {
            assert!(plan.request.is_empty());
        }
        let partial = text("p", plan.map_max_tokens);
        let reduce = plan.reduce_messages(&vec![partial; plan.len()]);
        let (reduce_user, context) = reduce.split_last().unwrap();
        assert!(reduce_user["content"].as_str().unwrap().contains(&plan.request));
        // The reduce context: every instruction, then a suffix of the earlier conversation.
        let earlier = &messages[..messages.len() - 1];
        let kept: Vec<usize> =
            context.iter().map(|m| earlier.iter().position(|e| e == m).expect("an earlier message")).collect();
        assert!(kept.windows(2).all(|w| w[0] < w[1]), "order kept: {kept:?}");
        let oldest_turn = kept.iter().copied().find(|i| !is_instruction(&earlier[*i])).unwrap_or(earlier.len());
        let expected: Vec<usize> =
            (0..earlier.len()).filter(|i| *i >= oldest_turn || is_instruction(&earlier[*i])).collect();
        assert_eq!(kept, expected, "whole turns from the newest back, instructions always");
        let reduce_tokens =
            counter.chat_tokens(ChatPrompt { messages: &reduce, tools, template_kwargs: None }).unwrap();
        assert!(
            reduce_tokens + plan.reduce_max_tokens <= budget.cap,
            "reduce {reduce_tokens} + {}",
            plan.reduce_max_tokens
        );
        assert!(plan.reduce_max_tokens <= budget.max_tokens.unwrap_or(usize::MAX));
        assert_eq!(plan.max_tokens_cut, budget.max_tokens.is_some_and(|max| plan.reduce_max_tokens < max));
    }

    // -----------------------------------------------------------------------------------------
    // Properties over random conversations.

    /// One step of a random conversation after the first user message.
    #[derive(Debug, Clone)]
    enum Step {
        Assistant(usize),
        User(usize),
        ToolCalls(Vec<usize>),
        Instruction(usize),
        Image(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => (0..300usize).prop_map(Step::Assistant),
            3 => (1..300usize).prop_map(Step::User),
            2 => prop::collection::vec(0..300usize, 1..4).prop_map(Step::ToolCalls),
            1 => (1..40usize).prop_map(Step::Instruction),
            1 => (0..100usize).prop_map(Step::Image),
        ]
    }

    /// Messages tagged with `_id` (their index in the original), so kept ones are found.
    fn conversation(system: Option<usize>, first: usize, steps: &[Step], last: usize) -> Vec<Value> {
        let mut messages = Vec::new();
        let mut add = |mut message: Value| {
            let id = messages.len();
            message["_id"] = json!(id);
            // Distinct words per message, so a piece's tokens identify it.
            messages.push(message);
        };
        if let Some(words) = system {
            add(msg("system", text("sys", words)));
        }
        add(msg("user", text("first", first)));
        for (index, step) in steps.iter().enumerate() {
            let tag = |kind: &str| format!("{kind}{index}_");
            match step {
                Step::Assistant(n) => add(msg("assistant", text(&tag("a"), *n))),
                Step::User(n) => add(msg("user", text(&tag("u"), *n))),
                Step::Instruction(n) => add(msg("developer", text(&tag("d"), *n))),
                Step::Image(n) => add(json!({"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": "data:,"}},
                    {"type": "text", "text": text(&tag("i"), *n)}
                ]})),
                Step::ToolCalls(answers) => {
                    let calls: Vec<Value> = (0..answers.len())
                        .map(|c| {
                            json!({"id": format!("call{index}_{c}"), "type": "function",
                            "function": {"name": "look", "arguments": "{\"q\": 1}"}})
                        })
                        .collect();
                    add(json!({"role": "assistant", "content": null, "tool_calls": calls}));
                    for (c, n) in answers.iter().enumerate() {
                        add(
                            json!({"role": "tool", "tool_call_id": format!("call{index}_{c}"), "content": text(&tag("t"), *n)}),
                        );
                    }
                }
            }
        }
        if last > 0 {
            add(msg("user", text("last", last)));
        }
        messages
    }

    fn id(message: &Value) -> usize {
        message["_id"].as_u64().unwrap() as usize
    }

    fn check_middle_out(original: &[Value], kept: &[Value]) {
        let ids: Vec<usize> = kept.iter().map(id).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "order kept: {ids:?}");
        let first_user = original.iter().position(|m| role(m) == "user");
        for (index, message) in original.iter().enumerate() {
            let kept_copy = kept.iter().find(|k| id(k) == index);
            if is_instruction(message) {
                assert_eq!(kept_copy, Some(message), "instructions kept whole");
            }
            if Some(index) == first_user || Some(index) == last_user(original) || index + 1 == original.len() {
                assert!(kept_copy.is_some(), "message {index} kept");
            }
            if let Some(copy) = kept_copy {
                let mut without_content = copy.clone();
                without_content["content"] = message["content"].clone();
                assert_eq!(&without_content, message, "only the text changes");
            }
        }
        // Tool groups: a kept call keeps all its answers and a kept answer its call.
        for (index, message) in original.iter().enumerate() {
            if tool_call_text(message).is_some() {
                let answers = original[index + 1..].iter().take_while(|m| role(m) == "tool");
                let present = ids.contains(&index);
                for answer in answers {
                    assert_eq!(ids.contains(&id(answer)), present, "tool group {index} split: {ids:?}");
                }
            }
        }
    }

    /// A random chat request over a random budget.
    #[derive(Debug, Clone)]
    struct Case {
        system: Option<usize>,
        first: usize,
        steps: Vec<Step>,
        last: usize,
        budget: Budget,
        with_tools: bool,
        action: OnOverflow,
    }

    fn action() -> impl Strategy<Value = OnOverflow> {
        prop_oneof![Just(OnOverflow::Reject), Just(OnOverflow::MiddleOut), Just(OnOverflow::Chunk)]
    }

    fn case() -> impl Strategy<Value = Case> {
        (
            prop::option::of(0..200usize),
            1..400usize,
            prop::collection::vec(step(), 0..12),
            prop_oneof![Just(0usize), 1..300usize, 300..6000usize],
            (60..4000usize, prop::option::of(prop_oneof![4 => 0..1500usize, 1 => 1500..40000usize]), 1..400usize),
            any::<bool>(),
            action(),
        )
            .prop_map(|(system, first, steps, last, (cap, max_tokens, min_room), with_tools, action)| Case {
                system,
                first,
                steps,
                last,
                budget: Budget { cap, max_tokens, min_room },
                with_tools,
                action,
            })
    }

    /// Plans `case` and checks the plan's promises; returns the plan's kind.
    fn check_case(case: &Case) -> Result<&'static str, TestCaseError> {
        let counter = Words::default();
        let messages = conversation(case.system, case.first, &case.steps, case.last);
        let tools = vec![json!({"type": "function", "function": {"name": "look"}})];
        let tools = case.with_tools.then_some(tools.as_slice());
        let prompt = ChatPrompt { messages: &messages, tools, template_kwargs: None };
        let Case { budget, action, .. } = *case;
        let (cap, max_tokens) = (budget.cap, budget.max_tokens);
        let original = counter.chat_tokens(prompt).unwrap();
        let plan = plan_chat(&counter, prompt, budget, action).unwrap();
        // Under the cap with at least min_room (or the client's smaller max_tokens) left: sent as
        // it is, whatever the action and however large max_tokens is.
        let room = cap.checked_sub(original);
        let fits_as_is = room.is_some_and(|room| room >= budget.needed() || max_tokens.is_some_and(|m| m <= room));
        let max = max_tokens.unwrap_or(usize::MAX);
        Ok(match plan {
            ChatPlan::Fits { prompt_tokens, max_tokens: send } => {
                prop_assert!(fits_as_is);
                prop_assert_eq!(prompt_tokens, original);
                prop_assert!(prompt_tokens + send <= cap && send <= max);
                // The client's max_tokens when it fits, else all the room left.
                prop_assert_eq!(send, max.min(cap - original));
                if send < max { "fits_cut" } else { "fits" }
            }
            ChatPlan::Reject(requested) => {
                prop_assert!(!fits_as_is);
                prop_assert_eq!(requested.prompt, original);
                let completion = (original <= cap).then(|| max_tokens.unwrap_or(budget.needed()));
                prop_assert_eq!(requested.completion, completion);
                "reject"
            }
            ChatPlan::MiddleOut { messages: kept, prompt_tokens, removed_tokens, max_tokens: send } => {
                prop_assert!(!fits_as_is && action != OnOverflow::Reject);
                let counted = counter.chat_tokens(ChatPrompt { messages: &kept, ..prompt }).unwrap();
                prop_assert_eq!(counted, prompt_tokens);
                prop_assert!(prompt_tokens + send <= cap && send >= budget.reserve() && send <= max);
                prop_assert_eq!(send, max.min(cap - prompt_tokens));
                prop_assert_eq!(removed_tokens, original - prompt_tokens);
                check_middle_out(&messages, &kept);
                if kept.iter().any(|m| m["content"].to_string().contains('…')) {
                    "middle_out_cut"
                } else {
                    "middle_out"
                }
            }
            ChatPlan::Chunk(plan) => {
                prop_assert!(!fits_as_is && action == OnOverflow::Chunk);
                check_chunk(&counter, &messages, tools, budget, &plan);
                prop_assert!(plan.reduce_max_tokens >= budget.reserve() && plan.reduce_max_tokens <= max);
                if plan.reduce_context.iter().any(|m| !is_instruction(m)) {
                    "chunk_with_earlier_turns"
                } else {
                    "chunk"
                }
            }
        })
    }

    #[test]
    fn random_cases_reach_every_kind_of_plan() {
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let mut kinds: HashMap<&str, usize> = HashMap::new();
        for _ in 0..400 {
            let case = case().new_tree(&mut runner).unwrap().current();
            *kinds.entry(check_case(&case).unwrap()).or_default() += 1;
        }
        println!("plans over 400 random cases: {kinds:?}");
        for kind in ["fits", "fits_cut", "reject", "middle_out", "middle_out_cut", "chunk", "chunk_with_earlier_turns"]
        {
            assert!(kinds.get(kind).copied().unwrap_or(0) >= 10, "{kind} is rare: {kinds:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        #[test]
        fn every_plan_keeps_its_promises(case in case()) {
            check_case(&case)?;
        }

        #[test]
        fn text_plans_fit_and_embedding_pieces_rebuild_the_input(
            words in 0..3000usize,
            cap in 40..2000usize,
            max_tokens in prop::option::of(0..500usize),
            min_room in 1..300usize,
            action in prop_oneof![Just(OnOverflow::Reject), Just(OnOverflow::MiddleOut), Just(OnOverflow::Chunk)],
        ) {
            let counter = Words::default();
            let input = text("w", words);
            let budget = Budget { cap, max_tokens, min_room };
            match plan_text(&counter, &input, budget, action) {
                TextPlan::Fits { prompt_tokens, max_tokens: send } | TextPlan::MiddleOut { prompt_tokens, max_tokens: send, .. } => {
                    prop_assert!(prompt_tokens + send <= cap);
                    prop_assert!(send <= max_tokens.unwrap_or(usize::MAX));
                }
                TextPlan::Reject(requested) => {
                    prop_assert_eq!(requested, budget.requested(words + BOS));
                    prop_assert!(budget.fitting(words + BOS).is_none());
                    let room_to_keep = cap.saturating_sub(budget.reserve() + BOS + 1);
                    prop_assert!(action == OnOverflow::Reject || room_to_keep < MIN_KEPT_TOKENS.min(words));
                }
            }
            let pieces = split_for_embedding(&counter, &input, cap);
            prop_assert!(pieces.iter().all(|(piece, _)| counter.text_tokens(piece) <= cap));
            prop_assert_eq!(pieces.iter().map(|(p, _)| p.as_str()).collect::<String>(), input);
            prop_assert_eq!(pieces.iter().map(|(_, n)| n).sum::<usize>(), words);
        }
    }
}
