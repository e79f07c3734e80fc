"""The shared conformance table (clients/conformance.json) run through the blocking
client, the asyncio client, the WSGI middleware and the ASGI middleware: one test
per case and way, named after the case."""

from __future__ import annotations

import asyncio
import unittest
from typing import Any, Dict, List, Tuple

from ratelimitd import AsyncClient, Client, RequestError, Result
from ratelimitd.asgi import RateLimitMiddleware as ASGIMiddleware
from ratelimitd.wsgi import RateLimitMiddleware as WSGIMiddleware

from support import FakeDaemon, load_cases

RL_HEADERS = ("ratelimit", "ratelimit-policy", "retry-after")


def rl_headers(pairs: List[Tuple[str, str]]) -> Dict[str, str]:
    """The rate-limit headers of a response, lower-cased names."""
    return {k.lower(): v for k, v in pairs if k.lower() in RL_HEADERS or k.lower().startswith("x-ratelimit-")}


def as_dict(r: Result) -> Dict[str, Any]:
    return {"allowed": r.allowed, "limit": r.limit, "remaining": r.remaining, "reset_ms": r.reset_ms,
            "wait_ms": r.wait_ms, "window_ms": r.window_ms, "source": r.source, "error": bool(r.error)}


def checks_of(case: dict) -> List[Tuple[str, str, int]]:
    return [(c[0], c[1], c[2]) for c in case["checks"]]


def via_sync(case: dict, path: str, opts: dict) -> Any:
    with Client(path, timeout=opts["timeout_ms"] / 1000, fail_open=opts["fail_open"]) as c:
        checks = checks_of(case)
        return [c.check(*checks[0])] if len(checks) == 1 else c.check_many(checks)


def via_async(case: dict, path: str, opts: dict) -> Any:
    async def go() -> List[Result]:
        async with AsyncClient(path, timeout=opts["timeout_ms"] / 1000, fail_open=opts["fail_open"]) as c:
            checks = checks_of(case)
            return [await c.check(*checks[0])] if len(checks) == 1 else await c.check_many(checks)
    return asyncio.run(go())


def via_wsgi(case: dict, path: str, opts: dict) -> Tuple[int, Dict[str, str]]:
    def app(environ: dict, start_response: Any) -> List[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    with Client(path, timeout=opts["timeout_ms"] / 1000, fail_open=opts["fail_open"]) as c:
        mw = WSGIMiddleware(app, c, checks=lambda environ: checks_of(case), legacy_headers=opts["legacy_headers"])
        got: Dict[str, Any] = {}

        def start_response(status: str, headers: List[Tuple[str, str]], exc_info: Any = None) -> None:
            got["status"], got["headers"] = int(status.split()[0]), headers

        b"".join(mw({"REQUEST_METHOD": "GET", "PATH_INFO": "/"}, start_response))
        return got["status"], rl_headers(got["headers"])


def via_asgi(case: dict, path: str, opts: dict) -> Tuple[int, Dict[str, str]]:
    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async def go() -> Tuple[int, Dict[str, str]]:
        async with AsyncClient(path, timeout=opts["timeout_ms"] / 1000, fail_open=opts["fail_open"]) as c:
            mw = ASGIMiddleware(app, c, checks=lambda scope: checks_of(case), legacy_headers=opts["legacy_headers"])
            sent: List[dict] = []

            async def receive() -> dict:
                return {"type": "http.request", "body": b""}

            async def send(m: dict) -> None:
                sent.append(m)

            await mw({"type": "http", "method": "GET", "path": "/", "headers": [], "client": ("127.0.0.1", 1)},
                     receive, send)
            start = sent[0]
            return start["status"], rl_headers([(k.decode(), v.decode()) for k, v in start["headers"]])

    return asyncio.run(go())


WAYS = {"sync": via_sync, "async": via_async, "wsgi": via_wsgi, "asgi": via_asgi}


class Conformance(unittest.TestCase):
    pass


def make_test(case: dict, way: str) -> Any:
    def test(self: unittest.TestCase) -> None:
        opts = {"fail_open": True, "legacy_headers": False, "timeout_ms": 5000, **case.get("options", {})}
        fake = FakeDaemon(case["daemon"], case.get("replies"))
        try:
            expect = case["expect"]
            if "raises" in expect:
                with self.assertRaises(RequestError) as e:
                    WAYS[way](case, fake.path, opts)
                self.assertEqual(e.exception.code, expect["raises"])
            elif way in ("sync", "async"):
                got = WAYS[way](case, fake.path, opts)
                self.assertEqual([as_dict(r) for r in got], expect["results"])
            else:
                status, headers = WAYS[way](case, fake.path, opts)
                self.assertEqual(status, expect["status"])
                self.assertEqual(headers, {k.lower(): v for k, v in expect["headers"].items()})
            if "requests" in case:
                self.assertEqual(fake.requests, case["requests"])
            if case["daemon"] in ("stall", "close"):
                self.assertEqual(fake.connections, 1, "a timeout or a fresh connection closed: no retry")
        finally:
            fake.close()

    return test


for _case in load_cases():
    for _way in WAYS:
        setattr(Conformance, f"test_{_way}_{_case['name']}", make_test(_case, _way))


if __name__ == "__main__":
    unittest.main()
