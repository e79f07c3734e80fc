#!/usr/bin/env bash
# The conformance table's stand-in daemon, one connection (socat runs it per
# connection with the socket as stdin/stdout): MODE reply answers the i-th request
# line with line i of REPLIES_FILE (and closes after ERR BUSY/PERM), stall never
# answers, close closes after reading one line. Every request line is appended to
# REQUESTS_FILE; every connection adds a line to REQUESTS_FILE.conns.
mode=$1 replies=$2 requests=$3
echo x >>"$requests.conns"
mapfile -t lines <"$replies"
i=0
while IFS= read -r line; do
  printf '%s\n' "$line" >>"$requests"
  case $mode in
    close) exit 0 ;;
    stall) continue ;;
  esac
  [ "$i" -lt "${#lines[@]}" ] || continue
  printf '%s\n' "${lines[i]}"
  case ${lines[i]} in "ERR BUSY"* | "ERR PERM"*) exit 0 ;; esac
  i=$((i + 1))
done
