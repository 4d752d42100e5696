"""The figures of a run, all pure: percentiles, the time spent loading and the most servers at
once from the samples of /admin/backends and /proc, the swap and starting-seconds counters from
/metrics (the baseline's swap counter has no labels, the new one has backend and reason), the
access lines of the gateway's JSON log, one variant's summary, and issue 22's goals."""

from __future__ import annotations

import json

from balance_lib.stats import parse_metrics

from .agents import complete
from .settings import (
    FALLBACK_FIELD, FOOTPRINT_METRIC, MAJORITY, MAX_WAIT_S, MINORITY, STARTING_METRIC, SWAPS_METRIC,
)

# Issue 22's goals.
LOADING_GOAL = 0.25      # loading ≤ 25 % of the wall time (default policy)
ANSWERS_GOAL = 3.0       # ≥ 3× the answers of today's policy


def pct(values: list[float], p: float) -> float | None:
    """The p-th percentile (nearest rank on the sorted values); None without values."""
    s = sorted(v for v in values if v is not None and v == v)
    if not s:
        return None
    k = min(len(s) - 1, max(0, int(round(p / 100 * (len(s) - 1)))))
    return s[k]


def spread(values: list[float]) -> dict:
    return {"n": len(values), "p50": pct(values, 50), "p95": pct(values, 95),
            "max": max(values) if values else None}


def loading(samples: list[dict]) -> dict:
    """From samples in time order, `{"t": s, "states": {backend: state}, "alive": {model: [pids]}}`:
    the seconds during which any GPU backend was `starting` (each sample's state holds until the
    next sample), per backend too, the most server processes alive at once, and the seconds during
    which both models had a server process alive."""
    total, per = 0.0, {}
    for cur, nxt in zip(samples, samples[1:]):
        dt = nxt["t"] - cur["t"]
        starting = [b for b, s in cur.get("states", {}).items() if s == "starting"]
        if starting:
            total += dt
        for b in starting:
            per[b] = per.get(b, 0.0) + dt
    peak = max((sum(len(p) for p in s.get("alive", {}).values()) for s in samples), default=0)
    both = sum(nxt["t"] - cur["t"] for cur, nxt in zip(samples, samples[1:])
               if sum(1 for p in cur.get("alive", {}).values() if p) > 1)
    return {"loading_s": total, "per_backend_s": per, "peak_servers": peak, "both_alive_s": both,
            "samples": len(samples)}


def start_times(timeline: list[list]) -> dict[str, list[float]]:
    """Each backend's starts (seconds from `starting` to the next state) from a timeline of
    [seconds, backend, state] changes."""
    out: dict[str, list[float]] = {}
    began: dict[str, float] = {}
    for t, backend, state in timeline:
        if state == "starting":
            began[backend] = t
        elif backend in began:
            out.setdefault(backend, []).append(round(t - began.pop(backend), 1))
    return out


def metric_sum(text: str, name: str) -> float | None:
    """Σ of every sample of `name` (labelled or not); None when the gateway exposes none."""
    values = [v for n, _, v in parse_metrics(text) if n == name]
    return sum(values) if values else None


def by_label(text: str, name: str, label: str) -> dict[str, float]:
    """Σ of `name` per value of `label` (empty when unlabelled or absent)."""
    out: dict[str, float] = {}
    for n, labels, v in parse_metrics(text):
        if n == name and label in labels:
            out[labels[label]] = out.get(labels[label], 0.0) + v
    return out


def access_lines(log_text: str) -> list[dict]:
    """The access lines (target `mlxgate::access`) of a JSON log (`--log-format json`): their
    fields."""
    out = []
    for line in log_text.splitlines():
        if "mlxgate::access" not in line:
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("target") == "mlxgate::access":
            out.append(entry.get("fields") or {})
    return out


def summarize(records: list[dict], wall_s: float, samples: list[dict], metrics_text: str, access: list[dict],
              rss_peak: dict[str, int]) -> dict:
    """One variant's run: answers and failures per model, swaps, loading, servers at once, the
    waits (first byte of the answer at the client; the gateway's queue wait from its access
    log), the minority's requests served by the majority model, the servers' peak memory."""
    load = loading(samples)
    by_id = {a.get("request_id"): a for a in access}
    per_model = {}
    for model in (MAJORITY, MINORITY):
        mine = [r for r in records if r["model"] == model]
        ok = [r for r in mine if complete(r)]
        failed = [r for r in mine if not complete(r)]
        statuses: dict[str, int] = {}
        for r in failed:
            key = str(r.get("status")) if r.get("status") != 200 else "cut"
            statuses[key] = statuses.get(key, 0) + 1
        lines = [by_id.get(r["request_id"]) for r in mine]
        queue = [a["queue_ms"] / 1000 for a in lines if a and a.get("queue_ms") is not None]
        by_majority_header = sum(1 for r in ok if r.get("served_by") == MAJORITY and model != MAJORITY)
        by_majority_log = sum(1 for r in ok if model != MAJORITY and (by_id.get(r["request_id"]) or {}).get("backend")
                              == MAJORITY)
        fallback_logged = sum(1 for a in lines if a and a.get(FALLBACK_FIELD))
        per_model[model] = {
            "requests": len(mine), "answers": len(ok), "failures": len(failed), "failure_statuses": statuses,
            "wait_s": spread([r["first_byte_s"] for r in ok if r.get("first_byte_s") is not None]),
            "ttft_s": spread([r["ttft_s"] for r in ok if r.get("ttft_s") is not None]),
            "queue_s": spread(queue), "access_lines": sum(1 for a in lines if a),
            "served_by_majority_header": by_majority_header, "served_by_majority_log": by_majority_log,
            "fallback_logged": fallback_logged,
        }
    swaps = metric_sum(metrics_text, SWAPS_METRIC)
    starting = metric_sum(metrics_text, STARTING_METRIC)
    answers = sum(m["answers"] for m in per_model.values())
    return {
        "wall_s": wall_s, "requests": len(records), "answers": answers,
        "failures": sum(m["failures"] for m in per_model.values()),
        "answers_per_minute": answers / wall_s * 60 if wall_s else None,
        "swaps": swaps, "swaps_by_reason": by_label(metrics_text, SWAPS_METRIC, "reason"),
        "loading_s": load["loading_s"], "loading_per_backend_s": load["per_backend_s"],
        "loading_share": load["loading_s"] / wall_s if wall_s else None,
        "starting_s_metric": starting,
        "peak_servers": load["peak_servers"], "both_alive_s": load["both_alive_s"], "samples": load["samples"],
        "rss_peak_mib": {m: round(v / 2**20) for m, v in rss_peak.items()},
        "footprint_gauge_mib": {b: round(v / 2**20) for b, v in by_label(metrics_text, FOOTPRINT_METRIC, "backend").items()
                                if v > 0},
        "models": per_model,
    }


def never_both(name: str, v: dict) -> dict:
    """Without a budget, one GPU server at a time: the seconds both were alive must be 0."""
    return {"variant": name, "goal": "never both servers alive (no budget)", "unit": "s",
            "value": v["both_alive_s"], "met": v["both_alive_s"] == 0}


def goals(variants: dict[str, dict]) -> list[dict]:
    """Issue 22's goals, each judged on the variants that ran (one not run is not judged)."""
    out = []
    base_name = next((v for v in ("before", "timer") if v in variants), None)
    after = variants.get("after")
    minority_bound = float(MAX_WAIT_S)
    if after:
        share = after["loading_share"]
        out.append({"variant": "after", "goal": f"loading ≤ {LOADING_GOAL:.0%} of wall time", "unit": "share",
                    "value": share, "met": share is not None and share <= LOADING_GOAL})
        if base_name:
            base = variants[base_name]["answers"]
            ratio = after["answers"] / base if base else None
            out.append({"variant": "after", "goal": f"≥ {ANSWERS_GOAL:g}× the answers of `{base_name}`", "unit": "×",
                        "value": ratio, "met": ratio is not None and ratio >= ANSWERS_GOAL})
        p95 = after["models"][MINORITY]["wait_s"]["p95"]
        out.append({"variant": "after", "goal": f"{MINORITY}'s p95 wait within its max_wait ({MAX_WAIT_S} s)", "unit": "s",
                    "value": p95, "met": p95 is not None and p95 <= minority_bound})
        out.append({"variant": "after", "goal": "no request fails", "value": after["failures"],
                    "met": after["failures"] == 0})
        out.append(never_both("after", after))
    budget = variants.get("budget")
    if budget:
        out.append({"variant": "budget", "goal": "0 swaps (both fit the budget)", "value": budget["swaps"],
                    "met": budget["swaps"] == 0})
        out.append({"variant": "budget", "goal": "no request fails", "value": budget["failures"],
                    "met": budget["failures"] == 0})
    fb = variants.get("fallback")
    if fb:
        out.append({"variant": "fallback", "goal": "0 swaps", "value": fb["swaps"], "met": fb["swaps"] == 0})
        m = fb["models"][MINORITY]
        served = max(m["served_by_majority_header"], m["served_by_majority_log"])
        out.append({"variant": "fallback", "goal": f"every {MINORITY} answer served by the loaded `{MAJORITY}`",
                    "value": f"{served} of {m['answers']}", "met": m["answers"] > 0 and served == m["answers"]})
        out.append({"variant": "fallback", "goal": "no request fails", "value": fb["failures"],
                    "met": fb["failures"] == 0})
        out.append(never_both("fallback", fb))
    return out
