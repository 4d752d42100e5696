"""The Markdown report (a section for BENCHMARKS.md) from a run's raw figures."""

from __future__ import annotations

from pathlib import Path


def fmt(v, digits: int = 2) -> str:
    if v is None:
        return "-"  # a figure that could not be had (e.g. max/min with a backend that served none)
    if isinstance(v, float):
        if v != v:
            return "-"
        if v == float("inf"):
            return "∞"
        return f"{v:.{digits}f}"
    return str(v)


def render(res: dict) -> str:
    real = res["backends"] == "real"
    lines = [
        "## Balancing two backends behind one model (`bench/balance`)",
        "",
        f"Measured {res['date']} on {res['machine']}, commit `{res['commit']}`, in {res['elapsed_s'] / 60:.1f} "
        f"minutes. Load average before: {res['loadavg_start']}, after: {res.get('loadavg_end', '-')}.",
        "",
        f"Backends: {res['backends_what']}. Workload: `bench/balance_lib/workload.json` (fixed before any "
        f"policy was tuned; seed {res['workload']['seed']}): {res['workload']['conversations']} conversations "
        f"of {res['workload']['turns']} turns ({res['workload']['requests']} requests) from "
        f"{res['workload']['clients']} clients, one system prompt and tool list for all, each turn the "
        f"previous prompt + the recorded answer + a tool result or user message; {res['max_tokens']} tokens "
        "generated per answer. Each policy replays it once on freshly started backends and gateway.",
        "",
        f"Command: `{res['command']}`",
        "",
        "Prefilled tokens: Σ over answered requests of prompt − cached tokens, from each answer's "
        "`usage` (exact). Oracle: each conversation pinned to one backend, no evictions: Σ over "
        "conversations of its first prompt + each later turn's new tokens"
        + (" (from the prompt tokens the servers reported)." if real else
           f" ({res['oracle']['prefilled']} tokens; {res['oracle']['prefilled_shared']} when the two backends' "
           "caches also share the common system prompt across the conversations pinned to them).")
        + " TTFT: time to the first content token, at the client, through mlxgate"
        + (" (two CPU servers sharing two cores: reported, not judged)." if real else "."),
        "",
        "| policy | prefilled tokens | × oracle | × round_robin | cached tokens | TTFT p50 s | TTFT p95 s | "
        "requests a / b | max/min | failed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    oracle = res["oracle_tokens"]
    rr = res["policies"].get("round_robin", {}).get("prefilled")
    for policy, s in res["policies"].items():
        pb = s["per_backend"]
        counts = " / ".join(fmt(pb.get(b), 0) for b in ("a", "b"))
        lines.append(
            f"| {policy} | {s['prefilled']} | {fmt(s['prefilled'] / oracle if oracle else None)} | "
            f"{fmt(s['prefilled'] / rr if rr else None)} | {s['cached']} | {fmt(s['ttft_p50_s'], 3)} | "
            f"{fmt(s['ttft_p95_s'], 3)} | {counts} | {fmt(s['balance'])} | {s['failed']} |")
    lines.append(f"| oracle | {fmt(oracle)} | 1.00 | {fmt(oracle / rr if oracle and rr else None)} | | | | | | |")
    shared = res.get("oracle_shared_tokens")
    if shared:
        lines.append(f"| oracle, common prefix shared | {fmt(shared)} | {fmt(shared / oracle if oracle else None)} | "
                     f"{fmt(shared / rr if rr else None)} | | | | | | |")
        ca = res["policies"].get("cache_aware")
        lines += ["", "The second oracle row is stricter: the conversations pinned to a backend also share the "
                  "common system prompt and tools in its cache, so that prefix is prefilled once per backend "
                  "instead of once per conversation" + (" (its size from the cached tokens the servers reported "
                  "on first turns)" if real else "") + "."
                  + (f" cache_aware prefilled {fmt(ca['prefilled'] / shared)}× that." if ca else "")]
    lines += ["", "| goal (issue 21) | measured | met |", "|---|---|---|"]
    for g in res["goals"]:
        lines.append(f"| {g['goal']} | {fmt(g['value'])} | {'yes' if g['met'] else '**no**'} |")
    sc = res.get("self_correction")
    if sc:
        lines += [
            "",
            "### Self-correction: small caches and a restart",
            "",
            f"The same workload with `{sc.get('policy', 'cache_aware')}`, each server keeping only {sc['cache_size']} sequences "
            f"(`--prompt-cache-size {sc['cache_size']}`; the gateway's index assumes the kind's default), so more "
            f"conversations run at once than a server's cache holds; backend `a` killed (-9) and restarted "
            f"after {sc['restart_after']} answers ({fmt(sc.get('restart_at_s'), 1)} s into the run). "
            f"Prefilled {sc['summary']['prefilled']} tokens, {sc['summary']['failed']} of "
            f"{sc['summary']['requests']} requests failed, requests a / b: "
            f"{' / '.join(fmt(sc['summary']['per_backend'].get(b), 0) for b in ('a', 'b'))}.",
            "",
        ]
        windows = sc.get("windows")
        if windows:
            lines += ["Prediction error (the gateway's predicted − reported cached tokens, from its /metrics), "
                      "by quarter of the run:", "",
                      "| quarter | seconds | predicted | reported | error | Σ\\|error\\| per backend |", "|---|---|---|---|---|---|"]
            for w in windows:
                lines.append(f"| {w['window']} | {w['from_s']}–{w['to_s']} | {fmt(w['predicted'], 0)} | "
                             f"{fmt(w['reported'], 0)} | {fmt(w['error'], 0)} | {fmt(w['abs_error'], 0)} |")
            after = sc.get("after_restart")
            if after:
                lines += ["", f"Backend `a` in the {after['seconds']} s after its restart: predicted "
                          f"{fmt(after['predicted'], 0)}, reported {fmt(after['reported'], 0)} cached tokens."]
        else:
            lines.append(f"Prediction error: not measured — the gateway exposes no `{sc['predicted_metric']}` "
                         "(HOOK(metrics) in bench/balance_lib/settings.py, `--predicted-metric`).")
        lines += ["", "Client side, by quarter of the requests (in completion order):", "",
                  "| quarter | requests | prompt tokens | cached tokens | prefilled |", "|---|---|---|---|---|"]
        for q in sc["client_quarters"]:
            lines.append(f"| {q['quarter']} | {q['requests']} | {q['prompt_tokens']} | {q['cached']} | {q['prefilled']} |")
    for note in res.get("notes", []):
        lines += ["", f"Note: {note}"]
    lines.append("")
    return "\n".join(lines)


def write(path: Path, res: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(res))
