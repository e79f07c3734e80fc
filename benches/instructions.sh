#!/usr/bin/env bash
# Instructions per request, counted by callgrind: a regression check that load on the
# machine cannot disturb (wall-clock benchmarks on a shared 2-core box swing by 2x; the
# instruction count of the same binary and input is the same run after run).
#
#   bash benches/instructions.sh [BINARY...]     # default: target/release/ratelimitd
#
# For each binary: the daemon runs under `valgrind --tool=callgrind` with
# redis.mode = "none"; a client sends a warm-up batch, then N pipelined requests for
# each workload; the daemon's instruction count over the measured part (callgrind's
# --toggle-collect is not used: the warm-up's count is subtracted instead, from a
# second run with the warm-up only) divided by N is printed. Workloads:
#   local-hot   CHECK api hot      one exhausted key (local DENY)
#   local-keys  CHECK api k<n>     keys spread over 10,000
#   local-new   CHECK api n<i>     a new key every request (a new local bucket each)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-20000}
command -v valgrind >/dev/null || { echo "instructions.sh: valgrind not found (apt-get install valgrind)" >&2; exit 1; }
command -v socat >/dev/null || { echo "instructions.sh: socat not found" >&2; exit 1; }
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(target/release/ratelimitd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/rl-instr-XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# requests WORKLOAD COUNT: the request lines.
requests() {
    python3 - "$1" "$2" <<'EOF'
import sys
w, n = sys.argv[1], int(sys.argv[2])
out = sys.stdout
for i in range(n):
    if w == "local-hot":
        out.write("CHECK api hot\n")
    elif w == "local-new":
        out.write(f"CHECK api n{i}\n")
    else:
        out.write(f"CHECK api k{i % 10000}\n")
EOF
}

# count BIN WORKLOAD COUNT: total instructions of the daemon serving COUNT requests.
count() {
    local bin=$1 w=$2 n=$3 dir
    dir=$(mktemp -d "$TMP/run-XXXX")
    cat >"$dir/rl.toml" <<EOF
[server]
socket = "$dir/rl.sock"
socket_mode = "0600"
worker_threads = 1
[redis]
mode = "none"
[[rule]]
name = "api"
algorithm = "token_bucket"
capacity = 5
refill_rate = 0.001
EOF
    RUST_LOG=error valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" \
        "$bin" --config "$dir/rl.toml" >"$dir/log" 2>&1 &
    local pid=$!
    for _ in $(seq 600); do [ -S "$dir/rl.sock" ] && break; sleep 0.1; done
    requests "$w" "$n" >"$dir/req"
    socat -t 30 - "UNIX-CONNECT:$dir/rl.sock" <"$dir/req" | wc -l >"$dir/replies"
    kill -TERM "$pid"
    wait "$pid" || true
    [ "$(cat "$dir/replies")" = "$n" ] || { echo "instructions.sh: $(cat "$dir/replies") replies for $n requests" >&2; exit 1; }
    sed -n 's/^summary: *\([0-9]*\).*/\1/p; s/^totals: *\([0-9]*\).*/\1/p' "$dir/cg.out" | head -n 1
}

printf '| binary | workload | instructions per request |\n|---|---|---|\n'
for bin in "${bins[@]}"; do
    for w in ${WORKLOADS:-local-hot local-keys local-new}; do
        base=$(count "$bin" "$w" 1000)
        full=$(count "$bin" "$w" $((N + 1000)))
        printf '| %s | %s | %s |\n' "$bin" "$w" "$(( (full - base) / N ))"
    done
done
