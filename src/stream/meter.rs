//! `StreamMeter`: the one wrapper around every proxied streaming response body. It
//!
//! - forwards the backend's own bytes (zero-copy slices) as soon as each SSE frame is complete,
//!   and drops the usage-only chunk when the client did not ask for usage (mlxgate always asks
//!   the backend for it);
//! - re-parses the stream to measure what the client really got: time to first token (the first
//!   frame carrying text, reasoning or a tool call — not role-only chunks, comments or omlx's
//!   `chatcmpl-keepalive`), inter-token latency and decode speed, tokens from the backend's last
//!   `usage` (never from the frame count), bursts, usage that disagrees with the stream, and an
//!   `{"error": …}` event as a failure whatever `finish_reason` follows;
//! - holds the request's queue [`Permit`] until the body ends or the client goes away — or,
//!   for a backend that keeps generating after its client left (`hold_abandoned`), until the
//!   backend has ended the abandoned stream, read to its end in the background (bounded);
//! - applies the backend's stream-side normalisations (`finish_length`: a `stop` finish at
//!   `max_tokens` becomes `length`; `single_finish`: a repeated finish chunk reaches the client
//!   as the usage it adds, the first with its output as it was), re-serialising only the frames
//!   they change;
//! - names the model as the client did: each event's `model` string becomes the public name
//!   (found by the frame reading, replaced in the event's text, never re-encoded), so an answer
//!   never shows the backend's name for it (a path on disk, say);
//! - classifies how the stream ended, once: complete (`[DONE]` or a `finish_reason` seen), an
//!   error event, or cut — an end of file before the answer's end (HTTP/1.0 bodies end at the
//!   close, so a crashed mlx_lm.server looks like a normal end), a broken connection, silence
//!   longer than `stream_idle_timeout`, or an event larger than [`MAX_EVENT_BYTES`]; a cut
//!   stream gets a final SSE error event and counts as a backend failure;
//! - records everything once, when the stream ends (what each figure means: docs/metrics.md).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use pin_project_lite::pin_project;
use serde_json::Value;
use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

use super::frame::{self, Seen};
use super::sse::{Event, Item, SseParser};
use crate::dispatch::queue::Permit;
use crate::error::GatewayError;
use crate::metrics::Metrics;
use crate::outcome::{Outcome, RequestRecord, Usage};

/// A burst: at least this share of the generated tokens' frames arrived in one read.
const BURST_SHARE: f64 = 0.5;

/// The largest SSE event (or unfinished line) a backend may send: past it the stream is cut,
/// so a backend that never ends a line cannot make the gateway hold its bytes without bound.
pub const MAX_EVENT_BYTES: usize = 16 << 20;

/// The end of the shutdown grace, as the running streams see it: once cut, each ends itself
/// with a final error event (counted as `gateway_shutdown`) instead of being dropped mid-frame
/// with its connection.
#[derive(Default)]
pub struct Cutoff {
    notify: Arc<Notify>,
    cut: AtomicBool,
}

impl Cutoff {
    /// Ends every running stream.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// A future that resolves at the cut; registered from its creation on.
    pub fn notified(&self) -> Pin<Box<OwnedNotified>> {
        Box::pin(Arc::clone(&self.notify).notified_owned())
    }

    /// Whether the cut has happened.
    pub fn is_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }
}

/// Who the request was and what the client asked.
pub struct RequestInfo {
    /// The request's one outcome record (labels, arrival time).
    pub record: RequestRecord,
    pub queue_wait: Duration,
    /// The client asked for `stream_options.include_usage`; else the usage-only chunk is dropped.
    pub client_wants_usage: bool,
    /// Append `: mlxgate queue_ms=… ttft_ms=… tokens=… tps=…` at the end (`x-mlxgate-stats: 1`).
    pub stats_comment: bool,
    /// Longest silence of the backend once its answer has begun.
    pub idle_timeout: Duration,
    /// The gateway's shutdown cut.
    pub cutoff: Arc<Cutoff>,
    /// The backend's stream-side normalisations.
    pub normalise: StreamNormalise,
}

/// The stream-side normalisations in force for one answer (from its backend's `normalise:`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamNormalise {
    /// `finish_length`: the completion tokens at which the answer counts as cut by its
    /// `max_tokens`, where a `stop` finish becomes `length`; `None` when off.
    pub length_at: Option<u64>,
    /// `single_finish`: a finish chunk without usage waits for the next event; when that event is
    /// the same finish again, the first goes on and the repeat becomes a usage-only chunk (for a
    /// client that asked for usage; else nothing), unless it carries output the first did not.
    pub single_finish: bool,
    /// `hold_abandoned`: a stream the client leaves is read to its end before its slot is freed.
    pub hold_abandoned: bool,
}

impl StreamNormalise {
    /// Whether any frame may be rewritten, held or dropped by a normalisation.
    fn rewrites(&self) -> bool {
        self.length_at.is_some() || self.single_finish
    }
}

/// The longest an abandoned stream is read for before its slot is freed whatever the backend
/// does. Each read is also bounded by the backend's `stream_idle_timeout`. Ten minutes covers
/// any answer the servers here generate on a Mac (tens of thousands of tokens at 50+ tokens/s),
/// while a backend that never ends a stream cannot keep the slot for more than that.
pub const MAX_ABANDONED_DRAIN: Duration = Duration::from_secs(600);

impl RequestInfo {
    fn backend(&self) -> String {
        self.record.backend.clone()
    }
}

/// How the body is watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `text/event-stream`: parsed, metered, forwarded frame by frame.
    Sse,
    /// Anything else (embeddings, a backend's error body): forwarded as read, not parsed.
    Raw,
}

/// What one stream showed, measured as it passed.
#[derive(Debug, Default, Clone)]
pub struct StreamFigures {
    /// First frame with generated text, reasoning or a tool call.
    pub first_token: Option<Instant>,
    pub last_token: Option<Instant>,
    /// Frames that carried generated output.
    pub token_frames: u64,
    /// Most token frames in one read from the backend.
    pub max_frames_in_one_read: u64,
    /// The backend's last `usage` object.
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens` of that usage: prompt tokens the backend
    /// served from its prompt cache (`None` when it does not report them, as vllm-mlx).
    pub cached_tokens: Option<u64>,
    /// An `{"error": …}` event, with its message.
    pub error: Option<String>,
    pub done: bool,
    /// Choice indices seen, and those that carried a `finish_reason` (`n` > 1 answers several
    /// choices in one stream: each must finish).
    pub choices_seen: Vec<u64>,
    pub choices_finished: Vec<u64>,
    /// The body was parsed as a stream of generated output.
    pub metered: bool,
}

impl StreamFigures {
    /// Looks at one SSE item; returns (whether it goes to the client, whether it carried
    /// generated output).
    pub fn watch(&mut self, item: &Item, now: Instant, client_wants_usage: bool) -> (bool, bool) {
        let (keep, generated, _) = self.look(item, now, client_wants_usage);
        (keep, generated)
    }

    /// As [`Self::watch`], with what the event said (`None` for comments, `[DONE]`, errors and
    /// what is not JSON).
    fn look(&mut self, item: &Item, now: Instant, client_wants_usage: bool) -> (bool, bool, Option<Seen>) {
        let Item::Event(event) = item else { return (true, false, None) };
        if event.data == "[DONE]" {
            self.done = true;
            return (true, false, None);
        }
        let Some(mut seen) = frame::read(&event.data) else { return (true, false, None) };
        if let Some(message) = seen.error.take() {
            self.error.get_or_insert(message);
            return (true, false, None);
        }
        if let Some(usage) = seen.usage {
            // vllm-mlx sends usage twice: the last one wins, never a sum.
            self.prompt_tokens = usage.prompt_tokens.or(self.prompt_tokens);
            self.completion_tokens = usage.completion_tokens.or(self.completion_tokens);
            self.cached_tokens = usage.cached_tokens.or(self.cached_tokens);
        }
        for choice in &seen.choices {
            if !self.choices_seen.contains(&choice.index) {
                self.choices_seen.push(choice.index);
            }
            if choice.finished && !self.choices_finished.contains(&choice.index) {
                self.choices_finished.push(choice.index);
            }
        }
        let usage_only = seen.has_choices && seen.choices.is_empty() && seen.usage.is_some();
        let generated = !seen.keepalive && seen.choices.iter().any(|c| c.output);
        if generated {
            self.first_token.get_or_insert(now);
            self.last_token = Some(now);
            self.token_frames += 1;
        }
        (!usage_only || client_wants_usage, generated, Some(seen))
    }

    /// Whether the stream showed its end: `[DONE]`, or a `finish_reason` for every choice it
    /// carried. A stream that stops without either was cut (the backend died or dropped the
    /// connection).
    pub fn complete(&self) -> bool {
        let every_choice_finished =
            !self.choices_seen.is_empty() && self.choices_seen.iter().all(|i| self.choices_finished.contains(i));
        self.done || every_choice_finished
    }

    /// Tokens generated, from the backend's usage; `None` when it sent none.
    pub fn tokens(&self) -> Option<u64> {
        self.completion_tokens
    }

    /// What the answer used, for the client's token limit. A stream cut before its usage
    /// (the client left, the backend died) is charged the output frames it showed: for the
    /// servers here one token each, and a charge of nothing would make cutting streams free.
    pub fn usage(&self) -> Usage {
        let shown = self.metered.then_some(self.token_frames);
        Usage { prompt_tokens: self.prompt_tokens, generated_tokens: self.tokens().or(shown) }
    }

    /// Whether most tokens arrived in one read (a detokenizer holding text back, a proxy
    /// buffering): then the stream's timing says nothing about decode speed. One frame that
    /// carries several of usage's tokens is a burst too (mlx_lm.server held a random model's
    /// broken UTF-8 back and sent 64 tokens in one frame).
    pub fn is_burst(&self) -> bool {
        match self.token_frames {
            0 => false,
            1 => self.tokens().is_some_and(|tokens| tokens >= 2),
            frames => self.max_frames_in_one_read as f64 >= BURST_SHARE * frames as f64,
        }
    }

    /// (tokens − 1) / (last token − first token), only for a spread-out stream with known tokens.
    pub fn decode_tokens_per_second(&self) -> Option<f64> {
        let (first, last, tokens) = (self.first_token?, self.last_token?, self.tokens()?);
        let span = last.duration_since(first).as_secs_f64();
        (tokens >= 2 && span > 0.0 && !self.is_burst()).then(|| (tokens - 1) as f64 / span)
    }

    /// Mean time between tokens, under the same conditions as the decode speed.
    pub fn inter_token_latency(&self) -> Option<f64> {
        self.decode_tokens_per_second().map(|tps| 1.0 / tps)
    }

    /// The stream shows no output while usage counts tokens (Rapid-MLX's reasoning parser), or
    /// more output frames than usage's tokens.
    pub fn usage_mismatch(&self) -> bool {
        match self.tokens() {
            Some(tokens) => (self.token_frames == 0 && tokens > 0) || self.token_frames > tokens,
            None => false,
        }
    }
}

pin_project! {
    /// Wraps the backend's streaming body for the client.
    #[project = StreamMeterProj]
    pub struct StreamMeter {
        // The backend's body; taken by the reading of an abandoned stream (`hold_abandoned`).
        inner: Option<Incoming>,
        mode: Mode,
        forward: Forward,
        figures: StreamFigures,
        info: Option<RequestInfo>,
        permit: Option<Permit>,
        finished: bool,
        // Fires when the backend has been silent for the idle timeout.
        idle: Pin<Box<tokio::time::Sleep>>,
        // A raw body's cut, given to the client as a body error (the connection is aborted).
        failure: Option<axum::BoxError>,
        // Fires when the gateway's shutdown grace is over.
        shutdown: Pin<Box<OwnedNotified>>,
    }

    impl PinnedDrop for StreamMeter {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // Dropped after the answer's `[DONE]` went out, before the backend closed: the client
            // had the whole answer and hung up (Codex closes at `response.completed`, which the
            // Responses face sends at `[DONE]`). That is the answer's end, not a departure.
            // Its slot is not `finish`ed (the backend's body was not read to its end: a
            // serialized backend's next request keeps its pauses).
            if *this.mode == Mode::Sse && this.figures.done && this.forward.out.is_empty() {
                if let Some(info) = this.info.take() {
                    let outcome = if this.figures.error.is_some() { Outcome::StreamError } else { Outcome::Ok };
                    record(info, this.figures, outcome);
                }
                return;
            }
            // Dropped before its end: the client went away.
            if let Some(info) = this.info.take() {
                if info.normalise.hold_abandoned
                    && *this.mode == Mode::Sse
                    && !*this.finished
                    && let (Some(body), Some(permit)) = (this.inner.take(), this.permit.take())
                {
                    hold_abandoned(body, permit, &info);
                }
                record(info, this.figures, Outcome::ClientClosed);
            }
        }
    }
}

impl StreamMeter {
    /// Wraps `inner`; `first` holds bytes already taken from it (the first frame of a managed
    /// backend's answer). `permit` is released when the body ends or is dropped.
    pub fn new(inner: Incoming, mode: Mode, first: Option<Bytes>, permit: Permit, info: RequestInfo) -> Self {
        let idle = Box::pin(tokio::time::sleep(info.idle_timeout));
        let shutdown = info.cutoff.notified();
        let mut meter = StreamMeter {
            inner: Some(inner),
            mode,
            forward: Forward::new(info.normalise).naming(info.record.public_model()),
            figures: StreamFigures { metered: mode == Mode::Sse, ..Default::default() },
            info: Some(info),
            permit: Some(permit),
            finished: false,
            idle,
            failure: None,
            shutdown,
        };
        match (first, mode) {
            (Some(first), Mode::Raw) => meter.forward.out.push_back(first),
            (Some(first), Mode::Sse) => {
                let wants_usage = meter.info.as_ref().is_some_and(|i| i.client_wants_usage);
                meter.forward.observe(&mut meter.figures, first, wants_usage);
            }
            (None, _) => {}
        }
        meter
    }
}

/// Reads the rest of a stream its client abandoned, discarding it, and frees its slot when the
/// backend ends it (or stalls past its idle timeout, or after [`MAX_ABANDONED_DRAIN`], or at the
/// gateway's shutdown): the next request waits for the slot in the queue, where its wait shows,
/// and not at a backend still busy with the abandoned answer. Without a runtime (a test
/// dropping a meter outside one) the slot is freed at once.
fn hold_abandoned(body: Incoming, mut permit: Permit, info: &RequestInfo) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    permit.abandon();
    let backend = info.backend();
    let held = info.record.metrics().abandoned_held.with_label_values(&[&backend]);
    held.inc();
    let (idle_timeout, cutoff) = (info.idle_timeout, Arc::clone(&info.cutoff));
    runtime.spawn(async move {
        let started = Instant::now();
        let (end, bytes) = drain(body, idle_timeout, &cutoff).await;
        drop(permit);
        held.dec();
        tracing::info!(backend = %backend, end, bytes, held_for = ?started.elapsed(), "abandoned stream read to its end; its slot is free");
    });
}

/// Reads an abandoned answer's `body` to its end, bounded (each read by `idle_timeout`, the whole
/// by [`MAX_ABANDONED_DRAIN`], and the shutdown's cut); returns how the reading ended
/// (`finished`, `broken`, `stalled`, `capped`, `shutdown`) and the bytes it discarded.
pub async fn drain(mut body: Incoming, idle_timeout: Duration, cutoff: &Cutoff) -> (&'static str, usize) {
    use http_body_util::BodyExt;
    let mut shutdown = cutoff.notified();
    let cap = tokio::time::sleep(MAX_ABANDONED_DRAIN);
    tokio::pin!(cap);
    let mut bytes = 0;
    loop {
        if cutoff.is_cut() {
            return ("shutdown", bytes);
        }
        tokio::select! {
            () = shutdown.as_mut() => return ("shutdown", bytes),
            () = &mut cap => return ("capped", bytes),
            read = tokio::time::timeout(idle_timeout, body.frame()) => match read {
                Err(_) => return ("stalled", bytes),
                Ok(None) => return ("finished", bytes),
                Ok(Some(Err(_))) => return ("broken", bytes),
                Ok(Some(Ok(frame))) => bytes += frame.data_ref().map_or(0, Bytes::len),
            },
        }
    }
}

/// Turns the backend's reads into the client's: complete frames only, in order, as zero-copy
/// slices of the backend's bytes, less the frames that must not be forwarded, and the frames a
/// normalisation changes re-serialised.
#[derive(Default)]
struct Forward {
    parser: SseParser,
    /// Bytes of an unfinished frame, held until the frame completes.
    partial: Vec<Bytes>,
    /// Ready to go to the client, in order.
    out: VecDeque<Bytes>,
    /// How the previous read ended: on an item's line end, kept or dropped. The `\n` of that
    /// line's `\r\n` may open the next read, and goes (or not) with that item.
    tail: Tail,
    /// The normalisations' state.
    finish: Finish,
    /// The public model name as a JSON string, put in place of each event's `model`.
    model: Option<Box<str>>,
}

/// Puts `model` (a JSON string) in place of an event's `model` string where it differs; returns
/// whether the event changed (it is then written anew).
fn rename(item: &mut Item, seen: Option<&Seen>, model: Option<&str>) -> bool {
    let (Item::Event(event), Some(span), Some(model)) = (item, seen.and_then(|s| s.model.clone()), model) else {
        return false;
    };
    if event.data.get(span.clone()) == Some(model) {
        return false;
    }
    event.data.replace_range(span, model);
    true
}

/// What becomes of one SSE item on its way to the client.
#[derive(Debug, PartialEq)]
enum Action {
    /// The backend's bytes, as they are.
    Keep,
    /// Nothing.
    Drop,
    /// These bytes instead: the item re-serialised, after a held finish frame it releases.
    Replace(Bytes),
}

impl Action {
    fn of(keep: bool) -> Self {
        if keep { Action::Keep } else { Action::Drop }
    }
}

/// The finish-frame normalisations of one stream (`finish_length`, `single_finish`).
#[derive(Default)]
struct Finish {
    normalise: StreamNormalise,
    /// A finish frame without usage, waiting for the next event (`single_finish`), with the
    /// choices it finishes.
    held: Option<(Event, Vec<u64>)>,
}

/// The choices an event finishes, when it is a finish frame: every choice it carries has a
/// `finish_reason`.
fn finished_choices(seen: Option<&Seen>) -> Option<Vec<u64>> {
    let seen = seen?;
    if seen.choices.is_empty() || !seen.choices.iter().all(|c| c.finished) {
        return None;
    }
    let mut indices: Vec<u64> = seen.choices.iter().map(|c| c.index).collect();
    indices.sort_unstable();
    Some(indices)
}

impl Finish {
    /// What becomes of one item, once the figures have seen it (`keep`: whether it goes to the
    /// client as far as the meter is concerned).
    fn settle(
        &mut self,
        item: &Item,
        seen: Option<&Seen>,
        keep: bool,
        figures: &StreamFigures,
        wants_usage: bool,
    ) -> Action {
        // Comments and blank lines pass; a held finish waits for an event.
        let Item::Event(event) = item else { return Action::of(keep) };
        let finishes = finished_choices(seen);
        if let Some((held, indices)) = self.held.take() {
            if finishes.as_ref() == Some(&indices) {
                // The repeat: the first goes on (with `finish_length` judged on the repeat's
                // usage, read by now), the repeat as the usage it adds.
                let mut out = self.render_finish(&held, figures).to_vec();
                match Repeat::of(&held, event) {
                    // As the meter treats a usage-only chunk: for a client that asked for usage.
                    Repeat::Usage(usage) if wants_usage => out.extend_from_slice(&usage),
                    Repeat::Usage(_) | Repeat::Nothing => {}
                    Repeat::Output => out.extend_from_slice(&self.render_finish(event, figures)),
                }
                return Action::Replace(Bytes::from(out));
            }
            let mut out = self.render_finish(&held, figures).to_vec();
            match self.settle(item, seen, keep, figures, wants_usage) {
                Action::Keep => out.extend_from_slice(&render(event, &event.data)),
                Action::Drop => {}
                Action::Replace(bytes) => out.extend_from_slice(&bytes),
            }
            return Action::Replace(Bytes::from(out));
        }
        let Some(indices) = finishes else { return Action::of(keep) };
        if self.normalise.single_finish && seen.is_some_and(|s| s.usage.is_none()) {
            self.held = Some((event.clone(), indices));
            return Action::Drop;
        }
        if self.cut_by_max_tokens(figures) && keep {
            return Action::Replace(self.render_finish(event, figures));
        }
        Action::of(keep)
    }

    /// Whether the answer reached its `max_tokens`: the backend's last usage says so, or, before
    /// any usage, the output frames shown (one token each on the servers here). Only for an
    /// answer of one choice: usage counts every choice's tokens, `max_tokens` limits each.
    fn cut_by_max_tokens(&self, figures: &StreamFigures) -> bool {
        let generated = figures.completion_tokens.unwrap_or(figures.token_frames);
        self.normalise.length_at.is_some_and(|at| generated >= at) && figures.choices_seen.len() <= 1
    }

    /// A finish frame as the client gets it: `stop` made `length` when the answer was cut by
    /// `max_tokens`, else as it was.
    fn render_finish(&self, event: &Event, figures: &StreamFigures) -> Bytes {
        if !self.cut_by_max_tokens(figures) {
            return render(event, &event.data);
        }
        match serde_json::from_str::<Value>(&event.data) {
            Ok(mut value) => {
                stop_to_length(&mut value);
                render(event, &value.to_string())
            }
            Err(_) => render(event, &event.data),
        }
    }

    /// The end of the stream: a finish still held goes to the client.
    fn release(&mut self, figures: &StreamFigures) -> Option<Bytes> {
        let (held, _) = self.held.take()?;
        Some(self.render_finish(&held, figures))
    }
}

/// What a repeated finish frame (mlx-omni-server: the finish again, with only the role and the
/// usage) adds to the first.
#[derive(Debug, PartialEq)]
enum Repeat {
    /// Nothing but its usage: it goes on as the usage-only chunk it amounts to, in OpenAI's
    /// shape (`"choices": []` and its `usage`).
    Usage(Bytes),
    /// Nothing at all.
    Nothing,
    /// Output the first did not carry (text, reasoning, a tool call): it goes on as it is, and
    /// the client sees two finish chunks rather than lose output.
    Output,
}

impl Repeat {
    fn of(first: &Event, repeat: &Event) -> Repeat {
        let (Ok(first_value), Ok(mut value)) =
            (serde_json::from_str::<Value>(&first.data), serde_json::from_str::<Value>(&repeat.data))
        else {
            return Repeat::Output;
        };
        let first_choices = first_value.get("choices").and_then(Value::as_array);
        let choices = value.get("choices").and_then(Value::as_array).into_iter().flatten();
        let adds = choices.into_iter().any(|choice| {
            let same = first_choices.into_iter().flatten().find(|c| c.get("index") == choice.get("index"));
            adds_output(choice, same)
        });
        if adds {
            return Repeat::Output;
        }
        if !value.get("usage").is_some_and(Value::is_object) {
            return Repeat::Nothing;
        }
        value["choices"] = Value::Array(Vec::new());
        Repeat::Usage(render(repeat, &value.to_string()))
    }
}

/// Whether a choice carries output its counterpart in an earlier frame did not: a non-empty
/// `text` or delta field (other than `role`) that differs from the earlier one's.
fn adds_output(choice: &Value, earlier: Option<&Value>) -> bool {
    let empty = |v: &Value| v.is_null() || v.as_str() == Some("") || v.as_array().is_some_and(Vec::is_empty);
    let new_in = |field: Option<&Value>, before: Option<&Value>| {
        field
            .into_iter()
            .filter_map(Value::as_object)
            .flatten()
            .any(|(key, v)| key != "role" && !empty(v) && before.and_then(|b| b.get(key)) != Some(v))
    };
    let text = choice.get("text").filter(|t| !empty(t));
    let new_text = text.is_some_and(|t| earlier.and_then(|e| e.get("text")) != Some(t));
    new_text || new_in(choice.get("delta"), earlier.and_then(|e| e.get("delta")))
}

/// Turns every `finish_reason: "stop"` of an answer's (or a chunk's) choices into `"length"`;
/// returns whether any was.
pub fn stop_to_length(value: &mut Value) -> bool {
    let mut changed = false;
    for choice in value.get_mut("choices").and_then(Value::as_array_mut).into_iter().flatten() {
        if let Some(reason) = choice.get_mut("finish_reason").filter(|r| r.as_str() == Some("stop")) {
            *reason = Value::from("length");
            changed = true;
        }
    }
    changed
}

/// One SSE event written anew, with `data` as its data (one `data:` line per line of it).
fn render(event: &Event, data: &str) -> Bytes {
    let mut out = String::with_capacity(data.len() + 16);
    if let Some(name) = &event.event {
        out.push_str(&format!("event: {name}\n"));
    }
    if let Some(id) = &event.id {
        out.push_str(&format!("id: {id}\n"));
    }
    for line in data.split('\n') {
        out.push_str("data: ");
        out.push_str(line);
        out.push('\n');
    }
    out.push('\n');
    Bytes::from(out)
}

/// A renamed event the client gets as it is goes as its new text.
fn renamed_action(action: Action, renamed: bool, item: &Item) -> Action {
    match (action, item) {
        (Action::Keep, Item::Event(event)) if renamed => Action::Replace(render(event, &event.data)),
        (action, _) => action,
    }
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum Tail {
    /// Inside a frame (or nothing read yet).
    #[default]
    Open,
    Kept,
    Dropped,
}

impl Forward {
    fn new(normalise: StreamNormalise) -> Self {
        Forward { finish: Finish { normalise, held: None }, ..Forward::default() }
    }

    /// Names `model` (the public name) in every event that carries a `model` string; nothing
    /// for an empty name.
    fn naming(mut self, model: &str) -> Self {
        self.model = (!model.is_empty()).then(|| Value::from(model).to_string().into_boxed_str());
        self
    }

    /// Parses one read, queues the complete frames to forward and keeps the unfinished tail.
    fn observe(&mut self, figures: &mut StreamFigures, data: Bytes, client_wants_usage: bool) {
        let now = Instant::now();
        let mut from = 0;
        if self.parser.continues_line_ending(&data) {
            match self.tail {
                Tail::Kept => {
                    self.out.push_back(data.slice(0..1));
                    from = 1;
                }
                Tail::Dropped => from = 1,
                Tail::Open => {}
            }
        }
        let mut cuts: Vec<(usize, Action)> = Vec::new();
        let mut generated_here = 0u64;
        let finish = &mut self.finish;
        let model = self.model.as_deref();
        self.parser.feed(&data, |mut item, end| {
            let (keep, generated, seen) = figures.look(&item, now, client_wants_usage);
            generated_here += u64::from(generated);
            let renamed = rename(&mut item, seen.as_ref(), model);
            let action = if finish.normalise.rewrites() {
                finish.settle(&item, seen.as_ref(), keep, figures, client_wants_usage)
            } else {
                Action::of(keep)
            };
            cuts.push((end, renamed_action(action, renamed, &item)));
        });
        figures.max_frames_in_one_read = figures.max_frames_in_one_read.max(generated_here);
        let mut run_start: Option<usize> = None;
        let mut last_kept = None;
        for (end, action) in cuts {
            let keep = action == Action::Keep;
            if keep {
                if run_start.is_none() {
                    self.out.extend(self.partial.drain(..));
                    run_start = Some(from);
                }
            } else {
                if let Some(start) = run_start.take() {
                    self.out.push_back(data.slice(start..from));
                }
                self.partial.clear();
                if let Action::Replace(bytes) = action {
                    self.out.push_back(bytes);
                }
            }
            last_kept = Some(keep);
            from = end;
        }
        self.tail = match last_kept {
            Some(true) if from == data.len() => Tail::Kept,
            Some(false) if from == data.len() => Tail::Dropped,
            _ => Tail::Open,
        };
        if let Some(start) = run_start {
            self.out.push_back(data.slice(start..from));
        }
        if from < data.len() {
            self.partial.push(data.slice(from..));
        }
    }

    /// The end of the stream: a last event without its blank line still counts (its end is
    /// implied) and goes to the client.
    fn finish(&mut self, figures: &mut StreamFigures, client_wants_usage: bool) {
        let mut last = Action::Keep;
        if !self.partial.is_empty() {
            let now = Instant::now();
            let finish = &mut self.finish;
            let model = self.model.as_deref();
            self.parser.feed(b"\n\n", |mut item, _| {
                let (keep, _, seen) = figures.look(&item, now, client_wants_usage);
                let renamed = rename(&mut item, seen.as_ref(), model);
                if finish.normalise.rewrites() && item != Item::Blank {
                    last = finish.settle(&item, seen.as_ref(), keep, figures, client_wants_usage);
                }
                last = renamed_action(std::mem::replace(&mut last, Action::Keep), renamed, &item);
            });
        }
        match last {
            Action::Keep => self.out.extend(self.partial.drain(..)),
            Action::Drop => self.partial.clear(),
            Action::Replace(bytes) => {
                self.partial.clear();
                self.out.push_back(bytes);
            }
        }
        if let Some(held) = self.finish.release(figures) {
            self.out.push_back(held);
        }
    }

    /// Bytes held back for an event that has not ended yet.
    fn pending_bytes(&self) -> usize {
        self.partial.iter().map(Bytes::len).sum()
    }
}

/// Records one finished request.
fn record(mut info: RequestInfo, f: &StreamFigures, outcome: Outcome) {
    let ttft = f.first_token.map(|first| first.duration_since(info.record.arrived));
    info.record.measured(ttft, f.prompt_tokens, f.cached_tokens, f.tokens());
    let m = info.record.metrics().clone();
    let (model, backend) = (info.record.model.clone(), info.record.backend.clone());
    let labels = [model.as_str(), backend.as_str()];
    m.request_duration.with_label_values(&labels).observe(info.record.arrived.elapsed().as_secs_f64());
    let arrived = info.record.arrived;
    let client = info.record.client.clone();
    info.record.finish_used(outcome, f.usage());
    if !f.metered {
        // A raw body (embeddings, an error): nothing generated to count.
        return;
    }
    if let Some(first) = f.first_token {
        let ttft = first.duration_since(arrived).as_secs_f64();
        m.time_to_first_token.with_label_values(&[&model, &backend, "true"]).observe(ttft);
    }
    record_tokens(&m, &[&model, &backend, &client], f, true);
    if f.is_burst() {
        m.stream_bursts.with_label_values(&[&backend]).inc();
    }
    if let Some(tps) = f.decode_tokens_per_second() {
        m.tokens_per_second.with_label_values(&labels).observe(tps);
    }
    if let Some(itl) = f.inter_token_latency() {
        m.inter_token_latency.with_label_values(&labels).observe(itl);
    }
    if f.usage_mismatch() {
        m.usage_mismatch.with_label_values(&[&backend]).inc();
    }
}

/// Prompt, cached prompt and generated tokens from the backend's usage, or that the count is
/// unknown (`labels`: model, backend, client). A reported cache count of 0 still makes its
/// series (a backend that reports misses shows a hit ratio of 0, not no data).
fn record_tokens(m: &Metrics, labels: &[&str; 3], f: &StreamFigures, generates: bool) {
    if let Some(p) = f.prompt_tokens {
        m.prompt_tokens.with_label_values(labels).inc_by(p);
    }
    if let Some(cached) = f.cached_tokens {
        m.prompt_cached_tokens.with_label_values(&[labels[0], labels[1]]).inc_by(cached);
    }
    match f.tokens() {
        Some(t) => m.generation_tokens.with_label_values(labels).inc_by(t),
        // An embeddings answer generates nothing: no count is missing.
        None if generates => m.generation_tokens_unknown.with_label_values(labels).inc(),
        None => {}
    }
}

/// Figures of a whole (non-streaming) answer: its usage. `None` when the body is not an OpenAI
/// answer (a JSON object with `choices`, or `data` for embeddings): an empty or cut body.
pub fn figures_of_whole(body: &[u8]) -> Option<StreamFigures> {
    let value = serde_json::from_slice::<Value>(body).ok()?;
    let answer = value.get("choices").is_some_and(Value::is_array) || value.get("data").is_some_and(Value::is_array);
    if !answer {
        return None;
    }
    let usage = value.get("usage");
    Some(StreamFigures {
        metered: true,
        prompt_tokens: usage.and_then(|u| u.get("prompt_tokens")).and_then(Value::as_u64),
        completion_tokens: usage.and_then(|u| u.get("completion_tokens")).and_then(Value::as_u64),
        cached_tokens: usage.and_then(|u| u.get("prompt_tokens_details")?.get("cached_tokens")?.as_u64()),
        ..Default::default()
    })
}

/// Records a whole answer: TTFT is the full response time, labelled `streaming="false"`.
pub fn record_whole(record: RequestRecord, f: &StreamFigures, outcome: Outcome) {
    record_answer(record, f, outcome, true);
}

/// As [`record_whole`]; `generates: false` (embeddings) observes no time to first token.
pub fn record_answer(mut record: RequestRecord, f: &StreamFigures, outcome: Outcome, generates: bool) {
    let took = record.arrived.elapsed();
    let ttft = (outcome == Outcome::Ok && generates).then_some(took);
    record.measured(ttft, f.prompt_tokens, f.cached_tokens, f.tokens());
    let m = record.metrics().clone();
    let labels = [record.model.as_str(), record.backend.as_str()];
    let elapsed = took.as_secs_f64();
    m.request_duration.with_label_values(&labels).observe(elapsed);
    if outcome == Outcome::Ok && generates {
        m.time_to_first_token.with_label_values(&[labels[0], labels[1], "false"]).observe(elapsed);
    }
    record_tokens(&m, &[labels[0], labels[1], record.client.as_str()], f, generates);
    record.finish_used(outcome, f.usage());
}

/// The `x-mlxgate-stats` comment line.
fn stats_line(info: &RequestInfo, f: &StreamFigures) -> Bytes {
    let ttft = f.first_token.map(|t| t.duration_since(info.record.arrived).as_millis().to_string());
    let tps = f.decode_tokens_per_second().map(|t| format!("{t:.1}"));
    let unknown = || "unknown".to_string();
    Bytes::from(format!(
        ": mlxgate queue_ms={} ttft_ms={} tokens={} tps={}\n\n",
        info.queue_wait.as_millis(),
        ttft.unwrap_or_else(unknown),
        f.tokens().map_or_else(unknown, |t| t.to_string()),
        tps.unwrap_or_else(unknown),
    ))
}

impl Body for StreamMeter {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        let mut this = self.project();
        loop {
            if let Some(bytes) = this.forward.out.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(bytes))));
            }
            if let Some(failure) = this.failure.take() {
                return Poll::Ready(Some(Err(failure)));
            }
            if *this.finished {
                return Poll::Ready(None);
            }
            let Some(info) = this.info.as_ref() else { return Poll::Ready(None) };
            let (wants_usage, idle_timeout) = (info.client_wants_usage, info.idle_timeout);
            if info.cutoff.is_cut() {
                cut(&mut this, |_| GatewayError::ShuttingDown);
                continue;
            }
            let polled = match this.inner.as_mut() {
                Some(inner) => Pin::new(inner).poll_frame(cx),
                None => return Poll::Ready(None),
            };
            match polled {
                Poll::Pending => {
                    if this.shutdown.as_mut().poll(cx).is_ready() {
                        cut(&mut this, |_| GatewayError::ShuttingDown);
                        continue;
                    }
                    if this.idle.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    cut(&mut this, |backend| GatewayError::BackendStalled { backend, after: idle_timeout });
                }
                Poll::Ready(Some(Ok(frame))) => {
                    let deadline = tokio::time::Instant::now() + idle_timeout;
                    this.idle.as_mut().reset(deadline);
                    let Ok(data) = frame.into_data() else { continue };
                    match this.mode {
                        Mode::Sse => this.forward.observe(this.figures, data, wants_usage),
                        Mode::Raw => this.forward.out.push_back(data),
                    }
                    if this.forward.pending_bytes() > MAX_EVENT_BYTES {
                        let reason = format!(
                            "it sent more than {} MiB without ending an SSE event; the answer was cut",
                            MAX_EVENT_BYTES >> 20
                        );
                        cut(&mut this, |backend| GatewayError::Backend { backend, reason });
                    }
                }
                Poll::Ready(None) => {
                    this.forward.finish(this.figures, wants_usage);
                    let ended_early = *this.mode == Mode::Sse && !this.figures.complete();
                    if ended_early && this.figures.error.is_none() {
                        let reason = "the stream ended before the answer did (no finish_reason, no [DONE]): \
                                      the backend closed the connection"
                            .to_string();
                        cut(&mut this, |backend| GatewayError::Backend { backend, reason });
                        continue;
                    }
                    end(&mut this);
                }
                Poll::Ready(Some(Err(e))) => {
                    let reason = format!("the stream broke after it began: {e}");
                    cut(&mut this, |backend| GatewayError::Backend { backend, reason });
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.finished && self.forward.out.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// Ends a stream that reached its end: the slot freed, the outcome recorded (`ok`, or
/// `stream_error` after an error event), the stats line added when asked for.
fn end(this: &mut StreamMeterProj<'_>) {
    *this.finished = true;
    // An answer that ended with an error event did not end normally (its backend may still be
    // busy with it: vllm-mlx's serialized route).
    if let Some(mut permit) = this.permit.take()
        && this.figures.error.is_none()
    {
        permit.finish();
    }
    if let Some(info) = this.info.take() {
        let outcome = if this.figures.error.is_some() { Outcome::StreamError } else { Outcome::Ok };
        if info.stats_comment {
            this.forward.out.push_back(stats_line(&info, this.figures));
        }
        record(info, this.figures, outcome);
    }
}

/// Ends a stream that the backend cut: the unfinished event is dropped, the slot freed, the
/// request counted as the error's failure, and the client gets the error (made from the
/// backend's name) as a final SSE event.
fn cut(this: &mut StreamMeterProj<'_>, error: impl FnOnce(String) -> GatewayError) {
    if *this.mode == Mode::Sse && this.figures.complete() {
        // The answer had reached its end; only the close was missing (a chunked server that
        // died before its last chunk, a silent backend after `[DONE]`, the shutdown's cut).
        let wants_usage = this.info.as_ref().is_some_and(|i| i.client_wants_usage);
        this.forward.finish(this.figures, wants_usage);
        end(this);
        return;
    }
    let error = error(this.info.as_ref().map(RequestInfo::backend).unwrap_or_default());
    *this.finished = true;
    this.forward.partial.clear();
    this.permit.take();
    let id = this.info.as_ref().map_or("-", |i| i.record.request_id().as_str());
    tracing::warn!(error = %error, request_id = %id, "backend stream cut");
    let outcome = Outcome::from(&error);
    match this.mode {
        Mode::Sse => this.forward.out.push_back(error.sse_event_for(id)),
        Mode::Raw => *this.failure = Some(Box::new(error)),
    }
    if let Some(info) = this.info.take() {
        record(info, this.figures, outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures_of(chunks: &[&str], wants_usage: bool) -> (StreamFigures, String) {
        normalised(StreamNormalise::default(), chunks, wants_usage)
    }

    const ROLE: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
    const KEEPALIVE: &str =
        "data: {\"id\":\"chatcmpl-keepalive\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"}}]}\n\n";
    const TOKEN: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t \"}}]}\n\n";
    const USAGE_ONLY: &str =
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\n";

    #[test]
    fn role_keepalive_and_comments_are_not_tokens() {
        let (f, _) = figures_of(&[": keepalive 1/2\n\n", KEEPALIVE, ROLE], true);
        assert_eq!(f.first_token, None);
        assert_eq!(f.token_frames, 0);
    }

    #[test]
    fn the_usage_only_chunk_is_dropped_unless_asked_and_nothing_else_changes() {
        let chunks = [ROLE, TOKEN, TOKEN, USAGE_ONLY, "data: [DONE]\n\n"];
        let (f, sent) = figures_of(&chunks, false);
        assert_eq!(sent, [ROLE, TOKEN, TOKEN, "data: [DONE]\n\n"].concat());
        assert_eq!(f.tokens(), Some(2));
        let (_, sent) = figures_of(&chunks, true);
        assert_eq!(sent, chunks.concat());
        // Split mid-frame: the same bytes, the dropped frame's pieces dropped too.
        let all = chunks.concat();
        let cut = all.find("\"usage\"").expect("usage");
        let (_, sent) = figures_of(&[&all[..cut], &all[cut..]], false);
        assert_eq!(sent, [ROLE, TOKEN, TOKEN, "data: [DONE]\n\n"].concat());
    }

    #[test]
    fn the_last_usage_wins_and_errors_are_failures() {
        let twice =
            "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"completion_tokens\":2}}\n\n";
        let (f, _) = figures_of(&[TOKEN, TOKEN, twice, USAGE_ONLY], true);
        assert_eq!(f.tokens(), Some(2), "counted once");
        let (f, _) =
            figures_of(&[TOKEN, "data: {\"error\":{\"message\":\"boom\"}}\n\n", twice, "data: [DONE]\n\n"], true);
        assert_eq!(f.error.as_deref(), Some("boom"));
    }

    #[test]
    fn cached_tokens_come_from_the_last_usage_and_only_when_reported() {
        let usage = |cached: &str| {
            format!("data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":27,\"completion_tokens\":2{cached}}}}}\n\n")
        };
        let reported = usage(",\"prompt_tokens_details\":{\"cached_tokens\":26}");
        let (f, _) = figures_of(&[TOKEN, TOKEN, &reported, &reported, "data: [DONE]\n\n"], true);
        assert_eq!(f.cached_tokens, Some(26), "sent twice, counted once");
        let (f, _) = figures_of(&[TOKEN, &usage(",\"prompt_tokens_details\":{\"cached_tokens\":0}")], true);
        assert_eq!(f.cached_tokens, Some(0), "a reported miss is a figure");
        let (f, _) = figures_of(&[TOKEN, TOKEN, USAGE_ONLY, &usage(",\"prompt_tokens_details\":null")], true);
        assert_eq!(f.cached_tokens, None, "vllm-mlx reports none");
        let whole = br#"{"choices":[],"usage":{"prompt_tokens":138,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":137}}}"#;
        assert_eq!(figures_of_whole(whole).and_then(|f| f.cached_tokens), Some(137));
        let whole = figures_of_whole(br#"{"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":9}}"#);
        assert_eq!(whole.and_then(|f| f.cached_tokens), None);
    }

    #[test]
    fn a_stream_is_complete_at_done_or_when_every_choice_has_finished() {
        let choice = |i: u32, finish: &str| {
            let reason = if finish.is_empty() { "null".to_string() } else { format!("\"{finish}\"") };
            format!(
                "data: {{\"choices\":[{{\"index\":{i},\"delta\":{{\"content\":\"x\"}},\"finish_reason\":{reason}}}]}}\n\n"
            )
        };
        let (f, _) = figures_of(&[&choice(0, ""), &choice(0, "stop")], true);
        assert!(f.complete(), "one choice, finished");
        let (f, _) = figures_of(&[&choice(0, ""), &choice(1, ""), &choice(0, "stop"), &choice(1, "")], true);
        assert!(!f.complete(), "choice 1 never finished (n=2, cut)");
        let (f, _) = figures_of(&[&choice(0, ""), &choice(1, ""), &choice(0, "stop"), &choice(1, "length")], true);
        assert!(f.complete());
        let (f, _) = figures_of(&[&choice(0, ""), "data: [DONE]\n\n"], true);
        assert!(f.complete(), "[DONE] ends it whatever the choices said");
        let (f, _) = figures_of(&[&choice(0, ""), USAGE_ONLY], true);
        assert!(!f.complete(), "usage alone is no end");
    }

    #[test]
    fn a_burst_gives_no_decode_speed() {
        let (f, _) = figures_of(&[&[TOKEN, TOKEN, TOKEN, TOKEN].concat(), USAGE_ONLY], true);
        assert!(f.is_burst());
        assert_eq!(f.decode_tokens_per_second(), None);
        // One frame carrying all of usage's tokens is a burst; one frame of one token is not.
        let (f, _) = figures_of(&[TOKEN, USAGE_ONLY], true);
        assert_eq!((f.token_frames, f.tokens().is_some_and(|t| t >= 2)), (1, true), "{f:?}");
        assert!(f.is_burst());
        let one = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":1}}\n\n";
        let (f, _) = figures_of(&[TOKEN, one], true);
        assert_eq!(f.tokens(), Some(1));
        assert!(!f.is_burst(), "a one-token answer");
    }

    fn normalised(normalise: StreamNormalise, chunks: &[&str], wants_usage: bool) -> (StreamFigures, String) {
        let mut forward = Forward::new(normalise);
        let mut figures = StreamFigures::default();
        for c in chunks {
            forward.observe(&mut figures, Bytes::from(c.to_string()), wants_usage);
        }
        forward.finish(&mut figures, wants_usage);
        let sent: Vec<u8> = forward.out.iter().flat_map(|b| b.iter().copied()).collect();
        (figures, String::from_utf8(sent).expect("utf8"))
    }

    /// What the client gets of `chunks` with the public name `model`, whole and in every split
    /// in two (the same each time).
    fn named_output(normalise: StreamNormalise, model: &str, chunks: &[String]) -> String {
        let run = |pieces: &[&str]| {
            let mut forward = Forward::new(normalise).naming(model);
            let mut figures = StreamFigures::default();
            for piece in pieces {
                forward.observe(&mut figures, Bytes::from(piece.to_string()), true);
            }
            forward.finish(&mut figures, true);
            let sent: Vec<u8> = forward.out.iter().flat_map(|b| b.iter().copied()).collect();
            String::from_utf8(sent).expect("utf8")
        };
        let all = chunks.concat();
        let whole = run(&[&all]);
        for cut in 0..=all.len() {
            assert_eq!(run(&[&all[..cut], &all[cut..]]), whole, "cut at {cut}");
        }
        whole
    }

    #[test]
    fn every_event_names_the_public_model_in_any_split_and_normalisation() {
        let event = |rest: &str| format!("data: {{\"id\":\"c\",\"model\":\"/path/on/disk/tiny-qwen3\",{rest}}}\n\n");
        let chunks = [
            ROLE.to_string(),
            event(r#""choices":[{"index":0,"delta":{"content":"a"}}]"#),
            event(r#""choices":[{"index":0,"delta":{"content":"b"}}]"#),
            event(r#""choices":[{"index":0,"delta":{},"finish_reason":"stop"}]"#).replace("\n\n", "\r\n\r\n"),
            event(r#""choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}"#),
            "data: [DONE]\n\n".to_string(),
        ];
        let single = StreamNormalise { single_finish: true, length_at: Some(2), hold_abandoned: false };
        for normalise in [StreamNormalise::default(), single] {
            let sent = named_output(normalise, "qwen", &chunks);
            assert!(!sent.contains("/path/on/disk"), "{sent}");
            let events = sent.matches("data: ").count();
            assert_eq!(sent.matches(r#""model":"qwen""#).count(), events - 2, "all but role and [DONE]: {sent}");
            assert!(sent.contains(r#""content":"a""#) && sent.ends_with("data: [DONE]\n\n"), "{sent}");
        }
        // A name that is already the public one: the backend's own bytes, untouched.
        let public: Vec<String> = chunks.iter().map(|c| c.replace("/path/on/disk/tiny-qwen3", "qwen")).collect();
        assert_eq!(named_output(StreamNormalise::default(), "qwen", &public), public.concat());
        // The last event without its blank line is renamed too.
        let unended =
            [event(r#""choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]"#).trim_end().to_string()];
        assert!(named_output(StreamNormalise::default(), "q\"x", &unended).contains(r#""model":"q\"x""#));
    }

    /// Every split of `chunks`' bytes in two gives the same output as the whole.
    fn same_for_every_split(normalise: StreamNormalise, chunks: &[&str], wants_usage: bool) -> String {
        let all = chunks.concat();
        let (_, whole) = normalised(normalise, &[&all], wants_usage);
        for cut in 0..=all.len() {
            let (_, sent) = normalised(normalise, &[&all[..cut], &all[cut..]], wants_usage);
            assert_eq!(sent, whole, "cut at {cut}");
        }
        whole
    }

    const OMNI_FINISH: &str =
        "data: {\"choices\": [{\"index\": 0, \"delta\": {\"role\": \"assistant\"}, \"finish_reason\": \"stop\"}]}\n\n";
    const OMNI_FINISH_USAGE: &str = "data: {\"choices\": [{\"index\": 0, \"delta\": {\"role\": \"assistant\"}, \"finish_reason\": \"stop\"}], \"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": 2}}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    fn finish_reasons(sent: &str) -> Vec<(String, bool)> {
        sent.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter_map(|v| {
                let reason = v["choices"][0]["finish_reason"].as_str()?.to_string();
                Some((reason, v["usage"].is_object()))
            })
            .collect()
    }

    /// `OMNI_FINISH_USAGE` as the usage-only chunk it amounts to.
    const OMNI_USAGE_ONLY: &str = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n";

    #[test]
    fn a_repeated_finish_reaches_the_client_once_its_usage_when_asked() {
        let omni = StreamNormalise { single_finish: true, ..Default::default() };
        let chunks = [TOKEN, TOKEN, OMNI_FINISH, OMNI_FINISH_USAGE, DONE];
        let sent = same_for_every_split(omni, &chunks, true);
        assert_eq!(sent, [TOKEN, TOKEN, OMNI_FINISH, OMNI_USAGE_ONLY, DONE].concat(), "the first, then the usage");
        let sent = same_for_every_split(omni, &chunks, false);
        assert_eq!(sent, [TOKEN, TOKEN, OMNI_FINISH, DONE].concat(), "the first alone");
        let (f, _) = normalised(omni, &chunks, false);
        assert_eq!((f.tokens(), f.choices_finished.len()), (Some(2), 1), "usage read, one finish");
        // A finish that is not repeated goes on, before what follows it, and at the end.
        let sent = same_for_every_split(omni, &[TOKEN, OMNI_FINISH, DONE], true);
        assert_eq!(finish_reasons(&sent).len(), 1);
        assert!(sent.ends_with(DONE), "{sent}");
        let sent = same_for_every_split(omni, &[TOKEN, OMNI_FINISH], true);
        assert_eq!(finish_reasons(&sent).len(), 1, "{sent}");
        // Off: both go on.
        let (_, sent) = normalised(StreamNormalise::default(), &chunks, true);
        assert_eq!(sent, chunks.concat());
    }

    /// mlx-omni-server's tool answer: the tool call rides in the first finish chunk, the repeat
    /// has only the role and the usage (the review's H1: the tool call was dropped).
    const OMNI_TOOL_FINISH: &str = "data: {\"choices\": [{\"index\": 0, \"delta\": {\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": \"{}\"}}]}, \"finish_reason\": \"tool_calls\"}]}\n\n";
    const OMNI_TOOL_REPEAT: &str = "data: {\"choices\": [{\"index\": 0, \"delta\": {\"role\": \"assistant\"}, \"finish_reason\": \"tool_calls\"}], \"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": 2}}\n\n";

    #[test]
    fn a_tool_call_in_the_first_finish_reaches_the_client_once() {
        let omni = StreamNormalise { length_at: Some(100), single_finish: true, ..Default::default() };
        let chunks = [ROLE, OMNI_TOOL_FINISH, OMNI_TOOL_REPEAT, DONE];
        let sent = same_for_every_split(omni, &chunks, true);
        assert_eq!(sent, [ROLE, OMNI_TOOL_FINISH, OMNI_USAGE_ONLY, DONE].concat());
        let sent = same_for_every_split(omni, &chunks, false);
        assert_eq!(sent, [ROLE, OMNI_TOOL_FINISH, DONE].concat());
        // Cut at max_tokens (usage 2 ≥ 2): the first finish is re-serialised, its tool call kept,
        // and a `tool_calls` finish stays what it is.
        let cut = StreamNormalise { length_at: Some(2), ..omni };
        let sent = same_for_every_split(cut, &chunks, true);
        assert_eq!(sent.matches("\"get_weather\"").count(), 1, "{sent}");
        assert_eq!(finish_reasons(&sent), [("tool_calls".to_string(), false)], "{sent}");
        assert!(sent.ends_with(&[OMNI_USAGE_ONLY, DONE].concat()), "{sent}");
    }

    #[test]
    fn a_repeat_carrying_new_output_is_not_dropped() {
        let omni = StreamNormalise { single_finish: true, ..Default::default() };
        // Output in the repeat only: both go on, as they were.
        let chunks = [TOKEN, OMNI_FINISH, OMNI_TOOL_FINISH, DONE];
        for wants_usage in [true, false] {
            assert_eq!(same_for_every_split(omni, &chunks, wants_usage), chunks.concat());
        }
        // The same output in both: a true repeat, its choices dropped.
        let with_usage = OMNI_TOOL_FINISH.replacen(
            "]}\n\n",
            "], \"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": 2}}\n\n",
            1,
        );
        let sent = same_for_every_split(omni, &[OMNI_TOOL_FINISH, &with_usage, DONE], true);
        assert_eq!(sent, [OMNI_TOOL_FINISH, OMNI_USAGE_ONLY, DONE].concat());
        // A repeat without usage or output: nothing.
        let sent = same_for_every_split(omni, &[TOKEN, OMNI_FINISH, OMNI_FINISH, DONE], true);
        assert_eq!(sent, [TOKEN, OMNI_FINISH, DONE].concat());
    }

    #[test]
    fn stop_at_max_tokens_becomes_length_and_only_that_frame_changes() {
        let at = |n| StreamNormalise { length_at: Some(n), ..Default::default() };
        // mlx-openai-server: usage in the finish chunk.
        let finish = "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\",\"index\":0}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n";
        let sent = same_for_every_split(at(2), &[ROLE, TOKEN, TOKEN, finish, DONE], true);
        assert_eq!(finish_reasons(&sent), [("length".to_string(), true)]);
        assert!(sent.starts_with(&[ROLE, TOKEN, TOKEN].concat()) && sent.ends_with(DONE), "{sent}");
        let sent = same_for_every_split(at(3), &[ROLE, TOKEN, TOKEN, finish, DONE], true);
        assert_eq!(sent, [ROLE, TOKEN, TOKEN, finish, DONE].concat(), "not cut: untouched");
        // mlx-omni-server: the finish twice, usage in the second: the first says length (judged
        // on the second's usage), the usage follows it when asked for.
        let both = StreamNormalise { length_at: Some(2), single_finish: true, ..Default::default() };
        for wants_usage in [true, false] {
            let sent = same_for_every_split(both, &[TOKEN, TOKEN, OMNI_FINISH, OMNI_FINISH_USAGE, DONE], wants_usage);
            assert_eq!(finish_reasons(&sent), [("length".to_string(), false)], "{sent}");
            assert_eq!(sent.contains(OMNI_USAGE_ONLY), wants_usage, "{sent}");
        }
    }

    #[test]
    fn a_whole_answer_at_max_tokens_says_length() {
        let whole = br#"{"choices":[{"index":0,"message":{"content":"x"},"finish_reason":"stop"}],"usage":{"completion_tokens":5}}"#;
        let mut value: Value = serde_json::from_slice(whole).expect("json");
        assert!(stop_to_length(&mut value));
        assert_eq!(value["choices"][0]["finish_reason"], "length");
        assert!(!stop_to_length(&mut value), "nothing left to change");
    }

    #[test]
    fn usage_without_any_output_frame_is_a_mismatch() {
        let (f, _) = figures_of(&[ROLE, USAGE_ONLY], true);
        assert!(f.usage_mismatch());
        let whole = figures_of_whole(br#"{"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":9}}"#);
        assert_eq!(whole.and_then(|f| f.tokens()), Some(9));
        assert!(figures_of_whole(b"").is_none() && figures_of_whole(br#"{"id":"x"}"#).is_none());
        let (f, _) = figures_of(&[TOKEN, TOKEN, USAGE_ONLY], true);
        assert!(!f.usage_mismatch());
    }
}

/// Property tests: for generated transcripts in the style of every server in docs/wire-facts.md,
/// split at random, the parser sees the same events, the figures are the same, and the client
/// gets the same bytes (exactly the backend's, less the usage-only chunk when not asked for;
/// with `finish_length` and `single_finish`, one finish chunk, saying `length`).
#[cfg(test)]
mod properties {
    use proptest::prelude::*;
    use proptest::sample::Index;

    use super::*;
    use crate::stream::sse::SseParser;

    fn chunk(delta: Value) -> Value {
        serde_json::json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
    }

    /// One server's transcript of `n` tokens, as (lines of each frame).
    fn transcript(style: u8, n: usize, split_data: bool) -> Vec<Vec<String>> {
        let data = |v: Value| vec![format!("data: {v}")];
        let usage = serde_json::json!({"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n});
        let mut frames: Vec<Vec<String>> = Vec::new();
        match style {
            0 => frames.push(vec![format!(": keepalive 3/{n}")]),
            1 => frames.push(data(serde_json::json!({"id": "chatcmpl-keepalive", "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": null}]}))),
            2 => frames.push(vec![": ping".into()]),
            _ => {}
        }
        frames.push(data(chunk(serde_json::json!({"role": "assistant"}))));
        for i in 0..n {
            let delta = match (style, i % 3) {
                (3, _) => serde_json::json!({"reasoning_content": format!("r{i}")}),
                (4, _) => serde_json::json!({"role": "assistant", "content": format!("t{i} ")}),
                (5, 0) => serde_json::json!({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
                _ => serde_json::json!({"content": format!("t{i}\nx")}),
            };
            let line = chunk(delta).to_string();
            if split_data && i % 2 == 0 {
                // A multi-line data field: the parser joins the lines with "\n", which JSON
                // takes as whitespace between two members.
                let at = line.find("\"choices\"").unwrap_or(0);
                let (a, b) = line.split_at(at);
                frames.push(vec![format!("data: {a}"), format!("data:{b}")]);
            } else {
                frames.push(vec![format!("data: {line}")]);
            }
            if style == 0 && i == 0 {
                frames.push(vec![
                    "event: message".into(),
                    "id: 9".into(),
                    format!("data: {}", chunk(serde_json::json!({}))),
                ]);
            }
        }
        if style == 6 {
            frames.push(data(serde_json::json!({"error": {"message": "boom", "type": "server_error"}})));
        }
        let mut finish = chunk(serde_json::json!({}));
        finish["choices"][0]["finish_reason"] = "stop".into();
        if style == 8 {
            // mlx-omni-server: the finish, then the same finish with usage.
            frames.push(data(finish.clone()));
        }
        if matches!(style, 2 | 6 | 7 | 8) {
            finish["usage"] = usage.clone();
        }
        frames.push(data(finish));
        if !matches!(style, 6 | 8) {
            frames.push(data(serde_json::json!({"id": "chatcmpl-1", "choices": [], "usage": usage})));
        }
        if style != 5 {
            frames.push(vec!["data: [DONE]".into()]);
        }
        frames
    }

    fn render(frames: &[Vec<String>], eol: &str) -> Vec<u8> {
        let mut out = String::new();
        for frame in frames {
            for line in frame {
                out.push_str(line);
                out.push_str(eol);
            }
            out.push_str(eol);
        }
        out.into_bytes()
    }

    fn split(bytes: &[u8], cuts: &[Index]) -> Vec<Bytes> {
        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
        points.push(0);
        points.push(bytes.len());
        points.sort_unstable();
        points.dedup();
        points.windows(2).map(|w| Bytes::copy_from_slice(&bytes[w[0]..w[1]])).collect()
    }

    /// Items, figures (less per-read counts) and forwarded bytes of one delivery.
    /// Output frames, tokens, error, `[DONE]` seen.
    type Summary = (u64, Option<u64>, Option<String>, bool);

    fn run(chunks: &[Bytes], wants_usage: bool, normalise: StreamNormalise) -> (Vec<Item>, Summary, Vec<u8>) {
        let mut items_parser = SseParser::new();
        let mut items = Vec::new();
        for c in chunks {
            items_parser.feed(c, |i, _| items.push(i));
        }
        let mut forward = Forward::new(normalise);
        let mut figures = StreamFigures::default();
        for c in chunks {
            forward.observe(&mut figures, c.clone(), wants_usage);
        }
        forward.finish(&mut figures, wants_usage);
        let sent = forward.out.iter().flat_map(|b| b.iter().copied()).collect();
        (items, (figures.token_frames, figures.tokens(), figures.error, figures.done), sent)
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: std::env::var("MLXGATE_PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(100_000),
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn any_split_gives_the_same_events_figures_and_bytes(
            style in 0u8..9,
            n in 0usize..12,
            split_data in any::<bool>(),
            eol in prop_oneof![Just("\n"), Just("\r\n"), Just("\r")],
            cuts in prop::collection::vec(any::<Index>(), 0..24),
            one_byte_reads in prop::bool::weighted(0.1),
            wants_usage in any::<bool>(),
            normalised in any::<bool>(),
        ) {
            // finish_length at the answer's length (every transcript is cut at it) and single_finish.
            let normalise = if normalised {
                StreamNormalise { length_at: Some(n as u64), single_finish: true, hold_abandoned: false }
            } else {
                StreamNormalise::default()
            };
            let bytes = render(&transcript(style, n, split_data), eol);
            let whole = [Bytes::from(bytes.clone())];
            let chunks = if one_byte_reads {
                bytes.iter().map(|b| Bytes::copy_from_slice(&[*b])).collect()
            } else {
                split(&bytes, &cuts)
            };
            let (items, figures, sent) = run(&chunks, wants_usage, normalise);
            let (whole_items, whole_figures, whole_sent) = run(&whole, wants_usage, normalise);
            prop_assert_eq!(&items, &whole_items);
            prop_assert_eq!(&figures, &whole_figures);
            prop_assert_eq!(&sent, &whole_sent);
            if wants_usage && !normalised {
                prop_assert_eq!(&sent, &bytes, "the client gets exactly the backend's bytes");
            }
            if normalised {
                let text = String::from_utf8_lossy(&sent);
                let finishes = text.matches("\"finish_reason\":\"").count();
                prop_assert_eq!(finishes, 1, "one finish chunk: {}", text);
                prop_assert!(text.contains("\"finish_reason\":\"length\""), "cut at max_tokens: {}", text);
            }
            if n > 0 && style != 1 {
                prop_assert_eq!(figures.0 as usize, n, "one output frame per generated token");
            }
        }
    }
}
