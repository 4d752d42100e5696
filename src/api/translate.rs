//! `TranslatedBody`: a face's streamed body, wrapped around the metered chat stream (the
//! [`StreamMeter`](crate::stream::meter::StreamMeter) every face's stream goes through, so
//! slots, figures and outcomes are the same). Each read of the chat stream is parsed with the
//! gateway's SSE parser and its complete events handed at once to the face's state machine
//! ([`Translate`]), whose bytes go out as they come; nothing is held beyond an unfinished SSE
//! line. A face is its request translation and one [`Translate`] implementation.
//!
//! Keep-alives: a face that wants them (`every`: the Messages face's `ping`) gets a timer that,
//! until its state machine says content has begun ([`Translate::awaits_content`]), asks it for
//! one ([`Translate::keepalive`]) after every `every` of silence, for servers that send nothing
//! while they prefill. The timer lives in the body (no task): it stops with the first content
//! and is dropped with the body.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use crate::stream::sse::{Item, SseParser};

/// A face's translation of the chat stream: a state machine fed one chat event at a time.
pub trait Translate {
    /// The face's first events, before anything of the chat stream.
    fn start(&mut self) -> Bytes;
    /// The face's events that one chat SSE event (its `data`) completes.
    fn chat_event(&mut self, data: &str) -> Bytes;
    /// What a comment of the chat stream (a server's keep-alive during prefill, the gateway's
    /// own during a map-reduce, the stats line) becomes.
    fn comment(&mut self, text: &str) -> Bytes;
    /// The chat stream broke with `error`.
    fn broke(&mut self, error: &str) -> Bytes;
    /// The chat stream ended.
    fn end(&mut self) -> Bytes;
    /// Whether silence still calls for keep-alives (no content yet); only asked by a body with a
    /// keep-alive timer.
    fn awaits_content(&self) -> bool {
        false
    }
    /// A keep-alive after silence (see the module's header).
    fn keepalive(&mut self) -> Bytes {
        Bytes::new()
    }
}

pin_project! {
    /// A face's events of a chat SSE body.
    pub struct TranslatedBody<B, T> {
        #[pin]
        inner: B,
        parser: SseParser,
        translator: T,
        out: VecDeque<Bytes>,
        #[pin]
        keepalive: Option<Sleep>,
        every: Duration,
        ended: bool,
    }
}

impl<B, T: Translate> TranslatedBody<B, T> {
    /// Wraps `inner`; the translator's first events go out first. `every`: the keep-alive
    /// timer's period, for a face that sends keep-alives during silence before content.
    pub fn new(inner: B, mut translator: T, every: Option<Duration>) -> Self {
        let mut out = VecDeque::new();
        out.push_back(translator.start());
        let keepalive = every.map(tokio::time::sleep);
        let every = every.unwrap_or_default();
        TranslatedBody { inner, parser: SseParser::new(), translator, out, keepalive, every, ended: false }
    }
}

/// The face's bytes of one read of the chat stream.
fn translate(parser: &mut SseParser, translator: &mut impl Translate, data: &[u8]) -> Bytes {
    let mut out = Vec::new();
    parser.feed(data, |item, _| match item {
        Item::Event(event) => out.extend_from_slice(&translator.chat_event(&event.data)),
        Item::Comment(text) => out.extend_from_slice(&translator.comment(&text)),
        Item::Blank => {}
    });
    Bytes::from(out)
}

impl<B, T> Body for TranslatedBody<B, T>
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Display,
    T: Translate,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        loop {
            if let Some(bytes) = this.out.pop_front() {
                if bytes.is_empty() {
                    continue;
                }
                return Poll::Ready(Some(Ok(Frame::data(bytes))));
            }
            if *this.ended {
                return Poll::Ready(None);
            }
            match this.inner.as_mut().poll_frame(cx) {
                Poll::Pending => {
                    let Some(mut timer) = this.keepalive.as_mut().as_pin_mut() else { return Poll::Pending };
                    if !this.translator.awaits_content() {
                        return Poll::Pending;
                    }
                    // Silence before the first content: a keep-alive when the timer fires.
                    match timer.as_mut().poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(()) => {
                            timer.as_mut().reset(Instant::now() + *this.every);
                            this.out.push_back(this.translator.keepalive());
                        }
                    }
                }
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        this.out.push_back(translate(this.parser, this.translator, &data));
                        if let Some(timer) = this.keepalive.as_mut().as_pin_mut() {
                            timer.reset(Instant::now() + *this.every);
                        }
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    *this.ended = true;
                    this.out.push_back(this.translator.broke(&e.to_string()));
                }
                Poll::Ready(None) => {
                    *this.ended = true;
                    // A last event without its blank line still counts, as the meter counts it.
                    this.out.push_back(translate(this.parser, this.translator, b"\n\n"));
                    this.out.push_back(this.translator.end());
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.out.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
