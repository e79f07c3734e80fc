"""Web apps behind the middlewares, against a real daemon: a Starlette (ASGI) app and
a Flask (WSGI) app, and a plain WSGI app served by wsgiref over real HTTP, each
answering 200 until the rule's limit (5) is used, then 429 with the headers."""

from __future__ import annotations

import threading
import unittest
import urllib.error
import urllib.request
from typing import Any, List
from wsgiref.simple_server import WSGIRequestHandler, make_server

from ratelimitd import AsyncClient, Client
from ratelimitd.asgi import RateLimitMiddleware as ASGIRateLimit
from ratelimitd.wsgi import RateLimitMiddleware as WSGIRateLimit

from support import Daemon

POLICY = '"api";q=5;w=5000'


class MiddlewareTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.d = Daemon()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.d.stop()

    def assert_limited(self, statuses: List[int], last_headers: Any, policy: str = POLICY) -> None:
        self.assertEqual(statuses, [200] * 5 + [429])
        self.assertEqual(last_headers["RateLimit-Policy"], policy)
        self.assertRegex(last_headers["RateLimit"], r'^"api";r=0;t=\d+$')
        self.assertRegex(last_headers["Retry-After"], r"^\d+$")

    def test_starlette_app_gets_429_with_headers(self) -> None:
        from starlette.applications import Starlette
        from starlette.responses import PlainTextResponse
        from starlette.routing import Route
        from starlette.testclient import TestClient

        async def hello(request: Any) -> PlainTextResponse:
            return PlainTextResponse("hello")

        app = Starlette(routes=[Route("/", hello), Route("/health", hello)])
        app.add_middleware(ASGIRateLimit, client=AsyncClient(self.d.socket, timeout=5), rule="api",
                           key=lambda scope: None if scope["path"] == "/health" else
                           dict(scope["headers"]).get(b"x-user", b"anon").decode())
        with TestClient(app) as http:
            rs = [http.get("/", headers={"X-User": "starlette"}) for _ in range(6)]
            self.assertEqual(rs[0].text, "hello")
            self.assertEqual(rs[0].headers["RateLimit"], '"api";r=4;t=1000')
            self.assert_limited([r.status_code for r in rs], rs[-1].headers)
            self.assertEqual(http.get("/health").status_code, 200)  # key None: not checked
            self.assertEqual(http.get("/", headers={"X-User": "other"}).status_code, 200)

    def test_flask_app_gets_429_with_legacy_headers_too(self) -> None:
        from flask import Flask

        app = Flask("rl-test")

        @app.route("/")
        def hello() -> str:
            return "hello"

        client = Client(self.d.socket, timeout=5)
        self.addCleanup(client.close)
        app.wsgi_app = WSGIRateLimit(app.wsgi_app, client,  # type: ignore[method-assign]
                                     rule=lambda environ: "api", key=lambda environ: "flask",
                                     legacy_headers=True)
        http = app.test_client()
        rs = [http.get("/") for _ in range(6)]
        self.assertEqual(rs[0].get_data(as_text=True), "hello")
        self.assert_limited([r.status_code for r in rs], rs[-1].headers)
        self.assertEqual(rs[-1].headers["X-RateLimit-Limit"], "5")
        self.assertEqual(rs[-1].headers["X-RateLimit-Remaining"], "0")

    def test_wsgiref_server_over_http_with_two_rules(self) -> None:
        def app(environ: dict, start_response: Any) -> List[bytes]:
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"hello"]

        class Quiet(WSGIRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

        client = Client(self.d.socket, timeout=5)
        self.addCleanup(client.close)
        limited = WSGIRateLimit(app, client,
                                checks=lambda environ: [("fast", "wsgiref"), ("api", "wsgiref")])
        server = make_server("127.0.0.1", 0, limited, handler_class=Quiet)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{server.server_port}/"
            statuses, headers = [], None
            for _ in range(6):
                try:
                    with urllib.request.urlopen(url, timeout=5) as resp:
                        statuses.append(resp.status)
                        headers = resp.headers
                except urllib.error.HTTPError as e:
                    statuses.append(e.code)
                    headers = e.headers
            # "api" (5 per key) is the most restrictive of the two: it sets RateLimit;
            # RateLimit-Policy lists both ("fast": 1,000,000 per second).
            self.assert_limited(statuses, headers, '"fast";q=1000000;w=1, ' + POLICY)
        finally:
            server.shutdown()
            server.server_close()


if __name__ == "__main__":
    unittest.main()
