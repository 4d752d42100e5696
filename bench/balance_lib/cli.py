"""The command line: check the workload, run each policy on fresh processes, the self-correction
run, the report."""

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
import threading
import time
from pathlib import Path

from overhead_lib.processes import loadavg

from . import __doc__ as USAGE
from . import settings, stats
from . import workload as wl
from .client import replay
from .procs import Run, ensure_real_model, ports_free
from .report import write
from .settings import (
    BACKEND_PORTS, MAX_TOKENS, METRICS_EVERY_S, POLICIES, PROMPT_CACHE_SIZE, PUBLIC_MODEL, REAL_MODEL_DIR, ROOT,
    SIM_PREFILL_MS_PER_TOKEN, SIM_SPEEDUP, SIM_TOKENS_PER_SECOND, SINGLE, SMALL_PROMPT_CACHE_SIZE, log,
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


def requests_by_backend(run: Run) -> dict[str, float]:
    return stats.by_backend(stats.parse_metrics(run.metrics()), "mlxgate_requests_total", PUBLIC_MODEL)


def run_policy(workdir: Path, workload: dict, policy: str, real_model: Path | None) -> tuple[dict, list[dict]]:
    run = Run(workdir / policy, real_model, PROMPT_CACHE_SIZE)
    try:
        run.start_backends()
        run.start_gateway(policy)
        log(f"{policy}: replaying the workload")
        records = replay(workload, settings.GATEWAY_PORT)
        per_backend = requests_by_backend(run)
    finally:
        run.stop_all()
    summary = stats.summarize(records, per_backend)
    log(f"{policy}: prefilled {summary['prefilled']}, cached {summary['cached']}, per backend {per_backend}, "
        f"failed {summary['failed']}")
    return summary, records


def client_quarters(records: list[dict]) -> list[dict]:
    ordered = sorted(records, key=lambda r: r["index"])
    n = len(ordered)
    out = []
    for q in range(4):
        part = ordered[q * n // 4:(q + 1) * n // 4]
        ok = [r for r in part if r.get("prompt_tokens") is not None]
        cached = sum(r.get("cached_tokens") or 0 for r in ok)
        prompt = sum(r["prompt_tokens"] for r in ok)
        out.append({"quarter": q + 1, "requests": len(part), "prompt_tokens": prompt, "cached": cached,
                    "prefilled": prompt - cached})
    return out


def self_correction(workdir: Path, workload: dict, real_model: Path | None, predicted_metric: str,
                    policy: str = "cache_aware") -> dict:
    """`policy` (cache_aware) on servers with small caches; backend a killed and restarted
    halfway; the gateway's predicted and reported cached tokens sampled from /metrics all along."""
    run = Run(workdir / "self-correction", real_model, SMALL_PROMPT_CACHE_SIZE)
    total = sum(len(c["turns"]) for c in workload["conversations"])
    restart_after = total // 2
    samples: list[dict] = []
    state: dict = {"answers": 0, "restart_at": None}
    stop = threading.Event()
    lock = threading.Lock()
    t0 = time.monotonic()

    def sample() -> None:
        while not stop.is_set():
            try:
                parsed = stats.parse_metrics(run.metrics())
                samples.append({"t": time.monotonic() - t0,
                                "predicted": stats.by_backend(parsed, predicted_metric, PUBLIC_MODEL),
                                "reported": stats.by_backend(parsed, settings.REPORTED_METRIC, PUBLIC_MODEL)})
            except OSError:
                pass
            stop.wait(METRICS_EVERY_S)

    def restart() -> None:
        log(f"self-correction: kill -9 of backend a after {restart_after} answers, then a restart")
        run.kill("a")
        state["restart_at"] = time.monotonic() - t0
        run.start_backend("a")

    def on_answer(_rec: dict) -> None:
        with lock:
            state["answers"] += 1
            now = state["answers"] == restart_after
        if now:
            threading.Thread(target=restart, daemon=True).start()

    try:
        run.start_backends()
        run.start_gateway(policy, health=policy != SINGLE)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        records = replay(workload, settings.GATEWAY_PORT, on_answer=on_answer)
        per_backend = requests_by_backend(run)
        stop.set()
        sampler.join(timeout=5)
    finally:
        stop.set()
        run.stop_all()
    out = {"policy": policy, "cache_size": SMALL_PROMPT_CACHE_SIZE, "restart_after": restart_after, "restart_at_s": state["restart_at"],
           "summary": stats.summarize(records, per_backend), "windows": stats.prediction_windows(samples),
           "predicted_metric": predicted_metric, "client_quarters": client_quarters(records), "records": records}
    if state["restart_at"] is not None and out["windows"]:
        lo, hi = state["restart_at"], state["restart_at"] + 10
        inside = [s for s in samples if lo <= s["t"] <= hi]
        if len(inside) >= 2:
            out["after_restart"] = {
                "seconds": 10,
                "predicted": inside[-1]["predicted"].get("a", 0) - inside[0]["predicted"].get("a", 0),
                "reported": inside[-1]["reported"].get("a", 0) - inside[0]["reported"].get("a", 0)}
    return out


def finite(value):
    """`value` with every infinite or NaN float replaced by None (standard JSON has neither)."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def workload_facts(workload: dict) -> dict:
    convs = workload["conversations"]
    turns = sorted(len(c["turns"]) for c in convs)
    return {"seed": workload["seed"], "conversations": len(convs), "turns": f"{turns[0]}–{turns[-1]}",
            "requests": sum(turns), "clients": len({c["client"] for c in convs})}


def main() -> int:
    ap = argparse.ArgumentParser(description=USAGE.split("\n\n")[0])
    ap.add_argument("--self-test", action="store_true", help="test the harness's pieces (no process started)")
    ap.add_argument("--real", action="store_true", help="two real mlx_lm.server processes instead of mlxgate-sim")
    ap.add_argument("--real-model", default=str(REAL_MODEL_DIR), help="the real servers' model directory "
                    "(generated by scripts/make-tiny-model.py when missing)")
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated policies")
    ap.add_argument("--no-self-correction", action="store_true", help="skip the small-cache + restart run")
    ap.add_argument("--self-correction-policy", default="cache_aware",
                    help="the policy of the small-cache + restart run (single: check the harness on a gateway "
                         "that does not balance)")
    ap.add_argument("--predicted-metric", default=settings.PREDICTED_METRIC,
                    help="the gateway's counter of predicted cached tokens (HOOK(metrics))")
    ap.add_argument("--bin-dir", help="where mlxgate and mlxgate-sim are (default: target/release)")
    ap.add_argument("--out", help="Markdown report (default: bench/results/balance[-real].md, JSON beside it)")
    ap.add_argument("--render-only", metavar="JSON", help="rewrite the report from a saved raw-figures file")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, configs)")
    args = ap.parse_args()
    if args.self_test:
        from .selftest import run as self_test
        return self_test()
    out_md = Path(args.out) if args.out else ROOT / "bench" / "results" / ("balance-real.md" if args.real
                                                                          else "balance.md")
    if args.render_only:
        write(out_md, json.loads(Path(args.render_only).read_text()))
        return 0
    if args.bin_dir:
        settings.BIN_DIR = Path(args.bin_dir).resolve()
    needed = ["mlxgate"] + ([] if args.real else ["mlxgate-sim"])
    missing = [b for b in needed if not (settings.BIN_DIR / b).is_file()]
    if missing:
        raise SystemExit(f"missing {missing} in {settings.BIN_DIR}: `cargo build --release --bins` (or --bin-dir)")
    workload = wl.load()
    if wl.render(wl.generate()) != wl.OUT.read_text():
        raise SystemExit("bench/balance_lib/workload.json differs from its generator: the workload is fixed")
    busy = ports_free()
    if busy:
        raise SystemExit(f"ports in use on {settings.HOST}: {busy}")
    policies = [p for p in args.policies.split(",") if p]
    real_model = Path(args.real_model).resolve() if args.real else None
    if real_model is not None:
        ensure_real_model(real_model)
    limit = (90 if args.real else 20) * 60

    def overtime(_sig, _frame):  # noqa: ANN001
        raise SystemExit(f"bench/balance: over its {limit // 60} minutes: stopped")

    def terminated(sig, _frame):  # noqa: ANN001
        # SIGTERM (a `timeout`, a CI job cancelled) or SIGHUP: unwind, so that the servers and
        # gateways started in their own sessions are stopped, not left running.
        raise SystemExit(f"bench/balance: stopped by signal {sig}")

    signal.signal(signal.SIGALRM, overtime)
    signal.signal(signal.SIGTERM, terminated)
    signal.signal(signal.SIGHUP, terminated)
    signal.alarm(limit)
    workdir = Path(tempfile.mkdtemp(prefix="mlxgate-bench-balance-"))
    began = time.monotonic()
    sim_what = (f"two `mlxgate-sim --style mlx-lm --prompt-cache-size {PROMPT_CACHE_SIZE}` (prefill "
                f"{SIM_PREFILL_MS_PER_TOKEN} ms per uncached token, {SIM_TOKENS_PER_SECOND} tokens/s, speedup "
                f"{SIM_SPEEDUP}), max_concurrency {settings.MAX_CONCURRENCY} each")
    shown = real_model.relative_to(ROOT) if real_model and real_model.is_relative_to(ROOT) else real_model
    made = (f" (random weights, scripts/make-tiny-model.py {' '.join(settings.REAL_MODEL_ARGS)})"
            if real_model == REAL_MODEL_DIR.resolve() else "")
    real_what = (f"two `mlx_lm.server --prompt-cache-size {PROMPT_CACHE_SIZE}` on the CPU, model `{shown}`{made}, "
                 f"max_concurrency {settings.MAX_CONCURRENCY} each")
    res: dict = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
                 "commit": commit(), "loadavg_start": loadavg(), "backends": "real" if args.real else "sim",
                 "backends_what": real_what if args.real else sim_what, "max_tokens": MAX_TOKENS,
                 "workload": workload_facts(workload), "oracle": stats.oracle(workload), "policies": {},
                 "records": {}, "notes": [],
                 "command": "bench/balance " + " ".join(shlex.quote(a) for a in sys.argv[1:])}
    try:
        for policy in policies:
            summary, records = run_policy(workdir, workload, policy, real_model)
            res["policies"][policy] = summary
            res["records"][policy] = records
        if not args.no_self_correction:
            res["self_correction"] = self_correction(workdir, workload, real_model, args.predicted_metric,
                                                     args.self_correction_policy)
        res["loadavg_end"] = loadavg()
    finally:
        signal.alarm(0)
    # The oracle in the servers' own tokens: the prompts are the same in every policy's run.
    from_records = [stats.oracle_from_records(r) for r in res["records"].values()]
    res["oracle_tokens"] = next((o for o in from_records if o), None) if args.real else res["oracle"]["prefilled"]
    if not args.real and from_records and from_records[0] not in (None, res["oracle"]["prefilled"]):
        res["notes"].append(f"the simulators' prompt tokens give an oracle of {from_records[0]}, the workload's "
                            f"words {res['oracle']['prefilled']}")
    # The stricter oracle: the pinned conversations also share the common prefix on a backend.
    res["oracle_shared_tokens"] = (
        stats.oracle_shared(res["oracle_tokens"], stats.shared_prefix_from_records(list(res["records"].values())),
                            len(workload["conversations"]), len(settings.BACKEND_PORTS))
        if args.real else res["oracle"]["prefilled_shared"])
    res["goals"] = stats.goals(res["policies"], res["oracle_tokens"])
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
