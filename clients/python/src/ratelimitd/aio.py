"""The asyncio client: one Unix-socket connection per event loop, shared by every
task, with concurrent calls pipelined on it (written as they come, replies matched
in order), so many requests in flight cost one connection and no locking.

Same outcomes as the blocking ``Client``: failures become the fallback result with
its cause, a timeout is never retried, a kept connection found closed is retried
once on a fresh one, and malformed requests raise ``RequestError``."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Deque, Iterable, List, Optional, Tuple

from ._result import (
    DEFAULT_SOCKET,
    Check,
    Key,
    ReplyError,
    RequestError,
    Result,
    encode_key,
    fallback,
    normalize,
    parse_reply,
    request_line,
)
from ._several import (
    all_payload,
    check_all_items,
    check_all_line,
    policy_checks,
    read_binding,
    read_policies,
)

_log = logging.getLogger("ratelimitd")


class _Batch:
    __slots__ = ("payload", "n", "lines", "future", "reused", "retried", "deadline")

    def __init__(self, payload: bytes, n: int, future: "asyncio.Future[Tuple[List[str], Optional[str]]]",
                 deadline: float):
        self.payload, self.n, self.future, self.deadline = payload, n, future, deadline
        self.lines: List[str] = []
        self.reused = self.retried = False

    def finish(self, cause: Optional[str]) -> None:
        if not self.future.done():
            self.future.set_result((self.lines, cause))


class _Conn(asyncio.Protocol):
    """One connection as an asyncio protocol: the event loop hands it the bytes read
    (no reader task to wake, no stream buffer), and it hands each reply line to the
    oldest batch still waiting."""

    def __init__(self, client: "AsyncClient", loop: asyncio.AbstractEventLoop):
        self.client, self.loop = client, loop
        self.transport: Optional[asyncio.Transport] = None
        self.pending: Deque[_Batch] = deque()
        self.rest = ""  # a reply line's start, until its newline arrives
        self.used = False  # a reply was read on this connection
        self.closed = False
        # Requests of one event-loop turn go out in one write (fewer syscalls).
        self.out: List[bytes] = []
        # One timer for the earliest deadline in flight, not one per call.
        self.timer: Optional[asyncio.TimerHandle] = None
        self.timer_at = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def flush(self) -> None:
        if self.out and not self.closed and self.transport is not None:
            self.transport.write(b"".join(self.out))
        self.out.clear()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        *lines, self.rest = (self.rest + data.decode("ascii", "replace")).split("\n")
        if not lines:
            return
        self.used = True
        pending = self.pending
        for line in lines:
            if not pending:
                continue  # unsolicited (ERR BUSY/PERM at connect)
            batch = pending[0]
            batch.lines.append(line)
            if len(batch.lines) == batch.n:
                pending.popleft()
                if not batch.future.done():
                    batch.future.set_result((batch.lines, None))
        if not pending and self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def eof_received(self) -> Optional[bool]:
        return None  # close; connection_lost follows

    def connection_lost(self, exc: Optional[Exception]) -> None:
        cause = f"{type(exc).__name__}: {exc}" if exc is not None else "ConnectionResetError: daemon closed the connection"
        self.client._lost(self, cause)


class AsyncClient:
    """A pipelined connection to the daemon for asyncio programs.

    ``timeout`` (seconds) bounds each call, connecting included. ``fail_open``
    (default True) makes a failure an allow (``client_fail_open``); False a deny
    (``client_fail_closed``). Usable from any event loop: a connection made on
    another loop is replaced."""

    def __init__(self, path: str = DEFAULT_SOCKET, timeout: float = 0.2, fail_open: bool = True):
        self.path = path
        self.timeout = timeout
        self.fail_open = fail_open
        self._conn: Optional[_Conn] = None
        self._connecting: Optional["asyncio.Future[_Conn]"] = None
        self._warned = False

    async def check(self, rule: str, key: Key, cost: int = 1) -> Result:
        """Asks for ``cost`` units of ``key``'s budget under ``rule``."""
        loop = asyncio.get_running_loop()
        conn = self._conn
        if conn is None or conn.closed or conn.loop is not loop:
            return (await self._round_trip([(rule, key, int(cost))]))[0]
        # The common case, inline: a kept connection, one line, one reply.
        batch = _Batch(request_line(rule, key, cost).encode("ascii"), 1, loop.create_future(),
                       loop.time() + self.timeout)
        self._enqueue(conn, batch, loop)
        lines, cause = await batch.future
        if lines:
            line = lines[0]
            try:
                return parse_reply(line, rule)
            except ReplyError as e:
                if not line.startswith("ERR") and self._conn is not None:
                    self._lost(self._conn, "connection out of step", retry=False)
                return fallback(rule, self.fail_open, str(e))
        return fallback(rule, self.fail_open, cause or "no reply")

    async def check_many(self, checks: Iterable[Check]) -> List[Result]:
        """Several checks in one round trip; results in the same order."""
        items = normalize(list(checks))
        return await self._round_trip(items) if items else []

    async def check_all(self, checks: Iterable[Check]) -> Result:
        """1 to 8 checks as one request (CHECKALL): allowed only if every one is, and
        then each is taken; on a deny none is. The binding check's result, its
        ``rule`` naming it. Raises ``RequestError`` for a malformed request."""
        items = check_all_items(checks)
        lines, cause = await self._lines(check_all_line(items).encode("ascii"), 1)
        result, lost = read_binding(lines, items[0][0], self.fail_open, cause)
        self._out_of_step(lost)
        return result

    async def check_all_policies(self, checks: Iterable[Check]) -> Tuple[Result, List[Result]]:
        """``check_all``, plus one cost-0 check per distinct rule in the same round
        trip (none for a single rule): the binding result and each rule's state, for
        ``all_or_nothing_headers`` to list every policy."""
        items = check_all_items(checks)
        asks = policy_checks(items)
        lines, cause = await self._lines(all_payload(items, asks), 1 + len(asks))
        result, lost = read_binding(lines, items[0][0], self.fail_open, cause)
        policies, lost2 = read_policies(lines, asks, self.fail_open, cause)
        self._out_of_step(lost or lost2)
        return result, policies

    async def refund(self, rule: str, key: Key, units: int) -> Result:
        """Gives up to ``units`` back to ``key`` under ``rule`` (never beyond its limit);
        the key's state after it."""
        lines, cause = await self._lines(f"REFUND {rule} {encode_key(key)} {int(units)}\n".encode("ascii"), 1)
        result, lost = read_binding(lines, rule, self.fail_open, cause, binding=False)
        self._out_of_step(lost)
        return result

    def _out_of_step(self, lost: bool) -> None:
        if lost and self._conn is not None:
            self._lost(self._conn, "connection out of step", retry=False)

    async def _lines(self, payload: bytes, n: int) -> Tuple[List[str], Optional[str]]:
        """Sends ``payload`` (n request lines) and waits for up to n reply lines."""
        loop = asyncio.get_running_loop()
        batch = _Batch(payload, n, loop.create_future(), loop.time() + self.timeout)
        conn = self._conn
        if conn is not None and not conn.closed and conn.loop is loop:
            self._enqueue(conn, batch, loop)  # the common case: no coroutine to connect
        else:
            await self._send(batch, loop)
        return await batch.future

    async def _round_trip(self, items: List[Tuple[str, Key, int]]) -> List[Result]:
        payload = "".join([request_line(r, k, n) for r, k, n in items]).encode("ascii")
        lines, cause = await self._lines(payload, len(items))
        out: List[Result] = []
        bug: Optional[RequestError] = None
        for i, (rule, _, _) in enumerate(items):
            if i >= len(lines):
                out.append(fallback(rule, self.fail_open, cause or "no reply"))
                continue
            try:
                out.append(parse_reply(lines[i], rule))
            except RequestError as e:
                bug = bug or e
                out.append(fallback(rule, self.fail_open, str(e)))
            except ReplyError as e:
                if not lines[i].startswith("ERR") and self._conn is not None:
                    self._lost(self._conn, "connection out of step", retry=False)
                out.append(fallback(rule, self.fail_open, str(e)))
        if bug is not None:
            raise bug
        return out

    async def close(self) -> None:
        """Closes the connection (the next check opens a new one)."""
        if self._conn is not None:
            self._lost(self._conn, "client closed")

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- internals -------------------------------------------------------------------

    async def _send(self, batch: _Batch, loop: asyncio.AbstractEventLoop) -> None:
        conn = self._conn
        if conn is None or conn.closed or conn.loop is not loop:
            try:
                conn = await asyncio.wait_for(self._get_conn(), max(batch.deadline - loop.time(), 0.001))
            except asyncio.TimeoutError:
                batch.finish(f"TimeoutError: no connection within {self.timeout}s")
                return
            except OSError as e:
                batch.finish(f"{type(e).__name__}: {e}")
                return
        self._enqueue(conn, batch, loop)

    def _enqueue(self, conn: _Conn, batch: _Batch, loop: asyncio.AbstractEventLoop) -> None:
        batch.reused = conn.used
        conn.pending.append(batch)
        if not conn.out:
            loop.call_soon(conn.flush)
        conn.out.append(batch.payload)
        if conn.timer is None or batch.deadline < conn.timer_at:
            self._arm(conn)

    def _arm(self, conn: _Conn) -> None:
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None
        if conn.closed or not conn.pending:
            return
        conn.timer_at = min(b.deadline for b in conn.pending)
        conn.timer = conn.loop.call_at(conn.timer_at, self._tick, conn)

    def _tick(self, conn: _Conn) -> None:
        conn.timer = None
        now = conn.loop.time()
        late = next((b for b in conn.pending if b.deadline <= now), None)
        if late is not None:
            self._timed_out(conn, late)
        else:
            self._arm(conn)

    async def _get_conn(self) -> _Conn:
        loop = asyncio.get_running_loop()
        conn = self._conn
        if conn is not None and not conn.closed and conn.loop is loop:
            return conn
        if conn is not None and conn.loop is not loop:
            self._conn = None  # made on another (perhaps closed) loop: abandon it
        if self._connecting is not None and not self._connecting.done() and self._connecting.get_loop() is loop:
            return await asyncio.shield(self._connecting)
        self._connecting = fut = loop.create_future()
        try:
            _, conn = await loop.create_unix_connection(lambda: _Conn(self, loop), self.path)
        except BaseException as e:  # OSError, or cancelled by the caller's deadline
            if isinstance(e, OSError) and not self._warned:
                # Said once per client: a wrong path must not pass silently.
                self._warned = True
                _log.warning("ratelimitd: cannot reach the daemon at %s (%s); every call fails %s until it can",
                             self.path, type(e).__name__, "open" if self.fail_open else "closed")
            # Waiters sharing this attempt see an OSError (their fallback), never a
            # cancellation that is not theirs.
            fut.set_exception(e if isinstance(e, OSError) else ConnectionError("connect interrupted"))
            fut.exception()  # mark retrieved: waiters re-raise it themselves
            if self._connecting is fut:
                self._connecting = None
            raise
        self._conn = conn
        fut.set_result(conn)
        self._connecting = None
        return conn

    def _lost(self, conn: _Conn, cause: str, retry: bool = True) -> None:
        if conn.closed:
            return
        conn.closed = True
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None
        if self._conn is conn:
            self._conn = None
        if conn.transport is not None:
            try:
                conn.transport.close()
            except RuntimeError:
                pass  # its loop is closed
        pending, conn.pending = conn.pending, deque()
        for batch in pending:
            if retry and not batch.lines and batch.reused and not batch.retried and not batch.future.done():
                # A kept connection closed by a daemon restart or idle timeout: one
                # retry on a fresh connection.
                batch.retried = True
                conn.loop.create_task(self._send(batch, conn.loop))
            else:
                batch.finish(cause)

    def _timed_out(self, conn: _Conn, batch: _Batch) -> None:
        cause = f"TimeoutError: no reply within {self.timeout}s"
        # Replies come in order: everything behind a late one is late too, and the
        # connection is out of step. Fail them all, retry none.
        for b in conn.pending:
            b.finish(cause)
        self._lost(conn, cause, retry=False)
        batch.finish(cause)
