"""The command line: parse the flags, run the phases in order, stop everything, write the report."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from . import __doc__ as USAGE
from . import settings
from .load import wrk
from .phases import (
    measure_faces, measure_latency, measure_long_prompt, measure_many_streams, measure_pinned, measure_rate,
    measure_soak, measure_streams, measure_ttfb,
)
from .processes import Procs, choose_tokenizer, loadavg, port_free, rss_kib, start_all
from .profile import measure_profiles
from .report import machine, write_report
from .settings import (
    FULL, GATEWAYS, HOST, LITELLM_PORT, LOAD_CPU, NGINX_PORTS, PORTKEY_PORT, PORTKEY_SERVER, PROXIES, QUICK, ROOT,
    SIM_PORTS, TARGETS, configure, log,
)


def portkey_missing() -> str | None:
    """Why Portkey's gateway cannot run here (None: it can)."""
    if shutil.which("node") is None:
        return "node is not installed (bench/setup installs Portkey's gateway with npm and runs it with node)"
    if not PORTKEY_SERVER.is_file():
        return f"{PORTKEY_SERVER.relative_to(ROOT)} is missing (bench/setup installs it with npm)"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=USAGE.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter runs, no soak (about 5 minutes)")
    ap.add_argument("--soak-minutes", type=float,
                    help="minutes of the RSS soak through mlxgate-full (default 10; --quick: 0; 0 skips it)")
    ap.add_argument("--no-setup", action="store_true", help="do not run bench/setup first")
    ap.add_argument("--no-perf", action="store_true", help="skip the perf profiles")
    ap.add_argument("--out", help="markdown report (default: BENCHMARKS.md; --quick: bench/results/quick.md)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, perf.data)")
    ap.add_argument("--bin-dir", help="where mlxgate and mlxgate-sim are (default: target/release)")
    ap.add_argument("--before-bin-dir", metavar="DIR",
                    help="also measure mlxgate from DIR (target mlxgate-before: same config, its own port) in every "
                         "phase mlxgate is, for a before/after from one run")
    ap.add_argument("--proxy-quota", type=float, default=settings.PROXY_QUOTA, metavar="SHARE",
                    help="the rate phase's CPU quota on each proxy, a share of one CPU (default 0.25; 0: none)")
    ap.add_argument("--access-log", choices=["on", "off"], default="on",
                    help="mlxgate's access log and nginx's access_log, both on (default) or both off")
    ap.add_argument("--render-only", metavar="JSON", help="rewrite the report from a saved raw-figures file")
    ap.add_argument("--self-test", action="store_true", help="test the harness's pure pieces (no process started)")
    args = ap.parse_args()
    if args.self_test:
        from .selftest import run as self_test
        return self_test()
    if args.bin_dir:
        settings.RELEASE = Path(args.bin_dir).resolve()
    if args.before_bin_dir:
        settings.BEFORE_RELEASE = Path(args.before_bin_dir).resolve()
        if not (settings.BEFORE_RELEASE / "mlxgate").is_file():
            raise SystemExit(f"--before-bin-dir: no mlxgate in {settings.BEFORE_RELEASE}")
    settings.PROXY_QUOTA = args.proxy_quota
    settings.ACCESS_LOG = args.access_log == "on"
    mode = QUICK if args.quick else FULL
    if args.soak_minutes is not None:
        mode.soak_minutes = args.soak_minutes
    out_md = Path(args.out) if args.out else (ROOT / "bench" / "results" / "quick.md" if args.quick
                                              else ROOT / "BENCHMARKS.md")
    if args.render_only:
        res = json.loads(Path(args.render_only).read_text())
        for r in res["rate"]["summary"].values():  # JSON made the connection counts strings
            r["steps"] = {int(c): v for c, v in r["steps"].items()}
        configure(before="mlxgate-before" in res.get("targets", []), portkey="portkey" in res.get("targets", []))
        write_report(out_md, res)
        return 0
    if not args.no_setup:
        subprocess.run([str(ROOT / "bench" / "setup")], check=True)
    no_portkey = portkey_missing()
    configure(before=settings.BEFORE_RELEASE is not None, portkey=no_portkey is None)
    ports = [*SIM_PORTS.values(), *GATEWAYS.values(), *NGINX_PORTS.values(), LITELLM_PORT, PORTKEY_PORT]
    busy = [p for p in ports if not port_free(p)]
    if busy:
        raise SystemExit(f"ports in use on {HOST}: {busy}")
    os.sched_setaffinity(0, {int(LOAD_CPU)})
    # A bounded run: whatever hangs, everything started is stopped by then (the finally below).
    limit = int((12 if args.quick else 32) * 60 + mode.soak_minutes * 60)

    def overtime(_sig, _frame):  # noqa: ANN001
        raise SystemExit(f"bench/overhead: over its {limit // 60} minutes: stopped")

    signal.signal(signal.SIGALRM, overtime)
    signal.alarm(limit)
    workdir = Path(tempfile.mkdtemp(prefix="mlxgate-bench-"))
    workdir.chmod(0o755)  # nginx's worker runs as another user
    procs = Procs(workdir)
    began = time.monotonic()
    res: dict = {"date": dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"), "quick": args.quick,
                 "mode": mode.__dict__, "machine": machine(), "loadavg_start": loadavg(), "notes": [],
                 "targets": list(TARGETS), "access_log": settings.ACCESS_LOG,
                 "before_bin_dir": str(settings.BEFORE_RELEASE) if settings.BEFORE_RELEASE else None,
                 "bin_dir": str(settings.RELEASE)}
    if no_portkey:
        res["notes"].append(f"Portkey's gateway was not measured: {no_portkey}.")
        log(f"WARNING: Portkey's gateway is not measured: {no_portkey}")
    try:
        res["tokenizer"] = choose_tokenizer()
        log(f"starting simulators, {', '.join(PROXIES)} (mlxgate-full: {res['tokenizer']['short']}; access logs "
            f"{'on' if settings.ACCESS_LOG else 'off'}) (work dir {workdir})")
        start_all(procs, workdir, mode, res["tokenizer"]["dir"])
        time.sleep(1)
        res["rss_idle_kib"] = {t: rss_kib(procs.pid(t)) for t in PROXIES}
        # Warm-up: connections, caches, LiteLLM's first-request imports.
        for t in TARGETS:
            wrk(workdir, t, 4, 1)
        measure_latency(procs, workdir, mode, res)
        measure_pinned(procs, workdir, mode, res)
        measure_long_prompt(procs, workdir, mode, res)
        measure_ttfb(procs, mode, res)
        measure_rate(procs, workdir, mode, res)
        measure_streams(procs, mode, res)
        measure_faces(procs, mode, res)
        measure_many_streams(procs, mode, res)
        time.sleep(1)
        res["rss_after_kib"] = {t: rss_kib(procs.pid(t)) for t in PROXIES}
        if not args.no_perf:
            measure_profiles(procs, workdir, mode, res)
        if mode.soak_minutes > 0:
            measure_soak(procs, workdir, mode, res)
        res["loadavg_end"] = loadavg()
        res["elapsed_s"] = time.monotonic() - began
    finally:
        signal.alarm(0)
        procs.stop_all()
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    # The raw figures beside the report: bench/results/overhead.json for BENCHMARKS.md,
    # bench/results/quick.json for quick.md, else the report's name with .json (--out elsewhere
    # never touches the committed figures).
    if out_md.resolve() == (ROOT / "BENCHMARKS.md").resolve():
        raw = results / "overhead.json"
    elif out_md.resolve() == (results / "quick.md").resolve():
        raw = results / "quick.json"
    else:
        raw = out_md.with_suffix(".json")
    raw.write_text(json.dumps(res, indent=1, default=str))
    write_report(out_md, res)
    log(f"done in {res['elapsed_s']:.0f}s: {out_md} (raw figures: {raw}; logs: {workdir})")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0
