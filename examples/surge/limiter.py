"""The API's front door: ratelimitd decides, over its Unix socket, whether a request may
reach the matching service. Built from the project's Python client (clients/python):
its AsyncClient (pipelined, never blocks the event loop) and its ASGI middleware.

Two rules, both token buckets kept by the daemon:
- the rider's own bucket (key = the X-User-Id header), through the client's
  RateLimitMiddleware: fairness, one rider cannot take more than its share however
  hard it refreshes; 429 with Retry-After and the RateLimit headers;
- the matching service's guard (one key for the whole service, refilled below the
  pool's capacity): the aggregate bound that per-rider buckets cannot give when
  thousands of riders arrive at once, each with a full bucket.
Order matters, so that no budget is spent on a request that is refused anyway: the
guard is first looked at without taking anything (cost 0) and an empty guard refuses
at once; then the rider's bucket takes its token; then the guard takes one. (Two riders
racing for the guard's last token can still cost the loser one of its own: rare, and
on the safe side.)
"""

from __future__ import annotations

import os
import sys
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT_SRC = os.path.join(HERE, "..", "..", "clients", "python", "src")
if os.path.isdir(CLIENT_SRC) and CLIENT_SRC not in sys.path:
    sys.path.append(CLIENT_SRC)  # the client from this checkout, not installed

from ratelimitd import AsyncClient, response_headers  # noqa: E402
from ratelimitd.asgi import RateLimitMiddleware  # noqa: E402

GUARD_KEY = "matching"
BUSY_BODY = b'{"error": "service busy"}'


class CountingClient:
    """The AsyncClient, counting decisions by verdict and source for the report
    ("look" = a cost-0 look at the guard). Wraps rather than subclasses: only the
    client's public methods are relied on."""

    def __init__(self, client: AsyncClient):
        self.client = client
        self.sources: Counter = Counter()

    async def check(self, rule, key, cost=1):
        return (await self.check_many([(rule, key, cost)]))[0]

    async def check_many(self, checks):
        checks = list(checks)
        results = await self.client.check_many(checks)
        for c, r in zip(checks, results):
            verdict = "look:" if len(c) > 2 and c[2] == 0 else "allow:" if r.allowed else "deny:"
            self.sources[verdict + r.source] += 1
        return results


class Guard:
    """ASGI middleware for the matching service's guard rule: `take=False` only looks
    (cost 0) and refuses when the guard is empty; `take=True` takes a token."""

    def __init__(self, app, client: CountingClient, rule: str, take: bool):
        self.app, self.client, self.rule, self.take = app, client, rule, take

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/api/"):
            return await self.app(scope, receive, send)
        r = await self.client.check(self.rule, GUARD_KEY, 1 if self.take else 0)
        refused = not r.allowed if self.take else (r.remaining < 1 and not r.from_client)
        if not refused:
            return await self.app(scope, receive, send)
        headers = response_headers([r])
        headers.setdefault("Retry-After", "1")  # a look (cost 0) says allowed: no wait
        hdrs = [(b"content-type", b"application/json"),
                (b"content-length", str(len(BUSY_BODY)).encode())]
        hdrs += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        await send({"type": "http.response.start", "status": 429, "headers": hdrs})
        await send({"type": "http.response.body", "body": BUSY_BODY})


def rider_key(scope):
    """The rider's id from X-User-Id (without one: the peer address); only /api/."""
    if not scope["path"].startswith("/api/"):
        return None
    for k, v in scope.get("headers", ()):
        if k == b"x-user-id":
            return "rider:" + v.decode("latin-1")
    return "addr:" + (scope.get("client") or ("unknown",))[0]


def front_door(app, socket_path: str, rider_rule: str, guard_rule: str = ""):
    """`app` behind the limiter; returns (the wrapped app, the decision counters)."""
    client = CountingClient(AsyncClient(socket_path, timeout=0.1, fail_open=True))
    inner = Guard(app, client, guard_rule, take=True) if guard_rule else app
    door = RateLimitMiddleware(inner, client=client, rule=rider_rule, key=rider_key,
                               legacy_headers=True)
    if guard_rule:
        door = Guard(door, client, guard_rule, take=False)
    return door, client.sources
