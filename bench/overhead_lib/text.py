"""Numbers as the report writes them, and the verdict of a figure against a goal given its noise
floor: shared by the report, the goals table and the picture."""

from __future__ import annotations

from typing import Callable

from .settings import TINY_TOKENIZER_DIR


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


def verdict(added: float | None, goal: float, floor: float | None, fmt: Callable[[float], str] = plain_us) -> str:
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
    return f"undetermined (noise ± {fmt(floor)} vs goal {fmt(goal)})"


def met(ok: bool) -> str:
    """A goal that is not a difference from another path (a rate ratio, a count, a size)."""
    return "met" if ok else "**not met**"


def tokenizer_of(res: dict) -> dict:
    """What mlxgate-full counted with (runs saved before this was recorded used the tiny model's)."""
    return res.get("tokenizer") or {"dir": str(TINY_TOKENIZER_DIR), "fallback": True,
                                    "short": "the tiny model's 433-token tokenizer",
                                    "what": "the tiny generated model's tokenizer (`.cache/tiny-qwen3`)"}
