#!/bin/sh
# The PyTorch Llama reference (tests/trainer/llama_ref.py) checked on its own,
# independently of tp-train (tests/trainer/test_llama_ref.py): rotary
# embeddings against Meta's complex formulation on permuted weights,
# grouped-query attention against KV heads expanded explicitly, RMSNorm's
# values, Llama 3's frequency scaling against hand-computed values, names
# and causality. Skipped without python3-torch.
# tier: check
. "$(dirname "$0")/lib.sh"

skip_without_python 'torch, numpy' "python3-torch is not installed"

run "$PY" "$ROOT/tests/trainer/test_llama_ref.py"
sed 's/^/    /' "$WORK/.out"
check_all "the Llama reference's self-test (exit $RC)" \
    '[ "$RC" -eq 0 ] && grep -q "^test_llama_ref: 0 failed$" "$WORK/.out" && ! grep -q ": FAIL" "$WORK/.out"'

finish
