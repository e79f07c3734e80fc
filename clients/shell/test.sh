#!/usr/bin/env bash
# Tests of the shell client against a real daemon (clients/run_tests.sh runs them;
# needs RATELIMITD_BIN and socat). Exit status 0 when all pass.
# Needs python3 too (it reads clients/conformance.json for the shared cases).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/ratelimitd.sh"

passed=0 failed=0 dirs=()
td() { bash "$here/../testdaemon.sh" "$@"; }
new_daemon() {
  local d
  d=$(mktemp -d "${RL_TEST_ROOT:-/tmp}/rl-sh-XXXXXX")
  dirs+=("$d")
  td start "$d" || exit 1
  DIR=$d
  RL_SOCKET=$d/rl.sock
}
cleanup() { rl_close; for d in "${dirs[@]}"; do td resume "$d" 2>/dev/null; td stop "$d"; done; }
trap cleanup EXIT
fail() { echo "not ok - $T: $*"; failed=$((failed + 1)); return 1; }
ok() { echo "ok - $T"; passed=$((passed + 1)); }

T="counts down, denies, maps headers, reuses the connection"
new_daemon; RL_TIMEOUT=5
(
  for left in 4 3 2 1 0; do
    rl_check api sh:count || exit 1
    [ "$RL_LIMIT $RL_REMAINING $RL_SOURCE" = "5 $left local" ] || exit 1
  done
  pid=$RL__PID
  rl_check api sh:count; [ $? = 1 ] || exit 2
  [ "$RL__PID" = "$pid" ] || exit 3
  h=$(rl_headers)
  grep -qx 'RateLimit-Policy: "api";q=5;w=5000' <<<"$h" || exit 4
  grep -Eqx 'RateLimit: "api";r=0;t=[0-9]+' <<<"$h" || exit 5
  ! grep -q 'X-RateLimit' <<<"$h" || exit 6
  grep -qx 'X-RateLimit-Remaining: 0' <<<"$(RL_LEGACY_HEADERS=1 rl_headers)" || exit 6
  grep -qx "Retry-After: $(((RL_WAIT_MS + 999) / 1000))" <<<"$h" || exit 7
  rl_check api sh:other && ! rl_headers | grep -q Retry-After || exit 8
  rl_close
) && ok || fail "step $?"

T="pipelining keeps order"
(
  rl_check_many "api sh:pipe" "api sh:pipe" "api sh:pipe" "api sh:pipe" "api sh:pipe" "api sh:pipe" "api sh:pipe2 2" "fast x 0"
  got=$(printf '%s\n' "${RL_REPLIES[@]}" | cut -d' ' -f1,3 | tr '\n' ,)
  [ "$got" = "ALLOW 4,ALLOW 3,ALLOW 2,ALLOW 1,ALLOW 0,DENY 0,ALLOW 3,ALLOW 1000000," ] || { echo "$got"; exit 1; }
  rl_close
) && ok || fail "order"

T="request errors return 2; keys encoded; extra fields ignored"
(
  rl_check nope k; [ $? = 2 ] && [[ $RL_ERROR == "ERR RULE "* ]] || exit 1
  rl_check api k 6; [ $? = 2 ] && [[ $RL_ERROR == "ERR COST "* ]] || exit 2
  rl_check api "user name/é" || exit 3
  [ "$(rl_encode_key 'user name/é%')" = "user%20name/%C3%A9%25" ] || exit 4
  rl_parse "DENY 20 0 1900 100 cache future fields" rides; [ $? = 1 ] || exit 5
  [ "$RL_LIMIT $RL_REMAINING $RL_RESET_MS $RL_WAIT_MS $RL_SOURCE" = "20 0 1900 100 cache" ] || exit 6
  rl_close
) && ok || fail "step $?"

T="reconnects after a daemon restart"
(
  rl_check api k && [ "$RL_SOURCE" = local ] || exit 1
  td stop "$DIR"
  rl_check api k && [ "$RL_SOURCE" = client_fail_open ] || exit 2
  td start "$DIR"
  rl_check api k && [ "$RL_SOURCE $RL_REMAINING" = "local 4" ] || exit 3
  td stop "$DIR"; td start "$DIR"
  rl_check api k && [ "$RL_SOURCE" = local ] || exit 4
  rl_close
) && ok || fail "step $?"

T="times out and fails open when the daemon is stalled"
(
  rl_check fast k && [ "$RL_SOURCE" = local ] || exit 1
  RL_TIMEOUT=0.3
  td pause "$DIR"
  start=$(date +%s%N)
  rl_check fast k && [ "$RL_SOURCE" = client_fail_open ] && [[ $RL_ERROR == timeout* ]] || exit 2
  [ $((($(date +%s%N) - start) / 1000000)) -lt 3000 ] || exit 3
  RL_FAIL_OPEN=0
  rl_check fast k; [ $? = 1 ] && [ "$RL_SOURCE" = client_fail_closed ] || exit 4
  RL_FAIL_OPEN=1
  td resume "$DIR"
  RL_TIMEOUT=5
  rl_check fast k && [ "$RL_SOURCE" = local ] || exit 5
  rl_close
) && ok || fail "step $?"

T="fails open (or closed) when the daemon is absent"
(
  RL_SOCKET=$(mktemp -u "${TMPDIR:-/tmp}/rl-none-XXXXXX.sock")
  rl_check api k && [ "$RL_SOURCE" = client_fail_open ] && [ -n "$RL_ERROR" ] && [ -z "$(rl_headers)" ] || exit 1
  RL_FAIL_OPEN=0
  rl_check api k; [ $? = 1 ] && [ "$RL_SOURCE" = client_fail_closed ] && [ "$(rl_headers)" = "Retry-After: 1" ] || exit 2
) && ok || fail "step $?"

T="rl_check_many: the most restrictive result sets RL_* and the status"
(
  rl_check_many "fast sh:m1" "api sh:m1 5" "fast sh:m2"; [ $? = 0 ] && [ "$RL_RULE $RL_REMAINING" = "api 0" ] || exit 1
  rl_check_many "fast sh:m1" "api sh:m1"; [ $? = 1 ] && [ "$(rl_status)" = 429 ] && [ "$RL_RULE" = api ] || exit 2
  rl_check_many "fast sh:m1" "nope sh:m1"; [ $? = 2 ] || exit 3
  rl_close
) && ok || fail "step $?"

. "$here/ratelimitd-slots.sh"
T="concurrency slots: acquire, deny, release, rl_with_slot gives back on failure"
new_daemon; RL_TIMEOUT=5
(
  rl_acquire inflight sh:k || exit 1
  a=$RL_TOKEN
  [ -n "$a" ] && [ "$RL_LIMIT $RL_REMAINING $RL_SOURCE" = "2 1 local" ] || exit 2
  rl_acquire inflight sh:k || exit 3
  rl_acquire inflight sh:k; [ $? = 1 ] || exit 4
  grep -qx 'RateLimit-Policy: "inflight";q=2;qu="concurrent-requests"' <<<"$(rl_slot_headers)" || exit 5
  grep -q '^Retry-After: ' <<<"$(rl_slot_headers)" || exit 5
  rl_release inflight sh:k "$a" || exit 6
  ! rl_release inflight sh:k "$a" || exit 7
  for _ in 1 2 3; do rl_with_slot inflight sh:w false; [ $? = 1 ] || exit 8; done
  rl_with_slot inflight sh:w true || exit 9
  rl_acquire inflight sh:w && rl_acquire inflight sh:w || exit 10
  rl_with_slot inflight sh:w true; [ $? = 75 ] || exit 11
  rl_acquire api sh:k; [ $? = 2 ] || exit 12
  # Closing the connection gives back this shell's slots.
  rl_close
  rl_acquire inflight sh:w || exit 13
  rl_close
) && ok || fail "step $?"

T="rl_check_all takes nothing when one check denies; rl_refund answers the state"
(
  rl_check_all "api sh:all:a" "api sh:all:b 1" && [ "$RL_RULE $RL_LIMIT $RL_REMAINING" = "api 5 4" ] || exit 1
  rl_check_all "api sh:all:a" "api sh:all:b" && [ "$RL_REMAINING" = 3 ] || exit 2
  rl_check api sh:all:a 3 && [ "$RL_REMAINING" = 0 ] || exit 3
  for i in 1 2 3; do
    rl_check_all "api sh:all:a" "api sh:all:b"; [ $? = 1 ] && [ "$RL_RULE" = api ] && [ "$RL_WAIT_MS" -gt 0 ] || exit 4
  done
  rl_check api sh:all:b 0 && [ "$RL_REMAINING" = 3 ] || exit 5 # b untouched by the denials
  # Without Redis a refund gives nothing back (docs/PROTOCOL.md): the reply is the state.
  rl_refund api sh:all:b 1 && [ "$RL_RULE $RL_LIMIT $RL_REMAINING" = "api 5 3" ] || exit 6
  nine=(); for i in 1 2 3 4 5 6 7 8 9; do nine+=("api k"); done
  rl_check_all "${nine[@]}"; [ $? = 2 ] || exit 7
  rl_check_all "api k" "nope k"; [ $? = 2 ] && [[ $RL_ERROR == "ERR RULE "* ]] || exit 8
  rl_close
) && ok || fail "step $?"

T="an unreachable daemon: one warning on stderr naming RL_SOCKET, then fail open"
(
  RL_SOCKET=$(mktemp -u "${TMPDIR:-/tmp}/rl-nowhere-XXXXXX.sock")
  errs=$(mktemp "${TMPDIR:-/tmp}/rl-sh-err-XXXXXX")
  {
    rl_check api k && [ "$RL_SOURCE" = client_fail_open ] || exit 1
    rl_check_all "api k" "fast k" && [ "$RL_SOURCE" = client_fail_open ] || exit 2
    rl_refund api k 1 && [ "$RL_SOURCE" = client_fail_open ] || exit 3
  } 2>"$errs"
  n=$(grep -c "cannot reach the daemon at $RL_SOCKET: failing open" "$errs")
  [ "$n" = 1 ] && [ "$(wc -l <"$errs")" = 1 ] || { cat "$errs"; rm -f "$errs"; exit 4; }
  rm -f "$errs"
) && ok || fail "step $?"

T="rl_limit_all: a denied request takes nothing from the other rule; every policy listed"
new_daemon; RL_TIMEOUT=5
(
  rl_check api sh:mw:a 3 || exit 1 # "a" has 2 left, "b" 5
  for want in 200 200 429 429 429; do
    out=$(rl_limit_all "api sh:mw:a" "fast sh:mw:a" "api sh:mw:b" | tr -d '\r')
    grep -qx "Status: $want.*" <<<"$out" || exit 2
    grep -qxE 'RateLimit-Policy: "api";q=5;w=5000, "fast";q=1000000;w=[0-9]+' <<<"$out" || exit 3
    grep -qxE 'RateLimit: "api";r=[0-9]+;t=[0-9]+' <<<"$out" || exit 4
    if [ "$want" = 429 ]; then grep -qxE 'Retry-After: [1-9][0-9]*' <<<"$out" || exit 5; fi
    if [ "$want" = 200 ]; then ! grep -q Retry-After <<<"$out" || exit 6; fi
  done
  # Two allowed requests took 2 of b's 5; the three denied ones took nothing.
  rl_check api sh:mw:b 0 && [ "$RL_REMAINING" = 3 ] || exit 7
  rl_check_all_policies "api sh:mw:c" "fast sh:mw:c" && [ "$RL_RULE $RL_REMAINING" = "api 4" ] || exit 8
  rl_headers | grep -qxE 'RateLimit-Policy: "api";q=5;w=5000, "fast";q=1000000;w=[0-9]+' || exit 9
  rl_check api sh:mw:c 0 && rl_headers | grep -qx 'RateLimit-Policy: "api";q=5;w=5000' || exit 10
  rl_close
) && ok || fail "step $?"

. "$here/conformance.sh"
conformance_all
. "$here/conformance_several.sh"
conformance_several_all
conformance_headers_all

echo "shell: $passed passed, $failed failed"
[ "$failed" = 0 ]
