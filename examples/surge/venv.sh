#!/usr/bin/env bash
# Makes (once) the virtualenv the surge experiment runs in, and prints its path.
# $SURGE_VENV, default examples/surge/.venv (ignored by git); remade when the
# requirements file changes. Packages come from PyPI through pip as configured.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
VENV="${SURGE_VENV:-$HERE/.venv}"
REQ="$HERE/requirements.txt"
if [ ! -x "$VENV/bin/locust" ] || ! cmp -s "$REQ" "$VENV/.requirements"; then
  echo "surge: installing locust, uvicorn and matplotlib into $VENV (once)" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQ" >&2
  cp "$REQ" "$VENV/.requirements"
fi
echo "$VENV"
