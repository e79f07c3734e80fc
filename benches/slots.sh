#!/usr/bin/env bash
# ACQUIRE + RELEASE pairs per second against two CHECKs per iteration (docs/PERFORMANCE.md,
# "Concurrency slots"), on one daemon of the release build in front of a 3-primary Redis
# Cluster started here, in the same run: `tools/src/bin/slot_pairs.rs` (standard library
# only, compiled here with rustc -O unless SLOT_PAIRS names a build of it).
#   bash benches/slots.sh [CONNS] [SECS]      (RATELIMITD_BIN: the daemon to measure)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. benches/lib.sh
conns=${1:-4}
secs=${2:-5}
bench_work slots
DAEMON=${RATELIMITD_BIN:-}
if [ -z "$DAEMON" ]; then
  cargo build --release --quiet --bin ratelimitd
  DAEMON=${CARGO_TARGET_DIR:-$PWD/target}/release/ratelimitd
fi
pairs=${SLOT_PAIRS:-$work/slot_pairs}
[ -n "${SLOT_PAIRS:-}" ] || rustc -O --edition 2021 -o "$pairs" tools/src/bin/slot_pairs.rs
start_cluster
cat >"$work/rl.toml" <<CONF
[server]
socket = "$work/rl.sock"
[redis]
mode = "cluster"
nodes = [$toml_nodes]
timeout_ms = 100
[[rule]]
name = "tb"
algorithm = "token_bucket"
capacity = 1000000000
refill_rate = 1000000000.0
[[rule]]
name = "slots"
algorithm = "concurrency"
limit = 1000
CONF
start_daemon_waiting "$work/rl.toml" "$work/rl.sock" "$work/daemon.log"
pids+=("$daemon_pid")
wait_daemon "$work/rl.sock" "$daemon_pid"
# Every primary probed before measuring.
sleep 2
echo "slots: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
"$pairs" "$work/rl.sock" tb slots "$conns" "$secs"
