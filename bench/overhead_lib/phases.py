"""The measurements, one function per phase: latency (both pinnings), time to the first chunk, rate
(under a CPU quota), 256 streams, the faces, the long prompt, 1000 streams, the soak; each adds its
figures to the results."""

from __future__ import annotations

import asyncio
import json
import resource
import subprocess
import time
from pathlib import Path
from typing import Callable

from . import settings
from .load import first_chunk_times, run_streams, wrk, wrk_command, wrk_result
from .processes import (
    Procs, busy_share, cpu_seconds, cpu_times, http_text, loadavg, pin, preempted, prompts_counted, rss_kib,
)
from .quota import QuotaUnavailable, quotas
from .settings import (
    FACE_GATEWAYS, FACES, GATEWAYS, HOST, LOAD_CPU, LOAD_TARGETS, MANY_TARGETS, Mode, P99_BUDGET_US, PROXY_CPU,
    QUOTA_PERIOD_US, QWEN_TOKENIZER_DIR, ROOT, SIM_PORTS, SLOW_TARGETS, SOAK_CONNS, SOAK_SAMPLE_S,
    SOAK_STREAMS_PER_S, SOAK_TARGET, TARGETS, log,
)
from .stats import med, noise, pct, rounds_order, slope_per_minute, spread, summarize
from .targets import chat_body, long_prompt


def on_cpu(pid: int | None, run: Callable[[], dict]) -> dict:
    """Runs `run` and adds the proxy's CPU seconds and involuntary switches over it."""
    cpu0, pre0 = cpu_seconds(pid), preempted(pid)
    r = run()
    if pid:
        r["cpu_s"] = cpu_seconds(pid) - cpu0
        r["preempted"] = preempted(pid) - pre0
    return r


def latency_rounds(procs: Procs, workdir: Path, targets: list[str], rounds: int, seconds: float,
                   wrk_cpu: str = LOAD_CPU, body: dict | None = None, label: str = "") -> dict[str, list[dict]]:
    """wrk -c1 through each target, `rounds` interleaved rounds, with the proxy's CPU per request."""
    runs: dict[str, list[dict]] = {t: [] for t in targets}
    for r in range(rounds):
        for target in rounds_order(targets, r):
            w = on_cpu(procs.proxy_pid(target), lambda t=target: wrk(workdir, t, 1, seconds, wrk_cpu, body))
            w["round"], w["loadavg"] = r, loadavg()
            if "cpu_s" in w:
                w["cpu_us_per_req"] = w["cpu_s"] / max(1, w["requests"]) * 1e6
                w["preempted_per_s"] = w["preempted"] / (w["duration_us"] / 1e6)
            runs[target].append(w)
            log(f"  {label}round {r + 1} {target:14} p50 {w['p50']:6d} us  p99 {w['p99']:6d} us  {w['rps']:8.0f} "
                f"req/s  non-2xx {w['status_errors']}"
                + (f"  cpu {w['cpu_us_per_req']:.1f} us/req" if "cpu_s" in w else ""))
    return runs


def latency_summary(runs: dict[str, list[dict]]) -> dict:
    summary = {}
    for target, ws in runs.items():
        summary[target] = summarize(ws, runs["direct"], ["p50", "p90", "p99", "rps", "cpu_us_per_req",
                                                         "preempted_per_s"])
        summary[target]["errors"] = sum(w["status_errors"] + w["socket_errors"] for w in ws)
    return summary


def paired(runs: dict[str, list[dict]], key: str, a: str, b: str) -> dict:
    """a − b of `key` per round (two gateways measured in the same round): median and [min, max]."""
    by_b = {w["round"]: w[key] for w in runs[b]}
    d = [w[key] - by_b[w["round"]] for w in runs[a] if w["round"] in by_b]
    return {"median": med(d), "range": spread(d), "values": d}


def measure_latency(procs: Procs, workdir: Path, mode: Mode, res: dict) -> None:
    log(f"latency at concurrency 1 (proxy alone on CPU {PROXY_CPU}): {mode.latency_rounds} rounds x "
        f"{mode.latency_seconds}s per target")
    runs = latency_rounds(procs, workdir, TARGETS, mode.latency_rounds, mode.latency_seconds)
    direct = runs["direct"]
    # Features on: mlxgate-full minus mlxgate of the same round (latency and CPU per request).
    res["latency"] = {
        "runs": runs, "summary": latency_summary(runs), "loadavg": loadavg(),
        "noise": {k: noise([w[k] for w in direct]) for k in ["p50", "p99"]},
        "features_cost": {k: paired(runs, k, "mlxgate-full", "mlxgate") for k in ["p50", "p99", "cpu_us_per_req"]},
        "prompts_counted": {name: prompts_counted(port) for name, port in GATEWAYS.items()},
    }
    if res["latency"]["prompts_counted"]["mlxgate-full"] < sum(w["requests"] for w in runs["mlxgate-full"]):
        raise SystemExit(f"mlxgate-full counted fewer prompts than it served: {res['latency']['prompts_counted']}")


def measure_pinned(procs: Procs, workdir: Path, mode: Mode, res: dict) -> None:
    """Added latency at c=1 with each proxy beside the backend: the proxy moved to the simulator's
    CPU, wrk on the other one (the "proxy alone" pinning is measure_latency's)."""
    targets = [t for t in TARGETS if t != "mlxgate-full"]
    log(f"latency at concurrency 1, proxy beside the backend (proxy and sim on CPU {LOAD_CPU}, wrk on CPU "
        f"{PROXY_CPU}): {mode.pin_rounds} rounds x {mode.latency_seconds}s per target")
    proxies = [t for t in targets if t != "direct"]
    try:
        for t in proxies:
            pin(procs.proxy_pid(t), LOAD_CPU)
        runs = latency_rounds(procs, workdir, targets, mode.pin_rounds, mode.latency_seconds, wrk_cpu=PROXY_CPU,
                              label="beside: ")
    finally:
        for t in proxies:
            pin(procs.proxy_pid(t), PROXY_CPU)
    res["pinned"] = {"runs": runs, "summary": latency_summary(runs), "loadavg": loadavg(),
                     "noise": {k: noise([w[k] for w in runs["direct"]]) for k in ["p50", "p99"]}}


def prompt_tokens(text: str) -> tuple[int | None, str]:
    """Tokens of `text` with Qwen3.6's tokenizer (.venv-tokens' `tokenizers`), and how it was counted."""
    py = ROOT / ".venv-tokens" / "bin" / "python"
    tok = QWEN_TOKENIZER_DIR / "tokenizer.json"
    if py.exists() and tok.exists():
        out = subprocess.run([str(py), "-c", "import sys, tokenizers; t = tokenizers.Tokenizer.from_file(sys.argv[1]);"
                              " print(len(t.encode(sys.stdin.read()).ids))", str(tok)],
                             input=text, capture_output=True, text=True, timeout=120)
        if out.returncode == 0:
            return int(out.stdout.strip()), "Qwen3.6's tokenizer (the user text; the chat template adds a few)"
    return None, "not counted (.venv-tokens or .cache/qwen3.6-tokenizer missing): estimated at 1.3 tokens a word"


def measure_long_prompt(procs: Procs, workdir: Path, mode: Mode, res: dict) -> None:
    """Counting a long prompt: mlxgate-full (counts it) vs mlxgate (does not), CPU per request,
    reported per 1k prompt tokens."""
    words = 3000
    text = long_prompt(words)
    tokens, how = prompt_tokens(text)
    if tokens is None:
        tokens = int(words * 1.3)
    targets = ["direct", *[g for g in GATEWAYS]]
    log(f"long prompt ({tokens} tokens) at concurrency 1: {mode.long_rounds} rounds x {mode.long_seconds}s")
    runs = latency_rounds(procs, workdir, targets, mode.long_rounds, mode.long_seconds,
                          body=chat_body("fast", False, prompt=text), label="long: ")
    cost = paired(runs, "cpu_us_per_req", "mlxgate-full", "mlxgate")
    res["long_prompt"] = {"runs": runs, "summary": latency_summary(runs), "tokens": tokens, "counted_by": how,
                          "bytes": len(text), "cost_cpu": cost,
                          "cost_per_1k": {"median": cost["median"] / (tokens / 1000),
                                          "range": [v / (tokens / 1000) for v in cost["range"]] if cost["range"]
                                          else None},
                          "p50_cost": paired(runs, "p50", "mlxgate-full", "mlxgate")}
    log(f"  counting {tokens} tokens: {cost['median']:.0f} us CPU per request over mlxgate, "
        f"{res['long_prompt']['cost_per_1k']['median']:.1f} us per 1k tokens")


def measure_ttfb(procs: Procs, mode: Mode, res: dict) -> None:
    log(f"stream time to first byte / first content chunk at concurrency 1: {mode.latency_rounds} rounds x "
        f"{mode.ttfb_seconds}s per target")
    runs: dict[str, list[dict]] = {t: [] for t in TARGETS}
    for r in range(mode.latency_rounds):
        for target in rounds_order(TARGETS, r):
            times = first_chunk_times(target, mode.ttfb_seconds)
            byte, chunk = [b for b, _ in times], [c for _, c in times]
            s = {"round": r, "requests": len(times), "no_content": sum(1 for c in chunk if c != c),
                 "byte_p50": pct(byte, 50), "byte_p99": pct(byte, 99),
                 "chunk_p50": pct(chunk, 50), "chunk_p99": pct(chunk, 99)}
            runs[target].append(s)
            log(f"  round {r + 1} {target:12} first chunk p50 {s['chunk_p50']:7.0f} us  p99 {s['chunk_p99']:7.0f} us"
                f"  (first byte p50 {s['byte_p50']:.0f} us)  {s['requests']} streams")
    keys = ["byte_p50", "byte_p99", "chunk_p50", "chunk_p99"]
    summary = {t: summarize(runs[t], runs["direct"], keys) for t in TARGETS}
    for t in TARGETS:
        summary[t]["requests"] = sum(s["requests"] for s in runs[t])
        summary[t]["no_content"] = sum(s["no_content"] for s in runs[t])
    res["ttfb"] = {"runs": runs, "summary": summary,
                   "noise": {k: noise([s[k] for s in runs["direct"]]) for k in keys}}


def bounded_by(target: str, w: dict, share: float) -> str:
    """Which resource bounded one rate step: the proxy's quota (or its whole CPU without a quota)
    when it used ≥ 90% of it; the load generator when wrk + the simulator used ≥ 90% of CPU 1; CPU 1
    shared with other jobs when it was ≥ 90% busy without that."""
    proxy = w.get("proxy_use", float("nan"))
    own = w.get("load_own", float("nan"))
    busy = w.get("load_busy", float("nan"))
    found = []
    if target != "direct" and proxy == proxy and proxy >= 0.9:
        found.append("proxy quota" if share else "proxy CPU")
    if own == own and own >= 0.9:
        found.append("load generator CPU")
    if found:
        return " and ".join(found)
    if busy == busy and busy >= 0.9:
        return "CPU 1 shared with other jobs (wrk + sim below 90%)"
    return "neither (latency: too few connections)"


def load_cpu_s(procs: Procs) -> float:
    """CPU seconds of the load generator so far: wrk (this driver's finished children) and the
    `fast` simulator."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime + cpu_seconds(procs.pid("sim-fast"))


def measure_rate(procs: Procs, workdir: Path, mode: Mode, res: dict) -> None:
    share = settings.PROXY_QUOTA
    groups: dict = {}
    unavailable = None
    proxies = [t for t in LOAD_TARGETS if t != "direct"]
    if share > 0:
        try:
            groups = quotas({t: procs.pid(t) for t in proxies}, share, QUOTA_PERIOD_US)
        except QuotaUnavailable as e:
            unavailable = str(e)
            res["notes"].append(f"The rate phase ran WITHOUT a CPU quota on the proxies ({unavailable}): each proxy "
                                f"had all of CPU {PROXY_CPU}, and the rate may be bounded by wrk and the simulator "
                                "on the other CPU (see \"bounded by\").")
            log(f"  no CPU quota: {unavailable}")
            share = 0
    kind = next(iter(groups.values())).kind if groups else None
    period = next(iter(groups.values())).period_us if groups else None
    if groups:
        share = next(iter(groups.values())).share  # as the kernel was given it
    log(f"highest rate with p99 < 5 ms: connections {mode.rate_conns}, {mode.rate_seconds}s each, "
        f"{mode.rate_rounds} round(s)" + (f"; each proxy in a {kind} quota of {share:.0%} of one CPU" if groups
                                          else ""))
    steps: dict[str, dict[int, list[dict]]] = {t: {} for t in LOAD_TARGETS}
    try:
        for r in range(mode.rate_rounds):
            over: set[str] = set()
            for i, conns in enumerate(mode.rate_conns):
                for target in rounds_order(LOAD_TARGETS, r + i):
                    if target in over:
                        continue
                    q = groups.get(target)
                    thr0 = q.throttled() if q else (0, 0)
                    load0, own0 = cpu_times(LOAD_CPU), load_cpu_s(procs)
                    w = on_cpu(procs.proxy_pid(target), lambda t=target: wrk(workdir, t, conns, mode.rate_seconds))
                    w["load_busy"] = busy_share(load0, cpu_times(LOAD_CPU))
                    w["load_own"] = (load_cpu_s(procs) - own0) / (w["duration_us"] / 1e6)
                    if "cpu_s" in w:
                        w["cpu_us_per_req"] = w["cpu_s"] / max(1, w["requests"]) * 1e6
                        w["proxy_use"] = w["cpu_s"] / (w["duration_us"] / 1e6) / (share or 1)
                    if q:
                        thr1 = q.throttled()
                        periods = thr1[0] - thr0[0]
                        w["throttled_share"] = (thr1[1] - thr0[1]) / periods if periods else 0.0
                    w["bound"] = bounded_by(target, w, share)
                    steps[target].setdefault(conns, []).append(w)
                    log(f"  round {r + 1} c={conns:<3} {target:14} {w['rps']:8.0f} req/s  p99 {w['p99'] / 1000:8.2f} ms"
                        f"  non-2xx {w['status_errors']}"
                        + (f"  proxy {w['proxy_use']:.0%} of {'its quota' if share else 'a CPU'}" if "proxy_use" in w
                           else "")
                        + f"  wrk+sim {w['load_own']:.0%} of CPU 1 ({w['load_busy']:.0%} busy): {w['bound']}")
                    prev = steps[target].get(conns // 2) or steps[target].get(conns // 4)
                    grew = not prev or w["rps"] > 1.1 * prev[-1]["rps"]
                    if w["p99"] >= 10 * P99_BUDGET_US and not grew:
                        over.add(target)  # far over budget and saturated: more connections only queue
    finally:
        for q in groups.values():
            q.remove()
    summary = {}
    for target in LOAD_TARGETS:
        per_conns = {}
        for c, ws in sorted(steps[target].items()):
            st = {"rps": med([w["rps"] for w in ws]), "p99": med([w["p99"] for w in ws]),
                  "cpu_us_per_req": med([w.get("cpu_us_per_req", float("nan")) for w in ws]),
                  "cpu_us_per_req_values": [w.get("cpu_us_per_req") for w in ws],
                  "proxy_use": med([w.get("proxy_use", float("nan")) for w in ws]),
                  "load_busy": med([w["load_busy"] for w in ws]),
                  "load_own": med([w["load_own"] for w in ws]),
                  "errors": sum(w["status_errors"] + w["socket_errors"] for w in ws)}
            st["bound"] = bounded_by(target, st, share)
            per_conns[c] = st
        ok = {c: s for c, s in per_conns.items() if s["p99"] < P99_BUDGET_US}
        best = max(ok.items(), key=lambda kv: kv[1]["rps"]) if ok else None
        peak = max(per_conns.items(), key=lambda kv: kv[1]["rps"])
        summary[target] = {"steps": per_conns, "best_conns": best[0] if best else None,
                           "best_rps": best[1]["rps"] if best else None,
                           "peak_conns": peak[0], "peak_rps": peak[1]["rps"], "peak_p99": peak[1]["p99"],
                           "peak_bound": peak[1]["bound"]}
    res["rate"] = {"summary": summary, "loadavg": loadavg(), "quota": share, "quota_kind": kind,
                   "quota_period_us": period, "quota_unavailable": unavailable}


def sim_requests(route: str) -> int:
    """Requests the simulator of a route has received so far (its /sim/stats)."""
    return json.loads(http_text(f"http://{HOST}:{SIM_PORTS[route]}/sim/stats"))["total"]


def stream_run(procs: Procs, target: str, route: str, count: int, timeout: float, spread_s: float = 0.02,
               sample_s: float = 0.1) -> dict:
    """One run of `count` streams through `target`: the client's figures, the proxy's CPU per
    content chunk, its RSS sampled every `sample_s` (peak, and the most seen while every stream was
    open), and the requests the simulator got."""
    pid = procs.proxy_pid(target)
    samples: list[tuple[int, int]] = []  # (streams receiving, RSS KiB)

    async def watch(clients):  # noqa: ANN001
        while True:
            samples.append((sum(1 for c in clients if c.events and not c.finished), rss_kib(pid)))
            await asyncio.sleep(sample_s)

    before = sim_requests(route)
    s = on_cpu(pid, lambda: asyncio.run(run_streams(target, route, count, timeout, spread_s, on_open=watch)))
    s["sim_requests"] = sim_requests(route) - before
    s["max_open"] = max((o for o, _ in samples), default=0)
    if pid:
        s["cpu_us_per_chunk"] = s["cpu_s"] / max(1, s["content_chunks"]) * 1e6
        s["rss_peak_kib"] = max((rss for _, rss in samples), default=0)
        s["rss_at_all_open_kib"] = max((rss for o, rss in samples if o >= count), default=None)
    return s


def stream_summary(runs: dict[str, list[dict]], expected: int) -> dict:
    """Per target: medians and ranges over rounds, added gaps per round, chunk counts."""
    summary = {}
    for target, rs in runs.items():
        summary[target] = summarize(rs, runs["direct"], ["gap_p50_us", "gap_p99_us", "cpu_us_per_chunk"])
        summary[target].update({
            "content_chunks_min": min(s["content_chunks"] for s in rs),
            "content_chunks_max": max(s["content_chunks"] for s in rs),
            "expected_chunks": expected, "rounds": len(rs),
            "sim_requests_min": min(s["sim_requests"] for s in rs),
            "data_events": med([s["data_events"] for s in rs]),
            "max_open_min": min(s["max_open"] for s in rs),
        })
        if target != "direct":
            summary[target]["rss_peak_kib"] = max(s["rss_peak_kib"] for s in rs)
            summary[target]["rss_at_all_open_kib"] = max((s["rss_at_all_open_kib"] or 0) for s in rs) or None
    return summary


def log_stream(r: int, target: str, s: dict, expected: int) -> None:
    log(f"  round {r + 1} {target:8} gap p50 {s['gap_p50_us'] / 1000:7.2f} ms  p99 {s['gap_p99_us'] / 1000:7.2f} ms"
        f"  content chunks {s['content_chunks']}/{expected}  open at once {s['max_open']}  {s['elapsed_s']:.1f}s"
        f" (client CPU {s['client_cpu_s']:.1f}s)"
        + (f"  cpu {s['cpu_us_per_chunk']:.1f} us/chunk  RSS {s['rss_peak_kib'] / 1024:.1f} MiB"
           if "cpu_us_per_chunk" in s else ""))


def measure_streams(procs: Procs, mode: Mode, res: dict) -> None:
    log(f"streams: {mode.streams} x {mode.stream_chunks} chunks 20 ms apart, {mode.stream_rounds} rounds")
    runs: dict[str, list[dict]] = {t: [] for t in LOAD_TARGETS}
    expected = mode.streams * mode.stream_chunks
    for r in range(mode.stream_rounds):
        for target in rounds_order(LOAD_TARGETS, r):
            if target in SLOW_TARGETS and r >= mode.litellm_stream_rounds:
                continue  # slower than the pace: one round takes minutes
            s = stream_run(procs, target, "stream", mode.streams, timeout=mode.stream_chunks * 0.02 * 6 + 60)
            s["round"] = r
            runs[target].append(s)
            log_stream(r, target, s, expected)
    res["streams"] = {"runs": runs, "summary": stream_summary(runs, expected), "loadavg": loadavg(),
                      "noise": {k: noise([s[k] for s in runs["direct"]]) for k in ["gap_p50_us", "gap_p99_us"]}}


def measure_faces(procs: Procs, mode: Mode, res: dict) -> None:
    """CPU per content chunk of 256 streams through each face of the gateways (the simulator
    serves chat; the Responses and Anthropic faces translate every chunk), the faces of one gateway
    in the same rounds."""
    targets = [f"{g}:{f}" for g in FACE_GATEWAYS for f in FACES]
    log(f"faces: {mode.streams} streams x {mode.stream_chunks} chunks through {', '.join(targets)}, "
        f"{mode.face_rounds} rounds")
    runs: dict[str, list[dict]] = {t: [] for t in ["direct", *targets]}
    expected = mode.streams * mode.stream_chunks
    for r in range(mode.face_rounds):
        for target in rounds_order(["direct", *targets], r):
            s = stream_run(procs, target, "stream", mode.streams, timeout=mode.stream_chunks * 0.02 * 6 + 60)
            s["round"] = r
            runs[target].append(s)
            log_stream(r, target, s, expected)
    ratios = {}
    for g in FACE_GATEWAYS:
        for f in FACES[1:]:
            chat = {s["round"]: s["cpu_us_per_chunk"] for s in runs[f"{g}:chat"]}
            rs = [s["cpu_us_per_chunk"] / chat[s["round"]] for s in runs[f"{g}:{f}"] if chat.get(s["round"])]
            ratios[f"{g}:{f}"] = {"median": med(rs), "range": spread(rs), "values": rs}
    res["faces"] = {"runs": runs, "summary": stream_summary(runs, expected), "ratios": ratios, "loadavg": loadavg(),
                    "noise": {k: noise([s[k] for s in runs["direct"]]) for k in ["gap_p50_us", "gap_p99_us"]}}


def measure_many_streams(procs: Procs, mode: Mode, res: dict) -> None:
    n = mode.many_streams
    log(f"{n} open streams ({mode.many_chunks} chunks 100 ms apart): RSS and gaps, {mode.many_rounds} round(s)")
    runs: dict[str, list[dict]] = {t: [] for t in MANY_TARGETS}
    expected = n * mode.many_chunks
    for r in range(mode.many_rounds):
        for target in rounds_order(MANY_TARGETS, r):
            s = stream_run(procs, target, "slow", n, timeout=mode.many_chunks * 0.1 + 60, sample_s=0.2)
            s["round"] = r
            runs[target].append(s)
            log_stream(r, target, s, expected)
    res["many_streams"] = {"runs": runs, "summary": stream_summary(runs, expected), "loadavg": loadavg(),
                           "noise": {k: noise([s[k] for s in runs["direct"]]) for k in ["gap_p50_us", "gap_p99_us"]}}


def measure_soak(procs: Procs, workdir: Path, mode: Mode, res: dict) -> None:
    seconds = int(mode.soak_minutes * 60)
    log(f"soak: {mode.soak_minutes:g} min of wrk -c{SOAK_CONNS} and {SOAK_STREAMS_PER_S} streams/s through "
        f"{SOAK_TARGET}, RSS every {SOAK_SAMPLE_S}s")
    pid = procs.pid(SOAK_TARGET)
    rss: list[tuple[float, float]] = []  # (seconds since the start, MiB)
    began = time.monotonic()

    async def sample(_clients):  # noqa: ANN001
        while True:
            rss.append((time.monotonic() - began, rss_kib(pid) / 1024))
            await asyncio.sleep(SOAK_SAMPLE_S)

    load = subprocess.Popen(wrk_command(workdir, SOAK_TARGET, SOAK_CONNS, seconds), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        streams = on_cpu(pid, lambda: asyncio.run(run_streams(
            SOAK_TARGET, "stream", SOAK_STREAMS_PER_S * seconds, timeout=seconds + 60, spread=seconds,
            on_open=sample, keep=False)))
        out, _ = load.communicate(timeout=120)
    finally:
        if load.poll() is None:
            load.kill()
    w = wrk_result(f"{SOAK_TARGET} (soak)", out)
    time.sleep(1)
    second_half = [(t, v) for t, v in rss if t >= seconds / 2]
    mib = [v for _, v in rss]
    res["soak"] = {
        "target": SOAK_TARGET, "minutes": mode.soak_minutes, "samples": rss, "start_mib": mib[0], "end_mib": mib[-1], "max_mib": max(mib),
        "growth_mib_per_min": slope_per_minute(second_half), "idle_after_mib": rss_kib(pid) / 1024,
        "wrk": w, "streams": streams["streams"], "streams_finished": streams["finished"],
        "stream_statuses": streams["statuses"], "content_chunks": streams["content_chunks"],
        "stream_chunks": mode.stream_chunks, "cpu_s": streams.get("cpu_s"),
    }
    s = res["soak"]
    log(f"  RSS start {s['start_mib']:.1f} MiB, end {s['end_mib']:.1f}, max {s['max_mib']:.1f}, growth over the "
        f"second half {s['growth_mib_per_min']:+.3f} MiB/min; idle after {s['idle_after_mib']:.1f} MiB; "
        f"{w['requests']} requests (non-2xx {w['status_errors']}), {s['streams_finished']}/{s['streams']} streams")
