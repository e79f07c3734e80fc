"""Concurrency slots against a real daemon (redis.mode = "none"; rule "inflight": 2
slots per key): acquire/release, ``hold`` giving the slot back on an exception, a
closed connection freeing its slots, and the WSGI middleware releasing after the
response, after an app that raises, and answering 429 with the policy headers."""

from __future__ import annotations

import unittest
from typing import Any, Iterable, List

from ratelimitd import Client, RequestError
from ratelimitd.slots import ConcurrencyMiddleware, acquire, hold, release

from support import Daemon


class SlotsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.d = Daemon()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.d.stop()

    def client(self) -> Client:
        c = Client(self.d.socket, timeout=5.0)
        self.addCleanup(c.close)
        return c

    def test_two_slots_then_a_denial_then_a_release_frees_one(self) -> None:
        c = self.client()
        a, b = acquire(c, "inflight", "k1"), acquire(c, "inflight", "k1")
        self.assertTrue(a.allowed and b.allowed and a.token and b.token)
        self.assertEqual((a.limit, a.remaining, b.remaining, a.source), (2, 1, 0, "local"))
        denied = acquire(c, "inflight", "k1")
        self.assertFalse(denied.allowed)
        self.assertGreater(denied.wait_ms, 55_000)
        self.assertEqual(denied.headers(), {
            "RateLimit-Policy": '"inflight";q=2;qu="concurrent-requests"',
            "RateLimit": '"inflight";r=0',
            "Retry-After": str(-(-denied.wait_ms // 1000)),
        })
        self.assertTrue(release(c, a))
        self.assertFalse(release(c, a), "a slot is given back once")
        self.assertTrue(acquire(c, "inflight", "k1").allowed)

    def test_hold_releases_on_an_exception(self) -> None:
        c = self.client()
        for _ in range(3):
            with self.assertRaises(KeyError):
                with hold(c, "inflight", "k2") as slot:
                    self.assertTrue(slot.allowed)
                    raise KeyError("the handler failed")
        with hold(c, "inflight", "k2") as s1, hold(c, "inflight", "k2") as s2:
            self.assertTrue(s1.allowed and s2.allowed)

    def test_a_closed_connection_frees_its_slots(self) -> None:
        c = self.client()
        self.assertTrue(acquire(c, "inflight", "k3").allowed)
        self.assertTrue(acquire(c, "inflight", "k3").allowed)
        c.close()  # as a crashed worker's socket closes
        other = self.client()
        for _ in range(100):
            if acquire(other, "inflight", "k3").allowed:
                break
        else:
            self.fail("the closed connection's slots never came back")

    def test_caller_bugs_raise(self) -> None:
        c = self.client()
        with self.assertRaises(RequestError) as e:
            acquire(c, "api", "k")  # a token bucket
        self.assertEqual(e.exception.code, "RULE")

    def test_middleware_releases_after_the_response_and_after_an_exception(self) -> None:
        c = self.client()
        seen: List[Any] = []

        def app(environ: Any, start_response: Any) -> Iterable[bytes]:
            if environ.get("PATH_INFO") == "/boom":
                raise RuntimeError("handler raised")
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok"]

        mw = ConcurrencyMiddleware(app, c, "inflight", key=lambda env: env["REMOTE_ADDR"])

        def call(path: str) -> Any:
            status: List[Any] = []

            def start_response(s: str, h: List[Any], exc_info: Any = None) -> None:
                status.append((s, dict(h)))

            body = mw({"PATH_INFO": path, "REMOTE_ADDR": "10.0.0.9"}, start_response)
            data = b"".join(body)
            getattr(body, "close", lambda: None)()
            return status[0], data

        for _ in range(5):
            (status, headers), _ = call("/")
            self.assertEqual(status, "200 OK")
            self.assertEqual(headers["RateLimit-Policy"], '"inflight";q=2;qu="concurrent-requests"')
            with self.assertRaises(RuntimeError):
                call("/boom")
        # Two held by others: the middleware answers 429 without calling the app.
        held = [acquire(c, "inflight", "10.0.0.9") for _ in range(2)]
        (status, headers), body = call("/")
        seen.append(body)
        self.assertTrue(status.startswith("429"))
        self.assertIn("Retry-After", headers)
        for s in held:
            self.assertTrue(release(c, s))


if __name__ == "__main__":
    unittest.main()


class AsyncSlotsTest(unittest.TestCase):
    """The asyncio calls and the ASGI middleware, driven without a server."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.d = Daemon()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.d.stop()

    def test_hold_and_the_asgi_middleware_release_on_exception_and_cancel(self) -> None:
        import asyncio

        from ratelimitd import AsyncClient
        from ratelimitd import slots_asgi

        async def main() -> None:
            c = AsyncClient(self.d.socket, timeout=5.0)
            for _ in range(3):
                with self.assertRaises(KeyError):
                    async with slots_asgi.hold(c, "inflight", "a1") as s:
                        self.assertTrue(s.allowed)
                        raise KeyError("handler failed")

            async def app(scope: Any, receive: Any, send: Any) -> None:
                if scope["path"] == "/boom":
                    raise RuntimeError("handler raised")
                if scope["path"] == "/slow":
                    await asyncio.sleep(10)  # cancelled: the client went away
                await send({"type": "http.response.start", "status": 200, "headers": []})
                await send({"type": "http.response.body", "body": b"ok"})

            mw = slots_asgi.ConcurrencyMiddleware(app, c, "inflight", key=lambda s: "asgi")

            async def call(path: str) -> List[Any]:
                sent: List[Any] = []

                async def send(m: Any) -> None:
                    sent.append(m)

                async def receive() -> Any:
                    return {"type": "http.disconnect"}

                await mw({"type": "http", "path": path}, receive, send)
                return sent

            for _ in range(3):
                sent = await call("/")
                self.assertEqual(sent[0]["status"], 200)
                self.assertIn((b"ratelimit-policy", b'"inflight";q=2;qu="concurrent-requests"'), sent[0]["headers"])
                with self.assertRaises(RuntimeError):
                    await call("/boom")
                task = asyncio.ensure_future(call("/slow"))
                await asyncio.sleep(0.05)
                task.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await task
            await asyncio.sleep(0.05)
            held = [await slots_asgi.acquire(c, "inflight", "asgi") for _ in range(2)]
            self.assertTrue(all(s.allowed for s in held), "every request gave its slot back")
            sent = await call("/")
            self.assertEqual(sent[0]["status"], 429)
            for s in held:
                self.assertTrue(await slots_asgi.release(c, s))
            await c.close()

        asyncio.run(main())
