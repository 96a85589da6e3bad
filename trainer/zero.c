/* zero.c: ZeRO-1's moments between the shards and the first rank of each
 * data-parallel group (zero.h). A shard is a range of the flattened
 * parameters (rank d: [d shard_len, (d + 1) shard_len)); a view's moments
 * may lie in several shards, and a shard may hold parts of several views. */
#include <stdlib.h>
#include <string.h>

#include "../common/error.h"
#include "zero.h"

/* The snapshot's offset of each view this rank owns, -1 for the others
 * (the saver's layout: per owned view, parameters, then both moments). */
static int64_t *snapshot_offsets(const gpt_model *m)
{
    int64_t *offsets = malloc((size_t)(m->num_params > 0 ? m->num_params : 1) * sizeof *offsets);
    int64_t at = 0;
    for (int i = 0; offsets && i < m->num_params; i++) {
        offsets[i] = m->params[i].owner ? at : -1;
        if (m->params[i].owner) at += 3 * m->params[i].numel;
    }
    return offsets;
}

/* Values [flat, flat + n) of the flattened first (which 0) or second
 * moments into the snapshot, where they fall in views this rank owns. */
static void place(const gpt_model *m, const int64_t *offsets, float *snapshot, int which, int64_t flat,
                  const float *values, int64_t n)
{
    for (int i = 0; i < m->num_params; i++) {
        const param_view *v = &m->params[i];
        if (offsets[i] < 0) continue;
        int64_t begin = v->data - m->memory, end = begin + v->numel;
        int64_t lo = begin > flat ? begin : flat, hi = end < flat + n ? end : flat + n;
        if (hi > lo)
            memcpy(snapshot + offsets[i] + (1 + which) * v->numel + (lo - begin), values + (lo - flat),
                   (size_t)(hi - lo) * sizeof(float));
    }
}

static void chunk_free(gpt_model *m, float *kernel, float *host)
{
    if (host != kernel) free(host);
    m->kernels->release(kernel);
}

/* A buffer of the backend's memory and, on a device, its host copy (the
 * same memory on the CPU) for the first rank of the group, agreed on by
 * every rank together with `status`, this rank's verdict so far. */
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

int zero_gather_moments(gpt_model *m, float *snapshot)
{
    if (!m->zero) return TP_OK;
    comm *c = m->comm;
    int dp = c->dp, root = c->dp_rank == 0;
    int64_t chunk = m->shard_len < ZERO_CHUNK ? m->shard_len : ZERO_CHUNK;
    int64_t *offsets = root ? snapshot_offsets(m) : NULL;
    float *gathered, *host;
    int status = root && !offsets ? tp_fail(TP_ERR_NOMEM, "out of memory") : TP_OK;
    status = chunk_buffers(m, status, 2 * dp * chunk, root, &gathered, &host, "ZeRO-1: gathering the moments to save");
    if (status) {
        free(offsets);
        return status;
    }
    /* Chunk j: [m of member 0 .. m of member dp-1 | v of each], n values each. */
    for (int64_t j = 0; j < m->shard_len && !status; j += chunk) {
        int64_t n = m->shard_len - j < chunk ? m->shard_len - j : chunk;
        status = comm_all_gather(c, GROUP_DP, m->shard_m + j, gathered, n, COMM_FLOAT, m->stream);
        if (!status) status = comm_all_gather(c, GROUP_DP, m->shard_v + j, gathered + dp * n, n, COMM_FLOAT, m->stream);
        if (!status && root && host != gathered)
            status = m->kernels->to_host(host, gathered, (size_t)(2 * dp * n) * sizeof(float));
        for (int which = 0; which < 2 && root && !status; which++)
            for (int d = 0; d < dp; d++)
                place(m, offsets, snapshot, which, d * m->shard_len + j, host + (which * dp + d) * n, n);
    }
    chunk_free(m, gathered, host);
    free(offsets);
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
