"""ASGI middleware (Starlette, FastAPI, any ASGI app): checks each HTTP request with
the ``AsyncClient``; a denied request gets 429 with the rate-limit headers without
reaching the app, an allowed one reaches the app and its response carries them.

    app.add_middleware(RateLimitMiddleware, client=AsyncClient(), rule="api",
                       key=lambda scope: scope["client"][0])
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Dict, List, MutableMapping, Optional

from ._checks import DENY_BODY, ChecksFunc, KeyFunc, RuleSpec, make_checks
from ._result import Key, response_headers, status_for
from ._several import all_or_nothing_headers
from .aio import AsyncClient

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def client_address(scope: Scope) -> Optional[Key]:
    """The default key: the peer's address (put your proxy's forwarded address or
    the user id in a ``key`` callable instead when there is one)."""
    client = scope.get("client")
    return client[0] if client else "unknown"


class RateLimitMiddleware:
    """``rule``: a rule name or ``callable(scope) -> name | None``; ``key``:
    ``callable(scope) -> str | None`` (None: no check for this request; default: the
    peer address); ``cost``: units per request. Or ``checks``: ``callable(scope) ->
    [(rule, key, cost), ...]`` for several rules, checked in one round trip; the most
    restrictive result sets the headers. ``all_or_nothing=True`` decides the checks
    as one CHECKALL instead (a denied request takes nothing from any rule; at most 8
    checks, no ``lease = "auto"`` or concurrency rule): ``RateLimit`` names the binding
    rule and ``RateLimit-Policy`` lists every rule. ``legacy_headers`` adds X-RateLimit-*.
    Only HTTP requests are checked (websocket and lifespan pass through)."""

    def __init__(
        self,
        app: ASGIApp,
        client: AsyncClient,
        rule: Optional[RuleSpec] = None,
        key: Optional[KeyFunc] = None,
        cost: int = 1,
        checks: Optional[ChecksFunc] = None,
        legacy_headers: bool = False,
        deny_body: bytes = DENY_BODY,
        all_or_nothing: bool = False,
    ) -> None:
        self.app = app
        self.client = client
        self.legacy_headers = legacy_headers
        self.deny_body = deny_body
        self.all_or_nothing = all_or_nothing
        self._checks = make_checks(rule, key, cost, checks, client_address)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        checks = self._checks(scope)
        if not checks:
            await self.app(scope, receive, send)
            return
        if self.all_or_nothing:
            binding, policies = await self.client.check_all_policies(checks)
            found, status = all_or_nothing_headers(binding, policies, self.legacy_headers), 200 if binding.allowed else 429
        else:
            results = await self.client.check_many(checks)
            found, status = response_headers(results, self.legacy_headers), status_for(results)
        headers = _encode(found)
        if status == 429:
            await send({"type": "http.response.start", "status": 429,
                        "headers": headers + [(b"content-type", b"text/plain; charset=utf-8"),
                                              (b"content-length", str(len(self.deny_body)).encode())]})
            await send({"type": "http.response.body", "body": self.deny_body})
            return
        if not headers:
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message.get("type") == "http.response.start":
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _encode(headers: Dict[str, str]) -> List[Any]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
