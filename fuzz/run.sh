#!/usr/bin/env bash
# Builds the fuzz targets (works on the stable toolchain) and, with --smoke,
# runs each one briefly over its seed corpus. Exits non-zero on any build
# failure or crash.
#
#   fuzz/run.sh                  build every target
#   fuzz/run.sh --smoke          build, then run each target (bounded)
#   fuzz/run.sh --smoke grpc_frame http_connect    only these targets
#
# Environment:
#   FUZZ_RUNS=20000       libFuzzer -runs per target in --smoke
#   FUZZ_TIME=20          libFuzzer -max_total_time (seconds) per target
#   FUZZ_SANITIZER=none   none | address (address needs nightly; on stable
#                         this script sets RUSTC_BOOTSTRAP=1 for it)
#   FUZZ_TOOLCHAIN=       e.g. +nightly (default: the default toolchain)
#
# New inputs found by a smoke run go to a scratch directory, so the committed
# seed corpora (fuzz/corpus/<target>/seed-*) stay as they are. Crash inputs
# are written to fuzz/artifacts/<target>/.
set -euo pipefail

cd "$(dirname "$0")"

smoke=0
targets=()
for arg in "$@"; do
    case "$arg" in
        --smoke) smoke=1 ;;
        -h | --help)
            sed -n '2,22p' "$0"
            exit 0
            ;;
        -*)
            echo "run.sh: unknown option $arg" >&2
            exit 2
            ;;
        *) targets+=("$arg") ;;
    esac
done

runs=${FUZZ_RUNS:-20000}
max_time=${FUZZ_TIME:-20}
sanitizer=${FUZZ_SANITIZER:-none}
toolchain=${FUZZ_TOOLCHAIN:-}

# shellcheck disable=SC2086 # $toolchain is empty or one word
if ! cargo $toolchain fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install --locked cargo-fuzz
fi

# -Zsanitizer=... is a nightly flag: on a stable compiler, let it through.
# shellcheck disable=SC2086
if [ "$sanitizer" != none ] && ! rustc $toolchain -V | grep -q nightly; then
    export RUSTC_BOOTSTRAP=1
fi

if [ ${#targets[@]} -eq 0 ]; then
    # shellcheck disable=SC2086
    mapfile -t targets < <(cargo $toolchain fuzz list)
fi

fuzz() {
    # shellcheck disable=SC2086
    cargo $toolchain fuzz "$1" -s "$sanitizer" "${@:2}"
}

start=$(date +%s)
echo "== building ${targets[*]} (sanitizer: $sanitizer, $(rustc $toolchain -V))"
fuzz build
echo "== built in $(($(date +%s) - start))s"

[ "$smoke" = 1 ] || exit 0

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=()
for t in "${targets[@]}"; do
    mkdir -p "$scratch/$t"
    t0=$(date +%s)
    echo "== smoke $t: -runs=$runs -max_total_time=$max_time"
    if fuzz run "$t" "$scratch/$t" "corpus/$t" -- \
        -runs="$runs" -max_total_time="$max_time" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 >"$scratch/$t.log" 2>&1; then
        echo "   ok in $(($(date +%s) - t0))s: $(grep -E '^Done' "$scratch/$t.log" || true)"
    else
        echo "   FAILED in $(($(date +%s) - t0))s:"
        # The panic or sanitizer report and the reproducer's path, else the tail.
        { grep -E -A12 "panicked at|^==[0-9]+==ERROR|deadly signal|ERROR: libFuzzer" "$scratch/$t.log" ||
            tail -n 30 "$scratch/$t.log"; } | head -n 40 | sed 's/^/   | /'
        grep -E "Test unit written to|Reproduce with" "$scratch/$t.log" | sed 's/^/   | /' || true
        failed+=("$t")
    fi
done
echo "== smoke total $(($(date +%s) - start))s"
if [ ${#failed[@]} -ne 0 ]; then
    echo "== crashes or errors in: ${failed[*]} (inputs under fuzz/artifacts/)" >&2
    exit 1
fi
echo "== all ${#targets[@]} targets passed"
