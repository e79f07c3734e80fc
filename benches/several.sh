#!/usr/bin/env bash
# Several limits at once: CHECKALL and composite rules against the CHECKs they stand
# for, measured by one load generator against one daemon in the same run, on a
# standalone Redis and on a 3-primary Redis Cluster (no replicas) on this machine
# (docs/PERFORMANCE.md, "Several limits at once").
#
#   bash benches/several.sh [--quick]
#
# Rules: burst (token_bucket, capacity 100, 50/s), perday (fixed_window, 10^6 per day),
# a twin of perday named by tools/src/bin/same_slot_rule.rs so that its keys share a
# slot with burst's (perday<n>), and api (all_of burst and that twin); no request is
# ever denied. Keys are k000000 to k999999 (n uniform over 10^6, 7 bytes each: for keys
# of one length, two rules' keys share a slot for every key or for none). Rows, each for
# the shapes 50 connections x depth 16 and 50 x 1 (a "request" is one template: what
# the row's rps counts):
#   p  two pipelined CHECKs: "CHECK burst k<n>" + "CHECK perday k<n>" (one request =
#      the pair: two replies, both checked)
#   x  "CHECKALL burst k<n> 1 perday k<n> 1" (in a cluster, two slots for every n)
#   o  one "CHECK burst k<n>"
#   m  the composite "CHECK api k<n>" (in a cluster, one slot for every n)
# Ratios: x / p (two decisions each: CHECKALLs/s against pairs/s) and m / o (requests/s;
# m decides two limits, o one). Each row also gets Redis's EVALSHA calls and CPU per
# request (INFO commandstats over every primary, reset before the row) and the daemon's
# CPU per request (/proc/<pid>/stat). REPEAT (default 3) rounds of every row, in turn;
# the load average is printed with every row. --quick: 2 s per measurement instead of 4.
# Environment as benches/run.sh (DURATION, WARMUP, RATELIMITD_BIN with LOADGEN: measure
# those builds; MODES="standalone cluster" to pick). Everything it starts runs in a temp
# dir and is stopped by pid on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh

DURATION=${DURATION:-4s}
WARMUP=${WARMUP:-1s}
[ "${1:-}" = --quick ] && DURATION=2s && WARMUP=500ms
REPEAT=${REPEAT:-3}
MODES=${MODES:-standalone cluster}
for tool in redis-server redis-cli cargo socat python3; do
  command -v "$tool" >/dev/null || { echo "several.sh: $tool not found" >&2; exit 1; }
done
build_bench_binaries several.sh
SAME_SLOT_RULE=${SAME_SLOT_RULE:-$(dirname "$LOADGEN")/same_slot_rule}
[ -x "$SAME_SLOT_RULE" ] || cargo build --release --quiet -p ratelimitd-tools --bin same_slot_rule
bench_work several
twin=$("$SAME_SLOT_RULE" burst perday 7)

# write_config FILE SOCKET MODE NODES
write_config() {
  cat >"$1" <<EOF
[server]
socket = "$2"
redis_max_in_flight = 65536
redis_max_in_flight_per_uid = 65536
[redis]
mode = "$3"
nodes = [$4]
timeout_ms = 200
prefix = "rl"
[cache]
ttl_ms = 500
max_entries = 1000000
[fallback]
hosts = 1
[[rule]]
name = "burst"
algorithm = "token_bucket"
capacity = 100
refill_rate = 50.0
[[rule]]
name = "perday"
algorithm = "fixed_window"
limit = 1000000
window = "1d"
[[rule]]
name = "$twin"
algorithm = "fixed_window"
limit = 1000000
window = "1d"
[[rule]]
name = "api"
all_of = ["burst", "$twin"]
EOF
}

# redis_stats PORT...: EVALSHA calls and µs summed over those nodes.
redis_stats() {
  local p calls=0 usec=0 line
  for p in "$@"; do
    line=$(redis-cli -p "$p" INFO commandstats | tr -d '\r' | grep '^cmdstat_evalsha:' || true)
    if [ -n "$line" ]; then
      calls=$((calls + $(sed -n 's/.*:calls=\([0-9]*\).*/\1/p' <<<"$line")))
      usec=$((usec + $(sed -n 's/.*usec=\([0-9]*\),.*/\1/p' <<<"$line")))
    fi
  done
  echo "$calls $usec"
}

# cpu_ticks PID: user + system clock ticks of PID.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# measure MODE ROW SHAPE ROUND: one loadgen run; appends a tab-separated line to $results.
measure() {
  local mode=$1 row=$2 shape=$3 round=$4 c d req lines=1 out rps errors bad
  read -r c d <<<"$shape"
  case $row in
    p) req='CHECK burst k{n}\nCHECK perday k{n}\n'; lines=2 ;;
    x) req='CHECKALL burst k{n} 1 perday k{n} 1\n' ;;
    o) req='CHECK burst k{n}\n' ;;
    m) req='CHECK api k{n}\n' ;;
  esac
  local load ticks0 ticks1 stats0 stats1
  load=$(cut -d' ' -f1 /proc/loadavg)
  for p in "${redis_ports[@]}"; do redis-cli -p "$p" CONFIG RESETSTAT >/dev/null; done
  stats0=$(redis_stats "${redis_ports[@]}")
  ticks0=$(cpu_ticks "$daemon_pid")
  out=$("$LOADGEN" --socket "$sock" --conns "$c" --depth "$d" --duration "$DURATION" --warmup "$WARMUP" \
    --threads 1 --label "$mode $row c$c d$d" --request "$req" --reply-lines "$lines" --check-every-line \
    --n-start $((RANDOM * 100000)) --keys 1000000 --n-width 6 --expect ALLOW --expect-contains ' redis')
  ticks1=$(cpu_ticks "$daemon_pid")
  stats1=$(redis_stats "${redis_ports[@]}")
  local json
  json=$(grep '^{' <<<"$out" | tail -n 1)
  rps=$(sed -n 's/.*"rps":\([0-9.]*\).*/\1/p' <<<"$json")
  errors=$(sed -n 's/.*"errors":\([0-9]*\).*/\1/p' <<<"$json")
  bad=$(sed -n 's/.*"first_bad":"\([^"]*\)".*/\1/p' <<<"$json")
  local n_req secs hz
  n_req=$(sed -n 's/.*"requests":\([0-9]*\).*/\1/p' <<<"$json")
  secs=$(sed -n 's/.*"seconds":\([0-9.]*\).*/\1/p' <<<"$json")
  hz=$(getconf CLK_TCK)
  # The warm-up's requests are in the counters too: per request over the whole run.
  read -r calls0 usec0 <<<"$stats0"
  read -r calls1 usec1 <<<"$stats1"
  local total
  total=$(awk -v r="$rps" -v s="$secs" -v w="$(secs_of "$WARMUP")" 'BEGIN { print r * (s + w) }')
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$row" "$c×$d" "$round" "$rps" \
    "$(awk -v a=$((calls1 - calls0)) -v t="$total" 'BEGIN { printf "%.3f", (t > 0 ? a / t : 0) }')" \
    "$(awk -v a=$((usec1 - usec0)) -v t="$total" 'BEGIN { printf "%.1f", (t > 0 ? a / t : 0) }')" \
    "$(awk -v a=$((ticks1 - ticks0)) -v hz="$hz" -v t="$total" 'BEGIN { printf "%.1f", (t > 0 ? a / hz * 1e6 / t : 0) }')" \
    "$errors${bad:+ ($bad)}" "$load" >>"$results"
  : "$n_req"
}
secs_of() { awk -v d="$1" 'BEGIN { if (d ~ /ms$/) { sub(/ms$/, "", d); d /= 1000 } else sub(/s$/, "", d); print d + 0 }'; }

results=$work/results.tsv
: >"$results"
for mode in $MODES; do
  sock=$work/rl-$mode.sock
  case $mode in
    standalone)
      port=$(cluster_free_port)
      mkdir -p "$work/redis-$port"
      redis-server --port "$port" --bind 127.0.0.1 --dir "$work/redis-$port" --save '' --appendonly no \
        --protected-mode no >"$work/redis-$port/log" 2>&1 &
      pids+=($!)
      for _ in $(seq 1 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
      redis_ports=("$port")
      write_config "$work/$mode.toml" "$sock" standalone "\"127.0.0.1:$port\""
      ;;
    cluster)
      start_cluster
      redis_ports=("${ports[@]}")
      write_config "$work/$mode.toml" "$sock" cluster "$toml_nodes"
      ;;
  esac
  start_daemon_waiting "$work/$mode.toml" "$sock" "$work/daemon-$mode.log" || { cat "$work/daemon-$mode.log" >&2; exit 1; }
  pids+=("$daemon_pid")
  wait_daemon "$sock" "$daemon_pid"
  # Every primary decides in Redis before measuring.
  for _ in $(seq 1 100); do
    out=$(printf 'CHECK burst w1\nCHECK burst w2\nCHECK burst w3\nCHECK perday w4\nCHECK perday w5\nCHECK perday w6\n' |
      socat -t 2 - "UNIX-CONNECT:$sock")
    [ "$(grep -c ' redis' <<<"$out")" = 6 ] && break
    sleep 0.1
  done
  for round in $(seq 1 "$REPEAT"); do
    for shape in "50 16" "50 1"; do
      for row in p x o m; do
        measure "$mode" "$row" "$shape" "$round"
        tail -n 1 "$results" >&2
      done
    done
  done
  kill "$daemon_pid" 2>/dev/null || true
done

echo
echo "composite api = burst + $twin"
echo "redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'); daemon $DAEMON; $DURATION per measurement; $(nproc) CPUs"
echo "| mode | shape | round | p: pairs of CHECKs/s | x: CHECKALLs/s | x ÷ p | o: CHECKs/s | m: composite CHECKs/s | m ÷ o | load before (p x o m) |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"
awk -F'\t' '
  { k = $1 SUBSEP $3 SUBSEP $4; rps[k, $2] = $5; load[k, $2] = $10; if (!(k in seen)) { seen[k] = 1; order[++n] = k } }
  END {
    for (i = 1; i <= n; i++) {
      k = order[i]; split(k, f, SUBSEP)
      p = rps[k, "p"]; x = rps[k, "x"]; o = rps[k, "o"]; m = rps[k, "m"]
      printf "| %s | %s | %s | %.0f | %.0f | **%.2f** | %.0f | %.0f | **%.2f** | %s %s %s %s |\n", f[1], f[2], f[3], p, x, (p > 0 ? x / p : 0), o, m, (o > 0 ? m / o : 0), load[k, "p"], load[k, "x"], load[k, "o"], load[k, "m"]
    }
  }' "$results"
echo
echo "Per request (the row's unit), means over the rounds:"
echo "| mode | shape | row | EVALSHA | Redis CPU, µs | daemon CPU, µs | off-path replies (all rounds) |"
echo "|---|---|---|---:|---:|---:|---:|"
awk -F'\t' '
  { k = $1 SUBSEP $3 SUBSEP $2; if (!(k in n)) order[++m] = k; n[k]++; e[k] += $6; r[k] += $7; d[k] += $8; split($9, b, " "); off[k] += b[1] }
  END { for (i = 1; i <= m; i++) { k = order[i]; split(k, f, SUBSEP); printf "| %s | %s | %s | %.3f | %.1f | %.1f | %d |\n", f[1], f[2], f[3], e[k] / n[k], r[k] / n[k], d[k] / n[k], off[k] } }' "$results"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
