#!/usr/bin/env bash
# Build the Debian package with cargo-deb and check what it installs:
#   bash tests/deb.sh [ratelimitd_*.deb]
# (tests/run.sh runs it after the cargo tests.) Installs cargo-deb (pinned) if
# missing. Checks, without installing anything on this machine: the file list,
# the conffile, the dependencies, the maintainer scripts (user and group, shell
# syntax), that the packaged files are the repository's, that the packaged binary
# accepts the packaged config (one host, Debian's redis-server), that the generated
# man page and completions are current, `systemd-analyze verify` on the unpacked tree
# (no output allowed), and lintian (no error or warning beyond the package's
# documented overrides; installed with apt-get if missing). Prints "tests/deb.sh: OK"
# last on success; exits 1 on the first failed check, saying which. The real-systemd
# test (install, activation, reload, watchdog, removal) is tests/systemd-real.sh.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

CARGO_DEB_VERSION=3.8.0

log() { printf 'tests/deb.sh: %s\n' "$*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

start=$SECONDS
if ! cargo deb --version >/dev/null 2>&1; then
  log "cargo-deb missing; installing cargo-deb $CARGO_DEB_VERSION (takes about 2 min)"
  cargo install cargo-deb --locked --version "$CARGO_DEB_VERSION"
fi
command -v dpkg-deb >/dev/null 2>&1 || fail "dpkg-deb not found (Debian/Ubuntu only)"
command -v objcopy >/dev/null 2>&1 || fail "objcopy not found: apt-get install binutils"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One command builds the package (release build of the daemon, symbols split off
# into a -dbgsym .ddeb). --fast: lighter xz compression, same contents (saves ~15 s).
# A .deb given as the argument is checked instead (built from this tree).
if [ -n "${1:-}" ]; then
  deb=$1
else
  # DEB_NO_BUILD=1: package target/release/ratelimitd as built (tests/run.sh builds it
  # once for every leg that runs the release daemon).
  no_build=()
  if [ "${DEB_NO_BUILD:-0}" = 1 ] && [ -x target/release/ratelimitd ]; then no_build=(--no-build); fi
  cargo deb --fast ${no_build[@]+"${no_build[@]}"} --output "$work" >&2 || fail "cargo deb"
  deb=$(ls "$work"/ratelimitd_*.deb)
fi
log "$(basename "$deb") ($(du -h "$deb" | cut -f1)), ready after $((SECONDS - start)) s"

# The files it installs.
contents=$(dpkg-deb --contents "$deb" | awk '{ print $NF }')
for f in ./usr/bin/ratelimitd \
         ./usr/lib/systemd/system/ratelimitd.service \
         ./usr/lib/systemd/system/ratelimitd.socket \
         ./etc/ratelimitd/ratelimitd.toml \
         ./usr/share/doc/ratelimitd/README.md \
         ./usr/share/doc/ratelimitd/SYSTEMD.md \
         ./usr/share/doc/ratelimitd/examples/cluster.toml \
         ./usr/share/doc/ratelimitd/copyright \
         ./usr/share/doc/ratelimitd/changelog.Debian.gz \
         ./usr/share/man/man8/ratelimitd.8.gz \
         ./usr/share/man/man5/ratelimitd.toml.5.gz \
         ./usr/share/bash-completion/completions/ratelimitd \
         ./usr/share/zsh/vendor-completions/_ratelimitd \
         ./usr/share/fish/vendor_completions.d/ratelimitd.fish \
         ./usr/share/ratelimitd/ratelimitd.sh \
         ./usr/share/lintian/overrides/ratelimitd; do
  grep -qxF "$f" <<<"$contents" || fail "$f missing from dpkg-deb --contents:
$contents"
done

# The config is a conffile (an edited one survives upgrades).
conffiles=$(dpkg-deb -I "$deb" conffiles) || fail "no conffiles in the package"
grep -qxF /etc/ratelimitd/ratelimitd.toml <<<"$conffiles" ||
  fail "/etc/ratelimitd/ratelimitd.toml is not a conffile: $conffiles"

# postinst needs adduser; the scripts create the user and the clients' group.
dpkg-deb -f "$deb" Depends | grep -qw adduser || fail "Depends lacks adduser"
# The shipped config uses Debian's redis-server on this host.
dpkg-deb -f "$deb" Recommends | grep -qw redis-server || fail "Recommends lacks redis-server"
dpkg-deb -e "$deb" "$work/control"
grep -q 'addgroup --system --quiet ratelimitd-clients' "$work/control/postinst" ||
  fail "postinst does not create the ratelimitd-clients group"
# (continuation lines joined first)
sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$work/control/postinst" |
  grep -q 'adduser --system .*ratelimitd$' ||
  fail "postinst does not create the ratelimitd user"
for s in postinst prerm postrm; do
  [ -f "$work/control/$s" ] || fail "no $s script"
  sh -n "$work/control/$s" || fail "$s: shell syntax"
done
grep -q 'deb-systemd-invoke stop ratelimitd.service ratelimitd.socket' "$work/control/prerm" ||
  fail "prerm does not stop the units on removal"

# The packaged files are the repository's, and the packaged binary runs and accepts
# the packaged config.
root="$work/root"
dpkg-deb -x "$deb" "$root"
cmp systemd/ratelimitd.service "$root/usr/lib/systemd/system/ratelimitd.service" || fail "service differs"
cmp systemd/ratelimitd.socket "$root/usr/lib/systemd/system/ratelimitd.socket" || fail "socket differs"
cmp conf/ratelimitd.toml "$root/etc/ratelimitd/ratelimitd.toml" || fail "config differs"
cmp clients/shell/ratelimitd.sh "$root/usr/share/ratelimitd/ratelimitd.sh" || fail "shell client differs"
cmp debian/ratelimitd.lintian-overrides "$root/usr/share/lintian/overrides/ratelimitd" ||
  fail "lintian overrides differ"
summary=$("$root/usr/bin/ratelimitd" --config "$root/etc/ratelimitd/ratelimitd.toml" --check) ||
  fail "the packaged binary rejects the packaged config"
grep -q 'redis.mode = Standalone' <<<"$summary" || fail "the packaged config is not standalone: $summary"
grep -qx 'nodes = \["127.0.0.1:6379"\].*' "$root/etc/ratelimitd/ratelimitd.toml" ||
  fail "the packaged config does not use 127.0.0.1:6379"
# The socket unit owns /run/ratelimitd: a RuntimeDirectory=ratelimitd in the service
# would chown the socket to the daemon's user on the first activation and lock clients
# out. The service's own runtime directory is another one (ratelimitd-rls).
! grep -qE '^RuntimeDirectory=(.* )?ratelimitd( |$)' "$root/usr/lib/systemd/system/ratelimitd.service" ||
  fail "ratelimitd.service has RuntimeDirectory=ratelimitd (chowns the socket)"
grep -qx 'ExecReload=/usr/bin/ratelimitd --check --config /etc/ratelimitd/ratelimitd.toml' \
  "$root/usr/lib/systemd/system/ratelimitd.service" || fail "ExecReload= does not check the config first"

# The man page and completions are generated from the CLI and committed: current?
if "$root/usr/bin/ratelimitd" --print-man >"$work/ratelimitd.8" 2>/dev/null; then
  zcat "$root/usr/share/man/man8/ratelimitd.8.gz" | cmp - "$work/ratelimitd.8" ||
    fail "debian/man/ratelimitd.8 is stale: ratelimitd --print-man > debian/man/ratelimitd.8"
  for sh in bash:ratelimitd.bash zsh:_ratelimitd fish:ratelimitd.fish; do
    "$root/usr/bin/ratelimitd" --print-completions "${sh%%:*}" | cmp - "debian/completions/${sh#*:}" ||
      fail "debian/completions/${sh#*:} is stale: ratelimitd --print-completions ${sh%%:*}"
  done
else
  fail "ratelimitd --print-man failed (the man page cannot be regenerated)"
fi

# systemd-analyze verify on the unpacked package (plus the system's own units, which
# verify needs, and /bin/kill for ExecReload=): it must print nothing.
if command -v systemd-analyze >/dev/null 2>&1; then
  for u in /lib/systemd/system/*; do
    [ -e "$root/usr/lib/systemd/system/$(basename "$u")" ] || cp -P "$u" "$root/usr/lib/systemd/system/" 2>/dev/null || true
  done
  cp /bin/kill "$root/usr/bin/kill"
  ln -s usr/bin "$root/bin"
  ln -s usr/lib "$root/lib"
  verify=$(systemd-analyze verify --root="$root" ratelimitd.socket ratelimitd.service 2>&1) ||
    fail "systemd-analyze verify on the package: $verify"
  [ -z "$verify" ] || fail "systemd-analyze verify on the package printed: $verify"
else
  fail "systemd-analyze not found (Debian package systemd)"
fi

# lintian: no error or warning but the overrides the package ships (docs/SYSTEMD.md).
if ! command -v lintian >/dev/null 2>&1; then
  log "lintian missing; installing it with apt-get"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q lintian >&2 || fail "apt-get install lintian"
fi
tags=$(lintian --tag-display-limit 0 "$deb" 2>&1 | grep -E '^[EW]: ' || true)
[ -z "$tags" ] || fail "lintian:
$tags"

log "OK ($((SECONDS - start)) s)"
