/* fuzz_scratch.c: the fuzzers' scratch directories (fuzz_scratch.h). */
#include "fuzz_scratch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../store/store.h"

static char scratch[512];
static pid_t scratch_maker; /* a forked child's exit leaves it alone */

static void remove_scratch(void)
{
    if (scratch[0] && getpid() == scratch_maker) (void)store_posix()->remove_tree(store_posix(), scratch);
}

int fuzz_scratch_dir(const char *name, char *out, size_t size)
{
    static int made;
    if (!made) {
        made = 1;
        const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(scratch, sizeof scratch, "%s/tp-fuzz-XXXXXX", base);
        scratch_maker = getpid();
        if (!mkdtemp(scratch)) scratch[0] = '\0';
        else if (atexit(remove_scratch) != 0) remove_scratch(), scratch[0] = '\0';
    }
    if (!scratch[0]) return -1;
    int n = snprintf(out, size, "%s/%s", scratch, name);
    if (n < 0 || (size_t)n >= size) return -1;
    return mkdir(out, 0700) == 0 || errno == EEXIST ? 0 : -1;
}

int fuzz_scratch_with_copies(const char *name, const char *from_dir, const char *const *files, int count, char *out,
                             size_t size)
{
    if (fuzz_scratch_dir(name, out, size)) return out[0] = '\0', -1;
    char from[1024], to[1024];
    for (int i = 0; i < count; i++) {
        snprintf(from, sizeof from, "%s/%s", from_dir, files[i]);
        snprintf(to, sizeof to, "%s/%s", out, files[i]);
        if (fuzz_copy_file(from, to)) return out[0] = '\0', -1;
    }
    return 0;
}

int fuzz_write_file(const char *path, const void *data, size_t size)
{
    (void)unlink(path);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t n = fwrite(data, 1, size, f);
    return fclose(f) == 0 && n == size ? 0 : -1;
}

int fuzz_copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb");
    if (in) (void)unlink(to); /* a new file, as fuzz_write_file writes */
    FILE *out = in ? fopen(to, "wb") : NULL;
    char buf[1 << 16];
    size_t n;
    int ok = in && out;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    if (ok && ferror(in)) ok = 0;
    if (in) fclose(in);
    if (out && fclose(out) != 0) ok = 0;
    return ok ? 0 : -1;
}
