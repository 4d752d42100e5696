"""`bench/overhead --self-test`: unit tests of the harness's pure pieces (no process started): the
content events of each face, the requests of each target, which resource bounded a rate step, the
verdict rule, the quota's refusal where cgroups are missing, and the picture."""

from __future__ import annotations

import json
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path

from . import quota
from .goals import ratio_goal
from .load import content_of
from .phases import bounded_by
from .picture import render_svg
from .targets import chat_body, face_of, process_of, route_headers, stream_request
from .text import verdict


def event(obj: dict, name: str | None = None) -> bytes:
    return ((f"event: {name}\n" if name else "") + "data: " + json.dumps(obj)).encode()


class Faces(unittest.TestCase):
    def test_content_events_of_each_face(self) -> None:
        chat = event({"choices": [{"index": 0, "delta": {"content": "t0 "}}]})
        self.assertEqual(content_of(chat), "t0 ")
        self.assertIsNone(content_of(event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})))
        self.assertIsNone(content_of(b"data: [DONE]"))
        responses = event({"type": "response.output_text.delta", "item_id": "m", "output_index": 0,
                           "content_index": 0, "delta": "t1 "}, "response.output_text.delta")
        self.assertEqual(content_of(responses), "t1 ")
        for lifecycle in ["response.created", "response.output_item.added", "response.content_part.added",
                          "response.output_text.done", "response.completed"]:
            self.assertIsNone(content_of(event({"type": lifecycle, "response": {}}, lifecycle)), lifecycle)
        messages = event({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "t2 "}},
                         "content_block_delta")
        self.assertEqual(content_of(messages), "t2 ")
        for lifecycle in ["message_start", "content_block_start", "content_block_stop", "message_delta", "ping",
                          "message_stop"]:
            self.assertIsNone(content_of(event({"type": lifecycle}, lifecycle)), lifecycle)

    def test_face_targets_name_their_process_path_and_body(self) -> None:
        self.assertEqual((process_of("mlxgate:responses"), face_of("mlxgate:responses")), ("mlxgate", "responses"))
        self.assertEqual((process_of("nginx"), face_of("nginx")), ("nginx", "chat"))
        body = chat_body("stream", True, "responses")
        self.assertEqual((body["input"], body["stream"]), ("Say hello in one word.", True))
        body = chat_body("stream", True, "messages")
        self.assertEqual(body["messages"][0]["role"], "user")
        self.assertIn("max_tokens", body)
        _, raw = stream_request("mlxgate-before:messages", "stream")
        head = raw.split(b"\r\n\r\n", 1)[0].decode()
        self.assertTrue(head.startswith("POST /v1/messages HTTP/1.1"))
        self.assertIn("anthropic-version: 2023-06-01", head)

    def test_portkey_is_told_the_simulator(self) -> None:
        h = route_headers("portkey", "slow")
        self.assertEqual(h["x-portkey-provider"], "openai")
        self.assertTrue(h["x-portkey-custom-host"].endswith(":19405/v1"))
        self.assertNotIn("x-portkey-provider", route_headers("mlxgate", "slow"))


class Bounds(unittest.TestCase):
    def test_mlxgate_runs_one_event_loop_as_nginx_one_worker(self) -> None:
        from .processes import gateway_yaml
        self.assertIn("worker_threads: 1", gateway_yaml(1, full=False, tokenizer=""))
        self.assertIn("worker_threads: 1", gateway_yaml(1, full=True, tokenizer="/t"))
        # The "before" binaries predate the key (an unknown key is refused).
        self.assertNotIn("worker_threads", gateway_yaml(1, full=False, tokenizer="", one_thread=False))

    def test_which_resource_bounded_a_step(self) -> None:
        self.assertEqual(bounded_by("mlxgate", {"proxy_use": 0.97, "load_own": 0.2, "load_busy": 0.3}, 0.25),
                         "proxy quota")
        self.assertEqual(bounded_by("mlxgate", {"proxy_use": 0.97, "load_own": 0.2, "load_busy": 0.3}, 0),
                         "proxy CPU")
        self.assertEqual(bounded_by("direct", {"load_own": 0.95, "load_busy": 0.99}, 0.25), "load generator CPU")
        self.assertEqual(bounded_by("nginx", {"proxy_use": 0.95, "load_own": 0.93, "load_busy": 1.0}, 0.25),
                         "proxy quota and load generator CPU")
        self.assertTrue(bounded_by("nginx", {"proxy_use": 0.7, "load_own": 0.3, "load_busy": 0.95}, 0.25)
                        .startswith("CPU 1 shared with other jobs"))
        self.assertTrue(bounded_by("nginx", {"proxy_use": 0.5, "load_own": 0.3, "load_busy": 0.4}, 0.25)
                        .startswith("neither"))

    def test_a_missing_controller_is_said_not_skipped(self) -> None:
        roots = quota.V1_ROOT, quota.V2_ROOT
        quota.V1_ROOT, quota.V2_ROOT = Path("/nonexistent/cpu"), Path("/nonexistent")
        try:
            if quota.os.geteuid() == 0:
                with self.assertRaisesRegex(quota.QuotaUnavailable, "no cgroup cpu controller"):
                    quota.quotas({"nginx": 1}, 0.25, 4000)
            else:
                with self.assertRaisesRegex(quota.QuotaUnavailable, "not root"):
                    quota.quotas({"nginx": 1}, 0.25, 4000)
        finally:
            quota.V1_ROOT, quota.V2_ROOT = roots


class Verdicts(unittest.TestCase):
    def test_the_noise_floor_rule(self) -> None:
        self.assertEqual(verdict(10, 30, 5), "met")
        self.assertEqual(verdict(40, 30, 5), "**not met**")
        self.assertTrue(verdict(28, 30, 5).startswith("undetermined"))
        self.assertTrue(verdict(10, 30, None).startswith("met (one round"))

    def test_a_ratio_goal_pairs_the_rounds(self) -> None:
        a = [{"round": 0, "x": 30.0}, {"round": 1, "x": 34.0}]
        b = [{"round": 0, "x": 20.0}, {"round": 1, "x": 20.0}]
        med_a, med_b, floor = ratio_goal(a, b, "x", 1.5)
        self.assertEqual((med_a, med_b, floor), (32.0, 20.0, 4.0))


class Picture(unittest.TestCase):
    def test_the_svg_is_well_formed_and_has_a_bar_per_proxy_and_panel(self) -> None:
        lat = {t: {"cpu_us_per_req": c, "added_p50": c, "added_p99": 3 * c}
               for t, c in [("mlxgate", 90.0), ("nginx", 40.0), ("litellm", 8000.0)]}
        rate = {t: {"peak_conns": 16, "steps": {16: {"cpu_us_per_req": c}}}
                for t, c in [("mlxgate", 60.0), ("nginx", 20.0), ("litellm", 9000.0)]}
        st = {t: {"cpu_us_per_chunk": c} for t, c in [("mlxgate", 20.0), ("nginx", 15.0), ("litellm", 1500.0)]}
        res = {"targets": ["direct", "mlxgate", "nginx", "litellm"], "latency": {"summary": lat},
               "rate": {"summary": rate, "quota": 0.25}, "streams": {"summary": st}, "date": "d",
               "machine": {"commit": "abc"}}
        root = ET.fromstring(render_svg(res))
        rects = [r for r in root.iter("{http://www.w3.org/2000/svg}rect") if r.get("fill") != "white"]
        self.assertEqual(len(rects), 5 * 3)
        texts = "".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
        self.assertIn("8000 (cut)", texts)  # LiteLLM beyond the gateways' scale


def run() -> int:
    suite = unittest.defaultTestLoader.loadTestsFromModule(__import__(__name__, fromlist=["*"]))
    return 0 if unittest.TextTestRunner(verbosity=1).run(suite).wasSuccessful() else 1
