#!/bin/sh
# What an object store is trusted with, checked before it can cost data
# (nginx's WebDAV and s3rver, tests/support/objstore.sh; a fault proxy,
# tests/support/fault_proxy.py, where the store must misbehave):
#   a live run's lease refuses every writer of a step into its directory:
#   `tp-ckpt copy [--force] DIR URL/run/step_N` (an upload, which took no
#   claim) went on and with --force replaced the trainer's step; so copy
#   URL->URL, synth, tp-reshard (also as Megatron-LM) and export named
#   step_N. A lease naming a live process of this machine is refused at
#   once (it was watched for up to a lease period, then taken for lapsed
#   when the holder did not renew meanwhile); one renewed from elsewhere
#   refuses copy as it refused synth;
#   an index.json PUT answered 201 but not kept, or kept with a byte
#   changed, gave "copied", exit 0, and moved `latest`: now the upload fails
#   naming the index and what arrived, `latest` stays where it was;
#   an http(s) URL with a space failed as curl's "URL using bad/illegal
#   format" from a request never asked for: refused at once saying to write
#   %20 (s3:// keys with a space still work);
#   a wrong AWS_REGION gave a bare "HTTP 400" (a HEAD's answer has no body):
#   now the region used and where it came from are named.
# takes: about 15 s on 2 cores
# tier: full
. "$(dirname "$0")/lib.sh"
. "$ROOT/tests/support/objstore.sh"

CK="$BIN/tp-ckpt"
RS="$BIN/tp-reshard"
export TMPDIR="$WORK/tmp"
mkdir -p "$TMPDIR"
PROXY_PID=""
HOLDER_PID=""
RENEW_PID=""
stop_helpers() {
    for p in $PROXY_PID $HOLDER_PID $RENEW_PID; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
    PROXY_PID="" HOLDER_PID="" RENEW_PID=""
}
objstore_stop_at_exit stop_helpers
export TP_REMOTE_RETRIES=1 TP_REMOTE_BACKOFF_MS=10
# Leases of 2 s here; the leases written below say 10 s, their holder's
# period, which a watcher waits out before it takes one for lapsed.
export TP_RUN_LEASE_SECONDS=2
HOST=$(hostname | tr -c 'A-Za-z0-9\n-' '-')

SYNTH="--model tiny --tp 1 --pp 1"
expect_ok "synth step 50" "$CK" synth -o "$WORK/s50" $SYNTH --step 50
expect_ok "synth step 50, another seed" "$CK" synth -o "$WORK/s50b" $SYNTH --step 50 --seed 7
expect_ok "synth step 20" "$CK" synth -o "$WORK/s20" $SYNTH --step 20

# lease FILE HOLDER HOST PID RENEWALS: a run's lease as tp-train writes it.
lease() {
    printf '{"owner":"%s-%s-0000beef","holder":"%s (pid %s on host %s, since 2026-11-30T00:00:00Z)","host":"%s","pid":%s,"renewals":%s,"period_seconds":10}' \
        "$3" "$4" "$2" "$4" "$3" "$3" "$4" "$5" >"$1.tmp" && mv "$1.tmp" "$1"
}

if ! webdav_start "$WORK/dav" 2>"$WORK/.err"; then
    echo "[SKIP] [$NAME] WebDAV: $(head -n 1 "$WORK/.err")"
else
    U=$WEBDAV_URL
    DAV="$WORK/dav"

    # --- 1. a run directory whose lease names a live process of this machine.
    expect_ok "a run's step 50 on the server" "$CK" copy "$WORK/s50" "$U/trun/step_00000050"
    expect_ok "a step to copy from, on the server" "$CK" copy "$WORK/s20" "$U/src/step_00000020"
    sleep 60 &
    HOLDER_PID=$!
    lease "$DAV/trun/.tp-run.lease" sleep "$HOST" "$HOLDER_PID" 0
    LIVE="is in use by sleep \\(pid $HOLDER_PID .*names process $HOLDER_PID of this machine, which is running"
    expect_error "copy --force over the live run's step: refused" 1 "$LIVE" \
        "$CK" copy --force "$WORK/s50b" "$U/trun/step_00000050"
    check "the run's step 50 is the run's still" cmp -s "$WORK/s50/shard_pp00_tp00.h5" "$DAV/trun/step_00000050/shard_pp00_tp00.h5"
    expect_error "copy of a new step into the live run: refused" 1 "$LIVE" "$CK" copy "$WORK/s20" "$U/trun/step_00000020"
    expect_error "copy URL -> URL into the live run: refused" 1 "$LIVE" "$CK" copy "$U/src" "$U/trun/step_00000020"
    check "nothing of them is on the server" [ ! -e "$DAV/trun/step_00000020" ]
    start=$(date +%s%N)
    expect_error "synth into the live run: refused" 1 "$LIVE" "$CK" synth -o "$U/trun/step_00000060" $SYNTH --step 60
    ms=$((($(date +%s%N) - start) / 1000000))
    check "at once (1 s of grace for a holder that is exiting): $ms ms, where the lease's period is 10 s" [ "$ms" -lt 4000 ]
    expect_error "tp-reshard -o the live run's step --force: refused" 1 "$LIVE" \
        "$RS" "$WORK/s50b" --to tp1pp1 -o "$U/trun/step_00000050" --force
    # Another tool's checkpoint or an export named step_N in a run directory
    # is not one of its checkpoints: refused as such (ckpt_foreign_output_refusal),
    # live run or not, before its claim is asked.
    expect_error "tp-reshard --format megatron -o a step of the live run: refused" 2 \
        "trun is a run directory, where step_00000070 names one of the run's checkpoints, which a Megatron-LM" \
        "$RS" "$WORK/s50b" --to tp1pp1 --format megatron -o "$U/trun/step_00000070"
    expect_error "export -o a step of the live run: refused" 2 \
        "trun is a run directory, where step_00000080 names one of the run's checkpoints, which an export is not" \
        "$CK" export "$WORK/s50b" --format hdf5 -o "$U/trun/step_00000080"
    check_all "the run directory holds its step 50 alone" \
        '[ "$(ls "$DAV/trun" | grep step_ | tr "\n" " ")" = "step_00000050 " ] && cmp -s "$WORK/s50/shard_pp00_tp00.h5" "$DAV/trun/step_00000050/shard_pp00_tp00.h5"'
    kill "$HOLDER_PID" && wait "$HOLDER_PID" 2>/dev/null
    HOLDER_PID=""

    # --- 2. a lease renewed by a holder on another machine refuses copy too.
    (n=0; while :; do n=$((n + 1)); lease "$DAV/trun/.tp-run.lease" tp-train elsewhere 41 $n; sleep 0.2; done) &
    RENEW_PID=$!
    expect_error "copy into a run renewed from another machine: refused" 1 \
        "is in use by tp-train \\(pid 41 on host elsewhere.*is renewed" "$CK" copy "$WORK/s20" "$U/trun/step_00000020"
    kill "$RENEW_PID" && wait "$RENEW_PID" 2>/dev/null
    RENEW_PID=""
    rm -f "$DAV/trun/.tp-run.lease"
    check "nothing of it is on the server" [ ! -e "$DAV/trun/step_00000020" ]

    # --- 3. what the store kept of an index: read back before `latest` moves.
    fault_proxy_start "$U"
    expect_ok "copy step 20 through the proxy" "$CK" copy "$WORK/s20" "$P/k/step_00000020"
    echo "fakeok PUT step_00000050/index.json always" >"$RULES.tmp" && mv "$RULES.tmp" "$RULES"
    expect_error "an index PUT answered 201 but not kept: the upload fails, naming it" 1 \
        "/k/step_00000050/index.json: 0 bytes arrived of [0-9]+ sent" "$CK" copy "$WORK/s50" "$P/k/step_00000050"
    check "latest stays on step 20" [ "$(cat "$DAV/k/latest")" = step_00000020 ]
    echo "flipput PUT step_00000050/index.json always" >"$RULES.tmp" && mv "$RULES.tmp" "$RULES"
    expect_error "an index kept with a byte changed: the upload fails, naming where" 1 \
        "/k/step_00000050/index.json: the store kept other bytes than were sent: byte [0-9]+ of [0-9]+ is 0x" \
        "$CK" copy "$WORK/s50" "$P/k/step_00000050"
    check_all "latest stays on step 20, no index of step 50 is left" \
        '[ "$(cat "$DAV/k/latest")" = step_00000020 ] && [ ! -e "$DAV/k/step_00000050/index.json" ]'
    echo "fakeok PUT shard_pp00_tp00.h5 always" >"$RULES.tmp" && mv "$RULES.tmp" "$RULES"
    expect_error "a shard PUT answered 201 but not kept: the upload fails (as before)" 1 \
        "shard_pp00_tp00.h5: 0 bytes arrived of [0-9]+ sent" "$CK" copy "$WORK/s50" "$P/k/step_00000050"
    # `latest` is read back too (a store that kept the older name: a resume
    # took step 20 after "copied").
    echo "fakeok PUT /k/latest always" >"$RULES.tmp" && mv "$RULES.tmp" "$RULES"
    expect_error "latest answered 201 but not kept: the upload fails, naming it" 1 \
        "/k/latest: the store kept 'step_00000020' after its PUT of 'step_00000050' was answered as done \\(read back 5 times over 1 s\\)" \
        "$CK" copy "$WORK/s50" "$P/k/step_00000050"
    check_all "latest still names step 20, and the upload of step 50 is removed" \
        '[ "$(cat "$DAV/k/latest")" = step_00000020 ] && [ ! -e "$DAV/k/step_00000050/index.json" ]'
    : >"$RULES.tmp" && mv "$RULES.tmp" "$RULES"
    expect_ok "the same copy, the store keeping what it is sent" "$CK" copy "$WORK/s50" "$P/k/step_00000050"
    check "latest moves to step 50" [ "$(cat "$DAV/k/latest")" = step_00000050 ]
    kill "$PROXY_PID" && wait "$PROXY_PID" 2>/dev/null
    PROXY_PID=""

    # --- 4. an http URL with a space: refused at once, naming its %20 spelling.
    expect_error "copy to a URL with a space: refused, saying %20" 2 \
        "my run/step_00000020: a space in an http\\(s\\) URL is not sent as it is: write it %20 \\(.*/my%20run/step_00000020\\)" \
        "$CK" copy "$WORK/s20" "$U/my run/step_00000020"
    expect_error "verify of a URL with a space: refused the same" 2 "write it %20" "$CK" verify "$U/my run"
    expect_ok "the URL with %20 works" "$CK" copy "$WORK/s20" "$U/my%20run/step_00000020"
    expect_ok "and verifies" "$CK" verify "$U/my%20run"
    check "the server's directory is named with its space" [ -s "$DAV/my run/step_00000020/index.json" ]
    webdav_stop
fi

if ! s3_start "$WORK/s3" bkt 2>"$WORK/.err"; then
    echo "[SKIP] [$NAME] S3: $(head -n 1 "$WORK/.err")"
else
    export AWS_ENDPOINT_URL="$S3_ENDPOINT"
    expect_ok "copy up to s3://" "$CK" copy "$WORK/s20" "s3://bkt/run/step_00000020"
    # --- 5. a wrong region: S3's bare 400 named as what it usually is.
    expect_error "info with a wrong AWS_REGION: the region named" 1 \
        "HTTP 400 with no reason given \\(the answer to a HEAD has no body\\).*signed for eu-west-1, from AWS_REGION" \
        env AWS_REGION=eu-west-1 "$CK" info "s3://bkt/run"
    expect_error "AWS_DEFAULT_REGION named when it is the one used" 1 "signed for eu-west-2, from AWS_DEFAULT_REGION" \
        env -u AWS_REGION AWS_DEFAULT_REGION=eu-west-2 "$CK" info "s3://bkt/run"
    # S3 names the bucket's region in such an answer (x-amz-bucket-region;
    # s3rver does not): said, with the remedy (it was the guess above).
    fault_proxy_start "$S3_ENDPOINT"
    echo "region HEAD /bkt/ always eu-central-1" >"$RULES"
    expect_error "a 400 naming the bucket's region: said, with AWS_REGION to set" 1 \
        "HEAD s3://bkt/run.*HTTP 400: the bucket is in eu-central-1 \(S3's x-amz-bucket-region\), these requests are signed for us-west-2, from AWS_REGION: set AWS_REGION=eu-central-1$" \
        env AWS_ENDPOINT_URL="$P" AWS_REGION=us-west-2 "$CK" info "s3://bkt/run"
    kill "$PROXY_PID" 2>/dev/null
    wait "$PROXY_PID" 2>/dev/null
    PROXY_PID=""
    # --- 6. an s3:// key with a space is the key's own: it works as before.
    expect_ok "copy to an s3:// key with a space" "$CK" copy "$WORK/s20" "s3://bkt/my run/step_00000020"
    expect_ok "and it verifies" "$CK" verify "s3://bkt/my run"
    unset AWS_ENDPOINT_URL
    s3_stop
fi

stop_helpers
finish
