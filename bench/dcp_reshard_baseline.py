#!/usr/bin/python3
"""PyTorch's own route to rechunk a distributed checkpoint offline, in one
process: load every entry whole with torch.distributed.checkpoint (as
format_utils.dcp_to_torch_save does), then save the state dict again with
it. Used by `make bench-dcp` as the baseline; runs with PyTorch 1.13's
torch.distributed._shard.checkpoint or 2.x's (tests/formats/dcp_torch.py).

Usage: dcp_reshard_baseline.py SRC DST
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "formats"))
import dcp_torch  # noqa: E402


def main(src, dst):
    state = dcp_torch.load_whole(src)
    dcp_torch.save(state, dst)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
