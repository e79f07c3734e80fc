#!/usr/bin/env bash
# Token leases (lease = "auto") on one hot key, against the ceiling without them and
# against what users pick instead, all in one run on one 3-primary Redis Cluster:
#   a  one Redis shard running the daemons' script for that key with redis-benchmark
#      EVALSHA (the lease script's per-request call, and the plain token bucket script):
#      the most any per-request design gets out of one hot key;
#   b  3 daemons, one hot key of a token_bucket rule with lease = "auto", one loadgen
#      per daemon; Redis script calls per decision from INFO commandstats;
#   c  the same rule with lease = "off" (every decision one script call);
#   d  cold keys (100,000 keys, one request in flight per connection): latency with
#      lease = "auto" and "off", alternated;
#   e  rate-limiter-flexible (npm; RateLimiterRedis on ioredis' Cluster client) and
#      Python's limits (PyPI; async Redis Cluster storage, FixedWindowRateLimiter)
#      driving the same hot key from 3 processes each; Redis commands per decision.
#
#   bash benches/leases.sh [--quick]
#
# Environment: RATELIMITD_BIN (default target/release/ratelimitd), LOADGEN (the built
# loadgen of tools/; default: built with cargo), DURATION seconds per measurement (default
# 8; --quick 4), RL_BENCH_CACHE (where the peers are installed, as benches/clients/run.sh
# does; default ~/.cache/ratelimitd-bench; a peer that cannot be installed is skipped
# with the reason). Needs redis-server, redis-cli, redis-benchmark, python3; node + npm
# for rate-limiter-flexible. Starts the cluster and the daemons in a temp dir, on free
# loopback ports, and stops them by pid on exit.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
[ "${1:-}" = --quick ] && : "${DURATION:=4}"
DURATION=${DURATION:-8}
bin=${RATELIMITD_BIN:-$repo/target/release/ratelimitd}
[ -x "$bin" ] || { echo "leases.sh: no daemon at $bin (cargo build --release, or set RATELIMITD_BIN)" >&2; exit 1; }
if [ -z "${LOADGEN:-}" ]; then
  LOADGEN=$(cd "$repo" && cargo build --release -p ratelimitd-tools --bin loadgen --message-format=json 2>/dev/null |
    grep '"reason":"compiler-artifact"' | grep '"name":"loadgen"' |
    sed 's/.*"executable":"\([^"]*\)".*/\1/' | tail -n 1)
fi
[ -x "$LOADGEN" ] || { echo "leases.sh: cannot find the built loadgen" >&2; exit 1; }
cache=${RL_BENCH_CACHE:-${HOME:-/tmp}/.cache/ratelimitd-bench}
# shellcheck source=benches/lib.sh
. "$here/lib.sh"
bench_work leases
start_cluster

# --- three daemons -----------------------------------------------------------------
rules='
[[rule]]
name = "hot_lease"
algorithm = "token_bucket"
capacity = 1000000000
refill_rate = 1000000000.0
lease = "auto"

[[rule]]
name = "hot_plain"
algorithm = "token_bucket"
capacity = 1000000000
refill_rate = 1000000000.0
'
for i in 1 2 3; do
  cat >"$work/rl$i.toml" <<CONF
[server]
socket = "$work/rl$i.sock"
socket_mode = "0600"

[redis]
mode = "cluster"
nodes = [$toml_nodes]
timeout_ms = 100
prefix = "rl"

[fallback]
hosts = "auto"
$rules
CONF
  RUST_LOG=${RUST_LOG:-warn} "$bin" --config "$work/rl$i.toml" >>"$work/daemon$i.log" 2>&1 &
  pids+=($!)
done
for i in 1 2 3; do
  wait_daemon "$work/rl$i.sock" || true # one that did not start shows in the measurements
done
sleep 2.5 # the heartbeats count the three daemons

# Redis counters, summed over the primaries.
stat() { # stat evalsha|total
  local p sum=0 v
  for p in "${ports[@]}"; do
    if [ "$1" = evalsha ]; then
      v=$(redis-cli -p "$p" info commandstats | tr -d '\r' | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*/\1/p')
    else
      v=$(redis-cli -p "$p" info stats | tr -d '\r' | sed -n 's/^total_commands_processed:\([0-9]*\)/\1/p')
    fi
    sum=$((sum + ${v:-0}))
  done
  echo "$sum"
}
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }

echo "redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/') cluster ${nodes[*]}; daemon $bin; $DURATION s per measurement"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

# --- a: one shard, redis-benchmark EVALSHA of the same scripts ----------------------
key='rl:{hot_lease:hot}:tb'
owner=
for p in "${ports[@]}"; do
  redis-cli -p "$p" exists "$key" 2>&1 | grep -q MOVED || owner=$p
done
lease_sha=$(redis-cli -p "$owner" script load "$(cat "$repo/lua/prelude.lua" "$repo/lua/lease.lua" "$repo/lua/lease_token_bucket.lua")")
plain_sha=$(redis-cli -p "$owner" script load "$(cat "$repo/lua/prelude.lua" "$repo/lua/token_bucket.lua")")
bench_rps() { # bench_rps <redis-benchmark args...>: requests/s
  redis-benchmark -p "$owner" -c 50 -P 16 -n $((DURATION * 60000)) -q "$@" 2>/dev/null | tr '\r' '\n' |
    sed -n 's/.*: \([0-9.]*\) requests per second.*/\1/p' | tail -n 1
}
shard_lease=$(bench_rps evalsha "$lease_sha" 1 "$key" 1000000000000000 1000000000 1000000 '' bench 0 0 0 1000000 0)
shard_plain=$(bench_rps evalsha "$plain_sha" 1 'rl:{hot_plain:hot}:tb' 1000000000000000 1000000000 1000000)
redis-cli -p "$owner" del "$key" 'rl:{hot_plain:hot}:tb' >/dev/null
echo "a: one shard, redis-benchmark -c 50 -P 16 EVALSHA: lease script $shard_lease/s, plain token bucket $shard_plain/s"

# --- b, c: one hot key over the three daemons ---------------------------------------
three() { # three <rule> <label>: loadgen on each daemon at once; prints "rps calls/decision p50 p99"
  local i out=() evalsha0 evalsha1
  for p in "${ports[@]}"; do redis-cli -p "$p" config resetstat >/dev/null; done
  evalsha0=$(stat evalsha)
  for i in 1 2 3; do
    "$LOADGEN" --socket "$work/rl$i.sock" --conns 16 --depth 16 --warmup 1s --duration "${DURATION}s" \
      --request "CHECK $1 hot\n" --expect ALLOW --label "$2 d$i" | grep '^{' >"$work/$1.$i.json" &
    out+=($!)
  done
  for i in "${out[@]}"; do wait "$i"; done
  evalsha1=$(stat evalsha)
  python3 - "$work/$1" "$((evalsha1 - evalsha0))" <<'PY'
import json, sys
rows = [json.loads(open(f"{sys.argv[1]}.{i}.json").read()) for i in (1, 2, 3)]
rps = sum(r["rps"] for r in rows)
decisions = sum(r["requests"] for r in rows)
errors = sum(r["errors"] + r["io_errors"] for r in rows)
calls = int(sys.argv[2])
print(f"{rps:.0f} {calls / max(decisions, 1):.4f} {max(r['p50_us'] for r in rows)} {max(r['p99_us'] for r in rows)} {errors}")
PY
}
read -r lease_rps lease_cpd lease_p50 lease_p99 lease_err < <(three hot_lease "hot, lease")
echo "b: 3 daemons, one hot key, lease = auto: $lease_rps decisions/s, $lease_cpd script calls per decision (batch p50 $lease_p50 µs, p99 $lease_p99 µs, errors $lease_err)"
read -r plain_rps plain_cpd plain_p50 plain_p99 plain_err < <(three hot_plain "hot, plain")
echo "c: 3 daemons, one hot key, lease = off: $plain_rps decisions/s, $plain_cpd script calls per decision (batch p50 $plain_p50 µs, p99 $plain_p99 µs, errors $plain_err)"

# --- d: cold keys keep their latency --------------------------------------------------
cold() { # cold <rule>: p50 p99 µs, 100,000 keys, 8 connections × 1 request in flight
  "$LOADGEN" --socket "$work/rl1.sock" --conns 8 --depth 1 --warmup 1s --duration "${DURATION}s" \
    --keys 100000 --request "CHECK $1 k{n}\n" --expect ALLOW --label "cold $1" | grep '^{' |
    python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print(r["p50_us"], r["p99_us"], round(r["rps"]))'
}
cold_rows=()
for round in 1 2; do
  for rule in hot_lease hot_plain; do
    read -r p50 p99 rps < <(cold "$rule")
    cold_rows+=("$rule $round $p50 $p99 $rps")
    echo "d: cold keys, $rule (round $round): p50 $p50 µs, p99 $p99 µs, $rps/s"
  done
done

# --- e: what users pick instead, on the same hot key from 3 processes ---------------
peer() { # peer <label> <command...>: 3 processes at once; prints "rps commands/decision errors"
  local label=$1 i out=() c0 c1
  shift
  c0=$(stat total)
  for i in 1 2 3; do
    "$@" >"$work/peer.$i.json" 2>"$work/peer.$i.err" &
    out+=($!)
  done
  for i in "${out[@]}"; do wait "$i" || { echo "skipped: $label failed: $(tail -n 2 "$work"/peer.*.err | tr '\n' ' ')"; return 0; }; done
  c1=$(stat total)
  python3 - "$work/peer" "$((c1 - c0))" "$label" <<'PY'
import json, sys
rows = [json.loads(open(f"{sys.argv[1]}.{i}.json").read().strip().splitlines()[-1]) for i in (1, 2, 3)]
rps = sum(r["n"] / r["secs"] for r in rows)
n = sum(r["n"] for r in rows)
print(f"{sys.argv[3]}: {rps:.0f} decisions/s, {int(sys.argv[2]) / max(n, 1):.2f} Redis commands per decision (warm-up included), errors {sum(r['errors'] for r in rows)}")
PY
}
node_ok=0
if command -v node >/dev/null && command -v npm >/dev/null; then
  if install_node_peers "$cache/node" >"$work/npm.log" 2>&1; then
    node_ok=1
  else
    echo "e: skipped rate-limiter-flexible: npm install failed ($(tail -n 1 "$work/npm.log"))"
  fi
else
  echo "e: skipped rate-limiter-flexible: no node/npm"
fi
if [ "$node_ok" = 1 ]; then
  cp "$here/clients/peer_hot.js" "$here/clients/closed_loop.js" "$cache/node/"
  echo "e: $(cd "$cache/node" && peer "rate-limiter-flexible $(node -p "require('./node_modules/rate-limiter-flexible/package.json').version") (3 processes × 64 in flight)" node peer_hot.js "$node_list" "$DURATION")"
fi
if [ ! -x "$cache/venv/bin/python" ] || ! "$cache/venv/bin/python" -c 'import limits, coredis' 2>/dev/null; then
  { python3 -m venv "$cache/venv" && "$cache/venv/bin/pip" install --quiet --disable-pip-version-check "limits[async-redis]" redis; } >"$work/pip.log" 2>&1 ||
    echo "e: skipped limits: pip install failed ($(tail -n 1 "$work/pip.log"))"
fi
if "$cache/venv/bin/python" -c 'import limits, coredis' 2>/dev/null; then
  echo "e: $(peer "limits $("$cache/venv/bin/python" -c 'import limits; print(limits.__version__)') coredis (3 processes × 64 in flight)" "$cache/venv/bin/python" "$here/clients/peer_hot.py" "$node_list" "$DURATION")"
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$shard_lease" "$shard_plain" "$lease_rps" "$lease_cpd" "$plain_rps" "$plain_cpd" <<'PY'
import sys
sl, sp, lr, lc, pr, pc = (float(x) for x in sys.argv[1:])
print()
print("| one hot key | decisions/s | ÷ one shard, lease script EVALSHA | script calls per decision |")
print("|---|---:|---:|---:|")
print(f"| one shard, redis-benchmark EVALSHA, lease script | {sl:,.0f} | 1.00× | 1 |")
print(f"| one shard, redis-benchmark EVALSHA, plain script | {sp:,.0f} | {sp / sl:.2f}× | 1 |")
print(f"| 3 daemons, lease = \"auto\" | {lr:,.0f} | **{lr / sl:.2f}×** | {lc:.4f} |")
print(f"| 3 daemons, lease = \"off\" | {pr:,.0f} | {pr / sl:.2f}× | {pc:.4f} |")
PY
