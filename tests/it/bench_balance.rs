//! `bench/balance` (issue 21's benchmark of the routing policies): its pieces — the fixed
//! workload, the offline oracle, the statistics, the report, the gateway config it writes — pass
//! their own unit tests (`bench/balance --self-test`, no process started), and the checked-in
//! workload is what its seeded generator writes.

use std::process::Command;

use crate::common::{ROOT, bench_self_test};

#[test]
fn the_harness_pieces_pass_their_self_test() {
    bench_self_test("balance", 14);
}

#[test]
fn the_workload_is_what_its_generator_writes() {
    let out = Command::new("python3")
        .arg(format!("{ROOT}/bench/balance_lib/workload.py"))
        .arg("--check")
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "bench/balance_lib/workload.json differs from its generator (the workload is fixed: do not regenerate it \
         to suit a policy): {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The whole harness through the real binaries: two simulators started, the gateway on the config
/// it writes, the workload replayed, the usage read, the report and its JSON written, everything
/// stopped. With the pseudo-policy `single` (the model on backend `a` alone), which today's
/// gateway serves; the integrator of issue 21 adds the balancing policies here once the gateway
/// balances (`--policies cache_aware,round_robin`, and the goals).
#[test]
fn the_harness_runs_end_to_end_through_the_gateway() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("balance.md");
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_mlxgate")).parent().expect("bin dir").to_path_buf();
    let run = Command::new("python3")
        .arg(format!("{ROOT}/bench/balance"))
        .args(["--policies", "single", "--no-self-correction", "--bin-dir"])
        .arg(&bin_dir)
        .arg("--out")
        .arg(&out)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "bench/balance failed:\n{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    let raw: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.with_extension("json")).expect("json written"))
            .expect("json");
    let single = &raw["policies"]["single"];
    let requests = raw["workload"]["requests"].as_u64().expect("requests");
    assert_eq!(single["answered"].as_u64(), Some(requests), "{single}");
    assert_eq!(single["per_backend"]["a"].as_f64(), Some(requests as f64), "{single}");
    // Exact accounting: the simulator's prompt tokens are the workload's words.
    let prompt_tokens = raw["oracle"]["prompt_tokens"].as_u64().expect("prompt tokens");
    assert_eq!(single["prompt_tokens"].as_u64(), Some(prompt_tokens));
    let (prefilled, cached) =
        (single["prefilled"].as_u64().expect("prefilled"), single["cached"].as_u64().expect("cached"));
    assert_eq!(prefilled + cached, prompt_tokens);
    // One backend caches each conversation's previous turns: most of every prompt is cached, and
    // no less than the system prompt shared by all conversations is prefilled once.
    assert!(prefilled * 3 < prompt_tokens, "{single}");
    let markdown = std::fs::read_to_string(&out).expect("report written");
    assert!(markdown.contains("| single | "), "{markdown}");
}
