"""Several limits as one all-or-nothing request (CHECKALL): the request lines, how
the replies read, and the headers of an HTTP response decided that way. Shared by
the sync and asyncio clients and both middlewares; no I/O here.

The CHECKALL reply carries the binding rule's fields only. So that
``RateLimit-Policy`` can list every rule the request answered to, the same round
trip carries one ``CHECK <rule> <key> 0`` per distinct rule (cost 0 takes nothing)
when the checks name more than one rule."""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ._result import (
    Check,
    Key,
    ReplyError,
    RequestError,
    Result,
    encode_key,
    fallback,
    normalize,
    parse_reply,
    policy_list,
    request_line,
    response_headers,
)

#: Most checks one ``check_all`` may carry.
MAX_TRIPLES = 8

Items = List[Tuple[str, Key, int]]


def check_all_items(checks: Iterable[Check]) -> Items:
    """The checks as (rule, key, cost); raises ``RequestError`` (PROTO) unless 1 to 8."""
    items = normalize(list(checks))
    if not 1 <= len(items) <= MAX_TRIPLES:
        raise RequestError("PROTO", f"check_all takes 1 to {MAX_TRIPLES} (rule, key[, cost]) checks")
    return items


def check_all_line(items: Items) -> str:
    """``CHECKALL <rule> <key> <cost> ...`` with its newline."""
    return "CHECKALL" + "".join(f" {r} {encode_key(k)} {int(n)}" for r, k, n in items) + "\n"


def policy_checks(items: Items) -> Items:
    """One cost-0 check per distinct rule (its first key), or none for a single rule."""
    first: Dict[str, Key] = {}
    for rule, key, _ in items:
        first.setdefault(rule, key)
    return [] if len(first) < 2 else [(r, k, 0) for r, k in first.items()]


def all_payload(items: Items, asks: Items) -> bytes:
    """The CHECKALL line, then the cost-0 lines."""
    return (check_all_line(items) + "".join(request_line(r, k, 0) for r, k, _ in asks)).encode("ascii")


def read_binding(lines: Sequence[str], rule: str, fail_open: bool, cause: Optional[str],
                 binding: bool = True) -> Tuple[Result, bool]:
    """The CHECKALL reply (``lines[0]``) as a result whose ``rule`` is the binding one
    (the first check's when the client decided), and whether the connection is out of
    step (a line that is not a reply). Raises ``RequestError`` for a caller bug.
    ``binding=False`` reads a REFUND reply (no rule name after ``window_ms``)."""
    if not lines:
        return fallback(rule, fail_open, cause or "no reply"), False
    try:
        result = parse_reply(lines[0], rule)
    except ReplyError as e:
        return fallback(rule, fail_open, str(e)), not lines[0].startswith("ERR")
    fields = lines[0].split()
    if binding and len(fields) >= 8:
        result.rule = fields[7]  # the binding rule, after window_ms
    return result, False


def read_policies(lines: Sequence[str], asks: Items, fail_open: bool,
                  cause: Optional[str]) -> Tuple[List[Result], bool]:
    """The cost-0 replies (``lines[1:]``); one that cannot be read is a fallback
    (left out of the headers). Also whether the connection is out of step."""
    out: List[Result] = []
    lost = False
    for i, (rule, _, _) in enumerate(asks):
        line = lines[i + 1] if i + 1 < len(lines) else None
        if line is None:
            out.append(fallback(rule, fail_open, cause or "no reply"))
            continue
        try:
            out.append(parse_reply(line, rule))
        except (ReplyError, RequestError) as e:
            lost = lost or not line.startswith("ERR")
            out.append(fallback(rule, fail_open, str(e)))
    return out, lost


def all_or_nothing_headers(binding: Result, policies: Sequence[Result], legacy: bool = False) -> Dict[str, str]:
    """The headers of a request decided by ``check_all_policies``: ``RateLimit``,
    ``Retry-After`` (denied) and the legacy trio from the binding result;
    ``RateLimit-Policy`` lists every distinct rule once, in the order of the checks
    (see ``policy_list``). Client fail-open: none; fail-closed: only
    ``Retry-After: 1``."""
    h = response_headers([binding], legacy)
    if not binding.from_client:
        h["RateLimit-Policy"] = policy_list(binding, policies)
    return h
