"""peak_within.py OUT MIB: the "peak memory X (--memory-limit Y)" line that
tp-ckpt verify and copy print under --memory-limit, in OUT, says at most MIB
MiB (the process's own peak, getrusage: a parent's count of its children
would include what a Python parent held when it spawned them)."""
import re
import sys

text = open(sys.argv[1]).read()
found = re.findall(r"^peak memory ([0-9.]+) (B|KiB|MiB|GiB) \(--memory-limit ", text, re.M)
assert found, "no peak memory line in:\n" + text
value, unit = found[-1]
peak = float(value) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]
assert 0 < peak <= int(sys.argv[2]) * 2**20, (peak, sys.argv[2])
print(f"peak {peak / 2**20:.1f} MiB within {sys.argv[2]} MiB")
