"""What each target is on the wire: its port and path, its headers, and the chat requests sent to it."""

from __future__ import annotations

import json

from .settings import CLIENT_KEY, GATEWAY_FULL_PORT, GATEWAY_PORT, HOST, LITELLM_PORT, NGINX_PORTS, SIM_PORTS


def base_url(target: str, route: str) -> tuple[int, str]:
    """(port, path) of the chat endpoint for a target and a simulator."""
    port = {"direct": SIM_PORTS[route], "mlxgate": GATEWAY_PORT, "mlxgate-full": GATEWAY_FULL_PORT,
            "nginx": NGINX_PORTS[route], "litellm": LITELLM_PORT}[target]
    return port, "/v1/chat/completions"


def auth_headers(target: str) -> dict[str, str]:
    """The headers a client of this target sends beyond the request's own (mlxgate-full's key)."""
    return {"Authorization": f"Bearer {CLIENT_KEY}"} if target == "mlxgate-full" else {}


def chat_body(route: str, stream: bool) -> dict:
    body: dict = {"model": route, "messages": [{"role": "user", "content": "Say hello in one word."}],
                  "max_tokens": 1000 if stream else 16}
    if stream:
        body["stream"] = True
    return body


def stream_request(target: str, route: str) -> tuple[int, bytes]:
    """(port, bytes) of one streamed chat request over HTTP/1.1 keep-alive."""
    port, path = base_url(target, route)
    body = json.dumps(chat_body(route, True)).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in auth_headers(target).items())
    head = (f"POST {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\n{extra}Content-Length: {len(body)}\r\n\r\n")
    return port, head.encode() + body
