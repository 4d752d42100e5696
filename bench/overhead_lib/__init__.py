"""bench/overhead: what the gateway itself adds, side by side with nginx and LiteLLM.

One zero-delay mlxgate-sim (release build) behind five paths: direct, mlxgate (release, a
minimal gateway.yaml with url: backends: metrics on, no clients, no context cap), mlxgate-full
(a second mlxgate process: auth required with a client key, rpm/tpm/concurrency limits that never
refuse, a context cap with Qwen3.6's 248k-token tokenizer and Qwen3's chat template from
.cache/qwen3.6-tokenizer, so every prompt is rendered and counted as for a real model; the tiny
model's tokenizer, with a warning, when that directory is missing), nginx (a
plain keepalive reverse proxy, our own process on a generated config) and LiteLLM's proxy
(1.74.9, offline). Each proxy under test is pinned to CPU 0; wrk, the simulators and this driver
(the stream clients) to CPU 1. Rounds are interleaved, the order of the targets changing from
round to round (a balanced Latin square: no proxy always follows the same one), and every round
measures direct, so "added" is a proxy minus the direct run of the same round.

Phases: latency at concurrency 1 (wrk); time to first content chunk of a stream at concurrency 1;
the highest request rate with p99 under 5 ms; 256 streams; 1000 open streams (3 rounds, for a
noise floor); a soak of steady mixed traffic through mlxgate-full (auth, limits and counting: the
superset of the default's per-request state) sampling its RSS every 10 s; perf profiles of
mlxgate (saturated, concurrency 1, 256 streams) and mlxgate-full (concurrency 1). CPU time is the
kernel's per-process CPU clock (clock_gettime on the process's CPU clock id: the scheduler's ns on
CPU summed over all the process's threads, those that have exited included), summed over the
proxy's process tree; not 10 ms ticks, and not /proc/PID/schedstat (that file is the main
thread's alone).

    bench/overhead            # full run (about 22 minutes with the 10-minute soak), BENCHMARKS.md
    bench/overhead --quick    # no soak, shorter phases (about 3 minutes), bench/results/quick.md

--soak-minutes N sets the soak (default 10 in the full run, 0 with --quick; 0 skips it).
Runs bench/setup first (nginx, wrk and perf from Debian, the release binaries, .venv-litellm)
unless --no-setup. Traffic goes to 127.0.0.1 only, on ports 19400-19499. Everything it starts
is stopped when it ends, and the whole run is stopped by an alarm if it overruns.
"""
