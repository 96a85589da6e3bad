#!/usr/bin/python3
"""Runs the test suite: the Criterion unit tests ($BUILD/tests/*/test_*) and
the test scripts (tests/*/test_*.sh), a tier of them, three at a time.

Tiers (`make check` runs the first, `make test` both):
  check  the edit loop: every library's unit tests and one end-to-end
         scenario per program; under 2 minutes on 2 cores
  full   everything else: faults, object stores, Slurm, soak, benchmarks
Every unit test binary is in the check tier. Every script declares its tier
in its header, a line `# tier: check` or `# tier: full`; a script that
declares none is an error, so that no test is forgotten by either tier.

Scripts own their directories (mktemp) and ports (tests/support/common.sh
free_port), so two run at once; one whose header says `# alone: REASON`
runs with nothing beside it; one whose header says `# waits: REASON` (it
mostly waits: Slurm's timeouts) runs beside the jobs, one such at a time.
Each test's output is printed whole when it
ends, with its time; a summary of the slowest and of what failed ends the run.
A header line `# takes: about N s` orders a run with no timings yet (a fresh
clone): the longest first, so that no long script starts last.

The run starts with the machine: the CPU's model and ISA flags, the kernel
OpenBLAS chose and the ISA oneDNN will use (both follow OPENBLAS_CORETYPE and
ONEDNN_MAX_CPU_ISA, printed when set). Every Python command of every test is
a fork of one server started for the run (tests/support/py_server.py), which
imported PyTorch once. What a test leaves running comes back here (a child
subreaper) and is reaped, so the run's processor seconds, printed with its
total, count everything the tests started. Each test has a TMPDIR of its
own, which must be empty when it ends: a test that leaves anything there
fails, naming it (Open MPI's session directory, which ranks a test kills
leave, is not the test's, and goes with the rest).

Usage: scripts/run-tests.py [--tier check|full] [--jobs N] [--repeat N]
                            [--only NAME]... [--list]
  --tier     check, or full (the default): the check tier and the full one
  --jobs     tests run at once (default 3: on 2 cores, a third keeps them
             busy while the other two wait on a timeout, a server or a disk)
  --repeat   run the selection N times in a row; a table of each test's
             runs, failures and times at the end (docs/RELIABILITY.md)
  --only     tests whose path contains NAME (repeatable)
  --list     print the selection with tiers, run nothing
  --timeout  seconds a test may run before it is stopped and fails (1200;
             2400 under the sanitizers, which make the slowest tests 3-4x
             slower: test_elastic took 1188 s under make asan)
Environment: BUILD (default build); SANITIZED=1 for the ASan/UBSan build.
Exit status: 0 when every test passed, 1 otherwise, 2 on a usage error.
"""
import argparse
import ctypes
import glob
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT_DIRS = ["e2e", "faults", "elastic", "gpu", "support"]
TIERS = ("check", "full")
# What a passing unit test binary says worth seeing: its skipped tests (a
# GPU test without a GPU). A failing one's output is printed whole.
UNIT_SKIPS = re.compile(r"^\[SKIP\]")


class Test:
    def __init__(self, path, kind, tier, alone, takes, waits=None):
        self.path, self.kind, self.tier, self.alone = path, kind, tier, alone
        self.waits = waits  # why the script mostly waits (it runs beside the jobs), or None
        self.takes = takes  # seconds the script's header says it takes, or None
        self.runs = []  # (passed, seconds)
        self.cpu = []  # processor seconds of each run (the test and what it waited for)


def script_header(path):
    """The tier, the reason to run alone, the seconds it takes (a line
    `# takes: about N s`, for the order of a run with no history) and why
    it mostly waits (`# waits: REASON`) that a script's header declares."""
    tier = alone = takes = waits = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.startswith("#"):
                break
            m = re.match(r"#\s*tier:\s*(\S+)\s*$", line)
            if m:
                tier = m.group(1)
            m = re.match(r"#\s*alone:\s*(.+)$", line)
            if m:
                alone = m.group(1).strip()
            m = re.match(r"#\s*takes:\D*(\d+)", line)
            if m:
                takes = int(m.group(1))
            m = re.match(r"#\s*waits:\s*(.+)$", line)
            if m:
                waits = m.group(1).strip()
    return tier, alone, takes, waits


# The CPU flags that decide which products the libraries run (kernels/cpu:
# OpenBLAS's kernel, oneDNN's ISA and bf16 instructions).
ISA_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16",
             "amx_tile", "amx_bf16")
ONEDNN_ISAS = {0x1: "sse41", 0x3: "avx", 0x7: "avx2", 0x407: "avx2_vnni", 0xf: "avx512_mic",
               0x1f: "avx512_mic_4ops", 0x27: "avx512_core", 0x67: "avx512_core_vnni", 0xe7: "avx512_core_bf16",
               0x3e7: "avx512_core_amx"}  # dnnl_cpu_isa_t (oneapi/dnnl/dnnl_types.h)


def cpu_report():
    """Lines saying which CPU paths this run's tests take: the CPU, its
    flags that matter, OpenBLAS's kernel and oneDNN's ISA under this
    environment (OPENBLAS_CORETYPE, ONEDNN_MAX_CPU_ISA cap them), asked of
    the libraries tp-train links."""
    first, flags = {}, set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                first.setdefault(key.strip(), value.strip())
        flags = set(first.get("flags", "").split())
    except OSError:
        pass
    model = f"{first.get('model name', 'unknown')} (family {first.get('cpu family', '?')}, model {first.get('model', '?')})"
    present = [f for f in ISA_FLAGS if f in flags]
    try:
        blas = ctypes.CDLL("libopenblas.so.0")
        blas.openblas_get_corename.restype = ctypes.c_char_p
        core = blas.openblas_get_corename().decode()
    except (OSError, AttributeError):
        core = "unknown (no libopenblas.so.0)"
    try:
        dnnl = ctypes.CDLL("libdnnl.so.2")
        isa = dnnl.dnnl_get_effective_cpu_isa()
        onednn = ONEDNN_ISAS.get(isa, hex(isa))
    except (OSError, AttributeError):
        onednn = "unknown (no libdnnl.so.2)"
    settings = " ".join(f"{k}={os.environ[k]}" for k in ("OPENBLAS_CORETYPE", "ONEDNN_MAX_CPU_ISA", "TP_NO_ONEDNN")
                        if k in os.environ) or "none"
    return [f"== CPU: {model}, {os.cpu_count()} cores; flags: {' '.join(present) or 'none of ' + ' '.join(ISA_FLAGS)}",
            f"== OpenBLAS kernel {core}, oneDNN ISA {onednn}; settings: {settings}"]


def discover(build):
    tests, errors = [], []
    for path in sorted(glob.glob(os.path.join(build, "tests", "*", "test_*"))):
        if os.access(path, os.X_OK) and not path.endswith((".o", ".d")):
            tests.append(Test(path, "unit", "check", None, None))
    for d in SCRIPT_DIRS:
        for path in sorted(glob.glob(os.path.join("tests", d, "test_*.sh"))):
            tier, alone, takes, waits = script_header(path)
            if tier not in TIERS:
                errors.append(f"{path}: its header declares no tier (a line '# tier: check' or '# tier: full')"
                              if tier is None else f"{path}: unknown tier '{tier}' (check or full)")
                continue
            tests.append(Test(path, "script", tier, alone, takes, waits))
    return tests, errors


def pyfork_client():
    """The client of the Python server (tests/tools/pyfork.c), or None."""
    if os.environ.get("TP_PYFORK", "1") == "0":
        return None
    client = os.path.abspath(os.path.join(os.environ["BUILD"], "tests", "tools", "pyfork"))
    return client if os.access(client, os.X_OK) else None


def start_python_server(logdir):
    """One Python server for the whole run (tests/support/py_server.py): it
    imports PyTorch, numpy and h5py once, and every Python command of every
    test is a fork of it (a test script's, through tests/e2e/lib.sh, and a
    unit test's fixtures, tests/support/fixture.c fixture_python). Started
    here, with the run's environment, so that no test's settings become the
    server's and no test's process group holds it; it ends when its
    directory goes with logdir. Returns the settings the tests get."""
    client = pyfork_client()
    if client is None:
        return {}
    directory = os.path.join(logdir, "python-server")
    os.mkdir(directory)
    settings = dict(TP_PYFORK_DIR=directory, TP_PYFORK_PYTHON=os.environ.get("TP_PYTHON", "/usr/bin/python3"),
                    TP_PYFORK_SERVER=os.path.join(ROOT, "tests", "support", "py_server.py"),
                    TP_PYFORK_OWNER=str(os.getpid()))
    subprocess.run([client, "-c", "pass"], env=dict(os.environ, **settings), stdin=subprocess.DEVNULL, check=False)
    return settings


def reap_children(seconds):
    """Reaps the children that end within `seconds` (this process is the
    tests' subreaper), so that their processor time counts in the run's."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if os.wait4(-1, os.WNOHANG)[0] == 0:
                time.sleep(0.05)
        except ChildProcessError:
            break


def stop_python_server(settings):
    """The run's server told to end (its socket gone) and reaped, within 5 s,
    so that its processor time counts in the run's total."""
    if not settings:
        return
    try:
        os.unlink(os.path.join(settings["TP_PYFORK_DIR"], "sock"))
    except OSError:
        pass
    reap_children(5)


def environment(test, python_server):
    env = dict(os.environ, **python_server)
    if test.kind == "unit" and python_server:
        env["TP_PYTHON"] = pyfork_client()
    if env.get("SANITIZED") == "1":
        # HDF5 keeps global state until exit; leaks are checked, third-party
        # ones suppressed (tests/lsan.supp).
        env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=0:exitcode=99"
        env["LSAN_OPTIONS"] = f"suppressions={ROOT}/tests/lsan.supp:print_suppressions=0"
        env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
    return env


# Open MPI's session directory (ompi.HOST.UID), left by ranks a test kills.
NOT_THE_TESTS = re.compile(r"^ompi\.")


class Running:
    started_count = 0

    def __init__(self, test, logdir, python_server):
        self.test = test
        Running.started_count += 1
        # A short path: Open MPI and PMIx put Unix sockets under TMPDIR. Open
        # to all as /tmp is: tests run tools as another user (nobody), who
        # must reach the files they are given.
        self.tmpdir = os.path.join(logdir, "t", str(Running.started_count))
        os.makedirs(self.tmpdir)
        for path, mode in ((logdir, 0o755), (os.path.dirname(self.tmpdir), 0o755), (self.tmpdir, 0o1777)):
            os.chmod(path, mode)
        self.log = open(os.path.join(logdir, test.path.replace("/", "_") + ".log"), "w+", encoding="utf-8",
                        errors="replace")
        if test.kind == "unit":
            # Verbose so that skipped tests show as SKIP.
            argv = [test.path, "--jobs", "2", "--short-filename", "--verbose"]
        else:
            argv = ["sh", test.path]
        # A process group of its own, so that a test past its time limit
        # goes with everything it started.
        env = dict(environment(test, python_server), TMPDIR=self.tmpdir)
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True)
        self.started = time.monotonic()
        self.stopping = None  # when SIGTERM was sent

    def signal(self, sig):
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def leftovers(self):
        """What the test left in its TMPDIR (then removed with the rest)."""
        left = sorted(n for n in os.listdir(self.tmpdir) if not NOT_THE_TESTS.match(n))
        shutil.rmtree(self.tmpdir, ignore_errors=True)
        return left


def report(test, code, seconds, cpu, log):
    """Prints the test's output whole, after a line with its time."""
    log.seek(0)
    text = log.read()
    log.close()
    if test.kind == "unit" and code == 0:
        text = "".join(line for line in text.splitlines(True) if UNIT_SKIPS.search(line))
    status = "ok" if code == 0 else f"FAILED (exit {code})"
    print(f"== {test.path} [{test.tier}] {seconds:.0f} s (cpu {cpu:.0f} s) {status}", flush=True)
    if text:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


def may_start(test, running, jobs):
    """Whether test may start beside the running ones: an alone test with
    none, none beside an alone one; a test that mostly waits (Slurm's
    timeouts, a benchmark's pauses) while no other such test runs, beside
    the jobs; any other while fewer than `jobs` others run."""
    if any(r.test.alone for r in running):
        return False
    if test.alone:
        return not running
    if test.waits:
        return not any(r.test.waits for r in running)
    return sum(1 for r in running if not r.test.waits) < jobs


def run_round(tests, jobs, logdir, limit, python_server):
    """Runs every test once, `jobs` at a time (an alone test by itself; one
    that mostly waits, one at a time beside the jobs, in order as it can). A
    test still running after `limit` seconds is stopped (SIGTERM to its
    process group, SIGKILL 20 s later) and fails."""
    waiting, running = list(tests), []
    try:
        while waiting or running:
            while waiting:
                startable = [t for t in waiting if may_start(t, running, jobs)]
                if not startable:
                    break
                waiting.remove(startable[0])
                running.append(Running(startable[0], logdir, python_server))
            time.sleep(0.2)
            now = time.monotonic()
            # Every child that ended: the tests (wait4 gives the processor
            # time of each and of every process of it that was waited for),
            # and what a test left to run on after it, which comes here
            # (a child subreaper) and counts in the tier's total.
            ended = {}
            while True:
                try:
                    pid, status, usage = os.wait4(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                ended[pid] = (status, usage)
            for r in list(running):
                pid, usage = 0, None
                if r.proc.pid in ended:
                    status, usage = ended[r.proc.pid]
                    pid, r.proc.returncode = r.proc.pid, os.waitstatus_to_exitcode(status)
                if pid == 0:
                    if r.stopping is None and now - r.started > limit:
                        print(f"== {r.test.path}: still running after {limit} s: stopped", flush=True)
                        r.signal(signal.SIGTERM)
                        r.stopping = now
                    elif r.stopping is not None and now - r.stopping > 20:
                        r.signal(signal.SIGKILL)
                    continue
                running.remove(r)
                # What the test left in its group (a server it failed to stop) goes too.
                r.signal(signal.SIGKILL)
                code = r.proc.returncode if r.proc.returncode >= 0 else 128 - r.proc.returncode
                if r.stopping is not None:
                    code = code or 124
                left = r.leftovers()
                if left:
                    r.log.seek(0, os.SEEK_END)
                    r.log.write(f"run-tests: FAIL: the test left in its TMPDIR: {' '.join(left[:10])}"
                                f"{' and %d more' % (len(left) - 10) if len(left) > 10 else ''}\n")
                    code = code or 1
                seconds = now - r.started
                cpu = usage.ru_utime + usage.ru_stime if usage else 0.0
                r.test.runs.append((code == 0, seconds))
                r.test.cpu.append(cpu)
                report(r.test, code, seconds, cpu, r.log)
    finally:
        for r in running:  # interrupted: nothing is left running
            r.signal(signal.SIGTERM)
        # The last tests' leftovers, killed with their group: reaped, so that they count.
        reap_children(2)


def order(tests, history):
    """Alone tests first, then the longest first (as the last runs took, in
    $BUILD/test-times.json; in a fresh build, as the script's header says,
    else a script counts as long and a unit test as short), so that the lanes
    end at about the same time."""
    def expected(t):
        if t.runs:
            return statistics.mean(s for _, s in t.runs)
        return history.get(t.path, t.takes or (60 if t.kind == "script" else 2))
    return sorted(tests, key=lambda t: (t.alone is None, -expected(t)))


def load_history(path):
    try:
        with open(path, encoding="utf-8") as f:
            return {k: float(v) for k, v in json.load(f).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def save_history(path, history, tests):
    for t in tests:
        if t.runs:
            history[t.path] = round(statistics.mean(s for _, s in t.runs), 1)
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(history, f, indent=0, sort_keys=True)
        os.replace(path + ".tmp", path)
    except OSError:
        pass  # only an ordering hint


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tier", choices=TIERS, default=os.environ.get("TIER", "full"))
    p.add_argument("--jobs", type=int, default=3)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--only", action="append", default=[])
    p.add_argument("--list", action="store_true")
    p.add_argument("--timeout", type=int, default=2400 if os.environ.get("SANITIZED") == "1" else 1200)
    args = p.parse_args()
    if args.jobs < 1 or args.repeat < 1:
        p.error("--jobs and --repeat take a positive number")
    os.chdir(ROOT)
    build = os.environ.get("BUILD", "build")
    os.environ["BUILD"] = build
    tests, errors = discover(build)
    for e in errors:
        print(f"run-tests: {e}", file=sys.stderr)
    if errors:
        return 1
    if not any(t.kind == "unit" for t in tests):
        print(f"run-tests: no unit test binaries in {build}/tests (build them: make tests)", file=sys.stderr)
        return 1
    tiers = TIERS[: TIERS.index(args.tier) + 1]
    chosen = [t for t in tests if t.tier in tiers and (not args.only or any(o in t.path for o in args.only))]
    if not chosen:
        print("run-tests: nothing matches the selection", file=sys.stderr)
        return 2
    if args.list:
        for t in chosen:
            print(f"{t.tier:5} {t.path}" + (f"  (alone: {t.alone})" if t.alone else "")
                  + (f"  (waits: {t.waits})" if t.waits else ""))
        return 0
    print(f"== tier {args.tier}: {len(chosen)} tests ({', '.join(tiers)}), {args.jobs} at a time, "
          f"build {build}{', sanitized' if os.environ.get('SANITIZED') == '1' else ''}", flush=True)
    print("\n".join(cpu_report()), flush=True)
    wall = time.monotonic()
    try:  # PR_SET_CHILD_SUBREAPER: what the tests leave running is reaped here
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    history_path = os.path.join(build, "test-times.json")
    history = load_history(history_path)
    with tempfile.TemporaryDirectory(prefix="tp-run-tests-") as logdir:
        python_server = start_python_server(logdir)
        for round_no in range(args.repeat):
            if args.repeat > 1:
                print(f"== round {round_no + 1} of {args.repeat}", flush=True)
            run_round(order(chosen, history), args.jobs, logdir, args.timeout, python_server)
            save_history(history_path, history, chosen)
        stop_python_server(python_server)
    wall = time.monotonic() - wall
    failed = [t for t in chosen if not all(ok for ok, _ in t.runs)]
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime
    print(f"== tier {args.tier}: {len(chosen)} tests in {wall:.0f} s, {cpu:.0f} processor seconds "
          f"({cpu / wall / (os.cpu_count() or 1):.0%} of {os.cpu_count()} cores); the slowest:")
    for t in sorted(chosen, key=lambda t: -max(s for _, s in t.runs))[:8]:
        print(f"   {max(s for _, s in t.runs):5.0f} s  (cpu {max(t.cpu):4.0f} s)  {t.path}")
    if args.repeat > 1:
        print("| test | runs | failed | min s | median s | max s |")
        print("| --- | --- | --- | --- | --- | --- |")
        for t in chosen:
            times = [s for _, s in t.runs]
            print(f"| {t.path} | {len(t.runs)} | {sum(not ok for ok, _ in t.runs)} | "
                  f"{min(times):.0f} | {statistics.median(times):.0f} | {max(times):.0f} |")
    if failed:
        print("FAILED: " + " ".join(t.path for t in failed), file=sys.stderr)
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
