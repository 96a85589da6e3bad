# objstore.sh: real object-store servers on this machine, for tests of
# checkpoints over HTTP. Source it (POSIX sh). Each server listens on
# 127.0.0.1 only, keeps its files (configuration, pid, logs) in a private
# temporary directory, and is started here and stopped here by pid; no
# service, nothing under /etc, /var or /run. Installed by scripts/deps.sh
# (optional: where a server is missing its start function says why on stderr
# and returns 1, and the test says SKIP).
#
#   webdav_start ROOT_DIR   nginx (Debian's, /usr/sbin/nginx) serving ROOT_DIR
#                           with WebDAV: PUT DELETE MKCOL COPY MOVE, PROPFIND
#                           and OPTIONS (the dav-ext module), parent
#                           directories created by PUT, no body size limit,
#                           ranged GET; waits until it answers. Exports
#                           WEBDAV_URL (http://127.0.0.1:PORT, no slash at
#                           the end), WEBDAV_PID (nginx's master) and
#                           WEBDAV_ACCESS_LOG (one line per request: method,
#                           URI, status, bytes sent, Range header)
#   webdav_pids             nginx's live processes
#   webdav_kill SIGNAL      SIGNAL to all of them at once (faults: KILL, STOP)
#   webdav_restart          nginx again on the same port and root, once killed
#   webdav_stop             stops it (the master and its workers), removes its
#                           temporary directory (not ROOT_DIR)
#   s3_start DATA_DIR BUCKET
#                           s3rver ($ROOT/.deps/npm, else the one on PATH),
#                           data in DATA_DIR, BUCKET created; waits until it
#                           answers. s3rver 3 refuses an unknown access key
#                           (403 InvalidAccessKeyId) but computes no Signature
#                           Version 4: a wrong secret or payload hash passes,
#                           and so does an unsigned request. So, with Debian's
#                           python3-botocore, S3_ENDPOINT is a proxy in front
#                           of it (sigv4_proxy.py) that checks each request's
#                           signature and payload hash with botocore and
#                           refuses (403 SignatureDoesNotMatch) what S3 would;
#                           S3_SIGNATURES=checked, else unchecked. Exports
#                           S3_ENDPOINT (http://127.0.0.1:PORT), S3_BUCKET,
#                           S3_PID, S3_SIGNATURES, S3_REQUEST_LOG (with the
#                           proxy: "METHOD PATH STATUS" per request relayed,
#                           else empty), and s3rver's keys and region:
#                           AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER
#                           AWS_REGION=us-east-1 (AWS_SESSION_TOKEN unset)
#   s3_stop                 stops it, removes its temporary directory (not
#                           DATA_DIR), unsets what s3_start exported
#   s3cmd_run ARGS...       Debian's s3cmd against that server (path-style,
#                           http, Signature Version 4, s3rver's keys); e.g.
#                           `s3cmd_run put FILE s3://$S3_BUCKET/KEY`; s3cmd's
#                           own options override (--secret_key=WRONG)
#
# One server of each kind at a time.
# A test: `webdav_start DIR || { echo "[SKIP] [$NAME] ..."; exit 0; }`, and
# `trap` webdav_stop (s3_stop) on EXIT, INT and TERM (objstore_stop_at_exit
# does both). The servers are not
# children of the caller (a `wait` there does not wait for them); each runs
# in a process group of its own, and stopping takes whole groups, so that
# nothing a server forked outlives it. A start
# that fails prints the end of the server's log. Needs ROOT, the repository's
# root (tests/e2e/lib.sh sets it), or the root as the current directory.

. "${ROOT:-.}/tests/support/common.sh"

OBJSTORE_NGINX=/usr/sbin/nginx
OBJSTORE_DAV_EXT=/usr/lib/nginx/modules/ngx_http_dav_ext_module.so

_objstore_err() { echo "objstore: $*" >&2; }

# objstore_stop_at_exit [FIRST]: at the test's exit (a signal's too:
# tests/e2e/lib.sh makes INT and TERM an exit), FIRST (a command of the
# test's, e.g. its own proxy's stop) if given, both servers stopped, WORK
# removed.
objstore_stop_at_exit() {
    trap "${1:+$1; }webdav_stop >/dev/null 2>&1; s3_stop >/dev/null 2>&1; rm -rf \"\$WORK\"" EXIT
}

# _objstore_spawn DIR CMD...: starts CMD in the background in a process
# group of its own (spawn_group), output to DIR/server.log; its pid goes to
# DIR/pid and is added to DIR/groups, every group started for DIR, so that
# stopping finds whatever any of them left (an orphaned worker included).
_objstore_spawn() {
    _os_dir=$1
    shift
    spawn_group "$_os_dir/pid" "$_os_dir/server.log" "$@" || return 1
    cat "$_os_dir/pid" >>"$_os_dir/groups"
}

# _objstore_pids DIR: the live processes of every group started for DIR.
_objstore_pids() {
    [ -n "$1" ] && [ -f "$1/groups" ] && group_pids "$(cat "$1/groups")"
    return 0
}

# _objstore_answers URL: 0 when an HTTP server answers at URL (any status).
_objstore_answers() {
    _os_code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$1" 2>/dev/null)
    [ -n "$_os_code" ] && [ "$_os_code" != 000 ]
}

# _objstore_wait URL PID SECONDS [FILE]: until URL answers, once FILE exists
# when given (0), PID exits (1) or SECONDS pass (2).
_objstore_wait() {
    _os_end=$(($(date +%s) + $3))
    while :; do
        pid_alive "$2" || return 1
        if [ -z "${4:-}" ] || [ -s "$4" ]; then
            _objstore_answers "$1" && pid_alive "$2" && return 0
        fi
        [ "$(date +%s)" -ge $_os_end ] && return 2
        sleep 0.05
    done
}

# _objstore_stop DIR WHAT: stops every process of every group started for
# DIR, removes DIR; 1 (and says so) when something is left running.
_objstore_stop() {
    [ -n "$1" ] && [ -d "$1" ] || return 0
    _os_rc=0
    if [ -f "$1/groups" ] && ! stop_groups "$(cat "$1/groups")"; then
        _objstore_err "$2 left running:"
        # shellcheck disable=SC2046
        ps -o pid,pgid,ppid,args -p "$(echo $(_objstore_pids "$1") | tr ' ' ',')" >&2
        _os_rc=1
    fi
    [ $_os_rc = 0 ] && rm -rf "$1"
    return $_os_rc
}

_objstore_log_tail() {
    for _os_f in "$@"; do
        [ -s "$_os_f" ] && tail -n 15 "$_os_f" | sed "s|^|    $(basename "$_os_f"): |" >&2
    done
    return 0
}

# --- WebDAV (nginx)

# _webdav_conf DIR ROOT PORT: nginx's configuration, everything under DIR.
_webdav_conf() {
    if [ -e "$OBJSTORE_DAV_EXT" ]; then echo "load_module $OBJSTORE_DAV_EXT;"; fi
    # As root, nginx's workers would run as nobody, who may not write ROOT.
    if [ "$(id -u)" -eq 0 ]; then echo "user root root;"; fi
    cat <<EOF
daemon off;
master_process on;
worker_processes 2;
pid "$1/nginx.pid";
error_log "$1/error.log" warn;
events { worker_connections 256; }
http {
    log_format tp '\$request_method \$request_uri \$status \$body_bytes_sent range=\$http_range';
    access_log "$1/access.log" tp;
    client_body_temp_path "$1/body";
    proxy_temp_path "$1/proxy";
    fastcgi_temp_path "$1/fastcgi";
    uwsgi_temp_path "$1/uwsgi";
    scgi_temp_path "$1/scgi";
    default_type application/octet-stream;
    sendfile on;
    # /throttled/ serves the same files at most 4 requests a second (one
    # each 250 ms), answering 429 to the others, as a store over its
    # request rate does.
    limit_req_zone \$binary_remote_addr zone=throttled:1m rate=4r/s;
    server {
        listen 127.0.0.1:$3;
        root "$2";
        location /throttled/ {
            limit_req zone=throttled;
            limit_req_status 429;
            alias "$2/";
            dav_ext_methods PROPFIND OPTIONS;
        }
        location / {
            dav_methods PUT DELETE MKCOL COPY MOVE;
            dav_ext_methods PROPFIND OPTIONS;
            dav_access user:rw group:r all:r;
            create_full_put_path on;
            client_max_body_size 0;
            autoindex off;
        }
    }
}
EOF
}

# _webdav_launch DIR URL: nginx started from DIR's configuration; as
# _objstore_wait: 0 once it answers at URL, 1 when it exited, 2 when it does
# not answer in 10 s; 3 when it could not be started. nginx writes its pid
# file once it has bound its port: whatever answered before might be
# another server.
_webdav_launch() {
    rm -f "$1/nginx.pid"
    _objstore_spawn "$1" "$OBJSTORE_NGINX" -p "$1" -c "$1/nginx.conf" -e "$1/error.log" || return 3
    _objstore_wait "$2/" "$(cat "$1/pid")" 10 "$1/nginx.pid"
}

# _webdav_port_held DIR: 0 when nginx's last start found its port held
# ("Address already in use"), its logs then emptied for the next try.
_webdav_port_held() {
    grep -q 'Address already in use' "$1/error.log" "$1/server.log" 2>/dev/null || return 1
    : >"$1/error.log"
    : >"$1/server.log"
}

webdav_start() {
    if [ $# -ne 1 ]; then _objstore_err "usage: webdav_start ROOT_DIR"; return 2; fi
    if [ -n "${_WEBDAV_DIR:-}" ]; then _objstore_err "webdav_start: one is running ($WEBDAV_URL)"; return 2; fi
    if [ ! -x "$OBJSTORE_NGINX" ]; then
        _objstore_err "nginx is not installed ($OBJSTORE_NGINX; scripts/deps.sh installs nginx-light)"
        return 1
    fi
    command -v curl >/dev/null 2>&1 || { _objstore_err "curl is not installed"; return 1; }
    mkdir -p "$1" || return 1
    _wd_root=$(cd "$1" && pwd)
    _WEBDAV_DIR=$(mktemp -d "${TMPDIR:-/tmp}/tp-webdav-XXXXXX") || return 1
    _wd_d=$_WEBDAV_DIR
    # The configuration, tested once (a missing dav-ext module shows here).
    _webdav_conf "$_wd_d" "$_wd_root" 1 >"$_wd_d/nginx.conf"
    if ! "$OBJSTORE_NGINX" -t -q -p "$_wd_d" -c "$_wd_d/nginx.conf" -e "$_wd_d/error.log" >"$_wd_d/test.log" 2>&1; then
        if grep -q 'dav_ext_methods\|ngx_http_dav_ext_module' "$_wd_d/test.log"; then
            _objstore_err "nginx has no WebDAV PROPFIND (scripts/deps.sh installs libnginx-mod-http-dav-ext):"
        else
            _objstore_err "nginx rejects its configuration:"
        fi
        _objstore_log_tail "$_wd_d/test.log"
        rm -rf "$_wd_d"
        _WEBDAV_DIR=""
        return 1
    fi
    # A free port may be taken before nginx binds it: another one then.
    _wd_try=1
    while :; do
        _wd_port=$(free_port 1) || { _objstore_err "no free port"; webdav_stop; return 1; }
        _webdav_conf "$_wd_d" "$_wd_root" "$_wd_port" >"$_wd_d/nginx.conf"
        _webdav_launch "$_wd_d" "http://127.0.0.1:$_wd_port"
        case $? in
        0) break ;;
        1) if [ $_wd_try -lt 5 ] && _webdav_port_held "$_wd_d"; then
               _wd_try=$((_wd_try + 1))
               continue
           fi
           _objstore_err "nginx exited while starting:" ;;
        2) _objstore_err "nginx does not answer on port $_wd_port after 10 s:" ;;
        3) webdav_stop; return 1 ;;
        esac
        _objstore_log_tail "$_wd_d/server.log" "$_wd_d/error.log"
        webdav_stop
        return 1
    done
    WEBDAV_URL="http://127.0.0.1:$_wd_port"
    WEBDAV_PID=$(cat "$_wd_d/pid")
    WEBDAV_ACCESS_LOG="$_wd_d/access.log"
    WEBDAV_SPOOL="$_wd_d/body"
    export WEBDAV_URL WEBDAV_PID WEBDAV_ACCESS_LOG WEBDAV_SPOOL
}

# webdav_pids: nginx's live processes (the master and its workers, and any
# worker a killed master left behind).
webdav_pids() {
    _objstore_pids "${_WEBDAV_DIR:-}"
}

# webdav_kill SIGNAL: SIGNAL (a name: KILL, STOP, CONT...) to all of nginx at once,
# through its process groups. Killing its pids one by one is a race: a
# master that sees a worker die starts another before its own death, and
# that one lives on, orphaned, holding the port.
webdav_kill() {
    [ -n "${_WEBDAV_DIR:-}" ] && [ -f "$_WEBDAV_DIR/groups" ] ||
        { _objstore_err "webdav_kill: none started"; return 2; }
    for _wk_g in $(cat "$_WEBDAV_DIR/groups"); do kill "-$1" "-$_wk_g" 2>/dev/null; done
    return 0
}

# webdav_restart: nginx started again on the same port and root, after it
# was killed (its configuration names both); WEBDAV_PID updated. Refused
# while any nginx it started still runs (a second one would not get the
# port, and the first would be lost track of). nginx itself tries to bind
# for about 2.5 s; while the port stays held ("Address already in use") it
# is started twice more; a failure says why, with nginx's logs.
webdav_restart() {
    [ -n "${_WEBDAV_DIR:-}" ] || { _objstore_err "webdav_restart: none started"; return 2; }
    _wr_left=$(webdav_pids)
    if [ -n "$_wr_left" ]; then
        _objstore_err "webdav_restart: nginx still runs (pids $_wr_left); stop it first (webdav_kill KILL)"
        return 2
    fi
    _wr_try=1
    while :; do
        _webdav_launch "$_WEBDAV_DIR" "$WEBDAV_URL"
        _wr_rc=$?
        [ $_wr_rc = 3 ] && return 1
        WEBDAV_PID=$(cat "$_WEBDAV_DIR/pid")
        export WEBDAV_PID
        case $_wr_rc in
        0) return 0 ;;
        1) if [ $_wr_try -lt 3 ] && _webdav_port_held "$_WEBDAV_DIR"; then
               _wr_try=$((_wr_try + 1))
               continue
           fi
           _objstore_err "webdav_restart: nginx exited while starting again ($WEBDAV_URL, try $_wr_try):" ;;
        *) _objstore_err "webdav_restart: nginx does not answer at $WEBDAV_URL after 10 s:" ;;
        esac
        _objstore_log_tail "$_WEBDAV_DIR/server.log" "$_WEBDAV_DIR/error.log"
        return 1
    done
}

webdav_stop() {
    _objstore_stop "${_WEBDAV_DIR:-}" nginx || return 1
    _WEBDAV_DIR=""
    unset WEBDAV_URL WEBDAV_PID WEBDAV_ACCESS_LOG WEBDAV_SPOOL
}

# --- S3 (s3rver)

_s3rver_bin() {
    if [ -x "${ROOT:-.}/.deps/npm/node_modules/.bin/s3rver" ]; then
        (cd "${ROOT:-.}/.deps/npm/node_modules/.bin" && echo "$(pwd)/s3rver")
    else
        command -v s3rver 2>/dev/null
    fi
}

s3_start() {
    if [ $# -ne 2 ]; then _objstore_err "usage: s3_start DATA_DIR BUCKET"; return 2; fi
    if [ -n "${_S3_DIR:-}" ]; then _objstore_err "s3_start: one is running ($S3_ENDPOINT)"; return 2; fi
    _s3_bin=$(_s3rver_bin) || {
        _objstore_err "s3rver is not installed (scripts/deps.sh installs it with npm into .deps/npm)"
        return 1
    }
    command -v node >/dev/null 2>&1 || { _objstore_err "Node.js is not installed (s3rver needs it)"; return 1; }
    command -v curl >/dev/null 2>&1 || { _objstore_err "curl is not installed"; return 1; }
    mkdir -p "$1" || return 1
    _s3_data=$(cd "$1" && pwd)
    _S3_DIR=$(mktemp -d "${TMPDIR:-/tmp}/tp-s3rver-XXXXXX") || return 1
    _s3_d=$_S3_DIR
    # Port 0: s3rver binds a free one and says which ("S3rver listening on
    # 127.0.0.1:PORT"), so no port can be lost to another server.
    # s3rver's continuation tokens (truncated listings) are DES, which
    # OpenSSL 3 has only in its legacy provider.
    _objstore_spawn "$_s3_d" env NODE_OPTIONS="--openssl-legacy-provider${NODE_OPTIONS:+ $NODE_OPTIONS}" \
        "$_s3_bin" --directory "$_s3_data" --address 127.0.0.1 --port 0 \
        --configure-bucket "$2" || { s3_stop; return 1; }
    _s3_pid=$(cat "$_s3_d/pid")
    _s3_end=$(($(date +%s) + 20))
    _s3_port=""
    while [ -z "$_s3_port" ]; do
        _s3_port=$(sed -n 's/^S3rver listening on 127\.0\.0\.1:\([0-9][0-9]*\)$/\1/p' "$_s3_d/server.log" 2>/dev/null)
        [ -n "$_s3_port" ] && break
        if ! pid_alive "$_s3_pid"; then
            _objstore_err "s3rver exited while starting:"
            _objstore_log_tail "$_s3_d/server.log"
            s3_stop
            return 1
        fi
        if [ "$(date +%s)" -ge $_s3_end ]; then
            _objstore_err "s3rver is not listening after 20 s:"
            _objstore_log_tail "$_s3_d/server.log"
            s3_stop
            return 1
        fi
        sleep 0.05
    done
    if ! _objstore_wait "http://127.0.0.1:$_s3_port/" "$_s3_pid" 10; then
        _objstore_err "s3rver does not answer on port $_s3_port:"
        _objstore_log_tail "$_s3_d/server.log"
        s3_stop
        return 1
    fi
    # s3rver computes no Signature Version 4: in front of it, a proxy that
    # checks every request's signature with botocore (sigv4_proxy.py), when
    # Debian's python3-botocore is there. S3_SIGNATURES says which.
    S3_SIGNATURES=unchecked
    # OBJSTORE_S3_PROXY=0 leaves it out (benchmarks measure s3rver itself).
    if [ "${OBJSTORE_S3_PROXY:-1}" != 0 ] && /usr/bin/python3 -c 'import botocore' 2>/dev/null; then
        mkdir -p "$_s3_d/proxy"
        _objstore_spawn "$_s3_d/proxy" /usr/bin/python3 "${ROOT:-.}/tests/support/sigv4_proxy.py" "$_s3_port" \
            S3RVER S3RVER us-east-1 "$_s3_d/proxy/requests.log" || { s3_stop; return 1; }
        _s3_proxy_port=""
        _s3_end=$(($(date +%s) + 20))
        while [ -z "$_s3_proxy_port" ] && [ "$(date +%s)" -lt $_s3_end ]; do
            _s3_proxy_port=$(sed -n 's/^sigv4 proxy listening on 127\.0\.0\.1:\([0-9][0-9]*\)$/\1/p' \
                "$_s3_d/proxy/server.log" 2>/dev/null)
            pid_alive "$(cat "$_s3_d/proxy/pid")" || break
            [ -n "$_s3_proxy_port" ] || sleep 0.05
        done
        if [ -z "$_s3_proxy_port" ]; then
            _objstore_err "the signature-checking proxy did not start:"
            _objstore_log_tail "$_s3_d/proxy/server.log"
            s3_stop
            return 1
        fi
        _s3_port=$_s3_proxy_port
        S3_SIGNATURES=checked
    elif [ "${OBJSTORE_S3_PROXY:-1}" != 0 ]; then
        _objstore_err "note: python3-botocore missing: signatures go unchecked (s3rver checks none)"
    fi
    cat >"$_s3_d/s3cmd.cfg" <<EOF
[default]
access_key = S3RVER
secret_key = S3RVER
host_base = 127.0.0.1:$_s3_port
host_bucket = 127.0.0.1:$_s3_port
bucket_location = us-east-1
use_https = False
signature_v2 = False
check_ssl_certificate = False
guess_mime_type = False
progress_meter = False
EOF
    S3_ENDPOINT="http://127.0.0.1:$_s3_port"
    S3_BUCKET=$2
    S3_PID=$_s3_pid
    AWS_ACCESS_KEY_ID=S3RVER
    AWS_SECRET_ACCESS_KEY=S3RVER
    AWS_REGION=us-east-1
    unset AWS_SESSION_TOKEN
    S3_LOG="$_s3_d/server.log"
    # The requests relayed, "METHOD PATH STATUS" a line (empty without the proxy).
    S3_REQUEST_LOG=""
    [ "$S3_SIGNATURES" = checked ] && S3_REQUEST_LOG="$_s3_d/proxy/requests.log"
    export S3_REQUEST_LOG S3_ENDPOINT S3_BUCKET S3_PID S3_SIGNATURES S3_LOG AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_REGION
}

# s3_pids: s3rver's processes and the signature-checking proxy's.
s3_pids() {
    _objstore_pids "${_S3_DIR:-}"
    [ -z "${_S3_DIR:-}" ] || _objstore_pids "$_S3_DIR/proxy"
}

s3_stop() {
    [ -z "${_S3_DIR:-}" ] || _objstore_stop "$_S3_DIR/proxy" "the signature-checking proxy" || return 1
    _objstore_stop "${_S3_DIR:-}" s3rver || return 1
    _S3_DIR=""
    unset S3_ENDPOINT S3_BUCKET S3_PID S3_SIGNATURES S3_LOG S3_REQUEST_LOG AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_REGION
}

s3cmd_run() {
    if [ -z "${_S3_DIR:-}" ] || [ ! -f "$_S3_DIR/s3cmd.cfg" ]; then
        _objstore_err "s3cmd_run: no s3rver started (s3_start)"
        return 2
    fi
    command -v s3cmd >/dev/null 2>&1 || { _objstore_err "s3cmd is not installed"; return 127; }
    s3cmd -c "$_S3_DIR/s3cmd.cfg" "$@"
}

# fault_proxy_start UPSTREAM_URL: tests/support/fault_proxy.py in front of
# the server at UPSTREAM_URL (its port), its rules in $RULES ($WORK/rules,
# emptied: everything relayed), its pid in PROXY_PID (the caller stops it),
# its URL in P once it listens.
fault_proxy_start() {
    rm -f "$WORK/proxy.port"
    RULES="$WORK/rules"
    : >"$RULES"
    /usr/bin/python3 "$ROOT/tests/support/fault_proxy.py" --upstream "${1##*:}" --rules "$RULES" \
        --port-file "$WORK/proxy.port" --log "$WORK/proxy.log" 2>"$WORK/proxy.err" &
    PROXY_PID=$!
    _n=0
    while [ ! -s "$WORK/proxy.port" ] && [ $_n -lt 100 ]; do sleep 0.1; _n=$((_n + 1)); done
    P="http://127.0.0.1:$(cat "$WORK/proxy.port")"
}
