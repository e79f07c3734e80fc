"""The concert surge: riders who all just left a concert hammer the ride-hailing API.

Each simulated rider has its own id (X-User-Id), requests a ride, estimates fares and
looks for nearby drivers (task weights 5 : 2 : 1), and waits only 0.1-0.3 s between
requests (a rider refreshing the app in a hurry). A 429 is the limiter doing its job:
it is marked a success for locust's own tallies and counted as a rejection here.

Every request is also written, one line each, to $SURGE_LOG_DIR/requests-<pid>.csv
(start time, endpoint, ms, kind, status), so the report can take percentiles of the
requests let through and of the rejected ones separately, and plot them over time.
"""

from __future__ import annotations

import itertools
import os
import random
import time

from locust import FastHttpUser, between, events, task

WAIT_MIN = float(os.environ.get("SURGE_WAIT_MIN", "0.1"))
WAIT_MAX = float(os.environ.get("SURGE_WAIT_MAX", "0.3"))
WARMUP = "warm-up (not measured)"
_ids = itertools.count(1)
_log = None


@events.init.add_listener
def _open_log(environment, **_kw):
    global _log
    log_dir = os.environ.get("SURGE_LOG_DIR")
    if log_dir:
        path = os.path.join(log_dir, f"requests-{os.getpid()}.csv")
        _log = open(path, "w", buffering=1 << 20)
        _log.write("t,name,ms,kind,status\n")


@events.test_start.add_listener
def _started(environment, **_kw):
    _mark("started")


@events.test_stop.add_listener
def _stopped(environment, **_kw):
    _mark("stopped")


def _mark(what):
    """Records when the test started and stopped (run.sh times the run and the Redis
    outage from these, not from the process start)."""
    log_dir = os.environ.get("SURGE_LOG_DIR")
    if log_dir:
        with open(os.path.join(log_dir, what), "w") as f:
            f.write(f"{time.time():.4f}\n")


@events.quitting.add_listener
def _close_log(environment, **_kw):
    if _log is not None:
        _log.flush()
        _log.close()


@events.request.add_listener
def _record(request_type, name, response_time, response, exception, start_time=None, **_kw):
    if _log is None or name == WARMUP:
        return
    status = getattr(response, "status_code", 0) or 0
    if status == 429:
        kind = "429"
    elif exception is not None or not 200 <= status < 400:
        kind = "fail"
    else:
        kind = "ok"
    _log.write(f"{start_time:.4f},{name},{response_time:.2f},{kind},{status}\n")


class Rider(FastHttpUser):
    wait_time = between(WAIT_MIN, WAIT_MAX)

    def on_start(self):
        self.rider = f"rider-{os.getpid()}-{next(_ids)}"
        self.headers = {"X-User-Id": self.rider, "Content-Type": "application/json"}
        # A rider's app already holds a connection when the concert ends: open it
        # first, unmeasured, so the surge measures the API and not TCP handshakes.
        self.client.request("GET", "/healthz", name=WARMUP)

    def _call(self, method: str, path: str, body: str = None):
        with self.client.request(method, path, data=body, headers=self.headers,
                                 name=f"{method} {path.split('?')[0]}", catch_response=True) as resp:
            if resp.status_code == 429:
                resp.success()  # a rejection, not a failure

    @task(5)
    def request_ride(self):
        lat, lon = 40.75 + random.random() / 100, -73.99 + random.random() / 100
        self._call("POST", "/api/rides/request", f'{{"pickup":[{lat:.5f},{lon:.5f}]}}')

    @task(2)
    def estimate_fare(self):
        self._call("POST", "/api/fares/estimate", '{"from":"arena","to":"downtown"}')

    @task(1)
    def nearby_drivers(self):
        self._call("GET", "/api/drivers/nearby?lat=40.75&lon=-73.99")
