#!/usr/bin/env bash
# Test helper shared by every client's tests: start, stop, pause or resume a real
# ratelimitd (redis.mode = "none") in DIR, on DIR/rl.sock, pid in DIR/pid.
#
#   testdaemon.sh start DIR     start (config written once) and wait until it answers PING
#   testdaemon.sh stop DIR      SIGTERM by pid, wait for the exit (SIGKILL after 10 s)
#   testdaemon.sh pause DIR     SIGSTOP (the daemon accepts nothing, answers nothing)
#   testdaemon.sh resume DIR    SIGCONT
#
# Needs RATELIMITD_BIN (the daemon binary) and socat. clients/run_tests.sh sets it and
# kills, by pid, every daemon left under its temp root.
set -euo pipefail

cmd=${1:?usage: testdaemon.sh start|stop|pause|resume DIR}
dir=${2:?usage: testdaemon.sh start|stop|pause|resume DIR}
bin=${RATELIMITD_BIN:?set RATELIMITD_BIN to the ratelimitd binary}

pid_of() { cat "$dir/pid" 2>/dev/null || true; }

# True while the process exists and is not a zombie (an orphan may wait to be reaped).
running() {
  local pid=$1 state
  [ -n "$pid" ] || return 1
  state=$(awk '/^State:/ { print $2 }' "/proc/$pid/status" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

case $cmd in
start)
  mkdir -p "$dir"
  if [ ! -f "$dir/rl.toml" ]; then
    cat >"$dir/rl.toml" <<CONF
[server]
socket = "$dir/rl.sock"
socket_mode = "0600"

[redis]
mode = "none"

# 5 per key, refilling one token every ~17 minutes: exact counts in tests.
[[rule]]
name = "api"
algorithm = "token_bucket"
capacity = 5
refill_rate = 0.001

[[rule]]
name = "fast"
algorithm = "token_bucket"
capacity = 1000000
refill_rate = 1000000.0

# 2 requests in flight per key (ACQUIRE / RELEASE).
[[rule]]
name = "inflight"
algorithm = "concurrency"
limit = 2
max_hold = "60s"
CONF
  fi
  # A session of its own: were it in the caller's process group, that group becoming
  # orphaned while the daemon is paused would make the kernel send it SIGHUP + SIGCONT.
  # (setsid execs in place: $! is the daemon's pid.)
  setsid "$bin" --config "$dir/rl.toml" </dev/null >>"$dir/daemon.log" 2>&1 &
  echo $! >"$dir/pid"
  for _ in $(seq 1 500); do
    if [ "$(printf 'PING\n' | socat -t 1 - "UNIX-CONNECT:$dir/rl.sock" 2>/dev/null)" = PONG ]; then
      exit 0
    fi
    if ! running "$(pid_of)"; then
      echo "testdaemon.sh: daemon exited during start-up:" >&2
      tail -n 20 "$dir/daemon.log" >&2
      exit 1
    fi
    sleep 0.02
  done
  echo "testdaemon.sh: daemon not answering on $dir/rl.sock after 10 s" >&2
  exit 1
  ;;
stop)
  pid=$(pid_of)
  running "$pid" || exit 0
  kill -CONT "$pid" 2>/dev/null || true
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 500); do
    running "$pid" || exit 0
    sleep 0.02
  done
  kill -KILL "$pid" 2>/dev/null || true
  ;;
pause) kill -STOP "$(pid_of)" ;;
resume) kill -CONT "$(pid_of)" ;;
*)
  echo "testdaemon.sh: unknown command $cmd" >&2
  exit 2
  ;;
esac
