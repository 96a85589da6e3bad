#!/bin/sh
# The include graph follows the declared layering (scripts/check-layers.py),
# and the check fails, naming the file and the rule, on each kind of wrong
# include planted in a copy of the sources, and on a CUDA entry point that
# the build without CUDA does not stand in for.
# tier: check
. "$(dirname "$0")/lib.sh"

CHECK="$ROOT/scripts/check-layers.py"
expect_ok "the sources follow the layering" "$PY" "$CHECK" "$ROOT"

# plant FILE LINE: a copy of the sources with LINE added at the top of FILE.
plant() {
    rm -rf "$WORK/tree"
    mkdir "$WORK/tree"
    (cd "$ROOT" && tar cf - common kernels store ckpt reshard formats model trainer elastic programs) | (cd "$WORK/tree" && tar xf -)
    { echo "$2"; cat "$WORK/tree/$1"; } >"$WORK/tree/$1.new" && mv "$WORK/tree/$1.new" "$WORK/tree/$1"
}

# refused "what" FILE LINE PATTERN: the check exits 1 and says PATTERN.
refused() {
    what=$1 file=$2 line=$3 pattern=$4
    plant "$file" "$line"
    run "$PY" "$CHECK" "$WORK/tree"
    if [ "$RC" -ne 1 ]; then failed "$what: exit $RC, expected 1"
    elif ! grep -Eq -- "$pattern" "$WORK/.err"; then failed "$what: stderr does not match /$pattern/"
    else pass; fi
}

refused "a lower library including a higher one" ckpt/reader.c '#include "../trainer/train.h"' \
    'ckpt/reader.c:1: includes trainer/train.h: ckpt may use only common kernels store'
refused "the trainer including the orchestrator above it" trainer/train.c '#include "../elastic/elastic.h"' \
    'trainer/train.c:1: includes elastic/elastic.h: trainer may use only'
refused "a library including another's private header" formats/export.c '#include "../reshard/internal.h"' \
    'formats/export.c:1: includes reshard/internal.h, a private header of reshard'
refused "a library including a program's header" model/gpt.c '#include "../programs/cli.h"' \
    'model/gpt.c:1: includes programs/cli.h: model may use only'
refused "the trainer including MPI outside its communicator" trainer/train.c '#include <mpi.h>' \
    'trainer/train.c:1: includes <mpi.h>, which only trainer/comm_mpi.c may include'
refused "HDF5 outside the checkpoint library" reshard/plan.c '#include <hdf5.h>' \
    'reshard/plan.c:1: includes <hdf5.h>'
refused "the store including the checkpoint library above it" store/posix.c '#include "../ckpt/ckpt.h"' \
    'store/posix.c:1: includes ckpt/ckpt.h: store may use only common kernels'
refused "libcurl outside the store library" ckpt/upload.c '#include <curl/curl.h>' \
    'ckpt/upload.c:1: includes <curl/curl.h>, which only store/\* may include'
refused "OpenSSL outside the store library" formats/export.c '#include <openssl/evp.h>' \
    'formats/export.c:1: includes <openssl/evp.h>, which only store/\* may include'
refused "a header that is not there" kernels/cpu/adamw.c '#include "../nowhere.h"' \
    'kernels/cpu/adamw.c:1: includes "../nowhere.h", which is not a file'
refused "a program including a private header" programs/tp-ckpt.c '#include "../ckpt/internal.h"' \
    'programs/tp-ckpt.c:1: includes ckpt/internal.h, a private header of ckpt'
refused "a call to asprintf (its leaks are suppressed under the sanitizers)" formats/export.c \
    'static void f(char **s) { if (asprintf(s, "%d", 1) < 0) *s = 0; }' \
    'formats/export.c:1: calls asprintf, which the toolkit does not: .*tests/lsan.supp'
refused "a CUDA entry point that the build without CUDA lacks (kernels/cuda/none.c)" kernels/cuda/attention_tiled.h \
    'int cuda_planted_entry(const char *value);' \
    'kernels/cuda/attention_tiled.h: declares cuda_planted_entry, which kernels/cuda/none.c does not define'

# What the copy holds without a planted line passes: the failures above come from the plants.
plant common/error.c '/* nothing */'
expect_ok "an unchanged copy passes" "$PY" "$CHECK" "$WORK/tree"

finish
