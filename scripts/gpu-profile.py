#!/usr/bin/python3
"""Summarizes an Nsight Compute profile of tp-train (scripts/gpu-check.sh
--phase profile) per kernel, as a Markdown table: what to speed up first.

Usage: gpu-profile.py PROFILE.csv

PROFILE.csv is `ncu --csv --page raw` output (lines that are not CSV, the
program's and ncu's own, are skipped) with the metrics gpu-check.sh asks
for. Per kernel name, over all its launches: the time and its share, DRAM
bytes and the bandwidth reached, FP32 operations (FMA counted as two; the
tensor cores' bf16 work in a column of its own, in ncu's count of
operations), the SM and memory
throughputs as fractions of the GPU's peaks, which of the two bounds the
kernel (the roofline: the higher fraction), and the time it would take at
80% of that bound, with the time that would save.
"""
import csv
import re
import sys

TIME = "gpu__time_duration.sum"
READ, WRITE = "dram__bytes_read.sum", "dram__bytes_write.sum"
FLOP_METRICS = {"smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": 2,
                "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum": 1,
                "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum": 1}
TENSOR = "sm__ops_path_tensor_src_bf16_dst_fp32.sum"  # the bf16 products' work, as ncu counts it
SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
MEMORY = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
TARGET = 80.0  # percent of the bounding peak a good kernel reaches

# Units ncu may print, to seconds, bytes and counts.
SCALE = {"ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3, "second": 1.0, "s": 1.0,
         "nsecond": 1e-9, "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12, "KB": 1e3,
         "MB": 1e6, "GB": 1e9, "inst": 1, "Kinst": 1e3, "Minst": 1e6, "Ginst": 1e9, "%": 1, "": 1}


def number(text):
    text = text.replace(",", "").strip()
    return float(text) if text and text not in ("n/a", "N/A") else 0.0


def short_name(name):
    """A kernel's name without its return type, arguments and template arguments."""
    name = re.sub(r"\(.*$", "", re.sub(r"^void ", "", name.strip()))
    depth, out = 0, []
    for c in name:
        depth += c == "<"
        if depth == 0:
            out.append(c)
        depth -= c == ">" and depth > 0
    return "".join(out).strip() or name


def read_profile(path):
    rows = [r for r in csv.reader(line for line in open(path, errors="replace") if line.startswith('"'))]
    if len(rows) < 3:
        sys.exit("%s: no kernel rows (did ncu profile anything?)" % path)
    header, units, data = rows[0], rows[1], rows[2:]
    missing = [m for m in [TIME, SM, MEMORY, "Kernel Name"] if m not in header]
    if missing:
        sys.exit("%s: columns missing: %s" % (path, ", ".join(missing)))
    col = {name: i for i, name in enumerate(header)}

    def value(row, metric):
        i = col.get(metric)
        return 0.0 if i is None or i >= len(row) else number(row[i]) * SCALE.get(units[i], 1)
    kernels = {}
    for row in data:
        if len(row) < len(header):
            continue
        k = kernels.setdefault(short_name(row[col["Kernel Name"]]),
                               {"launches": 0, "time": 0.0, "bytes": 0.0, "flops": 0.0, "tensor": 0.0, "sm": 0.0,
                                "memory": 0.0})
        t = value(row, TIME)
        k["launches"] += 1
        k["time"] += t
        k["bytes"] += value(row, READ) + value(row, WRITE)
        k["flops"] += sum(w * value(row, m) for m, w in FLOP_METRICS.items())
        k["tensor"] += value(row, TENSOR)
        k["sm"] += t * value(row, SM)  # time-weighted, divided below
        k["memory"] += t * value(row, MEMORY)
    return kernels


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    kernels = read_profile(sys.argv[1])
    total = sum(k["time"] for k in kernels.values())
    saved_total = 0.0
    lines = ["| kernel | launches | ms | share | DRAM MB | GB/s | FP32 GFLOP/s | bf16 tensor Gop/s | SM %% | memory %% | bound | ms at %d%% | saves ms |"
             % TARGET, "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, k in sorted(kernels.items(), key=lambda kv: -kv[1]["time"]):
        t = k["time"]
        sm = k["sm"] / t if t else 0.0
        memory = k["memory"] / t if t else 0.0
        bound = "memory" if memory >= sm else "compute"
        at_target = t * max(sm, memory) / TARGET
        saves = max(0.0, t - at_target)
        saved_total += saves
        lines.append("| %s | %d | %.3f | %.1f%% | %.1f | %.0f | %.0f | %.0f | %.0f | %.0f | %s | %.3f | %.3f |" % (
            name[:60], k["launches"], t * 1e3, 100 * t / total if total else 0, k["bytes"] / 1e6,
            k["bytes"] / t / 1e9 if t else 0, k["flops"] / t / 1e9 if t else 0, k["tensor"] / t / 1e9 if t else 0,
            sm, memory, bound,
            at_target * 1e3, saves * 1e3))
    print("%d kernels, %d launches, %.3f ms on the GPU; at %d%% of each kernel's bound: %.3f ms less (%.0f%%)"
          % (len(kernels), sum(k["launches"] for k in kernels.values()), total * 1e3, TARGET, saved_total * 1e3,
             100 * saved_total / total if total else 0))
    print()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
