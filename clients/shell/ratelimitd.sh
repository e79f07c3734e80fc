# shellcheck shell=bash
# Client for ratelimitd, the per-host rate-limit daemon, for shell scripts.
# Needs bash >= 4.1 and socat. Source it:
#
#   . clients/shell/ratelimitd.sh
#   RL_SOCKET=/run/ratelimitd/ratelimitd.sock
#   if rl_check rides_request "user:42"; then do_the_work; else echo "retry in ${RL_WAIT_MS} ms"; fi
#
# One connection (a socat coprocess), opened on first use and reused by every
# rl_check / rl_check_many of this shell, re-opened after the daemon restarts.
# (A plain POSIX sh can do without the library, one connection per check:
#   printf 'CHECK rides_request user:42\n' | socat -t1 - UNIX-CONNECT:/run/ratelimitd/ratelimitd.sock )
#
# Settings (variables): RL_SOCKET (default /run/ratelimitd/ratelimitd.sock),
# RL_TIMEOUT seconds (default 0.2), RL_FAIL_OPEN 1 (default) or 0.
#
# rl_check RULE KEY [COST]: sets RL_VERDICT (ALLOW/DENY) RL_LIMIT RL_REMAINING
# RL_RESET_MS RL_WAIT_MS RL_SOURCE RL_RULE RL_ERROR; returns 0 when allowed, 1 when
# denied, 2 when the daemon rejected the request (ERR PROTO/RULE/KEY/COST/TOO_LONG,
# message in RL_ERROR). When the daemon is absent, refuses, or does not answer within
# RL_TIMEOUT, the check is allowed (source client_fail_open) or, with RL_FAIL_OPEN=0,
# denied (client_fail_closed), and RL_ERROR says why.
#
# rl_check_many "RULE KEY [COST]"...: all checks in one round trip (KEY as sent: no
# spaces, printable ASCII; pass it through rl_encode_key if unsure); replies in the
# array RL_REPLIES (raw lines, fail-open/closed lines synthesised as
# "ALLOW 0 0 0 0 client_fail_open"). rl_parse LINE [RULE] sets the RL_* variables from
# one reply. rl_headers prints the HTTP headers for the last result, one per line.
# rl_close closes the connection.

: "${RL_SOCKET:=/run/ratelimitd/ratelimitd.sock}"
: "${RL_TIMEOUT:=0.2}"
: "${RL_FAIL_OPEN:=1}"
RL__PID=
RL__IN=
RL__OUT=

# Percent-encodes every byte outside 0x21..0x7E, and '%' itself.
rl_encode_key() {
  local LC_ALL=C s=$1 out= c i
  for ((i = 0; i < ${#s}; i++)); do
    c=${s:i:1}
    case $c in
      [!\!-~] | %) printf -v c '%%%02X' "'$c" ;;
    esac
    out+=$c
  done
  printf '%s' "$out"
}

rl_close() {
  if [ -n "$RL__IN" ]; then exec {RL__IN}>&-; fi
  if [ -n "$RL__OUT" ]; then exec {RL__OUT}<&-; fi
  if [ -n "$RL__PID" ]; then
    kill "$RL__PID" 2>/dev/null
    wait "$RL__PID" 2>/dev/null
  fi
  RL__PID= RL__IN= RL__OUT=
  return 0
}

rl__open() {
  local d
  d=$(mktemp -d "${TMPDIR:-/tmp}/rl-sh-XXXXXX") || return 1
  mkfifo "$d/in" "$d/out" || { rm -rf "$d"; return 1; }
  socat -t 0.1 - "UNIX-CONNECT:$RL_SOCKET" <"$d/in" >"$d/out" 2>/dev/null &
  RL__PID=$!
  exec {RL__IN}>"$d/in" {RL__OUT}<"$d/out"
  rm -rf "$d"
}

# rl__exchange PAYLOAD N: writes PAYLOAD, reads N lines into RL_REPLIES.
# Returns 0, 1 (connection lost: EOF or write error), 3 (timeout).
rl__exchange() {
  local payload=$1 n=$2 line i rc=0 old_pipe
  RL_REPLIES=()
  [ -n "$RL__PID" ] || rl__open || return 1
  old_pipe=$(trap -p PIPE)
  trap '' PIPE
  printf '%s' "$payload" >&"$RL__IN" 2>/dev/null || rc=1
  eval "${old_pipe:-trap - PIPE}"
  [ "$rc" = 0 ] || return 1
  for ((i = 0; i < n; i++)); do
    if IFS= read -r -t "$RL_TIMEOUT" -u "$RL__OUT" line; then
      RL_REPLIES+=("$line")
    elif [ $? -gt 128 ]; then
      return 3
    else
      return 1
    fi
  done
}

rl_check_many() {
  local payload= c rule key cost
  for c in "$@"; do
    read -r rule key cost <<<"$c"
    payload+="CHECK $rule $key ${cost:-1}"$'\n'
  done
  rl__round_trip "$payload" $#
}

# rl__round_trip PAYLOAD N: sends the request lines, fills RL_REPLIES (N lines), with
# fail-open/closed lines when the daemon cannot answer.
rl__round_trip() {
  local payload=$1 n=$2 rc reused i line
  reused=${RL__PID:+1}
  rl__exchange "$payload" "$n"
  rc=$?
  if [ "$rc" = 1 ] && [ -n "$reused" ]; then
    # A kept connection closed by a daemon restart or idle timeout: one retry.
    rl_close
    rl__exchange "$payload" "$n"
    rc=$?
  fi
  if [ "$rc" != 0 ]; then
    rl_close
    if [ "$rc" = 3 ]; then RL_ERROR="timeout: no reply within ${RL_TIMEOUT} s"; else RL_ERROR="cannot reach the daemon at $RL_SOCKET"; fi
    RL_REPLIES=()
    for ((i = 0; i < n; i++)); do RL_REPLIES+=("$(rl__fallback_line)"); done
    return 0
  fi
  for line in "${RL_REPLIES[@]}"; do
    case $line in
      "ERR BUSY"* | "ERR PERM"*) rl_close ;;
    esac
  done
  RL_ERROR=
}

rl__fallback_line() {
  if [ "$RL_FAIL_OPEN" = 1 ]; then echo "ALLOW 0 0 0 0 client_fail_open"; else echo "DENY 0 0 0 0 client_fail_closed"; fi
}

# rl_parse LINE [RULE]: sets the RL_* variables; returns like rl_check.
rl_parse() {
  local line=$1 f
  RL_RULE=${2:-}
  read -r -a f <<<"$line"
  case ${f[0]:-} in
    ALLOW | DENY)
      RL_VERDICT=${f[0]} RL_LIMIT=${f[1]:-0} RL_REMAINING=${f[2]:-0}
      RL_RESET_MS=${f[3]:-0} RL_WAIT_MS=${f[4]:-0} RL_SOURCE=${f[5]:-}
      [ "$RL_VERDICT" = ALLOW ]
      return
      ;;
    ERR)
      case ${f[1]:-} in
        PROTO | RULE | KEY | COST | TOO_LONG)
          RL_ERROR=$line RL_VERDICT= RL_SOURCE=
          return 2
          ;;
      esac
      # BUSY, PERM, INTERNAL: the daemon cannot serve us now.
      RL_ERROR="daemon said: $line"
      rl_parse "$(rl__fallback_line)" "$RL_RULE"
      return
      ;;
  esac
  RL_ERROR="unexpected reply: $line"
  return 2
}

rl_check() {
  local err
  rl__round_trip "CHECK $1 $(rl_encode_key "$2") ${3:-1}"$'\n' 1
  err=$RL_ERROR
  rl_parse "${RL_REPLIES[0]}" "$1"
  local rc=$?
  [ -n "$RL_ERROR" ] || RL_ERROR=$err
  return $rc
}

# Prints the HTTP headers for the last result: IETF draft-ietf-httpapi-ratelimit-headers
# (RateLimit-Policy, RateLimit), X-RateLimit-Limit/Remaining/Reset (seconds from now),
# Retry-After (seconds) when denied. Nothing when the daemon did not decide
# (Retry-After: 1 if the client failed closed).
rl_headers() {
  case $RL_SOURCE in
    client_fail_open) return 0 ;;
    client_fail_closed) echo "Retry-After: 1"; return 0 ;;
  esac
  local reset=$(((RL_RESET_MS + 999) / 1000)) retry=$(((RL_WAIT_MS + 999) / 1000))
  echo "RateLimit-Policy: \"$RL_RULE\";q=$RL_LIMIT"
  echo "RateLimit: \"$RL_RULE\";r=$RL_REMAINING;t=$reset"
  echo "X-RateLimit-Limit: $RL_LIMIT"
  echo "X-RateLimit-Remaining: $RL_REMAINING"
  echo "X-RateLimit-Reset: $reset"
  if [ "$RL_VERDICT" = DENY ]; then echo "Retry-After: $((retry < 1 ? 1 : retry))"; fi
}
