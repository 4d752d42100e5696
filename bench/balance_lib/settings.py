"""What a run is made of: paths, ports, the policies, the simulators' and real servers' settings,
the gateway metrics read for the prediction error, and `log`."""

from __future__ import annotations

import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

# Where mlxgate and mlxgate-sim are; `--bin-dir` sets it before anything starts.
BIN_DIR = ROOT / "target" / "release"

HOST = "127.0.0.1"
GATEWAY_PORT = 19600
BACKEND_PORTS = {"a": 19610, "b": 19611}
PUBLIC_MODEL = "agent"

# The policies compared, in the report's order (gateway.yaml's `balance: {policy: …}`).
POLICIES = ["cache_aware", "least_loaded", "round_robin", "session"]

# A pseudo-policy (`--policies single`): the model served by backend `a` alone (`backend: a`).
SINGLE = "single"

# Requests a backend runs at once (the gateway's max_concurrency, the simulator's capacity).
MAX_CONCURRENCY = 2

# Tokens per answer: the workload's answers are replayed, so the generated ones are thrown away;
# few, so that prefill dominates as it does for agents.
MAX_TOKENS = 8

# The simulators (mlxgate-sim in mlx_lm.server's style, with its LRU prompt cache): prefill time
# per uncached token (a Mac's few thousand tokens/s, scaled down so that a run is short), decode
# speed, and the aggregate speedup of two requests decoded together.
SIM_PREFILL_MS_PER_TOKEN = 0.5
SIM_TOKENS_PER_SECOND = 100
SIM_SPEEDUP = "1,1.6"
SIM_TTFT_MS = 5

# The real servers (`--real`): mlx_lm.server on a random-weight Qwen3 larger than the tests' tiny
# one, so that prefill time shows on a CPU, with the tiny model's tokenizer (one token per
# workload word) and its 2048-token context (the workload's last prompts stay under ~1800).
REAL_MODEL_DIR = ROOT / ".cache" / "models" / "balance-h512-l8"
REAL_MODEL_ARGS = ["--hidden-size", "512", "--layers", "8", "--intermediate-size", "1536", "--heads", "8",
                   "--kv-heads", "4", "--dtype", "float32"]
MLX_LM_VENV = ROOT / ".venv-mlx-lm"

# mlx_lm.server's default `--prompt-cache-size`; the self-correction run uses a smaller one, so
# that more conversations run at once than one server's cache holds.
PROMPT_CACHE_SIZE = 10
SMALL_PROMPT_CACHE_SIZE = 2

# The gateway's counters of predicted and reported cached tokens per backend (the same answers:
# those of a model of several backends that report cached_tokens), read from /metrics for the
# prediction error of the self-correction run.
PREDICTED_METRIC = "mlxgate_route_predicted_cached_tokens_total"
REPORTED_METRIC = "mlxgate_route_reported_cached_tokens_total"

# How often the metrics are sampled during the self-correction run, in seconds.
METRICS_EVERY_S = 0.5

READY_TIMEOUT_S = 300.0
REQUEST_TIMEOUT_S = 600.0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)
