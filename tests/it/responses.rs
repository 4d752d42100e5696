//! `POST /v1/responses` through the gateway in front of mlxgate-sim: the streamed event
//! sequence and its sequence numbers, the whole `response` object, a tool round trip (the
//! `function_call` item sent back with its `function_call_output` reaches the backend as an
//! assistant `tool_calls` message and a `tool` message), a custom tool, the refusal of
//! server-side state, a backend failing mid-stream (with its request id and the text so far), an
//! answer cut by `max_output_tokens`, usage equal to the gateway's metrics, structured output
//! (`text.format`), an input with nothing to send, history arguments that are not JSON, and
//! whole tool calls without `index` from a backend that sends them so.

use crate::common::*;
use mlxgate::sim::{self, Behaviour, Script, SimConfig, SimHandle, Style};
use serde_json::{Value, json};

/// A simulator with `defaults` that plays `script`.
async fn scripted(script: Value, defaults: Behaviour) -> SimHandle {
    let script: Script = serde_json::from_value(script).expect("script");
    sim::spawn(SimConfig { defaults, script: Some(script), ..Default::default() }).await.expect("sim starts")
}

async fn gateway_for(sim: &SimHandle) -> Gateway {
    gateway(&one_model_yaml(&sim.url(), 4, 16)).await
}

/// The Responses events of a streamed body, each checked: its `event:` line is its `type`,
/// and sequence numbers run 0, 1, 2, … in order.
fn parse_events(body: &str) -> Vec<Value> {
    let events: Vec<Value> = body
        .split("\n\n")
        .filter(|block| block.starts_with("event: "))
        .map(|block| {
            let mut lines = block.lines();
            let name = lines.next().and_then(|l| l.strip_prefix("event: ")).expect("event line");
            let data = lines.next().and_then(|l| l.strip_prefix("data: ")).expect("data line");
            let event: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"));
            assert_eq!(event["type"], name);
            event
        })
        .collect();
    for (n, event) in events.iter().enumerate() {
        assert_eq!(event["sequence_number"], n, "{body}");
    }
    events
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().expect("type")).collect()
}

/// The whole items of `response.output_item.done`, in order.
fn done_items(events: &[Value]) -> Vec<Value> {
    events.iter().filter(|e| e["type"] == "response.output_item.done").map(|e| e["item"].clone()).collect()
}

async fn responses(gw: &Gateway, body: &Value) -> (u16, String) {
    let r = client().post(gw.url("/v1/responses")).json(body).send().await.expect("send");
    let status = r.status().as_u16();
    (status, text_of(r).await)
}

/// The last request the backend received.
async fn last_backend_request(sim: &SimHandle) -> Value {
    sim_requests(sim).await.last().cloned().expect("the backend got a request")
}

#[tokio::test]
async fn a_streamed_answer_is_the_responses_event_sequence_and_its_usage_is_the_metrics() {
    // mlx_lm.server's wire: keepalive comments during prefill, role on every delta, a usage
    // chunk with `choices: []`, HTTP/1.0 close-delimited.
    let sim = sim_with(Behaviour { style: Some(Style::MlxLm), tokens: Some(5), ..Default::default() }).await;
    let gw = gateway_for(&sim).await;
    let (status, body) = responses(
        &gw,
        &json!({"model": "qwen", "stream": true, "instructions": "Be brief.", "input": "hello there",
                "store": false, "include": ["reasoning.encrypted_content"], "reasoning": {"summary": "auto"},
                "prompt_cache_key": "session-1", "client_metadata": {"x": "y"}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let events = parse_events(&body);
    let kinds = types(&events);
    assert_eq!(
        kinds[..4],
        ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    );
    assert_eq!(
        kinds[kinds.len() - 4..],
        ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"]
    );
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().expect("delta"))
        .collect();
    assert_eq!(deltas.split_whitespace().count(), 5, "{deltas:?}");
    let completed = &events.last().expect("completed")["response"];
    assert_eq!(completed["status"], "completed");
    // The name the client asked for, never the backend's.
    assert_eq!(completed["model"], "qwen");
    assert_eq!(events[0]["response"]["model"], "qwen");
    assert_eq!(completed["output"][0]["content"][0]["text"], deltas);
    let usage = &completed["usage"];
    assert_eq!(usage["output_tokens"], 5);
    assert!(usage["input_tokens"].as_u64().is_some_and(|n| n > 0), "{usage}");
    assert!(usage["input_tokens_details"]["cached_tokens"].is_u64(), "{usage}");

    // The backend got a chat completion: the system and user messages, usage asked for, an
    // explicit limit, and none of the Responses fields.
    let sent = last_backend_request(&sim).await;
    assert_eq!(
        sent["messages"],
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}])
    );
    assert_eq!(sent["stream_options"], json!({"include_usage": true}));
    assert_eq!(sent["model"], "tiny-qwen3");
    assert!(sent["max_tokens"].is_u64(), "{sent}");
    for field in ["input", "instructions", "include", "reasoning", "store", "prompt_cache_key", "client_metadata"] {
        assert!(sent.get(field).is_none(), "{field} reached the backend: {sent}");
    }

    // Counted once, as any chat request is, with the usage the client was told.
    let labels = "backend=\"local\",client=\"anonymous\",model=\"qwen\"";
    let requests = metric(&gw, &format!("mlxgate_requests_total{{{labels},outcome=\"ok\"}}")).await;
    assert_eq!(requests, Some(1.0));
    let prompt = metric(&gw, &format!("mlxgate_prompt_tokens_total{{{labels}}}")).await;
    assert_eq!(prompt, usage["input_tokens"].as_f64());
    let generated = metric(&gw, &format!("mlxgate_generation_tokens_total{{{labels}}}")).await;
    assert_eq!(generated, usage["output_tokens"].as_f64());
    let cached = metric(&gw, "mlxgate_prompt_cached_tokens_total{backend=\"local\",model=\"qwen\"}").await;
    assert_eq!(cached, usage["input_tokens_details"]["cached_tokens"].as_f64());
}

#[tokio::test]
async fn a_whole_answer_is_one_response_object() {
    let sim = sim_with(Behaviour { tokens: Some(4), ..Default::default() }).await;
    let gw = gateway_for(&sim).await;
    let (status, body) = responses(
        &gw,
        &json!({"model": "qwen", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
                "max_output_tokens": 50, "temperature": 0.5}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let response: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(response["object"], "response");
    assert_eq!(response["status"], "completed");
    assert_eq!(response["model"], "qwen");
    assert_eq!(response["temperature"], 0.5);
    assert_eq!(response["max_output_tokens"], 50);
    assert!(response["id"].as_str().is_some_and(|id| id.starts_with("resp_")));
    let output = response["output"].as_array().expect("output");
    assert_eq!(output.len(), 1);
    assert_eq!(output[0]["type"], "message");
    assert_eq!(output[0]["content"][0]["text"].as_str().map(|t| t.split_whitespace().count()), Some(4));
    assert_eq!(response["usage"]["output_tokens"], 4);
    let sent = last_backend_request(&sim).await;
    assert_eq!(sent["max_tokens"], 50);
    assert_eq!(sent["stream"], false);
    assert!(sent.get("stream_options").is_none());
}

/// The script's tool loop: the first turn calls `shell`, the next answers in text.
fn shell_script() -> Value {
    json!({"turns": [
        {"text": "Let me look.", "calls": [{"tool": "shell", "arguments": {"command": ["ls", "-la"]}}]},
        {"text": "There are two files."},
    ]})
}

fn shell_tool() -> Value {
    json!({"type": "function", "name": "shell", "description": "Runs a shell command.",
           "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}},
                          "required": ["command"]}})
}

#[tokio::test]
async fn a_tool_round_trip_reaches_the_backend_as_chat_tool_calls_and_a_tool_message() {
    let sim = scripted(shell_script(), Behaviour::default()).await;
    let gw = gateway_for(&sim).await;
    let user = json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]});
    let first = json!({"model": "qwen", "stream": true, "store": false, "tools": [shell_tool()],
                       "tool_choice": "auto", "parallel_tool_calls": true, "input": [user]});
    let (status, body) = responses(&gw, &first).await;
    assert_eq!(status, 200, "{body}");
    let events = parse_events(&body);
    let items = done_items(&events);
    assert_eq!(items.len(), 2, "{body}");
    assert_eq!(items[0]["type"], "message");
    assert_eq!(items[0]["content"][0]["text"], "Let me look.");
    let call = &items[1];
    assert_eq!(call["type"], "function_call");
    assert_eq!(call["name"], "shell");
    let arguments: Value = serde_json::from_str(call["arguments"].as_str().expect("arguments")).expect("json");
    assert_eq!(arguments, json!({"command": ["ls", "-la"]}));
    // The arguments arrived in pieces, each a delta of the call's output index.
    let pieces: Vec<&Value> = events.iter().filter(|e| e["type"] == "response.function_call_arguments.delta").collect();
    assert!(!pieces.is_empty());
    assert!(pieces.iter().all(|e| e["output_index"] == 1 && e["item_id"] == call["id"]));
    let sent = last_backend_request(&sim).await;
    assert_eq!(sent["tools"][0]["type"], "function");
    assert_eq!(sent["tools"][0]["function"]["name"], "shell");
    assert_eq!(sent["tool_choice"], "auto");

    // The next turn sends the whole conversation: the items the answer gave, and the result.
    let call_id = call["call_id"].as_str().expect("call_id");
    let mut second = first.clone();
    second["input"] = json!([user, items[0], call,
        {"type": "function_call_output", "call_id": call_id, "output": "a.txt\nb.txt"}]);
    let (status, body) = responses(&gw, &second).await;
    assert_eq!(status, 200, "{body}");
    let items = done_items(&parse_events(&body));
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["content"][0]["text"], "There are two files.");
    let sent = last_backend_request(&sim).await;
    let messages = sent["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 3, "{sent}");
    assert_eq!(messages[0], json!({"role": "user", "content": "list files"}));
    assert_eq!(messages[1]["role"], "assistant");
    assert_eq!(messages[1]["content"], "Let me look.");
    assert_eq!(messages[1]["tool_calls"][0]["id"], call_id);
    assert_eq!(messages[1]["tool_calls"][0]["function"]["name"], "shell");
    assert_eq!(messages[1]["tool_calls"][0]["function"]["arguments"], call["arguments"]);
    assert_eq!(messages[2], json!({"role": "tool", "tool_call_id": call_id, "content": "a.txt\nb.txt"}));
}

#[tokio::test]
async fn a_custom_tool_is_a_function_to_the_backend_and_a_custom_tool_call_to_the_client() {
    let patch = "*** Begin Patch\n*** Add File: hello.txt\n+hi\n*** End Patch\n";
    let sim = scripted(
        json!({"turns": [{"calls": [{"tool": "apply_patch", "arguments": {"input": patch}}]}, {"text": "Done."}]}),
        Behaviour::default(),
    )
    .await;
    let gw = gateway_for(&sim).await;
    let tools = json!([
        {"type": "custom", "name": "apply_patch", "description": "Edit files.",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch hunk+ end_patch"}},
        {"type": "web_search", "external_web_access": false},
        {"type": "local_shell"},
    ]);
    let body = json!({"model": "qwen", "stream": true, "tools": tools, "input": "add hello.txt"});
    let (status, text) = responses(&gw, &body).await;
    assert_eq!(status, 200, "{text}");
    let items = done_items(&parse_events(&text));
    assert_eq!(items.len(), 1, "{text}");
    assert_eq!(items[0]["type"], "custom_tool_call");
    assert_eq!(items[0]["name"], "apply_patch");
    assert_eq!(items[0]["input"], patch);
    // The backend saw functions only: apply_patch with one string parameter, local_shell; no
    // web_search (nothing here runs it).
    let sent = last_backend_request(&sim).await;
    let names: Vec<&str> =
        sent["tools"].as_array().expect("tools").iter().filter_map(|t| t["function"]["name"].as_str()).collect();
    assert_eq!(names, ["apply_patch", "local_shell"]);
    assert_eq!(sent["tools"][0]["function"]["parameters"]["properties"]["input"]["type"], "string");

    // Sent back, the call and its output are a tool call and a tool message.
    let call_id = items[0]["call_id"].as_str().expect("call_id");
    let next = json!({"model": "qwen", "stream": false, "tools": tools, "input": [
        {"role": "user", "content": "add hello.txt"}, items[0],
        {"type": "custom_tool_call_output", "call_id": call_id, "output": "Success."}]});
    let (status, text) = responses(&gw, &next).await;
    assert_eq!(status, 200, "{text}");
    let response: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(response["output"][0]["content"][0]["text"], "Done.");
    let sent = last_backend_request(&sim).await;
    let arguments: Value =
        serde_json::from_str(sent["messages"][1]["tool_calls"][0]["function"]["arguments"].as_str().expect("string"))
            .expect("json");
    assert_eq!(arguments, json!({"input": patch}));
    assert_eq!(sent["messages"][2]["content"], "Success.");
}

#[tokio::test]
async fn stored_state_is_refused_with_an_openai_error_and_nothing_is_sent() {
    let sim = sim().await;
    let gw = gateway_for(&sim).await;
    for (field, value) in [("store", json!(true)), ("previous_response_id", json!("resp_123"))] {
        let mut body = json!({"model": "qwen", "input": "hi"});
        body[field] = value;
        let (status, text) = responses(&gw, &body).await;
        assert_eq!(status, 400, "{text}");
        let error: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(error["error"]["type"], "invalid_request_error");
        assert_eq!(error["error"]["param"], field);
        assert!(error["error"]["message"].as_str().is_some_and(|m| m.contains("stateless")), "{text}");
    }
    assert!(sim_requests(&sim).await.is_empty());
    // The gateway's own refusals keep their shape too: an unknown model.
    let (status, text) = responses(&gw, &json!({"model": "nope", "input": "hi"})).await;
    assert_eq!(status, 404, "{text}");
    assert!(text.contains("model_not_found"));
}

#[tokio::test]
async fn a_backend_failing_mid_stream_is_response_failed() {
    // The connection drops after 3 tokens: the meter cuts the chat stream with its error event.
    let sim = sim_with(Behaviour { tokens: Some(8), drop_after: Some(3), ..Default::default() }).await;
    let gw = gateway_for(&sim).await;
    let (status, body) = responses(&gw, &json!({"model": "qwen", "stream": true, "input": "hi"})).await;
    assert_eq!(status, 200, "{body}");
    let events = parse_events(&body);
    let kinds = types(&events);
    assert_eq!(kinds.last(), Some(&"response.failed"), "{body}");
    assert!(!kinds.contains(&"response.completed"));
    assert!(kinds.contains(&"response.output_text.delta"));
    let response = &events.last().expect("failed")["response"];
    assert_eq!(response["status"], "failed");
    assert_eq!(response["error"]["code"], "server_error");
    assert!(response["error"]["message"].as_str().is_some_and(|m| m.contains("local")), "{response}");
    // Counted as the backend failure it was.
    let failed = metric(
        &gw,
        "mlxgate_requests_total{backend=\"local\",client=\"anonymous\",model=\"qwen\",outcome=\"backend_error\"}",
    )
    .await;
    assert_eq!(failed, Some(1.0));

    // An error event from the backend itself (mlx-openai-server: then a normal stop and [DONE]).
    let sim =
        sim_with(Behaviour { style: Some(Style::MlxOpenaiServer), error_after: Some(2), ..Default::default() }).await;
    let gw = gateway_for(&sim).await;
    let (_, body) = responses(&gw, &json!({"model": "qwen", "stream": true, "input": "hi"})).await;
    let kinds: Vec<String> = types(&parse_events(&body)).into_iter().map(str::to_string).collect();
    assert_eq!(kinds.last().map(String::as_str), Some("response.failed"), "{body}");
    assert_eq!(
        kinds.iter().filter(|k| k.starts_with("response.completed") || k.starts_with("response.failed")).count(),
        1
    );
}

#[tokio::test]
async fn an_answer_cut_by_max_output_tokens_completes_as_incomplete() {
    let sim = sim_with(Behaviour { tokens: Some(20), ..Default::default() }).await;
    let gw = gateway_for(&sim).await;
    let (status, body) =
        responses(&gw, &json!({"model": "qwen", "stream": true, "input": "hi", "max_output_tokens": 3})).await;
    assert_eq!(status, 200, "{body}");
    let events = parse_events(&body);
    let kinds = types(&events);
    // `response.completed` (Codex fails a turn on `response.incomplete`), saying it was cut.
    assert_eq!(kinds.last(), Some(&"response.completed"));
    assert!(!kinds.contains(&"response.incomplete"));
    let response = &events.last().expect("completed")["response"];
    assert_eq!(response["status"], "incomplete");
    assert_eq!(response["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(response["output"][0]["status"], "incomplete");
    assert_eq!(response["usage"]["output_tokens"], 3);
    assert_eq!(last_backend_request(&sim).await["max_tokens"], 3);
    // Whole, the same.
    let (_, body) = responses(&gw, &json!({"model": "qwen", "input": "hi", "max_output_tokens": 3})).await;
    let response: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(response["status"], "incomplete");
    assert_eq!(response["incomplete_details"]["reason"], "max_output_tokens");
}

/// Codex hangs up as soon as it has `response.completed`, which the face sends at the chat
/// stream's `[DONE]`, while a backend may take a moment to close (mlx_lm.server ends its
/// HTTP/1.0 body by closing the connection). The request is a whole answer (`ok`), not a client
/// that left (`client_closed`): seen with the real Codex CLI in tests/it/agents.rs. The backend here
/// sends `[DONE]` and keeps the connection open until the test ends.
#[tokio::test]
async fn a_client_that_hangs_up_at_response_completed_had_a_whole_answer() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("accept");
        let mut request = vec![0u8; 64 * 1024];
        let _ = socket.read(&mut request).await;
        let chunk = |delta: &str, finish: &str| {
            format!(
                "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"/models/tiny\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
            )
        };
        let body = [
            chunk(r#"{"role":"assistant","content":"hello"}"#, "null"),
            chunk("{}", r#""stop""#),
            "data: {\"id\":\"c\",\"object\":\"chat.completion\",\"model\":\"/models/tiny\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1,\"total_tokens\":6}}\n\n".to_string(),
            "data: [DONE]\n\n".to_string(),
        ]
        .concat();
        let head = "HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n";
        socket.write_all(format!("{head}{body}").as_bytes()).await.expect("write");
        // The connection stays open: the end of the body is not known yet.
        let _ = released.await;
    });
    let gw = gateway(&one_model_yaml(&url, 1, 4)).await;
    let body = json!({"model": "qwen", "input": "hi", "stream": true});
    let mut response = client().post(gw.url("/v1/responses")).json(&body).send().await.expect("send");
    assert_eq!(response.status(), 200);
    let seen = read_until(&mut response, "response.completed").await;
    assert!(seen.contains("\"status\":\"completed\""), "{seen}");
    drop(response);
    let series = "mlxgate_requests_total{backend=\"local\",client=\"anonymous\",model=\"qwen\",outcome=\"ok\"}";
    eventually("the answer counted whole", || async { metric(&gw, series).await == Some(1.0) }).await;
    let closed =
        "mlxgate_requests_total{backend=\"local\",client=\"anonymous\",model=\"qwen\",outcome=\"client_closed\"}";
    assert_eq!(metric(&gw, closed).await.unwrap_or(0.0), 0.0);
    let _ = release.send(());
}

/// `text.format` (what the SDK's `responses.parse` sends) reaches the backend as the chat
/// `response_format`; `json_object` as is; `text` as nothing.
#[tokio::test]
async fn text_format_reaches_the_backend_as_response_format() {
    // A scripted simulator answers a request for JSON with an instance of its schema.
    let sim = scripted(json!({}), Behaviour::default()).await;
    let gw = gateway_for(&sim).await;
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    let format = json!({"type": "json_schema", "name": "Out", "schema": schema, "strict": true, "description": "d"});
    let (status, text) =
        responses(&gw, &json!({"model": "qwen", "input": "weather?", "text": {"format": format}})).await;
    assert_eq!(status, 200, "{text}");
    let sent = last_backend_request(&sim).await;
    assert_eq!(
        sent["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "Out", "schema": schema, "strict": true, "description": "d"}}),
        "backend got: {sent}"
    );
    // The output text is the simulator's instance of the schema.
    let response: Value = serde_json::from_str(&text).expect("json");
    let answer: Value = serde_json::from_str(response["output"][0]["content"][0]["text"].as_str().expect("text"))
        .unwrap_or_else(|e| panic!("{e}: {response}"));
    assert!(answer["city"].is_string(), "{answer}");

    for (format, want) in
        [(json!({"type": "json_object"}), json!({"type": "json_object"})), (json!({"type": "text"}), Value::Null)]
    {
        let (status, _) = responses(&gw, &json!({"model": "qwen", "input": "x", "text": {"format": format}})).await;
        assert_eq!(status, 200);
        assert_eq!(last_backend_request(&sim).await["response_format"], want);
    }
}

/// An input with no item a chat backend can use is a 400 on `input`, never an empty
/// conversation sent to the backend (mlx_lm.server's 404).
#[tokio::test]
async fn an_input_with_no_usable_item_is_a_400_and_nothing_is_sent() {
    let sim = sim().await;
    let gw = gateway_for(&sim).await;
    let inputs = [json!([]), json!(null), json!([{"type": "item_reference", "id": "msg_1"}])];
    for input in inputs {
        let (status, text) =
            responses(&gw, &json!({"model": "qwen", "instructions": "Be brief.", "input": input})).await;
        assert_eq!(status, 400, "input {input}: {text}");
        let body: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(body["error"]["param"], "input", "{body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    }
    let (status, text) = responses(&gw, &json!({"model": "qwen"})).await;
    assert_eq!(status, 400, "no input: {text}");
    assert!(sim_requests(&sim).await.is_empty(), "the backend got an empty conversation");
}

/// A call cut by `max_output_tokens` and sent back as it was: its arguments reach the backend
/// as valid JSON (mlx_lm.server parses them and answers 404 otherwise).
#[tokio::test]
async fn history_arguments_that_are_not_json_reach_the_backend_as_json() {
    let sim = sim().await;
    let gw = gateway_for(&sim).await;
    let input = json!([
        {"role": "user", "content": "run it"},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{\"cmd\": \"ec"},
        {"type": "function_call_output", "call_id": "c1", "output": "cut"},
    ]);
    let (status, text) = responses(&gw, &json!({"model": "qwen", "input": input})).await;
    assert_eq!(status, 200, "{text}");
    let sent = last_backend_request(&sim).await;
    let arguments = sent["messages"][1]["tool_calls"][0]["function"]["arguments"].as_str().expect("string");
    let parsed: Value = serde_json::from_str(arguments).unwrap_or_else(|e| panic!("{e}: {arguments}"));
    assert_eq!(parsed, "{\"cmd\": \"ec");
}

/// A Responses stream the backend cut: `response.failed` names the request id (as the chat
/// face's error event does) and the error's type, and its output shows the text already sent.
#[tokio::test]
async fn a_failed_stream_names_its_request_id_and_keeps_the_text_so_far() {
    let sim = sim_with(Behaviour { tokens: Some(8), drop_after: Some(3), ..Default::default() }).await;
    let gw = gateway_for(&sim).await;
    let response = client()
        .post(gw.url("/v1/responses"))
        .header("x-request-id", "trace-review-1")
        .json(&json!({"model": "qwen", "input": "hi", "stream": true}))
        .send()
        .await
        .expect("send");
    let body = text_of(response).await;
    let events = parse_events(&body);
    let failed = events.iter().find(|e| e["type"] == "response.failed").unwrap_or_else(|| panic!("{body}"));
    let error = &failed["response"]["error"];
    assert_eq!(error["request_id"], "trace-review-1", "{error}");
    assert_eq!(error["type"], "backend_error", "{error}");
    assert_eq!(error["code"], "server_error", "{error}");
    let streamed: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert!(!streamed.is_empty(), "{body}");
    let output = &failed["response"]["output"];
    assert_eq!(output[0]["status"], "incomplete", "{output}");
    assert_eq!(output[0]["content"][0]["text"], streamed.as_str(), "{output}");
}

/// A backend on a raw socket that answers every POST with `sse` (HTTP/1.0-style: the body ends
/// at the close) and every GET with an empty model list.
async fn canned_backend(sse: String) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { return };
            let sse = sse.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                let head_end = loop {
                    let n = socket.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break at + 4;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                while buf.len() < head_end + length {
                    let n = socket.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let response = if head.starts_with("post") {
                    format!("HTTP/1.0 200 OK\r\ncontent-type: text/event-stream\r\n\r\n{sse}")
                } else {
                    let body = r#"{"object":"list","data":[{"id":"tiny-qwen3","object":"model"}]}"#;
                    format!(
                        "HTTP/1.0 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    )
                };
                let _ = socket.write_all(response.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    url
}

/// Two tool calls, each sent whole in its own chunk without `index` or `id` (a server that
/// streams every call complete), are two `function_call` items, not one "readwrite" with
/// arguments `{"p":1}{"q":2}`.
#[tokio::test]
async fn whole_calls_in_separate_chunks_without_index_are_separate_items() {
    let frame = |delta: Value, finish: Value| {
        let chunk = json!({"id": "c", "object": "chat.completion.chunk", "model": "m",
                           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        format!("data: {chunk}\n\n")
    };
    let call =
        |name: &str, arguments: &str| json!({"type": "function", "function": {"name": name, "arguments": arguments}});
    let sse = [
        frame(json!({"role": "assistant", "tool_calls": [call("read", "{\"p\":1}")]}), Value::Null),
        frame(json!({"tool_calls": [call("write", "{\"q\":2}")]}), Value::Null),
        frame(json!({}), json!("tool_calls")),
        "data: [DONE]\n\n".to_string(),
    ]
    .concat();
    let url = canned_backend(sse).await;
    let gw = gateway(&one_model_yaml(&url, 4, 16)).await;
    let tools = json!([{"type": "function", "name": "read"}, {"type": "function", "name": "write"}]);
    let (status, body) = responses(&gw, &json!({"model": "qwen", "input": "go", "stream": true, "tools": tools})).await;
    assert_eq!(status, 200, "{body}");
    let done: Vec<Value> =
        done_items(&parse_events(&body)).iter().map(|item| json!([item["name"], item["arguments"]])).collect();
    assert_eq!(done, vec![json!(["read", "{\"p\":1}"]), json!(["write", "{\"q\":2}"])], "{body}");
}

/// A prompt over the context cap is refused on `input`, the field the client sent (the cap is
/// measured on the chat `messages` it becomes).
#[tokio::test]
async fn a_prompt_over_the_cap_is_refused_on_input() {
    let sim = sim().await;
    let yaml = format!(
        "backends:\n  local: {{url: '{}', max_concurrency: 4, context_cap: 2048}}\n\
         models:\n  qwen: {{backend: local, upstream_model: tiny-qwen3, max_queue: 16, max_wait: 60s}}\n",
        sim.url()
    );
    let gw = gateway(&yaml).await;
    let words: Vec<String> = (0..5000).map(|i| format!("w{i}")).collect();
    let (status, text) = responses(&gw, &json!({"model": "qwen", "input": words.join(" ")})).await;
    assert_eq!(status, 400, "{text}");
    let body: Value = serde_json::from_str(&text).expect("json");
    let error = &body["error"];
    assert_eq!(error["code"], "context_length_exceeded", "{body}");
    assert_eq!(error["param"], "input", "{body}");
    let message = error["message"].as_str().expect("message");
    assert!(message.contains("your input") && !message.contains("messages"), "{message}");
    assert!(error["request_id"].is_string(), "{body}");
    assert!(sim_requests(&sim).await.is_empty());
}
