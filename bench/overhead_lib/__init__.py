"""bench/overhead: what the gateway itself adds, side by side with nginx, LiteLLM and Portkey.

One zero-delay mlxgate-sim (release build) behind these paths: direct, mlxgate (release, a
minimal gateway.yaml with url: backends: metrics on, no clients, no context cap), mlxgate-before
(with --before-bin-dir DIR: the same config run from DIR's binaries, its own port, measured in
every phase mlxgate is, so one run shows before and after), mlxgate-full (a second mlxgate
process: auth required with a client key, rpm/tpm/concurrency limits that never refuse, a context
cap with Qwen3.6's 248k-token tokenizer and Qwen3's chat template from .cache/qwen3.6-tokenizer,
so every prompt is rendered and counted as for a real model; the tiny model's tokenizer, with a
warning, when that directory is missing), nginx (a plain keepalive reverse proxy, our own process
on a generated config), LiteLLM's proxy (1.74.9, offline) and Portkey's gateway (npm
@portkey-ai/gateway 1.15.2 on node, told the simulator by its x-portkey-custom-host header; left
out, said in the report, when it is not installed). mlxgate's access log and nginx's access_log
are both on (--access-log off: both off). Each proxy under test is pinned to CPU 0; wrk, the
simulators and this driver (the stream clients) to CPU 1. Rounds are interleaved, the order of the
targets changing from round to round (a balanced Latin square: no proxy always follows the same
one), and every round measures direct, so "added" is a proxy minus the direct run of the same
round.

Phases: latency at concurrency 1 (wrk) in two pinnings — the proxy alone on CPU 0, and the proxy
beside the backend (moved to the simulator's CPU, wrk on the other) —, with CPU per request, and
features on (mlxgate-full − mlxgate, same round: CPU per request and latency); a long prompt
(~3k tokens) through mlxgate-full and mlxgate, the counting's CPU reported per 1k tokens; time to
first content chunk of a stream at concurrency 1; the request rate with the proxy as the
bottleneck: each proxy in a cgroup with a CPU quota (--proxy-quota, 25% of one CPU; cgroup v1's
cfs quota or v2's cpu.max, made for the phase and removed after it; without cgroups, said in the
report, the old set-up), and for each step which resource bounded it (the proxy's CPU vs its
quota, wrk + the simulator's CPU, CPU 1's busy share); 256 streams; the same 256 streams through
mlxgate's chat, Responses and Anthropic Messages faces (CPU per content chunk, each face's own
content events counted); 1000 open streams; a soak of steady mixed traffic through mlxgate-full
(auth, limits and counting: the superset of the default's per-request state) sampling its RSS
every 10 s; perf profiles of mlxgate (saturated, concurrency 1, and per chunk of 256 streams) and
mlxgate-full (concurrency 1). The report opens with issue 24's goals judged by the noise-floor
rule, and a picture (an SVG beside it: bench/results/overhead.svg for BENCHMARKS.md). CPU time
is the kernel's per-process CPU clock (clock_gettime on the process's CPU clock id: the
scheduler's ns on CPU summed over all the process's threads, those that have exited included),
summed over the proxy's process tree; not 10 ms ticks, and not /proc/PID/schedstat (that file is
the main thread's alone).

    bench/overhead            # full run (about 30 minutes with the 10-minute soak), BENCHMARKS.md
    bench/overhead --quick    # no soak, shorter phases (about 5 minutes), bench/results/quick.md
    bench/overhead --before-bin-dir DIR   # and mlxgate from DIR beside it in every phase

--soak-minutes N sets the soak (default 10 in the full run, 0 with --quick; 0 skips it).
--render-only JSON remakes the report and its picture from saved raw figures; --self-test tests
the harness's pure pieces (no process started).
Runs bench/setup first (nginx, wrk, perf, node from Debian, the release binaries, .venv-litellm,
Portkey's gateway) unless --no-setup. Traffic goes to 127.0.0.1 only, on ports 19400-19499 (Portkey's
gateway listens on every interface: its start script takes no address). Everything it starts is
stopped when it ends, and the whole run is stopped by an alarm if it overruns.
"""
