//! The outgoing request: the client's fields rewritten for the backend and encoded in one pass
//! ([`Rewrite::body`]: `model` to the backend's name, usage asked for, an explicit
//! `max_tokens`; every other value as the client wrote it); [`prepare`] adds the client's
//! method, path and headers. The client's own bytes and the parsed fields are gone before the
//! request waits in the queue.

use bytes::Bytes;

use super::fields::RawBody;
use crate::backend::handle::Outbound;
use crate::dispatch::Route;
use crate::error::GatewayError;

/// What the client asked for, ready to send: the body encoded once, and what the answer's
/// wrapping needs to know of the request.
pub(crate) struct Outgoing {
    pub(crate) outbound: Outbound,
    /// Generation endpoints (chat, completions): their answers are metered.
    pub(crate) generates: bool,
    pub(crate) client_wants_usage: bool,
    pub(crate) stats_comment: bool,
    /// `x-mlxgate-transform` for the client's response (middle-out, chunk).
    pub(crate) transform: Option<String>,
}

/// What [`Rewrite::body`] learnt of the request on the way.
pub(crate) struct Rewritten {
    /// A generation endpoint (chat, completions).
    pub(crate) generates: bool,
    /// Whether the client asked for usage itself (the gateway always does).
    pub(crate) client_wants_usage: bool,
}

/// The client's ask for the stats comment at a stream's end (`x-mlxgate-stats: 1`).
const STATS_HEADER: axum::http::HeaderName = axum::http::HeaderName::from_static("x-mlxgate-stats");

/// The request for `route`'s first backend: the client's fields rewritten and encoded
/// ([`prepare_for`]).
pub(crate) fn prepare(
    parts: &axum::http::request::Parts,
    fields: &RawBody,
    route: &Route,
) -> Result<Outgoing, GatewayError> {
    prepare_for(parts, fields, route, 0)
}

/// The request for `route`'s backend at `position` (in the model's list): the client's fields
/// as [`Rewrite::body`] writes them for that backend, with the client's method, path and
/// headers. `fields` are left as the client sent them.
pub(crate) fn prepare_for(
    parts: &axum::http::request::Parts,
    fields: &RawBody,
    route: &Route,
    position: usize,
) -> Result<Outgoing, GatewayError> {
    let backend = route.backends.get(position).unwrap_or(&route.backend);
    let rewrite = Rewrite {
        generates: matches!(parts.uri.path(), "/v1/chat/completions" | "/v1/completions"),
        upstream_model: route.model.upstream_model_for(&backend.config),
        takes_stream_options: backend.config.normalise.stream_options,
        default_max_tokens: route.model.default_max_tokens,
    };
    let (body, Rewritten { generates, client_wants_usage }) = rewrite.body(fields)?;
    let path_and_query = parts.uri.path_and_query().map_or(parts.uri.path(), |p| p.as_str()).to_string();
    let outbound = Outbound {
        method: parts.method.clone(),
        path_and_query,
        headers: parts.headers.clone(),
        body: Bytes::from(body),
    };
    Ok(Outgoing {
        outbound,
        generates,
        client_wants_usage,
        stats_comment: parts.headers.get(STATS_HEADER).is_some_and(|v| v.as_bytes() == b"1"),
        transform: None,
    })
}

/// Whether the backend at `position` takes the request built for the model's first backend as
/// it is: the same upstream model name and the same `stream_options` rule.
pub(crate) fn same_request(route: &Route, position: usize) -> bool {
    let (Some(first), Some(other)) = (route.backends.first(), route.backends.get(position)) else { return true };
    route.model.upstream_model_for(&first.config) == route.model.upstream_model_for(&other.config)
        && first.config.normalise.stream_options == other.config.normalise.stream_options
}

/// The request for the model's backend at `position`, built again from the client's `pristine`
/// fields when that backend takes another request than the first one's (another upstream model
/// name, another `stream_options` rule); `None`: it takes the first one's as it is.
pub(crate) fn for_position(
    parts: &axum::http::request::Parts,
    route: &Route,
    pristine: Option<&RawBody>,
    position: usize,
) -> Option<Result<Outbound, GatewayError>> {
    if same_request(route, position) {
        return None;
    }
    Some(prepare_for(parts, pristine?, route, position).map(|o| o.outbound))
}

/// How one backend takes a request: `model` becomes its upstream name; on generation
/// endpoints, usage is asked for and `max_tokens` made explicit.
pub(crate) struct Rewrite<'a> {
    /// A generation endpoint (chat, completions).
    pub(crate) generates: bool,
    /// The model's name at the backend.
    pub(crate) upstream_model: &'a str,
    /// The backend takes `stream_options` (`normalise.stream_options`).
    pub(crate) takes_stream_options: bool,
    /// The model's `default_max_tokens`, sent when the client gives no limit.
    pub(crate) default_max_tokens: u32,
}

/// `stream_options` as the backend gets it.
enum StreamOptions {
    /// The client's, as it sent it (or none).
    Kept,
    /// None: the backend refuses it.
    Dropped,
    /// The client's with `include_usage: true`, encoded.
    Set(Vec<u8>),
}

/// `stream_options` asking for usage alone (the client sent none, or `null`).
const USAGE_ONLY: &[u8] = br#"{"include_usage":true}"#;

impl Rewrite<'_> {
    /// The body the backend gets, encoded once: the client's fields in their order, each value
    /// as the client wrote it, except `model` (the upstream name), `stream_options` (usage
    /// asked for on a stream; none for a backend that refuses it) and a `max_tokens` added
    /// when the client set no limit (mlx_lm.server stops at 512 tokens when none is given).
    /// Fields the rewrite adds come last, as `model`, `stream_options`, `max_tokens`.
    pub(crate) fn body(&self, fields: &RawBody) -> Result<(Vec<u8>, Rewritten), GatewayError> {
        let mut client_wants_usage = true;
        let mut options = StreamOptions::Kept;
        if self.generates {
            if fields.get("stream").is_some_and(|v| v.get() == "true") {
                let (asked, set) = ask_for_usage(fields, self.takes_stream_options)?;
                client_wants_usage = asked;
                options = set.map_or(StreamOptions::Dropped, StreamOptions::Set);
            } else if !self.takes_stream_options {
                // Some SDKs send it on every request: a backend that refuses it gets none.
                options = StreamOptions::Dropped;
            }
        }
        let add_max_tokens =
            self.generates && !fields.contains_key("max_tokens") && !fields.contains_key("max_completion_tokens");
        let size: usize = fields.iter().map(|(k, v)| k.len() + v.get().len() + 4).sum();
        let mut out = Object { out: Vec::with_capacity(size + self.upstream_model.len() + 64), empty: true };
        out.out.push(b'{');
        let (mut has_model, mut has_options) = (false, false);
        for (key, value) in fields {
            match key.as_str() {
                "model" => {
                    has_model = true;
                    out.key(key)?;
                    string_into(&mut out.out, self.upstream_model)?;
                }
                "stream_options" => {
                    has_options = true;
                    match &options {
                        StreamOptions::Kept => out.field(key, value.get().as_bytes())?,
                        StreamOptions::Dropped => {}
                        StreamOptions::Set(set) => out.field(key, set)?,
                    }
                }
                _ => out.field(key, value.get().as_bytes())?,
            }
        }
        if !has_model {
            out.key("model")?;
            string_into(&mut out.out, self.upstream_model)?;
        }
        if let (false, StreamOptions::Set(set)) = (has_options, &options) {
            out.field("stream_options", set)?;
        }
        if add_max_tokens {
            out.field("max_tokens", itoa::Buffer::new().format(self.default_max_tokens).as_bytes())?;
        }
        out.out.push(b'}');
        Ok((out.out, Rewritten { generates: self.generates, client_wants_usage }))
    }
}

/// A JSON object being written: its bytes so far, and whether it has a field yet.
struct Object {
    out: Vec<u8>,
    empty: bool,
}

impl Object {
    /// Starts the field `key` (its separator, name and colon); its value is written next.
    fn key(&mut self, key: &str) -> Result<(), GatewayError> {
        if !std::mem::take(&mut self.empty) {
            self.out.push(b',');
        }
        string_into(&mut self.out, key)?;
        self.out.push(b':');
        Ok(())
    }

    /// Writes the field `key` with `value`, already JSON.
    fn field(&mut self, key: &str, value: &[u8]) -> Result<(), GatewayError> {
        self.key(key)?;
        self.out.extend_from_slice(value);
        Ok(())
    }
}

/// Writes `text` as a JSON string, as serde_json writes it.
fn string_into(out: &mut Vec<u8>, text: &str) -> Result<(), GatewayError> {
    if text.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
        return Ok(());
    }
    serde_json::to_writer(out, text).map_err(|e| GatewayError::invalid(format!("cannot re-encode the body: {e}"), None))
}

/// `stream_options` with `include_usage: true` (mlxgate always wants usage), encoded, and
/// whether the client had asked for it itself. Towards a backend that refuses `stream_options`
/// (`backend_takes_it: false`) there is none, not even the client's (the backend would refuse
/// the client's as it refuses the gateway's): the stream is metered without usage.
fn ask_for_usage(fields: &RawBody, backend_takes_it: bool) -> Result<(bool, Option<Vec<u8>>), GatewayError> {
    let mut options: serde_json::Map<String, serde_json::Value> = match fields.get("stream_options") {
        None => return Ok((false, backend_takes_it.then(|| USAGE_ONLY.to_vec()))),
        Some(raw) if raw.get() == "null" => return Ok((false, backend_takes_it.then(|| USAGE_ONLY.to_vec()))),
        Some(raw) => serde_json::from_str(raw.get())
            .map_err(|_| GatewayError::invalid("`stream_options` must be an object", Some("stream_options")))?,
    };
    let asked = options.get("include_usage").and_then(serde_json::Value::as_bool).unwrap_or(false);
    if !backend_takes_it {
        return Ok((asked, None));
    }
    options.insert("include_usage".into(), serde_json::Value::Bool(true));
    let encoded = serde_json::to_vec(&options)
        .map_err(|e| GatewayError::invalid(format!("cannot encode stream_options: {e}"), None))?;
    Ok((asked, Some(encoded)))
}

#[cfg(test)]
mod tests;
