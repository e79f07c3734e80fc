"""The simulated downstream "matching service": a fixed pool of workers behind a bounded
queue, the thing the surge overloads and the rate limiter protects.

A call waits for one of `workers` slots, holds it for `service_ms`, and releases it, so
the pool serves at most workers / service_ms requests per second (4 x 50 ms = 80 RPS).
Beyond that, calls queue: a call that finds `queue_max` others already waiting fails at
once (503, the pool is exhausted), and one that waits longer than `timeout_ms` for a
worker gives up (504), the way an HTTP handler in front of a saturated connection pool
behaves. Every call that reaches the service is counted (arrivals), per second and per
endpoint, so the experiment can report what load the service really saw.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter


class Unavailable(Exception):
    """The matching service could not take the call: `status` is 503 or 504."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


class MatchingService:
    def __init__(self, workers: int, service_ms: float, queue_max: int, timeout_ms: float):
        self.workers = workers
        self.service_s = service_ms / 1000.0
        self.queue_max = queue_max
        self.timeout_s = timeout_ms / 1000.0
        self._slots = asyncio.Semaphore(workers)
        self.waiting = 0
        self.arrivals: Counter = Counter()  # per endpoint
        self.served: Counter = Counter()
        self.rejected: Counter = Counter()  # 503: queue full
        self.timed_out: Counter = Counter()  # 504: waited too long
        self.arrivals_per_s: Counter = Counter()  # unix second -> calls that arrived
        self.served_per_s: Counter = Counter()

    @property
    def capacity_rps(self) -> float:
        return self.workers / self.service_s

    async def call(self, endpoint: str) -> None:
        """One unit of matching work for `endpoint`; raises Unavailable on overload."""
        self.arrivals[endpoint] += 1
        self.arrivals_per_s[int(time.time())] += 1
        if self.waiting >= self.queue_max:
            self.rejected[endpoint] += 1
            raise Unavailable(503, "matching service queue full")
        self.waiting += 1
        try:
            await asyncio.wait_for(self._slots.acquire(), self.timeout_s)
        except asyncio.TimeoutError:
            self.timed_out[endpoint] += 1
            raise Unavailable(504, "matching service timed out") from None
        finally:
            self.waiting -= 1
        try:
            await asyncio.sleep(self.service_s)
        finally:
            self._slots.release()
        self.served[endpoint] += 1
        self.served_per_s[int(time.time())] += 1

    def stats(self) -> dict:
        return {
            "workers": self.workers,
            "service_ms": self.service_s * 1000.0,
            "queue_max": self.queue_max,
            "timeout_ms": self.timeout_s * 1000.0,
            "capacity_rps": self.capacity_rps,
            "arrivals": dict(self.arrivals),
            "served": dict(self.served),
            "rejected_503": dict(self.rejected),
            "timed_out_504": dict(self.timed_out),
            "arrivals_per_s": {str(k): v for k, v in sorted(self.arrivals_per_s.items())},
            "served_per_s": {str(k): v for k, v in sorted(self.served_per_s.items())},
        }
