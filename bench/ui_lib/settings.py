"""What a run is made of: the ports and CPUs (bench/overhead's), the browser, the defaults."""

from __future__ import annotations

from overhead_lib.settings import GATEWAY_PORT, HOST, LOAD_CPU, PROXY_CPU, ROOT, SIM_PORTS

__all__ = ["GATEWAY_PORT", "HOST", "LOAD_CPU", "PROXY_CPU", "ROOT", "SIM_PORTS"]

# The page runs beside the load (the stream clients and the simulator), never on the gateway's CPU.
BROWSER_CPU = LOAD_CPU

CHROMIUM = "/usr/bin/chromium"

CHROMEDRIVER = "/usr/bin/chromedriver"

# The gateway (bench/overhead's `mlxgate`) and the simulator it proxies (bench/overhead's `stream`).
GATEWAY = "mlxgate"

ROUTE = "stream"

# The rate phase's simulator (one token, at once) and wrk's connections: one, so the gateway is
# not saturated and its CPU per request does not hang on how much each wake-up batches.
FAST_ROUTE = "fast"

RATE_CONNS = 1

RATE_SECONDS = 5

RATE_ROUNDS = 3

# `none` (no follower), `page` (the real page), `feed` (curl on /ui/events: the feed without a browser).
VARIANTS = ["none", "page", "feed"]

DEFAULT_VARIANTS = ["none", "page"]

ROUNDS = 6

STREAMS = 256

CHUNKS = 128

# The page keeps this many activity rows (ui/app.js `Activity.max`, src/activity.rs REQUESTS).
ACTIVITY_MAX = 500

# Each stream round's CPU window runs this long past the last stream's end, in both variants, so
# the feed's events written just after the last chunk are counted.
SETTLE_S = 1.0

# After the page is live, this long for its first render (state, the 200-request backlog).
PAGE_SETTLE_S = 2.0

# After a bare feed follower got its backlog.
FEED_SETTLE_S = 0.5

IDLE_SECONDS = 30.0

IDLE_ROUNDS = 2

RESULTS = ROOT / "bench" / "results"
