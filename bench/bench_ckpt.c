/* bench_ckpt: checkpoint write and read throughput of the library itself.
 *
 *   bench_ckpt write DIR --gb N [--tp T] [--pp P] [--threads N] [--compress L] [--dim D] [--vocab V]
 *   bench_ckpt read DIR [--threads N] [--no-verify]
 *
 * write: a GPT-shaped checkpoint of about N GiB with optimizer state (dim D,
 * default 2048, and vocabulary V, default 50257: a smaller shape lets a test
 * write a checkpoint of a few MiB; at least one layer per stage), from
 * data already in memory (as a trainer has it), through the writer API on N
 * threads, committed (fsynced). read: every piece of a checkpoint streamed
 * through an 8 MiB buffer per thread (as the resharder consumes them) on N
 * threads, every block checksum verified. Prints one JSON line:
 * {"op":..., "bytes":..., "seconds":..., "gbps":...}. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../ckpt/ckpt.h"
#include "../programs/synth.h"
#include "../programs/cli.h"
#include "../common/memory.h"
#include "../common/parallel.h"
#include "../common/clock.h"
#include "../model/gpt.h"

#define SLAB_BYTES ((int64_t)8 << 20)

typedef struct {
    int tensor, piece;
    int64_t row, rows;
    int file; /* shard file, for reading each file front to back */
} slab;

static int by_file_order(const void *a, const void *b)
{
    const slab *x = a, *y = b;
    if (x->file != y->file) return x->file - y->file;
    if (x->tensor != y->tensor) return x->tensor - y->tensor;
    return x->row < y->row ? -1 : x->row > y->row;
}

typedef struct {
    ckpt_writer *writer;
    const gpt_tensor *catalog;
    const int *ids;
    const slab *slabs;
    int tp;
    const float *pattern; /* SLAB_BYTES of realistic values, reused for every slab */
} write_job;

static int write_slab(void *ctx, int64_t i, int thread)
{
    (void)thread;
    write_job *job = ctx;
    const slab *s = &job->slabs[i];
    return ckpt_writer_put_rows(job->writer, job->ids[s->tensor], s->piece, s->row, s->rows, job->pattern);
}

static int bench_write(const char *dir, double gib, int tp, int pp, int threads, int compress, int64_t dim,
                       int64_t vocab)
{
    /* GPT-2-like proportions: 16 heads, sequence 2048; layers for the size. */
    gpt_config config = {.dim = dim, .heads = 16, .vocab = vocab, .seq = 2048, .dtype = TP_FP32};
    gpt_config_defaults(&config);
    double bytes_per_layer = 12.0 * dim * dim * 4 * 3; /* weights + Adam moments, fp32 */
    double embedding_bytes = ((double)vocab + 2048) * dim * 4 * 3;
    double layers = (gib * 1073741824.0 - embedding_bytes) / bytes_per_layer;
    config.layers = (int64_t)ceil((layers > 1 ? layers : 1) / pp) * pp;
    gpt_tensor *catalog;
    int count;
    if (gpt_config_check(&config, tp, pp) || gpt_catalog(&config, 1, &catalog, &count))
        return fprintf(stderr, "%s\n", tp_errmsg()), 1;
    float *pattern = alloc_pages(SLAB_BYTES);
    synth_fill(1, 2, 0.0f, 0.02f, 0, SLAB_BYTES / 4, pattern);

    ckpt_layout layout = {tp, pp, 1, config.layers, 1};
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    options.compress_level = compress;
    options.overwrite = 1;
    double start = now_seconds();
    ckpt_writer *writer;
    if (ckpt_writer_create(&writer, dir, &layout, &options)) return fprintf(stderr, "%s\n", tp_errmsg()), 1;
    int *ids = calloc((size_t)count, sizeof *ids);
    slab *slabs = NULL;
    int64_t num_slabs = 0, capacity = 0, total = 0;
    for (int i = 0; i < count; i++) {
        if (ckpt_writer_add_tensor(writer, &catalog[i].desc, &ids[i]))
            return fprintf(stderr, "%s\n", tp_errmsg()), 1;
        int64_t shape[CKPT_MAX_DIMS], row_bytes = (int64_t)tp_dtype_size(catalog[i].desc.dtype);
        ckpt_piece_shape(&catalog[i].desc, tp, shape);
        for (int d = 1; d < catalog[i].desc.ndim; d++) row_bytes *= shape[d];
        int64_t block = ckpt_writer_block_rows(writer, ids[i]);
        int64_t rows = SLAB_BYTES / row_bytes / block * block;
        if (rows < block) rows = block;
        for (int p = 0; p < ckpt_piece_count(&catalog[i].desc, tp); p++) {
            for (int64_t r = 0; r < shape[0]; r += rows) {
                if (num_slabs == capacity) {
                    capacity = capacity ? capacity * 2 : 4096;
                    slabs = realloc(slabs, (size_t)capacity * sizeof *slabs);
                }
                int64_t n = shape[0] - r < rows ? shape[0] - r : rows;
                slabs[num_slabs++] = (slab){i, p, r, n, 0};
                total += n * row_bytes;
            }
        }
    }
    write_job job = {writer, catalog, ids, slabs, tp, pattern};
    if (parallel_for(num_slabs, threads, write_slab, &job))
        return fprintf(stderr, "%s\n", tp_errmsg()), 1;
    ckpt_train_state state = {1, 0, NULL, NULL, NULL, NULL};
    if (ckpt_writer_commit(writer, &state)) return fprintf(stderr, "%s\n", tp_errmsg()), 1;
    double seconds = now_seconds() - start;
    printf("{\"op\":\"write\",\"bytes\":%lld,\"seconds\":%.3f,\"gbps\":%.3f,\"layers\":%lld,\"compress\":%d}\n",
           (long long)total, seconds, total / seconds / 1e9, (long long)config.layers, compress);
    free(slabs);
    free(ids);
    free(pattern);
    free(catalog);
    return 0;
}

typedef struct {
    ckpt_reader *reader;
    slab *slabs;
    char **buffers;
} read_job;

static int read_slab(void *ctx, int64_t i, int thread)
{
    read_job *job = ctx;
    const slab *s = &job->slabs[i];
    return ckpt_reader_read_rows(job->reader, s->tensor, s->piece, s->row, s->rows, job->buffers[thread],
                                 SLAB_BYTES);
}

static int bench_read(const char *dir, int threads, int verify)
{
    double start = now_seconds();
    ckpt_read_options options;
    ckpt_read_options_init(&options);
    options.verify = verify;
    ckpt_reader *r;
    if (ckpt_reader_open(&r, dir, &options)) return fprintf(stderr, "%s\n", tp_errmsg()), 1;
    const ckpt_layout *layout = ckpt_reader_layout(r);
    slab *slabs = NULL;
    int64_t num_slabs = 0, capacity = 0, total = 0;
    for (int i = 0; i < ckpt_reader_num_tensors(r); i++) {
        const ckpt_tensor_desc *t = ckpt_reader_tensor(r, i);
        for (int p = 0; p < ckpt_piece_count(t, layout->tp); p++) {
            ckpt_piece_info info;
            ckpt_reader_piece_info(r, i, p, &info);
            int64_t row_bytes = info.bytes / info.shape[0];
            int64_t rows = SLAB_BYTES / row_bytes;
            if (rows < 1) return fprintf(stderr, "rows of %s exceed the slab\n", t->name), 1;
            for (int64_t row = 0; row < info.shape[0]; row += rows) {
                if (num_slabs == capacity) {
                    capacity = capacity ? capacity * 2 : 4096;
                    slabs = realloc(slabs, (size_t)capacity * sizeof *slabs);
                }
                int64_t n = info.shape[0] - row < rows ? info.shape[0] - row : rows;
                slabs[num_slabs++] = (slab){i, p, row, n, info.pp * layout->tp + info.tp};
            }
            total += info.bytes;
        }
    }
    /* Threads take consecutive slabs of one file: the disk sees one stream. */
    qsort(slabs, (size_t)num_slabs, sizeof *slabs, by_file_order);
    char **buffers = calloc((size_t)threads, sizeof *buffers);
    for (int t = 0; t < threads; t++) buffers[t] = alloc_pages(SLAB_BYTES);
    read_job job = {r, slabs, buffers};
    if (parallel_for(num_slabs, threads, read_slab, &job))
        return fprintf(stderr, "%s\n", tp_errmsg()), 1;
    double seconds = now_seconds() - start;
    printf("{\"op\":\"read\",\"bytes\":%lld,\"seconds\":%.3f,\"gbps\":%.3f,\"verify\":%d}\n", (long long)total,
           seconds, total / seconds / 1e9, verify);
    for (int t = 0; t < threads; t++) free(buffers[t]);
    free(buffers);
    free(slabs);
    ckpt_reader_close(r);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_ckpt write DIR --gb N [--tp T] [--pp P] [--threads N] [--compress L] "
                        "[--dim D] [--vocab V]\n"
                        "       bench_ckpt read DIR [--threads N] [--no-verify]\n");
        return 2;
    }
    double gib = 4;
    int64_t tp = 4, pp = 1, threads = parallel_cpu_count(), compress = 0, dim = 2048, vocab = 50257;
    int verify = 1;
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        int bad = 0;
        if (strcmp(a, "--gb") == 0) bad = parse_double(v, &gib), i++;
        else if (strcmp(a, "--tp") == 0) bad = parse_int(v, 1, 64, &tp), i++;
        else if (strcmp(a, "--pp") == 0) bad = parse_int(v, 1, 64, &pp), i++;
        else if (strcmp(a, "--threads") == 0) bad = parse_int(v, 1, 256, &threads), i++;
        else if (strcmp(a, "--compress") == 0) bad = parse_int(v, 0, 22, &compress), i++;
        else if (strcmp(a, "--dim") == 0) bad = parse_int(v, 16, 65536, &dim), i++;
        else if (strcmp(a, "--vocab") == 0) bad = parse_int(v, 2, 1 << 24, &vocab), i++;
        else if (strcmp(a, "--no-verify") == 0) verify = 0;
        else bad = 1;
        if (bad) return fprintf(stderr, "bench_ckpt: bad option %s\n", a), 2;
    }
    if (strcmp(argv[1], "write") == 0)
        return bench_write(argv[2], gib, (int)tp, (int)pp, (int)threads, (int)compress, dim, vocab);
    if (strcmp(argv[1], "read") == 0) return bench_read(argv[2], (int)threads, verify);
    fprintf(stderr, "bench_ckpt: unknown mode %s\n", argv[1]);
    return 2;
}
