//! Middle-out: the plan that makes an over-long prompt fit by removing middle messages oldest
//! first (in groups that keep tool calls with their answers) and cutting the middle of the
//! longest text ([`middle_out`]), or, for a `/v1/completions` text, cutting its middle
//! ([`middle_out_text`]). Works from per-message estimates and verifies with full counts.

use serde_json::Value;

use super::cut::{CUT_MARKER, cut_middle};
use super::messages::{is_instruction, role, set_text, text_segments, tool_call_text};
use super::{Budget, ChatPlan, TextPlan};
use crate::tokens::{ChatPrompt, Count, CountError};

/// Tokens a truncated text keeps at least (head and tail together); a shorter one is not cut.
pub(super) const MIN_KEPT_TOKENS: usize = 32;
/// Full counts a middle-out may spend verifying before it gives up (reject).
const MAX_VERIFICATIONS: usize = 4;

/// Middle-out: `Some((messages, prompt tokens))` fitting `budget.prompt_limit()`, or `None`
/// when it can not fit.
pub(super) fn middle_out(
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
pub(super) fn last_user(messages: &[Value]) -> Option<usize> {
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

/// Middle-out of a text prompt: its head and tail around [`CUT_MARKER`], fitting
/// `budget.prompt_limit()`, or `None` when it can not fit.
pub(super) fn middle_out_text(
    counter: &dyn Count,
    text: &str,
    budget: Budget,
    prompt_tokens: usize,
) -> Option<TextPlan> {
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
