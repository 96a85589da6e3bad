/* verify.c: an output proven equal to its source without merging anything.
 * Each output piece is read and checked against its checksums and its part
 * of the logical digest; each tensor's logical digest is compared with the
 * source's. Where the dtype changed, the expected digest is that of the
 * source values converted, computed from the source one slab at a time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/memory.h"
#include "../common/parallel.h"
#include "internal.h"

#define VERIFY_SLAB_BYTES RESHARD_READ_BACK_BYTES

typedef struct {
    ckpt_reader *source, *output;
    int *mismatch;       /* per output tensor: 0 equal, 1 differs */
    char (*reason)[512];
} verify_job;

/* Logical rows of source tensor t that converted_digest reads at a time
 * (about VERIFY_SLAB_BYTES as fp32, at least one row), *row its elements a row. */
static int64_t converted_slab_rows(const ckpt_tensor_desc *t, int64_t *row)
{
    *row = 1;
    for (int d = 1; d < t->ndim; d++) *row *= t->shape[d];
    int64_t rows = VERIFY_SLAB_BYTES / (*row * 4);
    if (rows < 1) rows = 1;
    if (rows > t->shape[0]) rows = t->shape[0];
    return rows;
}

/* Digest of a source tensor converted to dtype, slab by slab of logical rows. */
static int converted_digest(ckpt_reader *source, int index, tp_dtype dtype, uint64_t *out)
{
    const ckpt_tensor_desc *t = ckpt_reader_tensor(source, index);
    int64_t row;
    int64_t rows = converted_slab_rows(t, &row);
    size_t src_bytes = (size_t)(rows * row) * tp_dtype_size(t->dtype);
    size_t src_pages = (src_bytes + 4095) / 4096 * 4096; /* the converted values page-aligned after the raw */
    /* [rows of the source][the same converted] (reshard_converted_digest_bytes,
     * which the plan counts): the thread's, kept from tensor to tensor.
     * Allocated and freed per tensor, the freed slabs stayed resident in the
     * thread's heap (glibc raises its mmap threshold to a freed mapping's
     * size, so the next came from the heap): one thread of --verify --dtype
     * bf16 peaked at 72 MiB with 38 MiB live. */
    char *raw = scratch_buffer(SCRATCH_STAGING, (size_t)reshard_converted_digest_bytes(t, dtype));
    char *converted = raw ? raw + src_pages : NULL;
    int status = raw ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    uint64_t digest = 0;
    for (int64_t r = 0; r < t->shape[0] && !status; r += rows) {
        int64_t start[CKPT_MAX_DIMS] = {0}, count[CKPT_MAX_DIMS];
        memcpy(count, t->shape, sizeof count);
        start[0] = r;
        count[0] = t->shape[0] - r < rows ? t->shape[0] - r : rows;
        status = ckpt_reader_read_region(source, index, start, count, raw, src_bytes);
        if (status) break;
        /* A source value beyond dtype's range has no equal in the output: the
         * digest of its infinity would vouch for what reshard refuses. */
        status = convert_overflow_check(convert_numbers(raw, t->dtype, converted, dtype, count[0] * row), dtype,
                                        t->name, 0);
        if (status) break;
        digest += ckpt_digest_run(converted, tp_dtype_size(dtype), r * row, count[0] * row);
    }
    *out = digest;
    return status;
}

static int verify_tensor(void *ctx, int64_t i, int thread)
{
    (void)thread;
    verify_job *job = ctx;
    const ckpt_tensor_desc *t = ckpt_reader_tensor(job->output, (int)i);
    int j = ckpt_reader_find(job->source, t->name);
    char *reason = job->reason[i];
    job->mismatch[i] = 1;
    if (j < 0) {
        snprintf(reason, 512, "%s: not in the source", t->name);
        return 0;
    }
    const ckpt_tensor_desc *s = ckpt_reader_tensor(job->source, j);
    if (s->ndim != t->ndim || memcmp(s->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim) != 0) {
        snprintf(reason, 512, "%s: logical shape differs from the source", t->name);
        return 0;
    }
    for (int p = 0; p < ckpt_piece_count(t, ckpt_reader_layout(job->output)->tp); p++) {
        if (ckpt_reader_verify_piece(job->output, (int)i, p) || ckpt_reader_check_padding(job->output, (int)i, p)) {
            snprintf(reason, 512, "%s", tp_errmsg());
            return 0;
        }
    }
    uint64_t expected = ckpt_reader_digest(job->source, j);
    if (s->dtype != t->dtype && converted_digest(job->source, j, t->dtype, &expected)) {
        snprintf(reason, 512, "%s", tp_errmsg());
        return 0;
    }
    uint64_t actual = ckpt_reader_digest(job->output, (int)i);
    if (actual != expected) {
        snprintf(reason, 512, "%s: logical digest %016llx, the source gives %016llx", t->name,
                 (unsigned long long)actual, (unsigned long long)expected);
        return 0;
    }
    job->mismatch[i] = 0;
    return 0;
}

int64_t reshard_converted_digest_bytes(const ckpt_tensor_desc *source, tp_dtype dtype)
{
    if (source->dtype == dtype) return 0;
    int64_t row, rows = converted_slab_rows(source, &row);
    int64_t src_bytes = rows * row * (int64_t)tp_dtype_size(source->dtype);
    return (src_bytes + 4095) / 4096 * 4096 + rows * row * (int64_t)tp_dtype_size(dtype);
}

int reshard_verify_threads(int64_t limit, int threads, int64_t need)
{
    int64_t share;
    return reshard_threads_within(limit, threads, need > 0 ? need : RESHARD_READ_BACK_BYTES, 0, &share);
}

int reshard_verify(ckpt_reader *source, ckpt_reader *output, int threads, reshard_verify_result *result)
{
    memset(result, 0, sizeof *result);
    int n = ckpt_reader_num_tensors(output);
    verify_job job = {source, output, calloc((size_t)n + 1, sizeof(int)), calloc((size_t)n + 1, 512)};
    if (!job.mismatch || !job.reason) {
        free(job.mismatch);
        free(job.reason);
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    parallel_for(n, threads > 0 ? threads : parallel_cpu_count(), verify_tensor, &job);
    result->tensors = n;
    for (int i = 0; i < n; i++) {
        if (!job.mismatch[i]) continue;
        if (!result->mismatches)
            snprintf(result->first_mismatch, sizeof result->first_mismatch, "%s", job.reason[i]);
        result->mismatches++;
    }
    free(job.mismatch);
    free(job.reason);
    return TP_OK;
}
