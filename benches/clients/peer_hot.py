"""limits (async Redis Cluster storage, FixedWindowRateLimiter; driver LIMITS_IMPL,
coredis by default, or redispy) deciding one hot key, IN_FLIGHT tasks each awaiting one
decision after another, for SECONDS after a 1 s warm-up. Run by benches/leases.sh, three
at once, as three application processes.

    python peer_hot.py <host:port,...> <seconds>

Prints one JSON line: decisions, seconds, errors."""

import asyncio
import json
import os
import sys
import time

from limits import parse
from limits.aio.strategies import FixedWindowRateLimiter
from limits.storage import storage_from_string

node_list, seconds = sys.argv[1], float(sys.argv[2])
IN_FLIGHT = int(os.environ.get("IN_FLIGHT", 64))
LIMITS_IMPL = os.environ.get("LIMITS_IMPL", "coredis")


async def run(hit, secs: float) -> dict:
    end = time.monotonic() + secs
    state = {"n": 0, "errors": 0}

    async def worker() -> None:
        while time.monotonic() < end:
            try:
                await hit()
                state["n"] += 1
            except Exception:  # noqa: BLE001 - counted
                state["errors"] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    return {"n": state["n"], "secs": time.perf_counter() - t0, "errors": state["errors"]}


async def main() -> None:
    storage = storage_from_string("async+redis+cluster://" + node_list, implementation=LIMITS_IMPL)
    limiter = FixedWindowRateLimiter(storage)
    item = parse("1000000000/hour")

    async def hit() -> None:
        if not await limiter.hit(item, "hot"):
            raise RuntimeError("denied")

    await run(hit, 1.0)
    print(json.dumps(await run(hit, seconds)))


asyncio.run(main())
