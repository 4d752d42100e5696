"""The command line: check the binaries, the model, the ports; run each variant on a fresh
gateway (the agents, the sampler, /metrics and the access log read); the report."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from balance_lib.cli import finite  # one JSON cleaner for both benches
from overhead_lib.processes import loadavg

from . import __doc__ as USAGE
from . import settings, stats
from .agents import run_agents
from .procs import Gateway, gateway_yaml, leftovers, ports_busy, wait_gone
from .report import write
from .sampler import Sampler
from .settings import (
    AGENTS, DEFAULT_VARIANTS, FOOTPRINTS_MB, GATEWAY_PORT, MAJORITY, MAX_TOKENS, MAX_WAIT_S, MINORITY,
    MINORITY_SHARE, MODEL_DIR, ROOT, SEED, SERVERS, SIM_FOOTPRINTS_MB, SIM_START_S, SWAP_AFTER_S, THINK_S, VARIANTS,
    log,
)


def machine() -> str:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "?")
    return f"{os.uname().sysname} {os.uname().machine}, {os.cpu_count()} CPUs ({cpu})"


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True)
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def version(binary: Path) -> str:
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
    return out.stdout.strip() or "?"


def transitions(samples: list[dict]) -> list[list]:
    """Each backend's state changes over the run: [seconds, backend, state] (a timeline small
    enough to keep in the JSON)."""
    out, last = [], {}
    for s in samples:
        for b, state in s.get("states", {}).items():
            if last.get(b) != state:
                out.append([round(s["t"], 1), b, state])
                last[b] = state
    return out


def kill_leftovers() -> list[str]:
    """Last resort after a run: SIGKILL of the servers on our ports (started by our gateway) that
    outlived it; what was killed."""
    from .procs import servers
    killed = []
    for model, pids in servers().items():
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(f"{model} pid {pid}")
            except ProcessLookupError:
                pass
    return killed


def run_variant(variant: str, binary: Path, workdir: Path, seconds: float, footprints: dict[str, int],
                seed: int, sim: Path | None = None, shape: str = "side") -> dict:
    vdir = workdir / variant
    vdir.mkdir(parents=True)
    config = vdir / "gateway.yaml"
    config.write_text(gateway_yaml(variant, footprints, sim))
    gw = Gateway(binary, config, vdir / "mlxgate.log")
    busy = ports_busy()
    if busy:
        raise SystemExit(f"ports in use on {settings.HOST}: {busy}: refusing to start")
    log(f"{variant}: {binary} on {config}")
    notes: list[str] = []
    metrics_text = ""
    sampler = None
    try:
        gw.start()
        t0 = time.monotonic()
        sampler = Sampler(gw, t0)
        sampler.start()
        records, wall = run_agents(GATEWAY_PORT, seconds, variant, seed=seed, shape=shape)
        try:
            metrics_text = gw.get("/metrics")
        except OSError as e:
            notes.append(f"/metrics unreadable at the end: {e}")
        sampler.stop()
    finally:
        if sampler is not None:
            sampler.stop()
        gw.stop()
    left = wait_gone()
    if left:
        notes.append(f"left behind after the gateway stopped (killed): {', '.join(left)}")
        kill_leftovers()
    log_text = gw.log_path.read_text(errors="replace")
    access = stats.access_lines(log_text)
    summary = stats.summarize(records, wall, sampler.samples, metrics_text, access, sampler.rss_peak)
    summary.update(binary=str(binary), version=version(binary), config=config.read_text(), notes=notes,
                   timeline=transitions(sampler.samples), admin_errors=sampler.errors, left_behind=left)
    log(f"{variant}: {summary['answers']} answers, {summary['failures']} failures, swaps {summary['swaps']}, "
        f"loading {summary['loading_s']:.0f} s of {wall:.0f} s, at most {summary['peak_servers']} servers at once")
    return {"summary": summary, "records": records}


def parse_footprints(text: str, defaults: dict[str, int] = FOOTPRINTS_MB) -> dict[str, int]:
    out = dict(defaults)
    for part in filter(None, text.split(",")):
        name, _, mib = part.partition("=")
        if name not in SERVERS or not mib.isdigit():
            raise SystemExit(f"--footprints: {part!r}: want MODEL=MIB with MODEL one of {list(SERVERS)}")
        out[name] = int(mib)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=USAGE.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Variants: " + ", ".join(VARIANTS) + " (see bench/swaps_lib/settings.py).")
    ap.add_argument("--self-test", action="store_true", help="test the harness's pieces (no process started)")
    ap.add_argument("--mlxgate", default=str(settings.MLXGATE), help="the gateway under test (default: %(default)s)")
    ap.add_argument("--baseline-mlxgate", help="today's main (a backend kept swap_after), for the variant `before`; "
                    "without it, `before` is replaced by `timer` (the new binary with loading_share: 1.0)")
    ap.add_argument("--variants", help=f"comma-separated, of {', '.join(VARIANTS)} (default: "
                    f"{','.join(DEFAULT_VARIANTS)})")
    ap.add_argument("--seconds", type=float, default=settings.SECONDS, help="how long the agents send, per variant "
                    "(default %(default)s)")
    ap.add_argument("--agents", choices=["side", "blocking"], default="side",
                    help="side: the minority model's requests are side calls the agents do not wait for (Claude "
                         "Code's small fast model); blocking: every request waited for (default %(default)s)")
    ap.add_argument("--seed", type=int, default=SEED, help="the agents' seed (default %(default)s)")
    ap.add_argument("--footprints", default="", help="MiB written as each backend's footprint in `budget`, like "
                    f"coder=600,haiku=700 (default {FOOTPRINTS_MB})")
    ap.add_argument("--servers", choices=["real", "sim"], default="real",
                    help="real: mlx_lm.server and mlx-openai-server (default); sim: two mlxgate-sim that take 1 and "
                    "2 s to start (a quick check of the harness, no MLX)")
    ap.add_argument("--mlxgate-sim", help="mlxgate-sim for --servers sim (default: beside --mlxgate)")
    ap.add_argument("--out", help="Markdown report (default: bench/results/swaps.md, JSON beside it)")
    ap.add_argument("--render-only", metavar="JSON", help="rewrite the report from a saved raw-figures file")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, configs)")
    args = ap.parse_args()
    if args.self_test:
        from .selftest import run as self_test
        return self_test()
    out_md = Path(args.out) if args.out else ROOT / "bench" / "results" / "swaps.md"
    if args.render_only:
        res = json.loads(Path(args.render_only).read_text())
        res["goals"] = stats.goals(res["variants"])  # pure: the goals of this version over the saved figures
        write(out_md, res)
        return 0
    new_bin = Path(args.mlxgate).resolve()
    base_bin = Path(args.baseline_mlxgate).resolve() if args.baseline_mlxgate else None
    variants = [v for v in (args.variants or ",".join(DEFAULT_VARIANTS)).split(",") if v]
    if not args.variants and base_bin is None:
        variants = ["timer" if v == "before" else v for v in variants]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}: pick from {VARIANTS}")
    if "before" in variants and base_bin is None:
        raise SystemExit("`before` needs --baseline-mlxgate (today's main); or run `timer`")
    needed = ({new_bin} if any(v != "before" for v in variants) else set()) | ({base_bin} if "before" in variants else set())
    for b in sorted(needed):
        if not b.is_file():
            raise SystemExit(f"missing {b}: `cargo build --release --bins` (or --mlxgate / --baseline-mlxgate)")
    sim = None
    if args.servers == "sim":
        sim = Path(args.mlxgate_sim).resolve() if args.mlxgate_sim else new_bin.parent / "mlxgate-sim"
        if not sim.is_file():
            raise SystemExit(f"missing {sim}: `cargo build --release --bins` (or --mlxgate-sim)")
        settings.PROGRAMS = {m: "mlxgate-sim" for m in SERVERS}
    else:
        missing = [str(p) for p in (MODEL_DIR / "model.safetensors", *(v / "bin" for _, v, _ in SERVERS.values()))
                   if not p.exists()]
        if missing:
            raise SystemExit(f"missing {missing}: scripts/setup-backends mlx-lm mlx-openai-server")
    busy, left = ports_busy(), leftovers()
    if busy or left:
        raise SystemExit(f"refusing to start: ports in use {busy}, servers or gateways of a run alive {left}")
    footprints = parse_footprints(args.footprints, FOOTPRINTS_MB if sim is None else SIM_FOOTPRINTS_MB)
    limit = int(len(variants) * (args.seconds + 400))

    def overtime(_sig, _frame):  # noqa: ANN001
        raise SystemExit(f"bench/swaps: over its {limit} s: stopped")

    def terminated(sig, _frame):  # noqa: ANN001
        raise SystemExit(f"bench/swaps: stopped by signal {sig}")

    signal.signal(signal.SIGALRM, overtime)
    signal.signal(signal.SIGTERM, terminated)
    signal.signal(signal.SIGHUP, terminated)
    signal.alarm(limit)
    workdir = Path(tempfile.mkdtemp(prefix="mlxgate-bench-swaps-"))
    began = time.monotonic()
    res: dict = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
        "commit": commit(), "loadavg_start": loadavg(),
        "command": "bench/swaps " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "schedule": {"agents": AGENTS, "seconds": args.seconds, "minority_share": MINORITY_SHARE,
                     "think_s": list(THINK_S), "max_tokens": MAX_TOKENS, "seed": args.seed, "agents_shape": args.agents,
                     "swap_after_s": SWAP_AFTER_S, "max_wait_s": MAX_WAIT_S, "majority": MAJORITY,
                     "minority": MINORITY,
                     "servers": ({m: k for m, (k, _, _) in SERVERS.items()} if sim is None else
                                 {m: f"mlxgate-sim (a {SIM_START_S[m]} s start)" for m in SERVERS}),
                     "sim": sim is not None, "model": str(MODEL_DIR.relative_to(ROOT))},
        "footprints_mib": footprints, "budget_margin_mib": settings.BUDGET_MARGIN_MB,
        "variants": {}, "notes": [],
    }
    try:
        for variant in variants:
            binary = base_bin if variant == "before" else new_bin
            out = run_variant(variant, binary, workdir, args.seconds, footprints, args.seed, sim, args.agents)
            res["variants"][variant] = out["summary"]
            # Every request's record stays with the run's logs (with --keep), not in the results:
            # thousands of them would make the committed JSON megabytes.
            (workdir / variant / "records.json").write_text(json.dumps(finite(out["records"]), default=str))
        res["loadavg_end"] = loadavg()
    finally:
        signal.alarm(0)
        left = wait_gone(5)
        if left:
            kill_leftovers()
            log(f"killed what was left behind: {left}")
    res["goals"] = stats.goals(res["variants"])
    res["elapsed_s"] = time.monotonic() - began
    raw = out_md.with_suffix(".json")
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text(json.dumps(finite(res), indent=1, default=str, allow_nan=False))
    write(out_md, res)
    log(f"done in {res['elapsed_s']:.0f}s: {out_md} (raw figures: {raw}; logs: {workdir})")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    print(out_md.read_text())
    return 0 if all(g["met"] for g in res["goals"]) else 1
