#!/usr/bin/env bash
# The Debian package under a real systemd, used as an administrator and an
# application would use it:
#   bash tests/systemd-real.sh [path/to/ratelimitd_*.deb]
# Boots Debian 12 with systemd as PID 1 in a container (systemd-nspawn --boot), with
# Debian's redis-server, installs the .deb, and checks socket activation, the
# socket's owner and mode (before and after the first activation, after restarts and
# a reboot), CHECKs as an unprivileged member of ratelimitd-clients answered from
# Redis, restart, reload with a good and a bad config, the watchdog, a Redis outage in
# `journalctl -p warning`, log lines still reaching the journal after journald
# restarts, the `systemd-analyze security` exposure bound, stop, remove, purge and
# install again.
#
# Without a .deb argument it runs `cargo deb --fast` (a release build). RLD_BIN=<path>
# packages that binary instead (`cargo deb --no-build`, no compilation).
# The container's root file system (debootstrap, ~45 s and ~260 MB the first time) is
# cached in $RLD_ROOTFS_CACHE (default /var/cache/ratelimitd-test), keyed by its
# package list; each run boots a fresh copy of it. Needs root, systemd-nspawn
# (systemd-container) and debootstrap (both installed with apt-get if missing), and
# the Debian mirror of /etc/apt/sources*. When the machine cannot run the container it
# prints why and `systemd-real: 0 passed, 0 failed, 1 skipped`, exit 0.
#
# Prints one line per check, "ok <name>" or "FAIL <name>: <why>", then
# "systemd-real: N passed, M failed[, K skipped]"; exit 1 if any check failed.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD

SUITE=bookworm
PACKAGES=systemd,systemd-sysv,dbus,procps,redis-server,adduser,socat
# systemd-analyze security's overall exposure for ratelimitd.service (1.2 measured
# under systemd 252, docs/SYSTEMD.md): a regression bound, not the target.
MAX_EXPOSURE=1.5
CACHE=${RLD_ROOTFS_CACHE:-/var/cache/ratelimitd-test}
SOCK=/run/ratelimitd/ratelimitd.sock
CONF=/etc/ratelimitd/ratelimitd.toml

passed=0 failed=0 skipped=0
start=$SECONDS
log() { printf 'systemd-real: %s\n' "$*" >&2; }
ok() { printf 'ok %s\n' "$1"; passed=$((passed + 1)); }
bad() { printf 'FAIL %s: %s\n' "$1" "$2"; failed=$((failed + 1)); }
skipped_check() { printf 'skip %s: %s\n' "$1" "$2"; skipped=$((skipped + 1)); }
skip_all() {
  printf 'SKIP: %s\n' "$*"
  echo "systemd-real: 0 passed, 0 failed, 1 skipped"
  exit 0
}
# check NAME COMMAND...: ok when the command succeeds, else FAIL with its output.
check() {
  local name=$1 out
  shift
  if out=$("$@" 2>&1); then ok "$name"; else bad "$name" "$(printf '%s' "$out" | tail -5 | tr '\n' ' ')"; fi
}

# --- Can this machine boot a container? -------------------------------------------
[ "$(id -u)" = 0 ] || skip_all "not root (systemd-nspawn and debootstrap need root)"
[ -d /sys/fs/cgroup ] || skip_all "no /sys/fs/cgroup"
command -v nsenter >/dev/null || skip_all "nsenter missing (util-linux)"
if ! command -v systemd-nspawn >/dev/null || ! command -v debootstrap >/dev/null; then
  command -v apt-get >/dev/null || skip_all "systemd-nspawn/debootstrap missing and no apt-get"
  log "installing systemd-container and debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q systemd-container debootstrap >&2 ||
    skip_all "apt-get install systemd-container debootstrap failed"
fi

# --- The container's root file system (cached) -------------------------------------
mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
  grep -Eo 'https?://[^ ]+/debian/?( |$)' | grep -v security | head -1 | tr -d ' ')
mirror=${RLD_MIRROR:-${mirror:-http://deb.debian.org/debian}}
key=$(printf '%s %s' "$SUITE" "$PACKAGES" | sha256sum | cut -c1-12)
rootfs=$CACHE/rootfs-$key
mkdir -p "$CACHE" || skip_all "cannot create $CACHE"
exec 9>"$CACHE/lock"
flock 9
if [ ! -x "$rootfs/lib/systemd/systemd" ]; then
  log "debootstrap $SUITE from $mirror into $rootfs (once; about a minute)"
  rm -rf "$rootfs.tmp"
  if ! debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs.tmp" "$mirror" \
    >"$CACHE/debootstrap.log" 2>&1; then
    rm -rf "$rootfs.tmp"
    skip_all "debootstrap $SUITE from $mirror failed (log: $CACHE/debootstrap.log)"
  fi
  mv "$rootfs.tmp" "$rootfs"
fi
flock -u 9

# --- The package ---------------------------------------------------------------------
work=$(mktemp -d -p /var/tmp rld-systemd-real.XXXXXX)
nspawn_pid=
stop_container() {
  [ -n "$nspawn_pid" ] || return 0
  kill -TERM "$nspawn_pid" 2>/dev/null
  for _ in $(seq 100); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$nspawn_pid" 2>/dev/null
  wait "$nspawn_pid" 2>/dev/null
  nspawn_pid=
}
cleanup() {
  stop_container
  # nspawn unmounts what it mounted; a killed one may leave mounts under the copy.
  grep -o " $work/[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m"; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

deb=${1:-}
if [ -z "$deb" ]; then
  if ! cargo deb --version >/dev/null 2>&1; then
    log "cargo-deb missing; installing cargo-deb 3.8.0"
    cargo install cargo-deb --locked --version 3.8.0 >&2 || skip_all "cannot install cargo-deb"
  fi
  if [ -n "${RLD_BIN:-}" ]; then
    mkdir -p "$work/target/release"
    cp "$RLD_BIN" "$work/target/release/ratelimitd"
    CARGO_TARGET_DIR=$work/target cargo deb --no-build --fast --output "$work/deb" >&2 ||
      { bad package "cargo deb --no-build failed"; exit 1; }
  else
    cargo deb --fast --output "$work/deb" >&2 || { bad package "cargo deb failed"; exit 1; }
  fi
  deb=$(ls "$work"/deb/ratelimitd_*.deb)
fi
[ -f "$deb" ] || { bad package "no such .deb: $deb"; exit 1; }
log "package $(basename "$deb")"

# --- Boot ----------------------------------------------------------------------------
root=$work/root
cp -a "$rootfs" "$root"
mkdir -p "$root/var/tmp/rld"
cp "$deb" "$root/var/tmp/rld/"
debname=/var/tmp/rld/$(basename "$deb")
echo ratelimitd-test >"$root/etc/hostname"

cpid=
boot() {
  systemd-nspawn -D "$root" --boot --register=no --keep-unit --quiet \
    >"$work/nspawn.log" 2>&1 </dev/null &
  nspawn_pid=$!
  cpid=
  for _ in $(seq 100); do
    cpid=$(ps -o pid= --ppid "$nspawn_pid" 2>/dev/null | head -1 | tr -d ' ')
    [ -n "$cpid" ] && [ "$(cat "/proc/$cpid/comm" 2>/dev/null)" = systemd ] && break
    cpid=
    kill -0 "$nspawn_pid" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$cpid" ] || return 1
  local state
  for _ in $(seq 300); do
    state=$(X systemctl is-system-running 2>/dev/null)
    case $state in running | degraded) return 0 ;; esac
    kill -0 "$nspawn_pid" 2>/dev/null || return 1
    sleep 0.2
  done
  echo "systemctl is-system-running: $state" >>"$work/nspawn.log"
  return 1
}
# X COMMAND...: run in the container (all its namespaces), with a clean environment.
X() { nsenter -t "$cpid" -a env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }
# As the application: an unprivileged user in ratelimitd-clients.
as_app() { X setpriv --reuid=app --regid=app --init-groups "$@"; }
# ask LINE...: one connection as the application, the reply lines.
ask() { as_app sh -c 'printf "%s\n" "$@" | socat -t2 - UNIX-CONNECT:'"$SOCK" sh "$@"; }
# The socket and its directory: owner, group, mode.
perms() { X stat -c '%n %U:%G %a' /run/ratelimitd "$SOCK" 2>&1 | tr '\n' ';'; }
want_perms="/run/ratelimitd root:root 755;$SOCK root:ratelimitd-clients 660;"
main_pid() { X systemctl show -p MainPID --value ratelimitd; }
source_of() { awk '{ print $6 }' <<<"$1"; }
# until SECONDS COMMAND...: retry every 0.2 s.
until_ok() {
  local n=$(($1 * 5))
  shift
  for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  "$@"
}
answers_from() { # RULE SOURCE: a new connection's CHECK is answered from SOURCE
  local r
  r=$(ask "CHECK $1 probe:$RANDOM") && [ "$(source_of "$r")" = "$2" ] || { echo "reply: '$r'"; return 1; }
}

if ! boot; then
  tail -20 "$work/nspawn.log" >&2
  skip_all "systemd-nspawn --boot did not come up (log above)"
fi
log "container up (systemd pid $cpid) after $((SECONDS - start)) s"

# --- 1. Install; nothing starts ------------------------------------------------------
check redis-server-running X systemctl is-active redis-server
check install X env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$debname"
if [ "$(X systemctl is-active ratelimitd.socket ratelimitd | sort -u)" = inactive ] &&
  [ -z "$(X ls /run/ratelimitd 2>/dev/null)" ]; then
  ok nothing-started-on-install
else
  bad nothing-started-on-install "$(X systemctl is-active ratelimitd.socket ratelimitd | tr '\n' ' ')"
fi
X adduser --system --group --quiet --no-create-home app
X adduser --quiet app ratelimitd-clients
check enable-socket X systemctl enable --now ratelimitd.socket

# --- 2. The application's CHECKs, the socket's owner ---------------------------------
before=$(perms)
[ "$before" = "$want_perms" ] && ok socket-perms-before-activation ||
  bad socket-perms-before-activation "$before"
reply=$(ask "CHECK api user:1")
[ "$(source_of "$reply")" = redis ] && ok first-check-as-client-source-redis ||
  bad first-check-as-client-source-redis "reply '$reply'"
# The ownership bug locked out every connection after the first.
reply=$(ask "CHECK api user:1" "PING")
[ "$(source_of "$(head -1 <<<"$reply")")" = redis ] && ok second-connection-as-client ||
  bad second-connection-as-client "reply '$reply'"
after=$(perms)
[ "$after" = "$want_perms" ] && ok socket-perms-after-first-activation ||
  bad socket-perms-after-first-activation "$after"
reply=$(as_app bash -c '. /usr/share/ratelimitd/ratelimitd.sh; rl_check api user:2; echo "$RL_VERDICT $RL_SOURCE"')
[ "$reply" = "ALLOW redis" ] && ok packaged-shell-client || bad packaged-shell-client "'$reply'"
reply=$(X setpriv --reuid=nobody --regid=nogroup --clear-groups sh -c \
  "printf 'PING\n' | socat -t1 - UNIX-CONNECT:$SOCK" 2>&1)
grep -q PONG <<<"$reply" && bad outsider-refused "a user outside ratelimitd-clients got '$reply'" ||
  ok outsider-refused

# --- 3. Restart, reload, watchdog -----------------------------------------------------
pid=$(main_pid)
check restart X systemctl restart ratelimitd
[ "$(main_pid)" != "$pid" ] && answers_from api redis >/dev/null && ok answered-after-restart ||
  bad answered-after-restart "$(answers_from api redis)"
[ "$(perms)" = "$want_perms" ] && ok socket-perms-after-restart || bad socket-perms-after-restart "$(perms)"

X cp "$CONF" /var/tmp/rld/good.toml
X sh -c "cat /var/tmp/rld/good.toml - > $CONF" <<'EOF'

[[rule]]
name = "added_by_reload"
algorithm = "fixed_window"
limit = 7
window = "1m"
EOF
pid=$(main_pid)
check reload-good-config X systemctl reload ratelimitd
if until_ok 5 answers_from added_by_reload redis && [ "$(main_pid)" = "$pid" ]; then
  ok reload-applies-new-rule
else
  bad reload-applies-new-rule "$(answers_from added_by_reload redis)"
fi
X sh -c "sed 's/^max_line_bytes/max_line_bytez/' /var/tmp/rld/good.toml > $CONF"
since=$(X date '+%Y-%m-%d %H:%M:%S')
if out=$(X systemctl reload ratelimitd 2>&1); then
  bad reload-bad-config-fails "systemctl reload succeeded with a bad config"
else
  ok reload-bad-config-fails
fi
errors=$(X journalctl -u ratelimitd -p err --since "$since" --no-pager)
grep -q max_line_bytez <<<"$errors" &&
  ok reload-bad-config-error-in-journal-at-priority-err ||
  bad reload-bad-config-error-in-journal-at-priority-err "journalctl -p err does not name the bad field"
[ "$(main_pid)" = "$pid" ] && answers_from added_by_reload redis >/dev/null &&
  ok old-rules-stay-after-bad-reload ||
  bad old-rules-stay-after-bad-reload "$(answers_from added_by_reload redis)"
X cp /var/tmp/rld/good.toml "$CONF"
check reload-restored-config X systemctl reload ratelimitd

X mkdir -p /etc/systemd/system/ratelimitd.service.d
X sh -c 'cat > /etc/systemd/system/ratelimitd.service.d/test-watchdog.conf' <<'EOF'
[Service]
WatchdogSec=2s
TimeoutAbortSec=5s
EOF
X systemctl daemon-reload
X systemctl restart ratelimitd
pid=$(main_pid)
restarts=$(X systemctl show -p NRestarts --value ratelimitd)
X kill -STOP "$pid"
t0=$SECONDS
gone() { [ "$(main_pid)" != "$pid" ] && [ "$(main_pid)" != 0 ]; }
if until_ok 15 gone && [ "$(X systemctl show -p NRestarts --value ratelimitd)" -gt "$restarts" ]; then
  ok "watchdog-restarts-stopped-daemon ($((SECONDS - t0)) s)"
else
  bad watchdog-restarts-stopped-daemon "MainPID still $(main_pid)"
  X kill -CONT "$pid" 2>/dev/null
fi
until_ok 5 answers_from api redis >/dev/null && ok answered-after-watchdog-restart ||
  bad answered-after-watchdog-restart "$(answers_from api redis)"
[ "$(perms)" = "$want_perms" ] && ok socket-perms-after-watchdog || bad socket-perms-after-watchdog "$(perms)"
X rm -r /etc/systemd/system/ratelimitd.service.d
X systemctl daemon-reload
X systemctl restart ratelimitd

# --- A Redis outage reaches `journalctl -p warning` ----------------------------------
since=$(X date '+%Y-%m-%d %H:%M:%S')
X systemctl stop redis-server
until_ok 3 answers_from api local >/dev/null && ok redis-down-answers-local ||
  bad redis-down-answers-local "$(answers_from api local)"
sleep 1
warnings=$(X journalctl -u ratelimitd -p warning --since "$since" --no-pager -q)
if grep -qi redis <<<"$warnings"; then
  ok journal-warning-shows-redis-outage
  log "journalctl -p warning: $(head -1 <<<"$warnings")"
  # Sent with the native protocol: the event's target and fields are journal fields.
  # (Read whole first: `grep -q` would close the pipe at its first match, and
  # journalctl, still writing, would fail the pipeline under pipefail.)
  verbose=$(X journalctl -u ratelimitd -p warning --since "$since" --no-pager -o verbose)
  grep -q '^ *TARGET=ratelimitd' <<<"$verbose" &&
    ok journal-structured-fields || bad journal-structured-fields "no TARGET= field on the outage warning"
else
  bad journal-warning-shows-redis-outage "journalctl -p warning -u ratelimitd shows nothing (the outage is logged at priority $(X journalctl -u ratelimitd --since "$since" -o verbose --no-pager | grep -m1 -o 'PRIORITY=[0-9]'))"
fi
X systemctl start redis-server
until_ok 5 answers_from api redis >/dev/null && ok back-to-redis-after-outage ||
  bad back-to-redis-after-outage "$(answers_from api redis)"

# --- journald restarted: the daemon's next lines still reach the journal -------------
# Each entry is a datagram sent to journald's socket by address (no connection to
# lose), so the restarted journald gets the next one, fields and all.
pid=$(main_pid)
jpid=$(X systemctl show -p MainPID --value systemd-journald)
check restart-journald X systemctl restart systemd-journald
[ "$(X systemctl show -p MainPID --value systemd-journald)" != "$jpid" ] ||
  bad restart-journald "systemd-journald kept MainPID $jpid"
since=$(X date '+%Y-%m-%d %H:%M:%S')
check reload-after-journald-restart X systemctl reload ratelimitd
reload_in_journal() {
  local out
  out=$(X journalctl -u ratelimitd --since "$since" --no-pager -o verbose) &&
    grep -q '^ *MESSAGE=SIGHUP: configuration reloaded' <<<"$out" &&
    grep -q '^ *SYSLOG_IDENTIFIER=ratelimitd$' <<<"$out" && grep -q '^ *RULES=' <<<"$out"
}
if until_ok 5 reload_in_journal && [ "$(main_pid)" = "$pid" ]; then
  ok journal-gets-lines-after-journald-restart
else
  bad journal-gets-lines-after-journald-restart "no reload entry with its fields since $since: $(X journalctl -u ratelimitd --since "$since" --no-pager -q | tail -3 | tr '\n' ' ')"
fi

# --- Hardening ------------------------------------------------------------------------
exposure=$(X systemd-analyze security ratelimitd.service 2>/dev/null | sed -n 's/.*Overall exposure level for ratelimitd.service: \([0-9.]*\).*/\1/p')
if [ -n "$exposure" ] && awk -v e="$exposure" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(e <= m) }'; then
  ok "security-exposure $exposure <= $MAX_EXPOSURE"
else
  bad security-exposure "'$exposure' (bound $MAX_EXPOSURE)"
fi
# IPAddressDeny= needs the BPF firewall (cgroup v2); probe it before judging.
if X systemd-run --wait --pipe -q -p IPAddressDeny=any redis-cli -h 127.0.0.1 ping >/dev/null 2>&1; then
  skipped_check ip-address-allow-list "this host's systemd does not enforce IPAddressDeny= (no BPF cgroup firewall here)"
elif answers_from api redis >/dev/null; then
  ok ip-address-allow-list-admits-localhost
else
  bad ip-address-allow-list-admits-localhost "$(answers_from api redis)"
fi

# --- Reboot: /run is new, the socket must come back right ----------------------------
stop_container
if boot; then
  [ "$(perms)" = "$want_perms" ] && ok socket-perms-after-reboot || bad socket-perms-after-reboot "$(perms)"
  until_ok 5 answers_from api redis >/dev/null && ok answered-after-reboot ||
    bad answered-after-reboot "$(answers_from api redis)"
  ask "CHECK api user:3" >/dev/null
  [ "$(perms)" = "$want_perms" ] && ok socket-perms-after-reboot-activation ||
    bad socket-perms-after-reboot-activation "$(perms)"
else
  bad reboot "the container did not boot again"
  exit 1
fi

# --- 4. Stop, remove, purge, install again --------------------------------------------
X systemctl stop ratelimitd.socket ratelimitd
left=$(X find /run -name '*ratelimitd*')
[ -z "$left" ] && ok stop-leaves-nothing-in-run || bad stop-leaves-nothing-in-run "$left"
# Every file of the package, whatever it is named (/usr/share/zsh/…/_ratelimitd too).
X dpkg -L ratelimitd | sort >"$work/files"
leftovers() {
  X sh -c 'for f; do [ -e "$f" ] && [ ! -d "$f" ] && echo "$f"; done; find / -xdev -name "*ratelimitd*" -not -path "/var/tmp/rld*" -not -path "/proc/*"' sh $(cat "$work/files")
}
check remove X env DEBIAN_FRONTEND=noninteractive apt-get remove -y -q ratelimitd
# remove keeps what purge deletes: the conffile, dpkg's record of it, the state
# directory (StateDirectory=, the count of daemons alive) and Debian's systemd
# bookkeeping (the units masked while their files are gone, whether they were enabled,
# so that installing again restores it).
left=$(leftovers | grep -vxF -e "$CONF" -e /etc/ratelimitd -e /var/lib/ratelimitd \
  -e /etc/systemd/system/ratelimitd.service -e /etc/systemd/system/ratelimitd.socket \
  -e /etc/systemd/system/sockets.target.wants/ratelimitd.socket |
  grep -Ev '^/var/lib/(dpkg/info/ratelimitd\.|systemd/deb-systemd-helper-(enabled|masked)/)')
[ -z "$left" ] && ok "remove-leaves-only-conffile-and-unit-state" ||
  bad remove-leaves-only-conffile-and-unit-state "$(tr '\n' ' ' <<<"$left")"
check purge X env DEBIAN_FRONTEND=noninteractive apt-get purge -y -q ratelimitd
left=$(leftovers)
[ -z "$left" ] && ok purge-leaves-no-files || bad purge-leaves-no-files "$(tr '\n' ' ' <<<"$left")"
X getent passwd ratelimitd >/dev/null && log "purge keeps the system user ratelimitd and the group ratelimitd-clients (Debian: a removed system user's uid may still own files)"
check reinstall X env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$debname"
check enable-after-reinstall X systemctl enable --now ratelimitd.socket
until_ok 5 answers_from api redis >/dev/null && ok answered-after-reinstall ||
  bad answered-after-reinstall "$(answers_from api redis)"
[ "$(perms)" = "$want_perms" ] && ok socket-perms-after-reinstall || bad socket-perms-after-reinstall "$(perms)"

stop_container
log "took $((SECONDS - start)) s"
if [ "$skipped" -gt 0 ]; then
  echo "systemd-real: $passed passed, $failed failed, $skipped skipped"
else
  echo "systemd-real: $passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
