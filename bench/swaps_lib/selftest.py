"""`bench/swaps --self-test`: unit tests of the harness's pure pieces (no process started); run
by tests/it/bench_swaps.rs."""

from __future__ import annotations

import json
import unittest

from . import report, stats
from .agents import complete, draw, plan, read_stream
from .cli import finite, parse_footprints, transitions
from .procs import gateway_yaml, is_server
from .settings import MAJORITY, MAX_QUEUE, MAX_WAIT_S, MINORITY, MINORITY_SHARE, PORTS


def rec(model: str, i: int, wait: float | None = 1.0, ok: bool = True, served: str | None = None, **kw) -> dict:
    r = {"model": model, "request_id": f"v-a0-{i}", "status": 200, "first_byte_s": wait, "ttft_s": wait,
         "done": ok, "finished": ok, "error": None, "served_by": served or model}
    r.update(kw)
    return r


def sample(t: float, coder: str, haiku: str, alive: tuple[int, int] = (0, 0)) -> dict:
    return {"t": t, "states": {"coder": coder, "haiku": haiku},
            "alive": {"coder": list(range(alive[0])), "haiku": list(range(100, 100 + alive[1]))}}


class Percentiles(unittest.TestCase):
    def test_nearest_rank(self):
        values = [float(v) for v in range(1, 101)]
        self.assertEqual(stats.pct(values, 50), 51.0)
        self.assertEqual(stats.pct(values, 95), 95.0)
        self.assertEqual(stats.pct([3.0], 95), 3.0)
        self.assertIsNone(stats.pct([], 50))
        self.assertEqual(stats.spread([2.0, 1.0, 9.0]), {"n": 3, "p50": 2.0, "p95": 9.0, "max": 9.0})


class Loading(unittest.TestCase):
    def test_the_time_any_backend_starts_is_integrated_once(self):
        samples = [sample(0.0, "starting", "stopped", (1, 0)), sample(1.0, "ready", "stopped", (1, 0)),
                   sample(3.0, "draining", "stopped", (1, 0)), sample(3.5, "stopped", "starting", (0, 1)),
                   sample(6.0, "starting", "starting", (1, 1)), sample(7.0, "ready", "ready", (1, 1)),
                   sample(8.0, "ready", "ready", (1, 1))]
        out = stats.loading(samples)
        # coder starting 0-1 and 6-7, haiku 3.5-7: the union is 1 + 3.5 = 4.5 s.
        self.assertAlmostEqual(out["loading_s"], 4.5)
        self.assertAlmostEqual(out["per_backend_s"]["coder"], 2.0)
        self.assertAlmostEqual(out["per_backend_s"]["haiku"], 3.5)
        self.assertEqual(out["peak_servers"], 2)
        self.assertAlmostEqual(out["both_alive_s"], 2.0)

    def test_no_samples_no_loading(self):
        self.assertEqual(stats.loading([])["loading_s"], 0.0)
        self.assertEqual(stats.loading([sample(0, "starting", "stopped")])["loading_s"], 0.0)

    def test_starts_from_the_timeline(self):
        timeline = [[0.0, "coder", "stopped"], [0.1, "coder", "starting"], [2.1, "coder", "ready"],
                    [4.0, "coder", "stopped"], [4.0, "haiku", "starting"], [16.5, "haiku", "ready"],
                    [20.0, "coder", "starting"], [21.5, "coder", "ready"], [30.0, "haiku", "starting"]]
        self.assertEqual(stats.start_times(timeline), {"coder": [2.0, 1.5], "haiku": [12.5]})

    def test_the_timeline_keeps_changes_only(self):
        samples = [sample(0.0, "stopped", "stopped"), sample(0.1, "starting", "stopped"),
                   sample(0.2, "starting", "stopped"), sample(0.3, "ready", "stopped")]
        self.assertEqual(transitions(samples), [[0.0, "coder", "stopped"], [0.0, "haiku", "stopped"],
                                                [0.1, "coder", "starting"], [0.3, "coder", "ready"]])


class Metrics(unittest.TestCase):
    BASELINE = "# TYPE mlxgate_backend_swaps_total counter\nmlxgate_backend_swaps_total 26\n"
    NEW = ('mlxgate_backend_swaps_total{backend="coder",reason="due"} 3\n'
           'mlxgate_backend_swaps_total{backend="haiku",reason="max_wait"} 1\n'
           'mlxgate_backend_swaps_total{backend="haiku",reason="no_work"} 2\n'
           'mlxgate_backend_starting_seconds_total{backend="coder"} 7.5\n'
           'mlxgate_backend_starting_seconds_total{backend="haiku"} 2.5\n')

    def test_the_swap_counter_with_and_without_labels(self):
        self.assertEqual(stats.metric_sum(self.BASELINE, "mlxgate_backend_swaps_total"), 26)
        self.assertEqual(stats.metric_sum(self.NEW, "mlxgate_backend_swaps_total"), 6)
        self.assertEqual(stats.by_label(self.NEW, "mlxgate_backend_swaps_total", "reason"),
                         {"due": 3, "max_wait": 1, "no_work": 2})
        self.assertEqual(stats.by_label(self.BASELINE, "mlxgate_backend_swaps_total", "reason"), {})
        self.assertEqual(stats.metric_sum(self.NEW, "mlxgate_backend_starting_seconds_total"), 10.0)
        self.assertIsNone(stats.metric_sum(self.BASELINE, "mlxgate_backend_starting_seconds_total"))


class AccessLog(unittest.TestCase):
    def test_access_lines_of_the_json_log(self):
        lines = [
            json.dumps({"level": "INFO", "target": "mlxgate", "fields": {"message": "mlxgate serving"}}),
            json.dumps({"level": "INFO", "target": "mlxgate::access",
                        "fields": {"request_id": "v-a0-1", "model": "haiku", "backend": "coder", "queue_ms": 1250.0,
                                   "fallback_from": "haiku"}}),
            "not json, mlxgate::access",
            json.dumps({"level": "INFO", "target": "mlxgate::backend::output",
                        "fields": {"message": "mlxgate::access in a server's output"}}),
        ]
        out = stats.access_lines("\n".join(lines))
        self.assertEqual(len(out), 1)
        self.assertEqual(out[0]["queue_ms"], 1250.0)


class Agents(unittest.TestCase):
    def test_the_same_seed_draws_the_same_turns(self):
        a = [draw(plan(3)) for _ in range(50)]
        self.assertEqual(a, [draw(plan(3)) for _ in range(50)])
        self.assertNotEqual(a, [draw(plan(4)) for _ in range(50)])

    def test_the_minority_share_and_think_times(self):
        rng = plan(0)
        turns = [draw(rng) for _ in range(4000)]
        share = sum(1 for m, _, _ in turns if m == MINORITY) / len(turns)
        self.assertAlmostEqual(share, MINORITY_SHARE, delta=0.03)
        self.assertTrue(all(0.5 <= t <= 2.0 for _, t, _ in turns))

    def test_a_stream_is_read_whole_or_cut(self):
        body = [b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n', b"\n",
                b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n', b"\n",
                b'data: {"choices":[{"delta":{},"finish_reason":"length"}]}\n', b"\n", b"data: [DONE]\n"]
        ev = read_stream((float(i), line) for i, line in enumerate(body))
        self.assertEqual((ev["first_byte_at"], ev["first_content_at"], ev["text"]), (0.0, 2.0, "Hi"))
        self.assertTrue(ev["done"] and ev["finished"])
        cut = read_stream((float(i), line) for i, line in enumerate(body[:3]))
        self.assertFalse(cut["done"] or cut["finished"])
        self.assertFalse(complete({"status": 200, "done": False, "finished": False}))
        self.assertTrue(complete({"status": 200, "done": True, "finished": True, "error": None}))
        self.assertFalse(complete({"status": 200, "done": True, "finished": True, "error": {"type": "x"}}))
        self.assertFalse(complete({"status": 503}))


class Configs(unittest.TestCase):
    def test_before_and_after_run_the_same_file(self):
        before, after = gateway_yaml("before"), gateway_yaml("after")
        self.assertEqual(before.splitlines()[1:], after.splitlines()[1:])
        for new_key in ("loading_share", "gpu_memory_budget", "footprint", "fallback"):
            self.assertNotIn(new_key, before, "the baseline knows none of the new keys")
        self.assertIn("swap_after: 5s\n", before)
        self.assertIn("    kind: mlx-lm\n", before)
        self.assertIn("    kind: mlx-openai-server\n", before)
        self.assertIn(f"max_wait: {MAX_WAIT_S}s", before)

    def test_each_variant_adds_its_own_key(self):
        self.assertIn("loading_share: 1.0", gateway_yaml("timer"))
        budget = gateway_yaml("budget", {MAJORITY: 600, MINORITY: 700})
        self.assertIn("gpu_memory_budget: 1500MiB", budget)
        self.assertIn("    footprint: 600MiB\n", budget)
        self.assertIn("    footprint: 700MiB\n", budget)
        self.assertIn(f"  {MINORITY}: {{backend: {MINORITY}, max_queue: {MAX_QUEUE}, max_wait: {MAX_WAIT_S}s, "
                      f"fallback: {MAJORITY}}}", gateway_yaml("fallback"))
        with self.assertRaises(ValueError):
            gateway_yaml("budget")

    def test_footprints_from_the_command_line(self):
        self.assertEqual(parse_footprints("haiku=900")[MINORITY], 900)
        with self.assertRaises(SystemExit):
            parse_footprints("gpt=1")

    def test_a_server_is_told_from_its_keeper(self):
        port = str(PORTS[MAJORITY])
        server = ["/v/bin/python3.11", "/v/bin/mlx_lm.server", "--model", "m", "--port", port]
        self.assertTrue(is_server(server, "mlx_lm.server", int(port)))
        self.assertFalse(is_server(["/t/mlxgate", "keep", "--", *server[1:]], "mlx_lm.server", int(port)))
        self.assertFalse(is_server(server[:-1] + ["19999"], "mlx_lm.server", int(port)))
        self.assertFalse(is_server([], "mlx_lm.server", int(port)))


def variant(answers: tuple[int, int], swaps: float | None, loading_s: float, wall: float = 100.0,
            fallback_served: int = 0, failures: int = 0, haiku_p95: float = 3.0) -> dict:
    records = [rec(MAJORITY, i) for i in range(answers[0])]
    records += [rec(MINORITY, 1000 + i, wait=haiku_p95,
                    served=MAJORITY if i < fallback_served else None) for i in range(answers[1])]
    records += [rec(MAJORITY, 5000 + i, ok=False) for i in range(failures)]
    text = f"mlxgate_backend_swaps_total {swaps}\n" if swaps is not None else ""
    samples = [sample(0.0, "starting", "stopped", (1, 0)), sample(loading_s, "ready", "stopped", (1, 0)),
               sample(wall, "ready", "stopped", (1, 0))]
    return stats.summarize(records, wall, samples, text, [], {MAJORITY: 500 * 2**20})


class Summaries(unittest.TestCase):
    def test_a_variant_summary(self):
        access = [{"request_id": "v-a0-1000", "queue_ms": 2000.0, "backend": "coder"},
                  {"request_id": "v-a0-0", "queue_ms": 10.0, "backend": "coder"}]
        records = [rec(MAJORITY, 0), rec(MINORITY, 1000, wait=2.5),
                   rec(MINORITY, 1001, ok=False), rec(MINORITY, 1002, status=503, done=False)]
        s = stats.summarize(records, 50.0, [sample(0, "starting", "stopped", (1, 0)), sample(5, "ready", "stopped", (1, 0))],
                            'mlxgate_backend_swaps_total{backend="coder",reason="due"} 2\n', access, {})
        self.assertEqual((s["answers"], s["failures"], s["swaps"]), (2, 2, 2.0))
        self.assertEqual(s["models"][MINORITY]["failure_statuses"], {"cut": 1, "503": 1})
        self.assertEqual(s["models"][MINORITY]["queue_s"]["max"], 2.0)
        self.assertEqual(s["models"][MINORITY]["served_by_majority_log"], 1)
        self.assertEqual(s["models"][MINORITY]["served_by_majority_header"], 0)
        self.assertAlmostEqual(s["loading_share"], 0.1)
        self.assertEqual(s["models"][MINORITY]["wait_s"]["max"], 2.5)


class Goals(unittest.TestCase):
    def test_met_and_not_met(self):
        variants = {"before": variant((30, 10), 26, 90.0), "after": variant((100, 40), 4, 20.0),
                    "budget": variant((120, 50), 0, 10.0), "fallback": variant((120, 50), 0, 5.0, fallback_served=50)}
        goals = stats.goals(variants)
        self.assertTrue(all(g["met"] for g in goals), goals)
        self.assertEqual(len(goals), 11)
        ratio = next(g for g in goals if "answers of" in g["goal"])
        self.assertAlmostEqual(ratio["value"], 3.5)

        variants = {"timer": variant((50, 10), 26, 90.0), "after": variant((100, 40), 4, 30.0, failures=1,
                                                                          haiku_p95=MAX_WAIT_S + 1),
                    "budget": variant((120, 50), 1, 10.0), "fallback": variant((120, 50), 0, 5.0, fallback_served=49)}
        failed = {(g["variant"], g["goal"]) for g in stats.goals(variants) if not g["met"]}
        self.assertEqual(len(failed), 6, failed)
        self.assertIn(("after", "≥ 3× the answers of `timer`"), failed)

    def test_a_variant_not_run_is_not_judged(self):
        self.assertEqual(stats.goals({}), [])
        goals = stats.goals({"after": variant((10, 3), None, 1.0)})
        self.assertFalse(any("answers of" in g["goal"] for g in goals))


class Report(unittest.TestCase):
    def test_it_renders_the_variants_side_by_side_and_the_goals(self):
        variants = {"before": variant((30, 10), 26, 90.0), "after": variant((100, 40), 4, 20.0)}
        res = {"date": "d", "machine": "m", "commit": "c", "elapsed_s": 60, "loadavg_start": "0",
               "command": "bench/swaps", "footprints_mib": {MAJORITY: 600, MINORITY: 700}, "budget_margin_mib": 200,
               "schedule": {"agents": 6, "seconds": 180, "minority_share": 0.3, "think_s": [0.5, 2.0],
                            "max_tokens": 32, "seed": 22, "swap_after_s": 5, "max_wait_s": 120,
                            "majority": MAJORITY, "minority": MINORITY, "model": ".cache/tiny-qwen3",
                            "servers": {MAJORITY: "mlx-lm", MINORITY: "mlx-openai-server"}},
               "variants": variants, "goals": stats.goals(variants)}
        md = report.render(finite(res))
        self.assertIn("| | `before` | `after` |", md)
        self.assertIn("| answers coder / haiku | **40** (30 / 10) | **140** (100 / 40) |", md)
        self.assertIn("| loading share of wall time | **90 %** | **20 %** |", md)
        self.assertIn("| swaps | 26 | 4 |", md)
        self.assertIn("| ≥ 3× the answers of `before` | `after` | 3.50× | yes |", md)
        self.assertIn("| loading ≤ 25% of wall time | `after` | 20 % | yes |", md)
        self.assertIn("budget 1500 MiB", md)
        self.assertIn("| footprint measured by the gateway, MiB coder / haiku | - / - | - / - |", md)
        self.assertIn("2 CPU cores", md)


class Json(unittest.TestCase):
    def test_the_raw_figures_are_standard_json(self):
        self.assertEqual(finite({"a": [float("inf"), 1.5, float("nan")], "b": {"c": float("-inf")}}),
                         {"a": [None, 1.5, None], "b": {"c": None}})


def run() -> int:
    suite = unittest.defaultTestLoader.loadTestsFromModule(__import__(__name__, fromlist=["*"]))
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    return 0 if result.wasSuccessful() else 1
