use std::time::Duration;

use super::*;

#[test]
fn templates_fill_every_placeholder() {
    let t: Vec<String> = Kind::MlxLm.launch_template().expect("template").iter().map(|s| s.to_string()).collect();
    assert_eq!(
        fill_template(&t, "/m", "127.0.0.1", 8101),
        ["mlx_lm.server", "--model", "/m", "--host", "127.0.0.1", "--port", "8101"]
    );
}

#[test]
fn every_managed_kind_has_a_template_with_host_and_port() {
    for kind in [
        Kind::MlxLm,
        Kind::MlxOpenaiServer,
        Kind::VllmMlx,
        Kind::RapidMlx,
        Kind::MlxVlm,
        Kind::MlxOmniServer,
        Kind::Omlx,
        Kind::Higgs,
        Kind::MlxServe,
    ] {
        let t = kind.launch_template().expect("template");
        assert!(t.contains(&"{host}") && t.contains(&"{port}"), "{}: {t:?}", kind.name());
        assert!(
            t.contains(&"{model}") != kind.model_from_request(),
            "{}: the model comes from the command or from each request",
            kind.name()
        );
    }
    assert_eq!(Kind::Omlx.context_cap(), Some(32768));
}

#[test]
fn each_kind_gets_the_normalisations_its_wire_facts_call_for() {
    let cb: Vec<String> = ["vllm-mlx", "serve", "m", "--continuous-batching"].map(String::from).to_vec();
    assert!(Kind::VllmMlx.normalise(None).serialize);
    assert!(!Kind::VllmMlx.normalise(Some(&cb)).serialize, "--continuous-batching batches");
    assert!(Kind::RapidMlx.normalise(None).loopback_host);
    assert_eq!(Kind::RapidMlx.normalise(None).pool_idle_timeout, Duration::from_secs(25));
    assert!(Kind::MlxOpenaiServer.normalise(None).hold_abandoned);
    assert!(Kind::MlxOpenaiServer.normalise(None).finish_length);
    let omni = Kind::MlxOmniServer.normalise(None);
    assert!(omni.finish_length && omni.single_finish);
    let lm = Kind::MlxLm.normalise(None);
    assert!(!lm.loopback_host && !lm.serialize && !lm.hold_abandoned && !lm.finish_length && lm.stream_options);
    assert_eq!(lm.active().len(), 1, "{:?}", lm.active());
    assert!(omni.active().iter().any(|l| l.starts_with("single_finish:")));
}

#[test]
fn finish_length_reads_the_limit_the_server_applies() {
    let both = br#"{"model":"m","max_tokens":8,"max_completion_tokens":200}"#;
    let reversed = br#"{"model":"m","max_tokens":200,"max_completion_tokens":8}"#;
    // mlx-openai-server: max_tokens first (measured: cut at 8 with both 8 and 200).
    assert_eq!(Kind::MlxOpenaiServer.max_tokens_of(both), Some(8));
    assert_eq!(Kind::MlxOpenaiServer.max_tokens_of(reversed), Some(200));
    // mlx-omni-server: max_completion_tokens first, a 0 falls through (Python's `or`).
    assert_eq!(Kind::MlxOmniServer.max_tokens_of(both), Some(200));
    assert_eq!(Kind::MlxOmniServer.max_tokens_of(reversed), Some(8));
    let zero = br#"{"max_tokens":30,"max_completion_tokens":0}"#;
    assert_eq!(Kind::MlxOmniServer.max_tokens_of(zero), Some(30));
    // Unknown precedence: the larger, which never calls a finished answer cut.
    assert_eq!(Kind::Custom.max_tokens_of(both), Some(200));
    assert_eq!(Kind::Custom.max_tokens_of(reversed), Some(200));
    // One of them, whichever it is, for every kind.
    for kind in [Kind::MlxOpenaiServer, Kind::MlxOmniServer, Kind::Custom] {
        assert_eq!(kind.max_tokens_of(br#"{"max_tokens":5}"#), Some(5), "{kind:?}");
        assert_eq!(kind.max_tokens_of(br#"{"max_completion_tokens":6,"max_tokens":null}"#), Some(6), "{kind:?}");
        assert_eq!(kind.max_tokens_of(br#"{"model":"m"}"#), None, "{kind:?}");
    }
}

#[test]
fn a_cut_answer_counts_as_the_server_counts_it() {
    assert_eq!(Kind::MlxOmniServer.length_at(30), 29, "mlx-omni-server drops the last token");
    assert_eq!(Kind::MlxOmniServer.length_at(1), 1);
    assert_eq!(Kind::MlxOpenaiServer.length_at(30), 30);
}

#[test]
fn every_kind_has_one_name_in_the_file_the_command_line_and_the_logs() {
    use clap::ValueEnum;
    for kind in Kind::ALL {
        let from_file: Kind = serde_json::from_value(serde_json::Value::from(kind.name())).expect("serde name");
        assert_eq!(from_file, kind);
        let possible = kind.to_possible_value().expect("listed");
        assert_eq!(possible.get_name(), kind.name());
        assert_eq!(kind.to_string(), kind.name());
    }
    assert_eq!(Kind::value_variants(), Kind::ALL.as_slice(), "clap lists them in catalogue order");
    assert_eq!(
        Kind::names_where(|k| k.negative_max_tokens() == NegativeMaxTokens::Refused),
        "mlx-lm, vllm-mlx, rapid-mlx, mlx-vlm"
    );
    assert_eq!(Kind::names_where(Kind::checks_context), "rapid-mlx, mlx-vlm");
}

#[test]
fn content_parts_are_joined_as_each_server_joins_them() {
    assert_eq!(Kind::MlxLm.content_joiner(), "");
    assert_eq!(Kind::MlxVlm.content_joiner(), "\n");
    assert_eq!(Kind::Custom.content_joiner(), "\n");
}

#[test]
fn the_prompt_cache_size_is_the_commands_else_the_kinds_else_unknown() {
    let command = |args: &[&str]| args.iter().map(|s| s.to_string()).collect::<Vec<String>>();
    assert_eq!(Kind::MlxLm.prompt_cache_sequences(None), Some(10), "mlx_lm.server's --prompt-cache-size default");
    let spaced = command(&["mlx_lm.server", "--model", "{model}", "--prompt-cache-size", "4"]);
    assert_eq!(Kind::MlxLm.prompt_cache_sequences(Some(&spaced)), Some(4));
    let inline = command(&["mlx_lm.server", "--prompt-cache-size=2"]);
    assert_eq!(Kind::MlxLm.prompt_cache_sequences(Some(&inline)), Some(2));
    let garbled = command(&["mlx_lm.server", "--prompt-cache-size"]);
    assert_eq!(Kind::MlxLm.prompt_cache_sequences(Some(&garbled)), Some(10));
    assert_eq!(Kind::VllmMlx.prompt_cache_sequences(Some(&spaced)), None, "another kind's flag means nothing");
    assert_eq!(Kind::Custom.prompt_cache_sequences(None), None);
}
