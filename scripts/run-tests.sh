#!/bin/sh
# Runs every test: the Criterion unit tests (build/tests/*/test_*) and the
# end-to-end tests of the real programs (tests/e2e/test_*.sh).
# BUILD selects the build directory; SANITIZED=1 for the ASan/UBSan build.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export BUILD
if [ "${SANITIZED:-0}" = 1 ]; then
    # HDF5 keeps global state until exit; leaks are checked, third-party ones suppressed.
    export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=99"
    export LSAN_OPTIONS="suppressions=$(pwd)/tests/lsan.supp:print_suppressions=0"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
fi
failed=""
start=$(date +%s)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# MPI programs: Open MPI keeps allocations from MPI_Init, some in components it
# unloads at exit; only full stack unwinding shows them as its own (tests/lsan.supp).
# End-to-end scripts that use mpirun ask for it themselves (lib.sh use_open_mpi).
mpi_env() {
    case "$1" in
    */trainer/*) [ "${SANITIZED:-0}" = 1 ] && echo "ASAN_OPTIONS=$ASAN_OPTIONS:fast_unwind_on_malloc=0" ;;
    esac
}
for t in "$BUILD"/tests/*/test_*; do
    [ -x "$t" ] || continue
    echo "== $t"
    # Verbose so that skipped tests (a GPU test without a GPU) show as SKIP.
    env $(mpi_env "$t") "$t" --jobs 2 --short-filename --verbose >"$log" 2>&1
    rc=$?
    grep -E '^\[(SKIP|FAIL|----|ERR )\]|Synthesis|CRASH' "$log"
    [ $rc -eq 0 ] || failed="$failed $t"
done
for t in tests/e2e/test_*.sh tests/faults/test_*.sh tests/elastic/test_*.sh tests/gpu/test_*.sh tests/support/test_*.sh; do
    [ -e "$t" ] || continue
    echo "== $t"
    if ! env $(mpi_env "$t") sh "$t"; then failed="$failed $t"; fi
done
echo "== all tests ran in $(( $(date +%s) - start )) s"
if [ -n "$failed" ]; then
    echo "FAILED:$failed" >&2
    exit 1
fi
echo "all passed"
