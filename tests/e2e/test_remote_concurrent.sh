#!/bin/sh
# Two uploads to one URL at once (docs/STORES.md "Two uploads to one URL"):
# at most one succeeds, the other fails naming the URL and the writer that
# goes on, and what the URL holds then verifies as the winner's checkpoint.
# Before, both printed "copied", exited 0, and the URL held one's index over
# a mix of both's shards ("54 of 339 pieces damaged"): each had checked that
# nothing was there before it began, and nothing caught the other after.
# Every interleaving is made by the test hook (TP_CKPT_FAULT=POINT:WAIT:FILE,
# docs/FORMAT.md "Test hook"), none by timing:
#   1. the reviewer's mix: A and B both past their checks with their shards
#      in flight, A's shards up, B's over them with B's index, then A's index;
#   2. two claims made at once (each before the other looked): the tie is
#      broken, one goes on; a claim listed, and gone with its finished
#      upload before it was read: that upload named;
#   3. a writer killed outright after its claim: refused without --force,
#      naming it; replaced with --force at once (its process is gone); a
#      claim from another machine, never renewed, taken over after
#      TP_UPLOAD_CLAIM_SECONDS;
#   4. --force beside a live upload (its claim renewed): refused, and the
#      live one completes whole;
#   5. tp-reshard -o URL and tp-ckpt export -o URL beside a copy in flight.
# The same on nginx's WebDAV and on s3rver (S3); each part says SKIP where
# its server cannot start.
# takes: about 40 s beside two other tests on 2 cores
# waits: mostly for the object stores' servers to start
# tier: full
. "$(dirname "$0")/lib.sh"
. "$ROOT/tests/support/objstore.sh"

CK="$BIN/tp-ckpt"
RS="$BIN/tp-reshard"
export TMPDIR="$WORK/tmp"
mkdir -p "$TMPDIR"
objstore_stop_at_exit

# Two checkpoints of one shape (the same shard names and sizes), told apart
# by their step. Shards of about 2.8 MB: more than one of libcurl's
# buffers, so that a body is held partly sent.
MODEL="--model tiny --dim 128 --tp 2 --pp 1 --optim"
expect_ok "checkpoint A (step 100)" "$CK" synth -o "$WORK/A" $MODEL --step 100 --seed 1
expect_ok "checkpoint B (step 200)" "$CK" synth -o "$WORK/B" $MODEL --step 200 --seed 2

# start NAME POINTS CMD...: CMD in the background with TP_CKPT_FAULT=POINTS,
# its output in $WORK/NAME.out and .err; its pid in PID_<NAME>.
start() {
    _name=$1 _points=$2
    shift 2
    env TP_CKPT_FAULT="$_points" "$@" >"$WORK/$_name.out" 2>"$WORK/$_name.err" &
    eval "PID_$_name=\$!"
}

# held FILE PID: waits until the writer PID holds at FILE's point (FILE.held)
# or has exited, 60 s at most; 0 when it holds there.
held() {
    for _i in $(seq 1200); do
        [ -e "$1.held" ] && return 0
        pid_alive "$2" || { [ -e "$1.held" ]; return; }
        sleep 0.05
    done
    return 1
}

# finished PID: waits for it; its exit status in RCW.
finished() {
    wait "$1"
    RCW=$?
}

# step_at URL: the step of the checkpoint at URL (tp-ckpt info --json).
step_at() {
    "$CK" info --json "$1" 2>/dev/null | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["step"])'
}

# one_won WHAT URL RC_A RC_B: exactly one of A (step 100) and B (step 200)
# exited 0; the URL verifies and holds the winner's step; the loser's error
# names the URL and the winner's process.
one_won() {
    _what=$1 _url=$2 _ra=$3 _rb=$4
    check "$_what: exactly one upload succeeded (A exit $_ra, B exit $_rb)" \
        [ $((_ra == 0)) -ne $((_rb == 0)) ]
    expect_ok "$_what: what the URL holds verifies" "$CK" verify "$_url"
    if [ "$_ra" -eq 0 ]; then _win=A _lose=B _step=100; else _win=B _lose=A _step=200; fi
    _winpid=$(eval echo "\$PID_$_win")
    check "$_what: the URL holds the winner's checkpoint ($_win, step $_step)" [ "$(step_at "$_url")" = "$_step" ]
    # The loser's output as the check's (a failure shows what it said).
    cp "$WORK/$_lose.out" "$WORK/.out"
    cp "$WORK/$_lose.err" "$WORK/.err"
    check_all "$_what: the loser ($_lose) says why, naming the URL and the winner (pid $_winpid)" \
        "grep -q '$_url' '$WORK/$_lose.err' && grep -q 'pid $_winpid ' '$WORK/$_lose.err'"
    check "$_what: the winner printed 'copied'" grep -q '^copied ' "$WORK/$_win.out"
}

# concurrent_parts STORE PREFIX HAS LIST PUT_RAW: the cases against one store;
# `HAS KEY` is true when KEY is stored, `LIST KEY` prints the names under
# KEY, `PUT_RAW KEY FILE` stores FILE as KEY (all on the server's own disk or
# through an independent client).
concurrent_parts() {
    store=$1 P=$2 has=$3 list=$4 put_raw=$5

    # --- 1. The reviewer's interleaving: A and B past their checks, bodies
    # in flight; A's shards up (A held before its index); B goes through;
    # then A's index.
    rm -f "$WORK"/g*
    start A "upload-sending:WAIT:$WORK/ga1,upload-before-index:WAIT:$WORK/ga2" "$CK" copy "$WORK/A" "$P/c1"
    held "$WORK/ga1" "$PID_A"
    check "$store 1: A holds with a shard's body partly sent" [ -e "$WORK/ga1.held" ]
    start B "upload-sending:WAIT:$WORK/gb1" "$CK" copy "$WORK/B" "$P/c1"
    held "$WORK/gb1" "$PID_B"
    touch "$WORK/ga1"
    held "$WORK/ga2" "$PID_A"
    touch "$WORK/gb1"
    finished "$PID_B"
    rb=$RCW
    touch "$WORK/ga2"
    finished "$PID_A"
    ra=$RCW
    one_won "$store 1 (both past their checks, bodies in flight)" "$P/c1" "$ra" "$rb"
    check_all "$store 1: no claim is left at the URL" '! $list c1 | grep -q "^tp-upload-claim\."'

    # --- 2. Two claims made before either looked: each sees the other's,
    # the tie is broken by the claims' names, one goes on.
    rm -f "$WORK"/g*
    start A "upload-claiming:WAIT:$WORK/ga1,upload-claimed:WAIT:$WORK/ga2" "$CK" copy "$WORK/A" "$P/c2"
    held "$WORK/ga1" "$PID_A"
    start B "upload-claiming:WAIT:$WORK/gb1,upload-claimed:WAIT:$WORK/gb2" "$CK" copy "$WORK/B" "$P/c2"
    held "$WORK/gb1" "$PID_B"
    check_all "$store 2: both writers past their checks, neither has claimed" \
        '[ -e "$WORK/ga1.held" ] && [ -e "$WORK/gb1.held" ]'
    touch "$WORK/ga1" "$WORK/gb1"
    held "$WORK/ga2" "$PID_A"
    held "$WORK/gb2" "$PID_B"
    check "$store 2: both claims made" [ "$($list c2 | grep -c '^tp-upload-claim\.')" -eq 2 ]
    touch "$WORK/gb2" # B looks first: it finds A's claim still choosing and waits for it
    sleep 0.3
    touch "$WORK/ga2"
    finished "$PID_A"
    ra=$RCW
    finished "$PID_B"
    rb=$RCW
    one_won "$store 2 (two claims at once)" "$P/c2" "$ra" "$rb"
    check_all "$store 2: no claim is left at the URL" '! $list c2 | grep -q "^tp-upload-claim\."'

    # --- 2b. A writer that listed another's claim and, before it read it,
    # found it gone with its upload finished (met under load in case 2): it
    # names that upload's process all the same (it said "the upload of the
    # claim tp-upload-claim.OWNER").
    rm -f "$WORK"/g*
    start A "upload-claiming:WAIT:$WORK/ga0,upload-judging:WAIT:$WORK/ga1" "$CK" copy "$WORK/A" "$P/c2b"
    held "$WORK/ga0" "$PID_A"
    start B "upload-before-index:WAIT:$WORK/gb1" "$CK" copy "$WORK/B" "$P/c2b"
    held "$WORK/gb1" "$PID_B"
    touch "$WORK/ga0"
    held "$WORK/ga1" "$PID_A"
    touch "$WORK/gb1"
    finished "$PID_B"
    rb=$RCW
    touch "$WORK/ga1"
    finished "$PID_A"
    ra=$RCW
    one_won "$store 2b (the other's claim gone before it was read)" "$P/c2b" "$ra" "$rb"
    check "$store 2b: the loser says the other finished while it chose" \
        grep -q "put by another upload that finished while this one was choosing: the upload of pid $PID_B on host" "$WORK/A.err"

    # --- 3. A writer killed outright after its claim: its claim stays.
    run env TP_CKPT_FAULT=upload-claimed "$CK" copy "$WORK/A" "$P/c3"
    check "$store 3: killed after its claim (exit $RC, expected 137)" [ "$RC" -eq 137 ]
    expect_error "$store 3: a plain copy is refused, naming what the stopped upload left" 1 \
        "$P/c3 holds what an upload that stopped left: tp-ckpt \(pid [0-9]+ on host .*its process is gone.*--force replaces it" \
        "$CK" copy "$WORK/B" "$P/c3"
    expect_ok "$store 3: copy --force replaces it at once (its process is gone from this machine)" \
        "$CK" copy "$WORK/B" "$P/c3" --force
    expect_ok "$store 3: it verifies" "$CK" verify "$P/c3"
    check "$store 3: the server holds the checkpoint alone" \
        [ "$($list c3 | tr '\n' ' ')" = "index.json shard_pp00_tp00.h5 shard_pp00_tp01.h5 " ]
    # A claim of another machine's writer, never renewed: taken over by
    # --force once it has been seen unchanged for TP_UPLOAD_CLAIM_SECONDS.
    printf '{"owner":"elsewhere-7-00000001","writer":"tp-ckpt (pid 7 on host elsewhere, since 2026-01-01T00:00:00Z)","host":"elsewhere","pid":7,"state":"chosen","saw":["elsewhere-7-00000001"],"renewals":3}' \
        >"$WORK/foreign.claim"
    $put_raw c4/tp-upload-claim.elsewhere-7-00000001 "$WORK/foreign.claim"
    expect_error "$store 3: another machine's claim: a plain copy is refused, naming its writer" 1 \
        "$P/c4: an upload to it is under way, or stopped before it finished: tp-ckpt \(pid 7 on host elsewhere" \
        "$CK" copy "$WORK/B" "$P/c4"
    t0=$(date +%s%N)
    expect_ok "$store 3: copy --force takes a claim never renewed over" env TP_UPLOAD_CLAIM_SECONDS=2 \
        "$CK" copy "$WORK/B" "$P/c4" --force
    ms=$((($(date +%s%N) - t0) / 1000000))
    check "$store 3: ... after watching it for TP_UPLOAD_CLAIM_SECONDS=2 ($ms ms)" [ "$ms" -ge 2000 ]
    check_all "$store 3: the foreign claim is gone" '! $list c4 | grep -q "^tp-upload-claim\."'
    expect_ok "$store 3: and the checkpoint verifies" "$CK" verify "$P/c4"

    # --- 4. --force beside a live upload: its claim is renewed, so it is
    # not taken for a stopped one's; the live upload completes.
    rm -f "$WORK"/g*
    start A "upload-before-index:WAIT:$WORK/ga1" env TP_UPLOAD_CLAIM_SECONDS=4 "$CK" copy "$WORK/A" "$P/c5"
    held "$WORK/ga1" "$PID_A"
    run env TP_UPLOAD_CLAIM_SECONDS=4 "$CK" copy "$WORK/B" "$P/c5" --force
    check_all "$store 4: copy --force beside a live upload is refused (exit $RC), naming the URL and the writer" \
        "[ '$RC' -eq 1 ] && grep -q '$P/c5: another upload to it is under way: tp-ckpt (pid $PID_A ' '$WORK/.err'"
    touch "$WORK/ga1"
    finished "$PID_A"
    ra=$RCW
    check "$store 4: the live upload completes (exit $ra)" [ "$ra" -eq 0 ]
    expect_ok "$store 4: it verifies" "$CK" verify "$P/c5"
    check "$store 4: it is A's (step 100)" [ "$(step_at "$P/c5")" = 100 ]

    # --- 5. Other writers of URLs beside a copy in flight: refused at once,
    # naming it, before any work.
    rm -f "$WORK"/g*
    start A "upload-sending:WAIT:$WORK/ga1" "$CK" copy "$WORK/A" "$P/c6"
    held "$WORK/ga1" "$PID_A"
    expect_error "$store 5: tp-reshard -o URL beside an upload in flight: refused, naming it" 1 \
        "$P/c6: an upload to it is under way, or stopped before it finished: tp-ckpt \(pid $PID_A " \
        "$RS" "$WORK/B" --to tp1pp1 -o "$P/c6"
    expect_error "$store 5: tp-ckpt export -o URL beside it: refused, naming it" 1 \
        "$P/c6: an upload to it is under way, or stopped before it finished: tp-ckpt \(pid $PID_A " \
        "$CK" export "$WORK/B" --format safetensors -o "$P/c6"
    touch "$WORK/ga1"
    finished "$PID_A"
    ra=$RCW
    check "$store 5: the copy completes (exit $ra)" [ "$ra" -eq 0 ]
    expect_ok "$store 5: it verifies" "$CK" verify "$P/c6"
}

# ================================================================== WebDAV
if ! webdav_start "$WORK/dav" 2>"$WORK/.err"; then
    echo "[SKIP] [$NAME] WebDAV: $(head -n 1 "$WORK/.err")"
else
    dav_has() { [ -e "$WORK/dav/$1" ]; }
    dav_list() { ls -A "$WORK/dav/$1" 2>/dev/null | sort; }
    dav_put() { mkdir -p "$(dirname "$WORK/dav/$1")" && cp "$2" "$WORK/dav/$1"; }
    concurrent_parts WebDAV "$WEBDAV_URL" dav_has dav_list dav_put
    webdav_stop
fi

# ====================================================================== S3
if ! s3_start "$WORK/s3" bkt 2>"$WORK/.err"; then
    echo "[SKIP] [$NAME] S3: $(head -n 1 "$WORK/.err")"
else
    export AWS_ENDPOINT_URL="$S3_ENDPOINT"
    # s3rver keeps KEY as KEY._S3rver_object on its disk.
    s3_has() { [ -n "$(find "$WORK/s3/bkt/$1._S3rver_object" -type f 2>/dev/null)" ]; }
    s3_list() {
        find "$WORK/s3/bkt/$1" -maxdepth 1 -name '*._S3rver_object' 2>/dev/null |
            sed 's|.*/||; s|\._S3rver_object$||' | sort
    }
    s3_put() { s3cmd_run put "$2" "s3://bkt/$1" >/dev/null 2>&1; }
    concurrent_parts S3 s3://bkt s3_has s3_list s3_put
    s3_stop
fi

finish
