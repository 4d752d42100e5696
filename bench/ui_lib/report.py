"""From the rounds' raw figures to the summary (medians and ranges over rounds, the paired
difference of each follower − none, the noise floor, the verdict) and the Markdown report."""

from __future__ import annotations

from overhead_lib.stats import med, noise, spread

STREAM_KEYS = ["cpu_us_per_chunk", "cpu_us_per_chunk_streams", "gap_p50_us", "gap_p99_us"]

WHAT = {"none": "no page open, nobody following the feed",
        "page": "the real page open on its Activity tab",
        "feed": "a bare follower of /ui/events (curl), no browser"}


def paired(runs: dict[str, list[dict]], key: str, variant: str = "page") -> list[float]:
    """Per round that has both: `variant` − none of `key`."""
    none = {r["round"]: r[key] for r in runs["none"]}
    return [r[key] - none[r["round"]] for r in runs[variant] if r["round"] in none]


def verdict(diff_median: float, floor: float | None) -> str:
    """`within noise` when the median paired difference is no larger than the noise floor (the
    none-variant's own max − min over rounds), else `beyond noise`."""
    if floor is None or diff_median != diff_median:
        return "no noise floor (fewer than two rounds)"
    return "within noise" if abs(diff_median) <= floor else "beyond noise"


def compare(runs: dict[str, list[dict]], key: str, variant: str = "page") -> dict:
    """The paired difference `variant` − none: per round, median, range; the floor; the verdict."""
    diffs = paired(runs, key, variant)
    floor = noise([r[key] for r in runs["none"]])
    out = {"per_round": diffs, "median": med(diffs), "range": spread(diffs), "noise": floor}
    out["verdict"] = verdict(out["median"], floor)
    return out


def variant_summary(rounds: list[dict], expected: int) -> dict:
    s: dict = {"rounds": len(rounds), "expected_chunks": expected}
    for k in STREAM_KEYS:
        s[k] = med([r[k] for r in rounds])
        s[f"{k}_range"] = spread([r[k] for r in rounds])
    s["content_chunks_min"] = min((r["content_chunks"] for r in rounds), default=0)
    s["content_chunks_max"] = max((r["content_chunks"] for r in rounds), default=0)
    s["sim_requests_min"] = min((r["sim_requests"] for r in rounds), default=0)
    s["non_200"] = sum(n for r in rounds for st, n in r["statuses"].items() if int(st) != 200)
    s["preempted"] = med([r["preempted"] for r in rounds])
    s["others_cpu_s"] = med([r.get("others_cpu_s", float("nan")) for r in rounds])
    s["others_cpu_s_max"] = max((r.get("others_cpu_s", 0.0) for r in rounds), default=0.0)
    s["held_before"] = sorted({r.get("held_before", 0) for r in rounds})
    s["lagged"] = [r["lagged"] for r in rounds if r.get("lagged")]
    if rounds and "feed_gone_s" in rounds[0]:
        s["feed_gone_s_max"] = max(r["feed_gone_s"] for r in rounds)
    if rounds and "rows_new" in rounds[0]:
        s["rows_new_min"] = min(r["rows_new"] for r in rounds)
        s["rows_wanted"] = rounds[0]["rows_wanted"]
        s["rows_caught_up_s_max"] = max(r["rows_caught_up_s"] for r in rounds)
        s["browser_cpu_s"] = med([r["browser_cpu_s"] for r in rounds])
    if rounds and "events_new" in rounds[0]:
        s["events_new_min"] = min(r["events_new"] for r in rounds)
        s["events_caught_up_s_max"] = max(r["events_caught_up_s"] for r in rounds)
    return s


def rate_summary(rounds: list[dict]) -> dict:
    """One variant of the rate phase: CPU per request, rate, p99, errors, and how its follower kept up."""
    s: dict = {"rounds": len(rounds), "cpu_us_per_req": med([r["cpu_us_per_req"] for r in rounds]),
               "cpu_us_per_req_range": spread([r["cpu_us_per_req"] for r in rounds]),
               "rps": med([r["rps"] for r in rounds]), "p99_us": med([r["p99"] for r in rounds]),
               "requests": sum(r["requests"] for r in rounds),
               "errors": sum(r["status_errors"] + r["socket_errors"] for r in rounds),
               "lagged": [r["lagged"] for r in rounds if r.get("lagged")]}
    if "rows_new" in rounds[0]:
        s["rows_short"] = sum(1 for r in rounds if r["rows_new"] < r["rows_wanted"])
        s["rows_new_min"] = min(r["rows_new"] for r in rounds)
        s["browser_cpu_s"] = med([r["browser_cpu_s"] for r in rounds])
    if "events_new" in rounds[0]:
        s["events_new"] = sum(r["events_new"] for r in rounds)
        s["missed"] = sum(r["missed"] for r in rounds)
    return s


def summarize(res: dict) -> dict:
    """The summary of a run's raw figures (`res["streams"]`, `res["idle"]`: rounds per variant)."""
    runs = {v: rs for v, rs in res["streams"].items() if rs}
    expected = res["settings"]["streams"] * res["settings"]["chunks"]
    followers = [v for v in runs if v != "none"]
    out: dict = {"streams": {v: variant_summary(rs, expected) for v, rs in runs.items()},
                 "compare": {v: {k: compare(runs, k, v) for k in STREAM_KEYS} for v in followers}}
    rate = {v: rs for v, rs in (res.get("rate") or {}).items() if rs}
    if rate.get("none") and len(rate) > 1:
        out["rate"] = {v: rate_summary(rs) for v, rs in rate.items()}
        out["rate_compare"] = {v: compare(rate, "cpu_us_per_req", v) for v in rate if v != "none"}
    idle = {v: rs for v, rs in (res.get("idle") or {}).items() if rs}
    if idle.get("none") and len(idle) > 1:
        out["idle"] = {v: {"cpu_us_per_s": med([r["cpu_us_per_s"] for r in rs]),
                           "cpu_us_per_s_range": spread([r["cpu_us_per_s"] for r in rs]), "rounds": len(rs)}
                       for v, rs in idle.items()}
        for v, rs in idle.items():
            if any("state_events" in r for r in rs):
                out["idle"][v]["state_events_per_s"] = med([r["state_events"] / r["seconds"] for r in rs])
        out["idle_compare"] = {v: compare(idle, "cpu_us_per_s", v) for v in idle if v != "none"}
    return out


def us(v: float | None, digits: int = 2) -> str:
    return "–" if v is None or v != v else f"{v:.{digits}f} µs"


def ms(v: float) -> str:
    return f"{v / 1000:.2f} ms"


def rng(r: list[float] | None, fmt=us) -> str:  # noqa: ANN001
    return f"{fmt(r[0])} to {fmt(r[1])}" if r else "one round"


def signed(v: float, digits: int = 2) -> str:
    return f"{v:+.{digits}f} µs"


def chunks_cell(s: dict) -> str:
    low, high = s["content_chunks_min"], s["content_chunks_max"]
    return f"{low}" + (f"–{high}" if high != low else "") + f" / {s['expected_chunks']}"


def render(res: dict, summary: dict) -> str:
    st = res["settings"]
    sv, cmps = summary["streams"], summary["compare"]
    order = [v for v in ("none", "page", "feed") if v in sv]
    lines = [
        f"# The /ui page open during {st['streams']} streams (`bench/ui`)",
        "",
        f"Measured {res['date']} on {res['machine']}; commit `{res['commit']}`; command `{res['command']}`.",
        "",
        f"One mlxgate (release, `url:` backend at a zero-delay mlxgate-sim, access log on as by default) "
        f"pinned to CPU {st['proxy_cpu']}; the stream clients, the simulator and what follows the gateway on "
        f"CPU {st['browser_cpu']}. {st['rounds']} rounds, the variants in alternating order (ABBA…). Each run: "
        f"{st['streams']} streams × {st['chunks']} chunks 20 ms apart (bench/overhead's `stream_run`). CPU is "
        f"the gateway's (the kernel's per-process CPU clock) over the run and {st['settle_s']:g} s after it, "
        f"per content chunk the clients got. The variants:",
        "",
        *[f"- **{v}**: {WHAT[v]}" + (" (a fresh headless Chromium on `/ui#activity`, live and its first render "
                                     "settled before the run; every finished request becomes a rendered row)"
                                     if v == "page" else "") for v in order],
        "",
        "| variant | CPU per chunk (median) | min – max over rounds | streams only (no settle) | gap p50 | gap p99 "
        "| content chunks out / expected | non-200 | others' CPU per run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for v in order:
        s = sv[v]
        lines.append(
            f"| {v} | {us(s['cpu_us_per_chunk'])} | {rng(s['cpu_us_per_chunk_range'])} | "
            f"{us(s['cpu_us_per_chunk_streams'])} | {ms(s['gap_p50_us'])} | {ms(s['gap_p99_us'])} | "
            f"{chunks_cell(s)} | {s['non_200']} | {s['others_cpu_s']:.2f} s (max {s['others_cpu_s_max']:.2f}) |")
    for v in order[1:]:
        cpu, cmp = cmps[v]["cpu_us_per_chunk"], cmps[v]
        lines += [
            "",
            f"**{v.capitalize()} − none, paired by round** (CPU per chunk): median {signed(cpu['median'])}, "
            f"{rng(cpu['range'], signed)} over rounds; per round: "
            + ", ".join(signed(d) for d in cpu["per_round"]) + ".",
            f"Noise floor (the none-variant's own max − min over rounds): {us(cpu['noise'])}. "
            f"**Verdict: {cpu['verdict']}.**",
            f"Gaps, {v} − none, paired: p50 {signed(cmp['gap_p50_us']['median'], 0)} (noise "
            f"{us(cmp['gap_p50_us']['noise'], 0)}: {cmp['gap_p50_us']['verdict']}), p99 "
            f"{signed(cmp['gap_p99_us']['median'], 0)} (noise {us(cmp['gap_p99_us']['noise'], 0)}: "
            f"{cmp['gap_p99_us']['verdict']}) — timed by the clients, which share CPU {st['browser_cpu']} with the "
            f"follower.",
        ]
    lines.append("")
    p = sv.get("page")
    if p and "rows_new_min" in p:
        lag = "; ".join(p["lagged"]) if p["lagged"] else "none"
        lines += [
            f"The page followed: at least {p['rows_new_min']} new activity rows per round (wanted "
            f"{p['rows_wanted']}), all rendered within {p['rows_caught_up_s_max']:.1f} s of the CPU window's end; "
            f"lag notices: {lag}. Chromium's own CPU per round (all its processes): "
            f"{p['browser_cpu_s']:.2f} s (median). Connections the gateway held as each page run began: "
            f"{', '.join(str(h) for h in p['held_before'])} (the page's document and its feed).",
            "",
        ]
    f = sv.get("feed")
    if f and "events_new_min" in f:
        lag = "; ".join(f["lagged"]) if f["lagged"] else "none"
        lines += [f"The feed followed: at least {f['events_new_min']} `request` events per round, all within "
                  f"{f['events_caught_up_s_max']:.1f} s of the CPU window's end; lagged: {lag}.", ""]
    n = sv["none"]
    if "feed_gone_s_max" in n:
        lines += [f"Before each none run the gateway held no connection (a closed page's feed had ended; "
                  f"waited at most {n['feed_gone_s_max']:.1f} s for it).", ""]
    rate = summary.get("rate")
    if rate:
        rorder = [v for v in ("none", "page", "feed") if v in rate]
        lines += [
            f"## Whole answers as fast as wrk sends them ({st['rate_conns']} connection(s), {st['rate_seconds']:g} s a "
            f"run, {rate['none']['rounds']} round(s), ABBA)",
            "",
            "The same gateway, non-streamed chat completions from a `fast` simulator (one token, at once): "
            "thousands of finished requests a second, each one a `request` event for a follower — where a feed "
            "would fall behind. CPU per request over the run and 1 s after it.",
            "",
            "| variant | CPU per request (median) | min – max | req/s | p99 | errors | the follower got |",
            "|---|---|---|---|---|---|---|",
        ]
        for v in rorder:
            x = rate[v]
            got = "–"
            if "rows_new_min" in x:
                got = (f"≥ {x['rows_new_min']} new rows ({x['rows_short']} run(s) short of the last 500); "
                       f"lag notices: {'; '.join(x['lagged']) or 'none'}")
            if "events_new" in x:
                got = (f"{x['events_new']} `request` events for {x['requests']} requests; "
                       f"{x['missed']} missed (`lagged`)")
            lines.append(f"| {v} | {us(x['cpu_us_per_req'], 1)} | {rng(x['cpu_us_per_req_range'])} | {x['rps']:.0f} | "
                         f"{ms(x['p99_us'])} | {x['errors']} | {got} |")
        lines.append("")
        for v in rorder[1:]:
            c = summary["rate_compare"][v]
            lines.append(f"{v.capitalize()} − none, paired: median {signed(c['median'], 1)} per request "
                         f"({rng(c['range'], signed)}); noise floor {us(c['noise'], 1)}: **{c['verdict']}**.")
        lines.append("")
    idle = summary.get("idle")
    if idle:
        iorder = [v for v in ("none", "page", "feed") if v in idle]
        lines += [
            f"## Idle: no traffic, {st['idle_seconds']:g} s per window, {idle['none']['rounds']} window(s) per variant "
            f"(ABBA)",
            "",
            "| variant | gateway CPU per second (median) | min – max | state events per second |",
            "|---|---|---|---|",
            *[f"| {v} | {us(idle[v]['cpu_us_per_s'], 1)} | {rng(idle[v]['cpu_us_per_s_range'])} | "
              + (f"{idle[v]['state_events_per_s']:.2f}" if "state_events_per_s" in idle[v] else "–") + " |"
              for v in iorder],
            "",
        ]
        for v in iorder[1:]:
            c = summary["idle_compare"][v]
            lines.append(f"{v.capitalize()} − none, paired: median {signed(c['median'], 1)} of CPU per second "
                         f"(per window pair: {', '.join(signed(d, 1) for d in c['per_round'])}); noise floor "
                         f"{us(c['noise'], 1)}: **{c['verdict']}**.")
        lines.append("")
    lines += ["## What else was running", "",
              "Others' CPU per run (above): the CPU seconds all CPUs were busy (/proc/stat) minus this run's own "
              "processes (the gateway, the simulator, the clients, the browser).",
              f"Load average at the start {res['loadavg_start']}, at the end {res['loadavg_end']}. "
              "The busiest processes (top, one-second sample) at the start and at the end:", "", "```",
              *res.get("top_start", []), "---", *res.get("top_end", []), "```", ""]
    return "\n".join(lines)
