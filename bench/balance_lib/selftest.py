"""`bench/balance --self-test`: unit tests of the harness's pieces (no process started); run by
tests/it/bench_balance.rs."""

from __future__ import annotations

import unittest

from . import report, stats
from . import workload as wl
from .cache_model import LruPromptCache
from .client import body, read_events
from .procs import gateway_yaml


def toks(s: str) -> list[str]:
    return s.split()


class Workload(unittest.TestCase):
    def test_the_checked_in_file_is_the_generators(self):
        self.assertEqual(wl.render(wl.generate()), wl.OUT.read_text(), "run bench/balance_lib/workload.py")

    def test_its_shape_is_issue_21s(self):
        w = wl.load()
        convs = w["conversations"]
        self.assertEqual(len(convs) % 2, 1, "an odd number of conversations")
        self.assertGreaterEqual(len(convs), 5)
        self.assertGreaterEqual(len({c["client"] for c in convs}), 3, "several clients")
        self.assertTrue(w["tools"], "tools offered")
        sizes = []
        for c in convs:
            self.assertGreaterEqual(len(c["turns"]), 10, c["id"])
            prompts = wl.prompts(w, c)
            self.assertEqual(prompts[0][0], {"role": "system", "content": w["system"]}, "one shared system prompt")
            for before, after in zip(prompts, prompts[1:]):
                self.assertEqual(after[:len(before)], before, "each turn extends the previous prompt")
                self.assertEqual([m["role"] for m in after[len(before):]], ["assistant", "user"])
                sizes.append(len(after[-1]["content"].split()))
            self.assertLessEqual(len(wl.words_of(prompts[-1])), wl.MAX_PROMPT_WORDS, "fits the tiny context")
        self.assertGreater(max(sizes) / min(sizes), 10, "messages of varied size")
        starts = [c["start_seconds"] for c in convs]
        self.assertEqual(len(set(starts)), len(starts), "conversations start apart (interleaved)")

    def test_a_request_carries_the_session_and_client(self):
        w = wl.load()
        c = w["conversations"][1]
        b = body(w, c, wl.prompts(w, c)[0])
        self.assertEqual((b["prompt_cache_key"], b["user"], b["stream"]), (c["session"], c["client"], True))
        self.assertEqual(b["stream_options"], {"include_usage": True})
        self.assertEqual(b["tools"], w["tools"])


class CacheModel(unittest.TestCase):
    """The cases of src/sim/prompt_cache/tests.rs: the two implementations agree."""

    def cache(self, capacity, stored):
        c = LruPromptCache(capacity)
        for s in stored:
            c.insert(toks(s))
        return c

    def test_lookups(self):
        self.assertEqual(self.cache(10, ["s1 s2 u1 u2 g1 g2"]).fetch(toks("s1 s2 u1 u2")), 3)
        c = self.cache(10, ["s1 u1 g1 g2"])
        self.assertEqual(c.fetch(toks("s1 u1 g1 g2 u2 u3")), 4)
        self.assertEqual(c.fetch(toks("s1 u1 a1 a2 u2")), 2)
        self.assertEqual(c.fetch(toks("x y z")), 0)
        self.assertEqual(self.cache(10, ["a b c"]).fetch(toks("a b c")), 3)
        c = self.cache(10, ["a b c x y"])
        c.insert(toks("a b"), "system")
        self.assertEqual(c.fetch(toks("a b c d")), 3)
        self.assertEqual(self.cache(10, ["a b c", "a x"]).fetch(toks("a b c d e")), 3)
        self.assertEqual(self.cache(10, ["a"]).fetch(toks("a b")), 1)

    def test_insertion_and_eviction(self):
        c = self.cache(10, ["a b", "a", "x y"])
        c.insert(toks("a b c"))
        self.assertEqual(list(c.entries()), [toks("x y"), toks("a b c")])
        c = self.cache(2, ["a 1", "b 1"])
        self.assertEqual(c.fetch(toks("a 1 more")), 2)
        c.insert(toks("c 1"))
        self.assertEqual(list(c.entries()), [toks("b 1"), toks("c 1")])
        c.insert(toks("b 1"))
        c.insert(toks("d 1"))
        self.assertEqual(list(c.entries()), [toks("b 1"), toks("d 1")])
        c = LruPromptCache(2)
        for s, kind in [("sys", "system"), ("a 1", "assistant"), ("b 1", "assistant"), ("c 1", "assistant")]:
            c.insert(toks(s), kind)
        self.assertEqual(list(c.entries()), [toks("c 1"), toks("sys")])
        c = LruPromptCache(0)
        c.insert(toks("a b"))
        self.assertEqual(len(c), 0)


def hand_workload() -> dict:
    def conv(i, turns):
        return {"id": f"c{i}", "client": "x", "session": f"s{i}", "start_seconds": i, "turns": turns}
    return {"seed": 0, "system": "s1 s2", "tools": [], "clients": ["x"], "conversations": [
        conv(0, [{"append": [{"role": "user", "content": "a1"}], "tool_seconds": 0},
                 {"append": [{"role": "assistant", "content": "x"}, {"role": "user", "content": "a2 a3"}],
                  "tool_seconds": 0}]),
        conv(1, [{"append": [{"role": "user", "content": "b1 b2"}], "tool_seconds": 0}]),
        conv(2, [{"append": [{"role": "user", "content": "c1"}], "tool_seconds": 0}]),
    ]}


class Figures(unittest.TestCase):
    def test_the_oracle_of_a_hand_made_workload(self):
        o = stats.oracle(hand_workload())
        # Pinned, no evictions: Σ of last prompts: 6 + 4 + 3.
        self.assertEqual(o["prefilled"], 13)
        # c0 and c2 on one backend share the system prompt (2 words); c0's second turn gets its
        # first prompt (3) from the cache: 3 + 3, 4, 1.
        self.assertEqual(o["prefilled_shared"], 11)
        self.assertEqual((o["requests"], o["prompt_tokens"]), (4, 16))

    def test_the_oracle_from_reported_prompt_tokens(self):
        recs = [{"conv": "c0", "turn": 0, "prompt_tokens": 10}, {"conv": "c0", "turn": 1, "prompt_tokens": 30},
                {"conv": "c1", "turn": 0, "prompt_tokens": 12}, {"conv": "c1", "turn": 1, "prompt_tokens": None}]
        self.assertEqual(stats.oracle_from_records(recs), 42)
        self.assertIsNone(stats.oracle_from_records([]))

    def test_the_shared_oracle_from_reported_first_turns(self):
        recs = [[{"turn": 0, "cached_tokens": 0}, {"turn": 0, "cached_tokens": 300}, {"turn": 1, "cached_tokens": 290},
                 {"turn": 0, "cached_tokens": 310}], [{"turn": 0, "cached_tokens": None}]]
        self.assertEqual(stats.shared_prefix_from_records(recs), 300, "a later turn's figure is not the prefix")
        self.assertIsNone(stats.shared_prefix_from_records([[{"turn": 0, "cached_tokens": 0}]]))
        # 7 conversations on 2 backends: the prefix is prefilled twice, not seven times.
        self.assertEqual(stats.oracle_shared(9966, 300, 7, 2), 9966 - 5 * 300)
        self.assertIsNone(stats.oracle_shared(9966, None, 7, 2))
        self.assertIsNone(stats.oracle_shared(None, 300, 7, 2))

    def test_a_policys_summary(self):
        recs = [{"prompt_tokens": 100, "cached_tokens": 90, "ttft_s": 0.1},
                {"prompt_tokens": 50, "cached_tokens": None, "ttft_s": 0.3},
                {"prompt_tokens": 80, "cached_tokens": 0, "ttft_s": 0.2},
                {"prompt_tokens": None, "error": "refused"}]
        s = stats.summarize(recs, {"a": 3.0, "b": 2.0})
        self.assertEqual((s["prefilled"], s["cached"], s["prompt_tokens"]), (140, 90, 230))
        self.assertEqual((s["answered"], s["failed"], s["unreported_cache"]), (3, 1, 1))
        self.assertEqual((s["ttft_p50_s"], s["ttft_p95_s"]), (0.2, 0.3))
        self.assertEqual(s["balance"], 1.5)
        self.assertEqual(stats.summarize([], {"a": 2.0})["balance"], float("inf"))

    def test_the_goals(self):
        ok = {"prefilled": 105, "balance": 1.2, "failed": 0}
        g = stats.goals({"cache_aware": ok, "round_robin": {"prefilled": 300}}, 100)
        self.assertEqual([x["met"] for x in g], [True, True, True, True])
        bad = {"prefilled": 200, "balance": 2.0, "failed": 1}
        g = stats.goals({"cache_aware": bad, "round_robin": {"prefilled": 300}}, 100)
        self.assertEqual([x["met"] for x in g], [False, False, False, False])

    def test_metrics_by_backend(self):
        text = "\n".join([
            "# HELP mlxgate_requests_total Requests answered.",
            'mlxgate_requests_total{backend="a",client="anonymous",model="agent",outcome="ok"} 7',
            'mlxgate_requests_total{backend="a",client="anonymous",model="agent",outcome="error"} 1',
            'mlxgate_requests_total{backend="b",client="anonymous",model="agent",outcome="ok"} 5',
            'mlxgate_requests_total{backend="c",client="anonymous",model="other",outcome="ok"} 9',
            "mlxgate_up 1",
        ])
        parsed = stats.parse_metrics(text)
        self.assertEqual(stats.by_backend(parsed, "mlxgate_requests_total", "agent"), {"a": 8.0, "b": 5.0})
        self.assertEqual(stats.delta({"a": 8.0}, {"a": 3.0, "b": 1.0}), {"a": 5.0, "b": -1.0})

    def test_prediction_windows(self):
        samples = [{"t": t, "predicted": {"a": 10.0 * t, "b": 0.0}, "reported": {"a": 5.0 * t, "b": 0.0}}
                   for t in range(9)]
        w = stats.prediction_windows(samples, windows=4)
        self.assertEqual(len(w), 4)
        self.assertEqual([x["error"] for x in w], [10.0, 10.0, 10.0, 10.0])
        self.assertEqual(w[0]["per_backend"], {"a": 10.0, "b": 0.0})
        none = [{"t": t, "predicted": {}, "reported": {"a": 1.0}} for t in range(3)]
        self.assertIsNone(stats.prediction_windows(none))


class Wire(unittest.TestCase):
    def test_an_mlx_lm_stream_read(self):
        lines = [(0.0, b": keepalive 10/40\n"), (0.0, b"\n"),
                 (0.5, b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n'),
                 (0.7, b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"t0 "}}]}\n'),
                 (0.9, b'data: {"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":1,'
                       b'"prompt_tokens_details":{"cached_tokens":39}}}\n'),
                 (1.0, b"data: [DONE]\n")]
        ev = read_events(iter(lines))
        self.assertEqual(ev["first_content_at"], 0.7)
        self.assertEqual(ev["usage"]["prompt_tokens_details"]["cached_tokens"], 39)
        self.assertTrue(ev["done"])
        self.assertIsNone(ev["error"])
        err = read_events(iter([(0.1, b'data: {"error":{"message":"backend died"}}\n')]))
        self.assertEqual(err["error"], {"message": "backend died"})

    def test_the_gateway_config(self):
        y = gateway_yaml("session", None, health=False)
        self.assertIn("    backends: [a, b]\n", y)
        self.assertIn("    balance: {policy: session}\n", y)
        self.assertEqual(y.count("kind: mlx-lm"), 2)
        self.assertIn("    upstream_model: default_model\n", y)
        self.assertNotIn("health:", y)
        y = gateway_yaml("cache_aware", "/m/x", health=True)
        self.assertIn("    upstream_model: /m/x\n", y)
        self.assertEqual(y.count("health: {interval: 1s"), 2)
        y = gateway_yaml("single", None, health=False)
        self.assertIn("    backend: a\n", y)
        self.assertNotIn("balance:", y)


class Json(unittest.TestCase):
    def test_the_raw_figures_are_standard_json(self):
        from .cli import finite
        self.assertEqual(finite({"a": [float("inf"), 1.5, float("nan")], "b": {"c": float("-inf")}, "d": "x"}),
                         {"a": [None, 1.5, None], "b": {"c": None}, "d": "x"})


class Report(unittest.TestCase):
    def test_it_renders_policies_the_oracle_goals_and_the_self_correction(self):
        s = stats.summarize([{"prompt_tokens": 100, "cached_tokens": 60, "ttft_s": 0.1}], {"a": 1.0, "b": 1.0})
        res = {"backends": "sim", "date": "d", "machine": "m", "commit": "c", "elapsed_s": 60, "loadavg_start": "0",
               "backends_what": "two sims", "max_tokens": 8, "command": "bench/balance",
               "workload": {"seed": 21, "conversations": 7, "turns": "11–14", "requests": 88, "clients": 3},
               "oracle": {"prefilled": 40, "prefilled_shared": 38}, "oracle_tokens": 40, "oracle_shared_tokens": 38,
               "policies": {"cache_aware": s, "round_robin": dict(s, prefilled=80)},
               "goals": stats.goals({"cache_aware": s, "round_robin": dict(s, prefilled=80)}, 40),
               "self_correction": {"cache_size": 2, "restart_after": 44, "restart_at_s": 12.0, "summary": s,
                                   "windows": None, "predicted_metric": "x_total",
                                   "client_quarters": [{"quarter": 1, "requests": 1, "prompt_tokens": 100,
                                                        "cached": 60, "prefilled": 40}]}}
        md = report.render(res)
        self.assertIn("| cache_aware | 40 | 1.00 | 0.50 | 60 |", md)
        self.assertIn("| oracle | 40 | 1.00 | 0.50 |", md)
        self.assertIn("| oracle, common prefix shared | 38 | 0.95 | 0.47 |", md)
        self.assertIn("cache_aware prefilled 1.05× that.", md)
        self.assertIn("not measured", md)
        self.assertIn("| cache_aware prefilled ≤ 1.1× the oracle's | 1.00 | yes |", md)


def run() -> int:
    suite = unittest.defaultTestLoader.loadTestsFromModule(__import__(__name__, fromlist=["*"]))
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    return 0 if result.wasSuccessful() else 1
