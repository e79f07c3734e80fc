#!/usr/bin/env bash
# Reproducible benchmark: ratelimitd against Redis, measured by the same
# closed-loop client (tools/src/bin/loadgen/) with the same settings.
#
#   bash benches/run.sh [--quick] [--out FILE]
#
#   --quick      2 s per measurement instead of 5 s (smoke run)
#   --out FILE   where to write the markdown results (default docs/perf-results.md)
#
# Environment: DURATION / WARMUP override the per-measurement times (e.g. 10s),
# RUST_LOG the daemon's log filter (default "warn"), RATELIMITD_BIN another daemon
# binary to measure (default $CARGO_TARGET_DIR or target, /release/ratelimitd);
# with both RATELIMITD_BIN and LOADGEN (a built tools/src/bin/loadgen/) set, nothing is built.
#
# Needs redis-server, redis-cli and redis-benchmark (Debian: apt-get install
# redis-server redis-tools). Everything it starts (two redis-servers, the
# daemon) runs in a temporary directory and is stopped by pid on exit.
#
# Scenarios, each for three shapes: 50 connections x pipeline depth 1,
# 50 x 16, and 1 x 1 (latency; client and servers pinned to CPU 0 with taskset):
#   a  Redis PING over its Unix socket                      (baseline)
#   b  daemon, redis.mode = "none": CHECK api k<n>, a new key per request
#   u  daemon, redis.mode = "none": CHECK api k<n>, n uniform over 10^5 keys
#   v  daemon, redis.mode = "none": CHECK api k<n>, n uniform over 10^6 keys
#   g  daemon, redis.mode = "none": CHECK hot k, one exhausted key (local DENY)
#   c  daemon, standalone Redis: CHECK hot k, an exhausted key (deny cache)
#   k  daemon, standalone Redis: CHECK one k<n>, n uniform over 10^3 denied keys
#      (deny cache)
#   d  daemon, standalone Redis: CHECK api k<n>, n uniform over 10^6 keys -> one
#      EVALSHA each
#   e  the same EVALSHA sent straight to that Redis over TCP, by loadgen (RESP)
#   f  the same EVALSHA by redis-benchmark -r 1000000 (our script)
#   s  redis-benchmark -r 1000000 EVALSHA of the seeds' plain token bucket
#      (benches/seed_token_bucket.lua: HMGET, refill, HMSET, EXPIRE)
#   h  g with [metrics] listen on (metrics overhead), 50x1 and 50x16
#   i  c with [metrics] listen on (metrics overhead), 50x1 and 50x16
# Ratios: b, u, v, g, c and k against a; d against e (and f, s); h against g, i
# against c.
# ONLY=<letters> (e.g. ONLY=auvk) measures just those scenarios (a development aid:
# the published table is a full run).
set -euo pipefail

QUICK=0
OUT=docs/perf-results.md
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --out) OUT=$2; shift ;;
        -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) echo "run.sh: unknown argument: $1 (try --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ "$QUICK" = 1 ]; then
    DURATION=${DURATION:-2s}
    WARMUP=${WARMUP:-500ms}
else
    DURATION=${DURATION:-5s}
    WARMUP=${WARMUP:-1s}
fi
export RUST_LOG=${RUST_LOG:-warn}
secs() { # 500ms / 2s / 1.5 -> seconds
    awk -v d="$1" 'BEGIN { if (d ~ /ms$/) { sub(/ms$/, "", d); d /= 1000 } else sub(/s$/, "", d); print d + 0 }'
}
DURATION_S=$(secs "$DURATION")
WARMUP_S=$(secs "$WARMUP")

cd "$(dirname "$0")/.."
ROOT=$PWD
for tool in redis-server redis-cli redis-benchmark cargo awk; do
    command -v "$tool" >/dev/null || { echo "run.sh: $tool not found" >&2; exit 1; }
done

# The rule every scenario uses (must match the [[rule]] written below).
CAPACITY=100
REFILL=50
# token_bucket.lua ARGV: capacity and cost in micro-tokens, refill in tokens/s.
LUA_ARGV="$((CAPACITY * 1000000)) $REFILL 1000000"
SHAPES=("50 1" "50 16" "1 1")

TMP=$(mktemp -d "${TMPDIR:-/tmp}/rlbench.XXXXXX")
PIDS=()
DAEMON_PID=

stop_pid() { # pid: SIGTERM, wait up to 5 s, then SIGKILL
    local pid=$1 i
    kill -TERM "$pid" 2>/dev/null || return 0
    for i in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    local pid
    for pid in ${DAEMON_PID:-} "${PIDS[@]}"; do
        if [ -n "$pid" ]; then stop_pid "$pid"; fi
    done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { printf '\n== %s\n' "$*" >&2; }

# --- build ----------------------------------------------------------------
if [ -n "${LOADGEN:-}" ] && [ -n "${RATELIMITD_BIN:-}" ]; then
    log "using LOADGEN=$LOADGEN and RATELIMITD_BIN=$RATELIMITD_BIN as built"
else
    log "building (cargo build --release; the loadgen of tools/)"
    cargo build --release
    LOADGEN=$(cargo build --release -p ratelimitd-tools --bin loadgen --message-format=json 2>/dev/null |
        grep '"reason":"compiler-artifact"' | grep '"name":"loadgen"' |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
fi
[ -x "$LOADGEN" ] || { echo "run.sh: cannot find the built loadgen" >&2; exit 1; }
DAEMON=${RATELIMITD_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/ratelimitd}
CLK_TCK=$(getconf CLK_TCK)

# --- redis ----------------------------------------------------------------
redis_alive() { # pid redis-cli-args...: is this pid the redis answering there?
    local pid=$1
    shift
    kill -0 "$pid" 2>/dev/null &&
        [ "$(redis-cli "$@" info server 2>/dev/null | tr -d '\r' |
            sed -n 's/^process_id://p')" = "$pid" ]
}
wait_redis() { # pid redis-cli-args...
    local i
    for i in $(seq 50); do
        redis_alive "$@" && return 0
        kill -0 "$1" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

log "starting redis-server on a Unix socket (baseline)"
redis-server --port 0 --unixsocket "$TMP/redis.sock" --unixsocketperm 700 \
    --save "" --appendonly no --dir "$TMP" --logfile "$TMP/redis-unix.log" &
REDIS_UNIX_PID=$!
PIDS+=("$REDIS_UNIX_PID")
wait_redis "$REDIS_UNIX_PID" -s "$TMP/redis.sock" ||
    { echo "run.sh: redis-server (unix) did not start:" >&2; cat "$TMP/redis-unix.log" >&2; exit 1; }

log "starting redis-server on TCP loopback (for the daemon)"
REDIS_TCP_PID=
for attempt in $(seq 20); do
    PORT=$((20000 + RANDOM % 30000))
    redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no \
        --dir "$TMP" --logfile "$TMP/redis-tcp.log" &
    pid=$!
    if wait_redis "$pid" -h 127.0.0.1 -p "$PORT"; then
        REDIS_TCP_PID=$pid
        PIDS+=("$pid")
        break
    fi
    stop_pid "$pid" # port taken: try another
done
[ -n "$REDIS_TCP_PID" ] ||
    { echo "run.sh: could not start redis-server on TCP:" >&2; cat "$TMP/redis-tcp.log" >&2; exit 1; }
RCLI=(redis-cli -h 127.0.0.1 -p "$PORT")
SHA=$("${RCLI[@]}" SCRIPT LOAD "$(cat lua/prelude.lua lua/token_bucket.lua)")
[[ $SHA =~ ^[0-9a-f]{40}$ ]] || { echo "run.sh: SCRIPT LOAD failed: $SHA" >&2; exit 1; }
SEED_SHA=$("${RCLI[@]}" SCRIPT LOAD "$(cat benches/seed_token_bucket.lua)")
[[ $SEED_SHA =~ ^[0-9a-f]{40}$ ]] || { echo "run.sh: SCRIPT LOAD (seed) failed: $SEED_SHA" >&2; exit 1; }
# Keys of the spread scenarios (the issue's "realistic key population").
KEYS_LOCAL_SMALL=100000
KEYS_LOCAL_LARGE=1000000
KEYS_DENIED=1000
KEYS_REDIS=1000000

# --- measuring ------------------------------------------------------------
RESULTS=$TMP/results.tsv # scenario shape rps p50 p99 off cpu note
: >"$RESULTS"
NSTART=0

cpu_ticks() { # pids... -> summed utime+stime of all their threads
    local pid t=0
    for pid in "$@"; do
        t=$((t + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)))
    done
    echo "$t"
}
jnum() { # field json
    sed -n 's/.*"'"$1"'":\([-0-9.]*\).*/\1/p' <<<"$2"
}
jstr() { # field json (first string field, unescaped enough for a table)
    sed -n 's/.*"'"$1"'":"\(\([^"\\]\|\\.\)*\)".*/\1/p' <<<"$2" | sed 's/\\"/"/g; s/|/\\|/g'
}
record() { # scenario shape rps p50 p99 off cpu note ("" is stored as "-")
    local f line=""
    for f in "$@"; do line="$line${line:+$'\t'}${f:--}"; done
    printf '%s\n' "$line" >>"$RESULTS"
}

# measure SCENARIO SHAPE "server pids" loadgen-args... : one loadgen run.
measure() {
    local scen=$1 shape=$2 pids=$3
    shift 3
    wanted "$scen" || return 0
    local c d out json t0 t1 cpu rps note="" secs
    read -r c d <<<"$shape"
    # 1x1 (latency): the client and the server(s) all on CPU 0, as the latency target
    # asks ("client and daemon on the same core"); other shapes use every CPU.
    local pin=()
    if [ "$shape" = "1 1" ]; then
        pin=(taskset -c 0)
        for p in $pids; do taskset -a -p -c 0 "$p" >/dev/null 2>&1 || true; done
    fi
    t0=$(cpu_ticks $pids)
    out=$(${pin[@]+"${pin[@]}"} "$LOADGEN" --conns "$c" --depth "$d" --duration "$DURATION" --warmup "$WARMUP" \
        --threads 1 --n-start "$NSTART" --label "$scen c$c d$d" "$@") || note="loadgen failed"
    t1=$(cpu_ticks $pids)
    if [ "$shape" = "1 1" ]; then
        for p in $pids; do taskset -a -p -c "0-$(($(nproc) - 1))" "$p" >/dev/null 2>&1 || true; done
    fi
    NSTART=$((NSTART + 100000000))
    printf '%s\n' "$out" | grep -v '^{' >&2 || true
    json=$(printf '%s\n' "$out" | grep '^{' | tail -n 1) || true
    if [ -z "$json" ]; then
        record "$scen" "$shape" "" "" "" "" "" "${note:-no output}"
        return
    fi
    secs=$(jnum seconds "$json")
    cpu=$(awk -v t=$((t1 - t0)) -v hz="$CLK_TCK" -v s="$secs" -v w="$WARMUP_S" \
        'BEGIN { if (s + w > 0) printf "%.2f", t / hz / (s + w) }')
    [ "$(jnum io_errors "$json")" = 0 ] || note="${note:+$note; }io: $(jstr first_io_error "$json")"
    if [ "$(jnum errors "$json")" != 0 ]; then
        note="${note:+$note; }first off-path reply: $(jstr first_bad "$json")"
    fi
    record "$scen" "$shape" "$(jnum rps "$json")" "$(jnum p50_us "$json")" \
        "$(jnum p99_us "$json")" "$(jnum errors "$json")" "$cpu" "$note"
}
wanted() { # scenario: is it measured in this run (ONLY)?
    [ -z "${ONLY:-}" ] || [[ $ONLY == *"$1"* ]]
}
skip() { # scenario note: record n/a rows for every shape
    local shape
    for shape in "${SHAPES[@]}"; do record "$1" "$shape" "" "" "" "" "" "$2"; done
}

# Daemon ------------------------------------------------------------------
RLSOCK=$TMP/rl.sock
write_config() { # mode [metrics] -> path
    local mode=$1 cfg=$TMP/ratelimitd-$1${2:-}.toml nodes="" metrics=""
    if [ "$mode" = standalone ]; then nodes="nodes = [\"127.0.0.1:$PORT\"]"; fi
    if [ "${2:-}" = metrics ]; then
        metrics="[metrics]
listen = \"127.0.0.1:$((20000 + RANDOM % 30000))\""
    fi
    cat >"$cfg" <<EOF
[server]
socket = "$RLSOCK"
max_line_bytes = 1024

[redis]
mode = "$mode"
$nodes
timeout_ms = 100
prefix = "rl"

[cache]
ttl_ms = 500
max_entries = 1000000

[fallback]
hosts = 1
# Room for the 10^6-key population of v and the new keys of b after it (b then
# runs at the bound, evicting).
max_keys = 2000000

$metrics

[[rule]]
name = "api"
algorithm = "token_bucket"
capacity = $CAPACITY
refill_rate = $REFILL.0

# Refills so slowly that an exhausted key stays denied for the whole run: a cached
# DENY lives the full cache.ttl_ms.
[[rule]]
name = "hot"
algorithm = "token_bucket"
capacity = $CAPACITY
refill_rate = 0.001

# One request per key, then denied for the whole run (scenario k).
[[rule]]
name = "one"
algorithm = "token_bucket"
capacity = 1
refill_rate = 0.001
EOF
    echo "$cfg"
}
lg_once() { # request expect: one request on one connection
    "$LOADGEN" --socket "$RLSOCK" --conns 1 --depth 1 --warmup 0s --duration 2s \
        --max-requests 1 --request "$1" --expect "$2"
}
start_daemon() { # mode [metrics]; sets DAEMON_PID, returns 1 if it does not come up
    local cfg i
    cfg=$(write_config "$1" "${2:-}")
    rm -f "$RLSOCK"
    "$DAEMON" --config "$cfg" >"$TMP/daemon-$1.log" 2>&1 &
    DAEMON_PID=$!
    for i in $(seq 100); do
        if [ -S "$RLSOCK" ] && lg_once 'PING\n' PONG >/dev/null 2>&1; then
            return 0
        fi
        kill -0 "$DAEMON_PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "run.sh: the daemon (mode $1) did not answer PING on $RLSOCK; its log:" >&2
    tail -n 20 "$TMP/daemon-$1.log" >&2
    stop_pid "$DAEMON_PID"
    DAEMON_PID=
    return 1
}
stop_daemon() {
    if [ -n "$DAEMON_PID" ]; then stop_pid "$DAEMON_PID"; fi
    DAEMON_PID=
}

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

log "a: Redis PING over its Unix socket"
for s in "${SHAPES[@]}"; do
    measure a "$s" "$REDIS_UNIX_PID" --socket "$TMP/redis.sock" --request 'PING\r\n' --expect +PONG
done

log "b: daemon, redis.mode = none (local decisions, a new key per request)"
if start_daemon none; then
    # u, v: keys drawn uniformly from 10^5 / 10^6 (buckets re-used, a realistic
    # population); every key stays far below its limit, so every reply is ALLOW.
    # Each population is touched once first (k0 .. k<N-1>, in order), so the rows
    # measure a daemon holding it, not the map growing to it (that is b's subject).
    preload() { # N: CHECK api k0 .. k<N-1>, once each
        "$LOADGEN" --socket "$RLSOCK" --conns 8 --depth 64 --warmup 0s --duration 30s \
            --max-requests "$1" --request 'CHECK api k{n}\n' >/dev/null || true
    }
    preload "$KEYS_LOCAL_SMALL"
    for s in "${SHAPES[@]}"; do
        measure u "$s" "$DAEMON_PID" --socket "$RLSOCK" --request 'CHECK api k{n}\n' \
            --keys "$KEYS_LOCAL_SMALL" --expect ALLOW --expect-contains ' local'
    done
    preload "$KEYS_LOCAL_LARGE"
    for s in "${SHAPES[@]}"; do
        measure v "$s" "$DAEMON_PID" --socket "$RLSOCK" --request 'CHECK api k{n}\n' \
            --keys "$KEYS_LOCAL_LARGE" --expect ALLOW --expect-contains ' local'
    done
    # g: one exhausted key, decided locally each time (no new bucket per request).
    "$LOADGEN" --socket "$RLSOCK" --conns 1 --depth $((CAPACITY * 2)) --warmup 0s \
        --duration 5s --max-requests $((CAPACITY * 2)) --request 'CHECK hot k\n' >/dev/null || true
    for s in "${SHAPES[@]}"; do
        measure g "$s" "$DAEMON_PID" --socket "$RLSOCK" --request 'CHECK hot k\n' \
            --expect DENY --expect-contains ' local'
    done
    # b last: its new keys fill the map up to fallback.max_keys, then evict.
    for s in "${SHAPES[@]}"; do
        measure b "$s" "$DAEMON_PID" --socket "$RLSOCK" --request 'CHECK api k{n}\n' \
            --expect ALLOW --expect-contains ' local'
    done
    stop_daemon
else
    skip b "daemon did not start"
fi

log "c-d: daemon, redis.mode = standalone (127.0.0.1:$PORT)"
if start_daemon standalone; then
    # c: exhaust one key of the slow rule, then hammer it: DENYs from the deny cache
    # (each cached DENY lives cache.ttl_ms = 500 ms; a dry run in the background then
    # refreshes it, which no request waits for).
    "$LOADGEN" --socket "$RLSOCK" --conns 1 --depth $((CAPACITY * 2)) --warmup 0s \
        --duration 5s --max-requests $((CAPACITY * 2)) --request 'CHECK hot k\n' >/dev/null || true
    if lg_once 'CHECK hot k\n' DENY >/dev/null; then
        for s in "${SHAPES[@]}"; do
            measure c "$s" "$DAEMON_PID $REDIS_TCP_PID" --socket "$RLSOCK" \
                --request 'CHECK hot k\n' --expect DENY --expect-contains ' cache'
        done
    else
        skip c "could not exhaust the key: $(lg_once 'CHECK hot k\n' DENY | head -n 1)"
    fi
    # k: 10^3 keys of a capacity-1 rule, each drawn ~20 times first (one ALLOW, then
    # DENYs), then hammered: DENYs from the deny cache (an entry lives
    # cache.ttl_ms = 500 ms, then one request of that key goes to Redis: off-path).
    "$LOADGEN" --socket "$RLSOCK" --conns 8 --depth 64 --warmup 0s --duration 20s \
        --max-requests $((KEYS_DENIED * 20)) --keys "$KEYS_DENIED" \
        --request 'CHECK one k{n}\n' >/dev/null || true
    for s in "${SHAPES[@]}"; do
        measure k "$s" "$DAEMON_PID $REDIS_TCP_PID" --socket "$RLSOCK" \
            --request 'CHECK one k{n}\n' --keys "$KEYS_DENIED" --expect DENY \
            --expect-contains ' cache'
    done
    # d: keys uniform over 10^6 -> a Redis decision per request (all ALLOW), sent in batches.
    for s in "${SHAPES[@]}"; do
        measure d "$s" "$DAEMON_PID $REDIS_TCP_PID" --socket "$RLSOCK" \
            --request 'CHECK api k{n}\n' --keys "$KEYS_REDIS" --expect ALLOW \
            --expect-contains ' redis'
    done
    stop_daemon
else
    skip c "daemon did not start"
    skip d "daemon did not start"
fi

log "h, i: the g and c paths again with [metrics] listen set (metrics overhead)"
METRIC_SHAPES=("50 1" "50 16")
if start_daemon none metrics; then
    "$LOADGEN" --socket "$RLSOCK" --conns 1 --depth $((CAPACITY * 2)) --warmup 0s \
        --duration 5s --max-requests $((CAPACITY * 2)) --request 'CHECK hot k\n' >/dev/null || true
    for s in "${METRIC_SHAPES[@]}"; do
        measure h "$s" "$DAEMON_PID" --socket "$RLSOCK" --request 'CHECK hot k\n' \
            --expect DENY --expect-contains ' local'
    done
    stop_daemon
else
    skip h "daemon did not start"
fi
if start_daemon standalone metrics; then
    "$LOADGEN" --socket "$RLSOCK" --conns 1 --depth $((CAPACITY * 2)) --warmup 0s \
        --duration 5s --max-requests $((CAPACITY * 2)) --request 'CHECK hot k2\n' >/dev/null || true
    for s in "${METRIC_SHAPES[@]}"; do
        measure i "$s" "$DAEMON_PID $REDIS_TCP_PID" --socket "$RLSOCK" \
            --request 'CHECK hot k2\n' --expect DENY --expect-contains ' cache'
    done
    stop_daemon
else
    skip i "daemon did not start"
fi

# resp ARGS...: a RESP command (what Redis clients, the daemon's included, send)
# as a loadgen template; `{n}` in an argument counts as N_WIDTH digits.
N_WIDTH=12
resp() {
    local a len out="*$#\\r\\n"
    for a in "$@"; do
        len=${#a}
        if [[ $a == *"{n}"* ]]; then len=$((len - 3 + N_WIDTH)); fi
        out+="\$$len\\r\\n$a\\r\\n"
    done
    printf '%s' "$out"
}

log "e: EVALSHA straight to Redis over TCP (loadgen, RESP, a new key per request)"
# shellcheck disable=SC2086 # LUA_ARGV is three words
EVALSHA_RESP=$(resp EVALSHA "$SHA" 1 'rl:{api:e{n}}' $LUA_ARGV)
for s in "${SHAPES[@]}"; do
    measure e "$s" "$REDIS_TCP_PID" --tcp "127.0.0.1:$PORT" --request "$EVALSHA_RESP" \
        --n-width "$N_WIDTH" --keys "$KEYS_REDIS" --reply-lines 5 --expect '*4'
done

# rbench SCENARIO SHA: redis-benchmark -r 1000000 EVALSHA of that script, each shape.
rbench() {
    local scen=$1 sha=$2 s c d rps n t0 t1 pin out line
    wanted "$scen" || return 0
    for s in "${SHAPES[@]}"; do
        read -r c d <<<"$s"
        # As many requests as loadgen managed in the same time in e.
        rps=$(awk -F'\t' -v s="$s" '$1 == "e" && $2 == s && $3 != "-" { print $3 }' "$RESULTS")
        n=$(awk -v r="${rps:-20000}" -v s="$DURATION_S" 'BEGIN { n = int(r * s); print (n < 10000 ? 10000 : n) }')
        t0=$(cpu_ticks "$REDIS_TCP_PID")
        pin=()
        if [ "$s" = "1 1" ]; then
            pin=(taskset -c 0)
            taskset -a -p -c 0 "$REDIS_TCP_PID" >/dev/null 2>&1 || true
        fi
        # shellcheck disable=SC2086 # LUA_ARGV is three words
        out=$(${pin[@]+"${pin[@]}"} redis-benchmark -h 127.0.0.1 -p "$PORT" -c "$c" -P "$d" -n "$n" -r "$KEYS_REDIS" --csv \
            EVALSHA "$sha" 1 "rl:{$scen:__rand_int__}" $LUA_ARGV 2>&1) || true
        t1=$(cpu_ticks "$REDIS_TCP_PID")
        taskset -a -p -c "0-$(($(nproc) - 1))" "$REDIS_TCP_PID" >/dev/null 2>&1 || true
        # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
        line=$(printf '%s\n' "$out" | tr -d '\r' | grep -v '^"test"' | grep '^"' | tail -n 1) || true
        if [ -z "$line" ]; then
            record "$scen" "$s" "" "" "" "" "" "redis-benchmark: $(printf '%s' "$out" | tail -n 1)"
            continue
        fi
        echo "$scen c$c d$d: $line" >&2
        printf '%s\n' "$line" | awk -v scen="$scen" -v s="$s" -v t=$((t1 - t0)) -v hz="$CLK_TCK" -v n="$n" '{
            gsub(/"/, "", $0); split($0, x, ","); k = length(x)
            rps = x[k - 6]; p50 = x[k - 3] * 1000; p99 = x[k - 1] * 1000
            printf "%s\t%s\t%s\t%.1f\t%.1f\t-\t%.2f\tredis-benchmark -n %d; latency per request\n",
                scen, s, rps, p50, p99, (rps > 0 ? t / hz / (n / rps) : 0), n
        }' >>"$RESULTS"
    done
}

log "f: our EVALSHA straight to Redis over TCP (redis-benchmark)"
rbench f "$SHA"
log "s: the seeds' plain token bucket, EVALSHA straight to Redis (redis-benchmark)"
rbench s "$SEED_SHA"

# --- report ---------------------------------------------------------------
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
CPU_MODEL=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
REDIS_VERSION=$(redis-server --version)
GIT_REV=$(git rev-parse --short HEAD 2>/dev/null || echo "uncommitted")

describe() {
    case $1 in
        a) echo "Redis PING (unix socket)" ;;
        b) echo "daemon, mode none: \`CHECK api k<n>\`, a new key each" ;;
        u) echo "daemon, mode none: \`CHECK api k<n>\`, 10^5 keys" ;;
        v) echo "daemon, mode none: \`CHECK api k<n>\`, 10^6 keys" ;;
        k) echo "daemon, deny cache: \`CHECK one k<n>\`, 10^3 denied keys" ;;
        s) echo "seeds' token bucket EVALSHA direct (redis-benchmark)" ;;
        c) echo "daemon, deny cache: \`CHECK hot k\` (exhausted)" ;;
        g) echo "daemon, mode none: \`CHECK hot k\` (exhausted)" ;;
        d) echo "daemon, standalone: \`CHECK api k<n>\`, 10^6 keys (Redis-decided, batched)" ;;
        e) echo "Redis EVALSHA direct (TCP, loadgen)" ;;
        f) echo "Redis EVALSHA direct (TCP, redis-benchmark)" ;;
        h) echo "g with metrics on" ;;
        i) echo "c with metrics on" ;;
    esac
}
baseline() { # scenario -> the scenario it is compared with
    case $1 in b | c | g | u | v | k) echo a ;; d) echo e ;; h) echo g ;; i) echo c ;; *) echo "" ;; esac
}

{
    echo "# ratelimitd benchmark results"
    echo
    echo "Generated by \`bash benches/run.sh$(if [ "$QUICK" = 1 ]; then echo " --quick"; fi)\`; do not edit by hand."
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "- commit: $GIT_REV"
    echo "- nproc: $(nproc); CPU: $CPU_MODEL"
    echo "- $REDIS_VERSION"
    echo "- $(rustc --version)"
    echo "- each measurement: ${WARMUP} warm-up, then ${DURATION}; loadgen closed loop, 1 tokio thread"
    echo "- load average before / after: $LOAD_BEFORE / $LOAD_AFTER"
    echo
    echo "Shapes: \`conns x depth\`: each connection writes \`depth\` requests at once, then waits for"
    echo "all the replies (closed loop). Latency is per batch (write to last reply), in µs."
    echo "\"vs\" is rps ÷ the baseline's rps for the same shape: b, u, v, g, c and k against a, d against e, f and s,"
    echo "h (metrics on) against g and i (metrics on) against c."
    echo "\"off-path\" counts replies that did not take the path under test (b: not \`ALLOW … local\`;"
    echo "c, k: not \`DENY … cache\`: a cached DENY is refreshed in the background every cache.ttl_ms ="
    echo "500 ms, so only a key not asked for past its ttl and grace goes to Redis; g: not"
    echo "\`DENY … local\`; d: not \`ALLOW … redis\`)."
    echo "CPU is the server processes' CPU time ÷ wall time (cores): a, b, u, v, g: the server; c, k, d: daemon + Redis; e, f, s: Redis."
    echo
    echo "| scenario | shape | rps | vs | p50 µs | p99 µs | off-path | CPU | note |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---|"
    while IFS=$'\t' read -r scen shape rps p50 p99 off cpu note; do
        for v in rps p50 p99 off cpu note; do if [ "${!v}" = - ]; then printf -v "$v" '%s' ""; fi; done
        read -r c d <<<"$shape"
        if [ -n "$off" ] && [ "$off" != 0 ] && [ -n "$rps" ]; then
            off=$(awk -v o="$off" -v r="$rps" -v s="$DURATION_S" \
                'BEGIN { printf "%d (%.2f%%)", o, (r * s > 0 ? 100 * o / (r * s) : 0) }')
        fi
        base=$(baseline "$scen")
        ratio=""
        if [ -n "$base" ] && [ -n "$rps" ]; then
            brps=$(awk -F'\t' -v b="$base" -v s="$shape" '$1 == b && $2 == s && $3 != "-" { print $3 }' "$RESULTS")
            if [ -n "$brps" ]; then
                ratio=$(awk -v a="$rps" -v b="$brps" -v n="$base" \
                    'BEGIN { if (b > 0) printf "%.2f × %s", a / b, n }')
            fi
            frps=$(awk -F'\t' -v s="$shape" '$1 == "f" && $2 == s && $3 != "-" { print $3 }' "$RESULTS")
            if [ "$scen" = d ] && [ -n "$frps" ]; then
                ratio="$ratio, $(awk -v a="$rps" -v b="$frps" 'BEGIN { if (b > 0) printf "%.2f × f", a / b }')"
            fi
            srps=$(awk -F'\t' -v s="$shape" '$1 == "s" && $2 == s && $3 != "-" { print $3 }' "$RESULTS")
            if [ "$scen" = d ] && [ -n "$srps" ]; then
                ratio="$ratio, $(awk -v a="$rps" -v b="$srps" 'BEGIN { if (b > 0) printf "%.2f × s", a / b }')"
            fi
        fi
        if [ -n "$rps" ]; then rps=$(awk -v r="$rps" 'BEGIN { printf "%.0f", r }'); fi
        printf '| %s %s | %s×%s | %s | %s | %s | %s | %s | %s | %s |\n' \
            "$scen" "$(describe "$scen")" "$c" "$d" "${rps:-n/a}" "$ratio" "$p50" "$p99" "$off" "$cpu" "$note"
    done <"$RESULTS"
    echo
    echo "Two cores: the client, Redis and the daemon share them, so rows that run all three"
    echo "(c, d) compete for CPU; compare rows of one run, not figures across machines."
    echo "The 1×1 rows are one round trip at a time, with the client and the server(s) pinned to"
    echo "CPU 0 (taskset), as the latency target asks; on a VM they still include vCPU wake-ups"
    echo "(tens of µs), for the baseline as much as for the daemon."
} >"$TMP/report.md"

mkdir -p "$(dirname "$OUT")"
cp "$TMP/report.md" "$OUT"
echo
cat "$OUT"
echo
echo "written to $OUT"
