#!/usr/bin/env bash
# A tiny CGI-style handler: prints an HTTP response, 429 with the headers when the
# caller (REMOTE_ADDR) is over the rides_request limit.
#   RL_SOCKET=/run/ratelimitd/ratelimitd.sock REMOTE_ADDR=10.0.0.1 bash example.sh
. "$(dirname "$0")/ratelimitd.sh"
rl_check rides_request "${REMOTE_ADDR:-local}"
case $? in
  0) printf 'Status: 200 OK\r\n'; rl_headers | sed 's/$/\r/'; printf '\r\nhello\n' ;;
  1) printf 'Status: 429 Too Many Requests\r\n'; rl_headers | sed 's/$/\r/'; printf '\r\nslow down\n' ;;
  *) printf 'Status: 500 Internal Server Error\r\n\r\n%s\n' "$RL_ERROR" ;;
esac
