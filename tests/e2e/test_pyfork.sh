#!/bin/sh
# The Python server that every test's python3 commands are forked from
# (tests/support/py_server.py, client tests/tools/pyfork.c) outlives
# clients that go away: a command killed before its answer came (a test's
# time limit, a signal sent to a check) broke the pipe of the server's
# reply, the server died of it, and the commands other tests were running
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
# own CMD...: CMD with this test's server (its socket in $OWN). A script
# that execs, not a function, so that `own CMD &` leaves in $! the client
# itself, not a subshell whose kill would leave the client running.
cat >"$WORK/own" <<EOF
#!/bin/sh
exec env TP_PYFORK_DIR="$OWN" TP_PYFORK_OWNER=$$ TP_PYFORK_SERVER="$ROOT/tests/support/py_server.py" \\
    TP_PYFORK_PYTHON="$REAL" "\$@"
EOF
chmod +x "$WORK/own"
own() { "$WORK/own" "$@"; }
# server_pid: the pid of the server, the parent of a command it forked.
server_pid() { own "$PYFORK" -c 'import os; print(os.getppid())'; }

first=$(server_pid)
check_all "a server answers (pid $first)" '[ -n "$first" ] && [ "$first" != "$$" ]'

# A raw client: its request (-c CODE, and one environment entry), then gone
# at once, before the server's answer.
cat >"$WORK/gone.py" <<'EOF'
import array, os, socket, sys
sock, code, entry = sys.argv[1:4]
s = socket.socket(socket.AF_UNIX)
s.connect(sock)
body = b"\0".join([os.getcwd().encode(), b"2", b"-c", code.encode(), entry.encode()])
s.sendmsg([len(body).to_bytes(4, "little") + body],
          [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]).tobytes())])
s.close()
EOF
# One to be answered "fallback" (a load-time variable of its own), one to be
# forked (its "pid" answer finds no one), ten of each.
i=0
while [ $i -lt 10 ]; do
    "$REAL" "$WORK/gone.py" "$OWN/sock" "pass" "OPENBLAS_CORETYPE=Nonsense"
    "$REAL" "$WORK/gone.py" "$OWN/sock" "import time; time.sleep(30)" "PATH=/usr/bin:/bin"
    i=$((i + 1))
done
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
