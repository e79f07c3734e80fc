#!/usr/bin/env bash
# The Envoy Rate Limit Service (gRPC) beside the line protocol, in one run: the same
# daemon, the same Redis, the same limit (a fixed window deciding every call in Redis),
# the same key population (10^6 users, uniform), 50 calls in flight each way.
#
#   bash benches/rls.sh [--quick]
#
#   a  Redis PING over its Unix socket, loadgen 50 x 1          (the machine's baseline)
#   L  line protocol: CHECK api k<n>, 50 connections x 1        (one EVALSHA each)
#   R  RLS: ShouldRateLimit [(generic_key, api), (user_id, n)], 2 HTTP/2 connections x 25
#      in flight (as Envoy multiplexes), rls_loadgen            (one EVALSHA each)
#   Ll / Rl  the same two against a daemon with redis.mode = "none" (local decisions:
#      the front ends' own cost)
# Prints a markdown table and the ratios R / L and Rl / Ll (decisions/s).
# Needs redis-server; builds the release daemon and both load generators. Everything it
# starts runs in a temporary directory and is stopped by pid on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-5s}; WARMUP=${WARMUP:-1s}
[ "${1:-}" = --quick ] && { DURATION=2s; WARMUP=500ms; }
export RUST_LOG=${RUST_LOG:-warn}
TARGET=${CARGO_TARGET_DIR:-target}
cargo build --release --quiet --bin ratelimitd
cargo build --release --quiet -p ratelimitd-tools --bin loadgen --bin rls_loadgen
BIN=${RATELIMITD_BIN:-$TARGET/release/ratelimitd}
LOADGEN=$TARGET/release/loadgen
RLSGEN=$TARGET/release/rls_loadgen
TMP=$(mktemp -d /tmp/rld-rls-bench.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
[ -n "${KEEP_LOGS:-}" ] && trap 'cat "$TMP"/*.log >&2; cleanup' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_sock() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no socket $1" >&2; exit 1; }

RPORT=$(free_port)
redis-server --port "$RPORT" --bind 127.0.0.1 --unixsocket "$TMP/redis.sock" --save '' --appendonly no --dir "$TMP" >"$TMP/redis.log" 2>&1 &
pids+=($!)
wait_sock "$TMP/redis.sock"
mkdir "$TMP/envoy"
cat >"$TMP/envoy/bench.yaml" <<YAML
domain: bench
descriptors:
  - key: generic_key
    value: api
    descriptors:
      - key: user_id
        rate_limit: {unit: minute, requests_per_unit: 1000000000}
YAML
RULE='[[rule]]
name = "api"
algorithm = "fixed_window"
limit = 1000000000
window = "1m"'
start_daemon() { # start_daemon NAME REDIS_TABLE -> sets SOCK, GRPC
  SOCK="$TMP/rl-$1.sock"; GRPC=$(free_port)
  printf '[server]\nsocket = "%s"\n%s\n[envoy]\nlisten = "127.0.0.1:%s"\nconfig_dir = "%s/envoy"\n\n%s\n' \
    "$SOCK" "$2" "$GRPC" "$TMP" "$RULE" >"$TMP/$1.toml"
  "$BIN" --config "$TMP/$1.toml" >"$TMP/$1.log" 2>&1 &
  pids+=($!)
  wait_sock "$SOCK"
  for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$GRPC") 2>/dev/null && return 0; sleep 0.05; done
  echo "the RLS did not listen on $GRPC" >&2; exit 1
}
json() { grep '^{' | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print(d["rps"], d["p50_us"], d["p99_us"])'; }
line() { "$LOADGEN" --socket "$1" --conns 50 --depth 1 --duration "$DURATION" --warmup "$WARMUP" "${@:2}"; }
rls() { "$RLSGEN" --addr "127.0.0.1:$1" --conns 2 --concurrency 25 --keys 1000000 --duration "$DURATION" --warmup "$WARMUP"; }

declare -A R
R[a]=$(line "$TMP/redis.sock" --request 'PING\r\n' --expect +PONG | json)
start_daemon redis "[redis]
mode = \"standalone\"
nodes = [\"127.0.0.1:$RPORT\"]"
R[L]=$(line "$SOCK" --request 'CHECK api k{n}\n' --keys 1000000 --expect ALLOW --expect-contains ' redis' | json)
R[R]=$(rls "$GRPC" | json)
start_daemon local '[redis]
mode = "none"'
R[Ll]=$(line "$SOCK" --request 'CHECK api k{n}\n' --keys 1000000 --expect ALLOW | json)
R[Rl]=$(rls "$GRPC" | json)

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores; $DURATION per measurement"
echo
echo "| scenario | decisions/s | p50 µs | p99 µs |"
echo "|---|---|---|---|"
for k in a L R Ll Rl; do
  read -r rps p50 p99 <<<"${R[$k]}"
  case $k in
    a) name="a: Redis PING, Unix socket, 50 x 1 (baseline)" ;;
    L) name="L: line protocol CHECK, Redis (EVALSHA each), 50 conns x 1" ;;
    R) name="R: RLS ShouldRateLimit, Redis (EVALSHA each), 2 conns x 25" ;;
    Ll) name="Ll: line protocol CHECK, local (mode none), 50 x 1" ;;
    Rl) name="Rl: RLS ShouldRateLimit, local (mode none), 2 x 25" ;;
  esac
  printf '| %s | %.0f | %s | %s |\n' "$name" "$rps" "$p50" "$p99"
done
ratio() { python3 -c "print(f'{float(\"$1\".split()[0]) / float(\"$2\".split()[0]):.2f}')"; }
echo
echo "R / L = $(ratio "${R[R]}" "${R[L]}") (target >= 0.5); Rl / Ll = $(ratio "${R[Rl]}" "${R[Ll]}"); L / a = $(ratio "${R[L]}" "${R[a]}")"
