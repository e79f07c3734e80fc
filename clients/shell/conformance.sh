# shellcheck shell=bash
# The shared conformance table (clients/conformance.json) run through rl_check /
# rl_check_many, rl_status and rl_headers, each case against a stand-in daemon
# (socat + fake_daemon.sh). Sourced by test.sh, which provides ok/fail and the
# counters; python3 reads the JSON into tab-separated records.

conformance_records() {
  python3 - "$1" <<'PY'
import json, sys
for c in json.load(open(sys.argv[1], encoding="utf-8"))["cases"]:
    o = {"fail_open": True, "legacy_headers": False, "timeout_ms": 5000, **c.get("options", {})}
    print("case", c["name"], c["daemon"], int(o["fail_open"]), int(o["legacy_headers"]), o["timeout_ms"] / 1000, sep="\t")
    for ch in c["checks"]:
        print("check", *ch, sep="\t")
    for r in c.get("replies", []):
        print("reply", r, sep="\t")
    for r in c.get("requests", []):
        print("request", r, sep="\t")
    e = c["expect"]
    if "raises" in e:
        print("raises", e["raises"], sep="\t")
    else:
        for r in e["results"]:
            w = "null" if r["window_ms"] is None else r["window_ms"]
            print("result", "ALLOW" if r["allowed"] else "DENY", r["limit"], r["remaining"], r["reset_ms"],
                  r["wait_ms"], w, r["source"], int(r["error"]), sep="\t")
        print("status", e["status"], sep="\t")
        for k, v in e["headers"].items():
            print("header", f"{k}: {v}", sep="\t")
    print("end", sep="\t")
PY
}

# conformance_run_case: runs the case held in the C_* variables; prints why it failed.
conformance_run_case() {
  local dir sock pid i got want n rc status
  dir=$(mktemp -d "${RL_TEST_ROOT:-/tmp}/rl-sh-fake-XXXXXX")
  sock=$dir/fake.sock
  printf '%s\n' "${C_REPLIES[@]}" >"$dir/replies"
  : >"$dir/requests"
  pid=
  if [ "$C_DAEMON" != absent ]; then
    socat "UNIX-LISTEN:$sock,fork" "EXEC:bash $here/fake_daemon.sh $C_DAEMON $dir/replies $dir/requests" 2>/dev/null &
    pid=$!
    for _ in $(seq 1 200); do [ -S "$sock" ] && break; sleep 0.01; done
  fi
  (
    RL_SOCKET=$sock RL_FAIL_OPEN=$C_FAIL_OPEN RL_LEGACY_HEADERS=$C_LEGACY RL_TIMEOUT=$C_TIMEOUT
    n=${#C_CHECKS[@]}
    if [ "$n" = 1 ]; then
      read -r rule cost <<<"${C_CHECKS[0]}"
      rl_check "$rule" "${C_KEYS[0]}" "$cost"
    else
      args=()
      for ((i = 0; i < n; i++)); do
        read -r rule cost <<<"${C_CHECKS[i]}"
        args+=("$rule $(rl_encode_key "${C_KEYS[i]}") $cost")
      done
      rl_check_many "${args[@]}"
    fi
    rc=$?
    status=$(rl_status)
    headers=$(rl_headers)
    rl_close
    if [ -n "$C_RAISES" ]; then
      [ "$rc" = 2 ] || { echo "expected rc 2 (ERR $C_RAISES), got $rc"; exit 1; }
      exit 0
    fi
    [ "$rc" != 2 ] || { echo "unexpected rc 2: $RL_ERROR"; exit 1; }
    for ((i = 0; i < n; i++)); do
      if [ "$n" != 1 ]; then # rl_check set RL_* already; here one line at a time
        RL_ERROR=
        rl_parse "${RL_REPLIES[i]}" x
      fi
      err=0
      if [ -n "$RL_ERROR" ] || [[ $RL_SOURCE == client_* ]]; then err=1; fi
      got="$RL_VERDICT $RL_LIMIT $RL_REMAINING $RL_RESET_MS $RL_WAIT_MS ${RL_WINDOW_MS:-null} $RL_SOURCE $err"
      want=${C_RESULTS[i]}
      [ "$got" = "$want" ] || { echo "result $i: got '$got', want '$want'"; exit 1; }
    done
    [ "$status" = "$C_STATUS" ] || { echo "status $status, want $C_STATUS"; exit 1; }
    want=$(printf '%s\n' "${C_HEADERS[@]}" | sed '/^$/d' | sort)
    got=$(printf '%s\n' "$headers" | sed '/^$/d' | sort)
    [ "$got" = "$want" ] || { echo "headers: got [$got] want [$want]"; exit 1; }
  )
  rc=$?
  if [ "$rc" = 0 ] && [ "${#C_REQUESTS[@]}" -gt 0 ]; then
    got=$(cat "$dir/requests")
    want=$(printf '%s\n' "${C_REQUESTS[@]}")
    [ "$got" = "$want" ] || { echo "requests: got [$got] want [$want]"; rc=1; }
  fi
  if [ "$rc" = 0 ] && { [ "$C_DAEMON" = stall ] || [ "$C_DAEMON" = close ]; }; then
    n=$(wc -l <"$dir/requests.conns" 2>/dev/null || echo 0)
    [ "$n" = 1 ] || { echo "$n connections: a timeout or a fresh closed connection was retried"; rc=1; }
  fi
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; fi
  rm -rf "$dir"
  return "$rc"
}

conformance_all() {
  local kind a b c d e f g h why
  T="conformance table"
  command -v python3 >/dev/null || { fail "python3 is needed to read conformance.json"; return; }
  while IFS=$'\t' read -r kind a b c d e f g h; do
    case $kind in
      case)
        C_NAME=$a C_DAEMON=$b C_FAIL_OPEN=$c C_LEGACY=$d C_TIMEOUT=$e
        C_CHECKS=() C_KEYS=() C_REPLIES=() C_REQUESTS=() C_RAISES= C_RESULTS=() C_STATUS= C_HEADERS=()
        ;;
      check) C_CHECKS+=("$a $c") C_KEYS+=("$b") ;;
      reply) C_REPLIES+=("$a") ;;
      request) C_REQUESTS+=("$a") ;;
      raises) C_RAISES=$a ;;
      result) C_RESULTS+=("$a $b $c $d $e ${f:-null} $g $h") ;;
      status) C_STATUS=$a ;;
      header) C_HEADERS+=("$a") ;;
      end)
        T="conformance $C_NAME"
        if why=$(conformance_run_case); then ok; else fail "$why"; fi
        ;;
    esac
  done < <(conformance_records "$here/../conformance.json")
}
