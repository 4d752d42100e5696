"""What the run is made of: paths, ports, the targets, how long each phase runs (`Mode`), and `log`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent.parent


# Where mlxgate and mlxgate-sim are; `--bin-dir` sets it before anything starts.
RELEASE = ROOT / "target" / "release"


# `--before-bin-dir`: a second copy of mlxgate (the "before" of a change) measured beside the
# first in every phase mlxgate is, same config, its own port; None: not run.
BEFORE_RELEASE: Path | None = None


LITELLM_VENV = ROOT / ".venv-litellm"


# Portkey's gateway (npm @portkey-ai/gateway), installed by bench/setup with `npm install --prefix`.
# Its @hono/node-server is pinned to 1.13.8 (package.json `overrides`): 1.19.x hands a proxied
# stream's upstream headers through as-is, and appending Portkey's own headers to them throws
# "immutable" on Node 20, so every streamed request fails with a 500.
PORTKEY_DIR = ROOT / ".cache" / "portkey-gateway"


PORTKEY_VERSION = "1.15.2"


PORTKEY_SERVER = PORTKEY_DIR / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"


# mlxgate's access log (on by default in gateway.yaml) and nginx's `access_log`: both on or both
# off (`--access-log`), so neither proxy is measured without the line the other writes.
ACCESS_LOG = True


# `--proxy-quota`: the rate phase puts each proxy in a cgroup with this share of one CPU, so the
# proxy, not wrk and the simulator on the other CPU, is what bounds the rate. 0: no quota.
PROXY_QUOTA = 0.25


# The quota's period: short, so a throttled proxy stalls for at most (1 − quota) × period (the
# kernel's smallest quota, 1 ms, makes it 4 ms at 25%).
QUOTA_PERIOD_US = 4000


# mlxgate-full counts prompts with a real model's tokenizer and chat template: Qwen3.6's
# 248k-token vocabulary and Qwen3's template (scripts/make-qwen-tokenizer, run by
# `scripts/setup-backends tokens`, which bench/setup runs when the directory is missing). The tiny
# generated model's (scripts/make-tiny-model.py) is the fallback, with a warning: its 433-token
# vocabulary and one-line template understate what counting costs.
QWEN_TOKENIZER_DIR = ROOT / ".cache" / "qwen3.6-tokenizer"


TINY_TOKENIZER_DIR = ROOT / ".cache" / "tiny-qwen3"


HOST = "127.0.0.1"


PROXY_CPU = "0"


LOAD_CPU = "1"


P99_BUDGET_US = 5000.0


# Three simulators: `fast` answers at once (one token, ttft 0; streamed too, for the time to the
# first chunk); `stream` sends content chunks 20 ms apart; `slow` sends chunks 100 ms apart (the
# 1000-stream run). `--speedup 1,2,...,N` keeps every stream at its own pace however many run at
# once (the sim otherwise shares its tokens/s among the active requests, as a GPU would).
SIM_PORTS = {"fast": 19400, "stream": 19404, "slow": 19405}


GATEWAY_PORT = 19401


GATEWAY_FULL_PORT = 19406


NGINX_PORTS = {"fast": 19402, "stream": 19412, "slow": 19422}


LITELLM_PORT = 19403


GATEWAY_BEFORE_PORT = 19407


PORTKEY_PORT = 19408


# mlxgate-full's one client (its key is sent by wrk and the stream clients as a Bearer token).
CLIENT_KEY = "sk-bench-overhead-0123456789abcdef"


NEVER_REFUSING = "{rpm: 1000000000, tpm: 4000000000, concurrency: 100000}"


# The paths measured. `configure` fills these lists in place (the other modules import the list
# objects themselves): mlxgate-before with `--before-bin-dir`, portkey when it is installed.
TARGETS: list[str] = []


PROXIES: list[str] = []


GATEWAYS: dict[str, int] = {}


# mlxgate-full is only compared with mlxgate at concurrency 1 (latency, stream TTFB, the long prompt).
LOAD_TARGETS: list[str] = []


MANY_TARGETS: list[str] = []  # one LiteLLM worker (or one node process) does not keep 1000 streams


# The gateways whose faces are compared (the chat face, and the Responses and Anthropic faces
# that re-encode every chunk): a target "mlxgate:responses" is the mlxgate process on that face.
FACES = ["chat", "responses", "messages"]


FACE_GATEWAYS: list[str] = []


def configure(before: bool, portkey: bool) -> None:
    """Which targets this run (or the saved run being rendered) has."""
    TARGETS[:] = ["direct", "mlxgate", *(["mlxgate-before"] if before else []), "mlxgate-full", "nginx", "litellm",
                  *(["portkey"] if portkey else [])]
    PROXIES[:] = [t for t in TARGETS if t != "direct"]
    GATEWAYS.clear()
    GATEWAYS.update({"mlxgate": GATEWAY_PORT, **({"mlxgate-before": GATEWAY_BEFORE_PORT} if before else {}),
                     "mlxgate-full": GATEWAY_FULL_PORT})
    LOAD_TARGETS[:] = [t for t in TARGETS if t != "mlxgate-full"]
    MANY_TARGETS[:] = ["direct", "mlxgate", *(["mlxgate-before"] if before else []), "nginx"]
    FACE_GATEWAYS[:] = ["mlxgate", *(["mlxgate-before"] if before else [])]


configure(before=False, portkey=False)


# The slow targets: fewer stream rounds (each takes minutes at their pace).
SLOW_TARGETS = ["litellm", "portkey"]


@dataclass
class Mode:
    """How long each part runs."""

    latency_rounds: int
    latency_seconds: int
    ttfb_seconds: int
    rate_rounds: int
    rate_seconds: int
    rate_conns: list[int]
    stream_rounds: int
    litellm_stream_rounds: int
    streams: int
    stream_chunks: int
    many_rounds: int
    many_streams: int
    many_chunks: int
    perf_seconds: int
    pin_rounds: int
    face_rounds: int
    long_rounds: int
    long_seconds: int
    soak_minutes: float = 0.0


FULL = Mode(latency_rounds=5, latency_seconds=5, ttfb_seconds=3, rate_rounds=3, rate_seconds=3,
            rate_conns=[1, 4, 16, 32, 64], stream_rounds=4, litellm_stream_rounds=1, streams=256,
            stream_chunks=128, many_rounds=3, many_streams=1000, many_chunks=100, perf_seconds=8, pin_rounds=3,
            face_rounds=3, long_rounds=3, long_seconds=3, soak_minutes=10)


QUICK = Mode(latency_rounds=2, latency_seconds=2, ttfb_seconds=2, rate_rounds=1, rate_seconds=2,
             rate_conns=[1, 4, 16, 64], stream_rounds=2, litellm_stream_rounds=1, streams=256, stream_chunks=64,
             many_rounds=1, many_streams=1000, many_chunks=40, perf_seconds=3, pin_rounds=2, face_rounds=2,
             long_rounds=2, long_seconds=1)


# The soak's steady mixed traffic through mlxgate-full (the features on: auth, the limiter's
# store, counting — where per-request state would pile up): wrk on a few connections, and streams
# started at a steady rate; its RSS sampled every 10 s.
SOAK_TARGET = "mlxgate-full"


SOAK_CONNS = 2


SOAK_STREAMS_PER_S = 10


SOAK_SAMPLE_S = 10


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)
