#!/bin/sh
# tp-train's checkpoints end to end, the quick tier's scenario of the
# trainer: exact resume (stopped at step 10 with asynchronous saves, resumed,
# the losses of a straight run bit for bit, from the last save and from an
# asynchronous one), the run's JSON log across launches, resume at another
# layout (tp4pp2 -> tp2pp1dp2) and from a checkpoint tp-reshard converted;
# the run directory's rules (another tool's checkpoint, one of ours, and
# without --resume a run with checkpoints refused before anything is
# written) and --stop-at at or below the resumed step.
# tier: check
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/train_lib.sh"

use_open_mpi
TRAIN="$BIN/tp-train"
TINY="--model tiny --micro-batch 2 --quiet"

# --- Exact resume: 10 steps, stop, resume, 10 steps = 20 straight (tp2, async saves).
expect_ok "20 straight steps at tp2" mpi_train 2 $TINY --tp 2 --steps 20 --log "$WORK/straight.jsonl"
expect_ok "10 steps at tp2 then stop" mpi_train 2 $TINY --tp 2 --steps 20 --stop-at 10 --ckpt-dir "$WORK/run" \
    --ckpt-every 4 --log "$WORK/split.jsonl"
check "stopped at step 10" [ "$(last_step "$WORK/split.jsonl")" = 10 ]
check_all "checkpoints at steps 4, 8, 10; latest is 10" '[ "$(ls "$WORK/run" | tr "\n" " ")" = \
    "latest step_00000004 step_00000008 step_00000010 " ] && [ "$(cat "$WORK/run/latest")" = step_00000010 ]'
expect_ok "tp-ckpt verify on the trainer's checkpoint" "$BIN/tp-ckpt" verify "$WORK/run"
# Step 8 was saved asynchronously: its snapshot was copied while step 9 ran.
mkdir "$WORK/from8" && cp -r "$WORK/run/step_00000008" "$WORK/from8/"
expect_ok "resume from the asynchronous save of step 8" mpi_train 2 $TINY --tp 2 --steps 20 --stop-at 12 \
    --ckpt-dir "$WORK/from8" --resume --log "$WORK/from8.jsonl"
steps_from "$WORK/straight.jsonl" 9 12 >"$WORK/straight-9-12.jsonl"
check "resumed from step 8: the straight run's losses bit for bit" losses_match "$WORK/from8.jsonl" "$WORK/straight-9-12.jsonl" 0
expect_ok "resume at tp2" mpi_train 2 $TINY --tp 2 --steps 20 --ckpt-dir "$WORK/run" --resume --log "$WORK/split.jsonl"
check "resumed run has the straight run's losses bit for bit" losses_match "$WORK/split.jsonl" "$WORK/straight.jsonl" 0
# Resumed at --steps: nothing to train, said (it exited 0 without a word).
run "$TRAIN" --model tiny --micro-batch 2 --steps 20 --ckpt-dir "$WORK/run" --resume
check_all "resumed at --steps: exit 0, 'nothing to train' (exit $RC)" \
    '[ $RC -eq 0 ] && grep -q "^done: nothing to train: the run resumed at step 20, and --steps is 20$" "$WORK/.out"'
expect_ok "tp-ckpt info --json of the final checkpoint" "$BIN/tp-ckpt" info --json "$WORK/run"
check "training state: step 20, 40 samples consumed" "$PY" -c '
import json, sys
i = json.load(open(sys.argv[1]))
sys.exit(not (i["step"] == 20 and i["train"]["consumed_samples"] == 40))' "$WORK/.out"
# One log across the two launches: a start and a stop line each, a save line per committed checkpoint.
check_all "log: two launches (start steps 0, 10; resumed from null, step_00000010)" \
    '[ "$(events "$WORK/split.jsonl" start step)" = "0 10 " ] &&
    [ "$(events "$WORK/split.jsonl" start resumed_from)" = "null step_00000010 " ]'
check_all "log: stopped, then finished (at steps 10, 20)" '[ "$(events "$WORK/split.jsonl" stop reason)" = "stopped finished " ] &&
    [ "$(events "$WORK/split.jsonl" stop step)" = "10 20 " ]'
check "log: a save line for each committed checkpoint (4 8 10 20)" [ "$(events "$WORK/split.jsonl" save step)" = "4 8 10 20 " ]
check "log: every line has a time; start, save, save_wait and stop lines have their fields" "$PY" -c '
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
keys = {"start": {"event", "step", "tp", "pp", "dp", "micro_batch", "grad_accum", "global_batch", "world", "device", "cpu_kernels", "attention", "dtype",
                  "sequence_parallel", "virtual_stages", "zero", "optimizer_bytes", "parameter_bytes", "activation_bytes",
                  "resumed_from", "load_seconds", "startup_seconds", "time"},
        "save": {"event", "step", "seconds", "time"}, "stop": {"event", "step", "reason", "peak_rss_bytes", "time"},
        "save_wait": {"event", "step", "time"},
        None: {"step", "loss", "lr", "grad_norm", "tokens_per_s", "ms", "ckpt_stall_ms", "pipeline_ms", "pipeline_wait_ms",
               "time"}}
times = [r["time"] for r in lines]
ok = all(set(r) == keys[r.get("event")] for r in lines) and times == sorted(times) and times[0] > 1.7e9
starts = [r for r in lines if r.get("event") == "start"]
ok = ok and [(r["tp"], r["dp"], r["world"], r["global_batch"]) for r in starts] == [(2, 1, 2, 2)] * 2
ok = ok and starts[0]["load_seconds"] == 0 and starts[1]["load_seconds"] > 0
ok = ok and all(r["attention"].startswith("CPU fp32") for r in starts)  # which code computes the attention
ok = ok and all(r["sequence_parallel"] is False and r["virtual_stages"] == 1 and r["activation_bytes"] > 0
               and r["parameter_bytes"] == r["optimizer_bytes"] > 0  # without ZeRO: as many as the two moments
               for r in starts)
ok = ok and all(r["pipeline_wait_ms"] == 0 for r in lines if "event" not in r)  # pp 1: no pipeline messages
# The peak resident memory of each rank: more than 1 MB, less than 4 GB.
ok = ok and all(len(r["peak_rss_bytes"]) == 2 and all(1e6 < b < 4e9 for b in r["peak_rss_bytes"])
                for r in lines if r.get("event") == "stop")
# A save line follows the step line of its step.
last = 0
for r in lines:
    if "event" not in r:
        last = r["step"]
    elif r["event"] == "save":
        ok = ok and last >= r["step"]
    elif r["event"] == "save_wait":  # the save waited for was started at or before the last step
        ok = ok and last >= r["step"]
sys.exit(not ok)' "$WORK/split.jsonl"

# --- Resume at another layout: written at tp4pp2, resumed at tp2pp1dp2.
expect_ok "10 steps at tp4pp2 then stop" mpi_train 8 $TINY --tp 4 --pp 2 --steps 20 --stop-at 10 \
    --ckpt-dir "$WORK/relayout" --log "$WORK/relayout.jsonl"
expect_ok "resume at tp2pp1dp2" mpi_train 4 $TINY --tp 2 --dp 2 --micro-batch 1 --steps 20 --ckpt-dir "$WORK/relayout" \
    --resume --log "$WORK/relayout.jsonl"
check "tp4pp2 -> tp2pp1dp2 has the straight tp2 losses (1e-4)" losses_match "$WORK/relayout.jsonl" "$WORK/straight.jsonl" 1e-4

# A checkpoint converted by tp-reshard resumes as well (written as a step of a run directory).
mkdir "$WORK/tp1run"
expect_ok "tp-reshard tp4pp2 -> tp1" "$BIN/tp-reshard" "$WORK/relayout/step_00000010" --to tp1pp1 \
    -o "$WORK/tp1run/step_00000010"
steps_from "$WORK/straight.jsonl" 11 >"$WORK/straight-tail.jsonl"
expect_ok "resume at tp1 from the resharded checkpoint" "$TRAIN" $TINY --steps 20 \
    --ckpt-dir "$WORK/tp1run" --resume --log "$WORK/from-reshard.jsonl"
check "resumed from tp-reshard output: the straight losses (1e-4)" \
    losses_match "$WORK/from-reshard.jsonl" "$WORK/straight-tail.jsonl" 1e-4

# --- Another tool's checkpoint as --ckpt-dir: refused (exit 2), with or without --resume, before anything is
# written there, in one line naming what it is and the command that converts it; that command works. (--resume
# found no step_* there, started afresh and wrote its checkpoints beside the tracker.)
expect_ok "step 10 as a PyTorch DCP" "$BIN/tp-reshard" "$WORK/relayout/step_00000010" --to tp1 --format dcp -o "$WORK/dcp"
expect_ok "step 10 as Megatron-LM's" "$BIN/tp-reshard" "$WORK/relayout/step_00000010" --to tp1 --format megatron \
    -o "$WORK/meg"
# What Megatron-Core writes beside its DCP (docs/MEGATRON.md): the tracker, and metadata.json naming the backend.
mkdir -p "$WORK/dist/iter_0000010" && echo 10 >"$WORK/dist/latest_checkpointed_iteration.txt" &&
    cp "$WORK/dcp/.metadata" "$WORK/dcp/__0_0.distcp" "$WORK/dist/iter_0000010/" &&
    echo '{"sharded_backend": "torch_dist", "sharded_backend_version": 1}' >"$WORK/dist/iter_0000010/metadata.json"
listing() { (cd "$WORK" && find dcp meg dist | sort); }
before=$(listing)
expect_error "--resume over a DCP" 2 "^tp-train: --ckpt-dir .*/dcp is a PyTorch distributed checkpoint \(\.metadata\), \
not a tp-train run directory: .*tp-reshard .*/dcp --to tpTppP --format tp -o RUN/step_N.*--ckpt-dir RUN --resume" \
    "$TRAIN" $TINY --steps 12 --ckpt-dir "$WORK/dcp" --resume
expect_error "--resume over a Megatron-LM checkpoint" 2 "^tp-train: --ckpt-dir .*/meg is a Megatron-LM checkpoint \
\(latest_checkpointed_iteration.txt\), not a tp-train run directory: .*tp-ckpt import .*/meg -o RUN/step_N --tp T --pp P" \
    "$TRAIN" $TINY --steps 12 --ckpt-dir "$WORK/meg" --resume
expect_error "a fresh run into a Megatron-LM checkpoint" 2 "--ckpt-dir .*/meg is a Megatron-LM checkpoint" \
    "$TRAIN" $TINY --steps 12 --ckpt-dir "$WORK/meg"
run mpi_train 2 $TINY --tp 2 --steps 12 --ckpt-dir "$WORK/meg/iter_0000010" --resume
check_all "--resume over a Megatron-LM iteration under mpirun: exit 2, rank 0 alone says what it is (exit $RC)" \
    '[ "$RC" -eq 2 ] && [ "$(grep -c "^tp-train: --ckpt-dir" "$WORK/.err")" -eq 1 ] && grep -Eq \
    -- "--ckpt-dir .*/meg/iter_0000010 is an iteration of a Megatron-LM checkpoint \(mp_rank_\* rank files\)" "$WORK/.err"'
expect_error "--resume over a torch_dist checkpoint" 2 "--ckpt-dir .*/dist is a Megatron-Core distributed checkpoint \
\(metadata.json\), not a tp-train run directory: .*tp-ckpt import .*/dist -o RUN/step_N --tp T --pp P" \
    "$TRAIN" $TINY --steps 12 --ckpt-dir "$WORK/dist" --resume
# eval and generate read this toolkit's checkpoints: another tool's is
# named with the command that converts it (they said "not a checkpoint: no
# index.json"), and the converted one is read.
awk 'BEGIN { for (i = 0; i < 40; i++) print "the quick brown fox jumps over the lazy dog", i }' >"$WORK/text.txt"
expect_ok "tokens for eval" "$TRAIN" prepare "$WORK/text.txt" -o "$WORK/tokens.bin"
expect_error "eval of a DCP: what it is and how to convert it" 2 "^tp-train: --ckpt .*/dcp is a PyTorch distributed \
checkpoint \(\.metadata\), which tp-train eval reads once converted into this toolkit's format: tp-reshard .*/dcp --to \
tpTppP --format tp -o CKPT, then give --ckpt CKPT \(docs/DCP.md\)" "$TRAIN" eval --ckpt "$WORK/dcp" --data "$WORK/tokens.bin"
expect_error "generate from a Megatron-LM checkpoint" 2 "^tp-train: --ckpt .*/meg is a Megatron-LM checkpoint \
\(latest_checkpointed_iteration.txt\), which tp-train generate reads .*: tp-ckpt import .*/meg -o CKPT --tp T --pp P" \
    "$TRAIN" generate --ckpt "$WORK/meg" --prompt hello
# A Hugging Face model directory (config.json and safetensors) was "not a
# checkpoint: no index.json": it is named, with tp-ckpt import, which makes
# the checkpoint eval then reads.
expect_ok "a Hugging Face export of a trained checkpoint" "$BIN/tp-ckpt" export "$WORK/relayout/step_00000010" \
    --format safetensors -o "$WORK/hf"
expect_error "eval of a Hugging Face directory: what it is and how to import it" 2 "^tp-train: --ckpt .*/hf is a Hugging \
Face model directory \(config.json, safetensors\), which tp-train eval reads once converted into this toolkit's format: \
tp-ckpt import .*/hf -o CKPT --tp T --pp P, then give --ckpt CKPT \(docs/EXPORT.md \"Import\"\)" \
    "$TRAIN" eval --ckpt "$WORK/hf" --data "$WORK/tokens.bin"
expect_error "--ckpt-dir a Hugging Face directory alike" 2 "^tp-train: --ckpt-dir .*/hf is a Hugging Face model \
directory .*tp-ckpt import .*/hf -o RUN/step_N --tp T --pp P, N its step, 0 for a model imported from Hugging Face" \
    "$TRAIN" $TINY --steps 12 --ckpt-dir "$WORK/hf" --resume
expect_ok "imported as it says" "$BIN/tp-ckpt" import "$WORK/hf" -o "$WORK/hf.ck" --tp 1 --pp 1
expect_ok "eval reads the import" "$TRAIN" eval --ckpt "$WORK/hf.ck" --data "$WORK/tokens.bin" --windows 2
check "gives a loss" grep -q "^loss " "$WORK/.out"
run mpi_train 2 eval --ckpt "$WORK/dist" --data "$WORK/tokens.bin" --tp 2
check_all "eval of a torch_dist checkpoint under mpirun: exit 2, rank 0 alone says it (exit $RC)" \
    '[ "$RC" -eq 2 ] && [ "$(grep -c "^tp-train: --ckpt" "$WORK/.err")" -eq 1 ] && grep -Eq \
    -- "--ckpt .*/dist is a Megatron-Core distributed checkpoint \(metadata.json\), .*tp-ckpt import .*/dist" "$WORK/.err"'
# A layout the checkpoint's model does not divide into is the command
# line's, as in training: exit 2, rank 0 alone says it (it exited 1).
run mpi_train 3 eval --ckpt "$WORK/relayout/step_00000010" --data "$WORK/tokens.bin" --tp 3
check_all "eval at a tp the model's heads do not divide: exit 2, one line naming the checkpoint (exit $RC)" \
    '[ "$RC" -eq 2 ] && [ "$(grep -c "^tp-train: " "$WORK/.err")" -eq 1 ] && grep -Eq \
    "^tp-train: .*step_00000010.*heads 4 is not divisible by tp 3 \(see tp-train eval --help\)$" "$WORK/.err"'
run mpi_train 2 generate --ckpt "$WORK/relayout/step_00000010" --prompt hello --tokens 5
check_all "generate under mpirun: refused by rank 0 alone, no text (each rank wrote its own, interleaved; exit $RC)" \
    '[ "$RC" -eq 2 ] && [ "$(grep -c "^tp-train: generate runs as one process (it was started as 2 ranks)" \
    "$WORK/.err")" -eq 1 ] && ! grep -q hello "$WORK/.out"'
expect_ok "generate under mpirun with one rank" mpi_train 1 generate --ckpt "$WORK/relayout/step_00000010" \
    --prompt hello --tokens 5
check "writes the prompt and its continuation" grep -q "^hello" "$WORK/.out"
expect_error "generate with an empty prompt: a usage error" 2 "--prompt is empty" \
    "$TRAIN" generate --ckpt "$WORK/relayout/step_00000010" --prompt ""
# Output that cannot be written fails (exit 1, one line) instead of exit 0
# with the text lost: a full disk, and a reader gone while SIGPIPE is
# ignored (generate computed every token for nobody).
expect_error "generate to a full disk: exit 1" 1 "^tp-train: error: cannot write the text: No space left on device" \
    sh -c 'exec "$@" >/dev/full' sh "$TRAIN" generate --ckpt "$WORK/relayout/step_00000010" --prompt hello --tokens 5
expect_error "eval to a full disk: exit 1" 1 "^tp-train: error: cannot write standard output: No space left on device" \
    sh -c 'exec "$@" >/dev/full' sh "$TRAIN" eval --ckpt "$WORK/relayout/step_00000010" --data "$WORK/tokens.bin" --json
expect_error "tp-ckpt info to a full disk: exit 1" 1 "^tp-ckpt: error: cannot write standard output: No space left on device" \
    sh -c 'exec "$@" >/dev/full' sh "$BIN/tp-ckpt" info "$WORK/relayout/step_00000010"
run bash -c 'trap "" PIPE; "$@" 2>"$0.generate-err" | head -c 1 >/dev/null; exit "${PIPESTATUS[0]}"' "$WORK/pipe" \
    "$TRAIN" generate --ckpt "$WORK/relayout/step_00000010" --prompt hello --tokens 100000 --temperature 0
check_all "generate to a reader that left, SIGPIPE ignored: stops, exit 1 (exit $RC)" '[ "$RC" -eq 1 ] &&
    grep -q "^tp-train: error: cannot write the text: Broken pipe" "$WORK/pipe.generate-err"'
# --resume with another --seed than the checkpoint's run: the samples from
# there on differ (it went unsaid); a warning naming both, once.
expect_ok "a run with --seed 7, stopped at step 3" "$TRAIN" $TINY --steps 6 --seed 7 --stop-at 3 --ckpt-dir "$WORK/seeded"
expect_ok "resumed with the same seed" "$TRAIN" $TINY --steps 6 --seed 7 --stop-at 4 --ckpt-dir "$WORK/seeded" --resume
check "no warning" [ ! -s "$WORK/.err" ]
expect_ok "resumed at dp2 without --seed" mpi_train 2 $TINY --micro-batch 1 --dp 2 --steps 6 --ckpt-dir "$WORK/seeded" --resume
check "a warning, once, naming both seeds" [ "$(grep -c "^tp-train: warning: --seed 1337, but .*seeded/step_00000004 was trained with --seed 7: the samples" "$WORK/.err")" -eq 1 ]
# A step saved again (a run resumed before it, `latest` behind a committed
# step) while a reader holds that step's checkpoint: the save waits for the
# reader to finish (the run failed at its last save, "being read ... not
# replaced", its steps lost). The reader, a reshard, is held at its commit
# until the trainer has logged its last step.
D="$WORK/reread"
expect_ok "a run of 10 steps" "$TRAIN" $TINY --steps 10 --ckpt-every 5 --ckpt-dir "$D"
echo step_00000005 >"$D/latest"
TP_CKPT_FAULT="before-rename:WAIT:$WORK/reread.release" "$BIN/tp-reshard" "$D/step_00000010" --to tp1 \
    -o "$WORK/reread-out" >/dev/null 2>&1 &
reader=$!
wait_for "$WORK/reread.release.held" 60
"$TRAIN" $TINY --steps 10 --ckpt-every 5 --ckpt-dir "$D" --resume --log "$WORK/reread.jsonl" >"$WORK/.out" 2>"$WORK/.err" &
trainer=$!
wait_for_step "$WORK/reread.jsonl" 10 60
sleep 1
check "the trainer waits for the reader of step 10" kill -0 "$trainer"
: >"$WORK/reread.release"
wait "$reader"
wait "$trainer"
RC=$?
check_all "then saves it: exit 0, latest step 10 (exit $RC)" '[ "$RC" -eq 0 ] && [ "$(cat "$D/latest")" = step_00000010 ]'
expect_ok "and it verifies" "$BIN/tp-ckpt" verify "$D/step_00000010"
expect_ok "a run whose log cannot be written" "$TRAIN" $TINY --steps 2 --log /dev/full
check "says so once, on stderr" [ "$(grep -c "^tp-train: warning: cannot write the log /dev/full: No space left on device" "$WORK/.err")" -eq 1 ]
expect_ok "the DCP converted as the refusal says" "$BIN/tp-reshard" "$WORK/dcp" --to tp1pp1 --format tp -o "$WORK/dcp-tp"
expect_ok "eval of the original" "$TRAIN" eval --ckpt "$WORK/relayout/step_00000010" --data "$WORK/tokens.bin" --json
original_loss=$(sed 's/.*"loss": \([^,]*\),.*/\1/' "$WORK/.out")
expect_ok "eval of the converted DCP" "$TRAIN" eval --ckpt "$WORK/dcp-tp" --data "$WORK/tokens.bin" --json
check "the converted DCP's loss is the original's ($original_loss)" grep -q "\"loss\": $original_loss," "$WORK/.out"
# A run that diverges ends at its first non-finite gradient norm (it went on
# training NaN weights, exit 0, and would have saved them after the good
# checkpoints): the step logged with a null loss, its update not applied,
# the saves under way committed, every rank ending together (rank 0 says
# it, no abort), the newest checkpoint the last finite one.
run mpi_train 4 $TINY --tp 2 --pp 2 --steps 6 --warmup 0 --lr 1e30 --ckpt-dir "$WORK/diverged" --ckpt-every 1 \
    --log "$WORK/diverged.jsonl"
check_all "a diverged run: exit 1, one line from rank 0 naming the step (exit $RC)" '[ "$RC" -eq 1 ] &&
    [ "$(grep -c "^tp-train: error: step [0-9]*: the gradient norm is not finite.*the newest checkpoint, .*/diverged/step_[0-9]*, holds the last finite weights" "$WORK/.err")" -eq 1 ] &&
    ! grep -q "rank [1-9]" "$WORK/.err"'
check "a diverged run: its log is JSON, the last step null, a diverged stop after it" "$PY" -c '
import json, sys
lines = [json.loads(l, parse_constant=lambda w: sys.exit("not JSON: " + w)) for l in open(sys.argv[1])]
steps = [l for l in lines if "event" not in l]
assert steps[-1]["grad_norm"] is None and all(s["grad_norm"] is not None for s in steps[:-1]), steps
stop = [l for l in lines if l.get("event") == "stop"][-1]
assert stop["reason"] == "diverged" and stop["step"] == steps[-1]["step"] - 1, stop
assert "not finite" in stop["error"], stop' "$WORK/diverged.jsonl"
check "a diverged run: latest names the step before the diverged one" "$PY" -c '
import json, sys
last = [json.loads(l) for l in open(sys.argv[1]) if "event" not in l][-1]["step"]
assert open(sys.argv[2]).read().strip() == "step_%08d" % (last - 1)' "$WORK/diverged.jsonl" "$WORK/diverged/latest"
expect_ok "a diverged run: its newest checkpoint verifies" "$BIN/tp-ckpt" verify "$WORK/diverged"
expect_ok "exported whole" "$BIN/tp-ckpt" export "$WORK/diverged" --format hdf5 -o "$WORK/diverged.h5"
check "and its weights are finite (h5py)" "$PY" -c '
import h5py, numpy, sys
f = h5py.File(sys.argv[1], "r"); names = []
f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
assert names and all(numpy.isfinite(f[n][()].astype(numpy.float64)).all() for n in names), names' "$WORK/diverged.h5"
# tp-elastic run says it once, before launching: it relaunched the
# trainer's refusal as a failure to retry.
expect_error "tp-elastic run over a Megatron-LM checkpoint: refused before any launch" 2 \
    "^tp-elastic run: error: --ckpt-dir .*/meg is a Megatron-LM checkpoint .*tp-ckpt import" "$BIN/tp-elastic" run --ckpt-dir "$WORK/meg" \
    --world 2 -- "$TRAIN" $TINY --steps 12 --global-batch 4
check "and launched nothing" sh -c '! grep -q "launch\|attempt" "$1"' sh "$WORK/.err"
check "nothing was written into them" [ "$(listing)" = "$before" ]
mkdir "$WORK/run-dcp" "$WORK/run-meg"
expect_ok "the DCP converted as the refusal says" "$BIN/tp-reshard" "$WORK/dcp" --to tp1pp1 --format tp \
    -o "$WORK/run-dcp/step_00000010"
expect_ok "resumed from it" "$TRAIN" $TINY --steps 20 --stop-at 12 --ckpt-dir "$WORK/run-dcp" --resume \
    --log "$WORK/run-dcp.jsonl"
steps_from "$WORK/straight.jsonl" 11 12 >"$WORK/straight-11-12.jsonl"
check "from the DCP: the straight losses (1e-4)" losses_match "$WORK/run-dcp.jsonl" "$WORK/straight-11-12.jsonl" 1e-4
expect_ok "the Megatron-LM checkpoint imported as the refusal says" "$BIN/tp-ckpt" import "$WORK/meg" \
    -o "$WORK/run-meg/step_00000010" --tp 1 --pp 1
expect_ok "resumed from it" "$TRAIN" $TINY --steps 20 --stop-at 12 --ckpt-dir "$WORK/run-meg" --resume \
    --log "$WORK/run-meg.jsonl"
check "from the import: resumed at step 10 (weights only: the optimizer starts afresh)" \
    [ "$(events "$WORK/run-meg.jsonl" start resumed_from)" = "step_00000010 " ]

# --- A new run never replaces another's history: without --resume, a run directory holding committed checkpoints
# is refused (exit 2) before anything is written, in one line naming its newest. (The new run replaced step_N of the
# old one as it reached them, and `latest` still named the old run's: one directory mixing two runs.)
files() { (cd "$1" && find . -type f ! -name '.*' | sort | xargs md5sum); } # what a run holds, not its claim
before=$(files "$WORK/run")
expect_error "a new run into a run directory with checkpoints: refused" 2 "^tp-train: --ckpt-dir .*/run holds the \
checkpoints of a run \(the newest: .*/run/step_00000020\): pass --resume to continue it, or choose another directory \
for a new run$" "$TRAIN" $TINY --dim 128 --steps 3 --ckpt-every 3 --ckpt-dir "$WORK/run"
run mpi_train 2 $TINY --tp 2 --steps 3 --ckpt-dir "$WORK/run"
check_all "the same under mpirun: exit 2, rank 0 alone says it (exit $RC)" \
    '[ "$RC" -eq 2 ] && [ "$(grep -c "^tp-train: --ckpt-dir .*holds the checkpoints of a run" "$WORK/.err")" -eq 1 ]'
check "nothing in the run directory changed" [ "$(files "$WORK/run")" = "$before" ]
# A new directory, an empty one, and one holding only what a killed save left (no committed checkpoint) are a new
# run's.
mkdir "$WORK/empty"
expect_ok "a new run into an empty directory" "$TRAIN" $TINY --steps 2 --ckpt-dir "$WORK/empty"
run env TP_CKPT_FAULT=before-index "$TRAIN" $TINY --steps 2 --ckpt-dir "$WORK/killed"
check_all "a save killed before its index: no committed checkpoint (exit $RC)" \
    '[ "$RC" -eq 137 ] && [ -n "$(ls -A "$WORK/killed")" ] && [ -z "$(ls "$WORK/killed")" ]'
expect_ok "a new run into a killed save's leftovers" "$TRAIN" $TINY --steps 2 --ckpt-dir "$WORK/killed"
check "its checkpoint committed" [ "$(cat "$WORK/killed/latest")" = step_00000002 ]

# --- A checkpoint given as --ckpt-dir is a source, never written inside: refused (exit 2) with or without --resume,
# saying how to train from it. (New checkpoints went inside it, ck/step_00000008, and a later --resume passed over
# them, resuming from ck itself.) tp-elastic run refuses it before making its state directory there.
cp -r "$WORK/run/step_00000020" "$WORK/ck"
before=$(files "$WORK/ck")
expect_error "--resume with a checkpoint as --ckpt-dir: refused" 2 "^tp-train: --ckpt-dir .*/ck is a checkpoint, not a \
run directory, and no checkpoint is written inside another: to train from it, give a run directory that holds it \
\(mkdir RUN; cp -r .*/ck RUN/step_00000020\), then --ckpt-dir RUN --resume$" \
    "$TRAIN" $TINY --steps 22 --ckpt-dir "$WORK/ck" --resume
expect_error "a new run with a checkpoint as --ckpt-dir: refused" 2 \
    "^tp-train: --ckpt-dir .*/ck is a checkpoint, .*; for a new run, choose another directory$" \
    "$TRAIN" $TINY --steps 22 --ckpt-dir "$WORK/ck"
expect_error "a step of a run directory as --ckpt-dir: refused, naming the run" 2 "^tp-train: --ckpt-dir \
.*/run/step_00000010 is a checkpoint, .*RUN/step_00000010\), then --ckpt-dir RUN --resume; or --ckpt-dir .*/run --resume \
to continue the run it belongs to" "$TRAIN" $TINY --steps 22 --ckpt-dir "$WORK/run/step_00000010" --resume
expect_error "tp-elastic run over a checkpoint: refused before any launch" 2 \
    "^tp-elastic run: error: --ckpt-dir .*/ck is a checkpoint, not a run directory" "$BIN/tp-elastic" run \
    --ckpt-dir "$WORK/ck" --world 2 -- "$TRAIN" $TINY --steps 22 --global-batch 4
check_all "nothing written inside them" '[ "$(files "$WORK/ck")" = "$before" ] && [ ! -e "$WORK/ck/elastic" ] &&
    [ "$(ls -A "$WORK/run/step_00000010" | grep -cv "^index.json$\|^shard_.*\.h5$")" -eq 0 ]'
mkdir "$WORK/ck-run" && cp -r "$WORK/ck" "$WORK/ck-run/step_00000020"
expect_ok "put in a run directory as the refusal says, it resumes" "$TRAIN" $TINY --steps 22 --ckpt-dir "$WORK/ck-run" \
    --resume --log "$WORK/ck-run.jsonl"
check "resumed from step 20" [ "$(events "$WORK/ck-run.jsonl" start resumed_from)" = "step_00000020 " ]

# --- --stop-at N at or below the step a run resumes at: it stops at once, saying so, with nothing trained and no
# checkpoint written (exit 0, a stop line). (The test was for step N itself: such a run trained on to --steps.)
before=$(files "$WORK/run-meg")
for at in 12 5; do
    expect_ok "--stop-at $at, resumed at step 12" "$TRAIN" --model tiny --micro-batch 2 --steps 20 --stop-at $at \
        --ckpt-dir "$WORK/run-meg" --resume --log "$WORK/run-meg.jsonl"
    check "--stop-at $at: says so" grep -q "^stopped at step 12, where the run resumed: --stop-at $at was reached \
before; no step trained, no checkpoint written$" "$WORK/.out"
done
check_all "no step trained: the log's last step 12, two more start and stop lines (stopped at 12)" \
    '[ "$(last_step "$WORK/run-meg.jsonl")" = 12 ] && [ "$(events "$WORK/run-meg.jsonl" start step)" = "10 12 12 " ] &&
    [ "$(events "$WORK/run-meg.jsonl" stop reason)|$(events "$WORK/run-meg.jsonl" stop step)" = \
    "stopped stopped stopped |12 12 12 " ]'
check "no checkpoint written" [ "$(files "$WORK/run-meg")" = "$before" ]

# --resume compares the checkpoint's record of its run with this launch: one
# that forgot --data trained the run's weights on synthetic data without a
# word (refused now, nothing trained: a usage error, exit 2, as another
# model's flags are below); another schedule or global batch is said, each
# setting with the one it was trained with.
S="$WORK/settings"
expect_ok "a run on token files, stopped at step 3" "$TRAIN" $TINY --global-batch 8 --data "$WORK/tokens.bin" --lr 1e-3 \
    --warmup 2 --steps 6 --ckpt-dir "$S" --stop-at 3
expect_error "resumed without --data: refused, naming the checkpoint and the option" 2 \
    "^tp-train: error: --resume: .*settings/step_00000003 was trained on token files \(--data\), and this launch gives no --data" \
    "$TRAIN" $TINY --global-batch 8 --lr 1e-3 --warmup 2 --steps 6 --ckpt-dir "$S" --resume
check "nothing trained or saved" [ "$(ls "$S" | tr '\n' ' ')" = "latest step_00000003 " ]
# Model flags other than the checkpoint's are the launch's usage error too
# (exit 2, as tp-elastic says it before launching): it was exit 1, which a
# job script that retries failures relaunched forever. Every rank of two
# agrees; the log's stop line still says why.
run mpi_train 2 $TINY --dim 128 --global-batch 8 --data "$WORK/tokens.bin" --steps 6 --ckpt-dir "$S" --resume \
    --log "$WORK/other-model.jsonl"
check_all "resumed with another model's flags at 2 ranks: exit 2 ($RC), one line naming both models" \
    '[ "$RC" -eq 2 ] && [ "$(grep -c "^tp-train: " "$WORK/.err")" -eq 1 ] &&
    grep -q "^tp-train: error: .*settings/step_00000003 holds another model: .*dim 64 .*this run has .*dim 128 .*: resume with the model flags" "$WORK/.err"'
check_all "the log's stop line: failed before any step (0), with the same reason" \
    '[ "$(events "$WORK/other-model.jsonl" stop reason)|$(events "$WORK/other-model.jsonl" stop step)" = "failed |0 " ] &&
    grep -q "\"event\":\"stop\".*\"error\":\".*holds another model" "$WORK/other-model.jsonl"'
check "nothing trained or saved" [ "$(ls "$S" | tr '\n' ' ')" = "latest step_00000003 " ]
run "$TRAIN" $TINY --data "$WORK/tokens.bin" --steps 12 --ckpt-dir "$S" --resume --stop-at 4
check_all "resumed with another schedule and batch: said, each with what it was (exit $RC)" \
    '[ "$RC" -eq 0 ] && grep -q "^tp-train: warning: .*settings/step_00000003 was trained with other settings than this launch.s: --lr 0.0003 (was 0.001), --min-lr 3e-05 (was 0.0001), --warmup 1 (was 2), --steps 12 (was 6), global batch 2 (was 8); the run goes on with this launch.s$" "$WORK/.err"'
run "$TRAIN" $TINY --data "$WORK/tokens.bin" --steps 12 --ckpt-dir "$S" --resume --stop-at 5
check_all "resumed with the settings it was trained with: nothing said (exit $RC)" \
    '[ "$RC" -eq 0 ] && ! grep -q "other settings" "$WORK/.err"'
# Other token files: the sample index went on into another dataset
# without a word (the record said only "files"); now their size is said.
head -c 1000 "$WORK/text.txt" >"$WORK/other.txt"
expect_ok "other token files" "$TRAIN" prepare "$WORK/other.txt" -o "$WORK/other.bin"
run "$TRAIN" $TINY --data "$WORK/other.bin" --steps 12 --ckpt-dir "$S" --resume --stop-at 6
check_all "resumed on other token files: said with both sizes (exit $RC)" \
    '[ "$RC" -eq 0 ] && grep -q "^tp-train: warning: .*settings/step_00000005 was trained with other settings than this launch.s: --data tokens 1000 (was 1870);" "$WORK/.err"'

# --resume without model options takes the run's model and precision (a
# resume had to repeat every model option, and one without --dtype bf16
# went on in fp32): a bf16 run of an odd shape resumed so has a straight
# run's losses bit for bit; --dtype given still decides, and is said.
SHAPE="--layers 2 --dim 48 --heads 3 --vocab 200 --seq 24 --vocab-pad-multiple 64 --dtype bf16 --micro-batch 2 --quiet"
expect_ok "a bf16 run of its own shape, 6 steps straight" "$TRAIN" $SHAPE --steps 6 --log "$WORK/shape-straight.jsonl"
expect_ok "the same, stopped at step 3" "$TRAIN" $SHAPE --steps 6 --stop-at 3 --ckpt-dir "$WORK/shape" \
    --log "$WORK/shape.jsonl"
expect_ok "resumed with no model option" "$TRAIN" --micro-batch 2 --quiet --steps 6 --ckpt-dir "$WORK/shape" --resume \
    --log "$WORK/shape.jsonl"
check "its start line says bf16" grep -q '"event":"start","step":3,.*"dtype":"bf16"' "$WORK/shape.jsonl"
check "the straight run's losses bit for bit" losses_match "$WORK/shape.jsonl" "$WORK/shape-straight.jsonl" 0
run "$TRAIN" --micro-batch 2 --quiet --steps 8 --ckpt-dir "$WORK/shape" --resume --dtype fp32 --stop-at 7
check_all "--dtype fp32 given on the bf16 run: trained so, and said (exit $RC)" \
    '[ "$RC" -eq 0 ] && grep -q "^tp-train: warning: .*was trained with other settings than this launch.s: .*--dtype fp32 (was bf16)" "$WORK/.err"'
expect_error "--resume without model options where no checkpoint is: a usage error saying what to give" 2 \
    "--resume without model options takes the model of the run.s newest checkpoint, and .*empty-run has none" \
    "$TRAIN" --steps 4 --ckpt-dir "$WORK/empty-run" --resume

finish
