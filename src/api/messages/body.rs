//! `MessagesBody`: the client's streamed body, wrapped around the metered chat stream (the
//! [`StreamMeter`](crate::stream::meter::StreamMeter) the chat face's stream goes through, so
//! slots, figures and outcomes are the same). Each read of the chat stream is parsed with the
//! gateway's SSE parser and its complete events translated at once ([`Translator`]); nothing is
//! held beyond an unfinished SSE line.
//!
//! `ping`: a comment in the chat stream (a server's keep-alive during prefill, the gateway's own
//! during a map-reduce) becomes a `ping` event; until the first content block starts, a timer
//! also sends one every [`PING_EVERY`] of silence, for servers that send nothing while they
//! prefill. The timer lives in the body (no task): it stops with the first content and is
//! dropped with the body.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use super::events::Translator;
use crate::stream::sse::{Item, SseParser};

/// Silence before the first content after which a `ping` is sent.
pub const PING_EVERY: Duration = Duration::from_secs(10);

pin_project! {
    /// The Messages events of a chat SSE body.
    pub struct MessagesBody<B> {
        #[pin]
        inner: B,
        parser: SseParser,
        translator: Translator,
        out: VecDeque<Bytes>,
        #[pin]
        ping: Sleep,
        every: Duration,
        ended: bool,
    }
}

impl<B> MessagesBody<B> {
    /// Wraps `inner`; `message_start` goes out first. `every`: the ping timer's period.
    pub fn new(inner: B, mut translator: Translator, every: Duration) -> Self {
        let mut out = VecDeque::new();
        out.push_back(translator.start());
        let ping = tokio::time::sleep(every);
        MessagesBody { inner, parser: SseParser::new(), translator, out, ping, every, ended: false }
    }
}

/// The Messages bytes of one read of the chat stream.
fn translate(parser: &mut SseParser, translator: &mut Translator, data: &[u8]) -> Bytes {
    let mut out = Vec::new();
    parser.feed(data, |item, _| match item {
        Item::Event(event) => out.extend_from_slice(&translator.chat_event(&event.data)),
        Item::Comment(_) => out.extend_from_slice(&translator.ping()),
        Item::Blank => {}
    });
    Bytes::from(out)
}

impl<B> Body for MessagesBody<B>
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
                Poll::Pending => {
                    if this.translator.content_started() {
                        return Poll::Pending;
                    }
                    // Silence before the first content: a ping when the timer fires.
                    match this.ping.as_mut().poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(()) => {
                            this.ping.as_mut().reset(Instant::now() + *this.every);
                            this.out.push_back(this.translator.ping());
                        }
                    }
                }
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        this.out.push_back(translate(this.parser, this.translator, &data));
                        this.ping.as_mut().reset(Instant::now() + *this.every);
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    *this.ended = true;
                    this.out.push_back(this.translator.fail(&format!("The answer broke: {e}")));
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

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::{BodyExt, StreamBody};
    use serde_json::Value;

    use super::*;
    use crate::api::messages::request::Shape;

    fn shape() -> Shape {
        Shape { model: "claude-x".into(), stop_sequences: Vec::new(), thinking: true }
    }

    /// What a client reads from the chat stream `chunks`: each event's name (and its delta's
    /// text, when it has one).
    async fn read(chunks: Vec<&'static [u8]>) -> Vec<String> {
        let frames = chunks.into_iter().map(|c| Ok::<_, Infallible>(Frame::data(Bytes::from_static(c))));
        let inner = StreamBody::new(futures_util::stream::iter(frames));
        let body = MessagesBody::new(inner, Translator::new(shape()), PING_EVERY);
        let bytes = body.collect().await.expect("body").to_bytes();
        events(std::str::from_utf8(&bytes).expect("utf-8"))
    }

    fn events(text: &str) -> Vec<String> {
        text.split("\n\n")
            .filter(|block| !block.is_empty())
            .map(|block| {
                let mut lines = block.lines();
                let name = lines.next().and_then(|l| l.strip_prefix("event: ")).expect("event line");
                let data = lines.next().and_then(|l| l.strip_prefix("data: ")).expect("data line");
                let event: Value = serde_json::from_str(data).expect("json");
                assert_eq!(event["type"], name);
                match event.pointer("/delta/text") {
                    Some(text) => format!("{name} {text}"),
                    None => name.to_string(),
                }
            })
            .collect()
    }

    const STREAM: &[u8] = b": keepalive 1/2\n\n\
        data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"He\"}}]}\n\n\
        data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"y\"},\"finish_reason\":\"stop\"}]}\r\n\r\n\
        data: [DONE]\n\n";

    #[tokio::test]
    async fn any_split_of_the_chat_stream_gives_the_same_events() {
        let whole = read(vec![STREAM]).await;
        assert_eq!(
            whole,
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta \"He\"",
                "content_block_delta \"y\"",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        for cut in 1..STREAM.len() {
            let (head, tail) = STREAM.split_at(cut);
            assert_eq!(read(vec![head, tail]).await, whole, "cut at {cut}");
        }
        let singles: Vec<&'static [u8]> = STREAM.chunks(1).collect();
        assert_eq!(read(singles).await, whole);
    }

    #[tokio::test]
    async fn a_cut_stream_ends_with_an_error_event_and_no_message_stop() {
        let events = read(vec![
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"He\"}}]}\n\n",
            b"data: {\"error\":{\"message\":\"Backend `b` failed\",\"type\":\"backend_error\"}}\n\n",
        ])
        .await;
        assert_eq!(events.last().map(String::as_str), Some("error"));
        assert!(!events.iter().any(|e| e == "message_stop"));
        // Ended without a finish: an error too.
        let events = read(vec![b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"He\"}}]}\n\n"]).await;
        assert_eq!(events.last().map(String::as_str), Some("error"));
        // A last event without its blank line still counts.
        let events = read(vec![b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}"]).await;
        assert_eq!(events.last().map(String::as_str), Some("message_stop"));
    }

    #[tokio::test]
    async fn a_silent_backend_gets_timer_pings_until_content_begins() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
        let inner = StreamBody::new(tokio_stream_of(rx));
        // A short period: each ping below is the timer's (the backend sends nothing).
        let mut body = Box::pin(MessagesBody::new(inner, Translator::new(shape()), Duration::from_millis(5)));
        let mut next = async || {
            let frame = body.as_mut().frame().await.expect("a frame").expect("ok");
            events(std::str::from_utf8(&frame.into_data().expect("data")).expect("utf-8"))
        };
        assert_eq!(next().await, ["message_start"]);
        assert_eq!(next().await, ["ping"]);
        assert_eq!(next().await, ["ping"]);
        tx.send(Ok(Frame::data(Bytes::from_static(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
        ))))
        .await
        .expect("send");
        assert_eq!(next().await, ["content_block_start", "content_block_delta \"a\""]);
        tx.send(Ok(Frame::data(Bytes::from_static(b"data: [DONE]\n\n")))).await.expect("send");
        drop(tx);
        assert_eq!(next().await, ["content_block_stop", "message_delta", "message_stop"]);
    }

    /// A channel as a stream of frames.
    fn tokio_stream_of(
        rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>,
    ) -> impl futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>> {
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) })
    }
}
