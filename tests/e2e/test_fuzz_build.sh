#!/bin/sh
# The fuzzers (make fuzz, tests/fuzz/fuzz_*.c) build with clang and run: each
# for a second from its seed corpus, in a directory of this test's own. They
# had rotted unseen once: a library file newly drawn into their link called a
# function clang 14 cannot reach across files (kernels/cpu/vector_clones.h),
# and `make fuzz` stopped linking. Nothing is left in TMPDIR. Skipped,
# saying so, without clang.
# takes: about 45 s alone on 2 cores
# tier: full
. "$(dirname "$0")/lib.sh"

if ! command -v clang >/dev/null; then
    echo "[SKIP] [$NAME] clang is not installed (make deps installs it)"
    finish
    exit 0
fi
mkdir "$WORK/tmp"
run env TMPDIR="$WORK/tmp" make -C "$ROOT" --no-print-directory fuzz FUZZ_BUILD="$WORK/fuzz" FUZZ_SECONDS=1
check_all "make fuzz builds every fuzzer and runs it (exit $RC)" '[ $RC -eq 0 ]'
[ $RC -eq 0 ] || sed 's/^/    /' "$WORK/.err" | tail -20
targets=$(sed -n 's/^FUZZ_TARGETS := //p' "$ROOT/Makefile")
for t in $targets; do
    check "fuzz_$t ran its corpus and fuzzed, no crash" \
        sh -c "grep -q 'number_of_executed_units: [1-9]' '$WORK/fuzz/fuzz_$t.log' && ! ls '$WORK/fuzz/crashes/' | grep -q ."
done
# Their scratch directories (tests/support/fuzz_scratch.h) go with them:
# fuzz_dcp's was left in /tmp at every run, three others ignored TMPDIR.
check "the fuzzers leave nothing in TMPDIR" [ -z "$(ls -A "$WORK/tmp")" ]
finish
