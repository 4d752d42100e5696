//! `mlxgate bench`, the real binary, against `mlxgate-sim` set to known speeds: the figures it
//! reports (TTFT, decode tokens/s, aggregate and speedup of two requests released together)
//! agree with the simulator's settings within a wide tolerance (a noisy, shared machine: half
//! to twice the expected value), tokens come from usage and never from frames, bursts are
//! flagged, and `--compare` measures the same server directly and through an in-process gateway.

use std::process::Command;

use crate::common::*;
use mlxgate::sim::{self, Behaviour, SimConfig};
use serde_json::Value;

const MLXGATE: &str = env!("CARGO_BIN_EXE_mlxgate");

/// The bench's arguments for one prompt of 100 tokens, once, writing JSON to `json`.
fn bench_args(url: &str, scenario: &str, json: &std::path::Path) -> Vec<String> {
    let args = ["bench", "--url", &format!("{url}/v1"), "--model", "x", "--scenario", scenario];
    let rest = ["--repeats", "1", "--prompt-tokens", "100", "--max-tokens", "64", "--json"];
    args.iter().chain(&rest).map(|s| s.to_string()).chain([json.display().to_string()]).collect()
}

/// Runs `mlxgate bench` to its end; its stdout (the table) and the JSON report.
fn bench(args: &[String]) -> (String, Value) {
    let json = args.last().expect("json path").clone();
    let out = Command::new(MLXGATE).args(args).output().expect("bench runs");
    report_of(out, &json)
}

fn report_of(out: std::process::Output, json: &str) -> (String, Value) {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stderr}\n{stdout}");
    let report = serde_json::from_str(&std::fs::read_to_string(json).expect("json written")).expect("json");
    (stdout, report)
}

/// `value` is within `tolerance` of `expected`: for ratios measured within one run, which the
/// machine's noise moves together (a speedup), unlike absolute speeds.
fn within(what: &str, value: &Value, expected: f64, tolerance: f64) -> f64 {
    let v = value.as_f64().unwrap_or_else(|| panic!("{what}: no figure ({value})"));
    assert!((v - expected).abs() <= tolerance, "{what}: {v}, expected {expected} ± {tolerance}");
    v
}

/// `value` is within half to twice `expected`.
fn near(what: &str, value: &Value, expected: f64) -> f64 {
    let v = value.as_f64().unwrap_or_else(|| panic!("{what}: no figure ({value})"));
    assert!(v >= expected * 0.5 && v <= expected * 2.0, "{what}: {v}, expected about {expected}");
    v
}

#[test]
fn double_reports_the_simulators_speeds_and_the_batching_speedup() {
    // 30 tokens at 40 tokens/s after 300 ms; two requests together decode at 1.8× in all
    // (0.9× each).
    let (_sim, url) =
        spawn_sim(&["--ttft-ms", "300", "--tokens-per-second", "40", "--tokens", "30", "--speedup", "1,1.8"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let (table, report) = bench(&bench_args(&url, "double", &dir.path().join("out.json")));
    println!("{table}");
    let size = &report["endpoints"][0]["sizes"][0];
    let (single, together) = (&size["single"], &size["concurrent"]);
    assert_eq!((single["requests"].as_u64(), single["failed"].as_u64()), (Some(1), Some(0)), "{report}");
    assert_eq!((together["requests"].as_u64(), together["failed"].as_u64()), (Some(2), Some(0)), "{report}");
    assert_eq!(single["completion_tokens"], 30.0, "usage's tokens");
    assert_eq!(together["completion_tokens"], 30.0);
    assert_eq!(single["bursts"], 0);

    near("single TTFT", &single["ttft_seconds"], 0.3);
    near("single decode tokens/s", &single["decode_tokens_per_second"], 40.0);
    let single_wall = 30.0 / (0.3 + 29.0 / 40.0);
    near("single wall tokens/s", &single["wall_tokens_per_second"], single_wall);
    near("together TTFT", &together["ttft_seconds"], 0.3);
    let each = 40.0 * 1.8 / 2.0;
    near("together decode tokens/s (each)", &together["decode_tokens_per_second"], each);
    let aggregate = 60.0 / (0.3 + 29.0 / each);
    near("together aggregate tokens/s", &together["aggregate_tokens_per_second"], aggregate);
    // 1.85 here; two requests sent one after the other would give about 1.0.
    let speedup = within("speedup", &size["speedup"], aggregate / single_wall, 0.3);
    let sent = near("prompt tokens sent", &size["prompt_tokens_sent"], 100.0);
    // The simulator's tokens are words: the server's own count is reported beside ours.
    let words = single["prompt_tokens"].as_f64().expect("usage's prompt tokens");
    let spread = size["concurrent_groups"][0]["sent_spread_seconds"].as_f64().expect("the release's spread");
    println!(
        "speedup {speedup:.2}; prompt of 100 tokens: {sent} counted here, {words} by the server; \
         the pair sent {:.0} µs apart",
        spread * 1e6
    );
    assert!(table.contains("×2"), "{table}");
    assert!(table.lines().any(|l| l.trim_end().ends_with("cached")), "{table}");
}

#[test]
fn bursts_give_no_decode_speed() {
    // Every token held back and sent in one write: a burst, with no decode speed.
    let dir = tempfile::tempdir().expect("tempdir");
    let (_sim, url) = spawn_sim(&["--tokens", "20", "--tokens-per-second", "200", "--burst", "true"]);
    let (table, report) = bench(&bench_args(&url, "double", &dir.path().join("burst.json")));
    let size = &report["endpoints"][0]["sizes"][0];
    for run in ["single", "concurrent"] {
        assert_eq!(size[run]["bursts"], size[run]["requests"], "{run}: {report}");
        assert!(size[run]["decode_tokens_per_second"].is_null(), "{run}: {report}");
        assert_eq!(size[run]["completion_tokens"], 20.0);
    }
    assert!(table.contains("burst"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_measures_the_server_directly_and_through_the_gateway() {
    let defaults =
        Behaviour { ttft_ms: Some(200), tokens_per_second: Some(40.0), tokens: Some(20), ..Default::default() };
    let sim = sim::spawn(SimConfig { defaults, speedup: vec![1.0, 1.8], ..Default::default() }).await.expect("sim");
    let gw = gateway(&one_model_yaml(&sim.url(), 2, 16)).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("compare.json");
    let mut args = bench_args(&sim.url(), "double", &json);
    args[4] = "tiny-qwen3".into();
    args.extend(["--compare".into(), gw.url("/v1"), "--compare-model".into(), "qwen".into()]);
    let out = tokio::process::Command::new(MLXGATE).args(&args).output().await.expect("bench runs");
    let (table, report) = report_of(out, &json.display().to_string());
    println!("{table}");
    let (direct, through) = (&report["endpoints"][0], &report["endpoints"][1]);
    assert_eq!(through["url"], gw.url("/v1"));
    for endpoint in [direct, through] {
        let size = &endpoint["sizes"][0];
        assert_eq!(size["concurrent"]["failed"], 0, "{report}");
        assert_eq!(size["concurrent"]["completion_tokens"], 20.0, "{report}");
        near("TTFT", &size["single"]["ttft_seconds"], 0.2);
        near("decode tokens/s", &size["single"]["decode_tokens_per_second"], 40.0);
    }
    let ratios = &report["ratios"][0];
    near("B/A wall tokens/s", &ratios["single"]["wall_tokens_per_second"], 1.0);
    near("B/A aggregate tokens/s together", &ratios["concurrent"]["aggregate_tokens_per_second"], 1.0);
    near("B/A speedup", &ratios["speedup"], 1.0);
    assert!(table.contains("B / A"), "{table}");
    // Both went to the one server: a warm-up, one alone and two together each, and the two
    // calibration prompts to A only (B's prompts are sized by A's count).
    let received = sim_requests(&sim).await;
    let tags: Vec<String> = received
        .iter()
        .filter_map(|r| r["messages"][0]["content"].as_str())
        .map(|text| text.split_whitespace().nth(2).unwrap_or_default().to_string())
        .collect();
    assert_eq!(tags.len(), 10, "{received:?}");
    assert_eq!(tags.iter().filter(|t| t.contains("-calibrate-")).count(), 2, "{tags:?}");
    assert!(tags.iter().filter(|t| t.contains("-calibrate-")).all(|t| t.contains("-A-")), "{tags:?}");
    assert_eq!(report["prompt_sizing"]["method"], "calibrated", "{report}");
    // Interleaved, and neither always first: A then B alone, then B's pair before A's.
    let order: Vec<&str> = tags
        .iter()
        .filter(|t| t.contains("-single-") || t.contains("-together-"))
        .map(|t| if t.contains("-A-") { "A" } else { "B" })
        .collect();
    assert_eq!(order, ["A", "B", "B", "B", "A", "A"], "{tags:?}");
}

#[test]
fn prompts_are_sized_by_the_servers_own_count() {
    // No tokenizer for model "x": the sizes come from the simulator's usage.prompt_tokens,
    // which counts words (a rule of "a token per word plus a chat template" is 10 tokens off).
    let (_sim, url) = spawn_sim(&["--tokens", "4", "--tokens-per-second", "1000"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("sized.json");
    let mut args = bench_args(&url, "single", &json);
    let sizes = args.iter().position(|a| a == "--prompt-tokens").expect("sizes") + 1;
    args[sizes] = "100,1000".into();
    let (table, report) = bench(&args);
    println!("{table}");
    let sizing = &report["prompt_sizing"];
    assert_eq!(sizing["method"], "calibrated", "{report}");
    let per_word = sizing["tokens_per_word"].as_f64().expect("tokens per word");
    assert!((per_word - 1.0).abs() < 0.01, "{sizing}");
    assert!(table.lines().next().is_some_and(|l| l.contains("calibration against the server")), "{table}");
    for (size, target) in report["endpoints"][0]["sizes"].as_array().expect("sizes").iter().zip([100.0, 1000.0]) {
        let counted = size["single"]["prompt_tokens"].as_f64().expect("the server's count");
        assert!((counted - target).abs() <= target * 0.02, "{target}: the server counted {counted}");
        let predicted = size["prompt_tokens_sent"].as_f64().expect("predicted");
        assert!((predicted - counted).abs() <= 1.0, "{target}: predicted {predicted}, counted {counted}");
    }
}

#[test]
fn failed_requests_are_counted_named_and_fail_the_run() {
    // Prompts over 500 words are refused: the 1000-token rows fail, the 100-token ones do not.
    let (_sim, url) = spawn_sim(&["--tokens", "4", "--tokens-per-second", "1000", "--prompt-cap", "500"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("failed.json");
    let mut args = bench_args(&url, "double", &json);
    let sizes = args.iter().position(|a| a == "--prompt-tokens").expect("sizes") + 1;
    args[sizes] = "100,1000".into();
    let out = Command::new(MLXGATE).args(&args).output().expect("bench runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{stdout}{stderr}");
    assert_eq!(out.status.code(), Some(1), "a failed request fails the run");
    assert!(stderr.contains("3 requests failed") && stderr.contains("A at 1000 tokens: HTTP 400"), "{stderr}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("json");
    let [ok, over] = [0, 1].map(|i| report["endpoints"][0]["sizes"][i].clone());
    assert_eq!((ok["single"]["failed"].as_u64(), ok["concurrent"]["failed"].as_u64()), (Some(0), Some(0)));
    assert!(ok["speedup"].is_number(), "{ok}");
    assert_eq!((over["single"]["failed"].as_u64(), over["concurrent"]["failed"].as_u64()), (Some(1), Some(2)));
    for figure in ["wall_tokens_per_second", "ttft_seconds", "aggregate_tokens_per_second"] {
        assert!(over["single"][figure].is_null() && over["concurrent"][figure].is_null(), "{figure}: {over}");
    }
    assert!(over["speedup"].is_null(), "no speedup from failed requests: {over}");
    let row = stdout.lines().find(|l| l.trim_start().starts_with("1000") && l.contains("×2")).expect("row");
    assert_eq!(row.split_whitespace().nth(3), Some("2"), "the failed column: {row}");
}

#[test]
fn a_server_that_serves_one_request_at_a_time_shows_no_speedup() {
    // The control of the test above: the simulator generates for one request at a time.
    // Styled as Rapid-MLX, which reports its prompt cache.
    let sim_args = ["--ttft-ms", "100", "--tokens-per-second", "100", "--tokens", "20", "--capacity", "1"];
    let (_sim, url) = spawn_sim(&[&sim_args[..], &["--style", "rapid-mlx"]].concat());
    let dir = tempfile::tempdir().expect("tempdir");
    let (table, report) = bench(&bench_args(&url, "double", &dir.path().join("out.json")));
    println!("{table}");
    let size = &report["endpoints"][0]["sizes"][0];
    within("speedup of a one-at-a-time server", &size["speedup"], 1.0, 0.25);
    // The pair shares its prompt: one of the two found it in the cache, and the report shows
    // it (a real server's cache would shorten that one's prefill: a speedup that is no batching).
    let cached = size["concurrent"]["cached_tokens"].as_f64().expect("cached tokens reported");
    assert!(cached >= 40.0, "half the pair's prompt tokens, at least: {cached}\n{table}");
}

#[test]
fn a_server_without_usage_gets_no_tokens_per_second_and_is_told_why() {
    // No usage even when asked: the bench counts no frames as tokens, says so and exits 1.
    let (_sim, url) = spawn_sim(&["--tokens", "12", "--tokens-per-second", "500", "--usage", "none"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("no-usage.json");
    let out = Command::new(MLXGATE).args(bench_args(&url, "double", &json)).output().expect("bench runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{stdout}{stderr}");
    assert_eq!(out.status.code(), Some(1), "nothing measured is not a success");
    assert!(stderr.contains("no tokens/s where the server sent no usage.completion_tokens"), "{stderr}");
    assert!(
        stderr.contains("A at 100 tokens (single): 1 of 1 answers without usage, 12 output frames each"),
        "{stderr}"
    );
    assert!(stderr.contains("A at 100 tokens (together): 2 of 2 answers without usage"), "{stderr}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("json");
    let single = &report["endpoints"][0]["sizes"][0]["single"];
    assert_eq!(single["output_frames"], 12.0, "{report}");
    for figure in
        ["completion_tokens", "wall_tokens_per_second", "decode_tokens_per_second", "aggregate_tokens_per_second"]
    {
        assert!(single[figure].is_null(), "{figure} without usage: frames never stand in for tokens: {report}");
    }
    assert!(single["ttft_seconds"].is_number(), "the timing is still measured: {single}");
    assert!(stdout.lines().any(|l| l.contains("single") && l.contains(" - ")), "{stdout}");
    // Nor a calibration: the prompts were estimated, and the report says so and why.
    assert_eq!(report["prompt_sizing"]["method"], "estimate", "{report}");
    assert!(stdout.lines().next().is_some_and(|l| l.contains("estimate") && l.contains("no usage")), "{stdout}");
}

#[test]
fn options_that_would_measure_nothing_are_refused() {
    let refused = |args: &[&str], why: &str| {
        let base = ["bench", "--url", "http://127.0.0.1:9/v1", "--model", "m"];
        let out = Command::new(MLXGATE).args(base.iter().chain(args)).output().expect("bench runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.code().is_some_and(|c| c != 0), "{args:?} accepted: {stderr}");
        assert!(stderr.contains(why), "{args:?}: {stderr}");
    };
    refused(&["--scenario", "parallel:1"], "parallel:N (N ≥ 2)");
    refused(&["--repeats", "0"], "--repeats 0");
    refused(&["--max-tokens", "0"], "--max-tokens 0");
    refused(&["--prompt-tokens", "100,0"], "at least 1 token");
    refused(&["--compare-model", "b"], "--compare, which is missing");
    refused(&["--timeout", "0s"], "--timeout 0s");
}
