"""The command line: start the simulator and the gateway, run the rounds and the idle windows in
alternating order, stop everything, write the report."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from overhead_lib import settings as overhead_settings
from overhead_lib.load import wrk
from overhead_lib.phases import stream_run
from overhead_lib.processes import Procs, gateway_yaml, loadavg, port_free, sim_command
from overhead_lib.settings import FULL, log
from overhead_lib.stats import rounds_order

from . import __doc__ as USAGE
from .measure import idle_window, rate_round, stream_round
from .report import render, summarize
from .settings import (
    BROWSER_CPU, CHROMEDRIVER, CHROMIUM, CHUNKS, DEFAULT_VARIANTS, FAST_ROUTE, GATEWAY, GATEWAY_PORT, HOST,
    IDLE_ROUNDS, IDLE_SECONDS, LOAD_CPU, PROXY_CPU, RATE_CONNS, RATE_ROUNDS, RATE_SECONDS, RESULTS, ROOT, ROUNDS,
    ROUTE, SETTLE_S, SIM_PORTS, STREAMS, VARIANTS,
)


def top_lines(n: int = 8) -> list[str]:
    """The busiest processes over one second (top's second sample)."""
    try:
        out = subprocess.run(["top", "-bn2", "-d1", "-w", "160"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    last = out.split("top - ")[-1].splitlines()
    head = next((i for i, ln in enumerate(last) if ln.lstrip().startswith("PID")), None)
    return [] if head is None else [ln.rstrip() for ln in last[head:head + 1 + n]]


def first_line(*cmd: str) -> str:
    try:
        out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
        return ((out.stdout or out.stderr).strip().splitlines() or ["?"])[0]
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def machine() -> str:
    """The CPU, cores, memory, kernel and browser, in one line."""
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "?")
    mem = next((int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
                if ln.startswith("MemTotal")), 0)
    return (f"{cpu}, {os.cpu_count()} cores, {mem / 2**20:.1f} GiB, {first_line('uname', '-sr')}, "
            f"{first_line(CHROMIUM, '--version')}")


def start(procs: Procs, workdir: Path, chunks: int) -> None:
    mode = dataclasses.replace(FULL, stream_chunks=chunks)
    for route in (ROUTE, FAST_ROUTE):
        procs.start(f"sim-{route}", sim_command(route, mode), LOAD_CPU)
        procs.wait_ready(f"sim-{route}", f"http://{HOST}:{SIM_PORTS[route]}/v1/models", 20)
    config = workdir / "mlxgate.yaml"
    config.write_text(gateway_yaml(GATEWAY_PORT, full=False, tokenizer="", routes=[ROUTE, FAST_ROUTE], one_thread=False))
    procs.start(GATEWAY, [str(overhead_settings.RELEASE / "mlxgate"), "serve", "--config", str(config)], PROXY_CPU)
    procs.wait_ready(GATEWAY, f"http://{HOST}:{GATEWAY_PORT}/health", 20)


def write(out_md: Path, res: dict) -> dict:
    summary = summarize(res)
    res["summary"] = summary
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
    out_md.write_text(render(res, summary))
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=USAGE.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=ROUNDS, help=f"stream rounds per variant (default {ROUNDS})")
    ap.add_argument("--streams", type=int, default=STREAMS, help=f"streams per run (default {STREAMS})")
    ap.add_argument("--chunks", type=int, default=CHUNKS, help=f"content chunks per stream (default {CHUNKS})")
    ap.add_argument("--idle-seconds", type=float, default=IDLE_SECONDS,
                    help=f"seconds per idle window (default {IDLE_SECONDS:g})")
    ap.add_argument("--idle-rounds", type=int, default=IDLE_ROUNDS,
                    help=f"idle windows per variant (default {IDLE_ROUNDS}; 0 skips them)")
    ap.add_argument("--rate-seconds", type=int, default=RATE_SECONDS,
                    help=f"seconds of wrk per rate run (default {RATE_SECONDS:g}; 0 skips the rate phase)")
    ap.add_argument("--rate-conns", type=int, default=RATE_CONNS,
                    help=f"wrk's connections in the rate phase (default {RATE_CONNS}: the gateway not saturated)")
    ap.add_argument("--rate-rounds", type=int, default=RATE_ROUNDS,
                    help=f"rate runs per variant (default {RATE_ROUNDS})")
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                    help=f"comma-separated, from {','.join(VARIANTS)}; none is always run (default "
                         f"{','.join(DEFAULT_VARIANTS)})")
    ap.add_argument("--bin-dir", help="where mlxgate and mlxgate-sim are (default: target/release)")
    ap.add_argument("--out", help="markdown report (default bench/results/ui.md; the JSON beside it)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    ap.add_argument("--render-only", metavar="JSON", help="rewrite the report from a saved raw-figures file")
    ap.add_argument("--self-test", action="store_true", help="test the report's pieces (no process started)")
    args = ap.parse_args()
    if args.self_test:
        from .selftest import run as self_test
        return self_test()
    out_md = Path(args.out) if args.out else RESULTS / "ui.md"
    variants = ["none", *[v for v in VARIANTS if v != "none" and v in args.variants.split(",")]]
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown or len(variants) < 2:
        raise SystemExit(f"--variants: {args.variants!r} (known: {', '.join(VARIANTS)}; none and one more)")
    if args.render_only:
        res = json.loads(Path(args.render_only).read_text())
        write(out_md, res)
        return 0
    if args.bin_dir:
        overhead_settings.RELEASE = Path(args.bin_dir).resolve()
    for path in [overhead_settings.RELEASE / "mlxgate", overhead_settings.RELEASE / "mlxgate-sim",
                 Path(CHROMIUM), Path(CHROMEDRIVER)]:
        if not path.exists():
            raise SystemExit(f"{path} is missing (cargo build --release --bins; apt-get install chromium "
                             "chromium-driver)")
    busy = [p for p in [GATEWAY_PORT, SIM_PORTS[ROUTE], SIM_PORTS[FAST_ROUTE]] if not port_free(p)]
    if busy:
        raise SystemExit(f"ports in use on {HOST}: {busy}")
    os.sched_setaffinity(0, {int(LOAD_CPU)})
    limit = int(args.rounds * len(variants) * (args.chunks * 0.02 * 6 + 120)
                + args.idle_rounds * len(variants) * (args.idle_seconds + 60)
                + args.rate_rounds * len(variants) * (args.rate_seconds + 90) + 120)

    def overtime(_sig, _frame):  # noqa: ANN001
        raise SystemExit(f"bench/ui: over its {limit}s: stopped")

    signal.signal(signal.SIGALRM, overtime)
    signal.alarm(limit)
    workdir = Path(tempfile.mkdtemp(prefix="mlxgate-bench-ui-"))
    procs = Procs(workdir)
    url = f"http://{HOST}:{GATEWAY_PORT}/ui#activity"
    began = time.monotonic()
    res: dict = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
        "commit": first_line("git", "-C", str(ROOT), "describe", "--always", "--dirty"),
        "command": " ".join(["bench/ui", *sys.argv[1:]]),
        "settings": {"rounds": args.rounds, "streams": args.streams, "chunks": args.chunks, "settle_s": SETTLE_S,
                     "rate_seconds": args.rate_seconds, "rate_rounds": args.rate_rounds, "rate_conns": args.rate_conns,
                     "idle_seconds": args.idle_seconds, "idle_rounds": args.idle_rounds, "proxy_cpu": PROXY_CPU,
                     "browser_cpu": BROWSER_CPU, "url": url, "variants": variants},
        "loadavg_start": loadavg(), "top_start": top_lines(),
        "streams": {v: [] for v in variants}, "idle": {v: [] for v in variants},
        "rate": {v: [] for v in variants},
    }
    try:
        log(f"starting the simulator and mlxgate (work dir {workdir})")
        start(procs, workdir, args.chunks)
        warm = stream_run(procs, GATEWAY, ROUTE, args.streams, timeout=args.chunks * 0.02 * 6 + 60)
        log(f"warm-up: {warm['content_chunks']} content chunks")
        expected = args.streams * args.chunks
        for r in range(args.rounds):
            for v in rounds_order(variants, r):
                s = stream_round(procs, workdir, url, v, args.streams, args.chunks, f"{v}-{r}")
                s["round"] = r
                res["streams"][v].append(s)
                log(f"  round {r + 1} {v:4}  cpu {s['cpu_us_per_chunk']:6.2f} us/chunk "
                    f"(streams only {s['cpu_us_per_chunk_streams']:6.2f})  gap p50 {s['gap_p50_us'] / 1000:6.2f} ms "
                    f"p99 {s['gap_p99_us'] / 1000:6.2f} ms  chunks {s['content_chunks']}/{expected}  "
                    f"preempted {s['preempted']}  others {s['others_cpu_s']:.2f}s  load {s['loadavg']}"
                    + (f"  rows +{s['rows_new']} in {s['rows_caught_up_s']:.1f}s  browser cpu "
                       f"{s['browser_cpu_s']:.2f}s  lagged {s['lagged']!r}" if v == "page" else "")
                    + (f"  events +{s['events_new']}  lagged {s['lagged']!r}" if v == "feed" else ""))
        if args.rate_seconds > 0:
            wrk(workdir, GATEWAY, args.rate_conns, 1)  # warm-up
            for r in range(args.rate_rounds):
                for v in rounds_order(variants, r):
                    s = rate_round(procs, workdir, url, v, args.rate_seconds, args.rate_conns, f"rate-{v}-{r}")
                    s["round"] = r
                    res["rate"][v].append(s)
                    log(f"  rate {r + 1} {v:4}  {s['rps']:7.0f} req/s  cpu {s['cpu_us_per_req']:6.1f} us/req  "
                        f"p99 {s['p99'] / 1000:6.2f} ms  non-2xx {s['status_errors']}  others {s['others_cpu_s']:.2f}s"
                        + (f"  rows +{s['rows_new']}/{s['rows_wanted']}" if "rows_new" in s else "")
                        + (f"  events +{s['events_new']}" if "events_new" in s else "")
                        + (f"  lagged {s['lagged']!r}" if v != "none" else ""))
        for r in range(args.idle_rounds):
            for v in rounds_order(variants, r + 1):  # another order than the streams' last round
                s = idle_window(procs, workdir, url, v, args.idle_seconds, f"idle-{v}-{r}")
                s["round"] = r
                res["idle"][v].append(s)
                log(f"  idle {r + 1} {v:4}  {s['cpu_us_per_s']:8.1f} us of CPU per second over {s['seconds']:.1f}s")
        res["loadavg_end"] = loadavg()
        res["top_end"] = top_lines()
        res["elapsed_s"] = time.monotonic() - began
    finally:
        signal.alarm(0)
        procs.stop_all()
    summary = write(out_md, res)
    for v in variants[1:]:
        c = summary["compare"][v]["cpu_us_per_chunk"]
        log(f"CPU per chunk: none {summary['streams']['none']['cpu_us_per_chunk']:.2f} us, {v} "
            f"{summary['streams'][v]['cpu_us_per_chunk']:.2f} us; {v} - none {c['median']:+.2f} us, noise "
            f"{c['noise'] if c['noise'] is None else round(c['noise'], 2)} us: {c['verdict']}")
        if "idle" in summary:
            log(f"idle: none {summary['idle']['none']['cpu_us_per_s']:.1f} us/s, {v} "
                f"{summary['idle'][v]['cpu_us_per_s']:.1f} us/s: {summary['idle_compare'][v]['verdict']}")
    log(f"done in {res['elapsed_s']:.0f}s: {out_md} (logs: {workdir})")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0
