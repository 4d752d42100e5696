//! The translation's unit tests: each input shape, tool kind and field, and Codex's recorded
//! requests (tests/data/agents).

use super::*;

fn chat(request: Value) -> (Map<String, Value>, Translated) {
    let translated = translate(request.to_string().as_bytes()).expect("translated");
    let fields = serde_json::to_value(&translated.fields).expect("encode");
    let Value::Object(fields) = fields else { panic!("not an object") };
    (fields, translated)
}

fn refused(request: Value) -> GatewayError {
    translate(request.to_string().as_bytes()).expect_err("refused")
}

#[test]
fn a_string_input_with_instructions_and_the_sampling_fields() {
    let (fields, translated) = chat(json!({
        "model": "qwen", "instructions": "Be brief.", "input": "Hello",
        "max_output_tokens": 64, "temperature": 0.2, "top_p": 0.9, "stream": true,
        // Fields a chat backend has no use for: ignored, never refused.
        "store": false, "include": ["reasoning.encrypted_content"], "reasoning": {"summary": "auto"},
        "text": {"verbosity": "low"}, "client_metadata": {"a": 1}, "metadata": {"b": "c"},
        "truncation": "auto", "user": "u", "service_tier": "auto", "prompt_cache_key": "session-1",
    }));
    assert_eq!(
        Value::Object(fields),
        json!({
            "model": "qwen",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
            "max_tokens": 64, "temperature": 0.2, "top_p": 0.9,
            "stream": true, "stream_options": {"include_usage": true},
        })
    );
    assert_eq!(translated.session.as_deref(), Some("session-1"));
    assert_eq!(translated.shape.model, "qwen");
    assert_eq!(translated.shape.echo.max_output_tokens, Some(json!(64)));
    // Not streamed: no stream_options, no limit (the pipeline adds the model's default).
    let (fields, translated) = chat(json!({"model": "qwen", "input": "Hi"}));
    assert_eq!(fields["stream"], false);
    assert!(!fields.contains_key("stream_options") && !fields.contains_key("max_tokens"));
    assert_eq!(translated.session, None);
}

#[test]
fn server_side_state_is_refused_with_a_clear_400() {
    for (request, param) in [
        (json!({"model": "qwen", "input": "x", "store": true}), "store"),
        (json!({"model": "qwen", "input": "x", "previous_response_id": "resp_1"}), "previous_response_id"),
        (json!({"model": "qwen", "input": "x", "conversation": "conv_1"}), "conversation"),
    ] {
        let e = refused(request);
        assert_eq!(e.status(), axum::http::StatusCode::BAD_REQUEST);
        let body = e.body();
        assert_eq!(body["error"]["param"], param);
        assert_eq!(body["error"]["type"], "invalid_request_error");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains("only stateless"), "{message}");
    }
    // `store: false`, a null previous_response_id, no store at all: served.
    chat(json!({"model": "qwen", "input": "x", "store": false, "previous_response_id": null}));
    assert_eq!(refused(json!([1])).status(), axum::http::StatusCode::BAD_REQUEST);
    assert_eq!(refused(json!({"model": "qwen", "input": 3})).body()["error"]["param"], "input");
}

#[test]
fn text_format_is_the_chat_response_format() {
    let schema = json!({"type": "object", "properties": {"a": {"type": "string"}}});
    let (fields, _) = chat(json!({"model": "qwen", "input": "x", "text": {"verbosity": "low", "format":
        {"type": "json_schema", "name": "Out", "schema": schema, "strict": true, "description": "d"}}}));
    assert_eq!(
        fields["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "Out", "schema": schema, "strict": true, "description": "d"}})
    );
    let (fields, _) = chat(json!({"model": "qwen", "input": "x", "text": {"format": {"type": "json_schema",
        "name": "Out", "schema": schema, "strict": null}}}));
    assert_eq!(fields["response_format"]["json_schema"], json!({"name": "Out", "schema": schema}));
    let (fields, _) = chat(json!({"model": "qwen", "input": "x", "text": {"format": {"type": "json_object"}}}));
    assert_eq!(fields["response_format"], json!({"type": "json_object"}));
    for text in [json!({"format": {"type": "text"}}), json!({"verbosity": "low"}), json!(null)] {
        let (fields, _) = chat(json!({"model": "qwen", "input": "x", "text": text}));
        assert!(!fields.contains_key("response_format"), "{text}");
    }
}

#[test]
fn an_input_with_nothing_to_send_is_a_400_on_input() {
    for request in [
        json!({"model": "qwen", "input": []}),
        json!({"model": "qwen", "instructions": "Be brief.", "input": null}),
        json!({"model": "qwen", "instructions": "Be brief."}),
        json!({"model": "qwen", "input": [{"type": "item_reference", "id": "msg_1"},
                                          {"type": "web_search_call", "id": "ws_1"}]}),
        json!({"model": "qwen", "input": [{"role": "developer", "content": ""}]}),
    ] {
        let e = refused(request.clone());
        assert_eq!(e.status(), axum::http::StatusCode::BAD_REQUEST, "{request}");
        assert_eq!(e.body()["error"]["param"], "input", "{request}");
    }
    // A developer message alone is something to send: the system message.
    let (fields, _) = chat(json!({"model": "qwen", "input": [{"role": "developer", "content": "d"}]}));
    assert_eq!(fields["messages"], json!([{"role": "system", "content": "d"}]));
}

#[test]
fn history_arguments_that_are_not_json_become_json() {
    let (fields, _) = chat(json!({"model": "qwen", "input": [
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "a", "name": "shell", "arguments": "{\"cmd\": \"ec"},
        {"type": "function_call", "call_id": "b", "name": "shell", "arguments": ""},
        {"type": "function_call", "call_id": "c", "name": "shell", "arguments": "{\"cmd\": \"ls\"}"},
    ]}));
    let calls = fields["messages"][1]["tool_calls"].as_array().expect("calls");
    let arguments: Vec<&Value> = calls.iter().map(|c| &c["function"]["arguments"]).collect();
    assert_eq!(arguments, [&json!("\"{\\\"cmd\\\": \\\"ec\""), &json!("{}"), &json!("{\"cmd\": \"ls\"}")]);
}

/// A Codex turn as it sends it: instructions, a developer message, the user's context and
/// prompt, then its tool loop (reasoning, parallel calls, their outputs, a custom tool),
/// and a developer message added later.
#[test]
fn a_codex_conversation_becomes_chat_messages() {
    let (fields, _) = chat(json!({
        "model": "qwen", "instructions": "You are Codex.", "store": false, "stream": true,
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "summary"}],
             "content": [{"type": "reasoning_text", "text": "I should run ls."}], "encrypted_content": null},
            {"type": "function_call", "name": "shell", "arguments": "{\"command\":[\"ls\"]}", "call_id": "call_1"},
            {"type": "function_call", "name": "shell", "arguments": "{\"command\":[\"pwd\"]}", "call_id": "call_2"},
            {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
            {"type": "function_call_output", "call_id": "call_2",
             "output": [{"type": "input_text", "text": "/tmp"}, {"type": "input_image", "image_url": "data:"}]},
            {"type": "custom_tool_call", "call_id": "call_3", "name": "apply_patch", "input": "*** Begin Patch"},
            {"type": "custom_tool_call_output", "call_id": "call_3", "output": "Done!"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a.txt in /tmp"}]},
            {"type": "message", "role": "developer", "content": "<model switched>"},
            {"role": "user", "content": "thanks"},
            {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search"}},
            {"type": "item_reference", "id": "msg_1"},
        ],
    }));
    let call = |id: &str, name: &str, arguments: &str| json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}});
    assert_eq!(
        fields["messages"],
        json!([
            {"role": "system", "content": "You are Codex.\n\n<permissions>"},
            {"role": "user", "content": "<environment_context>"},
            {"role": "user", "content": "list the files"},
            {"role": "assistant", "content": "", "reasoning_content": "I should run ls.", "tool_calls": [
                call("call_1", "shell", "{\"command\":[\"ls\"]}"),
                call("call_2", "shell", "{\"command\":[\"pwd\"]}"),
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
            {"role": "tool", "tool_call_id": "call_2", "content": "/tmp"},
            {"role": "assistant", "content": "", "tool_calls": [
                call("call_3", "apply_patch", "{\"input\":\"*** Begin Patch\"}"),
            ]},
            {"role": "tool", "tool_call_id": "call_3", "content": "Done!"},
            {"role": "assistant", "content": "a.txt in /tmp"},
            {"role": "user", "content": "<model switched>"},
            {"role": "user", "content": "thanks"},
        ])
    );
}

#[test]
fn a_text_and_its_calls_are_one_assistant_turn_and_reasoning_without_one_is_dropped() {
    let (fields, _) = chat(json!({"model": "qwen", "input": [
        {"role": "user", "content": "go"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "only a summary"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Running it."}]},
        {"type": "function_call", "name": "shell", "arguments": "{}", "call_id": "c1"},
        {"type": "local_shell_call", "call_id": "c2", "status": "completed",
         "action": {"type": "exec", "command": ["ls"], "working_directory": "/w", "timeout_ms": 5}},
        {"type": "local_shell_call_output", "id": "c2", "output": "x"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "lost"}]},
        {"role": "user", "content": "next"},
    ]}));
    let messages = fields["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 4);
    assert_eq!(messages[1]["content"], "Running it.");
    assert_eq!(messages[1]["reasoning_content"], "only a summary");
    let calls = messages[1]["tool_calls"].as_array().expect("calls");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1]["function"]["name"], LOCAL_SHELL);
    let arguments: Value =
        serde_json::from_str(calls[1]["function"]["arguments"].as_str().expect("string")).expect("json");
    assert_eq!(arguments, json!({"command": ["ls"], "workdir": "/w", "timeout_ms": 5}));
    assert_eq!(messages[2], json!({"role": "tool", "tool_call_id": "c2", "content": "x"}));
    assert_eq!(messages[3], json!({"role": "user", "content": "next"}));
}

#[test]
fn user_images_stay_parts_and_text_parts_are_joined() {
    let (fields, _) = chat(json!({"model": "qwen", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "see"},
                                     {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "low"},
                                     {"type": "input_image", "file_id": "file_1"},
                                     {"type": "input_file", "file_id": "file_2"}]},
    ]}));
    assert_eq!(fields["messages"][0]["content"], "ab");
    assert_eq!(
        fields["messages"][1]["content"],
        json!([{"type": "text", "text": "see"},
               {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA", "detail": "low"}}])
    );
}

#[test]
fn tools_map_to_functions_where_they_can_and_are_dropped_otherwise() {
    let (fields, translated) = chat(json!({"model": "qwen", "input": "x", "parallel_tool_calls": false,
    "tool_choice": {"type": "custom", "name": "apply_patch"},
    "tools": [
        {"type": "function", "name": "shell", "description": "Runs a command.", "strict": false,
         "parameters": {"type": "object", "properties": {"command": {"type": "array"}}}},
        {"type": "function", "name": "no_parameters"},
        {"type": "custom", "name": "apply_patch", "description": "Edits files.",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch"}},
        {"type": "local_shell"},
        {"type": "web_search", "external_web_access": false},
        {"type": "image_generation", "output_format": "png"},
        {"type": "namespace", "name": "multi_agent_v1", "description": "d", "tools": [
            {"type": "function", "name": "close_agent", "parameters": {"type": "object", "properties": {}}}]},
        {"type": "file_search", "vector_store_ids": []},
    ]}));
    let tools = fields["tools"].as_array().expect("tools");
    let names: Vec<&Value> = tools.iter().map(|t| &t["function"]["name"]).collect();
    assert_eq!(
        names,
        [&json!("shell"), &json!("no_parameters"), &json!("apply_patch"), &json!("local_shell"), &json!("close_agent")]
    );
    assert!(tools.iter().all(|t| t["type"] == "function"));
    assert_eq!(tools[0]["function"]["parameters"]["properties"]["command"]["type"], "array");
    assert_eq!(tools[1]["function"]["parameters"], json!({"type": "object", "properties": {}}));
    let patch = &tools[2]["function"];
    assert_eq!(patch["parameters"]["required"], json!([CUSTOM_INPUT]));
    let description = patch["description"].as_str().expect("description");
    assert!(description.starts_with("Edits files.") && description.contains("lark grammar:\nstart: begin_patch"));
    assert_eq!(fields["tool_choice"], json!({"type": "function", "function": {"name": "apply_patch"}}));
    assert_eq!(fields["parallel_tool_calls"], false);
    let shape = &translated.shape;
    assert_eq!(shape.kind_of("shell"), ToolKind::Function);
    assert_eq!(shape.kind_of("apply_patch"), ToolKind::Custom);
    assert_eq!(shape.kind_of("local_shell"), ToolKind::LocalShell);
    assert_eq!(shape.kind_of("unknown"), ToolKind::Function);
    assert_eq!(shape.echo.parallel_tool_calls, Some(false));
    assert_eq!(shape.namespaces.get("close_agent").map(String::as_str), Some("multi_agent_v1"));
    assert_eq!(shape.namespaces.get("shell"), None);

    // Only hosted tools: no tools, no choice, no parallel flag for the backend.
    let (fields, _) = chat(json!({"model": "qwen", "input": "x", "tool_choice": "required",
        "parallel_tool_calls": true, "tools": [{"type": "web_search"}]}));
    assert!(!fields.contains_key("tools") && !fields.contains_key("tool_choice"));
    assert!(!fields.contains_key("parallel_tool_calls"));
}

#[test]
fn tool_choice_modes_and_names() {
    let kinds = HashMap::from([("f".to_string(), ToolKind::Function), (LOCAL_SHELL.to_string(), ToolKind::LocalShell)]);
    assert_eq!(tool_choice(&json!("auto"), &kinds), Some(json!("auto")));
    assert_eq!(tool_choice(&json!("required"), &kinds), Some(json!("required")));
    assert_eq!(tool_choice(&json!("none"), &kinds), Some(json!("none")));
    assert_eq!(
        tool_choice(&json!({"type": "function", "name": "f"}), &kinds),
        Some(json!({"type": "function", "function": {"name": "f"}}))
    );
    assert_eq!(
        tool_choice(&json!({"type": "local_shell"}), &kinds),
        Some(json!({"type": "function", "function": {"name": "local_shell"}}))
    );
    // A dropped tool, a hosted tool, an allowed-tools list: the backend's default.
    assert_eq!(tool_choice(&json!({"type": "function", "name": "gone"}), &kinds), None);
    assert_eq!(tool_choice(&json!({"type": "web_search_preview"}), &kinds), None);
    assert_eq!(tool_choice(&json!({"type": "allowed_tools", "mode": "auto", "tools": []}), &kinds), None);
}

/// Codex's recorded requests (tests/data/agents).
mod recorded {
    use super::*;

    /// Codex CLI 0.171's first request, as it sent it (tests/data/agents).
    #[test]
    fn codex_s_recorded_request_translates() {
        let body = include_str!("../../../../tests/data/agents/codex-responses.json");
        let translated = translate(body.as_bytes()).expect("translated");
        assert_eq!(translated.session.as_deref(), Some("00000000-0000-7000-8000-000000000005"));
        let fields = serde_json::to_value(&translated.fields).expect("encode");
        let messages = fields["messages"].as_array().expect("messages");
        let roles: Vec<&str> = messages.iter().filter_map(|m| m["role"].as_str()).collect();
        // Its two developer messages are the one system message; its context and prompt follow.
        assert_eq!(roles, ["system", "user", "user"]);
        assert!(messages[0]["content"].as_str().is_some_and(|t| t.contains("<skills_instructions>")));
        assert_eq!(messages[2]["content"], "Run the shell command: echo hi");
        let tools = fields["tools"].as_array().expect("tools");
        let names: Vec<&str> = tools.iter().filter_map(|t| t["function"]["name"].as_str()).collect();
        assert!(names.contains(&"exec_command") && names.contains(&"close_agent"), "{names:?}");
        // web_search has nothing to run it here.
        assert!(!names.contains(&"web_search"));
        assert_eq!(fields["tool_choice"], "auto");
        assert_eq!(fields["stream_options"], json!({"include_usage": true}));
        for dropped in ["include", "reasoning", "store", "client_metadata", "prompt_cache_key", "input"] {
            assert!(fields.get(dropped).is_none(), "{dropped} reached the backend");
        }
    }

    /// Its second request: the call it made and the call's output, sent back.
    #[test]
    fn codex_s_recorded_second_turn_translates_into_a_tool_call_and_a_tool_message() {
        let body = include_str!("../../../../tests/data/agents/codex-responses-turn2.json");
        let translated = translate(body.as_bytes()).expect("translated");
        let fields = serde_json::to_value(&translated.fields).expect("encode");
        let messages = fields["messages"].as_array().expect("messages");
        let roles: Vec<&str> = messages.iter().filter_map(|m| m["role"].as_str()).collect();
        assert_eq!(roles, ["system", "user", "user", "assistant", "tool"]);
        let call = &messages[3]["tool_calls"][0];
        assert_eq!(call["id"], "call_1");
        assert_eq!(call["function"]["name"], "exec_command");
        assert_eq!(call["function"]["arguments"], "{\"cmd\": \"echo sim-tool-result-5c1e | tee tool-output.txt\"}");
        assert_eq!(messages[3]["content"], "");
        assert_eq!(messages[4]["tool_call_id"], "call_1");
        assert!(messages[4]["content"].as_str().is_some_and(|c| c.ends_with("sim-tool-result-5c1e\n")));
    }
}
