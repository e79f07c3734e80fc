#!/usr/bin/env bash
# The Kubernetes manifests (deploy/kubernetes/): validated against the schemas of a
# pinned Kubernetes version (kubernetes-validate from PyPI, in a venv: tests/venv.sh),
# then checked for what they promise (check.py): the socket directory shared with the
# application pods, PING probes, the config from the ConfigMap and the Redis password
# from the Secret, Redis with maxmemory and noeviction and no persistence; and the
# ConfigMap's own files run for real: the Redis config under redis-server, the daemon's
# config under the ratelimitd binary cargo built ($RATELIMITD_BIN, default
# <target dir>/debug/ratelimitd), and the probe's command against that daemon.
# Says why it skips what the machine lacks; prints `kubernetes: N passed, M failed[, K
# skipped]` last.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${RATELIMITD_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/ratelimitd}"
# The Kubernetes version whose API schemas the manifests must satisfy.
K8S_VERSION=1.33.0
VENV_DIR="${KUBERNETES_VENV:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/ratelimitd-kubernetes/venv}"
if ! VENV=$(bash "$ROOT/tests/venv.sh" "$HERE/requirements.txt" "$VENV_DIR" kubernetes); then
  echo "SKIP kubernetes: could not install kubernetes-validate from PyPI (pip output above)"
  echo "kubernetes: 0 passed, 0 failed, 1 skipped"
  exit 0
fi
exec "$VENV/bin/python" "$HERE/check.py" --root "$ROOT" --daemon "$BIN" \
  --validator "$VENV/bin/kubernetes-validate" --kubernetes-version "$K8S_VERSION"
