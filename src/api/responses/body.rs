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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::convert::Infallible;

    use http_body_util::{BodyExt, StreamBody};
    use serde_json::Value;

    use super::*;
    use crate::api::responses::request::{Echo, Shape};

    /// What a client reads from the chat stream `chunks`: the Responses events (type and the
    /// delta or the terminal status) and the comments.
    async fn read(chunks: Vec<&'static [u8]>) -> Vec<String> {
        let frames = chunks.into_iter().map(|c| Ok::<_, Infallible>(Frame::data(Bytes::from_static(c))));
        let inner = StreamBody::new(futures_util::stream::iter(frames));
        let shape =
            Shape { model: "qwen".into(), tools: HashMap::new(), namespaces: HashMap::new(), echo: Echo::default() };
        let body = ResponsesBody::new(inner, Translator::new(shape));
        let bytes = body.collect().await.expect("body").to_bytes();
        let text = String::from_utf8(bytes.to_vec()).expect("utf-8");
        text.split("\n\n")
            .filter(|block| !block.is_empty())
            .map(|block| match block.lines().nth(1).and_then(|l| l.strip_prefix("data: ")) {
                Some(data) => {
                    let event: Value = serde_json::from_str(data).expect("json");
                    let detail = event.get("delta").or_else(|| event.pointer("/response/status")).cloned();
                    format!("{} {}", event["type"].as_str().expect("type"), detail.unwrap_or(Value::Null))
                }
                None => block.to_string(),
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
        assert_eq!(whole[0], "response.created \"in_progress\"");
        assert_eq!(whole[2], ": keepalive 1/2");
        assert!(whole.contains(&"response.output_text.delta \"He\"".to_string()), "{whole:?}");
        assert_eq!(whole.last().map(String::as_str), Some("response.completed \"completed\""));
        for cut in 1..STREAM.len() {
            let (head, tail) = STREAM.split_at(cut);
            assert_eq!(read(vec![head, tail]).await, whole, "cut at {cut}");
        }
        let singles: Vec<&'static [u8]> = STREAM.chunks(1).collect();
        assert_eq!(read(singles).await, whole);
    }

    #[tokio::test]
    async fn the_meter_s_error_event_for_a_cut_stream_is_response_failed() {
        let events = read(vec![
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"He\"}}]}\n\n",
            b"data: {\"error\":{\"message\":\"Backend `b` failed\",\"type\":\"backend_error\"}}\n\n",
        ])
        .await;
        assert_eq!(events.last().map(String::as_str), Some("response.failed \"failed\""));
        // A last event without its blank line still counts.
        let events = read(vec![b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}"]).await;
        assert_eq!(events.last().map(String::as_str), Some("response.completed \"completed\""));
    }
}
