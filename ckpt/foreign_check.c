/* foreign_check.c: the checksums another tool's checkpoint records (a
 * torch.save archive's CRC-32 of each zip entry), checked as the reader
 * reads, as the toolkit's own block checksums are (reader.c).
 *
 * A recorded CRC-32 covers a whole entry, and a reader asks for pieces, rows
 * or boxes of it, in any order and from several threads. Each range keeps
 * the CRC of its bytes from its start up to the furthest byte read in order;
 * a read that continues it extends it, and when it reaches the range's end
 * the CRC is compared. What was read out of that order is read again, once,
 * by foreign_checks_finish, which a consumer calls before it publishes what
 * it made of the data: damage anywhere in an entry it used fails it,
 * naming the file, the entry and both CRCs. */
#include <isa-l/crc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/error.h"
#include "../common/memory.h"
#include "foreign_check.h"

typedef struct {
    ckpt_foreign_check range;
    char *name;
    int64_t verified; /* bytes from its start whose CRC is in crc */
    uint32_t crc;
    int state; /* 0: not yet whole, 1: matched, TP_ERR_CHECKSUM: did not */
} check_state;

struct foreign_checks {
    check_state *checks; /* by file, then offset */
    int count;
    char **files; /* copies of the file paths, for messages */
    int num_files;
    pthread_mutex_t lock;
};

static int by_file_and_offset(const void *a, const void *b)
{
    const check_state *x = a, *y = b;
    if (x->range.file != y->range.file) return x->range.file < y->range.file ? -1 : 1;
    return x->range.offset < y->range.offset ? -1 : x->range.offset > y->range.offset;
}

int foreign_checks_create(const ckpt_foreign_check *ranges, int count, const char *const *files, int num_files,
                          foreign_checks **out)
{
    *out = NULL;
    foreign_checks *fc = calloc(1, sizeof *fc);
    if (!fc || !(fc->checks = calloc((size_t)count + 1, sizeof *fc->checks))) {
        free(fc);
        return tp_fail(TP_ERR_NOMEM, "out of memory for %d checksums", count);
    }
    pthread_mutex_init(&fc->lock, NULL);
    int status = (fc->files = calloc((size_t)num_files + 1, sizeof *fc->files)) ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int f = 0; f < num_files && !status; f++, fc->num_files = f)
        if (!(fc->files[f] = strdup(files[f]))) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < count && !status; i++) {
        const ckpt_foreign_check *r = &ranges[i];
        if (r->file < 0 || r->file >= num_files || r->offset < 0 || r->bytes < 0)
            status = tp_fail(TP_ERR_ARG, "checksum range %d: file %d, bytes %lld at %lld", i, r->file, (long long)r->bytes,
                             (long long)r->offset);
        fc->checks[i].range = *r;
        if (!status && !(fc->checks[i].name = strdup(r->name ? r->name : "?")))
            status = tp_fail(TP_ERR_NOMEM, "out of memory");
        fc->count = i + 1;
    }
    if (!status) qsort(fc->checks, (size_t)fc->count, sizeof *fc->checks, by_file_and_offset);
    /* One entry's range per storage: ranges of one file must not overlap
     * (two tensors sharing a storage give it once). Names move to the kept. */
    int kept = 0;
    for (int i = 0; i < fc->count && !status; i++) {
        check_state *c = &fc->checks[i], *last = kept ? &fc->checks[kept - 1] : NULL;
        if (last && last->range.file == c->range.file && c->range.offset < last->range.offset + last->range.bytes) {
            if (c->range.offset != last->range.offset || c->range.bytes != last->range.bytes || c->range.crc32 != last->range.crc32)
                status = tp_fail(TP_ERR_FORMAT, "%s: entries %s and %s overlap", files[c->range.file], last->name, c->name);
            continue;
        }
        if (kept != i) {
            check_state moved = *c;
            c->name = fc->checks[kept].name; /* the slot's old name goes where it can be freed */
            fc->checks[kept] = moved;
        }
        kept++;
    }
    if (!status) {
        for (int i = kept; i < fc->count; i++) free(fc->checks[i].name);
        fc->count = kept;
    }
    if (status) {
        foreign_checks_free(fc);
        return status;
    }
    *out = fc;
    return TP_OK;
}

void foreign_checks_free(foreign_checks *fc)
{
    if (!fc) return;
    for (int i = 0; i < fc->count; i++) free(fc->checks[i].name);
    for (int f = 0; fc->files && f < fc->num_files; f++) free(fc->files[f]);
    free(fc->files);
    free(fc->checks);
    pthread_mutex_destroy(&fc->lock);
    free(fc);
}

static int mismatch(const foreign_checks *fc, const check_state *c)
{
    return tp_fail(TP_ERR_CHECKSUM, "%s: entry %s: its %lld bytes have CRC-32 %08x, the archive records %08x (data damaged)",
                   fc->files[c->range.file], c->name, (long long)c->range.bytes, c->crc, c->range.crc32);
}

/* Adds bytes [from, from + n) of check c (file offsets), held at data, when
 * they continue what it has: its state after. */
static int extend(const foreign_checks *fc, check_state *c, int64_t from, const unsigned char *data, int64_t n)
{
    if (c->state) return c->state == 1 ? TP_OK : mismatch(fc, c);
    int64_t next = c->range.offset + c->verified;
    if (from > next || from + n <= next) return TP_OK;
    int64_t skip = next - from, end = c->range.offset + c->range.bytes, take = (from + n < end ? from + n : end) - next;
    c->crc = crc32_gzip_refl(c->crc, data + skip, (uint64_t)take);
    c->verified += take;
    if (c->verified < c->range.bytes) return TP_OK;
    c->state = c->crc == c->range.crc32 ? 1 : TP_ERR_CHECKSUM;
    return c->state == 1 ? TP_OK : mismatch(fc, c);
}

/* The first check of file whose range ends after offset. */
static int first_after(const foreign_checks *fc, int file, int64_t offset)
{
    int lo = 0, hi = fc->count;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        const ckpt_foreign_check *r = &fc->checks[mid].range;
        if (r->file < file || (r->file == file && r->offset + r->bytes <= offset)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

int foreign_checks_note(foreign_checks *fc, int file, int64_t offset, const void *data, int64_t n)
{
    if (!fc || n <= 0) return TP_OK;
    int status = TP_OK;
    pthread_mutex_lock(&fc->lock);
    for (int i = first_after(fc, file, offset);
         i < fc->count && fc->checks[i].range.file == file && fc->checks[i].range.offset < offset + n && !status; i++)
        status = extend(fc, &fc->checks[i], offset, data, n);
    pthread_mutex_unlock(&fc->lock);
    return status;
}

int foreign_checks_finish(foreign_checks *fc, int (*read)(void *ctx, int file, void *buf, int64_t n, int64_t offset),
                          void *ctx, int *checked)
{
    if (checked) *checked = 0;
    if (!fc) return TP_OK;
    const int64_t block = (int64_t)1 << 20;
    unsigned char *buf = NULL;
    int status = TP_OK;
    pthread_mutex_lock(&fc->lock);
    for (int i = 0; i < fc->count && !status; i++) {
        check_state *c = &fc->checks[i];
        /* An entry nothing was read of was not used: nothing to check. */
        if (c->state == TP_ERR_CHECKSUM) status = mismatch(fc, c);
        if (c->state || !c->verified) continue;
        if (!buf && !(buf = alloc_pages((size_t)block))) status = tp_fail(TP_ERR_NOMEM, "out of memory");
        while (!status && !c->state) {
            int64_t at = c->range.offset + c->verified, left = c->range.bytes - c->verified;
            int64_t n = left < block ? left : block;
            status = read(ctx, c->range.file, buf, n, at);
            if (!status) status = extend(fc, c, at, buf, n);
        }
    }
    for (int i = 0; i < fc->count && checked; i++) *checked += fc->checks[i].state == 1;
    pthread_mutex_unlock(&fc->lock);
    free(buf);
    return status;
}
