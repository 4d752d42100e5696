//! TEMPORARY shim of the planner's API (the real one is written on its branch).
use serde_json::Value;

use super::{ChatPrompt, Count, CountError, OnOverflow};

#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub cap: usize,
    pub max_tokens: Option<usize>,
}
pub enum ChatPlan {
    Fits { prompt_tokens: usize, max_tokens: usize },
    Reject { requested: usize },
    MiddleOut { messages: Vec<Value>, prompt_tokens: usize, removed_tokens: usize, max_tokens: usize },
    Chunk(ChunkPlan),
}
pub struct ChunkPlan {
    pub pieces: Vec<Vec<Value>>,
    pub piece_max_tokens: usize,
    pub max_tokens: usize,
}
impl ChunkPlan {
    pub fn reduce_messages(&self, _partials: &[String]) -> Vec<Value> {
        vec![]
    }
}
pub enum TextPlan {
    Fits { prompt_tokens: usize, max_tokens: usize },
    Reject { requested: usize },
    MiddleOut { text: String, prompt_tokens: usize, removed_tokens: usize, max_tokens: usize },
}
pub fn plan_chat(_c: &dyn Count, _p: ChatPrompt<'_>, _b: Budget, _a: OnOverflow) -> Result<ChatPlan, CountError> {
    Ok(ChatPlan::Reject { requested: 0 })
}
pub fn plan_text(_c: &dyn Count, _t: &str, _b: Budget, _a: OnOverflow) -> TextPlan {
    TextPlan::Reject { requested: 0 }
}
pub fn split_for_embedding(_c: &dyn Count, _t: &str, _cap: usize) -> Vec<(String, usize)> {
    vec![]
}
pub fn average_embeddings(_p: &[(Vec<f32>, usize)]) -> Vec<f32> {
    vec![]
}
