"""The agents, in one of two shapes (`--agents`):

- `side` (the default, Claude Code's shape: its small fast model does background work — titles,
  summaries — beside the main conversation): each agent's main loop sends a streamed chat
  completion of its short growing conversation to the majority model, waits for the whole answer,
  thinks, and goes on; after a main turn it also sends, with a probability that makes the minority
  model's share of all requests `MINORITY_SHARE`, a side call to the minority model on a thread of
  its own, which it does not wait for (every draw is sent, however many are under way: the
  minority model's load does not shrink when it waits longer).
- `blocking` (an agent that waits for every answer, e.g. an editor model's turn): each agent sends
  its request to one of the two models (its first to the majority model, as a session opens with
  its main model; then the minority one with a fixed probability), waits for the whole answer,
  thinks, and goes on.
 Every draw (model, think time, message) comes
from the agent's own seeded RNG, so every run sends the same sequence of models per agent. One
record per request: when it was sent, its status, the time to the first byte of the body (the
wait a user sees) and to the first content token, whether the stream ended whole, and which
model served it (the fallback header)."""

from __future__ import annotations

import http.client
import json
import random
import threading
import time

from .settings import (
    AGENTS, FALLBACK_HEADER, HOST, MAJORITY, MAX_TOKENS, MINORITY, MINORITY_SHARE, REQUEST_TIMEOUT_S, SEED,
    THINK_S, TURNS_PER_CONVERSATION,
)

TASKS = [
    "Write a function that parses a duration like 30s or 5m.", "Summarise this diff in one line.",
    "Name this conversation in five words.", "Is this test flaky? It sleeps 10 ms.", "Rename the variable x to count.",
    "Explain what a mutex guards here.", "Suggest a commit message for a fix of an off-by-one.",
    "Which file owns the queue?", "Write a unit test for the percentile function.", "Why does this loop never end?",
]


def plan(agent: int, seed: int = SEED) -> random.Random:
    """The agent's RNG: the same seed, the same models, think times and messages in every run."""
    return random.Random(f"bench-swaps-{seed}-{agent}")


def draw(rng: random.Random, share: float = MINORITY_SHARE) -> tuple[str, float, str]:
    """The next turn of an agent: the model, the think time after it, the user's message."""
    model = MINORITY if rng.random() < share else MAJORITY
    think = rng.uniform(*THINK_S)
    return model, think, rng.choice(TASKS)


def body(model: str, messages: list[dict]) -> dict:
    return {"model": model, "messages": messages, "max_tokens": MAX_TOKENS, "stream": True,
            "stream_options": {"include_usage": True}}


def read_stream(lines) -> dict:
    """Reads an SSE answer from an iterator of (monotonic seconds, line bytes): the time of the
    first body line and of the first content delta, the text, any error event, whether a
    finish_reason and [DONE] came."""
    out: dict = {"first_byte_at": None, "first_content_at": None, "text": "", "error": None, "done": False,
                 "finished": False}
    for at, raw in lines:
        if out["first_byte_at"] is None:
            out["first_byte_at"] = at
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            out["done"] = True
            continue
        try:
            event = json.loads(data)
        except json.JSONDecodeError:
            continue
        if "error" in event:
            out["error"] = event["error"]
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            piece = delta.get("content") or delta.get("reasoning") or delta.get("reasoning_content") or ""
            if piece:
                out["text"] += piece
                if out["first_content_at"] is None:
                    out["first_content_at"] = at
            if choice.get("finish_reason"):
                out["finished"] = True
    return out


def send(port: int, model: str, messages: list[dict], request_id: str) -> dict:
    """One streamed request through the gateway; its record (times relative to its sending)."""
    started = time.monotonic()
    conn = http.client.HTTPConnection(HOST, port, timeout=REQUEST_TIMEOUT_S)
    rec: dict = {"model": model, "request_id": request_id}
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body(model, messages)).encode(),
                     headers={"Content-Type": "application/json", "x-request-id": request_id})
        resp = conn.getresponse()
        rec["status"] = resp.status
        rec["headers_s"] = time.monotonic() - started
        rec["served_by"] = resp.getheader(FALLBACK_HEADER) or model
        rec["fallback"] = resp.getheader(FALLBACK_HEADER) is not None
        if resp.status != 200:
            rec["error"] = resp.read()[:300].decode("utf-8", "replace")
            rec["seconds"] = time.monotonic() - started
            return rec

        def lines():
            while True:
                raw = resp.readline()
                if not raw:
                    return
                yield time.monotonic(), raw

        ev = read_stream(lines())
    except (OSError, http.client.HTTPException) as e:
        rec.update(status=rec.get("status", 0), error=f"{type(e).__name__}: {e}", seconds=time.monotonic() - started)
        return rec
    finally:
        conn.close()
    rec.update(
        seconds=time.monotonic() - started,
        first_byte_s=None if ev["first_byte_at"] is None else ev["first_byte_at"] - started,
        ttft_s=None if ev["first_content_at"] is None else ev["first_content_at"] - started,
        error=ev["error"], done=ev["done"], finished=ev["finished"], text=ev["text"][:400])
    return rec


def complete(rec: dict) -> bool:
    """An answer counts when it came whole: 200, no error event, a finish_reason and [DONE]."""
    return rec.get("status") == 200 and not rec.get("error") and bool(rec.get("done")) and bool(rec.get("finished"))


def side_probability(share: float = MINORITY_SHARE) -> float:
    """The chance of a side call after a main turn that makes the side calls `share` of all requests."""
    return share / (1.0 - share)


def run_agents(port: int, seconds: float, label: str, agents: int = AGENTS, seed: int = SEED,
               on_record=None, shape: str = "side") -> tuple[list[dict], float]:
    """The agents for `seconds` (no request is sent after; those under way finish); every
    record, and the wall seconds from the first request to the last answer."""
    records: list[dict] = []
    lock = threading.Lock()
    t0 = time.monotonic()
    deadline = t0 + seconds

    def agent(i: int) -> None:
        rng = plan(i, seed)
        history: dict[str, list[dict]] = {MAJORITY: [], MINORITY: []}
        turns: dict[str, int] = {MAJORITY: 0, MINORITY: 0}
        n = 0
        # Agents start a little apart, as sessions do (the first draw of each RNG).
        time.sleep(rng.uniform(0, 1.0))
        side_calls: list[threading.Thread] = []

        def side_call(messages: list[dict], request_id: str) -> None:
            sent = time.monotonic() - t0
            rec = send(port, MINORITY, messages, request_id)
            rec.update(agent=i, n=request_id, sent_s=sent, ended_s=time.monotonic() - t0, side=True)
            rec.pop("text", None)
            with lock:
                records.append(rec)
            if on_record is not None:
                on_record(rec)

        while time.monotonic() < deadline:
            model, think, task = draw(rng)
            if n == 0 or shape == "side":
                model = MAJORITY  # a session opens with its main model; side agents' main loop is it
            if turns[model] >= TURNS_PER_CONVERSATION:
                history[model], turns[model] = [], 0
            messages = history[model] + [{"role": "user", "content": task}]
            sent = time.monotonic() - t0
            rec = send(port, model, messages, f"{label}-a{i}-{n}")
            rec.update(agent=i, n=n, sent_s=sent, ended_s=time.monotonic() - t0)
            if complete(rec):
                history[model] = messages + [{"role": "assistant", "content": rec.get("text") or "ok"}]
                turns[model] += 1
            rec.pop("text", None)
            with lock:
                records.append(rec)
            if on_record is not None:
                on_record(rec)
            n += 1
            if shape == "side" and rng.random() < side_probability():
                side_calls = [t for t in side_calls if t.is_alive()]
                if time.monotonic() < deadline:
                    summary = [{"role": "user", "content": f"Name this conversation in five words: {task}"}]
                    call = threading.Thread(target=side_call, args=(summary, f"{label}-a{i}-s{n}"), daemon=True)
                    call.start()
                    side_calls.append(call)
            if time.monotonic() + think >= deadline:
                break
            time.sleep(think)
        for call in side_calls:
            call.join()

    threads = [threading.Thread(target=agent, args=(i,), daemon=True) for i in range(agents)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return records, time.monotonic() - t0
