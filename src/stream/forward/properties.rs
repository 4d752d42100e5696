//! Property tests: for generated transcripts in the style of every server in docs/wire-facts.md,
//! split at random, the parser sees the same events, the figures are the same, and the client
//! gets the same bytes (exactly the backend's, less the usage-only chunk when not asked for;
//! with `finish_length` and `single_finish`, one finish chunk, saying `length`).

use proptest::prelude::*;
use proptest::sample::Index;

use super::*;
use crate::stream::sse::SseParser;

fn chunk(delta: Value) -> Value {
    serde_json::json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
}

/// One server's transcript of `n` tokens, as (lines of each frame).
fn transcript(style: u8, n: usize, split_data: bool) -> Vec<Vec<String>> {
    let data = |v: Value| vec![format!("data: {v}")];
    let usage = serde_json::json!({"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n});
    let mut frames: Vec<Vec<String>> = Vec::new();
    match style {
        0 => frames.push(vec![format!(": keepalive 3/{n}")]),
        1 => frames.push(data(serde_json::json!({"id": "chatcmpl-keepalive", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": null}]}))),
        2 => frames.push(vec![": ping".into()]),
        _ => {}
    }
    frames.push(data(chunk(serde_json::json!({"role": "assistant"}))));
    for i in 0..n {
        let delta = match (style, i % 3) {
            (3, _) => serde_json::json!({"reasoning_content": format!("r{i}")}),
            (4, _) => serde_json::json!({"role": "assistant", "content": format!("t{i} ")}),
            (5, 0) => serde_json::json!({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
            _ => serde_json::json!({"content": format!("t{i}\nx")}),
        };
        let line = chunk(delta).to_string();
        if split_data && i % 2 == 0 {
            // A multi-line data field: the parser joins the lines with "\n", which JSON
            // takes as whitespace between two members.
            let at = line.find("\"choices\"").unwrap_or(0);
            let (a, b) = line.split_at(at);
            frames.push(vec![format!("data: {a}"), format!("data:{b}")]);
        } else {
            frames.push(vec![format!("data: {line}")]);
        }
        if style == 0 && i == 0 {
            frames.push(vec![
                "event: message".into(),
                "id: 9".into(),
                format!("data: {}", chunk(serde_json::json!({}))),
            ]);
        }
    }
    if style == 6 {
        frames.push(data(serde_json::json!({"error": {"message": "boom", "type": "server_error"}})));
    }
    let mut finish = chunk(serde_json::json!({}));
    finish["choices"][0]["finish_reason"] = "stop".into();
    if style == 8 {
        // mlx-omni-server: the finish, then the same finish with usage.
        frames.push(data(finish.clone()));
    }
    if matches!(style, 2 | 6 | 7 | 8) {
        finish["usage"] = usage.clone();
    }
    frames.push(data(finish));
    if !matches!(style, 6 | 8) {
        frames.push(data(serde_json::json!({"id": "chatcmpl-1", "choices": [], "usage": usage})));
    }
    if style != 5 {
        frames.push(vec!["data: [DONE]".into()]);
    }
    frames
}

fn render(frames: &[Vec<String>], eol: &str) -> Vec<u8> {
    let mut out = String::new();
    for frame in frames {
        for line in frame {
            out.push_str(line);
            out.push_str(eol);
        }
        out.push_str(eol);
    }
    out.into_bytes()
}

fn split(bytes: &[u8], cuts: &[Index]) -> Vec<Bytes> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
    points.push(0);
    points.push(bytes.len());
    points.sort_unstable();
    points.dedup();
    points.windows(2).map(|w| Bytes::copy_from_slice(&bytes[w[0]..w[1]])).collect()
}

/// Items, figures (less per-read counts) and forwarded bytes of one delivery.
/// Output frames, tokens, error, `[DONE]` seen.
type Summary = (u64, Option<u64>, Option<String>, bool);

fn run(chunks: &[Bytes], wants_usage: bool, normalise: StreamNormalise) -> (Vec<Item>, Summary, Vec<u8>) {
    let mut items_parser = SseParser::new();
    let mut items = Vec::new();
    for c in chunks {
        items_parser.feed(c, |i, _| items.push(i));
    }
    let mut forward = Forward::new(normalise);
    let mut figures = StreamFigures::default();
    for c in chunks {
        forward.observe(&mut figures, c.clone(), wants_usage);
    }
    forward.finish(&mut figures, wants_usage);
    let sent = forward.out.iter().flat_map(|b| b.iter().copied()).collect();
    (items, (figures.token_frames, figures.tokens(), figures.error, figures.done), sent)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("MLXGATE_PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(100_000),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn any_split_gives_the_same_events_figures_and_bytes(
        style in 0u8..9,
        n in 0usize..12,
        split_data in any::<bool>(),
        eol in prop_oneof![Just("\n"), Just("\r\n"), Just("\r")],
        cuts in prop::collection::vec(any::<Index>(), 0..24),
        one_byte_reads in prop::bool::weighted(0.1),
        wants_usage in any::<bool>(),
        normalised in any::<bool>(),
    ) {
        // finish_length at the answer's length (every transcript is cut at it) and single_finish.
        let normalise = if normalised {
            StreamNormalise { length_at: Some(n as u64), single_finish: true, hold_abandoned: false }
        } else {
            StreamNormalise::default()
        };
        let bytes = render(&transcript(style, n, split_data), eol);
        let whole = [Bytes::from(bytes.clone())];
        let chunks = if one_byte_reads {
            bytes.iter().map(|b| Bytes::copy_from_slice(&[*b])).collect()
        } else {
            split(&bytes, &cuts)
        };
        let (items, figures, sent) = run(&chunks, wants_usage, normalise);
        let (whole_items, whole_figures, whole_sent) = run(&whole, wants_usage, normalise);
        prop_assert_eq!(&items, &whole_items);
        prop_assert_eq!(&figures, &whole_figures);
        prop_assert_eq!(&sent, &whole_sent);
        if wants_usage && !normalised {
            prop_assert_eq!(&sent, &bytes, "the client gets exactly the backend's bytes");
        }
        if normalised {
            let text = String::from_utf8_lossy(&sent);
            let finishes = text.matches("\"finish_reason\":\"").count();
            prop_assert_eq!(finishes, 1, "one finish chunk: {}", text);
            prop_assert!(text.contains("\"finish_reason\":\"length\""), "cut at max_tokens: {}", text);
        }
        if n > 0 && style != 1 {
            prop_assert_eq!(figures.0 as usize, n, "one output frame per generated token");
        }
    }
}
