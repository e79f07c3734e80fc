"""Turns one surge run's raw records into results.json and report.md, or two runs (without
and with the limiter) into one side-by-side report.

    report.py run DIR                 # DIR/raw/* -> DIR/results.json, DIR/report.md
    report.py compare OUT DIR_OFF DIR_ON [DIR_REDIS_KILLED]   # -> OUT/report.md

results.json: {"endpoints": {name: ROW}, "aggregated": ROW, "params": {...}}, ROW =
{requests, failures, p50_ms, p95_ms, p99_ms, max_ms, count_429, p50_429_ms, p99_429_ms,
backend_rps}. `requests` counts every request; `failures` and p*_ms are about those let
through (not 429), *_429_ms about the rejected ones, backend_rps is calls that reached the
matching service per second of the run. Percentiles are nearest-rank over every request.
"""

from __future__ import annotations

import csv
import glob
import json
import os
import sys

# locust request name -> the matching service's name for the endpoint
ENDPOINTS = {
    "POST /api/rides/request": "rides_request",
    "POST /api/fares/estimate": "fares_estimate",
    "GET /api/drivers/nearby": "drivers_nearby",
}


def pct(sorted_values, p):
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, int(-(-p * len(sorted_values) // 100)) - 1))
    return round(sorted_values[k], 1)


def load_requests(raw):
    rows = []
    for path in sorted(glob.glob(os.path.join(raw, "requests-*.csv"))):
        with open(path) as f:
            for r in csv.DictReader(f):
                rows.append((float(r["t"]), r["name"], float(r["ms"]), r["kind"], int(r["status"])))
    rows.sort()
    return rows


def row(reqs, arrivals, seconds):
    passed = sorted(ms for _, _, ms, kind, _ in reqs if kind != "429")
    rejected = sorted(ms for _, _, ms, kind, _ in reqs if kind == "429")
    return {
        "requests": len(reqs),
        "failures": sum(1 for r in reqs if r[3] == "fail"),
        "p50_ms": pct(passed, 50),
        "p95_ms": pct(passed, 95),
        "p99_ms": pct(passed, 99),
        "max_ms": round(passed[-1], 1) if passed else None,
        "count_429": len(rejected),
        "p50_429_ms": pct(rejected, 50),
        "p99_429_ms": pct(rejected, 99),
        "backend_rps": round(arrivals / seconds, 1) if seconds else 0.0,
    }


def build(run_dir):
    raw = os.path.join(run_dir, "raw")
    with open(os.path.join(raw, "meta.json")) as f:
        meta = json.load(f)
    with open(os.path.join(raw, "app_stats.json")) as f:
        stats = json.load(f)
    reqs = load_requests(raw)
    seconds = meta["t_end"] - meta["t_start"]
    arrivals = stats["arrivals"]
    endpoints = {}
    for name, ep in ENDPOINTS.items():
        endpoints[name] = row([r for r in reqs if r[1] == name], arrivals.get(ep, 0), seconds)
    aggregated = row(reqs, sum(arrivals.values()), seconds)
    served = sum(stats["served"].values())
    params = dict(meta)
    params.update({
        "matching_service": {k: stats[k] for k in ("workers", "service_ms", "queue_max",
                                                   "timeout_ms", "capacity_rps")},
        "backend_served_rps": round(served / seconds, 1) if seconds else 0.0,
        "backend_503": sum(stats["rejected_503"].values()),
        "backend_504": sum(stats["timed_out_504"].values()),
        "offered_rps": round(len(reqs) / seconds, 1) if seconds else 0.0,
        "limiter_sources": stats.get("limiter_sources", {}),
    })
    return {"endpoints": endpoints, "aggregated": aggregated, "params": params}


def _fmt_ms(v):
    if v is None:
        return "—"
    return f"{v / 1000:.2f} s" if v >= 1000 else f"{v:.0f} ms" if v >= 10 else f"{v:.1f} ms"


def _fail_pct(r):
    passed = r["requests"] - r["count_429"]
    return f"{100.0 * r['failures'] / passed:.1f} %" if passed else "—"


def table(columns):
    """The seeds' table layout: one column per run (label, results)."""
    cap = columns[0][1]["params"]["matching_service"]["capacity_rps"]
    head = "| | " + " | ".join(label for label, _ in columns) + " |"
    lines = [head, "|---" * (len(columns) + 1) + "|"]
    aggs = [(label, res["aggregated"], res["params"]) for label, res in columns]
    lines.append("| p99 of requests let through | "
                 + " | ".join(_fmt_ms(a["p99_ms"]) for _, a, _ in aggs) + " |")
    lines.append("| failures (non-429) | " + " | ".join(
        f"{_fail_pct(a)} ({a['failures']} of {a['requests'] - a['count_429']})" for _, a, _ in aggs)
        + " |")
    lines.append("| 429 response time (p50 / p99) | " + " | ".join(
        "—" if not a["count_429"] else f"{_fmt_ms(a['p50_429_ms'])} / {_fmt_ms(a['p99_429_ms'])}"
        for _, a, _ in aggs) + " |")
    base = aggs[0][1]["backend_rps"]
    cells = []
    for i, (_, a, _) in enumerate(aggs):
        cell = f"{a['backend_rps']:.0f} RPS"
        if i and base:
            cell += f" ({100.0 * (a['backend_rps'] - base) / base:+.0f} %)"
        cells.append(cell)
    lines.append(f"| load reaching the matching service (capacity {cap:.0f} RPS) | "
                 + " | ".join(cells) + " |")
    lines.append("| requests sent (rejected with 429) | " + " | ".join(
        f"{a['requests']} ({a['count_429']})" for _, a, _ in aggs) + " |")
    lines.append("| p50 / p95 of requests let through | " + " | ".join(
        f"{_fmt_ms(a['p50_ms'])} / {_fmt_ms(a['p95_ms'])}" for _, a, _ in aggs) + " |")
    return "\n".join(lines)


def endpoint_table(res):
    lines = ["| endpoint | requests | failures | p50 | p95 | p99 | max | 429s | 429 p50 | 429 p99 | backend RPS |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in list(res["endpoints"].items()) + [("all", res["aggregated"])]:
        lines.append(f"| {name} | {r['requests']} | {r['failures']} | {_fmt_ms(r['p50_ms'])} | "
                     f"{_fmt_ms(r['p95_ms'])} | {_fmt_ms(r['p99_ms'])} | {_fmt_ms(r['max_ms'])} | "
                     f"{r['count_429']} | {_fmt_ms(r['p50_429_ms'])} | {_fmt_ms(r['p99_429_ms'])} | "
                     f"{r['backend_rps']} |")
    return "\n".join(lines)


def params_text(res):
    p = res["params"]
    ms = p["matching_service"]
    lines = [
        f"- mode `{p['mode']}`, {p['users']} riders for {p['seconds']} s "
        f"(spawned at {p['spawn_rate']}/s), waits {p['wait_min']}–{p['wait_max']} s, tasks 5 : 2 : 1",
        f"- matching service: {ms['workers']} workers × {ms['service_ms']:.0f} ms = "
        f"{ms['capacity_rps']:.0f} RPS, queue ≤ {ms['queue_max']}, wait ≤ {ms['timeout_ms']:.0f} ms",
        f"- offered {p['offered_rps']} RPS; matching service served {p['backend_served_rps']} RPS, "
        f"refused {p['backend_503']} (503 queue full), timed out {p['backend_504']} (504)",
        f"- CPU (share of one core): locust {p.get('cpu_locust', '?')}, API {p.get('cpu_api', '?')}, "
        f"ratelimitd {p.get('cpu_daemon', '?')}, redis {p.get('cpu_redis', '?')}; "
        f"load average before/after: {p.get('load_before', '?')} / {p.get('load_after', '?')}, "
        f"during (every 5 s): mean {p.get('load_during_mean', '?')}, max {p.get('load_during_max', '?')}"
        + (f"; run at nice {p['nice']}" if p.get("nice") else ""),
    ]
    if p.get("limiter"):
        lines.append(f"- limiter: {p['limiter']}")
    if p.get("limiter_sources"):
        lines.append("- decisions by source: " + ", ".join(
            f"{k} {v}" for k, v in sorted(p["limiter_sources"].items())))
    if p.get("redis_killed_at") is not None:
        lines.append(f"- Redis killed at {p['redis_killed_at']} s, restarted at {p['redis_restarted_at']} s")
    return "\n".join(lines)


def write_run(run_dir):
    res = build(run_dir)
    with open(os.path.join(run_dir, "results.json"), "w") as f:
        json.dump(res, f, indent=2)
    label = {"off": "without limiter", "on": "with limiter",
             "redis-killed": "with limiter, Redis killed for the middle third"}.get(
        res["params"]["mode"], res["params"]["mode"])
    with open(os.path.join(run_dir, "report.md"), "w") as f:
        f.write(f"# Surge run: {label}\n\n{table([(label, res)])}\n\n## Per endpoint\n\n"
                f"{endpoint_table(res)}\n\n## Parameters\n\n{params_text(res)}\n\n"
                "![latency over time](latency.png)\n")
    return res


def write_compare(out, dirs):
    cols = []
    for d in dirs:
        with open(os.path.join(d, "results.json")) as f:
            res = json.load(f)
        label = {"off": "without limiter", "on": "with limiter",
                 "redis-killed": "with limiter, Redis killed for the middle third"}[res["params"]["mode"]]
        cols.append((label, res, d))
    text = ["# Surge: with and without ratelimitd", "", table([(l, r) for l, r, _ in cols]), ""]
    for label, res, d in cols:
        text += [f"## {label}", "", endpoint_table(res), "", params_text(res), ""]
    text.append("![latency over time](latency.png)")
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(text) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "run":
        write_run(sys.argv[2])
    elif sys.argv[1] == "compare":
        write_compare(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(__doc__)
