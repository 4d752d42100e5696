//! A backend's chat completion as the translating faces (Responses, Anthropic Messages) read
//! it: one stream chunk or a whole completion (`message` read as `delta`), only the fields
//! they translate, each optional, so that any server's variant parses.

use serde::Deserialize;
use serde_json::Value;

/// One chat stream chunk (or a whole completion), read as far as the translation needs.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Chunk {
    /// omlx's keep-alive is a data chunk with this id and an empty text: a `ping`.
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub choices: Vec<Choice>,
    #[serde(default)]
    pub usage: Option<Usage>,
    #[serde(default)]
    pub error: Option<Value>,
    /// The gateway's request id on its own error events.
    #[serde(default)]
    pub request_id: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Choice {
    #[serde(default)]
    pub index: u64,
    /// A stream's `delta`, or a whole completion's `message`.
    #[serde(default, alias = "message")]
    pub delta: Option<Delta>,
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// The stop string that ended the answer, where the server says (vLLM's `stop_reason`,
    /// SGLang's `matched_stop`).
    #[serde(default, alias = "matched_stop")]
    pub stop_reason: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct Delta {
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub reasoning_content: Option<String>,
    /// Another name servers use (mlx-vlm sends the same text in both: one is taken).
    #[serde(default)]
    pub reasoning: Option<String>,
    #[serde(default)]
    pub tool_calls: Option<Vec<CallDelta>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct CallDelta {
    #[serde(default)]
    pub index: Option<u64>,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub function: Option<FunctionDelta>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct FunctionDelta {
    #[serde(default)]
    pub name: Option<String>,
    /// A string (in pieces when streamed); some servers give a whole answer's as an object.
    #[serde(default)]
    pub arguments: Option<Value>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub(crate) struct Usage {
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub completion_tokens: Option<u64>,
    #[serde(default)]
    pub total_tokens: Option<u64>,
    #[serde(default)]
    pub prompt_tokens_details: Option<PromptDetails>,
    #[serde(default)]
    pub completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub(crate) struct PromptDetails {
    #[serde(default)]
    pub cached_tokens: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub(crate) struct CompletionDetails {
    #[serde(default)]
    pub reasoning_tokens: Option<u64>,
}

/// A chat error event's message: `error.message`, a string error, or the error's JSON.
pub(crate) fn error_message(error: &Value) -> String {
    match error {
        Value::String(text) => text.clone(),
        other => other.get("message").and_then(Value::as_str).map_or_else(|| other.to_string(), str::to_string),
    }
}
