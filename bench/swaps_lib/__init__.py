"""bench/swaps: swaps between two managed GPU backends of different kinds, before and after issue 22.

Two models, each on its own managed GPU backend started by mlxgate, on the tiny model
(.cache/tiny-qwen3): `coder` on mlx_lm.server (`kind: mlx-lm`) and `haiku` on mlx-openai-server,
`swap_after: 5s`, `max_wait: 120s` each. Six agents for `--seconds` (default 180), each sending a
streamed chat completion of its short growing conversation (max_tokens 32), its first to `coder`,
then 30 % to `haiku` (seeded: every variant sends the same models in the same order per agent),
thinking 0.5-2 s between turns. Each variant is its own gateway run on the same schedule:

    before    today's main (`--baseline-mlxgate PATH`), whose scheduler keeps a backend swap_after
    timer     the new binary with `loading_share: 1.0` (the same rules), when no baseline is given
    after     the new binary, default policy (loading ≤ 20 % of a residency and a start)
    budget    `gpu_memory_budget` fitting both, each backend's `footprint:` written: side by side
    fallback  `haiku` with `fallback: coder`: served by the loaded coder instead of a swap

Per variant: answers and failures per model; swaps (`mlxgate_backend_swaps_total`, labelled or
not); the seconds some GPU backend was `starting` (/admin/backends sampled every 100 ms; and the
new `mlxgate_backend_starting_seconds_total`) and their share of the wall time; the most server
processes alive at once (/proc); per model p50/p95/max of the wait to the answer's first byte (at
the client) and of the gateway's queue wait (its JSON access line, joined by `x-request-id`);
haiku answers served by coder (`x-mlxgate-fallback`, or the access line's backend); each
server's peak RSS. The report (bench/results/swaps.md, raw figures in swaps.json) puts the
variants side by side with issue 22's goals met or not: `after` loading ≤ 25 % of wall time, ≥ 3×
the answers of `before`, haiku's p95 wait within its max_wait, no failure; `budget` 0 swaps;
`fallback` 0 swaps and every haiku answer served by coder.

    bench/swaps --baseline-mlxgate PATH           # the four variants, 180 s each (about 13 minutes)
    bench/swaps --variants after,budget --seconds 40
    bench/swaps --self-test                       # the pieces, no process started (tests/it/bench_swaps.rs)

The modules, each owning one part:

    settings.py  paths, ports, the models and servers, the variants, the agents' schedule, metric names
    procs.py     the gateway's config per variant, starting and stopping it, the servers in /proc
    agents.py    the agents: seeded turns, streamed requests, one record each
    sampler.py   /admin/backends and /proc sampled while a run lasts
    stats.py     loading, servers at once, metrics, access lines, a variant's summary, the goals
    report.py    the Markdown report
    cli.py       the command line and the order of the runs
    selftest.py  unit tests of the pure pieces

Traffic goes to 127.0.0.1 only (ports 19700, 19710, 19711; it refuses to start when one is in use
or a server of an earlier run is alive). The gateway starts and stops the servers; after each run
no server may be left (one that is, is killed by its pid and named in the report).
"""
