//! `mlxgate probe` against mlxgate-sim in each server style (the probe reports what the style
//! does on the wire) and against the real mlx_lm.server (the probe reports what
//! wire-facts.md records for it: HTTP/1.0, close-delimited, no keep-alive, role on every delta,
//! `: keepalive` comments, usage in a separate chunk, …).

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use mlxgate::probe::{ProbeOptions, probe, report::Report};
use mlxgate::sim::{self, Behaviour, Framing, SimConfig, Style};

fn options(url: &str) -> ProbeOptions {
    ProbeOptions { url: url.to_string(), model: None, context: None, idle_wait: Duration::from_secs(2), json: true }
}

async fn probe_sim(config: SimConfig) -> Report {
    let sim = sim::spawn(config).await.expect("sim starts");
    probe(&options(&sim.url())).await.expect("probe")
}

fn style(style: Style) -> SimConfig {
    SimConfig { defaults: Behaviour { style: Some(style), ..Behaviour::default() }, ..SimConfig::default() }
}

#[tokio::test]
async fn mlx_lm_style_http10_close_comments_and_separate_usage() {
    let mut config = style(Style::MlxLm);
    // A prefill long enough for `: keepalive N/M` comments.
    config.defaults.ttft_ms = Some(300);
    config.defaults.keepalive_ms = Some(100);
    let r = probe_sim(config).await;
    assert_eq!((r.http_version.as_str(), r.framing.as_str(), r.keep_alive), ("HTTP/1.0", "close", false), "{r:?}");
    assert_eq!(r.idle_timeout_s, None);
    assert_eq!(r.keepalive, "comment");
    assert_eq!(r.usage_placement, "separate");
    assert!(!r.usage_without_include_usage);
    assert!(r.done_marker);
    assert_eq!(r.finish_reason_at_max_tokens.as_deref(), Some("length"));
    // The sim reports the shared prefix less the last token, as mlx_lm.server does.
    assert!(r.cached_tokens.is_some_and(|c| c > 0), "{r:?}");
    assert!(r.errors["unknown_model"].skipped.as_deref().is_some_and(|s| s.contains("unloads")), "{r:?}");
    assert!(r.profile.contains("# kind: mlx-lm"), "{}", r.profile);
}

#[tokio::test]
async fn mlx_openai_server_style_role_first_usage_on_finish_even_unasked() {
    let r = probe_sim(style(Style::MlxOpenaiServer)).await;
    assert_eq!((r.http_version.as_str(), r.framing.as_str(), r.keep_alive), ("HTTP/1.1", "chunked", true), "{r:?}");
    assert_eq!(r.role_chunk, "first");
    assert_eq!(r.keepalive, "none");
    assert_eq!(r.usage_placement, "finish");
    assert!(r.usage_without_include_usage, "{r:?}");
    assert!(r.cached_tokens.is_some(), "{r:?}");
    // Not recognised by its headers: the unknown-model case is sent (the sim answers it).
    assert_eq!(r.errors["unknown_model"].status, Some(200), "{r:?}");
    assert_eq!(r.errors["invalid_json"].status, Some(400));
}

#[tokio::test]
async fn vllm_mlx_style_usage_twice() {
    let r = probe_sim(style(Style::VllmMlx)).await;
    assert_eq!(r.role_chunk, "first");
    assert_eq!(r.usage_placement, "both");
    assert_eq!(r.cached_tokens, None, "vllm-mlx reports no cached tokens: {r:?}");
    assert!(r.profile.contains("usage sent twice"), "{}", r.profile);
}

#[tokio::test]
async fn rapid_mlx_style_comments_and_context_refusal() {
    let mut config = style(Style::RapidMlx);
    config.defaults.ttft_ms = Some(300);
    config.defaults.keepalive_ms = Some(100);
    config.defaults.prompt_cap = Some(100);
    let sim = sim::spawn(config).await.expect("sim");
    let r = probe(&ProbeOptions { context: Some(100), ..options(&sim.url()) }).await.expect("probe");
    assert_eq!(r.keepalive, "comment");
    assert_eq!(r.cached_tokens, Some(26), "Rapid-MLX reports the whole repeated prompt: {r:?}");
    let over = &r.errors["prompt_over_context"];
    assert_eq!((over.status, over.openai_shape), (Some(400), Some(true)), "{r:?}");
    assert!(r.profile.contains("context_cap: 100"), "{}", r.profile);
}

#[tokio::test]
async fn omlx_style_fake_data_keepalive() {
    let mut config = style(Style::Omlx);
    config.defaults.ttft_ms = Some(100);
    let r = probe_sim(config).await;
    assert_eq!(r.keepalive, "data", "{r:?}");
    assert_eq!(r.usage_placement, "finish");
}

#[tokio::test]
async fn mlx_omni_style_role_on_every_delta() {
    let r = probe_sim(style(Style::MlxOmni)).await;
    assert_eq!(r.role_chunk, "every", "{r:?}");
}

#[tokio::test]
async fn a_server_generating_one_at_a_time_is_serialized_and_a_batching_one_batched() {
    let one_at_a_time = SimConfig { capacity: 1, ..style(Style::Openai) };
    let r = probe_sim(one_at_a_time).await;
    assert_eq!(r.concurrent_streams.as_deref(), Some("serialized"), "{r:?}");
    assert!(r.profile.contains("max_concurrency: 1"), "{}", r.profile);
    let batching = SimConfig { capacity: 2, speedup: vec![1.0, 1.8], ..style(Style::Openai) };
    let r = probe_sim(batching).await;
    assert_eq!(r.concurrent_streams.as_deref(), Some("batched"), "{r:?}");
    assert!(r.speedup_2.is_some_and(|s| s > 1.2), "{r:?}");
}

#[tokio::test]
async fn keep_alive_idle_timeout_is_none_when_the_server_keeps_it_and_chunked_framing_is_seen() {
    let r = probe_sim(SimConfig { framing: Some(Framing::Chunked), ..style(Style::Openai) }).await;
    assert!(r.keep_alive);
    assert_eq!(r.idle_timeout_s, None, "the sim never closes an idle connection");
    assert!(r.notes.iter().any(|n| n.contains("still open")), "{r:?}");
    assert!(r.cancels_on_disconnect == Some(true), "the sim stops when the client leaves: {r:?}");
}

#[tokio::test]
async fn the_command_prints_json_with_the_issue_keys() {
    let (_sim, url) = spawn_sim(&["--style", "vllm-mlx"]);
    let out = Command::new(env!("CARGO_BIN_EXE_mlxgate"))
        .args(["probe", &url, "--json", "--idle-wait", "1s"])
        .stderr(Stdio::inherit())
        .output()
        .expect("probe runs");
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    for key in [
        "http_version",
        "framing",
        "keep_alive",
        "idle_timeout_s",
        "role_chunk",
        "keepalive",
        "usage_placement",
        "usage_without_include_usage",
        "done_marker",
        "reasoning_field",
        "finish_reason_at_max_tokens",
        "cached_tokens",
        "cancels_on_disconnect",
        "concurrent_streams",
        "speedup_2",
        "errors",
        "profile",
    ] {
        assert!(v.get(key).is_some(), "missing {key}: {v}");
    }
    for case in ["unknown_model", "invalid_json", "negative_max_tokens", "prompt_over_context"] {
        assert!(v["errors"][case].get("status").is_some(), "{case}: {v}");
    }
}

/// The real mlx_lm.server (tiny model): what wire-facts.md records for it.
#[tokio::test]
async fn real_mlx_lm_server_matches_the_wire_facts() {
    let Some(model) = prerequisites(&["mlx-lm"]) else { return };
    let port = free_port();
    let hub = tempfile::tempdir().expect("empty hub cache");
    let child = Command::new(format!("{ROOT}/.venv-mlx-lm/bin/mlx_lm.server"))
        .args(["--model", &model.display().to_string(), "--host", "127.0.0.1", "--port", &port.to_string()])
        .env("HF_HUB_CACHE", hub.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("mlx_lm.server starts");
    let _server = KillOnDrop(child);
    let url = format!("http://127.0.0.1:{port}");
    let warm = serde_json::json!({"model": model.display().to_string(), "max_tokens": 2,
        "messages": [{"role": "user", "content": "hi"}]});
    eventually("mlx_lm.server answers a completion", || {
        let (url, warm) = (format!("{url}/v1/chat/completions"), warm.clone());
        async move { client().post(url).json(&warm).send().await.is_ok_and(|r| r.status().is_success()) }
    })
    .await;
    let r = probe(&ProbeOptions { model: Some(model.display().to_string()), ..options(&url) }).await.expect("probe");
    eprintln!("{}", r.text());
    assert_eq!((r.http_version.as_str(), r.framing.as_str(), r.keep_alive), ("HTTP/1.0", "close", false), "{r:?}");
    assert_eq!(r.role_chunk, "every");
    assert_eq!(r.keepalive, "comment");
    assert_eq!(r.usage_placement, "separate");
    assert!(!r.usage_without_include_usage);
    assert!(r.done_marker);
    assert_eq!(r.finish_reason_at_max_tokens.as_deref(), Some("length"));
    assert!(r.cached_tokens.is_some_and(|c| c > 0), "{r:?}");
    assert_eq!(r.cancels_on_disconnect, Some(true), "mlx_lm.server stops within 1 s");
    let e = &r.errors;
    assert!(e["unknown_model"].skipped.is_some(), "never sent to mlx_lm.server: {r:?}");
    assert_eq!((e["invalid_json"].status, e["invalid_json"].openai_shape), (Some(400), Some(false)), "{r:?}");
    assert_eq!(e["negative_max_tokens"].status, Some(400), "{r:?}");
    assert_eq!(e["prompt_over_context"].status, Some(200), "mlx_lm.server does not check: {r:?}");
}
