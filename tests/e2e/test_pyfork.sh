#!/bin/sh
# The Python server that every test's python3 commands are forked from
# (tests/support/py_server.py, client tests/tools/pyfork.c) outlives
# clients that go away: a client gone before its answer came broke the
# pipe of the server's reply, the server died of it, and the commands other tests were running
# through it failed with "the Python server went away" (three tests of one
# `make asan`). Here a server of the test's own is sent such clients, and
# must still be the one that answers afterwards, with the commands of its
# other clients ending as they ended.
# tier: check
. "$(dirname "$0")/lib.sh"
PYFORK="$ROOT/${BUILD:-build}/tests/tools/pyfork"
REAL=${TP_PYFORK_PYTHON:-/usr/bin/python3}
if [ ! -x "$PYFORK" ]; then
    echo "[SKIP] [$NAME] the Python server: $PYFORK not built"
    finish
fi
OWN="$WORK/server"
mkdir "$OWN"
# $WORK/own CMD...: CMD with this test's server (its socket in $OWN). A script
# that execs, not a function, so that `$WORK/own CMD &` leaves in $! the client
# itself, not a subshell whose kill would leave the client running.
cat >"$WORK/own" <<EOF
#!/bin/sh
exec env TP_PYFORK_DIR="$OWN" TP_PYFORK_OWNER=$$ TP_PYFORK_SERVER="$ROOT/tests/support/py_server.py" \\
    TP_PYFORK_PYTHON="$REAL" "\$@"
EOF
chmod +x "$WORK/own"
# server_pid: the pid of the server, the parent of a command it forked.
server_pid() { "$WORK/own" "$PYFORK" -c 'import os; print(os.getppid())'; }

first=$(server_pid)
check_all "a server answers (pid $first)" '[ -n "$first" ] && [ "$first" != "$$" ]'

# A file a command leaves open is written when it ends, as python3's end
# closes it: in a -c command and in a script.
# (A forked command ended with os._exit, which dropped the file's buffer:
# make demo's one-byte flip, run through the server, was never written.)
printf '%s\n' 'import sys' 'f = open(sys.argv[1], "w")' 'f.write("left open")' >"$WORK/open.py"
for runner in real server; do
    case $runner in real) py="$REAL" ;; server) py="$WORK/own $PYFORK" ;; esac
    $py -c 'import sys; f = open(sys.argv[1], "w"); f.write("left open")' "$WORK/$runner-c"
    $py "$WORK/open.py" "$WORK/$runner-script"
    for form in c script; do
        check "$runner python: a file a command ($form) leaves open is written when it ends" \
            [ "$(cat "$WORK/$runner-$form" 2>/dev/null)" = "left open" ]
    done
done

# A raw client (client.py SOCK CODE MODE [NAME=VALUE]): its request (-c
# CODE, the environment with NAME=VALUE put in), then, by MODE: "gone",
# away at once, before the server's answer; "badkill", after the "pid"
# answer a signal that is none and then SIGTERM, printing the last answer.
cat >"$WORK/client.py" <<'EOF'
import array, os, socket, sys
sock, code, mode = sys.argv[1:4]
env = dict(os.environ)
for entry in sys.argv[4:]:
    env.update([entry.split("=", 1)])
s = socket.socket(socket.AF_UNIX)
s.connect(sock)
fields = [os.getcwd(), "2", "-c", code] + ["%s=%s" % kv for kv in env.items()]
body = b"\0".join(f.encode() for f in fields)
s.sendmsg([len(body).to_bytes(4, "little") + body],
          [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]).tobytes())])
if mode == "badkill":
    f = s.makefile("rb")
    first = f.readline()
    if not first.startswith(b"pid "):
        sys.exit("answered %r, not a pid" % first)
    s.sendall(b"kill 999\nkill x\n")
    s.sendall(b"kill 15\n")
    print(f.readline().decode().strip())
s.close()
EOF
# Ten to be answered "fallback" (a load-time variable of their own), ten to
# be forked (their "pid" answer finds no one).
i=0
while [ $i -lt 10 ]; do
    "$REAL" "$WORK/client.py" "$OWN/sock" "pass" gone "OPENBLAS_CORETYPE=Nonsense"
    "$REAL" "$WORK/client.py" "$OWN/sock" "import time; time.sleep(30)" gone
    i=$((i + 1))
done
# A client that asks for a signal that is none: the server stays, and a
# real one after it still reaches the command.
answer=$(timeout 20 "$REAL" "$WORK/client.py" "$OWN/sock" "import time; time.sleep(30)" badkill)
check "signals that are none are ignored, a real one after them ends the command (got '$answer')" \
    [ "$answer" = "signal 15" ]
# A command whose client is killed while another's runs: the other ends as it ended.
"$WORK/own" "$PYFORK" -c 'import sys, time; time.sleep(1); sys.exit(7)' &
kept=$!
"$WORK/own" "$PYFORK" -c 'import time; time.sleep(30)' &
killed=$!
sleep 0.3
kill -KILL $killed
wait $killed
wait $kept
RC=$?
check "another client's command ends as it ended (exit 7, got $RC) when one client is killed" [ "$RC" -eq 7 ]
sleep 0.5
check "the server outlived 20 clients gone before its answer and one killed (pid $first, now $(server_pid))" \
    [ "$(server_pid)" = "$first" ]
# The commands of the gone clients went with them: none left sleeping
# (a forked command's parent is the server).
sleep 0.5
left=$(pgrep -P "$first" | tr '\n' ' ')
check "the commands of gone clients were ended (left: $left)" [ -z "$left" ]
rm -f "$OWN/sock"
finish
