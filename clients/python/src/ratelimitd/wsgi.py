"""WSGI middleware (Flask, Django, any WSGI app): checks each request with the
thread-safe ``Client``; a denied request gets 429 with the rate-limit headers without
reaching the app, an allowed one reaches the app and its response carries them.

    app.wsgi_app = RateLimitMiddleware(app.wsgi_app, Client(), rule="api",
                                       key=lambda environ: environ["REMOTE_ADDR"])
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from ._checks import DENY_BODY, ChecksFunc, KeyFunc, RuleSpec, make_checks
from ._result import Key, response_headers, status_for
from ._several import all_or_nothing_headers
from .client import Client

Environ = Dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]


def remote_addr(environ: Environ) -> Optional[Key]:
    """The default key: the peer's address (use the forwarded address or the user id
    in a ``key`` callable instead when there is one)."""
    return environ.get("REMOTE_ADDR") or "unknown"


class RateLimitMiddleware:
    """Same parameters as the ASGI middleware, with the WSGI ``environ`` passed to
    the callables: ``rule`` (a name or ``callable(environ)``), ``key``
    (``callable(environ) -> str | None``; None skips the check), ``cost``, or
    ``checks`` (``callable(environ) -> [(rule, key, cost), ...]``), ``legacy_headers``
    and ``all_or_nothing``."""

    def __init__(
        self,
        app: WSGIApp,
        client: Client,
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
        self._checks = make_checks(rule, key, cost, checks, remote_addr)

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        checks = self._checks(environ)
        if not checks:
            return self.app(environ, start_response)
        if self.all_or_nothing:
            binding, policies = self.client.check_all_policies(checks)
            found, status = all_or_nothing_headers(binding, policies, self.legacy_headers), 200 if binding.allowed else 429
        else:
            results = self.client.check_many(checks)
            found, status = response_headers(results, self.legacy_headers), status_for(results)
        headers: List[Tuple[str, str]] = list(found.items())
        if status == 429:
            start_response("429 Too Many Requests", headers + [
                ("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(self.deny_body)))])
            return [self.deny_body]
        if not headers:
            return self.app(environ, start_response)

        def start_with_headers(status: str, response_headers: List[Tuple[str, str]], exc_info: Any = None) -> Any:
            return start_response(status, list(response_headers) + headers, exc_info)

        return self.app(environ, start_with_headers)
