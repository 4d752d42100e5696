"""CPU quotas on the proxies: one cgroup per proxy with a share of one CPU (cgroup v1's
cpu.cfs_quota_us / cpu.cfs_period_us, or v2's cpu.max), so that in the rate phase the proxy, not wrk
and the simulator on the other CPU, is what saturates first. Created for the phase, removed after it
(the processes moved back to the root group first), whatever happens."""

from __future__ import annotations

import math
import os
from pathlib import Path

from .processes import tree

V1_ROOT = Path("/sys/fs/cgroup/cpu")


V2_ROOT = Path("/sys/fs/cgroup")


class QuotaUnavailable(Exception):
    """Why no quota can be set here (not root, no cpu controller, a write refused)."""


def write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as e:
        raise QuotaUnavailable(f"cannot write {value.strip()!r} to {path}: {e.strerror or e}") from e


class CpuQuota:
    """A cgroup holding one proxy's processes under `share` of one CPU."""

    def __init__(self, name: str, share: float, period_us: int):
        if os.geteuid() != 0:
            raise QuotaUnavailable("not root: cgroups cannot be written")
        # The kernel's smallest quota is 1 ms: a small share takes a longer period.
        period_us = max(period_us, math.ceil(1000 / share))
        quota_us = int(share * period_us)
        if (V1_ROOT / "cpu.cfs_quota_us").is_file():
            self.kind, self.root = "cgroup v1", V1_ROOT
            self.dir = V1_ROOT / name
            self._mkdir()
            self._set([("cpu.cfs_period_us", str(period_us)), ("cpu.cfs_quota_us", str(quota_us))])
        elif "cpu" in _read(V2_ROOT / "cgroup.controllers").split():
            self.kind, self.root = "cgroup v2", V2_ROOT
            if "cpu" not in _read(V2_ROOT / "cgroup.subtree_control").split():
                write(V2_ROOT / "cgroup.subtree_control", "+cpu")
            self.dir = V2_ROOT / name
            self._mkdir()
            self._set([("cpu.max", f"{quota_us} {period_us}")])
        else:
            raise QuotaUnavailable("no cgroup cpu controller (neither /sys/fs/cgroup/cpu/cpu.cfs_quota_us nor a "
                                   "cgroup v2 'cpu' controller)")
        self.share = quota_us / period_us
        self.period_us = period_us
        self.pids: list[int] = []

    def _mkdir(self) -> None:
        try:
            self.dir.mkdir(exist_ok=True)
        except OSError as e:
            raise QuotaUnavailable(f"cannot create {self.dir}: {e.strerror or e}") from e

    def _set(self, files: list[tuple[str, str]]) -> None:
        try:
            for f, v in files:
                write(self.dir / f, v)
        except QuotaUnavailable:
            self.dir.rmdir()
            raise

    def add(self, pid: int) -> None:
        """Moves pid and its descendants (all their threads) into the group."""
        for p in tree(pid):
            write(self.dir / "cgroup.procs", str(p))
            self.pids.append(p)

    def throttled(self) -> tuple[int, int]:
        """(periods, periods throttled) so far, from cpu.stat."""
        stat = dict(ln.split() for ln in _read(self.dir / "cpu.stat").splitlines() if len(ln.split()) == 2)
        return int(stat.get("nr_periods", 0)), int(stat.get("nr_throttled", 0))

    def remove(self) -> None:
        """Moves the processes back to the root group and removes the group (never raises)."""
        for p in tree_all(self.dir):
            try:
                (self.root / "cgroup.procs").write_text(str(p))
            except OSError:
                pass
        try:
            self.dir.rmdir()
        except OSError:
            pass


def tree_all(group: Path) -> list[int]:
    return [int(x) for x in _read(group / "cgroup.procs").split()]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def quotas(pids: dict[str, int], share: float, period_us: int) -> dict[str, CpuQuota]:
    """One group per proxy (target → its quota); on a failure, the groups made so far are removed
    and QuotaUnavailable raised."""
    made: dict[str, CpuQuota] = {}
    try:
        for target, pid in pids.items():
            q = CpuQuota(f"mlxgate-bench-{os.getpid()}-{target}", share, period_us)
            made[target] = q
            q.add(pid)
    except QuotaUnavailable:
        for q in made.values():
            q.remove()
        raise
    return made

