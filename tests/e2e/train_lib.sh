# train_lib.sh: what the end-to-end tests of tp-train share (sourced after
# lib.sh, with TRAIN set to the trainer).

# mpi_train RANKS ARGS...: tp-train under mpirun.
mpi_train() {
    ranks=$1
    shift
    mpirun --oversubscribe -np "$ranks" "$TRAIN" "$@" </dev/null
}

# A log (--log) holds step lines {"step":N,"loss":X,...} and event lines
# {"event":"start"|"save"|"stop",...}; these helpers read its step lines.

# steps_from LOG FIRST [LAST]: the log's step lines of steps FIRST..LAST.
steps_from() {
    "$PY" -c 'import json,sys; [print(l, end="") for l in open(sys.argv[1]) if "event" not in json.loads(l) and int(sys.argv[2]) <= json.loads(l)["step"] <= int(sys.argv[3])]' \
        "$1" "$2" "${3:-999999999}"
}

# last_step LOG: the step of its last step line.
last_step() { "$PY" -c 'import json,sys; print([r for r in map(json.loads, open(sys.argv[1])) if "event" not in r][-1]["step"])' "$1"; }

# events LOG KIND FIELD: FIELD of each KIND event line, one per line.
events() { "$PY" -c 'import json,sys; [print(json.dumps(r[sys.argv[3]]).strip(chr(34))) for r in map(json.loads, open(sys.argv[1])) if r.get("event") == sys.argv[2]]' "$1" "$2" "$3" | tr '\n' ' '; }

