//! Plans for a prompt over a backend's context cap: fits as it is, reject, middle-out (drop
//! middle messages, then cut the middle of the longest text) or chunk (map the over-long last
//! user message in pieces, then reduce the partial answers). Pure: the HTTP handler counts
//! nothing itself and carries the plan out (the map requests go through the same queue).
//!
//! Costs: a full `chat_tokens` count renders the template and tokenizes the whole prompt
//! (~20 ms for 53k tokens), so the planners work from per-message estimates (each text encoded
//! once) and verify with one full count at the end, looping only when the verification says
//! the prompt still does not fit.

use std::ops::Range;

use serde_json::{Value, json};

use super::{ChatPrompt, Count, CountError, OnOverflow};

/// The marker put where the middle of a text was cut.
pub const CUT_MARKER: &str = "\n…\n";
/// Tokens a truncated text keeps at least (head and tail together); a shorter one is not cut.
const MIN_KEPT_TOKENS: usize = 32;
/// Full counts a middle-out may spend verifying before it gives up (reject).
const MAX_VERIFICATIONS: usize = 4;
/// Room kept for the answer by a transform when the client gave no `max_tokens`: at most this,
/// and at most a quarter of the cap.
const DEFAULT_ROOM: usize = 1024;
/// The overlap between consecutive chunk pieces: at most this many tokens, and at most
/// [`OVERLAP_PERCENT`] of a piece.
const MAX_OVERLAP: usize = 64;
const OVERLAP_PERCENT: usize = 5;
/// A chunk plan whose partial answers would get fewer tokens than this is rejected.
pub const MIN_PARTIAL_TOKENS: usize = 32;
/// A chunk piece shorter than this is not worth a request: reject.
const MIN_PIECE_TOKENS: usize = 64;
/// How much of the original message the reduce request quotes, tried in this order: its head
/// usually states the request.
const REDUCE_HEAD_TOKENS: [usize; 3] = [256, 64, 0];
/// Tokens kept free in the reduce prompt, as a whole and per partial answer: a model's answer
/// re-tokenized inside a prompt can merge differently from how it was generated.
const REDUCE_SLACK: usize = 16;
const PARTIAL_SLACK: usize = 4;
/// The widest "Part i of P" label the map framing is measured with (digits tokenize one by
/// one in the Qwen vocabulary, so this bounds any real label).
const WIDEST_PART_LABEL: usize = 9999;
/// How many tokens a cut may move to land on a character boundary.
const MAX_BOUNDARY_SHIFT: usize = 4;

/// The tokens a request may use: the backend's cap and what the client asked to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The backend's context cap (prompt + generated tokens).
    pub cap: usize,
    /// The client's `max_tokens` / `max_completion_tokens`; `None` when not given.
    pub max_tokens: Option<usize>,
}

impl Budget {
    /// The room a transform keeps for the answer: the client's `max_tokens`, or when not given
    /// `min(1024, cap / 4)` (at least 1). The plan's `max_tokens` is then the room actually
    /// left, which the handler caps by the model's default.
    pub fn reserve(&self) -> usize {
        self.max_tokens
            .unwrap_or_else(|| DEFAULT_ROOM.min(self.cap / 4).max(1))
    }

    /// The largest prompt a transform may produce.
    fn prompt_limit(&self) -> usize {
        self.cap.saturating_sub(self.reserve())
    }

    /// The `max_tokens` to send with a prompt of `prompt_tokens` when it fits as it is.
    fn fitting(&self, prompt_tokens: usize) -> Option<usize> {
        match self.max_tokens {
            Some(max) => (prompt_tokens + max <= self.cap).then_some(max),
            None => (prompt_tokens < self.cap).then(|| self.cap - prompt_tokens),
        }
    }

    /// What a rejection reports: prompt + `max_tokens` (the prompt alone when not given).
    fn requested(&self, prompt_tokens: usize) -> usize {
        prompt_tokens + self.max_tokens.unwrap_or(0)
    }

    /// Whether `max_tokens` alone leaves no room for any prompt (rejected whatever the action).
    fn max_tokens_alone_over(&self) -> bool {
        self.max_tokens.is_some_and(|max| max >= self.cap)
    }

    /// The `max_tokens` to send after a transform: the client's, or the room left.
    fn after_transform(&self, prompt_tokens: usize) -> usize {
        self.max_tokens
            .unwrap_or_else(|| self.cap.saturating_sub(prompt_tokens).max(1))
    }
}

/// What to do with a chat request.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatPlan {
    /// Send it as it is, with this `max_tokens` (when the client gave none: the room left).
    Fits {
        prompt_tokens: usize,
        max_tokens: usize,
    },
    /// 400 `context_length_exceeded`; `requested` = prompt tokens + `max_tokens` (the prompt
    /// alone when not given) is the "M tokens" of the message.
    Reject { requested: usize },
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
/// Map requests carry the system/developer messages and one piece, without the client's
/// `tools` (a partial answer must be text) and with its `chat_template_kwargs`; the earlier
/// conversation is not sent. The reduce request carries the system/developer messages, the
/// client's `tools` and kwargs, and one user message built by [`ChunkPlan::reduce_messages`].
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkPlan {
    /// One map request per piece, in order.
    pub pieces: Vec<Piece>,
    /// `max_tokens` for each map request: the reduce prompt with every partial answer this long
    /// still fits with `reduce_max_tokens`.
    pub map_max_tokens: usize,
    /// `max_tokens` for the reduce request: the client's, or when not given the room left.
    pub reduce_max_tokens: usize,
    /// Tokens of the original message that was split.
    pub message_tokens: usize,
    instructions: Vec<Value>,
    head: String,
    head_is_whole: bool,
}

/// One piece of the split message and its map request.
#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    /// The map request's messages: the system/developer messages, then a user message with a
    /// framing line and the piece.
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
        let mut messages = self.instructions.clone();
        messages.push(user_message(reduce_text(
            &self.head,
            self.head_is_whole,
            self.pieces.len(),
            partials,
        )));
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
    Fits {
        prompt_tokens: usize,
        max_tokens: usize,
    },
    /// 400 `context_length_exceeded` (see [`ChatPlan::Reject`]).
    Reject { requested: usize },
    /// Send this text instead: the head and tail of the prompt around [`CUT_MARKER`].
    MiddleOut {
        text: String,
        prompt_tokens: usize,
        removed_tokens: usize,
        max_tokens: usize,
    },
}

/// Decides what to do with a chat prompt under `budget`.
///
/// - `max_tokens` ≥ cap: reject whatever the action.
/// - fits (prompt + `max_tokens` ≤ cap; without `max_tokens`: prompt < cap): [`ChatPlan::Fits`].
/// - `reject`: [`ChatPlan::Reject`].
/// - `middle_out`: keep system/developer messages, the first user message and the last
///   message; remove the others oldest first in groups (an assistant message with the tool
///   answers and user messages that follow it, so a tool answer never loses its call and
///   user/assistant alternation holds as long as possible); then cut the middle of the longest
///   text (never a system/developer message's, never an image part) until the prompt fits with
///   [`Budget::reserve`] left. Reject when even that does not fit.
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
    let reject = ChatPlan::Reject {
        requested: budget.requested(prompt_tokens),
    };
    if budget.max_tokens_alone_over() {
        return Ok(reject);
    }
    if let Some(max_tokens) = budget.fitting(prompt_tokens) {
        return Ok(ChatPlan::Fits {
            prompt_tokens,
            max_tokens,
        });
    }
    match action {
        OnOverflow::Reject => Ok(reject),
        OnOverflow::MiddleOut => Ok(middle_out(counter, prompt, budget, prompt_tokens)?.unwrap_or(reject)),
        OnOverflow::Chunk => match chunk(counter, prompt, budget)? {
            Some(plan) => Ok(plan.map_or(reject, ChatPlan::Chunk)),
            None => Ok(middle_out(counter, prompt, budget, prompt_tokens)?.unwrap_or(reject)),
        },
    }
}

/// Decides what to do with a `/v1/completions` text prompt under `budget`.
///
/// `chunk` has no meaning for a text to be continued (a continuation of each piece is not a
/// continuation of the whole), so a `chunk` model middle-outs completion prompts: the head and
/// the tail, which the continuation depends on most, are kept. `reject` rejects; `max_tokens`
/// ≥ cap rejects whatever the action.
pub fn plan_text(counter: &dyn Count, text: &str, budget: Budget, action: OnOverflow) -> TextPlan {
    let prompt_tokens = counter.text_tokens(text);
    let reject = TextPlan::Reject {
        requested: budget.requested(prompt_tokens),
    };
    if budget.max_tokens_alone_over() {
        return reject;
    }
    if let Some(max_tokens) = budget.fitting(prompt_tokens) {
        return TextPlan::Fits {
            prompt_tokens,
            max_tokens,
        };
    }
    if action == OnOverflow::Reject {
        return reject;
    }
    middle_out_text(counter, text, budget, prompt_tokens).unwrap_or(reject)
}

/// Splits an embedding input into pieces at token boundaries, each fitting `cap` as the server
/// counts it (special tokens included), without overlap. Returns each piece's text with its
/// token count (tokens of the text, no special tokens: the weights for
/// [`average_embeddings`]). A text that fits is returned whole.
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
        if total == 0 {
            1.0 / pieces.len() as f64
        } else {
            tokens as f64 / total as f64
        }
    };
    let mut mean = vec![0f64; first.len()];
    for (vector, tokens) in pieces {
        for (sum, value) in mean.iter_mut().zip(vector) {
            *sum += f64::from(*value) * weight(*tokens);
        }
    }
    let all_unit = pieces
        .iter()
        .all(|(vector, _)| (norm(vector.iter().map(|v| f64::from(*v))) - 1.0).abs() < 1e-3);
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
        excess = conversation.remove_middle(excess);
        excess = conversation.cut_longest(counter, excess);
        if excess > 0 {
            return Ok(None);
        }
        let messages = conversation.kept();
        let counted = counter.chat_tokens(ChatPrompt {
            messages: &messages,
            ..prompt
        })?;
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
}

impl Conversation {
    fn new(counter: &dyn Count, messages: &[Value]) -> Self {
        let protected = protected_messages(messages);
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

    /// Cuts the middle of the longest kept text, again and again, until the estimated excess is
    /// gone or nothing can be cut; returns what is left.
    fn cut_longest(&mut self, counter: &dyn Count, mut excess: usize) -> usize {
        let marker_tokens = counter.encode(CUT_MARKER).len();
        while excess > 0 {
            let Some(longest) = self
                .texts
                .iter_mut()
                .filter(|text| text.cuttable && self.kept[text.message])
                .max_by_key(|text| text.tokens)
            else {
                return excess;
            };
            let keep = longest
                .kept
                .saturating_sub(excess + marker_tokens)
                .max(MIN_KEPT_TOKENS);
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
        self.messages
            .iter()
            .zip(&self.kept)
            .filter(|(_, kept)| **kept)
            .map(|(message, _)| message.clone())
            .collect()
    }
}

/// Messages middle-out never removes: system/developer messages, the first user message and
/// the last message.
fn protected_messages(messages: &[Value]) -> Vec<bool> {
    let first_user = messages.iter().position(|m| role(m) == "user");
    (0..messages.len())
        .map(|i| is_instruction(&messages[i]) || Some(i) == first_user || i + 1 == messages.len())
        .collect()
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
    let instructions_tokens = counter.chat_tokens(ChatPrompt {
        messages: &alone,
        ..prompt
    })?;
    if instructions_tokens + ids.len() <= budget.prompt_limit() {
        return Ok(None);
    }
    let split = Split {
        counter,
        prompt,
        budget,
        instructions,
        ids,
    };
    for head_tokens in REDUCE_HEAD_TOKENS {
        if let Some(plan) = split.plan(head_tokens)? {
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
    instructions: Vec<Value>,
    ids: Vec<u32>,
}

impl Split<'_> {
    /// A plan quoting `head_tokens` of the message in the reduce request, or `None`.
    fn plan(&self, head_tokens: usize) -> Result<Option<ChunkPlan>, CountError> {
        let cap = self.budget.cap;
        let head_end = clean_boundary(self.counter, &self.ids, head_tokens.min(self.ids.len()), 0);
        let head = self.counter.decode(&self.ids[..head_end]);
        let head_is_whole = head_end == self.ids.len();
        let framing_tokens = self.map_tokens(&map_text(WIDEST_PART_LABEL, WIDEST_PART_LABEL, ""))?;
        let Some(mut room) = cap.checked_sub(framing_tokens) else {
            return Ok(None);
        };
        let mut parts = 2;
        // `parts` only grows and `room` only shrinks: the loop ends.
        for _ in 0..256 {
            let reduce_base = self.reduce_tokens(&head, head_is_whole, parts)?;
            let Some(answers) = cap.checked_sub(self.budget.reserve() + reduce_base + REDUCE_SLACK) else {
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
            let pieces = self.pieces(&ranges)?;
            let over = pieces
                .iter()
                .map(|piece| (piece.prompt_tokens + map_max).saturating_sub(cap))
                .max()
                .unwrap_or(0);
            if over > 0 {
                room -= over.min(room);
                continue;
            }
            let reduce_max_tokens = self.budget.max_tokens.unwrap_or_else(|| {
                cap.saturating_sub(reduce_base + REDUCE_SLACK + parts * (map_max + PARTIAL_SLACK))
                    .max(1)
            });
            return Ok(Some(ChunkPlan {
                pieces,
                map_max_tokens: map_max,
                reduce_max_tokens,
                message_tokens: self.ids.len(),
                instructions: self.instructions.clone(),
                head,
                head_is_whole,
            }));
        }
        Ok(None)
    }

    fn pieces(&self, ranges: &[Range<usize>]) -> Result<Vec<Piece>, CountError> {
        let total = ranges.len();
        ranges
            .iter()
            .enumerate()
            .map(|(index, range)| {
                let text = self.counter.decode(&self.ids[range.clone()]);
                let mut messages = self.instructions.clone();
                messages.push(user_message(map_text(index + 1, total, &text)));
                let prompt_tokens = self.counter.chat_tokens(ChatPrompt {
                    messages: &messages,
                    tools: None,
                    template_kwargs: self.prompt.template_kwargs,
                })?;
                Ok(Piece {
                    messages,
                    text,
                    tokens: range.clone(),
                    prompt_tokens,
                })
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

    /// Tokens of a reduce prompt with `parts` empty partial answers (with the client's tools).
    fn reduce_tokens(&self, head: &str, head_is_whole: bool, parts: usize) -> Result<usize, CountError> {
        let mut messages = self.instructions.clone();
        messages.push(user_message(reduce_text(head, head_is_whole, parts, &vec![String::new(); parts])));
        self.counter.chat_tokens(ChatPrompt {
            messages: &messages,
            ..self.prompt
        })
    }
}

/// The user message of map request `index` (from 1) of `total`.
fn map_text(index: usize, total: usize, piece: &str) -> String {
    format!(
        "Part {index} of {total} of a long message. Answer the request below about this part only; \
         you will not see the other parts.\n\n{piece}"
    )
}

/// The user message of the reduce request.
fn reduce_text(head: &str, head_is_whole: bool, total: usize, partials: &[String]) -> String {
    let mut text = format!(
        "A long message was split into {total} parts, and each part was answered on its own."
    );
    if !head.is_empty() {
        text.push_str(" The message began:\n\n");
        text.push_str(head);
        if !head_is_whole {
            text.push_str(CUT_MARKER);
        }
    }
    text.push_str("\n\nThe answers for each part:");
    for (index, partial) in partials.iter().enumerate() {
        text.push_str(&format!("\n\n[Part {} of {total}]\n{partial}", index + 1));
    }
    text.push_str(
        "\n\nUsing these partial answers, answer the original request of the long message as \
         if you had read it whole.",
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
        let next = clean_boundary(counter, ids, end.saturating_sub(overlap), start + 1);
        start = next.max(start + 1);
    }
}

/// The end of a piece starting at `start` of at most `len` tokens (at least one).
fn piece_end(counter: &dyn Count, ids: &[u32], start: usize, len: usize) -> usize {
    let end = (start + len.max(1)).min(ids.len());
    if end == ids.len() {
        end
    } else {
        clean_boundary(counter, ids, end, start + 1)
    }
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
    let text = format!(
        "{}{CUT_MARKER}{}",
        counter.decode(&ids[..head]),
        counter.decode(&ids[tail_start..])
    );
    (text, head + ids.len() - tail_start)
}

/// `at`, or up to [`MAX_BOUNDARY_SHIFT`] tokens before it (not below `floor`), where the text
/// splits cleanly: decoding both sides apart gives the same text as decoding them together (a
/// byte-level BPE token may hold half a character).
fn clean_boundary(counter: &dyn Count, ids: &[u32], at: usize, floor: usize) -> usize {
    (0..=MAX_BOUNDARY_SHIFT)
        .map_while(|shift| at.checked_sub(shift).filter(|b| *b >= floor))
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
                ["name", "arguments"]
                    .into_iter()
                    .filter_map(|key| function.get(key).and_then(Value::as_str))
            })
            .collect::<Vec<_>>()
            .join(" "),
    )
}

fn set_text(message: &mut Value, part: Option<usize>, text: String) {
    let slot = match part {
        None => message.get_mut("content"),
        Some(index) => message
            .get_mut("content")
            .and_then(|content| content.get_mut(index))
            .and_then(|part| part.get_mut("text")),
    };
    if let Some(slot) = slot {
        *slot = Value::String(text);
    }
}
