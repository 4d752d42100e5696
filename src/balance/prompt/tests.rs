use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

fn prompt(body: &Value) -> Prompt {
    Prompt::of_chat(&serde_json::to_vec(body).expect("encodes"))
}

fn chat(messages: Value) -> Value {
    json!({"model": "m", "messages": messages, "stream": true})
}

/// Every segment alike, chained (`a` and `b` agree on their whole length).
fn same(a: &Prompt, b: &Prompt) -> bool {
    a.chain() == b.chain() && a.bytes() == b.bytes() && a.conversation_key() == b.conversation_key()
}

#[test]
fn tools_then_each_message_one_segment_each() {
    let body = json!({
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        "model": "m",
        "tools": [{"type": "function", "function": {"name": "bash"}}],
    });
    let p = prompt(&body);
    assert_eq!(p.segments(), 3);
    // The tools come first whatever the body's key order.
    let reordered = json!({
        "tools": [{"type": "function", "function": {"name": "bash"}}],
        "model": "m",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
    });
    assert!(same(&p, &prompt(&reordered)));
    let without_tools =
        prompt(&chat(json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])));
    assert_eq!(without_tools.segments(), 2);
    assert_ne!(without_tools.chain()[0], p.chain()[0]);
}

#[test]
fn whitespace_key_order_escapes_and_cache_control_do_not_count() {
    let compact = br#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"caf\u00e9 \"x\""}]}]}"#;
    let loose = "{ \"messages\" : [ { \"content\" : [ { \"text\" : \"caf\u{e9} \\\"x\\\"\", \"type\" : \"text\", \
                 \"cache_control\": {\"type\": \"ephemeral\"} } ], \"role\" : \"user\" } ],\n \"model\": \"other\" }";
    let a = Prompt::of_chat(compact);
    let b = Prompt::of_chat(loose.as_bytes());
    assert_eq!(a.segments(), 1);
    assert!(same(&a, &b), "{a:?} vs {b:?}");
}

#[test]
fn what_a_template_reads_does_count() {
    let base = prompt(&chat(json!([{"role": "user", "content": "hi"}])));
    for other in [
        json!([{"role": "user", "content": "hi "}]),
        json!([{"role": "assistant", "content": "hi"}]),
        json!([{"role": "user", "content": ["hi"]}]),
        json!([{"role": "user", "content": "hi", "name": "x"}]),
        json!([{"role": "user", "content": null}]),
        json!([{"role": "user", "content": 1}]),
        json!([{"role": "user", "content": 1.5}]),
        json!([{"role": "user", "content": true}]),
    ] {
        assert_ne!(base.chain(), prompt(&chat(other.clone())).chain(), "{other}");
    }
    // A value's kind counts: the string "1" is not the number 1, an array not an object.
    assert_ne!(prompt(&chat(json!([{"c": "1"}]))).chain(), prompt(&chat(json!([{"c": 1}]))).chain());
    assert_ne!(prompt(&chat(json!([{"c": []}]))).chain(), prompt(&chat(json!([{"c": {}}]))).chain());
    // Array order counts; member order does not.
    assert_ne!(prompt(&chat(json!([["a", "b"]]))).chain(), prompt(&chat(json!([["b", "a"]]))).chain());
}

#[test]
fn a_later_turn_extends_the_chain() {
    let turn1 = json!([{"role": "system", "content": "S"}, {"role": "user", "content": "U1"}]);
    let turn2 = json!([{"role": "system", "content": "S"}, {"role": "user", "content": "U1"},
                       {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"}]);
    let (a, b) = (prompt(&chat(turn1)), prompt(&chat(turn2)));
    assert_eq!(&b.chain()[..2], a.chain());
    assert_eq!(b.bytes_of(2), a.bytes());
    assert!(b.bytes() > a.bytes());
    assert_eq!(a.conversation_key(), b.conversation_key(), "the opening is the same on every turn");
    let other = prompt(&chat(json!([{"role": "system", "content": "S"}, {"role": "user", "content": "V1"}])));
    assert_eq!(other.chain()[0], a.chain()[0]);
    assert_ne!(other.chain()[1], a.chain()[1]);
    assert_ne!(other.conversation_key(), a.conversation_key(), "another conversation with the same system prompt");
}

#[test]
fn a_different_segment_changes_every_hash_after_it() {
    let a = prompt(&chat(json!([{"content": "1"}, {"content": "2"}, {"content": "3"}])));
    let b = prompt(&chat(json!([{"content": "1"}, {"content": "X"}, {"content": "3"}])));
    assert_eq!(a.chain()[0], b.chain()[0]);
    assert_ne!(a.chain()[1], b.chain()[1]);
    assert_ne!(a.chain()[2], b.chain()[2], "chained: the third segment's hash includes the second");
}

#[test]
fn the_conversation_key_ends_before_the_first_assistant_message() {
    // Codex's opening: two developer messages and two user ones, then the turns.
    let opening = json!([{"role": "developer", "content": "D1"}, {"role": "developer", "content": "D2"},
                         {"role": "user", "content": "env"}, {"role": "user", "content": "task"}]);
    let mut later = opening.as_array().expect("array").clone();
    later.push(json!({"role": "assistant", "content": null, "tool_calls": []}));
    later.push(json!({"role": "tool", "content": "out"}));
    let (a, b) = (prompt(&chat(opening)), prompt(&chat(Value::Array(later))));
    assert_eq!(a.conversation_key(), b.conversation_key());
    assert_eq!(a.conversation_key(), a.chain()[3]);
    // A nested "role": "assistant" is not the message's role.
    let nested = prompt(&chat(json!([{"role": "user", "content": {"role": "assistant"}}, {"role": "user"}])));
    assert_eq!(nested.conversation_key(), nested.chain()[1]);
    // An assistant first: the first two segments.
    let first = prompt(&chat(json!([{"role": "assistant", "content": "a"}, {"role": "user"}, {"role": "user"}])));
    assert_eq!(first.conversation_key(), first.chain()[1]);
    assert_eq!(Prompt::default().conversation_key(), 0);
}

#[test]
fn a_completions_prompt_is_cut_in_pieces() {
    let text = "x".repeat(TEXT_PIECE * 2 + 10);
    let p = prompt(&json!({"model": "m", "prompt": text}));
    assert_eq!(p.segments(), 3);
    assert_eq!(p.bytes(), text.len() as u64);
    assert!(same(&p, &Prompt::of_text(&text)));
    assert_eq!(p.conversation_key(), p.chain()[1]);
    // A token array: one segment.
    assert_eq!(prompt(&json!({"prompt": [1, 2, 3]})).segments(), 1);
}

#[test]
fn what_is_not_a_request_gives_the_empty_prompt() {
    for body in [&b"not json"[..], b"[1, 2]", b"{\"messages\": 3}", b"", b"{\"messages\": [1,"] {
        assert_eq!(Prompt::of_chat(body), Prompt::default(), "{}", String::from_utf8_lossy(body));
    }
    assert_eq!(Prompt::of_chat(b"{\"messages\": null}").segments(), 0);
    assert_eq!(Prompt::of_chat(b"{\"model\": \"m\"}").segments(), 0);
}

#[test]
fn at_most_max_segments_are_hashed_the_rest_still_counts_in_the_size() {
    let messages: Vec<Value> =
        (0..MAX_SEGMENTS + 10).map(|i| json!({"role": "user", "content": i.to_string()})).collect();
    let p = prompt(&chat(Value::Array(messages)));
    assert_eq!(p.segments(), MAX_SEGMENTS);
    assert!(p.bytes() > p.bytes_of(MAX_SEGMENTS));
    assert_eq!(p.segments_within(p.bytes() as f64), MAX_SEGMENTS);
}

/// The recorded agents' requests: compact (as sent) or pretty-printed, the same prompt; Codex's
/// two requests (of two runs) share their opening messages and tools.
#[test]
fn recorded_agent_requests_read_alike_compact_or_pretty() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/agents");
    for file in ["opencode-chat.json", "qwen-code-chat.json", "claude-code-messages.json", "codex-responses.json"] {
        let pretty = std::fs::read(dir.join(file)).expect("read");
        let mut value: Value = serde_json::from_slice(&pretty).expect("json");
        if let Some(body) = value.get("body") {
            value = body.clone();
        }
        if let Some(input) = value.as_object_mut().and_then(|o| o.remove("input")) {
            // A Responses body: its items as messages, enough for the bytes' sake.
            value["messages"] = input;
        }
        let compact = serde_json::to_vec(&value).expect("encodes");
        let pretty = serde_json::to_vec_pretty(&value).expect("encodes");
        let (a, b) = (Prompt::of_chat(&compact), Prompt::of_chat(&pretty));
        assert!(a.segments() >= 3, "{file}: {} segments", a.segments());
        assert!(same(&a, &b), "{file}");
        // The sizes are the decoded text's, near the compact body's length.
        let ratio = a.bytes() as f64 / compact.len() as f64;
        assert!((0.8..1.05).contains(&ratio), "{file}: {ratio}");
    }
    let turn = |file: &str| {
        let mut v: Value = serde_json::from_slice(&std::fs::read(dir.join(file)).expect("read")).expect("json");
        let input = v.as_object_mut().and_then(|o| o.remove("input")).expect("input");
        v["messages"] = input;
        prompt(&v)
    };
    let (one, two) = (turn("codex-responses.json"), turn("codex-responses-turn2.json"));
    // tools + three opening messages alike; the task differs (two runs).
    assert_eq!(one.chain()[..4], two.chain()[..4]);
    assert_ne!(one.chain()[4], two.chain()[4]);
}

proptest! {
    /// Equal hashes at `i` if and only if equal prefixes up to `i`.
    #[test]
    fn equal_chain_at_i_iff_equal_prefix(
        a in proptest::collection::vec(0u8..4, 0..12),
        b in proptest::collection::vec(0u8..4, 0..12),
    ) {
        let p = |m: &[u8]| prompt(&chat(Value::Array(m.iter().map(|c| json!({"content": c})).collect())));
        let (pa, pb) = (p(&a), p(&b));
        for i in 0..a.len().min(b.len()) {
            prop_assert_eq!(pa.chain()[i] == pb.chain()[i], a[..=i] == b[..=i]);
        }
        prop_assert!(pa.bytes_of(pa.segments()) == pa.bytes());
    }

    /// Sizes grow with the segments; `segments_within` inverts `bytes_of`.
    #[test]
    fn sizes_are_cumulative(texts in proptest::collection::vec(".{0,40}", 0..10)) {
        let p = prompt(&chat(Value::Array(texts.iter().map(|t| json!({"content": t})).collect())));
        for i in 0..p.segments() {
            prop_assert!(p.bytes_of(i) < p.bytes_of(i + 1));
            prop_assert_eq!(p.segments_within(p.bytes_of(i + 1) as f64), i + 1);
        }
    }
}

/// A figure, not a check: how long reading a 200 KB agent body takes next to parsing it into a
/// `serde_json::Value` (run by hand: `cargo test --release --lib balance::prompt::tests::timing
/// -- --ignored --nocapture`).
#[test]
#[ignore = "a timing figure, run by hand in release mode; timing is not a test"]
fn timing() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/agents");
    let one: Value =
        serde_json::from_slice(&std::fs::read(dir.join("qwen-code-chat.json")).expect("read")).expect("json");
    let mut body = one.clone();
    // Grow it to ~200 KB of turns, as a long agent conversation.
    let turns: Vec<Value> = one["messages"].as_array().expect("messages").clone();
    while serde_json::to_vec(&body).expect("encodes").len() < 200_000 {
        let messages = body["messages"].as_array_mut().expect("messages");
        messages.extend(turns[1..].iter().cloned());
    }
    let bytes = serde_json::to_vec(&body).expect("encodes");
    let rounds = 200;
    let start = std::time::Instant::now();
    let mut segments = 0;
    for _ in 0..rounds {
        segments += Prompt::of_chat(std::hint::black_box(&bytes)).segments();
    }
    let ours = start.elapsed() / rounds;
    let start = std::time::Instant::now();
    for _ in 0..rounds {
        let v: Value = serde_json::from_slice(std::hint::black_box(&bytes)).expect("json");
        std::hint::black_box(v);
    }
    let value = start.elapsed() / rounds;
    println!(
        "{} bytes, {} segments: Prompt::of_chat {:?} ({:.2} GB/s), serde_json::Value {:?}: ratio {:.2}",
        bytes.len(),
        segments / rounds as usize,
        ours,
        bytes.len() as f64 / ours.as_secs_f64() / 1e9,
        value,
        ours.as_secs_f64() / value.as_secs_f64()
    );
}
