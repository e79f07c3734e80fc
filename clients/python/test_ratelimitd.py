"""Tests of the Python client against a real daemon (clients/run_tests.sh runs them;
needs RATELIMITD_BIN). Run: python3 -m unittest -v test_ratelimitd"""

import os
import subprocess
import tempfile
import time
import unittest

from ratelimitd import Client, RequestError, Result, encode_key, parse_reply

HERE = os.path.dirname(os.path.abspath(__file__))
TESTDAEMON = os.path.join(HERE, "..", "testdaemon.sh")


class Daemon:
    """A real daemon in a temp dir, driven by clients/testdaemon.sh."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="rl-py-", dir=os.environ.get("RL_TEST_ROOT"))
        self.socket = os.path.join(self.dir, "rl.sock")
        self.start()

    def _run(self, cmd):
        subprocess.run(["bash", TESTDAEMON, cmd, self.dir], check=True, timeout=30)

    def start(self):
        self._run("start")

    def stop(self):
        self._run("stop")

    def pause(self):
        self._run("pause")

    def resume(self):
        self._run("resume")


class Base(unittest.TestCase):
    def client(self, *args, **kwargs):
        c = Client(*args, **kwargs)
        self.addCleanup(c.close)
        return c


class ClientTest(Base):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()

    def test_check_counts_down_and_denies_with_headers(self):
        rl = self.client(self.d.socket, timeout=5)
        for left in (4, 3, 2, 1, 0):
            r = rl.check("api", "py:count")
            self.assertTrue(r.allowed)
            self.assertEqual((r.limit, r.remaining, r.source), (5, left, "local"))
        r = rl.check("api", "py:count")
        self.assertFalse(r.allowed)
        self.assertGreater(r.wait_ms, 0)
        h = r.headers()
        self.assertEqual(h["RateLimit-Policy"], '"api";q=5')
        self.assertRegex(h["RateLimit"], r'^"api";r=0;t=\d+$')
        self.assertEqual(h["X-RateLimit-Limit"], "5")
        self.assertEqual(h["X-RateLimit-Remaining"], "0")
        self.assertEqual(h["Retry-After"], str(-(-r.wait_ms // 1000)))
        self.assertNotIn("Retry-After", rl.check("api", "py:other").headers())

    def test_pipelining_keeps_order(self):
        rl = self.client(self.d.socket, timeout=5)
        checks = [("api", "py:pipe")] * 7 + [("api", "py:pipe2", 2), ("fast", "x", 0)]
        rs = rl.check_many(checks)
        self.assertEqual([r.allowed for r in rs], [True] * 5 + [False, False, True, True])
        self.assertEqual([r.remaining for r in rs[:5]], [4, 3, 2, 1, 0])
        self.assertEqual((rs[7].remaining, rs[8].limit, rs[8].rule), (3, 1000000, "fast"))

    def test_one_connection_is_reused(self):
        rl = self.client(self.d.socket, timeout=5)
        rl.check("fast", "a")
        first = rl._sock
        for i in range(50):
            rl.check("fast", f"a{i}")
        self.assertIs(rl._sock, first)

    def test_request_errors_raise_and_keys_are_encoded(self):
        rl = self.client(self.d.socket, timeout=5)
        with self.assertRaises(RequestError) as e:
            rl.check("nope", "k")
        self.assertEqual(e.exception.code, "RULE")
        with self.assertRaises(RequestError) as e:
            rl.check("api", "k", 6)
        self.assertEqual(e.exception.code, "COST")
        # The connection is still in step after errors.
        r = rl.check("api", "user name/é")
        self.assertTrue(r.allowed)
        self.assertEqual(encode_key("user name/é%"), "user%20name/%C3%A9%25")

    def test_parse_ignores_extra_fields(self):
        r = parse_reply("DENY 20 0 1900 100 cache future fields 7", "rides")
        self.assertEqual(r, Result(False, 20, 0, 1900, 100, "cache", "rides"))
        with self.assertRaises(ValueError):
            parse_reply("HELLO")


class FailureTest(Base):
    def test_fail_open_and_closed_when_daemon_absent(self):
        path = os.path.join(tempfile.mkdtemp(dir=os.environ.get("RL_TEST_ROOT")), "none.sock")
        r = Client(path).check("api", "k")
        self.assertTrue(r.allowed)
        self.assertEqual(r.source, "client_fail_open")
        self.assertIn("FileNotFoundError", r.error)
        self.assertEqual(r.headers(), {})
        r = Client(path, fail_open=False).check("api", "k")
        self.assertFalse(r.allowed)
        self.assertEqual(r.source, "client_fail_closed")
        self.assertEqual(r.headers(), {"Retry-After": "1"})
        rs = Client(path).check_many([("api", "a"), ("api", "b")])
        self.assertEqual([r.source for r in rs], ["client_fail_open"] * 2)

    def test_reconnects_after_daemon_restart(self):
        d = Daemon()
        try:
            rl = self.client(d.socket, timeout=5)
            self.assertEqual(rl.check("api", "k").source, "local")
            d.stop()
            r = rl.check("api", "k")
            self.assertEqual(r.source, "client_fail_open")
            d.start()
            r = rl.check("api", "k")
            # A fresh daemon: the bucket is full again.
            self.assertEqual((r.source, r.remaining), ("local", 4))
            # Restart while the connection is kept: the next check reconnects by itself.
            d.stop()
            d.start()
            self.assertEqual(rl.check("api", "k").source, "local")
        finally:
            d.stop()

    def test_timeout_when_daemon_stalled(self):
        d = Daemon()
        try:
            rl = self.client(d.socket, timeout=5)
            self.assertEqual(rl.check("fast", "k").source, "local")
            rl.timeout = 0.3
            d.pause()
            t0 = time.monotonic()
            r = rl.check("fast", "k")
            took = time.monotonic() - t0
            self.assertEqual(r.source, "client_fail_open")
            self.assertIn("Timeout", r.error)
            self.assertLess(took, 3.0)
            closed = self.client(d.socket, timeout=0.3, fail_open=False).check("fast", "k")
            self.assertEqual(closed.source, "client_fail_closed")
            d.resume()
            rl.timeout = 5
            self.assertEqual(rl.check("fast", "k").source, "local")
        finally:
            d.resume()
            d.stop()


if __name__ == "__main__":
    unittest.main()
