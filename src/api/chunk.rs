//! chunk: carries out the `chunk` plans. A chat message too long for the backend's context is
//! mapped piece by piece (each piece its own request through the same queue, as many at once as
//! the backend has slots) and the partial answers are returned for the reduce request, which
//! then takes the normal path (streamed if the client asked). An embedding input too long is
//! embedded in pieces (one backend request) and each input's vectors are averaged.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use base64::Engine;
use futures_util::{StreamExt, TryStreamExt};
use serde_json::{Value, json};

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt;

use super::AppState;
use super::answer::{self, Wrapped};
use super::body::{MAX_WHOLE_ANSWER, read_whole};
use super::fields::{RawBody, estimated_prompt_tokens};
use super::fit::{Chunked, EmbedPlan, raw};
use super::outgoing::{for_position, prepare};
use crate::backend::handle::Answer;
use crate::dispatch::Route;
use crate::dispatch::call::{self, Encode, Held, Prepared};
use crate::dispatch::queue::ClientId;
use crate::error::{ErrorBody, GatewayError, backend_error_body, with_request_id};
use crate::outcome::{Outcome, RequestRecord};
use crate::stream::figures::{StreamFigures, Whole, figures_of_whole};
use crate::tokens::overflow::{ChunkPlan, average_embeddings};

/// How long a map part that found the queue full waits before it asks again.
const QUEUE_FULL_PAUSE: Duration = Duration::from_millis(200);

/// Fields of the client's request that make no sense for a map request: it must answer with
/// text, once, whole.
const NOT_FOR_PARTS: [&str; 9] = [
    "stream_options",
    "n",
    "max_completion_tokens",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "logprobs",
    "top_logprobs",
    "response_format",
];

/// Sends every piece of `plan` as its own request ("map") and returns their answers' texts in
/// order. Each part is recorded as a request of the model (it took a slot and backend time),
/// labelled with the client of `request`, the client's request: what each part used is added
/// to `request`, whose one admission is settled to it too (also when a later part or the
/// reduce fails).
pub async fn map(
    state: &AppState,
    route: &Route,
    client: &ClientId,
    parts: &axum::http::request::Parts,
    fields: &RawBody,
    chunked: &Chunked,
    request: &RequestRecord,
) -> Result<Vec<String>, GatewayError> {
    let plan = &chunked.plan;
    let width = route.backend.config.max_concurrency.clamp(1, plan.pieces.len().max(1));
    let jobs: Vec<_> = plan
        .pieces
        .iter()
        .map(|piece| {
            let messages = chunked.restore.apply(piece.messages.clone());
            map_part(state, route, client, parts, fields, messages, plan, request)
        })
        .collect();
    futures_util::stream::iter(jobs).buffered(width).try_collect().await
}

/// One map request: the client's request with one piece's messages, whole, text only. What
/// it used is added to `request`.
#[allow(clippy::too_many_arguments)]
async fn map_part(
    state: &AppState,
    route: &Route,
    client: &ClientId,
    parts: &axum::http::request::Parts,
    fields: &RawBody,
    messages: Vec<Value>,
    plan: &ChunkPlan,
    request: &RequestRecord,
) -> Result<String, GatewayError> {
    let mut body = fields.clone();
    for key in NOT_FOR_PARTS {
        body.shift_remove(key);
    }
    body.insert("messages".into(), raw(&messages)?);
    body.insert("stream".into(), raw(&false)?);
    body.insert("max_tokens".into(), raw(&plan.map_max_tokens)?);
    let (whole, figures) = whole_answer(state, route, client, parts, &body, request, Some(request.piece())).await?;
    request.add_pieces_used(figures.usage());
    Ok(answer_text(&whole))
}

/// The reduce request: the plan's prompt over the partial answers, with the client's
/// `max_tokens` or (none given) the room left, cut to the model's default.
pub fn reduce_request(
    fields: &mut RawBody,
    chunked: &Chunked,
    partials: &[String],
    default_max_tokens: u32,
) -> Result<(), GatewayError> {
    let plan = &chunked.plan;
    fields.insert("messages".into(), raw(&chunked.restore.apply(plan.reduce_messages(partials)))?);
    let given =
        ["max_tokens", "max_completion_tokens"].iter().any(|k| fields.get(*k).is_some_and(|v| v.get() != "null"));
    let max_tokens =
        if given { plan.reduce_max_tokens } else { plan.reduce_max_tokens.min(default_max_tokens as usize) };
    fields.insert("max_tokens".into(), raw(&max_tokens)?);
    fields.shift_remove("max_completion_tokens");
    Ok(())
}

/// The `x-mlxgate-transform` header of a chunked request.
pub fn transform(plan: &ChunkPlan) -> String {
    let pieces = plan.pieces.len();
    match plan.max_tokens_cut {
        true => format!("chunk; pieces={pieces}, max_tokens={}", plan.reduce_max_tokens),
        false => format!("chunk; pieces={pieces}"),
    }
}

/// A chunked request whose client asked for a stream, carried out after its headers are sent.
pub struct StreamedJob {
    pub model: String,
    pub client: ClientId,
    pub parts: axum::http::request::Parts,
    pub fields: RawBody,
    pub chunked: Chunked,
}

/// How often a streamed chunked request says it is still mapping.
const MAP_KEEPALIVE: Duration = Duration::from_secs(5);

/// A chunked request for a streaming client: the SSE headers at once, `: mlxgate chunk …`
/// comments while the pieces are mapped (a client or proxy with a read timeout would otherwise
/// give up during minutes of prefill), then the reduce's stream, metered as any stream. A
/// failure before the reduce streams ends the stream with an error event. The task stops when
/// the client goes (its record: `client_closed`) or at the end of the shutdown grace.
pub fn streamed(state: Arc<AppState>, job: StreamedJob, mut record: RequestRecord) -> Response {
    // The client's status is this 200, whatever the reduce's turns out to be.
    record.responded(StatusCode::OK.as_u16());
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let header = transform(&job.chunked.plan);
    tokio::spawn(run_streamed(state, job, record, tx));
    let frames = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    let body = Body::from_stream(frames);
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(answer::ACCEL_BUFFERING, HeaderValue::from_static("no"));
    if let Ok(v) = HeaderValue::from_str(&header) {
        headers.insert(answer::TRANSFORM_HEADER, v);
    }
    response
}

type Sender = tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>;

async fn run_streamed(state: Arc<AppState>, job: StreamedJob, mut record: RequestRecord, tx: Sender) {
    let StreamedJob { model, client, parts, mut fields, chunked } = job;
    let Some(route) = state.dispatch.route(&model) else { return };
    let cut = state.cutoff.notified();
    tokio::pin!(cut);
    let said = format!(": mlxgate chunk: mapping {} pieces\n\n", chunked.plan.pieces.len());
    if tx.send(Ok(Bytes::from(said))).await.is_err() {
        return;
    }
    let answered = async {
        let mut keepalive = tokio::time::interval(MAP_KEEPALIVE);
        keepalive.tick().await;
        let partials = {
            let map = map(&state, route, &client, &parts, &fields, &chunked, &record);
            tokio::pin!(map);
            loop {
                tokio::select! {
                    partials = &mut map => break partials?,
                    _ = keepalive.tick() => {
                        if tx.send(Ok(Bytes::from_static(b": mlxgate chunk: mapping\n\n"))).await.is_err() {
                            return Ok(None);
                        }
                    }
                }
            }
        };
        reduce_request(&mut fields, &chunked, &partials, route.model.default_max_tokens)?;
        let reduce_estimate = estimated_prompt_tokens(&fields);
        // The reduce's prefill can take minutes too: the comments go on until its first byte.
        let sent = record.sent_flag();
        let terms = answer::Terms { request_id: Some(record.request_id().clone()), ..answer::Terms::default() };
        let reduce = answer::call(&state, route, &client, &parts, fields, terms, &sent);
        tokio::pin!(reduce);
        loop {
            tokio::select! {
                answered = &mut reduce => break answered.map(|a| Some((a, reduce_estimate))),
                _ = keepalive.tick() => {
                    if tx.send(Ok(Bytes::from_static(b": mlxgate chunk: reducing\n\n"))).await.is_err() {
                        return Ok(None);
                    }
                }
            }
        }
    };
    let answered = tokio::select! {
        answered = answered => answered,
        () = tx.closed() => return,
        () = &mut cut => Err(GatewayError::ShuttingDown),
    };
    let answered = match answered {
        Ok(Some((answered, reduce_estimate))) => {
            record.reestimated(reduce_estimate);
            answered
        }
        Ok(None) => return,
        Err(e) => {
            let _ = tx.send(Ok(e.sse_event_for(record.request_id().as_str()))).await;
            record.finish(Outcome::from(&e));
            return;
        }
    };
    let id = record.request_id().clone();
    let response = match answered.into_response(record, Arc::clone(&state.cutoff)) {
        Wrapped::Now(response) => response,
        Wrapped::Read(reading) => reading.await,
    };
    let error_body = response.extensions().get::<ErrorBody>().map(|e| e.body.clone());
    let ok = response.status().is_success();
    let sse = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if ok && !sse {
        // The backend answered the reduce whole although a stream was asked: one chunk event
        // with the whole answer, then [DONE], so the client's stream parser gets a stream.
        let whole = response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let _ = tx.send(Ok(Bytes::from(whole_as_events(&whole, id.as_str())))).await;
        return;
    }
    let mut body = response.into_body();
    let mut error = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { break };
        let Ok(data) = frame.into_data() else { continue };
        if !ok {
            error.extend_from_slice(&data);
            continue;
        }
        if tx.send(Ok(data)).await.is_err() {
            return;
        }
    }
    if !ok {
        // The reduce was refused after the client's 200: its error as the stream's last event.
        if let Some(mut body) = error_body {
            with_request_id(&mut body, id.as_str());
            error = body.to_string().into_bytes();
        }
        let mut event = b"data: ".to_vec();
        event.extend_from_slice(&error);
        event.extend_from_slice(b"\n\n");
        let _ = tx.send(Ok(Bytes::from(event))).await;
    }
}

/// A whole chat answer as the SSE events of a stream: one `chat.completion.chunk` carrying the
/// message as its delta (with the answer's finish reason and usage), then `[DONE]`.
fn whole_as_events(whole: &[u8], request_id: &str) -> String {
    let Ok(answer) = serde_json::from_slice::<Value>(whole) else {
        let e = GatewayError::Internal("the backend's whole answer to the reduce is not JSON".into());
        return String::from_utf8_lossy(&e.sse_event_for(request_id)).into_owned();
    };
    let choices: Vec<Value> = answer["choices"]
        .as_array()
        .map(|choices| {
            choices
                .iter()
                .map(|c| json!({"index": c["index"], "delta": c["message"], "finish_reason": c["finish_reason"]}))
                .collect()
        })
        .unwrap_or_default();
    let mut chunk = json!({"id": answer["id"], "object": "chat.completion.chunk", "created": answer["created"],
        "model": answer["model"], "choices": choices});
    if !answer["usage"].is_null() {
        chunk["usage"] = answer["usage"].clone();
    }
    format!("data: {chunk}\n\ndata: [DONE]\n\n")
}

/// Embeds every piece of `plan` in one request and answers the client with each input's
/// vector: its pieces' vectors averaged, weighted by their tokens. The returned figures are
/// the backend's usage, which the client's `request` records and is settled to.
pub async fn embed(
    state: &AppState,
    route: &Route,
    client: &ClientId,
    parts: &axum::http::request::Parts,
    mut fields: RawBody,
    plan: EmbedPlan,
    request: &RequestRecord,
) -> Result<(Response, StreamFigures), GatewayError> {
    let base64 = fields.get("encoding_format").is_some_and(|f| f.get() == r#""base64""#);
    fields.insert("input".into(), raw(&plan.pieces)?);
    fields.insert("encoding_format".into(), raw("float")?);
    // One backend request for all the pieces: it is the client's request, recorded once (by
    // the handler, with these figures), not a piece of its own.
    let (whole, figures) = whole_answer(state, route, client, parts, &fields, request, None).await?;
    let backend = &route.backend.config.name;
    let unusable = |what: &str| GatewayError::Backend {
        backend: backend.clone(),
        reason: format!("its embeddings answer {what}"),
    };
    let mut answer: Value = serde_json::from_slice(&whole).map_err(|_| unusable("is not JSON"))?;
    let data = answer.get("data").and_then(Value::as_array).ok_or_else(|| unusable("has no data array"))?;
    let mut vectors: Vec<Option<Vec<f32>>> = vec![None; plan.pieces.len()];
    for (position, item) in data.iter().enumerate() {
        let index = item.get("index").and_then(Value::as_u64).map_or(position, |i| i as usize);
        let vector = item
            .get("embedding")
            .and_then(Value::as_array)
            .and_then(|v| v.iter().map(|x| x.as_f64().map(|x| x as f32)).collect::<Option<Vec<f32>>>())
            .ok_or_else(|| unusable("has an embedding that is not an array of numbers"))?;
        if let Some(slot) = vectors.get_mut(index) {
            *slot = Some(vector);
        }
    }
    let mut out = Vec::with_capacity(plan.groups.len());
    for (index, group) in plan.groups.iter().enumerate() {
        let pieces: Vec<(Vec<f32>, usize)> = group
            .iter()
            .map(|&(piece, tokens)| vectors[piece].clone().map(|v| (v, tokens)))
            .collect::<Option<_>>()
            .ok_or_else(|| unusable("lacks the vector of a piece"))?;
        let vector = average_embeddings(&pieces);
        let embedding = if base64 {
            let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
            Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
        } else {
            json!(vector)
        };
        out.push(json!({"object": "embedding", "index": index, "embedding": embedding}));
    }
    answer["data"] = Value::Array(out);
    if answer.get("model").is_some() {
        // The name the client asked for, not the backend's.
        answer["model"] = Value::from(request.public_model());
    }
    let mut response = Response::new(Body::from(answer.to_string()));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Ok(v) = HeaderValue::from_str(&format!("chunk; pieces={}", plan.piece_count())) {
        headers.insert(answer::TRANSFORM_HEADER, v);
    }
    *response.status_mut() = StatusCode::OK;
    Ok((response, figures))
}

/// One request of a plan, sent through the model's queue and read whole. `piece`: the record
/// of a map piece, finished here as a request of its own; `None` when this backend request is
/// the client's `request` itself (chunked embeddings), which its caller finishes. Returns the
/// answer and its figures.
async fn whole_answer(
    state: &AppState,
    route: &Route,
    client: &ClientId,
    parts: &axum::http::request::Parts,
    body: &RawBody,
    request: &RequestRecord,
    piece: Option<RequestRecord>,
) -> Result<(Vec<u8>, StreamFigures), GatewayError> {
    let finish = |piece: Option<RequestRecord>, status: StatusCode, outcome: Outcome| {
        if let Some(mut piece) = piece {
            piece.responded(status.as_u16());
            piece.finish(outcome);
        }
    };
    let pristine = (route.backends.len() > 1).then_some(body);
    let outgoing = prepare(parts, body, route)?;
    let other = |position: usize| for_position(parts, route, pristine, position);
    let encode: Option<Encode<'_>> = if pristine.is_some() { Some(&other) } else { None };
    // Sent: the piece's own record (the client's request is sent only with its reduce: one
    // that ends during the map is charged its pieces' usage alone), or, for the one request
    // of chunked embeddings, the client's request itself.
    let sent = piece.as_ref().map_or_else(|| request.sent_flag(), RequestRecord::sent_flag);
    // A part that finds the queue full waits for room within the model's max_wait rather than
    // failing the whole request after the parts before it did their work.
    let deadline = Instant::now() + route.model.max_wait;
    let request_id = request.request_id().as_str();
    let Held { permit, answer, .. } = loop {
        let max_wait = route.model.max_wait;
        let prepared = Prepared {
            route,
            client,
            outbound: &outgoing.outbound,
            encode,
            router: None,
            sent: &sent,
            max_wait,
            request_id,
        };
        match call::call(prepared, &state.metrics, &state.cutoff).await {
            Ok(held) => break held,
            Err(GatewayError::QueueFull { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(QUEUE_FULL_PAUSE).await;
            }
            Err(e) => {
                finish(piece, e.status(), Outcome::from(&e));
                return Err(e);
            }
        }
    };
    // The model's backend that served it (a model of several: the least loaded, pieces are
    // not a conversation to route by cache).
    let served = &route.backends.get(permit.position()).unwrap_or(&route.backend).config;
    let backend = served.name.clone();
    let mut piece = piece;
    if let Some(piece) = piece.as_mut() {
        piece.served_by(&backend);
    }
    let Answer { head, body, first, .. } = answer;
    let whole = read_whole(&backend, first, body, MAX_WHOLE_ANSWER, served.stream_idle_timeout).await;
    drop(permit);
    let whole = match whole {
        Ok(whole) => whole,
        Err(e) => {
            finish(piece, e.status(), Outcome::from(&e));
            return Err(e);
        }
    };
    if !head.status.is_success() {
        let body = backend_error_body(&backend, head.status, &whole);
        finish(piece, head.status, Outcome::BackendRejected);
        let message = body["error"]["message"].as_str().unwrap_or("no message").to_string();
        return Err(GatewayError::Backend {
            backend,
            reason: format!("a piece was refused ({}): {message}", head.status),
        });
    }
    let figures = figures_of_whole(&whole).unwrap_or_default();
    if let Some(mut piece) = piece {
        piece.responded(head.status.as_u16());
        piece.finish_answered(Outcome::Ok, &figures.of_whole(Whole::Answer));
    }
    Ok((whole, figures))
}

/// The text of a whole chat answer's first choice (empty when it has none), without a thinking
/// model's `<think>…</think>` block: the reduce request needs the answers, not the reasoning.
fn answer_text(whole: &[u8]) -> String {
    let Ok(value) = serde_json::from_slice::<Value>(whole) else { return String::new() };
    let message = &value["choices"][0]["message"];
    let text = match &message["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join(""),
        _ => String::new(),
    };
    match text.find("</think>") {
        Some(end) if text.trim_start().starts_with("<think>") || !text.contains("<think>") => {
            text[end + "</think>".len()..].trim_start().to_string()
        }
        // Cut by max_tokens while still thinking: no answer in it.
        None if text.trim_start().starts_with("<think>") => String::new(),
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answer_text_reads_string_and_parts_content() {
        assert_eq!(answer_text(br#"{"choices":[{"message":{"content":"abc"}}]}"#), "abc");
        assert_eq!(
            answer_text(br#"{"choices":[{"message":{"content":[{"type":"text","text":"a"},{"text":"b"}]}}]}"#),
            "ab"
        );
        assert_eq!(answer_text(b"{}"), "");
        let events = whole_as_events(
            br#"{"id":"x","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#,
            "req_1",
        );
        let first: Value =
            serde_json::from_str(events.lines().next().unwrap().strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(first["choices"][0]["delta"]["content"], "hi");
        assert_eq!(first["usage"]["completion_tokens"], 1);
        assert!(events.ends_with("data: [DONE]\n\n"));
        assert_eq!(
            answer_text(br#"{"choices":[{"message":{"content":"<think>hmm</think>\n\nthe answer"}}]}"#),
            "the answer"
        );
        assert_eq!(answer_text(br#"{"choices":[{"message":{"content":"reasoning</think>answer"}}]}"#), "answer");
        assert_eq!(answer_text(br#"{"choices":[{"message":{"content":"<think>still thinking"}}]}"#), "");
    }
}
