# shellcheck shell=bash
# conformance.json's several_cases (CHECKALL, REFUND) run through rl_check_all and
# rl_refund, and its several_header_cases through rl_limit_all, each against the
# stand-in daemon of conformance.sh. Sourced by test.sh
# after conformance.sh (ok/fail, the counters, fake_daemon.sh).

conformance_several_records() {
  python3 - "$1" <<'PY'
import json, sys
for c in json.load(open(sys.argv[1], encoding="utf-8"))["several_cases"]:
    o = {"fail_open": True, "timeout_ms": 5000, **c.get("options", {})}
    print("case", c["name"], c["call"], c["daemon"], int(o["fail_open"]), o["timeout_ms"] / 1000, sep="\t")
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
        r = e["result"]
        w = "null" if r["window_ms"] is None else r["window_ms"]
        print("result", "ALLOW" if r["allowed"] else "DENY", r["limit"], r["remaining"], r["reset_ms"],
              r["wait_ms"], w, r["source"], r["rule"], int(r["error"]), sep="\t")
    print("end", sep="\t")
PY
}

# conformance_several_case: runs the case held in the S_* variables; prints why it failed.
conformance_several_case() {
  local dir sock pid rc got want
  dir=$(mktemp -d "${RL_TEST_ROOT:-/tmp}/rl-sh-fake-XXXXXX")
  sock=$dir/fake.sock
  printf '%s\n' "${S_REPLIES[@]}" >"$dir/replies"
  : >"$dir/requests"
  pid=
  if [ "$S_DAEMON" != absent ]; then
    socat "UNIX-LISTEN:$sock,fork" "EXEC:bash $here/fake_daemon.sh reply $dir/replies $dir/requests" 2>/dev/null &
    pid=$!
    for _ in $(seq 1 200); do [ -S "$sock" ] && break; sleep 0.01; done
  fi
  (
    RL_SOCKET=$sock RL_FAIL_OPEN=$S_FAIL_OPEN RL_TIMEOUT=$S_TIMEOUT RL__WARNED=1
    if [ "$S_CALL" = refund ]; then
      read -r rule key units <<<"${S_CHECKS[0]}"
      rl_refund "$rule" "$key" "$units"
    else
      rl_check_all "${S_CHECKS[@]}"
    fi
    rc=$?
    rl_close
    if [ -n "$S_RAISES" ]; then
      [ "$rc" = 2 ] || { echo "expected rc 2 ($S_RAISES), got $rc"; exit 1; }
      exit 0
    fi
    [ "$rc" != 2 ] || { echo "unexpected rc 2: $RL_ERROR"; exit 1; }
    err=0
    if [ -n "$RL_ERROR" ] || [[ $RL_SOURCE == client_* ]]; then err=1; fi
    got="$RL_VERDICT $RL_LIMIT $RL_REMAINING $RL_RESET_MS $RL_WAIT_MS ${RL_WINDOW_MS:-null} $RL_SOURCE $RL_RULE $err"
    [ "$got" = "$S_RESULT" ] || { echo "got '$got', want '$S_RESULT'"; exit 1; }
  )
  rc=$?
  if [ "$rc" = 0 ] && [ "${#S_REQUESTS[@]}" -gt 0 ]; then
    got=$(cat "$dir/requests")
    want=$(printf '%s\n' "${S_REQUESTS[@]}")
    [ "$got" = "$want" ] || { echo "requests: got [$got] want [$want]"; rc=1; }
  fi
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; fi
  rm -rf "$dir"
  return "$rc"
}

conformance_several_all() {
  local kind a b c d e f g h i why n=0
  T="conformance several_cases"
  command -v python3 >/dev/null || { fail "python3 is needed to read conformance.json"; return; }
  while IFS=$'\t' read -r kind a b c d e f g h i; do
    case $kind in
      case)
        S_NAME=$a S_CALL=$b S_DAEMON=$c S_FAIL_OPEN=$d S_TIMEOUT=$e
        S_CHECKS=() S_REPLIES=() S_REQUESTS=() S_RAISES= S_RESULT=
        ;;
      check) S_CHECKS+=("$a $b $c") ;;
      reply) S_REPLIES+=("$a") ;;
      request) S_REQUESTS+=("$a") ;;
      raises) S_RAISES=$a ;;
      result) S_RESULT="$a $b $c $d $e $f $g $h $i" ;;
      end)
        n=$((n + 1))
        T="conformance several $S_NAME"
        if why=$(conformance_several_case); then ok; else fail "$why"; fi
        ;;
    esac
  done < <(conformance_several_records "$here/../conformance.json")
  [ "$n" -gt 0 ] || { T="conformance several_cases"; fail "none read"; }
}

conformance_headers_records() {
  python3 - "$1" <<'PY'
import json, sys
for c in json.load(open(sys.argv[1], encoding="utf-8"))["several_header_cases"]:
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
        print("header", f"Status: {e['status']}", sep="\t")
        for k, v in e["headers"].items():
            print("header", f"{k}: {v}", sep="\t")
    print("end", sep="\t")
PY
}

# conformance_headers_case: runs the several_header_cases case held in the H_* variables
# through rl_limit_all; prints why it failed.
conformance_headers_case() {
  local dir sock pid rc got want
  dir=$(mktemp -d "${RL_TEST_ROOT:-/tmp}/rl-sh-fake-XXXXXX")
  sock=$dir/fake.sock
  printf '%s\n' "${H_REPLIES[@]}" >"$dir/replies"
  : >"$dir/requests"
  pid=
  if [ "$H_DAEMON" != absent ]; then
    socat "UNIX-LISTEN:$sock,fork" "EXEC:bash $here/fake_daemon.sh $H_DAEMON $dir/replies $dir/requests" 2>/dev/null &
    pid=$!
    for _ in $(seq 1 200); do [ -S "$sock" ] && break; sleep 0.01; done
  fi
  (
    # shellcheck disable=SC2034 # read by rl_headers (ratelimitd.sh)
    RL_SOCKET=$sock RL_FAIL_OPEN=$H_FAIL_OPEN RL_LEGACY_HEADERS=$H_LEGACY RL_TIMEOUT=$H_TIMEOUT RL__WARNED=1
    out=$(rl_limit_all "${H_CHECKS[@]}")
    rc=$?
    rl_close
    if [ -n "$H_RAISES" ]; then
      if [ "$rc" = 2 ] && [ -z "$out" ]; then exit 0; fi
      echo "expected rc 2 ($H_RAISES) and no output, got $rc [$out]"
      exit 1
    fi
    # "Status: 429 Too Many Requests" compares as "Status: 429"; every line ends in CR LF.
    [ "$(printf '%s\n' "$out" | grep -vc $'\r$')" = 0 ] || { echo "a line without CR: [$out]"; exit 1; }
    got=$(printf '%s\n' "$out" | tr -d '\r' | sed -E 's/^(Status: [0-9]+).*/\1/' | sort)
    want=$(printf '%s\n' "${H_HEADERS[@]}" | sort)
    [ "$got" = "$want" ] || { echo "headers: got [$got] want [$want]"; exit 1; }
    case $rc in 0) [ "${H_HEADERS[0]}" = "Status: 200" ] ;; 1) [ "${H_HEADERS[0]}" = "Status: 429" ] ;; *) false ;; esac ||
      { echo "rc $rc for ${H_HEADERS[0]}"; exit 1; }
  )
  rc=$?
  if [ "$rc" = 0 ] && [ "${#H_REQUESTS[@]}" -gt 0 ]; then
    got=$(cat "$dir/requests")
    want=$(printf '%s\n' "${H_REQUESTS[@]}")
    [ "$got" = "$want" ] || { echo "requests: got [$got] want [$want]"; rc=1; }
  fi
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; fi
  rm -rf "$dir"
  return "$rc"
}

conformance_headers_all() {
  local kind a b c d e why n=0
  T="conformance several_header_cases"
  command -v python3 >/dev/null || { fail "python3 is needed to read conformance.json"; return; }
  while IFS=$'\t' read -r kind a b c d e; do
    case $kind in
      case)
        H_NAME=$a H_DAEMON=$b H_FAIL_OPEN=$c H_LEGACY=$d H_TIMEOUT=$e
        H_CHECKS=() H_REPLIES=() H_REQUESTS=() H_RAISES= H_HEADERS=()
        ;;
      check) H_CHECKS+=("$a $b $c") ;;
      reply) H_REPLIES+=("$a") ;;
      request) H_REQUESTS+=("$a") ;;
      raises) H_RAISES=$a ;;
      header) H_HEADERS+=("$a") ;;
      end)
        n=$((n + 1))
        T="conformance all-or-nothing $H_NAME"
        if why=$(conformance_headers_case); then ok; else fail "$why"; fi
        ;;
    esac
  done < <(conformance_headers_records "$here/../conformance.json")
  [ "$n" -gt 0 ] || { T="conformance several_header_cases"; fail "none read"; }
}
