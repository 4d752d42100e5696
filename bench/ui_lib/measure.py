"""The measured parts of a run: one 256-stream round and one idle window, each with nobody
following the gateway (`none`), the real page open (`page`) or a bare follower of its feed
(`feed`). bench/overhead's `stream_run` and `on_cpu` do the measuring."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from overhead_lib.load import wrk
from overhead_lib.phases import on_cpu, stream_run
from overhead_lib.processes import Procs, cpu_seconds, loadavg

from .browser import Page
from .settings import (
    ACTIVITY_MAX, BROWSER_CPU, FEED_SETTLE_S, GATEWAY, GATEWAY_PORT, HOST, PAGE_SETTLE_S, ROUTE,
    SETTLE_S,
)

# /proc/net/tcp's states of a connection the gateway still holds: ESTABLISHED, CLOSE_WAIT.
HELD = {"01", "08"}


def held_connections(port: int, table: str | None = None) -> int:
    """Connections to the local `port` the gateway still holds (its side not closed yet)."""
    lines = (table if table is not None else Path("/proc/net/tcp").read_text()).splitlines()[1:]
    return sum(1 for ln in lines if len(f := ln.split()) > 3 and int(f[1].split(":")[1], 16) == port
               and f[3] in HELD)


def no_follower_left(timeout: float = 10.0) -> float:
    """Seconds until no connection to the gateway is held (a closed page's feed has ended);
    fails loudly when one still is after `timeout`: a `none` run would not be one."""
    began = time.monotonic()
    while (held := held_connections(GATEWAY_PORT)) > 0:
        if time.monotonic() - began > timeout:
            raise SystemExit(f"{held} connection(s) to the gateway still held {timeout:.0f}s after the page closed")
        time.sleep(0.1)
    return time.monotonic() - began


def busy_cpu_s(stat: str | None = None) -> float:
    """Seconds all CPUs were busy since boot (/proc/stat's first line: all but idle and iowait)."""
    fields = [int(v) for v in (stat if stat is not None else Path("/proc/stat").read_text()).split("\n", 1)[0]
              .split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def others_cpu(run):  # noqa: ANN001, ANN201
    """Runs `run` and adds the CPU seconds the machine spent on processes this run did not start
    (all CPUs' busy time minus this process's tree: the gateway, the simulator, the browser)."""
    busy0, mine0 = busy_cpu_s(), cpu_seconds(os.getpid())
    r = run()
    r["others_cpu_s"] = max(0.0, (busy_cpu_s() - busy0) - (cpu_seconds(os.getpid()) - mine0))
    return r


def count_events(text: str) -> dict[str, int]:
    """Events of each name in an SSE text, and `missed`: the sum of its `lagged` events' counts."""
    counts: dict[str, int] = {}
    name = None
    for line in text.splitlines():
        if line.startswith("event: "):
            name = line[7:]
            counts[name] = counts.get(name, 0) + 1
        elif line.startswith("data: ") and name == "lagged":
            try:
                counts["missed"] = counts.get("missed", 0) + int(json.loads(line[6:])["missed"])
            except (ValueError, KeyError, TypeError):
                pass
        elif not line:
            name = None
    return counts


class Feed:
    """A bare follower of /ui/events (curl, pinned beside the load): the gateway's feed without a
    browser's work on the load's CPU."""

    def __init__(self, workdir: Path, tag: str):
        self.path = workdir / f"feed-{tag}.txt"
        self.proc = subprocess.Popen(["taskset", "-c", BROWSER_CPU, "curl", "-sN", "-o", str(self.path),
                                      f"http://{HOST}:{GATEWAY_PORT}/ui/events"], start_new_session=True)
        began = time.monotonic()
        while "requests" not in self.events():
            if time.monotonic() - began > 10 or self.proc.poll() is not None:
                self.close()
                raise SystemExit(f"the feed /ui/events sent no backlog within 10s (see {self.path})")
            time.sleep(0.05)

    def events(self) -> dict[str, int]:
        """How many events of each name the feed has sent so far, and `missed`: the requests its
        `lagged` events said it skipped."""
        text = self.path.read_text(errors="replace") if self.path.exists() else ""
        return count_events(text)

    def wait_requests(self, before: int, want: int, timeout: float = 15.0) -> tuple[int, float]:
        began = time.monotonic()
        while True:
            got = self.events().get("request", 0) - before
            if got >= want:
                return got, time.monotonic() - began
            if time.monotonic() - began > timeout:
                raise SystemExit(f"the feed sent {got} of the run's {want} requests (see {self.path})")
            time.sleep(0.1)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass


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


def open_follower(workdir: Path, url: str, variant: str, tag: str) -> tuple[Page | Feed | None, dict]:
    """What follows the gateway in `variant`, open and settled, and what opening it took."""
    if variant == "page":
        return open_page(workdir, url)
    if variant == "feed":
        feed = Feed(workdir, tag)
        time.sleep(FEED_SETTLE_S)
        return feed, {}
    return None, {"feed_gone_s": no_follower_left()}


def stream_round(procs: Procs, workdir: Path, url: str, variant: str, streams: int, chunks: int, tag: str) -> dict:
    """One run of `streams` streams through the gateway with `variant` following it:
    stream_run's figures, the gateway's CPU per content chunk over the run and SETTLE_S after
    it, what the others on the machine used meanwhile, and what the follower got of the run (a
    page's new rows, a feed's request events: all of them, or a loud failure)."""
    follower, s = open_follower(workdir, url, variant, tag)
    try:
        page = follower if isinstance(follower, Page) else None
        feed = follower if isinstance(follower, Feed) else None
        before_rows = set(page.row_ids()) if page else set()
        before_events = feed.events().get("request", 0) if feed else 0
        s["held_before"] = held_connections(GATEWAY_PORT)
        browser_cpu0 = page.browser.cpu_s() if page else 0.0
        timeout = chunks * 0.02 * 6 + 60

        def run() -> dict:
            r = stream_run(procs, GATEWAY, ROUTE, streams, timeout=timeout)
            r["cpu_us_per_chunk_streams"] = r.pop("cpu_us_per_chunk")  # the streams alone
            r["cpu_s_streams"] = r.pop("cpu_s")
            time.sleep(SETTLE_S)
            return r

        r = others_cpu(lambda: on_cpu(procs.pid(GATEWAY), run))  # cpu_s: the run and the settle
        r.update(s)
        r["cpu_us_per_chunk"] = r["cpu_s"] / max(1, r["content_chunks"]) * 1e6
        r["variant"], r["loadavg"] = variant, loadavg()
        if page:
            want = min(streams, ACTIVITY_MAX)
            r["rows_new"], r["rows_caught_up_s"] = page.wait_rows(before_rows, want)
            r["rows_wanted"] = want
            r["rows_before"] = len(before_rows)
            r["lagged"] = page.lagged()
            r["live_after"] = page.live()
            r["browser_cpu_s"] = page.browser.cpu_s() - browser_cpu0
            if r["live_after"] != "live":
                raise SystemExit(f"the /ui page was not live after the run (badge {r['live_after']!r})")
        if feed:
            r["events_new"], r["events_caught_up_s"] = feed.wait_requests(before_events, streams)
            r["feed_events"] = feed.events()
            r["lagged"] = f"lagged events: {r['feed_events']['lagged']}" if r["feed_events"].get("lagged") else ""
    finally:
        if follower:
            follower.close()
    return r


def idle_window(procs: Procs, workdir: Path, url: str, variant: str, seconds: float, tag: str) -> dict:
    """The gateway's CPU over `seconds` with no traffic and `variant` following it (a feed then
    sends only state changes and a keep-alive comment), in µs of CPU per second."""
    follower, s = open_follower(workdir, url, variant, tag)
    try:
        browser_cpu0 = follower.browser.cpu_s() if isinstance(follower, Page) else 0.0
        events0 = follower.events() if isinstance(follower, Feed) else {}
        began = time.monotonic()
        r = others_cpu(lambda: on_cpu(procs.pid(GATEWAY), lambda: time.sleep(seconds) or {}))
        r["seconds"] = time.monotonic() - began
        r.update(s)
        r["cpu_us_per_s"] = r["cpu_s"] / r["seconds"] * 1e6
        r["variant"], r["loadavg"] = variant, loadavg()
        if isinstance(follower, Page):
            r["live_after"] = follower.live()
            r["browser_cpu_s"] = follower.browser.cpu_s() - browser_cpu0
            if r["live_after"] != "live":
                raise SystemExit(f"the /ui page was not live after the idle window (badge {r['live_after']!r})")
        if isinstance(follower, Feed):
            r["state_events"] = follower.events().get("state", 0) - events0.get("state", 0)
    finally:
        if follower:
            follower.close()
    return r


def rate_round(procs: Procs, workdir: Path, url: str, variant: str, seconds: int, conns: int, tag: str) -> dict:
    """Whole (non-streamed) answers as fast as wrk gets them for `seconds` over `conns` connections
    with `variant` following: the gateway's CPU per request, and how the follower kept up with
    thousands of requests a second (a page's rows and lag notice, a feed's events and `lagged`
    counts). Only a follower that got nothing fails the run: falling behind here is a finding."""
    follower, s = open_follower(workdir, url, variant, tag)
    try:
        page = follower if isinstance(follower, Page) else None
        feed = follower if isinstance(follower, Feed) else None
        before_rows = set(page.row_ids()) if page else set()
        before = feed.events() if feed else {}
        browser_cpu0 = page.browser.cpu_s() if page else 0.0

        def run() -> dict:
            w = wrk(workdir, GATEWAY, conns, seconds)
            time.sleep(SETTLE_S)
            return w

        r = others_cpu(lambda: on_cpu(procs.pid(GATEWAY), run))
        r.update(s)
        r["cpu_us_per_req"] = r["cpu_s"] / max(1, r["requests"]) * 1e6
        r["variant"], r["loadavg"] = variant, loadavg()
        if page:
            want = min(r["requests"], ACTIVITY_MAX)
            began = time.monotonic()
            while (new := len(set(page.row_ids()) - before_rows)) < want and time.monotonic() - began < 10:
                time.sleep(0.2)
            r["rows_new"], r["rows_wanted"], r["lagged"] = new, want, page.lagged()
            r["live_after"] = page.live()
            r["browser_cpu_s"] = page.browser.cpu_s() - browser_cpu0
            if new == 0 or r["live_after"] != "live":
                raise SystemExit(f"the /ui page showed {new} new rows after {r['requests']} requests (badge "
                                 f"{r['live_after']!r}): it was not following")
        if feed:
            time.sleep(1)
            after = feed.events()
            r["events_new"] = after.get("request", 0) - before.get("request", 0)
            r["lagged_events"] = after.get("lagged", 0) - before.get("lagged", 0)
            r["missed"] = after.get("missed", 0) - before.get("missed", 0)
            r["lagged"] = f"{r['lagged_events']} lagged events, {r['missed']} requests missed" if r["missed"] else ""
            if r["events_new"] == 0:
                raise SystemExit(f"the feed sent no request event for {r['requests']} requests (see {feed.path})")
    finally:
        if follower:
            follower.close()
    return r
