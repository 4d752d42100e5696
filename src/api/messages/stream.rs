//! The Messages face's stream: its [`Translator`] as the state machine that the generic
//! [`TranslatedBody`](crate::api::translate::TranslatedBody) drives over the metered chat
//! stream, with a keep-alive timer of [`PING_EVERY`].
//!
//! `ping`: a comment in the chat stream (a server's keep-alive during prefill, the gateway's own
//! during a map-reduce) becomes a `ping` event; until the first content block starts, the
//! body's timer also sends one every [`PING_EVERY`] of silence, for servers that send nothing
//! while they prefill.

use std::time::Duration;

use bytes::Bytes;

use super::events::Translator;
use crate::api::translate::Translate;

/// Silence before the first content after which a `ping` is sent.
pub const PING_EVERY: Duration = Duration::from_secs(10);

impl Translate for Translator {
    /// `message_start`.
    fn start(&mut self) -> Bytes {
        Translator::start(self)
    }

    fn chat_event(&mut self, data: &str) -> Bytes {
        Translator::chat_event(self, data)
    }

    /// A `ping`.
    fn comment(&mut self, _: &str) -> Bytes {
        self.ping()
    }

    fn broke(&mut self, error: &str) -> Bytes {
        self.fail(&format!("The answer broke: {error}"))
    }

    fn end(&mut self) -> Bytes {
        Translator::end(self)
    }

    fn awaits_content(&self) -> bool {
        !self.content_started()
    }

    /// A `ping`.
    fn keepalive(&mut self) -> Bytes {
        self.ping()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::{BodyExt, StreamBody};
    use serde_json::Value;

    use http_body::Frame;

    use super::*;
    use crate::api::messages::request::Shape;
    use crate::api::translate::TranslatedBody;

    fn shape() -> Shape {
        Shape { model: "claude-x".into(), stop_sequences: Vec::new(), thinking: true, tools: Vec::new() }
    }

    /// What a client reads from the chat stream `chunks`: each event's name (and its delta's
    /// text, when it has one).
    async fn read(chunks: Vec<&'static [u8]>) -> Vec<String> {
        let frames = chunks.into_iter().map(|c| Ok::<_, Infallible>(Frame::data(Bytes::from_static(c))));
        let inner = StreamBody::new(futures_util::stream::iter(frames));
        let body = TranslatedBody::new(inner, Translator::new(shape()), Some(PING_EVERY));
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
        let mut body = Box::pin(TranslatedBody::new(inner, Translator::new(shape()), Some(Duration::from_millis(5))));
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
