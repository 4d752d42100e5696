//! The official `anthropic` Python SDK through mlxgate in front of the simulator:
//! `messages.create` (whole), `messages.stream` (the SDK's own accumulator: its final message
//! has the same content as the whole answer), every raw event validated strictly against the
//! SDK's pydantic types, a tool round trip made of the SDK's own content blocks, a backend
//! failing mid-stream (the SDK raises Anthropic's error type, not a parse error), an unknown
//! model (`NotFoundError`), and a reasoning backend's thinking blocks. The SDK is the one in
//! `.venv-agents` (scripts/setup-agents installs it, pinned).

use std::path::PathBuf;
use std::process::Command;

use crate::common::*;
use mlxgate::sim::{self, Behaviour, Script, SimConfig};
use serde_json::{Value, json};

/// Runs the SDK against `base_url` (and `failing_url`, a gateway whose backend drops its
/// answers); prints one JSON object of what it saw.
const SDK_SCRIPT: &str = r#"
import json, sys
import anthropic
from pydantic import TypeAdapter
from anthropic.types import Message, RawMessageStreamEvent

base_url, failing_url, thinking_url = sys.argv[1], sys.argv[2], sys.argv[3]
client = anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=120.0)
events_adapter = TypeAdapter(RawMessageStreamEvent)
out = {}

def content(message):
    """The content blocks without their ids (each answer's tool ids are new)."""
    blocks = []
    for block in message.content:
        b = block.model_dump(mode="json", exclude_none=True)
        b.pop("id", None)
        b.pop("citations", None)
        blocks.append(b)
    return blocks

def strict_stream(via=None, **body):
    """Sends a streamed request (through `via`, else `client`) and validates every raw event
    strictly; returns their types."""
    kinds = []
    with (via or client).messages.with_streaming_response.create(stream=True, **body) as r:
        assert r.status_code == 200, r.read()
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data = line[len("data: "):]
                if name == "ping":
                    kinds.append("ping")
                    continue
                event = events_adapter.validate_json(data)
                assert event.type == name, (event.type, name)
                if event.type == "message_start":
                    Message.model_validate(event.message.model_dump(mode="json"))
                kinds.append(event.type)
    return kinds

hello = {"model": "qwen", "max_tokens": 50, "messages": [{"role": "user", "content": "hello"}]}

# Whole: the object validates as a Message.
raw = client.messages.with_raw_response.create(**hello)
whole = Message.model_validate_json(raw.http_response.text)
out["whole_content"] = content(whole)
out["whole_stop"] = whole.stop_reason
out["whole_usage"] = whole.usage.model_dump(exclude_none=True)

# Streamed through the SDK's helper: its accumulator's final message.
with client.messages.stream(**hello) as stream:
    kinds = [event.type for event in stream]
    final = stream.get_final_message()
out["stream_types"] = kinds
out["stream_content"] = content(final)
out["stream_stop"] = final.stop_reason
out["stream_usage"] = final.usage.model_dump(exclude_none=True)
out["strict_types"] = strict_stream(**hello)

# Tools: streamed, then the round trip with the SDK's own blocks.
tools = [{"name": "get_weather", "description": "The weather in a city.",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
conversation = [{"role": "user", "content": "What is the weather in Paris?"}]
with client.messages.stream(model="qwen", max_tokens=200, messages=conversation, tools=tools) as stream:
    first = stream.get_final_message()
whole_first = client.messages.create(model="qwen", max_tokens=200, messages=conversation, tools=tools)
out["tool_stream_content"] = content(first)
out["tool_whole_content"] = content(whole_first)
out["tool_stop"] = first.stop_reason
out["strict_tool_types"] = strict_stream(model="qwen", max_tokens=200, messages=conversation, tools=tools)
calls = [block for block in first.content if block.type == "tool_use"]
conversation.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]})
conversation.append({"role": "user", "content": [
    {"type": "tool_result", "tool_use_id": c.id, "content": "Sunny, 21 C"} for c in calls]})
second = client.messages.create(model="qwen", max_tokens=200, messages=conversation, tools=tools)
out["answer"] = second.content[0].text
out["answer_stop"] = second.stop_reason

# A reasoning backend: thinking blocks (thinking_delta, signature_delta) through the accumulator
# and the strict types.
thinker = anthropic.Anthropic(base_url=thinking_url, api_key="unused", max_retries=0, timeout=120.0)
think = dict(hello, thinking={"type": "adaptive"})
with thinker.messages.stream(**think) as stream:
    thought = stream.get_final_message()
out["thinking_content"] = content(thought)
out["strict_thinking_types"] = strict_stream(via=thinker, **think)

# An unknown model: the SDK's NotFoundError.
try:
    client.messages.create(model="claude-nope", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    out["unknown_model"] = "no error"
except anthropic.NotFoundError as e:
    out["unknown_model"] = {"class": type(e).__name__, "type": e.body["error"]["type"],
                            "request_id": e.body.get("request_id")}

# A backend dropping its answer mid-stream: Anthropic's error, raised by the SDK.
failing = anthropic.Anthropic(base_url=failing_url, api_key="unused", max_retries=0, timeout=120.0)
try:
    with failing.messages.stream(**hello) as stream:
        for _ in stream:
            pass
    out["mid_stream"] = "no error"
except anthropic.APIStatusError as e:
    out["mid_stream"] = {"class": type(e).__name__, "type": e.body["error"]["type"]}
print(json.dumps(out))
"#;

/// The Python of `.venv-agents` when it can import the anthropic SDK. Missing, the test fails
/// saying to run scripts/setup-agents, unless `MLXGATE_SKIP_REAL_SERVERS=1` (never in CI).
fn anthropic_python() -> Option<PathBuf> {
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv-agents/bin/python");
    let has_sdk =
        python.is_file() && Command::new(&python).args(["-c", "import anthropic"]).status().is_ok_and(|s| s.success());
    if has_sdk {
        return Some(python);
    }
    let why = "no .venv-agents with the anthropic SDK: run scripts/setup-agents";
    let skip = std::env::var_os("MLXGATE_SKIP_REAL_SERVERS").is_some_and(|v| v == "1");
    assert!(skip && std::env::var_os("CI").is_none(), "this test needs the anthropic SDK: {why}");
    eprintln!("SKIPPED (MLXGATE_SKIP_REAL_SERVERS=1): {why}");
    None
}

#[tokio::test]
async fn the_anthropic_sdk_creates_and_streams_messages_and_round_trips_a_tool_call() {
    let Some(python) = anthropic_python() else { return };
    let script: Script = serde_json::from_value(json!({
        "text": "Hello from the simulator.",
        "turns": [
            {"text": "Let me check.", "calls": [{"tool": "get_weather", "arguments": {"city": "Paris"}}]},
            {"text": "It is sunny in Paris."},
        ],
    }))
    .expect("script");
    let sim = sim::spawn(SimConfig { script: Some(script), defaults: Behaviour::default(), ..Default::default() })
        .await
        .expect("sim starts");
    let gw = gateway(&one_model_yaml(&sim.url(), 4, 16)).await;
    let dropping = sim_with(Behaviour { tokens: Some(8), drop_after: Some(3), ..Default::default() }).await;
    let failing = gateway(&one_model_yaml(&dropping.url(), 4, 16)).await;
    let reasoning: Behaviour =
        serde_json::from_value(json!({"tokens": 3, "content_field": "reasoning_content"})).expect("behaviour");
    let thinking_sim = sim_with(reasoning).await;
    let thinking = gateway(&one_model_yaml(&thinking_sim.url(), 4, 16)).await;
    let (base_url, failing_url, thinking_url) = (gw.url(""), failing.url(""), thinking.url(""));
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .args(["-c", SDK_SCRIPT, &base_url, &failing_url, &thinking_url])
            .output()
            .expect("python runs")
    })
    .await
    .expect("joined");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the SDK failed:\n{stderr}");
    let seen: Value = serde_json::from_slice(&output.stdout).expect("the script's JSON");

    let text = json!([{"type": "text", "text": "Hello from the simulator."}]);
    assert_eq!(seen["whole_content"], text, "{seen}");
    assert_eq!(seen["stream_content"], seen["whole_content"], "the accumulator rebuilds the whole message");
    assert_eq!((seen["whole_stop"].as_str(), seen["stream_stop"].as_str()), (Some("end_turn"), Some("end_turn")));
    for usage in [&seen["whole_usage"], &seen["stream_usage"]] {
        assert!(usage["input_tokens"].as_u64().is_some_and(|n| n > 0), "{usage}");
        assert!(usage["output_tokens"].as_u64().is_some_and(|n| n > 0), "{usage}");
        assert!(usage["cache_read_input_tokens"].is_u64(), "{usage}");
    }
    assert_eq!(seen["stream_usage"]["output_tokens"], seen["whole_usage"]["output_tokens"]);
    let kinds = seen["stream_types"].as_array().expect("types");
    assert_eq!(kinds.first().and_then(Value::as_str), Some("message_start"));
    assert_eq!(kinds.last().and_then(Value::as_str), Some("message_stop"));
    let strict = seen["strict_types"].as_array().expect("strict");
    assert_eq!(strict.last().and_then(Value::as_str), Some("message_stop"));

    let call = json!({"type": "tool_use", "name": "get_weather", "input": {"city": "Paris"}});
    let expected = json!([{"type": "text", "text": "Let me check."}, call]);
    assert_eq!(seen["tool_stream_content"], expected, "{seen}");
    assert_eq!(seen["tool_whole_content"], expected);
    assert_eq!(seen["tool_stop"], "tool_use");
    assert_eq!(
        seen["strict_tool_types"].as_array().and_then(|k| k.last()).and_then(Value::as_str),
        Some("message_stop")
    );
    assert_eq!(seen["answer"], "It is sunny in Paris.");
    assert_eq!(seen["answer_stop"], "end_turn");

    let thought = &seen["thinking_content"];
    assert_eq!(thought[0]["type"], "thinking", "{seen}");
    assert_eq!(thought[0]["signature"], "");
    assert_eq!(thought[0]["thinking"].as_str().map(|t| t.split_whitespace().count()), Some(3));
    let strict = seen["strict_thinking_types"].as_array().expect("types");
    assert!(strict.contains(&json!("content_block_delta")) && strict.last() == Some(&json!("message_stop")), "{seen}");
    assert_eq!(seen["unknown_model"]["class"], "NotFoundError", "{seen}");
    assert_eq!(seen["unknown_model"]["type"], "not_found_error");
    assert!(seen["unknown_model"]["request_id"].as_str().is_some_and(|id| id.starts_with("req_")), "{seen}");
    assert_eq!(seen["mid_stream"]["type"], "api_error", "{seen}");
}
