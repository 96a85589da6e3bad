#!/bin/sh
# Crash consistency (docs/RELIABILITY.md "Reviews (2026-12-01, third)"):
#   The order of a commit, seen in the system calls (strace -f -y): before
#   an output is renamed to its final name every file in it and every
#   directory inside it (a Megatron-LM save's iter_N/mp_rank_XX too) is
#   fsynced, and its parent after the rename; a training save's `latest`
#   is written, fsynced, renamed and its directory fsynced after the
#   checkpoint is. What a power loss would keep cannot be shown by a kill.
#   A --force replacement where the file system has no atomic exchange,
#   killed between its renames or after them (strace injects both): the
#   next writer of the name finds the earlier output, or the new one, and
#   nothing left aside.
#   kill -9 of a 2-rank tp-train under mpirun with a save at every step: of
#   mpirun, of rank 0, of rank 1 or of every rank (drawn from FAULT_SEED),
#   once the run has committed a save of its own (so that every trial moves
#   the run on) or in its start-up. After each: the ranks are gone, `latest`
#   names a checkpoint that verifies, every step_* under its final name
#   verifies, and the next `--resume` starts (leftovers never block it). At
#   the end the run, resumed to its last step, equals an uninterrupted run
#   bit for bit (docs/TOOLS.md "Resuming": at the same layout the
#   continuation is bit-exact), its losses step for step.
# takes: about 60 s on 2 cores
# tier: full
. "$(dirname "$0")/../e2e/lib.sh"
# 12 trials unless FAULT_TRIALS says (5 under the sanitizers, lib.sh): each
# is a launch of mpirun and two ranks, about a second of start-up.
[ "${SANITIZED:-0}" != 1 ] && FAULT_TRIALS=${FAULT_TRIALS:-12}
. "$(dirname "$0")/lib.sh"
use_open_mpi

# ------------------------------------------------------ the order of a commit
# durable_before_rename TRACE OUT: in TRACE (strace -f -y of a writer of OUT),
# every file and directory of OUT was fsynced under its staging name before
# the rename to OUT, and OUT's parent after it.
durable_before_rename() {
    "$PY" - "$@" <<'PYEOF'
import os, re, sys
trace, out = sys.argv[1], os.path.realpath(sys.argv[2])
synced, staging, after = set(), None, set()
for line in open(trace):
    m = re.search(r'fsync\(\d+<([^>]*)>', line)
    if m:
        (after if staging else synced).add(m.group(1))
        continue
    m = re.search(r'rename(?:at2)?\(.*"([^"]*)", .*"([^"]*)"', line)
    if not m or not line.rstrip().endswith("= 0"):
        continue
    if os.path.realpath(m.group(2)) == out and m.group(1).endswith(".staging"):
        staging = m.group(1)
    elif not staging and m.group(1) in synced:
        synced.add(m.group(2))  # a file written aside, fsynced, renamed (index.json)
if not staging:
    sys.exit("no rename of a staging entry to %s in the trace" % out)
missing = []
for root, dirs, files in os.walk(out):
    for name in [""] + dirs + files:
        path = os.path.join(root, name) if name else root
        rel = os.path.relpath(path, out)
        if os.path.normpath(os.path.join(staging, rel)) not in synced:
            missing.append(rel)
if missing:
    sys.exit("not fsynced before the rename to %s: %s" % (out, ", ".join(sorted(set(missing)))))
if os.path.dirname(out) not in after:
    sys.exit("%s's parent not fsynced after the rename" % out)
PYEOF
}

# traced ARGS...: strace ARGS with LeakSanitizer off in an ASan build: it
# cannot run under ptrace (the command exits 99 on its own). The same
# commands run untraced, leaks checked, everywhere else in the suite.
traced() { ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" strace "$@"; }
if ! strace -f -o /dev/null true >/dev/null 2>&1; then
    echo "[$NAME] SKIP the order of commits: strace cannot trace here (no strace, or ptrace forbidden)"
else
    expect_ok "source checkpoint" "$CK" synth -o "$WORK/src" --tp 2 --pp 1 --model tiny --optim
    expect_ok "a Megatron-LM checkpoint to read from" "$RS" "$WORK/src" --format megatron --to tp2 -o "$WORK/meg-src"
    for kind in checkpoint megatron dcp torch_dist safetensors gguf; do
        out="$WORK/order/$kind"
        case $kind in
        checkpoint) cmd="$RS $WORK/src --to tp1 -o $out" ;;
        megatron) cmd="$RS $WORK/src --format megatron --to tp2 -o $out" ;;
        dcp) cmd="$RS $WORK/meg-src --format dcp --to tp1 -o $out" ;;
        torch_dist) cmd="$RS $WORK/meg-src --format torch_dist --to tp1 -o $out" ;;
        safetensors) cmd="$CK export $WORK/src --format safetensors -o $out" ;;
        gguf) cmd="$CK export $WORK/src --format gguf -o $out" ;;
        esac
        mkdir -p "$WORK/order"
        expect_ok "$kind: written under strace" traced -f -y -e trace=fsync,rename,renameat2 -o "$WORK/order/$kind.trace" $cmd
        check "$kind: every file and directory fsynced before the rename, the parent after" \
            durable_before_rename "$WORK/order/$kind.trace" "$out"
    done
    # A training save into a run directory it makes (new/run): the
    # directories it made fsynced into their parents, the checkpoint, then
    # `latest` (written aside, fsynced, renamed, its directory fsynced).
    expect_ok "a training save under strace" traced -f -y -e trace=fsync,rename,renameat2 -o "$WORK/order/train.trace" \
        "$TRAIN" --model tiny --micro-batch 2 --quiet --steps 1 --ckpt-dir "$WORK/order/new/run"
    check "training: the checkpoint fsynced before its rename, the run directory after" \
        durable_before_rename "$WORK/order/train.trace" "$WORK/order/new/run/step_00000001"
    check "training: latest fsynced, renamed after the checkpoint, the run directory fsynced after; the directories made fsynced into their parents before" "$PY" - \
        "$WORK/order/train.trace" "$WORK/order/new/run" <<'PYEOF'
import os, re, sys
run = os.path.realpath(sys.argv[2])
events = []
for line in open(sys.argv[1]):
    m = re.search(r'fsync\(\d+<([^>]*)>', line)
    if m: events.append(("fsync", m.group(1)))
    m = re.search(r'rename(?:at2)?\(.*"([^"]*)", .*"([^"]*)"', line)
    if m and line.rstrip().endswith("= 0"): events.append(("rename", os.path.realpath(m.group(2)), m.group(1)))
def at(pred):
    return next((i for i, e in enumerate(events) if pred(e)), None)
ckpt = at(lambda e: e[0] == "rename" and e[1] == run + "/step_00000001")
latest = at(lambda e: e[0] == "rename" and e[1] == run + "/latest")
if ckpt is None or latest is None or latest < ckpt:
    sys.exit("latest renamed at %s, the checkpoint at %s" % (latest, ckpt))
tmp = events[latest][2]
if not any(e == ("fsync", os.path.realpath(tmp)) for e in events[ckpt:latest]):
    sys.exit("latest's temporary %s not fsynced before its rename" % tmp)
if ("fsync", run) not in events[latest + 1:]:
    sys.exit("the run directory not fsynced after latest's rename")
for made in (os.path.dirname(run), os.path.dirname(os.path.dirname(run))):
    if ("fsync", made) not in events[:ckpt]:
        sys.exit("%s (holding a directory the run made) not fsynced before the checkpoint's rename" % made)
PYEOF
fi

# ------------------------------------- a replacement without an atomic exchange
# Where the file system has no RENAME_EXCHANGE (NFS), --force moves the
# earlier output aside (.NAME.OWNER.staging.replaced), then renames the new
# one into place, then removes the aside. strace makes every renameat2 fail
# with EINVAL, as such a file system does, and kills the writer (a) between
# the two renames: the name held nothing and the earlier output stayed
# hidden for ever, the new one removed as a dead writer's; (b) after the
# publish, as it removes the aside: the earlier output stayed for ever. The
# next writer of the name puts the earlier output back (a), or removes it (b).
aside_left() { ls -A "$1" | grep -q '\.staging\.replaced$'; }
if strace -f -o /dev/null true >/dev/null 2>&1; then
    mkdir -p "$WORK/nx"
    expect_ok "the earlier output" "$CK" synth -o "$WORK/nx/earlier" --tp 1 --pp 1 --model tiny --seed 1
    expect_ok "the new output" "$CK" synth -o "$WORK/nx/new" --tp 1 --pp 1 --model tiny --seed 2
    for case in between-renames removing-aside; do
        out="$WORK/nx/$case/out"
        mkdir -p "$WORK/nx/$case"
        expect_ok "$case: an output to replace" "$CK" synth -o "$out" --tp 1 --pp 1 --model tiny --seed 1
        case $case in
        between-renames) kill_at="rename:signal=KILL:when=4" ;; # the claim, index.json, the aside, then this
        removing-aside) kill_at="unlink,unlinkat:signal=KILL:when=1" ;;
        esac
        run traced -f -o "$WORK/nx/$case.trace" -e trace=rename,renameat2,unlink,unlinkat \
            -e inject=renameat2:error=EINVAL -e inject=$kill_at \
            "$CK" synth -o "$out" --tp 1 --pp 1 --model tiny --seed 2 --force
        if [ $case = between-renames ]; then
            check_all "$case: the kill struck with nothing at the name and the earlier output aside" \
                "[ ! -e '$out' ] && aside_left '$WORK/nx/$case'"
            expect_error "$case: the next writer of the name finds the earlier output back" 1 "already exists" \
                "$CK" synth -o "$out" --tp 1 --pp 1 --model tiny --seed 3
            check "$case: the output is the earlier one" same "$out" "$WORK/nx/earlier"
        else
            check_all "$case: the kill struck with the new output published and the earlier one aside" \
                "same '$out' '$WORK/nx/new' && aside_left '$WORK/nx/$case'"
            expect_error "$case: the next writer of the name" 1 "already exists" \
                "$CK" synth -o "$out" --tp 1 --pp 1 --model tiny --seed 3
            check "$case: the output is the new one" same "$out" "$WORK/nx/new"
        fi
        check_all "$case: nothing left beside it" "no_staging '$WORK/nx/$case' && ! aside_left '$WORK/nx/$case'"
    done
else
    echo "[$NAME] SKIP a replacement without an atomic exchange: strace cannot trace here"
fi

# ------------------------------------------ kill -9 of a 2-rank run under mpirun
STEPS=80
ARGS="--tp 2 --model tiny --micro-batch 2 --quiet --steps $STEPS --ckpt-every 1"
mpi_train() { mpirun -np 2 "$TRAIN" $ARGS "$@"; }
start=$(date +%s.%N)
expect_ok "an uninterrupted run" mpi_train --ckpt-dir "$WORK/base" --log "$WORK/base.jsonl"
full=$(echo "$(date +%s.%N) - $start" | bc)
step_span=$(echo "$full * 3 / $STEPS" | bc -l) # about three steps and their saves
startup_span=$full                              # until a trial has seen one

latest_of() { cat "$WORK/run/latest" 2>/dev/null; }
rank_of() { tr '\0' '\n' 2>/dev/null <"/proc/$1/environ" | sed -n 's/^OMPI_COMM_WORLD_RANK=//p'; }
alive() { for p in $1; do [ -e "/proc/$p" ] && return 0; done; return 1; }
# until CONDITION (a command) holds, for at most SECONDS
until_true() {
    n=0
    while ! eval "$1" && [ $n -lt $(($2 * 10)) ]; do sleep 0.1; n=$((n + 1)); done
    eval "$1"
}

bad=0 i=0 record=""
while [ $i -lt "$TRIALS" ]; do
    target=$(((FAULT_SEED + i) % 4)) # 0 mpirun, 1 rank 0, 2 rank 1, 3 every rank
    phase=steps
    [ $((i % 5)) = 4 ] && phase=start-up
    before=$(latest_of)
    launched=$(date +%s.%N)
    (exec mpirun -np 2 "$TRAIN" $ARGS --ckpt-dir "$WORK/run" --resume --log "$WORK/run.jsonl") \
        >"$WORK/trial.out" 2>&1 & # one process: $! is mpirun
    mp=$!
    until_true '[ "$(pgrep -P $mp | wc -l)" = 2 ] || ! kill -0 $mp 2>/dev/null' 120
    ranks=$(pgrep -P $mp | tr '\n' ' ')
    if [ $phase = steps ]; then
        # A save of this launch committed (`latest` moved), or the run ended.
        until_true '[ "$(latest_of)" != "$before" ] || ! kill -0 $mp 2>/dev/null' 300
        startup_span=$(echo "$(date +%s.%N) - $launched" | bc)
        at=$(instant $i "$TRIALS" "$step_span" steps)
    else
        at=$(instant $i "$TRIALS" "$startup_span" start-up)
    fi
    sleep "$at"
    case $target in
    0) victims=$mp what=mpirun ;;
    3) victims=$ranks what="every rank" ;;
    *) victims="" what="rank $((target - 1))"
        for p in $ranks; do [ "$(rank_of "$p")" = $((target - 1)) ] && victims=$p; done ;;
    esac
    finished=0
    kill -0 $mp 2>/dev/null || finished=1
    [ -n "$victims" ] && kill -9 $victims 2>/dev/null
    wait $mp
    rc=$?
    record="$record $i:$what@$phase+${at}s:$(latest_of | sed 's/step_0*//')"
    # The ranks end with their launcher, whoever was killed (after mpirun's
    # kill, Open MPI's ranks find their daemon gone within seconds).
    if ! until_true '! alive "$ranks"' 120; then
        failed "trial $i ($what): ranks $ranks still alive 120 s after the kill"
        kill -9 $ranks 2>/dev/null
    fi
    if [ "$finished" = 1 ] && [ "$rc" != 0 ]; then
        failed "trial $i: the launch ended (exit $rc) before the kill"
        sed 's/^/    /' "$WORK/trial.out" | head -20 >&2
    fi
    latest=$(latest_of)
    if [ -n "$latest" ] && ! intact "$WORK/run/$latest"; then
        bad=$((bad + 1))
        echo "    trial $i ($what): latest names $latest, which does not verify" >&2
    fi
    # Each checkpoint verified once, known by its index's inode (a step
    # saved again, after a resume from before it, is a new one); the record
    # is kept outside the run directory, where a file would make the step's
    # directory not a checkpoint's, which a save again refuses to replace.
    for d in "$WORK"/run/step_*; do
        [ -d "$d" ] || continue
        seen="$(basename "$d"):$(stat -c %i "$d/index.json" 2>/dev/null)"
        grep -qxF "$seen" "$WORK/verified" 2>/dev/null && continue
        if [ -e "$d/index.json" ] && intact "$d"; then echo "$seen" >>"$WORK/verified"; else
            bad=$((bad + 1))
            echo "    trial $i ($what): $d is under its final name and does not verify" >&2
        fi
    done
    i=$((i + 1))
done
echo "[$NAME] kill -9 under mpirun: $TRIALS trials (trial:victim@phase+delay:latest step after):$record"
check "kill -9 under mpirun: every checkpoint under its final name verified after each of $TRIALS kills" [ "$bad" -eq 0 ]
check "kill -9 under mpirun: the killed launches saved checkpoints" [ -n "$(latest_of)" ]
expect_ok "the run resumed to its end after the kills" mpi_train --ckpt-dir "$WORK/run" --resume --log "$WORK/run.jsonl"
final=$(printf 'step_%08d' $STEPS)
check "the resumed run's last checkpoint equals the uninterrupted run's, bit for bit" \
    same "$WORK/base/$final" "$WORK/run/$final"
check "every step the killed launches logged has the uninterrupted run's loss, bit for bit" "$PY" - \
    "$WORK/base.jsonl" "$WORK/run.jsonl" <<'PYEOF'
import json, sys
def steps(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if "event" not in r: out.setdefault(r["step"], set()).add(r["loss"])
    return out
base, run = steps(sys.argv[1]), steps(sys.argv[2])
wrong = [(s, sorted(l), base.get(s)) for s, l in sorted(run.items()) if l != base.get(s)]
if wrong or set(run) != set(base):
    sys.exit("steps differ: %s; missing %s" % (wrong[:5], sorted(set(base) - set(run))[:5]))
PYEOF
check "no staging left once the run ended" no_staging "$WORK/run"

finish
