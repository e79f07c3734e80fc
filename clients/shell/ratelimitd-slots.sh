# shellcheck shell=bash
# Concurrency slots for shell scripts (rules with algorithm = "concurrency"), on the
# connection of clients/shell/ratelimitd.sh. Source both:
#
#   . clients/shell/ratelimitd.sh
#   . clients/shell/ratelimitd-slots.sh
#   rl_with_slot jobs "user:42" ./run-the-job.sh arg...   # 75 when every slot is held
#
# rl_acquire RULE KEY: ACQUIRE; sets the RL_* variables as rl_check does, and
# RL_TOKEN (empty when denied or decided by the client); returns 0 when a slot was
# taken, 1 when denied, 2 for a caller bug (unknown rule, not a concurrency rule).
# rl_release RULE KEY TOKEN: RELEASE; returns 0 when given back, 1 when the daemon no
# longer held it (its connection closed, or its max_hold ended) or could not be asked.
# rl_with_slot RULE KEY CMD...: runs CMD holding a slot and gives it back however CMD
# ends; returns CMD's status, or 75 (EX_TEMPFAIL) without running it when denied.
#
# The daemon gives a slot back when the connection that took it closes: a script that
# dies (its socat coprocess with it) frees its slots at once. rl_close, or a check that
# times out (which drops the connection), gives back every slot this shell holds.

rl_acquire() {
  local err f rc
  RL_TOKEN=
  rl__round_trip "ACQUIRE $1 $(rl_encode_key "$2")"$'\n' 1
  err=$RL_ERROR
  rl_parse "${RL_REPLIES[0]}" "$1"
  rc=$?
  [ -n "$RL_ERROR" ] || RL_ERROR=$err
  if [ "$rc" = 0 ] && [[ $RL_SOURCE != client_* ]]; then
    read -r -a f <<<"${RL_REPLIES[0]}"
    RL_TOKEN=${f[7]:-}
  fi
  return "$rc"
}

rl_release() {
  [ -n "${3:-}" ] || return 1
  # Not rl__round_trip: an "OK" is no decision, and dropping the connection would give
  # back every other slot of this shell.
  rl__exchange "RELEASE $1 $(rl_encode_key "$2") $3"$'\n' 1 || { rl_close; return 1; }
  [ "${RL_REPLIES[0]:-}" = OK ]
}

rl_with_slot() {
  local rule=$1 key=$2 token rc
  shift 2
  rl_acquire "$rule" "$key"
  rc=$?
  [ "$rc" = 2 ] && return 2
  [ "$rc" = 0 ] || return 75
  token=$RL_TOKEN
  "$@"
  rc=$?
  rl_release "$rule" "$key" "$token"
  return "$rc"
}

# Prints RateLimit-Policy: "<rule>";q=<limit>;qu="concurrent-requests", RateLimit and,
# when denied, Retry-After, for the last rl_acquire (nothing when the client decided).
rl_slot_headers() {
  case $RL_SOURCE in
    client_fail_open) return 0 ;;
    client_fail_closed) echo "Retry-After: 1"; return 0 ;;
  esac
  echo "RateLimit-Policy: \"$RL_RULE\";q=$RL_LIMIT;qu=\"concurrent-requests\""
  echo "RateLimit: \"$RL_RULE\";r=$RL_REMAINING"
  if [ "$RL_VERDICT" = DENY ]; then
    local s=$(((RL_WAIT_MS + 999) / 1000))
    echo "Retry-After: $((s < 1 ? 1 : s))"
  fi
}
