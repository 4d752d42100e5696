//! `StreamFigures`: what one answer showed, measured as it passed — time to first token (the
//! first frame carrying text, reasoning or a tool call, not role-only chunks, comments or
//! omlx's `chatcmpl-keepalive`), output frames and how many came in one read, the backend's last
//! `usage` (never the frame count), an `{"error": …}` event, and whether the answer reached its
//! end. The meter fills them event by event, `mlxgate bench` reads streams with them
//! (`bench/run.rs`), [`figures_of_whole`] makes them of a whole answer, and they are handed to the
//! request's record as the [`Measured`] it records (`outcome.rs`, the one recorder).

use std::time::Instant;

use serde_json::Value;

use super::frame::{self, Seen};
use super::sse::Item;
use crate::outcome::{Measured, Usage};

/// A burst: at least this share of the generated tokens' frames arrived in one read.
const BURST_SHARE: f64 = 0.5;

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

/// What one SSE item was, to the figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watched {
    /// It goes to the client: everything but the usage-only chunk of a client that did not ask
    /// for usage.
    pub forward: bool,
    /// It carried generated output (text, reasoning, a tool call).
    pub generated: bool,
}

/// As [`Watched`], with what the event said (`None` for comments, `[DONE]`, errors and what
/// is not JSON), for the normalisations and the renaming that act on it.
pub(super) struct Looked {
    pub(super) watched: Watched,
    pub(super) seen: Option<Seen>,
}

/// How a whole (non-streaming) answer is timed and counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whole {
    /// A chat or completion answer, read just now: its time to first token is the whole
    /// answer's (`streaming="false"`).
    Answer,
    /// An embeddings answer: nothing generated, nothing to time, no count missing.
    Embeddings,
    /// No answer (the backend's error, a body cut or not an answer): nothing to time, and
    /// the generated count is unknown.
    Failed,
}

impl StreamFigures {
    /// Looks at one SSE item: whether it goes to the client, whether it carried generated
    /// output.
    pub fn watch(&mut self, item: &Item, now: Instant, client_wants_usage: bool) -> Watched {
        self.look(item, now, client_wants_usage).watched
    }

    /// As [`Self::watch`], with what the event said.
    pub(super) fn look(&mut self, item: &Item, now: Instant, client_wants_usage: bool) -> Looked {
        const PASSES: Watched = Watched { forward: true, generated: false };
        let Item::Event(event) = item else { return Looked { watched: PASSES, seen: None } };
        if event.data == "[DONE]" {
            self.done = true;
            return Looked { watched: PASSES, seen: None };
        }
        let Some(mut seen) = frame::read(&event.data) else { return Looked { watched: PASSES, seen: None } };
        if let Some(message) = seen.error.take() {
            self.error.get_or_insert(message);
            return Looked { watched: PASSES, seen: None };
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
        Looked { watched: Watched { forward: !usage_only || client_wants_usage, generated }, seen: Some(seen) }
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

    /// What a stream showed, for its record: its first token's time, its usage, its decode
    /// speed, burst and usage mismatch.
    pub fn of_stream(&self) -> Measured {
        Measured {
            first_token: self.first_token,
            streaming: true,
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
            completion_tokens: self.tokens(),
            generates: true,
            decode_tokens_per_second: self.decode_tokens_per_second(),
            burst: self.is_burst(),
            usage_mismatch: self.usage_mismatch(),
            used: self.usage(),
        }
    }

    /// What a whole answer showed, for its record, read in full just now: its usage; timed
    /// (to now) when it is a generation endpoint's answer.
    pub fn of_whole(&self, whole: Whole) -> Measured {
        Measured {
            first_token: (whole == Whole::Answer).then(Instant::now),
            streaming: false,
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
            completion_tokens: self.tokens(),
            generates: whole != Whole::Embeddings,
            decode_tokens_per_second: None,
            burst: false,
            usage_mismatch: false,
            used: self.usage(),
        }
    }
}

/// Figures of a whole (non-streaming) answer: its usage. `None` when the body is not an OpenAI
/// answer (a JSON object with `choices`, or `data` for embeddings): an empty or cut body.
pub fn figures_of_whole(body: &[u8]) -> Option<StreamFigures> {
    whole_answer(body).map(|(figures, _)| figures)
}

/// A whole answer's figures (as [`figures_of_whole`]) and where its top-level `model` string
/// lies in it (as `frame::model_span` finds it), from one reading of the answer.
pub fn whole_answer(body: &[u8]) -> Option<(StreamFigures, Option<std::ops::Range<usize>>)> {
    let text = std::str::from_utf8(body).ok();
    // Serde would also read a struct from an array: only objects take the typed path.
    if let Some(text) = text.filter(|t| t.trim_start().starts_with('{'))
        && let Ok(answer) = serde_json::from_str::<WholeAnswer<'_>>(text)
    {
        let model = answer.model.and_then(|raw| super::frame::string_span(text, raw));
        return answer.figures().map(|figures| (figures, model));
    }
    // Not the usual shape (a duplicated key, a `usage` that is not an object): read it whole.
    let figures = figures_of_value(&serde_json::from_slice::<Value>(body).ok()?)?;
    Some((figures, text.and_then(super::frame::model_span)))
}

/// The figures of a whole answer already parsed.
fn figures_of_value(value: &Value) -> Option<StreamFigures> {
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

/// The parts of a whole answer its figures come from, read without building the rest (the
/// answer's text and choices are skipped, not parsed into maps).
#[derive(serde::Deserialize)]
struct WholeAnswer<'a> {
    #[serde(borrow)]
    model: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow)]
    choices: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow)]
    data: Option<&'a serde_json::value::RawValue>,
    usage: Option<super::frame::Object<WholeUsage<'a>>>,
}

#[derive(serde::Deserialize)]
struct WholeUsage<'a> {
    #[serde(borrow)]
    prompt_tokens: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow)]
    completion_tokens: Option<&'a serde_json::value::RawValue>,
    prompt_tokens_details: Option<super::frame::Object<WholeDetails<'a>>>,
}

#[derive(serde::Deserialize)]
struct WholeDetails<'a> {
    #[serde(borrow)]
    cached_tokens: Option<&'a serde_json::value::RawValue>,
}

impl WholeAnswer<'_> {
    /// As [`figures_of_whole`] reads a parsed answer: an answer has a `choices` or `data`
    /// array; a count is a JSON integer ≥ 0 (anything else: unknown).
    fn figures(&self) -> Option<StreamFigures> {
        let array = |raw: Option<&serde_json::value::RawValue>| raw.is_some_and(|r| r.get().starts_with('['));
        if !array(self.choices) && !array(self.data) {
            return None;
        }
        let count = |raw: Option<&serde_json::value::RawValue>| raw.and_then(|r| r.get().parse::<u64>().ok());
        let usage = self.usage.as_ref().map(|u| &u.0);
        Some(StreamFigures {
            metered: true,
            prompt_tokens: count(usage.and_then(|u| u.prompt_tokens)),
            completion_tokens: count(usage.and_then(|u| u.completion_tokens)),
            cached_tokens: count(usage.and_then(|u| u.prompt_tokens_details.as_ref()?.0.cached_tokens)),
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests;
