#!/usr/bin/env bash
# Installs the Python client the way its users do (pip into a fresh venv, with the
# test extras: starlette, httpx, flask, mypy), checks the installed package's type
# hints with mypy --strict, and runs its tests against a real daemon.
# Needs RATELIMITD_BIN; RL_TEST_ROOT (temp root, default a new temp dir) holds the
# venv; PYTHON picks the interpreter (default python3). pip's own cache makes
# repeated runs fast. Prints unittest's summary.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=${RL_TEST_ROOT:-$(mktemp -d)}
venv=$root/py-venv
[ -n "${HOME:-}" ] || export PIP_CACHE_DIR=$root/pip-cache
rm -rf "$venv"
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "$here/..[test]"
cd "$here"
"$venv/bin/python" -m mypy --strict --no-incremental -p ratelimitd
RL_REQUIRE_INSTALLED=1 RL_CLIENTS_DIR=$(cd "$here/../.." && pwd) "$venv/bin/python" -m unittest discover -v -p 'test_*.py' 2>&1
