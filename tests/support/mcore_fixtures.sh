# mcore_fixtures.sh: what the tests of Megatron-Core's own checkpoints share
# (sourced after tests/e2e/lib.sh): the real checkpoints of
# tests/data/megatron-core unpacked into $WORK (the test skipped without the
# Python modules their judges read them with), and the dialect of PyTorch's
# DCP at hand: DIALECT is what --dcp-torch writes for its load to judge
# (1.13's torch.distributed._shard.checkpoint, or 2.x's), TORCH 1 where
# python3-torch is installed.
DATA="$ROOT/tests/data/megatron-core"
skip_without_python 'h5py, numpy, xxhash, zstandard' "python3-h5py, -numpy, -xxhash or -zstandard is not installed"
expect_ok "the real checkpoints unpacked" "$PY" -c '
import sys, tarfile, zstandard
with open(sys.argv[1], "rb") as f, zstandard.ZstdDecompressor().stream_reader(f) as r:
    tarfile.open(fileobj=r, mode="r|").extractall(sys.argv[2])' "$DATA/checkpoints.tar.zst" "$WORK"
TORCH=0 DIALECT=2
if "$PY" -c 'import torch' 2>/dev/null; then
    TORCH=1
    "$PY" -c 'import torch.distributed.checkpoint' 2>/dev/null || DIALECT=1.13
fi
