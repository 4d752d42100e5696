"""What a run is made of: paths, ports, the two models and their servers, the variants, the
agents' schedule, the metric names, and `log`."""

from __future__ import annotations

import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

# The gateway under test (`--mlxgate`) and today's main (`--baseline-mlxgate`, for `before`).
MLXGATE = ROOT / "target" / "release" / "mlxgate"

HOST = "127.0.0.1"
# A range no test uses (the tests' free ports are 20000-32767; bench/balance has 19600-19611).
GATEWAY_PORT = 19700
PORTS = {"coder": 19710, "haiku": 19711}
ALL_PORTS = [GATEWAY_PORT, *PORTS.values()]

# The tiny model both servers load (scripts/setup-backends generates it; the tests use it too).
MODEL_DIR = ROOT / ".cache" / "tiny-qwen3"

# The two models, each on its own managed GPU backend (named after the model), of two kinds:
# model name -> (kind, venv, what its process's command line contains).
MAJORITY, MINORITY = "coder", "haiku"
SERVERS = {
    MAJORITY: ("mlx-lm", ROOT / ".venv-mlx-lm", "mlx_lm.server"),
    MINORITY: ("mlx-openai-server", ROOT / ".venv-mlx-openai-server", "mlx-openai-server"),
}

# `--servers sim`: the same schedule on two `mlxgate-sim` (a check of the harness, quick, no MLX):
# managed `kind: custom` GPU backends, each a shell that sleeps its "start" then becomes the
# simulator; their program in the command line is then mlxgate-sim. `PROGRAMS` is what `servers()`
# looks for (set by the command line).
SIM_START_S = {MAJORITY: 1, MINORITY: 2}
SIM_ARGS = ["--style", "mlx-lm", "--tokens", "32", "--tokens-per-second", "400", "--ttft-ms", "20",
            "--capacity", "2"]
SIM_FOOTPRINTS_MB = {MAJORITY: 64, MINORITY: 64}
PROGRAMS = {m: program for m, (_, _, program) in SERVERS.items()}

# The gateway's terms, the same in every variant (issue 22's schedule).
SWAP_AFTER_S = 5
MAX_WAIT_S = 120
# Room for the side calls that wait while the other model is loaded (a user whose agents send
# background calls sizes max_queue so: 64, the default, is less than a residency's worth here).
MAX_QUEUE = 256
MAX_CONCURRENCY = 2

# The variants, in the report's order: name -> (binary: "baseline" or "new", extra config).
#   before    today's main (a backend is kept swap_after), run by --baseline-mlxgate
#   timer     the same rules run by the new binary (`loading_share: 1.0`), when no baseline is given
#   after     the new binary, default policy (loading ≤ 20 % of a residency and a start)
#   budget    both fit a gpu_memory_budget: side by side, no swap
#   fallback  haiku falls back to coder while coder holds the GPU
VARIANTS = ["before", "timer", "after", "budget", "fallback"]
DEFAULT_VARIANTS = ["before", "after", "budget", "fallback"]

# Footprints written for `budget` (`footprint:` of each backend; the budget is their sum plus a
# margin). Measured once on this machine (Linux, CPU, the tiny model; 2026-12-02, 40 s runs of
# `after` and `budget`): the peak resident memory of each server's process group, 89-93 MiB for
# mlx_lm.server, 1054-1061 MiB for mlx-openai-server (it imports PyTorch), rounded up (the `peak
# RSS` row of every report shows what that run measured).
FOOTPRINTS_MB = {MAJORITY: 128, MINORITY: 1152}
BUDGET_MARGIN_MB = 200

# The agents: six loops for `--seconds`, each sending a streamed chat completion of a short growing
# conversation (reset after TURNS_PER_CONVERSATION turns: the tiny model's context is 2048), 30 % of
# them to the minority model, a think time between turns; all drawn from a seeded RNG per agent.
AGENTS = 6
SECONDS = 180
MINORITY_SHARE = 0.3
THINK_S = (0.5, 2.0)
MAX_TOKENS = 32
TURNS_PER_CONVERSATION = 6
SEED = 22
REQUEST_TIMEOUT_S = 600.0

# How often /admin/backends and the servers' processes are sampled.
SAMPLE_EVERY_S = 0.1

READY_TIMEOUT_S = 30.0

# The gateway's metrics (the baseline's swap counter has no labels; the new one has backend and
# reason; the starting-seconds counter is new).
SWAPS_METRIC = "mlxgate_backend_swaps_total"
STARTING_METRIC = "mlxgate_backend_starting_seconds_total"
FOOTPRINT_METRIC = "mlxgate_backend_footprint_bytes"

# The answer header and the access-log field that say a fallback served the request.
FALLBACK_HEADER = "x-mlxgate-fallback"
FALLBACK_FIELD = "fallback_from"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)
