#!/usr/bin/env bash
# Usage: tests/interop/gen_certs.sh OUT_DIR
#
# Writes a throw-away PKI for interop tests into OUT_DIR (created if missing):
#   ca.crt ca.key            self-signed CA (EC P-256, basicConstraints CA:TRUE)
#   server.crt server.key    leaf for SAN DNS:localhost, IP:127.0.0.1, IP:::1 (serverAuth)
#   client.crt client.key    leaf CN=interop-agent (clientAuth), for agents/mTLS clients
# Keys are PKCS#8 PEM (what rustls and grpcio both accept). Valid 2 days.
# Exit 0 and last line "OK certs=OUT_DIR"; non-zero if openssl fails; 2 on usage error.
set -euo pipefail
if [[ $# -ne 1 || "$1" == -* ]]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
D="$1"
mkdir -p "$D"
cd "$D"

LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
ossl() { openssl "$@" 2>"$LOG" || { echo "FAIL openssl $1:" >&2; cat "$LOG" >&2; return 1; }; }

ossl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ca.key
ossl req -x509 -new -key ca.key -sha256 -days 2 -subj "/CN=edgetunnel-interop-ca" \
  -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -addext "subjectKeyIdentifier=hash" -out ca.crt

leaf() {  # name CN extfile-lines
  local name="$1" cn="$2" ext="$3"
  ossl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$name.key"
  ossl req -new -key "$name.key" -subj "/CN=$cn" -out "$name.csr"
  printf '%b' "$ext" > "$name.ext"
  ossl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 -days 2 \
    -extfile "$name.ext" -out "$name.crt"
  rm -f "$name.csr" "$name.ext"
}
COMMON='basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nauthorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n'
leaf server localhost "${COMMON}extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1\n"
leaf client interop-agent "${COMMON}extendedKeyUsage=clientAuth\nsubjectAltName=DNS:interop-agent\n"
rm -f ca.srl
openssl verify -CAfile ca.crt server.crt client.crt >/dev/null
echo "OK certs=$D"
