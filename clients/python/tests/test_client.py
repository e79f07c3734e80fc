"""The blocking and asyncio clients against a real daemon (redis.mode = "none"; rule
"api": a token bucket of 5 refilling one token every ~17 minutes, so counts are
exact; rule "fast": effectively unlimited)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import unittest
from typing import List

import ratelimitd
from ratelimitd import AsyncClient, Client, RequestError, encode_key

from support import Daemon, tmpdir

API_WINDOW_S = 5000  # ceil(capacity 5 / refill 0.001 per s)


class Installed(unittest.TestCase):
    def test_package_is_installed_and_typed(self) -> None:
        pkg = os.path.dirname(ratelimitd.__file__)
        if os.environ.get("RL_REQUIRE_INSTALLED"):
            self.assertIn("site-packages", pkg, "tests must run against the pip-installed package")
        self.assertTrue(os.path.exists(os.path.join(pkg, "py.typed")))


class SyncClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.d = Daemon()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.d.stop()

    def client(self, **kw: object) -> Client:
        c = Client(self.d.socket, **{"timeout": 5.0, **kw})  # type: ignore[arg-type]
        self.addCleanup(c.close)
        return c

    def test_check_all_is_all_or_nothing_and_names_the_binding_rule(self) -> None:
        rl = self.client()
        for left in (4, 3, 2, 1, 0):
            r = rl.check_all([("fast", "py:all"), ("api", "py:all", 1)])
            self.assertEqual((r.allowed, r.remaining, r.rule), (True, left, "api"))
        r = rl.check_all([("fast", "py:all"), ("api", "py:all")])
        self.assertEqual((r.allowed, r.rule), (False, "api"))
        with self.assertRaises(RequestError):
            rl.check_all([])
        # Without Redis (this daemon) nothing is given back: the state after it.
        r = rl.refund("api", "py:all", 2)
        self.assertEqual((r.allowed, r.limit, r.source), (True, 5, "local"))

    def test_an_unreachable_daemon_is_warned_about_once_naming_the_path(self) -> None:
        missing = os.path.join(tmpdir("rl-py-missing-"), "nothing.sock")
        rl = Client(missing)
        self.addCleanup(rl.close)
        with self.assertLogs("ratelimitd", level="WARNING") as logs:
            for _ in range(3):
                self.assertEqual(rl.check("api", "k").source, "client_fail_open")
        self.assertEqual(len(logs.records), 1, logs.output)
        self.assertIn(missing, logs.output[0])

    def test_counts_down_then_denies_with_draft_headers(self) -> None:
        rl = self.client()
        for left in (4, 3, 2, 1, 0):
            r = rl.check("api", "py:count")
            self.assertEqual((r.allowed, r.limit, r.remaining, r.source), (True, 5, left, "local"))
        r = rl.check("api", "py:count")
        self.assertFalse(r.allowed)
        self.assertGreater(r.wait_ms, 0)
        self.assertEqual(r.window_ms, API_WINDOW_S * 1000)
        h = r.headers()
        self.assertEqual(h["RateLimit-Policy"], f'"api";q=5;w={API_WINDOW_S}')
        self.assertRegex(h["RateLimit"], r'^"api";r=0;t=\d+$')
        self.assertEqual(h["Retry-After"], str(-(-r.wait_ms // 1000)))
        self.assertNotIn("X-RateLimit-Limit", h)
        self.assertEqual(r.headers(legacy=True)["X-RateLimit-Remaining"], "0")
        self.assertNotIn("Retry-After", rl.check("api", "py:other").headers())

    def test_check_many_pipelines_in_order(self) -> None:
        rl = self.client()
        checks = [("api", "py:pipe")] * 7 + [("api", "py:pipe2", 2), ("fast", "x", 0)]
        rs = rl.check_many(checks)
        self.assertEqual([r.allowed for r in rs], [True] * 5 + [False, False, True, True])
        self.assertEqual([r.remaining for r in rs[:5]], [4, 3, 2, 1, 0])
        self.assertEqual((rs[7].remaining, rs[8].limit, rs[8].rule), (3, 1000000, "fast"))

    def test_one_connection_is_reused(self) -> None:
        rl = self.client()
        rl.check("fast", "a")
        first = rl._sock
        for i in range(50):
            rl.check("fast", f"a{i}")
        self.assertIs(rl._sock, first)

    def test_threads_share_one_client_exactly(self) -> None:
        rl = self.client()
        allowed: List[bool] = []
        lock = threading.Lock()

        def work() -> None:
            for i in range(40):
                r = rl.check("api", "py:threads")
                rl.check("fast", f"t{i}")
                with lock:
                    allowed.append(r.allowed)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual((len(allowed), allowed.count(True)), (320, 5))

    def test_request_errors_raise_and_keys_are_encoded(self) -> None:
        rl = self.client()
        with self.assertRaises(RequestError) as e:
            rl.check("nope", "k")
        self.assertEqual(e.exception.code, "RULE")
        with self.assertRaises(RequestError) as e:
            rl.check("api", "k", 6)
        self.assertEqual(e.exception.code, "COST")
        self.assertTrue(rl.check("api", "user name/é").allowed)  # still in step
        self.assertEqual(encode_key("user name/é%"), "user%20name/%C3%A9%25")


class FailureTest(unittest.TestCase):
    def test_absent_daemon_fails_open_or_closed(self) -> None:
        path = os.path.join(tmpdir("rl-py-none-"), "none.sock")
        r = Client(path).check("api", "k")
        self.assertEqual((r.allowed, r.source), (True, "client_fail_open"))
        self.assertIn("FileNotFoundError", r.error or "")
        r = Client(path, fail_open=False).check("api", "k")
        self.assertEqual((r.allowed, r.source, r.headers()), (False, "client_fail_closed", {"Retry-After": "1"}))

    def test_reconnects_after_daemon_restart(self) -> None:
        d = Daemon()
        try:
            rl = Client(d.socket, timeout=5)
            self.assertEqual(rl.check("api", "k").source, "local")
            d.stop()
            self.assertEqual(rl.check("api", "k").source, "client_fail_open")
            d.start()
            r = rl.check("api", "k")
            self.assertEqual((r.source, r.remaining), ("local", 4))  # a fresh daemon
            d.stop()
            d.start()  # restarted under a kept connection: one silent retry
            self.assertEqual(rl.check("api", "k").source, "local")
            rl.close()
        finally:
            d.stop()

    def test_stalled_daemon_times_out_without_retry(self) -> None:
        d = Daemon()
        try:
            rl = Client(d.socket, timeout=5)
            self.assertEqual(rl.check("fast", "k").source, "local")
            rl.timeout = 0.3
            d.pause()
            t0 = time.monotonic()
            r = rl.check("fast", "k")
            took = time.monotonic() - t0
            self.assertEqual(r.source, "client_fail_open")
            self.assertIn("Timeout", r.error or "")
            # Bounded by the timeout (no retry: the conformance table counts connections);
            # the margin is for a loaded test machine.
            self.assertLess(took, 2.0)
            d.resume()
            rl.timeout = 5
            self.assertEqual(rl.check("fast", "k").source, "local")
            rl.close()
        finally:
            d.resume()
            d.stop()


class AsyncClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.d = Daemon()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.d.stop()

    def test_concurrent_calls_pipeline_on_one_connection_exactly(self) -> None:
        async def go() -> None:
            async with AsyncClient(self.d.socket, timeout=5) as rl:
                await rl.check("fast", "warm")
                conn = rl._conn
                rs = await asyncio.gather(*(rl.check("api", "py:aio") for _ in range(50)),
                                          *(rl.check("fast", f"k{i}") for i in range(200)))
                self.assertIs(rl._conn, conn, "one connection for every call")
                self.assertEqual([r.allowed for r in rs[:50]].count(True), 5)
                self.assertTrue(all(r.allowed and r.source == "local" for r in rs[50:]))
                many = await rl.check_many([("api", "py:aio2")] * 6)
                self.assertEqual([r.remaining for r in many], [4, 3, 2, 1, 0, 0])
                self.assertEqual(many[5].window_ms, API_WINDOW_S * 1000)
                with self.assertRaises(RequestError):
                    await rl.check("nope", "k")
                self.assertTrue((await rl.check("fast", "after")).allowed)

        asyncio.run(go())

    def test_restart_stall_and_absent(self) -> None:
        d = Daemon()

        async def go() -> None:
            rl = AsyncClient(d.socket, timeout=5)
            self.assertEqual((await rl.check("api", "k")).source, "local")
            d.stop()
            d.start()
            r = await rl.check("api", "k")  # kept connection closed: one retry
            self.assertEqual((r.source, r.remaining), ("local", 4))
            rl.timeout = 0.3
            d.pause()
            t0 = time.monotonic()
            rs = await asyncio.gather(*(rl.check("fast", f"s{i}") for i in range(10)))
            self.assertTrue(all(r.source == "client_fail_open" and "Timeout" in (r.error or "") for r in rs))
            self.assertLess(time.monotonic() - t0, 2.0)
            d.resume()
            rl.timeout = 5
            self.assertEqual((await rl.check("fast", "k")).source, "local")
            await rl.close()
            closed = AsyncClient(os.path.join(d.dir, "absent.sock"), fail_open=False)
            r = await closed.check("api", "k")
            self.assertEqual((r.allowed, r.source), (False, "client_fail_closed"))

        try:
            asyncio.run(go())
        finally:
            d.resume()
            d.stop()


if __name__ == "__main__":
    unittest.main()
