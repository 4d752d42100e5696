"""bench/balance: routing policies side by side on a fixed workload of agent sessions (issue 21).

Two backends behind one model of mlxgate (`backends: [a, b]`, `balance: {policy: …}`): two
`mlxgate-sim --style mlx-lm --prompt-cache-size 10` (mlx_lm.server's prompt cache, reported in
`usage.prompt_tokens_details.cached_tokens` as the real server reports it, prefill time per
uncached token), or with `--real` two real `mlx_lm.server` on the CPU. The workload
(`workload.json`, from the seeded `workload.py`, fixed before any policy was tuned) is replayed
once per policy (cache_aware, least_loaded, round_robin, session) on freshly started backends and
gateway, and the report puts side by side, per policy: the tokens actually prefilled (Σ prompt −
cached tokens from each answer's usage, exact), TTFT p50/p95 and the requests each backend served;
plus the ORACLE computed offline (each conversation pinned to one backend, no evictions: Σ over
conversations of the first prompt + each later turn's new tokens) and issue 21's goals
(cache_aware within 1.1× the oracle, at most half of round_robin's, no backend serving more than
1.5× the other's requests).

A second run (self-correction): cache_aware with servers keeping 2 sequences each (more
conversations at once than a cache holds) and backend `a` killed (-9) and restarted halfway; the
gateway's predicted − reported cached tokens sampled from its /metrics, by quarter of the run
(HOOK(metrics) in settings.py names the counter), and what the clients saw.

    bench/balance                 # sims (about 3 minutes): bench/results/balance.{md,json}
    bench/balance --real          # real servers: bench/results/balance-real.{md,json}
    bench/balance --self-test     # the harness's pieces, no process started (tests/it/bench_balance.rs)

The modules, each owning one part:

    settings.py     paths, ports, policies, the backends' settings, the metrics' names
    workload.py     the seeded generator of workload.json (and --check)
    cache_model.py  mlx_lm.server's prompt cache in Python (the oracle; the same rules as the sim's)
    client.py       the replay: a thread per conversation, streamed requests, TTFT and usage
    procs.py        the processes: the backends, mlxgate and its gateway.yaml, restart, stop
    stats.py        the oracle, per-policy summaries, /metrics parsing, prediction windows, goals
    report.py       the Markdown report
    cli.py          the command line and the order of the runs
    selftest.py     unit tests of the pieces

Traffic goes to 127.0.0.1 only (ports 19600-19611). Everything it starts is stopped when it ends
(by its own pid), and the whole run is stopped by an alarm if it overruns.
"""
