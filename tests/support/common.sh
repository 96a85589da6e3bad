# common.sh: what the test harnesses (slurm.sh, objstore.sh) share: free TCP
# ports, and processes started by the harness, watched and stopped by pid.
# Sourced by them (POSIX sh); its variables start with _cm_, so that callers'
# loops keep theirs.
#
#   port_used PORT      0 when PORT is in use on this machine (listening or
#                       connected, IPv4 or IPv6)
#   free_port [N]       prints the first of N (default 1) consecutive ports in
#                       20000..31999 that nothing uses (a server may still lose
#                       it to another before it binds: retry on EADDRINUSE)
#   pid_alive PID       0 when PID runs (a zombie does not)
#   stop_pids PIDS      SIGTERM to each, SIGKILL after 2 s to those left; waits
#                       up to 5 s for all to go; 1 when any is left
#   spawn_group PIDFILE LOG CMD...
#                       starts CMD in the background (stdin /dev/null, output
#                       appended to LOG) as the leader of a new
#                       session and process group (setsid), not a child of
#                       the caller; its pid, which is also the group's id, in
#                       PIDFILE once it runs. What it forks stays in the group
#                       unless it leaves it itself (nginx's workers, node's
#                       children stay), so the group finds them all
#   group_pids PGIDS    the live (not zombie) processes of those groups
#   stop_groups PGIDS   stop_pids for whole groups: each signal goes to every
#                       member at once (kill -SIG -PGID), so that a parent
#                       cannot start a new child between its children's
#                       deaths and its own, as nginx's master does when a
#                       worker dies; 1 when any member is left

port_used() {
    _cm_h=$(printf ':%04X ' "$1")
    grep -q "$_cm_h" /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

free_port() {
    _cm_n=${1:-1}
    _cm_try=0
    while [ $_cm_try -lt 50 ]; do
        _cm_base=$(awk -v s="$$$_cm_try" 'BEGIN { srand(); srand(srand() + s); print 20000 + int(rand() * 11900) }')
        _cm_i=0 _cm_ok=1
        while [ $_cm_i -lt "$_cm_n" ]; do
            if port_used $((_cm_base + _cm_i)); then _cm_ok=0; break; fi
            _cm_i=$((_cm_i + 1))
        done
        [ $_cm_ok = 1 ] && { echo "$_cm_base"; return 0; }
        _cm_try=$((_cm_try + 1))
    done
    return 1
}

pid_alive() {
    [ -n "$1" ] && kill -0 "$1" 2>/dev/null || return 1
    # State, the field after the command name in parentheses: Z is a zombie.
    # No state: the process went between kill -0 and the read (a zombie
    # reaped meanwhile; seen under load with nginx's orphaned workers).
    _cm_state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)
    [ -n "$_cm_state" ] && [ "$_cm_state" != Z ]
}

stop_pids() {
    [ -z "$1" ] && return 0
    # shellcheck disable=SC2086
    kill -TERM $1 2>/dev/null
    _cm_i=0
    while [ $_cm_i -lt 50 ]; do
        _cm_left=""
        for _cm_p in $1; do pid_alive "$_cm_p" && _cm_left="$_cm_left $_cm_p"; done
        [ -z "$_cm_left" ] && return 0
        # shellcheck disable=SC2086
        [ $_cm_i = 20 ] && kill -KILL $_cm_left 2>/dev/null
        sleep 0.1
        _cm_i=$((_cm_i + 1))
    done
    return 1
}

spawn_group() {
    _cm_pidfile=$1
    _cm_log=$2
    shift 2
    rm -f "$_cm_pidfile"
    # setsid forks when its caller leads a group (job control on): the pid
    # is written by the process that runs CMD, whichever that is.
    (
        setsid sh -c 'echo $$ >"$0.new" && mv "$0.new" "$0" && exec "$@"' "$_cm_pidfile" "$@" \
            </dev/null >>"$_cm_log" 2>&1 &
    )
    _cm_i=0
    while [ ! -s "$_cm_pidfile" ]; do
        [ $_cm_i -ge 200 ] && { echo "spawn_group: $1 did not start in 10 s" >&2; return 1; }
        sleep 0.05
        _cm_i=$((_cm_i + 1))
    done
}

group_pids() {
    [ -z "$1" ] && return 0
    ps -eo pid=,pgid=,stat= | awk -v groups=" $(echo $1) " \
        'index(groups, " " $2 " ") && $3 !~ /^Z/ { printf "%s ", $1 }'
}

stop_groups() {
    [ -z "$1" ] && return 0
    for _cm_g in $1; do kill -TERM "-$_cm_g" 2>/dev/null; done
    _cm_i=0
    while [ $_cm_i -lt 50 ]; do
        [ -z "$(group_pids "$1")" ] && return 0
        if [ $_cm_i = 20 ]; then
            for _cm_g in $1; do kill -KILL "-$_cm_g" 2>/dev/null; done
        fi
        sleep 0.1
        _cm_i=$((_cm_i + 1))
    done
    return 1
}
