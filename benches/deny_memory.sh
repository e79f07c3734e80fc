#!/usr/bin/env bash
# Memory of the deny cache in the whole daemon: bytes of RSS per DENY it holds.
#
#   bash benches/deny_memory.sh [KEYS] [MAX_ENTRIES]
#
# A standalone redis-server on a free loopback port and the daemon with one rule of
# capacity 1 that barely refills (`one`). The load generator (8 connections, pipeline
# depth 64) sends `CHECK one k<n>` for KEYS distinct keys (default 1000000): each takes
# the key's one token (ALLOW). Then the same KEYS keys again: each is denied by Redis
# and the DENY goes into the deny cache (cache.max_entries = MAX_ENTRIES, default KEYS;
# cache.ttl_ms = 10 min, so none expires meanwhile). The local buckets are capped at
# 1,000 keys so that they do not grow with the keys. Reported: VmRSS before and after the
# second pass, the deny cache's entry count (`ratelimitd_cache_entries`), and their
# ratio. Release build; everything started is stopped by pid.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

KEYS=${1:-1000000}
MAX=${2:-$KEYS}

for tool in redis-server redis-cli python3; do
    command -v "$tool" >/dev/null || { echo "deny_memory.sh: $tool not found" >&2; exit 1; }
done
# shellcheck source=benches/lib.sh
. benches/lib.sh
build_bench_binaries deny_memory.sh # DAEMON, LOADGEN

bench_work denymem # work (the temp dir), pids (stopped on exit)
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

port=$(free_port)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
    --logfile "$work/redis.log" &
pids+=($!)
for _ in $(seq 1 250); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.02; done
redis-cli -p "$port" ping >/dev/null 2>&1 ||
    { echo "deny_memory.sh: redis-server did not start:" >&2; cat "$work/redis.log" >&2; exit 1; }

mport=$(free_port)
cat >"$work/rl.toml" <<CONF
[server]
socket = "$work/rl.sock"
[redis]
mode = "standalone"
nodes = ["127.0.0.1:$port"]
timeout_ms = 1000
[cache]
ttl_ms = 600000
max_entries = $MAX
[fallback]
max_keys = 1000
hosts = 1
[metrics]
listen = "127.0.0.1:$mport"
[[rule]]
name = "one"
algorithm = "token_bucket"
capacity = 1
refill_rate = 0.0001
CONF
started=0
start_daemon_waiting "$work/rl.toml" "$work/rl.sock" "$work/daemon.log" && started=1
daemon=$daemon_pid
pids+=("$daemon")
[ "$started" = 1 ] || { echo "deny_memory.sh: the daemon did not start:" >&2; cat "$work/daemon.log" >&2; exit 1; }

pass() { # expected reply
    "$LOADGEN" --socket "$work/rl.sock" --conns 8 --depth 64 --threads 2 \
        --request 'CHECK one k{n}\n' --expect "$1" --warmup 0s --duration 3600s \
        --max-requests "$KEYS" --label "$1"
}
entries() {
    python3 - "$mport" <<'PY'
import sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics").read().decode()
print(next(l.split()[1] for l in body.splitlines() if l.startswith("ratelimitd_cache_entries")))
PY
}

pass ALLOW >"$work/pass1.json"
before=$(proc_status "$daemon" VmRSS)
pass DENY >"$work/pass2.json"
sleep 2 # the gauge is sampled every second
after=$(proc_status "$daemon" VmRSS)
held=$(entries)
[ "${held%.*}" -gt 0 ] || { echo "deny_memory.sh: the deny cache holds nothing (were the DENYs from Redis?)" >&2; exit 1; }
off=$(sed -n 's/.*"errors":\([0-9]*\).*/\1/p' "$work/pass2.json")
echo "| keys | cache.max_entries | DENYs held | replies not DENY (pass 2) | RSS before (MB) | RSS after (MB) | bytes per DENY held |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
echo "| $KEYS | $MAX | ${held%.*} | ${off:-?} | $((before / 1024)) | $((after / 1024)) | $(((after - before) * 1024 / ${held%.*})) |"
