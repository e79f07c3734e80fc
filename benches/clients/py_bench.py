"""One closed-loop measurement from one Python process (asyncio): IN_FLIGHT concurrent
tasks, each awaiting one decision after another, for DURATION seconds after a warm-up.

    python py_bench.py rld <socket> <rule> spread|hot
    python py_bench.py limits <host:port,...> - spread|hot   (limits, async Redis Cluster storage)

Prints one JSON line: decisions per second, the sources seen (ratelimitd), errors."""

import asyncio
import json
import os
import random
import sys
import time

impl, target, rule, keys = sys.argv[1:5]
DURATION = float(os.environ.get("DURATION", 5))
WARMUP = float(os.environ.get("WARMUP", 1))
IN_FLIGHT = int(os.environ.get("IN_FLIGHT", 64))
KEYSPACE = 100000


async def main() -> None:
    sources: dict = {}
    if impl == "rld":
        from ratelimitd import AsyncClient

        rl = AsyncClient(target, timeout=2.0)

        async def decide(key: str) -> None:
            r = await rl.check(rule, key)
            sources[r.source] = sources.get(r.source, 0) + 1
            if not r.allowed:
                raise RuntimeError(f"denied: {r.source} {r.error}")
    else:
        from limits import parse
        from limits.storage import storage_from_string
        from limits.aio.strategies import FixedWindowRateLimiter

        storage = storage_from_string("async+redis+cluster://" + target)
        limiter = FixedWindowRateLimiter(storage)
        item = parse("1000000000/hour")

        async def decide(key: str) -> None:
            if not await limiter.hit(item, key):
                raise RuntimeError("denied")

    key_of = (lambda: "hot") if keys == "hot" else (lambda: f"k{random.randrange(KEYSPACE)}")
    state = {"counting": False, "n": 0, "errors": 0, "stop": False}

    async def worker() -> None:
        while not state["stop"]:
            try:
                await decide(key_of())
                if state["counting"]:
                    state["n"] += 1
            except Exception as e:  # noqa: BLE001 - counted and shown
                state["errors"] += 1
                if state["errors"] < 3:
                    print(repr(e), file=sys.stderr)

    tasks = [asyncio.create_task(worker()) for _ in range(IN_FLIGHT)]
    await asyncio.sleep(WARMUP)
    sources.clear()
    state["counting"] = True
    t0 = time.perf_counter()
    await asyncio.sleep(DURATION)
    state["counting"] = False
    secs = time.perf_counter() - t0
    done = state["n"]
    state["stop"] = True
    await asyncio.gather(*tasks)
    print(json.dumps({"impl": impl, "keys": keys, "in_flight": IN_FLIGHT, "decisions_per_s": round(done / secs),
                      "sources": sources, "errors": state["errors"]}))


asyncio.run(main())
