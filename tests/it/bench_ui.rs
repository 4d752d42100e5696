//! `bench/ui` (issue 23's benchmark of a live /ui page open during 256 streams): its pure pieces
//! — the paired difference of each follower − none, the noise floor and the verdict, the
//! per-variant summary with the page's rows and lag notices and the feed's `lagged` counts, the
//! rate phase, the idle windows, the Markdown, the gateway's config and the ABBA order — pass their own unit tests on canned figures (`bench/ui --self-test`, no
//! process started). The benchmark itself runs Chromium and 256 streams for minutes on a quiet
//! machine: it is run by hand (BENCHMARKS.md), not here.

use std::process::Command;

use crate::common::{ROOT, bench_self_test};

#[test]
fn the_harness_pieces_pass_their_self_test() {
    bench_self_test("ui", 18);
}

#[test]
fn its_help_names_the_knobs() {
    let out = Command::new("python3").arg(format!("{ROOT}/bench/ui")).arg("--help").output().expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--rounds",
        "--streams",
        "--chunks",
        "--rate-seconds",
        "--rate-conns",
        "--idle-seconds",
        "--variants",
        "--bin-dir",
        "--self-test",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}
