/* zero.c: ZeRO-1's moments between the shards and the ranks that write and
 * read them (zero.h). A shard is a range of the flattened
 * parameters (rank d: [d shard_len, (d + 1) shard_len)); a view's moments
 * may lie in several shards, and a shard may hold parts of several views. */
#include <stdlib.h>
#include <string.h>

#include "../common/error.h"
#include "zero.h"

int zero_moment_writer(const gpt_model *m, const param_view *v)
{
    return m->zero ? (int)((v->data - m->memory) / m->shard_len) : 0;
}

/* Values [flat, flat + n) of the flattened first (which 0) or second
 * moments into the snapshot, where they fall in views this rank writes. */
static void place(const gpt_model *m, const int64_t *moment_at, float *snapshot, int which, int64_t flat,
                  const float *values, int64_t n)
{
    for (int i = 0; i < m->num_params; i++) {
        const param_view *v = &m->params[i];
        if (moment_at[i] < 0) continue;
        int64_t begin = v->data - m->memory, end = begin + v->numel;
        int64_t lo = begin > flat ? begin : flat, hi = end < flat + n ? end : flat + n;
        if (hi > lo)
            memcpy(snapshot + moment_at[i] + which * v->numel + (lo - begin), values + (lo - flat),
                   (size_t)(hi - lo) * sizeof(float));
    }
}

static void chunk_free(gpt_model *m, float *kernel, float *host)
{
    if (host != kernel) free(host);
    m->kernels->release(kernel);
}

/* A buffer of the backend's memory and, on a device, its host copy (the
 * same memory on the CPU) where with_host, agreed on by every rank together
 * with `status`, this rank's verdict so far. */
static int chunk_buffers(gpt_model *m, int status, int64_t floats, int with_host, float **kernel, float **host,
                         const char *what)
{
    const kernel_backend *k = m->kernels;
    *kernel = *host = NULL;
    if (!status) status = k->alloc((void **)kernel, (size_t)floats * sizeof(float));
    if (!status && with_host) {
        *host = k->on_device ? malloc((size_t)floats * sizeof(float)) : *kernel;
        if (!*host) status = tp_fail(TP_ERR_NOMEM, "out of memory (%lld values)", (long long)floats);
    }
    status = comm_agree(m->comm, status, what);
    if (status) {
        chunk_free(m, *kernel, *host);
        *kernel = *host = NULL;
    }
    return status;
}

int zero_gather_moments(gpt_model *m, float *snapshot, const int64_t *moment_at)
{
    if (!m->zero) return TP_OK;
    comm *c = m->comm;
    int dp = c->dp, writes = snapshot != NULL;
    int64_t chunk = m->shard_len < ZERO_CHUNK ? m->shard_len : ZERO_CHUNK;
    float *gathered, *host;
    TP_TRY(chunk_buffers(m, TP_OK, 2 * dp * chunk, writes, &gathered, &host, "ZeRO-1: gathering the moments to save"));
    int status = TP_OK;
    /* Chunk j: [m of member 0 .. m of member dp-1 | v of each], n values each. */
    for (int64_t j = 0; j < m->shard_len && !status; j += chunk) {
        int64_t n = m->shard_len - j < chunk ? m->shard_len - j : chunk;
        status = comm_all_gather(c, GROUP_DP, m->shard_m + j, gathered, n, COMM_FLOAT, m->stream);
        if (!status) status = comm_all_gather(c, GROUP_DP, m->shard_v + j, gathered + dp * n, n, COMM_FLOAT, m->stream);
        if (!status && writes && host != gathered)
            status = m->kernels->to_host(host, gathered, (size_t)(2 * dp * n) * sizeof(float));
        for (int which = 0; which < 2 && writes && !status; which++)
            for (int d = 0; d < dp; d++)
                place(m, moment_at, snapshot, which, d * m->shard_len + j, host + (which * dp + d) * n, n);
    }
    chunk_free(m, gathered, host);
    return status;
}

int zero_scatter_moments(gpt_model *m, const float *moments)
{
    if (!m->zero) return TP_OK;
    comm *c = m->comm;
    int dp = c->dp, root = c->dp_rank == 0;
    int64_t chunk = m->shard_len < ZERO_CHUNK ? m->shard_len : ZERO_CHUNK;
    float *send, *host;
    TP_TRY(chunk_buffers(m, TP_OK, dp * chunk, root, &send, &host, "ZeRO-1: handing out the loaded moments"));
    int status = TP_OK;
    /* Chunk j of each moment: member d's values [j, j + n) of its shard, from
     * the first rank (a sum with the others' zeros). */
    for (int64_t j = 0; j < m->shard_len && !status; j += chunk) {
        int64_t n = m->shard_len - j < chunk ? m->shard_len - j : chunk;
        for (int which = 0; which < 2 && !status; which++) {
            if (root) {
                for (int d = 0; d < dp; d++)
                    memcpy(host + d * n, moments + which * m->total + d * m->shard_len + j, (size_t)n * sizeof(float));
                if (host != send) status = m->kernels->to_device(send, host, (size_t)(dp * n) * sizeof(float));
            } else {
                status = m->kernels->zero(send, (size_t)(dp * n) * sizeof(float));
            }
            float *shard = which ? m->shard_v : m->shard_m;
            if (!status) status = comm_reduce_scatter(c, GROUP_DP, send, shard + j, n, COMM_FLOAT, m->stream);
        }
    }
    chunk_free(m, send, host);
    return status;
}
