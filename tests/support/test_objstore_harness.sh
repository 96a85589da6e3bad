#!/bin/sh
# The object-store test harness (tests/support/objstore.sh) checked with
# independent clients only (curl, s3cmd), no code of ours:
#   - WebDAV (nginx): PUT creates the parent directories, GET whole and
#     ranged (206, Content-Range, the right bytes), PROPFIND Depth: 1 lists
#     the file with its length, MOVE, DELETE;
#   - S3 (s3rver): s3cmd put, get, ls, a multipart upload; curl's Signature
#     Version 4 (GET, ranged GET, ListObjectsV2 with delimiter, a truncated
#     listing continued with its token); an unknown access key refused (403);
#   - stopping leaves no server process and no temporary directory.
# Each server's part says SKIP where that server is not installed.
# tier: full
. "$(dirname "$0")/../e2e/lib.sh"
. "$ROOT/tests/support/objstore.sh"
objstore_stop_at_exit
SKIPPED=""

# An object: bytes that differ at every offset a range could pick.
head -c 100000 /dev/urandom >"$WORK/obj"
# bytes FILE FIRST LAST: those bytes of FILE.
bytes() { tail -c +$(($2 + 1)) "$1" | head -c $(($3 - $2 + 1)); }
bytes "$WORK/obj" 1000 1999 >"$WORK/obj.1000-1999"

# http_code FILE CURL_ARGS...: curl's status code; the body to FILE.
http_code() {
    _f=$1
    shift
    curl -s -o "$_f" -w '%{http_code}' "$@"
}

# The process ids of a server and its children, and its private directory
# (the command line's -p for nginx).
tree_of() { echo "$1 $(ps -o pid= --ppid "$1" | tr '\n' ' ')"; }
none_alive() {
    for _p in $1; do pid_alive "$_p" && return 1; done
    return 0
}
any_alive() { ! none_alive "$1"; }
# no_process_naming TEXT: no process has TEXT in its command line.
no_process_naming() { ! pgrep -f -- "$1" >/dev/null; }

# --- WebDAV
if ! webdav_start "$WORK/dav" 2>"$WORK/.err"; then
    echo "[SKIP] [$NAME] WebDAV: $(head -n 1 "$WORK/.err")"
    SKIPPED="$SKIPPED webdav"
else
    U=$WEBDAV_URL
    check "WEBDAV_URL is http://127.0.0.1:PORT" sh -c "echo '$U' | grep -Eqx 'http://127\.0\.0\.1:[0-9]+'"
    check "curl PUT to a new directory: 201" [ "$(http_code /dev/null -T "$WORK/obj" "$U/ckpt/step-1/shard.h5")" = 201 ]
    check "the file is in ROOT_DIR, whole" cmp -s "$WORK/obj" "$WORK/dav/ckpt/step-1/shard.h5"
    check "PUT over it: 204" [ "$(http_code /dev/null -T "$WORK/obj" "$U/ckpt/step-1/shard.h5")" = 204 ]
    check "GET: 200" [ "$(http_code "$WORK/got" "$U/ckpt/step-1/shard.h5")" = 200 ]
    check "GET: the same bytes" cmp -s "$WORK/obj" "$WORK/got"
    code=$(http_code "$WORK/range" -D "$WORK/headers" -r 1000-1999 "$U/ckpt/step-1/shard.h5")
    check "ranged GET: 206" [ "$code" = 206 ]
    check "ranged GET: Content-Range bytes 1000-1999/100000" grep -qi '^Content-Range: bytes 1000-1999/100000' "$WORK/headers"
    check "ranged GET: bytes 1000..1999" cmp -s "$WORK/obj.1000-1999" "$WORK/range"
    check "ranged GET past the end: 416" [ "$(http_code /dev/null -r 200000-200001 "$U/ckpt/step-1/shard.h5")" = 416 ]
    code=$(http_code "$WORK/propfind" -X PROPFIND -H 'Depth: 1' "$U/ckpt/step-1/")
    check "PROPFIND Depth 1: 207" [ "$code" = 207 ]
    check "PROPFIND lists the directory and the file" \
        grep -q '<D:href>/ckpt/step-1/shard.h5</D:href>' "$WORK/propfind"
    check_all "PROPFIND gives the file's length" \
        "tr -d '\n' <'$WORK/propfind' | grep -q 'shard.h5</D:href>.*<D:getcontentlength>100000</D:getcontentlength>'"
    check "PROPFIND of a missing path: 404" [ "$(http_code /dev/null -X PROPFIND -H 'Depth: 1' "$U/nothing/")" = 404 ]
    # nginx answers 204 to a MOVE to a new name too, and creates the missing
    # directories (create_full_put_path).
    code=$(http_code /dev/null -X MOVE -H "Destination: $U/ckpt/step-2/shard.h5" "$U/ckpt/step-1/shard.h5")
    check_all "MOVE to a new directory: 201 or 204" '[ "$code" = 201 ] || [ "$code" = 204 ]'
    check_all "MOVE: renamed in ROOT_DIR" \
        "[ ! -e '$WORK/dav/ckpt/step-1/shard.h5' ] && cmp -s '$WORK/obj' '$WORK/dav/ckpt/step-2/shard.h5'"
    check "DELETE: 204" [ "$(http_code /dev/null -X DELETE "$U/ckpt/step-2/shard.h5")" = 204 ]
    check "DELETE: gone from ROOT_DIR" [ ! -e "$WORK/dav/ckpt/step-2/shard.h5" ]
    check "GET after DELETE: 404" [ "$(http_code /dev/null "$U/ckpt/step-2/shard.h5")" = 404 ]
    # webdav_restart after kill -9: the same URL and files; while another
    # process holds the port it tries again, and gives up naming the cause.
    port=${U##*:}
    # nginx in a process group of its own, away from this test's.
    check "nginx's master leads a process group of its own" \
        [ "$(ps -o pgid= -p "$WEBDAV_PID" | tr -d ' ')" = "$WEBDAV_PID" ]
    check "not this test's group" [ "$(ps -o pgid= -p "$WEBDAV_PID" | tr -d ' ')" != "$(ps -o pgid= -p $$ | tr -d ' ')" ]
    # A worker that dies is replaced by its master: the new one is found too.
    before=$(webdav_pids)
    worker=$(ps -o pid= --ppid "$WEBDAV_PID" | head -n 1 | tr -d ' ')
    kill -9 "$worker"
    for _ in $(seq 100); do
        [ "$(echo "$(webdav_pids)" | wc -w)" = "$(echo "$before" | wc -w)" ] && ! pid_alive "$worker" && break
        sleep 0.05
    done
    after=$(webdav_pids)
    check_all "a killed worker replaced: webdav_pids names its successor, not it" \
        "[ $(echo "$after" | wc -w) -eq $(echo "$before" | wc -w) ] && ! echo ' $after ' | grep -q ' $worker '"
    run webdav_restart
    check_all "webdav_restart while nginx runs: refused" "[ $RC -eq 2 ] && grep -q 'nginx still runs' '$WORK/.err'"
    webdav_kill KILL
    sleep 0.2
    check "webdav_kill KILL: no nginx left" [ -z "$(webdav_pids)" ]
    expect_ok "webdav_restart after kill -9" webdav_restart
    check "restarted: the same URL answers with the same files" \
        [ "$(http_code /dev/null -X PROPFIND -H 'Depth: 1' "$U/ckpt/")" = 207 ]
    # hold_port SECONDS: a listener on the port for that long (background).
    hold_port() {
        "$PY" -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(1)
open(sys.argv[3], "w").close(); time.sleep(float(sys.argv[2]))' "$port" "$1" "$WORK/held" &
        holder=$!
        while [ ! -e "$WORK/held" ] && pid_alive $holder; do sleep 0.02; done
        rm -f "$WORK/held"
    }
    webdav_kill KILL
    sleep 0.2
    hold_port 4
    expect_ok "webdav_restart while the port is held for 4 s (longer than nginx's own tries): starts it again" \
        webdav_restart
    wait $holder
    webdav_kill KILL
    sleep 0.2
    hold_port 60
    run webdav_restart
    kill $holder 2>/dev/null
    wait $holder 2>/dev/null
    sleep 0.2
    check "webdav_restart while the port stays held: fails" [ "$RC" -ne 0 ]
    check "and says why, with nginx's log" grep -q "Address already in use" "$WORK/.err"
    expect_ok "webdav_restart once the port is free" webdav_restart
    pids=$(tree_of "$WEBDAV_PID")
    # (nginx's master rewrites its command line: "nginx: master process ... -p DIR ...")
    tmp=$(tr '\0' ' ' <"/proc/$WEBDAV_PID/cmdline" | sed -n 's|.* -p \(/[^ ]*\) .*|\1|p')
    check "nginx has a master and workers" [ "$(echo "$pids" | wc -w)" -ge 2 ]
    check "nginx's directory is a private temporary one" [ -d "$tmp" ]
    # The master killed alone: its workers live on, orphaned, holding the
    # port; webdav_restart refuses, naming them, and webdav_stop stops them.
    workers=$(ps -o pid= --ppid "$WEBDAV_PID" | tr '\n' ' ')
    kill -9 "$WEBDAV_PID"
    sleep 0.2
    check "the master killed alone: its workers live on" any_alive "$workers"
    run webdav_restart
    check_all "webdav_restart refuses while orphaned workers run, naming them" \
        "[ $RC -ne 0 ] && grep -q 'nginx still runs (pids .*$(echo $workers | cut -d' ' -f1)' '$WORK/.err'"
    expect_ok "webdav_stop" webdav_stop
    check "webdav_stop: no nginx process left, orphaned workers included" none_alive "$pids $workers"
    check "webdav_stop: no process names its directory" no_process_naming "$tmp"
    check "webdav_stop: its directory is removed" [ ! -e "$tmp" ]
    check "webdav_stop: ROOT_DIR is kept" [ -d "$WORK/dav/ckpt" ]
fi

# --- S3
if ! s3_start "$WORK/s3" tp-test 2>"$WORK/.err"; then
    echo "[SKIP] [$NAME] S3: $(head -n 1 "$WORK/.err")"
    SKIPPED="$SKIPPED s3"
elif ! command -v s3cmd >/dev/null 2>&1; then
    echo "[SKIP] [$NAME] S3: s3cmd is not installed (scripts/deps.sh installs it)"
    SKIPPED="$SKIPPED s3"
    s3_stop
else
    B=s3://$S3_BUCKET
    check "S3_ENDPOINT is http://127.0.0.1:PORT" sh -c "echo '$S3_ENDPOINT' | grep -Eqx 'http://127\.0\.0\.1:[0-9]+'"
    check_all "s3rver's keys and region exported" \
        '[ "$AWS_ACCESS_KEY_ID" = S3RVER ] && [ "$AWS_SECRET_ACCESS_KEY" = S3RVER ] && [ "$AWS_REGION" = us-east-1 ]'
    expect_ok "s3cmd put" s3cmd_run put "$WORK/obj" "$B/ckpt/step-1/shard.h5"
    expect_ok "s3cmd put of a second object" s3cmd_run put "$WORK/obj.1000-1999" "$B/ckpt/step-1/small"
    expect_ok "s3cmd put at the prefix's top" s3cmd_run put "$WORK/obj.1000-1999" "$B/ckpt/latest"
    expect_ok "s3cmd get" s3cmd_run get --force "$B/ckpt/step-1/shard.h5" "$WORK/s3got"
    check "s3cmd get: the same bytes" cmp -s "$WORK/obj" "$WORK/s3got"
    expect_ok "s3cmd ls" s3cmd_run ls "$B/ckpt/step-1/"
    check "s3cmd ls lists the object with its size" grep -Eq ' 100000 +s3://tp-test/ckpt/step-1/shard.h5$' "$WORK/.out"
    # A multipart upload: three parts of at least 5 MiB (s3cmd's smallest).
    head -c 11000000 /dev/urandom >"$WORK/big"
    expect_ok "s3cmd multipart put (3 parts)" s3cmd_run --multipart-chunk-size-mb=5 --progress put "$WORK/big" "$B/big"
    check "s3cmd used a multipart upload" grep -q 'part 3 of 3' "$WORK/.out"
    expect_ok "s3cmd get of the multipart object" s3cmd_run get --force "$B/big" "$WORK/big.got"
    check "multipart object: the same bytes" cmp -s "$WORK/big" "$WORK/big.got"

    # curl's own Signature Version 4 (s3rver wants x-amz-content-sha256).
    EMPTY_SHA=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
    # s3curl FILE CURL_ARGS...: http_code, signed.
    s3curl() {
        _s3f=$1
        shift
        http_code "$_s3f" --aws-sigv4 aws:amz:us-east-1:s3 --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
            -H "x-amz-content-sha256: $EMPTY_SHA" "$@"
    }
    O="$S3_ENDPOINT/$S3_BUCKET"
    check "curl SigV4 GET: 200" [ "$(s3curl "$WORK/s3got2" "$O/ckpt/step-1/shard.h5")" = 200 ]
    check "curl SigV4 GET: the same bytes" cmp -s "$WORK/obj" "$WORK/s3got2"
    code=$(s3curl "$WORK/s3range" -D "$WORK/headers" -r 1000-1999 "$O/ckpt/step-1/shard.h5")
    check "curl SigV4 ranged GET: 206" [ "$code" = 206 ]
    check "ranged GET: Content-Range bytes 1000-1999/100000" grep -qi '^Content-Range: bytes 1000-1999/100000' "$WORK/headers"
    check "ranged GET: bytes 1000..1999" cmp -s "$WORK/obj.1000-1999" "$WORK/s3range"
    check "GET of a missing key: 404" [ "$(s3curl "$WORK/missing" "$O/ckpt/none")" = 404 ]
    check "missing key: NoSuchKey" grep -q '<Code>NoSuchKey</Code>' "$WORK/missing"
    # Query parameters in sorted order: curl 7.88 signs them as written,
    # and S3 (and the signature-checking proxy) canonicalize them sorted.
    code=$(s3curl "$WORK/list" "$O?delimiter=%2F&list-type=2&prefix=ckpt%2F")
    check "ListObjectsV2 with delimiter: 200" [ "$code" = 200 ]
    check_all "ListObjectsV2: the key at the top, the step as a common prefix" \
        "grep -q '<Key>ckpt/latest</Key>' '$WORK/list' && grep -q '<CommonPrefixes><Prefix>ckpt/step-1/</Prefix></CommonPrefixes>' '$WORK/list' && ! grep -q 'shard.h5' '$WORK/list'"
    # A truncated listing (its continuation token needs OpenSSL's legacy DES).
    code=$(s3curl "$WORK/page1" "$O?list-type=2&max-keys=1&prefix=ckpt%2Fstep-1%2F")
    check "ListObjectsV2 max-keys=1: 200" [ "$code" = 200 ]
    check "first page: truncated, one key" grep -q '<KeyCount>1</KeyCount>.*<IsTruncated>true</IsTruncated>.*<Key>ckpt/step-1/shard.h5</Key>' "$WORK/page1"
    token=$(sed -n 's|.*<NextContinuationToken>\([^<]*\)</NextContinuationToken>.*|\1|p' "$WORK/page1")
    enc=$(printf '%s' "$token" | sed 's|+|%2B|g; s|/|%2F|g; s|=|%3D|g')
    code=$(s3curl "$WORK/page2" "$O?continuation-token=$enc&list-type=2&max-keys=1&prefix=ckpt%2Fstep-1%2F")
    check "second page: 200" [ "$code" = 200 ]
    check "second page: the other key, not truncated" grep -q '<IsTruncated>false</IsTruncated>.*<Key>ckpt/step-1/small</Key>' "$WORK/page2"

    # Authentication.
    run s3cmd_run --access_key=NOBODY ls "$B/"
    check_all "an unknown access key is refused: 403 InvalidAccessKeyId" \
        "[ $RC -ne 0 ] && grep -q '403 (InvalidAccessKeyId)' '$WORK/.err'"
    check "curl with an unknown access key: 403" \
        [ "$(curl -s -o /dev/null -w '%{http_code}' --aws-sigv4 aws:amz:us-east-1:s3 --user NOBODY:x -H "x-amz-content-sha256: $EMPTY_SHA" "$O/ckpt/latest")" = 403 ]
    # s3rver 3 computes no Signature Version 4 (only V2): the proxy in
    # front of it (S3_SIGNATURES=checked, with python3-botocore) does.
    run s3cmd_run --secret_key=WRONG ls "$B/"
    if [ "$S3_SIGNATURES" = checked ]; then
        check_all "a wrong secret key is refused: 403 SignatureDoesNotMatch" \
            "[ $RC -ne 0 ] && grep -q 'SignatureDoesNotMatch' '$WORK/.err' '$WORK/.out'"
        check "an unsigned request is refused: 403" \
            [ "$(curl -s -o /dev/null -w '%{http_code}' "$O/ckpt/latest")" = 403 ]
    elif [ "$RC" -eq 0 ]; then
        echo "[$NAME] note: signatures unchecked (no python3-botocore): a wrong secret key is accepted"
    fi

    pid=$S3_PID
    expect_ok "s3_stop" s3_stop
    check "s3_stop: no s3rver process left" none_alive "$pid"
    check "s3_stop: no process names its data directory" no_process_naming "$WORK/s3"
    check "s3_stop: the variables are unset" sh -c '[ -z "${S3_ENDPOINT:-}${S3_PID:-}${AWS_ACCESS_KEY_ID:-}" ]'
    check "s3_stop: the data are kept" [ -e "$WORK/s3/tp-test" ]
fi

if [ "$SKIPPED" = " webdav s3" ]; then
    echo "[$NAME] 0 passed, 0 failed, skipped"
    exit 0
fi
finish
