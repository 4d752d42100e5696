"""`bench/ui --self-test`: unit tests of the harness's pure pieces on canned figures (no process
started); run by tests/it/bench_ui.rs."""

from __future__ import annotations

import json
import unittest

from overhead_lib.processes import gateway_yaml, sim_command
from overhead_lib.settings import FULL, SIM_PORTS
from overhead_lib.stats import rounds_order

from . import report
from .measure import busy_cpu_s, count_events, held_connections
from .settings import ACTIVITY_MAX, DEFAULT_VARIANTS, GATEWAY_PORT, ROUTE, VARIANTS


def stream(r: int, cpu: float, page: bool = False, chunks: int = 32768, feed: bool = False, **kw) -> dict:
    s = {"round": r, "variant": "feed" if feed else "page" if page else "none", "cpu_us_per_chunk": cpu,
         "others_cpu_s": 0.1 + r / 100,
         "cpu_us_per_chunk_streams": cpu - 0.5, "gap_p50_us": 21000.0 + r, "gap_p99_us": 23000.0 + 10 * r,
         "content_chunks": chunks, "sim_requests": 256, "statuses": {"200": 256}, "preempted": 3}
    if page:
        s.update({"held_before": 2, "rows_new": 256, "rows_wanted": 256, "rows_caught_up_s": 0.2 + r / 10, "lagged": "",
                  "browser_cpu_s": 1.5, "rows_before": 200, "live_after": "live"})
    elif feed:
        s.update({"held_before": 1, "events_new": 256, "events_caught_up_s": 0.1, "lagged": "",
                  "feed_events": {"state": 9, "request": 456, "requests": 1}})
    else:
        s["feed_gone_s"] = 0.1 * r
    s.update(kw)
    return s


def canned(none: list[float], page: list[float], idle: bool = True) -> dict:
    res = {"settings": {"rounds": len(none), "streams": 256, "chunks": 128, "settle_s": 1.0, "idle_seconds": 30.0,
                        "idle_rounds": 2, "proxy_cpu": "0", "browser_cpu": "1", "url": "http://x/ui#activity"},
           "date": "2026-12-02 06:00 UTC", "machine": "a canned machine", "commit": "abc1234",
           "command": "bench/ui", "loadavg_start": "1.00 1.00 1.00", "loadavg_end": "1.10 1.00 1.00",
           "top_start": ["  PID USER ...", "  1 root ..."], "top_end": ["  PID USER ..."],
           "streams": {"none": [stream(r, c) for r, c in enumerate(none)],
                       "page": [stream(r, c, page=True) for r, c in enumerate(page)]},
           "idle": {"none": [], "page": []}}
    if idle:
        res["idle"] = {"none": [{"round": 0, "cpu_us_per_s": 40.0}, {"round": 1, "cpu_us_per_s": 60.0}],
                       "page": [{"round": 0, "cpu_us_per_s": 150.0}, {"round": 1, "cpu_us_per_s": 130.0}]}
    return res


class Paired(unittest.TestCase):
    def test_page_minus_none_of_the_same_round(self):
        runs = {"none": [stream(0, 15.0), stream(1, 14.0), stream(2, 16.0)],
                "page": [stream(1, 14.5, page=True), stream(0, 15.25, page=True)]}
        self.assertEqual(report.paired(runs, "cpu_us_per_chunk"), [0.5, 0.25])

    def test_a_round_without_its_pair_is_left_out(self):
        runs = {"none": [stream(0, 15.0)], "page": [stream(0, 16.0, page=True), stream(1, 99.0, page=True)]}
        self.assertEqual(report.paired(runs, "cpu_us_per_chunk"), [1.0])


class Verdict(unittest.TestCase):
    def test_within_when_the_median_difference_is_at_most_the_floor(self):
        self.assertEqual(report.verdict(0.4, 2.0), "within noise")
        self.assertEqual(report.verdict(-2.0, 2.0), "within noise")

    def test_beyond_when_it_is_larger_either_way(self):
        self.assertEqual(report.verdict(2.5, 2.0), "beyond noise")
        self.assertEqual(report.verdict(-2.5, 2.0), "beyond noise")

    def test_no_floor_with_one_round(self):
        self.assertTrue(report.verdict(0.1, None).startswith("no noise floor"))
        self.assertTrue(report.verdict(float("nan"), 1.0).startswith("no noise floor"))


class Compare(unittest.TestCase):
    def test_floor_is_the_none_variants_own_spread(self):
        res = canned([15.0, 13.0, 17.0, 14.0], [15.5, 13.0, 18.0, 14.5])
        c = report.compare(res["streams"], "cpu_us_per_chunk", "page")
        self.assertEqual(c["per_round"], [0.5, 0.0, 1.0, 0.5])
        self.assertEqual(c["median"], 0.5)
        self.assertEqual(c["range"], [0.0, 1.0])
        self.assertEqual(c["noise"], 4.0)
        self.assertEqual(c["verdict"], "within noise")

    def test_a_steady_none_and_a_costly_page_is_beyond(self):
        res = canned([15.0, 15.2, 15.1, 15.0], [17.0, 17.1, 16.9, 17.2])
        self.assertEqual(report.compare(res["streams"], "cpu_us_per_chunk")["verdict"], "beyond noise")


class Summary(unittest.TestCase):
    def test_per_variant_figures(self):
        res = canned([15.0, 13.0], [15.5, 13.5])
        res["streams"]["page"][1]["lagged"] = "fell behind: 3 requests not shown"
        res["streams"]["none"][0]["statuses"] = {"200": 255, "502": 1}
        res["streams"]["none"][1]["content_chunks"] = 32700
        s = report.summarize(res)
        none, page = s["streams"]["none"], s["streams"]["page"]
        self.assertEqual(none["cpu_us_per_chunk"], 14.0)
        self.assertEqual(none["cpu_us_per_chunk_range"], [13.0, 15.0])
        self.assertEqual((none["content_chunks_min"], none["content_chunks_max"]), (32700, 32768))
        self.assertEqual(none["expected_chunks"], 256 * 128)
        self.assertEqual(none["non_200"], 1)
        self.assertNotIn("rows_new_min", none)
        self.assertEqual(page["rows_new_min"], 256)
        self.assertEqual(page["lagged"], ["fell behind: 3 requests not shown"])
        self.assertAlmostEqual(page["rows_caught_up_s_max"], 0.3)

    def test_idle_is_paired_too(self):
        s = report.summarize(canned([15.0, 13.0], [15.5, 13.5]))
        self.assertEqual(s["idle"]["none"]["cpu_us_per_s"], 50.0)
        self.assertEqual(s["idle"]["page"]["cpu_us_per_s"], 140.0)
        self.assertEqual(s["idle_compare"]["page"]["per_round"], [110.0, 70.0])
        self.assertEqual(s["idle_compare"]["page"]["noise"], 20.0)
        self.assertEqual(s["idle_compare"]["page"]["verdict"], "beyond noise")

    def test_no_idle_windows_no_idle_summary(self):
        self.assertNotIn("idle", report.summarize(canned([15.0, 13.0], [15.5, 13.5], idle=False)))

    def test_the_summary_survives_json(self):
        res = json.loads(json.dumps(canned([15.0, 13.0], [15.5, 13.5])))
        self.assertEqual(report.summarize(res)["streams"]["none"]["non_200"], 0)


class Markdown(unittest.TestCase):
    def test_the_report_has_both_variants_the_difference_and_the_verdict(self):
        res = canned([15.0, 13.0, 14.0], [15.5, 13.5, 14.0])
        md = report.render(res, report.summarize(res))
        self.assertIn("| none | 14.00 µs | 13.00 µs to 15.00 µs |", md)
        self.assertIn("| 0 | 0.11 s (max 0.12) |", md)
        self.assertIn("| page | 14.00 µs | 13.50 µs to 15.50 µs |", md)
        self.assertIn("32768 / 32768", md)
        self.assertIn("per round: +0.50 µs, +0.50 µs, +0.00 µs", md)
        self.assertIn("Noise floor (the none-variant's own max − min over rounds): 2.00 µs", md)
        self.assertIn("**Verdict: within noise.**", md)
        self.assertIn("at least 256 new activity rows per round", md)
        self.assertIn("lag notices: none", md)
        self.assertIn("Connections the gateway held as each page run began: 2", md)
        self.assertIn("waited at most 0.2 s", md)
        self.assertIn("| page | 140.0 µs |", md)
        self.assertIn("Load average at the start 1.00 1.00 1.00", md)

    def test_a_chunk_shortfall_shows_its_range(self):
        res = canned([15.0, 13.0], [15.5, 13.5])
        res["streams"]["page"][0]["content_chunks"] = 30000
        md = report.render(res, report.summarize(res))
        self.assertIn("30000–32768 / 32768", md)


TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:4BC9 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 10 0
   1: 0100007F:4BC9 0100007F:B0F2 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 10 0
   2: 0100007F:4BC9 0100007F:B0F4 08 00000000:00000000 00:00000000 00000000     0        0 3 1 0 10 0
   3: 0100007F:4BC9 0100007F:B0F6 06 00000000:00000000 00:00000000 00000000     0        0 0 3 0 0 0
   4: 0100007F:D2A0 0100007F:4BCC 01 00000000:00000000 00:00000000 00000000     0        0 4 1 0 10 0
"""


class Feed(unittest.TestCase):
    def canned(self) -> dict:
        res = canned([15.0, 13.0], [15.5, 13.5])
        res["streams"]["feed"] = [stream(0, 15.25, feed=True), stream(1, 13.0, feed=True)]
        res["idle"]["feed"] = [{"round": 0, "cpu_us_per_s": 100.0, "state_events": 30, "seconds": 30.0},
                               {"round": 1, "cpu_us_per_s": 90.0, "state_events": 31, "seconds": 31.0}]
        return res

    def test_each_follower_is_paired_with_none(self):
        s = report.summarize(self.canned())
        self.assertEqual(s["compare"]["feed"]["cpu_us_per_chunk"]["per_round"], [0.25, 0.0])
        self.assertEqual(s["compare"]["page"]["cpu_us_per_chunk"]["per_round"], [0.5, 0.5])
        self.assertEqual(s["streams"]["feed"]["events_new_min"], 256)
        self.assertEqual(s["idle"]["feed"]["state_events_per_s"], 1.0)
        self.assertEqual(s["idle_compare"]["feed"]["per_round"], [60.0, 30.0])

    def test_the_report_has_a_row_and_a_verdict_for_each(self):
        res = self.canned()
        md = report.render(res, report.summarize(res))
        self.assertIn("| feed | 14.12 µs |", md)
        self.assertIn("**Feed − none, paired by round** (CPU per chunk): median +0.12 µs", md)
        self.assertIn("**Page − none, paired by round**", md)
        self.assertIn("The feed followed: at least 256 `request` events per round", md)
        self.assertIn("| feed | 95.0 µs | 90.00 µs to 100.00 µs | 1.00 |", md)
        self.assertIn("Feed − none, paired: median +45.0 µs", md)
        self.assertLess(md.index("| page |"), md.index("| feed |"))


def rate(r: int, cpu: float, variant: str = "none", requests: int = 15000, **kw) -> dict:
    w = {"round": r, "variant": variant, "cpu_us_per_req": cpu, "rps": requests / 5, "p99": 4000 + r,
         "requests": requests, "status_errors": 0, "socket_errors": 0, "lagged": "", "others_cpu_s": 0.1}
    if variant == "page":
        w.update({"rows_new": 500, "rows_wanted": 500, "browser_cpu_s": 2.0})
    if variant == "feed":
        w.update({"events_new": requests, "missed": 0, "lagged_events": 0})
    w.update(kw)
    return w


class Rate(unittest.TestCase):
    def canned(self) -> dict:
        res = canned([15.0, 13.0], [15.5, 13.5])
        res["settings"].update({"rate_conns": 8, "rate_seconds": 5.0})
        res["rate"] = {"none": [rate(0, 60.0), rate(1, 64.0)],
                       "page": [rate(0, 61.0, "page"), rate(1, 66.0, "page", rows_new=480,
                                                            lagged="fell behind: 20 requests not shown")],
                       "feed": [rate(0, 62.0, "feed", events_new=14000, missed=1000), rate(1, 65.0, "feed")]}
        return res

    def test_cpu_per_request_is_paired_and_the_followers_counted(self):
        s = report.summarize(self.canned())
        self.assertEqual(s["rate_compare"]["page"]["per_round"], [1.0, 2.0])
        self.assertEqual(s["rate_compare"]["feed"]["noise"], 4.0)
        self.assertEqual(s["rate"]["page"]["rows_short"], 1)
        self.assertEqual(s["rate"]["page"]["lagged"], ["fell behind: 20 requests not shown"])
        self.assertEqual((s["rate"]["feed"]["events_new"], s["rate"]["feed"]["missed"]), (29000, 1000))
        self.assertEqual(s["rate"]["none"]["requests"], 30000)

    def test_the_report_shows_who_fell_behind(self):
        res = self.canned()
        md = report.render(res, report.summarize(res))
        self.assertIn("## Whole answers as fast as wrk sends them (8 connection(s), 5 s a run, 2 round(s), ABBA)", md)
        self.assertIn("| none | 62.0 µs | 60.00 µs to 64.00 µs | 3000 |", md)
        self.assertIn("(1 run(s) short of the last 500); lag notices: fell behind: 20 requests not shown", md)
        self.assertIn("29000 `request` events for 30000 requests; 1000 missed", md)
        self.assertIn("Page − none, paired: median +1.5 µs per request", md)

    def test_lagged_events_are_summed(self):
        text = ("event: state\ndata: {}\n\nevent: request\ndata: {\"id\": 1}\n\n"
                "event: lagged\ndata: {\"missed\": 7}\n\n: keep-alive\n\nevent: lagged\ndata: {\"missed\": 5}\n\n")
        self.assertEqual(count_events(text), {"state": 1, "request": 1, "lagged": 2, "missed": 12})


class BusyCpu(unittest.TestCase):
    def test_all_but_idle_and_iowait(self):
        import os
        stat = "cpu  100 5 50 1000 20 3 2 0 0 0\ncpu0 50 2 25 500 10 1 1 0 0 0\n"
        self.assertAlmostEqual(busy_cpu_s(stat), (100 + 5 + 50 + 3 + 2) / os.sysconf("SC_CLK_TCK"))


class HeldConnections(unittest.TestCase):
    def test_established_and_close_wait_to_the_port_only(self):
        # 0x4BC9 = 19401: listening (0A) and TIME_WAIT (06) are not held; the gateway's own
        # connection out to the simulator (remote 0x4BCC = 19404) is not one to its port.
        self.assertEqual(held_connections(19401, TCP), 2)
        self.assertEqual(held_connections(19404, TCP), 0)


class Setup(unittest.TestCase):
    def test_the_variants_alternate_abba(self):
        order = [v for r in range(4) for v in rounds_order(DEFAULT_VARIANTS, r)]
        self.assertEqual(order, ["none", "page", "page", "none", "none", "page", "page", "none"])

    def test_with_the_feed_too_each_runs_once_a_round_and_each_goes_first(self):
        rows = [rounds_order(VARIANTS, r) for r in range(6)]
        self.assertTrue(all(sorted(row) == sorted(VARIANTS) for row in rows))
        self.assertEqual({row[0] for row in rows}, set(VARIANTS))

    def test_the_gateway_has_the_stream_simulator_only(self):
        yaml = gateway_yaml(GATEWAY_PORT, full=False, tokenizer="", routes=[ROUTE])
        self.assertIn(f"url: http://127.0.0.1:{SIM_PORTS[ROUTE]}", yaml)
        self.assertIn(f"  {ROUTE}:", yaml)
        for other in set(SIM_PORTS) - {ROUTE}:
            self.assertNotIn(f"sim-{other}", yaml)
        self.assertNotIn("access_log: false", yaml)  # on, as by default
        self.assertNotIn("auth:", yaml)

    def test_bench_overheads_config_is_unchanged_by_default(self):
        yaml = gateway_yaml(GATEWAY_PORT, full=False, tokenizer="")
        for route, port in SIM_PORTS.items():
            self.assertIn(f"  sim-{route}:\n    url: http://127.0.0.1:{port}\n", yaml)

    def test_the_simulator_sends_the_chunks_asked_for_20_ms_apart(self):
        cmd = sim_command(ROUTE, FULL)
        self.assertEqual(cmd[cmd.index("--tokens") + 1], "128")
        self.assertEqual(cmd[cmd.index("--tokens-per-second") + 1], "50")
        self.assertEqual(cmd[cmd.index("--ttft-ms") + 1], "0")

    def test_the_row_check_wants_every_request_the_page_can_hold(self):
        self.assertEqual(min(256, ACTIVITY_MAX), 256)
        self.assertEqual(min(1000, ACTIVITY_MAX), 500)


def run() -> int:
    suite = unittest.defaultTestLoader.loadTestsFromModule(__import__(__name__, fromlist=["*"]))
    result = unittest.TextTestRunner(verbosity=1).run(suite)
    return 0 if result.wasSuccessful() else 1
