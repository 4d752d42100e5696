use proptest::prelude::*;

use super::*;

fn head(text: &str) -> Result<Option<Head>, WireError> {
    parse_head(&mut BytesMut::from(text.as_bytes()), false)
}

/// Decodes `wire` fed in pieces cut at `cuts`: the body's bytes, and the bytes left after its end.
fn decode_in_pieces(framing: Framing, wire: &[u8], cuts: &[usize]) -> Result<(Vec<u8>, Vec<u8>), WireError> {
    let mut decoder = Decoder::new(framing);
    let mut buf = BytesMut::new();
    let mut body = Vec::new();
    let mut fed = 0;
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
    points.sort_unstable();
    points.push(wire.len());
    let mut points = points.into_iter();
    loop {
        match decoder.decode(&mut buf)? {
            Step::Data(d) => {
                assert!(!d.is_empty(), "an empty data step");
                body.extend_from_slice(&d);
            }
            Step::End => {
                buf.extend_from_slice(&wire[fed..]);
                return Ok((body, buf.to_vec()));
            }
            Step::More => match points.next() {
                Some(to) => {
                    buf.extend_from_slice(&wire[fed..to.max(fed)]);
                    fed = to.max(fed);
                }
                None => match decoder.closed()? {
                    Step::End => return Ok((body, buf.to_vec())),
                    other => panic!("{other:?} at the close"),
                },
            },
        }
    }
}

fn chunked(pieces: &[&[u8]]) -> Vec<u8> {
    let mut wire = Vec::new();
    for p in pieces.iter().filter(|p| !p.is_empty()) {
        wire.extend_from_slice(format!("{:x}\r\n", p.len()).as_bytes());
        wire.extend_from_slice(p);
        wire.extend_from_slice(b"\r\n");
    }
    wire.extend_from_slice(b"0\r\n\r\n");
    wire
}

#[test]
fn a_request_head_carries_its_headers_and_length() {
    let mut headers = HeaderMap::new();
    headers.insert(http::header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let mut out = Vec::new();
    encode_request(&mut out, &Method::POST, "/v1/chat/completions?x=1", &headers, 42).expect("encodes");
    assert_eq!(
        String::from_utf8(out).expect("utf-8"),
        "POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: 127.0.0.1:8080\r\ncontent-type: application/json\r\n\
         content-length: 42\r\n\r\n"
    );
    let mut out = Vec::new();
    encode_request(&mut out, &Method::GET, "/health", &HeaderMap::new(), 0).expect("encodes");
    assert_eq!(out, b"GET /health HTTP/1.1\r\n\r\n");
    let mut out = Vec::new();
    encode_request(&mut out, &Method::POST, "/v1/x", &HeaderMap::new(), 0).expect("encodes");
    assert!(out.ends_with(b"content-length: 0\r\n\r\n"), "an empty POST says its length");
}

#[test]
fn a_target_that_would_split_the_request_line_is_refused() {
    for target in ["/a b", "/a\r\nX-Evil: 1", "", "/\u{7f}"] {
        let mut out = Vec::new();
        assert!(encode_request(&mut out, &Method::GET, target, &HeaderMap::new(), 0).is_err(), "{target:?}");
    }
}

#[test]
fn a_head_is_parsed_its_values_sliced_and_the_rest_left() {
    let mut buf = BytesMut::from(
        &b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\nX-Two: a\r\n\
           x-two: b\r\n\r\n5\r\nhello"[..],
    );
    let head = parse_head(&mut buf, false).expect("parses").expect("whole");
    assert_eq!(
        (head.status, head.version, head.framing, head.keep_alive),
        (StatusCode::OK, Version::HTTP_11, Framing::Chunked, true)
    );
    assert_eq!(head.headers["content-type"], "text/event-stream");
    assert_eq!(head.headers.get_all("x-two").iter().collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(&buf[..], b"5\r\nhello", "the body's first bytes stay in the buffer");
}

#[test]
fn a_partial_head_waits_and_a_huge_one_is_refused() {
    let partial = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n";
    let mut buf = BytesMut::from(&partial[..]);
    assert!(parse_head(&mut buf, false).expect("no error").is_none());
    assert_eq!(buf.len(), partial.len(), "nothing taken while partial");
    let mut huge = BytesMut::from(&b"HTTP/1.1 200 OK\r\n"[..]);
    while huge.len() <= MAX_HEAD {
        huge.extend_from_slice(b"x-filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
    }
    assert!(matches!(parse_head(&mut huge, false), Err(WireError::HeadTooLarge | WireError::BadHead(_))));
    assert!(matches!(head("HTTP/1.1 200 OK\r\nbad header\r\n\r\n"), Err(WireError::BadHead(_))));
    assert!(matches!(head("SSH-2.0-OpenSSH\r\n\r\n"), Err(WireError::BadHead(_))));
}

#[test]
fn framing_follows_rfc_9112() {
    let framing = |text: &str| head(text).expect("parses").expect("whole").framing;
    assert_eq!(framing("HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n"), Framing::Length(12));
    assert_eq!(framing("HTTP/1.1 200 OK\r\ncontent-length: 12, 12\r\n\r\n"), Framing::Length(12));
    assert_eq!(framing("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n"), Framing::Chunked);
    assert_eq!(framing("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\n"), Framing::Close);
    assert_eq!(framing("HTTP/1.1 200 OK\r\n\r\n"), Framing::Close);
    assert_eq!(framing("HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n"), Framing::Empty);
    assert_eq!(framing("HTTP/1.1 100 Continue\r\n\r\n"), Framing::Empty);
    // Both: the coding wins, and the connection is not reused (a smuggling shape).
    let both =
        head("HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n").expect("ok").expect("whole");
    assert_eq!((both.framing, both.keep_alive), (Framing::Chunked, false));
    let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n"[..]);
    assert_eq!(parse_head(&mut buf, true).expect("ok").expect("whole").framing, Framing::Empty, "HEAD");
    for bad in
        ["content-length: 1, 2", "content-length: -1", "content-length: x", "content-length: 99999999999999999999999"]
    {
        assert!(matches!(head(&format!("HTTP/1.1 200 OK\r\n{bad}\r\n\r\n")), Err(WireError::BadBody(_))), "{bad}");
    }
}

#[test]
fn keep_alive_follows_the_version_and_connection() {
    let keep = |text: &str| head(text).expect("parses").expect("whole").keep_alive;
    assert!(keep("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"));
    assert!(!keep("HTTP/1.1 200 OK\r\nConnection: Close\r\ncontent-length: 0\r\n\r\n"));
    assert!(!keep("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n"), "HTTP/1.0 closes by default");
    assert!(keep("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\ncontent-length: 0\r\n\r\n"));
    assert!(!keep("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\n"), "no length: the close ends it");
}

#[test]
fn chunked_bodies_decode_with_extensions_trailers_and_bare_line_feeds() {
    let wire = b"5;name=x\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\nHTTP/1.1";
    let (body, rest) = decode_in_pieces(Framing::Chunked, wire, &[]).expect("decodes");
    assert_eq!((body.as_slice(), rest.as_slice()), (&b"hello world"[..], &b"HTTP/1.1"[..]));
    let (body, _) = decode_in_pieces(Framing::Chunked, b"3\nabc\n0\n\n", &[]).expect("bare LF");
    assert_eq!(body, b"abc");
    let (body, _) =
        decode_in_pieces(Framing::Chunked, b"A \r\n0123456789\r\n0\r\n\r\n", &[]).expect("upper hex, space");
    assert_eq!(body, b"0123456789");
}

#[test]
fn broken_chunked_bodies_are_errors_not_answers() {
    for (wire, why) in [
        (&b"zz\r\nhello\r\n0\r\n\r\n"[..], "not hex"),
        (b"3\r\nhello\r\n0\r\n\r\n", "longer than its size"),
        (b"fffffffffffffffff\r\n", "too many digits"),
        (b"\r\n", "no digits"),
        (b"5 x\r\nhello\r\n", "junk after the size"),
    ] {
        assert!(matches!(decode_in_pieces(Framing::Chunked, wire, &[]), Err(WireError::BadBody(_))), "{why}");
    }
    assert!(
        matches!(decode_in_pieces(Framing::Chunked, b"5\r\nhel", &[]), Err(WireError::ClosedInBody)),
        "closed inside a chunk"
    );
    let long_line = vec![b'1'; MAX_LINE + 2];
    assert!(matches!(decode_in_pieces(Framing::Chunked, &long_line, &[]), Err(WireError::BadBody(_))));
}

#[test]
fn a_length_body_ends_at_its_length_and_a_close_body_at_the_close() {
    let (body, rest) = decode_in_pieces(Framing::Length(5), b"helloHTTP", &[2]).expect("decodes");
    assert_eq!((body.as_slice(), rest.as_slice()), (&b"hello"[..], &b"HTTP"[..]));
    assert!(matches!(decode_in_pieces(Framing::Length(5), b"hel", &[]), Err(WireError::ClosedInBody)));
    let (body, _) = decode_in_pieces(Framing::Close, b"all of it", &[3]).expect("decodes");
    assert_eq!(body, b"all of it");
    let (body, _) = decode_in_pieces(Framing::Empty, b"", &[]).expect("decodes");
    assert!(body.is_empty());
}

proptest! {
    /// Whatever the pieces the bytes come in, a chunked body decodes to what was sent, and what
    /// follows it is left for the next answer.
    #[test]
    fn chunked_decoding_does_not_depend_on_where_reads_end(
        pieces in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
        let mut wire = chunked(&refs);
        wire.extend_from_slice(b"NEXT");
        let (body, rest) = decode_in_pieces(Framing::Chunked, &wire, &cuts).expect("decodes");
        prop_assert_eq!(body, pieces.concat());
        prop_assert_eq!(rest, b"NEXT".to_vec());
    }

    /// A head split anywhere parses the same once whole.
    #[test]
    fn a_head_parses_the_same_whatever_the_reads(cut in 0usize..80) {
        let text = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        let cut = cut.min(text.len());
        let mut buf = BytesMut::from(&text[..cut]);
        let early = parse_head(&mut buf, false).expect("no error");
        if let Some(h) = early {
            prop_assert!(cut >= text.len() - 2);
            prop_assert_eq!(h.framing, Framing::Length(2));
        } else {
            buf.extend_from_slice(&text[cut..]);
            let h = parse_head(&mut buf, false).expect("no error").expect("whole");
            prop_assert_eq!(h.framing, Framing::Length(2));
            prop_assert_eq!(&buf[..], b"{}");
        }
    }
}
