"""Client for ratelimitd, the per-host rate-limit daemon (standard library only).

    from ratelimitd import Client
    rl = Client("/run/ratelimitd/ratelimitd.sock")
    r = rl.check("rides_request", "user:42")
    if not r.allowed:
        return 429, r.headers()

One connection per Client, opened on first use and reused; re-opened after the daemon
restarts. Thread-safe (a lock serialises requests; use one Client per thread for
parallelism). When the daemon is absent, refuses, or does not answer within
``timeout`` seconds, the result is allowed (``fail_open=True``, the default, source
``client_fail_open``) or denied (``fail_open=False``, source ``client_fail_closed``),
with the cause in ``error``. A request the daemon rejects as malformed (unknown rule,
bad key or cost) raises ``RequestError``: that is a bug to fix, not an outage.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

DEFAULT_SOCKET = "/run/ratelimitd/ratelimitd.sock"

__all__ = ["Client", "Result", "RequestError", "parse_reply", "encode_key", "DEFAULT_SOCKET"]

# Daemon error codes that mean "this request is wrong" (raise) rather than "the
# daemon cannot serve you now" (fail open/closed).
_REQUEST_ERRORS = {"PROTO", "RULE", "KEY", "COST", "TOO_LONG"}


class RequestError(ValueError):
    """The daemon rejected the request itself (ERR PROTO/RULE/KEY/COST/TOO_LONG)."""

    def __init__(self, code: str, message: str):
        super().__init__(f"ratelimitd: ERR {code} {message}")
        self.code = code
        self.message = message


@dataclass
class Result:
    """One decision. Times in milliseconds; ``source`` is the daemon's (redis, cache,
    local, fail_open, fail_closed) or the client's own (client_fail_open,
    client_fail_closed, with ``error`` saying why)."""

    allowed: bool
    limit: int = 0
    remaining: int = 0
    reset_ms: int = 0
    wait_ms: int = 0
    source: str = ""
    rule: str = ""
    error: Optional[str] = None

    @property
    def from_client(self) -> bool:
        """True when the daemon did not decide (fail-open/closed in the client)."""
        return self.source.startswith("client_")

    def headers(self) -> Dict[str, str]:
        """HTTP response headers: IETF draft-ietf-httpapi-ratelimit-headers
        (``RateLimit-Policy``, ``RateLimit``), the common ``X-RateLimit-*`` trio (reset in
        seconds from now), and ``Retry-After`` (seconds) when denied. Empty when the
        daemon did not decide, except ``Retry-After: 1`` on a client fail-closed."""
        if self.from_client:
            return {} if self.allowed else {"Retry-After": "1"}
        reset_s = _ceil_s(self.reset_ms)
        h = {
            "RateLimit-Policy": f'"{self.rule}";q={self.limit}',
            "RateLimit": f'"{self.rule}";r={self.remaining};t={reset_s}',
            "X-RateLimit-Limit": str(self.limit),
            "X-RateLimit-Remaining": str(self.remaining),
            "X-RateLimit-Reset": str(reset_s),
        }
        if not self.allowed:
            h["Retry-After"] = str(max(1, _ceil_s(self.wait_ms)))
        return h


def _ceil_s(ms: int) -> int:
    return int(math.ceil(ms / 1000.0))


def encode_key(key: Union[str, bytes]) -> str:
    """Percent-encodes every byte outside 0x21..0x7E, and ``%`` itself."""
    raw = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    return "".join(chr(b) if 0x21 <= b <= 0x7E and b != 0x25 else "%%%02X" % b for b in raw)


def parse_reply(line: str, rule: str = "") -> Result:
    """Parses a CHECK reply (six fields, extra trailing fields ignored). Raises
    ``RequestError`` for ``ERR`` replies and ``ValueError`` for anything else."""
    fields = line.split()
    if fields and fields[0] == "ERR":
        code = fields[1] if len(fields) > 1 else "INTERNAL"
        raise RequestError(code, " ".join(fields[2:]))
    if len(fields) < 6 or fields[0] not in ("ALLOW", "DENY"):
        raise ValueError(f"ratelimitd: unexpected reply {line!r}")
    nums = [int(f) for f in fields[1:5]]
    return Result(fields[0] == "ALLOW", nums[0], nums[1], nums[2], nums[3], fields[5], rule)


Check = Union[Tuple[str, str], Tuple[str, str, int]]


class Client:
    """A connection to the daemon; see the module docstring."""

    def __init__(self, path: str = DEFAULT_SOCKET, timeout: float = 0.2, fail_open: bool = True):
        self.path = path
        self.timeout = timeout
        self.fail_open = fail_open
        self._sock: Optional[socket.socket] = None
        self._buf = b""
        self._lock = threading.Lock()

    def check(self, rule: str, key: Union[str, bytes], cost: int = 1) -> Result:
        """Asks for ``cost`` units of ``key``'s budget under ``rule``."""
        return self.check_many([(rule, key, cost)])[0]

    def check_many(self, checks: Iterable[Check]) -> List[Result]:
        """Several checks in one round trip (pipelined); results in the same order."""
        items = [(c[0], c[1], c[2] if len(c) > 2 else 1) for c in checks]
        if not items:
            return []
        payload = "".join(f"CHECK {r} {encode_key(k)} {int(n)}\n" for r, k, n in items)
        with self._lock:
            try:
                lines = self._round_trip(payload.encode("ascii"), len(items))
            except (OSError, ConnectionError, ValueError) as e:
                self._close()
                return [self._fallback(r, f"{type(e).__name__}: {e}") for r, _, _ in items]
            out = []
            for (rule, _, _), line in zip(items, lines):
                fields = line.split()
                if fields[:1] == ["ERR"] and fields[1:2] != [] and fields[1] in _REQUEST_ERRORS:
                    raise RequestError(fields[1], " ".join(fields[2:]))
                if fields[:1] == ["ERR"]:
                    # BUSY, PERM, INTERNAL: the daemon cannot serve us now (and closes
                    # the connection after BUSY or PERM).
                    self._close()
                    out.append(self._fallback(rule, f"daemon said: {line}"))
                else:
                    out.append(parse_reply(line, rule))
            return out

    def close(self) -> None:
        """Closes the connection (the next check opens a new one)."""
        with self._lock:
            self._close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------

    def _fallback(self, rule: str, error: str) -> Result:
        if self.fail_open:
            return Result(True, source="client_fail_open", rule=rule, error=error)
        return Result(False, source="client_fail_closed", rule=rule, error=error)

    def _round_trip(self, payload: bytes, n: int) -> List[str]:
        deadline = time.monotonic() + self.timeout
        reused = self._sock is not None
        try:
            return self._exchange(payload, n, deadline)
        except ConnectionError:
            # A kept connection closed by a daemon restart or idle timeout: one retry on
            # a fresh connection (not after a timeout: the daemon is alive but slow).
            self._close()
            if not reused:
                raise
            return self._exchange(payload, n, deadline)

    def _exchange(self, payload: bytes, n: int, deadline: float) -> List[str]:
        try:
            sock = self._connect(deadline)
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.sendall(payload)
            lines: List[str] = []
            while len(lines) < n:
                nl = self._buf.find(b"\n")
                if nl >= 0:
                    lines.append(self._buf[:nl].decode("ascii", "replace"))
                    self._buf = self._buf[nl + 1 :]
                    continue
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionResetError("daemon closed the connection")
                self._buf += chunk
            return lines
        except socket.timeout:
            raise TimeoutError(f"no reply within {self.timeout}s") from None
        except BrokenPipeError as e:
            raise ConnectionResetError(str(e)) from None

    def _connect(self, deadline: float) -> socket.socket:
        if self._sock is None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                s.connect(self.path)
            except OSError:
                s.close()
                raise
            self._sock, self._buf = s, b""
        return self._sock

    def _close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock, self._buf = None, b""
