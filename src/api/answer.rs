//! wrap: the backend's answer as the client gets it. [`call`] sends the prepared request
//! through dispatch's call and holds its answer ([`Answered`]); [`Answered::into_response`]
//! wraps it: a stream in the [`StreamMeter`] (which records the outcome at its end), a whole
//! answer read here (its figures as headers, `finish_length` applied, the backend's name for
//! the model replaced by the public one), a backend's error in OpenAI's shape.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::upstream::UpstreamBody;
use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use super::AppState;
use super::body::{MAX_ERROR_BODY, MAX_WHOLE_ANSWER, read_whole};
use super::fields::RawBody;
use super::normalise::stream_normalise;
use super::outgoing::{Outgoing, for_position, prepare};
use crate::backend::handle::Answer;
use crate::backend::upstream::strip_hop_by_hop;
use crate::config::BackendConfig;
use crate::dispatch::balancing::{Plan, Routed};
use crate::dispatch::call::{Encode, Held, Prepared};
use crate::dispatch::queue::{ClientId, Permit};
use crate::dispatch::route::Candidate;
use crate::dispatch::route::Router;
use crate::dispatch::{self, Route};
use crate::error::{ErrorBody, GatewayError, backend_error_body};
use crate::outcome::{AnswerHook, Outcome, RequestRecord};
use crate::stream::figures::{self, StreamFigures, Whole};
use crate::stream::finish::{StreamNormalise, stop_to_length};
use crate::stream::meter::{RequestInfo, StreamMeter};
use crate::stream::shutdown::Cutoff;

/// What the handler says of a request beyond its fields: the transform its prompt went through
/// (the `x-mlxgate-transform` header), and its session key (a model balanced by session).
#[derive(Debug, Default)]
pub(crate) struct Terms {
    pub transform: Option<String>,
    pub session: Option<String>,
    /// The `max_wait` of the model the client asked for, when its `fallback:` (`route`'s model)
    /// serves it: the request waits no longer than either model's bound.
    pub own_max_wait: Option<Duration>,
    /// The request's id, for the call's log lines.
    pub request_id: Option<crate::access_log::RequestId>,
}

/// call: the request prepared for `route`'s backend ([`prepare`]; for a model of several
/// backends, built again for another backend when it differs and the call is given it), then
/// dispatch's call (acquire → send → first bytes, retried as its rules say), its answer held
/// for wrapping.
pub(crate) async fn call(
    state: &AppState,
    route: &Route,
    client: &ClientId,
    parts: &axum::http::request::Parts,
    fields: RawBody,
    terms: Terms,
    sent: &std::sync::atomic::AtomicBool,
) -> Result<Answered, GatewayError> {
    let Terms { transform, session, own_max_wait, request_id } = terms;
    let request_id = request_id.as_ref().map_or("-", crate::access_log::RequestId::as_str);
    let max_wait = own_max_wait.map_or(route.model.max_wait, |own| own.min(route.model.max_wait));
    let mut outgoing = prepare(parts, &fields, route)?;
    outgoing.transform = transform;
    // A model of several backends keeps the client's fields, to build another backend's request.
    let pristine = if route.backends.len() > 1 {
        Some(fields)
    } else {
        drop(fields);
        None
    };
    let other = |position: usize| for_position(parts, route, pristine.as_ref(), position);
    let encode: Option<Encode<'_>> = if pristine.is_some() { Some(&other) } else { None };
    // A model of several backends: its balancer plans the request (the prompt read once).
    let mut plan = match route.balancer.as_ref() {
        Some((balancer, names)) => {
            let (balancer, names, body) = (Arc::clone(balancer), Arc::clone(names), outgoing.outbound.body.clone());
            Some(Plan::read(balancer, &route.model.name, names, body, session, &state.metrics).await)
        }
        None => None,
    };
    let held = {
        let mut choose = plan.as_mut().map(|plan| move |candidates: &[Candidate<'_>]| plan.choose(candidates));
        let router: Option<Router<'_>> = choose.as_mut().map(|f| f as Router<'_>);
        let prepared =
            Prepared { route, client, outbound: &outgoing.outbound, encode, router, sent, max_wait, request_id };
        dispatch::call::call(prepared, &state.metrics, &state.cutoff).await?
    };
    let backend = route.backends.get(held.position()).unwrap_or(&route.backend);
    let (routed, feedback) = match plan {
        Some(plan) => (plan.granted(held.position()), Some(plan.feedback(held.position(), held.answer.sent_at))),
        None => (None, None),
    };
    let Held { permit, answer, queue_wait } = held;
    let normalise = stream_normalise(&backend.config, &outgoing);
    Ok(Answered {
        answer,
        permit,
        outgoing: Box::new(outgoing),
        queue_wait,
        idle_timeout: backend.config.stream_idle_timeout,
        normalise,
        backend: Arc::clone(&backend.config),
        feedback,
        routed,
    })
}

/// A backend's answer with the slot it holds, before it is wrapped for the client.
pub(crate) struct Answered {
    answer: Answer,
    permit: Permit,
    /// Boxed: the answer is moved through the handler's result, and the request's parts are large.
    outgoing: Box<Outgoing>,
    /// Time spent waiting for slots (every attempt's).
    queue_wait: Duration,
    idle_timeout: Duration,
    normalise: StreamNormalise,
    /// The backend that answered.
    backend: Arc<BackendConfig>,
    /// What its answer teaches the model's balancer (a model of several backends).
    feedback: Option<AnswerHook>,
    /// Why the balancer bound it there (a model of several backends).
    routed: Option<Routed>,
}

impl Answered {
    /// wrap: the client's response. Streams and raw bodies are wrapped in the [`StreamMeter`]
    /// (which records the outcome at their end) at once; whole answers and the backend's own
    /// errors are to be read first (a boxed future: the rarer path holds the larger state).
    pub(crate) fn into_response(self, record: RequestRecord, cutoff: Arc<Cutoff>) -> Wrapped {
        let Answered { answer, permit, outgoing, queue_wait, idle_timeout, normalise, backend, feedback, routed } =
            self;
        let Answer { mut head, body, first, sent_at } = answer;
        let mut record = record;
        record.served_by(&backend.name);
        if let Some(routed) = routed {
            record.route_decided(routed.reason, routed.predicted_cached_tokens);
        }
        if let Some(feedback) = feedback {
            record.on_answer(feedback);
        }
        record.queued(queue_wait);
        strip_hop_by_hop(&mut head.headers);
        // Whatever the backend spoke (mlx_lm.server: HTTP/1.0), the client gets HTTP/1.1.
        head.version = axum::http::Version::HTTP_11;
        if let Some(v) = outgoing.transform.as_deref().and_then(|t| HeaderValue::from_str(t).ok()) {
            head.headers.insert(TRANSFORM_HEADER, v);
        }
        let info = RequestInfo {
            record,
            queue_wait,
            client_wants_usage: outgoing.client_wants_usage,
            stats_comment: outgoing.stats_comment,
            idle_timeout,
            cutoff,
            normalise,
        };
        if !head.status.is_success() {
            return Wrapped::Read(Box::pin(error_answer(head, body, first, permit, info)));
        }
        let sse = head
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if sse {
            // Tell nginx-style proxies in front of us not to buffer, and caches not to keep it.
            head.headers.insert(ACCEL_BUFFERING, HeaderValue::from_static("no"));
            head.headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            // The meter changes the length (a dropped usage chunk, an error event, the stats
            // line): the client's body is chunked, never the backend's announced length.
            head.headers.remove(header::CONTENT_LENGTH);
            let mut info = info;
            info.record.responded(head.status.as_u16());
            let body = StreamMeter::new(body, first, permit, info);
            return Wrapped::Now(Response::from_parts(head, Body::new(body)));
        }
        // Whole answers (embeddings too: read whole, their usage settles the client's charge
        // and the record ends with the answer, not when hyper stops polling a body of a known
        // length).
        Wrapped::Read(Box::pin(whole_answer(head, body, first, permit, info, sent_at, outgoing.generates)))
    }
}

/// The headers of the per-request figures and of what the gateway did (names built once).
pub(crate) const TRANSFORM_HEADER: HeaderName = HeaderName::from_static("x-mlxgate-transform");
pub(crate) const ACCEL_BUFFERING: HeaderName = HeaderName::from_static("x-accel-buffering");
const QUEUE_MS: HeaderName = HeaderName::from_static("x-mlxgate-queue-ms");
const TTFT_MS: HeaderName = HeaderName::from_static("x-mlxgate-ttft-ms");
const TOKENS_PER_SECOND: HeaderName = HeaderName::from_static("x-mlxgate-tokens-per-second");

/// A wrapped answer: its response now (a stream), or the reading that makes it (a whole
/// answer, a backend's error).
pub(crate) enum Wrapped {
    Now(Response),
    Read(std::pin::Pin<Box<dyn std::future::Future<Output = Response> + Send>>),
}

/// A whole (non-streaming) answer: read it (it is complete when the backend sends it) to take
/// its usage, record it, and add the per-request figures as headers. `sent_at` is when the
/// request went to the backend: the answer's tokens per second are over the backend's time.
/// `generates`: a chat or completion (an embeddings answer has no first token to time).
async fn whole_answer(
    mut head: hyper::http::response::Parts,
    incoming: UpstreamBody,
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
    let Some((figures, model_at)) = figures::whole_answer(&whole) else {
        let e = GatewayError::Backend {
            backend,
            reason: format!("it answered {} with a body that is not an OpenAI answer", head.status),
        };
        info.record.responded(e.status().as_u16());
        info.record.finish_answered(Outcome::from(&e), &StreamFigures::default().of_whole(Whole::Failed));
        return e.into_response();
    };
    info.record.responded(head.status.as_u16());
    let whole = named_at(whole, info.record.public_model(), model_at);
    let headers = &mut head.headers;
    headers.remove(header::CONTENT_LENGTH);
    headers.insert(QUEUE_MS, HeaderValue::from(info.queue_wait.as_millis() as u64));
    if !generates {
        info.record.finish_answered(Outcome::Ok, &figures.of_whole(Whole::Embeddings));
        return Response::from_parts(head, Body::from(whole));
    }
    headers.insert(TTFT_MS, HeaderValue::from(info.record.arrived.elapsed().as_millis() as u64));
    if let Some(tokens) = figures.tokens() {
        let seconds = sent_at.elapsed().as_secs_f64().max(1e-6);
        if let Ok(v) = HeaderValue::from_str(&one_decimal(tokens as f64 / seconds)) {
            headers.insert(TOKENS_PER_SECOND, v);
        }
    }
    let whole = finish_at_length(whole, &figures, info.normalise.length_at);
    info.record.finish_answered(Outcome::Ok, &figures.of_whole(Whole::Answer));
    Response::from_parts(head, Body::from(whole))
}

/// `value` with one decimal, as `format!("{:.1}")` writes a finite value ≥ 0 (rounded half away
/// from zero: a hair apart from `format!`'s ties-to-even on exact halves), without its float
/// formatting machinery.
fn one_decimal(value: f64) -> String {
    if !value.is_finite() || !(0.0..1e15).contains(&value) {
        return format!("{value:.1}");
    }
    let tenths = (value * 10.0).round() as u64;
    let mut digits = itoa::Buffer::new();
    let whole = digits.format(tenths / 10);
    let mut text = String::with_capacity(whole.len() + 2);
    text.push_str(whole);
    text.push('.');
    text.push(char::from(b'0' + (tenths % 10) as u8));
    text
}

/// A whole answer naming `model` (the public name) where the backend put its own name for it
/// (a path on disk, say): the `model` string at `span` (found when the answer was read; `None`:
/// it names none) replaced in the answer's text, nothing re-encoded.
fn named_at(whole: Vec<u8>, model: &str, span: Option<std::ops::Range<usize>>) -> Vec<u8> {
    let Some(span) = span else { return whole };
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
    incoming: UpstreamBody,
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
    let request_id = info.record.request_id().as_str();
    tracing::info!(request_id, backend = %backend, status = %head.status, message = %body["error"]["message"], "backend refused the request");
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

#[cfg(test)]
mod tests {
    use super::one_decimal;
    use proptest::prelude::*;

    proptest! {
        /// Within a hair of `format!("{:.1}")`: equal but where the value lies within a
        /// rounding error of a tie (`…x5`), where the two may round apart by one tenth.
        #[test]
        fn one_decimal_writes_as_format_does(value in 0.0f64..1e7) {
            let ours = one_decimal(value);
            let theirs = format!("{value:.1}");
            let tie = ((value * 10.0).fract() - 0.5).abs() < 1e-6;
            if !tie {
                prop_assert_eq!(ours, theirs);
            } else {
                let (a, b): (f64, f64) = (ours.parse().unwrap(), theirs.parse().unwrap());
                prop_assert!((a - b).abs() <= 0.1 + 1e-9, "{} vs {}", ours, theirs);
            }
        }
    }

    #[test]
    fn one_decimal_of_plain_values() {
        assert_eq!(one_decimal(0.0), "0.0");
        assert_eq!(one_decimal(180.54), "180.5");
        assert_eq!(one_decimal(9.96), "10.0");
        assert_eq!(one_decimal(f64::INFINITY), "inf");
    }
}
