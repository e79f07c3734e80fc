#!/usr/bin/env bash
# Run the chaos suite (chaos/chaos.rs; see chaos/README.md):
#
#   bash chaos/run.sh [FILTER...]     e.g. bash chaos/run.sh s3_freeze
#
# Builds the daemon and the suite with the release profile (CHAOS_PROFILE=dev for a
# debug build), runs every scenario (or those whose name contains FILTER) one at a
# time, writes $CHAOS_REPORT_DIR/report.json (default target/chaos/report.json) and
# prints the summary table, then `chaos: N passed, M failed`. Exits non-zero if a
# scenario failed. Needs redis-server and redis-cli >= 7 (tests/run.sh installs them);
# RATELIMITD_TEST_SERVER=valkey runs it against valkey-server and valkey-cli instead
# (tests/common/process.rs; REDIS_SERVER / REDIS_CLI name other binaries).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

report_dir=${CHAOS_REPORT_DIR:-target/chaos}
mkdir -p "$report_dir"
report_dir=$(cd "$report_dir" && pwd)
export CHAOS_REPORT_DIR=$report_dir
rm -f "$report_dir"/*.json "$report_dir"/*.row "$report_dir"/header.txt

profile=(--release)
if [ "${CHAOS_PROFILE:-release}" = dev ]; then profile=(); fi

# The server the scenarios start, as tests/common/process.rs picks it.
server=${REDIS_SERVER:-${RATELIMITD_TEST_SERVER:-redis}-server}
server_version=$("$server" --version 2>&1 | head -n1) || true
echo "chaos: using ${server_version:-$server (not found)}"

log=$report_dir/cargo-test.log
status=0
start=$(date +%s)
cargo test "${profile[@]}" --test chaos -- --ignored --test-threads=1 "$@" 2>&1 | tee "$log" || status=$?
elapsed=$(($(date +%s) - start))

# Counts from libtest's own summary line.
read -r passed failed < <(awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
                                END { printf "%d %d\n", p, f }' "$log")
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
  failed=1 # did not build, or crashed before its summary
fi

# report.json: every scenario's report, in name order.
{
  printf '{\n"passed": %d,\n"failed": %d,\n"elapsed_s": %d,\n"scenarios": [\n' "$passed" "$failed" "$elapsed"
  first=1
  for f in "$report_dir"/s*.json; do
    [ -e "$f" ] || continue
    if [ "$first" -eq 0 ]; then printf ',\n'; fi
    first=0
    cat "$f"
  done
  printf ']\n}\n'
} >"$report_dir/report.json"

echo
echo "chaos suite summary (${elapsed}s; $server_version; report: $report_dir/report.json)"
if [ -e "$report_dir/header.txt" ]; then
  cat "$report_dir/header.txt" "$report_dir"/s*.row 2>/dev/null || true
fi
# A scenario that failed before writing its report (e.g. its cluster did not start).
# (Tests are named <family>::<scenario>, e.g. outages::s1_failover.)
for name in $(sed -n 's/^test \([a-z_]*::\)\{0,1\}\(s[0-9][a-z0-9_]*\) \.\.\. FAILED$/\2/p' "$log"); do
  [ -e "$report_dir/$name.row" ] || echo "$name: FAILED before writing its report (see $log)"
done
echo "chaos: $passed passed, $failed failed"
exit "$status"
