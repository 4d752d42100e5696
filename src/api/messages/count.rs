//! `POST /v1/messages/count_tokens`: the tokens of a Messages request's prompt, counted as the
//! context cap counts it. The body is a Messages request (`model`, `system`, `messages`,
//! `tools`, `tool_choice`, `thinking`; `max_tokens` is not needed); it is translated as
//! `/v1/messages` translates it (the billing block dropped, system blocks joined, tools as
//! functions) and the chat prompt it becomes is counted with the model's own chat template and
//! tokenizer ([`fit::chat_prompt_tokens`]): the number Claude Code compacts by is the one the
//! cap refuses at. A model without a tokenizer is counted with the gateway's estimate, as its
//! cap is. No backend is asked and no queue slot taken; the request is counted in
//! `mlxgate_requests_total` and the access log as any other (its model named, its backend
//! empty). It is not subject to the client's rate limits and charges none: it costs no backend
//! time, a limit on requests in flight would refuse Claude Code's count while its own stream
//! runs, and its CPU is bounded by the counting pool the context cap uses (one count per core
//! at once), of which counts take at most all cores but one ([`share`]): however many a client
//! sends at once, the chat faces' own counts (Claude Code's turns) still find a core. A billing block it drops is not counted in
//! `mlxgate_anthropic_billing_blocks_stripped_total` (nothing is sent on).

use std::sync::Arc;

use axum::Json;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::request;
use crate::access_log::Face;
use crate::api::AppState;
use crate::api::arrival;
use crate::api::fit;
use crate::api::{body, fields};
use crate::auth;
use crate::error::GatewayError;
use crate::outcome::{Outcome, RequestRecord};

/// POST `/v1/messages/count_tokens`: `{"input_tokens": N}`, or an error in Anthropic's shape.
/// Anthropic's `request-id` header carries the request's id, as on `/v1/messages`.
pub async fn count_tokens(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let request_id = super::request_id_of(&request);
    let mut record = arrival::take_record(&state, &request);
    record.set_face(Face::Messages);
    let mut response = match count(&state, request, &mut record).await {
        Ok(tokens) => {
            record.responded(200);
            record.finish(Outcome::Ok);
            Json(json!({"input_tokens": tokens})).into_response()
        }
        Err(e) => {
            record.responded(e.status().as_u16());
            record.finish(Outcome::from(&e));
            super::anthropic_error(e.into_response())
        }
    };
    if let Some(id) = request_id {
        response.headers_mut().insert(super::REQUEST_ID, id);
    }
    response
}

/// identify (before the body is read) → read → translate → route (an unknown model, or one
/// the client may not use, is 404) → count.
async fn count(state: &Arc<AppState>, request: Request, record: &mut RequestRecord) -> Result<usize, GatewayError> {
    let (parts, body) = request.into_parts();
    let access = state.access();
    let caller = auth::identify(&access, &parts.headers)?;
    record.identified(caller.name());
    let bytes = body::read_body(&parts, body, state.config.max_body_bytes, state.config.body_read_timeout).await?;
    let translated = request::translate(&bytes)?;
    drop(bytes);
    let asked = fields::requested_model(&translated.fields)?;
    let model = state.config.model_named(&asked).to_string();
    let route = state.dispatch.route(&model).filter(|_| caller.may_use(&access, &model)).ok_or_else(|| {
        record.asked(&asked);
        GatewayError::ModelNotFound(asked.clone())
    })?;
    // Counted under its model, with no backend: none was asked.
    record.routed(&model, "");
    if asked != model {
        record.aliased(&asked);
    }
    let share = share().acquire().await.map_err(|e| GatewayError::Internal(format!("counting: {e}")))?;
    fit::chat_prompt_tokens(&state.metrics, route, state.tokens.get(&model), &translated.fields, share).await
}

/// Counts of this endpoint run at once: [`share_of`] the machine's cores.
fn share() -> &'static tokio::sync::Semaphore {
    static SHARE: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    SHARE.get_or_init(|| {
        tokio::sync::Semaphore::new(share_of(std::thread::available_parallelism().map_or(2, std::num::NonZero::get)))
    })
}

/// All of the counting pool's `cores` but one, at least one.
fn share_of(cores: usize) -> usize {
    cores.saturating_sub(1).max(1)
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_take_every_core_but_one() {
        let shares: Vec<usize> = [0, 1, 2, 8].into_iter().map(super::share_of).collect();
        assert_eq!(shares, [1, 1, 1, 7]);
    }
}
