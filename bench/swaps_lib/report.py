"""The Markdown report (a section for BENCHMARKS.md) from a run's raw figures: the variants side
by side, issue 22's goals met or not, and what bounded the figures."""

from __future__ import annotations

from pathlib import Path

from .settings import MAJORITY, MINORITY
from .stats import pct, start_times

WHAT = {
    "before": "today's main (`--baseline-mlxgate`): a backend is kept `swap_after`",
    "timer": "the new binary with `loading_share: 1.0` (the rules before issue 22)",
    "after": "the new binary, default policy (`loading_share` 0.2)",
    "budget": "the new binary, `gpu_memory_budget` fitting both footprints",
    "fallback": f"the new binary, `{MINORITY}` with `fallback: {MAJORITY}`",
}


def fmt(v, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v != v:
            return "-"
        return f"{v:.{digits}f}"
    return str(v)


def pair(a, b, digits: int = 1) -> str:
    return f"{fmt(a, digits)} / {fmt(b, digits)}"


def waits(s: dict, key: str) -> str:
    return f"{fmt(s[key]['p50'])} / {fmt(s[key]['p95'])} / {fmt(s[key]['max'])}"


def rows(v: dict) -> list[tuple[str, str]]:
    """One variant's column, row by row."""
    maj, mino = v["models"][MAJORITY], v["models"][MINORITY]
    starts = start_times(v.get("timeline", []))
    reasons = ", ".join(f"{k} {int(n)}" for k, n in sorted(v.get("swaps_by_reason", {}).items()) if n)
    served = max(mino["served_by_majority_header"], mino["served_by_majority_log"])
    return [
        ("wall seconds", fmt(v["wall_s"], 0)),
        (f"answers {MAJORITY} / {MINORITY}", f"**{v['answers']}** ({maj['answers']} / {mino['answers']})"),
        (f"failures {MAJORITY} / {MINORITY}", f"{v['failures']} ({maj['failures']} / {mino['failures']})"),
        ("swaps", fmt(v["swaps"], 0) + (f" ({reasons})" if reasons else "")),
        ("seconds loading (sampled; counter)", f"{fmt(v['loading_s'])}; {fmt(v['starting_s_metric'])}"),
        (f"starts {MAJORITY} / {MINORITY}: how many, median s",
         f"{len(starts.get(MAJORITY, []))}, {fmt(pct(starts.get(MAJORITY, []), 50))} / "
         f"{len(starts.get(MINORITY, []))}, {fmt(pct(starts.get(MINORITY, []), 50))}"),
        ("loading share of wall time", f"**{fmt(100 * v['loading_share'] if v['loading_share'] is not None else None, 0)} %**"),
        ("most server processes alive at once", str(v["peak_servers"])),
        ("seconds with both servers alive", fmt(v.get("both_alive_s"))),
        (f"wait to first byte, {MAJORITY}: p50 / p95 / max s", waits(maj, "wait_s")),
        (f"wait to first byte, {MINORITY}: p50 / p95 / max s", waits(mino, "wait_s")),
        (f"gateway queue wait, {MAJORITY}: p50 / p95 / max s", waits(maj, "queue_s")),
        (f"gateway queue wait, {MINORITY}: p50 / p95 / max s", waits(mino, "queue_s")),
        (f"{MINORITY} answers served by {MAJORITY}", str(served)),
        (f"peak RSS MiB {MAJORITY} / {MINORITY}", pair(v["rss_peak_mib"].get(MAJORITY), v["rss_peak_mib"].get(MINORITY), 0)),
        (f"footprint measured by the gateway, MiB {MAJORITY} / {MINORITY}",
         pair(v.get("footprint_gauge_mib", {}).get(MAJORITY), v.get("footprint_gauge_mib", {}).get(MINORITY), 0)),
    ]


def render(res: dict) -> str:
    sch = res["schedule"]
    names = list(res["variants"])
    lines = [
        "## Swaps between two GPU backends (`bench/swaps`)",
        "",
        f"Measured {res['date']} on {res['machine']}, commit `{res['commit']}`, in {res['elapsed_s'] / 60:.1f} "
        f"minutes. Load average before: {res['loadavg_start']}, after: {res.get('loadavg_end', '-')}.",
        "",
        (f"Two managed GPU backends of different kinds on the tiny model `{sch['model']}`: model `{sch['majority']}` "
         f"on `{sch['servers'][sch['majority']]}` (mlx_lm.server) and model `{sch['minority']}` on "
         f"`{sch['servers'][sch['minority']]}`" if not sch.get("sim") else
         f"Two managed GPU backends, both `mlxgate-sim` (`--servers sim`, a check of the harness, not a measure): "
         f"model `{sch['majority']}` on {sch['servers'][sch['majority']]}, model `{sch['minority']}` on "
         f"{sch['servers'][sch['minority']]}")
        + f", `swap_after: {sch['swap_after_s']}s`, `max_wait: {sch['max_wait_s']}s` "
        f"each. {sch['agents']} agents for {fmt(sch['seconds'], 0)} s"
        + (f" (`--agents side`): each runs its main conversation on `{sch['majority']}` — a streamed chat completion "
           f"of its short growing conversation (max_tokens {sch['max_tokens']}), waited for, then "
           f"{sch['think_s'][0]}–{sch['think_s'][1]} s of thinking — and after a turn sends, with a chance that makes "
           f"them {sch['minority_share']:.0%} of all requests, a side call to `{sch['minority']}` it does not wait "
           f"for (every draw sent, however many are under way; Claude Code's small fast model does such background "
           f"work), `max_queue: 256` "
           f"(seeded RNG, seed {sch['seed']})"
           if sch.get("agents_shape", "blocking") == "side" else
           f" (`--agents blocking`): each sends a streamed chat completion of its "
           f"short growing conversation (max_tokens {sch['max_tokens']}), its first to `{sch['majority']}`, then "
           f"{sch['minority_share']:.0%} to `{sch['minority']}` (seeded RNG, seed {sch['seed']}: every variant sends "
           f"the same sequence of models per agent), waits for the whole answer, and thinks "
           f"{sch['think_s'][0]}–{sch['think_s'][1]} s between turns")
        + ". Each variant is a fresh gateway; no backend is preloaded.",
        "",
        f"Command: `{res['command']}`",
        "",
        "| | " + " | ".join(f"`{n}`" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    columns = [rows(res["variants"][n]) for n in names]
    for i, (label, _) in enumerate(columns[0] if columns else []):
        lines.append(f"| {label} | " + " | ".join(c[i][1] for c in columns) + " |")
    lines += ["", "Variants:", ""]
    lines += [f"- `{n}`: {WHAT.get(n, n)} — `{res['variants'][n].get('version', '?')}`" for n in names]
    fp, margin = res["footprints_mib"], res["budget_margin_mib"]
    lines += [
        "",
        "How each figure is had. Answers: streams that ended whole (200, a finish_reason and `[DONE]`, no error "
        "event); failures: any other status or a cut stream. Swaps: `mlxgate_backend_swaps_total` summed (the "
        "baseline's has no labels; the new one's by reason). Seconds loading: `/admin/backends` sampled every "
        "100 ms, the time any GPU backend was `starting`; the counter is `mlxgate_backend_starting_seconds_total` "
        "(new binary only). Server processes: those found in /proc at each sample running a server program on "
        "its port (not the keeper that starts it); both servers alive: the time both models had one. Wait to "
        "first byte: from sending the request to the first byte of the answer's body, at the client (answers only). "
        "Gateway queue wait: `queue_ms` of the gateway's access line for that request (joined by `x-request-id`). "
        f"{MINORITY} answers served by {MAJORITY}: the `x-mlxgate-fallback` header, or the access line's backend. "
        "Peak RSS: the resident memory of each server's process group, sampled once a second; the gateway's own "
        "measure is `mlxgate_backend_footprint_bytes` (new binary; a written footprint shows as written).",
        "",
        f"Footprints written for `budget`: {MAJORITY} {fp[MAJORITY]} MiB, {MINORITY} {fp[MINORITY]} MiB (budget "
        f"{sum(fp.values()) + margin} MiB): the peak resident memory measured of each server's process group on this "
        "machine, rounded up (the peak RSS row shows what each run measured).",
        "",
        "What bounds these figures: 2 CPU cores shared with the gateway, the agents and other jobs (the load "
        "average above), CPU inference (MLX's CPU backend) of a tiny model, so an answer takes a fraction of a "
        "second. A start is the servers' Python imports (the starts row: mlx-openai-server imports PyTorch); on a "
        "Mac a 20 GB model loads in tens of seconds, so the loading a policy causes weighs more there and each "
        "answer takes longer.",
    ]
    lines += ["", "| goal (issue 22) | variant | measured | met |", "|---|---|---|---|"]
    for g in res["goals"]:
        value, unit = g["value"], g.get("unit")
        if value is None:
            shown = "-"
        elif unit == "share":
            shown = f"{100 * value:.0f} %"
        elif unit == "×":
            shown = f"{value:.2f}×"
        elif unit == "s":
            shown = f"{value:.1f} s"
        else:
            shown = fmt(int(value) if isinstance(value, float) and value.is_integer() else value, 2)
        lines.append(f"| {g['goal']} | `{g['variant']}` | {shown} | {'yes' if g['met'] else '**no**'} |")
    for name in names:
        for note in res["variants"][name].get("notes", []):
            lines += ["", f"Note (`{name}`): {note}"]
    for note in res.get("notes", []):
        lines += ["", f"Note: {note}"]
    lines.append("")
    return "\n".join(lines)


def write(path: Path, res: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(res))
