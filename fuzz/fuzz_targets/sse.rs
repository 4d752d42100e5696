//! The SSE parser on arbitrary bytes: it never panics, and splitting the input at any two
//! points (taken from the input's first bytes) yields the same items as the whole.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mlxgate::stream::sse::{Item, SseParser};

fn items(chunks: &[&[u8]]) -> Vec<Item> {
    let mut parser = SseParser::new();
    let mut out = Vec::new();
    for chunk in chunks {
        parser.feed(chunk, |item, _| out.push(item));
    }
    out
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let (cuts, body) = data.split_at(2);
    let a = usize::from(cuts[0]) % (body.len() + 1);
    let b = (a + usize::from(cuts[1])) % (body.len() + 1);
    let (a, b) = (a.min(b), a.max(b));
    let whole = items(&[body]);
    assert_eq!(items(&[&body[..a], &body[a..b], &body[b..]]), whole);
    let bytes: Vec<&[u8]> = body.chunks(1).collect();
    assert_eq!(items(&bytes), whole);
});
