"""Client for ratelimitd, the per-host rate-limit daemon.

    from ratelimitd import Client
    rl = Client("/run/ratelimitd/ratelimitd.sock")
    r = rl.check("rides_request", "user:42")
    if not r.allowed:
        return 429, r.headers()

``Client`` (blocking, thread-safe), ``AsyncClient`` (asyncio, pipelined),
``ratelimitd.asgi.RateLimitMiddleware`` and ``ratelimitd.wsgi.RateLimitMiddleware``.
When the daemon is absent, refuses, or does not answer within ``timeout``, results
are allowed (``fail_open=True``, the default, source ``client_fail_open``) or denied
(``fail_open=False``, ``client_fail_closed``), with the cause in ``error``. A request
the daemon rejects as malformed raises ``RequestError``: a bug to fix, not an outage.
"""

from ._result import (
    DEFAULT_SOCKET,
    Check,
    ReplyError,
    RequestError,
    Result,
    encode_key,
    most_restrictive,
    parse_reply,
    response_headers,
    status_for,
)
from ._several import all_or_nothing_headers
from .aio import AsyncClient
from .client import Client

__version__ = "0.2.0"

__all__ = [
    "AsyncClient",
    "Check",
    "Client",
    "DEFAULT_SOCKET",
    "ReplyError",
    "RequestError",
    "Result",
    "all_or_nothing_headers",
    "encode_key",
    "most_restrictive",
    "parse_reply",
    "response_headers",
    "status_for",
]
