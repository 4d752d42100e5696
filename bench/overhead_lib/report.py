"""The Markdown report (BENCHMARKS.md, bench/results/quick.md) rendered from the raw figures."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable

from .processes import nginx_binary
from .settings import (
    LITELLM_VENV, LOAD_TARGETS, MANY_TARGETS, PROXIES, ROOT, SOAK_CONNS, SOAK_SAMPLE_S, SOAK_STREAMS_PER_S, TARGETS,
    TINY_TOKENIZER_DIR,
)
from .stats import paired_over_rounds, range_width, spread


# Text after this line in the report is written by hand (the reading of the figures) and kept
# when the harness rewrites the tables above it.
KEEP_MARKER = "<!-- bench/overhead rewrites everything above this line; what follows is kept -->"


def machine() -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "?")

    def cmd(*c: str) -> str:
        try:
            r = subprocess.run(list(c), capture_output=True, text=True, timeout=30)
            return (r.stdout + r.stderr).strip().splitlines()[0]
        except Exception:  # noqa: BLE001
            return "?"

    mem = next((ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                if ln.startswith("MemTotal")), "0")
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_gib": round(int(mem) / 2**20, 1),
            "kernel": cmd("uname", "-sr"), "nginx": cmd(nginx_binary(), "-v"), "wrk": cmd("wrk", "-v"),
            "litellm": cmd(str(LITELLM_VENV / "bin" / "python"), "-c",
                           "import importlib.metadata as m; print('litellm', m.version('litellm'))"),
            "rustc": cmd("rustc", "-V"), "commit": cmd("git", "-C", str(ROOT), "rev-parse", "--short", "HEAD")}


def us(v: float | None) -> str:
    if v is None or v != v:
        return "–"
    return f"{v:+.0f} µs" if abs(v) < 10000 else f"{v / 1000:+.1f} ms"


def plain_us(v: float | None) -> str:
    if v is None or v != v:
        return "–"
    return f"{v:.0f} µs" if abs(v) < 10000 else f"{v / 1000:.1f} ms"


def span(r: list[float] | None, fmt: Callable[[float], str] = plain_us) -> str:
    """" (min–max)" over rounds, or nothing with one round."""
    return f" ({fmt(r[0])} to {fmt(r[1])})" if r else ""


def one_decimal(v: float | None) -> str:
    return f"{v:.1f} µs" if v is not None and v == v else "–"


def mib(kib: float | None) -> str:
    return f"{kib / 1024:.1f} MiB" if kib else "–"


def noise_text(v: float | None) -> str:
    return f"spread {plain_us(v)}" if v is not None else "one round: no noise floor"


def verdict(added: float | None, goal: float, floor: float | None) -> str:
    """A figure (µs) against an upper goal, given its noise floor: "met" only when added + floor is
    within the goal, "**not met**" when added − floor is beyond it, otherwise undetermined (the run
    cannot tell). Without a floor (one round), met / not met on the figure alone, said so."""
    if added is None or added != added:
        return "–"
    if floor is None:
        return ("met" if added <= goal else "**not met**") + " (one round: no noise floor)"
    if added + floor <= goal:
        return "met"
    if added - floor > goal:
        return "**not met**"
    return f"undetermined (noise ± {plain_us(floor)} vs goal {plain_us(goal)})"


def met(ok: bool) -> str:
    """A goal that is not a difference from another path (a rate ratio, a count, a size)."""
    return "met" if ok else "**not met**"


def tokenizer_of(res: dict) -> dict:
    """What mlxgate-full counted with (runs saved before this was recorded used the tiny model's)."""
    return res.get("tokenizer") or {"dir": str(TINY_TOKENIZER_DIR), "fallback": True,
                                    "short": "the tiny model's 433-token tokenizer",
                                    "what": "the tiny generated model's tokenizer (`.cache/tiny-qwen3`)"}


def render(res: dict, quick: bool) -> str:
    m = res["machine"]
    mode = res["mode"]
    out: list[str] = []
    w = out.append
    w("# BENCHMARKS: the gateway's overhead" + (" (quick run)" if quick else ""))
    w("")
    w(f"Measured {res['date']} on {m['cpu']} ({m['cores']} cores, {m['mem_gib']} GiB), {m['kernel']}; "
      f"mlxgate {m['commit']} (release build, {m['rustc']}), {m['nginx']}, {m['wrk']}, {m['litellm']}.")
    w(f"Load average (1/5/15 min): {res['loadavg_start']} at the start, {res['loadavg_end']} at the end — "
      "other jobs share this 2-core machine, so figures move by a few per cent between runs.")
    w("")
    w(f"Reproduce (installs nginx, wrk and perf from Debian, builds the release binaries and "
      f"`.venv-litellm`, then runs everything; this run took {res['elapsed_s'] / 60:.1f} minutes):")
    w("")
    w("    bench/overhead" + (" --quick" if quick else ""))
    w("")
    w("Set-up: one zero-delay `mlxgate-sim` per kind of answer (`--ttft-ms 0`; non-streaming: one token, "
      f"answered at once; streams: {mode['stream_chunks']} content chunks 20 ms apart, or 10/s for the "
      "1000-stream run) is the backend of every path: **direct**, **mlxgate** (release, a `gateway.yaml` with "
      "`url:` backends, everything else default: metrics on, no clients, no context cap), **mlxgate-full** "
      "(a second mlxgate process: `auth: required` with one client whose key the load generators send as "
      "`Authorization: Bearer`, rpm/tpm/concurrency limits that never refuse, `context_cap: 32768` and, as "
      f"`tokenizer:`, {tokenizer_of(res)['what']}, so every prompt is rendered and counted exactly), "
      "**nginx** (one worker, `proxy_pass` to "
      "a keepalive upstream, `proxy_buffering off`), **LiteLLM** proxy (one worker, `openai/` models with "
      "`api_base` at the simulator, `LITELLM_LOCAL_MODEL_COST_MAP=True`). The proxy under test is pinned to "
      "CPU 0 (`taskset`); wrk, the simulators and the Python clients to CPU 1. Rounds are interleaved and the "
      "order of the paths changes every round (rows of a balanced Latin square); figures are medians over "
      "rounds, with (min to max) over rounds where there are several; \"added\" is the proxy minus the direct "
      "run of the same round. Noise floor: for a proxy-minus-direct figure, how much the direct run's own "
      "figure moved between rounds (max − min); for a difference of two gateways (the features-on cost), "
      "the max − min over rounds of that paired difference itself. A goal is \"met\" only when the figure "
      "plus its floor is within the goal, \"**not met**\" when the figure minus its floor is beyond it, and "
      "\"undetermined\" in between (the run cannot tell). CPU time is read from the kernel's per-process "
      "CPU clock (`clock_gettime` on the process's CPU clock id), summed over the proxy's process tree: the "
      "scheduler's ns on CPU of all the process's threads, exited threads included (not "
      "`/proc/PID/schedstat`, which is the main thread's alone), not 10 ms ticks.")
    w("")
    render_latency(w, res)
    render_ttfb(w, res)
    render_rate(w, res)
    render_streams(w, res)
    render_memory(w, res)
    render_soak(w, res)
    for key, title in [("profile", "mlxgate at saturation"), ("profile_c1", "mlxgate at concurrency 1"),
                       ("profile_full_c1", "mlxgate-full (features on) at concurrency 1"),
                       ("profile_streams", f"mlxgate during {mode['streams']} streams")]:
        render_profile(w, res.get(key, {}), title)
    w("## Goals (issue 11)")
    w("")
    w("| goal | measured | met? |")
    w("|---|---|---|")
    for goal, measured, met in goals(res):
        w(f"| {goal} | {measured} | {met} |")
    w("")
    if res.get("notes"):
        w("## Notes")
        w("")
        for n in res["notes"]:
            w(f"- {n}")
        w("")
    return "\n".join(out)


def render_latency(w: Callable[[str], None], res: dict) -> None:
    mode, lat = res["mode"], res["latency"]
    s_ = lat["summary"]
    w(f"## Added latency at concurrency 1 (non-streaming chat; {mode['latency_rounds']} rounds × "
      f"{mode['latency_seconds']} s)")
    w("")
    w("| path | p50 | p99 | added p50 | added p99 | req/s | CPU per request | preempted / s | errors |")
    w("|---|---|---|---|---|---|---|---|---|")
    for t in TARGETS:
        s = s_[t]
        pre = f"{s['preempted_per_s']:.0f}" if "preempted_per_s" in s else "–"
        w(f"| {t} | {plain_us(s['p50'])} | {plain_us(s['p99'])} | "
          f"{us(s.get('added_p50'))}{span(s.get('added_p50_range'), us)} | "
          f"{us(s.get('added_p99'))}{span(s.get('added_p99_range'), us)} | {s['rps']:.0f} | "
          f"{plain_us(s.get('cpu_us_per_req'))}{span(s.get('cpu_us_per_req_range'))} | {pre} | {s['errors']} |")
    w("")
    nz = lat["noise"]
    w(f"Noise floor (direct's max − min over rounds): p50 {noise_text(nz['p50'])}, p99 {noise_text(nz['p99'])}. "
      "\"Preempted / s\" counts the proxy's involuntary context switches (another process took its CPU): "
      "the p99 at concurrency 1 is mostly those, not the proxy's own work, while other jobs run.")
    w("")
    fc = lat["features_cost"]
    counted = lat["prompts_counted"]
    w("### Features on vs off (mlxgate-full − mlxgate, same round)")
    w("")
    w("| | added p50 | added p99 |")
    w("|---|---|---|")
    for t in ["mlxgate", "mlxgate-full"]:
        w(f"| {t} | {us(s_[t].get('added_p50'))} | {us(s_[t].get('added_p99'))} |")
    w(f"| **features on cost** | {us(fc['p50']['median'])}{span(fc['p50']['range'], us)} | "
      f"{us(fc['p99']['median'])}{span(fc['p99']['range'], us)} |")
    w("")
    w(f"mlxgate-full counted with {tokenizer_of(res)['what']}. The noise floor of this difference is its "
      "own max − min over rounds (mlxgate-full and mlxgate are each measured once a round).")
    w("")
    w(f"Checked in the run: mlxgate-full answered a request without its key with 401, loaded the tokenizer, "
      f"and counted {counted['mlxgate-full']} prompts (`mlxgate_prompt_count_seconds_count`; mlxgate without a "
      f"cap: {counted['mlxgate']}). mlxgate has no switch for its metrics or its SSE meter (the meter is the "
      "product), so \"off\" is the default configuration.")
    w("")


def render_ttfb(w: Callable[[str], None], res: dict) -> None:
    mode, tt = res["mode"], res["ttfb"]
    w(f"## Stream time to first chunk at concurrency 1 ({mode['latency_rounds']} rounds × "
      f"{mode['ttfb_seconds']} s)")
    w("")
    w("Streamed chat requests one after another on one keep-alive connection (a Python client, stdlib "
      "sockets); the `fast` simulator sends the role chunk, one content chunk, the finish chunk and `[DONE]` "
      "at once. Time from sending the request to the first content chunk, and to the first byte of the answer.")
    w("")
    w("| path | first chunk p50 | p99 | added p50 | added p99 | first byte p50 | added | streams |")
    w("|---|---|---|---|---|---|---|---|")
    for t in TARGETS:
        s = tt["summary"][t]
        w(f"| {t} | {plain_us(s['chunk_p50'])} | {plain_us(s['chunk_p99'])} | "
          f"{us(s.get('added_chunk_p50'))}{span(s.get('added_chunk_p50_range'), us)} | "
          f"{us(s.get('added_chunk_p99'))}{span(s.get('added_chunk_p99_range'), us)} | "
          f"{plain_us(s['byte_p50'])} | {us(s.get('added_byte_p50'))} | {s['requests']} |")
    w("")
    nz = tt["noise"]
    w(f"Noise floor (direct's max − min over rounds): first-chunk p50 {noise_text(nz['chunk_p50'])}, p99 "
      f"{noise_text(nz['chunk_p99'])}.")
    w("")


def render_rate(w: Callable[[str], None], res: dict) -> None:
    mode, rate = res["mode"], res["rate"]["summary"]
    w(f"## Highest request rate with p99 under 5 ms (connections {mode['rate_conns']}, "
      f"{mode['rate_seconds']} s a step, {mode['rate_rounds']} round(s))")
    w("")
    w("| path | highest req/s with p99 < 5 ms | at connections | peak req/s seen (p99) | "
      "CPU per request at that step |")
    w("|---|---|---|---|---|")
    for t in LOAD_TARGETS:
        s = rate[t]
        best = f"{s['best_rps']:.0f}" if s["best_rps"] else "none (p99 ≥ 5 ms at every step)"
        cpu = s["steps"][s["best_conns"]]["cpu_us_per_req"] if s["best_conns"] else float("nan")
        w(f"| {t} | {best} | {s['best_conns'] or '–'} | {s['peak_rps']:.0f} "
          f"({s['peak_p99'] / 1000:.2f} ms at c={s['peak_conns']}) | {plain_us(cpu)} |")
    w("")
    w("Every step (req/s, p99):")
    w("")
    conns = mode["rate_conns"]
    w("| path | " + " | ".join(f"c={c}" for c in conns) + " |")
    w("|---|" + "---|" * len(conns))
    for t in LOAD_TARGETS:
        cells = []
        for c in conns:
            s = rate[t]["steps"].get(c)
            cells.append(f"{s['rps']:.0f}, {s['p99'] / 1000:.2f} ms" if s else "(stopped)")
        w(f"| {t} | " + " | ".join(cells) + " |")
    w("")


def render_stream_table(w: Callable[[str], None], phase: dict, targets: list[str], rss_key: str) -> None:
    w("| path | gap p50 | gap p99 | added p50 | added p99 | content chunks out / expected (streams × chunks) | "
      "requests the sim got | CPU per chunk | RSS |")
    w("|---|---|---|---|---|---|---|---|---|")
    for t in targets:
        s = phase["summary"][t]
        out = (f"{s['content_chunks_min']}" if s["content_chunks_min"] == s["content_chunks_max"]
               else f"{s['content_chunks_min']}–{s['content_chunks_max']}")
        w(f"| {t} | {plain_us(s['gap_p50_us'])} | {plain_us(s['gap_p99_us'])} | "
          f"{us(s.get('added_gap_p50_us'))}{span(s.get('added_gap_p50_us_range'), us)} | "
          f"{us(s.get('added_gap_p99_us'))}{span(s.get('added_gap_p99_us_range'), us)} | "
          f"{out} / {s['expected_chunks']} | {s['sim_requests_min']} | "
          f"{one_decimal(s.get('cpu_us_per_chunk'))}{span(s.get('cpu_us_per_chunk_range'), one_decimal)} | "
          f"{mib(s.get(rss_key))} |")
    w("")
    nz = phase["noise"]
    w(f"Noise floor (direct's max − min over rounds): gap p50 {noise_text(nz['gap_p50_us'])}, gap p99 "
      f"{noise_text(nz['gap_p99_us'])}.")
    w("")


def render_streams(w: Callable[[str], None], res: dict) -> None:
    mode = res["mode"]
    st = res["streams"]
    w(f"## Streams: {mode['streams']} concurrent × {mode['stream_chunks']} chunks 20 ms apart "
      f"({mode['stream_rounds']} rounds; LiteLLM {st['summary']['litellm']['rounds']})")
    w("")
    w("Starts spread over one 20 ms interval. The gap is between consecutive content chunks of one stream "
      "as the client receives them. \"Expected\" is the configured count (streams × chunks; the "
      "simulator does not count what it sends); \"requests the sim got\" is its own count (`/sim/stats`). "
      "CPU per chunk is the proxy's whole CPU time over the run divided by the content chunks the client got "
      "(it includes accepting the connections and handling the requests). RSS: peak during the run.")
    w("")
    render_stream_table(w, st, LOAD_TARGETS, "rss_peak_kib")
    many = res["many_streams"]
    w(f"## {mode['many_streams']} open streams ({mode['many_chunks']} chunks 100 ms apart; "
      f"{mode['many_rounds']} round(s))")
    w("")
    opened = ", ".join(f"{t} {many['summary'][t]['max_open_min']}" for t in MANY_TARGETS)
    w(f"Streams receiving at once (least over rounds): {opened}. RSS: the most seen while all were open. "
      "LiteLLM is left out (one worker does not keep 1000 streams at 10 chunks/s).")
    w("")
    render_stream_table(w, many, MANY_TARGETS, "rss_at_all_open_kib")


def render_memory(w: Callable[[str], None], res: dict) -> None:
    st, many = res["streams"]["summary"], res["many_streams"]["summary"]
    soak = res.get("soak")
    w("## Memory (VmRSS)")
    w("")
    w("| process | idle after start | during 256 streams | with 1000 streams open | idle after the runs | "
      "end of the soak | idle after the soak |")
    w("|---|---|---|---|---|---|---|")
    for t in PROXIES:
        soaked = soak and t == soak.get("target", "mlxgate")
        w(f"| {t} | {mib(res['rss_idle_kib'][t])} | {mib(st.get(t, {}).get('rss_peak_kib'))} | "
          f"{mib(many.get(t, {}).get('rss_at_all_open_kib'))} | {mib(res['rss_after_kib'][t])} | "
          f"{mib(soak['end_mib'] * 1024) if soaked else '–'} | {mib(soak['idle_after_mib'] * 1024) if soaked else '–'} |")
    w("")
    w(f"mlxgate-full holds {tokenizer_of(res)['short']} in memory (loaded once, shared by its three models); "
      "the RSS goals are judged on the default configuration (mlxgate), which loads none.")
    w("")


def render_soak(w: Callable[[str], None], res: dict) -> None:
    soak = res.get("soak")
    if not soak:
        return
    s = soak
    wk = s["wrk"]
    target = s.get("target", "mlxgate")
    w(f"## Soak: steady mixed traffic through {target} for {s['minutes']:g} min")
    w("")
    if target == "mlxgate-full":
        w("Through mlxgate-full (auth, the rate limiter's in-memory store and token counting on every request: "
          "the superset of the default configuration's work, where per-request state would pile up), with its "
          "client key on every request.")
        w("")
    w(f"wrk -c{SOAK_CONNS} non-streaming ({wk['requests']} requests, {wk['rps']:.0f} req/s, non-2xx "
      f"{wk['status_errors']}, socket errors {wk['socket_errors']}) and {SOAK_STREAMS_PER_S} streams a second of "
      f"{s['stream_chunks']} chunks 20 ms apart ({s['streams_finished']} of {s['streams']} finished, "
      f"{s['content_chunks']} content chunks, statuses {s['stream_statuses']}); VmRSS every {SOAK_SAMPLE_S} s.")
    w("")
    w("| RSS at the start | at the end | max | growth (least squares over the second half) | idle after |")
    w("|---|---|---|---|---|")
    w(f"| {s['start_mib']:.1f} MiB | {s['end_mib']:.1f} MiB | {s['max_mib']:.1f} MiB | "
      f"{s['growth_mib_per_min']:+.3f} MiB/min | {s['idle_after_mib']:.1f} MiB |")
    w("")
    w("Samples (minute: MiB): " + ", ".join(f"{t / 60:.1f}: {v:.1f}" for t, v in s["samples"]))
    w("")


def render_profile(w: Callable[[str], None], prof: dict, title: str) -> None:
    if not prof.get("top"):
        return
    unit, load = prof["unit"], prof["load"]
    what = (f"wrk -c{load['conns']}, {load['rps']:.0f} req/s" if unit == "request"
            else f"{load['streams']} streams, {prof['units']} content chunks")
    w(f"## Profile of {title} (`perf record -g`, {what})")
    w("")
    w(f"{prof['cpu_us_per_unit']:.1f} µs of CPU per {unit} under perf ({prof['cpu_s']:.2f} s of CPU "
      f"for {prof['units']} {unit}s).")
    w("")
    w("Top 15 symbols by self time:")
    w("")
    w("| self | where | symbol |")
    w("|---|---|---|")
    for r in prof["top"]:
        sym = r["symbol"]
        if len(sym) > 110:
            sym = sym[:107] + "…"
        sym = sym.replace("|", "\\|")
        w(f"| {r['pct']:.2f}% | {'kernel' if r['kernel'] else r['dso']} | `{sym}` |")
    w("")
    w("Every sample in one group: a kernel sample by the system call it is in (a send over loopback "
      "includes delivering the segment to the peer and waking it: in this VM most of that shows as "
      "`_raw_spin_unlock_irqrestore` in `sock_def_readable`), a user-space one by its own symbol (one "
      f"frame up for memcpy and the like; inlined code counts where it was inlined). µs per {unit} = "
      f"share × CPU per {unit}.")
    w("")
    w(f"| group | share of samples | µs per {unit} |")
    w("|---|---|---|")
    for g, p in prof["groups"].items():
        w(f"| {g} | {p:.1f}% | {p / 100 * prof['cpu_us_per_unit']:.2f} |")
    w("")


def goals(res: dict) -> list[tuple[str, str, str]]:
    lat, tt = res["latency"], res["ttfb"]
    rate = res["rate"]["summary"]
    st, many = res["streams"], res["many_streams"]
    ls = lat["summary"]
    rows = []
    g_p50, n_p50 = ls["mlxgate"]["added_p50"], ls["nginx"]["added_p50"]
    # A comparison of two gateways: its floor is the spread over rounds of the paired difference
    # (mlxgate's added p50 − 1.5 × nginx's, same round), not direct's spread.
    vs_nginx = range_width(spread(paired_over_rounds(lat["runs"], "p50", "mlxgate", "nginx", 1.5)))
    rows.append(("added p50 ≤ 1.5× nginx's added p50 (c=1)",
                 f"{us(g_p50)} vs nginx {us(n_p50)}" + (f" ({g_p50 / n_p50:.2f}×)" if n_p50 > 0 else "")
                 + f"; mlxgate − 1.5× nginx over rounds: {noise_text(vs_nginx)}",
                 verdict(g_p50, 1.5 * n_p50, vs_nginx)))
    g_p99 = ls["mlxgate"]["added_p99"]
    rows.append(("added p99 ≤ 150 µs (c=1)", f"{us(g_p99)}; direct's p99 {noise_text(lat['noise']['p99'])}",
                 verdict(g_p99, 150, lat["noise"]["p99"])))
    tg = tt["summary"]["mlxgate"]
    rows.append(("stream time to first chunk (c=1): added p50 / p99 (reported; the 150 µs goal is for "
                 "non-streaming)", f"{us(tg['added_chunk_p50'])} / {us(tg['added_chunk_p99'])} "
                 f"(nginx {us(tt['summary']['nginx']['added_chunk_p50'])} / "
                 f"{us(tt['summary']['nginx']['added_chunk_p99'])}); direct's p99 "
                 f"{noise_text(tt['noise']['chunk_p99'])}", "– (no goal)"))

    def rate_of(t: str) -> tuple[float, str]:
        r = rate[t]
        if r["best_rps"]:
            return r["best_rps"], f"{r['best_rps']:.0f}"
        return r["peak_rps"], f"{r['peak_rps']:.0f} (peak; never p99 < 5 ms)"

    (g_rate, g_txt), (n_rate, n_txt), (l_rate, l_txt) = rate_of("mlxgate"), rate_of("nginx"), rate_of("litellm")
    rows.append(("highest rate (p99 < 5 ms) ≥ 0.7× nginx's",
                 f"mlxgate {g_txt} vs nginx {n_txt} req/s: {g_rate / n_rate:.2f}×", met(g_rate >= 0.7 * n_rate)))
    rows.append(("highest rate ≥ 300× LiteLLM's",
                 f"mlxgate {g_txt} vs LiteLLM {l_txt} req/s: {g_rate / l_rate:.0f}×", met(g_rate >= 300 * l_rate)))
    for phase, goal_us, label in [(st, 50, "256"), (many, 1000, "1000")]:
        a = phase["summary"]["mlxgate"]["added_gap_p99_us"]
        floor = phase["noise"]["gap_p99_us"]
        rows.append((f"added inter-chunk p99 ≤ {plain_us(goal_us)} at {label} streams",
                     f"{us(a)}{span(phase['summary']['mlxgate'].get('added_gap_p99_us_range'), us)}; "
                     f"direct's p99 {noise_text(floor)}", verdict(a, goal_us, floor)))
    for phase, label in [(st, "256"), (many, "1000")]:
        s = phase["summary"]["mlxgate"]
        rows.append((f"chunks in = chunks out ({label} streams)",
                     f"out {s['content_chunks_min']}–{s['content_chunks_max']}, expected (streams × chunks) "
                     f"{s['expected_chunks']}",
                     met(s["content_chunks_min"] == s["content_chunks_max"] == s["expected_chunks"])))
    s = st["summary"]["mlxgate"]
    cpc = s["cpu_us_per_chunk"]
    rows.append(("≤ 5 µs of CPU per streamed chunk (256 streams)",
                 f"{one_decimal(cpc)}{span(s.get('cpu_us_per_chunk_range'), one_decimal)}", met(cpc <= 5)))
    idle = res["rss_idle_kib"]["mlxgate"] / 1024
    rows.append(("RSS ≤ 15 MB idle (default config)", f"{idle:.1f} MiB", met(idle * 1.048576 <= 15)))
    r1000 = (many["summary"]["mlxgate"].get("rss_at_all_open_kib") or 0) / 1024
    rows.append(("RSS ≤ 64 MB at 1000 streams (default config)", f"{r1000:.1f} MiB", met(r1000 * 1.048576 <= 64)))
    tok = tokenizer_of(res)
    rows.append((f"RSS of mlxgate-full ({tok['short']} loaded)",
                 f"{mib(res['rss_idle_kib'].get('mlxgate-full'))} idle after start, "
                 f"{mib(res.get('rss_after_kib', {}).get('mlxgate-full'))} idle after the runs (default config: "
                 f"{idle:.1f} MiB idle after start)",
                 "– (no goal: the RSS goals are judged on the default config)"))
    soak = res.get("soak")
    if soak:
        g = soak["growth_mib_per_min"]
        rows.append((f"RSS growth < 1 MiB/min ({soak['minutes']:g}-minute soak through {soak.get('target', 'mlxgate')})",
                     f"{g:+.3f} MiB/min ({soak['start_mib']:.1f} → {soak['end_mib']:.1f} MiB, max "
                     f"{soak['max_mib']:.1f})", met(g < 1)))
    else:
        rows.append(("RSS growth < 1 MiB/min over a 10-minute soak", "not run (--soak-minutes 0)", "–"))
    fc = lat["features_cost"]["p50"]
    # A gateway − gateway difference: its floor is its own spread over rounds.
    fc_floor = range_width(fc["range"])
    rows.append((f"features on (auth + limits + token counting with {tok['short']}) cost ≤ 30 µs at p50",
                 f"{us(fc['median'])}{span(fc['range'], us)}; the difference over rounds: {noise_text(fc_floor)}",
                 verdict(fc["median"], 30, fc_floor)))
    return rows


def write_report(out_md: Path, res: dict) -> None:
    kept = ""
    if out_md.exists() and KEEP_MARKER in out_md.read_text():
        kept = out_md.read_text().split(KEEP_MARKER, 1)[1]
    out_md.write_text(render(res, res["quick"]) + "\n" + KEEP_MARKER + (kept or "\n"))
