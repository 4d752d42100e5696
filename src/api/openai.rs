//! `/v1/*`: the OpenAI endpoints. The proxy handler parses only what it needs from the body
//! (`model`; other top-level fields stay raw JSON text), rewrites `model` to the backend's name,
//! waits for a slot in the model's queue and streams the backend's answer back untouched but for
//! its backend's normalisations (`finish_length` here for whole answers, the stream's in the
//! meter; `hold_abandoned` keeps an abandoned answer's slot until the backend has ended it).
//! The handler reads as its phases: identify → parse → acquire → send → wrap.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use indexmap::IndexMap;
use serde_json::value::RawValue;

use super::AppState;
use super::arrival;
use super::chunk;
use super::fit::{self, Endpoint, Fitted};
use crate::auth::{self, Client};
use crate::backend::handle::{Answer, Outbound, SendFailure, busy_retries};
use crate::backend::profile::Kind;
use crate::backend::upstream::strip_hop_by_hop;
use crate::config::BackendConfig;
use crate::dispatch::Route;
use crate::dispatch::queue::{ClientId, Permit};
use crate::error::{ErrorBody, GatewayError, backend_error_body};
use crate::limits::body_fingerprint;
use crate::outcome::{Outcome, RequestRecord};
use crate::stream::abandoned::drain;
use crate::stream::figures::{StreamFigures, Whole, figures_of_whole};
use crate::stream::finish::{StreamNormalise, stop_to_length};
use crate::stream::meter::{RequestInfo, StreamMeter};
use crate::stream::shutdown::Cutoff;
use crate::tokens::Count;
use crate::tokens::counter::Estimate;

/// A request body: top-level fields in their original order, values left as raw JSON.
pub(crate) type RawBody = IndexMap<String, Box<RawValue>>;

/// The prompt's tokens as the gateway counted them before sending (the context cap's count, an
/// upper bound when the prompt fitted by its bytes; else the estimate), on the response of an
/// answered request: a face that reports input usage before the backend's own (the Messages
/// face's `message_start`) reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PromptTokens(pub(crate) u64);

/// Sends to a restarted managed backend at most this many times.
const MAX_RETRIES: u32 = 2;

/// Largest whole (non-streaming) answer the gateway reads to meter it.
pub(crate) const MAX_WHOLE_ANSWER: usize = 64 << 20;

/// Largest backend error body read to put in OpenAI's shape.
const MAX_ERROR_BODY: usize = 1 << 20;

/// POST `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`. The request's outcome is
/// recorded once: by the response body when it ends, else here for a refusal, else (the client
/// went away) as `client_closed` when the record is dropped.
///
/// At the end of the shutdown grace, a request still waiting for a slot or for its answer's
/// first bytes gets 503 `gateway_shutdown` (nothing is sent to a backend after that); a stream
/// is ended by its meter.
pub async fn proxy(State(state): State<Arc<AppState>>, request: Request) -> Response {
    serve(&state, request, |bytes, _| {
        serde_json::from_slice(bytes)
            .map_err(|e| GatewayError::invalid(format!("The request body is not a JSON object: {e}."), None))
    })
    .await
}

/// The pipeline every face shares, for `request` at an OpenAI path. `read` turns the client's
/// body into the fields of the OpenAI request served (the chat face: the body as it is; the
/// Responses face: its translation, which may also note the request's conversation on the
/// record); its error is the client's 400.
pub(crate) async fn serve(
    state: &Arc<AppState>,
    request: Request,
    read: impl FnOnce(&[u8], &mut RequestRecord) -> Result<RawBody, GatewayError> + Send,
) -> Response {
    let mut record = arrival::take_record(state, &request);
    let cut = state.cutoff.notified();
    let forwarded = if state.cutoff.is_cut() {
        Err(GatewayError::ShuttingDown)
    } else {
        tokio::select! {
            forwarded = forward(state, request, &mut record, read) => forwarded,
            () = cut => Err(GatewayError::ShuttingDown),
        }
    };
    // Every response to an admitted request carries the client's x-ratelimit-* headers (a 429
    // carries its own).
    let rate_limit_headers = record.rate_limit_headers().clone();
    let mut response = match forwarded {
        Ok(Forwarded::Answered(answered, prompt_tokens)) => {
            let mut response = answered.into_response(record, Arc::clone(&state.cutoff)).await;
            response.extensions_mut().insert(PromptTokens(prompt_tokens));
            response
        }
        Ok(Forwarded::Made(response, figures)) => {
            match figures {
                // Chunked embeddings: no first token to time.
                Some(figures) => {
                    record.responded(response.status().as_u16());
                    record.finish_answered(Outcome::Ok, &figures.of_whole(Whole::Embeddings));
                }
                // Its body finishes the record (a streamed map-reduce): it was taken.
                None => drop(record),
            }
            response
        }
        Err(e) => {
            record.responded(e.status().as_u16());
            record.finish(Outcome::from(&e));
            e.into_response()
        }
    };
    response.headers_mut().extend(rate_limit_headers);
    response
}

/// What the client asked for, ready to send: the body re-encoded once; the client's own
/// bytes and the parsed fields are gone before the request waits in the queue.
pub(crate) struct Parsed {
    pub(crate) outbound: Outbound,
    /// Generation endpoints (chat, completions): their answers are metered.
    generates: bool,
    client_wants_usage: bool,
    stats_comment: bool,
    /// `x-mlxgate-transform` for the client's response (middle-out, chunk).
    transform: Option<String>,
}

/// What the proxy answers: a backend's answer to wrap, or a response made here (the averaged
/// vectors of a chunked embedding).
enum Forwarded {
    /// The backend's answer, and the prompt's tokens as the gateway counted them.
    Answered(Answered, u64),
    /// A response made here, with the figures to record (`None`: its body records them).
    Made(Response, Option<StreamFigures>),
}

/// identify (the client, from the headers alone: a refused one's body is never read) → parse
/// → fit (the context cap; map-reduce of an over-long message) → limits (the client's rate
/// limits, charged with the prompt's count; a refusal before here costs nothing) → acquire →
/// send (retried on a restarted backend) → wrap. The pieces of a map-reduce are part of the
/// client's one admission.
async fn forward(
    state: &Arc<AppState>,
    request: Request,
    record: &mut RequestRecord,
    read: impl FnOnce(&[u8], &mut RequestRecord) -> Result<RawBody, GatewayError>,
) -> Result<Forwarded, GatewayError> {
    let (parts, body) = request.into_parts();
    // One snapshot of keys and clients for the whole request, whatever a reload does meanwhile.
    let access = state.access();
    let caller = auth::identify(&access, &parts.headers)?;
    record.identified(caller.name());
    let bytes = read_body(&parts, body, state.config.max_body_bytes, state.config.body_read_timeout).await?;
    // A client with a token limit: the body's fingerprint, to refuse the same body again
    // before it is counted once its token rate refused it.
    let fingerprint = state.limiter.limits_of(caller.name()).tpm.is_some().then(|| body_fingerprint(&bytes));
    let mut fields = read(&bytes, record)?;
    drop(bytes);
    let asked = requested_model(&fields)?;
    let model = state.config.model_named(&asked).to_string();
    // A model the client may not use is, to it, one that does not exist: the same 404.
    let route = state.dispatch.route(&model).filter(|_| caller.may_use(&access, &model)).ok_or_else(|| {
        record.asked(&asked);
        GatewayError::ModelNotFound(asked.clone())
    })?;
    record.routed(&model, &route.backend.config.name);
    if asked != model {
        record.aliased(&asked);
    }
    // A client at its concurrency, or still refused by its rate, is refused before its prompt
    // is counted (the costly part of a refusal).
    state.limiter.precheck(caller.name(), fingerprint).await.map_err(|denied| rate_limited(state, &caller, denied))?;
    let client = client_id(&parts, &caller);
    // A client with a token limit is charged its prompt's exact count when it is counted.
    let exact = state.limiter.limits_of(caller.name()).tpm.is_some();
    let fitted = match Endpoint::of(parts.uri.path()) {
        Some(endpoint) => {
            Some(fit::fit(&state.metrics, route, state.tokens.get(&model), endpoint, &mut fields, exact).await?)
        }
        None => None,
    };
    let prompt_tokens = match &fitted {
        Some(Fitted::Send { prompt_tokens: Some(counted), .. }) => *counted as u64,
        _ => estimated_prompt_tokens(&fields),
    };
    admit(state, &caller, prompt_tokens, fingerprint, record).await?;
    let mut transform = None;
    if let Some(fitted) = fitted {
        match fitted {
            Fitted::Send { transform: t, .. } => transform = t,
            Fitted::Chunk(chunked) if fields.get("stream").is_some_and(|v| v.get() == "true") => {
                // The client gets its headers now and keep-alive comments while the pieces are
                // mapped (minutes on a long document), then the reduce's stream.
                let job = chunk::StreamedJob { model: model.clone(), client, parts, fields, chunked };
                return Ok(Forwarded::Made(chunk::streamed(Arc::clone(state), job, record.take()), None));
            }
            Fitted::Chunk(chunked) => {
                let partials = chunk::map(state, route, &client, &parts, &fields, &chunked, record).await?;
                chunk::reduce_request(&mut fields, &chunked, &partials, route.model.default_max_tokens)?;
                record.reestimated(estimated_prompt_tokens(&fields));
                transform = Some(chunk::transform(&chunked.plan));
            }
            Fitted::Embed(plan) => {
                let (made, figures) = chunk::embed(state, route, &client, &parts, fields, plan, record).await?;
                return Ok(Forwarded::Made(made, Some(figures)));
            }
        }
    }
    let sent = record.sent_flag();
    let answered = send(state, route, &client, &parts, fields, transform, &sent).await?;
    Ok(Forwarded::Answered(answered, prompt_tokens))
}

/// limits: admits the request under its client's rate limits, charging `prompt_tokens` up front.
/// The admission goes into the record, which settles it to the backend's usage at the end (or
/// cancels it when no backend answered); a refusal is 429 and counted by client and limit.
async fn admit(
    state: &AppState,
    caller: &Client,
    prompt_tokens: u64,
    fingerprint: Option<u64>,
    record: &mut RequestRecord,
) -> Result<(), GatewayError> {
    match state.limiter.admit_body(caller.name(), prompt_tokens, fingerprint).await {
        Ok(admission) => {
            record.admitted(admission);
            Ok(())
        }
        Err(denied) => Err(rate_limited(state, caller, denied)),
    }
}

/// A 429: counted by client and limit, and logged at most once a minute per client and limit
/// (a client looping on its 429s must not flood the log).
fn rate_limited(state: &AppState, caller: &Client, denied: crate::limits::Denied) -> GatewayError {
    let limit = denied.limit.as_str();
    state.metrics.rate_limited.with_label_values(&[caller.name(), limit]).inc();
    if let Some(suppressed) = state.log_throttle.allow(&format!("rate limited {} {limit}", caller.name())) {
        tracing::info!(client = caller.name(), limit, retry_after = ?denied.retry_after, suppressed, "rate limited");
    }
    GatewayError::RateLimited(Box::new(denied))
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

/// The request as it goes to the backend: encoded once, then acquire → send.
pub(crate) async fn send(
    state: &AppState,
    route: &Route,
    client: &ClientId,
    parts: &axum::http::request::Parts,
    mut fields: RawBody,
    transform: Option<String>,
    sent: &std::sync::atomic::AtomicBool,
) -> Result<Answered, GatewayError> {
    let mut parsed = parse(parts, &mut fields, route)?;
    parsed.transform = transform;
    drop(fields);
    let (permit, answer, queue_wait) = dispatch(state, route, client, &parsed.outbound, sent).await?;
    let normalise = stream_normalise(&route.backend.config, &parsed);
    Ok(Answered {
        answer,
        permit,
        parsed: Box::new(parsed),
        queue_wait,
        idle_timeout: route.backend.config.stream_idle_timeout,
        normalise,
    })
}

/// The backend's normalisations that act on its answer to this request.
fn stream_normalise(config: &BackendConfig, parsed: &Parsed) -> StreamNormalise {
    let on = &config.normalise;
    let length_at = if on.finish_length && parsed.generates {
        max_tokens_of(config.kind, &parsed.outbound.body).map(|max| length_at(config.kind, max))
    } else {
        None
    };
    StreamNormalise { length_at, single_finish: on.single_finish, hold_abandoned: on.hold_abandoned }
}

/// The token limit the backend applies to the request, read from the body as it goes to the
/// backend (the gateway always sends one to a generation endpoint). When the body carries both
/// `max_tokens` and `max_completion_tokens`, the servers differ (read in their sources):
/// mlx-openai-server 1.6.3 takes `max_tokens` unless it is null (`app/models/mlx_lm.py`),
/// mlx-omni-server 0.5.3 `max_completion_tokens or max_tokens` (a 0 or null falls through,
/// `openai_adapter.py`). Any other kind: the larger of the two. Its precedence is unknown, and
/// the larger can only miss a cut (the server's own `stop`, as without `finish_length`), where
/// the smaller could turn a finished answer into `length` (and agents continue it).
fn max_tokens_of(kind: Kind, body: &[u8]) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Limits {
        max_tokens: Option<u64>,
        max_completion_tokens: Option<u64>,
    }
    let Limits { max_tokens, max_completion_tokens } = serde_json::from_slice(body).ok()?;
    match kind {
        Kind::MlxOpenaiServer => max_tokens.or(max_completion_tokens),
        Kind::MlxOmniServer => max_completion_tokens.filter(|&n| n > 0).or(max_tokens),
        _ => max_tokens.max(max_completion_tokens),
    }
}

/// The completion tokens a backend reports for an answer cut at `max_tokens`: mlx-omni-server
/// drops the last token (the one mlx-lm yields with the finish) and counts one less (measured:
/// 29 for `max_tokens` 30); the others count `max_tokens`.
fn length_at(kind: Kind, max_tokens: u64) -> u64 {
    match kind {
        Kind::MlxOmniServer => max_tokens.saturating_sub(1).max(1),
        _ => max_tokens,
    }
}

/// acquire → send, sent again (up to [`MAX_RETRIES`]) when the managed process that had it is
/// gone before the first byte. Returns the slot, the answer and the time spent waiting for
/// slots.
pub(crate) async fn dispatch(
    state: &AppState,
    route: &Route,
    client: &ClientId,
    outbound: &Outbound,
    sent: &std::sync::atomic::AtomicBool,
) -> Result<(Permit, Answer, Duration), GatewayError> {
    let model = &route.model.name;
    let mut retries = 0;
    // A request's queue wait is the time it waited for slots: a retry's wait for the restarted
    // backend counts, its failed attempt at the backend does not. Recorded once, when the
    // request got at least one slot.
    let mut queue_wait = Duration::ZERO;
    let observe_wait =
        |waited: Duration| state.metrics.queue_wait.with_label_values(&[&model]).observe(waited.as_secs_f64());
    let (permit, answer) = loop {
        // A retried request waits again for the restarted backend, within what is left of its
        // max_wait.
        let left = route.model.max_wait.saturating_sub(queue_wait).max(Duration::from_millis(1));
        let asked = Instant::now();
        let acquired = route.slot.acquire_within(client.clone(), left).await;
        queue_wait += asked.elapsed();
        let permit = match acquired {
            Ok(permit) => permit,
            Err(e) => {
                if retries > 0 {
                    observe_wait(queue_wait);
                }
                return Err(e);
            }
        };
        sent.store(true, std::sync::atomic::Ordering::SeqCst);
        match attempt(state, route, outbound, permit, retries == 0).await {
            Ok((answer, permit)) => break (permit, answer),
            Err(SendFailure::Retry(e)) if retries < MAX_RETRIES => {
                retries += 1;
                tracing::warn!(backend = %route.backend.config.name, error = %e, retries, "backend failed before the first byte and its process is gone; sending again");
            }
            Err(SendFailure::Retry(e) | SendFailure::Final(e)) => {
                observe_wait(queue_wait);
                return Err(e);
            }
        }
    };
    observe_wait(queue_wait);
    Ok((permit, answer, queue_wait))
}

/// One attempt at the backend, holding `permit`. For a backend that keeps generating for a
/// client that left (`hold_abandoned`), the attempt runs as its own task: if the client goes
/// away before the answer's first bytes (a long prefill, a whole answer being generated), the
/// slot stays held until the backend has answered and its answer has been read to its end, so
/// the next request waits in the queue rather than, unseen, at the backend.
async fn attempt(
    state: &AppState,
    route: &Route,
    outbound: &Outbound,
    permit: Permit,
    first_attempt: bool,
) -> Result<(Answer, Permit), SendFailure> {
    // A request sent again after a restart was its own previous request: no busy retries.
    let busy_retries = if first_attempt { busy_retries(permit.previous()) } else { 0 };
    if !route.backend.config.normalise.hold_abandoned {
        return route.backend.send(outbound, busy_retries).await.map(|answer| (answer, permit));
    }
    let backend = route.backend.clone();
    let copy = Outbound {
        method: outbound.method.clone(),
        path_and_query: outbound.path_and_query.clone(),
        headers: outbound.headers.clone(),
        body: outbound.body.clone(),
    };
    let (metrics, cutoff) = (state.metrics.clone(), Arc::clone(&state.cutoff));
    let (mut tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let send = backend.send(&copy, busy_retries);
        tokio::pin!(send);
        let answered = tokio::select! {
            answered = &mut send => answered,
            () = tx.closed() => return held_for_abandoned(send, permit, &backend, &metrics, &cutoff).await,
        };
        // The client may have left in between.
        if let Err((answered, permit)) = tx.send((answered, permit)) {
            held_for_abandoned(std::future::ready(answered), permit, &backend, &metrics, &cutoff).await;
        }
    });
    match rx.await {
        Ok((answered, permit)) => answered.map(|answer| (answer, permit)),
        Err(_) => {
            // The attempt's task failed (and its slot went with it).
            let reason = "the attempt ended without an answer".to_string();
            Err(SendFailure::Final(GatewayError::Backend { backend: route.backend.config.name.clone(), reason }))
        }
    }
}

/// Holds `permit` for an attempt whose client left before its answer's first bytes: until the
/// backend has `answered` and its answer has been read to its end (bounded as
/// [`drain`] is), or the gateway's shutdown.
async fn held_for_abandoned(
    answered: impl std::future::Future<Output = Result<Answer, SendFailure>>,
    mut permit: Permit,
    backend: &crate::backend::handle::BackendHandle,
    metrics: &crate::metrics::Metrics,
    cutoff: &Cutoff,
) {
    permit.abandon();
    let name = &backend.config.name;
    let held = metrics.abandoned_held.with_label_values(&[name]);
    held.inc();
    let started = Instant::now();
    let notified = cutoff.notified();
    let shutdown = async {
        if !cutoff.is_cut() {
            notified.await;
        }
    };
    let (end, bytes) = tokio::select! {
        answered = answered => match answered {
            Ok(answer) => drain(answer.body, backend.config.stream_idle_timeout, cutoff).await,
            Err(_) => ("failed", 0),
        },
        () = shutdown => ("shutdown", 0),
    };
    drop(permit);
    held.dec();
    tracing::info!(backend = %name, end, bytes, held_for = ?started.elapsed(), "abandoned answer read to its end; its slot is free");
}

/// Rewrites `model`, asks for usage and an explicit `max_tokens` on generation endpoints, and
/// encodes the body once.
pub(crate) fn parse(
    parts: &axum::http::request::Parts,
    fields: &mut RawBody,
    route: &Route,
) -> Result<Parsed, GatewayError> {
    let upstream_model = serde_json::value::to_raw_value(&route.model.upstream_model)
        .map_err(|e| GatewayError::invalid(format!("cannot encode the model name: {e}"), Some("model")))?;
    fields.insert("model".to_string(), upstream_model);
    let generates = matches!(parts.uri.path(), "/v1/chat/completions" | "/v1/completions");
    let mut client_wants_usage = true;
    if generates {
        let streaming = fields.get("stream").is_some_and(|v| v.get() == "true");
        if streaming {
            client_wants_usage = ask_for_usage(fields, route.backend.config.normalise.stream_options)?;
        } else if !route.backend.config.normalise.stream_options {
            // Some SDKs send it on every request: a backend that refuses it gets none.
            fields.shift_remove("stream_options");
        }
        // mlx_lm.server stops at 512 tokens when none is given: say it explicitly.
        if !fields.contains_key("max_tokens") && !fields.contains_key("max_completion_tokens") {
            let default = serde_json::value::to_raw_value(&route.model.default_max_tokens)
                .map_err(|e| GatewayError::invalid(format!("cannot encode max_tokens: {e}"), None))?;
            fields.insert("max_tokens".to_string(), default);
        }
    }
    let body = serde_json::to_vec(&fields)
        .map_err(|e| GatewayError::invalid(format!("cannot re-encode the body: {e}"), None))?;
    let path_and_query = parts.uri.path_and_query().map_or(parts.uri.path(), |p| p.as_str()).to_string();
    Ok(Parsed {
        outbound: Outbound {
            method: parts.method.clone(),
            path_and_query,
            headers: parts.headers.clone(),
            body: Bytes::from(body),
        },
        generates,
        client_wants_usage,
        stats_comment: parts.headers.get("x-mlxgate-stats").is_some_and(|v| v.as_bytes() == b"1"),
        transform: None,
    })
}

/// A backend's answer with the slot it holds, before it is wrapped for the client.
pub(crate) struct Answered {
    answer: Answer,
    permit: Permit,
    /// Boxed: the answer is moved through the handler's result, and the request's parts are large.
    parsed: Box<Parsed>,
    /// Time spent waiting for slots (every attempt's).
    queue_wait: Duration,
    idle_timeout: Duration,
    normalise: StreamNormalise,
}

impl Answered {
    /// wrap: the client's response. Streams and raw bodies are wrapped in the [`StreamMeter`]
    /// (which records the outcome at their end); whole answers and the backend's own errors
    /// are read here first.
    pub(crate) async fn into_response(self, record: RequestRecord, cutoff: Arc<Cutoff>) -> Response {
        let Answered { answer, permit, parsed, queue_wait, idle_timeout, normalise } = self;
        let Answer { mut head, body, first, sent_at } = answer;
        let mut record = record;
        record.queued(queue_wait);
        strip_hop_by_hop(&mut head.headers);
        // Whatever the backend spoke (mlx_lm.server: HTTP/1.0), the client gets HTTP/1.1.
        head.version = axum::http::Version::HTTP_11;
        if let Some(v) = parsed.transform.as_deref().and_then(|t| HeaderValue::from_str(t).ok()) {
            head.headers.insert("x-mlxgate-transform", v);
        }
        let info = RequestInfo {
            record,
            queue_wait,
            client_wants_usage: parsed.client_wants_usage,
            stats_comment: parsed.stats_comment,
            idle_timeout,
            cutoff,
            normalise,
        };
        if !head.status.is_success() {
            return error_answer(head, body, first, permit, info).await;
        }
        let sse = head
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if sse {
            // Tell nginx-style proxies in front of us not to buffer, and caches not to keep it.
            head.headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
            head.headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            // The meter changes the length (a dropped usage chunk, an error event, the stats
            // line): the client's body is chunked, never the backend's announced length.
            head.headers.remove(header::CONTENT_LENGTH);
            let mut info = info;
            info.record.responded(head.status.as_u16());
            let body = StreamMeter::new(body, first, permit, info);
            return Response::from_parts(head, Body::new(body));
        }
        // Whole answers (embeddings too: read whole, their usage settles the client's charge
        // and the record ends with the answer, not when hyper stops polling a body of a known
        // length).
        whole_answer(head, body, first, permit, info, sent_at, parsed.generates).await
    }
}

/// A whole (non-streaming) answer: read it (it is complete when the backend sends it) to take
/// its usage, record it, and add the per-request figures as headers. `sent_at` is when the
/// request went to the backend: the answer's tokens per second are over the backend's time.
/// `generates`: a chat or completion (an embeddings answer has no first token to time).
async fn whole_answer(
    mut head: hyper::http::response::Parts,
    incoming: Incoming,
    first: Option<Bytes>,
    permit: Permit,
    mut info: RequestInfo,
    sent_at: Instant,
    generates: bool,
) -> Response {
    let backend = info.record.backend.clone();
    let cut = info.cutoff.notified();
    let read = async {
        tokio::select! {
            whole = read_whole(&backend, first, incoming, MAX_WHOLE_ANSWER, info.idle_timeout) => whole,
            () = cut => Err(GatewayError::ShuttingDown),
        }
    };
    let whole = match read.await {
        Ok(whole) => whole,
        Err(e) => {
            drop(permit);
            info.record.responded(e.status().as_u16());
            info.record.finish_answered(Outcome::from(&e), &StreamFigures::default().of_whole(Whole::Failed));
            return e.into_response();
        }
    };
    let mut permit = permit;
    if head.status.is_success() {
        permit.finish();
    }
    drop(permit);
    let Some(figures) = figures_of_whole(&whole) else {
        let e = GatewayError::Backend {
            backend,
            reason: format!("it answered {} with a body that is not an OpenAI answer", head.status),
        };
        info.record.responded(e.status().as_u16());
        info.record.finish_answered(Outcome::from(&e), &StreamFigures::default().of_whole(Whole::Failed));
        return e.into_response();
    };
    info.record.responded(head.status.as_u16());
    let whole = named(whole, info.record.public_model());
    let headers = &mut head.headers;
    headers.remove(header::CONTENT_LENGTH);
    headers.insert("x-mlxgate-queue-ms", HeaderValue::from(info.queue_wait.as_millis() as u64));
    if !generates {
        info.record.finish_answered(Outcome::Ok, &figures.of_whole(Whole::Embeddings));
        return Response::from_parts(head, Body::from(whole));
    }
    headers.insert("x-mlxgate-ttft-ms", HeaderValue::from(info.record.arrived.elapsed().as_millis() as u64));
    if let Some(tokens) = figures.tokens() {
        let seconds = sent_at.elapsed().as_secs_f64().max(1e-6);
        let tps = format!("{:.1}", tokens as f64 / seconds);
        if let Ok(v) = HeaderValue::from_str(&tps) {
            headers.insert("x-mlxgate-tokens-per-second", v);
        }
    }
    let whole = finish_at_length(whole, &figures, info.normalise.length_at);
    info.record.finish_answered(Outcome::Ok, &figures.of_whole(Whole::Answer));
    Response::from_parts(head, Body::from(whole))
}

/// A whole answer naming `model` (the public name) where the backend put its own name for it
/// (a path on disk, say): the `model` string replaced in the answer's text, nothing re-encoded.
pub(crate) fn named(whole: Vec<u8>, model: &str) -> Vec<u8> {
    let Some(span) = std::str::from_utf8(&whole).ok().and_then(crate::stream::frame::model_span) else {
        return whole;
    };
    let public = serde_json::Value::from(model).to_string();
    if model.is_empty() || whole[span.clone()] == *public.as_bytes() {
        return whole;
    }
    let mut out = Vec::with_capacity(whole.len() + public.len());
    out.extend_from_slice(&whole[..span.start]);
    out.extend_from_slice(public.as_bytes());
    out.extend_from_slice(&whole[span.end..]);
    out
}

/// `finish_length` on a whole answer: when its usage reached `length_at` (the request's
/// `max_tokens`), a `stop` finish becomes `length`; the answer is re-encoded only then.
fn finish_at_length(whole: Vec<u8>, figures: &StreamFigures, length_at: Option<u64>) -> Vec<u8> {
    let cut = length_at.zip(figures.tokens()).is_some_and(|(at, tokens)| tokens >= at);
    if !cut {
        return whole;
    }
    let Ok(mut answer) = serde_json::from_slice::<serde_json::Value>(&whole) else { return whole };
    let one_choice = answer.get("choices").and_then(serde_json::Value::as_array).is_some_and(|c| c.len() == 1);
    if !one_choice || !stop_to_length(&mut answer) {
        return whole;
    }
    serde_json::to_vec(&answer).unwrap_or(whole)
}

/// The backend's own error answer (any non-2xx): read (bounded) and given to the client in
/// OpenAI's shape with the backend's status and words.
async fn error_answer(
    mut head: hyper::http::response::Parts,
    incoming: Incoming,
    first: Option<Bytes>,
    permit: Permit,
    info: RequestInfo,
) -> Response {
    let backend = info.record.backend.clone();
    let text = read_whole(&backend, first, incoming, MAX_ERROR_BODY, info.idle_timeout).await.unwrap_or_default();
    drop(permit);
    let body = backend_error_body(&backend, head.status, &text);
    let outcome =
        if head.status.is_client_error() { Outcome::BackendRejected } else { Outcome::Failed("backend_error") };
    tracing::info!(backend = %backend, status = %head.status, message = %body["error"]["message"], "backend refused the request");
    let mut record = info.record;
    record.responded(head.status.as_u16());
    record.finish_answered(outcome, &StreamFigures::default().of_whole(Whole::Failed));
    head.headers.remove(header::CONTENT_LENGTH);
    head.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let mut response = Response::from_parts(head, Body::from(body.to_string()));
    // The access layer adds the request id to it, as to the gateway's own errors.
    response.extensions_mut().insert(ErrorBody { body, outcome: outcome.label() });
    response
}

/// Reads the rest of a body after `first`, at most `limit` bytes, with at most `idle_timeout`
/// between two reads.
pub(crate) async fn read_whole(
    backend: &str,
    first: Option<Bytes>,
    mut body: Incoming,
    limit: usize,
    idle_timeout: Duration,
) -> Result<Vec<u8>, GatewayError> {
    let mut whole = first.map(|b| b.to_vec()).unwrap_or_default();
    loop {
        let frame = tokio::time::timeout(idle_timeout, body.frame())
            .await
            .map_err(|_| GatewayError::BackendStalled { backend: backend.to_string(), after: idle_timeout })?;
        match frame {
            None => return Ok(whole),
            Some(Err(e)) => {
                return Err(GatewayError::Backend {
                    backend: backend.to_string(),
                    reason: format!("its answer broke before its end: {e}"),
                });
            }
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    whole.extend_from_slice(&data);
                }
                if whole.len() > limit {
                    return Err(GatewayError::Backend {
                        backend: backend.to_string(),
                        reason: format!("its answer is larger than the gateway reads ({} MiB)", limit >> 20),
                    });
                }
            }
        }
    }
}

/// Sets `stream_options.include_usage: true` (mlxgate always wants usage) and returns whether
/// the client had asked for it itself. Towards a backend that refuses `stream_options`
/// (`normalise.stream_options: false`), the field is removed instead, the client's too (the
/// backend would refuse the client's as it refuses the gateway's): the stream is metered without
/// usage.
fn ask_for_usage(fields: &mut RawBody, backend_takes_it: bool) -> Result<bool, GatewayError> {
    let mut options: serde_json::Map<String, serde_json::Value> = match fields.get("stream_options") {
        None => serde_json::Map::new(),
        Some(raw) if raw.get() == "null" => serde_json::Map::new(),
        Some(raw) => serde_json::from_str(raw.get())
            .map_err(|_| GatewayError::invalid("`stream_options` must be an object", Some("stream_options")))?,
    };
    let asked = options.get("include_usage").and_then(serde_json::Value::as_bool).unwrap_or(false);
    if !backend_takes_it {
        fields.shift_remove("stream_options");
        return Ok(asked);
    }
    options.insert("include_usage".into(), serde_json::Value::Bool(true));
    let raw = serde_json::value::to_raw_value(&options)
        .map_err(|e| GatewayError::invalid(format!("cannot encode stream_options: {e}"), None))?;
    fields.insert("stream_options".to_string(), raw);
    Ok(asked)
}

/// Any other path: OpenAI's 404 shape rather than an empty body (counted, unrouted).
pub async fn not_found(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let e = GatewayError::UnknownUrl { method: request.method().to_string(), path: request.uri().path().to_string() };
    let mut record = arrival::take_record(&state, &request);
    record.set_face(crate::access_log::Face::None);
    record.responded(e.status().as_u16());
    record.finish(Outcome::from(&e));
    e.into_response()
}

/// Reads the whole request body, refusing more than `limit` bytes or a body that takes longer
/// than `deadline` to arrive. A `Content-Length` over the limit is refused from the header
/// alone, before a byte of the body is read (and before a client waiting on
/// `Expect: 100-continue` is told to send it).
pub(crate) async fn read_body(
    parts: &axum::http::request::Parts,
    body: Body,
    limit: usize,
    deadline: Duration,
) -> Result<Bytes, GatewayError> {
    let declared = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(GatewayError::BodyTooLarge { limit });
    }
    match tokio::time::timeout(deadline, Limited::new(body, limit).collect()).await {
        Err(_) => Err(GatewayError::BodyTimeout { after: deadline }),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(GatewayError::BodyTooLarge { limit }),
        Ok(Err(e)) => Err(GatewayError::invalid(format!("cannot read the request body: {e}"), None)),
    }
}

pub(crate) fn requested_model(fields: &RawBody) -> Result<String, GatewayError> {
    let raw = fields
        .get("model")
        .ok_or_else(|| GatewayError::invalid("you must provide a model parameter", Some("model")))?;
    serde_json::from_str::<String>(raw.get())
        .map_err(|_| GatewayError::invalid("`model` must be a string", Some("model")))
}

/// The identity used for fair queueing: with auth on, the client's configured name (a client
/// rotating made-up keys gets 401, not a fresh share of the queue); with auth off, the bearer
/// key if sent, else the peer's IP address.
fn client_id(parts: &axum::http::request::Parts, caller: &Client) -> ClientId {
    if let Client::Named(name) = caller {
        return ClientId(format!("client:{name}"));
    }
    let bearer = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
        .filter(|k| !k.is_empty());
    if let Some(key) = bearer {
        return ClientId(format!("key:{key}"));
    }
    let peer = parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip().to_string());
    ClientId(format!("ip:{}", peer.unwrap_or_else(|| "unknown".into())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_length_reads_the_limit_the_server_applies() {
        let both = br#"{"model":"m","max_tokens":8,"max_completion_tokens":200}"#;
        let reversed = br#"{"model":"m","max_tokens":200,"max_completion_tokens":8}"#;
        // mlx-openai-server: max_tokens first (measured: cut at 8 with both 8 and 200).
        assert_eq!(max_tokens_of(Kind::MlxOpenaiServer, both), Some(8));
        assert_eq!(max_tokens_of(Kind::MlxOpenaiServer, reversed), Some(200));
        // mlx-omni-server: max_completion_tokens first, a 0 falls through (Python's `or`).
        assert_eq!(max_tokens_of(Kind::MlxOmniServer, both), Some(200));
        assert_eq!(max_tokens_of(Kind::MlxOmniServer, reversed), Some(8));
        let zero = br#"{"max_tokens":30,"max_completion_tokens":0}"#;
        assert_eq!(max_tokens_of(Kind::MlxOmniServer, zero), Some(30));
        // Unknown precedence: the larger, which never calls a finished answer cut.
        assert_eq!(max_tokens_of(Kind::Custom, both), Some(200));
        assert_eq!(max_tokens_of(Kind::Custom, reversed), Some(200));
        // One of them, whichever it is, for every kind.
        for kind in [Kind::MlxOpenaiServer, Kind::MlxOmniServer, Kind::Custom] {
            assert_eq!(max_tokens_of(kind, br#"{"max_tokens":5}"#), Some(5), "{kind:?}");
            assert_eq!(max_tokens_of(kind, br#"{"max_completion_tokens":6,"max_tokens":null}"#), Some(6), "{kind:?}");
            assert_eq!(max_tokens_of(kind, br#"{"model":"m"}"#), None, "{kind:?}");
        }
    }
}
