"""The report's picture: a hand-written SVG of grouped horizontal bars, one panel per figure (CPU per
request at c=1 and at saturation, CPU per streamed chunk, added p50 and p99 at c=1), one bar per
proxy, each panel on its own scale (a bar beyond it is cut, with its value written at the end)."""

from __future__ import annotations

from html import escape
from pathlib import Path


COLOURS = {"mlxgate": "#1f77b4", "mlxgate-before": "#9ecae1", "mlxgate-full": "#6baed6", "nginx": "#2ca02c",
           "litellm": "#d62728", "portkey": "#ff7f0e"}


def panels(res: dict) -> list[tuple[str, dict[str, float]]]:
    """(title, proxy → value in µs) for each panel, from the run's figures."""
    targets = [t for t in res.get("targets", []) if t not in ("direct", "mlxgate-full")]
    lat, rate, st = res["latency"]["summary"], res["rate"]["summary"], res["streams"]["summary"]

    def pick(get) -> dict[str, float]:  # noqa: ANN001
        out = {}
        for t in targets:
            try:
                v = get(t)
            except (KeyError, TypeError):
                continue
            if v is not None and v == v:
                out[t] = v
        return out

    q = res["rate"].get("quota") or 0
    return [
        ("CPU per request, c=1 (µs)", pick(lambda t: lat[t]["cpu_us_per_req"])),
        ("CPU per request at saturation (µs)" + (f", {q:.0%}-CPU quota" if q else ""),
         pick(lambda t: rate[t]["steps"][rate[t]["peak_conns"]]["cpu_us_per_req"])),
        ("CPU per streamed chunk, 256 streams (µs)", pick(lambda t: st[t]["cpu_us_per_chunk"])),
        ("added p50 latency, c=1, proxy alone (µs)", pick(lambda t: lat[t]["added_p50"])),
        ("added p99 latency, c=1, proxy alone (µs)", pick(lambda t: lat[t]["added_p99"])),
    ]


def render_svg(res: dict) -> str:
    ps = panels(res)
    width, left, right = 900, 150, 90
    bar_h, gap, head = 18, 4, 28
    y = 50
    parts: list[str] = []
    for title, values in ps:
        parts.append(f'<text x="10" y="{y + 16}" font-size="15" font-weight="bold">{escape(title)}</text>')
        y += head
        # The scale: the gateways' and nginx's bars fit; a far larger one (LiteLLM, Portkey) is cut.
        near = [v for t, v in values.items() if t not in ("litellm", "portkey")] or list(values.values()) or [1]
        top = max(max(near) * 1.15, 1e-9)
        span_px = width - left - right
        for t, v in values.items():
            w = max(0.0, min(v, top)) / top * span_px
            cut = v > top
            parts.append(f'<text x="{left - 8}" y="{y + bar_h - 5}" font-size="13" text-anchor="end">{escape(t)}</text>')
            parts.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{COLOURS.get(t, "#888")}"/>')
            if cut:
                parts.append(f'<path d="M{left + w - 10:.1f},{y - 2} l6,{bar_h + 4}" stroke="white" stroke-width="3"/>')
            label = f"{v:.0f}" if abs(v) >= 10 else f"{v:.1f}"
            parts.append(f'<text x="{left + w + 6:.1f}" y="{y + bar_h - 5}" font-size="13">'
                         f'{escape(label + (" (cut)" if cut else ""))}</text>')
            y += bar_h + gap
        y += 14
    when = escape(f"bench/overhead, {res.get('date', '')}, mlxgate {res.get('machine', {}).get('commit', '?')}"
                  + (" (quick run)" if res.get("quick") else ""))
    header = (f'<text x="10" y="24" font-size="18" font-weight="bold">What each proxy costs: CPU and added latency '
              f'(lower is better)</text><text x="10" y="42" font-size="12" fill="#555">{when}</text>')
    parts.append(f'<text x="10" y="{y + 4}" font-size="12" fill="#555">Each panel has its own scale; a bar marked '
                 f'"(cut)" runs beyond it (its value is written). Figures: medians over rounds, from the tables of '
                 f'the report.</text>')
    y += 14
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y + 10}" '
            f'viewBox="0 0 {width} {y + 10}" font-family="sans-serif">'
            f'<rect width="100%" height="100%" fill="white"/>{header}{"".join(parts)}</svg>\n')


def write_svg(path: Path, res: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_svg(res))
