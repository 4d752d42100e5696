//! The finish normalisations' tests: the bytes the client gets, the same in every split.

use serde_json::Value;

use super::*;
use crate::stream::forward::tests::{DONE, ROLE, TOKEN, normalised, same_for_every_split};

const OMNI_FINISH: &str =
    "data: {\"choices\": [{\"index\": 0, \"delta\": {\"role\": \"assistant\"}, \"finish_reason\": \"stop\"}]}\n\n";
const OMNI_FINISH_USAGE: &str = "data: {\"choices\": [{\"index\": 0, \"delta\": {\"role\": \"assistant\"}, \"finish_reason\": \"stop\"}], \"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": 2}}\n\n";

fn finish_reasons(sent: &str) -> Vec<(String, bool)> {
    sent.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            let reason = v["choices"][0]["finish_reason"].as_str()?.to_string();
            Some((reason, v["usage"].is_object()))
        })
        .collect()
}

/// `OMNI_FINISH_USAGE` as the usage-only chunk it amounts to.
const OMNI_USAGE_ONLY: &str = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n";

#[test]
fn a_repeated_finish_reaches_the_client_once_its_usage_when_asked() {
    let omni = StreamNormalise { single_finish: true, ..Default::default() };
    let chunks = [TOKEN, TOKEN, OMNI_FINISH, OMNI_FINISH_USAGE, DONE];
    let sent = same_for_every_split(omni, &chunks, true);
    assert_eq!(sent, [TOKEN, TOKEN, OMNI_FINISH, OMNI_USAGE_ONLY, DONE].concat(), "the first, then the usage");
    let sent = same_for_every_split(omni, &chunks, false);
    assert_eq!(sent, [TOKEN, TOKEN, OMNI_FINISH, DONE].concat(), "the first alone");
    let (f, _) = normalised(omni, &chunks, false);
    assert_eq!((f.tokens(), f.choices_finished.len()), (Some(2), 1), "usage read, one finish");
    // A finish that is not repeated goes on, before what follows it, and at the end.
    let sent = same_for_every_split(omni, &[TOKEN, OMNI_FINISH, DONE], true);
    assert_eq!(finish_reasons(&sent).len(), 1);
    assert!(sent.ends_with(DONE), "{sent}");
    let sent = same_for_every_split(omni, &[TOKEN, OMNI_FINISH], true);
    assert_eq!(finish_reasons(&sent).len(), 1, "{sent}");
    // Off: both go on.
    let (_, sent) = normalised(StreamNormalise::default(), &chunks, true);
    assert_eq!(sent, chunks.concat());
}

/// mlx-omni-server's tool answer: the tool call rides in the first finish chunk, the repeat
/// has only the role and the usage (the review's H1: the tool call was dropped).
const OMNI_TOOL_FINISH: &str = "data: {\"choices\": [{\"index\": 0, \"delta\": {\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": \"{}\"}}]}, \"finish_reason\": \"tool_calls\"}]}\n\n";

const OMNI_TOOL_REPEAT: &str = "data: {\"choices\": [{\"index\": 0, \"delta\": {\"role\": \"assistant\"}, \"finish_reason\": \"tool_calls\"}], \"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": 2}}\n\n";

#[test]
fn a_tool_call_in_the_first_finish_reaches_the_client_once() {
    let omni = StreamNormalise { length_at: Some(100), single_finish: true, ..Default::default() };
    let chunks = [ROLE, OMNI_TOOL_FINISH, OMNI_TOOL_REPEAT, DONE];
    let sent = same_for_every_split(omni, &chunks, true);
    assert_eq!(sent, [ROLE, OMNI_TOOL_FINISH, OMNI_USAGE_ONLY, DONE].concat());
    let sent = same_for_every_split(omni, &chunks, false);
    assert_eq!(sent, [ROLE, OMNI_TOOL_FINISH, DONE].concat());
    // Cut at max_tokens (usage 2 ≥ 2): the first finish is re-serialised, its tool call kept,
    // and a `tool_calls` finish stays what it is.
    let cut = StreamNormalise { length_at: Some(2), ..omni };
    let sent = same_for_every_split(cut, &chunks, true);
    assert_eq!(sent.matches("\"get_weather\"").count(), 1, "{sent}");
    assert_eq!(finish_reasons(&sent), [("tool_calls".to_string(), false)], "{sent}");
    assert!(sent.ends_with(&[OMNI_USAGE_ONLY, DONE].concat()), "{sent}");
}

#[test]
fn a_repeat_carrying_new_output_is_not_dropped() {
    let omni = StreamNormalise { single_finish: true, ..Default::default() };
    // Output in the repeat only: both go on, as they were.
    let chunks = [TOKEN, OMNI_FINISH, OMNI_TOOL_FINISH, DONE];
    for wants_usage in [true, false] {
        assert_eq!(same_for_every_split(omni, &chunks, wants_usage), chunks.concat());
    }
    // The same output in both: a true repeat, its choices dropped.
    let with_usage =
        OMNI_TOOL_FINISH.replacen("]}\n\n", "], \"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": 2}}\n\n", 1);
    let sent = same_for_every_split(omni, &[OMNI_TOOL_FINISH, &with_usage, DONE], true);
    assert_eq!(sent, [OMNI_TOOL_FINISH, OMNI_USAGE_ONLY, DONE].concat());
    // A repeat without usage or output: nothing.
    let sent = same_for_every_split(omni, &[TOKEN, OMNI_FINISH, OMNI_FINISH, DONE], true);
    assert_eq!(sent, [TOKEN, OMNI_FINISH, DONE].concat());
}

#[test]
fn stop_at_max_tokens_becomes_length_and_only_that_frame_changes() {
    let at = |n| StreamNormalise { length_at: Some(n), ..Default::default() };
    // mlx-openai-server: usage in the finish chunk.
    let finish = "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\",\"index\":0}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n";
    let sent = same_for_every_split(at(2), &[ROLE, TOKEN, TOKEN, finish, DONE], true);
    assert_eq!(finish_reasons(&sent), [("length".to_string(), true)]);
    assert!(sent.starts_with(&[ROLE, TOKEN, TOKEN].concat()) && sent.ends_with(DONE), "{sent}");
    let sent = same_for_every_split(at(3), &[ROLE, TOKEN, TOKEN, finish, DONE], true);
    assert_eq!(sent, [ROLE, TOKEN, TOKEN, finish, DONE].concat(), "not cut: untouched");
    // mlx-omni-server: the finish twice, usage in the second: the first says length (judged
    // on the second's usage), the usage follows it when asked for.
    let both = StreamNormalise { length_at: Some(2), single_finish: true, ..Default::default() };
    for wants_usage in [true, false] {
        let sent = same_for_every_split(both, &[TOKEN, TOKEN, OMNI_FINISH, OMNI_FINISH_USAGE, DONE], wants_usage);
        assert_eq!(finish_reasons(&sent), [("length".to_string(), false)], "{sent}");
        assert_eq!(sent.contains(OMNI_USAGE_ONLY), wants_usage, "{sent}");
    }
}

#[test]
fn a_whole_answer_at_max_tokens_says_length() {
    let whole = br#"{"choices":[{"index":0,"message":{"content":"x"},"finish_reason":"stop"}],"usage":{"completion_tokens":5}}"#;
    let mut value: Value = serde_json::from_slice(whole).expect("json");
    assert!(stop_to_length(&mut value));
    assert_eq!(value["choices"][0]["finish_reason"], "length");
    assert!(!stop_to_length(&mut value), "nothing left to change");
}
