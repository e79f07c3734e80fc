#!/usr/bin/env bash
# Redis's instructions per token-bucket decision, counted by callgrind (stable where this
# VM's timings are not): redis-server runs under `valgrind --tool=callgrind` and serves
# N decisions on new keys, sent 50 commands at a time, five ways:
#   seed    the seeds' plain script (benches/seed_token_bucket.lua), one EVALSHA each
#   single  our token bucket script, one EVALSHA each
#   batch   our token bucket through the batch script, BATCH decisions per EVALSHA
#   all     CHECKALL groups of two token-bucket keys through the all-or-nothing batch
#           script (lua/all_batch.lua, standalone), as the daemon sends them: BATCH/2
#           groups (BATCH decisions) per EVALSHA, every group allowed (new keys)
#   deny    the same groups, each denied on its second key (a cost above the capacity):
#           the first key is taken, then given back, and both are reported as dry runs
#   lease   a token bucket's lease call (lua/lease_token_bucket.lua) asking for a lease
#           of 50 tokens, one EVALSHA each (a hot key's call: a lease granted and
#           recorded; its key new, so nothing to settle)
#   lease_batch  the same calls through the batch script, BATCH per EVALSHA
# Each count is that run's instructions minus those of a run of N/10 decisions,
# divided by the difference in decisions (for all and deny, a decision is one key of a
# group: a group of two costs twice the figure; for lease and lease_batch, a lease call).
#
#   bash benches/script_instructions.sh [N] [BATCH] [MODES]  # defaults 2000 20 "seed single batch all deny"
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-2000}
BATCH=${2:-20}
MODES=${3:-seed single batch all deny}
command -v valgrind >/dev/null || { echo "script_instructions.sh: valgrind not found (apt-get install valgrind)" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "script_instructions.sh: redis-server not found" >&2; exit 1; }
source benches/lib.sh
bench_work script-instr
cargo run --release --quiet -p ratelimitd-tools --bin script_text -- batch >"$work/batch.lua" 2>/dev/null
cargo run --release --quiet -p ratelimitd-tools --bin script_text -- token_bucket >"$work/single.lua" 2>/dev/null
cargo run --release --quiet -p ratelimitd-tools --bin script_text -- all_batch >"$work/all.lua" 2>/dev/null
cargo run --release --quiet -p ratelimitd-tools --bin script_text -- lease_token_bucket >"$work/lease.lua" 2>/dev/null
cp benches/seed_token_bucket.lua "$work/seed.lua"

# count WORKLOAD DECISIONS: redis-server's total instructions serving them.
count() {
    python3 - "$work" "$1" "$2" "$BATCH" <<'PY'
import random, socket, subprocess, sys, time
work, w, n, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
out = f"{work}/cg.{w}.{n}.out"
for _ in range(20):
    port = random.randrange(20000, 60000)
    try:
        probe = socket.socket(); probe.bind(("127.0.0.1", port)); probe.close(); break
    except OSError:
        continue
redis = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                          "redis-server", "--port", str(port), "--bind", "127.0.0.1",
                          "--save", "", "--appendonly", "no"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    for _ in range(600):
        try:
            conn = socket.create_connection(("127.0.0.1", port)); break
        except OSError:
            time.sleep(0.1)
    else:
        sys.exit("script_instructions.sh: redis-server under valgrind did not start")
    f = conn.makefile("rwb")
    def cmd(*args):
        b = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            b += b"$%d\r\n%s\r\n" % (len(a), a)
        return b
    def read():
        line = f.readline()
        if line[:1] == b"*":
            return [read() for _ in range(int(line[1:]))]
        if line[:1] == b"$":
            k = int(line[1:])
            return None if k < 0 else f.read(k + 2)[:-2]
        if line[:1] == b"-":
            sys.exit(f"script_instructions.sh: Redis replied {line.strip()!r}")
        return line.strip()
    sha = {}
    for name in ("seed", "single", "batch", "all", "lease"):
        f.write(cmd("SCRIPT", "LOAD", open(f"{work}/{name}.lua").read())); f.flush()
        sha[name] = read()
    # capacity 1000 tokens, refill 1000/s, cost 1 (micro-units, as the daemon sends)
    args = [1000000000, 1000, 1000000]
    # A lease call's (src/store/scripts.rs lease_args): the decision's, "" for TIME, the
    # holder, nothing given back, 50 tokens wanted for 1 s, no pace, no clocks.
    lease = args + ["", "bench", 0, 0, 50000000, 1000000, 0, "", 0, "", "", "", 0]
    reqs = []
    if w == "lease":
        reqs = [cmd("EVALSHA", sha["lease"], 1, f"rl:{{k:{i}}}:tb", *lease) for i in range(n)]
    elif w == "lease_batch":
        # The lease calls' functions follow the six algorithms' decisions.
        for j in range(n // batch):
            keys = [f"rl:{{k:{j * batch + i}}}:tb" for i in range(batch)]
            items = [x for _ in keys for x in [6, len(lease)] + lease]
            reqs.append(cmd("EVALSHA", sha["batch"], len(keys), *keys, *items))
    elif w == "batch":
        for j in range(n // batch):
            keys = [f"rl:{{k:{j * batch + i}}}:tb" for i in range(batch)]
            items = [x for _ in keys for x in [0, len(args)] + args]
            reqs.append(cmd("EVALSHA", sha["batch"], len(keys), *keys, *items))
    elif w in ("all", "deny"):
        # Groups of two keys; in deny, the second one's cost is above the capacity, so
        # the group is denied once its first key is taken.
        over = [1000000000, 1000, 2000000000]
        for j in range(n // batch):
            keys, items = [], []
            for g in range(batch // 2):
                i = j * batch + 2 * g
                keys += [f"rl:{{k:{i}}}:tb", f"rl:{{k:{i + 1}}}:tb"]
                second = over if w == "deny" else args
                items += [2, 0, len(args), *args, 0, len(second), *second]
            reqs.append(cmd("EVALSHA", sha["all"], len(keys), *keys, *items))
    else:
        suffix = "sd" if w == "seed" else "tb"
        reqs = [cmd("EVALSHA", sha[w], 1, f"rl:{{k:{i}}}:{suffix}", *args) for i in range(n)]
    for i in range(0, len(reqs), 50):
        chunk = reqs[i:i + 50]
        f.write(b"".join(chunk)); f.flush()
        for _ in chunk:
            read()
    f.write(cmd("SHUTDOWN", "NOSAVE")); f.flush()
    redis.wait(timeout=120)
finally:
    if redis.poll() is None:
        redis.kill()
for line in open(out):
    if line.startswith(("summary:", "totals:")):
        print(line.split()[1]); break
PY
}

printf '| what Redis runs | instructions per decision (lease, lease_batch: per lease call) |\n|---|---:|\n'
small=$((N / 10))
for w in $MODES; do
    base=$(count "$w" "$small")
    full=$(count "$w" "$N")
    printf '| %s | %s |\n' "$w" "$(( (full - base) / (N - small) ))"
done
