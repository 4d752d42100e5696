//! The figures' tests, the frames run through the slicer as the meter runs them.

use super::*;
use crate::stream::forward::tests::{KEEPALIVE, ROLE, TOKEN, USAGE_ONLY, figures_of};

#[test]
fn role_keepalive_and_comments_are_not_tokens() {
    let (f, _) = figures_of(&[": keepalive 1/2\n\n", KEEPALIVE, ROLE], true);
    assert_eq!(f.first_token, None);
    assert_eq!(f.token_frames, 0);
}

#[test]
fn the_last_usage_wins_and_errors_are_failures() {
    let twice =
        "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"completion_tokens\":2}}\n\n";
    let (f, _) = figures_of(&[TOKEN, TOKEN, twice, USAGE_ONLY], true);
    assert_eq!(f.tokens(), Some(2), "counted once");
    let (f, _) = figures_of(&[TOKEN, "data: {\"error\":{\"message\":\"boom\"}}\n\n", twice, "data: [DONE]\n\n"], true);
    assert_eq!(f.error.as_deref(), Some("boom"));
}

#[test]
fn cached_tokens_come_from_the_last_usage_and_only_when_reported() {
    let usage = |cached: &str| {
        format!("data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":27,\"completion_tokens\":2{cached}}}}}\n\n")
    };
    let reported = usage(",\"prompt_tokens_details\":{\"cached_tokens\":26}");
    let (f, _) = figures_of(&[TOKEN, TOKEN, &reported, &reported, "data: [DONE]\n\n"], true);
    assert_eq!(f.cached_tokens, Some(26), "sent twice, counted once");
    let (f, _) = figures_of(&[TOKEN, &usage(",\"prompt_tokens_details\":{\"cached_tokens\":0}")], true);
    assert_eq!(f.cached_tokens, Some(0), "a reported miss is a figure");
    let (f, _) = figures_of(&[TOKEN, TOKEN, USAGE_ONLY, &usage(",\"prompt_tokens_details\":null")], true);
    assert_eq!(f.cached_tokens, None, "vllm-mlx reports none");
    let whole = br#"{"choices":[],"usage":{"prompt_tokens":138,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":137}}}"#;
    assert_eq!(figures_of_whole(whole).and_then(|f| f.cached_tokens), Some(137));
    let whole = figures_of_whole(br#"{"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":9}}"#);
    assert_eq!(whole.and_then(|f| f.cached_tokens), None);
}

#[test]
fn a_stream_is_complete_at_done_or_when_every_choice_has_finished() {
    let choice = |i: u32, finish: &str| {
        let reason = if finish.is_empty() { "null".to_string() } else { format!("\"{finish}\"") };
        format!(
            "data: {{\"choices\":[{{\"index\":{i},\"delta\":{{\"content\":\"x\"}},\"finish_reason\":{reason}}}]}}\n\n"
        )
    };
    let (f, _) = figures_of(&[&choice(0, ""), &choice(0, "stop")], true);
    assert!(f.complete(), "one choice, finished");
    let (f, _) = figures_of(&[&choice(0, ""), &choice(1, ""), &choice(0, "stop"), &choice(1, "")], true);
    assert!(!f.complete(), "choice 1 never finished (n=2, cut)");
    let (f, _) = figures_of(&[&choice(0, ""), &choice(1, ""), &choice(0, "stop"), &choice(1, "length")], true);
    assert!(f.complete());
    let (f, _) = figures_of(&[&choice(0, ""), "data: [DONE]\n\n"], true);
    assert!(f.complete(), "[DONE] ends it whatever the choices said");
    let (f, _) = figures_of(&[&choice(0, ""), USAGE_ONLY], true);
    assert!(!f.complete(), "usage alone is no end");
}

#[test]
fn a_burst_gives_no_decode_speed() {
    let (f, _) = figures_of(&[&[TOKEN, TOKEN, TOKEN, TOKEN].concat(), USAGE_ONLY], true);
    assert!(f.is_burst());
    assert_eq!(f.decode_tokens_per_second(), None);
    // One frame carrying all of usage's tokens is a burst; one frame of one token is not.
    let (f, _) = figures_of(&[TOKEN, USAGE_ONLY], true);
    assert_eq!((f.token_frames, f.tokens().is_some_and(|t| t >= 2)), (1, true), "{f:?}");
    assert!(f.is_burst());
    let one = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":1}}\n\n";
    let (f, _) = figures_of(&[TOKEN, one], true);
    assert_eq!(f.tokens(), Some(1));
    assert!(!f.is_burst(), "a one-token answer");
}

#[test]
fn usage_without_any_output_frame_is_a_mismatch() {
    let (f, _) = figures_of(&[ROLE, USAGE_ONLY], true);
    assert!(f.usage_mismatch());
    let whole = figures_of_whole(br#"{"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":9}}"#);
    assert_eq!(whole.and_then(|f| f.tokens()), Some(9));
    assert!(figures_of_whole(b"").is_none() && figures_of_whole(br#"{"id":"x"}"#).is_none());
    let (f, _) = figures_of(&[TOKEN, TOKEN, USAGE_ONLY], true);
    assert!(!f.usage_mismatch());
}

proptest::proptest! {
    /// Reading a whole answer's figures without parsing it into a value gives what reading the
    /// parsed value gives, whatever the answer holds.
    #[test]
    fn whole_answer_figures_need_no_parsed_value(
        choices in proptest::option::of(proptest::prop_oneof![
            proptest::strategy::Just("[]".to_string()),
            proptest::strategy::Just("[{\"index\":0,\"message\":{\"content\":\"hi\"}}]".to_string()),
            proptest::strategy::Just("{}".to_string()),
            proptest::strategy::Just("null".to_string()),
        ]),
        data in proptest::option::of(proptest::prop_oneof![
            proptest::strategy::Just("[]".to_string()), proptest::strategy::Just("3".to_string())]),
        counts in proptest::collection::vec(proptest::option::of(proptest::prop_oneof![
            proptest::strategy::Just("12".to_string()), proptest::strategy::Just("0".to_string()),
            proptest::strategy::Just("-3".to_string()), proptest::strategy::Just("1.5".to_string()),
            proptest::strategy::Just("1e2".to_string()), proptest::strategy::Just("null".to_string()),
            proptest::strategy::Just("\"7\"".to_string()),
            proptest::strategy::Just("18446744073709551615".to_string()),
            proptest::strategy::Just("18446744073709551616".to_string()),
        ]), 3),
        usage_kind in 0..5u8, details_kind in 0..4u8, duplicate in proptest::bool::ANY,
    ) {
        let mut fields = vec![r#""id":"x","model":"m""#.to_string()];
        if let Some(c) = &choices { fields.push(format!(r#""choices": {c}"#)); }
        if let Some(d) = &data { fields.push(format!(r#""data":{d}"#)); }
        let count = |i: usize, name: &str| counts[i].as_ref().map(|v| format!(r#""{name}":{v}"#));
        let details = match details_kind {
            0 => None,
            1 => Some(r#""prompt_tokens_details":null"#.to_string()),
            2 => Some(r#""prompt_tokens_details":[5]"#.to_string()),
            _ => Some(format!(r#""prompt_tokens_details":{{{}}}"#, count(2, "cached_tokens").unwrap_or_default())),
        };
        let inner: Vec<String> =
            [count(0, "prompt_tokens"), count(1, "completion_tokens"), details].into_iter().flatten().collect();
        match usage_kind {
            0 => {}
            1 => fields.push(r#""usage":null"#.to_string()),
            2 => fields.push(r#""usage":"none""#.to_string()),
            3 => fields.push(r#""usage":[12,7,null]"#.to_string()),
            _ => fields.push(format!(r#""usage":{{{}}}"#, inner.join(","))),
        }
        if duplicate { fields.push(r#""usage":{"prompt_tokens":99}"#.to_string()); }
        let body = format!("{{{}}}", fields.join(","));
        let fast = figures_of_whole(body.as_bytes());
        let parsed = serde_json::from_str::<Value>(&body).ok();
        let reference = parsed.as_ref().and_then(figures_of_value);
        let key = |f: Option<StreamFigures>| f.map(|f| (f.prompt_tokens, f.completion_tokens, f.cached_tokens));
        proptest::prop_assert_eq!(key(fast), key(reference), "{}", body);
    }
}
