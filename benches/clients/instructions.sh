#!/usr/bin/env bash
# The clients' own cost per decision in instructions (valgrind's callgrind), a figure
# the machine's load cannot move, unlike decisions/s:
#   Python: AsyncClient.check, 64 tasks in flight on one event loop
#   Node:   Client.check, 64 callers in flight
# against a daemon in redis.mode = "none" (every reply a local decision: the client's
# work is the same whoever decides). Each client makes N and 2N decisions in two runs;
# the difference divided by N is the steady cost of one decision (start-up, imports and
# the JIT's warm-up cancel out), harness loop included.
#
#   bash benches/clients/instructions.sh [N]      (default N = 12800)
#
# Environment: RATELIMITD_BIN (default target/release/ratelimitd), PYTHON (default
# python3), NODE (default node). Needs valgrind and socat. Starts the daemon in a temp
# dir and stops it by pid on exit.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
n=${1:-12800}
bin=${RATELIMITD_BIN:-$repo/target/release/ratelimitd}
[ -x "$bin" ] || { echo "instructions.sh: no daemon at $bin (cargo build --release, or set RATELIMITD_BIN)" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "instructions.sh: valgrind not found (apt-get install valgrind)" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/rl-clients-instr-XXXXXX")
daemon_pid=
cleanup() {
  [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/rl.toml" <<CONF
[server]
socket = "$work/rl.sock"
socket_mode = "0600"

[redis]
mode = "none"

[[rule]]
name = "bench"
algorithm = "token_bucket"
capacity = 1000000000
refill_rate = 1000000.0
CONF
RUST_LOG=warn "$bin" --config "$work/rl.toml" >"$work/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 1 200); do
  [ "$(printf 'PING\n' | socat -t 1 - "UNIX-CONNECT:$work/rl.sock" 2>/dev/null)" = PONG ] && break
  sleep 0.05
done

cat >"$work/py.py" <<'PY'
import asyncio, sys
from ratelimitd import AsyncClient

async def main(path: str, total: int) -> None:
    rl = AsyncClient(path, timeout=60.0)
    assert (await rl.check("bench", "warm")).source == "local"
    per = total // 64

    async def caller(i: int) -> None:
        for j in range(per):
            await rl.check("bench", f"k{(i * per + j) % 100000}")

    await asyncio.gather(*(caller(i) for i in range(64)))
    await rl.close()

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
PY
cat >"$work/node.js" <<'JS'
const { Client } = require(process.argv[2]);
const [path, total] = [process.argv[3], Number(process.argv[4])];
(async () => {
  const rl = new Client({ socket: path, timeoutMs: 60000 });
  if ((await rl.check('bench', 'warm')).source !== 'local') throw new Error('not a local decision');
  const per = Math.floor(total / 64);
  await Promise.all(Array.from({ length: 64 }, async (_, i) => {
    for (let j = 0; j < per; j++) await rl.check('bench', `k${(i * per + j) % 100000}`);
  }));
  rl.close();
})();
JS

collected() { # command...: the instructions callgrind counted
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" 2>&1 | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
per_decision() { # label command... (N appended, then 2N)
  local label=$1 a b
  shift
  a=$(collected "$@" "$n")
  b=$(collected "$@" $((2 * n)))
  [ -n "$a" ] && [ -n "$b" ] || { echo "$label: callgrind counted nothing (run it by hand: valgrind --tool=callgrind $*)" >&2; return 1; }
  echo "$label: $(((b - a) / n)) instructions per decision"
}
# The interpreters themselves, not wrappers (pyenv's shims are shell scripts, which
# callgrind would count instead).
python=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')
node=$("${NODE:-node}" -p 'process.execPath')
echo "N = $n; $("$python" --version) ($python); node $("$node" --version); $(valgrind --version)"
PYTHONPATH=$repo/clients/python/src per_decision "Python AsyncClient" "$python" "$work/py.py" "$work/rl.sock"
per_decision "Node Client" "$node" "$work/node.js" "$repo/clients/node" "$work/rl.sock"
