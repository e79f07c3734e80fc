#!/usr/bin/env bash
# One surge run: starts Redis, ratelimitd and the ride-hailing API, drives them with
# locust headless, stops everything it started, and writes DIR/results.json,
# DIR/report.md and DIR/latency.png (raw records under DIR/raw/).
#
#   examples/surge/run.sh [--users N] [--seconds S] [--mode off|on|redis-killed] [--out DIR]
#                         [--spawn-rate R] [--wait MIN MAX] [--rider-refill T/S]
#                         [--guard-rps R] [--guard-burst B] [--processes P]
#                         [--workers W] [--service-ms MS] [--queue-max Q] [--queue-timeout-ms MS]
#
# off: no limiter (the API calls the matching service for every request).
# on: ratelimitd with a standalone Redis decides every request (limiter.py says how).
# redis-killed: as on, but Redis is killed a third into the run and restarted at two
#   thirds; the daemon decides from local buckets meanwhile (on_redis_failure = local).
# Needs python3 (3.9+) and redis-server (redis-cli too); venv.sh makes the venv (locust,
# uvicorn, matplotlib) once. The daemon is $RATELIMITD_BIN, else
# target/release/ratelimitd (built with cargo if absent).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
USERS=200 SECONDS_=30 MODE=on OUT="" SPAWN="" WAIT_MIN=0.1 WAIT_MAX=0.3
RIDER_REFILL=0.2 GUARD_RPS=60 GUARD_BURST=8 PROCESSES=1
WORKERS=4 SERVICE_MS=50 QUEUE_MAX=1000 QUEUE_TIMEOUT_MS=2000
while [ $# -gt 0 ]; do
  case "$1" in
    --users) USERS="$2"; shift 2 ;;
    --seconds) SECONDS_="$2"; shift 2 ;;
    --mode) MODE="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --spawn-rate) SPAWN="$2"; shift 2 ;;
    --wait) WAIT_MIN="$2"; WAIT_MAX="$3"; shift 3 ;;
    --rider-refill) RIDER_REFILL="$2"; shift 2 ;;
    --guard-rps) GUARD_RPS="$2"; shift 2 ;;
    --guard-burst) GUARD_BURST="$2"; shift 2 ;;
    --processes) PROCESSES="$2"; shift 2 ;;
    --workers) WORKERS="$2"; shift 2 ;;
    --service-ms) SERVICE_MS="$2"; shift 2 ;;
    --queue-max) QUEUE_MAX="$2"; shift 2 ;;
    --queue-timeout-ms) QUEUE_TIMEOUT_MS="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$MODE" in off|on|redis-killed) ;; *) echo "run.sh: --mode off|on|redis-killed" >&2; exit 2 ;; esac
# Riders arrive within the first 5 s: a surge. (All in one second measures mostly
# locust itself starting greenlets and connections.)
SPAWN="${SPAWN:-$(awk "BEGIN{r=$USERS/5; print (r<1)?1:r}")}"
OUT="${OUT:-$HERE/results/latest-$MODE}"
mkdir -p "$OUT/raw"; OUT="$(cd "$OUT" && pwd)"; rm -f "$OUT"/raw/*

# --- tools ---------------------------------------------------------------------------
VENV="$("$HERE/venv.sh")"
if [ "$MODE" != off ]; then
  BIN="${RATELIMITD_BIN:-$ROOT/target/release/ratelimitd}"
  if [ ! -x "$BIN" ] && [ -z "${RATELIMITD_BIN:-}" ]; then
    echo "surge: building ratelimitd (cargo build --release)" >&2
    (cd "$ROOT" && cargo build --release --quiet --bin ratelimitd)
  fi
  command -v redis-server >/dev/null || { echo "run.sh: redis-server not found (apt-get install redis-server)" >&2; exit 1; }
fi

# SURGE_NICE=-5 (root only) runs everything below at that priority, so that other work
# on a shared machine (compilers) does not decide the latencies measured; 0 = as is.
NICE=(); [ "${SURGE_NICE:-0}" != 0 ] && NICE=(nice -n "$SURGE_NICE")

# --- processes we start, stopped on any exit -------------------------------------------
WORK="$(mktemp -d /tmp/surge.XXXXXX)"
PIDS=()
cleanup() {
  set +e
  [ -f "$WORK/redis.pid2" ] && PIDS+=("$(cat "$WORK/redis.pid2")")
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { "$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cpu_ticks() { [ -r "/proc/$1/stat" ] && sed 's/.*) //' "/proc/$1/stat" | awk '{print $12+$13}' || echo -1; }
http_get() { "$VENV/bin/python" -c 'import sys, urllib.request as u; sys.stdout.write(u.urlopen(sys.argv[1], timeout=5).read().decode())' "$1"; }
wait_for() { # wait_for <what> <command...>: up to 10 s
  local what="$1"; shift
  for _ in $(seq 100); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "run.sh: $what did not come up" >&2; return 1
}

REDIS_PORT="" SOCK="" LIMITER=""
start_redis() {
  ${NICE[@]+"${NICE[@]}"} redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize no --loglevel warning >>"$OUT/raw/redis.log" 2>&1 &
  echo $!
}
if [ "$MODE" != off ]; then
  REDIS_PORT="$(free_port)"
  REDIS_PID="$(start_redis)"; PIDS+=("$REDIS_PID")
  wait_for redis redis-cli -p "$REDIS_PORT" ping
  SOCK="$WORK/rld.sock"
  cat >"$WORK/ratelimitd.toml" <<EOF
[server]
socket = "$SOCK"
socket_mode = "0600"

[redis]
mode = "standalone"
nodes = ["127.0.0.1:$REDIS_PORT"]
timeout_ms = 25
prefix = "surge"

[fallback]
hosts = 1

# A rider's own bucket: 20 in a burst, then one request per 1/$RIDER_REFILL s.
[[rule]]
name = "surge_rider"
algorithm = "token_bucket"
capacity = 20
refill_rate = $RIDER_REFILL
on_redis_failure = "local"
EOF
  [ "$GUARD_RPS" = 0 ] || cat >>"$WORK/ratelimitd.toml" <<EOF

# The matching service's guard: one key, refilled below the pool's capacity.
[[rule]]
name = "surge_matching"
algorithm = "token_bucket"
capacity = $GUARD_BURST
refill_rate = $GUARD_RPS
on_redis_failure = "local"
EOF
  cp "$WORK/ratelimitd.toml" "$OUT/raw/ratelimitd.toml"
  ${NICE[@]+"${NICE[@]}"} "$BIN" --config "$WORK/ratelimitd.toml" >>"$OUT/raw/ratelimitd.log" 2>&1 &
  DAEMON_PID=$!; PIDS+=("$DAEMON_PID")
  wait_for ratelimitd test -S "$SOCK"
  LIMITER="per rider: token bucket capacity 20, refill $RIDER_REFILL/s; matching guard: token bucket capacity $GUARD_BURST, refill $GUARD_RPS/s"
  [ "$GUARD_RPS" = 0 ] && LIMITER="per rider: token bucket capacity 20, refill $RIDER_REFILL/s; no guard"
fi

API_PORT="$(free_port)"
GUARD_RULE=surge_matching; [ "$GUARD_RPS" = 0 ] && GUARD_RULE=""
(cd "$HERE" && SURGE_RL_SOCKET="$SOCK" SURGE_GUARD_RULE="$GUARD_RULE" \
  SURGE_WORKERS="$WORKERS" SURGE_SERVICE_MS="$SERVICE_MS" SURGE_QUEUE_MAX="$QUEUE_MAX" \
  SURGE_QUEUE_TIMEOUT_MS="$QUEUE_TIMEOUT_MS" exec ${NICE[@]+"${NICE[@]}"} "$VENV/bin/uvicorn" app:app \
  --host 127.0.0.1 --port "$API_PORT" --loop uvloop --http httptools --no-access-log \
  --log-level warning --backlog 4096 --timeout-keep-alive 30) >>"$OUT/raw/api.log" 2>&1 &
API_PID=$!; PIDS+=("$API_PID")
wait_for API http_get "http://127.0.0.1:$API_PORT/healthz"

# --- the run ---------------------------------------------------------------------------
if [ "$MODE" = redis-killed ]; then
  ( while [ ! -f "$OUT/raw/started" ]; do sleep 0.05; done
    sleep "$(awk "BEGIN{print $SECONDS_/3}")"
    kill -9 "$REDIS_PID"; date +%s.%N >"$OUT/raw/redis_killed"
    sleep "$(awk "BEGIN{print $SECONDS_/3}")"
    start_redis >"$WORK/redis.pid2"; date +%s.%N >"$OUT/raw/redis_restarted"
  ) &
  PIDS+=("$!")
fi
( while :; do cut -d' ' -f1 /proc/loadavg >>"$OUT/raw/load"; sleep 5; done ) &
PIDS+=("$!")
LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
T_API0="$(cpu_ticks "$API_PID")" T_D0="$(cpu_ticks "${DAEMON_PID:-0}")" T_R0="$(cpu_ticks "${REDIS_PID:-0}")"
echo "surge: $MODE, $USERS riders, ${SECONDS_} s -> $OUT" >&2
(cd "$HERE" && SURGE_LOG_DIR="$OUT/raw" SURGE_WAIT_MIN="$WAIT_MIN" SURGE_WAIT_MAX="$WAIT_MAX" \
  ${NICE[@]+"${NICE[@]}"} "$VENV/bin/locust" -f locustfile.py --headless --only-summary -u "$USERS" -r "$SPAWN" \
  -t "${SECONDS_}s" --stop-timeout 0 --host "http://127.0.0.1:$API_PORT" \
  $([ "$PROCESSES" -gt 1 ] && echo --processes "$PROCESSES") >"$OUT/raw/locust.log" 2>&1 || true
  times >"$OUT/raw/locust_times")
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"
T_API1="$(cpu_ticks "$API_PID")" T_D1="$(cpu_ticks "${DAEMON_PID:-0}")" T_R1="$(cpu_ticks "${REDIS_PID:-0}")"
http_get "http://127.0.0.1:$API_PORT/_stats" >"$OUT/raw/app_stats.json"
[ -f "$OUT/raw/started" ] || { echo "run.sh: locust did not start; see $OUT/raw/locust.log" >&2; exit 1; }

# --- results ---------------------------------------------------------------------------
"$VENV/bin/python" - "$OUT" <<EOF
import json, os, re, sys
out = sys.argv[1]; raw = os.path.join(out, "raw")
def t(name):
    p = os.path.join(raw, name)
    return float(open(p).read()) if os.path.exists(p) else None
t0, t1 = t("started"), t("stopped")
tick = os.sysconf("SC_CLK_TCK"); wall = t1 - t0
def share(a, b):  # -1: not running at one end (off mode; Redis restarted mid-run)
    return "n/a" if a < 0 or b < 0 else f"{100.0 * (b - a) / tick / wall:.0f} %"
load = [float(x) for x in open(os.path.join(raw, "load")).read().split()]
times = open(os.path.join(raw, "locust_times")).read().split("\n")[1].split()
cpu = sum(float(m) * 60 + float(s) for m, s in (re.match(r"(\d+)m([\d.]+)s", x).groups() for x in times))
meta = {
    "mode": "$MODE", "users": $USERS, "seconds": $SECONDS_, "spawn_rate": float("$SPAWN"),
    "wait_min": $WAIT_MIN, "wait_max": $WAIT_MAX, "locust_processes": $PROCESSES,
    "limiter": "$LIMITER" or None,
    "t_start": t0, "t_end": t1,
    "cpu_locust": f"{100.0 * cpu / wall:.0f} %", "cpu_api": share($T_API0, $T_API1),
    "cpu_daemon": share($T_D0, $T_D1), "cpu_redis": share($T_R0, $T_R1),
    "load_before": "$LOAD_BEFORE", "load_after": "$LOAD_AFTER", "cores": os.cpu_count(),
    "load_during_mean": round(sum(load) / len(load), 2) if load else None,
    "load_during_max": max(load) if load else None, "nice": int("${SURGE_NICE:-0}"),
    "redis_killed_at": round(t("redis_killed") - t0, 1) if t("redis_killed") else None,
    "redis_restarted_at": round(t("redis_restarted") - t0, 1) if t("redis_restarted") else None,
}
json.dump(meta, open(os.path.join(raw, "meta.json"), "w"), indent=2)
EOF
(cd "$HERE" && "$VENV/bin/python" report.py run "$OUT" && "$VENV/bin/python" plot.py "$OUT/latency.png" "$OUT")
if grep -q "CPU usage above" "$OUT/raw/locust.log"; then
  echo "surge: warning: locust reported CPU above 90 % (see raw/locust.log)" >&2
fi
sed -n '3,10p' "$OUT/report.md" >&2
