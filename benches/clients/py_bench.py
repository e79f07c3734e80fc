"""Python: ratelimitd's AsyncClient against limits (async Redis Cluster storage,
FixedWindowRateLimiter; driver LIMITS_IMPL, coredis by default, or redispy), from one asyncio process, IN_FLIGHT tasks each awaiting one
decision after another. Measured in alternating slices (A B B A ...) of SLICE seconds,
PAIRS pairs, after a warm-up of each; the ratio is the median of the per-pair ratios.

    python py_bench.py <socket> <rule> <host:port,...> spread|hot

Prints one JSON line."""

import asyncio
import json
import os
import random
import sys
import time

from limits import parse
from limits.aio.strategies import FixedWindowRateLimiter
from limits.storage import storage_from_string
from ratelimitd import AsyncClient

socket_path, rule, node_list, keys = sys.argv[1:5]
SLICE = float(os.environ.get("SLICE", 2))
PAIRS = int(os.environ.get("PAIRS", 5))
IN_FLIGHT = int(os.environ.get("IN_FLIGHT", 64))
KEYSPACE = 100000
# limits' async Redis Cluster driver: "coredis" (its default) or "redispy".
LIMITS_IMPL = os.environ.get("LIMITS_IMPL", "coredis")


def key_of() -> str:
    return "hot" if keys == "hot" else f"k{random.randrange(KEYSPACE)}"


async def measure(decide, secs: float):
    end = time.monotonic() + secs
    state = {"n": 0, "errors": 0}

    async def worker() -> None:
        while time.monotonic() < end:
            try:
                await decide(key_of())
                state["n"] += 1
            except Exception as e:  # noqa: BLE001 - counted and shown
                state["errors"] += 1
                if state["errors"] < 3:
                    print(repr(e), file=sys.stderr)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    return state["n"] / (time.perf_counter() - t0), state["errors"]


def median(xs):
    s, m = sorted(xs), len(xs) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


async def main() -> None:
    rl = AsyncClient(socket_path, timeout=2.0)
    sources: dict = {}

    async def rld(key: str) -> None:
        r = await rl.check(rule, key)
        sources[r.source] = sources.get(r.source, 0) + 1
        if not r.allowed:
            raise RuntimeError(f"denied: {r.source} {r.error}")

    storage = storage_from_string("async+redis+cluster://" + node_list, implementation=LIMITS_IMPL)
    limiter = FixedWindowRateLimiter(storage)
    item = parse("1000000000/hour")

    async def lim(key: str) -> None:
        if not await limiter.hit(item, key):
            raise RuntimeError("denied")

    await measure(rld, 1.0)
    await measure(lim, 1.0)
    sources.clear()
    a, b, errors = [], [], 0
    for i in range(PAIRS):
        order = [(rld, a), (lim, b)] if i % 2 == 0 else [(lim, b), (rld, a)]
        for decide, out in order:
            rate, errs = await measure(decide, SLICE)
            out.append(rate)
            errors += errs
    await rl.close()
    ratios = [x / y for x, y in zip(a, b)]
    print(json.dumps({"lang": "python", "peer_driver": LIMITS_IMPL, "keys": keys, "in_flight": IN_FLIGHT, "ratelimitd": round(median(a)),
                      "peer": round(median(b)), "ratio": round(median(ratios), 2),
                      "ratios": [round(r, 2) for r in ratios], "sources": sources, "errors": errors}))


asyncio.run(main())
