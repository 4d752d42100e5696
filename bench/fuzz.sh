#!/usr/bin/env bash
# Fuzzes the SSE parser for a bounded time (default 60 s): bench/fuzz.sh [SECONDS]
# Not part of CI's critical path. cargo-fuzz wants nightly; the machine's stable toolchain
# serves with RUSTC_BOOTSTRAP=1. Corpus and crashes stay under fuzz/ (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
command -v cargo-fuzz >/dev/null 2>&1 || cargo install --locked cargo-fuzz
mkdir -p fuzz/corpus/sse
printf 'data: {"choices":[{"delta":{"content":"hi"}}]}\r\n\r\n: keepalive 1/2\n\ndata: [DONE]\n\n' > fuzz/corpus/sse/seed
cd fuzz
RUSTC_BOOTSTRAP=1 cargo fuzz run sse corpus/sse -- -max_total_time="$seconds" -max_len=4096
