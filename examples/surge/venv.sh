#!/usr/bin/env bash
# Makes (once) the virtualenv the surge experiment runs in, and prints its path.
# $SURGE_VENV, default ~/.cache/ratelimitd-surge/venv (outside the checkout, so fresh
# clones and CI runs on the same machine reuse it); remade when requirements.txt
# changes. Packages come from PyPI through pip as configured.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
VENV="${SURGE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ratelimitd-surge/venv}"
REQ="$HERE/requirements.txt"
if [ ! -x "$VENV/bin/locust" ] || ! cmp -s "$REQ" "$VENV/.requirements"; then
  echo "surge: installing locust, uvicorn and matplotlib into $VENV (once)" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQ" >&2
  cp "$REQ" "$VENV/.requirements"
fi
echo "$VENV"
