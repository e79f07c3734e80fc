"""How a middleware turns one HTTP request into checks: a fixed rule or one chosen
by a callable, a key from a callable (None skips the request), or a callable that
returns every (rule, key, cost) the request must pass. Shared by ASGI and WSGI."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

from ._result import Check, Key, normalize

RuleSpec = Union[str, Callable[[Any], Optional[str]]]
KeyFunc = Callable[[Any], Optional[Key]]
ChecksFunc = Callable[[Any], Optional[Sequence[Check]]]

DENY_BODY = b"Too Many Requests\n"


def make_checks(
    rule: Optional[RuleSpec], key: Optional[KeyFunc], cost: int, checks: Optional[ChecksFunc], default_key: KeyFunc
) -> Callable[[Any], List[Tuple[str, Key, int]]]:
    """One function from the request (ASGI scope or WSGI environ) to its checks."""
    if checks is not None:
        if rule is not None or key is not None:
            raise TypeError("give either checks= or rule=/key=, not both")
        f = checks
        return lambda req: normalize(list(f(req) or ()))
    if rule is None:
        raise TypeError("rule= (a name or a callable) or checks= is required")
    rule_of = rule if callable(rule) else (lambda _req, _r=rule: _r)
    key_of = key or default_key

    def one(req: Any) -> List[Tuple[str, Key, int]]:
        r, k = rule_of(req), key_of(req)
        return [] if r is None or k is None else [(r, k, cost)]

    return one
