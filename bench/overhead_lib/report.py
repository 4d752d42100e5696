"""The Markdown report (BENCHMARKS.md, bench/results/quick.md) rendered from the raw figures."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable

from .processes import nginx_binary
from .goals import goals_issue11, goals_table
from .picture import write_svg
from .text import mib, noise_text, one_decimal, plain_us, span, tokenizer_of, us
from .settings import (
    LITELLM_VENV, LOAD_TARGETS, MANY_TARGETS, PORTKEY_VERSION, PROXIES, ROOT, SOAK_CONNS, SOAK_SAMPLE_S,
    SOAK_STREAMS_PER_S, TARGETS,
)


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


def svg_path(out_md: Path) -> Path:
    """Where the picture of a report goes: bench/results/overhead.svg for BENCHMARKS.md, else
    beside the report with its name (bench/results/quick.svg for quick.md)."""
    if out_md.resolve() == (ROOT / "BENCHMARKS.md").resolve():
        return ROOT / "bench" / "results" / "overhead.svg"
    return out_md.with_suffix(".svg")


def render(res: dict, quick: bool, svg: Path | None = None, out_md: Path | None = None) -> str:
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
    w(f"Reproduce (installs nginx, wrk, perf and node from Debian, builds the release binaries, `.venv-litellm` "
      f"and Portkey's gateway, then runs everything; this run took {res['elapsed_s'] / 60:.1f} minutes):")
    w("")
    w("    bench/overhead" + (" --quick" if quick else "")
      + (" --before-bin-dir DIR   # DIR: the \"before\" binaries (mlxgate)" if res.get("before_bin_dir") else ""))
    w("")
    if not quick and "pin_rounds" in mode:
        w(f"To keep the whole run near half an hour, some phases are shorter than they could be: the rate steps are "
          f"{mode['rate_seconds']} s at connections {mode['rate_conns']}; LiteLLM and Portkey get "
          f"{mode['litellm_stream_rounds']} round of 256 streams (the others {mode['stream_rounds']}); the second "
          f"pinning, the faces and the long prompt {mode['pin_rounds']}, {mode['face_rounds']} and "
          f"{mode['long_rounds']} rounds; the soak {mode['soak_minutes']:g} minutes (`--soak-minutes` sets it).")
        w("")
    render_goals(w, res)
    if svg is not None and out_md is not None:
        rel = os.path.relpath(svg, out_md.resolve().parent)
        w(f"![CPU per request and per chunk, added latency at c=1, per proxy]({rel})")
        w("")
    w("Set-up: one zero-delay `mlxgate-sim` per kind of answer (`--ttft-ms 0`; non-streaming: one token, "
      f"answered at once; streams: {mode['stream_chunks']} content chunks 20 ms apart, or 10/s for the "
      "1000-stream run) is the backend of every path: **direct**, **mlxgate** (release, a `gateway.yaml` with "
      "`url:` backends and `worker_threads: 1` — one event loop, as nginx's one worker —, everything else "
      "default: metrics on, no clients, no context cap; **mlxgate-before** the same without `worker_threads`, "
      "which it predates: tokio's thread per core), **mlxgate-full** "
      "(a second mlxgate process: `auth: required` with one client whose key the load generators send as "
      "`Authorization: Bearer`, rpm/tpm/concurrency limits that never refuse, `context_cap: 32768` and, as "
      f"`tokenizer:`, {tokenizer_of(res)['what']}, so every prompt is rendered and counted exactly), "
      "**nginx** (one worker, `proxy_pass` to "
      "a keepalive upstream, `proxy_buffering off`), **LiteLLM** proxy (one worker, `openai/` models with "
      "`api_base` at the simulator, `LITELLM_LOCAL_MODEL_COST_MAP=True`)"
      + (f", **portkey** (Portkey's gateway `@portkey-ai/gateway` {PORTKEY_VERSION} from npm, on node, `--headless`, "
         "`NODE_ENV=production`; requests carry `x-portkey-provider: openai` and `x-portkey-custom-host` = the "
         "simulator; its `@hono/node-server` pinned to 1.13.8: with 1.19 every streamed request fails on Node 20)"
         if "portkey" in res.get("targets", []) else "")
      + (f", **mlxgate-before** (the same configuration as mlxgate, binaries from `{res['before_bin_dir']}`: the "
         "\"before\" of this run, measured in every phase mlxgate is)" if res.get("before_bin_dir") else "")
      + ". Access logs: "
      + ("**on** for both (mlxgate's default `access_log: true`, one line per request to its log file; nginx's "
         "`access_log` to a file, its default format)" if res.get("access_log", False) else
         "**off** for both (`access_log: false` in mlxgate's gateway.yaml, `access_log off` in nginx's config)")
      + ". Unless a phase says otherwise (\"proxy beside the backend\"), the proxy under test is pinned to "
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
    render_pinned(w, res)
    render_long_prompt(w, res)
    render_ttfb(w, res)
    render_rate(w, res)
    render_streams(w, res)
    render_faces(w, res)
    render_memory(w, res)
    render_soak(w, res)
    for key, title in [("profile", "mlxgate at saturation"), ("profile_c1", "mlxgate at concurrency 1"),
                       ("profile_full_c1", "mlxgate-full (features on) at concurrency 1"),
                       ("profile_streams", f"mlxgate during {mode['streams']} streams (per content chunk)")]:
        render_profile(w, res.get(key, {}), title)
    w("## Earlier goals (issue 11)")
    w("")
    w("| goal | measured | met? |")
    w("|---|---|---|")
    for goal, measured, ok in goals_issue11(res):
        w(f"| {goal} | {measured} | {ok} |")
    w("")
    if res.get("notes"):
        w("## Notes")
        w("")
        for n in res["notes"]:
            w(f"- {n}")
        w("")
    return "\n".join(out)


def render_goals(w: Callable[[str], None], res: dict) -> None:
    has_before = "mlxgate-before" in res.get("targets", [])
    w("## Goals (issue 24): one run, side by side, medians over interleaved rounds")
    w("")
    w("Each figure is mlxgate's, its ratio to the path it is compared with, and the verdict by the noise-floor rule "
      "below (\"met\" only when the figure plus its floor is within the goal; \"**not met**\" when the figure minus "
      "its floor is beyond it; else \"undetermined\"). A ratio goal's floor is the max − min over rounds of the "
      "paired difference (mlxgate − k × nginx of the same round)."
      + (" The last column is the same run's mlxgate-before (the binaries of `--before-bin-dir`) and its ratio."
         if has_before else ""))
    w("")
    head = "| goal | figure | ratio | verdict |" + (" mlxgate-before (same run) |" if has_before else "")
    w(head)
    w("|---|---|---|---|" + ("---|" if has_before else ""))
    for goal, fig, ratio, verdict_, before in goals_table(res):
        w(f"| {goal} | {fig} | {ratio} | {verdict_} |" + (f" {before or '–'} |" if has_before else ""))
    w("")


def render_pinned(w: Callable[[str], None], res: dict) -> None:
    ph = res.get("pinned")
    if not ph:
        return
    lat = res["latency"]["summary"]
    sm = ph["summary"]
    mode = res["mode"]
    w(f"## Added p50 at concurrency 1 in two pinnings ({mode['pin_rounds']} rounds × {mode['latency_seconds']} s "
      "beside the backend)")
    w("")
    w("\"Proxy alone\": the proxy on CPU 0, wrk and the simulator on CPU 1 (the latency table above). \"Proxy beside "
      "the backend\": the proxy moved (`taskset -a -p`, every thread) to CPU 1 with the simulator, wrk on CPU 0; "
      "the proxy and the backend then take turns on one CPU, as on a machine whose backend is busy. Ratio: the "
      "proxy's added p50 over nginx's, same pinning.")
    w("")
    w("| path | added p50, alone | ratio to nginx | added p50, beside | ratio to nginx | CPU per request, beside |")
    w("|---|---|---|---|---|---|")
    for t in sm:
        if t == "direct":
            continue
        a1, n1 = lat[t].get("added_p50"), lat["nginx"].get("added_p50")
        a2, n2 = sm[t].get("added_p50"), sm["nginx"].get("added_p50")
        r1 = f"{a1 / n1:.2f}×" if n1 and n1 > 0 and a1 is not None else "–"
        r2 = f"{a2 / n2:.2f}×" if n2 and n2 > 0 and a2 is not None else "–"
        w(f"| {t} | {us(a1)}{span(lat[t].get('added_p50_range'), us)} | {r1} | "
          f"{us(a2)}{span(sm[t].get('added_p50_range'), us)} | {r2} | "
          f"{plain_us(sm[t].get('cpu_us_per_req'))}{span(sm[t].get('cpu_us_per_req_range'))} |")
    w("")
    nz = ph["noise"]
    w(f"Noise floor beside the backend (direct's max − min over rounds): p50 {noise_text(nz['p50'])}.")
    w("")


def render_long_prompt(w: Callable[[str], None], res: dict) -> None:
    lp = res.get("long_prompt")
    if not lp:
        return
    mode = res["mode"]
    sm = lp["summary"]
    w(f"## Counting a long prompt ({lp['tokens']} tokens; {mode['long_rounds']} rounds × {mode['long_seconds']} s "
      "at concurrency 1)")
    w("")
    w(f"One non-streaming chat request with a {lp['bytes']}-byte user message ({lp['tokens']} tokens by "
      f"{lp['counted_by']}); mlxgate-full renders and counts it exactly, mlxgate does not count. The cost of counting is "
      "mlxgate-full's CPU per request minus mlxgate's of the same round, reported per 1k prompt tokens (not folded "
      "into the features-on goal, which is for a short prompt).")
    w("")
    w("| path | p50 | added p50 | CPU per request |")
    w("|---|---|---|---|")
    for t, v in sm.items():
        w(f"| {t} | {plain_us(v['p50'])} | {us(v.get('added_p50'))} | "
          f"{plain_us(v.get('cpu_us_per_req'))}{span(v.get('cpu_us_per_req_range'))} |")
    w("")
    c, k = lp["cost_cpu"], lp["cost_per_1k"]
    w(f"Counting: {us(c['median'])} of CPU per request{span(c['range'], us)}, **{one_decimal(k['median'])} per 1k "
      f"tokens**{span(k['range'], one_decimal)}; added p50 {us(lp['p50_cost']['median'])}.")
    w("")


def render_faces(w: Callable[[str], None], res: dict) -> None:
    fc = res.get("faces")
    if not fc:
        return
    mode = res["mode"]
    w(f"## The API faces: {mode['streams']} streams × {mode['stream_chunks']} chunks through each face "
      f"({mode['face_rounds']} rounds)")
    w("")
    w("The simulator serves chat completions; the gateway's `/v1/responses` face (body `{model, input, stream}`) and "
      "`/v1/messages` face (`{model, max_tokens, messages, stream}`, header `anthropic-version`) translate every chunk "
      "into their own events. Content events are counted per face: `choices[0].delta.content` (chat), "
      "`response.output_text.delta` (Responses), `content_block_delta` (Messages). The faces of one gateway run in "
      "the same rounds; the ratio is a face's CPU per chunk over the chat face's of the same round.")
    w("")
    render_stream_table(w, fc, list(fc["summary"]), "rss_peak_kib")
    w("| face | CPU per chunk ÷ the chat face's (median, range over rounds) |")
    w("|---|---|")
    for t, r in fc["ratios"].items():
        w(f"| {t} | {r['median']:.2f}×" + (f" ({r['range'][0]:.2f}× to {r['range'][1]:.2f}×)" if r["range"] else "")
          + " |")
    w("")


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
    if "cpu_us_per_req" in fc:
        c = fc["cpu_us_per_req"]
        w("")
        w(f"CPU per request, mlxgate-full − mlxgate of the same round (the goal's figure): **{us(c['median'])}**"
          f"{span(c['range'], us)}.")
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
    if "portkey" in tt["summary"]:
        w("Portkey's gateway waits 25 ms before it passes on a stream's first chunk, by design: its stream handler "
          "(`build/start-server.js` of the npm package) sleeps `setTimeout(…, 25)` before the first chunk it forwards "
          "(and 1 ms before each chunk for Azure), so its time to first chunk is at least 25 ms whatever its CPU.")
        w("")
    nz = tt["noise"]
    w(f"Noise floor (direct's max − min over rounds): first-chunk p50 {noise_text(nz['chunk_p50'])}, p99 "
      f"{noise_text(nz['chunk_p99'])}.")
    w("")


def render_rate(w: Callable[[str], None], res: dict) -> None:
    mode, rate = res["mode"], res["rate"]["summary"]
    q = res["rate"].get("quota") or 0
    w(f"## Request rate with the proxy as the bottleneck (connections {mode['rate_conns']}, "
      f"{mode['rate_seconds']} s a step, {mode['rate_rounds']} round(s))")
    w("")
    if q:
        w(f"Each proxy ran in its own {res['rate']['quota_kind']} group with a CPU quota of **{q:.0%} of one CPU** "
          f"(period {res['rate']['quota_period_us'] / 1000:g} ms; the group made for this phase and removed after it), "
          "so that the proxy saturates before wrk and the simulator on CPU 1 do: without it, any proxy under ~40 µs "
          "per request is bounded by the load generator and looks alike. The peak rates are the rate ratio's figures; "
          "a throttled proxy waits up to the rest of a period, so its p99 at saturation says more about the quota "
          "than about the proxy.")
    else:
        why = res["rate"].get("quota_unavailable")
        w("**No CPU quota** on the proxies" + (f" ({why})" if why else " (`--proxy-quota 0`)") + ": each had all of "
          "CPU 0, and the rates may be bounded by wrk and the simulator on CPU 1 (see \"bounded by\").")
    w("")
    w("\"Bounded by\" for each step: the proxy's CPU time over the step divided by its quota (or one CPU) — at ≥ 90% "
      "the proxy's quota bounded it —; the CPU time of wrk and the simulator over the step (the load generator's "
      "own, from the kernel) — at ≥ 90% of CPU 1 the load generator bounded it —; and CPU 1's busy share from "
      "/proc/stat (everything on it, other jobs included): ≥ 90% without the other two means CPU 1 was taken by "
      "other jobs; none of these: too few connections (latency-bound).")
    w("")
    w("| path | highest req/s with p99 < 5 ms | at connections | peak req/s seen (p99) | CPU per request at the peak | "
      "bounded by (at the peak) |")
    w("|---|---|---|---|---|---|")
    for t in LOAD_TARGETS:
        s = rate[t]
        best = f"{s['best_rps']:.0f}" if s["best_rps"] else "none (p99 ≥ 5 ms at every step)"
        pk = s["steps"][s["peak_conns"]]
        w(f"| {t} | {best} | {s['best_conns'] or '–'} | {s['peak_rps']:.0f} "
          f"({s['peak_p99'] / 1000:.2f} ms at c={s['peak_conns']}) | {plain_us(pk.get('cpu_us_per_req'))} | "
          f"{pk.get('bound', '–')} |")
    w("")
    n_peak = rate["nginx"]["peak_rps"]
    ratios = ", ".join(f"{t} {rate[t]['peak_rps'] / n_peak:.3g}×" for t in LOAD_TARGETS if t not in ("direct", "nginx"))
    w(f"Peak rate over nginx's: {ratios}.")
    w("")
    w("Every step (req/s, p99; proxy CPU / its quota; CPU 1 busy → bounded by):")
    w("")
    conns = mode["rate_conns"]
    w("| path | " + " | ".join(f"c={c}" for c in conns) + " |")
    w("|---|" + "---|" * len(conns))
    for t in LOAD_TARGETS:
        cells = []
        for c in conns:
            s = rate[t]["steps"].get(c)
            if not s:
                cells.append("(stopped)")
                continue
            use = s.get("proxy_use")
            cells.append(f"{s['rps']:.0f}, {s['p99'] / 1000:.2f} ms; "
                         + (f"proxy {use:.0%}, " if use is not None and use == use else "")
                         + (f"wrk+sim {s['load_own']:.0%} of CPU 1 ({s['load_busy']:.0%} busy) → {s['bound']}"
                            if "load_own" in s else ""))
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
      f"({mode['stream_rounds']} rounds; "
      + ", ".join(f"{t} {st['summary'][t]['rounds']}" for t in ("litellm", "portkey") if t in st["summary"])
      + ": slow, fewer rounds)")
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
      "LiteLLM and Portkey are left out (one Python worker or one node process does not keep 1000 streams at "
      "10 chunks/s, and a run would take minutes).")
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
    top3 = list(prof["groups"].items())[:3]
    if top3:
        w(f"Where the {prof['cpu_us_per_unit']:.1f} µs per {unit} go, the largest first: "
          + "; ".join(f"{g} {p / 100 * prof['cpu_us_per_unit']:.2f} µs" for g, p in top3) + ".")
        w("")
    w(f"| group | share of samples | µs per {unit} |")
    w("|---|---|---|")
    for g, p in prof["groups"].items():
        w(f"| {g} | {p:.1f}% | {p / 100 * prof['cpu_us_per_unit']:.2f} |")
    w("")


def write_report(out_md: Path, res: dict) -> None:
    """The report and its picture (svg_path)."""
    kept = ""
    if out_md.exists() and KEEP_MARKER in out_md.read_text():
        kept = out_md.read_text().split(KEEP_MARKER, 1)[1]
    svg = svg_path(out_md)
    write_svg(svg, res)
    out_md.write_text(render(res, res["quick"], svg, out_md) + "\n" + KEEP_MARKER + (kept or "\n"))
