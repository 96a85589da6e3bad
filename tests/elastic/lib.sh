# lib.sh: what the tests of tp-elastic share (sourced after tests/e2e/lib.sh).
# A run's record is RUN/elastic/events.jsonl (docs/ELASTIC.md).

# losses_continue LOG: the last logged loss of every step of LOG equals the
# uninterrupted run's, $WORK/ref.jsonl (1e-4 relative), and every step
# 1..$STEPS is there.
losses_continue() { "$PY" "$ROOT/tests/elastic/check_losses.py" "$1" "$WORK/ref.jsonl" "$STEPS"; }

# events RUN NAME: how many events of that name the run recorded.
events() { grep -c "\"event\":\"$2\"" "$1/elastic/events.jsonl" 2>/dev/null || true; }

# summary_field RUN FIELD: from the run's last summary event.
summary_field() {
    "$PY" -c 'import json,sys; s=[json.loads(l) for l in open(sys.argv[1]) if "\"summary\"" in l][-1]; print(s[sys.argv[2]])' \
        "$1/elastic/events.jsonl" "$2"
}

# nothing_left RUN: no process of the run is left, stopped ones included
# (within 10 s: a launcher told to stop takes a moment to end its ranks).
nothing_left() {
    for i in $(seq 100); do
        pgrep -f -- "--ckpt-dir $1 " >/dev/null || return 0
        sleep 0.1
    done
    return 1
}
