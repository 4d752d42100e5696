"""The sampler: a thread that, every SAMPLE_EVERY_S while a run lasts, reads each backend's
state from the gateway's /admin/backends and finds the GPU servers' processes in /proc (how many
are alive at once), and once a second the resident memory of each server's process group (its
peak over the run)."""

from __future__ import annotations

import json
import threading
import time

from .procs import Gateway, group_rss, pgid_of, servers
from .settings import SAMPLE_EVERY_S


class Sampler:
    def __init__(self, gateway: Gateway, t0: float):
        self.gateway, self.t0 = gateway, t0
        self.samples: list[dict] = []
        self.rss_peak: dict[str, int] = {}
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        last_rss = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            states: dict[str, str] = {}
            try:
                listing = json.loads(self.gateway.get("/admin/backends", timeout=2.0))
                states = {b["name"]: b.get("state", "?") for b in listing.get("backends", [])}
            except (OSError, ValueError, KeyError):
                self.errors += 1
            alive = servers()
            self.samples.append({"t": now - self.t0, "states": states, "alive": alive})
            if now - last_rss >= 1.0:
                last_rss = now
                for model, pids in alive.items():
                    if not pids:
                        continue
                    groups = {g for g in (pgid_of(p) for p in pids) if g is not None}
                    rss = sum(group_rss(g) for g in groups)
                    self.rss_peak[model] = max(self.rss_peak.get(model, 0), rss)
            self._stop.wait(max(0.0, SAMPLE_EVERY_S - (time.monotonic() - now)))
