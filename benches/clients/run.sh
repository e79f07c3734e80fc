#!/usr/bin/env bash
# The clients' throughput against their usual peers, from one process with 64
# requests in flight, every decision made in the same Redis Cluster in the same run:
#   Node:   ratelimitd's client (-> daemon -> Redis)  vs  rate-limiter-flexible
#           (RateLimiterRedis on an ioredis Cluster)
#   Python: ratelimitd's AsyncClient                  vs  limits (async Redis Cluster
#           storage, FixedWindowRateLimiter), with each of its drivers (coredis, its
#           default, and redis-py)
# Keys: "spread" = a random key of 100,000 per decision (a fixed-window rule whose
# limit is never reached, so every ratelimitd decision is one script call in Redis:
# the sources seen are printed to prove it); "hot" = one key for every decision;
# "hot, lease" = the same from a rule with lease = "auto" (Node only; skipped, with a
# note, when the daemon does not take that setting).
#
#   bash benches/clients/run.sh [--quick]
#
# Each line alternates ours and the peer in slices (A B B A ...) from one process, so
# that load from anything else on the machine falls on both alike; its ratio is the
# median of the per-pair ratios.
#
# Environment: RATELIMITD_BIN (default target/release/ratelimitd), SLICE seconds per
# slice (default 2; --quick 1), PAIRS (default 6; --quick 3), IN_FLIGHT (default 64),
# RL_BENCH_CACHE (where the peers are installed; default
# ~/.cache/ratelimitd-bench). Needs redis-server, redis-cli, node + npm, python3; the
# peers come from npm and PyPI. Starts three redis-servers (a cluster on free
# loopback ports) and the daemon in a temp dir, and stops them by pid on exit.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
[ "${1:-}" = --quick ] && { : "${SLICE:=1}" "${PAIRS:=3}"; }
export SLICE=${SLICE:-2} PAIRS=${PAIRS:-6} IN_FLIGHT=${IN_FLIGHT:-64}
bin=${RATELIMITD_BIN:-$repo/target/release/ratelimitd}
[ -x "$bin" ] || { echo "run.sh: no daemon at $bin (cargo build --release, or set RATELIMITD_BIN)" >&2; exit 1; }
cache=${RL_BENCH_CACHE:-${HOME:-/tmp}/.cache/ratelimitd-bench}
# shellcheck source=benches/lib.sh
. "$repo/benches/lib.sh"
bench_work clients

# --- peers and clients, installed as their users install them -------------------
install_node_peers "$cache/node"
(
  cd "$cache/node"
  tgz=$(npm pack --silent "$repo/clients/node" --pack-destination "$work")
  npm install --silent --no-audit --no-fund "$work/$tgz"
)
if [ ! -x "$cache/venv/bin/python" ] || ! "$cache/venv/bin/python" -c 'import limits, coredis, redis' 2>/dev/null; then
  python3 -m venv "$cache/venv"
  "$cache/venv/bin/pip" install --quiet --disable-pip-version-check "limits[async-redis]" redis
fi
"$cache/venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "$repo/clients/python"

# --- a three-primary Redis Cluster on free loopback ports --------------------------
start_cluster

# --- the daemon -------------------------------------------------------------------
cat >"$work/rl.toml" <<CONF
[server]
socket = "$work/rl.sock"
socket_mode = "0600"

[redis]
mode = "cluster"
nodes = [$toml_nodes]
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
# A hot key served from leases (lease = "auto"), when this daemon knows the setting.
cp "$work/rl.toml" "$work/rl-base.toml"
cat >>"$work/rl.toml" <<CONF

[[rule]]
name = "bench_lease"
algorithm = "fixed_window"
limit = 1000000000
window = "1h"
lease = "auto"
CONF
lease=1
start_daemon() {
  RUST_LOG=${RUST_LOG:-warn} "$bin" --config "$work/rl.toml" >>"$work/daemon.log" 2>&1 &
  daemon_pid=$!
  wait_daemon "$work/rl.sock" "$daemon_pid"
}
if ! start_daemon; then
  echo "this daemon does not take lease = \"auto\": no lease measurement ($(tail -n 1 "$work/daemon.log"))"
  lease=0
  cp "$work/rl-base.toml" "$work/rl.toml"
  start_daemon || { tail -n 20 "$work/daemon.log" >&2; exit 1; }
fi
pids+=("$daemon_pid")

# --- measurements -----------------------------------------------------------------
cp "$here/node_bench.js" "$here/closed_loop.js" "$cache/node/"
echo "redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/') cluster ${nodes[*]}; daemon $bin; node $(node --version); $("$cache/venv/bin/python" --version)"
echo "peers: rate-limiter-flexible $(node -p "require('$cache/node/node_modules/rate-limiter-flexible/package.json').version"), ioredis $(node -p "require('$cache/node/node_modules/ioredis/package.json').version"), limits $("$cache/venv/bin/python" -c 'import limits; print(limits.__version__)')"
echo "in flight: $IN_FLIGHT; $PAIRS alternating pairs of $SLICE s slices per line; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
results=$work/results.jsonl
for keys in spread hot; do
  (cd "$cache/node" && node node_bench.js "$work/rl.sock" bench "$node_list" "$keys") | tee -a "$results"
  if [ "$keys" = hot ] && [ "$lease" = 1 ]; then
    (cd "$cache/node" && LABEL="hot, lease" node node_bench.js "$work/rl.sock" bench_lease "$node_list" hot) |
      tee -a "$results"
  fi
  for driver in coredis redispy; do # limits' two async Redis Cluster drivers
    (cd "$work" && LIMITS_IMPL=$driver "$cache/venv/bin/python" "$here/py_bench.py" "$work/rl.sock" bench "$node_list" "$keys") |
      tee -a "$results"
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
names = {"node": ("Node ratelimitd client", "rate-limiter-flexible"), "python": ("Python AsyncClient", "limits")}
for r in rows:
    if r["lang"] == "python":
        r["peer_name"] = f"limits ({r['peer_driver']})"
print()
print("| keys | ours | decisions/s | peer | decisions/s | ratio (median of pairs) | per-pair ratios | ratelimitd sources |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    ours, peer = names[r["lang"]]
    peer = r.get("peer_name", peer)
    print(f"| {r['keys']} | {ours} | {r['ratelimitd']:,} | {peer} | {r['peer']:,} | {r['ratio']:.2f}× | "
          f"{', '.join(f'{x:.2f}' for x in r['ratios'])} | {', '.join(f'{k} {v}' for k, v in r['sources'].items())} |")
PY
