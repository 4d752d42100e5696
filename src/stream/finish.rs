//! The backend's stream-side normalisations of a finish frame, applied as the frames pass:
//! `finish_length` (a `stop` finish at the request's `max_tokens` becomes `length`, as OpenAI
//! says it; [`stop_to_length`] does it to a whole answer too) and `single_finish` (a repeated
//! finish chunk, mlx-omni-server's, reaches the client as the usage it adds, the first with its
//! output as it was). Only the frames they change are re-serialised (`render`); every other
//! frame goes on as the backend's own bytes.

use bytes::Bytes;
use serde_json::Value;

use super::figures::StreamFigures;
use super::frame::Seen;
use super::sse::{Event, Item};

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
    pub(super) fn rewrites(&self) -> bool {
        self.length_at.is_some() || self.single_finish
    }
}

/// What becomes of one SSE item on its way to the client.
#[derive(Debug, PartialEq)]
pub(super) enum Action {
    /// The backend's bytes, as they are.
    Keep,
    /// Nothing.
    Drop,
    /// These bytes instead: the item re-serialised, after a held finish frame it releases.
    Replace(Bytes),
}

impl Action {
    pub(super) fn of(keep: bool) -> Self {
        if keep { Action::Keep } else { Action::Drop }
    }
}

/// The finish-frame normalisations of one stream (`finish_length`, `single_finish`).
#[derive(Default)]
pub(super) struct Finish {
    pub(super) normalise: StreamNormalise,
    /// A finish frame without usage, waiting for the next event (`single_finish`).
    held: Option<HeldFinish>,
}

/// A finish frame held back by `single_finish`, and the choices it finishes.
struct HeldFinish {
    event: Event,
    choices: Vec<u64>,
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
    /// The normalisations of one stream, nothing held yet.
    pub(super) fn new(normalise: StreamNormalise) -> Self {
        Finish { normalise, held: None }
    }

    /// What becomes of one item, once the figures have seen it (`keep`: whether it goes to the
    /// client as far as the meter is concerned).
    pub(super) fn settle(
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
        if let Some(HeldFinish { event: held, choices }) = self.held.take() {
            if finishes.as_ref() == Some(&choices) {
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
            self.held = Some(HeldFinish { event: event.clone(), choices: indices });
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
    pub(super) fn release(&mut self, figures: &StreamFigures) -> Option<Bytes> {
        let held = self.held.take()?;
        Some(self.render_finish(&held.event, figures))
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
pub(super) fn render(event: &Event, data: &str) -> Bytes {
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

#[cfg(test)]
mod tests;
