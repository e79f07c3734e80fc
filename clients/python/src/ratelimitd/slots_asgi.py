"""Concurrency slots for asyncio (``AsyncClient``): ``acquire``, ``release``, ``hold``
(an async context manager that always gives the slot back) and an ASGI middleware that
holds one slot while the app serves a request.

    app.add_middleware(ConcurrencyMiddleware, client=AsyncClient(), rule="inflight",
                       key=lambda scope: scope["client"][0])

The slot is given back when the app returns, raises, or is cancelled (the server
cancels it when the client disconnects); and by the daemon when the connection that
took it closes, or at the rule's ``max_hold``."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Awaitable, Callable, MutableMapping, Optional, Tuple

from ._result import Key, encode_key
from .aio import AsyncClient, _Batch
from .slots import DENY_BODY, Slot, read_slot, refuse

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def _ask(client: AsyncClient, line: str) -> Tuple[Optional[str], Optional[str]]:
    """One request line, pipelined on ``client``'s connection: (reply, cause of none)."""
    loop = asyncio.get_running_loop()
    batch = _Batch(line.encode("ascii"), 1, loop.create_future(), loop.time() + client.timeout)
    conn = client._conn
    if conn is not None and not conn.closed and conn.loop is loop:
        client._enqueue(conn, batch, loop)
    else:
        await client._send(batch, loop)
    lines, cause = await batch.future
    return (lines[0] if lines else None), cause


async def acquire(client: AsyncClient, rule: str, key: Key) -> Slot:
    """``ACQUIRE`` (see ``ratelimitd.slots.acquire``)."""
    k = encode_key(key)
    reply, cause = await _ask(client, f"ACQUIRE {rule} {k}\n")
    return read_slot(reply, cause, rule, k, client.fail_open)


async def release(client: AsyncClient, slot: Slot) -> bool:
    """``RELEASE`` (see ``ratelimitd.slots.release``). Idempotent."""
    token, slot.token = slot.token, None
    if token is None:
        return False
    reply, _ = await _ask(client, f"RELEASE {slot.rule} {slot.key} {token}\n")
    if reply is None:
        return False
    refuse(reply)
    return reply == "OK"


@contextlib.asynccontextmanager
async def hold(client: AsyncClient, rule: str, key: Key) -> AsyncIterator[Slot]:
    """``async with hold(client, rule, key) as slot:`` releases on the way out, an
    exception or a cancellation included."""
    slot = await acquire(client, rule, key)
    try:
        yield slot
    finally:
        # Shielded: a cancelled request still gives its slot back.
        await asyncio.shield(release(client, slot))


class ConcurrencyMiddleware:
    """ASGI middleware holding one slot of ``rule`` per HTTP request (``key(scope)``;
    None: no slot) while the app runs. A denied request gets 429 with
    ``RateLimit-Policy: "<rule>";q=<limit>;qu="concurrent-requests"`` and
    ``Retry-After`` without reaching the app; an allowed one's response carries the
    policy headers."""

    def __init__(self, app: ASGIApp, client: AsyncClient, rule: str,
                 key: Callable[[Scope], Optional[Key]], deny_body: bytes = DENY_BODY) -> None:
        self.app, self.client, self.rule, self.key, self.deny_body = app, client, rule, key, deny_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = self.key(scope) if scope["type"] == "http" else None
        if key is None:
            await self.app(scope, receive, send)
            return
        async with hold(self.client, self.rule, key) as slot:
            headers = [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in slot.headers().items()]
            if not slot.allowed:
                await send({"type": "http.response.start", "status": 429, "headers": headers + [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(self.deny_body)).encode())]})
                await send({"type": "http.response.body", "body": self.deny_body})
                return

            async def send_with_headers(message: Message) -> None:
                if message["type"] == "http.response.start":
                    message = dict(message)
                    message["headers"] = list(message.get("headers", [])) + headers
                await send(message)

            await self.app(scope, receive, send_with_headers)
