//! The Responses face's stream: its [`Translator`] as the state machine that the generic
//! [`TranslatedBody`](crate::api::translate::TranslatedBody) drives over the metered chat
//! stream. Comments (a server's keepalives during prefill, the stats line) pass as they are;
//! no keep-alives of its own.

use bytes::Bytes;

use super::events::Translator;
use crate::api::translate::Translate;

impl Translate for Translator {
    /// `response.created` and `response.in_progress`.
    fn start(&mut self) -> Bytes {
        Translator::start(self)
    }

    fn chat_event(&mut self, data: &str) -> Bytes {
        Translator::chat_event(self, data)
    }

    /// The comment as it is.
    fn comment(&mut self, text: &str) -> Bytes {
        let mut out = Vec::new();
        out.push(b':');
        if !text.is_empty() {
            out.push(b' ');
            out.extend_from_slice(text.as_bytes());
        }
        out.extend_from_slice(b"\n\n");
        Bytes::from(out)
    }

    fn broke(&mut self, error: &str) -> Bytes {
        self.fail(&format!("the answer broke: {error}"))
    }

    fn end(&mut self) -> Bytes {
        Translator::end(self)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::convert::Infallible;

    use http_body_util::{BodyExt, StreamBody};
    use serde_json::Value;

    use http_body::Frame;

    use super::*;
    use crate::api::responses::request::{Echo, Shape};
    use crate::api::translate::TranslatedBody;

    /// What a client reads from the chat stream `chunks`: the Responses events (type and the
    /// delta or the terminal status) and the comments.
    async fn read(chunks: Vec<&'static [u8]>) -> Vec<String> {
        let frames = chunks.into_iter().map(|c| Ok::<_, Infallible>(Frame::data(Bytes::from_static(c))));
        let inner = StreamBody::new(futures_util::stream::iter(frames));
        let shape =
            Shape { model: "qwen".into(), tools: HashMap::new(), namespaces: HashMap::new(), echo: Echo::default() };
        let body = TranslatedBody::new(inner, Translator::new(shape), None);
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
