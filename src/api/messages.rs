//! `POST /v1/messages`: the Anthropic Messages API face (Claude Code, the anthropic SDKs). A
//! request is translated onto the backend's chat completions (`request`) and goes through the
//! chat face's own pipeline ([`openai::serve`]); its answer is translated back.

pub mod count;
pub(crate) mod request;
