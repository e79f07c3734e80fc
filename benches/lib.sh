# shellcheck shell=bash
# Shell helpers of the benchmarks that run a Redis Cluster and daemons (benches/leases.sh,
# benches/clients/run.sh) or measure the daemon's memory (benches/memory.sh,
# benches/deny_memory.sh), sourced, never run. Everything they start goes in `pids` and
# lives in `work`, both stopped and removed on exit.
#
#   . benches/lib.sh; bench_work NAME; start_cluster

# build_bench_binaries NAME: sets DAEMON and LOADGEN: RATELIMITD_BIN and LOADGEN as given
# when both are set (measure those), else the release build of the daemon and the
# loadgen of tools/, built here (run from the repository's root). NAME prefixes the error.
build_bench_binaries() {
  if [ -z "${LOADGEN:-}" ] || [ -z "${RATELIMITD_BIN:-}" ]; then
    cargo build --release --quiet --bin ratelimitd
    LOADGEN=$(cargo build --release -p ratelimitd-tools --bin loadgen --message-format=json 2>/dev/null |
      grep '"reason":"compiler-artifact"' | grep '"name":"loadgen"' |
      sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
  fi
  [ -x "$LOADGEN" ] || { echo "$1: cannot find the built loadgen" >&2; exit 1; }
  DAEMON=${RATELIMITD_BIN:-${CARGO_TARGET_DIR:-$PWD/target}/release/ratelimitd}
}

# start_daemon_waiting CONFIG SOCKET LOG: starts $DAEMON with CONFIG (warnings to LOG), sets
# daemon_pid, and waits (10 s at most) for SOCKET to appear.
start_daemon_waiting() {
  RUST_LOG=warn "$DAEMON" --config "$1" </dev/null >"$3" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 1 500); do [ -S "$2" ] && return 0; sleep 0.02; done
  return 1
}

# proc_status PID FIELD: a field of /proc/PID/status in kB (VmRSS, VmHWM).
proc_status() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }

# bench_work NAME: a temp dir `work` (rl-NAME-bench-XXXXXX under TMPDIR) and `pids`, the
# processes to stop; on exit, kills them by pid, waits for them and removes `work`.
bench_work() {
  work=$(mktemp -d "${TMPDIR:-/tmp}/rl-$1-bench-XXXXXX")
  pids=()
  trap bench_cleanup EXIT
}
bench_cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}

cluster_free_port() { # a port p with p and p + 10000 (its cluster bus) free
  python3 - <<'PY'
import random, socket
while True:
    p = random.randrange(20000, 30000)
    try:
        for q in (p, p + 10000):
            s = socket.socket(); s.bind(("127.0.0.1", q)); s.close()
        print(p); break
    except OSError:
        pass
PY
}

# start_cluster: a three-primary Redis Cluster on free loopback ports, in `work`; waits
# until every node says cluster_state:ok. Sets `ports` (1 2 3), `nodes` (127.0.0.1:port
# each), `node_list` (comma-separated) and `toml_nodes` ("host:port", ... for a config's
# nodes = [...]), globals the caller reads.
# shellcheck disable=SC2034
start_cluster() {
  local p
  nodes=()
  ports=()
  for _ in 1 2 3; do
    p=$(cluster_free_port)
    mkdir -p "$work/redis-$p"
    redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file "$work/redis-$p/nodes.conf" \
      --dir "$work/redis-$p" --save '' --appendonly no --protected-mode no >"$work/redis-$p/log" 2>&1 &
    pids+=($!)
    nodes+=("127.0.0.1:$p")
    ports+=("$p")
  done
  for p in "${ports[@]}"; do
    for _ in $(seq 1 100); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.05; done
  done
  redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >"$work/cluster-create.log" 2>&1
  for p in "${ports[@]}"; do
    for _ in $(seq 1 200); do
      redis-cli -p "$p" cluster info 2>/dev/null | grep -q 'cluster_state:ok' && break
      sleep 0.05
    done
  done
  node_list=$(IFS=,; echo "${nodes[*]}")
  toml_nodes=$(printf '"%s", ' "${nodes[@]}")
  toml_nodes=${toml_nodes%, }
}

# wait_daemon SOCKET [PID]: waits (10 s at most) until the daemon at SOCKET answers PING;
# fails at once if PID is given and has exited, or when the time is up.
wait_daemon() {
  for _ in $(seq 1 200); do
    [ "$(printf 'PING\n' | socat -t 1 - "UNIX-CONNECT:$1" 2>/dev/null)" = PONG ] && return 0
    [ -z "${2:-}" ] || kill -0 "$2" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# install_node_peers DIR: rate-limiter-flexible and ioredis from npm in DIR (a private
# package there), unless they are already installed.
install_node_peers() {
  mkdir -p "$1"
  (
    cd "$1" &&
      { [ -f package.json ] || printf '{ "name": "rl-bench", "private": true, "version": "0.0.0" }\n' >package.json; } &&
      { { [ -d node_modules/rate-limiter-flexible ] && [ -d node_modules/ioredis ]; } ||
        npm install --silent --no-audit --no-fund rate-limiter-flexible ioredis; }
  )
}

# cluster_bench_config FILE SOCKET: the daemon's configuration of the cluster benchmarks
# (benches/cluster.sh, benches/cpu_budget.sh): mode = "cluster" on `toml_nodes`
# (start_cluster), listening on SOCKET, one token bucket rule "api" of capacity 100 at
# 50/s, written to FILE.
cluster_bench_config() {
  cat >"$1" <<EOF
[server]
socket = "$2"
[redis]
mode = "cluster"
nodes = [$toml_nodes]
timeout_ms = 100
prefix = "rl"
[cache]
ttl_ms = 500
max_entries = 1000000
[fallback]
hosts = 1
[[rule]]
name = "api"
algorithm = "token_bucket"
capacity = 100
refill_rate = 50.0
EOF
}

# load_seed_per_primary: loads benches/seed_token_bucket.lua on each primary of `ports`
# and finds a hash tag of one of its slots; sets `shas` and `tags` (one each per port).
# shellcheck disable=SC2034
load_seed_per_primary() {
  local p range i s
  shas=()
  tags=()
  for p in "${ports[@]}"; do
    shas+=("$(redis-cli -p "$p" SCRIPT LOAD "$(cat benches/seed_token_bucket.lua)")")
    range=$(redis-cli -p "$p" cluster nodes | awk '/myself/ { print $9 }')
    for i in $(seq 0 100000); do
      s=$(redis-cli -p "$p" cluster keyslot "t$i")
      if [ "$s" -ge "${range%-*}" ] && [ "$s" -le "${range#*-}" ]; then tags+=("t$i"); break; fi
    done
  done
}
