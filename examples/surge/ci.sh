#!/usr/bin/env bash
# The surge experiment, short, as a test: the same 100-rider surge for 20 s without and
# with the limiter, then the direction the full run shows, asserted on what was measured:
#   with the limiter: failures of requests let through <= 1 %, their p99 <= 1/5 of the
#   unprotected run's, 429s answered with p99 <= 20 ms, the matching service at or under
#   its capacity; without it: the matching service saturated (>= 90 % of capacity).
# Prints each assertion with its figure and closes with `surge: N passed, M failed`;
# exits non-zero on a failure. Options go to run.sh (e.g. --users 200 --seconds 30).
#
# Why 100 riders and 80 RPS of capacity: the direction must hold on a 2-core machine.
# 100 riders offer ~430 RPS (5x capacity) with the limiter, about half of one core for
# locust, API, daemon and Redis together; without it, 100 closed-loop riders keep ~95
# calls queued, a p99 near 1.1 s against ~0.1 s protected. The 429 bound (20 ms at p99,
# 1-2 ms at p50) is the one a machine busy with other work can break: when an attempt
# fails, the pair of runs is made once more and the second attempt decides (both print).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="$(mktemp -d /tmp/surge-ci.XXXXXX)"
trap 'rm -rf "$OUT"' EXIT
PY="$("$HERE/venv.sh")/bin/python" || { echo "surge: 0 passed, 1 failed (venv)"; exit 1; }

attempt() { # attempt <n>: runs off and on, prints the checks, returns their verdict
  local dir="$OUT/$1"
  if ! "$HERE/compare.sh" --out "$dir" --users 100 --seconds 20 ${ARGS[@]+"${ARGS[@]}"} >"$dir.log" 2>&1; then
    cat "$dir.log"
    echo "surge: the runs themselves failed (log above)"
    return 2
  fi
  echo "--- attempt $1"
  sed -n '3,10p' "$dir/report.md"
  "$PY" - "$dir" "$1" <<'PY'
import json, os, sys
out, n = sys.argv[1], sys.argv[2]
off = json.load(open(os.path.join(out, "off", "results.json")))
on = json.load(open(os.path.join(out, "on", "results.json")))
a, b = off["aggregated"], on["aggregated"]
cap = on["params"]["matching_service"]["capacity_rps"]
let_through = b["requests"] - b["count_429"]
fail_pct = 100.0 * b["failures"] / let_through if let_through else 100.0
# A latency bound means nothing on an oversubscribed machine. The run itself keeps about
# 1.3 cores busy (locust, the API, the daemon, Redis); when the load average during the
# protected run exceeded 1.5 x the cores, other programs were competing for the CPU, and
# the 429 latency check is reported as skipped, with the load and the figure, instead of
# passing or failing on another program's account.
cores = os.cpu_count() or 1
load_on = on["params"].get("load_during_mean")
overloaded = load_on is not None and float(load_on) > 1.5 * cores
checks = [
    ("with limiter: some requests rejected with 429", b["count_429"] > 0, f"{b['count_429']} 429s"),
    ("with limiter: failures of requests let through <= 1 %", fail_pct <= 1.0,
     f"{fail_pct:.2f} % ({b['failures']} of {let_through})"),
    ("with limiter: p99 let through <= 1/5 of without", b["p99_ms"] is not None and a["p99_ms"] is not None
     and b["p99_ms"] <= a["p99_ms"] / 5, f"{b['p99_ms']} ms vs {a['p99_ms']} ms"),
    ("with limiter: 429 p99 <= 20 ms", b["p99_429_ms"] is not None and b["p99_429_ms"] <= 20,
     f"{b['p99_429_ms']} ms (p50 {b['p50_429_ms']} ms)"),
    ("with limiter: matching service at or under capacity", b["backend_rps"] <= cap,
     f"{b['backend_rps']} RPS, capacity {cap:.0f}"),
    ("without limiter: matching service saturated (>= 90 % of capacity)", a["backend_rps"] >= 0.9 * cap,
     f"{a['backend_rps']} RPS, capacity {cap:.0f}"),
]
skipped = 0
if overloaded:
    for i, (name, ok, figure) in enumerate(checks):
        if name.startswith("with limiter: 429 p99"):
            print(f"SKIP {name}: {figure}; load average {load_on} > 1.5 x {cores} cores during the run")
            del checks[i]
            skipped = 1
            break
for name, ok, figure in checks:
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {figure}")
print(f"machine load average during the runs: {off['params'].get('load_during_mean')} / "
      f"{on['params'].get('load_during_mean')}")
passed = sum(1 for _, ok, _ in checks if ok)
open(out + ".counts", "w").write(f"{passed} {len(checks) - passed} {skipped}\n")
sys.exit(0 if passed == len(checks) else 1)
PY
}

ARGS=("$@")
mkdir -p "$OUT/1" "$OUT/2"
attempt 1; rc=$?; n=1
if [ "$rc" != 0 ]; then
  echo "surge: attempt 1 failed; once more"
  attempt 2; rc=$?; n=2
fi
if [ -f "$OUT/$n.counts" ]; then read -r passed failed skipped <"$OUT/$n.counts"; else passed=0 failed=1 skipped=0; fi
echo "surge: $passed passed, $failed failed, $skipped skipped"
[ "$rc" = 0 ]
