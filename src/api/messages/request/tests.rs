//! The translation's unit tests: each content block, tool field and switch, the billing block,
//! byte-identical prefixes across turns, and Claude Code's recorded request (tests/data/agents).

use super::*;

fn chat(request: Value) -> (Map<String, Value>, Translated) {
    let translated = translate(request.to_string().as_bytes()).expect("translated");
    let fields = serde_json::to_value(&translated.fields).expect("encode");
    let Value::Object(fields) = fields else { panic!("not an object") };
    (fields, translated)
}

/// The chat body's bytes, as the pipeline encodes them.
fn bytes(request: &Value) -> String {
    let translated = translate(request.to_string().as_bytes()).expect("translated");
    serde_json::to_string(&translated.fields).expect("encode")
}

#[test]
fn a_plain_request_with_the_sampling_fields() {
    let (fields, translated) = chat(json!({
        "model": "claude-sonnet-4-5", "max_tokens": 1024, "system": "Be brief.",
        "messages": [{"role": "user", "content": "Hello"}],
        "temperature": 0.2, "top_p": 0.9, "top_k": 40, "stop_sequences": ["END"], "stream": true,
        // Fields a chat backend has no use for: ignored, never refused.
        "context_management": {"edits": []}, "output_config": {"effort": "high"}, "container": "c",
        "mcp_servers": [], "service_tier": "auto", "metadata": {"user_id": "user_abc_session_1"},
    }));
    assert_eq!(
        Value::Object(fields),
        json!({
            "model": "claude-sonnet-4-5",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
            "stop": ["END"], "max_tokens": 1024, "temperature": 0.2, "top_p": 0.9, "top_k": 40,
            "stream": true, "stream_options": {"include_usage": true},
        })
    );
    assert_eq!(translated.session.as_deref(), Some("user_abc_session_1"));
    assert_eq!(translated.shape.model, "claude-sonnet-4-5");
    assert_eq!(translated.shape.stop_sequences, ["END"]);
    assert!(translated.shape.thinking);
    assert_eq!(translated.billing_blocks_stripped, 0);
    // `stream` defaults to false: no stream_options.
    let (fields, translated) = chat(json!({"model": "m", "messages": [{"role": "user", "content": "Hi"}]}));
    assert_eq!(fields["stream"], false);
    assert!(!fields.contains_key("stream_options") && !fields.contains_key("max_tokens"));
    assert_eq!(translated.session, None);
}

#[test]
fn the_billing_block_is_dropped_and_counted_and_the_other_system_blocks_joined() {
    let request = |nonce: &str| {
        json!({"model": "m", "max_tokens": 10,
            "system": [
                {"type": "text", "text": format!("x-anthropic-billing-header: cc_version=2.1.3.a1b; cc_entrypoint=cli; cch={nonce};")},
                {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "Rules.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
            ],
            "messages": [{"role": "user", "content": "hi"}]})
    };
    let (fields, translated) = chat(request("00001"));
    assert_eq!(translated.billing_blocks_stripped, 1);
    assert_eq!(fields["messages"][0], json!({"role": "system", "content": "You are Claude Code.\n\nRules."}));
    // Another nonce: the same bytes.
    assert_eq!(bytes(&request("00001")), bytes(&request("9f3c2")));
    // Only the billing block: no system message at all.
    let (fields, translated) = chat(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1;"}]}));
    assert_eq!(translated.billing_blocks_stripped, 1);
    assert_eq!(fields["messages"], json!([{"role": "user", "content": "hi"}]));
    // A system string that begins with it loses that line only.
    let (fields, translated) = chat(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
        "system": "x-anthropic-billing-header: cc_version=1; cch=2;\nYou are helpful."}));
    assert_eq!(translated.billing_blocks_stripped, 1);
    assert_eq!(fields["messages"][0]["content"], "You are helpful.");
    // The line elsewhere than at a block's start is the client's text.
    let (fields, translated) = chat(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
        "system": [{"type": "text", "text": "About x-anthropic-billing-header: nothing."}]}));
    assert_eq!(translated.billing_blocks_stripped, 0);
    assert_eq!(fields["messages"][0]["content"], "About x-anthropic-billing-header: nothing.");
}

#[test]
fn tools_and_their_calls_round_trip_with_ids_and_results_in_order() {
    let (fields, _) = chat(json!({
        "model": "m", "max_tokens": 100,
        "tools": [
            {"name": "Bash", "description": "Runs a command.", "cache_control": {"type": "ephemeral"},
             "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}},
            {"name": "Read", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
        ],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
        "messages": [
            {"role": "user", "content": "list and read"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls", "a": 1}},
                {"type": "tool_use", "id": "toolu_2", "name": "Read", "input": {}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true,
                 "content": [{"type": "text", "text": "no such file"}, {"type": "image", "source": {}}]},
                {"type": "text", "text": "go on", "cache_control": {"type": "ephemeral"}},
            ]},
        ],
    }));
    assert_eq!(
        fields["tools"],
        json!([
            {"type": "function", "function": {"name": "Bash", "description": "Runs a command.",
              "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
            {"type": "function", "function": {"name": "Read",
              "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}},
        ])
    );
    assert_eq!(fields["tool_choice"], "auto");
    assert_eq!(fields["parallel_tool_calls"], false);
    assert_eq!(
        fields["messages"],
        json!([
            {"role": "user", "content": "list and read"},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "Bash", "arguments": "{\"command\":\"ls\",\"a\":1}"}},
                {"id": "toolu_2", "type": "function", "function": {"name": "Read", "arguments": "{}"}},
            ]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "a.txt"},
            {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no such file\n[image]"},
            {"role": "user", "content": "go on"},
        ])
    );
}

#[test]
fn tool_choice_modes() {
    let with = |choice: Value| {
        let (fields, _) = chat(json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "tools": [{"name": "Bash", "input_schema": {"type": "object"}}], "tool_choice": choice}));
        (fields.get("tool_choice").cloned(), fields.get("parallel_tool_calls").cloned())
    };
    assert_eq!(with(json!({"type": "any"})), (Some(json!("required")), None));
    assert_eq!(with(json!({"type": "none"})), (Some(json!("none")), None));
    assert_eq!(
        with(json!({"type": "tool", "name": "Bash"})),
        (Some(json!({"type": "function", "function": {"name": "Bash"}})), None)
    );
    // A tool not offered, an unknown mode: the backend's default.
    assert_eq!(with(json!({"type": "tool", "name": "Nope"})), (None, None));
    assert_eq!(with(json!({"type": "whatever"})), (None, None));
    // No tools: no choice at all.
    let (fields, _) = chat(json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
        "tool_choice": {"type": "any"}}));
    assert!(!fields.contains_key("tool_choice") && !fields.contains_key("tools"));
}

#[test]
fn thinking_is_the_templates_switch_and_history_thinking_is_reasoning_content() {
    let switch = |thinking: Value| {
        let (fields, translated) =
            chat(json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "thinking": thinking}));
        (fields.get("chat_template_kwargs").cloned(), translated.shape.thinking)
    };
    let on = Some(json!({"enable_thinking": true}));
    assert_eq!(switch(json!({"type": "enabled", "budget_tokens": 2048})), (on.clone(), true));
    assert_eq!(switch(json!({"type": "adaptive"})), (on, true));
    assert_eq!(switch(json!({"type": "disabled"})), (Some(json!({"enable_thinking": false})), false));
    assert_eq!(switch(json!({"type": "other"})), (None, true));
    let (fields, _) = chat(json!({"model": "m", "messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I should run ls.", "signature": "sig"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}},
        ]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
    ]}));
    assert_eq!(
        fields["messages"][1],
        json!({"role": "assistant", "content": "", "reasoning_content": "I should run ls.", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "Bash", "arguments": "{\"command\":\"ls\"}"}}]})
    );
    // A user message of tool results only: no empty user message after them.
    assert_eq!(fields["messages"].as_array().map(Vec::len), Some(3));
}

#[test]
fn images_become_image_url_parts_and_text_blocks_a_string() {
    let (fields, _) = chat(json!({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "AAAA"}},
        {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "doc text"}},
    ]}]}));
    assert_eq!(
        fields["messages"][0]["content"],
        json!([
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA"}},
            {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
            {"type": "text", "text": "doc text"},
        ])
    );
    let (fields, _) = chat(json!({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>r</system-reminder>"}, {"type": "text", "text": "do it"}]}]}));
    assert_eq!(fields["messages"][0]["content"], "<system-reminder>r</system-reminder>\n\ndo it");
}

#[test]
fn history_inputs_that_are_strings_are_made_json_arguments() {
    assert_eq!(arguments(Some(&json!("{\"a\":1}"))), "{\"a\":1}");
    assert_eq!(arguments(Some(&json!("{\"cmd\": \"ec"))), "\"{\\\"cmd\\\": \\\"ec\"");
    assert_eq!(arguments(Some(&json!(""))), "{}");
    assert_eq!(arguments(None), "{}");
    assert_eq!(arguments(Some(&json!({"b": 1, "a": 2}))), "{\"b\":1,\"a\":2}", "the input's own key order");
}

#[test]
fn a_request_without_messages_is_refused_and_bad_json_too() {
    for request in
        [json!({"model": "m"}), json!({"model": "m", "messages": []}), json!({"model": "m", "messages": "x"})]
    {
        let e = translate(request.to_string().as_bytes()).expect_err("refused");
        assert_eq!(e.status(), axum::http::StatusCode::BAD_REQUEST);
        assert_eq!(e.body()["error"]["param"], "messages");
    }
    assert!(translate(b"not json").is_err());
    assert!(translate(br#"{"model":"m","system":5,"messages":[{"role":"user","content":"x"}]}"#).is_err());
}

#[test]
fn consecutive_turns_share_the_whole_previous_body_as_a_prefix() {
    // Turn 1, then turn 2 = turn 1's messages + the answer + a new user message; the billing
    // nonce changes, Claude Code moves its cache_control marks.
    let system = |nonce: &str| {
        json!([
            {"type": "text", "text": format!("x-anthropic-billing-header: cc_version=2.1.{nonce}; cc_entrypoint=cli; cch={nonce};")},
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        ])
    };
    let tools =
        json!([{"name": "Bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]);
    let first = json!({"model": "m", "max_tokens": 32000, "stream": true, "system": system("a1"), "tools": tools,
        "thinking": {"type": "adaptive"},
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}]});
    let second = json!({"model": "m", "max_tokens": 32000, "stream": true, "system": system("b2"), "tools": tools,
    "thinking": {"type": "adaptive"},
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
        {"role": "user", "content": [{"type": "text", "text": "more", "cache_control": {"type": "ephemeral"}}]},
    ]});
    let (one, two) = (bytes(&first), bytes(&second));
    // The messages array of turn 1 without its closing bracket is a prefix of turn 2's.
    let messages_of = |body: &str| {
        let start = body.find("\"messages\":").expect("messages");
        let end = body.find("],\"tools\"").expect("tools after messages");
        body[start..end].to_string()
    };
    let (m1, m2) = (messages_of(&one), messages_of(&two));
    assert!(m2.starts_with(&m1), "{m1}\n{m2}");
    // Everything before the messages (model) and after them (tools, limits) is byte-identical.
    assert_eq!(one[..one.find("\"messages\"").expect("m")], two[..two.find("\"messages\"").expect("m")]);
    assert_eq!(one[one.find("],\"tools\"").expect("t")..], two[two.find("],\"tools\"").expect("t")..]);
}

/// Claude Code's recorded request (tests/data/agents/claude-code-messages.json), when present.
#[test]
fn claude_codes_recorded_request_translates_without_its_billing_block() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/agents/claude-code-messages.json");
    let Ok(text) = std::fs::read_to_string(path) else {
        assert!(std::env::var_os("CI").is_none(), "{path} is missing");
        eprintln!("skipped: {path} is missing");
        return;
    };
    let recorded: Value = serde_json::from_str(&text).expect("json");
    // The fixture is the body, or a recording with the body under `body`.
    let body = recorded.get("body").cloned().unwrap_or(recorded);
    let (fields, translated) = chat(body.clone());
    let had_billing = body["system"]
        .as_array()
        .is_some_and(|blocks| blocks.iter().any(|b| b["text"].as_str().is_some_and(is_billing)));
    assert_eq!(translated.billing_blocks_stripped, u64::from(had_billing));
    let text = serde_json::to_string(&fields).expect("encode");
    assert!(!text.contains(BILLING_PREFIX) && !text.contains("cache_control"));
    let offered = body["tools"].as_array().map_or(0, Vec::len);
    let sent = fields.get("tools").and_then(Value::as_array).map_or(0, Vec::len);
    assert_eq!(sent, offered, "Claude Code's tools are all client tools");
    assert_eq!(fields["stream"], body["stream"]);
    // Claude Code 2.1.332: the two other system blocks lead; its environment, a `system`
    // message after the user's, is a user message in its place.
    let messages = fields["messages"].as_array().expect("messages");
    let system: Vec<&str> = body["system"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["text"].as_str())
        .filter(|t| !is_billing(t))
        .collect();
    assert_eq!(messages[0], json!({"role": "system", "content": system.join("\n\n")}));
    assert!(messages[1..].iter().all(|m| m["role"] == "user"), "{messages:?}");
    let in_conversation =
        body["messages"].as_array().expect("messages").iter().filter(|m| m["role"] == "system").count();
    assert_eq!(messages.len(), 1 + body["messages"].as_array().map_or(0, Vec::len));
    assert!(in_conversation > 0, "the recording has a system message in `messages`");
    assert_eq!(fields["chat_template_kwargs"], json!({"enable_thinking": true}), "thinking: adaptive");
    assert_eq!(translated.session.as_deref(), body["metadata"]["user_id"].as_str());
}
