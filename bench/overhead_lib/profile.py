"""`perf` profiles of the gateways, grouped by where the time goes."""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

from .load import run_streams, wrk
from .processes import Procs, cpu_seconds
from .settings import Mode, log


# "Where the time goes": each sample goes to one group. A sample in the kernel goes to the system
# call it is in (a loopback send includes delivering the segment to the peer's socket and waking
# the peer); a user-space one by its own symbol (the release build has no frame pointers, so
# user stacks are one or two frames deep), looking one frame up when the leaf is a generic helper.
USER_GROUPS = [
    ("metrics / labels", r"mlxgate::metrics|prometheus|[Hh]istogram|label"),
    ("token counting (tokenizer, chat template)", r"mlxgate::tokens|tokenizers::|minijinja|onig|fancy_regex|"
                                                  r"regex|aho_corasick|unicode_normalization|"
                                                  r"^match_at$|^forward_search"),  # Oniguruma's matcher
    ("rate limits / auth", r"mlxgate::limits|mlxgate::auth"),
    ("allocation (mimalloc)", r"^_?mi_|malloc|free\b|__rust_alloc|__rust_dealloc|__rdl_|raw_vec|RawVec"),
    ("JSON (serde_json, its IndexMap)", r"serde_json|serde::|serde_core|ryu::|itoa::|indexmap"),
    ("HTTP headers / URIs", r"http::header|HeaderMap|HeaderName|HeaderValue|HdrName|http::uri|http::method|"
                            r"httparse|hyper::proto::h1::role|http::extensions"),
    ("hash maps / hashing", r"hashbrown|core::hash|hash_one|sip::|DefaultHasher"),
    ("string formatting (fmt)", r"core::fmt|alloc::fmt|flt2dec|fmt::Write|format_inner"),
    ("hyper / axum / tower plumbing", r"hyper|axum|tower|matchit|http_body|bytes::"),
    ("tokio / wake-ups / timers", r"tokio::|futures|mio::|parking_lot|std::sync|std::thread|clock_gettime|"
                                  r"pthread|__lll_|Waker|wake"),
    ("tracing / logging", r"tracing"),
    ("SSE meter (mlxgate::stream)", r"mlxgate::stream"),
    ("mlxgate's own code", r"mlxgate::"),
]


GENERIC = r"memmove|memcpy|memset|memcmp|bcmp|\[unknown\]|drop_in_place|from_utf8|clone"


SYSCALL_GROUPS = [
    ("kernel: send (loopback TCP to the peer, waking it)", r"writev|sendto|sendmsg|^write$"),
    ("kernel: receive", r"readv|recvfrom|recvmsg|^read$"),
    ("kernel: epoll", r"epoll"),
    ("kernel: futex (thread wake-ups)", r"futex"),
    ("kernel: connections (accept, close, setsockopt)", r"accept|close|socket|setsockopt|getsockopt|"
                                                         r"shutdown|getpeername|getsockname|connect"),
]


def classify(frames: list[tuple[str, bool]]) -> str:
    """frames: (symbol, in kernel) from the leaf up."""
    if frames and frames[0][1]:
        for sym, kernel in frames:
            m = re.match(r"(?:__x64_sys_|__se_sys_|__do_sys_|ksys_|do_)(\w+)", sym) if kernel else None
            if m:
                name = m.group(1)
                for group, rx in SYSCALL_GROUPS:
                    if re.search(rx, name):
                        return group
        if any(s.startswith("entry_SYSCALL") for s, _ in frames):
            return "kernel: other system calls"
        return "kernel: interrupts, faults, other"
    for depth, (sym, _) in enumerate(frames[:3]):
        for group, rx in USER_GROUPS:
            if re.search(rx, sym):
                return group
        if depth == 0 and not re.search(GENERIC, sym):
            break
    leaf = frames[0][0] if frames else "?"
    if re.search(r"memmove|memcpy|memset|memcmp|bcmp", leaf):
        return "memory copies (caller unknown)"
    return "other user space"


def perf_groups(data: Path) -> dict[str, float]:
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip,sym,dso"], capture_output=True,
                            text=True, timeout=600).stdout
    counts: dict[str, int] = {}
    total = 0
    for block in script.split("\n\n"):
        frames = []
        for ln in block.strip().splitlines():
            m = re.match(r"\s*[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$", ln)
            if m:
                sym = re.sub(r"\+0x[0-9a-f]+$", "", m.group(1))
                frames.append((sym, "kernel" in m.group(2)))
        if frames:
            g = classify(frames)
            counts[g] = counts.get(g, 0) + 1
            total += 1
    return {g: 100.0 * n / total for g, n in sorted(counts.items(), key=lambda kv: -kv[1])} if total else {}


def perf_profile(procs: Procs, workdir: Path, target: str, name: str, unit: str,
                 load: Callable[[], tuple[int, dict]]) -> dict:
    """`perf record -g` on a gateway while `load` runs; load returns (units of work it did, its
    figures). The top symbols by self time, the samples by group, and CPU per unit under perf."""
    pid = procs.pid(target)
    data = workdir / f"perf-{name}.data"
    rec = subprocess.Popen(["perf", "record", "-g", "-F", "1999", "-p", str(pid), "-o", str(data)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)  # perf attaches to every thread
        cpu0 = cpu_seconds(pid)
        units, figures = load()
        cpu = cpu_seconds(pid) - cpu0
    finally:
        rec.send_signal(signal.SIGINT)
        _, err = rec.communicate(timeout=120)
    if not data.exists():
        return {"skipped": f"perf record failed: {err.strip()[-300:]}"}
    report = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", "dso,symbol",
                             "--stdio", "-g", "none", "--percent-limit", "0.01"],
                            capture_output=True, text=True, timeout=300).stdout
    (workdir / f"perf-{name}-report.txt").write_text(report)
    rows = []
    for ln in report.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[([k.])\]\s+(.*)$", ln)
        if m:
            rows.append({"pct": float(m.group(1)), "dso": m.group(2), "kernel": m.group(3) == "k",
                         "symbol": re.split(r"\s{2,}", m.group(4).strip())[0]})
    groups = perf_groups(data)
    per_unit = cpu / max(1, units) * 1e6
    log(f"  {units} {unit}s, {per_unit:.1f} us CPU per {unit}; groups: "
        + ", ".join(f"{k} {v:.1f}%" for k, v in groups.items()))
    return {"top": rows[:15], "groups": groups, "load": figures, "unit": unit, "units": units,
            "cpu_s": cpu, "cpu_us_per_unit": per_unit}


def measure_profiles(procs: Procs, workdir: Path, mode: Mode, res: dict) -> None:
    """Where mlxgate's CPU goes: saturated (wrk -c32), at concurrency 1 (and mlxgate-full there,
    for what the features cost), and per streamed chunk."""
    if shutil.which("perf") is None:
        res["notes"].append("perf not installed: no profiles")
        return
    for key, target, conns in [("profile", "mlxgate", 32), ("profile_c1", "mlxgate", 1),
                               ("profile_full_c1", "mlxgate-full", 1)]:
        log(f"perf record -g on {target} (wrk -c{conns}, {mode.perf_seconds}s)")

        def load(target=target, conns=conns) -> tuple[int, dict]:
            w = wrk(workdir, target, conns, mode.perf_seconds)
            return w["requests"], {**w, "conns": conns}

        res[key] = perf_profile(procs, workdir, target, f"{target}-c{conns}", "request", load)
    log(f"perf record -g on mlxgate ({mode.streams} streams x {mode.stream_chunks} chunks)")

    def streams() -> tuple[int, dict]:
        s = asyncio.run(run_streams("mlxgate", "stream", mode.streams, timeout=mode.stream_chunks * 0.02 * 6 + 60))
        return s["content_chunks"], {k: v for k, v in s.items() if k != "errors"}

    res["profile_streams"] = perf_profile(procs, workdir, "mlxgate", "streams", "chunk", streams)
