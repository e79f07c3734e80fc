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

if [ -z "${LOADGEN:-}" ] || [ -z "${RATELIMITD_BIN:-}" ]; then # else: measure those
    cargo build --release --quiet --bin ratelimitd
    LOADGEN=$(cargo bench --bench loadgen --no-run --message-format=json 2>/dev/null |
        grep '"reason":"compiler-artifact"' | grep '"name":"loadgen"' |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
fi
[ -x "$LOADGEN" ] || { echo "memory.sh: cannot find the built loadgen bench" >&2; exit 1; }
DAEMON=${RATELIMITD_BIN:-${CARGO_TARGET_DIR:-$PWD/target}/release/ratelimitd}

dir=$(mktemp -d "${TMPDIR:-/tmp}/rl-mem-XXXXXX")
pid=
cleanup() { [ -z "$pid" ] || kill "$pid" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT

status() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; } # pid field -> kB

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
    RUST_LOG=warn "$DAEMON" --config "$dir/rl.toml" </dev/null >"$dir/daemon.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 500); do [ -S "$dir/rl.sock" ] && break; sleep 0.02; done
    idle=$(status "$pid" VmRSS)
    out=$("$LOADGEN" --socket "$dir/rl.sock" --conns 8 --depth 64 --threads 2 \
        --request 'CHECK api k{n}\n' --expect ALLOW --warmup 0s --duration 3600s \
        --max-requests "$KEYS" --label "max_keys=$max")
    hwm=$(status "$pid" VmHWM)
    rss=$(status "$pid" VmRSS)
    rps=$(sed -n 's/.*"rps":\([0-9.]*\).*/\1/p' <<<"$out" | cut -d. -f1)
    sent=$(sed -n 's/.*"requests":\([0-9]*\).*/\1/p' <<<"$out")
    echo "| $max | ${sent:-?} | ${rps:-?} | $((idle / 1024)) | $((hwm / 1024)) | $((rss / 1024)) |"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    pid=
done
