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
# RL_TIMEOUT seconds (default 0.2), RL_FAIL_OPEN 1 (default) or 0,
# RL_LEGACY_HEADERS 0 (default) or 1 (rl_headers adds the X-RateLimit-* trio).
#
# rl_check RULE KEY [COST]: sets RL_VERDICT (ALLOW/DENY) RL_LIMIT RL_REMAINING
# RL_RESET_MS RL_WAIT_MS RL_WINDOW_MS (empty from a daemon that does not send it)
# RL_SOURCE RL_RULE RL_ERROR; returns 0 when allowed, 1 when denied, 2 when the daemon
# rejected the request (ERR PROTO/RULE/KEY/COST/TOO_LONG, message in RL_ERROR). When
# the daemon is absent, refuses, answers ERR BUSY/PERM/INTERNAL, or does not answer
# within RL_TIMEOUT (never retried), the check is allowed (source client_fail_open)
# or, with RL_FAIL_OPEN=0, denied (client_fail_closed), and RL_ERROR says why.
#
# rl_check_many "RULE KEY [COST]"...: all checks in one round trip (KEY as sent: no
# spaces, printable ASCII; pass it through rl_encode_key if unsure); replies in the
# array RL_REPLIES (raw lines, fail-open/closed lines synthesised as
# "ALLOW 0 0 0 0 client_fail_open"). It then sets the RL_* variables from the most
# restrictive result (any DENY before any ALLOW; the daemon's answer before the
# client's own; the longest wait among DENYs, the fewest remaining among ALLOWs; then
# the lowest remaining/limit; then the first) and returns like rl_check (2 if any
# check was rejected); RL_POLICY lists every rule (each from its first answered
# check, the most restrictive one's from its own), which rl_headers prints.
# rl_parse LINE [RULE] sets the RL_* variables from one reply.
# rl_check_all "RULE KEY [COST]"... (1 to 8; KEY without spaces, percent-encoded by
# the client as for rl_check): one CHECKALL,
# all or nothing: allowed only if every check is, and then each is taken; on a DENY
# none is consumed. Sets the RL_* variables from the binding check (RL_RULE is its
# rule) and returns like rl_check; more than 8 (or none) returns 2.
# rl_check_all_policies "RULE KEY [COST]"...: rl_check_all plus, in the same round
# trip, one "CHECK RULE KEY 0" (it takes nothing) per distinct rule when the checks
# name more than one; also sets RL_POLICY, the RateLimit-Policy value listing every
# rule ("<rule>";q=<limit>;w=<window s>, joined by ", "; the binding rule's from the
# CHECKALL reply, a rule whose line got no readable reply left out), which rl_headers
# then prints. rl_limit_all "RULE KEY [COST]"...: the all-or-nothing guard of a
# CGI-style handler: rl_check_all_policies, then prints "Status: 200 OK" or
# "Status: 429 Too Many Requests" and rl_headers, each line ending in CR LF (nothing
# when it returns 2); returns like rl_check.
# rl_refund RULE KEY [UNITS]: gives UNITS (default 1) back (REFUND; never beyond the
# capacity or limit); the RL_* variables are the state after it; returns like rl_check.
# The first time the daemon cannot be reached, one line on stderr names RL_SOCKET.
# rl_headers prints the HTTP headers for the last result, one per line.
# rl_close closes the connection.

: "${RL_SOCKET:=/run/ratelimitd/ratelimitd.sock}"
: "${RL_TIMEOUT:=0.2}"
: "${RL_FAIL_OPEN:=1}"
: "${RL_LEGACY_HEADERS:=0}"
RL__PID=
RL__IN=
RL__OUT=
RL__USED=
RL__WARNED=

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
  RL__PID= RL__IN= RL__OUT= RL__USED=
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

# rl__exchange PAYLOAD N: writes PAYLOAD, reads up to N lines into RL_REPLIES.
# Returns 0, 1 (connection lost: EOF or write error), 3 (timeout); on 1 or 3 the
# lines read before stay in RL_REPLIES.
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
      RL__USED=1
    elif [ $? -gt 128 ]; then
      return 3
    else
      return 1
    fi
  done
}

rl_check_many() {
  local payload= c rule key cost rules=() norm=() i best=-1 rc=0 bug=0 err
  local -A item=()
  for c in "$@"; do
    read -r rule key cost <<<"$c"
    rules+=("$rule")
    payload+="CHECK $rule $key ${cost:-1}"$'\n'
  done
  rl__round_trip "$payload" $#
  err=$RL_ERROR
  for ((i = 0; i < $#; i++)); do
    rl_parse "${RL_REPLIES[i]}" "${rules[i]}"
    if [ $? = 2 ]; then bug=1 norm+=(""); continue; fi
    norm+=("$RL_VERDICT $RL_LIMIT $RL_REMAINING $RL_RESET_MS $RL_WAIT_MS $RL_SOURCE")
    # Each rule's policy from its first daemon-decided result.
    [[ $RL_SOURCE == client_* ]] || [ -n "${item[$RL_RULE]+x}" ] || item[$RL_RULE]=$(rl__policy_item)
    if [ "$best" -lt 0 ] || rl__more_restrictive "${norm[i]}" "${norm[best]}"; then best=$i; fi
  done
  if [ "$best" -ge 0 ]; then
    RL_ERROR=
    rl_parse "${RL_REPLIES[best]}" "${rules[best]}"
    rc=$?
    [[ $RL_SOURCE != client_* ]] || [ -n "$RL_ERROR" ] || RL_ERROR=$err
    # RateLimit-Policy lists every rule, the most restrictive one's from its own reply.
    if [[ $RL_SOURCE != client_* ]]; then
      item[$RL_RULE]=$(rl__policy_item)
      local seen=" " out=
      for rule in "${rules[@]}"; do
        case $seen in *" $rule "*) continue ;; esac
        seen+="$rule "
        [ -z "${item[$rule]:-}" ] || out+="${out:+, }${item[$rule]}"
      done
      RL_POLICY=$out
    fi
  fi
  [ "$bug" = 1 ] && return 2
  return "$rc"
}

# rl__more_restrictive "V L R RESET WAIT SOURCE" (same for B): true when result A is
# more restrictive than B (the order rl_check_many documents).
rl__more_restrictive() {
  local a b fa=0 fb=0
  read -r -a a <<<"$1"
  read -r -a b <<<"$2"
  [ "${a[0]}" = "${b[0]}" ] || { [ "${a[0]}" = DENY ]; return; }
  [[ ${a[5]} == client_* ]] && fa=1
  [[ ${b[5]} == client_* ]] && fb=1
  [ "$fa" = "$fb" ] || { [ "$fa" = 0 ]; return; }
  if [ "${a[0]}" = DENY ]; then
    [ "${a[4]}" = "${b[4]}" ] || { [ "${a[4]}" -gt "${b[4]}" ]; return; }
  else
    [ "${a[2]}" = "${b[2]}" ] || { [ "${a[2]}" -lt "${b[2]}" ]; return; }
  fi
  # The lower remaining/limit (limit 0 counts as 0): a.r * b.l < b.r * a.l.
  local ra=$((a[1] > 0 ? a[2] : 0)) la=$((a[1] > 0 ? a[1] : 1))
  local rb=$((b[1] > 0 ? b[2] : 0)) lb=$((b[1] > 0 ? b[1] : 1))
  [ $((ra * lb)) -lt $((rb * la)) ]
}

# rl__round_trip PAYLOAD N: sends the request lines, fills RL_REPLIES (N lines), with
# fail-open/closed lines for the checks the daemon did not answer.
rl__round_trip() {
  local payload=$1 n=$2 rc reused i line
  reused=${RL__USED:+1}
  rl__exchange "$payload" "$n"
  rc=$?
  if [ "$rc" = 1 ] && [ -n "$reused" ] && [ "${#RL_REPLIES[@]}" = 0 ]; then
    # A kept connection closed by a daemon restart or idle timeout: one retry.
    rl_close
    rl__exchange "$payload" "$n"
    rc=$?
  fi
  RL_ERROR=
  if [ "$rc" != 0 ]; then
    if [ "$rc" = 3 ]; then RL_ERROR="timeout: no reply within ${RL_TIMEOUT} s"; else RL_ERROR="cannot reach the daemon at $RL_SOCKET"; fi
    if [ "$rc" = 1 ] && [ "${#RL_REPLIES[@]}" = 0 ] && [ -z "$RL__WARNED" ] && rl__unreachable; then
      # Once per shell: a wrong RL_SOCKET must not pass silently as "everything allowed".
      RL__WARNED=1
      if [ "$RL_FAIL_OPEN" = 1 ]; then rc="failing open (allowing)"; else rc="failing closed (denying)"; fi
      echo "ratelimitd: warning: cannot reach the daemon at $RL_SOCKET: $rc until it answers" >&2
    fi
    rl_close
    for ((i = ${#RL_REPLIES[@]}; i < n; i++)); do RL_REPLIES+=("$(rl__fallback_line)"); done
  fi
  for line in "${RL_REPLIES[@]}"; do
    case $line in
      "ERR BUSY"* | "ERR PERM"*) rl_close ;;
      ERR* | ALLOW* | DENY*) ;;
      *) rl_close ;; # an unreadable line: the connection may be out of step
    esac
  done
  return 0
}

# True when the connection's socat exited with a failure: it could not connect (a
# daemon that closed the connection makes it exit with 0). Called after EOF, when it is
# exiting anyway.
rl__unreachable() {
  [ -n "$RL__PID" ] || return 1
  wait "$RL__PID" 2>/dev/null
  local st=$?
  RL__PID=
  [ "$st" != 0 ] && [ "$st" != 127 ]
}

rl__fallback_line() {
  if [ "$RL_FAIL_OPEN" = 1 ]; then echo "ALLOW 0 0 0 0 client_fail_open"; else echo "DENY 0 0 0 0 client_fail_closed"; fi
}

# rl_parse LINE [RULE]: sets the RL_* variables; returns like rl_check.
rl_parse() {
  local line=$1 f
  RL_RULE=${2:-} RL_POLICY=
  read -r -a f <<<"$line"
  case ${f[0]:-} in
    ALLOW | DENY)
      if [ "${#f[@]}" -ge 6 ] && [[ "${f[1]} ${f[2]} ${f[3]} ${f[4]}" =~ ^[0-9]+\ [0-9]+\ [0-9]+\ [0-9]+$ ]]; then
        RL_VERDICT=${f[0]} RL_LIMIT=$((10#${f[1]})) RL_REMAINING=$((10#${f[2]}))
        RL_RESET_MS=$((10#${f[3]})) RL_WAIT_MS=$((10#${f[4]})) RL_SOURCE=${f[5]}
        RL_WINDOW_MS= # a seventh field that is not a count means "unknown"
        [[ ${f[6]:-} =~ ^[0-9]+$ ]] && RL_WINDOW_MS=$((10#${f[6]}))
        [ "$RL_VERDICT" = ALLOW ]
        return
      fi
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
  # A line we cannot read: the daemon failed us (rl__round_trip drops the connection).
  RL_ERROR="unexpected reply: $line"
  rl_parse "$(rl__fallback_line)" "$RL_RULE"
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

# Prints the HTTP headers for the last result (IETF draft-ietf-httpapi-ratelimit-headers):
#   RateLimit-Policy: "<rule>";q=<limit>;w=<ceil(window_ms/1000)>   (no w when unknown;
#                     RL_POLICY instead when rl_check_all_policies set it)
#   RateLimit: "<rule>";r=<remaining>;t=<ceil(reset_ms/1000)>
#   Retry-After: max(1, ceil(wait_ms/1000))                          (denied only)
# and with RL_LEGACY_HEADERS=1 X-RateLimit-Limit/-Remaining/-Reset. Nothing when the
# client failed open; only Retry-After: 1 when it failed closed.
rl_headers() {
  [ -n "${RL_VERDICT:-}" ] || return 0 # no result (a rejected request)
  case $RL_SOURCE in
    client_fail_open) return 0 ;;
    client_fail_closed) echo "Retry-After: 1"; return 0 ;;
  esac
  local reset=$(((RL_RESET_MS + 999) / 1000)) retry=$(((RL_WAIT_MS + 999) / 1000)) w=
  [ "${RL_WINDOW_MS:-0}" -gt 0 ] && w=";w=$(((RL_WINDOW_MS + 999) / 1000))"
  echo "RateLimit-Policy: ${RL_POLICY:-\"$RL_RULE\";q=$RL_LIMIT$w}"
  echo "RateLimit: \"$RL_RULE\";r=$RL_REMAINING;t=$reset"
  if [ "$RL_VERDICT" = DENY ]; then echo "Retry-After: $((retry < 1 ? 1 : retry))"; fi
  if [ "$RL_LEGACY_HEADERS" = 1 ]; then
    echo "X-RateLimit-Limit: $RL_LIMIT"
    echo "X-RateLimit-Remaining: $RL_REMAINING"
    echo "X-RateLimit-Reset: $reset"
  fi
  return 0
}

# rl_status: the HTTP status for the last result (429 when denied, else 200).
rl_status() {
  if [ "$RL_VERDICT" = DENY ]; then echo 429; else echo 200; fi
}

rl_check_all() {
  local line=CHECKALL c rule key cost first= rc err f
  if [ $# -lt 1 ] || [ $# -gt 8 ]; then
    RL_ERROR="CHECKALL takes 1 to 8 checks, got $#" RL_VERDICT= RL_SOURCE=
    return 2
  fi
  for c in "$@"; do
    read -r rule key cost <<<"$c"
    first=${first:-$rule}
    line+=" $rule $(rl_encode_key "$key") ${cost:-1}"
  done
  rl__round_trip "$line"$'\n' 1
  err=$RL_ERROR
  rl_parse "${RL_REPLIES[0]}" "$first"
  rc=$?
  [ -n "$RL_ERROR" ] || RL_ERROR=$err
  read -r -a f <<<"${RL_REPLIES[0]}"
  # The binding rule, the 8th field of a daemon's verdict.
  if [[ ${f[0]:-} == ALLOW || ${f[0]:-} == DENY ]] && [ -n "${f[7]:-}" ] && [[ $RL_SOURCE != client_* ]]; then
    RL_RULE=${f[7]}
  fi
  return $rc
}

rl_refund() {
  local err rc
  rl__round_trip "REFUND $1 $(rl_encode_key "$2") ${3:-1}"$'\n' 1
  err=$RL_ERROR
  rl_parse "${RL_REPLIES[0]}" "$1"
  rc=$?
  [ -n "$RL_ERROR" ] || RL_ERROR=$err
  return $rc
}

# rl__policy_item: "<RL_RULE>";q=<RL_LIMIT>;w=<window s> for the last result.
rl__policy_item() {
  local w=
  [ "${RL_WINDOW_MS:-0}" -gt 0 ] && w=";w=$(((RL_WINDOW_MS + 999) / 1000))"
  printf '"%s";q=%s%s' "$RL_RULE" "$RL_LIMIT" "$w"
}

rl_check_all_policies() {
  local line=CHECKALL payload c rule key cost first= rc err f i seen=" " names=() keys=() items=() replies
  if [ $# -lt 1 ] || [ $# -gt 8 ]; then
    RL_ERROR="CHECKALL takes 1 to 8 checks, got $#" RL_VERDICT= RL_SOURCE= RL_POLICY=
    return 2
  fi
  for c in "$@"; do
    read -r rule key cost <<<"$c"
    first=${first:-$rule}
    key=$(rl_encode_key "$key")
    line+=" $rule $key ${cost:-1}"
    case $seen in *" $rule "*) ;; *) seen+="$rule " names+=("$rule") keys+=("$key") ;; esac
  done
  [ "${#names[@]}" -gt 1 ] || names=()
  payload="$line"$'\n'
  for i in "${!names[@]}"; do payload+="CHECK ${names[i]} ${keys[i]} 0"$'\n'; done
  rl__round_trip "$payload" $((1 + ${#names[@]}))
  err=$RL_ERROR
  replies=("${RL_REPLIES[@]}")
  # Each rule's state first (rl_parse sets RL_*), the binding result last.
  for i in "${!names[@]}"; do
    items[i]=
    rl_parse "${replies[i + 1]}" "${names[i]}"
    [ $? = 2 ] || [[ $RL_SOURCE == client_* ]] || items[i]=$(rl__policy_item)
  done
  RL_ERROR=
  rl_parse "${replies[0]}" "$first"
  rc=$?
  [ -n "$RL_ERROR" ] || RL_ERROR=$err
  [ "$rc" != 2 ] || return 2
  read -r -a f <<<"${replies[0]}"
  [[ $RL_SOURCE == client_* ]] && return $rc
  [ -z "${f[7]:-}" ] || RL_RULE=${f[7]} # the binding rule, after window_ms
  case $seen in
    *" $RL_RULE "*) ;;
    *) names=("$RL_RULE" "${names[@]}") items=("" "${items[@]}") ;; # a composite rule's member
  esac
  [ "${#names[@]}" -gt 0 ] || names=("$RL_RULE")
  local out=
  for i in "${!names[@]}"; do
    if [ "${names[i]}" = "$RL_RULE" ]; then c=$(rl__policy_item); else c=${items[i]:-}; fi
    [ -z "$c" ] || out+="${out:+, }$c"
  done
  RL_POLICY=$out
  return $rc
}

rl_limit_all() {
  rl_check_all_policies "$@"
  local rc=$?
  [ "$rc" != 2 ] || return 2
  if [ "$rc" = 0 ]; then printf 'Status: 200 OK\r\n'; else printf 'Status: 429 Too Many Requests\r\n'; fi
  rl_headers | sed 's/$/\r/'
  return "$rc"
}
