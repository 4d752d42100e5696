"""The figures of a run: the oracle (offline), per-policy summaries from the answers' usage,
requests per backend from the gateway's /metrics, the prediction error's windows, and the goals
of issue 21."""

from __future__ import annotations

import re

from overhead_lib.stats import pct

from . import workload as wl
from .cache_model import LruPromptCache
from .settings import BACKEND_PORTS, MAX_TOKENS

# Goals of issue 21, judged on prefilled tokens (exact, from usage).
ORACLE_GOAL = 1.1        # cache_aware ≤ 1.1 × the oracle
ROUND_ROBIN_GOAL = 0.5   # cache_aware ≤ 0.5 × round_robin
BALANCE_GOAL = 1.5       # no backend serves more than 1.5 × the other's requests


def oracle(workload: dict) -> dict:
    """The oracle in the simulator's tokens (words), computed offline.

    `prefilled`: each conversation pinned to one backend with no evictions, as issue 21 defines
    it: Σ over conversations of the first prompt + each later turn's new tokens (every turn's
    prompt extends the previous one, so this is Σ of the last prompts). `prefilled_shared`: the
    same pinning (conversation i on backend i mod 2) replayed through two unbounded mlx_lm caches,
    which also share the common system prompt across conversations on one backend (a policy may
    beat the first figure by that much, never the second)."""
    convs = workload["conversations"]
    prompts = {c["id"]: [wl.words_of(m) for m in wl.prompts(workload, c)] for c in convs}
    prefilled = sum(len(p[-1]) for p in prompts.values())
    # What the simulator stores of an answer: the prompt and its generated tokens.
    generated = [f"t{i}" for i in range(MAX_TOKENS)]
    caches = [LruPromptCache(None), LruPromptCache(None)]
    shared_total = 0
    longest = max(len(c["turns"]) for c in convs)
    for k in range(longest):
        for i, c in enumerate(convs):
            if k < len(prompts[c["id"]]):
                p = prompts[c["id"]][k]
                cache = caches[i % 2]
                shared_total += len(p) - cache.fetch(p)
                cache.insert(p + generated)
    requests = sum(len(p) for p in prompts.values())
    return {"prefilled": prefilled, "prefilled_shared": shared_total, "requests": requests,
            "prompt_tokens": sum(len(x) for p in prompts.values() for x in p)}


def oracle_from_records(records: list[dict]) -> int | None:
    """The oracle from the prompt tokens the servers reported (the same prompts in every policy's
    run): Σ over conversations of its last prompt's tokens; None when a conversation has no
    answered last turn."""
    last: dict[str, tuple[int, int]] = {}
    for r in records:
        if r.get("prompt_tokens") is None:
            continue
        cur = last.get(r["conv"])
        if cur is None or r["turn"] > cur[0]:
            last[r["conv"]] = (r["turn"], r["prompt_tokens"])
    return sum(t for _, t in last.values()) if last else None


def shared_prefix_from_records(all_records: list[list[dict]]) -> int | None:
    """The prefix every conversation shares (tools, system prompt), in the servers' tokens: the
    fewest cached tokens a server reported for a conversation's first turn that found any (a
    first turn can only find what another conversation left); None when none did."""
    found = [r["cached_tokens"] for records in all_records for r in records
             if r.get("turn") == 0 and (r.get("cached_tokens") or 0) > 0]
    return min(found) if found else None


def oracle_shared(oracle_tokens: int | None, shared_prefix: int | None, conversations: int,
                  backends: int) -> int | None:
    """The pinned oracle when each backend's cache also shares the common prefix among the
    conversations pinned to it: that prefix is prefilled once per backend, not once per
    conversation (every conversation of the workload opens with it)."""
    if oracle_tokens is None or shared_prefix is None or conversations < backends:
        return None
    return oracle_tokens - shared_prefix * (conversations - backends)


def summarize(records: list[dict], per_backend: dict[str, float]) -> dict:
    """One policy's run: prefilled tokens (Σ prompt − cached over answered requests), cached and
    prompt tokens, TTFT p50/p95, failures, requests per backend and their balance."""
    ok = [r for r in records if r.get("prompt_tokens") is not None]
    prefilled = sum(r["prompt_tokens"] - (r.get("cached_tokens") or 0) for r in ok)
    ttfts = [r["ttft_s"] for r in ok if r.get("ttft_s") is not None]
    counts = [per_backend.get(b, 0.0) for b in BACKEND_PORTS]  # a backend that served none counts 0
    balance = (max(counts) / min(counts)) if counts and min(counts) > 0 else float("inf")
    return {
        "requests": len(records), "answered": len(ok), "failed": len(records) - len(ok),
        "prefilled": prefilled, "cached": sum(r.get("cached_tokens") or 0 for r in ok),
        "prompt_tokens": sum(r["prompt_tokens"] for r in ok),
        "ttft_p50_s": pct(ttfts, 50), "ttft_p95_s": pct(ttfts, 95),
        "per_backend": per_backend, "balance": balance,
        "unreported_cache": sum(1 for r in ok if r.get("cached_tokens") is None),
    }


METRIC_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict, float]]:
    """Prometheus text exposition → (name, labels, value) samples."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = METRIC_LINE.match(line.strip())
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), dict(LABEL.findall(m.group(2) or "")), value))
    return out


def by_backend(samples: list[tuple[str, dict, float]], name: str, model: str) -> dict[str, float]:
    """Σ of a counter per backend label, for one model."""
    out: dict[str, float] = {}
    for n, labels, v in samples:
        if n == name and labels.get("model") == model and "backend" in labels:
            out[labels["backend"]] = out.get(labels["backend"], 0.0) + v
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in sorted(set(after) | set(before))}


def prediction_windows(samples: list[dict], windows: int = 4) -> list[dict] | None:
    """The prediction error over the run, in `windows` equal spans of time: per span and backend,
    Δpredicted − Δreported cached tokens (and their sum). `samples`: [{"t": s, "predicted":
    {backend: v}, "reported": {backend: v}}] in time order. None when the gateway exposes no
    prediction counter (HOOK(metrics) in settings.py)."""
    if len(samples) < 2 or not any(s["predicted"] for s in samples):
        return None
    t0, t1 = samples[0]["t"], samples[-1]["t"]
    span = (t1 - t0) / windows or 1.0
    out = []
    for w in range(windows):
        lo, hi = t0 + w * span, t0 + (w + 1) * span
        inside = [s for s in samples if lo <= s["t"] <= hi + 1e-9]
        if len(inside) < 2:
            continue
        first, last = inside[0], inside[-1]
        pred, rep = delta(last["predicted"], first["predicted"]), delta(last["reported"], first["reported"])
        errors = {b: pred.get(b, 0.0) - rep.get(b, 0.0) for b in sorted(set(pred) | set(rep))}
        out.append({"window": w + 1, "from_s": round(lo - t0, 1), "to_s": round(hi - t0, 1),
                    "predicted": sum(pred.values()), "reported": sum(rep.values()),
                    "error": sum(errors.values()), "abs_error": sum(abs(e) for e in errors.values()),
                    "per_backend": errors})
    return out


def goals(summaries: dict[str, dict], oracle_tokens: int | None) -> list[dict]:
    """Issue 21's goals, judged on prefilled tokens (TTFT is reported, not judged)."""
    out = []
    ca, rr = summaries.get("cache_aware"), summaries.get("round_robin")
    if ca and oracle_tokens:
        v = ca["prefilled"] / oracle_tokens
        out.append({"goal": f"cache_aware prefilled ≤ {ORACLE_GOAL}× the oracle's", "value": v, "met": v <= ORACLE_GOAL})
    if ca and rr and rr["prefilled"]:
        v = ca["prefilled"] / rr["prefilled"]
        out.append({"goal": f"cache_aware prefilled ≤ {ROUND_ROBIN_GOAL}× round_robin's", "value": v,
                    "met": v <= ROUND_ROBIN_GOAL})
    if ca:
        out.append({"goal": f"cache_aware: no backend serves more than {BALANCE_GOAL}× the other's requests",
                    "value": ca["balance"], "met": ca["balance"] <= BALANCE_GOAL})
        out.append({"goal": "cache_aware: every request answered", "value": ca["failed"], "met": ca["failed"] == 0})
    return out
