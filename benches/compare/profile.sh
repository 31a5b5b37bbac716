#!/usr/bin/env bash
# Where the CPU goes (issue 29): runs the compare bench's bulk and latency
# cases with a profiler attached to each system's processes for exactly the
# measured window (benches/compare/profile.rs), three times:
#   1. perf record (flat profile, kernel call graphs)   -> OUT/record/*.data
#   2. perf stat: syscalls, io_uring ops, context switches, TLS records
#      (uprobes on ring's AES-GCM seal/open and OpenSSL's EVP_CipherFinal_ex,
#      one call per record)                              -> OUT/stat/*.txt
#   3. strace -c -f: syscalls by name                    -> OUT/strace/*.txt
# Each pass also writes the run's compare.md (the work done: bytes, req/s),
# which the figures are divided by. Needs root (perf, uprobes, strace).
#   benches/compare/profile.sh OUT [SYSTEMS] [BULK_MIB]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: profile.sh OUT [SYSTEMS] [BULK_MIB]}
SYSTEMS=${2:-edgetunnel-connect,edgetunnel-grpc,haproxy-tls-pair,anp-uds}
MIB=${3:-256}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cargo bench --bench compare --no-run 2>/dev/null
BIN=$(ls -t target/release/deps/compare-* | grep -v '\.d$' | head -1)
ET=target/release/edgetunnel
export COMPARE_PROFILE_ONLY=${COMPARE_PROFILE_ONLY:-}
run() { # PASS PROFILER
  mkdir -p "$OUT/$1"
  COMPARE_PROFILE_DIR="$OUT/$1" COMPARE_PROFILE="$2" "$BIN" --bench \
    --systems "$SYSTEMS" --scenarios bulk,latency --reps 1 --bulk-mib "$MIB" \
    --out "$OUT/$1/run" >"$OUT/$1/run.log" 2>&1
  uptime >>"$OUT/$1/run.log"
}

# TLS records: one uprobe per AEAD seal/open of a record.
perf probe -d 'probe_edgetunnel:*' -d 'probe_libcrypto:*' >/dev/null 2>&1 || true
sym() { nm "$ET" | awk -v p="$1" '$3 ~ p {print $3; exit}'; }
perf probe -q -x "$ET" --no-demangle -a "et_seal=$(sym '4ring4aead9algorithm12aes_gcm_seal')"
perf probe -q -x "$ET" --no-demangle -a "et_open=$(sym '4ring4aead9algorithm12aes_gcm_open')"
LIBCRYPTO=$(ldconfig -p | awk '/libcrypto.so.3 .*x86-64/ {print $NF; exit}')
perf probe -q -x "$LIBCRYPTO" -a 'ossl_final=EVP_CipherFinal_ex'
EVENTS=task-clock,context-switches,raw_syscalls:sys_enter
EVENTS=$EVENTS,io_uring:io_uring_submit_req,io_uring:io_uring_poll_arm,io_uring:io_uring_complete
EVENTS=$EVENTS,net:net_dev_xmit,probe_edgetunnel:et_seal,probe_edgetunnel:et_open
EVENTS=$EVENTS,probe_libcrypto:ossl_final

run record 'perf record -F 1999 -g -o {out}.data -p {pids}'
run stat "perf stat -e $EVENTS -o {out}.txt -p {pids}"
run strace 'strace -c -f -o {out}.txt -p {pids}'
perf probe -d 'probe_edgetunnel:*' -d 'probe_libcrypto:*' >/dev/null 2>&1 || true
echo "profiles in $OUT"
