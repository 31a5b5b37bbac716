#!/usr/bin/env bash
# Usage: tests/interop/selftest.sh VENV_DIR
#
# Python-only self-test of the interop peers (no edgetunnel binary involved):
#   1. fake_server <-> fake_agent -> echo_server  (1 conn, then 4 concurrent conns, then dial error)
#   2. proxy_client -> mini_anp_server (unix socket) -> fake_agent -> echo_server
#      (per-connection streams, shared stream, and "No agent available" dial error)
# Runs setup.sh first. Prints one line per case and, last, "N passed, N failed".
# Exit 0 iff all cases passed.
set -uo pipefail
if [[ $# -ne 1 || "$1" == -* ]]; then echo "usage: $0 VENV_DIR" >&2; exit 2; fi
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$HERE/setup.sh" "$1" >/dev/null || { echo "FAIL setup.sh"; exit 1; }
PY="$1/bin/python"
T="$(mktemp -d)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; [[ -n "${KEEP:-}" ]] && echo "kept $T" || rm -rf "$T"; }
trap cleanup EXIT
"$HERE/gen_certs.sh" "$T/pki" >/dev/null || { echo "FAIL gen_certs.sh"; exit 1; }
K="$T/pki"
pass=0; fail=0
result() { if [[ $2 -eq 0 ]]; then pass=$((pass+1)); echo "PASS $1"; else fail=$((fail+1)); echo "FAIL $1 (see $3)"; tail -n 5 "$3" | sed 's/^/    /'; fi; }
port_of() {  # file key -> waits for "LISTENING key=N"
  for _ in $(seq 100); do
    v="$(sed -n "s/^LISTENING $2=\([0-9]*\).*/\1/p" "$1")"; [[ -n "$v" ]] && { echo "$v"; return; }; sleep 0.1
  done; echo 0
}

"$PY" "$HERE/echo_server.py" --listen 127.0.0.1:0 --timeout 120 >"$T/echo.out" 2>&1 & PIDS+=($!)
EP="$(port_of "$T/echo.out" port)"

server_agent() {  # name, fake_server extra args
  local name="$1"; shift
  "$PY" "$HERE/fake_server.py" --listen 127.0.0.1:0 --ca "$K/ca.crt" --cert "$K/server.crt" --key "$K/server.key" \
    --server-id py-s1 --server-count 1 --expect-agent-id py-agent --expect-identifiers 'host=node-py' \
    --expect-token tok --timeout 30 "$@" >"$T/$name.srv" 2>&1 & local sp=$!
  local port; port="$(port_of "$T/$name.srv" port)"
  "$PY" "$HERE/fake_agent.py" --server "127.0.0.1:$port" --server-name localhost --ca "$K/ca.crt" \
    --cert "$K/client.crt" --key "$K/client.key" --agent-id py-agent --identifiers 'host=node-py' --token tok \
    --serve-seconds 25 --timeout 30 >"$T/$name.agent" 2>&1; local arc=$?
  wait $sp; local src=$?
  grep -q '^HEADERS serverID=py-s1 serverCount=1$' "$T/$name.agent" || arc=1
  grep -q '^AGENT id=py-agent identifiers=host=node-py$' "$T/$name.srv" || src=1
  cat "$T/$name.srv" "$T/$name.agent" >"$T/$name.log"
  result "$name" $((arc || src)) "$T/$name.log"
}
server_agent server-agent-1conn --dial "127.0.0.1:$EP" --payload-size 1048576
server_agent server-agent-4conn-8MiB --dial "127.0.0.1:$EP" --payload-size 8388608 --connections 4
server_agent server-agent-dial-error --dial "127.0.0.1:1" --expect-dial-error

# proxy_client through the mini server; first without any agent.
SOCK="$T/frontend.sock"
"$PY" "$HERE/mini_anp_server.py" --agent-listen 127.0.0.1:0 --frontend "unix:$SOCK" --ca "$K/ca.crt" \
  --cert "$K/server.crt" --key "$K/server.key" --timeout 100 >"$T/mini.out" 2>&1 & PIDS+=($!)
AP="$(port_of "$T/mini.out" agent_port)"
"$PY" "$HERE/proxy_client.py" --target "unix:$SOCK" --dial "127.0.0.1:$EP" --expect-dial-error --timeout 20 >"$T/noagent.log" 2>&1
result client-no-agent-dial-error $? "$T/noagent.log"

"$PY" "$HERE/fake_agent.py" --server "localhost:$AP" --ca "$K/ca.crt" --cert "$K/client.crt" --key "$K/client.key" \
  --agent-id py-agent --identifiers 'host=node-py' --serve-seconds 60 --timeout 70 >"$T/agent2.log" 2>&1 & PIDS+=($!)
for _ in $(seq 100); do grep -q '^READY' "$T/agent2.log" && break; sleep 0.1; done
"$PY" "$HERE/proxy_client.py" --target "unix:$SOCK" --dial "127.0.0.1:$EP" --payload-size 4194304 --connections 4 \
  --timeout 30 >"$T/c1.log" 2>&1
result client-agent-4streams $? "$T/c1.log"
"$PY" "$HERE/proxy_client.py" --target "unix:$SOCK" --dial "127.0.0.1:$EP" --payload-size 1048576 --connections 4 \
  --streams shared --timeout 30 >"$T/c2.log" 2>&1
result client-agent-shared-stream $? "$T/c2.log"
"$PY" "$HERE/proxy_client.py" --target "unix:$SOCK" --dial "127.0.0.1:1" --expect-dial-error --timeout 20 >"$T/c3.log" 2>&1
result client-agent-dial-refused $? "$T/c3.log"

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
