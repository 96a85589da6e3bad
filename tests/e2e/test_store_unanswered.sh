#!/bin/sh
# A store that did not answer is not a store that said "no checkpoint
# there". A run directory on WebDAV (nginx) with step_5..step_20 and
# `latest` naming step 20, behind a proxy that fails chosen requests a set
# number of times (tests/support/fault_proxy.py):
#   503 to the first 12 PROPFINDs of step_00000020/index.json, one retry
#   allowed: `tp-train --resume` printed a retry warning, then "resumed from
#   .../step_00000015", exit 0, and uploaded a step 20 of its own over the
#   real one; now it fails naming the index's URL, exit 1, before anything
#   is written. So with a 503 to every GET of the index (it fell back to
#   step 15 as "unusable") and of a shard;
#   `tp-ckpt info` and `verify` of the run: a 503, 302, redirect loop, HTML
#   200 or a dropped connection to the PROPFIND of the index called step 15
#   the newest; now each fails naming the index's URL. A server too slow
#   (TP_REMOTE_TIMEOUT=2, 8 s) made the checkpoint's own URL "not a
#   checkpoint"; now it times out, naming it.
#   S3 (s3rver): 500 to the HEADs of the index, the same.
# The controls: one 503 within the retries is waited out, and the resume
# takes step 20; a damaged step (a flipped byte on the server's disk) is
# still passed over for the one before it, saying so.
# A save whose check of the store (is the step there?) goes unanswered
# through every retry is lost with a warning, as a failed upload is, and
# training goes on (it ended the run).
# And a remote run's local cache (--ckpt-cache) removed mid-run: the next
# save said "no staging directory ... prepared by this process"; now it
# says the cache is gone (it is not made again: the run's lock on it went
# with it).
# tier: full
. "$(dirname "$0")/lib.sh"
. "$ROOT/tests/support/objstore.sh"

use_open_mpi
CK="$BIN/tp-ckpt"
TRAIN="$BIN/tp-train"
export TMPDIR="$WORK/tmp"
mkdir -p "$TMPDIR"
PROXY_PID=""
stop_proxy() {
    [ -n "$PROXY_PID" ] && kill "$PROXY_PID" 2>/dev/null && wait "$PROXY_PID" 2>/dev/null
    PROXY_PID=""
}
objstore_stop_at_exit stop_proxy

# proxy UPSTREAM_URL: the fault proxy in front of it, URL in $P, its rules
# in $RULES (rules ...: each argument a rule line; none: relay everything).
RULES="$WORK/rules"
proxy() {
    stop_proxy
    fault_proxy_start "$1"
}
rules() {
    : >"$RULES.tmp"
    for r in "$@"; do echo "$r" >>"$RULES.tmp"; done
    mv "$RULES.tmp" "$RULES"
}

# One retry, quickly: the failures below outlast it.
export TP_REMOTE_RETRIES=1 TP_REMOTE_BACKOFF_MS=10
resume() {
    cache=$1
    shift
    run mpirun --oversubscribe -np 2 "$TRAIN" --model tiny --tp 2 --steps 25 --ckpt-dir "$P/trainR" --ckpt-every 5 \
        --resume --ckpt-cache "$WORK/$cache" "$@" </dev/null
}
# The lines of stderr that are tp-train's or tp-ckpt's (not mpirun's).
said() { grep '^tp-[a-z]*: ' "$WORK/.err"; }

if ! webdav_start "$WORK/dav"; then
    echo "[SKIP] [$NAME] the WebDAV part: nginx cannot start"
else
    DAV="$WORK/dav"
    proxy "$WEBDAV_URL"
    expect_ok "a run to step 20 on WebDAV, through the proxy" mpirun --oversubscribe -np 2 "$TRAIN" --model tiny --tp 2 \
        --steps 20 --ckpt-dir "$P/trainR" --ckpt-every 5 --ckpt-cache "$WORK/cache0"
    check_all "the server holds steps 5..20, latest naming step 20" \
        '[ "$(ls "$DAV/trainR" | grep -c "^step_000000[0-9][05]$")" -eq 4 ] && [ "$(cat "$DAV/trainR/latest")" = step_00000020 ]'
    # The run's checkpoints and `latest` (not its lease, which each trainer
    # takes and gives back before it resumes).
    history() { (cd "$DAV/trainR" && find step_* latest -type f -print0 | sort -z | xargs -0 md5sum) | md5sum; }
    before=$(history)
    untouched() {
        [ "$(history)" = "$before" ] && ! grep "^PUT \|^DELETE \|^MOVE " "$WORK/proxy.log" | grep -q "/step_\|/latest"
    }

    # --- tp-train --resume: the reviewer's case, and the index's and a shard's GETs.
    IDX="$P/trainR/step_00000020/index.json"
    for case in "503 PROPFIND step_00000020/index.json 12|PROPFIND $IDX: HTTP 503" \
        "503 GET step_00000020/index.json always|GET $IDX: HTTP 503" \
        "503 GET step_00000020/shard_pp00_tp01.h5 always|$P/trainR/step_00000020/shard_pp00_tp01.h5: HTTP 503"; do
        rule=${case%%|*} error=${case#*|}
        rules "$rule"
        : >"$WORK/proxy.log"
        resume cache1
        check_all "resume, $rule: fails naming the URL (exit $RC), no rollback" \
            '[ $RC -eq 1 ] && said | grep "^tp-train: error: " | grep -qF "$error" &&
             ! grep -q "resumed from" "$WORK/.out" && ! grep -q "falling back" "$WORK/.err"'
        check "resume, $rule: nothing written to the run (step 20 and latest as they were)" untouched
    done

    # --- tp-ckpt info and verify of the run directory, and of step 20 itself.
    for rule in "503 PROPFIND step_00000020/index.json 12" "302 PROPFIND step_00000020/index.json always" \
        "loop PROPFIND step_00000020/index.json always" "html PROPFIND step_00000020/index.json always" \
        "drop PROPFIND step_00000020/index.json always"; do
        for cmd in info verify; do
            for where in trainR trainR/step_00000020; do
                rules "$rule"
                run "$CK" $cmd "$P/$where"
                check_all "tp-ckpt $cmd $where, $rule: an error naming the index's URL (exit $RC)" \
                    '[ $RC -eq 1 ] && [ "$(said | grep -c "^tp-ckpt: error: ")" -eq 1 ] &&
                     said | grep "^tp-ckpt: error: " | grep -qF "$IDX" &&
                     ! grep -q "step_00000015\|not a checkpoint" "$WORK/.out" "$WORK/.err"'
            done
        done
    done
    rules "sleep PROPFIND step_00000020/index.json 1 8"
    start=$(date +%s)
    run env TP_REMOTE_TIMEOUT=2 TP_REMOTE_RETRIES=0 "$CK" info "$P/trainR/step_00000020"
    secs=$(($(date +%s) - start))
    check_all "a server too slow for the index (TP_REMOTE_TIMEOUT=2): timed out naming it in $secs s, not 'not a checkpoint' (exit $RC)" \
        '[ $RC -eq 1 ] && said | grep "^tp-ckpt: error: " | grep -qF "$IDX: timed out" &&
         ! grep -q "not a checkpoint" "$WORK/.err" && [ $secs -lt 8 ]'
    check "no command wrote to the run" untouched

    # --- The controls. One 503 within the retries: waited out, step 20 taken.
    rules "503 PROPFIND step_00000020/index.json 1"
    resume cache2
    check_all "one 503 within the retries: resumed from step 20 (exit $RC)" \
        '[ $RC -eq 0 ] && grep -q "^resumed from $P/trainR/step_00000020 at step 20" "$WORK/.out" &&
         grep -q "^tp-train: warning: PROPFIND $IDX: HTTP 503; retry 1 of 1" "$WORK/.err"'
    check "and saved step 25" [ "$(cat "$DAV/trainR/latest")" = step_00000025 ]
    # Damage (a byte flipped on the server's disk, inside a tensor's data) is
    # passed over for the checkpoint before it, as before.
    rules
    shard="$DAV/trainR/step_00000025/shard_pp00_tp00.h5"
    flip_byte "$shard" "$(data_offset "$shard" model/layers.1.mlp.proj.weight)"
    resume cache3
    check_all "a damaged step 25: passed over for step 20, saying so (exit $RC)" \
        '[ $RC -eq 0 ] && grep -q "^resumed from $P/trainR/step_00000020 at step 20" "$WORK/.out" &&
         grep -q "^tp-train: warning: checkpoint $P/trainR/step_00000025 is unusable (.*checksum.*); falling back to $P/trainR/step_00000020" "$WORK/.err"'

    # --- A remote run's local cache removed mid-run (held at the commit of
    # step 5): the next save said "no staging directory .../.step_00000010...
    # staging prepared by this process"; now it says the cache is gone.
    TP_CKPT_FAULT="before-latest:WAIT:$WORK/go" mpirun --oversubscribe -np 2 "$TRAIN" --model tiny --tp 2 --steps 15 \
        --ckpt-dir "$P/runC" --ckpt-every 5 --ckpt-cache "$WORK/cacheK" </dev/null >"$WORK/.out" 2>"$WORK/.err" &
    trainer=$!
    wait_for "$WORK/go.held" 120
    rm -rf "$WORK/cacheK"
    : >"$WORK/go"
    wait $trainer
    RC=$?
    check_all "the cache removed mid-run: the next save says the cache is gone, naming it (exit $RC)" \
        '[ $RC -eq 1 ] && said | grep "^tp-train: error" | grep -qF "checkpoint $P/runC/step_00000010: the local cache $WORK/cacheK, where checkpoints are staged before they go up, is gone" &&
         ! grep -q "prepared by this process" "$WORK/.err"'
    check "step 5 is up, and latest names it" [ "$(cat "$DAV/runC/latest")" = step_00000005 ]

    # --- A save the store does not answer for (an outage through every
    # retry at the check of whether the step is there): that checkpoint is
    # lost with a warning, as a failed upload is, and training goes on (the
    # run ended, exit 1, its lease left behind).
    rules "503 PROPFIND step_00000010/index.json always"
    run env TP_REMOTE_RETRIES=1 TP_REMOTE_BACKOFF_MS=50 mpirun --oversubscribe -np 2 "$TRAIN" --model tiny --tp 2 \
        --steps 15 --ckpt-dir "$P/runO" --ckpt-every 5 --ckpt-cache "$WORK/cacheO" </dev/null
    check_all "no answer for step 10's save: said as a lost upload, training goes on to step 15 (exit $RC)" \
        '[ $RC -eq 0 ] && said | grep -q "^tp-train: warning: upload of the checkpoint of step 10 failed: PROPFIND $P/runO/step_00000010/index.json: HTTP 503"'
    check_all "steps 5 and 15 are up, latest names step 15, nothing of step 10" \
        '[ -s "$DAV/runO/step_00000005/index.json" ] && [ -s "$DAV/runO/step_00000015/index.json" ] &&
         [ "$(cat "$DAV/runO/latest")" = step_00000015 ] && [ ! -e "$DAV/runO/step_00000010" ]'
    rules
    stop_proxy
    webdav_stop
fi

# --- S3: a 500 to every HEAD of the index (s3rver, behind the proxy).
if ! s3_start "$WORK/s3" bkt; then
    echo "[SKIP] [$NAME] the S3 part: s3rver cannot start"
else
    proxy "$S3_ENDPOINT"
    export AWS_ENDPOINT_URL="$P"
    # (Older first: an upload into a store writes `latest` as it is told.)
    expect_ok "a checkpoint in an S3 run directory" "$CK" synth -o s3://bkt/run/step_00000015 --tp 2 --pp 1 \
        --model tiny --step 15
    expect_ok "and a newer one" "$CK" synth -o s3://bkt/run/step_00000020 --tp 2 --pp 1 --model tiny --step 20
    rules "500 HEAD step_00000020/index.json always"
    for cmd in info verify; do
        run "$CK" $cmd s3://bkt/run
        check_all "S3: tp-ckpt $cmd, 500 to the index's HEADs: an error naming it (exit $RC)" \
            '[ $RC -eq 1 ] && said | grep "^tp-ckpt: error: " | grep -q "run/step_00000020/index.json.*HTTP 500" &&
             ! grep -q "step_00000015" "$WORK/.out" "$WORK/.err"'
    done
    rules
    expect_ok "S3: answered, it is step 20" "$CK" info s3://bkt/run
    check "S3: info names step 20" grep -q "step_00000020" "$WORK/.out"
    stop_proxy
    s3_stop
fi

finish
