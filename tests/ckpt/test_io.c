/* Writer and reader: round trips over random tensors and layouts, region
 * reads against a naive extraction, corruption, versions, atomicity and
 * distributed writing. Each test works in its own temporary directory. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <hdf5.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../ckpt/ckpt.h"
#include "../../ckpt/commit.h"
#include "../../store/store.h"
#include "../support/fixture.h"

TestSuite(io, .init = make_dir, .fini = remove_dir);

static void check_reads(const char *path, const ckpt_layout *layout, test_tensor *tensors, int n, int verify)
{
    ckpt_read_options options;
    ckpt_read_options_init(&options);
    options.verify = verify;
    ckpt_reader *r;
    cr_assert_eq(ckpt_reader_open(&r, path, &options), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(ckpt_reader_num_tensors(r), n);
    cr_assert_eq(ckpt_reader_layout(r)->tp, layout->tp);
    cr_assert_eq(ckpt_reader_layout(r)->pp, layout->pp);
    for (int i = 0; i < n; i++) {
        const test_tensor *t = &tensors[i];
        int k = ckpt_reader_find(r, t->name);
        cr_assert(k >= 0, "tensor %s listed", t->name);
        const ckpt_tensor_desc *d = ckpt_reader_tensor(r, k);
        cr_assert_eq(d->dtype, t->desc.dtype);
        cr_assert_eq(d->ndim, t->desc.ndim);
        cr_assert_eq(d->partition.kind, t->desc.partition.kind);
        cr_assert_eq(ckpt_tensor_stage(d, layout), ckpt_tensor_stage(&t->desc, layout));
        cr_assert_eq(ckpt_reader_digest(r, k),
                     naive_digest(t->logical, tp_dtype_size(t->desc.dtype), elements_of(t->desc.shape, t->desc.ndim)),
                     "logical digest of %s", t->name);
        size_t es = tp_dtype_size(t->desc.dtype);
        int64_t pshape[CKPT_MAX_DIMS];
        ckpt_piece_shape(&t->desc, layout->tp, pshape);
        size_t piece_bytes = (size_t)elements_of(pshape, t->desc.ndim) * es;
        uint8_t *want = malloc(piece_bytes), *got = malloc(piece_bytes);
        for (int p = 0; p < ckpt_piece_count(&t->desc, layout->tp); p++) {
            build_piece(&t->desc, layout->tp, p, t->logical, want);
            memset(got, 0xAB, piece_bytes);
            cr_assert_eq(ckpt_reader_read_piece(r, k, p, got, piece_bytes), TP_OK, "%s", tp_errmsg());
            cr_assert_eq(memcmp(want, got, piece_bytes), 0, "piece %d of %s", p, t->name);
            cr_assert_eq(ckpt_reader_verify_piece(r, k, p), TP_OK, "%s", tp_errmsg());
            cr_assert_eq(ckpt_reader_check_padding(r, k, p), TP_OK, "%s", tp_errmsg());
        }
        free(want);
        free(got);
        /* The whole logical tensor and random boxes of it. */
        for (int q = 0; q < 12; q++) {
            int64_t start[CKPT_MAX_DIMS], count[CKPT_MAX_DIMS];
            for (int dd = 0; dd < t->desc.ndim; dd++) {
                start[dd] = q == 0 ? 0 : rnd(0, t->desc.shape[dd] - 1);
                count[dd] = q == 0 ? t->desc.shape[dd] : rnd(1, t->desc.shape[dd] - start[dd]);
            }
            size_t bytes = (size_t)elements_of(count, t->desc.ndim) * es;
            uint8_t *expect = malloc(bytes), *region = malloc(bytes);
            extract(t, start, count, expect);
            cr_assert_eq(ckpt_reader_read_region(r, k, start, count, region, bytes), TP_OK, "%s",
                         tp_errmsg());
            cr_assert_eq(memcmp(expect, region, bytes), 0, "region %d of %s", q, t->name);
            free(expect);
            free(region);
        }
    }
    const ckpt_train_state *state = ckpt_reader_state(r);
    cr_assert_eq(state->consumed_samples, state->step * 8);
    cr_assert_str_eq(state->model_json, "{\"arch\":\"test\"}");
    cr_assert_str_eq(state->rng_json, "[{\"rank\":0}]");
    ckpt_reader_close(r);
}

Test(io, random_round_trips)
{
    for (int iter = 0; iter < 24; iter++) {
        ckpt_layout layout = {(int)rnd(1, 4), (int)rnd(1, 3), 1, 0, 1};
        layout.num_layers = layout.pp * rnd(1, 3);
        test_tensor tensors[10];
        int n = random_tensors(tensors, 10, &layout.tp, 1, layout.num_layers);
        char path[600];
        snprintf(path, sizeof path, "%s/ckpt%d", dir, iter);
        int compress = iter % 3 == 2 ? 3 : 0;
        write_tensors(path, &layout, tensors, n, compress, iter);
        check_reads(path, &layout, tensors, n, iter % 2);
        for (int i = 0; i < n; i++) free(tensors[i].logical);
    }
}

/* A tensor with many blocks, so reads cross block boundaries, and its
 * compressed twin. */
Test(io, multi_block_regions)
{
    ckpt_layout layout = {2, 1, 1, 1, 1};
    test_tensor tensors[2];
    for (int i = 0; i < 2; i++) {
        memset(&tensors[i], 0, sizeof tensors[i]);
        snprintf(tensors[i].name, sizeof tensors[i].name, "model/big%d", i);
        tensors[i].desc = (ckpt_tensor_desc){.name = tensors[i].name, .dtype = TP_FP32, .ndim = 2,
                                             .shape = {3000, 300}, .anchor = CKPT_ANCHOR_FIRST};
        tensors[i].desc.partition = (ckpt_partition){CKPT_SPLIT, i, 0, {0}, 0, 0, 0};
        size_t bytes = 3000 * 300 * 4;
        tensors[i].logical = malloc(bytes);
        for (size_t b = 0; b < bytes; b++) tensors[i].logical[b] = (uint8_t)next_random();
    }
    for (int compress = 0; compress <= 1; compress++) {
        char path[600];
        snprintf(path, sizeof path, "%s/big%d", dir, compress);
        write_tensors(path, &layout, tensors, 2, compress, 5);
        check_reads(path, &layout, tensors, 2, 1);
        check_reads(path, &layout, tensors, 2, 0);
    }
    for (int i = 0; i < 2; i++) free(tensors[i].logical);
}

Test(io, digest_sees_every_change)
{
    uint32_t values[10000];
    for (int i = 0; i < 10000; i++) values[i] = (uint32_t)next_random();
    uint64_t base = ckpt_digest_run(values, 4, 0, 10000);
    cr_assert_eq(base, naive_digest((uint8_t *)values, 4, 10000));
    cr_assert_eq(base, ckpt_digest_run(values, 4, 0, 4000) + ckpt_digest_run(values + 4000, 4, 4000, 6000),
                 "parts add up");
    for (int i = 0; i < 10000; i += 97) {
        uint32_t saved = values[i];
        values[i] ^= 1u << (i % 32);
        cr_assert_neq(ckpt_digest_run(values, 4, 0, 10000), base, "flip in element %d", i);
        values[i] = saved;
    }
    uint32_t a = values[10], b = values[4106]; /* same key position, other block */
    values[10] = b, values[4106] = a;
    cr_assert_neq(ckpt_digest_run(values, 4, 0, 10000), base, "swapped elements");
}

/* ------------------------------------------------------------- damage */

static void simple_checkpoint(const char *path, int64_t step)
{
    ckpt_layout layout = {2, 1, 1, 2, 1};
    static uint8_t data[2][4096 * 4];
    for (size_t b = 0; b < sizeof data; b++) ((uint8_t *)data)[b] = (uint8_t)(b * 7 + (size_t)step);
    test_tensor t[2];
    memset(t, 0, sizeof t);
    strcpy(t[0].name, "model/a.weight");
    strcpy(t[1].name, "model/b.bias");
    t[0].desc = (ckpt_tensor_desc){.name = t[0].name, .dtype = TP_FP32, .ndim = 2, .shape = {64, 64},
                                   .anchor = CKPT_ANCHOR_LAYER, .layer = 1};
    t[0].desc.partition = (ckpt_partition){CKPT_SPLIT, 0, 0, {0}, 0, 0, 0};
    t[1].desc = (ckpt_tensor_desc){.name = t[1].name, .dtype = TP_BF16, .ndim = 1, .shape = {4096},
                                   .anchor = CKPT_ANCHOR_FIRST};
    t[0].logical = data[0];
    t[1].logical = data[1];
    write_tensors(path, &layout, t, 2, 0, step);
}

/* File offset of a tensor's data in a shard, through HDF5. */
static long data_offset(const char *file, const char *tensor)
{
    hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    char path[256];
    snprintf(path, sizeof path, "/tensors/%s", tensor);
    hid_t d = H5Dopen2(f, path, H5P_DEFAULT);
    long offset = (long)H5Dget_offset(d);
    H5Dclose(d);
    H5Fclose(f);
    return offset;
}

static void flip_byte(const char *file, long offset)
{
    int fd = open(file, O_RDWR);
    unsigned char c;
    cr_assert_eq(pread(fd, &c, 1, offset), 1);
    c ^= 0x10;
    cr_assert_eq(pwrite(fd, &c, 1, offset), 1);
    close(fd);
}

Test(io, flipped_byte_is_named)
{
    char path[600], shard[700];
    snprintf(path, sizeof path, "%s/step_00000001", dir);
    simple_checkpoint(path, 1);
    snprintf(shard, sizeof shard, "%s/shard_pp00_tp01.h5", path);
    flip_byte(shard, data_offset(shard, "model/a.weight") + 100);
    ckpt_reader *r;
    cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_OK, "%s", tp_errmsg());
    int k = ckpt_reader_find(r, "model/a.weight");
    cr_assert_eq(ckpt_reader_verify_piece(r, k, 0), TP_OK, "the other piece is intact");
    cr_assert_eq(ckpt_reader_verify_piece(r, k, 1), TP_ERR_CHECKSUM);
    cr_assert(strstr(tp_errmsg(), "model/a.weight") && strstr(tp_errmsg(), "shard_pp00_tp01.h5"),
              "message names tensor and file: %s", tp_errmsg());
    float buf[64 * 64];
    int64_t start[2] = {0, 0}, count[2] = {64, 64};
    cr_assert_eq(ckpt_reader_read_region(r, k, start, count, buf, sizeof buf), TP_ERR_CHECKSUM);
    ckpt_reader_close(r);
    ckpt_read_options no_verify = {0};
    cr_assert_eq(ckpt_reader_open(&r, path, &no_verify), TP_OK);
    cr_assert_eq(ckpt_reader_read_region(r, k, start, count, buf, sizeof buf), TP_OK,
                 "without verification the damaged data is returned");
    ckpt_reader_close(r);
}

static void add_bytes(void *total, int64_t bytes) { __atomic_add_fetch((int64_t *)total, bytes, __ATOMIC_RELAXED); }

/* ckpt_verify checks every piece, on several threads, and lists each
 * damaged one; an intact checkpoint has none. */
Test(io, verify_lists_every_damaged_piece)
{
    char path[600], shard[700];
    snprintf(path, sizeof path, "%s/step_00000001", dir);
    simple_checkpoint(path, 1);
    ckpt_reader *r;
    cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_OK, "%s", tp_errmsg());
    int64_t seen = 0;
    ckpt_verify_options options = {3, add_bytes, &seen};
    ckpt_verify_result result;
    cr_assert_eq(ckpt_verify(r, &options, &result), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(result.damaged, 0);
    cr_assert_eq(result.pieces, 3, "a split weight in 2 pieces, a replicated bias in 1");
    cr_assert_eq(result.bytes, 64 * 64 * 4 + 4096 * 2);
    cr_assert_eq(seen, result.bytes, "progress saw every byte");
    ckpt_verify_result_free(&result);
    ckpt_reader_close(r);

    /* The weight's piece on tp rank 1, the bias (kept by tp rank 0). */
    snprintf(shard, sizeof shard, "%s/shard_pp00_tp01.h5", path);
    flip_byte(shard, data_offset(shard, "model/a.weight") + 100);
    snprintf(shard, sizeof shard, "%s/shard_pp00_tp00.h5", path);
    flip_byte(shard, data_offset(shard, "model/b.bias") + 10);
    cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(ckpt_verify(r, NULL, &result), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(result.damaged, 2);
    for (int i = 0; i < 2; i++) {
        const ckpt_damage *d = &result.damage[i];
        const char *name = ckpt_reader_tensor(r, d->tensor)->name;
        int weight = strcmp(name, "model/a.weight") == 0;
        cr_assert_eq(d->piece, weight ? 1 : 0, "%s piece %d", name, d->piece);
        cr_assert_eq(d->status, TP_ERR_CHECKSUM);
        cr_assert(strstr(d->message, weight ? "shard_pp00_tp01.h5" : "shard_pp00_tp00.h5"), "%s", d->message);
        cr_assert(strstr(d->message, name), "%s", d->message);
    }
    cr_assert_neq(result.damage[0].tensor, result.damage[1].tensor);
    ckpt_verify_result_free(&result);
    ckpt_reader_close(r);
}

/* What the heap holds now (glibc's count over every arena, mapped blocks
 * included), and the most a progress call saw above it. */
static size_t heap_in_use(void)
{
    struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
}

typedef struct {
    size_t base, peak;
    int64_t calls;
} heap_watch;

static void watch_heap(void *ctx, int64_t bytes)
{
    (void)bytes;
    heap_watch *w = ctx;
    size_t now = heap_in_use();
    if (now > w->peak) w->peak = now;
    w->calls++;
}

/* A verify of many pieces holds little for each (it kept a 1 KiB message
 * buffer for every piece, damaged or not: 43 MB at 41,505 pieces), and no
 * HDF5 handle of a file whose pieces are all loaded (libhdf5 keeps about
 * half a MiB an open file: 16 MiB at 32 files). Both took `tp-ckpt verify
 * --memory-limit 64M` of a 9,228-tensor checkpoint to 110 MiB. */
Test(io, verify_holds_little_per_piece_and_no_finished_file)
{
    enum { TENSORS = 1500 };
    char path[600];
    snprintf(path, sizeof path, "%s/step_00000001", dir);
    ckpt_layout layout = {2, 1, 1, 2, 1};
    test_tensor *t = calloc(TENSORS, sizeof *t);
    static uint8_t data[4 * 8 * 4];
    for (int i = 0; i < TENSORS; i++) {
        snprintf(t[i].name, sizeof t[i].name, "model/t%04d.weight", i);
        t[i].desc = (ckpt_tensor_desc){.name = t[i].name, .dtype = TP_FP32, .ndim = 2, .shape = {4, 8},
                                       .anchor = CKPT_ANCHOR_LAYER, .layer = i % 2};
        t[i].desc.partition = (ckpt_partition){CKPT_SPLIT, 0, 0, {0}, 0, 0, 0};
        t[i].logical = data;
    }
    write_tensors(path, &layout, t, TENSORS, 0, 1);
    free(t);
    ckpt_reader *r;
    cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_OK, "%s", tp_errmsg());
    heap_watch watch = {heap_in_use(), 0, 0};
    ckpt_verify_options options = {1, watch_heap, &watch};
    ckpt_verify_result result;
    cr_assert_eq(ckpt_verify(r, &options, &result), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(result.pieces, 2 * TENSORS);
    cr_assert_eq(result.damaged, 0);
    cr_assert_eq(watch.calls, 2 * TENSORS);
    /* 3,000 pieces: 3.2 MB of message buffers before, beside one HDF5 file
     * open at a time (two, shortly, where verify goes from one to the next). */
    size_t grew = watch.peak > watch.base ? watch.peak - watch.base : 0;
    cr_assert_lt(grew, (size_t)(1536 << 10), "verify's heap grew by %zu bytes over %lld pieces", grew,
                 (long long)result.pieces);
    cr_assert_eq(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_FILE), 0, "HDF5 files left open after every piece was "
                 "loaded: %zd", H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_FILE));
    ckpt_verify_result_free(&result);
    ckpt_reader_close(r);
}

/* A reader keeps at most 16 HDF5 handles open (about 0.8 MiB each): an
 * export reads every file's weights and leaves its optimizer's pieces
 * unloaded, so each of 32 files' handles stayed open (63 MiB at
 * --memory-limit 56M). Tensors read stage after stage, over 32 files, come
 * back whole, with handles closed and opened again as they go round. */
Test(io, hdf5_handles_stay_few_and_reopen)
{
    enum { STAGES = 8, TENSORS = 3 * STAGES };
    char path[600];
    snprintf(path, sizeof path, "%s/step_00000001", dir);
    ckpt_layout layout = {4, STAGES, 1, STAGES, 1};
    test_tensor t[TENSORS];
    static float data[TENSORS][8 * 4];
    memset(t, 0, sizeof t);
    for (int i = 0; i < TENSORS; i++) {
        for (int e = 0; e < 8 * 4; e++) data[i][e] = (float)(i * 100 + e);
        snprintf(t[i].name, sizeof t[i].name, "model/t%02d.weight", i);
        t[i].desc = (ckpt_tensor_desc){.name = t[i].name, .dtype = TP_FP32, .ndim = 2, .shape = {8, 4},
                                       .anchor = CKPT_ANCHOR_LAYER, .layer = i % STAGES};
        t[i].desc.partition = (ckpt_partition){CKPT_SPLIT, 0, 0, {0}, 0, 0, 0};
        t[i].logical = (uint8_t *)data[i];
    }
    write_tensors(path, &layout, t, TENSORS, 0, 1);
    ckpt_reader *r;
    cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_OK, "%s", tp_errmsg());
    /* Twice round the stages, skipping the last third (as an export skips
     * the moments): no file's pieces all loaded, so none closed for that. */
    ssize_t most = 0;
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < 2 * STAGES; i++) {
            int k = ckpt_reader_find(r, t[i].name);
            float got[8 * 4];
            int64_t start[2] = {0, 0}, count[2] = {8, 4};
            cr_assert_eq(ckpt_reader_read_region(r, k, start, count, got, sizeof got), TP_OK, "%s", tp_errmsg());
            cr_assert(!memcmp(got, data[i], sizeof got), "%s read back otherwise", t[i].name);
            ssize_t open_now = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_FILE);
            if (open_now > most) most = open_now;
        }
    cr_assert_eq(most, 16, "at most 16 of the 32 files open with HDF5 at once, and all 16 used: %zd", most);
    ckpt_reader_close(r);
}

/* The first progress call: a request to an object store given up on
 * (nothing listens on port 1, and TP_REMOTE_RETRIES=0), as a thread of the
 * process other than verify's makes one (a lease's renewal, an upload). */
static void give_up_once(void *ctx, int64_t bytes)
{
    (void)bytes;
    int *done = ctx;
    if (*done) return;
    *done = 1;
    char *text = NULL;
    int64_t size = 0;
    cr_assert_neq(store_read_text_file("http://127.0.0.1:1/tp-test/lease", 1024, &text, &size), TP_OK);
    free(text);
}

/* verify's early stop (a store that failed a piece through every retry) is
 * a remote checkpoint's, decided by what failed the piece: a request given
 * up on elsewhere in the process (before: any since verify began) made a
 * local checkpoint's later pieces "not read: the store failed", as damage,
 * once one piece was damaged. */
Test(io, verify_early_stop_ignores_other_requests)
{
    setenv("TP_REMOTE_RETRIES", "0", 1);
    char path[600], shard[700];
    snprintf(path, sizeof path, "%s/step_00000001", dir);
    ckpt_layout layout = {2, 1, 1, 2, 1};
    static uint8_t data[3][64 * 64 * 4];
    for (size_t b = 0; b < sizeof data; b++) ((uint8_t *)data)[b] = (uint8_t)(b * 13);
    test_tensor t[3];
    memset(t, 0, sizeof t);
    for (int i = 0; i < 3; i++) {
        snprintf(t[i].name, sizeof t[i].name, "model/%c.weight", 'a' + i);
        t[i].desc = (ckpt_tensor_desc){.name = t[i].name, .dtype = TP_FP32, .ndim = 2, .shape = {64, 64},
                                       .anchor = CKPT_ANCHOR_LAYER, .layer = 1};
        t[i].desc.partition = (ckpt_partition){CKPT_SPLIT, 0, 0, {0}, 0, 0, 0};
        t[i].logical = data[i];
    }
    write_tensors(path, &layout, t, 3, 0, 1);
    snprintf(shard, sizeof shard, "%s/shard_pp00_tp00.h5", path);
    flip_byte(shard, data_offset(shard, "model/b.weight") + 100);
    ckpt_reader *r;
    cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_OK, "%s", tp_errmsg());
    long before = store_requests_given_up();
    int done = 0;
    ckpt_verify_options options = {1, give_up_once, &done};
    ckpt_verify_result result;
    cr_assert_eq(ckpt_verify(r, &options, &result), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(store_requests_given_up(), before + 1, "the premise: a request given up on during verify");
    cr_assert_eq(result.pieces, 6);
    for (int64_t i = 0; i < result.damaged; i++)
        cr_assert(!strstr(result.damage[i].message, "not read"), "piece %d of %s: %s", result.damage[i].piece,
                  ckpt_reader_tensor(r, result.damage[i].tensor)->name, result.damage[i].message);
    cr_assert_eq(result.damaged, 1, "the damaged piece alone");
    cr_assert_eq(result.damage[0].status, TP_ERR_CHECKSUM);
    cr_assert(strstr(result.damage[0].message, "model/b.weight"), "%s", result.damage[0].message);
    ckpt_verify_result_free(&result);
    ckpt_reader_close(r);
}

Test(io, future_version_is_refused)
{
    char path[600];
    snprintf(path, sizeof path, "%s/ck", dir);
    simple_checkpoint(path, 1);
    edit_index(path, "\"format_version\":\t\\[1, [0-9]*\\]", "\"format_version\":\t[2, 0]");
    ckpt_reader *r;
    cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_ERR_VERSION, "%s", tp_errmsg());
    cr_assert(strstr(tp_errmsg(), "2.0") && strstr(tp_errmsg(), "newer"), "%s", tp_errmsg());
}

Test(io, truncated_and_missing_files)
{
    char path[600], shard[700];
    snprintf(path, sizeof path, "%s/ck", dir);
    simple_checkpoint(path, 1);
    snprintf(shard, sizeof shard, "%s/shard_pp00_tp00.h5", path);
    struct stat st;
    stat(shard, &st);
    cr_assert_eq(truncate(shard, st.st_size - 10), 0);
    ckpt_reader *r;
    cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "shard_pp00_tp00.h5") && strstr(tp_errmsg(), "truncated"), "%s",
              tp_errmsg());
    unlink(shard);
    cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_ERR_NOT_FOUND);
    cr_assert(strstr(tp_errmsg(), "shard_pp00_tp00.h5"), "%s", tp_errmsg());
}

/* A shard truncated after the reader opened the checkpoint, before or after
 * a first read of it: reads fail naming the file (never a crash). */
Test(io, truncated_after_open)
{
    for (int first_read = 0; first_read < 2; first_read++) {
        char path[600], shard[700];
        snprintf(path, sizeof path, "%s/ck%d", dir, first_read);
        simple_checkpoint(path, 1);
        snprintf(shard, sizeof shard, "%s/shard_pp00_tp00.h5", path);
        long offset = data_offset(shard, "model/b.bias");
        ckpt_reader *r;
        cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_OK, "%s", tp_errmsg());
        int a = ckpt_reader_find(r, "model/a.weight"), b = ckpt_reader_find(r, "model/b.bias");
        float rows[32 * 64];
        if (first_read)
            cr_assert_eq(ckpt_reader_read_rows(r, a, 0, 0, 32, rows, sizeof rows), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(truncate(shard, offset + 100), 0);
        uint16_t bias[4096];
        int status = ckpt_reader_read_piece(r, b, 0, bias, sizeof bias);
        cr_assert(status == TP_ERR_FORMAT || status == TP_ERR_CHECKSUM, "status %d: %s", status, tp_errmsg());
        cr_assert(strstr(tp_errmsg(), "shard_pp00_tp00.h5"), "%s", tp_errmsg());
        cr_assert_neq(ckpt_reader_verify_piece(r, b, 0), TP_OK);
        cr_assert(strstr(tp_errmsg(), "shard_pp00_tp00.h5"), "%s", tp_errmsg());
        ckpt_reader_close(r);
    }
}

Test(io, not_a_checkpoint)
{
    ckpt_reader *r;
    cr_assert_eq(ckpt_reader_open(&r, dir, NULL), TP_ERR_NOT_FOUND);
    cr_assert(strstr(tp_errmsg(), "is not a checkpoint"), "%s", tp_errmsg());
    char path[600];
    snprintf(path, sizeof path, "%s/missing", dir);
    cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_ERR_NOT_FOUND);
    snprintf(path, sizeof path, "%s/ck", dir);
    simple_checkpoint(path, 1);
    edit_index(path, "\"tensors\"", "\"tensorz\"");
    cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "tensors"), "%s", tp_errmsg());
}

/* ------------------------------------------------------------ atomicity */

Test(io, existing_output_needs_overwrite)
{
    char path[600];
    snprintf(path, sizeof path, "%s/ck", dir);
    simple_checkpoint(path, 1);
    ckpt_layout layout = {1, 1, 1, 0, 1};
    ckpt_writer *w;
    cr_assert_eq(ckpt_writer_create(&w, path, &layout, NULL), TP_ERR_EXISTS);
    cr_assert(strstr(tp_errmsg(), "--force"), "%s", tp_errmsg());
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    options.overwrite = 1;
    cr_assert_eq(ckpt_writer_create(&w, path, &layout, &options), TP_OK);
    ckpt_train_state state = {42, 0, NULL, NULL, NULL, NULL};
    cr_assert_eq(ckpt_writer_commit(w, &state), TP_OK, "%s", tp_errmsg());
    ckpt_reader *r;
    cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_OK);
    cr_assert_eq(ckpt_reader_state(r)->step, 42);
    cr_assert_eq(ckpt_reader_num_tensors(r), 0);
    ckpt_reader_close(r);
    char staging[700];
    snprintf(staging, sizeof staging, "%s/.ck.staging", dir);
    cr_assert_eq(access(staging, F_OK), -1, "the replaced checkpoint is gone");
}

Test(io, abort_and_incomplete_leave_nothing)
{
    char path[600], staging[700];
    snprintf(path, sizeof path, "%s/ck", dir);
    snprintf(staging, sizeof staging, "%s/.ck.staging", dir);
    ckpt_layout layout = {2, 1, 1, 0, 1};
    ckpt_tensor_desc t = {.name = "model/w", .dtype = TP_FP32, .ndim = 1, .shape = {8},
                          .anchor = CKPT_ANCHOR_FIRST};
    t.partition.kind = CKPT_SPLIT;
    ckpt_writer *w;
    int id;
    cr_assert_eq(ckpt_writer_create(&w, path, &layout, NULL), TP_OK);
    cr_assert_eq(ckpt_writer_add_tensor(w, &t, &id), TP_OK);
    cr_assert_eq(ckpt_writer_add_tensor(w, &t, &id), TP_ERR_ARG, "a name is declared once");
    ckpt_writer_abort(w);
    cr_assert_eq(access(path, F_OK), -1);
    cr_assert_eq(access(staging, F_OK), -1);

    cr_assert_eq(ckpt_writer_create(&w, path, &layout, NULL), TP_OK);
    cr_assert_eq(ckpt_writer_add_tensor(w, &t, &id), TP_OK);
    float values[4] = {1, 2, 3, 4};
    cr_assert_eq(ckpt_writer_put_piece(w, id, 0, values), TP_OK);
    cr_assert_eq(ckpt_writer_put_piece(w, id, 0, values), TP_ERR_STATE, "rows written twice");
    cr_assert_eq(ckpt_writer_put_rows(w, id, 1, 1, 2, values), TP_ERR_ARG, "not block aligned");
    cr_assert_eq(ckpt_writer_commit(w, NULL), TP_ERR_STATE, "piece 1 missing");
    cr_assert(strstr(tp_errmsg(), "model/w piece 1"), "%s", tp_errmsg());
    cr_assert_eq(access(path, F_OK), -1, "nothing visible after a failed commit");
    cr_assert_eq(access(staging, F_OK), -1);
}

Test(io, nonzero_padding_is_found)
{
    char path[600];
    snprintf(path, sizeof path, "%s/ck", dir);
    ckpt_layout layout = {2, 1, 1, 0, 1};
    ckpt_tensor_desc t = {.name = "model/tok", .dtype = TP_FP32, .ndim = 1, .shape = {5},
                          .anchor = CKPT_ANCHOR_FIRST};
    t.partition = (ckpt_partition){CKPT_SPLIT, 0, 0, {0}, 1, 4, 0}; /* 5 padded to 8 */
    ckpt_writer *w;
    int id;
    cr_assert_eq(ckpt_writer_create(&w, path, &layout, NULL), TP_OK);
    cr_assert_eq(ckpt_writer_add_tensor(w, &t, &id), TP_OK);
    float first[4] = {1, 2, 3, 4}, second[4] = {5, 0, 9, 0}; /* 9 sits in padding */
    cr_assert_eq(ckpt_writer_put_piece(w, id, 0, first), TP_OK);
    cr_assert_eq(ckpt_writer_put_piece(w, id, 1, second), TP_OK);
    cr_assert_eq(ckpt_writer_commit(w, NULL), TP_OK);
    ckpt_reader *r;
    cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_OK);
    cr_assert_eq(ckpt_reader_check_padding(r, 0, 0), TP_OK);
    cr_assert_eq(ckpt_reader_check_padding(r, 0, 1), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "padding"), "%s", tp_errmsg());
    float logical[5];
    int64_t start = 0, count = 5;
    cr_assert_eq(ckpt_reader_read_region(r, 0, &start, &count, logical, sizeof logical), TP_OK);
    float expect[5] = {1, 2, 3, 4, 5};
    cr_assert_eq(memcmp(logical, expect, sizeof expect), 0, "padding is not part of the logical tensor");
    ckpt_reader_close(r);
}

/* Format 1.4's replicated segments: 4 query heads and 1 key/value head of
 * 2 rows over tp 4 (qkv [12, 3], segments [8, 2, 2], granule 2): every rank
 * holds the key and value head, rank 0's the primary copy. A replica that
 * differs, written with its checksums (a writer's bug on one rank), is
 * damage verify names: tensor, both ranks and files, element, both values. */
Test(io, replicated_granules_are_compared)
{
    ckpt_layout layout = {4, 1, 1, 0, 1};
    ckpt_tensor_desc t = {.name = "model/layers.0.attn.qkv.weight", .dtype = TP_FP32, .ndim = 2, .shape = {12, 3},
                          .anchor = CKPT_ANCHOR_FIRST};
    t.partition = (ckpt_partition){CKPT_SPLIT, 0, 3, {8, 2, 2}, 2, 0, 1};
    float logical[36];
    for (int i = 0; i < 36; i++) logical[i] = (float)i / 4;
    for (int k = 0; k < 2; k++) {
        char path[600];
        snprintf(path, sizeof path, "%s/ck%d", dir, k);
        ckpt_writer *w;
        int id;
        cr_assert_eq(ckpt_writer_create(&w, path, &layout, NULL), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(ckpt_writer_add_tensor(w, &t, &id), TP_OK, "%s", tp_errmsg());
        for (int p = 0; p < 4; p++) {
            float piece[6 * 3]; /* [q head p (2 rows); the key head; the value head] x 3 */
            const int rows[6] = {2 * p, 2 * p + 1, 8, 9, 10, 11};
            for (int i = 0; i < 6; i++) memcpy(&piece[i * 3], &logical[rows[i] * 3], 3 * sizeof *piece);
            if (k == 1 && p == 2) piece[3 * 3 + 1] = 5; /* the key head's row 1 (logical row 9), column 1 */
            cr_assert_eq(ckpt_writer_put_piece(w, id, p, piece), TP_OK, "%s", tp_errmsg());
        }
        cr_assert_eq(ckpt_writer_commit(w, NULL), TP_OK, "%s", tp_errmsg());
        ckpt_reader *r;
        cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_OK, "%s", tp_errmsg());
        ckpt_verify_result result;
        cr_assert_eq(ckpt_verify(r, NULL, &result), TP_OK, "%s", tp_errmsg());
        if (k == 0) {
            cr_assert_eq(result.damaged, 0, "%s", result.damaged ? result.damage[0].message : "");
        } else {
            cr_assert_eq(result.damaged, 1, "the replica that differs is damage");
            const ckpt_damage *d = &result.damage[0];
            cr_assert_eq(d->piece, 2);
            cr_assert_eq(d->status, TP_ERR_FORMAT);
            const char *needles[] = {"tensor model/layers.0.attn.qkv.weight: rows 8..9 of axis 0 are replicated over the "
                                     "tensor-parallel ranks (replicate_small_segments) and their copies differ: element "
                                     "[9, 1] is 5 (0x40a00000) in ",
                                     "(tensor-parallel rank 2's replica), 7 (0x40e00000) in ",
                                     "(rank 0's, the primary copy read)"};
            for (int n = 0; n < 3; n++) cr_assert(strstr(d->message, needles[n]), "'%s' not in: %s", needles[n], d->message);
            cr_assert_eq(ckpt_reader_check_replicas(r, 0, 1), TP_OK, "rank 1's replica is rank 0's");
        }
        ckpt_verify_result_free(&result);
        /* Readers take the primary copy either way. */
        float back[36];
        int64_t start[2] = {0, 0}, count[2] = {12, 3};
        cr_assert_eq(ckpt_reader_read_region(r, 0, start, count, back, sizeof back), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(memcmp(back, logical, sizeof back), 0);
        ckpt_reader_close(r);
    }
}

Test(io, latest_pointer_and_resolution)
{
    char run[600], a[700], b[700], resolved[4096];
    snprintf(run, sizeof run, "%s/run", dir);
    mkdir(run, 0755);
    snprintf(a, sizeof a, "%s/step_00000020", run);
    snprintf(b, sizeof b, "%s/step_00000010", run);
    ckpt_layout layout = {1, 1, 1, 0, 1};
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    options.update_latest = 1;
    ckpt_writer *w;
    ckpt_train_state s20 = {20, 0, NULL, NULL, NULL, NULL}, s10 = {10, 0, NULL, NULL, NULL, NULL};
    cr_assert_eq(ckpt_writer_create(&w, a, &layout, &options), TP_OK);
    cr_assert_eq(ckpt_writer_commit(w, &s20), TP_OK);
    cr_assert_eq(ckpt_writer_create(&w, b, &layout, &options), TP_OK);
    cr_assert_eq(ckpt_writer_commit(w, &s10), TP_OK);
    cr_assert_eq(ckpt_resolve(run, resolved, sizeof resolved), TP_OK);
    cr_assert_str_eq(resolved, a, "latest never moves back to an older step");
    /* A damaged pointer falls back to the newest committed step_* directory. */
    char latest[700];
    snprintf(latest, sizeof latest, "%s/latest", run);
    FILE *f = fopen(latest, "w");
    fputs("step_99999999\n", f);
    fclose(f);
    cr_assert_eq(ckpt_resolve(run, resolved, sizeof resolved), TP_OK);
    cr_assert_str_eq(resolved, a);
    /* A staging directory (an interrupted write) is never chosen. */
    char staging[700];
    snprintf(staging, sizeof staging, "%s/.step_00000030.staging", run);
    mkdir(staging, 0755);
    cr_assert_eq(ckpt_resolve(run, resolved, sizeof resolved), TP_OK);
    cr_assert_str_eq(resolved, a);
}

/* ------------------------------------------------------- distributed */

typedef struct {
    const char *path;
    ckpt_layout layout;
    int pp, tp;
    int status;
} rank_job;

/* One "rank": writes its shard of a column-split weight and a replicated bias. */
static void *write_rank(void *arg)
{
    rank_job *job = arg;
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    options.shard_pp = job->pp;
    options.shard_tp = job->tp;
    ckpt_writer *w;
    job->status = ckpt_writer_create(&w, job->path, &job->layout, &options);
    if (job->status) return NULL;
    for (int64_t layer = 0; layer < job->layout.num_layers && !job->status; layer++) {
        char wname[64], bname[64];
        snprintf(wname, sizeof wname, "model/layers.%lld.w", (long long)layer);
        snprintf(bname, sizeof bname, "model/layers.%lld.b", (long long)layer);
        ckpt_tensor_desc w_desc = {.name = wname, .dtype = TP_FP32, .ndim = 2, .shape = {8, 3},
                                   .anchor = CKPT_ANCHOR_LAYER, .layer = layer};
        w_desc.partition.kind = CKPT_SPLIT;
        ckpt_tensor_desc b_desc = {.name = bname, .dtype = TP_FP32, .ndim = 1, .shape = {3},
                                   .anchor = CKPT_ANCHOR_LAYER, .layer = layer};
        int wid, bid;
        job->status = ckpt_writer_add_tensor(w, &w_desc, &wid);
        if (!job->status) job->status = ckpt_writer_add_tensor(w, &b_desc, &bid);
        if (job->status || !ckpt_writer_owns_piece(w, wid, job->tp)) continue;
        float piece[12], bias[3] = {(float)layer, 1, 2};
        int rows = 8 / job->layout.tp;
        for (int i = 0; i < rows * 3; i++) piece[i] = (float)(layer * 100 + (job->tp * rows) * 3 + i);
        job->status = ckpt_writer_put_piece(w, wid, job->tp, piece);
        if (!job->status && ckpt_writer_owns_piece(w, bid, 0)) job->status = ckpt_writer_put_piece(w, bid, 0, bias);
    }
    int finish = ckpt_writer_finish(w);
    if (!job->status) job->status = finish;
    return NULL;
}

Test(io, distributed_writers_commit_once)
{
    char path[600];
    snprintf(path, sizeof path, "%s/step_00000005", dir);
    ckpt_layout layout = {2, 2, 4, 4, 1};
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    options.update_latest = 1;
    cr_assert_eq(ckpt_stage_prepare(path, &options), TP_OK, "%s", tp_errmsg());
    rank_job jobs[4];
    pthread_t threads[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (rank_job){path, layout, i / 2, i % 2, 0};
        pthread_create(&threads[i], NULL, write_rank, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(threads[i], NULL);
        cr_assert_eq(jobs[i].status, TP_OK, "rank %d", i);
    }
    ckpt_train_state state = {5, 40, NULL, NULL, "[{\"pp\":0,\"tp\":0,\"dp\":0,\"state\":\"01\"}]", NULL};
    cr_assert_eq(ckpt_commit_staged(path, &layout, &state, &options), TP_OK, "%s", tp_errmsg());
    ckpt_reader *r;
    cr_assert_eq(ckpt_reader_open(&r, dir, NULL), TP_OK, "the run directory resolves: %s", tp_errmsg());
    cr_assert_eq(ckpt_reader_num_tensors(r), 8);
    cr_assert_eq(ckpt_reader_layout(r)->dp, 4);
    for (int64_t layer = 0; layer < 4; layer++) {
        char wname[64];
        snprintf(wname, sizeof wname, "model/layers.%lld.w", (long long)layer);
        int k = ckpt_reader_find(r, wname);
        float merged[24];
        int64_t start[2] = {0, 0}, count[2] = {8, 3};
        cr_assert_eq(ckpt_reader_read_region(r, k, start, count, merged, sizeof merged), TP_OK, "%s",
                     tp_errmsg());
        for (int i = 0; i < 24; i++) cr_assert_eq(merged[i], (float)(layer * 100 + i));
        ckpt_piece_info info;
        ckpt_reader_piece_info(r, k, 1, &info);
        cr_assert_eq(info.pp, (int)layer / 2);
        cr_assert_eq(info.tp, 1);
    }
    ckpt_reader_close(r);
}

Test(io, distributed_commit_needs_every_shard)
{
    char path[600];
    snprintf(path, sizeof path, "%s/ck", dir);
    ckpt_layout layout = {2, 1, 1, 2, 1};
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    cr_assert_eq(ckpt_stage_prepare(path, &options), TP_OK);
    rank_job job = {path, layout, 0, 1, 0};
    write_rank(&job);
    cr_assert_eq(job.status, TP_OK, "%s", tp_errmsg());
    cr_assert_eq(ckpt_commit_staged(path, &layout, NULL, &options), TP_ERR_STATE);
    cr_assert(strstr(tp_errmsg(), "shard_pp00_tp00.h5"), "names the missing shard: %s", tp_errmsg());
    cr_assert_eq(access(path, F_OK), -1);
}

/* A distributed commit without a shared file system: each writer
 * describes its own shard, one process builds the index from the parts;
 * it must be the index a commit that reads every file builds, byte for
 * byte. */
Test(io, described_shards_build_the_committed_index)
{
    char path[600], staging[CKPT_PATH_MAX];
    snprintf(path, sizeof path, "%s/step_00000007", dir);
    ckpt_layout layout = {2, 2, 1, 4, 1};
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    cr_assert_eq(ckpt_stage_prepare(path, &options), TP_OK, "%s", tp_errmsg());
    for (int i = 0; i < 4; i++) {
        rank_job job = {path, layout, i / 2, i % 2, 0};
        write_rank(&job);
        cr_assert_eq(job.status, TP_OK, "%s", tp_errmsg());
    }
    cr_assert_eq(store_staging_path(path, NULL, staging, sizeof staging), TP_OK);
    char *parts[5] = {NULL};
    for (int i = 0; i < 4; i++)
        cr_assert_eq(ckpt_describe_shard(store_posix(), staging, &layout, i / 2, i % 2, 0, &parts[i]), TP_OK,
                     "%s", tp_errmsg());
    ckpt_train_state state = {7, 56, "{\"arch\":\"x\"}", NULL, "[{\"pp\":0,\"tp\":0,\"dp\":0,\"state\":\"01\"}]",
                              NULL};
    /* Parts arrive in any order, beside processes without a shard (NULL). */
    const char *shuffled[6] = {parts[2], NULL, parts[0], parts[3], NULL, parts[1]};
    char *built = NULL;
    int64_t bytes = -1;
    cr_assert_eq(ckpt_index_from_parts(&layout, &state, shuffled, 6, path, &built, &bytes), TP_OK, "%s", tp_errmsg());
    /* A part twice, a part missing, a part of another layout. */
    char *refused = NULL;
    const char *twice[5] = {parts[0], parts[1], parts[2], parts[3], parts[1]};
    cr_assert_eq(ckpt_index_from_parts(&layout, &state, twice, 5, path, &refused, NULL), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "shard_pp00_tp01.h5 is described twice"), "%s", tp_errmsg());
    cr_assert_eq(ckpt_index_from_parts(&layout, &state, (const char *const *)parts, 3, path, &refused, NULL), TP_ERR_STATE);
    cr_assert(strstr(tp_errmsg(), "no process described shard pp=1 tp=1"), "%s", tp_errmsg());
    ckpt_layout other = {2, 2, 1, 6, 1};
    cr_assert_neq(ckpt_index_from_parts(&other, &state, (const char *const *)parts, 4, path, &refused, NULL), TP_OK);
    cr_assert(strstr(tp_errmsg(), "layers=4, the checkpoint has tp=2 pp=2 layers=6"), "%s", tp_errmsg());
    cr_assert_null(refused);

    cr_assert_eq(ckpt_commit_staged(path, &layout, &state, &options), TP_OK, "%s", tp_errmsg());
    char index_path[700];
    snprintf(index_path, sizeof index_path, "%s/index.json", path);
    char *committed = NULL;
    int64_t size = 0;
    cr_assert_eq(store_read_text_file(index_path, 1 << 24, &committed, &size), TP_OK, "%s", tp_errmsg());
    cr_assert_str_eq(built, committed);
    /* The bytes it reports are its shard files'. */
    int64_t on_disk = 0;
    for (int i = 0; i < 4; i++) {
        char shard[700];
        struct stat st;
        snprintf(shard, sizeof shard, "%s/shard_pp%02d_tp%02d.h5", path, i / 2, i % 2);
        cr_assert_eq(stat(shard, &st), 0, "%s", shard);
        on_disk += st.st_size;
    }
    cr_assert_eq(bytes, on_disk);
    for (int i = 0; i < 4; i++) free(parts[i]);
    free(built);
    free(committed);
}

/* ----------------------------------------------- the interleaved schedule */

/* 8 layers at tp2 pp2 with `chunks` chunks of layers per stage: a split
 * weight per layer (with_layers), a replicated table on the first stage and
 * a norm on the last. Returns how many tensors; their data lives in `data`. */
static int interleaved_checkpoint(const char *path, int chunks, int with_layers, test_tensor *t, float data[10][24])
{
    ckpt_layout layout = {2, 2, 1, 8, chunks};
    int n = 0;
    memset(t, 0, 10 * sizeof *t);
    for (int l = 0; with_layers && l < 8; l++, n++) {
        snprintf(t[n].name, sizeof t[n].name, "model/layers.%d.w", l);
        t[n].desc = (ckpt_tensor_desc){.name = t[n].name, .dtype = TP_FP32, .ndim = 2, .shape = {8, 3},
                                       .anchor = CKPT_ANCHOR_LAYER, .layer = l};
        t[n].desc.partition.kind = CKPT_SPLIT;
    }
    for (int end = 0; end < 2; end++, n++) {
        strcpy(t[n].name, end ? "model/norm" : "model/embed");
        t[n].desc = (ckpt_tensor_desc){.name = t[n].name, .dtype = TP_FP32, .ndim = 1, .shape = {24},
                                       .anchor = end ? CKPT_ANCHOR_LAST : CKPT_ANCHOR_FIRST};
    }
    for (int i = 0; i < n; i++) {
        for (int e = 0; e < 24; e++) data[i][e] = (float)(i * 100 + e);
        t[i].logical = (uint8_t *)data[i];
    }
    write_tensors(path, &layout, t, n, 0, 3);
    return n;
}

static int64_t shard_attribute(const char *path, const char *shard, const char *name)
{
    char file[700];
    snprintf(file, sizeof file, "%s/%s", path, shard);
    hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    cr_assert_geq(f, 0, "%s", file);
    int64_t value = -1;
    if (H5Aexists(f, name) > 0) {
        hid_t a = H5Aopen(f, name, H5P_DEFAULT);
        cr_assert_geq(H5Aread(a, H5T_NATIVE_INT64, &value), 0);
        H5Aclose(a);
    }
    H5Fclose(f);
    return value;
}

static int index_contains(const char *path, const char *text)
{
    char file[700];
    snprintf(file, sizeof file, "%s/index.json", path);
    char *index = NULL;
    int64_t size = 0;
    cr_assert_eq(store_read_text_file(file, 1 << 24, &index, &size), TP_OK, "%s", tp_errmsg());
    int found = strstr(index, text) != NULL;
    free(index);
    return found;
}

/* Written at 2 chunks per stage, read back: the layout says so, stage 0
 * holds layers 0, 1, 4, 5 (chunks 0 and 2) and stage 1 layers 2, 3, 6, 7,
 * every piece reads back; the index and the shards record the chunks (format
 * 1.5), which a layout of one chunk leaves out. */
Test(io, interleaved_layout_round_trips)
{
    char path[600], plain[600];
    snprintf(path, sizeof path, "%s/v2", dir);
    snprintf(plain, sizeof plain, "%s/v1", dir);
    test_tensor t[10];
    static float data[10][24];
    int n = interleaved_checkpoint(path, 2, 1, t, data);
    ckpt_layout layout = {2, 2, 1, 8, 2};
    check_reads(path, &layout, t, n, 1);
    ckpt_reader *r;
    cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(ckpt_reader_layout(r)->virtual_stages, 2);
    int major, minor;
    ckpt_reader_version(r, &major, &minor);
    cr_assert(major == 1 && minor == CKPT_FORMAT_MINOR && minor >= 5, "format %d.%d", major, minor);
    static const int stage_of_layer[8] = {0, 0, 1, 1, 0, 0, 1, 1};
    for (int i = 0; i < n; i++) {
        int k = ckpt_reader_find(r, t[i].name);
        int expect = t[i].desc.anchor == CKPT_ANCHOR_LAYER   ? stage_of_layer[t[i].desc.layer]
                     : t[i].desc.anchor == CKPT_ANCHOR_FIRST ? 0
                                                             : 1;
        for (int p = 0; p < ckpt_piece_count(&t[i].desc, 2); p++) {
            ckpt_piece_info info;
            cr_assert_eq(ckpt_reader_piece_info(r, k, p, &info), TP_OK);
            cr_assert_eq(info.pp, expect, "%s piece %d on stage %d, expected %d", t[i].name, p, info.pp, expect);
            char file[64];
            snprintf(file, sizeof file, "shard_pp%02d_tp%02d.h5", expect, p);
            cr_assert_str_eq(info.file, file);
        }
    }
    ckpt_reader_close(r);
    cr_assert(index_contains(path, "\"num_layers\":\t8,\n\t\t\"virtual_stages\":\t2\n"), "the index's layout records 2");
    cr_assert(index_contains(path, "\"format_version\":\t[1, 7]"));
    for (int s = 0; s < 4; s++) {
        char shard[64];
        snprintf(shard, sizeof shard, "shard_pp%02d_tp%02d.h5", s / 2, s % 2);
        cr_assert_eq(shard_attribute(path, shard, "layout_virtual_stages"), 2, "%s", shard);
    }

    interleaved_checkpoint(plain, 1, 1, t, data);
    cr_assert_not(index_contains(plain, "virtual_stages"), "one chunk per stage is not written");
    cr_assert_eq(shard_attribute(plain, "shard_pp00_tp00.h5", "layout_virtual_stages"), -1, "nor its attribute");
    cr_assert_eq(ckpt_reader_open(&r, plain, NULL), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(ckpt_layout_chunks(ckpt_reader_layout(r)), 1);
    int k = ckpt_reader_find(r, "model/layers.2.w");
    ckpt_piece_info info;
    cr_assert_eq(ckpt_reader_piece_info(r, k, 0, &info), TP_OK);
    cr_assert_eq(info.pp, 0, "layers 0-3 on stage 0 without chunks");
    ckpt_reader_close(r);
}

/* An index whose stages do not follow its virtual_stages is refused: with
 * the key gone (what a 1.4 reader sees: consecutive stages), another count
 * of chunks, one that does not divide the layers, and values out of range. */
Test(io, index_stages_follow_its_virtual_stages)
{
    static const struct {
        const char *to, *message;
    } edits[] = {
        {"", "field 'stage' missing or not the stage its anchor and layer give"},
        {",\n\t\t\"virtual_stages\":\t4", "field 'stage' missing or not the stage its anchor and layer give"},
        {",\n\t\t\"virtual_stages\":\t3", "8 layers cannot be split evenly into pp=2 x 3"},
        {",\n\t\t\"virtual_stages\":\t0", "field 'virtual_stages' missing or not an integer in range"},
        {",\n\t\t\"virtual_stages\":\t4097", "field 'virtual_stages' missing or not an integer in range"},
        {",\n\t\t\"virtual_stages\":\t\"2\"", "field 'virtual_stages' missing or not an integer in range"},
    };
    test_tensor t[10];
    static float data[10][24];
    for (size_t e = 0; e < sizeof edits / sizeof edits[0]; e++) {
        char path[600];
        snprintf(path, sizeof path, "%s/ck%zu", dir, e);
        interleaved_checkpoint(path, 2, 1, t, data);
        edit_index(path, ",\n\t\t\"virtual_stages\":\t2", edits[e].to);
        ckpt_reader *r = NULL;
        cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_ERR_FORMAT, "edit %zu opened", e);
        cr_assert(strstr(tp_errmsg(), edits[e].message), "edit %zu: %s", e, tp_errmsg());
    }
    /* The same edit where no tensor has a layer: nothing disagrees. */
    char path[600];
    snprintf(path, sizeof path, "%s/ends", dir);
    interleaved_checkpoint(path, 2, 0, t, data);
    edit_index(path, ",\n\t\t\"virtual_stages\":\t2", ",\n\t\t\"virtual_stages\":\t4");
    ckpt_reader *r = NULL;
    cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(ckpt_reader_layout(r)->virtual_stages, 4);
    ckpt_reader_close(r);
}

/* A shard whose recorded chunks per stage differ from the index's is
 * refused when read (checkpoints whose tensors have no layer, so that the
 * index's stages agree either way), and a commit of shards written at
 * another count of chunks is refused, whether it reads the files or merges
 * their descriptions. */
Test(io, shards_record_the_index_virtual_stages)
{
    test_tensor t[10];
    static float data[10][24];
    char path[600];
    static const struct {
        int written;
        const char *from, *to, *message;
    } cases[] = {
        {2, ",\n\t\t\"virtual_stages\":\t2", "",
         "shard_pp00_tp00.h5: a shard of layout tp=2 pp=2 layers=8 virtual_stages=2, the checkpoint's is tp=2 pp=2 "
         "layers=8"},
        {1, "\"num_layers\":\t8", "\"num_layers\":\t8,\n\t\t\"virtual_stages\":\t2",
         "shard_pp00_tp00.h5: a shard of layout tp=2 pp=2 layers=8, the checkpoint's is tp=2 pp=2 layers=8 "
         "virtual_stages=2"},
    };
    for (int c = 0; c < 2; c++) {
        snprintf(path, sizeof path, "%s/ends%d", dir, c);
        interleaved_checkpoint(path, cases[c].written, 0, t, data);
        edit_index(path, cases[c].from, cases[c].to);
        ckpt_reader *r = NULL;
        cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_OK, "%s", tp_errmsg());
        float piece[24];
        cr_assert_eq(ckpt_reader_read_piece(r, ckpt_reader_find(r, "model/embed"), 0, piece, sizeof piece),
                     TP_ERR_FORMAT, "case %d read", c);
        cr_assert(strstr(tp_errmsg(), cases[c].message), "case %d: %s", c, tp_errmsg());
        ckpt_reader_close(r);
        cr_assert_neq(ckpt_verify_checkpoint(path, 2, NULL), TP_OK, "case %d verified", c);
    }

    /* Distributed writers at 2 chunks per stage (4 layers: one each). */
    snprintf(path, sizeof path, "%s/step_00000009", dir);
    ckpt_layout written = {2, 2, 1, 4, 2}, other = {2, 2, 1, 4, 1};
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    cr_assert_eq(ckpt_stage_prepare(path, &options), TP_OK, "%s", tp_errmsg());
    for (int i = 0; i < 4; i++) {
        rank_job job = {path, written, i / 2, i % 2, 0};
        write_rank(&job);
        cr_assert_eq(job.status, TP_OK, "%s", tp_errmsg());
    }
    char staging[CKPT_PATH_MAX];
    cr_assert_eq(store_staging_path(path, NULL, staging, sizeof staging), TP_OK);
    char *parts[4] = {NULL}, *refused = NULL;
    cr_assert_eq(ckpt_describe_shard(store_posix(), staging, &other, 1, 0, 0, &refused), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "shard_pp01_tp00.h5: a shard of layout tp=2 pp=2 layers=4 virtual_stages=2, the "
                                  "checkpoint's is tp=2 pp=2 layers=4"), "%s", tp_errmsg());
    for (int i = 0; i < 4; i++)
        cr_assert_eq(ckpt_describe_shard(store_posix(), staging, &written, i / 2, i % 2, 0, &parts[i]), TP_OK, "%s",
                     tp_errmsg());
    cr_assert_eq(ckpt_index_from_parts(&other, NULL, (const char *const *)parts, 4, path, &refused, NULL),
                 TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "layout tp=2 pp=2 layers=4 virtual_stages=2, the checkpoint has tp=2 pp=2 layers=4"),
              "%s", tp_errmsg());
    cr_assert_null(refused);
    for (int i = 0; i < 4; i++) free(parts[i]);
    cr_assert_eq(ckpt_commit_staged(path, &other, NULL, &options), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "virtual_stages=2, the checkpoint's is tp=2 pp=2 layers=4"), "%s", tp_errmsg());
    cr_assert_eq(access(path, F_OK), -1, "nothing committed");
}

/* A writer with count_nonfinite counts the NaNs and infinities of what it
 * writes, each logical element once (the padding left out: the digest's
 * walk), its first the earliest flat logical index: against the logical
 * tensors themselves (random bits, NaNs and infinities among them), widened
 * to fp32 and judged by isnan and isinf. Without the option it counts
 * nothing. */
Test(io, writer_counts_nonfinite_values_once)
{
    for (int iter = 0; iter < 16; iter++) {
        ckpt_layout layout = {(int)rnd(1, 4), 1, 1, 2, 1};
        test_tensor tensors[10];
        int n = random_tensors(tensors, 10, &layout.tp, 1, layout.num_layers);
        char path[600];
        snprintf(path, sizeof path, "%s/counted%d", dir, iter);
        ckpt_write_options options;
        ckpt_write_options_init(&options);
        options.count_nonfinite = iter % 4 != 3;
        ckpt_writer *w;
        cr_assert_eq(ckpt_writer_create(&w, path, &layout, &options), TP_OK, "%s", tp_errmsg());
        int ids[10];
        for (int i = 0; i < n; i++) {
            const ckpt_tensor_desc *d = &tensors[i].desc;
            cr_assert_eq(ckpt_writer_add_tensor(w, d, &ids[i]), TP_OK, "%s", tp_errmsg());
            int64_t shape[CKPT_MAX_DIMS];
            ckpt_piece_shape(d, layout.tp, shape);
            uint8_t *piece = malloc((size_t)elements_of(shape, d->ndim) * tp_dtype_size(d->dtype) + 1);
            for (int p = 0; p < ckpt_piece_count(d, layout.tp); p++) {
                build_piece(d, layout.tp, p, tensors[i].logical, piece);
                cr_assert_eq(ckpt_writer_put_piece(w, ids[i], p, piece), TP_OK, "%s", tp_errmsg());
            }
            free(piece);
        }
        for (int i = 0; i < n; i++) {
            const ckpt_tensor_desc *d = &tensors[i].desc;
            int64_t count = elements_of(d->shape, d->ndim), nans = 0, infinities = 0, first = -1;
            float *wide = malloc((size_t)count * sizeof *wide + 1);
            convert_to_f32(tensors[i].logical, d->dtype, wide, count);
            for (int64_t e = 0; e < count; e++) {
                nans += isnan(wide[e]) != 0;
                infinities += isinf(wide[e]) != 0;
                if (first < 0 && !isfinite(wide[e])) first = e;
            }
            free(wide);
            if (!options.count_nonfinite) nans = infinities = 0, first = -1;
            convert_nonfinite found = ckpt_writer_nonfinite(w, ids[i]);
            cr_assert(found.nans == nans && found.infinities == infinities && found.first == first,
                      "%s at tp %d: %lld NaNs, %lld infinities, first %lld; expected %lld, %lld, %lld", d->name,
                      layout.tp, (long long)found.nans, (long long)found.infinities, (long long)found.first, (long long)nans,
                      (long long)infinities, (long long)first);
        }
        ckpt_writer_abort(w);
        for (int i = 0; i < n; i++) free(tensors[i].logical);
    }
}

/* Grouped-query attention with fewer key/value heads than ranks (format
 * 1.4's replicated segments): a fused QKV [(q + 2 kv) g, cols] of q query
 * heads and kv < tp key/value heads of g rows, each key and value head held
 * alike by tp / kv ranks. A NaN or an infinity in a replicated head is
 * stored tp / kv times but is one logical element: counted once, at its
 * logical index, as the digest takes the primary copy alone. */
Test(io, writer_counts_replicated_granules_once)
{
    for (int iter = 0; iter < 24; iter++) {
        static const int tps[] = {2, 4, 8};
        int tp = tps[iter % 3];
        int64_t kv = (int64_t)1 << rnd(0, iter % 3); /* 1 at tp 2; 1 or 2 at tp 4; 1, 2 or 4 at tp 8 */
        int64_t granule = rnd(1, 3), q = tp * rnd(1, 2), cols = rnd(1, 5);
        ckpt_layout layout = {tp, 1, 1, 0, 1};
        ckpt_tensor_desc t = {.name = "model/layers.0.attn.qkv.weight", .dtype = (tp_dtype)rnd(0, 2), .ndim = 2,
                              .shape = {(q + 2 * kv) * granule, cols}, .anchor = CKPT_ANCHOR_FIRST};
        t.partition = (ckpt_partition){CKPT_SPLIT, 0, 3, {q * granule, kv * granule, kv * granule}, granule, 0, 1};
        cr_assert_eq(ckpt_tensor_check(&t, tp), TP_OK, "%s", tp_errmsg());
        size_t es = tp_dtype_size(t.dtype);
        int64_t count = elements_of(t.shape, 2);
        uint8_t *logical = malloc((size_t)count * es);
        random_numbers(logical, (size_t)count * es, t.dtype);
        /* A NaN in a key head and an infinity in a value head, both replicated
         * (bits of fp32, bf16, fp16; little-endian: memcpy takes the low bytes). */
        static const uint32_t nan_bits[] = {0x7fc00000u, 0x7fc0u, 0x7e00u}, inf_bits[] = {0x7f800000u, 0x7f80u, 0x7c00u};
        int64_t key_element = (q * granule + rnd(0, kv * granule - 1)) * cols + rnd(0, cols - 1);
        int64_t value_element = ((q + kv) * granule + rnd(0, kv * granule - 1)) * cols + rnd(0, cols - 1);
        memcpy(logical + key_element * (int64_t)es, &nan_bits[t.dtype], es);
        memcpy(logical + value_element * (int64_t)es, &inf_bits[t.dtype], es);

        char path[600];
        snprintf(path, sizeof path, "%s/gqa%d", dir, iter);
        ckpt_write_options options;
        ckpt_write_options_init(&options);
        options.count_nonfinite = 1;
        ckpt_writer *w;
        int id;
        cr_assert_eq(ckpt_writer_create(&w, path, &layout, &options), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(ckpt_writer_add_tensor(w, &t, &id), TP_OK, "%s", tp_errmsg());
        int64_t shape[CKPT_MAX_DIMS];
        ckpt_piece_shape(&t, tp, shape);
        cr_assert_eq(shape[0], (q / tp + 2) * granule, "each rank holds one key and one value head");
        uint8_t *piece = malloc((size_t)elements_of(shape, 2) * es);
        for (int p = 0; p < tp; p++) {
            build_piece(&t, tp, p, logical, piece);
            cr_assert_eq(ckpt_writer_put_piece(w, id, p, piece), TP_OK, "%s", tp_errmsg());
        }
        free(piece);

        int64_t nans = 0, infinities = 0, first = -1;
        float *wide = malloc((size_t)count * sizeof *wide);
        convert_to_f32(logical, t.dtype, wide, count);
        for (int64_t e = 0; e < count; e++) {
            nans += isnan(wide[e]) != 0;
            infinities += isinf(wide[e]) != 0;
            if (first < 0 && !isfinite(wide[e])) first = e;
        }
        free(wide);
        convert_nonfinite found = ckpt_writer_nonfinite(w, id);
        cr_assert(found.nans == nans && found.infinities == infinities && found.first == first,
                  "tp %d, %lld key/value heads of %lld rows: %lld NaNs, %lld infinities, first %lld; expected %lld, "
                  "%lld, %lld (each replicated element once)",
                  tp, (long long)kv, (long long)granule, (long long)found.nans, (long long)found.infinities,
                  (long long)found.first, (long long)nans, (long long)infinities, (long long)first);
        ckpt_writer_abort(w);
        free(logical);
    }
}
