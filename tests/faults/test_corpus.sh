#!/bin/sh
# Damaged shard files that crashed or hung libhdf5 under `tp-ckpt verify`
# before issue 11's fix (found by tests/faults/fuzz_shards.py), replayed:
# tests/faults/corpus/shards/cases/<case>/ holds the damaged shard of a tiny
# checkpoint of format 1.0 (variable-length string attributes, no metadata
# checksum; base-<seed>-1.0/ holds the rest of it), and the same byte changes
# applied to the same checkpoint written in format 1.1 (base-<seed>-1.1/).
# Every run must end in exit 0 or 1 without a sanitizer report or a hang:
# - 1.1: verify and tp-reshard exit 1 and name the damaged file (the metadata
#   checksum, or a block checksum when only data was hit);
# - 1.0: verify exits as recorded in expect-1.0 (1, or 0 when only a string
#   attribute the readers no longer read was damaged).
# tier: full
. "$(dirname "$0")/../e2e/lib.sh"
CORPUS="$ROOT/tests/faults/corpus/shards"

# unpack DIR SEED VERSION CASE: the base checkpoint with the case's shards over it.
unpack() {
    rm -rf "$1" && mkdir -p "$1" || return 1
    cp "$CORPUS/base-$2-$3/index.json" "$1/"
    for g in "$CORPUS/base-$2-$3"/*.gz "$CORPUS/cases/$4/$3"/*.gz; do
        gunzip -c "$g" >"$1/$(basename "$g" .gz)" || return 1
    done
}

# clean WHAT: the last run ended in exit 0 or 1, in time, without a sanitizer report.
clean() {
    if [ "$RC" -gt 1 ]; then failed "$1: exit $RC (crash or hang)"; return 1; fi
    if grep -qE 'AddressSanitizer|LeakSanitizer|runtime error:' "$WORK/.err"; then
        failed "$1: sanitizer report"; return 1
    fi
    return 0
}

cases=0
for dir in "$CORPUS"/cases/*/; do
    c=$(basename "$dir")
    seed=$(cat "$dir/seed")
    shard=$(basename "$(ls "$dir/1.1/"*.gz)" .gz)
    cases=$((cases + 1))
    for version in 1.0 1.1; do
        ck="$WORK/$c-$version"
        unpack "$ck" "$seed" "$version" "$c" || { failed "$c: cannot unpack"; continue; }
        run timeout 60 "$BIN/tp-ckpt" verify "$ck" --threads 2
        clean "$c $version verify" || continue
        if [ "$version" = 1.1 ]; then
            if [ "$RC" -ne 1 ]; then failed "$c 1.1 verify: exit $RC, damage not reported"; continue; fi
            if [ "$(grep -c 'damaged:' "$WORK/.err")" -ne 1 ] || ! grep -q "damaged: .*$shard" "$WORK/.err"; then
                failed "$c 1.1 verify: not one line naming $shard"; continue
            fi
        else
            want=$(cat "$dir/expect-1.0")
            if [ "$RC" -ne "$want" ]; then failed "$c 1.0 verify: exit $RC, expected $want"; continue; fi
        fi
        pass
        run timeout 60 "$BIN/tp-ckpt" info "$ck"
        clean "$c $version info" && pass
        run timeout 60 "$BIN/tp-reshard" "$ck" --to tp1 -o "$WORK/$c-$version-out" --threads 2 --device cpu
        if clean "$c $version reshard"; then
            if [ "$version" = 1.1 ] && [ "$RC" -ne 1 ]; then failed "$c 1.1 reshard: exit $RC"; else pass; fi
        fi
    done
done
[ "$cases" -gt 0 ] || failed "no corpus cases found in $CORPUS"
finish
