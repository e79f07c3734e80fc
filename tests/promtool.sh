#!/usr/bin/env bash
# The Prometheus alert rules (conf/prometheus/ratelimitd-rules.yml): `promtool check
# rules`, then `promtool test rules` on conf/prometheus/ratelimitd-rules.test.yml (each
# alert firing and not firing on synthetic series). promtool is Debian's `prometheus`
# package (tests/run.sh installs it). Without promtool it says so and counts a skip,
# never a pass. Prints `promtool: N passed, M failed[, K skipped]` last.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DIR=$ROOT/conf/prometheus
if ! command -v promtool >/dev/null 2>&1; then
  echo "SKIP promtool: promtool not found (Debian: apt-get install prometheus)"
  echo "promtool: 0 passed, 0 failed, 2 skipped"
  exit 0
fi
echo "promtool: using $(promtool --version 2>&1 | head -n1)"
passed=0 failed=0
step() {
  if "$@"; then passed=$((passed + 1)); else echo "promtool: FAILED: $*"; failed=$((failed + 1)); fi
}
step promtool check rules "$DIR/ratelimitd-rules.yml"
# Rule files in a test file are relative to it.
step bash -c 'cd "$1" && promtool test rules ratelimitd-rules.test.yml' _ "$DIR"
echo "promtool: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
