/* Reading in place (ckpt/mapped.c, the POSIX store's mappings, the reader's
 * views) and writing gathered parts: the same bytes, checks and digests as
 * reading through positioned reads; a source truncated before or while it
 * is mapped fails the read or the write naming the file, and the process
 * lives; a SIGBUS that is not a mapped read still kills; the pages mapped
 * stay few. Each test works in its own temporary directory. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../ckpt/ckpt.h"
#include "../support/fixture.h"

TestSuite(mapped, .init = make_dir, .fini = remove_dir);

/* The POSIX store without mappings: every read through read_at. */
static ckpt_storage read_through;

static ckpt_reader *open_reader(const char *path, int mapped, int verify)
{
    ckpt_read_options options;
    ckpt_read_options_init(&options);
    options.verify = verify;
    if (!mapped) {
        read_through = *ckpt_storage_posix();
        read_through.map = NULL;
        options.storage = &read_through;
    }
    ckpt_reader *r;
    cr_assert_eq(ckpt_reader_open(&r, path, &options), TP_OK, "%s", tp_errmsg());
    return r;
}

/* A tensor of many checksum blocks (3.6 MB, fp32) beside random small ones. */
static int some_tensors(test_tensor *tensors, int max, int tp)
{
    int n = random_tensors(tensors, max - 1, &tp, 1, 2);
    test_tensor *big = &tensors[n];
    memset(big, 0, sizeof *big);
    strcpy(big->name, "model/big.weight");
    big->desc = (ckpt_tensor_desc){.name = big->name, .dtype = TP_FP32, .ndim = 2, .shape = {3000, 300},
                                   .anchor = CKPT_ANCHOR_FIRST};
    big->desc.partition = (ckpt_partition){CKPT_SPLIT, 0, 0, {0}, 0, 0, 0};
    size_t bytes = 3000 * 300 * 4;
    big->logical = malloc(bytes);
    for (size_t b = 0; b < bytes; b++) big->logical[b] = (uint8_t)next_random();
    return n + 1;
}

static int64_t row_bytes_of(const ckpt_piece_info *info, const ckpt_tensor_desc *d)
{
    int64_t row = (int64_t)tp_dtype_size(d->dtype);
    for (int k = 1; k < d->ndim; k++) row *= info->shape[k];
    return row;
}

Test(mapped, in_place_reads_equal_positioned_reads)
{
    for (int iter = 0; iter < 6; iter++) {
        ckpt_layout layout = {(int)rnd(1, 3), 1, 1, 2};
        test_tensor tensors[8];
        int n = some_tensors(tensors, 8, layout.tp);
        char path[600];
        snprintf(path, sizeof path, "%s/ck%d", dir, iter);
        int compress = iter == 5 ? 3 : 0;
        write_tensors(path, &layout, tensors, n, compress, 1);
        int verify = iter % 2;
        ckpt_reader *in_place = open_reader(path, 1, verify), *through = open_reader(path, 0, verify);
        for (int i = 0; i < n; i++) {
            int k = ckpt_reader_find(in_place, tensors[i].name);
            const ckpt_tensor_desc *d = ckpt_reader_tensor(in_place, k);
            cr_assert_eq(ckpt_reader_digest(in_place, k), ckpt_reader_digest(through, k));
            for (int p = 0; p < ckpt_piece_count(d, layout.tp); p++) {
                ckpt_piece_info info;
                cr_assert_eq(ckpt_reader_piece_info(in_place, k, p, &info), TP_OK);
                int64_t row = row_bytes_of(&info, d), rows = info.shape[0];
                uint8_t *a = malloc((size_t)info.bytes), *b = malloc((size_t)info.bytes);
                cr_assert_eq(ckpt_reader_read_piece(in_place, k, p, a, (size_t)info.bytes), TP_OK, "%s", tp_errmsg());
                cr_assert_eq(ckpt_reader_read_piece(through, k, p, b, (size_t)info.bytes), TP_OK, "%s", tp_errmsg());
                cr_assert_eq(memcmp(a, b, (size_t)info.bytes), 0, "piece %d of %s", p, d->name);
                cr_assert_eq(ckpt_reader_verify_piece(in_place, k, p), TP_OK, "%s", tp_errmsg());
                cr_assert_eq(ckpt_reader_check_padding(in_place, k, p), TP_OK, "%s", tp_errmsg());
                /* Rows anywhere, and their views: in place unless compressed, never read through. */
                for (int q = 0; q < 8; q++) {
                    int64_t r0 = rnd(0, rows - 1), count = rnd(1, rows - r0);
                    memset(b, 0xAB, (size_t)info.bytes);
                    cr_assert_eq(ckpt_reader_read_rows(in_place, k, p, r0, count, b, (size_t)info.bytes), TP_OK, "%s",
                                 tp_errmsg());
                    cr_assert_eq(memcmp(a + r0 * row, b, (size_t)(count * row)), 0, "rows %lld+%lld of %s",
                                 (long long)r0, (long long)count, d->name);
                    const void *view = (const void *)1;
                    cr_assert_eq(ckpt_reader_view_rows(in_place, k, p, r0, count, &view), TP_OK, "%s", tp_errmsg());
                    cr_assert_eq(view == NULL, compress != 0, "a view where uncompressed");
                    if (view) cr_assert_eq(memcmp(view, a + r0 * row, (size_t)(count * row)), 0, "view of %s", d->name);
                    view = (const void *)1;
                    cr_assert_eq(ckpt_reader_view_rows(through, k, p, r0, count, &view), TP_OK, "%s", tp_errmsg());
                    cr_assert_null(view, "no view without a mapping");
                }
                free(a);
                free(b);
            }
            /* A random box of the logical tensor. */
            int64_t start[CKPT_MAX_DIMS], count[CKPT_MAX_DIMS];
            for (int dd = 0; dd < d->ndim; dd++) {
                start[dd] = rnd(0, d->shape[dd] - 1);
                count[dd] = rnd(1, d->shape[dd] - start[dd]);
            }
            size_t bytes = (size_t)elements_of(count, d->ndim) * tp_dtype_size(d->dtype);
            uint8_t *want = malloc(bytes), *got = malloc(bytes);
            extract(&tensors[i], start, count, want);
            cr_assert_eq(ckpt_reader_read_region(in_place, k, start, count, got, bytes), TP_OK, "%s", tp_errmsg());
            cr_assert_eq(memcmp(want, got, bytes), 0, "region of %s", d->name);
            free(want);
            free(got);
        }
        ckpt_reader_close(in_place);
        ckpt_reader_close(through);
        for (int i = 0; i < n; i++) free(tensors[i].logical);
    }
}

/* A damaged block is found in place, on every read: only blocks that
 * matched are taken as checked. */
Test(mapped, damage_is_found_in_place)
{
    ckpt_layout layout = {1, 1, 1, 2};
    test_tensor tensors[8];
    int n = some_tensors(tensors, 8, 1);
    char path[600], shard[700];
    snprintf(path, sizeof path, "%s/ck", dir);
    write_tensors(path, &layout, tensors, n, 0, 1);
    snprintf(shard, sizeof shard, "%s/shard_pp00_tp00.h5", path);
    /* Row 2000 of the big tensor (a later block), found by its random bytes. */
    int fd = open(shard, O_RDWR);
    cr_assert(fd >= 0);
    struct stat st;
    cr_assert_eq(fstat(fd, &st), 0);
    uint8_t *file = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    cr_assert(file != MAP_FAILED);
    uint8_t *at = memmem(file, (size_t)st.st_size, tensors[n - 1].logical + 2000 * 1200, 1200);
    cr_assert_not_null(at, "row 2000 found in the file");
    at[17] ^= 0x40;
    munmap(file, (size_t)st.st_size);
    close(fd);
    ckpt_reader *r = open_reader(path, 1, 1);
    int k = ckpt_reader_find(r, "model/big.weight");
    static uint8_t rows[20 * 1200];
    const void *view;
    for (int again = 0; again < 2; again++) {
        cr_assert_eq(ckpt_reader_read_rows(r, k, 0, 1990, 20, rows, sizeof rows), TP_ERR_CHECKSUM);
        cr_assert(strstr(tp_errmsg(), "shard_pp00_tp00.h5") && strstr(tp_errmsg(), "model/big.weight"), "%s",
                  tp_errmsg());
        cr_assert_eq(ckpt_reader_view_rows(r, k, 0, 2000, 1, &view), TP_ERR_CHECKSUM);
    }
    cr_assert_eq(ckpt_reader_read_rows(r, k, 0, 0, 10, rows, sizeof rows), TP_OK, "the first block is intact");
    cr_assert_eq(ckpt_reader_verify_piece(r, k, 0), TP_ERR_CHECKSUM);
    ckpt_reader_close(r);
    for (int i = 0; i < n; i++) free(tensors[i].logical);
}

static void simple(const char *path, test_tensor *tensors, int *n)
{
    ckpt_layout layout = {1, 1, 1, 2};
    *n = some_tensors(tensors, 4, 1);
    write_tensors(path, &layout, tensors, *n, 0, 1);
}

static void shorten(const char *file, off_t size)
{
    cr_assert_eq(truncate(file, size), 0);
}

/* Truncated after the reader opened, before its first read of the file:
 * the mapping is refused for the size, and the read fails naming the file. */
Test(mapped, truncated_before_mapping)
{
    char path[600], shard[700];
    snprintf(path, sizeof path, "%s/ck", dir);
    test_tensor tensors[4];
    int n;
    simple(path, tensors, &n);
    snprintf(shard, sizeof shard, "%s/shard_pp00_tp00.h5", path);
    ckpt_reader *r = open_reader(path, 1, 1);
    struct stat st;
    stat(shard, &st);
    shorten(shard, st.st_size - 4096);
    int k = ckpt_reader_find(r, "model/big.weight");
    static uint8_t piece[3000 * 1200];
    int status = ckpt_reader_read_piece(r, k, 0, piece, sizeof piece);
    cr_assert(status == TP_ERR_FORMAT || status == TP_ERR_CHECKSUM, "status %d: %s", status, tp_errmsg());
    cr_assert(strstr(tp_errmsg(), "shard_pp00_tp00.h5"), "%s", tp_errmsg());
    ckpt_reader_close(r);
    for (int i = 0; i < n; i++) free(tensors[i].logical);
}

/* Truncated while mapped: reads of what it lost fail naming the file. */
Test(mapped, truncated_while_mapped)
{
    char path[600], shard[700];
    snprintf(path, sizeof path, "%s/ck", dir);
    test_tensor tensors[4];
    int n;
    simple(path, tensors, &n);
    snprintf(shard, sizeof shard, "%s/shard_pp00_tp00.h5", path);
    ckpt_reader *r = open_reader(path, 1, 1);
    int k = ckpt_reader_find(r, "model/big.weight");
    static uint8_t piece[3000 * 1200];
    cr_assert_eq(ckpt_reader_read_rows(r, k, 0, 0, 10, piece, sizeof piece), TP_OK, "%s", tp_errmsg());
    shorten(shard, 8192);
    cr_assert_neq(ckpt_reader_read_piece(r, k, 0, piece, sizeof piece), TP_OK);
    cr_assert(strstr(tp_errmsg(), "shard_pp00_tp00.h5") && strstr(tp_errmsg(), "truncated"), "%s", tp_errmsg());
    cr_assert_neq(ckpt_reader_verify_piece(r, k, 0), TP_OK);
    cr_assert(strstr(tp_errmsg(), "shard_pp00_tp00.h5"), "%s", tp_errmsg());
    ckpt_reader_close(r);
    for (int i = 0; i < n; i++) free(tensors[i].logical);
}

/* Views taken, then the source truncated: the writer that reads them fails
 * naming the source (its SIGBUS caught), nothing is written, and a second
 * such failure is caught as well (the signal left unblocked). */
Test(mapped, truncated_under_a_view)
{
    char path[600], shard[700], out[600];
    snprintf(path, sizeof path, "%s/ck", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    test_tensor tensors[4];
    int n;
    simple(path, tensors, &n);
    snprintf(shard, sizeof shard, "%s/shard_pp00_tp00.h5", path);
    ckpt_reader *r = open_reader(path, 1, 1);
    int k = ckpt_reader_find(r, "model/big.weight");
    const void *view[2];
    cr_assert_eq(ckpt_reader_view_rows(r, k, 0, 0, 1500, &view[0]), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(ckpt_reader_view_rows(r, k, 0, 1500, 1500, &view[1]), TP_OK, "%s", tp_errmsg());
    cr_assert(view[0] && view[1]);
    shorten(shard, 0);
    for (int compress = 0; compress <= 3; compress += 3) {
        ckpt_layout layout = {1, 1, 1, 2};
        ckpt_write_options options;
        ckpt_write_options_init(&options);
        options.compress_level = compress;
        ckpt_writer *w;
        cr_assert_eq(ckpt_writer_create(&w, out, &layout, &options), TP_OK, "%s", tp_errmsg());
        int id;
        cr_assert_eq(ckpt_writer_add_tensor(w, ckpt_reader_tensor(r, k), &id), TP_OK, "%s", tp_errmsg());
        int64_t block = ckpt_writer_block_rows(w, id);
        for (int v = 0; v < 2; v++) {
            ckpt_part part = {view[v], block * 1200};
            cr_assert_eq(ckpt_writer_put_parts(w, id, 0, v * block, block, &part, 1), TP_ERR_IO);
            cr_assert(strstr(tp_errmsg(), "shard_pp00_tp00.h5") && strstr(tp_errmsg(), "could not be read"), "%s",
                      tp_errmsg());
        }
        ckpt_writer_abort(w);
        cr_assert_eq(access(out, F_OK), -1, "nothing written");
    }
    ckpt_reader_close(r);
    for (int i = 0; i < n; i++) free(tensors[i].logical);
}

/* Only faults in mapped reads are caught: any other SIGBUS kills as before. */
Test(mapped, other_faults_still_kill, .signal = SIGBUS)
{
    char path[600], file[700];
    snprintf(path, sizeof path, "%s/ck", dir);
    test_tensor tensors[4];
    int n;
    simple(path, tensors, &n);
    ckpt_reader *r = open_reader(path, 1, 1);
    static uint8_t piece[3000 * 1200];
    cr_assert_eq(ckpt_reader_read_rows(r, ckpt_reader_find(r, "model/big.weight"), 0, 0, 10, piece, sizeof piece),
                 TP_OK, "a mapping made: the library's handler is installed");
    snprintf(file, sizeof file, "%s/other", dir);
    int fd = open(file, O_RDWR | O_CREAT, 0644);
    cr_assert_eq(ftruncate(fd, 8192), 0);
    volatile char *bytes = mmap(NULL, 8192, PROT_READ, MAP_SHARED, fd, 0);
    cr_assert(bytes != MAP_FAILED);
    cr_assert_eq(ftruncate(fd, 0), 0);
    char c = bytes[4096]; /* dies here */
    cr_assert_fail("read %d past the end of a truncated file without SIGBUS", c);
}

/* Parts split anywhere on row boundaries write what the rows write: the
 * same checksums and digests, uncompressed and compressed, from memory and
 * from views of a mapped source. */
Test(mapped, parts_write_as_rows)
{
    char path[600];
    snprintf(path, sizeof path, "%s/src", dir);
    test_tensor tensors[4];
    int n;
    simple(path, tensors, &n);
    ckpt_reader *r = open_reader(path, 1, 1);
    int k = ckpt_reader_find(r, "model/big.weight");
    const ckpt_tensor_desc *d = ckpt_reader_tensor(r, k);
    int64_t rows = 3000, row = 1200;
    const uint8_t *data = tensors[n - 1].logical;
    ckpt_piece_info src_info;
    cr_assert_eq(ckpt_reader_piece_info(r, k, 0, &src_info), TP_OK);
    for (int compress = 0; compress <= 3; compress += 3) {
        for (int from_views = 0; from_views < 2; from_views++) {
            char out[600];
            snprintf(out, sizeof out, "%s/out%d%d", dir, compress, from_views);
            ckpt_layout layout = {1, 1, 1, 2};
            ckpt_write_options options;
            ckpt_write_options_init(&options);
            options.compress_level = compress;
            ckpt_writer *w;
            cr_assert_eq(ckpt_writer_create(&w, out, &layout, &options), TP_OK, "%s", tp_errmsg());
            int id;
            cr_assert_eq(ckpt_writer_add_tensor(w, d, &id), TP_OK, "%s", tp_errmsg());
            int64_t block = ckpt_writer_block_rows(w, id);
            for (int64_t start = 0; start < rows; start += 2 * block) {
                int64_t count = start + 2 * block < rows ? 2 * block : rows - start;
                ckpt_part parts[16];
                int m = 0;
                for (int64_t at = start; at < start + count;) {
                    int64_t take = m == 15 ? start + count - at : rnd(1, start + count - at);
                    const void *view = data + at * row;
                    if (from_views)
                        cr_assert_eq(ckpt_reader_view_rows(r, k, 0, at, take, &view), TP_OK, "%s", tp_errmsg());
                    parts[m++] = (ckpt_part){view, take * row};
                    at += take;
                }
                cr_assert_eq(ckpt_writer_put_parts(w, id, 0, start, count, parts, m), TP_OK, "%s", tp_errmsg());
            }
            ckpt_train_state state = {1, 8, "{\"arch\":\"test\"}", NULL, "[{\"rank\":0}]", NULL};
            cr_assert_eq(ckpt_writer_commit(w, &state), TP_OK, "%s", tp_errmsg());
            ckpt_reader *o = open_reader(out, 1, 1);
            ckpt_piece_info info;
            cr_assert_eq(ckpt_reader_piece_info(o, 0, 0, &info), TP_OK);
            cr_assert_eq(info.checksum, src_info.checksum, "the rows' checksum");
            cr_assert_eq(info.digest, src_info.digest, "the rows' digest");
            cr_assert_eq(ckpt_reader_verify_piece(o, 0, 0), TP_OK, "%s", tp_errmsg());
            ckpt_reader_close(o);
        }
    }
    /* Parts that are not whole rows, or do not add up, are refused. */
    char out[600];
    snprintf(out, sizeof out, "%s/bad", dir);
    ckpt_layout layout = {1, 1, 1, 2};
    ckpt_writer *w;
    cr_assert_eq(ckpt_writer_create(&w, out, &layout, NULL), TP_OK, "%s", tp_errmsg());
    int id;
    cr_assert_eq(ckpt_writer_add_tensor(w, d, &id), TP_OK, "%s", tp_errmsg());
    int64_t block = ckpt_writer_block_rows(w, id);
    ckpt_part half[2] = {{data, block * row / 2 + 4}, {data + block * row / 2 + 4, block * row / 2 - 4}};
    cr_assert_eq(ckpt_writer_put_parts(w, id, 0, 0, block, half, 2), TP_ERR_ARG);
    ckpt_part short_part = {data, (block - 1) * row};
    cr_assert_eq(ckpt_writer_put_parts(w, id, 0, 0, block, &short_part, 1), TP_ERR_ARG);
    ckpt_writer_abort(w);
    ckpt_reader_close(r);
    for (int i = 0; i < n; i++) free(tensors[i].logical);
}

static long resident_file_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "RssFile: %ld kB", &kib) == 1) break;
    if (f) fclose(f);
    return kib;
}

/* Reading 64 MB in place leaves few of its pages in the process's memory. */
Test(mapped, pages_read_in_place_are_let_go)
{
    char path[600];
    snprintf(path, sizeof path, "%s/ck", dir);
    test_tensor t;
    memset(&t, 0, sizeof t);
    strcpy(t.name, "model/huge.weight");
    t.desc = (ckpt_tensor_desc){.name = t.name, .dtype = TP_FP32, .ndim = 2, .shape = {16384, 1024},
                                .anchor = CKPT_ANCHOR_FIRST};
    size_t bytes = (size_t)16384 * 1024 * 4;
    t.logical = malloc(bytes);
    for (size_t b = 0; b < bytes; b += 4096) t.logical[b] = (uint8_t)next_random();
    ckpt_layout layout = {1, 1, 1, 1};
    write_tensors(path, &layout, &t, 1, 0, 1);
    ckpt_reader *r = open_reader(path, 1, 1);
    static uint8_t rows[1 << 20];
    long before = resident_file_kib(), most = before;
    for (int64_t row = 0; row < 16384; row += 256) {
        cr_assert_eq(ckpt_reader_read_rows(r, 0, 0, row, 256, rows, sizeof rows), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(memcmp(rows, t.logical + row * 4096, sizeof rows), 0);
        long now = resident_file_kib();
        most = now > most ? now : most;
    }
    cr_assert_eq(ckpt_reader_verify_piece(r, 0, 0), TP_OK, "%s", tp_errmsg());
    long now = resident_file_kib();
    most = now > most ? now : most;
    cr_assert(most - before < 32 * 1024, "%ld KiB of the file resident at most (of 65536)", most - before);
    ckpt_reader_close(r);
    free(t.logical);
}
