"""What a decision is and how it reads on the wire and in HTTP: the reply parser, the
key encoding, the choice of the most restrictive result and the response headers.
Shared by the sync and asyncio clients and both middlewares; no I/O here."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

DEFAULT_SOCKET = "/run/ratelimitd/ratelimitd.sock"

# Daemon error codes that mean "this request is wrong" (raise) rather than "the
# daemon cannot serve you now" (fail open/closed).
REQUEST_ERRORS = frozenset({"PROTO", "RULE", "KEY", "COST", "TOO_LONG"})

Key = Union[str, bytes]
Check = Union[Tuple[str, Key], Tuple[str, Key, int]]


class RequestError(ValueError):
    """The daemon rejected the request itself (ERR PROTO/RULE/KEY/COST/TOO_LONG): a
    bug in the caller, never turned into an allow or a deny."""

    def __init__(self, code: str, message: str):
        super().__init__(f"ratelimitd: ERR {code} {message}")
        self.code = code
        self.message = message


class ReplyError(ValueError):
    """A reply line the client cannot read (treated as a daemon failure)."""


@dataclass
class Result:
    """One decision. Times in milliseconds. ``source`` is the daemon's (redis, cache,
    local, lease, fail_open, fail_closed) or the client's own (client_fail_open,
    client_fail_closed, with ``error`` saying why). ``window_ms`` is the rule's policy
    window (None from a daemon that does not send it)."""

    allowed: bool
    limit: int = 0
    remaining: int = 0
    reset_ms: int = 0
    wait_ms: int = 0
    source: str = ""
    rule: str = ""
    error: Optional[str] = None
    window_ms: Optional[int] = None

    @property
    def from_client(self) -> bool:
        """True when the daemon did not decide (the client failed open or closed)."""
        return self.source.startswith("client_")

    def headers(self, legacy: bool = False) -> Dict[str, str]:
        """The HTTP headers for this one result (see ``response_headers``)."""
        return response_headers([self], legacy)


def ceil_s(ms: int) -> int:
    """Milliseconds to whole seconds, rounded up."""
    return -(-int(ms) // 1000)


_PLAIN_KEY = re.compile(r"[\x21-\x24\x26-\x7e]+")


def encode_key(key: Key) -> str:
    """Percent-encodes every byte outside 0x21..0x7E, and ``%`` itself."""
    if isinstance(key, str) and _PLAIN_KEY.fullmatch(key):
        return key  # the common case, nothing to encode
    raw = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    return "".join(chr(b) if 0x21 <= b <= 0x7E and b != 0x25 else "%%%02X" % b for b in raw)


def normalize(checks: Sequence[Check]) -> List[Tuple[str, Key, int]]:
    """(rule, key) or (rule, key, cost) tuples to (rule, key, cost)."""
    return [(c[0], c[1], int(c[2]) if len(c) > 2 else 1) for c in checks]


def request_line(rule: str, key: Key, cost: int) -> str:
    return f"CHECK {rule} {encode_key(key)} {int(cost)}\n"


def parse_reply(line: str, rule: str = "") -> Result:
    """Parses a CHECK reply: six fields, an optional seventh ``window_ms`` (None when
    absent or not a number), further trailing fields ignored. Raises ``RequestError``
    for an ERR reply with a request-error code and ``ReplyError`` for anything else it
    cannot read."""
    fields = line.split()
    if fields and fields[0] == "ERR":
        code = fields[1] if len(fields) > 1 else "INTERNAL"
        if code in REQUEST_ERRORS:
            raise RequestError(code, " ".join(fields[2:]))
        raise ReplyError(f"daemon said: {line.strip()}")
    if len(fields) < 6 or fields[0] not in ("ALLOW", "DENY") or not line.isascii():
        raise ReplyError(f"unexpected reply {line.strip()!r}")
    limit, remaining, reset_ms, wait_ms = fields[1:5]
    if not (limit.isdigit() and remaining.isdigit() and reset_ms.isdigit() and wait_ms.isdigit()):
        raise ReplyError(f"unexpected reply {line.strip()!r}")
    # A seventh field that is not a count (from some later protocol) means "unknown".
    window = int(fields[6]) if len(fields) > 6 and fields[6].isdigit() else None
    return Result(fields[0] == "ALLOW", int(limit), int(remaining), int(reset_ms), int(wait_ms), fields[5], rule,
                  None, window)


def fallback(rule: str, fail_open: bool, error: str) -> Result:
    """The client's own decision when the daemon could not give one."""
    if fail_open:
        return Result(True, source="client_fail_open", rule=rule, error=error)
    return Result(False, source="client_fail_closed", rule=rule, error=error)


def _rank(r: Result) -> Tuple[int, int, int, float]:
    # Smaller sorts first = more restrictive: any deny before any allow; a daemon's
    # answer before the client's own; the longest wait (denied) or the fewest
    # remaining (allowed); then the lowest remaining/limit ratio. Ties: first in order.
    ratio = r.remaining / r.limit if r.limit > 0 else 0.0
    if not r.allowed:
        return (0, 1 if r.from_client else 0, -r.wait_ms, ratio)
    return (1, 1 if r.from_client else 0, r.remaining, ratio)


def most_restrictive(results: Sequence[Result]) -> Result:
    """The result that sets the HTTP headers when one request checked several rules."""
    if not results:
        raise ValueError("no results")
    return min(results, key=_rank)  # min() keeps the first of equals


def status_for(results: Sequence[Result]) -> int:
    """429 when any result is denied, else 200."""
    return 429 if any(not r.allowed for r in results) else 200


def _sf_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _policy(r: Result, name: str) -> str:
    p = f"{_sf_string(name)};q={r.limit}"
    return p + f";w={ceil_s(r.window_ms)}" if r.window_ms else p


def policy_list(binding: Result, results: Sequence[Result]) -> str:
    """The ``RateLimit-Policy`` value: every distinct rule of ``results`` once, in
    order, joined by ``", "``; the binding rule's ``"<rule>";q=<limit>;w=<window_s>``
    from ``binding``, another's from its first daemon-decided result (a rule with
    none is left out). A binding rule not among them (a composite rule's member)
    comes first."""
    names: List[str] = []
    first: Dict[str, Result] = {binding.rule: binding}
    for r in results:
        if r.rule not in names:
            names.append(r.rule)
        if not r.from_client:
            first.setdefault(r.rule, r)
    if binding.rule not in names:
        names.insert(0, binding.rule)
    return ", ".join(_policy(first[n], n) for n in names if n in first)


def response_headers(results: Sequence[Result], legacy: bool = False) -> Dict[str, str]:
    """HTTP headers for one request's results: ``RateLimit-Policy`` listing every
    rule (``"<rule>";q=<limit>;w=<window_s>``, see ``policy_list``), and from the
    most restrictive result ``RateLimit: "<rule>";r=<remaining>;t=<reset_s>`` (IETF
    draft-ietf-httpapi-ratelimit-headers), ``Retry-After`` (seconds) when denied, and
    with ``legacy`` the ``X-RateLimit-Limit/-Remaining/-Reset`` trio. None when the
    client failed open; only ``Retry-After: 1`` when it failed closed."""
    if not results:
        return {}
    r = most_restrictive(results)
    if r.from_client:
        return {} if r.allowed else {"Retry-After": "1"}
    name = _sf_string(r.rule)
    reset_s = ceil_s(r.reset_ms)
    h = {"RateLimit-Policy": policy_list(r, results), "RateLimit": f"{name};r={r.remaining};t={reset_s}"}
    if not r.allowed:
        h["Retry-After"] = str(max(1, ceil_s(r.wait_ms)))
    if legacy:
        h["X-RateLimit-Limit"] = str(r.limit)
        h["X-RateLimit-Remaining"] = str(r.remaining)
        h["X-RateLimit-Reset"] = str(reset_s)
    return h
