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
mod tests;
