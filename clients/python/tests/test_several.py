"""Several limits at once: conformance.json's several_cases (CHECKALL and REFUND)
through the blocking and asyncio clients, its several_header_cases through both
middlewares with ``all_or_nothing=True``, and that middleware and the asyncio
client's calls against a real daemon (rule "api": 5 per key, barely refilling;
"fast": unlimited)."""

from __future__ import annotations

import asyncio
import logging
import os
import unittest
from typing import Any, Dict, List, Tuple

from ratelimitd import AsyncClient, Client, RequestError, Result
from ratelimitd.asgi import RateLimitMiddleware as ASGIMiddleware
from ratelimitd.wsgi import RateLimitMiddleware as WSGIMiddleware

from support import Daemon, FakeDaemon, load_cases, tmpdir
from test_conformance import as_dict, rl_headers

Checks = List[Tuple[str, str, int]]


def options(case: dict) -> Dict[str, Any]:
    return {"fail_open": True, "legacy_headers": False, "timeout_ms": 5000, **case.get("options", {})}


def checks_of(case: dict) -> Checks:
    return [(c[0], c[1], c[2]) for c in case["checks"]]


def call_sync(case: dict, path: str, o: Dict[str, Any]) -> Result:
    with Client(path, timeout=o["timeout_ms"] / 1000, fail_open=o["fail_open"]) as c:
        if case["call"] == "refund":
            return c.refund(*checks_of(case)[0])
        return c.check_all(checks_of(case))


def call_async(case: dict, path: str, o: Dict[str, Any]) -> Result:
    async def go() -> Result:
        async with AsyncClient(path, timeout=o["timeout_ms"] / 1000, fail_open=o["fail_open"]) as c:
            if case["call"] == "refund":
                return await c.refund(*checks_of(case)[0])
            return await c.check_all(checks_of(case))
    return asyncio.run(go())


def wsgi_request(c: Client, checks: Checks, legacy: bool) -> Tuple[int, Dict[str, str], bool]:
    """One GET through the all-or-nothing WSGI middleware: status, headers, app ran."""
    ran: List[bool] = []

    def app(environ: dict, start_response: Any) -> List[bytes]:
        ran.append(True)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    mw = WSGIMiddleware(app, c, checks=lambda environ: checks, legacy_headers=legacy, all_or_nothing=True)
    got: Dict[str, Any] = {}

    def start_response(status: str, headers: List[Tuple[str, str]], exc_info: Any = None) -> None:
        got["status"], got["headers"] = int(status.split()[0]), headers

    b"".join(mw({"REQUEST_METHOD": "GET", "PATH_INFO": "/"}, start_response))
    return got["status"], rl_headers(got["headers"]), bool(ran)


def via_wsgi(case: dict, path: str, o: Dict[str, Any]) -> Tuple[int, Dict[str, str], bool]:
    with Client(path, timeout=o["timeout_ms"] / 1000, fail_open=o["fail_open"]) as c:
        return wsgi_request(c, checks_of(case), o["legacy_headers"])


async def asgi_request(c: AsyncClient, checks: Checks, legacy: bool) -> Tuple[int, Dict[str, str], bool]:
    """One GET through the all-or-nothing ASGI middleware: status, headers, app ran."""
    ran: List[bool] = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        ran.append(True)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})

    mw = ASGIMiddleware(app, c, checks=lambda scope: checks, legacy_headers=legacy, all_or_nothing=True)
    sent: List[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b""}

    async def send(m: dict) -> None:
        sent.append(m)

    await mw({"type": "http", "method": "GET", "path": "/", "headers": [], "client": ("127.0.0.1", 1)}, receive, send)
    start = sent[0]
    return start["status"], rl_headers([(k.decode(), v.decode()) for k, v in start["headers"]]), bool(ran)


def via_asgi(case: dict, path: str, o: Dict[str, Any]) -> Tuple[int, Dict[str, str], bool]:
    async def go() -> Tuple[int, Dict[str, str], bool]:
        async with AsyncClient(path, timeout=o["timeout_ms"] / 1000, fail_open=o["fail_open"]) as c:
            return await asgi_request(c, checks_of(case), o["legacy_headers"])
    return asyncio.run(go())


class SeveralConformance(unittest.TestCase):
    def setUp(self) -> None:
        logging.disable(logging.WARNING)  # absent daemons: the one warning is tested elsewhere
        self.addCleanup(logging.disable, logging.NOTSET)


def make_test(case: dict, run: Any, http: bool) -> Any:
    def test(self: unittest.TestCase) -> None:
        fake = FakeDaemon(case["daemon"], case.get("replies"))
        try:
            expect = case["expect"]
            if "raises" in expect:
                with self.assertRaises(RequestError) as e:
                    run(case, fake.path, options(case))
                self.assertEqual(e.exception.code, expect["raises"])
            elif http:
                status, headers, ran = run(case, fake.path, options(case))
                self.assertEqual(status, expect["status"])
                self.assertEqual(ran, status == 200, "the app runs exactly when allowed")
                self.assertEqual(headers, {k.lower(): v for k, v in expect["headers"].items()})
            else:
                r = run(case, fake.path, options(case))
                self.assertEqual({**as_dict(r), "rule": r.rule}, expect["result"])
            if "requests" in case:
                self.assertEqual(fake.requests, case["requests"])
            if case["daemon"] in ("stall", "close"):
                self.assertEqual(fake.connections, 1, "a timeout or a fresh connection closed: no retry")
        finally:
            fake.close()

    return test


for _case in load_cases("several_cases"):
    for _way, _run in (("sync", call_sync), ("async", call_async)):
        setattr(SeveralConformance, f"test_{_way}_{_case['name']}", make_test(_case, _run, False))
for _case in load_cases("several_header_cases"):
    for _way, _run in (("wsgi", via_wsgi), ("asgi", via_asgi)):
        setattr(SeveralConformance, f"test_{_way}_{_case['name']}", make_test(_case, _run, True))


class AllOrNothingDaemonTest(unittest.TestCase):
    """The all-or-nothing middleware against a real daemon: a denied request takes
    nothing from the other rule, and the headers list both rules."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.d = Daemon()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.d.stop()

    def test_wsgi_denied_requests_take_nothing_from_the_other_rule(self) -> None:
        with Client(self.d.socket, timeout=5.0) as c:
            c.check("api", "py:mw:a", 3)  # "a" has 2 left, "b" 5
            checks: Checks = [("api", "py:mw:a", 1), ("fast", "py:mw:a", 1), ("api", "py:mw:b", 1)]
            for left in (1, 0):
                status, h, ran = wsgi_request(c, checks, False)
                self.assertEqual((status, ran), (200, True))
                self.assertRegex(h["ratelimit"], rf'^"api";r={left};t=\d+$')
            self.assertRegex(h["ratelimit-policy"], r'^"api";q=5;w=5000, "fast";q=1000000;w=\d+$')
            for _ in range(3):
                status, h, ran = wsgi_request(c, checks, False)
                self.assertEqual((status, ran), (429, False))
                self.assertGreater(int(h["retry-after"]), 0)
            # Two allowed requests took 2 of b's 5; the three denied ones took nothing.
            self.assertEqual(c.check("api", "py:mw:b", 0).remaining, 3)

    def test_asgi_and_async_calls(self) -> None:
        async def go() -> None:
            async with AsyncClient(self.d.socket, timeout=5.0) as c:
                both: Checks = [("fast", "py:aall", 1), ("api", "py:aall", 1)]
                for left in (4, 3):
                    r = await c.check_all(both)
                    self.assertEqual((r.allowed, r.remaining, r.rule), (True, left, "api"))
                status, h, ran = await asgi_request(c, both, False)
                self.assertEqual((status, ran), (200, True))
                self.assertRegex(h["ratelimit"], r'^"api";r=2;t=\d+$')
                r = await c.refund("api", "py:aall", 1)  # without Redis: the state, nothing back
                self.assertEqual((r.allowed, r.limit, r.remaining, r.source), (True, 5, 2, "local"))
                with self.assertRaises(RequestError):
                    await c.check_all([("api", f"k{i}", 1) for i in range(9)])
        asyncio.run(go())

    def test_async_client_warns_once_naming_the_path(self) -> None:
        missing = os.path.join(tmpdir("rl-py-amissing-"), "nothing.sock")

        async def go() -> List[Result]:
            async with AsyncClient(missing) as c:
                return [await c.check("api", "k"), await c.check_all([("api", "k")]), await c.refund("api", "k", 1)]
        with self.assertLogs("ratelimitd", level="WARNING") as logs:
            rs = asyncio.run(go())
        self.assertEqual([r.source for r in rs], ["client_fail_open"] * 3)
        self.assertEqual(len(logs.output), 1, logs.output)
        self.assertIn(missing, logs.output[0])


if __name__ == "__main__":
    unittest.main()
