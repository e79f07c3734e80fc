#!/usr/bin/env bash
# The dashboard and the rule lab in a real browser: Debian's chromium and
# chromium-driver (tests/run.sh installs them), selenium from PyPI in a venv
# (tests/venv.sh; $BROWSER_VENV, default ~/.cache/ratelimitd-browser/venv), a real
# redis-server and the ratelimitd binary cargo built ($RATELIMITD_BIN, default
# <target dir>/debug/ratelimitd). Screenshots go to <target dir>/browser/ (CI
# artefacts). When the browser cannot run here, says why and counts it as skipped,
# never as passed. Prints `browser: N passed, M failed[, K skipped]` last.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
BIN="${RATELIMITD_BIN:-$TARGET/debug/ratelimitd}"
skip() {
  echo "SKIP browser: $1"
  echo "browser: 0 passed, 0 failed, 1 skipped"
  exit 0
}
[ -x "$BIN" ] || { echo "browser: no ratelimitd binary at $BIN (cargo build first)"; echo "browser: 0 passed, 1 failed"; exit 1; }
command -v redis-server >/dev/null || skip "redis-server not found"
command -v chromium >/dev/null || skip "chromium not found (apt-get install chromium chromium-driver)"
command -v chromedriver >/dev/null || skip "chromedriver not found (apt-get install chromium-driver)"
version="$(chromium --headless=new --no-sandbox --disable-gpu --version 2>&1)" || skip "chromium does not run here: $version"
# (Debian's wrapper script may print a shell warning before the version.)
version="$(printf '%s\n' "$version" | tail -n 1)"
VENV=$(bash "$HERE/../venv.sh" "$HERE/requirements.txt" \
  "${BROWSER_VENV:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/ratelimitd-browser/venv}" browser) ||
  skip "could not install selenium from PyPI (pip output above)"
echo "browser: using $version, $(chromedriver --version | cut -d' ' -f1-2)"
exec "$VENV/bin/python" "$HERE/pages.py" --daemon "$BIN" --out "$TARGET/browser"
