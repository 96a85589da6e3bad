/* zero.c: the sharded optimizer's units, ZeRO-3's gathering of them, and
 * its state between the shards and the ranks that write and read it
 * (zero.h). A view may lie in the pieces of several ranks, and a piece may
 * hold parts of several views. */
#include <stdlib.h>
#include <string.h>

#include "../common/error.h"
#include "zero.h"

/* ZeRO-3 shards each layer as a unit, and each other tensor alone (the
 * token table's two copies on the first and last stages then split alike,
 * so that their gradients' pieces add up over the embedding group); the
 * others, all the views as one unit. */
static int starts_unit(const gpt_model *m, int i, int per_use)
{
    if (i == 0) return 1;
    if (!per_use) return 0;
    int layer = m->params[i].spec->layer;
    return layer < 0 || layer != m->params[i - 1].spec->layer;
}

int zero_use_views(const gpt_model *m, int use, int *views)
{
    int n = 0;
    if (use == ZERO_USE_EMBEDDING) {
        if (m->wte >= 0) views[n++] = m->wte;
        if (m->wpe >= 0) views[n++] = m->wpe;
    } else if (use == ZERO_USE_HEAD) {
        const int head[] = {m->lnf_w, m->lnf_b, m->wte_out};
        for (size_t j = 0; j < sizeof head / sizeof head[0]; j++)
            if (head[j] >= 0) views[n++] = head[j];
    } else {
        for (int k = 0; k < GPT_LAYER_KINDS; k++)
            if (m->layer[use][k] >= 0) views[n++] = m->layer[use][k];
    }
    return n;
}

int64_t zero_unit_span(const gpt_model *m, const zero_unit *u)
{
    return m->zero ? u->piece * m->comm->dp : u->piece;
}

int64_t zero_largest_piece(const gpt_model *m)
{
    int64_t largest = 0;
    for (int k = 0; k < m->num_units; k++)
        if (m->units[k].piece > largest) largest = m->units[k].piece;
    return largest;
}

/* The work area a use needs: its units' spans, each unit once. */
static int64_t use_floats(const gpt_model *m, int use)
{
    int views[GPT_LAYER_KINDS + 1], n = zero_use_views(m, use, views);
    int64_t floats = 0;
    for (int j = 0; j < n; j++) {
        int unit = m->params[views[j]].unit, seen = 0;
        for (int k = 0; k < j; k++) seen |= m->params[views[k]].unit == unit;
        if (!seen) floats += zero_unit_span(m, &m->units[unit]);
    }
    return floats;
}

/* Each view's writer (zero.h zero_lay_out). */
static int choose_writers(gpt_model *m)
{
    int dp = m->comm->dp;
    for (int i = 0; i < m->num_params; i++) m->params[i].writer = 0;
    if (!m->zero) return TP_OK;
    int64_t *load = calloc((size_t)dp, sizeof *load);
    if (!load) return tp_fail(TP_ERR_NOMEM, "out of memory choosing checkpoint writers for %d ranks", dp);
    for (int i = 0; i < m->num_params && m->zero == 1; i++) load[0] += m->params[i].owner ? m->params[i].numel : 0;
    for (int i = 0; i < m->num_params; i++) {
        param_view *v = &m->params[i];
        if (!v->owner) continue;
        for (int d = 1; d < dp; d++)
            if (load[d] < load[v->writer]) v->writer = d;
        load[v->writer] += (m->zero == 3 ? 3 : 2) * v->numel;
    }
    free(load);
    return TP_OK;
}

int zero_lay_out(gpt_model *m, int zero)
{
    int dp = m->comm->dp;
    m->zero = dp > 1 ? zero : 0;
    int per_use = m->zero == 3, units = 0;
    for (int i = 0; i < m->num_params; i++) units += starts_unit(m, i, per_use);
    m->units = calloc((size_t)units + 1, sizeof *m->units);
    if (!m->units) return tp_fail(TP_ERR_NOMEM, "out of memory for %d sharding units", units);
    for (int i = 0; i < m->num_params; i++) {
        if (starts_unit(m, i, per_use)) m->units[m->num_units++].first_view = i;
        m->units[m->num_units - 1].views++;
    }
    int64_t flat = 0, at = 0;
    for (int k = 0; k < m->num_units; k++) {
        zero_unit *u = &m->units[k];
        int64_t length = 0;
        u->first = flat;
        u->work_at = -1;
        for (int i = u->first_view; i < u->first_view + u->views; i++) {
            m->params[i].flat = flat + length;
            m->params[i].unit = k;
            length += m->params[i].numel;
        }
        u->piece = m->zero ? (length + dp - 1) / dp : length;
        u->at = at;
        at += u->piece;
        flat += zero_unit_span(m, u);
    }
    m->total = flat;
    m->shard_len = m->zero ? at : 0;
    TP_TRY(choose_writers(m));
    m->work_floats = 0;
    for (int use = m->zero == 3 ? ZERO_USE_HEAD : 0; m->zero == 3 && use < m->num_layers; use++) {
        if ((use == ZERO_USE_HEAD && !m->is_last) || (use == ZERO_USE_EMBEDDING && !m->is_first)) continue;
        int64_t floats = use_floats(m, use);
        if (floats > m->work_floats) m->work_floats = floats;
    }
    return TP_OK;
}

/* Points a unit's views at its place in the work area, or (at NULL) nowhere. */
static void point_views(gpt_model *m, const zero_unit *u, float *params, float *grads)
{
    for (int i = u->first_view; i < u->first_view + u->views; i++) {
        param_view *v = &m->params[i];
        v->data = params ? params + (v->flat - u->first) : NULL;
        v->grad = grads ? grads + (v->flat - u->first) : NULL;
    }
}

int zero_gather_use(gpt_model *m, int use, int what)
{
    if (m->zero != 3) return TP_OK;
    if (m->num_work_units) return tp_fail(TP_ERR_STATE, "ZeRO-3: a use gathered while another is");
    int views[GPT_LAYER_KINDS + 1], n = zero_use_views(m, use, views);
    int64_t offset = 0;
    for (int j = 0; j < n; j++) {
        zero_unit *u = &m->units[m->params[views[j]].unit];
        if (u->work_at >= 0) continue;
        u->work_at = offset;
        offset += zero_unit_span(m, u);
        m->work_units[m->num_work_units++] = m->params[views[j]].unit;
    }
    m->work_what = what;
    for (int j = 0; j < m->num_work_units; j++) {
        zero_unit *u = &m->units[m->work_units[j]];
        float *params = what & ZERO_PARAMS ? m->work_params + u->work_at : NULL;
        float *grads = what & ZERO_GRADS ? m->work_grads + u->work_at : NULL;
        if (params)
            TP_TRY(comm_all_gather(m->comm, GROUP_DP, m->shard_params + u->at, params, u->piece, COMM_FLOAT, m->stream));
        if (grads) TP_TRY(m->kernels->zero(grads, (size_t)zero_unit_span(m, u) * sizeof(float)));
        point_views(m, u, params, grads);
    }
    return TP_OK;
}

int zero_release_use(gpt_model *m)
{
    if (m->zero != 3) return TP_OK;
    int status = TP_OK;
    for (int j = 0; j < m->num_work_units; j++) {
        zero_unit *u = &m->units[m->work_units[j]];
        if (!status && (m->work_what & ZERO_GRADS)) {
            /* In place: this rank's sums land on its own piece of the unit. */
            float *grads = m->work_grads + u->work_at, *mine = grads + m->comm->dp_rank * u->piece;
            status = comm_reduce_scatter(m->comm, GROUP_DP, grads, mine, u->piece, COMM_FLOAT, m->stream);
            if (!status) status = m->kernels->add_inplace(m->shard_grads + u->at, mine, u->piece);
        }
        point_views(m, u, NULL, NULL);
        u->work_at = -1;
    }
    m->num_work_units = 0;
    return status;
}

/* Values [flat, flat + n) of unit u's parameters (kind 0), first (1) or
 * second (2) moments into the snapshot, where they fall in views this rank
 * writes. */
static void place(const gpt_model *m, const zero_unit *u, const int64_t *param_at, const int64_t *moment_at,
                  float *snapshot, int kind, int64_t flat, const float *values, int64_t n)
{
    for (int i = u->first_view; i < u->first_view + u->views; i++) {
        const param_view *v = &m->params[i];
        int64_t at = kind == 0 ? param_at[i] : moment_at[i];
        if (at < 0) continue;
        int64_t begin = v->flat, end = begin + v->numel;
        int64_t lo = begin > flat ? begin : flat, hi = end < flat + n ? end : flat + n;
        if (hi > lo)
            memcpy(snapshot + at + (kind == 2 ? v->numel : 0) + (lo - begin), values + (lo - flat),
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

/* Values of each rank's pieces that travel at once: ZERO_CHUNK, or the
 * largest piece when smaller. */
static int64_t chunk_values(const gpt_model *m)
{
    int64_t largest = zero_largest_piece(m);
    return largest < ZERO_CHUNK ? largest : ZERO_CHUNK;
}

/* The regions of the shard that `what` names, in the order of the kinds of
 * place (the parameters or gradients, then the moments); returns how many. */
static int shard_regions(gpt_model *m, int what, float **regions, int *kinds)
{
    int n = 0;
    if (m->zero == 3 && (what & (ZERO_PARAMS | ZERO_GRADS)))
        regions[n] = what & ZERO_GRADS ? m->shard_grads : m->shard_params, kinds[n++] = 0;
    if (what & ZERO_MOMENTS) {
        regions[n] = m->shard_m, kinds[n++] = 1;
        regions[n] = m->shard_v, kinds[n++] = 2;
    }
    return n;
}

int zero_gather_state(gpt_model *m, int what, float *snapshot, const int64_t *param_at, const int64_t *moment_at)
{
    if (!m->zero) return TP_OK;
    float *regions[3];
    int kinds[3], count = shard_regions(m, what, regions, kinds);
    if (!count) return TP_OK;
    comm *c = m->comm;
    int dp = c->dp, writes = snapshot != NULL;
    int64_t chunk = chunk_values(m);
    float *gathered, *host;
    TP_TRY(chunk_buffers(m, TP_OK, count * dp * chunk, writes, &gathered, &host, "ZeRO: gathering the state to save"));
    int status = TP_OK;
    /* Chunk j of unit u: [region 0 of member 0 .. of member dp-1 | region 1 of each ...], n values each. */
    for (int k = 0; k < m->num_units && !status; k++) {
        const zero_unit *u = &m->units[k];
        for (int64_t j = 0; j < u->piece && !status; j += chunk) {
            int64_t n = u->piece - j < chunk ? u->piece - j : chunk;
            for (int r = 0; r < count && !status; r++)
                status = comm_all_gather(c, GROUP_DP, regions[r] + u->at + j, gathered + r * dp * n, n, COMM_FLOAT,
                                         m->stream);
            if (!status && writes && host != gathered)
                status = m->kernels->to_host(host, gathered, (size_t)(count * dp * n) * sizeof(float));
            for (int r = 0; r < count && writes && !status; r++)
                for (int d = 0; d < dp; d++)
                    place(m, u, param_at, moment_at, snapshot, kinds[r], u->first + d * u->piece + j,
                          host + (r * dp + d) * n, n);
        }
    }
    chunk_free(m, gathered, host);
    return status;
}

int zero_scatter_begin(gpt_model *m, int what, zero_scatter *s)
{
    s->what = what;
    s->send = s->host = NULL;
    float *regions[3];
    int kinds[3];
    if (!m->zero || !shard_regions(m, what & (ZERO_PARAMS | ZERO_MOMENTS), regions, kinds)) return TP_OK;
    return chunk_buffers(m, TP_OK, m->comm->dp * chunk_values(m), m->comm->dp_rank == 0, &s->send, &s->host,
                         "ZeRO: handing out the loaded state");
}

void zero_scatter_end(gpt_model *m, zero_scatter *s)
{
    if (s->send) chunk_free(m, s->send, s->host);
    s->send = s->host = NULL;
}

int zero_scatter_unit(gpt_model *m, zero_scatter *s, int unit, const float *params, const float *moments,
                      int64_t moments_stride)
{
    if (!m->zero) return TP_OK;
    float *regions[3];
    int kinds[3], count = shard_regions(m, s->what & (ZERO_PARAMS | ZERO_MOMENTS), regions, kinds);
    if (!count) return TP_OK;
    comm *c = m->comm;
    int dp = c->dp, root = c->dp_rank == 0;
    int64_t chunk = chunk_values(m);
    const zero_unit *u = &m->units[unit];
    int local = TP_OK; /* a copy of this rank's that failed: it goes on with the group's reduce-scatters */
    /* Chunk j of each region: member d's values [j, j + n) of its piece of
     * the unit, from the first rank (a sum with the others' zeros). */
    for (int64_t j = 0; j < u->piece; j += chunk) {
        int64_t n = u->piece - j < chunk ? u->piece - j : chunk;
        for (int r = 0; r < count; r++) {
            int copied;
            if (root) {
                const float *source = kinds[r] == 0 ? params : moments + (kinds[r] - 1) * moments_stride;
                for (int d = 0; d < dp; d++)
                    memcpy(s->host + d * n, source + d * u->piece + j, (size_t)n * sizeof(float));
                copied = s->host != s->send ? m->kernels->to_device(s->send, s->host, (size_t)(dp * n) * sizeof(float))
                                            : TP_OK;
            } else {
                copied = m->kernels->zero(s->send, (size_t)(dp * n) * sizeof(float));
            }
            if (copied && !local) local = copied;
            TP_TRY(comm_reduce_scatter(c, GROUP_DP, s->send, regions[r] + u->at + j, n, COMM_FLOAT, m->stream));
        }
    }
    /* The group's verdict on the unit, alike on every member. */
    int failed = local != TP_OK;
    TP_TRY(comm_all_reduce(c, GROUP_DP, &failed, 1, COMM_INT, COMM_MAX, COMM_HOST));
    if (local) return local;
    return failed ? tp_fail(TP_ERR_COMM, "ZeRO: another rank of the data-parallel group failed to take its part of "
                                         "unit %d",
                            unit)
                  : TP_OK;
}

int zero_scatter_state(gpt_model *m, int what, const float *params, const float *moments)
{
    if (!m->zero) return TP_OK;
    zero_scatter s;
    TP_TRY(zero_scatter_begin(m, what, &s));
    int root = m->comm->dp_rank == 0, status = TP_OK;
    for (int k = 0; k < m->num_units && !status; k++) {
        const zero_unit *u = &m->units[k];
        status = zero_scatter_unit(m, &s, k, root && params ? params + u->first : NULL,
                                   root && moments ? moments + u->first : NULL, m->total);
    }
    zero_scatter_end(m, &s);
    return status;
}
