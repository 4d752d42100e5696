"""The measured parts of a run: one 256-stream round with or without the page open, and an idle
window with or without it. bench/overhead's `stream_run` and `on_cpu` do the measuring."""

from __future__ import annotations

import time
from pathlib import Path

from overhead_lib.phases import on_cpu, stream_run
from overhead_lib.processes import Procs, loadavg

from .browser import Page
from .settings import ACTIVITY_MAX, GATEWAY, GATEWAY_PORT, PAGE_SETTLE_S, ROUTE, SETTLE_S

# /proc/net/tcp's states of a connection the gateway still holds: ESTABLISHED, CLOSE_WAIT.
HELD = {"01", "08"}


def held_connections(port: int, table: str | None = None) -> int:
    """Connections to the local `port` the gateway still holds (its side not closed yet)."""
    lines = (table if table is not None else Path("/proc/net/tcp").read_text()).splitlines()[1:]
    return sum(1 for ln in lines if len(f := ln.split()) > 3 and int(f[1].split(":")[1], 16) == port
               and f[3] in HELD)


def no_page_left(timeout: float = 10.0) -> float:
    """Seconds until no connection to the gateway is held (a closed page's feed has ended);
    fails loudly when one still is after `timeout`: a `none` run would not be one."""
    began = time.monotonic()
    while (held := held_connections(GATEWAY_PORT)) > 0:
        if time.monotonic() - began > timeout:
            raise SystemExit(f"{held} connection(s) to the gateway still held {timeout:.0f}s after the page closed")
        time.sleep(0.1)
    return time.monotonic() - began


def open_page(workdir: Path, url: str) -> tuple[Page, dict]:
    """A fresh browser on the page, live (or a loud failure), its first render settled."""
    began = time.monotonic()
    page = Page(workdir, url)
    try:
        live_after_s = page.wait_live()
        time.sleep(PAGE_SETTLE_S)
        if page.live() != "live":
            raise SystemExit(f"the /ui page stopped being live while it settled (badge {page.live()!r})")
    except BaseException:
        page.close()
        raise
    return page, {"page_open_s": time.monotonic() - began, "live_after_s": live_after_s}


def stream_round(procs: Procs, workdir: Path, url: str, variant: str, streams: int, chunks: int) -> dict:
    """One run of `streams` streams through the gateway, with no page (`none`) or the page open on
    its Activity tab (`page`): stream_run's figures, the gateway's CPU per content chunk over the
    run and SETTLE_S after it, and for `page` what the page rendered of it."""
    page, s = (open_page(workdir, url) if variant == "page" else (None, {"feed_gone_s": no_page_left()}))
    try:
        before = set(page.row_ids()) if page else set()
        s["held_before"] = held_connections(GATEWAY_PORT)
        browser_cpu0 = page.browser.cpu_s() if page else 0.0
        timeout = chunks * 0.02 * 6 + 60

        def run() -> dict:
            r = stream_run(procs, GATEWAY, ROUTE, streams, timeout=timeout)
            r["cpu_us_per_chunk_streams"] = r.pop("cpu_us_per_chunk")  # the streams alone
            r["cpu_s_streams"] = r.pop("cpu_s")
            time.sleep(SETTLE_S)
            return r

        r = on_cpu(procs.pid(GATEWAY), run)  # its cpu_s: the run and the settle
        r.update(s)
        r["cpu_us_per_chunk"] = r["cpu_s"] / max(1, r["content_chunks"]) * 1e6
        r["variant"], r["loadavg"] = variant, loadavg()
        if page:
            want = min(streams, ACTIVITY_MAX)
            r["rows_new"], r["rows_caught_up_s"] = page.wait_rows(before, want)
            r["rows_wanted"] = want
            r["rows_before"] = len(before)
            r["lagged"] = page.lagged()
            r["live_after"] = page.live()
            r["browser_cpu_s"] = page.browser.cpu_s() - browser_cpu0
            if r["live_after"] != "live":
                raise SystemExit(f"the /ui page was not live after the run (badge {r['live_after']!r})")
    finally:
        if page:
            page.close()
    return r


def idle_window(procs: Procs, workdir: Path, url: str, variant: str, seconds: float) -> dict:
    """The gateway's CPU over `seconds` with no traffic, with no page or the page open (its feed
    then sends only state changes and a keep-alive comment), in µs of CPU per second."""
    page, s = (open_page(workdir, url) if variant == "page" else (None, {"feed_gone_s": no_page_left()}))
    try:
        browser_cpu0 = page.browser.cpu_s() if page else 0.0
        began = time.monotonic()
        r = on_cpu(procs.pid(GATEWAY), lambda: time.sleep(seconds) or {})
        r["seconds"] = time.monotonic() - began
        r.update(s)
        r["cpu_us_per_s"] = r["cpu_s"] / r["seconds"] * 1e6
        r["variant"], r["loadavg"] = variant, loadavg()
        if page:
            r["live_after"] = page.live()
            r["browser_cpu_s"] = page.browser.cpu_s() - browser_cpu0
            if r["live_after"] != "live":
                raise SystemExit(f"the /ui page was not live after the idle window (badge {r['live_after']!r})")
    finally:
        if page:
            page.close()
    return r
