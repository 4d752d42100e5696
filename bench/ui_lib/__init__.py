"""bench/ui: what a real /ui page open during 256 streams costs the gateway (issue 23, point 3).

One zero-delay mlxgate-sim (bench/overhead's `stream` simulator: 128 content chunks 20 ms apart,
every stream at its own pace) and its `fast` one (one token at once) behind one mlxgate
(release; bench/overhead's minimal config with `url:` backends: metrics on, the access log on as
by default). The gateway is pinned to CPU 0; the simulators, this driver (the stream clients,
wrk) and the page's browser to CPU 1. The variants, in alternating order over the rounds (ABBA…;
with three, a balanced Latin square):

    none   no page open: the gateway's activity ring is filled, nobody follows it
    page   headless Chromium (/usr/bin/chromium, driven over WebDriver's HTTP API through
           /usr/bin/chromedriver) freshly opened on /ui#activity before the run; the run starts
           once its badge reads `live` and its first render settled; after the run the page must
           show the run's requests as new rendered rows (min(streams, 500)) and still be live —
           a page that was not following fails the run instead of making the comparison
           meaningless. Its lag notice (`fell behind: …`) and Chromium's own CPU are recorded.
    feed   (`--variants none,page,feed`) curl following /ui/events, pinned beside the load: the
           gateway's side of the feed without a browser's work on the load's CPU; it must get
           a `request` event for each of the run's requests.

Each run is bench/overhead's `stream_run` (256 streams × 128 chunks, starts spread over 20 ms);
the gateway's CPU (the kernel's per-process CPU clock, bench/overhead's `on_cpu`) is taken over
the run and 1 s after it (the feed's events for the last requests), per content chunk. Per
variant: the median and min–max over rounds, gaps p50/p99, chunks out / expected; the paired
difference page − none per round, its median and range; the noise floor is the none-variant's
own max − min over rounds (as bench/overhead's floors), and the verdict `within noise` when the
median difference is no larger than it. Then a rate phase (default 3 rounds × 5 s per variant):
wrk with 8 connections sending whole chat completions to the `fast` simulator, thousands of
finished requests a second — each one an event for a follower, where a feed would fall behind:
CPU per request, the rate, and what the follower got (a page's rows and lag notice, a feed's
events and `lagged` counts; only a follower that got nothing fails the run). Then idle windows
(default 2 × 30 s per variant) with no traffic: the gateway's CPU per second with no page and
with one open (its feed then sends state changes only and a keep-alive comment). Each run also
records the CPU the machine spent on processes it did not start (/proc/stat's busy time minus
this run's process tree).

    bench/ui                   # none and page: 6 stream rounds, 3 rate rounds, 2 idle windows (~6 min)
    bench/ui --variants none,page,feed   # and the bare feed (~9 minutes)
    bench/ui --rounds 2 --idle-seconds 10
    bench/ui --self-test       # the report's pieces on canned figures (tests/it/bench_ui.rs)

Writes bench/results/ui.md and ui.json (`--out` elsewhere). Ports: bench/overhead's (19401 for
the gateway, 19404 and 19400 for the simulators; it refuses to start when one is in use) and a free port for
chromedriver. Everything it starts is stopped when it ends, by its own pid, and an alarm stops a
run that overruns.

The modules:

    settings.py  the ports, CPUs, browser paths and defaults
    browser.py   the WebDriver client and what is read from the rendered page
    measure.py   one stream round, rate round and idle window, each with its follower (or none)
    report.py    medians, paired differences, the noise floor, the verdict, the Markdown
    cli.py       the command line and the order of the runs
    selftest.py  unit tests of the report on canned figures
"""
