#!/usr/bin/env bash
# Peak memory of the daemon with many distinct keys: redis.mode = "none",
# one CHECK per new key, measured from /proc/<pid>/status (VmHWM = peak RSS).
#
#   bash benches/memory.sh [KEYS] [MAX_KEYS...]
#
# KEYS (default 10000000) distinct keys are sent by the load generator (8 connections,
# pipeline depth 64), once for each fallback.max_keys given (default: the default,
# 1000000, then 10000000 = every key kept, the cost of an unbounded map). Release build.
# The daemon runs in a temporary directory and is stopped by pid.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

KEYS=${1:-10000000}
shift || true
[ $# -gt 0 ] || set -- 1000000 10000000

# shellcheck source=benches/lib.sh
. benches/lib.sh
build_bench_binaries memory.sh # DAEMON, LOADGEN

dir=$(mktemp -d "${TMPDIR:-/tmp}/rl-mem-XXXXXX")
pid=
cleanup() { [ -z "$pid" ] || kill "$pid" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT

echo "| fallback.max_keys | keys sent | req/s | RSS idle (MB) | peak RSS VmHWM (MB) | RSS after (MB) |"
echo "|---|---|---|---|---|---|"
for max in "$@"; do
    cat >"$dir/rl.toml" <<CONF
[server]
socket = "$dir/rl.sock"
[redis]
mode = "none"
[fallback]
max_keys = $max
[[rule]]
name = "api"
algorithm = "token_bucket"
capacity = 10
refill_rate = 1.0
CONF
    start_daemon_waiting "$dir/rl.toml" "$dir/rl.sock" "$dir/daemon.log" || true
    pid=$daemon_pid
    idle=$(proc_status "$pid" VmRSS)
    out=$("$LOADGEN" --socket "$dir/rl.sock" --conns 8 --depth 64 --threads 2 \
        --request 'CHECK api k{n}\n' --expect ALLOW --warmup 0s --duration 3600s \
        --max-requests "$KEYS" --label "max_keys=$max")
    hwm=$(proc_status "$pid" VmHWM)
    rss=$(proc_status "$pid" VmRSS)
    rps=$(sed -n 's/.*"rps":\([0-9.]*\).*/\1/p' <<<"$out" | cut -d. -f1)
    sent=$(sed -n 's/.*"requests":\([0-9]*\).*/\1/p' <<<"$out")
    echo "| $max | ${sent:-?} | ${rps:-?} | $((idle / 1024)) | $((hwm / 1024)) | $((rss / 1024)) |"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    pid=
done
