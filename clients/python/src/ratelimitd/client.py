"""The blocking client: one Unix-socket connection, shared safely by threads.

A lock serialises round trips, so one ``Client`` may be used by every thread of a
WSGI server; ``check_many`` pipelines several checks in one round trip. Failures
(daemon absent, refused, closed, slow, overloaded) become the configured fallback
result with its cause; a request the daemon rejects as malformed raises."""

from __future__ import annotations

import socket
import threading
import time
from typing import Iterable, List, Optional, Tuple

from ._result import (
    DEFAULT_SOCKET,
    Check,
    Key,
    ReplyError,
    RequestError,
    Result,
    fallback,
    normalize,
    parse_reply,
    request_line,
)


class _Lost(Exception):
    """The connection ended (EOF, reset, broken pipe, refused, absent)."""


class Client:
    """A connection to the daemon.

    ``timeout`` (seconds) bounds each round trip, connecting included; it is never
    retried. ``fail_open`` (default True) makes a failure an allow with source
    ``client_fail_open``; False makes it a deny with ``client_fail_closed``. A kept
    connection found closed (daemon restarted) is retried once on a fresh one."""

    def __init__(self, path: str = DEFAULT_SOCKET, timeout: float = 0.2, fail_open: bool = True):
        self.path = path
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
            except OSError:
                s.close()
                raise
            self._sock, self._buf, self._used = s, b"", False
        return self._sock

    def _close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock, self._buf, self._used = None, b"", False
