//! The answer's translation fed recorded chat streams: the servers' usage placements, tool-call
//! deltas with `index` and arguments in pieces, several calls, calls sent whole, reasoning,
//! a cut by the token limit, error events and a stream that stops.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::*;
use crate::api::responses::request::{Echo, Shape, ToolKind};

fn shape() -> Shape {
    let tools = HashMap::from([
        ("shell".to_string(), ToolKind::Function),
        ("get_weather".to_string(), ToolKind::Function),
        ("apply_patch".to_string(), ToolKind::Custom),
        ("local_shell".to_string(), ToolKind::LocalShell),
    ]);
    Shape {
        model: "qwen".into(),
        tools,
        namespaces: HashMap::from([("close_agent".to_string(), "multi_agent_v1".to_string())]),
        echo: Echo::default(),
    }
}

/// The events (`data` as JSON) the translation sends for a chat stream's events, checking on
/// the way that each has its `event:` line equal to its `type`.
fn run(chat: &[Value]) -> Vec<Value> {
    let mut translator = Translator::new(shape());
    let mut bytes = translator.start().to_vec();
    for event in chat {
        let data = match event {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        bytes.extend_from_slice(&translator.chat_event(&data));
    }
    bytes.extend_from_slice(&translator.end());
    parse(&bytes)
}

fn parse(bytes: &[u8]) -> Vec<Value> {
    let text = String::from_utf8(bytes.to_vec()).expect("utf-8");
    text.split("\n\n")
        .filter(|block| !block.is_empty())
        .map(|block| {
            let mut lines = block.lines();
            let name = lines.next().and_then(|l| l.strip_prefix("event: ")).expect("event line");
            let data = lines.next().and_then(|l| l.strip_prefix("data: ")).expect("data line");
            let value: Value = serde_json::from_str(data).expect("json");
            assert_eq!(value["type"], name, "{block}");
            value
        })
        .collect()
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().expect("type")).collect()
}

/// Sequence numbers run 0, 1, 2, … in order, and every event names the response's model.
fn check_sequence(events: &[Value]) {
    for (n, event) in events.iter().enumerate() {
        assert_eq!(event["sequence_number"], n, "{event}");
        if let Some(response) = event.get("response") {
            assert_eq!(response["model"], "qwen");
        }
    }
}

fn delta(content: Value) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "/path/tiny",
           "choices": [{"index": 0, "delta": content, "finish_reason": null}]})
}

fn finish(reason: &str, usage: Option<Value>) -> Value {
    let mut chunk = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]});
    if let Some(usage) = usage {
        chunk["usage"] = usage;
    }
    chunk
}

fn usage(prompt: u64, completion: u64, cached: Option<u64>) -> Value {
    let mut usage =
        json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion});
    if let Some(cached) = cached {
        usage["prompt_tokens_details"] = json!({"cached_tokens": cached});
    }
    usage
}

fn usage_only(usage: Value) -> Value {
    json!({"choices": [], "usage": usage})
}

#[test]
fn a_text_answer_is_the_full_event_sequence_with_usage_and_cached_tokens() {
    // mlx_lm.server: role on every delta, a usage chunk with `choices: []`, then [DONE].
    let events = run(&[
        delta(json!({"role": "assistant", "content": "Hel"})),
        delta(json!({"role": "assistant", "content": "lo"})),
        finish("stop", None),
        usage_only(usage(12, 2, Some(8))),
        Value::from("[DONE]"),
    ]);
    check_sequence(&events);
    assert_eq!(
        types(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    assert_eq!(events[0]["response"]["status"], "in_progress");
    assert_eq!(events[0]["response"]["output"], json!([]));
    assert_eq!(events[4]["delta"], "Hel");
    assert_eq!(events[6]["text"], "Hello");
    let item = &events[8]["item"];
    assert_eq!(item["type"], "message");
    assert_eq!(item["status"], "completed");
    assert_eq!(item["content"][0]["text"], "Hello");
    let response = &events[9]["response"];
    assert_eq!(response["status"], "completed");
    assert_eq!(response["output"][0], *item);
    assert_eq!(response["id"], events[0]["response"]["id"]);
    assert_eq!(
        response["usage"],
        json!({"input_tokens": 12, "input_tokens_details": {"cached_tokens": 8, "cache_write_tokens": 0},
               "output_tokens": 2, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 14})
    );
    // Every item event names the same item and output index.
    for event in &events[2..9] {
        assert_eq!(event["output_index"], 0);
    }
}

#[test]
fn usage_is_taken_wherever_the_server_puts_it_the_last_one_winning() {
    // mlx-openai-server: on the finish chunk; vllm-mlx: there and again in a usage-only chunk.
    let on_finish = run(&[delta(json!({"content": "a"})), finish("stop", Some(usage(5, 1, None))), "[DONE]".into()]);
    assert_eq!(on_finish.last().expect("last")["response"]["usage"]["input_tokens"], 5);
    let twice = run(&[
        delta(json!({"content": "a"})),
        finish("stop", Some(usage(5, 1, None))),
        usage_only(usage(5, 2, None)),
        "[DONE]".into(),
    ]);
    let completed = &twice.last().expect("last")["response"];
    assert_eq!(completed["usage"]["output_tokens"], 2);
    assert_eq!(completed["usage"]["input_tokens_details"]["cached_tokens"], 0);
    // No usage at all (a backend that refuses stream_options): `usage: null`.
    let none = run(&[delta(json!({"content": "a"})), finish("stop", None), "[DONE]".into()]);
    assert_eq!(none.last().expect("last")["response"]["usage"], Value::Null);
    // Without [DONE] (the stream just ends after its finish): completed at the end.
    let no_done = run(&[delta(json!({"content": "a"})), finish("stop", Some(usage(3, 1, None)))]);
    assert_eq!(types(&no_done).last(), Some(&"response.completed"));
}

#[test]
fn tool_call_deltas_with_index_and_arguments_in_pieces_become_function_call_items() {
    // vLLM-style: each call announced with its id and name, its arguments in pieces, two calls.
    let events = run(&[
        delta(json!({"role": "assistant", "content": "Let me check."})),
        delta(json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                     "function": {"name": "get_weather", "arguments": ""}}]})),
        delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": "}}]})),
        delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]})),
        delta(json!({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                                     "function": {"name": "shell", "arguments": "{\"command\""}}]})),
        delta(json!({"tool_calls": [{"index": 1, "function": {"arguments": ": [\"ls\"]}"}}]})),
        finish("tool_calls", Some(usage(40, 20, Some(0)))),
        "[DONE]".into(),
    ]);
    check_sequence(&events);
    let kinds = types(&events);
    // The message closes when the first call begins.
    let message_done = kinds.iter().position(|t| *t == "response.output_item.done").expect("message done");
    let first_call = kinds.iter().rposition(|t| *t == "response.output_item.added").expect("call added");
    assert!(message_done < first_call, "{kinds:?}");
    let argument_deltas: Vec<(&Value, &Value)> = events
        .iter()
        .filter(|e| e["type"] == "response.function_call_arguments.delta")
        .map(|e| (&e["output_index"], &e["delta"]))
        .collect();
    assert_eq!(
        argument_deltas,
        [
            (&json!(1), &json!("{\"city\": ")),
            (&json!(1), &json!("\"Paris\"}")),
            (&json!(2), &json!("{\"command\"")),
            (&json!(2), &json!(": [\"ls\"]}"))
        ]
    );
    let done: Vec<&Value> =
        events.iter().filter(|e| e["type"] == "response.output_item.done").map(|e| &e["item"]).collect();
    assert_eq!(done.len(), 3);
    assert_eq!(done[1]["type"], "function_call");
    assert_eq!(done[1]["name"], "get_weather");
    assert_eq!(done[1]["arguments"], "{\"city\": \"Paris\"}");
    assert_eq!(done[2]["name"], "shell");
    assert_eq!(done[2]["arguments"], "{\"command\": [\"ls\"]}");
    assert_eq!(done[2]["status"], "completed");
    // Call ids are the gateway's own, distinct, and the same from added to done.
    assert_ne!(done[1]["call_id"], done[2]["call_id"]);
    assert!(done[1]["call_id"].as_str().is_some_and(|id| id.starts_with("call_")));
    let added: Vec<&Value> =
        events.iter().filter(|e| e["type"] == "response.output_item.added").map(|e| &e["item"]).collect();
    assert_eq!(added[1]["call_id"], done[1]["call_id"]);
    assert_eq!(added[1]["arguments"], "");
    let arguments_done: Vec<&Value> =
        events.iter().filter(|e| e["type"] == "response.function_call_arguments.done").collect();
    assert_eq!(arguments_done[0]["arguments"], "{\"city\": \"Paris\"}");
    let completed = &events.last().expect("last")["response"];
    assert_eq!(completed["status"], "completed");
    assert_eq!(completed["output"].as_array().map(Vec::len), Some(3));
}

#[test]
fn calls_sent_whole_without_index_are_one_item_each() {
    // mlx-omni-server (and the simulator): the calls whole in the finish chunk, no `index`.
    let events = run(&[
        delta(json!({"role": "assistant"})),
        json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "delta": {"tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
            {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": {"command": ["pwd"]}}},
            {"id": "call_2", "type": "function", "function": {"name": "close_agent", "arguments": "{}"}}]}}]}),
        "[DONE]".into(),
    ]);
    check_sequence(&events);
    let done: Vec<&Value> =
        events.iter().filter(|e| e["type"] == "response.output_item.done").map(|e| &e["item"]).collect();
    assert_eq!(done.len(), 3);
    assert_eq!(done[0]["arguments"], "{\"city\": \"Paris\"}");
    // A namespace's function goes back naming its namespace; the others name none.
    assert_eq!(done[2]["namespace"], "multi_agent_v1");
    assert!(done[0].get("namespace").is_none());
    // Arguments given as an object are passed on as their JSON text.
    assert_eq!(done[1]["arguments"], "{\"command\":[\"pwd\"]}");
    assert_eq!(types(&events).last(), Some(&"response.completed"));
}

#[test]
fn arguments_before_the_name_wait_for_it() {
    let events = run(&[
        delta(json!({"tool_calls": [{"index": 0, "id": "x", "function": {"arguments": "{\"a\""}}]})),
        delta(json!({"tool_calls": [{"index": 0, "function": {"name": "shell", "arguments": ":1}"}}]})),
        finish("tool_calls", None),
    ]);
    check_sequence(&events);
    let added = events.iter().find(|e| e["type"] == "response.output_item.added").expect("added");
    assert_eq!(added["item"]["name"], "shell");
    let deltas: Vec<&Value> =
        events.iter().filter(|e| e["type"] == "response.function_call_arguments.delta").map(|e| &e["delta"]).collect();
    assert_eq!(deltas, [&json!("{\"a\":1}")]);
}

#[test]
fn a_custom_tool_call_is_a_custom_tool_call_item_with_its_input() {
    let patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch";
    let arguments = json!({"input": patch}).to_string();
    let (head, tail) = arguments.split_at(10);
    let events = run(&[
        delta(json!({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "apply_patch", "arguments": head}}]})),
        delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": tail}}]})),
        finish("tool_calls", Some(usage(9, 9, None))),
        "[DONE]".into(),
    ]);
    check_sequence(&events);
    // Its input is not JSON arguments: no function_call_arguments events.
    assert!(!types(&events).iter().any(|t| t.starts_with("response.function_call_arguments")));
    let input_done = events.iter().find(|e| e["type"] == "response.custom_tool_call_input.done").expect("done");
    assert_eq!(input_done["input"], patch);
    let item = &events.iter().find(|e| e["type"] == "response.output_item.done").expect("item")["item"];
    assert_eq!(item["type"], "custom_tool_call");
    assert_eq!(item["name"], "apply_patch");
    assert_eq!(item["input"], patch);
    // A model that wrote the input itself, not as `{"input": …}`: passed on as it is.
    assert_eq!(custom_input("*** Begin Patch"), "*** Begin Patch");
    assert_eq!(custom_input("{\"patch\": \"p\"}"), "p");
}

#[test]
fn a_local_shell_call_is_a_local_shell_call_item_with_its_action() {
    let events = run(&[
        delta(json!({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "local_shell",
            "arguments": "{\"command\": [\"ls\", \"-l\"], \"workdir\": \"/tmp\"}"}}]})),
        finish("tool_calls", None),
        "[DONE]".into(),
    ]);
    let item = &events.iter().find(|e| e["type"] == "response.output_item.done").expect("item")["item"];
    assert_eq!(item["type"], "local_shell_call");
    assert_eq!(item["action"]["command"], json!(["ls", "-l"]));
    assert_eq!(item["action"]["working_directory"], "/tmp");
    assert_eq!(item["action"]["type"], "exec");
}

#[test]
fn reasoning_deltas_are_a_reasoning_item_before_the_message() {
    // mlx-vlm sends the same text in `reasoning_content` and `reasoning`: taken once.
    let events = run(&[
        delta(json!({"reasoning_content": "think", "reasoning": "think"})),
        delta(json!({"reasoning": "ing"})),
        delta(json!({"content": "Answer"})),
        finish("stop", None),
        "[DONE]".into(),
    ]);
    check_sequence(&events);
    assert_eq!(
        types(&events)[2..],
        [
            "response.output_item.added",
            "response.content_part.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let reasoning = &events[8]["item"];
    assert_eq!(reasoning["type"], "reasoning");
    assert_eq!(reasoning["content"], json!([{"type": "reasoning_text", "text": "thinking"}]));
    assert_eq!(reasoning["summary"], json!([]));
    assert_eq!(events[9]["output_index"], 1);
}

#[test]
fn an_answer_cut_by_its_token_limit_completes_with_status_incomplete() {
    let events = run(&[
        delta(json!({"content": "a long"})),
        finish("length", None),
        usage_only(usage(10, 2, None)),
        "[DONE]".into(),
    ]);
    check_sequence(&events);
    // Not `response.incomplete`: Codex fails a turn on it.
    assert!(!types(&events).contains(&"response.incomplete"));
    let item = &events.iter().find(|e| e["type"] == "response.output_item.done").expect("item")["item"];
    assert_eq!(item["status"], "incomplete");
    let last = events.last().expect("last");
    assert_eq!(last["type"], "response.completed");
    assert_eq!(last["response"]["status"], "incomplete");
    assert_eq!(last["response"]["incomplete_details"], json!({"reason": "max_output_tokens"}));
    assert_eq!(last["response"]["usage"]["output_tokens"], 2);
}

#[test]
fn an_error_event_mid_stream_is_response_failed_and_ends_the_answer() {
    // mlx-openai-server: an error event, then a normal stop and [DONE], which change nothing.
    let events = run(&[
        delta(json!({"content": "par"})),
        json!({"error": {"message": "Backend `local` failed: the stream broke", "type": "backend_error",
                         "code": "backend_error"}}),
        finish("stop", None),
        "[DONE]".into(),
    ]);
    check_sequence(&events);
    let kinds = types(&events);
    assert_eq!(kinds.last(), Some(&"response.failed"));
    assert_eq!(kinds.iter().filter(|t| t.starts_with("response.failed")).count(), 1);
    assert!(!kinds.contains(&"response.completed"));
    let response = &events.last().expect("last")["response"];
    assert_eq!(response["status"], "failed");
    assert_eq!(response["error"]["code"], "server_error");
    assert_eq!(response["error"]["message"], "Backend `local` failed: the stream broke");
    // No request id in the event: none in the error.
    assert!(response["error"].get("request_id").is_none(), "{response}");
    // A string error (some servers) is its own message.
    let events = run(&[json!({"error": "out of memory"})]);
    assert_eq!(events.last().expect("last")["response"]["error"]["message"], "out of memory");
}

#[test]
fn a_stream_that_stops_before_its_finish_fails() {
    let events = run(&[delta(json!({"content": "par"}))]);
    check_sequence(&events);
    let last = events.last().expect("last");
    assert_eq!(last["type"], "response.failed");
    // The answer so far is in the failed response's output, with its text, marked incomplete.
    assert_eq!(last["response"]["output"][0]["status"], "incomplete");
    assert_eq!(last["response"]["output"][0]["content"][0]["text"], "par");
    // An empty stream too.
    assert_eq!(types(&run(&[])), ["response.created", "response.in_progress", "response.failed"]);
}

#[test]
fn keepalives_role_chunks_and_odd_lines_emit_nothing() {
    let events = run(&[
        json!({"id": "chatcmpl-keepalive", "choices": [{"index": 0, "delta": {"content": ""}}]}),
        delta(json!({"role": "assistant"})),
        "not json".into(),
        delta(json!({"content": "x"})),
        finish("stop", None),
        "[DONE]".into(),
    ]);
    check_sequence(&events);
    assert_eq!(events.iter().filter(|e| e["type"] == "response.output_item.added").count(), 1);
}

#[test]
fn a_whole_completion_is_one_response_object() {
    let completion = json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "/path/on/disk",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "Checking.", "reasoning_content": "hmm",
            "tool_calls": [{"id": "call_0", "type": "function",
                            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}}],
        "usage": {"prompt_tokens": 30, "completion_tokens": 7, "total_tokens": 37,
                  "prompt_tokens_details": {"cached_tokens": 16}}
    });
    let response = whole(shape(), completion.to_string().as_bytes()).expect("a completion");
    assert_eq!(response["object"], "response");
    assert_eq!(response["status"], "completed");
    assert_eq!(response["model"], "qwen");
    let output = response["output"].as_array().expect("output");
    let kinds: Vec<&Value> = output.iter().map(|i| &i["type"]).collect();
    assert_eq!(kinds, [&json!("reasoning"), &json!("message"), &json!("function_call")]);
    assert_eq!(output[1]["content"][0]["text"], "Checking.");
    assert_eq!(output[2]["arguments"], "{\"city\":\"Paris\"}");
    assert!(output.iter().all(|i| i["status"] == "completed"));
    assert_eq!(response["usage"]["input_tokens_details"]["cached_tokens"], 16);
    assert_eq!(response["usage"]["total_tokens"], 37);

    let cut = json!({"choices": [{"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": "ab"}}],
                     "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}});
    let response = whole(shape(), cut.to_string().as_bytes()).expect("a completion");
    assert_eq!(response["status"], "incomplete");
    assert_eq!(response["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(response["output"][0]["status"], "incomplete");

    assert!(whole(shape(), b"{\"data\": []}").is_none());
    assert!(whole(shape(), b"not json").is_none());
}

#[test]
fn calls_without_index_or_id_continue_the_last_one_or_are_new_in_the_same_chunk() {
    let events = run(&[
        delta(json!({"tool_calls": [{"function": {"name": "shell", "arguments": "{\"a\""}}]})),
        delta(json!({"tool_calls": [{"function": {"arguments": ":1}"}}]})),
        delta(
            json!({"tool_calls": [{"function": {"arguments": ""}}, {"function": {"name": "get_weather", "arguments": "{}"}}]}),
        ),
        finish("tool_calls", None),
    ]);
    check_sequence(&events);
    let done: Vec<Value> =
        events.iter().filter(|e| e["type"] == "response.output_item.done").map(|e| e["item"].clone()).collect();
    assert_eq!(done.len(), 2);
    assert_eq!(done[0]["arguments"], "{\"a\":1}");
    assert_eq!(done[1]["name"], "get_weather");
}

#[test]
fn the_meter_s_error_event_gives_its_request_id_and_type_to_response_failed() {
    let events = run(&[
        delta(json!({"content": "par"})),
        delta(json!({"content": "tial"})),
        json!({"error": {"message": "Backend `local` failed: cut", "type": "backend_error", "param": null,
                         "code": "backend_failed", "request_id": "req_7"}}),
    ]);
    check_sequence(&events);
    let response = &events.last().expect("last")["response"];
    assert_eq!(response["status"], "failed");
    assert_eq!(
        response["error"],
        json!({"code": "server_error", "message": "Backend `local` failed: cut", "type": "backend_error",
               "request_id": "req_7"})
    );
    // The text already streamed is in the output, not an empty message.
    assert_eq!(
        response["output"][0]["content"],
        json!([{"type": "output_text", "text": "partial", "annotations": [], "logprobs": []}])
    );
    assert_eq!(response["output"][0]["status"], "incomplete");
    // A rate limit keeps its code (one of the Responses API's).
    let events = run(&[json!({"error": {"message": "slow down", "type": "requests", "code": "rate_limit_exceeded"}})]);
    assert_eq!(events.last().expect("last")["response"]["error"]["code"], "rate_limit_exceeded");
}

/// The done items' `[name, arguments]`, in order.
fn named_calls(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e["type"] == "response.output_item.done")
        .map(|e| json!([e["item"]["name"], e["item"]["arguments"]]))
        .collect()
}

#[test]
fn whole_calls_in_separate_chunks_without_index_or_id_are_separate_items() {
    let call =
        |name: &str, arguments: &str| json!({"type": "function", "function": {"name": name, "arguments": arguments}});
    let events = run(&[
        delta(json!({"role": "assistant", "tool_calls": [call("read", "{\"p\":1}")]})),
        delta(json!({"tool_calls": [call("write", "{\"q\":2}")]})),
        finish("tool_calls", None),
        "[DONE]".into(),
    ]);
    check_sequence(&events);
    assert_eq!(named_calls(&events), [json!(["read", "{\"p\":1}"]), json!(["write", "{\"q\":2}"])]);
}

#[test]
fn a_repeated_backend_id_with_a_new_name_is_a_new_call_streamed_or_whole() {
    let call = |name: &str, arguments: &str| json!({"id": "call_0", "type": "function", "function": {"name": name, "arguments": arguments}});
    // Streamed: each whole in its own chunk, then a piece for the latest call with that id.
    let events = run(&[
        delta(json!({"tool_calls": [call("read", "{\"p\":1}")]})),
        delta(json!({"tool_calls": [call("write", "{\"q\":")]})),
        delta(json!({"tool_calls": [{"id": "call_0", "function": {"arguments": "2}"}}]})),
        finish("tool_calls", None),
    ]);
    check_sequence(&events);
    assert_eq!(named_calls(&events), [json!(["read", "{\"p\":1}"]), json!(["write", "{\"q\":2}"])]);
    // Whole: both in the message.
    let completion = json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": null, "tool_calls": [call("read", "{\"p\":1}"), call("write", "{\"q\":2}")]}}]});
    let response = whole(shape(), completion.to_string().as_bytes()).expect("a completion");
    let output: Vec<Value> = response["output"]
        .as_array()
        .expect("output")
        .iter()
        .map(|item| json!([item["name"], item["arguments"]]))
        .collect();
    assert_eq!(output, [json!(["read", "{\"p\":1}"]), json!(["write", "{\"q\":2}"])]);
}

#[test]
fn mlx_lm_s_streamed_calls_still_continue_by_index() {
    // mlx_lm.server: each call whole with its index and id; a server streaming the name first,
    // then arguments in pieces under the same index, is one call.
    let events = run(&[
        delta(json!({"tool_calls": [{"index": 0, "id": "u1", "type": "function",
                                     "function": {"name": "read", "arguments": ""}}]})),
        delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"p\""}}]})),
        delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]})),
        delta(json!({"tool_calls": [{"index": 1, "id": "u2", "type": "function",
                                     "function": {"name": "read", "arguments": "{\"p\":2}"}}]})),
        finish("tool_calls", None),
    ]);
    check_sequence(&events);
    assert_eq!(named_calls(&events), [json!(["read", "{\"p\":1}"]), json!(["read", "{\"p\":2}"])]);
}

mod deltas {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// The per-chunk delta events, written directly, are byte for byte what the `Value`
        /// writing makes of them.
        #[test]
        fn a_delta_event_is_written_as_the_value_writing_writes_it(
            delta in "(?s).{0,12}", id in "[a-z_\"\\\\0-9]{0,8}", index in 0usize..20, sequence in 0..u64::MAX - 1,
            logprobs in any::<bool>(),
        ) {
            let mut translator = Translator::new(shape());
            translator.items.push(Item::new(id.clone(), Body::Message { text: String::new() }));
            translator.items.extend((1..=index).map(|i| Item::new(format!("x{i}"), Body::Message { text: String::new() })));
            let index = index.min(translator.items.len() - 1);
            let id = translator.items[index].id.clone();
            let kind = if logprobs { "response.output_text.delta" } else { "response.reasoning_text.delta" };
            let mut fields = json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta});
            if logprobs {
                fields["logprobs"] = json!([]);
            }
            translator.sequence = sequence;
            let mut by_value = Vec::new();
            translator.emit(&mut by_value, kind, fields);
            translator.sequence = sequence;
            let mut direct = Vec::new();
            translator.emit_delta(&mut direct, kind, index, &delta, logprobs);
            prop_assert_eq!(String::from_utf8_lossy(&direct), String::from_utf8_lossy(&by_value));
            prop_assert_eq!(translator.sequence, sequence + 1);
        }
    }
}
