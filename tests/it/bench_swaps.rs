//! `bench/swaps` (issue 22's benchmark of swaps between two real GPU backends): its pure pieces
//! — the loading integration, the servers at once, the swap counter with and without labels, the
//! access lines, the seeded agents, the configs of each variant, the goals and the report — pass
//! their own unit tests (`bench/swaps --self-test`, no process started). The benchmark itself
//! runs the real servers for minutes: it is run by hand (BENCHMARKS.md), not here.

use std::process::Command;

use crate::common::{ROOT, bench_self_test};

#[test]
fn the_harness_pieces_pass_their_self_test() {
    bench_self_test("swaps", 18);
}

#[test]
fn its_help_names_every_variant() {
    let out = Command::new("python3").arg(format!("{ROOT}/bench/swaps")).arg("--help").output().expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let help = String::from_utf8_lossy(&out.stdout);
    for variant in ["before", "timer", "after", "budget", "fallback", "--baseline-mlxgate", "--seconds"] {
        assert!(help.contains(variant), "{variant} missing from:\n{help}");
    }
}

/// The whole harness through the real gateway, with two `mlxgate-sim` as the GPU servers
/// (`--servers sim`: each a shell that sleeps its start, 1 and 2 s, then becomes the simulator):
/// every variant of the new binary run on a fresh gateway, the agents' answers, /metrics, the
/// sampled /admin/backends and /proc, the access lines joined to the requests, the report and its
/// JSON written, nothing left running. What does not depend on timing is asserted: no failure,
/// every request in the access log, the budget's two servers side by side with no swap, the
/// fallback's minority answered by the majority's loaded server with no swap, one server at a
/// time otherwise. (The goals on loading and answers need the real servers' minutes: the exit
/// code is 1 when a short run misses them, and is not judged here.)
#[test]
fn the_harness_runs_end_to_end_on_simulators() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("swaps.md");
    let run = Command::new("python3")
        .arg(format!("{ROOT}/bench/swaps"))
        .args(["--servers", "sim", "--variants", "timer,after,budget,fallback", "--seconds", "6", "--mlxgate"])
        .arg(env!("CARGO_BIN_EXE_mlxgate"))
        .arg("--mlxgate-sim")
        .arg(env!("CARGO_BIN_EXE_mlxgate-sim"))
        .arg("--out")
        .arg(&out)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(matches!(run.status.code(), Some(0 | 1)), "bench/swaps failed:\n{stdout}\n{stderr}");
    let raw: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.with_extension("json")).expect("json written"))
            .expect("json");
    for name in ["timer", "after", "budget", "fallback"] {
        let v = &raw["variants"][name];
        let (requests, answers) = (v["requests"].as_u64().expect("requests"), v["answers"].as_u64().expect("answers"));
        assert!(answers > 0 && answers == requests, "{name}: {answers} of {requests} answered:\n{stdout}");
        assert_eq!(v["failures"].as_u64(), Some(0), "{name}");
        for model in ["coder", "haiku"] {
            let m = &v["models"][model];
            assert_eq!(m["access_lines"], m["requests"], "{name}: every {model} request has its access line");
        }
        assert_eq!(v["left_behind"].as_array().map(Vec::len), Some(0), "{name}: a server outlived its gateway");
        let both = v["both_alive_s"].as_f64().expect("both_alive_s");
        if name == "budget" {
            assert_eq!(v["swaps"].as_f64(), Some(0.0), "{name}: both fit the budget");
            assert_eq!(v["peak_servers"].as_u64(), Some(2), "{name}: side by side");
            assert!(both > 0.0, "{name}: side by side");
        } else {
            assert_eq!(both, 0.0, "{name}: one GPU server at a time");
        }
    }
    let fallback = &raw["variants"]["fallback"];
    assert_eq!(fallback["swaps"].as_f64(), Some(0.0), "{fallback}");
    let haiku = &fallback["models"]["haiku"];
    assert!(haiku["answers"].as_u64().is_some_and(|n| n > 0), "{haiku}");
    assert_eq!(haiku["served_by_majority_header"], haiku["answers"], "{haiku}");
    assert_eq!(haiku["fallback_logged"], haiku["answers"], "{haiku}");
    let markdown = std::fs::read_to_string(&out).expect("report written");
    assert!(markdown.contains("| | `timer` | `after` | `budget` | `fallback` |"), "{markdown}");
}
