#!/usr/bin/python3
"""Runs a command and prints {"seconds": wall time, "max_rss_bytes": its peak
resident memory, "status": exit status} as one JSON line. Its output goes to
stderr so that stdout stays the measurement.

Usage: measure.py CMD [ARG...]
"""
import json
import os
import subprocess
import sys
import time

start = time.monotonic()
child = subprocess.Popen(sys.argv[1:], stdout=sys.stderr)
_, status, usage = os.wait4(child.pid, 0)
seconds = time.monotonic() - start
print(json.dumps({"seconds": seconds, "max_rss_bytes": usage.ru_maxrss * 1024,
                  "status": os.waitstatus_to_exitcode(status)}))
