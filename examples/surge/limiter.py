"""The API's front door: an ASGI middleware that asks ratelimitd (over its Unix socket,
with the project's Python client) before a request may reach the matching service.

Two rules, both token buckets kept by the daemon:
- the rider's own bucket (key = the X-User-Id header): fairness, one rider cannot take
  more than its share however hard it refreshes;
- the matching service's guard (one key for the whole service, refill below the pool's
  capacity): the aggregate bound that per-rider buckets cannot give when thousands of
  riders arrive at once, each with a full bucket.
The rider's bucket is asked first; the guard only for requests the rider's bucket lets
through, so a rider who is over its own limit never spends the shared budget.

A denied request gets 429 with Retry-After and the rate-limit headers of the rule that
denied it; an allowed one carries the rider bucket's headers. The client call blocks
the event loop for one Unix-socket round trip (tens of microseconds): cheaper, on a
single-threaded server, than handing it to a thread.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENTS = os.path.join(HERE, "..", "..", "clients", "python")
# The client as a package (clients/python/src/ratelimitd) or as one file.
for p in (os.environ.get("SURGE_CLIENT_PATH", ""), os.path.join(CLIENTS, "src"), CLIENTS):
    if p and os.path.isdir(p) and p not in sys.path:
        sys.path.append(p)

from ratelimitd import Client  # noqa: E402  (the project's client, found above)


class FrontDoor:
    """ASGI middleware: rate-limits paths under `prefix` by rider, then by the guard."""

    def __init__(self, app, socket_path: str, rider_rule: str, guard_rule: Optional[str],
                 prefix: str = "/api/"):
        self.app = app
        self.client = Client(socket_path, timeout=0.1, fail_open=True)
        self.rider_rule = rider_rule
        self.guard_rule = guard_rule
        self.prefix = prefix
        self.sources: dict = {}  # decision source -> count (redis, cache, local, ...)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            return await self.app(scope, receive, send)
        rider = _header(scope, b"x-user-id")
        if not rider:
            return await _reply(send, 400, {}, {"error": "X-User-Id header required"})
        result = self.client.check(self.rider_rule, "rider:" + rider)
        self._count(result)
        if result.allowed and self.guard_rule:
            guard = self.client.check(self.guard_rule, "matching")
            self._count(guard)
            if not guard.allowed:
                return await _reply(send, 429, guard.headers(), {"error": "service busy"})
        if not result.allowed:
            return await _reply(send, 429, result.headers(), {"error": "too many requests"})
        extra = [(k.lower().encode(), v.encode()) for k, v in result.headers().items()]

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message = dict(message, headers=list(message.get("headers", [])) + extra)
            await send(message)

        return await self.app(scope, receive, send_with_headers)

    def _count(self, result) -> None:
        key = ("allow:" if result.allowed else "deny:") + result.source
        self.sources[key] = self.sources.get(key, 0) + 1


def _header(scope, name: bytes) -> str:
    for k, v in scope.get("headers", ()):
        if k == name:
            return v.decode("latin-1")
    return ""


async def _reply(send, status: int, headers: dict, body: dict) -> None:
    payload = json.dumps(body).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    hdrs += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": payload})
