#!/usr/bin/env bash
# Redis Cluster: the daemon's Redis-bound decisions against redis-benchmark running the
# seeds' token bucket on every primary at once, measured in one run on one 3-primary
# cluster (no replicas) on this machine.
#
#   bash benches/cluster.sh [--quick]
#
# For each shape (50 connections x depth 16, then 50 x 1):
#   c  the daemon, mode = "cluster": CHECK api k<n>, n uniform over 10^6 keys, each
#      decided in Redis (the rule and the daemon's settings are benches/run.sh's)
#   s  redis-benchmark EVALSHA of benches/seed_token_bucket.lua on each primary at once
#      (17 connections x the same depth each: 51 in all), keys rl:{<tag>}:<rand 10^6> of
#      one slot of that primary; its rps summed over the three
# and prints c / s. --quick: 2 s per measurement instead of 5 s. Environment as
# benches/run.sh (DURATION, WARMUP, RATELIMITD_BIN with LOADGEN: measure those builds).
# Everything it starts runs in a temp dir and is stopped by pid on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh

DURATION=${DURATION:-5s}
WARMUP=${WARMUP:-1s}
[ "${1:-}" = --quick ] && DURATION=2s && WARMUP=500ms
secs() { awk -v d="$1" 'BEGIN { if (d ~ /ms$/) { sub(/ms$/, "", d); d /= 1000 } else sub(/s$/, "", d); print d + 0 }'; }
for tool in redis-server redis-cli redis-benchmark cargo socat python3; do
  command -v "$tool" >/dev/null || { echo "cluster.sh: $tool not found" >&2; exit 1; }
done
build_bench_binaries cluster.sh
bench_work cluster
start_cluster
# The rule of cluster_bench_config (lib.sh): capacity 100 (10^8 µ-tokens) at 50/s, cost 1.
LUA_ARGV="100000000 50 1000000"

sock=$work/rl.sock
cluster_bench_config "$work/ratelimitd.toml" "$sock"
start_daemon_waiting "$work/ratelimitd.toml" "$sock" "$work/daemon.log" || { cat "$work/daemon.log" >&2; exit 1; }
pids+=("$daemon_pid")
wait_daemon "$sock" "$daemon_pid"
# Every primary decides in Redis before measuring.
for _ in $(seq 1 100); do
  out=$(printf 'CHECK api w1\nCHECK api w2\nCHECK api w3\nCHECK api w4\nCHECK api w5\nCHECK api w6\n' | socat -t 2 - "UNIX-CONNECT:$sock")
  [ "$(grep -c ' redis' <<<"$out")" = 6 ] && break
  sleep 0.1
done

# Per primary: its port, the seeds' script loaded there, and a hash tag of one of its slots.
load_seed_per_primary

results=()
for shape in "50 16" "50 1"; do
  read -r c d <<<"$shape"
  load_before=$(cut -d' ' -f1 /proc/loadavg)
  out=$("$LOADGEN" --socket "$sock" --conns "$c" --depth "$d" --duration "$DURATION" --warmup "$WARMUP" \
    --threads 1 --label "c c$c d$d" --request 'CHECK api k{n}\n' --keys 1000000 --expect ALLOW --expect-contains ' redis')
  daemon_rps=$(grep '^{' <<<"$out" | tail -n 1 | sed -n 's/.*"rps":\([0-9.]*\).*/\1/p')
  errors=$(grep '^{' <<<"$out" | tail -n 1 | sed -n 's/.*"errors":\([0-9]*\).*/\1/p')
  first_bad=$(grep '^{' <<<"$out" | tail -n 1 | sed -n 's/.*"first_bad":"\([^"]*\)".*/\1/p')
  # As many requests per primary as a third of the daemon's in the same time, so the
  # three run about as long as the loadgen did.
  n=$(awk -v r="$daemon_rps" -v s="$(secs "$DURATION")" 'BEGIN { n = int(r * s / 3); print (n < 20000 ? 20000 : n) }')
  rb=()
  for i in 0 1 2; do
    # shellcheck disable=SC2086 # LUA_ARGV is three words
    redis-benchmark -p "${ports[$i]}" -c 17 -P "$d" -n "$n" -r 1000000 --csv \
      EVALSHA "${shas[$i]}" 1 "rl:{${tags[$i]}}:__rand_int__" $LUA_ARGV >"$work/rb$i.csv" 2>&1 &
    rb+=($!)
  done
  for p in "${rb[@]}"; do wait "$p"; done
  seeds_rps=0
  for i in 0 1 2; do
    r=$(tr -d '\r"' <"$work/rb$i.csv" | grep -v '^test' | grep -i evalsha | tail -n 1 | cut -d, -f2)
    seeds_rps=$(awk -v a="$seeds_rps" -v b="${r:-0}" 'BEGIN { print a + b }')
  done
  ratio=$(awk -v a="$daemon_rps" -v b="$seeds_rps" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
  results+=("| $c × $d | $daemon_rps | $seeds_rps | **$ratio** | $errors ${first_bad:+(e.g. $first_bad)} | $load_before |")
done
echo
echo "redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'), 3 primaries; daemon $DAEMON; $DURATION per measurement"
echo "| shape | daemon, decisions/s (c) | redis-benchmark seeds' EVALSHA, 3 primaries at once (s) | c ÷ s | off-path replies | load before |"
echo "|---|---:|---:|---:|---:|---:|"
printf '%s\n' "${results[@]}"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
