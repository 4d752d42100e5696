"""A real page: headless Chromium driven over WebDriver's HTTP API (stdlib only), and what the
benchmark reads from the rendered /ui page (the live badge, the activity rows, the lag notice)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from overhead_lib.processes import cpu_seconds

from .settings import BROWSER_CPU, CHROMEDRIVER, CHROMIUM, HOST

# What the page shows, read in the page (one WebDriver call each).
ROW_IDS_JS = ("return Array.from(document.querySelectorAll('tr[data-testid=activity-row]'))"
              ".map((r) => r.dataset.requestId);")
LIVE_JS = "const n = document.querySelector('[data-testid=live]'); return n ? n.textContent.trim() : null;"
LAGGED_JS = "const n = document.querySelector('#activity-lagged'); return n ? n.textContent.trim() : '';"
TAB_JS = "return location.hash;"


class WebDriverError(RuntimeError):
    """A WebDriver call failed (its answer's message)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Browser:
    """chromedriver (on a free port, in its own session, pinned with taskset) and one headless
    Chromium session it starts; `quit` ends both, by their own pid."""

    def __init__(self, workdir: Path, width: int = 1400, height: int = 900):
        self.port = free_port()
        log = open(workdir / "chromedriver.log", "ab")
        self.proc = subprocess.Popen(["taskset", "-c", BROWSER_CPU, CHROMEDRIVER, f"--port={self.port}"],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 20
        while True:
            try:
                self.call("GET", "/status")
                break
            except (OSError, WebDriverError):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.kill()
                    raise SystemExit(f"chromedriver did not start (see {workdir / 'chromedriver.log'})")
                time.sleep(0.1)
        args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", f"--user-data-dir={workdir / 'chromium-profile'}"]
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome",
                                                 "goog:chromeOptions": {"args": args, "binary": CHROMIUM}}}}
        try:
            self.sid = self.call("POST", "/session", caps)["sessionId"]
        except Exception:
            self.kill()
            raise

    def call(self, method: str, path: str, body: dict | None = None, timeout: float = 60):  # noqa: ANN201
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://{HOST}:{self.port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())["value"]
        except urllib.error.HTTPError as e:
            raise WebDriverError(e.read().decode(errors="replace")[:500]) from None

    def get(self, url: str) -> None:
        self.call("POST", f"/session/{self.sid}/url", {"url": url})

    def js(self, script: str):  # noqa: ANN201
        return self.call("POST", f"/session/{self.sid}/execute/sync", {"script": script, "args": []})

    def cpu_s(self) -> float:
        """CPU seconds of chromedriver and every Chromium process under it."""
        return cpu_seconds(self.proc.pid)

    def quit(self) -> None:
        try:
            self.call("DELETE", f"/session/{self.sid}", timeout=20)
        except (OSError, WebDriverError):
            pass
        self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: chromedriver and its Chromium
                self.proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


class Page:
    """The /ui page open on its Activity tab in a fresh browser."""

    def __init__(self, workdir: Path, url: str):
        self.browser = Browser(workdir)
        self.url = url
        try:
            self.browser.get(url)
        except Exception:
            self.browser.quit()
            raise

    def live(self) -> str | None:
        return self.browser.js(LIVE_JS)

    def row_ids(self) -> list[str]:
        return self.browser.js(ROW_IDS_JS)

    def lagged(self) -> str:
        return self.browser.js(LAGGED_JS)

    def wait_live(self, timeout: float = 20.0) -> float:
        """Seconds until the badge reads `live` and the tab is Activity; fails loudly otherwise."""
        began = time.monotonic()
        while time.monotonic() - began < timeout:
            if self.live() == "live" and self.browser.js(TAB_JS) == "#activity":
                return time.monotonic() - began
            time.sleep(0.1)
        raise SystemExit(f"the /ui page at {self.url} was not live after {timeout:.0f}s (badge reads "
                         f"{self.live()!r}): the comparison would be meaningless")

    def wait_rows(self, before: set[str], want: int, timeout: float = 15.0) -> tuple[int, float]:
        """(rows not in `before`, seconds it took) once at least `want` new rows are rendered;
        fails loudly when they are not within `timeout`."""
        began = time.monotonic()
        while True:
            new = len(set(self.row_ids()) - before)
            waited = time.monotonic() - began
            if new >= want:
                return new, waited
            if waited > timeout:
                raise SystemExit(f"the /ui page rendered {new} of the run's {want} requests after {timeout:.0f}s "
                                 f"(badge {self.live()!r}, lag notice {self.lagged()!r}): the page was not following")
            time.sleep(0.2)

    def close(self) -> None:
        self.browser.quit()
