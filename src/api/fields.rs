//! The request's fields as every face hands them to the pipeline: the top-level fields of an
//! OpenAI request in their order, values left as raw JSON text ([`RawBody`]), and what the
//! pipeline reads of them before it counts a prompt (the model asked for, a cheap estimate).

use indexmap::IndexMap;
use serde_json::value::RawValue;

use crate::error::GatewayError;
use crate::tokens::Count;
use crate::tokens::counter::Estimate;

/// A request body: top-level fields in their original order, values left as raw JSON.
pub(crate) type RawBody = IndexMap<String, Box<RawValue>, foldhash::fast::RandomState>;

/// The `model` the request asks for (a 400 when it is missing or not a string).
pub(crate) fn requested_model(fields: &RawBody) -> Result<String, GatewayError> {
    let raw = fields
        .get("model")
        .ok_or_else(|| GatewayError::invalid("you must provide a model parameter", Some("model")))?;
    serde_json::from_str::<String>(raw.get())
        .map_err(|_| GatewayError::invalid("`model` must be a string", Some("model")))
}

/// A cheap estimate of a prompt's tokens when no count was made (no context cap, a map-reduce,
/// embeddings): the estimate's count of the prompt fields' JSON text. Settled to the backend's
/// usage at the end.
pub(crate) fn estimated_prompt_tokens(fields: &RawBody) -> u64 {
    fields
        .iter()
        .filter(|(key, _)| matches!(key.as_str(), "messages" | "prompt" | "input" | "tools"))
        .map(|(_, raw)| Estimate.text_tokens(raw.get()) as u64)
        .sum()
}

/// The session key a request's body carries, for a model balanced by session: OpenAI's
/// `prompt_cache_key` (Codex sends its session id there), else `user`, else Anthropic's
/// `metadata.user_id`; strings only, at most [`MAX_SESSION_KEY`] bytes (a longer one is cut).
pub(crate) fn session_key(fields: &RawBody) -> Option<String> {
    let string = |raw: &RawValue| serde_json::from_str::<String>(raw.get()).ok().filter(|s| !s.is_empty());
    let metadata_user = || {
        let raw = fields.get("metadata")?;
        let metadata: IndexMap<String, Box<RawValue>> = serde_json::from_str(raw.get()).ok()?;
        metadata.get("user_id").and_then(|raw| string(raw))
    };
    let key = fields
        .get("prompt_cache_key")
        .and_then(|raw| string(raw))
        .or_else(|| fields.get("user").and_then(|raw| string(raw)))
        .or_else(metadata_user)?;
    Some(cut_to(key, MAX_SESSION_KEY))
}

/// Longest session key kept, in bytes.
pub(crate) const MAX_SESSION_KEY: usize = 512;

/// `text` cut to at most `max` bytes, on a character boundary.
pub(crate) fn cut_to(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}
