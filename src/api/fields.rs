//! The request's fields as every face hands them to the pipeline: the top-level fields of an
//! OpenAI request in their order, values left as raw JSON text ([`RawBody`]), and what the
//! pipeline reads of them before it counts a prompt (the model asked for, a cheap estimate).

use indexmap::IndexMap;
use serde_json::value::RawValue;

use crate::error::GatewayError;
use crate::tokens::Count;
use crate::tokens::counter::Estimate;

/// A request body: top-level fields in their original order, values left as raw JSON.
pub(crate) type RawBody = IndexMap<String, Box<RawValue>>;

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
    ["messages", "prompt", "input", "tools"]
        .iter()
        .filter_map(|key| fields.get(*key))
        .map(|raw| Estimate.text_tokens(raw.get()) as u64)
        .sum()
}
