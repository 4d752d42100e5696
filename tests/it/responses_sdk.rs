//! The official `openai` Python SDK's Responses client through mlxgate in front of the
//! simulator: `responses.create` (whole and streamed) and `responses.stream` (the SDK's own
//! event accumulator, which needs `response.completed`), plain and with function tools, a tool
//! round trip made of the SDK's own output items, and `responses.parse` (structured output).
//! Every event and object is also validated strictly against the SDK's pydantic types
//! (`ResponseStreamEvent` is a union discriminated by `type`: an event type or field the SDK
//! does not know fails). The SDK is the one in `.venv-agents` (scripts/setup-agents installs
//! it, pinned).

use std::path::PathBuf;
use std::process::Command;

use crate::common::*;
use mlxgate::sim::{self, Behaviour, Script, SimConfig};
use serde_json::{Value, json};

/// Runs the SDK against `base_url`; prints one JSON object of what it saw.
const SDK_SCRIPT: &str = r#"
import json, sys
from pydantic import TypeAdapter
from openai import OpenAI
from openai.types.responses import Response, ResponseStreamEvent

base_url = sys.argv[1]
client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120.0)
events_adapter = TypeAdapter(ResponseStreamEvent)
out = {}

def strict_stream(body):
    """Sends a streamed request and validates every raw event strictly; returns their types."""
    kinds = []
    with client.responses.with_streaming_response.create(**body) as r:
        assert r.status_code == 200, r.read()
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                event = events_adapter.validate_json(line[len("data: "):], strict=False)
                assert event.type == name, (event.type, name)
                if event.type in ("response.created", "response.completed", "response.failed"):
                    Response.model_validate(event.response.model_dump(mode="json", exclude_unset=True))
                kinds.append(event.type)
    return kinds

# Plain, whole: the object validates as a Response.
raw = client.responses.with_raw_response.create(model="qwen", input="hello", max_output_tokens=20)
whole = Response.model_validate_json(raw.http_response.text)
out["plain_text"] = whole.output_text
out["plain_status"] = whole.status
out["plain_usage"] = whole.usage.model_dump() if whole.usage else None

# Plain, streamed through the SDK's stream helper (its accumulator and final response).
with client.responses.stream(model="qwen", input="hello again") as stream:
    kinds = [event.type for event in stream]
    final = stream.get_final_response()
out["stream_types"] = kinds
out["stream_text"] = final.output_text
out["stream_status"] = final.status

# Plain, streamed, each event validated strictly.
out["strict_types"] = strict_stream({"model": "qwen", "input": "hello", "stream": True})

# Structured output: `responses.parse` sends `text.format` and parses the answer as the model.
from pydantic import BaseModel
class Weather(BaseModel):
    city: str
parsed = client.responses.parse(model="qwen", input="weather?", text_format=Weather)
out["parsed"] = parsed.output_parsed.model_dump()

# With function tools: the SDK's stream helper, then the round trip with its own items.
tools = [{"type": "function", "name": "get_weather", "description": "The weather in a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
conversation = [{"role": "user", "content": "What is the weather in Paris?"}]
with client.responses.stream(model="qwen", input=conversation, tools=tools) as stream:
    tool_kinds = [event.type for event in stream]
    first = stream.get_final_response()
calls = [item for item in first.output if item.type == "function_call"]
out["tool_stream_types"] = tool_kinds
out["calls"] = [{"name": c.name, "arguments": json.loads(c.arguments), "call_id": c.call_id} for c in calls]
out["strict_tool_types"] = strict_stream({"model": "qwen", "input": conversation, "tools": tools, "stream": True})
conversation += [item.model_dump(exclude_none=True) for item in first.output]
conversation += [{"type": "function_call_output", "call_id": c.call_id, "output": "Sunny, 21 C"} for c in calls]
second = client.responses.create(model="qwen", input=conversation, tools=tools)
out["answer"] = second.output_text
out["answer_status"] = second.status
print(json.dumps(out))
"#;

fn agents_python() -> Option<PathBuf> {
    openai_sdk_python(".venv-agents", "scripts/setup-agents")
}

#[tokio::test]
async fn the_openai_sdk_creates_and_streams_responses_and_round_trips_a_tool_call() {
    let Some(python) = agents_python() else { return };
    let script: Script = serde_json::from_value(json!({
        "text": "Hello from the simulator.",
        "turns": [
            {"calls": [{"tool": "get_weather", "arguments": {"city": "Paris"}}]},
            {"text": "It is sunny in Paris."},
        ],
    }))
    .expect("script");
    let sim = sim::spawn(SimConfig { script: Some(script), defaults: Behaviour::default(), ..Default::default() })
        .await
        .expect("sim starts");
    let gw = gateway(&one_model_yaml(&sim.url(), 4, 16)).await;
    let base_url = gw.url("/v1");
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python).args(["-c", SDK_SCRIPT, &base_url]).output().expect("python runs")
    })
    .await
    .expect("joined");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the SDK failed:\n{stderr}");
    let seen: Value = serde_json::from_slice(&output.stdout).expect("the script's JSON");

    assert_eq!(seen["plain_text"], "Hello from the simulator.");
    assert_eq!(seen["plain_status"], "completed");
    assert!(seen["plain_usage"]["input_tokens"].as_u64().is_some_and(|n| n > 0), "{seen}");
    assert_eq!(seen["stream_text"], "Hello from the simulator.");
    assert_eq!(seen["stream_status"], "completed");
    for key in ["stream_types", "strict_types", "tool_stream_types", "strict_tool_types"] {
        let kinds: Vec<&str> = seen[key].as_array().expect(key).iter().filter_map(Value::as_str).collect();
        assert_eq!(kinds.first(), Some(&"response.created"), "{key}: {kinds:?}");
        assert_eq!(kinds.last(), Some(&"response.completed"), "{key}: {kinds:?}");
    }
    let tool_kinds = seen["strict_tool_types"].to_string();
    assert!(tool_kinds.contains("response.function_call_arguments.delta"), "{tool_kinds}");
    assert!(tool_kinds.contains("response.function_call_arguments.done"), "{tool_kinds}");
    assert_eq!(seen["calls"].as_array().map(Vec::len), Some(1), "{seen}");
    assert_eq!(seen["calls"][0]["name"], "get_weather");
    assert_eq!(seen["calls"][0]["arguments"], json!({"city": "Paris"}));
    assert!(seen["parsed"]["city"].is_string(), "{seen}");
    let asked = sim_requests(&sim).await;
    let format = asked.iter().find_map(|r| r.get("response_format")).expect("a request with response_format");
    assert_eq!(format["type"], "json_schema", "{format}");
    assert_eq!(format["json_schema"]["name"], "Weather", "{format}");
    assert_eq!(format["json_schema"]["schema"]["required"], json!(["city"]), "{format}");
    assert_eq!(seen["answer"], "It is sunny in Paris.");
    assert_eq!(seen["answer_status"], "completed");

    // The round trip reached the backend as chat: the call and its result.
    let sent = sim_requests(&sim).await.last().cloned().expect("requests");
    let messages = sent["messages"].as_array().expect("messages");
    let call_id = seen["calls"][0]["call_id"].as_str().expect("call_id");
    assert_eq!(messages[1]["tool_calls"][0]["id"], call_id);
    assert_eq!(messages[2], json!({"role": "tool", "tool_call_id": call_id, "content": "Sunny, 21 C"}));
}

/// Validates strictly every event of one streamed request per case (`argv[2]`: a JSON list of
/// `[name, request]`), and the whole `response` object of the same request unstreamed; prints
/// each case's event types and final status.
const STRICT_SCRIPT: &str = r#"
import json, sys
import openai
from pydantic import TypeAdapter
from openai import OpenAI
from openai.types.responses import Response, ResponseStreamEvent

client = OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=120.0)
adapter = TypeAdapter(ResponseStreamEvent)
out = {}
for name, body in json.loads(sys.argv[2]):
    kinds, last = [], None
    with client.responses.with_streaming_response.create(stream=True, **body) as r:
        event_name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                event_name = line[len("event: "):]
            elif line.startswith("data: "):
                event = adapter.validate_json(line[len("data: "):])
                assert event.type == event_name, (event.type, event_name)
                kinds.append(event.type)
                last = event
    try:
        raw = client.responses.with_raw_response.create(**body)
        whole_status = Response.model_validate_json(raw.http_response.text).status
    except openai.APIStatusError as e:
        # A whole answer that fails fails before its headers: an HTTP error, OpenAI-shaped.
        whole_status = f"http {e.status_code}: {e.body['message'] if isinstance(e.body, dict) else e.body}"
    out[name] = {"types": kinds, "status": last.response.status, "whole_status": whole_status,
                 "items": [item.type for item in last.response.output]}
print(json.dumps(out))
"#;

#[tokio::test]
async fn every_kind_of_event_validates_against_the_sdk_s_types() {
    let Some(python) = agents_python() else { return };
    let patch = "*** Begin Patch\n*** Add File: a.txt\n+a\n*** End Patch\n";
    let custom: Script = serde_json::from_value(json!({"turns": [
        {"calls": [{"tool": "apply_patch", "arguments": {"input": patch}}, {"tool": "local_shell", "arguments": {"command": ["ls"]}}]},
    ]}))
    .expect("script");
    let reasoning: Behaviour =
        serde_json::from_value(json!({"content_field": "reasoning_content"})).expect("behaviour");
    let sims = [
        sim::spawn(SimConfig { script: Some(custom), ..Default::default() }).await.expect("sim"),
        sim_with(reasoning).await,
        sim_with(Behaviour { tokens: Some(20), ..Default::default() }).await,
        sim_with(Behaviour { tokens: Some(8), drop_after: Some(2), ..Default::default() }).await,
    ];
    let names = ["custom", "reasoning", "cut", "broken"];
    let backends: String = names
        .iter()
        .zip(&sims)
        .map(|(name, sim)| format!("  {name}: {{url: '{}', max_concurrency: 4}}\n", sim.url()))
        .collect();
    let models: String = names.iter().map(|name| format!("  {name}: {{backend: {name}}}\n")).collect();
    let gw = gateway(&format!("backends:\n{backends}models:\n{models}")).await;
    let tools = json!([
        {"type": "custom", "name": "apply_patch", "description": "Edits files.",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: \"*** Begin Patch\""}},
        {"type": "local_shell"},
    ]);
    let cases = json!([
        ["custom", {"model": "custom", "input": "edit", "tools": tools}],
        ["reasoning", {"model": "reasoning", "input": "think"}],
        ["cut", {"model": "cut", "input": "talk", "max_output_tokens": 3}],
        ["broken", {"model": "broken", "input": "talk"}],
    ]);
    let (base_url, cases) = (gw.url("/v1"), cases.to_string());
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python).args(["-c", STRICT_SCRIPT, &base_url, &cases]).output().expect("python runs")
    })
    .await
    .expect("joined");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the SDK refused an event:\n{stderr}");
    let seen: Value = serde_json::from_slice(&output.stdout).expect("the script's JSON");
    let has = |case: &str, kind: &str| seen[case]["types"].as_array().is_some_and(|t| t.contains(&json!(kind)));

    assert_eq!(seen["custom"]["items"], json!(["custom_tool_call", "local_shell_call"]), "{seen}");
    assert!(has("custom", "response.custom_tool_call_input.done"), "{seen}");
    assert_eq!(seen["custom"]["status"], "completed");
    assert_eq!(seen["reasoning"]["items"], json!(["reasoning"]), "{seen}");
    assert!(has("reasoning", "response.reasoning_text.delta") && has("reasoning", "response.reasoning_text.done"));
    assert_eq!(seen["cut"]["status"], "incomplete");
    assert_eq!(seen["cut"]["whole_status"], "incomplete");
    assert!(has("cut", "response.completed"));
    assert_eq!(seen["broken"]["status"], "failed");
    assert!(has("broken", "response.failed") && !has("broken", "response.completed"));
    assert!(
        seen["broken"]["whole_status"].as_str().is_some_and(|s| s.starts_with("http 502: Backend `broken` failed")),
        "{seen}"
    );
}
