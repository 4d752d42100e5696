//! An incremental Server-Sent Events parser (the WHATWG `text/event-stream` rules) over the
//! `Bytes` a backend sends, split anywhere.
//!
//! Feeding the same bytes in any split — one byte at a time, many events per read, a `\r\n`
//! cut between its `\r` and its `\n` — yields the same items. Lines end with `\n`, `\r\n` or
//! `\r`; `data:` lines of one event are joined with `\n`; `event:` and `id:` are kept; lines
//! starting with `:` are comments (servers' keepalives). The parser only watches: it reports
//! where each event ends in the bytes it was fed, so the caller can forward the backend's own
//! bytes (sliced, never re-encoded).

/// One thing a stream said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// A dispatched event (a blank line ended it).
    Event(Event),
    /// A comment line (`: keepalive 3/9`), without the colon.
    Comment(String),
    /// A blank line that ended no event (after a comment, or a second blank line): it belongs
    /// to what came before it.
    Blank,
}

/// An SSE event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Event {
    /// `event:` field, if any.
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// `id:` field, if any.
    pub id: Option<String>,
}

/// Incremental parser state. Holds at most one unfinished line.
#[derive(Debug, Default)]
pub struct SseParser {
    /// The unfinished line carried over from earlier chunks.
    line: Vec<u8>,
    /// The previous chunk ended in `\r`: a `\n` at the start of the next one belongs to it.
    after_cr: bool,
    /// The event being assembled.
    event: Event,
    /// Whether the current event has any data line (an event without one is not dispatched).
    has_data: bool,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses `chunk`, calling `on_item(item, end)` for every item completed in it, where `end`
    /// is the offset in `chunk` just past the line that completed it.
    pub fn feed(&mut self, chunk: &[u8], mut on_item: impl FnMut(Item, usize)) {
        if chunk.is_empty() {
            // Nothing read: a pending `\r` still waits for its possible `\n`.
            return;
        }
        let mut start = 0;
        if self.after_cr && chunk.first() == Some(&b'\n') {
            start = 1;
        }
        self.after_cr = false;
        let mut pos = start;
        while let Some(offset) = memchr::memchr2(b'\n', b'\r', &chunk[pos..]) {
            let end_of_line = pos + offset;
            let mut next = end_of_line + 1;
            if chunk[end_of_line] == b'\r' {
                match chunk.get(next) {
                    Some(b'\n') => next += 1,
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            if self.line.is_empty() {
                self.line_complete(&chunk[pos..end_of_line], next, &mut on_item);
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(&chunk[pos..end_of_line]);
                self.line_complete(&line, next, &mut on_item);
                line.clear();
                self.line = line;
            }
            pos = next;
        }
        self.line.extend_from_slice(&chunk[pos..]);
    }

    /// Whether `chunk` starts with the `\n` of a `\r\n` whose `\r` ended the previous chunk:
    /// that byte belongs to the line (and the item) the previous chunk completed.
    pub fn continues_line_ending(&self, chunk: &[u8]) -> bool {
        self.after_cr && chunk.first() == Some(&b'\n')
    }

    fn line_complete(&mut self, line: &[u8], end: usize, on_item: &mut impl FnMut(Item, usize)) {
        if line.is_empty() {
            if self.has_data {
                let mut event = std::mem::take(&mut self.event);
                if event.data.ends_with('\n') {
                    event.data.pop();
                }
                on_item(Item::Event(event), end);
            } else {
                on_item(Item::Blank, end);
            }
            self.event = Event::default();
            self.has_data = false;
            return;
        }
        // Valid UTF-8 is checked word by word; only a line that is not goes through the
        // (byte by byte) lossy decoding.
        let text = match std::str::from_utf8(line) {
            Ok(text) => std::borrow::Cow::Borrowed(text),
            Err(_) => String::from_utf8_lossy(line),
        };
        if let Some(comment) = text.strip_prefix(':') {
            on_item(Item::Comment(comment.strip_prefix(' ').unwrap_or(comment).to_string()), end);
            return;
        }
        let (field, value) = match text.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (text.as_ref(), ""),
        };
        match field {
            "data" => {
                self.event.data.push_str(value);
                self.event.data.push('\n');
                self.has_data = true;
            }
            "event" => self.event.event = Some(value.to_string()),
            "id" if !value.contains('\0') => self.event.id = Some(value.to_string()),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(chunks: &[&[u8]]) -> Vec<Item> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, |i, _| out.push(i));
        }
        out.retain(|i| *i != Item::Blank);
        out
    }

    fn data(s: &str) -> Item {
        Item::Event(Event { data: s.into(), ..Default::default() })
    }

    #[test]
    fn events_comments_and_fields() {
        let items = parse_all(&[
            b": keepalive 1/9\n\ndata: {\"a\":1}\n\nevent: error\nid: 7\ndata: x\ndata: y\n\ndata: [DONE]\n\n",
        ]);
        assert_eq!(
            items,
            [
                Item::Comment("keepalive 1/9".into()),
                data("{\"a\":1}"),
                Item::Event(Event { event: Some("error".into()), data: "x\ny".into(), id: Some("7".into()) }),
                data("[DONE]"),
            ]
        );
    }

    #[test]
    fn every_line_ending_and_every_split_give_the_same_items() {
        let lf = "data: one\n\n: c\ndata: two\ndata: three\n\n";
        for text in [lf.to_string(), lf.replace('\n', "\r\n"), lf.replace('\n', "\r")] {
            let whole = parse_all(&[text.as_bytes()]);
            assert_eq!(whole, [data("one"), Item::Comment("c".into()), data("two\nthree")], "{text:?}");
            let bytes = text.as_bytes();
            for cut in 0..=bytes.len() {
                assert_eq!(parse_all(&[&bytes[..cut], &bytes[cut..]]), whole, "{text:?} cut at {cut}");
            }
            let singles: Vec<&[u8]> = bytes.chunks(1).collect();
            assert_eq!(parse_all(&singles), whole);
        }
    }

    #[test]
    fn ends_point_just_past_the_completing_line() {
        let text = b"data: a\n\ndata: b\r\n\r\n";
        let mut ends = Vec::new();
        SseParser::new().feed(text, |_, end| ends.push(end));
        assert_eq!(ends, [9, text.len()]);
        let mut items = Vec::new();
        SseParser::new().feed(b": c\n\n", |i, end| items.push((i, end)));
        assert_eq!(items, [(Item::Comment("c".into()), 4), (Item::Blank, 5)]);
    }

    #[test]
    fn an_empty_read_between_cr_and_lf_changes_nothing() {
        // Found by the fuzzer (bench/fuzz.sh): an empty read used to forget the pending `\r`.
        let whole = parse_all(&[b":\r\n\r\n"]);
        assert_eq!(parse_all(&[b":\r", b"", b"\n\r\n"]), whole);
        let mut items = Vec::new();
        let mut p = SseParser::new();
        for chunk in [&b":\r"[..], b"", b"\n\r", b"", b"\n"] {
            p.feed(chunk, |i, _| items.push(i));
        }
        assert_eq!(items, [Item::Comment(String::new()), Item::Blank]);
    }

    #[test]
    fn an_event_without_data_is_not_dispatched_and_unfinished_events_wait() {
        assert_eq!(parse_all(&[b"event: ping\n\n", b"data: x"]), []);
        assert_eq!(parse_all(&[b"data:x\n", b"\n"]), [data("x")]);
        assert_eq!(parse_all(&[b"data\n\n"]), [data("")]);
    }
}
