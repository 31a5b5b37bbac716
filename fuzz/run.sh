#!/usr/bin/env bash
# Builds the fuzz targets (works on the stable toolchain) and, with --smoke,
# runs each one briefly over its corpus; with --long, runs each for minutes
# with AddressSanitizer and merges what it found into the committed corpus.
# Exits non-zero on any build failure or crash.
#
#   fuzz/run.sh                  build every target
#   fuzz/run.sh --smoke          build, then run each target (bounded; CI)
#   fuzz/run.sh --smoke grpc_frame http_connect    only these targets
#   fuzz/run.sh --long static_files go_regexp       5 minutes each, ASan, merge
#
# Environment:
#   FUZZ_RUNS=20000       libFuzzer -runs per target in --smoke (none in --long)
#   FUZZ_TIME=20          libFuzzer -max_total_time (seconds) per target
#                         (--long: 300)
#   FUZZ_SANITIZER=none   none | address (address needs nightly; on stable
#                         this script sets RUSTC_BOOTSTRAP=1 for it)
#                         (--long: address)
#   FUZZ_TOOLCHAIN=       e.g. +nightly (default: the default toolchain)
#
# Both modes start from everything in fuzz/corpus/<target>/: the hand-made
# seeds (seed-*, from gen_corpus.py) and the inputs earlier long runs kept.
# New inputs go to a scratch directory. --smoke throws them away; --long then
# minimizes (libFuzzer -merge=1: the seeds first, then every other input that
# adds coverage to them, in a fresh directory) and replaces the non-seed
# files of fuzz/corpus/<target>/ with the result, so the corpus grows only
# by inputs that reach new code; commit it. Targets run one at a time
# (-jobs 1). Crash inputs are written to fuzz/artifacts/<target>/. A summary
# gives runs, seconds and corpus size per target.
set -euo pipefail

cd "$(dirname "$0")"

mode=build
targets=()
for arg in "$@"; do
    case "$arg" in
        --smoke) mode=smoke ;;
        --long) mode=long ;;
        -h | --help)
            sed -n '2,33p' "$0"
            exit 0
            ;;
        -*)
            echo "run.sh: unknown option $arg" >&2
            exit 2
            ;;
        *) targets+=("$arg") ;;
    esac
done

if [ "$mode" = long ]; then
    max_time=${FUZZ_TIME:-300}
    sanitizer=${FUZZ_SANITIZER:-address}
    limits=()
else
    max_time=${FUZZ_TIME:-20}
    sanitizer=${FUZZ_SANITIZER:-none}
    limits=(-runs="${FUZZ_RUNS:-20000}")
fi
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

all=0
if [ ${#targets[@]} -eq 0 ]; then
    all=1
    # shellcheck disable=SC2086
    mapfile -t targets < <(cargo $toolchain fuzz list)
fi

fuzz() {
    # shellcheck disable=SC2086
    cargo $toolchain fuzz "$1" -s "$sanitizer" "${@:2}"
}

start=$(date +%s)
echo "== building ${targets[*]} (sanitizer: $sanitizer, $(rustc $toolchain -V))"
if [ "$all" = 1 ]; then
    fuzz build
else
    for t in "${targets[@]}"; do fuzz build "$t"; done
fi
echo "== built in $(($(date +%s) - start))s"

[ "$mode" = build ] && exit 0

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=()
summary=()
for t in "${targets[@]}"; do
    mkdir -p "$scratch/$t" "corpus/$t"
    before=$(find "corpus/$t" -type f | wc -l)
    t0=$(date +%s)
    echo "== $mode $t: ${limits[*]} -max_total_time=$max_time"
    status=ok
    if fuzz run "$t" "$scratch/$t" "corpus/$t" -- \
        "${limits[@]}" -max_total_time="$max_time" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 >"$scratch/$t.log" 2>&1; then
        echo "   ok in $(($(date +%s) - t0))s: $(grep -E '^Done' "$scratch/$t.log" || true)"
    else
        status=FAILED
        echo "   FAILED in $(($(date +%s) - t0))s:"
        # The panic or sanitizer report and the reproducer's path, else the tail.
        { grep -E -A12 "panicked at|^==[0-9]+==ERROR|deadly signal|ERROR: libFuzzer" "$scratch/$t.log" ||
            tail -n 30 "$scratch/$t.log"; } | head -n 40 | sed 's/^/   | /'
        grep -E "Test unit written to|Reproduce with" "$scratch/$t.log" | sed 's/^/   | /' || true
        failed+=("$t")
    fi
    secs=$(($(date +%s) - t0))
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$scratch/$t.log" | tail -n 1)
    after=$before
    if [ "$mode" = long ]; then
        # Minimize: the seeds, then whatever else adds coverage to them.
        merged="$scratch/$t.merged"
        mkdir -p "$merged"
        find "corpus/$t" -maxdepth 1 -type f -name 'seed-*' -exec cp {} "$merged/" \;
        mkdir -p "$scratch/$t.old"
        find "corpus/$t" -maxdepth 1 -type f ! -name 'seed-*' -exec mv {} "$scratch/$t.old/" \;
        if fuzz run "$t" "$merged" "$scratch/$t.old" "$scratch/$t" -- \
            -merge=1 -timeout=10 -rss_limit_mb=2048 >"$scratch/$t.merge.log" 2>&1; then
            find "$merged" -maxdepth 1 -type f ! -name 'seed-*' -exec mv {} "corpus/$t/" \;
        else
            echo "   merge FAILED (corpus left as it was):"
            tail -n 20 "$scratch/$t.merge.log" | sed 's/^/   | /'
            find "$scratch/$t.old" -maxdepth 1 -type f -exec mv {} "corpus/$t/" \;
            status="$status, merge failed"
            failed+=("$t(merge)")
        fi
        after=$(find "corpus/$t" -type f | wc -l)
    fi
    rate=-
    [ "$secs" -gt 0 ] && rate=$((${runs:-0} / secs))
    summary+=("$(printf '%-16s %-8s %12s runs %6ss  %8s exec/s  corpus %s -> %s' \
        "$t" "$status" "${runs:-?}" "$secs" "$rate" "$before" "$after")")
done
echo "== $mode total $(($(date +%s) - start))s (sanitizer: $sanitizer)"
printf '   %s\n' "${summary[@]}"
if [ ${#failed[@]} -ne 0 ]; then
    echo "== crashes or errors in: ${failed[*]} (inputs under fuzz/artifacts/)" >&2
    exit 1
fi
echo "== all ${#targets[@]} targets passed"
