//! The pipeline every face shares, below the faces' translations: identify → parse → fit →
//! admit → call → wrap, one function per step. A face (`openai.rs`, `responses.rs`,
//! `messages.rs`) hands [`serve`] the request, its label and a reader that turns the client's
//! body into the fields of one OpenAI request; the response it gets back it translates into its
//! own events and errors.
//!
//! Every request's outcome is recorded once: by the response body when it ends, else here for
//! a refusal, else (the client went away) as `client_closed` when the record is dropped.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request};
use axum::http::header;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::answer::{self, Answered, Wrapped};
use super::body::read_body;
use super::chunk;
use super::fields::{self, RawBody, estimated_prompt_tokens, requested_model};
use super::fit::{self, Endpoint, Fitted};
use crate::access_log::Face;
use crate::auth::{self, Access, Client};
use crate::dispatch::Route;
use crate::dispatch::queue::ClientId;
use crate::error::GatewayError;
use crate::limits::body_fingerprint;
use crate::outcome::{Outcome, RequestRecord};
use crate::stream::figures::{StreamFigures, Whole};

/// The pipeline every face shares, for `request` at an OpenAI path, with its `record` (as it
/// arrived: counted in `mlxgate_requests_total` from here on). `face`: which API the client spoke, a label for the access log (nothing below branches on it). `read` turns the
/// client's body into the fields of the OpenAI request served (the chat face: the body as it
/// is; the Responses face: its translation, which may also note the request's conversation on
/// the record); its error is the client's 400.
///
/// At the end of the shutdown grace, a request still waiting for a slot or for its answer's
/// first bytes gets 503 `gateway_shutdown` (nothing is sent to a backend after that); a stream
/// is ended by its meter.
///
/// Its futures are boxed, the whole once here and each large step where it is awaited: an
/// async fn's state holds its awaited steps' states side by side (rustc does not overlap them),
/// so unboxed the pipeline was a 29 KB future, copied whole at each move.
pub(crate) fn serve<'a>(
    state: &'a Arc<AppState>,
    request: Request,
    face: Face,
    record: RequestRecord,
    read: impl FnOnce(&[u8], &mut RequestRecord) -> Result<RawBody, GatewayError> + Send + 'a,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response> + Send + 'a>> {
    Box::pin(serve_boxed(state, request, face, record, read))
}

async fn serve_boxed(
    state: &Arc<AppState>,
    request: Request,
    face: Face,
    mut record: RequestRecord,
    read: impl FnOnce(&[u8], &mut RequestRecord) -> Result<RawBody, GatewayError> + Send,
) -> Response {
    record.metered();
    record.set_face(face);
    let cut = state.cutoff.notified();
    let reply = if state.cutoff.is_cut() {
        Err(GatewayError::ShuttingDown)
    } else {
        tokio::select! {
            reply = steps(state, request, &mut record, read) => reply,
            () = cut => Err(GatewayError::ShuttingDown),
        }
    };
    // Every response to an admitted request carries the client's x-ratelimit-* headers (a 429
    // carries its own).
    let mut rate_limit_headers = record.rate_limit_headers().clone();
    // A request its model's fallback served says so, naming the model that answered.
    if record.fallback_from().is_some()
        && let Ok(served) = http::HeaderValue::from_str(&record.model)
    {
        rate_limit_headers.insert(FALLBACK_HEADER, served);
    }
    let mut response = match reply {
        Ok(Reply::Answered { answered, prompt_tokens }) => {
            let mut response = match answered.into_response(record, Arc::clone(&state.cutoff)) {
                Wrapped::Now(response) => response,
                Wrapped::Read(reading) => reading.await,
            };
            // Only the Messages face reads it (its `message_start`): no extension for others.
            if face == Face::Messages {
                response.extensions_mut().insert(PromptTokens(prompt_tokens));
            }
            response
        }
        Ok(Reply::Made { response, figures }) => {
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

/// The header of an answer its model's `fallback:` gave: the model that answered.
pub(crate) const FALLBACK_HEADER: http::HeaderName = http::HeaderName::from_static("x-mlxgate-fallback");

/// The chat endpoint a translating face's request is served as (its URI while in the pipeline:
/// the context cap counts its messages; the backend gets it at its chat path).
pub(crate) const CHAT_PATH: &str = "/v1/chat/completions";

/// The prompt's tokens as the gateway counted them before sending (the context cap's count, an
/// upper bound when the prompt fitted by its bytes; else the estimate), on the response of an
/// answered request: a face that reports input usage before the backend's own (the Messages
/// face's `message_start`) reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PromptTokens(pub(crate) u64);

/// What the pipeline answers: a backend's answer to wrap, or a response made here (the averaged
/// vectors of a chunked embedding, a streamed map-reduce).
enum Reply {
    /// The backend's answer, and the prompt's tokens as the gateway counted them.
    Answered { answered: Answered, prompt_tokens: u64 },
    /// A response made here, with the figures to record (`None`: its body records them).
    Made { response: Response, figures: Option<StreamFigures> },
}

/// A request after parse: who sent it, the model it goes to, its fields.
struct Parsed<'s> {
    parts: Parts,
    caller: Client,
    /// The configured model's name (an alias resolved).
    model: String,
    route: &'s Route,
    fields: RawBody,
    /// For a client with a token limit: the body's fingerprint, to refuse the same body again
    /// before it is counted once its token rate refused it.
    fingerprint: Option<u64>,
    /// The `max_wait` of the model asked for, when its `fallback:` serves it (`model`, `route`):
    /// the request still waits no longer than its own model's bound.
    own_max_wait: Option<std::time::Duration>,
    /// The model asked for, while its fallback (`model`, `route`) is to serve it, until the fit
    /// shows whether the prompt fits the fallback's context cap as it is.
    own: Option<Own<'s>>,
}

/// The model a request asked for, which its fallback may serve instead.
struct Own<'s> {
    /// The configured model's name (an alias resolved).
    model: String,
    /// The name the client asked for.
    asked: String,
    route: &'s Route,
}

/// identify (the client, from the headers alone: a refused one's body is never read) → parse
/// → fit (the context cap; map-reduce of an over-long message) → admit (the client's rate
/// limits, charged with the prompt's count; a refusal before here costs nothing) → call
/// (acquire → send, retried on a restarted backend) → wrap (by [`serve`]). The pieces of a
/// map-reduce are part of the client's one admission.
async fn steps(
    state: &Arc<AppState>,
    request: Request,
    record: &mut RequestRecord,
    read: impl FnOnce(&[u8], &mut RequestRecord) -> Result<RawBody, GatewayError>,
) -> Result<Reply, GatewayError> {
    let (parts, body) = request.into_parts();
    // One snapshot of keys and clients for the whole request, whatever a reload does meanwhile.
    let access = state.access();
    let caller = auth::identify(&access, &parts.headers)?;
    record.identified(caller.name());
    let mut request = parse(state, &access, caller, parts, body, record, read).await?;
    // A client at its concurrency, or still refused by its rate, is refused before its prompt
    // is counted (the costly part of a refusal).
    let (caller, fingerprint) = (&request.caller, request.fingerprint);
    state.limiter.precheck(caller.name(), fingerprint).await.map_err(|denied| rate_limited(state, caller, denied))?;
    let fitted = Box::pin(fit_or_own(state, &mut request, record)).await?;
    let prompt_tokens = match &fitted {
        Some(Fitted::Send { prompt_tokens: Some(counted), .. }) => *counted as u64,
        _ => estimated_prompt_tokens(&request.fields),
    };
    admit(state, &request.caller, prompt_tokens, request.fingerprint, record).await?;
    let client = client_id(&request.parts, &request.caller, record.peer);
    let (request, transform) = match fitted {
        // Sent as it is, perhaps transformed: no plan to carry out.
        None => (request, None),
        Some(Fitted::Send { transform, .. }) => (request, transform),
        // A map-reduce or embeddings in pieces: boxed, as the rare path with a large future.
        fitted => match Box::pin(planned(state, request, &client, fitted, record)).await? {
            Planned::Send { request, transform } => (request, transform),
            Planned::Made(reply) => return Ok(reply),
        },
    };
    record.transformed(transform.as_deref());
    let sent = record.sent_flag();
    let Parsed { parts, route, fields, own_max_wait, .. } = request;
    let session = route.balancer.as_ref().and_then(|_| session_key(route, &parts, &fields, record));
    let terms = answer::Terms { transform, session, own_max_wait, request_id: Some(record.request_id().clone()) };
    let answered = Box::pin(answer::call(state, route, &client, &parts, fields, terms, &sent)).await?;
    Ok(Reply::Answered { answered, prompt_tokens })
}

/// parse: the body read (bounded), turned into the request's fields by the face's `read`, the
/// model it names resolved (aliases) to a route the client may use (else 404, as for a model
/// that does not exist).
async fn parse<'s>(
    state: &'s AppState,
    access: &Access,
    caller: Client,
    parts: Parts,
    body: axum::body::Body,
    record: &mut RequestRecord,
    read: impl FnOnce(&[u8], &mut RequestRecord) -> Result<RawBody, GatewayError>,
) -> Result<Parsed<'s>, GatewayError> {
    let bytes = read_body(&parts, body, state.config.max_body_bytes, state.config.body_read_timeout).await?;
    // A client with a token limit: the body's fingerprint, to refuse the same body again
    // before it is counted once its token rate refused it.
    let fingerprint = state.limiter.limits_of(caller.name()).tpm.is_some().then(|| body_fingerprint(&bytes));
    let fields = read(&bytes, record)?;
    let asked = requested_model(&fields)?;
    let model = state.config.model_named(&asked).to_string();
    // A model the client may not use is, to it, one that does not exist: the same 404.
    let route = state.dispatch.route(&model).filter(|_| caller.may_use(access, &model)).ok_or_else(|| {
        record.asked(&asked);
        GatewayError::ModelNotFound(asked.clone())
    })?;
    if route.model.capture {
        record.capture(&bytes);
    }
    drop(bytes);
    if asked != model {
        record.aliased(&asked);
    }
    // Its backend is not loaded and the GPU is busy with its fallback's: the fallback serves it
    // (if the client may use that model too), rather than a swap.
    let fallback = state.dispatch.fallback_for(&model).filter(|f| caller.may_use(access, f));
    if let Some((instead, instead_route)) = fallback.and_then(|f| Some((f, state.dispatch.route(f)?))) {
        record.routed(instead, &instead_route.backend.config.name);
        let own = Some(Own { model, asked, route });
        let (model, route) = (instead.to_string(), instead_route);
        return Ok(Parsed { parts, caller, model, route, fields, fingerprint, own_max_wait: None, own });
    }
    record.routed(&model, &route.backend.config.name);
    Ok(Parsed { parts, caller, model, route, fields, fingerprint, own_max_wait: None, own: None })
}

/// fit, for a request its model's fallback is to serve: the fallback serves it when the prompt
/// fits the fallback's context cap as it is; a prompt the fallback would refuse, cut or chunk
/// (its cap is smaller) goes to its own model instead, as without a fallback.
async fn fit_or_own(
    state: &AppState,
    request: &mut Parsed<'_>,
    record: &mut RequestRecord,
) -> Result<Option<Fitted>, GatewayError> {
    let Some(own) = request.own.take() else { return fit(state, request).await };
    let pristine = request.fields.clone();
    let fitted = fit(state, request).await;
    if matches!(fitted, Ok(None | Some(Fitted::Send { transform: None, .. }))) {
        record.fell_back(&own.model, &own.asked);
        request.own_max_wait = Some(own.route.model.max_wait);
        return fitted;
    }
    record.routed(&own.model, &own.route.backend.config.name);
    (request.model, request.route, request.fields) = (own.model, own.route, pristine);
    fit(state, request).await
}

/// fit: the context cap applied to the request's prompt (its endpoint's: chat, completions,
/// embeddings; none for another path).
async fn fit(state: &AppState, request: &mut Parsed<'_>) -> Result<Option<Fitted>, GatewayError> {
    let Some(endpoint) = Endpoint::of(request.parts.uri.path()) else { return Ok(None) };
    // A client with a token limit is charged its prompt's exact count when it is counted.
    let exact = state.limiter.limits_of(request.caller.name()).tpm.is_some();
    let tokens = state.tokens.get(&request.model);
    Ok(Some(fit::fit(&state.metrics, request.route, tokens, endpoint, &mut request.fields, exact).await?))
}

/// What the fit's plan leaves to send, or the response it made.
enum Planned<'s> {
    /// Send the request (`transform`: its `x-mlxgate-transform`).
    Send { request: Parsed<'s>, transform: Option<String> },
    /// A response made here.
    Made(Reply),
}

/// Carries out the fit's plan: a request sent as it is (perhaps transformed), a map-reduce
/// (mapped here, the reduce then sent; or, for a streaming client, all of it behind a stream
/// that starts now), embeddings in pieces.
async fn planned<'s>(
    state: &Arc<AppState>,
    mut request: Parsed<'s>,
    client: &ClientId,
    fitted: Option<Fitted>,
    record: &mut RequestRecord,
) -> Result<Planned<'s>, GatewayError> {
    let transform = match fitted {
        None => None,
        Some(Fitted::Send { transform, .. }) => transform,
        Some(Fitted::Chunk(chunked)) if request.fields.get("stream").is_some_and(|v| v.get() == "true") => {
            // The client gets its headers now and keep-alive comments while the pieces are
            // mapped (minutes on a long document), then the reduce's stream.
            let Parsed { parts, model, fields, .. } = request;
            record.transformed(Some(&chunk::transform(&chunked.plan)));
            let job = chunk::StreamedJob { model, client: client.clone(), parts, fields, chunked };
            let response = chunk::streamed(Arc::clone(state), job, record.take());
            return Ok(Planned::Made(Reply::Made { response, figures: None }));
        }
        Some(Fitted::Chunk(chunked)) => {
            let (route, parts) = (request.route, &request.parts);
            let partials = chunk::map(state, route, client, parts, &request.fields, &chunked, record).await?;
            chunk::reduce_request(&mut request.fields, &chunked, &partials, route.model.default_max_tokens)?;
            record.reestimated(estimated_prompt_tokens(&request.fields));
            Some(chunk::transform(&chunked.plan))
        }
        Some(Fitted::Embed(plan)) => {
            let Parsed { parts, route, fields, .. } = request;
            let (response, figures) = chunk::embed(state, route, client, &parts, fields, plan, record).await?;
            return Ok(Planned::Made(Reply::Made { response, figures: Some(figures) }));
        }
    };
    Ok(Planned::Send { request, transform })
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

/// The identity used for fair queueing: with auth on, the client's configured name (a client
/// rotating made-up keys gets 401, not a fresh share of the queue); with auth off, the bearer
/// key if sent, else the peer's IP address.
/// The peer is the record's (`peer`), else the request's `ConnectInfo`.
fn client_id(parts: &axum::http::request::Parts, caller: &Client, peer: Option<std::net::IpAddr>) -> ClientId {
    if let Client::Named(name) = caller {
        return ClientId(["client:", &**name].concat());
    }
    let bearer = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
        .filter(|k| !k.is_empty());
    if let Some(key) = bearer {
        return ClientId(["key:", key].concat());
    }
    let peer = peer.or_else(|| parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()));
    ClientId(format!("ip:{}", peer.map_or_else(|| "unknown".into(), |ip| ip.to_string())))
}

/// The session key of a request to a balanced model: the model's `session_header` when it is
/// set and sent, else the body's ([`fields::session_key`]), else the conversation key a face
/// noted (Claude Code's `metadata.user_id` or session header, Codex's `prompt_cache_key`).
fn session_key(
    route: &crate::dispatch::Route,
    parts: &axum::http::request::Parts,
    fields: &RawBody,
    record: &RequestRecord,
) -> Option<String> {
    let header = route.model.balance.session_header.as_ref().and_then(|name| parts.headers.get(name));
    let header = header.and_then(|v| v.to_str().ok()).filter(|v| !v.is_empty());
    header
        .map(|v| fields::cut_to(v.to_string(), fields::MAX_SESSION_KEY))
        .or_else(|| fields::session_key(fields))
        .or_else(|| record.conversation.clone())
}
