//! [`Rewrite::body`] held equal, byte for byte, to rewriting the parsed fields in place and
//! encoding them with serde_json (what the gateway did before writing the body in one pass).

use proptest::prelude::*;
use serde_json::value::{RawValue, to_raw_value};

use super::*;

/// The fields rewritten in place and encoded with serde_json: the reference [`Rewrite::body`]
/// is held to.
fn reference(rewrite: &Rewrite<'_>, fields: &RawBody) -> Result<(Vec<u8>, bool), GatewayError> {
    let mut fields = fields.clone();
    fields.insert("model".to_string(), to_raw_value(rewrite.upstream_model).expect("model"));
    let mut client_wants_usage = true;
    if rewrite.generates {
        if fields.get("stream").is_some_and(|v| v.get() == "true") {
            let mut options: serde_json::Map<String, serde_json::Value> = match fields.get("stream_options") {
                None => serde_json::Map::new(),
                Some(raw) if raw.get() == "null" => serde_json::Map::new(),
                Some(raw) => serde_json::from_str(raw.get())
                    .map_err(|_| GatewayError::invalid("`stream_options` must be an object", Some("stream_options")))?,
            };
            client_wants_usage = options.get("include_usage").and_then(serde_json::Value::as_bool).unwrap_or(false);
            if rewrite.takes_stream_options {
                options.insert("include_usage".into(), serde_json::Value::Bool(true));
                fields.insert("stream_options".to_string(), to_raw_value(&options).expect("options"));
            } else {
                fields.shift_remove("stream_options");
            }
        } else if !rewrite.takes_stream_options {
            fields.shift_remove("stream_options");
        }
        if !fields.contains_key("max_tokens") && !fields.contains_key("max_completion_tokens") {
            fields.insert("max_tokens".to_string(), to_raw_value(&rewrite.default_max_tokens).expect("max"));
        }
    }
    Ok((serde_json::to_vec(&fields).expect("encode"), client_wants_usage))
}

fn parsed(json: &str) -> RawBody {
    serde_json::from_str(json).expect("JSON object")
}

fn chat(model: &str, takes_stream_options: bool) -> Rewrite<'_> {
    Rewrite { generates: true, upstream_model: model, takes_stream_options, default_max_tokens: 4096 }
}

fn body_text(rewrite: &Rewrite<'_>, fields: &RawBody) -> (String, bool) {
    let (body, Rewritten { client_wants_usage, .. }) = rewrite.body(fields).expect("body");
    (String::from_utf8(body).expect("UTF-8"), client_wants_usage)
}

#[test]
fn a_chat_request_gets_the_upstream_model_and_a_max_tokens_in_the_clients_order() {
    let fields = parsed(r#"{"model":"fast","messages":[{"role":"user","content":"hi"}],"stream":false}"#);
    let (body, wants) = body_text(&chat("mlx/qwen", true), &fields);
    assert_eq!(
        body,
        r#"{"model":"mlx/qwen","messages":[{"role":"user","content":"hi"}],"stream":false,"max_tokens":4096}"#
    );
    assert!(wants);
}

#[test]
fn a_stream_asks_for_usage_where_the_client_put_its_options() {
    let fields = parsed(r#"{"stream_options":{"x":1},"model":"fast","stream":true,"max_tokens":5}"#);
    let (body, wants) = body_text(&chat("up", true), &fields);
    assert_eq!(body, r#"{"stream_options":{"x":1,"include_usage":true},"model":"up","stream":true,"max_tokens":5}"#);
    assert!(!wants);
    let fields = parsed(r#"{"model":"fast","stream":true,"stream_options":{"include_usage":true}}"#);
    assert!(body_text(&chat("up", true), &fields).1);
}

#[test]
fn a_backend_that_refuses_stream_options_gets_none() {
    let fields = parsed(r#"{"model":"fast","stream":true,"stream_options":{"include_usage":true}}"#);
    let (body, wants) = body_text(&chat("up", false), &fields);
    assert_eq!(body, r#"{"model":"up","stream":true,"max_tokens":4096}"#);
    assert!(wants);
}

#[test]
fn stream_options_that_are_not_an_object_are_refused() {
    let fields = parsed(r#"{"model":"fast","stream":true,"stream_options":[1]}"#);
    assert!(chat("up", true).body(&fields).is_err());
}

#[test]
fn other_endpoints_get_only_the_upstream_model() {
    let fields = parsed(r#"{"input":"x","model":"fast","stream_options":1}"#);
    let rewrite = Rewrite { generates: false, ..chat("a \"quoted\"\nname", false) };
    let (body, _) = body_text(&rewrite, &fields);
    assert_eq!(body, r#"{"input":"x","model":"a \"quoted\"\nname","stream_options":1}"#);
}

/// A top-level key: often one the rewrite reads, else any text (quotes, escapes, control
/// characters, non-ASCII).
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "messages", "user",
        ])
        .prop_map(str::to_string),
        1 => "\\PC{0,8}",
        1 => "[a-z\"\\\\\\n\\t\\x00\\x1f\\x7fé]{0,6}",
    ]
}

/// A value: the ones the rewrite reads, and others.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "true",
            "false",
            "null",
            "1",
            "-2.5e3",
            "\"fast\"",
            "\"t\\u00e9\\n\"",
            "[1, {\"a\": []}]",
            "{\"include_usage\": false, \"z\": 1}",
            "{\"include_usage\":true}",
            "{}",
            "{\"a\":{\"b\":null}}",
        ])
        .prop_map(str::to_string),
        "\\PC{0,10}".prop_map(|s| serde_json::to_string(&s).expect("string")),
    ]
}

/// A client's body as JSON text, its keys repeated at times.
fn body() -> impl Strategy<Value = String> {
    prop::collection::vec((key(), value(), any::<bool>()), 0..8).prop_map(|fields| {
        let fields: Vec<String> = fields
            .into_iter()
            .map(|(k, v, spaced)| {
                let k = serde_json::to_string(&k).expect("key");
                if spaced { format!(" {k} : {v} ") } else { format!("{k}:{v}") }
            })
            .collect();
        format!("{{{}}}", fields.join(","))
    })
}

proptest! {
    #[test]
    fn the_body_is_the_fields_rewritten_and_encoded_with_serde_json(
        json in body(),
        generates in any::<bool>(),
        takes_stream_options in any::<bool>(),
        upstream_model in prop_oneof!["[a-z/.-]{1,12}", "\\PC{0,8}"],
        default_max_tokens in any::<u32>(),
    ) {
        let Ok(fields) = serde_json::from_str::<RawBody>(&json) else { return Ok(()) };
        let rewrite = Rewrite { generates, upstream_model: &upstream_model, takes_stream_options, default_max_tokens };
        match (rewrite.body(&fields), reference(&rewrite, &fields)) {
            (Ok((body, rewritten)), Ok((expected, wants))) => {
                prop_assert_eq!(String::from_utf8(body).expect("UTF-8"), String::from_utf8(expected).expect("UTF-8"));
                prop_assert_eq!(rewritten.client_wants_usage, wants);
                prop_assert_eq!(rewritten.generates, generates);
            }
            (Err(_), Err(_)) => {}
            (got, expected) => prop_assert!(false, "{:?} vs {:?}", got.map(|(b, _)| b), expected.map(|(b, _)| b)),
        }
    }
}

#[test]
fn raw_values_are_written_as_the_client_wrote_them() {
    let fields = parsed(r#"{"model":"m","n": [ 1 , 2 ]}"#);
    let raw: &RawValue = fields.get("n").expect("n");
    let (body, _) = body_text(&Rewrite { generates: false, ..chat("m", true) }, &fields);
    assert!(body.contains(raw.get()));
}
