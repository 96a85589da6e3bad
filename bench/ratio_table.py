#!/usr/bin/python3
"""The table of a benchmark's runs side by side (scripts/bench-lib.sh
rounds): per cache state and tool, the runs, the median seconds, GB/s of
the tensor bytes, the largest peak RSS, and the speed against `cp` and the
Python baseline (tools named cp and python) from the same cache state, or
from the cold runs when a tool ran only cold.

Usage: ratio_table.py RESULTS BYTES DIGITS TOOL=LABEL...
  RESULTS: lines "CACHE TOOL JSON" (JSON: measure.py's seconds, max_rss_bytes, status)
  DIGITS: decimals of the seconds column
A run that failed (its status not 0) makes no table: the script stops,
naming the tool and the cache state (its seconds are those of a failure).
"""
import json
import statistics
import sys


def main(results, bytes_, digits, labels):
    runs = {}
    for line in open(results):
        cache, tool, m = line.split(" ", 2)
        m = json.loads(m)
        if m.get("status", 0) != 0:
            sys.exit("ratio_table.py: %s (%s, %s cache) failed with status %s: no table of a failure's seconds" % (
                labels.get(tool, tool), tool, cache, m["status"]))
        runs.setdefault((cache, tool), []).append(m)

    def median(cache, tool):
        return statistics.median(m["seconds"] for m in runs.get((cache, tool), runs.get(("cold", tool), [])))

    # The Python column where a benchmark has a Python baseline.
    python = any(tool == "python" for _, tool in runs)
    out = ["| cache | tool | runs | seconds (median) | GB/s | peak RSS | vs cp |" + (" vs Python |" if python else ""),
           "| --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if python else "")]
    for (cache, tool), ms in runs.items():
        seconds = median(cache, tool)
        row = "| %s | %s | %d | %.*f | %.2f | %.0f MiB | %.2fx |" % (
            cache, labels[tool], len(ms), digits, seconds, bytes_ / seconds / 1e9,
            max(m["max_rss_bytes"] for m in ms) / 2**20, median(cache, "cp") / seconds)
        out.append(row + (" %.2fx |" % (median(cache, "python") / seconds) if python else ""))
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), dict(a.split("=", 1) for a in sys.argv[4:]))
