"""What the run is made of: paths, ports, the targets, how long each phase runs (`Mode`), and `log`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent.parent


# Where mlxgate and mlxgate-sim are; `--bin-dir` sets it before anything starts.
RELEASE = ROOT / "target" / "release"


LITELLM_VENV = ROOT / ".venv-litellm"


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


# mlxgate-full's one client (its key is sent by wrk and the stream clients as a Bearer token).
CLIENT_KEY = "sk-bench-overhead-0123456789abcdef"


NEVER_REFUSING = "{rpm: 1000000000, tpm: 4000000000, concurrency: 100000}"


TARGETS = ["direct", "mlxgate", "mlxgate-full", "nginx", "litellm"]


PROXIES = [t for t in TARGETS if t != "direct"]


GATEWAYS = {"mlxgate": GATEWAY_PORT, "mlxgate-full": GATEWAY_FULL_PORT}


# mlxgate-full is only compared with mlxgate at concurrency 1 (latency and stream TTFB).
LOAD_TARGETS = ["direct", "mlxgate", "nginx", "litellm"]


MANY_TARGETS = ["direct", "mlxgate", "nginx"]  # one LiteLLM worker does not keep 1000 streams


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
    soak_minutes: float = 0.0


FULL = Mode(latency_rounds=5, latency_seconds=5, ttfb_seconds=3, rate_rounds=3, rate_seconds=3,
            rate_conns=[1, 2, 4, 8, 16, 32, 64], stream_rounds=4, litellm_stream_rounds=1, streams=256,
            stream_chunks=128, many_rounds=3, many_streams=1000, many_chunks=100, perf_seconds=10, soak_minutes=10)


QUICK = Mode(latency_rounds=2, latency_seconds=2, ttfb_seconds=2, rate_rounds=1, rate_seconds=2,
             rate_conns=[1, 4, 16, 64], stream_rounds=2, litellm_stream_rounds=1, streams=256, stream_chunks=64,
             many_rounds=1, many_streams=1000, many_chunks=40, perf_seconds=4)


# The soak's steady mixed traffic through mlxgate-full (the features on: auth, the limiter's
# store, counting — where per-request state would pile up): wrk on a few connections, and streams
# started at a steady rate; its RSS sampled every 10 s.
SOAK_TARGET = "mlxgate-full"


SOAK_CONNS = 2


SOAK_STREAMS_PER_S = 10


SOAK_SAMPLE_S = 10


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)
