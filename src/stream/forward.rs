//! The byte slicer: turns the backend's reads into the client's — complete SSE frames only, in
//! order, as zero-copy slices of the backend's own bytes — less the frames that must not go on
//! (the usage-only chunk of a client that did not ask for usage), with the frames a
//! normalisation changes ([`super::finish`]) and the events naming the backend's model written
//! anew. Each read is parsed once ([`SseParser`]) and each event shown to the
//! [`StreamFigures`]. The per-read path: no allocation per event but the list of where the
//! read's events end, and a new text only for an event that changes.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;
use serde_json::Value;

use super::figures::{Looked, StreamFigures};
use super::finish::{Action, Finish, StreamNormalise, render};
use super::frame::Seen;
use super::sse::{Item, SseParser};

/// Turns the backend's reads into the client's: complete frames only, in order, as zero-copy
/// slices of the backend's bytes, less the frames that must not be forwarded, and the frames a
/// normalisation changes re-serialised.
#[derive(Default)]
pub(super) struct Forward {
    parser: SseParser,
    /// Bytes of an unfinished frame, held until the frame completes.
    pub(super) partial: Vec<Bytes>,
    /// Ready to go to the client, in order.
    pub(super) out: VecDeque<Bytes>,
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
    pub(super) fn new(normalise: StreamNormalise) -> Self {
        Forward { finish: Finish::new(normalise), ..Forward::default() }
    }

    /// Names `model` (the public name) in every event that carries a `model` string; nothing
    /// for an empty name.
    pub(super) fn naming(mut self, model: &str) -> Self {
        self.model = (!model.is_empty()).then(|| Value::from(model).to_string().into_boxed_str());
        self
    }

    /// Parses one read, queues the complete frames to forward and keeps the unfinished tail.
    pub(super) fn observe(&mut self, figures: &mut StreamFigures, data: Bytes, client_wants_usage: bool) {
        self.observe_at(figures, data, client_wants_usage, Instant::now());
    }

    /// As [`Self::observe`], for a read made at `now`.
    pub(super) fn observe_at(
        &mut self,
        figures: &mut StreamFigures,
        data: Bytes,
        client_wants_usage: bool,
        now: Instant,
    ) {
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
            let Looked { watched, seen } = figures.look(&item, now, client_wants_usage);
            let keep = watched.forward;
            generated_here += u64::from(watched.generated);
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
    pub(super) fn finish(&mut self, figures: &mut StreamFigures, client_wants_usage: bool) {
        let mut last = Action::Keep;
        if !self.partial.is_empty() {
            let now = Instant::now();
            let finish = &mut self.finish;
            let model = self.model.as_deref();
            self.parser.feed(b"\n\n", |mut item, _| {
                let Looked { watched, seen } = figures.look(&item, now, client_wants_usage);
                let keep = watched.forward;
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
    pub(super) fn pending_bytes(&self) -> usize {
        self.partial.iter().map(Bytes::len).sum()
    }
}

#[cfg(test)]
pub(super) mod tests;

#[cfg(test)]
mod properties;
