#!/usr/bin/env bash
# The sliding window log's cost per decision in Redis at 1,000 and 10,000 entries:
# the script of this tree (lua/prelude.lua + lua/sliding_window_log.lua) and, for
# comparison, the one of an earlier revision (OLD_REV, default a920724: a full read of
# the log per decision), against a redis-benchmark PING baseline in the same run.
#
#   bash benches/swl.sh            # prints a markdown table
#
# Per size n: a key is filled with n entries 1 ms apart (limit n, window n ms, explicit
# timestamps, ARGV[4]), then
#   slide  M decisions each 1 ms later: one entry leaves the window, one is admitted
#          (the steady state of a busy key: trim + ALLOW, n entries throughout);
#   deny   M decisions at one instant on the full log (DENY, wait_ms searched);
#   bench  redis-benchmark -c 1 of the deny call (this tree's script), requests/s,
#          against PING's.
# "µs/decision" is Redis's own INFO commandstats usec_per_call for EVALSHA (time inside
# the server, script included); the PING round trip is 1e6 ÷ PING's requests/s at one
# connection. Needs redis-server, redis-cli, redis-benchmark, git (for OLD_REV).
set -euo pipefail
cd "$(dirname "$0")/.."
OLD_REV=${OLD_REV:-a920724}
M=${M:-2000}
M_OLD=${M_OLD:-100}
BENCH_N=${BENCH_N:-20000}
TMP=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
redis-server --port 0 --unixsocket "$TMP/r.sock" --unixsocketperm 700 --save "" \
    --appendonly no --daemonize no --logfile "$TMP/r.log" &
PID=$!
for _ in $(seq 100); do [ -S "$TMP/r.sock" ] && break; sleep 0.05; done
cli() { redis-cli -s "$TMP/r.sock" "$@"; }
until cli PING >/dev/null 2>&1; do sleep 0.05; done

cat lua/prelude.lua lua/sliding_window_log.lua >"$TMP/new.lua"
SHA_NEW=$(cli SCRIPT LOAD "$(cat "$TMP/new.lua")")
SHA_OLD=
if git cat-file -e "$OLD_REV" 2>/dev/null; then
    { git show "$OLD_REV:lua/prelude.lua"; git show "$OLD_REV:lua/sliding_window_log.lua"; } >"$TMP/old.lua"
    SHA_OLD=$(cli SCRIPT LOAD "$(cat "$TMP/old.lua")")
fi

T0=1700000000000000
usec_per_call() {
    cli INFO commandstats | tr -d '\r' | awk -F'[,=]' '/^cmdstat_evalsha:/ { for (i = 1; i < NF; i++) if ($i == "usec_per_call") print $(i + 1) }'
}
# run SHA KEY N OFFSET COUNT STEP: COUNT calls at T0 + OFFSET + j * STEP µs
run() {
    awk -v sha="$1" -v key="$2" -v n="$3" -v off="$4" -v count="$5" -v step="$6" -v t0="$T0" \
        'BEGIN { for (j = 0; j < count; j++) printf "EVALSHA %s 1 %s %d %d 1 %.0f\n", sha, key, n, n * 1000, t0 + off + j * step }' |
        cli >/dev/null
}
# fill WHICH KEY N: N entries 1 ms apart from T0, one unit each, in the member format
# of WHICH's script (ZADD in batches: filling through the old script would be O(n²)).
fill() {
    awk -v which="$1" -v key="$2" -v n="$3" -v t0="$T0" 'BEGIN {
        for (i = 0; i < n; i++) {
            if (i % 500 == 0) { if (i) printf "\n"; printf "ZADD %s", key }
            t = t0 + i * 1000
            if (which == "old") printf " %.0f %.0f:1", t, t
            else printf " %.0f %.0f:%d:0:1", t, t, i + 1
        }
        printf "\n"
    }' | cli >/dev/null
}
rps_of() { tr '\r' '\n' | sed -n 's/.* \([0-9.]*\) requests per second.*/\1/p' | tail -1; }
ping_rps=$(redis-benchmark -s "$TMP/r.sock" -c 1 -n "$BENCH_N" -q PING | rps_of)
ping_rtt=$(awk -v r="$ping_rps" 'BEGIN { printf "%.1f", 1e6 / r }')
echo "| script | entries | slide µs/decision | deny µs/decision | deny req/s (1 conn) | PING req/s (1 conn) | deny ÷ PING round trip |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for which in new old; do
    sha=$SHA_NEW; m=$M; bench_n=$BENCH_N
    if [ "$which" = old ]; then sha=$SHA_OLD; m=$M_OLD; bench_n=200; fi
    [ -n "$sha" ] || continue
    for n in 1000 10000; do
        key="swl:{$which$n}"
        fill "$which" "$key" "$n"
        entries=$(cli ZCARD "$key")
        cli CONFIG RESETSTAT >/dev/null
        run "$sha" "$key" "$n" "$(( n * 1000 ))" "$m" 1000
        slide=$(usec_per_call)
        cli CONFIG RESETSTAT >/dev/null
        at=$(( (n + m - 1) * 1000 + 1 ))
        run "$sha" "$key" "$n" "$at" "$m" 0
        deny=$(usec_per_call)
        # The benchmarked call must be a DENY (first field 0), not an error.
        first=$(cli EVALSHA "$sha" 1 "$key" "$n" "$(( n * 1000 ))" 1 "$(( T0 + at ))" | head -1)
        if [ "$first" != 0 ]; then
            [ "$which" = new ] && { echo "swl.sh: $which at $n entries answered '$first', not a DENY" >&2; exit 1; }
            deny=-
        fi
        rps=-
        if [ "$which" = new ]; then
            rps=$(redis-benchmark -s "$TMP/r.sock" -c 1 -n "$bench_n" -q \
                EVALSHA "$sha" 1 "$key" "$n" "$(( n * 1000 ))" 1 "$(( T0 + at ))" | rps_of)
        fi
        ratio=-
        [ "$deny" = - ] || ratio=$(awk -v d="$deny" -v r="$ping_rtt" 'BEGIN { printf "%.2f", d / r }')
        echo "| $which | $entries | $slide | $deny | $rps | $ping_rps | $ratio |"
    done
done
echo
echo "PING round trip (1 connection): $ping_rtt µs; redis-server $(redis-server --version | awk '{ print $3 }'); load average $(cut -d' ' -f1-3 /proc/loadavg)"
