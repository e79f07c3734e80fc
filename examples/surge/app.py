"""A small ride-hailing API of fixed capacity, the service the surge experiment overloads.

Three endpoints, each doing one call to the in-process matching service (matching.py):
    POST /api/rides/request     POST /api/fares/estimate     GET /api/drivers/nearby
GET /_stats, the matching service's counters (read by run.sh at the end of a run), and
GET /healthz (riders open their connection with it before the surge).

A plain ASGI callable (no framework: on a 2-core machine every microsecond the API
spends is one the load generator cannot). Served by uvicorn:
    uvicorn --app-dir examples/surge app:app
Configured through the environment (run.sh sets it):
    SURGE_WORKERS=4 SURGE_SERVICE_MS=50 SURGE_QUEUE_MAX=1000 SURGE_QUEUE_TIMEOUT_MS=2000
    SURGE_RL_SOCKET=<daemon socket>   (absent or empty: no rate limiting)
    SURGE_RIDER_RULE=surge_rider SURGE_GUARD_RULE=surge_matching (empty: no guard)
"""

from __future__ import annotations

import json
import os

from matching import MatchingService, Unavailable

ROUTES = {
    ("POST", "/api/rides/request"): "rides_request",
    ("POST", "/api/fares/estimate"): "fares_estimate",
    ("GET", "/api/drivers/nearby"): "drivers_nearby",
}

matching = MatchingService(
    workers=int(os.environ.get("SURGE_WORKERS", "4")),
    service_ms=float(os.environ.get("SURGE_SERVICE_MS", "50")),
    queue_max=int(os.environ.get("SURGE_QUEUE_MAX", "1000")),
    timeout_ms=float(os.environ.get("SURGE_QUEUE_TIMEOUT_MS", "2000")),
)
limiter_sources: dict = {}  # decisions by verdict and source, when rate limiting is on


async def _send_json(send, status: int, body: dict) -> None:
    payload = json.dumps(body).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode())],
    })
    await send({"type": "http.response.body", "body": payload})


async def _drain(receive) -> None:
    """Reads the request body (riders send a small JSON document) and ignores it."""
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False) and message["type"] == "http.request"


async def api(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    method, path = scope["method"], scope["path"]
    if method == "GET" and path == "/_stats":
        stats = matching.stats()
        stats["limiter_sources"] = dict(limiter_sources)
        return await _send_json(send, 200, stats)
    if path == "/healthz":
        return await _send_json(send, 200, {"ok": True})
    endpoint = ROUTES.get((method, path))
    if endpoint is None:
        return await _send_json(send, 404, {"error": "not found"})
    await _drain(receive)
    try:
        await matching.call(endpoint)
    except Unavailable as e:
        return await _send_json(send, e.status, {"error": e.reason})
    return await _send_json(send, 200, {"ok": True, "endpoint": endpoint})


app = api
if os.environ.get("SURGE_RL_SOCKET"):
    from limiter import front_door

    app, limiter_sources = front_door(
        api,
        os.environ["SURGE_RL_SOCKET"],
        rider_rule=os.environ.get("SURGE_RIDER_RULE", "surge_rider"),
        guard_rule=os.environ.get("SURGE_GUARD_RULE", "surge_matching"),
    )
