# bench-lib.sh: what the benchmark scripts share. Sourced, from the repository root.
PY=/usr/bin/python3

# drop_cache DIR...: a cold page cache. Drops the whole cache when allowed
# (root outside a container), else evicts the files under the given
# directories, which is what a benchmark then reads.
drop_cache() {
    sync
    if [ -w /proc/sys/vm/drop_caches ]; then echo 3 >/proc/sys/vm/drop_caches
    else $PY - "$@" <<'PYEOF'
import os, sys
for root in sys.argv[1:]:
    for d, _, files in os.walk(root):
        for f in files:
            fd = os.open(os.path.join(d, f), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
PYEOF
    fi
}

# measure CMD...: one JSON line of wall seconds, peak RSS and exit status.
measure() { $PY bench/measure.py "$@"; }

# gpt_layers BILLIONS: layers of a dim-2048 GPT of about that many parameters
# (12 * dim^2 per layer), even so that it splits over two pipeline stages.
gpt_layers() {
    $PY -c "import sys; print(max(2, round(float(sys.argv[1]) * 1e9 / (12 * 2048 ** 2) / 2) * 2))" "$1"
}
