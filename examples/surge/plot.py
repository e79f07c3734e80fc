"""Draws a surge run (or several, overlaid) over time: latency of the requests let
through and of the 429s (top, log scale), and the load reaching the matching service
with its capacity drawn (bottom). A Redis outage window, when the run had one, is shaded.

    plot.py OUT.png DIR [DIR ...]        # DIR as written by run.sh (raw/ and results.json)
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from report import load_requests, pct  # noqa: E402

STYLE = {"off": ("tab:red", "without limiter"), "on": ("tab:blue", "with limiter"),
         "redis-killed": ("tab:green", "with limiter, Redis killed")}


def per_second(run_dir):
    with open(os.path.join(run_dir, "results.json")) as f:
        res = json.load(f)
    p = res["params"]
    t0 = p["t_start"]
    passed, rejected = defaultdict(list), defaultdict(list)
    for t, _, ms, kind, _ in load_requests(os.path.join(run_dir, "raw")):
        (rejected if kind == "429" else passed)[int(t - t0)].append(ms)
    with open(os.path.join(run_dir, "raw", "app_stats.json")) as f:
        stats = json.load(f)
    arrivals = {int(k) - int(t0): v for k, v in stats["arrivals_per_s"].items()}
    served = {int(k) - int(t0): v for k, v in stats["served_per_s"].items()}
    secs = range(0, int(p["t_end"] - t0))

    def series(d, q):
        xs = [s for s in secs if d.get(s)]
        return xs, [pct(sorted(d[s]), q) for s in xs]

    return res, series(passed, 50), series(passed, 99), series(rejected, 99), \
        ([s for s in secs], [arrivals.get(s, 0) for s in secs]), \
        ([s for s in secs], [served.get(s, 0) for s in secs])


def main(out, dirs):
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11.5, 6.5), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    capacity = None
    for d in dirs:
        res, p50, p99, p99_429, arrivals, served = per_second(d)
        p = res["params"]
        color, label = STYLE.get(p["mode"], ("black", p["mode"]))
        top.plot(*p99, color=color, lw=1.4, label=f"{label}: p99 let through")
        top.plot(*p50, color=color, lw=0.9, ls="--", label=f"{label}: p50 let through")
        if p99_429[0]:
            top.plot(*p99_429, color=color, lw=0.9, ls=":", label=f"{label}: p99 of 429s")
        bottom.plot(*arrivals, color=color, lw=1.2, label=f"{label}: calls arriving")
        capacity = p["matching_service"]["capacity_rps"]
        if p.get("redis_killed_at") is not None:
            for ax in (top, bottom):
                ax.axvspan(p["redis_killed_at"], p["redis_restarted_at"], color="0.85", zorder=0)
            top.text(p["redis_killed_at"], 0.97, " Redis down (green run)", transform=top.get_xaxis_transform(),
                     va="top", fontsize=8)
    bottom.axhline(capacity, color="black", lw=1, ls="--",
                   label=f"matching service capacity ({capacity:.0f} RPS)")
    top.set_yscale("log")
    top.set_ylabel("latency per second of run (ms)")
    top.grid(True, which="both", alpha=0.3)
    top.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    bottom.set_ylabel("calls reaching the\nmatching service (per s)")
    bottom.set_xlabel("seconds since the surge began")
    bottom.set_ylim(bottom=0)
    bottom.grid(True, alpha=0.3)
    bottom.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    users = res["params"]["users"]
    fig.suptitle(f"Concert surge: {users} riders, waits "
                 f"{res['params']['wait_min']}–{res['params']['wait_max']} s", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    _shrink(out)


def _shrink(path):
    """Re-saves the PNG with a 64-colour palette: a third of the size, same look."""
    from PIL import Image  # matplotlib's own dependency

    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=64)
    small.save(path, optimize=True)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
