"""The replay: every conversation of the workload as its own thread, turns in order (a turn is
sent once the previous answer is in, after the turn's "tool time"), streamed with usage; each
request's record: time to first token, prompt, cached and generated tokens from the usage."""

from __future__ import annotations

import http.client
import json
import threading
import time

from . import workload as wl
from .settings import HOST, MAX_TOKENS, PUBLIC_MODEL, REQUEST_TIMEOUT_S


def body(workload: dict, conv: dict, messages: list[dict]) -> dict:
    """One turn's request, as an agent sends it: the system prompt and tools of every
    conversation, the session id as OpenAI's `prompt_cache_key`, the client as `user`."""
    return {"model": PUBLIC_MODEL, "messages": messages, "tools": workload["tools"], "max_tokens": MAX_TOKENS,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
            "prompt_cache_key": conv["session"], "user": conv["client"]}


def read_events(lines) -> dict:
    """Reads an SSE answer from an iterator of (monotonic seconds, line bytes); returns the time
    of the first content delta, the last usage object, any error event, and whether [DONE] came."""
    out: dict = {"first_content_at": None, "usage": None, "error": None, "done": False}
    for at, raw in lines:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line.startswith("data:"):
            continue  # blank lines and ": keepalive" comments
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
            if out["first_content_at"] is None and (delta.get("content") or delta.get("reasoning")
                                                    or delta.get("tool_calls")):
                out["first_content_at"] = at
        if isinstance(event.get("usage"), dict):
            out["usage"] = event["usage"]
    return out


def send(port: int, payload: dict, headers: dict | None = None) -> dict:
    """One streamed request; the record's timing and usage fields."""
    started = time.monotonic()
    conn = http.client.HTTPConnection(HOST, port, timeout=REQUEST_TIMEOUT_S)
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(payload).encode(),
                     headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        if resp.status != 200:
            return {"status": resp.status, "error": resp.read()[:300].decode("utf-8", "replace"),
                    "seconds": time.monotonic() - started}

        def lines():
            while True:
                raw = resp.readline()
                if not raw:
                    return
                yield time.monotonic(), raw

        ev = read_events(lines())
    except (OSError, http.client.HTTPException) as e:
        return {"status": 0, "error": str(e), "seconds": time.monotonic() - started}
    finally:
        conn.close()
    usage = ev["usage"] or {}
    details = usage.get("prompt_tokens_details") or {}
    return {
        "status": 200, "done": ev["done"], "error": ev["error"],
        "ttft_s": None if ev["first_content_at"] is None else ev["first_content_at"] - started,
        "seconds": time.monotonic() - started,
        "prompt_tokens": usage.get("prompt_tokens") if ev["error"] is None else None,
        "cached_tokens": details.get("cached_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
    }


def replay(workload: dict, port: int, on_answer=None, conversations: list[dict] | None = None) -> list[dict]:
    """Replays the workload against the gateway on `port`; returns one record per request, in
    completion order. `on_answer(record)` is called after each answer (the restart scenario)."""
    records: list[dict] = []
    lock = threading.Lock()
    t0 = time.monotonic()

    def run(conv: dict) -> None:
        time.sleep(conv["start_seconds"])
        for k, (turn, messages) in enumerate(zip(conv["turns"], wl.prompts(workload, conv))):
            if k > 0:
                time.sleep(turn["tool_seconds"])
            sent = time.monotonic() - t0
            rec = send(port, body(workload, conv, messages))
            rec.update({"conv": conv["id"], "turn": k, "client": conv["client"], "sent_s": sent,
                        "words": len(wl.words_of(messages))})
            with lock:
                records.append(rec)
                rec["index"] = len(records)
            if on_answer is not None:
                on_answer(rec)

    threads = [threading.Thread(target=run, args=(c,), daemon=True)
               for c in (conversations or workload["conversations"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return records
