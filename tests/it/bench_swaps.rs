//! `bench/swaps` (issue 22's benchmark of swaps between two real GPU backends): its pure pieces
//! — the loading integration, the servers at once, the swap counter with and without labels, the
//! access lines, the seeded agents, the configs of each variant, the goals and the report — pass
//! their own unit tests (`bench/swaps --self-test`, no process started). The benchmark itself
//! runs the real servers for minutes: it is run by hand (BENCHMARKS.md), not here.

use std::process::Command;

use crate::common::ROOT;

#[test]
fn the_harness_pieces_pass_their_self_test() {
    let out =
        Command::new("python3").arg(format!("{ROOT}/bench/swaps")).arg("--self-test").output().expect("python3 runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench/swaps --self-test failed:\n{stderr}");
    let ran: usize = stderr
        .lines()
        .find_map(|l| l.strip_prefix("Ran ")?.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no test count in:\n{stderr}"));
    assert!(ran >= 18, "{ran} tests ran:\n{stderr}");
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
