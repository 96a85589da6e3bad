#!/usr/bin/python3
"""Writes a benchmark's section of docs/BENCHMARKS.md.

Usage: doc_section.py DOC NAME TITLE < BODY

The body (stdin) replaces the text between <!-- NAME:begin --> and
<!-- NAME:end -->; without those markers the section is appended under
"## TITLE". The body is prefixed with the date and the machine.
"""
import datetime
import os
import platform
import subprocess
import sys

doc, name, title = sys.argv[1:4]
cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                     capture_output=True, text=True).stdout.strip()
machine = f"{datetime.date.today()}, {os.cpu_count()} cores ({cpu}), {platform.system()} {platform.release()}."
begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
section = f"{begin}\n{machine}\n{sys.stdin.read().strip()}\n{end}"
text = open(doc).read() if os.path.exists(doc) else "# Benchmarks\n"
if begin in text:
    text = text[: text.index(begin)] + section + text[text.index(end) + len(end):]
else:
    text = text.rstrip() + f"\n\n## {title}\n\n{section}\n"
open(doc, "w").write(text)
