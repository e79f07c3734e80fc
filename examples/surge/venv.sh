#!/usr/bin/env bash
# Makes (once) the virtualenv the surge experiment runs in, and prints its path.
# $SURGE_VENV, default ~/.cache/ratelimitd-surge/venv (outside the checkout, so fresh
# clones and CI runs on the same machine reuse it); remade when requirements.txt
# changes. Packages come from PyPI through pip as configured.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
VENV="${SURGE_VENV:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/ratelimitd-surge/venv}"
REQ="$HERE/requirements.txt"
if [ ! -x "$VENV/bin/locust" ] || ! cmp -s "$REQ" "$VENV/.requirements"; then
  echo "surge: installing locust, uvicorn and matplotlib into $VENV (once)" >&2
  rm -rf "$VENV"
  if ! python3 -m venv "$VENV" >&2; then
    # Debian's python3 ships venv separately.
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || exit 1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >&2
    rm -rf "$VENV"; python3 -m venv "$VENV" >&2
  fi
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQ" >&2
  cp "$REQ" "$VENV/.requirements"
fi
echo "$VENV"
