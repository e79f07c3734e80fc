#!/usr/bin/env bash
# Prints the path of a Go toolchain new enough for the Go client (its go.mod says
# go 1.21), or exits 1. Looks at $GO, then `go` on PATH, then Debian's versioned
# toolchains (/usr/lib/go-1.NN/bin/go, newest first: Debian 12's golang-go is 1.19,
# its backports ship golang-1.22-go and golang-1.23-go). Used by tests/run.sh (to
# decide what to install) and clients/run_tests.sh (to pick the one to run).
set -uo pipefail

go_ok() { # path: true if it runs and is at least go1.21
  local v
  v=$("$1" env GOVERSION 2>/dev/null) || return 1
  v=${v#go}
  local major=${v%%.*} rest=${v#*.}
  local minor=${rest%%[!0-9]*}
  [ -n "$major" ] && [ -n "$minor" ] || return 1
  [ "$major" -gt 1 ] || { [ "$major" -eq 1 ] && [ "$minor" -ge 21 ]; }
}

for g in ${GO:-} "$(command -v go 2>/dev/null)" $(ls -d /usr/lib/go-1.*/bin/go 2>/dev/null | sort -t. -k2,2nr); do
  [ -n "$g" ] && [ -x "$g" ] && GOTOOLCHAIN=local go_ok "$g" && { echo "$g"; exit 0; }
done
exit 1
