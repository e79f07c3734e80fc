#!/usr/bin/env bash
# Run every test: `bash tests/run.sh [extra cargo test args...]`
#
# Needs only the Rust toolchain and a Debian/Ubuntu system: redis-server,
# redis-cli and socat (and go and php, for the client libraries' tests in
# clients/) are installed with apt-get if missing. The tests start
# their own Redis servers on free ports in temp dirs; a system redis-server
# (e.g. one started by the package install on 6379) is neither used nor stopped.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf 'tests/run.sh: %s\n' "$*" >&2; }

missing_pkgs=()
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  missing_pkgs+=(redis-server redis-tools)
fi
if ! command -v socat >/dev/null 2>&1; then
  missing_pkgs+=(socat)
fi
# For the client libraries' tests (clients/run_tests.sh).
if ! command -v go >/dev/null 2>&1; then
  missing_pkgs+=(golang-go)
fi
if ! command -v php >/dev/null 2>&1; then
  missing_pkgs+=(php-cli)
fi

if ((${#missing_pkgs[@]})); then
  log "missing tools; installing Debian packages: ${missing_pkgs[*]}"
  if ! command -v apt-get >/dev/null 2>&1; then
    log "apt-get not found: install ${missing_pkgs[*]} (redis-server, redis-cli >= 7, socat) yourself"
    exit 1
  fi
  if [ "$(id -u)" -eq 0 ]; then
    as_root=()
  elif command -v sudo >/dev/null 2>&1; then
    # Prompt for a password only when someone can answer it.
    if [ -t 0 ]; then as_root=(sudo); else as_root=(sudo -n); fi
  else
    log "not root and sudo not found: install ${missing_pkgs[*]} as root first"
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  ${as_root[@]+"${as_root[@]}"} apt-get update
  # The package's post-install may try to start a system redis-server; if
  # that fails (no init system, port 6379 taken) apt reports an error although
  # the binaries are installed. Judge by the binaries, checked just below.
  ${as_root[@]+"${as_root[@]}"} apt-get install -y --no-install-recommends "${missing_pkgs[@]}" ||
    log "apt-get install reported an error; checking the binaries anyway"
fi

for tool in redis-server redis-cli socat; do
  command -v "$tool" >/dev/null 2>&1 || { log "$tool is still missing after install"; exit 1; }
done
log "using $(redis-server --version | head -n1)"

# Unit, property and integration tests (tests/*.rs start their own Redis
# servers). The output is kept to print one total at the end.
out=$(mktemp)
trap 'rm -f "$out"' EXIT
cargo test --all-targets "$@" 2>&1 | tee "$out"
totals=$(awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
              END { printf "%d %d", p, f }' "$out")
read -r passed failed <<<"$totals"

# Client libraries (clients/: Python, Node.js, Go, PHP, shell), each against a real
# daemon; counted into the total, and a failure fails this script.
clients_rc=0
bash clients/run_tests.sh 2>&1 | tee "$out" || clients_rc=1
read -r cp cf < <(sed -n 's/^clients: \([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$out") || true
passed=$((passed + ${cp:-0}))
failed=$((failed + ${cf:-1}))

# ---------------------------------------------------------------------------
# CHAOS SUITE HOOK: the chaos/ suite (Redis failures: kill, freeze, failover,
# script-cache flush, OOM...) will be called from here, after the tests above
# pass. Replace this comment with its entry point, e.g.:
#   bash chaos/run.sh
# ---------------------------------------------------------------------------

echo "ratelimitd: $passed passed, $failed failed"
[ "$clients_rc" = 0 ]
