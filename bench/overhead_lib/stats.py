"""Statistics over rounds: percentiles, medians, spreads and noise floors, proxy-minus-direct
summaries, and the balanced order of the targets in each round."""

from __future__ import annotations

import statistics


def rounds_order(targets: list[str], r: int) -> list[str]:
    """The targets in round r's order: row r of a balanced Latin square (Williams design; for an
    odd count every other row mirrored, as the design's second half is), so no target always
    follows the same one."""
    n = len(targets)
    base, lo, hi = [0], 1, n - 1
    while len(base) < n:
        base.append(lo)
        lo += 1
        if len(base) < n:
            base.append(hi)
            hi -= 1
    row = [targets[(b + r) % n] for b in base]
    return row[::-1] if n % 2 and r % 2 else row


def pct(values: list[float], p: float) -> float:
    values = [v for v in values if v == v]
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(p / 100 * (len(s) - 1)))))
    return s[k]


def med(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def spread(values: list[float]) -> list[float] | None:
    """[min, max] over rounds (None with fewer than two)."""
    values = [v for v in values if v == v]
    return [min(values), max(values)] if len(values) >= 2 else None


def noise(values: list[float]) -> float | None:
    """The round-to-round spread of a figure of the direct run (max − min), the floor below which
    an "added" figure cannot be told from zero; None with one round."""
    s = spread(values)
    return s[1] - s[0] if s else None


def summarize(runs: list[dict], direct: list[dict], keys: list[str]) -> dict:
    """Medians over rounds of `keys` with their [min, max], and for a proxy "added_<key>": the
    proxy minus the direct run of the same round, median and [min, max] over rounds."""
    by_round = {d["round"]: d for d in direct}
    out: dict = {}
    for k in keys:
        values = [r[k] for r in runs if k in r]
        if not values:
            continue
        out[k] = med(values)
        out[f"{k}_range"] = spread(values)
        if runs is not direct and all(k in d for d in direct):
            added = [r[k] - by_round[r["round"]][k] for r in runs if r["round"] in by_round]
            out[f"added_{k}"] = med(added)
            out[f"added_{k}_range"] = spread(added)
    return out


def slope_per_minute(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB) points, in MiB per minute."""
    n = len(points)
    if n < 2:
        return float("nan")
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    return sum((t - mx) * (v - my) for t, v in points) / var * 60 if var else float("nan")


def range_width(r: list[float] | None) -> float | None:
    """max − min of a [min, max] over rounds; None with one round."""
    return r[1] - r[0] if r else None


def paired_over_rounds(runs: dict[str, list[dict]], key: str, a: str, b: str, k: float = 1.0) -> list[float]:
    """Per round: (a − direct) − k·(b − direct) of `key`, a difference of two paths of the same round."""
    by = {t: {w["round"]: w[key] for w in runs[t]} for t in ("direct", a, b)}
    return [(by[a][r] - by["direct"][r]) - k * (by[b][r] - by["direct"][r])
            for r in by["direct"] if r in by[a] and r in by[b]]
