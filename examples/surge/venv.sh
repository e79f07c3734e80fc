#!/usr/bin/env bash
# Makes (once) the virtualenv the surge experiment runs in (locust, uvicorn, matplotlib
# from requirements.txt), and prints its path. $SURGE_VENV, default
# ~/.cache/ratelimitd-surge/venv; tests/venv.sh does the work.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
exec bash "$HERE/../../tests/venv.sh" "$HERE/requirements.txt" \
  "${SURGE_VENV:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/ratelimitd-surge/venv}" surge
