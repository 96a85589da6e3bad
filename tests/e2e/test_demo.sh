#!/bin/sh
# make demo (scripts/demo.sh), the first command README.md gives a new user,
# run whole into this test's directory: it must finish, every step of it
# (the script stops at the first failure: set -e, and its own checks), with
# llama.cpp's run of the GGUF where node-llama-cpp is installed.
# tier: full
. "$(dirname "$0")/lib.sh"

skip_without_python 'torch, numpy, h5py' "python3-torch (or h5py) is not installed"
use_open_mpi
# The repository's own demo-run/ (a user's last make demo) is left as it was.
listing() { ls -la --time-style=full-iso "$ROOT/demo-run" 2>&1 | md5sum; }
BEFORE=$(listing)
run env DEMO_OUT="$WORK/demo" BUILD="${BUILD:-build}" "$ROOT/scripts/demo.sh" </dev/null
check "the demo finishes" [ "$RC" -eq 0 ]
check "and says so" grep -q "^== demo done: checkpoints and exports are in $WORK/demo/" "$WORK/.out"
check "every one of its steps ran" \
    [ "$(grep -c '^== [0-9][0-9]*\. ' "$WORK/.out")" -eq "$(grep -c '^say "[0-9][0-9]*\. ' "$ROOT/scripts/demo.sh")" ]
if grep -q "llama.cpp's own run skipped" "$WORK/.out"; then
    echo "[SKIP] [$NAME] llama.cpp's run of the demo's GGUF: $(grep "llama.cpp's own run skipped" "$WORK/.out")"
else
    check "llama.cpp ran the demo's GGUF" grep -q "^   llama.cpp computes a loss of " "$WORK/.out"
fi
check "the repository's demo-run/ untouched (DEMO_OUT honoured)" [ "$(listing)" = "$BEFORE" ]
finish
