#!/usr/bin/env bash
# Where the CPU of a Redis-bound decision goes on a 3-primary Redis Cluster, and the
# ratio it allows against benches/cluster.sh's baseline. Wall-clock rates swing with
# the load on a shared machine; CPU time per decision (task-clock of each process,
# `perf stat`) much less so.
#
#   bash benches/cpu_budget.sh [DEPTH]      # default 16 (50 connections x DEPTH)
#
# Two runs on one cluster (no replicas), each 4 s:
#   c  the daemon (mode = "cluster", benches/cluster.sh's rule and settings) deciding
#      CHECK api k<n>, n uniform over 10^6 keys, driven by the load generator: CPU µs
#      per decision of the daemon, of the three redis-servers and of the load generator
#   s  redis-benchmark EVALSHA of benches/seed_token_bucket.lua on each primary at once
#      (17 connections x DEPTH each): CPU µs per call of the redis-servers and of the
#      three redis-benchmarks
# When every process is runnable and the cores are the limit, decisions/s is at most
# cores / (CPU per decision), so c ÷ s is at most (s's CPU per call) ÷ (c's CPU per
# decision): printed as "bound". Needs perf (linux-perf) and redis-benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
DEPTH=${1:-16}
for tool in perf redis-server redis-cli redis-benchmark socat; do
  command -v "$tool" >/dev/null || { echo "cpu_budget.sh: $tool not found" >&2; exit 1; }
done
build_bench_binaries cpu_budget.sh
bench_work cpu-budget
start_cluster
sock=$work/rl.sock
cluster_bench_config "$work/ratelimitd.toml" "$sock"
start_daemon_waiting "$work/ratelimitd.toml" "$sock" "$work/daemon.log" || { cat "$work/daemon.log" >&2; exit 1; }
pids+=("$daemon_pid")
wait_daemon "$sock" "$daemon_pid"
redis_pids=$(for p in "${ports[@]}"; do redis-cli -p "$p" info server | tr -d '\r' | awk -F: '/^process_id/ { print $2 }'; done | paste -sd,)
# cpu FILE: µs of task-clock in a `perf stat -x,` output
cpu() { awk -F, '$3 ~ /task-clock/ { t += $1 } END { printf "%.0f", t * 1000 }' "$@"; }
per() { awk -v a="$1" -v n="$2" 'BEGIN { printf "%.2f", a / n }'; }

# c: warm up (every primary's scripts loaded, the key space touched), then measure.
"$LOADGEN" --socket "$sock" --conns 50 --depth "$DEPTH" --duration 2s --warmup 0s --threads 1 \
  --request 'CHECK api k{n}\n' --keys 1000000 >/dev/null
perf stat -x, -e task-clock -p "$daemon_pid" -o "$work/d.stat" &
pd=$!
perf stat -x, -e task-clock -p "$redis_pids" -o "$work/rc.stat" &
pr=$!
sleep 0.2
perf stat -x, -e task-clock -o "$work/l.stat" -- "$LOADGEN" --socket "$sock" --conns 50 --depth "$DEPTH" \
  --duration 4s --warmup 0s --threads 1 --label c --request 'CHECK api k{n}\n' --keys 1000000 \
  --expect ALLOW --expect-contains ' redis' >"$work/lg.out"
kill -INT "$pd" "$pr"
wait "$pd" "$pr" || true
n=$(grep '^{' "$work/lg.out" | sed -n 's/.*"requests":\([0-9]*\).*/\1/p')
rps=$(grep '^{' "$work/lg.out" | sed -n 's/.*"rps":\([0-9.]*\).*/\1/p')
errors=$(grep '^{' "$work/lg.out" | sed -n 's/.*"errors":\([0-9]*\).*/\1/p')
c_d=$(per "$(cpu "$work/d.stat")" "$n")
c_r=$(per "$(cpu "$work/rc.stat")" "$n")
c_l=$(per "$(cpu "$work/l.stat")" "$n")

# s: the seeds' script on every primary at once.
kill "$daemon_pid" 2>/dev/null || true
load_seed_per_primary
calls=$((n / 3 < 20000 ? 20000 : n / 3))
perf stat -x, -e task-clock -p "$redis_pids" -o "$work/rs.stat" &
pr=$!
sleep 0.2
rb=()
for i in 0 1 2; do
  perf stat -x, -e task-clock -o "$work/b$i.stat" -- redis-benchmark -p "${ports[$i]}" -c 17 -P "$DEPTH" \
    -n "$calls" -r 1000000 --csv EVALSHA "${shas[$i]}" 1 "rl:{${tags[$i]}}:__rand_int__" \
    100000000 50 1000000 >"$work/rb$i.csv" 2>&1 &
  rb+=($!)
done
for p in "${rb[@]}"; do wait "$p"; done
kill -INT "$pr"
wait "$pr" || true
s_rps=0
for i in 0 1 2; do
  r=$(tr -d '\r"' <"$work/rb$i.csv" | grep -i evalsha | tail -n 1 | cut -d, -f2)
  s_rps=$(awk -v a="$s_rps" -v b="${r:-0}" 'BEGIN { print a + b }')
done
s_r=$(per "$(cpu "$work/rs.stat")" $((3 * calls)))
s_b=$(per "$(cpu "$work/b0.stat" "$work/b1.stat" "$work/b2.stat")" $((3 * calls)))

echo "redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'), 3 primaries, 50 x $DEPTH; daemon $DAEMON; load before $(cut -d' ' -f1 /proc/loadavg)"
echo "| run | rate (/s) | daemon µs | redis µs | client µs | total µs (CPU per decision or call) |"
echo "|---|---:|---:|---:|---:|---:|"
echo "| c: daemon ($errors errors) | $rps | $c_d | $c_r | $c_l | $(awk -v a="$c_d" -v b="$c_r" -v c="$c_l" 'BEGIN { printf "%.2f", a + b + c }') |"
echo "| s: seeds' EVALSHA | $s_rps | — | $s_r | $s_b | $(awk -v b="$s_r" -v c="$s_b" 'BEGIN { printf "%.2f", b + c }') |"
awk -v d="$c_d" -v r="$c_r" -v l="$c_l" -v sr="$s_r" -v sb="$s_b" -v a="$rps" -v b="$s_rps" 'BEGIN {
  printf "c ÷ s measured %.2f; bound from CPU %.2f; the daemon'"'"'s CPU for a bound of 0.9: %.2f µs\n",
    a / b, (sr + sb) / (d + r + l), (sr + sb) / 0.9 - r - l }'
