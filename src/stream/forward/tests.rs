//! The slicer's tests: what the client gets of a stream, in any split; and the helpers the
//! figures' and the finish normalisations' tests run frames through.

use bytes::Bytes;

use super::*;

pub(in crate::stream) const ROLE: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";

pub(in crate::stream) const KEEPALIVE: &str =
    "data: {\"id\":\"chatcmpl-keepalive\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"}}]}\n\n";

pub(in crate::stream) const TOKEN: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t \"}}]}\n\n";

pub(in crate::stream) const USAGE_ONLY: &str =
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\n";

pub(in crate::stream) const DONE: &str = "data: [DONE]\n\n";

pub(in crate::stream) fn figures_of(chunks: &[&str], wants_usage: bool) -> (StreamFigures, String) {
    normalised(StreamNormalise::default(), chunks, wants_usage)
}

pub(in crate::stream) fn normalised(
    normalise: StreamNormalise,
    chunks: &[&str],
    wants_usage: bool,
) -> (StreamFigures, String) {
    let mut forward = Forward::new(normalise);
    let mut figures = StreamFigures::default();
    for c in chunks {
        forward.observe(&mut figures, Bytes::from(c.to_string()), wants_usage);
    }
    forward.finish(&mut figures, wants_usage);
    let sent: Vec<u8> = forward.out.iter().flat_map(|b| b.iter().copied()).collect();
    (figures, String::from_utf8(sent).expect("utf8"))
}

/// Every split of `chunks`' bytes in two gives the same output as the whole.
pub(in crate::stream) fn same_for_every_split(
    normalise: StreamNormalise,
    chunks: &[&str],
    wants_usage: bool,
) -> String {
    let all = chunks.concat();
    let (_, whole) = normalised(normalise, &[&all], wants_usage);
    for cut in 0..=all.len() {
        let (_, sent) = normalised(normalise, &[&all[..cut], &all[cut..]], wants_usage);
        assert_eq!(sent, whole, "cut at {cut}");
    }
    whole
}

#[test]
fn the_usage_only_chunk_is_dropped_unless_asked_and_nothing_else_changes() {
    let chunks = [ROLE, TOKEN, TOKEN, USAGE_ONLY, "data: [DONE]\n\n"];
    let (f, sent) = figures_of(&chunks, false);
    assert_eq!(sent, [ROLE, TOKEN, TOKEN, "data: [DONE]\n\n"].concat());
    assert_eq!(f.tokens(), Some(2));
    let (_, sent) = figures_of(&chunks, true);
    assert_eq!(sent, chunks.concat());
    // Split mid-frame: the same bytes, the dropped frame's pieces dropped too.
    let all = chunks.concat();
    let cut = all.find("\"usage\"").expect("usage");
    let (_, sent) = figures_of(&[&all[..cut], &all[cut..]], false);
    assert_eq!(sent, [ROLE, TOKEN, TOKEN, "data: [DONE]\n\n"].concat());
}

/// What the client gets of `chunks` with the public name `model`, whole and in every split
/// in two (the same each time).
fn named_output(normalise: StreamNormalise, model: &str, chunks: &[String]) -> String {
    let run = |pieces: &[&str]| {
        let mut forward = Forward::new(normalise).naming(model);
        let mut figures = StreamFigures::default();
        for piece in pieces {
            forward.observe(&mut figures, Bytes::from(piece.to_string()), true);
        }
        forward.finish(&mut figures, true);
        let sent: Vec<u8> = forward.out.iter().flat_map(|b| b.iter().copied()).collect();
        String::from_utf8(sent).expect("utf8")
    };
    let all = chunks.concat();
    let whole = run(&[&all]);
    for cut in 0..=all.len() {
        assert_eq!(run(&[&all[..cut], &all[cut..]]), whole, "cut at {cut}");
    }
    whole
}

#[test]
fn every_event_names_the_public_model_in_any_split_and_normalisation() {
    let event = |rest: &str| format!("data: {{\"id\":\"c\",\"model\":\"/path/on/disk/tiny-qwen3\",{rest}}}\n\n");
    let chunks = [
        ROLE.to_string(),
        event(r#""choices":[{"index":0,"delta":{"content":"a"}}]"#),
        event(r#""choices":[{"index":0,"delta":{"content":"b"}}]"#),
        event(r#""choices":[{"index":0,"delta":{},"finish_reason":"stop"}]"#).replace("\n\n", "\r\n\r\n"),
        event(r#""choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}"#),
        "data: [DONE]\n\n".to_string(),
    ];
    let single = StreamNormalise { single_finish: true, length_at: Some(2), hold_abandoned: false };
    for normalise in [StreamNormalise::default(), single] {
        let sent = named_output(normalise, "qwen", &chunks);
        assert!(!sent.contains("/path/on/disk"), "{sent}");
        let events = sent.matches("data: ").count();
        assert_eq!(sent.matches(r#""model":"qwen""#).count(), events - 2, "all but role and [DONE]: {sent}");
        assert!(sent.contains(r#""content":"a""#) && sent.ends_with("data: [DONE]\n\n"), "{sent}");
    }
    // A name that is already the public one: the backend's own bytes, untouched.
    let public: Vec<String> = chunks.iter().map(|c| c.replace("/path/on/disk/tiny-qwen3", "qwen")).collect();
    assert_eq!(named_output(StreamNormalise::default(), "qwen", &public), public.concat());
    // The last event without its blank line is renamed too.
    let unended =
        [event(r#""choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]"#).trim_end().to_string()];
    assert!(named_output(StreamNormalise::default(), "q\"x", &unended).contains(r#""model":"q\"x""#));
}

/// A stream of 20 000 tokens through the slicer and the figures, one frame per read: the
/// per-chunk path, for an instruction count (`valgrind --tool=callgrind <lib test binary>
/// --exact stream::forward::tests::hot_path::same_name --ignored`; also `renamed` and
/// `normalising`), compared before and after a
/// change to it.
mod hot_path {
    use super::*;

    fn reads(n: usize, model: &str) -> Vec<Bytes> {
        let mut out = vec![Bytes::from(format!(
            "data: {{\"id\":\"c\",\"model\":\"{model}\",\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\"}},\"finish_reason\":null}}]}}\n\n"
        ))];
        for i in 0..n {
            out.push(Bytes::from(format!("data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"{model}\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok{i} \"}},\"finish_reason\":null}}]}}\n\n")));
        }
        out.push(Bytes::from(format!("data: {{\"id\":\"c\",\"model\":\"{model}\",\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}]}}\n\n")));
        out.push(Bytes::from(format!("data: {{\"id\":\"c\",\"model\":\"{model}\",\"choices\":[],\"usage\":{{\"prompt_tokens\":7,\"completion_tokens\":{n}}}}}\n\ndata: [DONE]\n\n")));
        out
    }

    fn run(model: &str, normalise: StreamNormalise) -> usize {
        let mut forward = Forward::new(normalise).naming("qwen");
        let mut figures = StreamFigures { metered: true, ..Default::default() };
        let mut sent = 0;
        for read in reads(20_000, model) {
            forward.observe(&mut figures, read, false);
            while let Some(bytes) = forward.out.pop_front() {
                sent += bytes.len();
            }
        }
        forward.finish(&mut figures, false);
        assert!(figures.complete() && figures.tokens() == Some(20_000));
        sent
    }

    #[test]
    #[ignore = "an instruction-count harness for callgrind, slow without it being useful as a test"]
    fn same_name() {
        assert!(run("qwen", StreamNormalise::default()) > 0);
    }

    #[test]
    #[ignore = "an instruction-count harness for callgrind, slow without it being useful as a test"]
    fn renamed() {
        assert!(run("/models/tiny", StreamNormalise::default()) > 0);
    }

    #[test]
    #[ignore = "an instruction-count harness for callgrind, slow without it being useful as a test"]
    fn normalising() {
        let normalise = StreamNormalise { length_at: Some(20_000), single_finish: true, hold_abandoned: false };
        assert!(run("qwen", normalise) > 0);
    }
}
