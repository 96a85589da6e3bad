#!/usr/bin/env python3
"""Mutation fuzzer for shard files (issue 11).

Makes a tiny checkpoint with `tp-ckpt synth`, then, trial after trial, damages
the bytes of one of its shard files (bit flips, random bytes, runs of 0x00 or
0xff, copied ranges, truncation) and runs `tp-ckpt verify`, `tp-ckpt info` and
`tp-reshard` on the damaged copy. A run that ends in anything but exit 0 or 1,
prints a sanitizer report, or outlasts the timeout is a crash: the damaged
shard, the command and its output are kept under OUT/crash-NNNN/.

    tests/faults/fuzz_shards.py --bin build-asan/bin --out /tmp/fuzz --seconds 600 [--old-bin DIR]

Prints one summary line at the end: trials, runs, crashes, hangs.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

SANITIZER_MARKS = (b"AddressSanitizer", b"runtime error:", b"LeakSanitizer", b"UndefinedBehaviorSanitizer")


def synth(bindir, out, extra):
    cmd = [os.path.join(bindir, "tp-ckpt"), "synth", "-o", out, "--tp", "2", "--pp", "1",
           "--layers", "1", "--dim", "8", "--heads", "2", "--vocab", "16", "--seq", "8",
           "--threads", "1"] + extra
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def mutate(data, rng):
    data = bytearray(data)
    n = len(data)
    for _ in range(rng.randint(1, 6)):
        kind = rng.randrange(7)
        pos = rng.randrange(n)
        if kind == 0:
            data[pos] ^= 1 << rng.randrange(8)
        elif kind == 1:
            data[pos] = rng.randrange(256)
        elif kind == 2:
            length = rng.randint(1, 64)
            data[pos:pos + length] = bytes([rng.choice((0, 0xff))]) * len(data[pos:pos + length])
        elif kind == 3:
            length = rng.randint(1, 16)
            data[pos:pos + length] = os.urandom(len(data[pos:pos + length]))
        elif kind == 4:  # an "interesting" integer
            value = rng.choice((0, 1, 0x7f, 0x80, 0xff, 0xffff, 0x7fffffff, 0xffffffff,
                                0x7fffffffffffffff, 0xffffffffffffffff, n, n + 1))
            width = rng.choice((1, 2, 4, 8))
            data[pos:pos + width] = (value & ((1 << (8 * width)) - 1)).to_bytes(width, "little")[:len(data[pos:pos + width])]
        elif kind == 5:  # copy a range elsewhere
            src = rng.randrange(n)
            length = rng.randint(1, 128)
            chunk = bytes(data[src:src + length])
            data[pos:pos + len(chunk)] = chunk
            del data[n:]
        else:  # small-valued byte nudge
            data[pos] = (data[pos] + rng.choice((-1, 1, 2, -2, 16))) & 0xff
    if rng.random() < 0.03:
        del data[rng.randrange(1, n):]
    return bytes(data)


def run(cmd, timeout, env):
    start = time.time()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, env=env)
        return p.returncode, p.stdout + p.stderr, time.time() - start
    except subprocess.TimeoutExpired as e:
        return "timeout", (e.stdout or b"") + (e.stderr or b""), time.time() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="folder with tp-ckpt and tp-reshard")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--trials", type=int, default=0, help="stop after this many trials (0: time only)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=20)
    ap.add_argument("--no-reshard", action="store_true")
    ap.add_argument("--old-bin", help="also fuzz checkpoints written by the tp-ckpt in this folder "
                    "(an older build: format 1.0 shards)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    os.makedirs(args.out, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=0:exitcode=86")
    env.setdefault("UBSAN_OPTIONS", "halt_on_error=1:exitcode=87:print_stacktrace=1")
    work = tempfile.mkdtemp(prefix="fuzz-shards-")
    seeds = []
    makers = [("", args.bin)] + ([("old-", args.old_bin)] if args.old_bin else [])
    for prefix, bindir in makers:
        for label, extra in (("plain", ["--compress", "none"]), ("zstd", ["--compress", "zstd"]),
                             ("optim", ["--optim", "--dtype", "bf16", "--compress", "none"])):
            d = os.path.join(work, "seed-" + prefix + label)
            synth(bindir, d, extra)
            seeds.append(d)
    tp_ckpt = os.path.join(args.bin, "tp-ckpt")
    tp_reshard = os.path.join(args.bin, "tp-reshard")
    trials = runs = crashes = hangs = 0
    exits = {}
    deadline = time.time() + args.seconds
    try:
        while time.time() < deadline and (not args.trials or trials < args.trials):
            seed = rng.choice(seeds)
            case = os.path.join(work, "case")
            shutil.rmtree(case, ignore_errors=True)
            shutil.copytree(seed, case)
            shards = sorted(f for f in os.listdir(case) if f.endswith(".h5"))
            shard = rng.choice(shards)
            with open(os.path.join(case, shard), "rb") as f:
                original = f.read()
            damaged = mutate(original, rng)
            with open(os.path.join(case, shard), "wb") as f:
                f.write(damaged)
            trials += 1
            cmds = [[tp_ckpt, "verify", case, "--threads", "1"], [tp_ckpt, "info", case]]
            if not args.no_reshard:
                out = os.path.join(work, "out")
                shutil.rmtree(out, ignore_errors=True)
                cmds.append([tp_reshard, case, "--to", "tp1", "-o", out, "--threads", "1",
                             "--device", "cpu"])
            for cmd in cmds:
                rc, output, _ = run(cmd, args.timeout, env)
                runs += 1
                exits[str(rc)] = exits.get(str(rc), 0) + 1
                bad = rc == "timeout" or rc not in (0, 1) or any(m in output for m in SANITIZER_MARKS)
                if not bad:
                    continue
                crashes += 1
                hangs += rc == "timeout"
                where = os.path.join(args.out, "crash-%04d" % crashes)
                os.makedirs(where)
                with open(os.path.join(where, shard), "wb") as f:
                    f.write(damaged)
                with open(os.path.join(where, "seed"), "w") as f:
                    f.write(os.path.basename(seed) + "\n")
                with open(os.path.join(where, "report.txt"), "wb") as f:
                    f.write(("cmd: %s\nexit: %s\n" % (" ".join(os.path.basename(c) if i == 0 else c
                                                                  for i, c in enumerate(cmd)), rc)).encode())
                    f.write(output[-20000:])
                break
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = {"trials": trials, "runs": runs, "crashes": crashes, "hangs": hangs, "exits": exits,
               "seconds": args.seconds, "seed": args.seed}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
