/* data.c: token files (llm.c's format: 256 int32 header with magic 20240520,
 * version 1 and the token count, then uint16 tokens), globs of them, and the
 * synthetic dataset. Files are mapped, not read. */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/error.h"
#include "../common/file.h"
#include "../common/random.h"
#include "data.h"

#define SYNTH_KEEP 0.75 /* probability that a token follows the rule */

typedef struct {
    const uint16_t *tokens;
    int64_t count;
    void *map;
    size_t map_size;
} token_file;

struct dataset {
    uint64_t seed;
    int64_t vocab;
    token_file *files;
    int num_files;
    int64_t total;
};

static int map_file(token_file *f, const char *path, int64_t vocab)
{
    int fd;
    TP_TRY(tp_open_regular(path, &fd));
    struct stat st;
    int32_t header[DATA_HEADER_INTS];
    int ok = fstat(fd, &st) == 0 && pread(fd, header, sizeof header, 0) == (ssize_t)sizeof header;
    if (!ok || header[0] != DATA_MAGIC) {
        close(fd);
        return tp_fail(TP_ERR_FORMAT, "%s: not a token file (magic %d, expected %d)", path, ok ? header[0] : -1,
                        DATA_MAGIC);
    }
    if (header[1] != DATA_VERSION) {
        close(fd);
        return tp_fail(TP_ERR_FORMAT, "%s: token file version %d, expected %d", path, header[1], DATA_VERSION);
    }
    int64_t count = header[2];
    if (count < 2 || (int64_t)sizeof header + count * 2 > (int64_t)st.st_size) {
        close(fd);
        return tp_fail(TP_ERR_FORMAT, "%s: header says %lld tokens, the file holds %lld (truncated?)", path,
                        (long long)count, (long long)((st.st_size - (off_t)sizeof header) / 2));
    }
    f->map_size = (size_t)st.st_size;
    f->map = mmap(NULL, f->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) return tp_fail(TP_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
    f->tokens = (const uint16_t *)((const char *)f->map + sizeof header);
    f->count = count;
    for (int64_t i = 0; i < count; i++)
        if (f->tokens[i] >= vocab)
            return tp_fail(TP_ERR_FORMAT, "%s: token %u at position %lld is outside the vocabulary of %lld", path,
                            f->tokens[i], (long long)i, (long long)vocab);
    return TP_OK;
}

int dataset_open(dataset **out, const char *pattern, int64_t vocab, uint64_t seed)
{
    *out = NULL;
    dataset *d = calloc(1, sizeof *d);
    if (!d) return tp_fail(TP_ERR_NOMEM, "out of memory");
    d->seed = seed;
    d->vocab = vocab;
    if (!pattern) {
        *out = d;
        return TP_OK;
    }
    glob_t g;
    if (glob(pattern, 0, NULL, &g) != 0 || g.gl_pathc == 0) {
        free(d);
        return tp_fail(TP_ERR_NOT_FOUND, "%s: no such token file", pattern);
    }
    d->files = calloc(g.gl_pathc, sizeof *d->files);
    int status = d->files ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < g.gl_pathc && !status; i++) {
        status = map_file(&d->files[d->num_files], g.gl_pathv[i], vocab);
        if (!status) d->total += d->files[d->num_files++].count;
    }
    globfree(&g);
    if (status) {
        dataset_close(d);
        return status;
    }
    *out = d;
    return TP_OK;
}

void dataset_close(dataset *d)
{
    if (!d) return;
    for (int i = 0; i < d->num_files; i++)
        if (d->files[i].map) munmap(d->files[i].map, d->files[i].map_size);
    free(d->files);
    free(d);
}

int64_t dataset_tokens(const dataset *d)
{
    return d->total;
}

int dataset_read_tokens(const dataset *d, int64_t first, int64_t count, int *tokens)
{
    if (first < 0 || count < 0 || first + count > d->total)
        return tp_fail(TP_ERR_ARG, "tokens [%lld, %lld) are not inside the %lld of the token files", (long long)first,
                       (long long)(first + count), (long long)d->total);
    for (int i = 0; i < d->num_files && count > 0; i++) {
        const token_file *f = &d->files[i];
        if (first >= f->count) {
            first -= f->count;
            continue;
        }
        int64_t n = f->count - first < count ? f->count - first : count;
        for (int64_t t = 0; t < n; t++) tokens[t] = f->tokens[first + t];
        tokens += n;
        count -= n;
        first = 0;
    }
    return TP_OK;
}

void dataset_sample(const dataset *d, int64_t index, int64_t seq, int *tokens)
{
    uint64_t z = splitmix64(d->seed ^ splitmix64((uint64_t)index));
    if (!d->num_files) {
        /* The rule: next = (5 * previous + 3) mod vocab. */
        tokens[0] = (int)(z % (uint64_t)d->vocab);
        for (int64_t t = 1; t <= seq; t++) {
            z = splitmix64(z);
            double u = (double)(z >> 11) * 0x1.0p-53;
            tokens[t] = u < SYNTH_KEEP ? (int)((5 * (int64_t)tokens[t - 1] + 3) % d->vocab)
                                       : (int)(splitmix64(z ^ 0xA5A5A5A5ull) % (uint64_t)d->vocab);
        }
        return;
    }
    /* A window of seq + 1 tokens inside one file. */
    int64_t windows = 0;
    for (int i = 0; i < d->num_files; i++) windows += d->files[i].count > seq ? d->files[i].count - seq : 0;
    int64_t w = windows > 0 ? (int64_t)(z % (uint64_t)windows) : 0;
    for (int i = 0; i < d->num_files; i++) {
        int64_t n = d->files[i].count > seq ? d->files[i].count - seq : 0;
        if (w < n) {
            for (int64_t t = 0; t <= seq; t++) tokens[t] = d->files[i].tokens[w + t];
            return;
        }
        w -= n;
    }
    memset(tokens, 0, (size_t)(seq + 1) * sizeof(int)); /* no file long enough (checked by callers) */
}

double dataset_loss_floor(const dataset *d)
{
    if (d->num_files) return -1;
    double V = (double)d->vocab, hit = SYNTH_KEEP + (1 - SYNTH_KEEP) / V, miss = (1 - SYNTH_KEEP) / V;
    return -(hit * log(hit) + (V - 1) * miss * log(miss));
}

int dataset_prepare(const char *text_path, const char *out_path)
{
    FILE *in = fopen(text_path, "rb");
    if (!in) return tp_fail(TP_ERR_IO, "%s: cannot open: %s", text_path, strerror(errno));
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", out_path);
    FILE *out = fopen(tmp, "wb");
    if (!out) {
        fclose(in);
        return tp_fail(TP_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    }
    int32_t header[DATA_HEADER_INTS] = {DATA_MAGIC, DATA_VERSION, 0};
    fwrite(header, sizeof header, 1, out);
    int64_t count = 0;
    unsigned char bytes[1 << 16];
    uint16_t tokens[1 << 16];
    size_t got;
    int write_ok = 1;
    while ((got = fread(bytes, 1, sizeof bytes, in)) > 0) {
        for (size_t i = 0; i < got; i++) tokens[i] = bytes[i]; /* byte-level vocabulary: token = byte */
        write_ok = write_ok && fwrite(tokens, sizeof tokens[0], got, out) == got;
        count += (int64_t)got;
    }
    int read_ok = !ferror(in);
    fclose(in);
    if (!read_ok || !write_ok) {
        fclose(out);
        unlink(tmp);
        return tp_fail(TP_ERR_IO, "%s: cannot %s: %s", read_ok ? tmp : text_path, read_ok ? "write" : "read",
                        strerror(errno));
    }
    if (count > INT32_MAX || count < 2) {
        fclose(out);
        unlink(tmp);
        return tp_fail(TP_ERR_FORMAT, "%s: %lld bytes: a token file holds 2 to %d tokens", text_path,
                        (long long)count, INT32_MAX);
    }
    header[2] = (int32_t)count;
    int ok = fseek(out, 0, SEEK_SET) == 0 && fwrite(header, sizeof header, 1, out) == 1;
    ok = fclose(out) == 0 && ok;
    if (!ok || rename(tmp, out_path) != 0) {
        unlink(tmp);
        return tp_fail(TP_ERR_IO, "%s: cannot write: %s", out_path, strerror(errno));
    }
    return TP_OK;
}
