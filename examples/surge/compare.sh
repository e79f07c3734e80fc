#!/usr/bin/env bash
# The experiment end to end: the same surge without and with the limiter (and, with
# --redis-killed, a third run whose Redis dies for the middle third), then one report
# and one plot of all of them.
#
#   examples/surge/compare.sh [--out DIR] [--redis-killed] [run.sh options...]
#   -> DIR/off/, DIR/on/ [, DIR/redis-killed/] (each as run.sh writes it),
#      DIR/report.md and DIR/latency.png (default DIR: examples/surge/results/latest)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="$HERE/results/latest" MODES="off on" ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --redis-killed) MODES="off on redis-killed"; shift ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
mkdir -p "$OUT"; OUT="$(cd "$OUT" && pwd)"
DIRS=()
for mode in $MODES; do
  "$HERE/run.sh" --mode "$mode" --out "$OUT/$mode" ${ARGS[@]+"${ARGS[@]}"}
  DIRS+=("$OUT/$mode")
done
VENV="$("$HERE/venv.sh")"
(cd "$HERE" && "$VENV/bin/python" report.py compare "$OUT" "${DIRS[@]}" \
  && "$VENV/bin/python" plot.py "$OUT/latency.png" "${DIRS[@]}")
sed -n '3,11p' "$OUT/report.md"
