"""The Python of a test script, loaded once: a server that has imported
the judges' heavy modules (PyTorch, numpy, h5py) and runs each `python3`
command of the script in a fork of itself, so that a check pays a fork
(tens of milliseconds) instead of PyTorch's import (2.5 s on the
development machine; test_signals alone ran 42 such commands).

tests/tools/pyfork.c is the client, the `$PY` of tests/e2e/lib.sh: it
passes its arguments, environment, working directory and its standard
input, output and error (the descriptors themselves) over the socket
DIR/sock, then relays signals to the command and ends as it ended. The
forked command is the script run as __main__ (runpy), `-c CODE` or `-`
(code on standard input), with sys.argv, sys.path[0], the environment and
the directory of a fresh interpreter's. A command whose environment differs
from the server's in a variable that libraries read when they load
(OpenBLAS's, OpenMP's, oneDNN's, Python's own: the same process would not
honour the new value) is answered "fallback", and the client runs a fresh
interpreter instead.

Protocol (one connection per command): the client sends a 4-byte length
(little-endian) and that many bytes, NUL-separated fields: the working
directory, the count of arguments, the arguments, then the environment's
NAME=VALUE entries; with the first bytes, its descriptors 0, 1 and 2
(SCM_RIGHTS). The server answers lines: "pid P" (then "exit N" or "signal
S" when it ends) or "fallback". The client may send "kill S" lines: the
signal goes to the command. A client that goes away takes its command with
it (SIGKILL).

Usage: TP_PYFORK_DIR=DIR py_server.py (the directory in the environment, so
that a test looking for its processes by the paths of its working directory
in their command lines does not find this one). It ends when DIR/sock is removed (the test's
working directory goes at its end), when the process TP_PYFORK_OWNER names
(the test) is gone, or after 30 idle minutes.
"""
import array
import atexit
import gc
import io
import os
import runpy
import select
import signal
import socket
import sys
import tempfile
import time
import traceback
import types

# Modules the judges import, loaded before the first fork: the light ones
# always; PyTorch's (2.5 s of processor time) once a command's code names
# torch (a script whose text holds "torch", or -c / - code that does), so
# that a test whose Python only reads JSON never pays for it. A module that
# fails to import is left to the commands, which then fail as a fresh
# interpreter would.
PRELOAD = ["numpy", "h5py", "xxhash", "zstandard"]
PRELOAD_TORCH = ["torch", "torch.nn.functional", "torch.distributed", "torch.distributed.checkpoint",
                 "torch.multiprocessing"]
# Variables read when a library loads, or when the interpreter starts.
LOAD_TIME = ("OPENBLAS_", "GOTO", "OMP_", "GOMP_", "KMP_", "ONEDNN_", "DNNL_", "MKL_", "PYTHON", "LD_PRELOAD",
             "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "TORCH_")
IDLE_SECONDS = 1800
# Thread counts, read at load too, that the command's own value replaces
# through the libraries' calls (the benchmarks' PyTorch baselines try splits
# of threads between OpenMP and OpenBLAS: a fresh interpreter each, before).
THREAD_COUNTS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def blas():
    try:
        import ctypes
        return ctypes.CDLL("libblas.so.3")
    except OSError:
        return None


def thread_defaults():
    """What a fresh interpreter starts with where the variables are unset:
    the libraries' own counts, read before any command changed them (the
    server is started with them unset or as its first command set them)."""
    library = blas()
    torch = sys.modules.get("torch")
    counts = {}
    try:
        counts["OPENBLAS_NUM_THREADS"] = library.openblas_get_num_threads() if library else None
    except AttributeError:
        counts["OPENBLAS_NUM_THREADS"] = None
    counts["OMP_NUM_THREADS"] = torch.get_num_threads() if torch is not None else None
    return counts


def apply_thread_counts(env, defaults):
    """The command's OMP_NUM_THREADS (PyTorch's intra-op threads) and
    OPENBLAS_NUM_THREADS (the BLAS numpy and PyTorch link), or a fresh
    interpreter's counts where it gives none."""
    def wanted(name):
        try:
            return int(env[name]) if name in env else defaults[name]
        except ValueError:
            return defaults[name]
    library, torch = blas(), sys.modules.get("torch")
    if library is not None and wanted("OPENBLAS_NUM_THREADS"):
        try:
            library.openblas_set_num_threads(wanted("OPENBLAS_NUM_THREADS"))
        except AttributeError:
            pass
    if torch is not None and wanted("OMP_NUM_THREADS"):
        torch.set_num_threads(wanted("OMP_NUM_THREADS"))


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def load_time_environment(env):
    return {k: v for k, v in env.items() if k.startswith(LOAD_TIME) and k not in THREAD_COUNTS}


def preload(names):
    for name in names:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - left to the commands
            pass


def names_torch(argv, stdin_fd):
    """Whether the command's code names torch: -c CODE, a script's text, or
    (for -) the code waiting on its standard input, peeked at, not read."""
    if argv[0] == "-c":
        return "torch" in argv[1]
    if argv[0] == "-":
        try:
            import fcntl
            import termios
            waiting = array.array("i", [0])
            fcntl.ioctl(stdin_fd, termios.FIONREAD, waiting)
            return b"torch" in os.pread(stdin_fd, waiting[0], 0) if waiting[0] else False
        except OSError:
            return False  # a file or pipe that cannot be peeked at: the command imports what it needs
    try:
        with open(argv[0], "rb") as f:
            return b"torch" in f.read(1 << 20)
    except OSError:
        return False


def receive_request(conn):
    """(fields, descriptors) of one request."""
    fds = array.array("i")
    data, ancillary, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    if len(data) < 4:
        raise ValueError("short request")
    length = int.from_bytes(data[:4], "little")
    body = bytearray(data[4:])
    while len(body) < length:
        more = conn.recv(length - len(body))
        if not more:
            raise ValueError("request cut short")
        body += more
    return bytes(body).split(b"\0"), list(fds)


def answer(conn, line):
    """line sent to a client; False when the client is gone (a command
    killed before its answer came: the pipe is broken), which must not end
    the server that every test's commands share."""
    try:
        conn.sendall(line)
        return True
    except OSError:
        return False


def fallback(conn, fds):
    """The client told to run a fresh interpreter; its connection and the
    descriptors it passed closed."""
    answer(conn, b"fallback\n")
    conn.close()
    for fd in fds:
        os.close(fd)


def print_traceback(e):
    """The traceback of e from the command's own frames on (this server's
    and runpy's left out), as a fresh interpreter prints it."""
    tb = e.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>")
                              or tb.tb_frame.f_code.co_filename.endswith("runpy.py")):
        tb = tb.tb_next
    traceback.print_exception(type(e), e, tb)


def run_command(cwd, argv, env, fds, defaults):
    """In the forked child: become the command; never returns."""
    code = 1
    try:
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        # A fresh interpreter's signal dispositions.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
        sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), line_buffering=False)
        sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), errors="backslashreplace",
                                      line_buffering=True)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        # The command's own temporary directory: a module the server loaded
        # may have asked for the server's (the run's server serves every test).
        tempfile.tempdir = None
        apply_thread_counts(env, defaults)
        command_globals = {}
        if argv[0] == "-c":
            sys.argv = ["-c"] + argv[2:]
            sys.path[0] = ""
            code_text, name = argv[1], "<string>"
        elif argv[0] == "-":
            sys.argv = ["-"] + argv[1:]
            sys.path[0] = ""
            code_text, name = sys.stdin.read(), "<stdin>"
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            code_text = None
        try:
            if code_text is None:
                runpy.run_path(os.path.abspath(argv[0]), run_name="__main__")
            else:
                module = types.ModuleType("__main__")
                sys.modules["__main__"] = module
                command_globals = module.__dict__
                exec(compile(code_text, name, "exec"), command_globals)
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt as e:
            print_traceback(e)
            code = 130
        except BaseException as e:  # the traceback a fresh interpreter prints
            print_traceback(e)
            code = 1
        try:
            atexit._run_exitfuncs()
        except BaseException:
            traceback.print_exc()
        # Then, as an interpreter's end does, the command's globals go and
        # what only they (or cycles) held is finalized: a file the command
        # left open is flushed and closed, where os._exit below would drop
        # its buffer (make demo's one-byte flip, written by a file never
        # closed, was lost). A script's globals went with run_path's module.
        command_globals.clear()
        gc.collect()
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        os._exit(code & 0xFF)


def main():
    # The server's own environment is its client's load-time part only: a
    # test that looks for processes by their environment (test_bench's
    # leftovers) must not find this one, which outlives the command that
    # started it.
    if os.environ.get("TP_PYFORK_CLEAN") != "1":
        kept = {k: v for k, v in os.environ.items()
                if k.startswith(LOAD_TIME) or k in ("PATH", "HOME", "TMPDIR", "LANG", "TP_PYFORK_OWNER", "TP_PYFORK_DIR")
                or k.startswith("LC_")}
        kept["TP_PYFORK_CLEAN"] = "1"
        os.execve(sys.executable, [sys.executable] + sys.argv, kept)
    directory = os.environ.pop("TP_PYFORK_DIR")
    path = os.path.join(directory, "sock")
    owner = int(os.environ.pop("TP_PYFORK_OWNER", "0") or 0)
    preload(PRELOAD)
    mine = load_time_environment(os.environ)
    defaults = thread_defaults()
    del os.environ["TP_PYFORK_CLEAN"]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    listener.listen(64)
    os.rename(path + ".new", path)  # the client connects only once it listens
    running = {}  # conn -> pid
    # A command's end wakes the loop: SIGCHLD writes to this pair.
    wake_read, wake_write = socket.socketpair()
    wake_read.setblocking(False)
    wake_write.setblocking(False)
    signal.set_wakeup_fd(wake_write.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)
    last = time.monotonic()
    while True:
        readable, _, _ = select.select([listener, wake_read] + list(running), [], [], 0.5)
        for conn in readable:
            if conn is wake_read:
                try:
                    wake_read.recv(4096)
                except BlockingIOError:
                    pass
            elif conn is listener:
                try:
                    client, _ = listener.accept()
                except OSError:  # a client gone before it was accepted
                    continue
                try:
                    fields, fds = receive_request(client)
                    cwd, argc = fields[0].decode(), int(fields[1])
                    argv = [f.decode("utf-8", "surrogateescape") for f in fields[2:2 + argc]]
                    env = dict(e.decode("utf-8", "surrogateescape").split("=", 1)
                               for e in fields[2 + argc:] if b"=" in e)
                except (OSError, ValueError, IndexError):
                    client.close()
                    continue
                if load_time_environment(env) != mine or len(fds) != 3:
                    fallback(client, fds)
                    continue
                if "torch" not in sys.modules and names_torch(argv, fds[0]):
                    preload(PRELOAD_TORCH)
                    defaults = thread_defaults()
                # The server's objects out of the collector's reach: a command
                # whose allocations start a full collection would otherwise
                # write to every object's header, copying most of the
                # server's pages (PyTorch's among them) into the child, each
                # copy a page fault (test_dcp: an eighth of its processor time).
                gc.freeze()
                try:
                    pid = os.fork()
                except OSError:  # no process to be had now: the client runs a fresh interpreter
                    pid = None
                if pid is None:
                    fallback(client, fds)
                    continue
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    for own in [listener, wake_read, wake_write, client] + list(running):
                        own.close()
                    run_command(cwd, argv, env, fds, defaults)
                for fd in fds:
                    os.close(fd)
                running[client] = pid
                if not answer(client, b"pid %d\n" % pid):  # its client is gone: so is the command
                    os.kill(pid, signal.SIGKILL)
            else:
                try:
                    data = conn.recv(256)
                except OSError:
                    data = b""
                if not data:  # the client went away: so does its command
                    try:
                        os.kill(running[conn], signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    continue
                for line in data.decode(errors="replace").splitlines():
                    if line.startswith("kill "):
                        try:
                            os.kill(running[conn], int(line[5:]))
                        except (OSError, ValueError):  # gone, or not a signal: the server stays
                            pass
        # Commands that ended: their status to their client.
        for conn, pid in list(running.items()):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 1 << 8
            if done:
                reply = b"signal %d\n" % os.WTERMSIG(status) if os.WIFSIGNALED(status) else \
                    b"exit %d\n" % os.waitstatus_to_exitcode(status)
                answer(conn, reply)
                conn.close()
                del running[conn]
        if running:
            last = time.monotonic()
        if not os.path.exists(path) or time.monotonic() - last > IDLE_SECONDS or (owner and not alive(owner)):
            break
    for pid in running.values():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


if __name__ == "__main__":
    main()
