//! Prompt tokens: counting a request's prompt with the model's own tokenizer and chat template
//! (`counter`), and deciding what to do with a prompt over a backend's context cap
//! (`overflow`: reject, middle-out, chunk). The handler carries a plan out; nothing here does
//! I/O after start-up.

pub mod counter;
pub mod overflow;
pub mod registry;
pub mod template;

use serde_json::Value;

/// A chat request's prompt as the server's chat template sees it.
#[derive(Debug, Clone, Copy)]
pub struct ChatPrompt<'a> {
    /// The request's `messages`, as the client sent them.
    pub messages: &'a [Value],
    /// The request's `tools` (OpenAI function definitions), when present.
    pub tools: Option<&'a [Value]>,
    /// The request's `chat_template_kwargs` (e.g. `enable_thinking`), when present: passed to
    /// the template as variables, as the servers do.
    pub template_kwargs: Option<&'a serde_json::Map<String, Value>>,
}

/// Why a prompt could not be counted.
#[derive(Debug, thiserror::Error)]
pub enum CountError {
    /// The chat template failed on these messages (e.g. it raised an exception: roles must
    /// alternate).
    #[error("the model's chat template failed on these messages: {0}")]
    Template(String),
}

/// What counts prompt tokens: the model's own tokenizer ([`counter::Counter`]) or a
/// conservative estimate when none is found.
pub trait Count: Send + Sync {
    /// Tokens of a chat prompt as the server renders and tokenizes it (the chat template with
    /// `add_generation_prompt: true`, then the tokenizer without adding special tokens again),
    /// the same as `transformers`' `apply_chat_template(..., tokenize=True)`.
    fn chat_tokens(&self, prompt: ChatPrompt<'_>) -> Result<usize, CountError>;
    /// Tokens of a `/v1/completions` text prompt as the server tokenizes it (special tokens
    /// added by the tokenizer's post-processor included).
    fn text_tokens(&self, text: &str) -> usize;
    /// A cheap upper bound of [`Count::chat_tokens`] (the default: the count itself). A
    /// byte-level tokenizer never makes more tokens than the rendered prompt has bytes, so a
    /// prompt whose bound fits needs no tokenizing.
    fn chat_tokens_at_most(&self, prompt: ChatPrompt<'_>) -> Result<usize, CountError> {
        self.chat_tokens(prompt)
    }
    /// The token ids of plain text, no special tokens added (to split text at token
    /// boundaries).
    fn encode(&self, text: &str) -> Vec<u32>;
    /// The text of token ids (inverse of `encode` on whole pieces).
    fn decode(&self, ids: &[u32]) -> String;
    /// Whether the counts are the model's own (false: an estimate).
    fn exact(&self) -> bool;
}

/// What a model does with a prompt over its backend's context cap (`on_overflow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnOverflow {
    /// 400 `context_length_exceeded` with OpenAI's wording.
    #[default]
    Reject,
    /// OpenRouter's middle-out: drop middle messages, then cut the longest one's middle.
    #[serde(alias = "middle-out")]
    MiddleOut,
    /// Map the over-long last user message in pieces, then reduce the partial answers.
    Chunk,
}

impl OnOverflow {
    /// The `action` label of `mlxgate_context_overflow_total`.
    pub fn label(self) -> &'static str {
        match self {
            OnOverflow::Reject => "reject",
            OnOverflow::MiddleOut => "middle_out",
            OnOverflow::Chunk => "chunk",
        }
    }
}
