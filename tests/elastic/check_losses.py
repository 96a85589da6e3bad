"""Checks that a run kept by tp-elastic logged the losses of an uninterrupted
run: every step 1..STEPS is in LOG (its last line for a step, when steps were
recomputed after a restart) and equals REF's loss to 1e-4 relative.

Usage: check_losses.py LOG REF STEPS   (exit 0, or 1 with why)
"""
import json
import sys


def losses(path):
    out = {}
    for line in open(path):
        record = json.loads(line)
        if "event" not in record and "step" in record:
            out[record["step"]] = record["loss"]
    return out


def main():
    got, ref, steps = losses(sys.argv[1]), losses(sys.argv[2]), int(sys.argv[3])
    missing = [s for s in range(1, steps + 1) if s not in got]
    if missing:
        sys.exit("steps missing: %s" % missing[:10])
    # A diverged step's loss is null in the log (JSON has no NaN).
    nonfinite = [s for s in range(1, steps + 1) if got[s] is None or ref[s] is None]
    if nonfinite:
        sys.exit("losses non-finite (null) at steps %s" % nonfinite[:10])
    worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in range(1, steps + 1))
    if worst > 1e-4:
        sys.exit("losses differ from the uninterrupted run by %.3e relative" % worst)


main()
