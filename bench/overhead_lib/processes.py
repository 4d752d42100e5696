"""The processes under test: starting and stopping them (`Procs`), their configurations (mlxgate,
mlxgate-full, nginx, LiteLLM), and reading their CPU time, RSS and involuntary switches from /proc."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from . import settings
from .settings import (
    CLIENT_KEY, GATEWAYS, GATEWAY_FULL_PORT, HOST, LITELLM_PORT, LITELLM_VENV, LOAD_CPU, Mode, NEVER_REFUSING,
    NGINX_PORTS, PORTKEY_PORT, PORTKEY_SERVER, PROXY_CPU, QWEN_TOKENIZER_DIR, SIM_PORTS, TARGETS,
    TINY_TOKENIZER_DIR, log,
)
from .targets import base_url, chat_body, process_of, route_headers


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is not "in use"
        try:
            s.bind((HOST, port))
            return True
        except OSError:
            return False


def http_get(url: str, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            r.read()
            return r.status
    except Exception:  # noqa: BLE001 - any failure means "not ready yet"
        return 0


def http_text(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def http_post(url: str, body: dict, headers: dict | None = None, timeout: float = 30.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except Exception as e:  # noqa: BLE001
        return 0, str(e).encode()


class Procs:
    """The processes this run started; all stopped at the end, by their own pids."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, cmd: list[str], cpu: str, env: dict | None = None) -> subprocess.Popen:
        out = open(self.workdir / f"{name}.log", "wb")
        full_env = dict(os.environ, **(env or {}))
        p = subprocess.Popen(["taskset", "-c", cpu, *cmd], stdout=out, stderr=subprocess.STDOUT,
                             env=full_env, cwd=self.workdir, start_new_session=True)
        self.procs[name] = p
        return p

    def wait_ready(self, name: str, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            p = self.procs[name]
            if p.poll() is not None:
                raise SystemExit(f"{name} exited ({p.returncode}); see {self.workdir / (name + '.log')}")
            if http_get(url) == 200:
                return
            time.sleep(0.2)
        raise SystemExit(f"{name} not ready at {url} after {timeout}s; see {self.workdir / (name + '.log')}")

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def proxy_pid(self, target: str) -> int | None:
        """The pid of a proxy under test (a face's: its gateway's); None for direct (nothing of ours
        in between)."""
        return None if target == "direct" else self.pid(process_of(target))

    def stop_all(self) -> None:
        for name, p in reversed(list(self.procs.items())):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)  # its own session: only what it started
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def tree(pid: int) -> list[int]:
    """pid and its descendants (nginx's worker, LiteLLM's children)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def process_cpu_ns(pid: int) -> int:
    """ns on CPU of one process, all its threads: the kernel's per-process CPU clock
    (clock_getcpuclockid's clock: the scheduler's sum_exec_runtime summed over every thread of the
    process, threads that have exited included); where that clock cannot be read, the sum of its
    live threads' /proc/PID/task/TID/schedstat (exited threads then missing)."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2)  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
    except OSError:
        pass
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for t in tasks:
        try:
            total += int(Path(f"/proc/{pid}/task/{t}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


def cpu_seconds(pid: int | None) -> float:
    """CPU time of pid and its descendants, in seconds (ns resolution); 0 for no pid."""
    return sum(process_cpu_ns(p) for p in tree(pid)) / 1e9 if pid else 0.0


def rss_kib(pid: int | None) -> int:
    """VmRSS of pid and its descendants, in KiB; 0 for no pid."""
    total = 0
    for p in tree(pid) if pid else []:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total


def preempted(pid: int | None) -> int:
    """Involuntary context switches of pid's threads and its descendants' (other jobs taking its CPU)."""
    total = 0
    for p in tree(pid) if pid else []:
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                for line in Path(f"/proc/{p}/task/{t}/status").read_text().splitlines():
                    if line.startswith("nonvoluntary_ctxt_switches:"):
                        total += int(line.split()[1])
            except OSError:
                continue
    return total


def pin(pid: int | None, cpu: str) -> None:
    """Moves every thread of pid and its descendants to `cpu` (taskset -a -p)."""
    for p in tree(pid) if pid else []:
        subprocess.run(["taskset", "-a", "-p", "-c", cpu, str(p)], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)


def cpu_times(cpu: str) -> tuple[int, int]:
    """(busy, total) jiffies of one CPU from /proc/stat (idle and iowait are not busy)."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{cpu} "):
            v = [int(x) for x in line.split()[1:]]
            total = sum(v[:8])  # guest time is already counted in user
            return total - v[3] - v[4], total
    return 0, 0


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of the time a CPU was busy between two cpu_times readings."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else float("nan")


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def choose_tokenizer() -> dict:
    """The tokenizer mlxgate-full counts with: Qwen3.6's when .cache/qwen3.6-tokenizer is there,
    else the tiny model's, with a printed warning (its figures understate counting)."""
    if (QWEN_TOKENIZER_DIR / "tokenizer.json").is_file():
        return {"dir": str(QWEN_TOKENIZER_DIR), "fallback": False, "short": "Qwen3.6's 248k-token tokenizer",
                "what": "Qwen3.6's tokenizer (248k-token vocabulary) and Qwen3's chat template "
                        "(`.cache/qwen3.6-tokenizer`, built by `scripts/setup-backends tokens`)"}
    if not (TINY_TOKENIZER_DIR / "tokenizer.json").is_file():
        raise SystemExit(f"mlxgate-full needs a tokenizer: neither {QWEN_TOKENIZER_DIR} nor {TINY_TOKENIZER_DIR} "
                         "has a tokenizer.json (run bench/setup)")
    log(f"WARNING: {QWEN_TOKENIZER_DIR} is missing (scripts/setup-backends tokens builds it): mlxgate-full "
        f"counts with the tiny model's tokenizer in {TINY_TOKENIZER_DIR}, which understates what counting costs")
    return {"dir": str(TINY_TOKENIZER_DIR), "fallback": True, "short": "the tiny model's 433-token tokenizer",
            "what": "the tiny generated model's tokenizer (433-token vocabulary) and its one-line ChatML template "
                    "(`.cache/tiny-qwen3`) — **a fallback**: Qwen3.6's could not be built, so the features-on "
                    "cost and mlxgate-full's RSS are understated"}


def gateway_yaml(port: int, full: bool, tokenizer: str, routes: list[str] | None = None,
                 one_thread: bool = True) -> str:
    """mlxgate's config; `full`: auth with one client under limits that never refuse, and a
    context cap with `tokenizer` (a model directory) on every model, so every prompt is counted.
    `routes`: the simulators it has a model for (default: all of SIM_PORTS). `one_thread`:
    `worker_threads: 1`, one event loop as nginx's one worker (the "before" binaries predate
    the key and run tokio's thread per core)."""
    routes = list(SIM_PORTS) if routes is None else routes
    lines = [
        f"listen: {HOST}:{port}",
        f"access_log: {'true' if settings.ACCESS_LOG else 'false'}",
        "max_connections_per_client: 4096   # the bench's 1000 streams come from one address",
    ]
    if one_thread:
        lines.append("worker_threads: 1   # one event loop, as nginx's one worker")
    if full:
        lines += ["auth: required", "rate_limit_store: memory", "clients:",
                  f"  bench: {{key_sha256: {hashlib.sha256(CLIENT_KEY.encode()).hexdigest()}, "
                  f"limits: {NEVER_REFUSING}}}"]
    lines.append("backends:")
    for route in routes:
        lines += [f"  sim-{route}:", f"    url: http://{HOST}:{SIM_PORTS[route]}", "    max_concurrency: 2048"]
        if full:
            lines.append("    context_cap: 32768")
    lines.append("models:")
    for route in routes:
        lines += [f"  {route}:", f"    backend: sim-{route}", "    max_queue: 4096"]
        if full:
            lines.append(f"    tokenizer: {tokenizer}")
    return "\n".join(lines) + "\n"


def nginx_conf(workdir: Path) -> str:
    servers = []
    for route, port in NGINX_PORTS.items():
        servers.append(f"""
    upstream sim_{route} {{
        server {HOST}:{SIM_PORTS[route]};
        keepalive 128;
    }}
    server {{
        listen {HOST}:{port} reuseport;
        location / {{
            proxy_pass http://sim_{route};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}""")
    return f"""# generated by bench/overhead: a plain reverse proxy, one worker (one CPU)
daemon off;
worker_processes 1;
worker_rlimit_nofile 16384;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log {f"{workdir}/nginx-access.log" if settings.ACCESS_LOG else "off"};
    client_body_temp_path {workdir}/nginx-tmp/body;
    proxy_temp_path {workdir}/nginx-tmp/proxy;
    fastcgi_temp_path {workdir}/nginx-tmp/fastcgi;
    uwsgi_temp_path {workdir}/nginx-tmp/uwsgi;
    scgi_temp_path {workdir}/nginx-tmp/scgi;
    keepalive_requests 1000000;
    tcp_nodelay on;
{''.join(servers)}
}}
"""


def litellm_yaml() -> str:
    lines = ["model_list:"]
    for route, port in SIM_PORTS.items():
        lines += [f"  - model_name: {route}", "    litellm_params:", f"      model: openai/{route}",
                  f"      api_base: http://{HOST}:{port}/v1", "      api_key: sk-bench"]
    lines += ["litellm_settings:", "  telemetry: false", "  turn_off_message_logging: true"]
    return "\n".join(lines) + "\n"


def sim_command(route: str, mode: Mode) -> list[str]:
    """The zero-delay mlxgate-sim of one of SIM_PORTS' routes, as `mode` sizes its answers."""
    speedup = ",".join(str(k) for k in range(1, 2049))
    flags = {
        "fast": ["--tokens", "1"],
        "stream": ["--tokens", str(mode.stream_chunks), "--tokens-per-second", "50", "--speedup", speedup],
        "slow": ["--tokens", str(mode.many_chunks), "--tokens-per-second", "10", "--speedup", speedup],
    }[route]
    return [str(settings.RELEASE / "mlxgate-sim"), "--host", HOST, "--port", str(SIM_PORTS[route]),
            "--ttft-ms", "0", *flags]


def start_all(procs: Procs, workdir: Path, mode: Mode, tokenizer: str) -> None:
    for route in SIM_PORTS:
        procs.start(f"sim-{route}", sim_command(route, mode), LOAD_CPU)
    for route, port in SIM_PORTS.items():
        procs.wait_ready(f"sim-{route}", f"http://{HOST}:{port}/v1/models", 20)

    for name, port in GATEWAYS.items():
        config = workdir / f"{name}.yaml"
        config.write_text(gateway_yaml(port, full=name == "mlxgate-full", tokenizer=tokenizer,
                                       one_thread=name != "mlxgate-before"))
        bin_dir = settings.BEFORE_RELEASE if name == "mlxgate-before" else settings.RELEASE
        procs.start(name, [str(bin_dir / "mlxgate"), "serve", "--config", str(config)], PROXY_CPU)
    for name, port in GATEWAYS.items():
        procs.wait_ready(name, f"http://{HOST}:{port}/health", 20)

    for d in ["body", "proxy", "fastcgi", "uwsgi", "scgi"]:
        (workdir / "nginx-tmp" / d).mkdir(parents=True, exist_ok=True)
    (workdir / "nginx.conf").write_text(nginx_conf(workdir))
    procs.start("nginx", [nginx_binary(), "-p", str(workdir), "-c", str(workdir / "nginx.conf")], PROXY_CPU)
    procs.wait_ready("nginx", f"http://{HOST}:{NGINX_PORTS['fast']}/v1/models", 20)

    (workdir / "litellm.yaml").write_text(litellm_yaml())
    procs.start("litellm", [str(LITELLM_VENV / "bin" / "litellm"), "--config", str(workdir / "litellm.yaml"),
                            "--host", HOST, "--port", str(LITELLM_PORT), "--num_workers", "1"], PROXY_CPU,
                env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR",
                     "LITELLM_TELEMETRY": "False", "NO_DOCS": "True"})
    if "portkey" in TARGETS:
        # --headless and NODE_ENV=production: no log UI, no request log kept for it.
        procs.start("portkey", ["node", str(PORTKEY_SERVER), f"--port={PORTKEY_PORT}", "--headless"], PROXY_CPU,
                    env={"NODE_ENV": "production"})
    procs.wait_ready("litellm", f"http://{HOST}:{LITELLM_PORT}/health/liveliness", 180)
    if "portkey" in TARGETS:
        procs.wait_ready("portkey", f"http://{HOST}:{PORTKEY_PORT}/", 60)

    for target in TARGETS:
        port, path = base_url(target, "fast")
        status, body = http_post(f"http://{HOST}:{port}{path}", chat_body("fast", False), route_headers(target, "fast"))
        if status != 200:
            raise SystemExit(f"{target}: a chat request answered {status}: {body[:300]!r}")
    check_full_guards_the_door(procs, tokenizer)


def check_full_guards_the_door(procs: Procs, tokenizer: str) -> None:
    """mlxgate-full really checks the key and really has the model's tokenizer: fail otherwise."""
    url = f"http://{HOST}:{GATEWAY_FULL_PORT}/v1/chat/completions"
    status, body = http_post(url, chat_body("fast", False))
    if status != 401:
        raise SystemExit(f"mlxgate-full answered a request without its key with {status}, not 401: {body[:300]!r}")
    text = (procs.workdir / "mlxgate-full.log").read_text(errors="replace")
    if "no tokenizer found" in text or "cannot load" in text or tokenizer not in text:
        raise SystemExit(f"mlxgate-full did not load the tokenizer of {tokenizer}: see "
                         f"{procs.workdir / 'mlxgate-full.log'}")


def prompts_counted(port: int) -> int:
    """How many prompts a gateway counted (mlxgate_prompt_count_seconds' observations)."""
    text = http_text(f"http://{HOST}:{port}/metrics")
    return sum(int(float(ln.rsplit(" ", 1)[1])) for ln in text.splitlines()
               if ln.startswith("mlxgate_prompt_count_seconds_count"))


def nginx_binary() -> str:
    return shutil.which("nginx") or "/usr/sbin/nginx"
