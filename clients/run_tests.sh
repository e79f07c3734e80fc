#!/usr/bin/env bash
# Runs every client's tests (Python, Node.js, Go, PHP, Java, shell) against a real daemon:
#   bash clients/run_tests.sh                 every language
#   bash clients/run_tests.sh go php          only these (python node go php java shell)
# Builds the daemon (cargo build, unless RATELIMITD_BIN points to one), then each
# language's suite starts its own daemons through clients/testdaemon.sh in one temp
# root; every daemon left there is killed by pid at the end. Needs python3, node, Go >= 1.21,
# php, composer, javac + Debian's jakarta-servlet-api and junit5 jars, socat
# (tests/run.sh installs the missing ones). Prints
# "clients: N passed, M failed" last; exit status 1 if anything failed or is missing.
set -uo pipefail

langs=("$@")
for l in "${langs[@]}"; do
  case $l in
    python | node | go | php | java | shell) ;;
    *) echo "clients/run_tests.sh: unknown language '$l' (python node go php java shell)" >&2; exit 2 ;;
  esac
done
# selected LANG: true when LANG's suite is to run (all of them without arguments).
selected() {
  [ "${#langs[@]}" = 0 ] && return 0
  local l
  for l in "${langs[@]}"; do [ "$l" = "$1" ] && return 0; done
  return 1
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here/.."

if [ -z "${RATELIMITD_BIN:-}" ]; then
  cargo build --quiet --bin ratelimitd || { echo "clients: 0 passed, 1 failed (daemon build)"; exit 1; }
  RATELIMITD_BIN=$PWD/${CARGO_TARGET_DIR:-target}/debug/ratelimitd
fi
export RATELIMITD_BIN
RL_TEST_ROOT=$(mktemp -d "${TMPDIR:-/tmp}/rl-clients-XXXXXX")
export RL_TEST_ROOT
cleanup() {
  local f pid
  for f in "$RL_TEST_ROOT"/*/pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    kill -CONT "$pid" 2>/dev/null
    kill -KILL "$pid" 2>/dev/null
  done
  rm -rf "$RL_TEST_ROOT"
}
trap cleanup EXIT
# Go: no network, and a build cache even without a HOME.
export GOPROXY=off GOFLAGS=-mod=mod
[ -n "${HOME:-}" ] || export GOCACHE=${GOCACHE:-$RL_TEST_ROOT/gocache}

total_pass=0 total_fail=0
summary=()
record() { # language passed failed
  total_pass=$((total_pass + $2)) total_fail=$((total_fail + $3))
  summary+=("$1 $2/$(($2 + $3))")
}
need() { # language tool
  command -v "$2" >/dev/null 2>&1 && return 0
  echo "clients/run_tests.sh: $2 not found: the $1 client's tests cannot run" >&2
  record "$1" 0 1
  return 1
}

if selected python && need python python3; then
  # pip install into a fresh venv (test extras from PyPI, pip's cache), then unittest.
  out=$(timeout 600 bash clients/python/tests/run.sh 2>&1)
  rc=$?
  printf '%s\n' "$out"
  ran=$(sed -n 's/^Ran \([0-9]*\) tests\{0,1\}.*/\1/p' <<<"$out")
  bad=$(grep -cE '\.\.\. (FAIL|ERROR)' <<<"$out")
  [ "$rc" = 0 ] || [ "$bad" -gt 0 ] || bad=1
  record python $((${ran:-0} - bad < 0 ? 0 : ${ran:-0} - bad)) "$bad"
fi

if selected node && need node node; then
  # npm pack, npm install of the tarball into a scratch project, node --test (TAP).
  out=$(timeout 600 bash clients/node/test/run.sh 2>&1)
  rc=$?
  printf '%s\n' "$out"
  p=$(sed -n 's/^# pass \([0-9]*\)/\1/p' <<<"$out") f=$(sed -n 's/^# fail \([0-9]*\)/\1/p' <<<"$out")
  [ "$rc" = 0 ] || [ "${f:-0}" -gt 0 ] || f=1
  record node "${p:-0}" "${f:-0}"
fi

# Go >= 1.21 (the module's go.mod says so): $GO, `go` on PATH or Debian's
# /usr/lib/go-1.NN/bin/go (tests/run.sh installs golang-1.22-go from bookworm-backports).
if ! selected go; then
  :
elif go=$(bash "$here/go/find_go.sh"); then
  echo "clients/run_tests.sh: Go client with $("$go" version) ($go)"
  export GOTOOLCHAIN=local # never download a toolchain
  # The module (go vet, then its tests: every conformance case as a subtest), then
  # example/: an application in a module of its own that imports the client by its
  # module path through a replace directive, as users' applications do.
  out=$({
    cd "$here/go" && "$go" vet ./... && timeout 300 "$go" test -count=1 -v ./...
    r=$?
    cd "$here/go/example" && "$go" vet ./... && timeout 120 "$go" test -count=1 -v ./...
    exit $((r | $?))
  } 2>&1)
  rc=$?
  printf '%s\n' "$out"
  p=$(grep -cE -- '^ *--- PASS' <<<"$out") f=$(grep -cE -- '^ *--- FAIL' <<<"$out")
  [ "$rc" = 0 ] || [ "$f" -gt 0 ] || f=1
  record go "$p" "$f"
else
  echo "clients/run_tests.sh: no Go >= 1.21 (\$GO, go on PATH, /usr/lib/go-1.NN): the Go client's tests cannot run" >&2
  record go 0 1
fi

if selected php && need php php; then
  # composer install of the example app (the package as a path repository), then every
  # test against that installed copy; see clients/php/tests/run.php.
  out=$(cd clients/php && timeout 300 php tests/run.php 2>&1)
  rc=$?
  printf '%s\n' "$out"
  p=$(sed -n 's/^php: \([0-9]*\) passed.*/\1/p' <<<"$out") f=$(sed -n 's/^php: [0-9]* passed, \([0-9]*\) failed/\1/p' <<<"$out")
  [ "$rc" = 0 ] || [ "${f:-0}" -gt 0 ] || f=1
  record php "${p:-0}" "${f:-0}"
fi

if selected java && need java javac; then
  # mvn install with pom.xml, offline against Debian's Maven repository (surefire's
  # report and summary go to the log), or where Maven is missing javac against Debian's
  # jars and JUnit's console launcher; see clients/java/test.sh.
  out=$(timeout 600 bash clients/java/test.sh 2>&1)
  rc=$?
  printf '%s\n' "$out"
  if grep -q '^java: mvn install' <<<"$out"; then
    # Surefire's summary: "Tests run: N, Failures: F, Errors: E, Skipped: S" (the last one).
    read -r n f e s < <(sed -n 's/^\[[A-Z]*\] Tests run: \([0-9]*\), Failures: \([0-9]*\), Errors: \([0-9]*\), Skipped: \([0-9]*\)$/\1 \2 \3 \4/p' <<<"$out" | tail -n 1)
    p=$((${n:-0} - ${f:-0} - ${e:-0} - ${s:-0})) f=$((${f:-0} + ${e:-0}))
  else
    p=$(sed -n 's/^\[ *\([0-9]*\) tests successful *\]$/\1/p' <<<"$out")
    f=$(sed -n 's/^\[ *\([0-9]*\) tests failed *\]$/\1/p' <<<"$out")
  fi
  [ "$rc" = 0 ] || [ "${f:-0}" -gt 0 ] || f=1
  record java "${p:-0}" "${f:-0}"
fi

if selected shell && need shell socat; then
  out=$(timeout 300 bash clients/shell/test.sh 2>&1)
  rc=$?
  printf '%s\n' "$out"
  p=$(sed -n 's/^shell: \([0-9]*\) passed.*/\1/p' <<<"$out") f=$(sed -n 's/^shell: [0-9]* passed, \([0-9]*\) failed/\1/p' <<<"$out")
  [ "$rc" = 0 ] || [ "${f:-0}" -gt 0 ] || f=1
  record shell "${p:-0}" "${f:-0}"
fi

echo "clients (passed/total): ${summary[*]}"
echo "clients: $total_pass passed, $total_fail failed"
[ "$total_fail" = 0 ]
