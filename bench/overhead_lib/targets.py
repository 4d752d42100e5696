"""What each target is on the wire: its port and path, its headers, and the requests sent to it.

A target is a path of the measurement: "direct", a proxy process ("mlxgate", "nginx", ...), or a
face of a gateway ("mlxgate:responses": the mlxgate process, its Responses face)."""

from __future__ import annotations

import json

from .settings import (
    CLIENT_KEY, GATEWAY_BEFORE_PORT, GATEWAY_FULL_PORT, GATEWAY_PORT, HOST, LITELLM_PORT, NGINX_PORTS, PORTKEY_PORT,
    SIM_PORTS,
)


FACE_PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


def process_of(target: str) -> str:
    """The process a target's requests go through ("mlxgate:responses" → "mlxgate")."""
    return target.split(":", 1)[0]


def face_of(target: str) -> str:
    """The API face a target's requests use ("chat" unless named)."""
    return target.split(":", 1)[1] if ":" in target else "chat"


def base_url(target: str, route: str) -> tuple[int, str]:
    """(port, path) of the target's endpoint for a simulator."""
    port = {"direct": SIM_PORTS[route], "mlxgate": GATEWAY_PORT, "mlxgate-before": GATEWAY_BEFORE_PORT,
            "mlxgate-full": GATEWAY_FULL_PORT, "nginx": NGINX_PORTS[route], "litellm": LITELLM_PORT,
            "portkey": PORTKEY_PORT}[process_of(target)]
    return port, FACE_PATHS[face_of(target)]


def auth_headers(target: str) -> dict[str, str]:
    """The headers a client of this target sends beyond the request's own: mlxgate-full's key;
    Portkey's provider and the simulator as its custom host; the Anthropic face's version."""
    out: dict[str, str] = {}
    if process_of(target) == "mlxgate-full":
        out["Authorization"] = f"Bearer {CLIENT_KEY}"
    if face_of(target) == "messages":
        out["anthropic-version"] = "2023-06-01"
    return out


def route_headers(target: str, route: str) -> dict[str, str]:
    """auth_headers plus what depends on the simulator (Portkey is told where to send each request)."""
    out = auth_headers(target)
    if process_of(target) == "portkey":
        out.update({"x-portkey-provider": "openai", "x-portkey-custom-host": f"http://{HOST}:{SIM_PORTS[route]}/v1",
                    "Authorization": "Bearer sk-bench"})
    return out


PROMPT = "Say hello in one word."


def long_prompt(words: int) -> str:
    """A long user prompt of ordinary English (about 1.3 tokens a word with Qwen's vocabulary)."""
    base = ("The gateway counts every prompt it forwards so that limits and context caps hold; "
            "this paragraph repeats to make a long prompt of plain English words for that count. ").split()
    return " ".join(base[i % len(base)] for i in range(words))


def chat_body(route: str, stream: bool, face: str = "chat", prompt: str = PROMPT) -> dict:
    """The request body of a face; the streamed ones ask for `max_tokens` the sim's answer length."""
    max_tokens = 1000 if stream else 16
    if face == "responses":
        body: dict = {"model": route, "input": prompt, "max_output_tokens": max_tokens}
    elif face == "messages":
        body = {"model": route, "max_tokens": max_tokens, "messages": [{"role": "user", "content": prompt}]}
    else:
        body = {"model": route, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    if stream:
        body["stream"] = True
    return body


def stream_request(target: str, route: str) -> tuple[int, bytes]:
    """(port, bytes) of one streamed request over HTTP/1.1 keep-alive."""
    port, path = base_url(target, route)
    body = json.dumps(chat_body(route, True, face_of(target))).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in route_headers(target, route).items())
    head = (f"POST {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\n{extra}Content-Length: {len(body)}\r\n\r\n")
    return port, head.encode() + body

