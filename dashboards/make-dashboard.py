#!/usr/bin/env python3
"""Writes dashboards/mlxgate.json, the Grafana dashboard of mlxgate, from the panels below.

    python3 dashboards/make-dashboard.py            # rewrites dashboards/mlxgate.json
    python3 dashboards/make-dashboard.py --out F    # writes F instead (the tests compare)

The panels are laid out to answer one question, top to bottom: "why is my agent slow right
now — prefill, the queue, a model swap, or the server degrading?". Every panel says in its
description what to do when it looks wrong. Only the standard library is used.
"""

import json
import pathlib
import sys

DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
# Filters every query takes from the dashboard's variables ("All" is `.*`, which also matches
# the empty label of a request refused before its model was known).
M = 'model=~"$model"'
B = 'backend=~"$backend"'
C = 'client=~"$client"'
RI = "$__rate_interval"
# Event counts drawn as bars: each step counts the events of its own interval (Grafana's step),
# so one restart is one bar of 1, not four overlapping windows.
EI = "$__interval"

panels = []
next_id = iter(range(1, 1000))


def row(title, y):
    panels.append({"type": "row", "id": next(next_id), "title": title, "collapsed": False,
                   "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})


def target(expr, legend, ref):
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, "range": True}


def timeseries(title, description, grid, targets, unit="short", min_zero=True, bars=False, extra=None):
    custom = {"drawStyle": "bars" if bars else "line", "lineWidth": 1, "fillOpacity": 60 if bars else 10,
              "showPoints": "never", "spanNulls": False, "axisSoftMin": 0 if min_zero else None}
    panel = {
        "type": "timeseries", "id": next(next_id), "title": title, "description": description,
        "datasource": DS, "gridPos": grid,
        "targets": [target(e, l, chr(ord("A") + i)) for i, (e, l) in enumerate(targets)],
        "fieldConfig": {"defaults": {"unit": unit, "custom": custom, "color": {"mode": "palette-classic"}},
                        "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
    }
    if extra:
        extra(panel)
    panels.append(panel)


def grid(x, y, w, h=8):
    return {"h": h, "w": w, "x": x, "y": y}


def quantile(q, metric, by, filters, window=RI):
    return (f"histogram_quantile({q}, sum by ({by}, le) "
            f"(rate({metric}_bucket{{{filters}}}[{window}])))")


# ---- Row 1: latency, as the agent feels it ------------------------------------------------
row("Why is my agent slow? Time to first token, queue, decode speed, prompt cache", 0)
timeseries(
    "Time to first token p50 / p95 (streams)",
    "From a request's arrival at the gateway to the first frame carrying generated output, for "
    "streamed requests: queue wait + a swap or cold start if one was needed + the backend's "
    "prefill. When p95 climbs, read across this row: a high queue-wait p95 means too many "
    "requests for the backend's max_concurrency (add concurrency or a backend); an orange "
    "swap or red restart marker at the same minute means the GPU changed hands (raise "
    "swap_after, or stop alternating models); a falling cache hit ratio means long prompts are "
    "prefilled from scratch (an agent's turn after a swap). None of these: the prompts grew "
    "(prefill is linear in their length) — check the prompt tokens/s panel below.",
    grid(0, 1, 12),
    [(quantile(0.5, "mlxgate_time_to_first_token_seconds", "model", f'{M}, {B}, streaming="true"'), "{{model}} p50"),
     (quantile(0.95, "mlxgate_time_to_first_token_seconds", "model", f'{M}, {B}, streaming="true"'), "{{model}} p95")],
    unit="s")
timeseries(
    "Queue wait p95",
    "Time a request waited in its model's queue for a slot at the backend (a cold start or a "
    "swap counts: the slot opens when the backend is ready). Near zero is normal. When it "
    "rises, the backend is saturated: requests arrive faster than max_concurrency lets them "
    "in. Raise max_concurrency if the server batches (mlx_lm.server, vllm-mlx with "
    "--continuous-batching), spread clients with per-client concurrency limits, or add a "
    "backend. If it rises together with swaps, two GPU models are competing for the GPU.",
    grid(12, 1, 12),
    [(quantile(0.95, "mlxgate_queue_wait_seconds", "model", M), "{{model}} p95"),
     (quantile(0.5, "mlxgate_queue_wait_seconds", "model", M), "{{model}} p50")],
    unit="s")
timeseries(
    "Decode speed p50 (tokens/s per stream)",
    "Median decode speed of a stream, measured by the gateway from the arrival of its tokens: "
    "(tokens - 1) / (last token - first token), never from frame counts. A drop with the "
    "same model means the server degrades: memory pressure (swapping to disk), thermal "
    "throttling, or several streams sharing the GPU (compare in-flight). A server that sends "
    "its tokens in bursts gives no sample (see the bursts panel beside).",
    grid(0, 9, 9),
    [(quantile(0.5, "mlxgate_generation_tokens_per_second", "backend", f"{M}, {B}"), "{{backend}} p50")],
    unit="none")
timeseries(
    "Streams in bursts",
    "Streams whose tokens mostly arrived in one read: the server (or a proxy before the "
    "gateway) buffered them, so the client saw nothing and then everything. No decode-speed "
    "sample is taken from them. Steady bursts from one backend: it is buffering its stream "
    "(a proxy with buffering on, or a server that does not flush) — the agent's output "
    "appears in lumps.",
    grid(9, 9, 3),
    [(f"sum by (backend) (increase(mlxgate_stream_bursts_total{{{B}}}[{EI}]))", "{{backend}}")],
    bars=True)
timeseries(
    "Prompt-cache hit ratio",
    "Share of prompt tokens the server took from its prompt cache "
    "(usage.prompt_tokens_details.cached_tokens over usage.prompt_tokens). An agent resends "
    "its whole conversation every turn, so a healthy session stays high. A drop right after "
    "a swap or restart is the cache being lost with the process: the next turns prefill "
    "everything (slow TTFT). A drop without one: the client changed the start of its prompt "
    "(a new system prompt, tool list or date line), or several sessions evict each other "
    "from the cache. Servers that do not report cached tokens (vllm-mlx) show nothing. "
    "Clamped at 100 %: where a counter series begins inside the window, rate()'s extrapolation "
    "can put the quotient a little above 1; mlx-openai-server counts cached tokens outside "
    "prompt_tokens, so it reads 100 % whenever it hits at all.",
    grid(12, 9, 12),
    [(f"clamp_max(sum by (backend) (rate(mlxgate_prompt_cached_tokens_total{{{M}, {B}}}[{RI}])) / "
      f"sum by (backend) (rate(mlxgate_prompt_tokens_total{{{M}, {B}}}[{RI}])), 1)", "{{backend}}")],
    unit="percentunit")

# ---- Row 2: the backends ------------------------------------------------------------------
row("Backends: state, swaps, restarts, load, and what the GPU's time goes to", 17)
STATES = ["stopped", "starting", "ready", "draining", "restarting", "failed"]
state_expr = " + ".join(
    f'(max by (backend) (mlxgate_backend_state{{{B}, state="{s}"}}) * {i})' for i, s in enumerate(STATES))
# Each backend's series joined to mlxgate_backend_info: the legend names the kind of server.
KIND = "* on (backend) group_left (kind) max by (backend, kind) (mlxgate_backend_info)"
COLORS = ["#808080", "#FADE2A", "#73BF69", "#5794F2", "#FF9830", "#F2495C"]


def state_timeline(panel):
    panel["type"] = "state-timeline"
    panel["fieldConfig"]["defaults"] = {
        "color": {"mode": "thresholds"},
        "thresholds": {"mode": "absolute", "steps": [{"color": "#808080", "value": None}]},
        "mappings": [{"type": "value", "options": {
            str(i): {"text": s, "color": COLORS[i], "index": i} for i, s in enumerate(STATES)}}],
        "custom": {"fillOpacity": 80, "lineWidth": 0},
    }
    panel["options"] = {"showValue": "auto", "mergeValues": True, "rowHeight": 0.8,
                        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "single"}}


timeseries(
    "Backend state over time",
    "Each managed backend's phase: stopped (idle or swapped out), starting (spawned, loading "
    "the model and warming up), ready, draining (finishing requests before a stop), restarting "
    "(crashed, waiting out its backoff) and failed (crashed too often: it waits for POST "
    "/admin/backends/NAME/restart). Two GPU backends alternating quickly between starting and "
    "stopped are thrashing: read the share of time spent starting below; lower loading_share, "
    "set gpu_memory_budget, give the small model a fallback, or give one of the models its own "
    "machine. Restarting or failed: read GET /admin/backends/NAME/logs for the server's last "
    "words (out of memory, a missing model file). Each backend is named with its kind of server "
    "(mlx-lm, mlx-openai-server, …): GET /admin/backends lists what the gateway normalises for it.",
    grid(0, 18, 24, 6),
    [(f"({state_expr}) {KIND}", "{{backend}} ({{kind}})")],
    extra=state_timeline)
timeseries(
    "Requests in flight per backend",
    "Requests holding a slot at each backend (from dispatch until their response ends). Flat "
    "at max_concurrency with a growing queue: the backend is the bottleneck. Above 1 on a "
    "server that does not batch (mlx-openai-server, vllm-mlx without --continuous-batching): "
    "streams share the GPU and each one decodes slower. 'Held by an abandoned stream': slots "
    "of streams whose client left, kept until the backend ends them (hold_abandoned, "
    "mlx-openai-server generates on after its client left).",
    grid(0, 24, 6),
    [(f"sum by (backend) (mlxgate_inflight_requests{{{B}}}) {KIND}", "{{backend}} ({{kind}})"),
     (f"sum by (backend) (mlxgate_abandoned_streams_held{{{B}}})", "held by an abandoned stream {{backend}}")])
timeseries(
    "Queue depth per model",
    "Requests waiting for a slot. Requests beyond max_queue get 503 server_overloaded with "
    "Retry-After; waits beyond max_wait too. A queue that never drains: the backend is too "
    "slow for the traffic, or stuck (check its state above and its logs).",
    grid(6, 24, 6),
    [(f"sum by (model) (mlxgate_queue_depth{{{M}}})", "{{model}}")])
timeseries(
    "Restarts and GPU swaps",
    "Restarts of managed backends by reason (crash: the process died; health: it stopped "
    "answering its health check and was restarted) and swaps (one GPU backend stopped so "
    "another could start). Each also marks the latency panels. Restarts in a loop: the server "
    "cannot stay up (memory, a bad flag); swaps every minute: two models are asked for in "
    "turn — why each swap happened and what it cost are in the panels below.",
    grid(12, 24, 6),
    [(f"sum by (backend, reason) (increase(mlxgate_backend_restarts_total{{{B}}}[{EI}]))",
      "restart {{backend}} ({{reason}})"),
     (f"sum(increase(mlxgate_backend_swaps_total[{EI}]))", "swaps")],
    bars=True)
timeseries(
    "Backend start time p95 (last 30 minutes)",
    "Time from spawning a managed server to its readiness, warm-up completion included, over "
    "the starts of the last 30 minutes (starts are rare: a shorter window is mostly empty): what "
    "a cold start or a swap costs the first request that waits for it. It grows with the "
    "model's size and the disk's speed (the first load after a reboot reads from disk; later "
    "ones from the page cache). If it is most of your slow first tokens, avoid the swaps "
    "(swap_after, idle_timeout) rather than the load.",
    grid(18, 24, 6),
    [(f"histogram_quantile(0.95, sum by (backend, le) (increase(mlxgate_backend_start_seconds_bucket{{{B}}}[30m])))",
      "{{backend}} p95")],
    unit="s")

# What the GPU's time goes to when several GPU models share it (swaps costed by their start
# time, several backends side by side within gpu_memory_budget, a fallback model).
LOADING_SHARE = 0.2  # the default loading_share: the line drawn on the loading panel


def threshold_line(value, soft_max):
    """A dashed red line at `value` on a time series, its axis at least up to `soft_max`."""
    def extra(panel):
        defaults = panel["fieldConfig"]["defaults"]
        defaults["thresholds"] = {"mode": "absolute", "steps": [
            {"color": "transparent", "value": None}, {"color": "red", "value": value}]}
        defaults["custom"]["thresholdsStyle"] = {"mode": "dashed"}
        defaults["custom"]["axisSoftMax"] = soft_max
    return extra


STARTING = f"rate(mlxgate_backend_starting_seconds_total{{{B}}}[5m])"
timeseries(
    "Share of time spent starting servers (5 min)",
    "Seconds spent starting managed servers (spawn to ready, failed starts included) per second, "
    "over 5 minutes: the share of the GPU's time that went to loading models instead of "
    "answering. The scheduler keeps a loaded GPU backend long enough that a round trip's two "
    "starts stay within loading_share of the time (default 20 %, the dashed line: 4x the two "
    "starts, less the other's last stay, never less than swap_after). Well above it "
    "for long: swaps cut short by a max_wait (see swaps by reason; raise that model's "
    "max_wait), a crash loop (state timeline), or a load that grew (start time). To spend "
    "less: lower loading_share, set gpu_memory_budget so both models stay loaded side by "
    "side, or give the small model a fallback. Seconds are counted when a start ends, so a "
    "start longer than the window shows as a spike; clamped at 100 %.",
    grid(0, 32, 8),
    [(f"clamp_max(sum({STARTING}), 1)", "all backends"),
     (f"clamp_max(sum by (backend) ({STARTING}), 1)", "{{backend}}")],
    unit="percentunit", extra=threshold_line(LOADING_SHARE, 0.25))
timeseries(
    "GPU swaps per minute by reason",
    "Swaps by the backend stopped and why: no_work (it had nothing to do), due (the other "
    "model's requests had waited swap_after and it had kept the GPU its residency), max_wait "
    "(the other model's oldest request would have missed its max_wait unless its backend "
    "started now: the residency was cut short), stalled (none of its slots moved for "
    "swap_after: long requests held them), backoff (it was in crash backoff, holding no "
    "process). Mostly due and no_work is the scheduler working as meant. Many max_wait: the "
    "max_wait is shorter than a residency plus a start (raise it, or give the model a "
    "fallback). Stalled: answers longer than swap_after hold the GPU (raise swap_after).",
    grid(8, 32, 8),
    [(f"sum by (backend, reason) (rate(mlxgate_backend_swaps_total{{{B}}}[{RI}])) * 60",
      "{{backend}} stopped ({{reason}})")])
timeseries(
    "Requests served by a fallback model",
    "Requests of a model answered by its fallback: the model's backend was not loaded, starting it "
    "would have needed a swap, and the fallback's backend was loaded (such answers carry "
    "x-mlxgate-fallback naming the model that answered; the access line, fallback_from=). "
    "Each one is a swap saved. Clients that must have the model they asked for: remove its "
    "fallback. Fallbacks all the time while its own backend never loads: its traffic is a "
    "minority the fallback serves — as meant for a small fast model.",
    grid(16, 32, 8),
    [(f"sum by (model, fallback) (increase(mlxgate_model_fallbacks_total{{{M}}}[{EI}]))",
      "{{model}} served by {{fallback}}")],
    bars=True)
timeseries(
    "Residency p50 per backend (last 30 minutes)",
    "How long a managed backend's process served, from ready to its stop or crash: the median "
    "over the stops of the last 30 minutes. For two GPU models taking turns it is what each "
    "swap buys. The scheduler keeps a backend at least swap_after and long enough that the "
    "round trip (the other started, then this one again) costs at most loading_share: "
    "(1 - s) / s x both starts (4x at 20 %), less the other's last stay — unless the other "
    "model's max_wait runs out first. Near swap_after with long starts: the max_wait rule cuts "
    "residencies short (swaps by reason). Short after crashes: the server dies (its logs).",
    grid(0, 40, 12),
    [(f"histogram_quantile(0.5, sum by (backend, le) "
      f"(increase(mlxgate_backend_residency_seconds_bucket{{{B}}}[30m])))", "{{backend}} p50")],
    unit="s")
timeseries(
    "Backend memory footprint",
    "The memory each managed backend holds when loaded: its footprint: in gateway.yaml, else "
    "the most resident memory its server's process group was measured holding (every 5 s "
    "while ready; on a Mac the model's Metal buffers count). With gpu_memory_budget set, GPU "
    "backends whose footprints fit the budget together run side by side and no swap happens "
    "between them; one whose footprint is unknown (never measured) runs alone. Two models "
    "that should fit but keep swapping: the sum of these is over the budget (raise it, if the "
    "Mac has the memory, or use smaller quantisations).",
    grid(12, 40, 12),
    [(f"max by (backend) (mlxgate_backend_footprint_bytes{{{B}}})", "{{backend}}")],
    unit="bytes")


# ---- Row 3: traffic -----------------------------------------------------------------------
row("Traffic: requests, outcomes, tokens", 48)
timeseries(
    "Requests by outcome",
    "Requests answered per second by outcome: ok; client_closed (the client left before the "
    "end: agents cancel, or their timeout is shorter than the answer); rate_limited (429); "
    "server_overloaded (503: queue full or max_wait); backend_error, backend_timeout, "
    "stream_error (the server failed, hung, or cut a stream); backend_rejected (the server "
    "refused the request, 4xx); invalid_request_error (a bad request, e.g. over the context "
    "cap). Anything but ok and client_closed rising: read the gateway's log at that minute.",
    grid(0, 49, 12),
    [(f"sum by (outcome) (rate(mlxgate_requests_total{{{M}, {B}, {C}}}[{RI}]))", "{{outcome}}")],
    unit="reqps")
timeseries(
    "Prompt and generation tokens/s",
    "Tokens per second through the gateway, from the backends' usage: prompt tokens "
    "(prefill work) and generated tokens (decode). Prompt tokens/s far above generated is "
    "normal for agents (whole conversations resent each turn) — that is what the prompt "
    "cache saves. Generated tokens/s that falls while requests keep coming: the backends slow "
    "down (see decode speed) or answers are cut short.",
    grid(12, 49, 12),
    [(f"sum by (model) (rate(mlxgate_prompt_tokens_total{{{M}, {B}, {C}}}[{RI}]))", "{{model}} prompt"),
     (f"sum by (model) (rate(mlxgate_generation_tokens_total{{{M}, {B}, {C}}}[{RI}]))", "{{model}} generated")],
    unit="none")

# ---- Row 4: clients, limits, context ------------------------------------------------------
row("Clients, rate limits and context caps", 57)
timeseries(
    "Requests per client",
    "Requests per second by client (the names in gateway.yaml's clients:, or anonymous). "
    "One client far above the others is the one to give a limit (rpm, tpm, concurrency).",
    grid(0, 58, 8),
    [(f"sum by (client) (rate(mlxgate_requests_total{{{M}, {B}, {C}}}[{RI}]))", "{{client}}")],
    unit="reqps")
timeseries(
    "Rate-limited requests per client",
    "429 rate_limit_exceeded per second by client and limit (rpm, tpm, concurrency). Clients "
    "read Retry-After and retry by themselves; steady refusals mean the limit is below what "
    "the client needs (raise it in gateway.yaml and send SIGHUP) or the client is a runaway "
    "agent (leave it limited: that is what the limit is for).",
    grid(8, 58, 8),
    [(f"sum by (client, limit) (rate(mlxgate_rate_limited_total{{{C}}}[{RI}]))", "{{client}} {{limit}}")],
    unit="reqps")
timeseries(
    "Context overflows by action",
    "Prompts over their backend's context cap, by the model's on_overflow action: reject (400 "
    "context_length_exceeded to the client), middle_out (messages removed from the middle) "
    "or chunk (map-reduce over pieces). Rejections a client keeps meeting: switch its model "
    "to middle_out, or give it a model with a longer context.",
    grid(16, 58, 8),
    [(f"sum by (model, action) (increase(mlxgate_context_overflow_total{{{M}}}[{EI}]))", "{{model}} {{action}}")],
    bars=True)
timeseries(
    "Usage mismatches and unknown token counts",
    "Answers whose usage disagrees with the output the gateway saw (a server that counts "
    "wrong or a stream cut after its usage), and answers that reported no usage at all (their "
    "tokens cannot be counted, nor charged to a client's tpm). Steady mismatches from one "
    "backend: its token figures cannot be trusted — report it upstream.",
    grid(0, 66, 12),
    [(f"sum by (backend) (increase(mlxgate_usage_mismatch_total{{{B}}}[{EI}]))", "mismatch {{backend}}"),
     (f"sum by (backend) (increase(mlxgate_generation_tokens_unknown_total{{{M}, {B}}}[{EI}]))",
      "no usage {{backend}}")],
    bars=True)
timeseries(
    "Prompt counting time p95",
    "Time the gateway took to count a prompt's tokens with the model's tokenizer and chat "
    "template (before the queue, for the context cap and tpm). Milliseconds are normal for "
    "long prompts; tens of milliseconds on every request mean huge prompts or a gateway "
    "short of CPU (it shares the machine with the server).",
    grid(12, 66, 12),
    [(quantile(0.95, "mlxgate_prompt_count_seconds", "model", M), "{{model}} p95")],
    unit="s")
timeseries(
    "Claude Code billing blocks stripped",
    "Claude Code's billing-header system blocks (x-anthropic-billing-header: cc_version=…; "
    "cch=…) the Messages face dropped before the prompt reached a backend: about one per "
    "Claude Code request. The block changes every request; sent on, it would make every "
    "turn's prompt differ from its first token and every prompt-cache lookup miss. Zero while "
    "Claude Code is in use: its attribution header is off (CLAUDE_CODE_ATTRIBUTION_HEADER=0), "
    "which saves the same.",
    grid(0, 74, 12),
    [("sum(increase(mlxgate_anthropic_billing_blocks_stripped_total[$__interval]))", "stripped")],
    bars=True)


# ---- Row 5: several backends behind one model ----------------------------------------------
row("Balancing: several backends behind one model", 82)
timeseries(
    "Routing decisions by backend and reason",
    "Requests of models with several backends, by the backend that got them and why: "
    "cache_hit (its cached prefix made it cheapest), cold (a new conversation, placed by "
    "load and a rendezvous hash every gateway agrees on), least_loaded, round_robin, session, "
    "only_choice (the others drained or ejected), none_usable (the request "
    "waited for any), rebound (it got another backend than the one named: its wait for the "
    "preferred one ran out, or a failover). An agent's turns should be mostly cache_hit; mostly cold on long "
    "conversations means their prefixes keep being evicted (raise the servers' prompt cache "
    "or add memory).",
    grid(0, 83, 8),
    [(f"sum by (backend, reason) (rate(mlxgate_route_decisions_total{{{M}, {B}}}[{RI}]))", "{{backend}} {{reason}}")],
    unit="reqps")
timeseries(
    "Cached prompt tokens: predicted vs reported",
    "Per backend, the prompt tokens the balancer expected the server to hold for the requests "
    "it sent there, against what the server reported it reused (usage.prompt_tokens_details."
    "cached_tokens). Close lines: the index is right and routing by cache works. Predicted far "
    "above reported: the server keeps fewer prompts than prompt_cache_sequences says (set it), "
    "or it restarted. The error panel shows how far off single answers are.",
    grid(8, 83, 8),
    [(f"sum by (backend) (rate(mlxgate_route_predicted_cached_tokens_total{{{M}, {B}}}[{RI}]))", "predicted {{backend}}"),
     (f"sum by (backend) (rate(mlxgate_route_reported_cached_tokens_total{{{M}, {B}}}[{RI}]))", "reported {{backend}}")],
    unit="short")
timeseries(
    "Prediction error p90 and prompts held",
    "Per backend: the 90th percentile of |predicted - reported| cached tokens per answer "
    "(falls as the index corrects itself from each answer), and how many prompts the balancer "
    "believes the server's cache holds (0 after a restart: its cache is gone).",
    grid(16, 83, 8),
    [(quantile(0.9, "mlxgate_route_prediction_error_tokens", "backend", f"{M}, {B}"), "error p90 {{backend}}"),
     (f"max by (backend) (mlxgate_route_index_sequences{{{M}, {B}}})", "held {{backend}}")],
    unit="short")
timeseries(
    "Backend health and ejections",
    "Backends of models with several: 1 on the state each is in (healthy, ejected: failed "
    "requests or probes in a row took it out, half_open: its one trial request), and each "
    "ejection as a bar. An ejected backend's requests go to the others; it is tried again "
    "after eject_for. Repeated ejections: look at that Mac (its server's log, its network).",
    grid(0, 91, 12),
    [(f"max by (backend, state) (mlxgate_backend_health{{{B}}})", "{{backend}} {{state}}"),
     (f"sum by (backend) (increase(mlxgate_backend_ejections_total{{{B}}}[{EI}]))", "ejected {{backend}}")],
    unit="short")


def variable(name, label, query):
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "query": {"query": query, "refId": f"{name}-values"}, "definition": query,
            "refresh": 2, "multi": True, "includeAll": True, "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "sort": 1}


dashboard = {
    "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "description": "The Prometheus that scrapes mlxgate",
                  "type": "datasource", "pluginId": "prometheus", "pluginName": "Prometheus"}],
    "__requires": [
        {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.4.0"},
        {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
        {"type": "panel", "id": "timeseries", "name": "Time series", "version": ""},
        {"type": "panel", "id": "state-timeline", "name": "State timeline", "version": ""},
    ],
    "annotations": {"list": [
        {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
         "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"},
        {"name": "GPU swaps", "datasource": DS, "enable": True, "iconColor": "orange",
         "expr": f"sum(increase(mlxgate_backend_swaps_total[{EI}])) > 0", "step": "10s",
         "titleFormat": "GPU swap", "textFormat": "a GPU backend was stopped for another to start"},
        {"name": "Backend restarts", "datasource": DS, "enable": True, "iconColor": "red",
         "expr": f"sum by (backend, reason) (increase(mlxgate_backend_restarts_total{{{B}}}[{EI}])) > 0",
         "step": "10s", "titleFormat": "restart", "textFormat": "{{backend}} restarted ({{reason}})"},
    ]},
    "description": "mlxgate: the gateway in front of local MLX servers. Why is an agent slow right now?",
    "editable": True,
    "graphTooltip": 1,
    "links": [],
    "panels": panels,
    "refresh": "10s",
    "schemaVersion": 39,
    "tags": ["mlxgate", "mlx", "llm"],
    "templating": {"list": [
        # Resolves ${DS_PROMETHEUS} when the file is provisioned rather than imported (an import
        # replaces it with the datasource chosen); hidden: a picker that changes nothing after an
        # import would mislead.
        {"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 2, "refresh": 1},
        variable("model", "Model", "label_values(mlxgate_requests_total, model)"),
        variable("backend", "Backend", "label_values(mlxgate_requests_total, backend)"),
        variable("client", "Client", "label_values(mlxgate_requests_total, client)"),
    ]},
    "time": {"from": "now-1h", "to": "now"},
    "timepicker": {},
    "timezone": "",
    "title": "mlxgate",
    "uid": "mlxgate",
    "version": 1,
}

out = pathlib.Path(sys.argv[2]) if sys.argv[1:2] == ["--out"] else pathlib.Path(__file__).with_name("mlxgate.json")
out.write_text(json.dumps(dashboard, indent=2) + "\n")
print(f"wrote {out} ({len([p for p in panels if p['type'] != 'row'])} panels)")
