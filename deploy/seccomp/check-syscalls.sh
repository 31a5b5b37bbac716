#!/usr/bin/env bash
# Runs an edgetunnel server and agent with traffic through both frontends
# (HTTP CONNECT and gRPC) and lists the system calls they made that
# edgetunnel.json does not allow. With STRACE=0 it instead measures the
# CPU the server and agent spend per GiB through the tunnel, under the
# driver given by EDGETUNNEL_DRIVER (uring or legacy).
#
#   deploy/seccomp/check-syscalls.sh [BIN] [ANPTOOL]
# BIN: an edgetunnel binary (target/release/edgetunnel); ANPTOOL: the
# peers' anptool (target/peers/anptool), the target and the client.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${1:-target/release/edgetunnel}
ANPTOOL=${2:-target/peers/anptool}
STRACE=${STRACE:-1}
SIZE=${SIZE:-$((1 << 30))}
W=$(mktemp -d /tmp/edgetunnel-syscalls.XXXXXX)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$W"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wrap() { if [ "$STRACE" = 1 ]; then exec strace -f -qq -c -U name -o "$W/$1.strace" "${@:2}"; else exec "${@:2}"; fi; }

"$BIN" certs init "$W/certs" >/dev/null
T=$(port); A=$(port); C=$(port); G=$(port)
"$ANPTOOL" target -listen "127.0.0.1:$T" >"$W/target.log" 2>&1 & pids+=($!)
wrap server "$BIN" server --certs-dir "$W/certs" --agent-bind "127.0.0.1:$A" --connect-bind "127.0.0.1:$C" \
  --grpc-bind "127.0.0.1:$G" --admin-bind 127.0.0.1:0 >"$W/server.out" 2>"$W/server.log" & pids+=($!)
SERVER=$!
for _ in $(seq 100); do grep -q READY "$W/server.out" 2>/dev/null && break; sleep 0.1; done
wrap agent "$BIN" agent --certs-dir "$W/certs" --server-addr "127.0.0.1:$A" --server-name localhost \
  --agent-id node-1 --agent-identifiers 'ipv4=127.0.0.1' --allow-destinations "127.0.0.1/32:$T" --drain-grace-secs 0 \
  >"$W/agent.out" 2>"$W/agent.log" & pids+=($!)
AGENT=$!
for _ in $(seq 100); do grep -q CONNECTED "$W/agent.out" 2>/dev/null && break; sleep 0.1; done
grep -q CONNECTED "$W/agent.out" || { cat "$W/agent.log"; exit 1; }

cpu() { # utime+stime of a process and its threads, in clock ticks
  local p=$1; [ "$STRACE" = 1 ] && p=$(pgrep -P "$1" | head -1)
  awk '{print $14+$15}' "/proc/$p/stat"; }
c0=$(( $(cpu $SERVER) + $(cpu $AGENT) ))
t0=$(date +%s.%N)
"$ANPTOOL" client -via connect -addr "127.0.0.1:$C" -target "127.0.0.1:$T" -test down -size "$SIZE" | head -1
"$ANPTOOL" client -via grpc -addr "127.0.0.1:$G" -target "127.0.0.1:$T" -test echo | head -1
"$ANPTOOL" client -via grpc -addr "127.0.0.1:$G" -target "127.0.0.1:$T" -test up -size $((SIZE / 4)) | head -1
t1=$(date +%s.%N)
c1=$(( $(cpu $SERVER) + $(cpu $AGENT) ))
if [ "$STRACE" != 1 ]; then
  hz=$(getconf CLK_TCK)
  python3 -c "gib=($SIZE*1.25)/2**30; s=($c1-$c0)/$hz; print(f'driver={__import__(\"os\").environ.get(\"EDGETUNNEL_DRIVER\",\"auto\")} {gib:.2f} GiB in {$t1-$t0:.2f} s wall, server+agent CPU {s:.2f} s = {s/gib:.3f} CPU-s/GiB')"
  exit 0
fi
# SIGTERM to edgetunnel itself; strace writes its table when it exits.
kill -TERM "$(pgrep -P $SERVER)" "$(pgrep -P $AGENT)"
wait $SERVER $AGENT || true
python3 - "$HERE/edgetunnel.json" "$W/server.strace" "$W/agent.strace" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
allowed = {n for s in p["syscalls"] if s["action"] == "SCMP_ACT_ALLOW" for n in s["names"]}
# clone3 answers ENOSYS (38), as in Docker's profile: glibc then uses clone.
enosys = {n for s in p["syscalls"] if s.get("errnoRet") == 38 for n in s["names"]}
bad = 0
for f in sys.argv[2:]:
    used = {l.split()[-1] for l in open(f) if l.strip() and not l.startswith(("%", "-", "100", " 100")) and l.split()[-1] not in ("total", "syscall")}
    missing = sorted(used - allowed - enosys)
    print(f"{f.rsplit('/',1)[1]}: {len(used)} distinct calls; not in the profile: {missing or 'none'}; ENOSYS by design: {sorted(used & enosys)}")
    bad += len(missing)
sys.exit(1 if bad else 0)
PY
