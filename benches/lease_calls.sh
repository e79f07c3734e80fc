#!/usr/bin/env bash
# EVALSHAs per lease call and per refund on one primary of a 3-primary Redis Cluster,
# one daemon, three shapes, each for DURATION seconds:
#   hot    K keys of a leased token bucket (lease = "auto", capacity 100,000 at
#          100,000/s: hot, never saturated), all on one primary, asked by 4 connections
#          with 64 requests in flight each: lump leases taken and given back
#   cold   20,000 keys of the same rule on that primary, each asked about once: every
#          CHECK a lease call of a cold key (the per-request path)
#   refund 20,000 keys of a plain token bucket on that primary, each taken 2 then
#          refunded 1 (REFUND)
# Redis counts the calls: EVALSHA on the primary (INFO commandstats) against its lease
# calls (HGETALL: the lease scripts read a key's hash with it, once per call, and no
# other script does) and the refunds sent. Every reply is checked: from Redis or a
# lease, and (refunds) the state after it. The times are the Python client's (its
# pipelines, 4 connections), which bounds the hot shape's rate.
#
#   bash benches/lease_calls.sh            # K=32 DURATION=5
#
# Environment: RATELIMITD_BIN (default: the release build, built here), K, DURATION.
# Needs redis-server, redis-cli, python3.
set -euo pipefail
cd "$(dirname "$0")/.."
K=${K:-32}
DURATION=${DURATION:-5}
if [ -z "${RATELIMITD_BIN:-}" ]; then
  cargo build --release --quiet --bin ratelimitd
fi
bin=${RATELIMITD_BIN:-${CARGO_TARGET_DIR:-$PWD/target}/release/ratelimitd}
# shellcheck source=benches/lib.sh
. benches/lib.sh
bench_work lease-calls
start_cluster
cat >"$work/rl.toml" <<CONF
[server]
socket = "$work/rl.sock"
[redis]
mode = "cluster"
nodes = [$toml_nodes]
timeout_ms = 100
prefix = "rl"
[cache]
ttl_ms = 0
[fallback]
hosts = 1
[[rule]]
name = "hot"
algorithm = "token_bucket"
capacity = 100000
refill_rate = 100000.0
lease = "auto"
[[rule]]
name = "plain"
algorithm = "token_bucket"
capacity = 10
refill_rate = 0.001
CONF
RUST_LOG=warn "$bin" --config "$work/rl.toml" >"$work/daemon.log" 2>&1 &
pids+=($!)
wait_daemon "$work/rl.sock" "${pids[-1]}" || { cat "$work/daemon.log" >&2; exit 1; }
echo "redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'); daemon $bin; load average $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$work/rl.sock" "${ports[0]}" "$K" "$DURATION" <<'PY'
import random, socket, subprocess, sys, threading, time
sock, port, k, duration = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])

def crc16(data):  # Redis Cluster's key slot hash (CRC16/XMODEM)
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc

def slot(key):  # the hash tag's, as Redis Cluster computes it
    a = key.find("{")
    b = key.find("}", a + 1)
    if a >= 0 and b > a + 1:
        key = key[a + 1:b]
    return crc16(key.encode()) % 16384

mine = set()
for line in subprocess.run(["redis-cli", "-p", str(port), "cluster", "nodes"], capture_output=True, text=True).stdout.splitlines():
    f = line.split()
    if "myself" in f[2]:
        for r in f[8:]:
            a, _, b = r.partition("-")
            mine.update(range(int(a), int(b or a) + 1))

def keys(rule, stem, n):
    out, i = [], 0
    while len(out) < n:
        if slot(f"rl:{{{rule}:{stem}{i}}}:tb") in mine:
            out.append(f"{stem}{i}")
        i += 1
    return out

def stat(cmd):
    info = subprocess.run(["redis-cli", "-p", str(port), "info", "commandstats"], capture_output=True, text=True).stdout
    for line in info.splitlines():
        if line.startswith(f"cmdstat_{cmd}:calls="):
            return int(line.split("=")[1].split(",")[0])
    return 0

def ask(lines_of, conns, check):
    """conns connections, each sending the lines lines_of(c) yields, 64 in flight."""
    bad, counts, lock = [], {}, threading.Lock()
    def run(c):
        s = socket.socket(socket.AF_UNIX); s.connect(sock)
        f = s.makefile("rwb")
        for lines in lines_of(c):
            f.write("".join(l + "\n" for l in lines).encode()); f.flush()
            for l in lines:
                r = f.readline().decode().split()
                with lock:
                    counts[r[5]] = counts.get(r[5], 0) + 1
                    if not check(l, r):
                        bad.append((l, r))
    ts = [threading.Thread(target=run, args=(c,)) for c in range(conns)]
    for t in ts: t.start()
    for t in ts: t.join()
    assert not bad, bad[:3]
    return counts

def measured(name, lines_of, conns, check):
    e0, h0 = stat("evalsha"), stat("hgetall")
    t = time.time()
    counts = ask(lines_of, conns, check)
    t = time.time() - t
    e, h = stat("evalsha") - e0, stat("hgetall") - h0
    n = sum(counts.values())
    items = h if name != "refund" else n
    what = "lease calls" if name != "refund" else "refunds"
    print(f"| {name} | {n} in {t:.2f} s | {counts} | {items} {what} | {e} | {e / max(items, 1):.3f} |")

print("| shape | requests | by source | calls to batch | EVALSHA | EVALSHA per call |")
print("|---|---:|---|---:|---:|---:|")
hot = keys("hot", "h", k)
def hot_lines(c):
    end = time.time() + duration
    while time.time() < end:
        yield [f"CHECK hot {random.choice(hot)}" for _ in range(64)]
measured("hot", hot_lines, 4, lambda l, r: r[0] == "ALLOW" and r[5] in ("redis", "lease"))
cold = keys("hot", "c", 20000)
def cold_lines(c):
    mine = cold[c::4]
    for i in range(0, len(mine), 64):
        yield [f"CHECK hot {x}" for x in mine[i:i + 64]]
measured("cold", cold_lines, 4, lambda l, r: r[0] == "ALLOW" and r[5] in ("redis", "lease"))
plain = keys("plain", "r", 20000)
ask(lambda c: ([f"CHECK plain {x} 2" for x in plain[c::4][i:i + 64]] for i in range(0, 5000, 64)), 4,
    lambda l, r: r[0] == "ALLOW")
def refunds(c):
    mine = plain[c::4]
    for i in range(0, len(mine), 64):
        yield [f"REFUND plain {x} 1" for x in mine[i:i + 64]]
measured("refund", refunds, 4, lambda l, r: r[2] == "9" and r[5] == "redis")
PY
