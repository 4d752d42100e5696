//! The state machine's unit tests: the event sequence and its indices for text, thinking and
//! tool calls (in pieces, whole, several, unnamed at first, without arguments), stop reasons,
//! Anthropic's usage, errors, and the whole `message` object.

use serde_json::{Value, json};

use super::*;

fn shape() -> Shape {
    Shape { model: "claude-sonnet-4-5".into(), stop_sequences: vec!["END".into()], thinking: true }
}

/// The events of a chat stream whose `data` are `chunks`, parsed, with the sequence checked:
/// message_start first, blocks one at a time with their indices in order, every delta inside
/// its open block, message_delta then message_stop last (or an error last).
fn run(shape: Shape, chunks: &[Value]) -> Vec<Value> {
    let mut translator = Translator::new(shape);
    let mut out = translator.start().to_vec();
    for chunk in chunks {
        out.extend_from_slice(&translator.chat_event(&chunk.to_string()));
    }
    out.extend_from_slice(&translator.chat_event("[DONE]"));
    out.extend_from_slice(&translator.end());
    parse(&out)
}

fn parse(bytes: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(bytes).expect("utf-8");
    let events: Vec<Value> = text
        .split("\n\n")
        .filter(|b| !b.is_empty())
        .map(|block| {
            let mut lines = block.lines();
            let name = lines.next().and_then(|l| l.strip_prefix("event: ")).expect("event line");
            let data = lines.next().and_then(|l| l.strip_prefix("data: ")).expect("data line");
            let event: Value = serde_json::from_str(data).expect("json");
            assert_eq!(event["type"], name, "{text}");
            event
        })
        .collect();
    check_sequence(&events);
    events
}

fn check_sequence(events: &[Value]) {
    assert_eq!(events[0]["type"], "message_start");
    let mut open: Option<u64> = None;
    let mut next_index = 0;
    let mut ended = false;
    for event in &events[1..] {
        assert!(!ended, "nothing after the end: {events:?}");
        match event["type"].as_str().expect("type") {
            "content_block_start" => {
                assert_eq!(open, None, "one block open at a time");
                assert_eq!(event["index"], next_index);
                open = Some(next_index);
                next_index += 1;
            }
            "content_block_delta" => assert_eq!(event["index"].as_u64(), open, "a delta inside its block"),
            "content_block_stop" => {
                assert_eq!(event["index"].as_u64(), open);
                open = None;
            }
            "message_delta" => assert_eq!(open, None, "every block stopped first"),
            "message_stop" | "error" => ended = true,
            "ping" => {}
            other => panic!("unexpected event {other}"),
        }
    }
    assert!(ended, "the stream ends with message_stop or error: {events:?}");
}

fn types(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            let kind = e["type"].as_str().expect("type");
            match (e.pointer("/delta/type"), e.pointer("/content_block/type")) {
                (Some(Value::String(delta)), _) if kind == "content_block_delta" => format!("delta {delta}"),
                (_, Some(Value::String(block))) => format!("start {block}"),
                _ => kind.to_string(),
            }
        })
        .collect()
}

fn delta(content: Value) -> Value {
    json!({"choices": [{"index": 0, "delta": content}]})
}

fn finish(reason: &str) -> Value {
    json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
}

/// The client's rebuild of the stream: each block's text / thinking / JSON input concatenated.
fn rebuilt(events: &[Value]) -> Vec<Value> {
    let mut blocks: Vec<Value> = Vec::new();
    let mut json_text: Vec<String> = Vec::new();
    for event in events {
        match event["type"].as_str() {
            Some("content_block_start") => {
                blocks.push(event["content_block"].clone());
                json_text.push(String::new());
            }
            Some("content_block_delta") => {
                let at = event["index"].as_u64().expect("index") as usize;
                let d = &event["delta"];
                match d["type"].as_str() {
                    Some("text_delta") => {
                        let text = format!(
                            "{}{}",
                            blocks[at]["text"].as_str().unwrap_or(""),
                            d["text"].as_str().unwrap_or("")
                        );
                        blocks[at]["text"] = json!(text);
                    }
                    Some("thinking_delta") => {
                        let text = format!(
                            "{}{}",
                            blocks[at]["thinking"].as_str().unwrap_or(""),
                            d["thinking"].as_str().unwrap_or("")
                        );
                        blocks[at]["thinking"] = json!(text);
                    }
                    Some("signature_delta") => blocks[at]["signature"] = d["signature"].clone(),
                    Some("input_json_delta") => json_text[at].push_str(d["partial_json"].as_str().expect("piece")),
                    other => panic!("unknown delta {other:?}"),
                }
            }
            Some("content_block_stop") => {
                let at = event["index"].as_u64().expect("index") as usize;
                if blocks[at]["type"] == "tool_use" {
                    blocks[at]["input"] = serde_json::from_str(&json_text[at]).expect("valid JSON at the block's stop");
                }
            }
            _ => {}
        }
    }
    blocks
}

#[test]
fn a_text_answer_is_the_strict_sequence_with_anthropics_usage() {
    let events = run(
        shape(),
        &[
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            delta(json!({"content": "Hel"})),
            delta(json!({"content": "lo"})),
            finish("stop"),
            json!({"choices": [], "usage": {"prompt_tokens": 120, "completion_tokens": 2, "total_tokens": 122,
                   "prompt_tokens_details": {"cached_tokens": 100}}}),
        ],
    );
    assert_eq!(
        types(&events),
        [
            "message_start",
            "start text",
            "delta text_delta",
            "delta text_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let start = &events[0]["message"];
    assert_eq!(start["model"], "claude-sonnet-4-5");
    assert_eq!(start["content"], json!([]));
    assert_eq!(start["role"], "assistant");
    assert!(start["id"].as_str().is_some_and(|id| id.starts_with("msg_")));
    assert_eq!(start["usage"]["input_tokens"], 0);
    let end = &events[5];
    assert_eq!(end["delta"], json!({"stop_reason": "end_turn", "stop_sequence": null}));
    assert_eq!(
        end["usage"],
        json!({"input_tokens": 20, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 100, "output_tokens": 2})
    );
    assert_eq!(rebuilt(&events), [json!({"type": "text", "text": "Hello"})]);
}

#[test]
fn thinking_then_text_then_calls_in_pieces() {
    let events = run(
        shape(),
        &[
            delta(json!({"reasoning": "Let me "})),
            delta(json!({"reasoning": "see."})),
            delta(json!({"content": "Running it."})),
            delta(json!({"tool_calls": [{"index": 0, "id": "call_0", "type": "function",
                                         "function": {"name": "Bash", "arguments": ""}}]})),
            delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"command\": "}}]})),
            delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"ls\"}"}}]})),
            delta(
                json!({"tool_calls": [{"index": 1, "id": "call_1", "function": {"name": "Read", "arguments": "{\"path\""}}]}),
            ),
            delta(json!({"tool_calls": [{"index": 1, "function": {"arguments": ": \"a\"}"}}]})),
            finish("tool_calls"),
        ],
    );
    assert_eq!(
        types(&events),
        [
            "message_start",
            "start thinking",
            "delta thinking_delta",
            "delta thinking_delta",
            "delta signature_delta",
            "content_block_stop",
            "start text",
            "delta text_delta",
            "content_block_stop",
            "start tool_use",
            "delta input_json_delta",
            "delta input_json_delta",
            "content_block_stop",
            "start tool_use",
            "delta input_json_delta",
            "delta input_json_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    let blocks = rebuilt(&events);
    assert_eq!(blocks[0], json!({"type": "thinking", "thinking": "Let me see.", "signature": ""}));
    assert_eq!(blocks[2]["name"], "Bash");
    assert_eq!(blocks[2]["input"], json!({"command": "ls"}));
    assert_eq!(blocks[3]["input"], json!({"path": "a"}));
    let (one, two) = (blocks[2]["id"].as_str().expect("id"), blocks[3]["id"].as_str().expect("id"));
    assert!(one.starts_with("toolu_") && two.starts_with("toolu_") && one != two);
    assert_eq!(events[events.len() - 2]["delta"]["stop_reason"], "tool_use");
}

#[test]
fn whole_calls_without_index_a_call_without_arguments_and_a_call_named_late() {
    // mlx_lm.server: each call whole in one delta, no index; finish "tool_calls".
    let events = run(
        shape(),
        &[
            delta(json!({"tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "Bash", "arguments": "{\"command\":\"ls\"}"}},
                {"id": "b", "type": "function", "function": {"name": "Glob", "arguments": ""}},
            ]})),
            finish("tool_calls"),
        ],
    );
    let blocks = rebuilt(&events);
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[0]["input"], json!({"command": "ls"}));
    assert_eq!(blocks[1]["input"], json!({}), "no arguments streamed: {{}} before the stop");
    // Arguments before the name: held until the name comes, then streamed.
    let events = run(
        shape(),
        &[
            delta(json!({"content": "x"})),
            delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\":"}}]})),
            delta(json!({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "Bash", "arguments": "1}"}}]})),
            finish("stop"),
        ],
    );
    let blocks = rebuilt(&events);
    assert_eq!(blocks[1], json!({"type": "tool_use", "id": blocks[1]["id"], "name": "Bash", "input": {"a": 1}}));
    // Every call numbered 0 (each its own id and name): two calls, not one.
    let events = run(
        shape(),
        &[
            delta(
                json!({"tool_calls": [{"index": 0, "id": "x", "function": {"name": "Bash", "arguments": "{\"a\":1}"}}]}),
            ),
            delta(json!({"tool_calls": [{"index": 0, "id": "y", "function": {"name": "Read", "arguments": "{}"}}]})),
            finish("tool_calls"),
        ],
    );
    let names: Vec<Value> = rebuilt(&events).iter().map(|b| b["name"].clone()).collect();
    assert_eq!(names, [json!("Bash"), json!("Read")]);
    assert_eq!(events[events.len() - 2]["delta"]["stop_reason"], "tool_use", "a `stop` after calls");
}

#[test]
fn stop_reasons() {
    let reason = |chunks: &[Value], shape: Shape| {
        let events = run(shape, chunks);
        let end = events.iter().find(|e| e["type"] == "message_delta").expect("message_delta").clone();
        (end["delta"]["stop_reason"].clone(), end["delta"]["stop_sequence"].clone())
    };
    let text = delta(json!({"content": "x"}));
    assert_eq!(reason(&[text.clone(), finish("length")], shape()), (json!("max_tokens"), Value::Null));
    assert_eq!(reason(&[text.clone(), finish("content_filter")], shape()), (json!("refusal"), Value::Null));
    let on_stop = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": "END"}]});
    assert_eq!(reason(&[text.clone(), on_stop], shape()), (json!("stop_sequence"), json!("END")));
    // A stop string the client did not send (or an EOS token id): end_turn.
    let eos = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": 151645}]});
    assert_eq!(reason(&[text.clone(), eos], shape()), (json!("end_turn"), Value::Null));
    // [DONE] without a finish_reason: the answer is whole.
    assert_eq!(reason(&[text], shape()), (json!("end_turn"), Value::Null));
}

#[test]
fn reasoning_is_dropped_when_the_client_turned_thinking_off() {
    let off = Shape { thinking: false, ..shape() };
    let events =
        run(off, &[delta(json!({"reasoning_content": "hmm"})), delta(json!({"content": "ok"})), finish("stop")]);
    assert_eq!(rebuilt(&events), [json!({"type": "text", "text": "ok"})]);
}

#[test]
fn a_failure_mid_stream_is_an_error_event_and_nothing_follows() {
    let mut translator = Translator::new(shape());
    let mut out = translator.start().to_vec();
    out.extend_from_slice(&translator.chat_event(&delta(json!({"content": "par"})).to_string()));
    let failure = json!({"error": {"message": "Backend `b` failed: its answer broke", "type": "backend_error",
                                   "param": null, "code": "backend_error", "request_id": "req_7"}});
    out.extend_from_slice(&translator.chat_event(&failure.to_string()));
    // The backend's own finish and [DONE] after its error event (mlx-openai-server's habit).
    out.extend_from_slice(&translator.chat_event(&finish("stop").to_string()));
    out.extend_from_slice(&translator.chat_event("[DONE]"));
    out.extend_from_slice(&translator.end());
    let events = parse(&out);
    assert_eq!(types(&events), ["message_start", "start text", "delta text_delta", "error"]);
    assert_eq!(
        events[3],
        json!({"type": "error", "error": {"type": "api_error", "message": "Backend `b` failed: its answer broke"},
               "request_id": "req_7"})
    );
    // A stream that stops without a finish: an error.
    let mut translator = Translator::new(shape());
    let mut out = translator.start().to_vec();
    out.extend_from_slice(&translator.chat_event(&delta(json!({"content": "par"})).to_string()));
    out.extend_from_slice(&translator.end());
    assert_eq!(parse(&out).last().expect("last")["error"]["type"], "api_error");
}

#[test]
fn pings_go_out_until_the_end_only() {
    let mut translator = Translator::new(shape());
    let mut out = translator.start().to_vec();
    assert!(!translator.content_started());
    out.extend_from_slice(&translator.ping());
    // omlx's keep-alive data chunk is a ping, not text.
    let keepalive = json!({"id": "chatcmpl-keepalive", "choices": [{"index": 0, "delta": {"content": " "}}]});
    out.extend_from_slice(&translator.chat_event(&keepalive.to_string()));
    assert!(!translator.content_started());
    out.extend_from_slice(&translator.chat_event(&delta(json!({"content": "a"})).to_string()));
    assert!(translator.content_started());
    out.extend_from_slice(&translator.chat_event("[DONE]"));
    assert!(translator.ping().is_empty(), "no ping after message_stop");
    assert_eq!(types(&parse(&out))[1..3], ["ping", "ping"]);
}

#[test]
fn a_whole_completion_is_the_message_object() {
    let completion = json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "/models/qwen",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "I'll look.", "reasoning_content": "Need ls.",
            "tool_calls": [
                {"id": "0", "type": "function", "function": {"name": "Bash", "arguments": "{\"command\":\"ls\"}"}},
                {"id": "1", "type": "function", "function": {"name": "Read", "arguments": "{\"path\":\"a\"}"}},
            ]}}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 10}},
    });
    let Some(Whole::Message(message)) = whole(shape(), completion.to_string().as_bytes()) else { panic!("a message") };
    let content = message["content"].as_array().expect("content");
    assert_eq!(content[0], json!({"type": "thinking", "thinking": "Need ls.", "signature": ""}));
    assert_eq!(content[1], json!({"type": "text", "text": "I'll look."}));
    assert_eq!(content[2]["type"], "tool_use");
    assert_eq!(content[2]["input"], json!({"command": "ls"}));
    assert_eq!(content[3]["input"], json!({"path": "a"}));
    assert_ne!(content[2]["id"], content[3]["id"]);
    assert_eq!(message["stop_reason"], "tool_use");
    assert_eq!(message["stop_sequence"], Value::Null);
    assert_eq!(message["model"], "claude-sonnet-4-5", "the name the client sent");
    assert_eq!(message["type"], "message");
    assert_eq!(
        message["usage"],
        json!({"input_tokens": 40, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 10, "output_tokens": 9})
    );
    // Arguments cut by the limit: an empty input object (it must be an object).
    let cut = json!({"choices": [{"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": null,
        "tool_calls": [{"id": "0", "type": "function", "function": {"name": "Bash", "arguments": "{\"comm"}}]}}]});
    let Some(Whole::Message(message)) = whole(shape(), cut.to_string().as_bytes()) else { panic!("a message") };
    assert_eq!(
        message["content"],
        json!([{"type": "tool_use", "id": message["content"][0]["id"], "name": "Bash", "input": {}}])
    );
    assert_eq!(message["stop_reason"], "max_tokens");
    // Not a completion; an error object.
    assert!(whole(shape(), b"[1]").is_none());
    let Some(Whole::Error(status, body)) = whole(shape(), br#"{"error":{"message":"x","type":"backend_error"}}"#)
    else {
        panic!("an error")
    };
    assert_eq!(status.as_u16(), 502);
    assert_eq!(body["error"]["type"], "api_error");
}
