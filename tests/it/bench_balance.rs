//! `bench/balance` (issue 21's benchmark of the routing policies): its pieces — the fixed
//! workload, the offline oracle, the statistics, the report, the gateway config it writes — pass
//! their own unit tests (`bench/balance --self-test`, no process started), and the checked-in
//! workload is what its seeded generator writes.

use std::process::Command;

use crate::common::ROOT;

#[test]
fn the_harness_pieces_pass_their_self_test() {
    let out =
        Command::new("python3").arg(format!("{ROOT}/bench/balance")).arg("--self-test").output().expect("python3 runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench/balance --self-test failed:\n{stderr}");
    let ran: usize = stderr
        .lines()
        .find_map(|l| l.strip_prefix("Ran ")?.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no test count in:\n{stderr}"));
    assert!(ran >= 14, "{ran} tests ran:\n{stderr}");
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
