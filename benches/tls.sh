#!/usr/bin/env bash
# The cost of TLS to Redis: Redis-bound decisions per second through the daemon over
# TLS, divided by the same over plain TCP, measured in one run against one
# redis-server that listens on both (a plain port and a TLS port), with the same load
# generator (tools/src/bin/loadgen/) and the same daemon binary.
#
#   bash benches/tls.sh [--rounds N] [--duration 3s]
#
# Each round measures plain then TLS, for 50 connections x pipeline 1 and 50 x 16,
# a new key per request (one EVALSHA each); the ratio reported is the median over
# rounds of TLS ÷ plain within the round, so load from elsewhere falls on both alike.
# The test CA and certificate are made with openssl in a temp dir. Everything started
# here is stopped by pid on exit.
set -euo pipefail

ROUNDS=3
DURATION=3s
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) ROUNDS=$2; shift ;;
        --duration) DURATION=$2; shift ;;
        -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) echo "tls.sh: unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
cd "$(dirname "$0")/.."
for tool in redis-server redis-cli openssl cargo python3; do
    command -v "$tool" >/dev/null || { echo "tls.sh: $tool not found" >&2; exit 1; }
done

TMP=$(mktemp -d "${TMPDIR:-/tmp}/rl-tls-bench-XXXXXX")
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT
log() { printf 'tls.sh: %s\n' "$*" >&2; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

log "building the daemon and the load generator (release)"
cargo build --release --quiet --bin ratelimitd
BIN=${CARGO_TARGET_DIR:-target}/release/ratelimitd
LOADGEN=$(cargo build --release -p ratelimitd-tools --bin loadgen --message-format=json 2>/dev/null |
    grep '"reason":"compiler-artifact"' | grep '"name":"loadgen"' |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
[ -x "$LOADGEN" ] || { echo "tls.sh: cannot find the built loadgen" >&2; exit 1; }

cd "$TMP"
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=bench ca" -keyout ca.key -out ca.crt 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=redis" -keyout srv.key -out srv.csr 2>/dev/null
echo "subjectAltName=IP:127.0.0.1" >srv.ext
openssl x509 -req -in srv.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 -extfile srv.ext -out srv.crt 2>/dev/null
PORT=$(free_port)
TLS_PORT=$(free_port)
redis-server --port "$PORT" --tls-port "$TLS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --tls-cert-file srv.crt --tls-key-file srv.key --tls-ca-cert-file ca.crt --tls-auth-clients no \
    --logfile "$TMP/redis.log" &
PIDS+=($!)
for _ in $(seq 50); do redis-cli -p "$PORT" PING 2>/dev/null | grep -q PONG && break; sleep 0.1; done

rules='[[rule]]
name = "api"
algorithm = "token_bucket"
capacity = 100
refill_rate = 10.0'
for kind in plain tls; do
    if [ "$kind" = plain ]; then
        extra="nodes = [\"127.0.0.1:$PORT\"]"
    else
        extra="nodes = [\"127.0.0.1:$TLS_PORT\"]
tls = true
tls_ca_file = \"$TMP/ca.crt\""
    fi
    cat >"$kind.toml" <<EOF
[server]
socket = "$TMP/$kind.sock"
socket_mode = "0600"
[redis]
mode = "standalone"
$extra
timeout_ms = 1000
[cache]
ttl_ms = 0
$rules
EOF
    RUST_LOG=warn "$OLDPWD/$BIN" --config "$kind.toml" >"$kind.log" 2>&1 &
    PIDS+=($!)
done
for kind in plain tls; do
    for _ in $(seq 100); do [ -S "$TMP/$kind.sock" ] && break; sleep 0.1; done
done
sleep 1

N=0
rate() { # socket conns depth -> requests/s
    N=$((N + 100000000))
    "$LOADGEN" --socket "$1" --conns "$2" --depth "$3" --duration "$DURATION" --warmup 500ms \
        --threads 1 --n-start "$N" --request 'CHECK api k{n}\n' --expect ALLOW --label x |
        grep '^{' | tail -n 1 | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("rps") or d.get("requests_per_s") or d["ops_per_s"])'
}
printf '| shape | plain TCP decisions/s | TLS decisions/s | TLS ÷ plain |\n|---|---|---|---|\n'
for shape in "50 1" "50 16"; do
    read -r c d <<<"$shape"
    ratios=()
    plains=()
    tlss=()
    for _ in $(seq "$ROUNDS"); do
        p=$(rate "$TMP/plain.sock" "$c" "$d")
        t=$(rate "$TMP/tls.sock" "$c" "$d")
        plains+=("$p")
        tlss+=("$t")
        ratios+=("$(python3 -c "print($t / $p)")")
    done
    med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
    printf '| %sx%s | %.0f | %.0f | %.2f |\n' "$c" "$d" "$(med "${plains[@]}")" "$(med "${tlss[@]}")" "$(med "${ratios[@]}")"
done
grep -h "source = local\|WARN\|ERROR" "$TMP"/plain.log "$TMP"/tls.log | head -5 >&2 || true
