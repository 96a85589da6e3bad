/* Foreign checkpoints whose pieces are stored as boxes (ckpt_foreign_box,
 * a PyTorch distributed checkpoint's chunks): random tensors at random
 * degrees cut into random grids of boxes scattered over two files, read
 * back whole, by rows and by region against a naive extraction, with
 * padding read as zeros and digests equal to the definition's; and every
 * tiling that is not one refused with a message naming the tensor. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../ckpt/ckpt.h"
#include "../support/fixture.h"

TestSuite(foreign, .init = make_dir, .fini = remove_dir);

#define MAX_BOXES 4096

typedef struct {
    ckpt_foreign_box boxes[MAX_BOXES];
    int64_t box_first[256];
    int64_t num_boxes;
    FILE *files[2];
    char paths[2][600];
    int64_t bytes[2];
} boxed;

/* Cut points of [0, n): 0, n and up to 3 random ones between, sorted, with
 * the extra cuts a split axis needs (each run of the piece whole). */
static int cuts_of(int64_t n, const int64_t *extra, int num_extra, int64_t *cuts)
{
    int k = 0;
    cuts[k++] = 0;
    for (int i = 0; i < 3; i++)
        if (n > 1 && rnd(0, 1)) cuts[k++] = rnd(1, n - 1);
    for (int i = 0; i < num_extra; i++) cuts[k++] = extra[i];
    cuts[k++] = n;
    for (int i = 1; i < k; i++) /* sort and drop repeats */
        for (int j = i; j > 0 && cuts[j - 1] > cuts[j]; j--) {
            int64_t x = cuts[j];
            cuts[j] = cuts[j - 1];
            cuts[j - 1] = x;
        }
    int m = 1;
    for (int i = 1; i < k; i++)
        if (cuts[i] != cuts[m - 1]) cuts[m++] = cuts[i];
    return m;
}

/* Cuts one stored piece into a grid of boxes (the padding runs of its split
 * axis left out) and appends each box's bytes to a random one of the two
 * files, in random order of boxes. */
static void cut_piece(boxed *b, const ckpt_tensor_desc *t, int tp, int piece, const uint8_t *data)
{
    int64_t shape[CKPT_MAX_DIMS];
    ckpt_piece_shape(t, tp, shape);
    size_t es = tp_dtype_size(t->dtype);
    int ndim = t->ndim, axis = t->partition.axis;
    ckpt_run runs[2 * CKPT_MAX_SEGMENTS];
    int64_t num_runs = t->partition.kind == CKPT_SPLIT ? ckpt_piece_runs(t, tp, piece, runs, 2 * CKPT_MAX_SEGMENTS) : 0;
    int64_t cuts[CKPT_MAX_DIMS][2 * CKPT_MAX_SEGMENTS + 8];
    int num_cuts[CKPT_MAX_DIMS];
    for (int d = 0; d < ndim; d++) {
        int64_t extra[2 * CKPT_MAX_SEGMENTS];
        int num_extra = 0;
        for (int64_t k = 0; d == axis && k < num_runs; k++) extra[num_extra++] = runs[k].local_start;
        num_cuts[d] = cuts_of(shape[d], extra, num_extra, cuts[d]);
    }
    int64_t cell[CKPT_MAX_DIMS] = {0};
    int64_t first = b->num_boxes;
    for (;;) {
        ckpt_foreign_box box = {0};
        int padding = 0;
        for (int d = 0; d < ndim; d++) {
            box.start[d] = cuts[d][cell[d]];
            box.count[d] = cuts[d][cell[d] + 1] - box.start[d];
        }
        for (int64_t k = 0; k < num_runs; k++)
            if (runs[k].logical_start < 0 && box.start[axis] >= runs[k].local_start &&
                box.start[axis] < runs[k].local_start + runs[k].length)
                padding = 1;
        if (!padding) {
            cr_assert(b->num_boxes < MAX_BOXES);
            b->boxes[b->num_boxes++] = box;
        }
        int d = ndim - 1;
        while (d >= 0 && ++cell[d] == num_cuts[d] - 1) cell[d--] = 0;
        if (d < 0) break;
    }
    /* Shuffled, then written: file order is not box order. */
    for (int64_t k = b->num_boxes - 1; k > first; k--) {
        int64_t j = rnd(first, k);
        ckpt_foreign_box x = b->boxes[k];
        b->boxes[k] = b->boxes[j];
        b->boxes[j] = x;
    }
    for (int64_t k = first; k < b->num_boxes; k++) {
        ckpt_foreign_box *box = &b->boxes[k];
        box->file = (int)rnd(0, 1);
        int64_t n = 1;
        for (int d = 0; d < ndim; d++) n *= box->count[d];
        uint8_t *bytes = malloc((size_t)n * es + 1);
        /* The box row-major, element by element from the piece. */
        int64_t idx[CKPT_MAX_DIMS] = {0};
        for (int64_t e = 0; e < n; e++) {
            int64_t flat = 0;
            for (int d = 0; d < ndim; d++) flat = flat * shape[d] + box->start[d] + idx[d];
            memcpy(bytes + e * (int64_t)es, data + flat * (int64_t)es, es);
            for (int d = ndim - 1; d >= 0 && ++idx[d] == box->count[d]; d--) idx[d] = 0;
        }
        int gap = (int)rnd(0, 7); /* boxes need not be packed */
        b->bytes[box->file] += gap;
        fseek(b->files[box->file], b->bytes[box->file], SEEK_SET);
        box->offset = b->bytes[box->file];
        cr_assert_eq(fwrite(bytes, 1, (size_t)n * es, b->files[box->file]), (size_t)n * es);
        b->bytes[box->file] += n * (int64_t)es;
        free(bytes);
    }
}

static void open_boxed(boxed *b, int iter)
{
    memset(b, 0, sizeof *b);
    for (int f = 0; f < 2; f++) {
        snprintf(b->paths[f], sizeof b->paths[f], "%s/__%d_%d.distcp", dir, f, iter);
        b->files[f] = fopen(b->paths[f], "wb");
        cr_assert(b->files[f]);
    }
}

static int open_reader(boxed *b, const ckpt_layout *layout, const ckpt_tensor_desc *descs, int n, int digests,
                       ckpt_reader **out)
{
    for (int f = 0; f < 2; f++) {
        fflush(b->files[f]);
        if (b->files[f]) fclose(b->files[f]);
        b->files[f] = NULL;
    }
    const char *files[2] = {b->paths[0], b->paths[1]};
    ckpt_foreign source = {.path = dir, .layout = *layout, .num_tensors = n, .tensors = descs, .num_files = 2,
                           .files = files, .file_bytes = b->bytes, .boxes = b->boxes, .box_first = b->box_first};
    return ckpt_reader_open_foreign(out, &source, digests);
}

Test(foreign, random_boxes_read_back)
{
    for (int iter = 0; iter < 30; iter++) {
        int tp = (int)rnd(1, 4);
        ckpt_layout layout = {tp, 1, 1, 3, 1};
        test_tensor tensors[8];
        int n = random_tensors(tensors, 8, &tp, 1, 3);
        boxed *b = malloc(sizeof *b);
        open_boxed(b, iter);
        ckpt_tensor_desc descs[8];
        int64_t pieces = 0;
        for (int i = 0; i < n; i++) {
            descs[i] = tensors[i].desc;
            int64_t pshape[CKPT_MAX_DIMS];
            ckpt_piece_shape(&descs[i], tp, pshape);
            size_t bytes = (size_t)elements_of(pshape, descs[i].ndim) * tp_dtype_size(descs[i].dtype);
            uint8_t *piece = malloc(bytes);
            for (int p = 0; p < ckpt_piece_count(&descs[i], tp); p++) {
                build_piece(&descs[i], tp, p, tensors[i].logical, piece);
                b->box_first[pieces++] = b->num_boxes;
                cut_piece(b, &descs[i], tp, p, piece);
            }
            free(piece);
        }
        b->box_first[pieces] = b->num_boxes;
        ckpt_reader *r;
        cr_assert_eq(open_reader(b, &layout, descs, n, 1, &r), TP_OK, "%s", tp_errmsg());
        for (int i = 0; i < n; i++) {
            const test_tensor *t = &tensors[i];
            size_t es = tp_dtype_size(t->desc.dtype);
            cr_assert_eq(ckpt_reader_digest(r, i), naive_digest(t->logical, es, elements_of(t->desc.shape, t->desc.ndim)),
                         "logical digest of %s", t->name);
            int64_t pshape[CKPT_MAX_DIMS];
            ckpt_piece_shape(&t->desc, tp, pshape);
            size_t piece_bytes = (size_t)elements_of(pshape, t->desc.ndim) * es;
            int64_t row_bytes = (int64_t)piece_bytes / pshape[0];
            uint8_t *want = malloc(piece_bytes), *got = malloc(piece_bytes);
            for (int p = 0; p < ckpt_piece_count(&t->desc, tp); p++) {
                build_piece(&t->desc, tp, p, t->logical, want);
                memset(got, 0xAB, piece_bytes);
                cr_assert_eq(ckpt_reader_read_piece(r, i, p, got, piece_bytes), TP_OK, "%s", tp_errmsg());
                cr_assert_eq(memcmp(want, got, piece_bytes), 0, "piece %d of %s (padding zero)", p, t->name);
                int64_t row0 = rnd(0, pshape[0] - 1), rows = rnd(1, pshape[0] - row0);
                memset(got, 0xAB, piece_bytes);
                cr_assert_eq(ckpt_reader_read_rows(r, i, p, row0, rows, got, piece_bytes), TP_OK, "%s", tp_errmsg());
                cr_assert_eq(memcmp(want + row0 * row_bytes, got, (size_t)(rows * row_bytes)), 0, "rows of %s", t->name);
                cr_assert_eq(ckpt_reader_verify_piece(r, i, p), TP_OK, "%s", tp_errmsg());
            }
            free(want);
            free(got);
            for (int q = 0; q < 6; q++) {
                int64_t start[CKPT_MAX_DIMS], count[CKPT_MAX_DIMS];
                for (int d = 0; d < t->desc.ndim; d++) {
                    start[d] = q == 0 ? 0 : rnd(0, t->desc.shape[d] - 1);
                    count[d] = q == 0 ? t->desc.shape[d] : rnd(1, t->desc.shape[d] - start[d]);
                }
                size_t bytes = (size_t)elements_of(count, t->desc.ndim) * es;
                uint8_t *expect = malloc(bytes), *region = malloc(bytes);
                extract(t, start, count, expect);
                cr_assert_eq(ckpt_reader_read_region(r, i, start, count, region, bytes), TP_OK, "%s", tp_errmsg());
                cr_assert_eq(memcmp(expect, region, bytes), 0, "region %d of %s", q, t->name);
                free(expect);
                free(region);
            }
        }
        ckpt_reader_close(r);
        for (int i = 0; i < n; i++) free(tensors[i].logical);
        free(b);
    }
}

/* Rows longer than the bounce buffer, read through runs, and many rows
 * bounced in groups: a [3, 3M] fp32 tensor in two column boxes and a
 * [5000, 1000] one in row-and-column boxes. */
Test(foreign, long_rows_and_groups)
{
    ckpt_layout layout = {1, 1, 1, 1, 1};
    const int64_t shapes[2][2] = {{3, 3 << 20}, {5000, 1000}};
    for (int k = 0; k < 2; k++) {
        test_tensor t = {0};
        snprintf(t.name, sizeof t.name, "model/w%d", k);
        t.desc = (ckpt_tensor_desc){.name = t.name, .dtype = TP_FP32, .ndim = 2, .shape = {shapes[k][0], shapes[k][1]},
                                    .anchor = CKPT_ANCHOR_FIRST};
        size_t bytes = (size_t)(shapes[k][0] * shapes[k][1] * 4);
        t.logical = malloc(bytes);
        for (size_t e = 0; e < bytes / 4; e++) ((uint32_t *)t.logical)[e] = (uint32_t)(e * 2654435761u);
        boxed *b = malloc(sizeof *b);
        open_boxed(b, k);
        b->box_first[0] = 0;
        int64_t col = shapes[k][1] / 3, row = k ? 1777 : shapes[k][0];
        /* [0, row) x [0, col), [0, row) x [col, end), then [row, end) x all */
        const int64_t grid[3][4] = {{0, row, 0, col}, {0, row, col, shapes[k][1]}, {row, shapes[k][0], 0, shapes[k][1]}};
        for (int g = 0; g < 3; g++) {
            if (grid[g][1] <= grid[g][0]) continue;
            ckpt_foreign_box *box = &b->boxes[b->num_boxes++];
            *box = (ckpt_foreign_box){.file = g % 2, .start = {grid[g][0], grid[g][2]},
                                      .count = {grid[g][1] - grid[g][0], grid[g][3] - grid[g][2]}};
            box->offset = b->bytes[box->file];
            int64_t stride = 4;
            for (int64_t r = 0; r < box->count[0]; r++) {
                const uint8_t *src = t.logical + ((box->start[0] + r) * shapes[k][1] + box->start[1]) * stride;
                cr_assert_eq(fwrite(src, 4, (size_t)box->count[1], b->files[box->file]), (size_t)box->count[1]);
            }
            b->bytes[box->file] += box->count[0] * box->count[1] * 4;
        }
        b->box_first[1] = b->num_boxes;
        ckpt_reader *r;
        cr_assert_eq(open_reader(b, &layout, &t.desc, 1, 1, &r), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(ckpt_reader_digest(r, 0), naive_digest(t.logical, 4, shapes[k][0] * shapes[k][1]));
        uint8_t *got = malloc(bytes);
        cr_assert_eq(ckpt_reader_read_piece(r, 0, 0, got, bytes), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(memcmp(got, t.logical, bytes), 0);
        int64_t start[2] = {1, col - 5}, count[2] = {shapes[k][0] - 1, 10};
        size_t region = (size_t)(count[0] * count[1] * 4);
        uint8_t *want = malloc(region);
        extract(&t, start, count, want);
        cr_assert_eq(ckpt_reader_read_region(r, 0, start, count, got, region), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(memcmp(got, want, region), 0, "a region across the column cut");
        ckpt_reader_close(r);
        free(want);
        free(got);
        free(t.logical);
        free(b);
    }
}

/* One [4, 6] tensor (or [10, 6] split at tp2 with padding) cut by the
 * given boxes; the open must fail with a message holding `expect`. */
static void refused(const ckpt_foreign_box *boxes, int n, int padded, int64_t file_bytes, const char *expect)
{
    boxed *b = malloc(sizeof *b);
    open_boxed(b, 99);
    ckpt_tensor_desc t = {.name = "model/w", .dtype = TP_FP32, .ndim = 2, .shape = {4, 6}, .anchor = CKPT_ANCHOR_FIRST};
    ckpt_layout layout = {1, 1, 1, 1, 1};
    if (padded) { /* 10 rows padded to 16 at tp2: piece 1 holds rows 8, 9 and six of padding */
        t.shape[0] = 10;
        t.partition = (ckpt_partition){CKPT_SPLIT, 0, 0, {0}, 1, 8, 0};
        layout.tp = 2;
        b->boxes[0] = (ckpt_foreign_box){.file = 0, .offset = 0, .start = {0, 0}, .count = {8, 6}};
        b->num_boxes = 1;
    }
    b->box_first[0] = 0;
    b->box_first[1] = b->num_boxes;
    for (int k = 0; k < n; k++) b->boxes[b->num_boxes++] = boxes[k];
    b->box_first[padded ? 2 : 1] = b->num_boxes;
    b->bytes[0] = b->bytes[1] = file_bytes;
    ckpt_reader *r = NULL;
    int status = open_reader(b, &layout, &t, 1, 0, &r);
    cr_assert_neq(status, TP_OK, "refused: %s", expect);
    cr_assert(strstr(tp_errmsg(), expect) && strstr(tp_errmsg(), "model/w"), "message '%s' names '%s' and the tensor",
              tp_errmsg(), expect);
    free(b);
}

Test(foreign, refusals_name_the_tensor)
{
    ckpt_foreign_box overlap[2] = {{.file = 0, .offset = 0, .start = {0, 0}, .count = {4, 4}},
                                   {.file = 1, .offset = 0, .start = {2, 3}, .count = {2, 3}}};
    refused(overlap, 2, 0, 1024, "overlap");
    ckpt_foreign_box gap[2] = {{.file = 0, .offset = 0, .start = {0, 0}, .count = {4, 3}},
                               {.file = 1, .offset = 0, .start = {0, 3}, .count = {3, 3}}};
    refused(gap, 2, 0, 1024, "chunk missing");
    ckpt_foreign_box outside[1] = {{.file = 0, .offset = 0, .start = {1, 0}, .count = {4, 6}}};
    refused(outside, 1, 0, 1024, "outside 0..4");
    ckpt_foreign_box negative[1] = {{.file = 0, .offset = 0, .start = {0, -1}, .count = {4, 6}}};
    refused(negative, 1, 0, 1024, "outside 0..6");
    ckpt_foreign_box short_file[1] = {{.file = 1, .offset = 8, .start = {0, 0}, .count = {4, 6}}};
    refused(short_file, 1, 0, 96, "lies outside the file");
    ckpt_foreign_box no_file[1] = {{.file = 2, .offset = 0, .start = {0, 0}, .count = {4, 6}}};
    refused(no_file, 1, 0, 1024, "in no file");
    ckpt_foreign_box on_padding[1] = {{.file = 1, .offset = 0, .start = {0, 0}, .count = {3, 6}}};
    refused(on_padding, 1, 1, 1024, "padding");
}

/* A [rows, cols] fp32 tensor stored in one (sparse) file and described by
 * the n boxes given; the open's status, its message in tp_errmsg(). */
static int open_many_boxes(int64_t rows, int64_t cols, ckpt_foreign_box *boxes, int64_t n)
{
    char path[700];
    snprintf(path, sizeof path, "%s/chunks.bin", dir);
    int64_t bytes = rows * cols * 4;
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(ftruncate(fileno(f), bytes), 0);
    fclose(f);
    ckpt_tensor_desc t = {.name = "model/w", .dtype = TP_FP32, .ndim = 2, .shape = {rows, cols},
                          .anchor = CKPT_ANCHOR_FIRST};
    ckpt_layout layout = {1, 1, 1, 1, 1};
    const char *files[1] = {path};
    int64_t box_first[2] = {0, n};
    ckpt_foreign source = {.path = dir, .layout = layout, .num_tensors = 1, .tensors = &t, .num_files = 1,
                           .files = files, .file_bytes = &bytes, .boxes = boxes, .box_first = box_first};
    ckpt_reader *r = NULL;
    int status = ckpt_reader_open_foreign(&r, &source, 0);
    if (r) ckpt_reader_close(r);
    return status;
}

/* A foreign index is untrusted: the overlap check of its chunks must end
 * soon whatever their order and shapes. 200,000 one-element chunks of a
 * [1, 200000] tensor in reverse order took the reader n^2 / 2 comparisons
 * (all start at row 0: minutes); swept along the axis they are cut along,
 * about n. The timeout is that bound's guard, not a speed target. */
Test(foreign, chunks_cut_along_columns_in_reverse_checked_in_bounded_time, .timeout = 120)
{
    int64_t n = 200000;
    ckpt_foreign_box *boxes = calloc((size_t)n, sizeof *boxes);
    cr_assert_not_null(boxes);
    for (int64_t k = 0; k < n; k++) {
        int64_t col = n - 1 - k;
        boxes[k] = (ckpt_foreign_box){.file = 0, .offset = col * 4, .start = {0, col}, .count = {1, 1}};
    }
    cr_assert_eq(open_many_boxes(1, n, boxes, n), TP_OK, "%s", tp_errmsg());
    boxes[n - 1].start[1] = 1; /* column 0 left out, column 1 twice */
    cr_assert_neq(open_many_boxes(1, n, boxes, n), TP_OK);
    cr_assert(strstr(tp_errmsg(), "two chunks overlap") && strstr(tp_errmsg(), "of dimension 1"), "%s", tp_errmsg());
    free(boxes);
}

/* A valid tiling that defeats any one sweep: N rows of [1, N/2] on the
 * left, N/2 columns of [N, 1] on the right; along either axis one half of
 * them all share their range (N^2 / 2 pairs). Refused, by its bound of
 * 256 comparisons a chunk, naming the tensor (the reader before the bound
 * took it, after 2^29 comparisons). */
Test(foreign, chunks_cut_two_ways_refused_by_the_bound, .timeout = 120)
{
    int64_t side = 1 << 15, n = side + side / 2;
    ckpt_foreign_box *boxes = calloc((size_t)n, sizeof *boxes);
    cr_assert_not_null(boxes);
    int64_t offset = 0;
    for (int64_t row = 0; row < side; row++, offset += side / 2 * 4)
        boxes[row] = (ckpt_foreign_box){.file = 0, .offset = offset, .start = {row, 0}, .count = {1, side / 2}};
    for (int64_t col = 0; col < side / 2; col++, offset += side * 4)
        boxes[side + col] = (ckpt_foreign_box){.file = 0, .offset = offset, .start = {0, side / 2 + col},
                                               .count = {side, 1}};
    cr_assert_neq(open_many_boxes(side, side, boxes, n), TP_OK, "refused");
    cr_assert(strstr(tp_errmsg(), "model/w") && strstr(tp_errmsg(), "more than 12648448 comparisons (256 a chunk"), "%s",
              tp_errmsg());
    free(boxes);
}

/* A tensor of `shape` (fp32, element value its row-major index) stored as
 * two boxes cut along dimension 0 at `cut`: the first dense in `order`
 * (permuted), the second row-major, in two files; read back whole, by
 * random row ranges (each read from the rows a thread keeps, or read
 * again where they do not hold it) and by random regions, against the
 * values. Box bytes over the 8 MiB a thread keeps and slabs of stored
 * runs shorter than the box are the edges of read_permuted_box. */
static void permuted_round_trip(int ndim, const int64_t *shape, int64_t cut, const int *order, unsigned seed)
{
    boxed *b = calloc(1, sizeof *b);
    open_boxed(b, (int)seed);
    ckpt_tensor_desc t = {.name = "model/w", .dtype = TP_FP32, .ndim = ndim, .anchor = CKPT_ANCHOR_FIRST};
    int64_t numel = 1, inner = 1;
    for (int d = 0; d < ndim; d++) {
        t.shape[d] = shape[d];
        numel *= shape[d];
        if (d > 0) inner *= shape[d];
    }
    /* Box 0: rows [0, cut), its elements written in `order`. */
    int64_t box_shape[CKPT_MAX_DIMS] = {0}, stored[CKPT_MAX_DIMS], idx[CKPT_MAX_DIMS] = {0}, box_numel = cut * inner;
    memcpy(box_shape, shape, (size_t)ndim * sizeof *shape);
    box_shape[0] = cut;
    for (int j = 0; j < ndim; j++) stored[j] = box_shape[order[j]];
    float *data = malloc((size_t)(box_numel > 1 ? box_numel : 1) * sizeof *data);
    for (int64_t k = 0; k < box_numel; k++) {
        int64_t flat = 0; /* idx: the element's index, in stored order */
        for (int d = 0; d < ndim; d++) {
            int64_t at = 0;
            for (int j = 0; j < ndim; j++)
                if (order[j] == d) at = idx[j];
            flat = flat * shape[d] + at;
        }
        data[k] = (float)flat;
        for (int j = ndim - 1; j >= 0 && ++idx[j] == stored[j]; j--) idx[j] = 0;
    }
    fwrite("pad", 1, 3, b->files[0]); /* an offset not aligned */
    cr_assert_eq(fwrite(data, sizeof *data, (size_t)box_numel, b->files[0]), (size_t)box_numel);
    b->boxes[0] = (ckpt_foreign_box){.file = 0, .offset = 3, .permuted = 1};
    for (int d = 0; d < ndim; d++) {
        b->boxes[0].count[d] = box_shape[d];
        b->boxes[0].order[d] = order[d];
    }
    /* Box 1: rows [cut, shape[0]), row-major. */
    int64_t rest = numel - box_numel;
    float *tail = malloc((size_t)(rest > 1 ? rest : 1) * sizeof *tail);
    for (int64_t k = 0; k < rest; k++) tail[k] = (float)(box_numel + k);
    cr_assert_eq(fwrite(tail, sizeof *tail, (size_t)rest, b->files[1]), (size_t)rest);
    b->boxes[1] = (ckpt_foreign_box){.file = 1, .offset = 0};
    for (int d = 0; d < ndim; d++) {
        b->boxes[1].start[d] = d == 0 ? cut : 0;
        b->boxes[1].count[d] = d == 0 ? shape[0] - cut : shape[d];
    }
    b->num_boxes = 2;
    b->box_first[0] = 0;
    b->box_first[1] = 2;
    b->bytes[0] = 3 + box_numel * 4;
    b->bytes[1] = rest * 4;
    ckpt_layout layout = {1, 1, 1, 1, 1};
    ckpt_reader *r = NULL;
    cr_assert_eq(open_reader(b, &layout, &t, 1, 0, &r), TP_OK, "%s", tp_errmsg());
    float *got = malloc((size_t)numel * sizeof *got);
    cr_assert_eq(ckpt_reader_read_piece(r, 0, 0, got, (size_t)numel * 4), TP_OK, "%s", tp_errmsg());
    for (int64_t k = 0; k < numel; k++) cr_assert_eq(got[k], (float)k, "whole: element %lld is %g", (long long)k, got[k]);
    srand(seed);
    for (int trial = 0; trial < 24; trial++) {
        int64_t row0 = rand() % shape[0], rows = 1 + rand() % (shape[0] - row0);
        if (trial % 3 == 0 && rows > 4) rows = 1 + rows % 4; /* a few rows: kept ones */
        memset(got, 0xff, (size_t)(rows * inner) * 4);
        cr_assert_eq(ckpt_reader_read_rows(r, 0, 0, row0, rows, got, (size_t)numel * 4), TP_OK, "%s", tp_errmsg());
        for (int64_t k = 0; k < rows * inner; k++)
            cr_assert_eq(got[k], (float)(row0 * inner + k), "rows [%lld, +%lld): element %lld is %g", (long long)row0,
                         (long long)rows, (long long)k, got[k]);
        int64_t start[CKPT_MAX_DIMS], count[CKPT_MAX_DIMS], n = 1;
        for (int d = 0; d < ndim; d++) {
            start[d] = rand() % shape[d];
            count[d] = 1 + rand() % (shape[d] - start[d]);
            n *= count[d];
        }
        cr_assert_eq(ckpt_reader_read_region(r, 0, start, count, got, (size_t)numel * 4), TP_OK, "%s", tp_errmsg());
        int64_t at[CKPT_MAX_DIMS] = {0};
        for (int64_t k = 0; k < n; k++) {
            int64_t flat = 0;
            for (int d = 0; d < ndim; d++) flat = flat * shape[d] + start[d] + at[d];
            cr_assert_eq(got[k], (float)flat, "region: element %lld is %g, not %lld", (long long)k, got[k], (long long)flat);
            for (int d = ndim - 1; d >= 0 && ++at[d] == count[d]; d--) at[d] = 0;
        }
    }
    ckpt_reader_close(r);
    free(got);
    free(data);
    free(tail);
    free(b);
}

Test(foreign, permuted_boxes_read_back, .timeout = 120)
{
    /* transposed: 2.4 MB, kept whole */
    permuted_round_trip(2, (int64_t[]){300, 2100}, 290, (int[]){1, 0}, 1);
    /* transposed, 9.2 MB: more rows than a thread keeps (8 MiB), stored columns longer than a slab needs */
    permuted_round_trip(2, (int64_t[]){1100, 2100}, 1097, (int[]){1, 0}, 2);
    /* transposed, 36 MB: the rows a thread keeps (2,097) under a quarter of a stored column (8,999), read a run
     * per column, packed */
    permuted_round_trip(2, (int64_t[]){9000, 1000}, 8999, (int[]){1, 0}, 7);
    /* a 4-D permutation, and channels_last's */
    permuted_round_trip(4, (int64_t[]){6, 4, 5, 3}, 5, (int[]){2, 0, 3, 1}, 3);
    permuted_round_trip(4, (int64_t[]){3, 4, 5, 6}, 2, (int[]){0, 2, 3, 1}, 4);
    /* size-1 dimensions (torch puts them last in its order), and 1-D */
    permuted_round_trip(3, (int64_t[]){7, 1, 3}, 6, (int[]){2, 0, 1}, 5);
    permuted_round_trip(1, (int64_t[]){9}, 5, (int[]){0}, 6);
}

/* A file cut short after the open checked its size: the read of a
 * permuted box that meets its end fails, naming the file and the tensor
 * (nothing read from past it is served as data). */
Test(foreign, permuted_box_of_a_file_cut_short)
{
    boxed *b = calloc(1, sizeof *b);
    open_boxed(b, 77);
    ckpt_tensor_desc t = {.name = "model/w", .dtype = TP_FP32, .ndim = 2, .shape = {64, 48}, .anchor = CKPT_ANCHOR_FIRST};
    float data[64 * 48];
    for (int k = 0; k < 64 * 48; k++) data[k] = (float)k;
    cr_assert_eq(fwrite(data, sizeof data, 1, b->files[0]), 1);
    b->boxes[0] = (ckpt_foreign_box){.file = 0, .count = {64, 48}, .permuted = 1, .order = {1, 0}};
    b->num_boxes = 1;
    b->box_first[1] = 1;
    b->bytes[0] = sizeof data;
    ckpt_layout layout = {1, 1, 1, 1, 1};
    ckpt_reader *r = NULL;
    cr_assert_eq(open_reader(b, &layout, &t, 1, 0, &r), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(truncate(b->paths[0], (off_t)sizeof data / 2), 0);
    int status = ckpt_reader_read_rows(r, 0, 0, 0, 2, data, sizeof data);
    cr_assert_neq(status, TP_OK, "a read past the end of a file cut short fails");
    cr_assert(strstr(tp_errmsg(), b->paths[0]) && strstr(tp_errmsg(), "model/w"), "'%s' names the file and the tensor",
              tp_errmsg());
    ckpt_reader_close(r);
    free(b);
}

Test(foreign, permuted_box_of_no_order_refused)
{
    ckpt_foreign_box twice[1] = {{.file = 0, .offset = 0, .start = {0, 0}, .count = {4, 6}, .permuted = 1, .order = {0, 0}}};
    refused(twice, 1, 0, 1000, "no order of its 2 dimensions");
    ckpt_foreign_box outside[1] = {{.file = 0, .offset = 0, .start = {0, 0}, .count = {4, 6}, .permuted = 1, .order = {2, 0}}};
    refused(outside, 1, 0, 1000, "no order of its 2 dimensions");
}
