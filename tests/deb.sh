#!/usr/bin/env bash
# Build the Debian package with cargo-deb and check what it installs:
#   bash tests/deb.sh
# (tests/run.sh runs it after the cargo tests.) Installs cargo-deb (pinned) if
# missing. Checks, without installing anything on this machine: the file list,
# the conffile, the dependencies, the maintainer scripts (user and group, shell
# syntax), that the packaged files are the repository's, that the packaged binary
# accepts the packaged config, and `systemd-analyze verify` on the unpacked tree
# (no output allowed). Prints "tests/deb.sh: OK" last on success; exits 1 on the
# first failed check, saying which.
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
cargo deb --fast --output "$work" >&2 || fail "cargo deb"
deb=$(ls "$work"/ratelimitd_*.deb)
log "built $(basename "$deb") ($(du -h "$deb" | cut -f1)) in $((SECONDS - start)) s"

# The files it installs.
contents=$(dpkg-deb --contents "$deb" | awk '{ print $NF }')
for f in ./usr/bin/ratelimitd \
         ./usr/lib/systemd/system/ratelimitd.service \
         ./usr/lib/systemd/system/ratelimitd.socket \
         ./etc/ratelimitd/ratelimitd.toml \
         ./usr/share/doc/ratelimitd/README.md \
         ./usr/share/doc/ratelimitd/copyright; do
  grep -qxF "$f" <<<"$contents" || fail "$f missing from dpkg-deb --contents:
$contents"
done

# The config is a conffile (an edited one survives upgrades).
conffiles=$(dpkg-deb -I "$deb" conffiles) || fail "no conffiles in the package"
grep -qxF /etc/ratelimitd/ratelimitd.toml <<<"$conffiles" ||
  fail "/etc/ratelimitd/ratelimitd.toml is not a conffile: $conffiles"

# postinst needs adduser; the scripts create the user and the clients' group.
dpkg-deb -f "$deb" Depends | grep -qw adduser || fail "Depends lacks adduser"
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
"$root/usr/bin/ratelimitd" --config "$root/etc/ratelimitd/ratelimitd.toml" --check >&2 ||
  fail "the packaged binary rejects the packaged config"

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

log "OK ($((SECONDS - start)) s)"
