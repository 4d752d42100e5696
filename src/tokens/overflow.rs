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
//!
//! This file owns the plans ([`ChatPlan`], [`TextPlan`]) and the entry points that choose one
//! ([`plan_chat`], [`plan_text`]); the rest is in its sub-modules: `budget` (the room
//! arithmetic: [`Budget`], [`Requested`]), `middle_out` (middle-out of a chat or text prompt),
//! `chunk` (chunk plans: map pieces, reduce), `embedding` (embedding pieces and their average),
//! `cut` (cutting token ids on character boundaries) and `messages` (reading and writing chat
//! messages).

mod budget;
mod chunk;
mod cut;
mod embedding;
mod messages;
mod middle_out;

use serde_json::Value;

pub use budget::{Budget, Requested};
pub use chunk::{ChunkPlan, MIN_PARTIAL_TOKENS, Piece};
pub use cut::CUT_MARKER;
pub use embedding::{average_embeddings, split_for_embedding};

use super::{ChatPrompt, Count, CountError, OnOverflow};
use chunk::chunk;
use middle_out::{middle_out, middle_out_text};

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

#[cfg(test)]
mod tests;
