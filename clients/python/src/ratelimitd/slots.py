"""Concurrency slots (``algorithm = "concurrency"`` rules): ``acquire`` / ``release``,
``hold`` (a context manager that always gives the slot back) and a WSGI middleware
that holds one slot while the app serves a request.

    from ratelimitd import Client
    from ratelimitd.slots import hold
    rl = Client()
    with hold(rl, "jobs", "user:42") as slot:
        if not slot.allowed:
            return 429, slot.headers()
        run_the_job()

The daemon also gives a slot back when the connection that took it closes (a crashed
process frees its slots at once) and when the rule's ``max_hold`` ends, so a slot
cannot leak; releasing it promptly frees it for others. A slot the client could not
ask about (daemon absent, slow, overloaded) follows ``fail_open``: allowed with no
token, or denied; its cause is in ``error``."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from ._result import REQUEST_ERRORS, Key, RequestError, ceil_s, encode_key
from .client import Client


@dataclass
class Slot:
    """One ``ACQUIRE``'s answer. ``token`` names the slot for ``release`` (None when
    denied, or when the client decided: ``source`` client_fail_open/closed)."""

    allowed: bool
    rule: str
    key: str
    limit: int = 0
    remaining: int = 0
    wait_ms: int = 0
    source: str = ""
    token: Optional[str] = None
    error: Optional[str] = None

    def headers(self) -> Dict[str, str]:
        """``RateLimit-Policy: "<rule>";q=<limit>;qu="concurrent-requests"`` and, when
        denied, ``Retry-After``; nothing when the client decided (fail open)."""
        if self.source.startswith("client_"):
            return {} if self.allowed else {"Retry-After": "1"}
        h = {
            "RateLimit-Policy": f'"{self.rule}";q={self.limit};qu="concurrent-requests"',
            "RateLimit": f'"{self.rule}";r={self.remaining}',
        }
        if not self.allowed:
            h["Retry-After"] = str(max(1, ceil_s(self.wait_ms)))
        return h


def _ask(client: Client, line: str) -> Tuple[Optional[str], Optional[str]]:
    """One request line on ``client``'s connection: (reply, cause of no reply)."""
    with client._lock:  # the same connection and lock as checks
        lines, cause = client._round_trip(line.encode("ascii"), 1)
    return (lines[0] if lines else None), cause


def refuse(reply: str) -> None:
    """Raises ``RequestError`` for a reply that says the request is wrong."""
    parts = reply.split(" ", 2)
    if parts[0] == "ERR" and len(parts) > 1 and parts[1] in REQUEST_ERRORS:
        raise RequestError(parts[1], parts[2] if len(parts) > 2 else "")


def read_slot(reply: Optional[str], cause: Optional[str], rule: str, key: str, fail_open: bool) -> Slot:
    """The ``Slot`` an ``ACQUIRE`` reply (None: no reply, ``cause`` says why) stands for.
    Raises ``RequestError`` for a reply that says the request is wrong."""
    if reply is not None:
        refuse(reply)
        f = reply.split()
        if len(f) >= 6 and f[0] in ("ALLOW", "DENY"):
            nums: Optional[List[int]] = None
            try:
                nums = [int(x) for x in f[1:5]]
            except ValueError:
                pass
            if nums is not None and (f[0] == "DENY" or len(f) >= 8):
                return Slot(f[0] == "ALLOW", rule, key, nums[0], nums[1], nums[3], f[5],
                            f[7] if f[0] == "ALLOW" else None)
        cause = f"unexpected reply: {reply[:80]}"
    source = "client_fail_open" if fail_open else "client_fail_closed"
    return Slot(fail_open, rule, key, source=source, error=cause or "no reply")


def acquire(client: Client, rule: str, key: Key) -> Slot:
    """``ACQUIRE rule key``: a slot, or a denial with ``wait_ms`` until the oldest slot
    held ends its ``max_hold``. Raises ``RequestError`` for a caller bug (unknown rule,
    a rule that is not a concurrency rule, bad key)."""
    k = encode_key(key)
    reply, cause = _ask(client, f"ACQUIRE {rule} {k}\n")
    return read_slot(reply, cause, rule, k, client.fail_open)


def release(client: Client, slot: Slot) -> bool:
    """``RELEASE``: True when the slot was given back, False when the daemon no longer
    held it (given back already, its connection closed, or lapsed) or could not be
    asked. Idempotent: the slot's token is cleared."""
    token, slot.token = slot.token, None
    if token is None:
        return False
    reply, _ = _ask(client, f"RELEASE {slot.rule} {slot.key} {token}\n")
    if reply is None:
        return False
    refuse(reply)
    return reply == "OK"


@contextlib.contextmanager
def hold(client: Client, rule: str, key: Key) -> Iterator[Slot]:
    """``with hold(client, rule, key) as slot:`` acquires, yields the ``Slot`` (check
    ``slot.allowed``), and releases it on the way out, an exception included."""
    slot = acquire(client, rule, key)
    try:
        yield slot
    finally:
        release(client, slot)


Environ = Dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]
DENY_BODY = b"Too many requests in progress\n"


class ConcurrencyMiddleware:
    """WSGI middleware holding one slot of ``rule`` per request while the app runs
    and its response body is sent (released when the server closes the body, on an
    exception, or when the client disconnects and the server closes it). ``key`` is
    ``callable(environ) -> str | None`` (None: no slot). A denied request gets 429
    with ``RateLimit-Policy: "<rule>";q=<limit>;qu="concurrent-requests"`` and
    ``Retry-After``, without reaching the app."""

    def __init__(self, app: WSGIApp, client: Client, rule: str,
                 key: Callable[[Environ], Optional[Key]], deny_body: bytes = DENY_BODY) -> None:
        self.app, self.client, self.rule, self.key, self.deny_body = app, client, rule, key, deny_body

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        key = self.key(environ)
        if key is None:
            return self.app(environ, start_response)
        slot = acquire(self.client, self.rule, key)
        headers: List[Tuple[str, str]] = list(slot.headers().items())
        if not slot.allowed:
            start_response("429 Too Many Requests", headers + [
                ("Content-Type", "text/plain; charset=utf-8"),
                ("Content-Length", str(len(self.deny_body)))])
            return [self.deny_body]

        def start_with_headers(status: str, h: List[Tuple[str, str]], exc_info: Any = None) -> Any:
            return start_response(status, list(h) + headers, exc_info)

        try:
            body = self.app(environ, start_with_headers)
        except BaseException:
            release(self.client, slot)
            raise
        return _Releasing(body, lambda: release(self.client, slot))


class _Releasing:
    """A response body that gives the slot back when the server closes it (PEP 3333:
    ``close()`` is called however the response ends)."""

    def __init__(self, body: Iterable[bytes], done: Callable[[], object]) -> None:
        self._body, self._done = body, done

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body)

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            self._done()
