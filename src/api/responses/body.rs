//! `ResponsesBody`: the client's streamed body, wrapped around the metered chat stream (the
//! [`StreamMeter`](crate::stream::meter::StreamMeter) that the chat face's stream goes
//! through, so slots, figures and outcomes are the same). Each read of the chat stream is
//! parsed with the gateway's SSE parser and its complete events translated at once
//! ([`Translator`]); comments (a server's keepalives during prefill, the stats line) pass as
//! they are. Nothing is held beyond an unfinished SSE line.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::events::Translator;
use crate::stream::sse::{Item, SseParser};

pin_project! {
    /// The Responses events of a chat SSE body.
    pub struct ResponsesBody<B> {
        #[pin]
        inner: B,
        parser: SseParser,
        translator: Translator,
        out: VecDeque<Bytes>,
        ended: bool,
    }
}

impl<B> ResponsesBody<B> {
    /// Wraps `inner`; `response.created` and `response.in_progress` go out first.
    pub fn new(inner: B, mut translator: Translator) -> Self {
        let mut out = VecDeque::new();
        out.push_back(translator.start());
        ResponsesBody { inner, parser: SseParser::new(), translator, out, ended: false }
    }
}

/// The Responses bytes of one read of the chat stream.
fn translate(parser: &mut SseParser, translator: &mut Translator, data: &[u8]) -> Bytes {
    let mut out = Vec::new();
    parser.feed(data, |item, _| match item {
        Item::Event(event) => out.extend_from_slice(&translator.chat_event(&event.data)),
        Item::Comment(text) => {
            out.push(b':');
            if !text.is_empty() {
                out.push(b' ');
                out.extend_from_slice(text.as_bytes());
            }
            out.extend_from_slice(b"\n\n");
        }
        Item::Blank => {}
    });
    Bytes::from(out)
}

impl<B> Body for ResponsesBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Display,
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
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        this.out.push_back(translate(this.parser, this.translator, &data));
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    *this.ended = true;
                    this.out.push_back(this.translator.fail(&format!("the answer broke: {e}")));
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
