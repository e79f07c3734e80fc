"""The blocking client: one Unix-socket connection, shared safely by threads.

A lock serialises round trips, so one ``Client`` may be used by every thread of a
WSGI server; ``check_many`` pipelines several checks in one round trip. Failures
(daemon absent, refused, closed, slow, overloaded) become the configured fallback
result with its cause; a request the daemon rejects as malformed raises."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Iterable, List, Optional, Tuple, Union

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
    MAX_TRIPLES,
    all_payload,
    check_all_items,
    check_all_line,
    policy_checks,
    read_binding,
    read_policies,
)

__all__ = ["Client", "MAX_TRIPLES"]


_log = logging.getLogger("ratelimitd")


class _Lost(Exception):
    """The connection ended (EOF, reset, broken pipe, refused, absent)."""


class Client:
    """A connection to the daemon.

    ``timeout`` (seconds) bounds each round trip, connecting included; it is never
    retried. ``fail_open`` (default True) makes a failure an allow with source
    ``client_fail_open``; False makes it a deny with ``client_fail_closed``. A kept
    connection found closed (daemon restarted) is retried once on a fresh one."""

    def __init__(self, path: Union[str, "os.PathLike[str]"] = DEFAULT_SOCKET, timeout: float = 0.2,
                 fail_open: bool = True):
        self.path = os.fspath(path)
        # Said once per client: a daemon that cannot be reached (a wrong path) must not
        # pass silently while every call fails open.
        self._warned = False
        self.timeout = timeout
        self.fail_open = fail_open
        self._sock: Optional[socket.socket] = None
        self._buf = b""
        self._used = False  # a reply was read on this connection
        self._lock = threading.Lock()

    def check(self, rule: str, key: Key, cost: int = 1) -> Result:
        """Asks for ``cost`` units of ``key``'s budget under ``rule``."""
        return self.check_many([(rule, key, cost)])[0]

    def check_many(self, checks: Iterable[Check]) -> List[Result]:
        """Several checks in one round trip (pipelined); results in the same order.
        Raises ``RequestError`` if the daemon rejects any of them as malformed."""
        items = normalize(list(checks))
        if not items:
            return []
        payload = "".join(request_line(r, k, n) for r, k, n in items).encode("ascii")
        with self._lock:
            lines, cause = self._round_trip(payload, len(items))
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
                    # ERR BUSY/PERM/INTERNAL: the daemon cannot serve us now (it closes
                    # the connection itself after BUSY and PERM). A line we cannot read:
                    # the connection may be out of step, drop it.
                    if not lines[i].startswith("ERR"):
                        self._close()
                    out.append(fallback(rule, self.fail_open, str(e)))
        if bug is not None:
            raise bug
        return out

    def check_all(self, checks: Iterable[Check]) -> Result:
        """1 to 8 checks as one request (CHECKALL): allowed only if every one is, and
        then each is taken; on a deny none is. The binding check's result, its
        ``rule`` naming it. Raises ``RequestError`` for a malformed request."""
        items = check_all_items(checks)
        with self._lock:
            lines, cause = self._round_trip(check_all_line(items).encode("ascii"), 1)
            result, lost = read_binding(lines, items[0][0], self.fail_open, cause)
            if lost:
                self._close()
        return result

    def check_all_policies(self, checks: Iterable[Check]) -> Tuple[Result, List[Result]]:
        """``check_all``, plus one cost-0 check per distinct rule in the same round
        trip (none for a single rule): the binding result and each rule's state, for
        ``all_or_nothing_headers`` to list every policy."""
        items = check_all_items(checks)
        asks = policy_checks(items)
        with self._lock:
            lines, cause = self._round_trip(all_payload(items, asks), 1 + len(asks))
            result, lost = read_binding(lines, items[0][0], self.fail_open, cause)
            policies, lost2 = read_policies(lines, asks, self.fail_open, cause)
            if lost or lost2:
                self._close()
        return result, policies

    def refund(self, rule: str, key: Key, units: int) -> Result:
        """Gives up to ``units`` back to ``key`` under ``rule`` (never beyond its limit);
        the key's state after it."""
        with self._lock:
            lines, cause = self._round_trip(f"REFUND {rule} {encode_key(key)} {int(units)}\n".encode("ascii"), 1)
            result, lost = read_binding(lines, rule, self.fail_open, cause, binding=False)
            if lost:
                self._close()
        return result

    def close(self) -> None:
        """Closes the connection (the next check opens a new one)."""
        with self._lock:
            self._close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals (called with the lock held) -------------------------------------

    def _round_trip(self, payload: bytes, n: int) -> Tuple[List[str], Optional[str]]:
        deadline = time.monotonic() + self.timeout
        reused = self._sock is not None and self._used
        lines, cause, lost = self._exchange(payload, n, deadline)
        if lost and not lines and reused:
            # A kept connection closed by a daemon restart or idle timeout: one retry
            # on a fresh connection (never after a timeout: the daemon is alive but slow).
            lines, cause, lost = self._exchange(payload, n, deadline)
        return lines, cause

    def _exchange(self, payload: bytes, n: int, deadline: float) -> Tuple[List[str], Optional[str], bool]:
        """Sends, reads up to n lines. Returns (lines, cause of a shortfall, lost)."""
        lines: List[str] = []
        try:
            sock = self._connect(deadline)
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.sendall(payload)
            while len(lines) < n:
                nl = self._buf.find(b"\n")
                if nl >= 0:
                    lines.append(self._buf[:nl].decode("ascii", "replace"))
                    self._buf = self._buf[nl + 1 :]
                    self._used = True
                    continue
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                chunk = sock.recv(65536)
                if not chunk:
                    raise _Lost("ConnectionResetError: daemon closed the connection")
                self._buf += chunk
            return lines, None, False
        except socket.timeout:
            self._close()
            return lines, f"TimeoutError: no reply within {self.timeout}s", False
        except _Lost as e:
            self._close()
            return lines, str(e), True
        except OSError as e:
            self._close()
            return lines, f"{type(e).__name__}: {e}", True

    def _connect(self, deadline: float) -> socket.socket:
        if self._sock is None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                s.connect(self.path)
            except OSError as e:
                s.close()
                if not self._warned:
                    self._warned = True
                    _log.warning("ratelimitd: cannot reach the daemon at %s (%s); every call fails %s until it can",
                                 self.path, type(e).__name__, "open" if self.fail_open else "closed")
                raise
            self._sock, self._buf, self._used = s, b"", False
        return self._sock

    def _close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock, self._buf, self._used = None, b"", False
