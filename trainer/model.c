/* model.c: GPT-2 and Llama forward and backward on one rank of a (TP, PP)
 * layout.
 *
 * Per block (x: [N, D] rows of the micro-batch, N = B*T; identical on every
 * TP rank of the stage):
 *   ln1 = LN(x);  qkv = ln1 Wqkv^T + bqkv            column-parallel: local heads
 *   a = attention(qkv);  p = a Wproj^T                 row-parallel: partial sums
 *   p = allreduce_tp(p) + bproj;  r1 = x + p
 *   ln2 = LN(r1);  h = ln2 Wfc^T + bfc;  g = gelu(h)    column-parallel
 *   o = allreduce_tp(g Wfcproj^T) + bfcproj;  r2 = r1 + o
 * Backward mirrors it: the gradients of the column-parallel inputs (ln1, ln2)
 * are partial per rank and summed over TP; replicated parameters get the
 * same gradient on every TP rank. The token table is split by vocabulary:
 * embedding rows held elsewhere contribute zero and are summed over TP; the
 * output logits stay split and the cross-entropy reduces max, sum and target
 * logit over TP, so no rank holds the full logits.
 *
 * Llama's block has the same shape of communication: RMSNorm for LN, no
 * biases, rotary embeddings applied in place to the local Q and K heads of
 * qkv after its product (the attention keeps the rotated qkv; the backward
 * turns d_qkv back before the qkv product's backward), and SwiGLU for GELU:
 * h = ln2 Wfc^T is [N, 2F/tp] = this rank's [gate | up], g = silu(gate) up.
 * Its untied output projection (output.weight) is split by vocabulary like
 * the token table; there is no position table. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "../common/memory.h"
#include "../common/parallel.h"
#include "../kernels/kernels.h"
#include "model.h"
#include "zero.h"

/* ------------------------------------------------------------ initialization */

typedef struct {
    float *data;
    uint64_t seed, hash;
    float mean, std;
} init_ctx;

static int init_run(void *ctx, int64_t offset, int64_t logical, int64_t n)
{
    init_ctx *c = ctx;
    float *out = c->data + offset;
    if (logical < 0 || c->std == 0) { /* padding is zero; a tensor of std 0 is its mean */
        for (int64_t i = 0; i < n; i++) out[i] = logical < 0 ? 0.0f : c->mean;
        return 0;
    }
    box_muller_normals(c->seed, c->hash, logical, n, out);
    for (int64_t i = 0; i < n; i++) out[i] = c->mean + c->std * out[i];
    return 0;
}

/* A share of the initial values: rows [row0, row1) of parameter view `param`. */
typedef struct {
    int param;
    int64_t row0, row1;
} init_task;

typedef struct {
    const gpt_model *model;
    float *initial; /* the values of the views' flattened parameters from `base` on (model.h zero_unit) */
    const int64_t *offsets; /* of each view in `initial` */
    uint64_t seed;
    const init_task *tasks;
} init_job;

static int init_share(void *ctx, int64_t k, int thread)
{
    (void)thread;
    const init_job *job = ctx;
    const init_task *task = &job->tasks[k];
    const param_view *v = &job->model->params[task->param];
    int64_t row_elements = v->numel / v->shape[0];
    /* The runs' offsets count from row row0. */
    init_ctx ic = {job->initial + job->offsets[task->param] + task->row0 * row_elements, job->seed,
                   XXH3_64bits(v->spec->name, strlen(v->spec->name)), v->spec->init_mean, v->spec->init_std};
    return ckpt_piece_element_runs(&v->spec->desc, job->model->comm->tp, v->piece, task->row0, task->row1,
                                   init_run, &ic);
}

/* Rows per share of the initial values: about a million elements, so that
 * the largest tensor (the token table) spreads over every thread. */
#define INIT_SHARE_ELEMENTS (1 << 20)
/* Micro-batches whose loss statistics a device keeps before they are read
 * (gpt_model_take_losses): a step's at any usual accumulation, within 16 MiB
 * (64 at micro-batch 16 of 1,024: 12.6 MB; fewer at larger micro-batches);
 * beyond, read when full. */
#define LOSS_STATS_MOST 64
#define LOSS_STATS_BYTES ((int64_t)16 << 20)

/* The initial values of views [first, first + views), into `initial` at
 * their flat places less `base`, on all of the machine's threads: a
 * one-time cost before the first step (124M elements take about 0.8 s on
 * one core), the same values at any thread count. */
static int init_values(const gpt_model *m, float *initial, uint64_t seed, int first, int views, int64_t base)
{
    int64_t *offsets = calloc((size_t)m->num_params + 1, sizeof *offsets);
    int64_t count = 0;
    for (int i = first; i < first + views; i++) {
        const param_view *v = &m->params[i];
        int64_t row_elements = v->numel / v->shape[0], rows = INIT_SHARE_ELEMENTS / row_elements + 1;
        count += (v->shape[0] + rows - 1) / rows;
    }
    init_task *tasks = calloc((size_t)count + 1, sizeof *tasks);
    if (!offsets || !tasks) {
        free(offsets);
        free(tasks);
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    count = 0;
    for (int i = first; i < first + views; i++) {
        const param_view *v = &m->params[i];
        offsets[i] = v->flat - base;
        int64_t row_elements = v->numel / v->shape[0], rows = INIT_SHARE_ELEMENTS / row_elements + 1;
        for (int64_t r = 0; r < v->shape[0]; r += rows)
            tasks[count++] = (init_task){i, r, r + rows < v->shape[0] ? r + rows : v->shape[0]};
    }
    init_job job = {m, initial, offsets, seed, tasks};
    int threads = parallel_cpu_count() < 16 ? parallel_cpu_count() : 16;
    int status = parallel_for(count, threads, init_share, &job);
    free(offsets);
    free(tasks);
    return status;
}

/* ------------------------------------------------------------ construction */

int gpt_model_find(const gpt_model *m, int entry)
{
    for (int i = 0; i < m->num_params; i++)
        if (!m->params[i].tied_copy && m->params[i].spec == &m->catalog[entry]) return i;
    return -1;
}

void gpt_model_free(gpt_model *m)
{
    if (!m) return;
    const kernel_backend *k = m->kernels;
    for (int s = 0; m->slots && s < m->num_slots; s++) {
        gpt_slot *slot = &m->slots[s];
        if (slot->kernel_tokens != slot->tokens) k->release(slot->kernel_tokens);
        free(slot->tokens);
        k->release(slot->input);
    }
    free(m->slots);
    free(m->heads);
    k->release(m->head_memory);
    k->release(m->rope_cos_sin);
    k->release(m->kv_grads);
    k->release(m->scratch);
    k->release(m->residual_bits);
    k->release(m->gathered);
    k->release(m->memory);
    k->release(m->weights16);
    free(m->weights16_made);
    k->release(m->loss_stats);
    free(m->host_loss_stats);
    free(m->units);
    free(m->layer);
    free(m->catalog);
    free(m->params);
    free(m);
}

/* The parameters' memory (m->memory, zero as alloc gives it) after their
 * units (zero_lay_out), and every view's place in it (model.h): params |
 * grads | m | v, each m->total; with ZeRO-1 params | grads | this rank's
 * shard of m and v (the summed gradients of the shard are summed in place,
 * in the gradients' own region); with ZeRO-3 this rank's shard of params,
 * grads, m and v, then the work area (params | grads of the units of one
 * use). Laid out once, at its final size: a
 * sharded optimizer is for a model whose whole state does not fit. */
static int lay_out_memory(gpt_model *m, int zero)
{
    TP_TRY(zero_lay_out(m, zero));
    int64_t S = m->shard_len, W = m->work_floats;
    int64_t floats = m->zero == 3 ? 4 * S + 2 * W : m->zero ? 2 * m->total + 2 * S : 4 * m->total;
    TP_TRY(m->kernels->alloc((void **)&m->memory, (size_t)floats * sizeof(float)));
    if (m->zero == 3) {
        /* Views point into the work area while gathered only (zero_gather_use). */
        m->shard_params = m->memory;
        m->shard_grads = m->memory + S;
        m->shard_m = m->memory + 2 * S;
        m->shard_v = m->memory + 3 * S;
        m->work_params = m->memory + 4 * S;
        m->work_grads = m->work_params + W;
        return TP_OK;
    }
    for (int i = 0; i < m->num_params; i++) {
        param_view *v = &m->params[i];
        v->data = m->memory + v->flat;
        v->grad = m->memory + m->total + v->flat;
        v->m = m->zero ? NULL : m->memory + 2 * m->total + v->flat;
        v->v = m->zero ? NULL : m->memory + 3 * m->total + v->flat;
    }
    if (m->zero) { /* one unit: this rank's piece of it is a range of the whole */
        int64_t mine = m->comm->dp_rank * S;
        m->shard_params = m->memory + mine;
        m->shard_grads = m->memory + m->total + mine;
        m->shard_m = m->memory + 2 * m->total;
        m->shard_v = m->shard_m + S;
    }
    return TP_OK;
}

/* Whether the MLP's input product and its GELU are one operation each way
 * (matmul_forward_gelu_bf16, matmul_backward_gelu_bf16: GPT-2 in bf16, on
 * a GPU cuBLASLt's GELU epilogues), rather than a product and an
 * activation's operation: the backward then has no gradient of GELU's
 * output to keep. */
static int gelu_in_products(const gpt_model *m)
{
    return m->bf16 && !m->config.swiglu;
}

/* The backward scratch (m->scratch), in order: one block's buffers
 * (block_backward: d_ln [N, D], d_qkv [N, qkv], d_attn [N, attn],
 * d_gelu [N, ffn] (none where GELU is in the products: gelu_in_products),
 * d_fc [N, fc], the attention's scratch), then d_x [N, D] (the
 * logits' gradient takes their place: head_backward). In bf16, d_qkv, d_attn, d_gelu (SwiGLU's) and
 * d_fc hold bf16 bits (kernels.h), in places sized for fp32 all the same
 * (the planner's count, elastic/plan.c, stays one for both; a forward
 * borrows d_qkv's for fp32). A forward borrows it too: the
 * attention's scratch at its start ([B, Hq, T], Hq <= D: within d_ln), and
 * in bf16 Llama's qkv before its rotation in d_qkv's place (qkv_forward).
 * The floats before d_x: */
static int64_t block_work_floats(const gpt_model *m)
{
    int64_t N = m->B * m->T, d_gelu = gelu_in_products(m) ? 0 : m->ffn_local;
    return N * (m->D + m->qkv_local + m->attn_local + d_gelu + m->fc_local) +
           attention_scratch_floats(m->B, m->T, m->heads_local);
}

/* d_qkv's place in a block's backward scratch (block_work_floats), [N, qkv]. */
static float *block_d_qkv(const gpt_model *m, float *work)
{
    return work + m->B * m->T * m->D;
}

/* Values of the bf16 copy of the weights (gpt_model.weights16): one for
 * each float of the parameters, or with ZeRO-3 of the work area. */
static int64_t weights16_count(const gpt_model *m)
{
    return m->zero == 3 ? m->work_floats : m->total;
}

/* floats that hold `count` values of an activation (fp32, or bf16 bits two to a float). */
static int64_t activation_floats(const gpt_model *m, int64_t count)
{
    return m->bf16 ? (count + 1) / 2 : count;
}

/* The value `index` of an activation held at base (fp32 or bf16 bits). */
static void *activation_at(const gpt_model *m, void *base, int64_t index)
{
    return (char *)base + (size_t)index * m->activation_bytes;
}

/* floats of one slot, as slot_init carves them: the input, then per
 * region of the chunk's layers ln1, its mean and rstd, qkv, att_lse, attn,
 * res1, ln2, its mean and rstd, fc, gelu, res2 (elastic/plan.c
 * micro_batch_floats counts them alike). */
static int64_t slot_floats(const gpt_model *m, int64_t *ints)
{
    int64_t N = m->B * m->T, R = m->rows, L = m->chunk_layers;
    int64_t fp32 = R * m->D + L * (R * (2 * m->D + 4) + N * m->heads_local);
    int64_t activations = 2 * activation_floats(m, L * R * m->D) + activation_floats(m, L * N * m->qkv_local) +
                          activation_floats(m, L * N * m->attn_local) + activation_floats(m, L * N * m->fc_local) +
                          activation_floats(m, L * N * m->ffn_local);
    *ints = 2 * N;
    return fp32 + activations;
}

/* floats of one gpt_head (last stage; model.h), as head_init carves them. */
static int64_t head_floats(const gpt_model *m)
{
    int64_t N = m->B * m->T;
    if (!m->is_last) return 0;
    return gpt_head_buffer_floats(activation_floats(m, m->rows * m->D)) + 2 * gpt_head_buffer_floats(m->rows) +
           gpt_head_buffer_floats(activation_floats(m, N * m->vocab_local)) + 4 * gpt_head_buffer_floats(N);
}

/* Carves head `index`'s buffers out of the heads' allocation (elastic/plan.c
 * head_floats counts them as laid out here). */
static int head_init(gpt_model *m, int index)
{
    gpt_head *h = &m->heads[index];
    int64_t N = m->B * m->T, R = m->rows;
    float *p = m->head_memory + index * head_floats(m);
#define CARVE(field, count) (h->field = p, p += gpt_head_buffer_floats(count))
    CARVE(lnf, activation_floats(m, R * m->D));
    CARVE(lnf_mean, R);
    CARVE(lnf_rstd, R);
    CARVE(logits, activation_floats(m, N * m->vocab_local)); /* bf16: the logits' bits (forward_head) */
    CARVE(row_max, N);
    CARVE(row_sum, N);
    CARVE(target_logit, N);
    CARVE(local_max, N);
#undef CARVE
    /* The statistics as the host reads them: in place on the CPU; on a
     * device none (gpt_model_take_losses reads them). */
    int host = !m->kernels->on_device;
    h->host_row_max = host ? h->row_max : NULL;
    h->host_row_sum = host ? h->row_sum : NULL;
    h->host_target_logit = host ? h->target_logit : NULL;
    return TP_OK;
}

int gpt_model_bind_head(gpt_model *m, gpt_slot *s, int head)
{
    if (!m->is_last) return TP_OK;
    if (head < 0 || head >= m->num_heads)
        return tp_fail(TP_ERR_ARG, "head buffer %d of %d", head, m->num_heads);
    s->head = &m->heads[head];
    return TP_OK;
}

/* Carves a slot's buffers out of one allocation of the backend's memory;
 * tokens and targets on the host, and on the device when there is one. */
static int slot_init(gpt_model *m, gpt_slot *s)
{
    const kernel_backend *k = m->kernels;
    int64_t ints, floats = slot_floats(m, &ints), N = m->B * m->T, R = m->rows, L = m->chunk_layers;
    s->tokens = malloc((size_t)ints * sizeof(int));
    if (!s->tokens) return tp_fail(TP_ERR_NOMEM, "out of memory for a micro-batch's tokens");
    s->targets = s->tokens + N;
    s->kernel_tokens = s->tokens;
    if (k->on_device) TP_TRY(k->alloc((void **)&s->kernel_tokens, (size_t)ints * sizeof(int)));
    s->kernel_targets = s->kernel_tokens + N;
    TP_TRY(k->alloc((void **)&s->input, (size_t)floats * sizeof(float)));
    float *p = s->input + R * m->D;
#define CARVE(field, count) (s->field = p, p += (count))
    CARVE(ln1, activation_floats(m, L * R * m->D));
    CARVE(ln1_mean, L * R);
    CARVE(ln1_rstd, L * R);
    CARVE(qkv, activation_floats(m, L * N * m->qkv_local));
    CARVE(att_lse, L * N * m->heads_local);
    CARVE(attn, activation_floats(m, L * N * m->attn_local));
    CARVE(res1, L * R * m->D);
    CARVE(ln2, activation_floats(m, L * R * m->D));
    CARVE(ln2_mean, L * R);
    CARVE(ln2_rstd, L * R);
    CARVE(fc, activation_floats(m, L * N * m->fc_local));
    CARVE(gelu, activation_floats(m, L * N * m->ffn_local));
    CARVE(res2, L * R * m->D);
#undef CARVE
    return TP_OK;
}

/* Llama's rotary table for positions 0..T-1 ([T, hd/2, 2], kernels.h
 * rope_table), computed on the host and kept in the backend's memory. */
static int rope_create(gpt_model *m)
{
    const gpt_config *c = &m->config;
    int64_t half = m->hd / 2, floats = m->T * m->hd;
    float *host = malloc((size_t)(floats + half) * sizeof(float));
    if (!host) return tp_fail(TP_ERR_NOMEM, "out of memory for the rotary table");
    rope_scaling scaling = {c->rope_scaling_factor, c->rope_low_freq_factor, c->rope_high_freq_factor,
                            (double)c->rope_original_seq};
    rope_frequencies(host + floats, m->hd, c->rope_theta, &scaling);
    rope_table(host, host + floats, m->T, m->hd);
    int status = m->kernels->alloc((void **)&m->rope_cos_sin, (size_t)floats * sizeof(float));
    if (!status) status = m->kernels->to_device(m->rope_cos_sin, host, (size_t)floats * sizeof(float));
    free(host);
    return status;
}

int gpt_model_supported(const gpt_config *config)
{
    /* fp32 parameters; bf16 computation is a training option (train_options.bf16). */
    if (config->dtype != TP_FP32)
        return tp_fail(TP_ERR_ARG, "the trainer keeps fp32 parameters (asked: %s; --dtype bf16 is mixed precision)",
                       tp_dtype_name(config->dtype));
    if (config->arch == GPT_ARCH_LLAMA || (!config->swiglu && config->kv_heads == config->heads)) return TP_OK;
    return tp_fail(TP_ERR_ARG,
                   "the trainer computes GPT-2 with a GELU MLP and as many key/value heads as heads, or Llama "
                   "(--arch llama) (asked: GPT with %s MLP, %lld key/value heads for %lld heads)",
                   config->swiglu ? "a SwiGLU" : "a GELU", (long long)config->kv_heads, (long long)config->heads);
}

/* ZeRO-3: each unit's initial values whole on the host, one unit at a
 * time, of which this rank keeps its piece. */
static int init_shards(gpt_model *m, uint64_t seed)
{
    int64_t largest = zero_largest_piece(m);
    int dp = m->comm->dp, d = m->comm->dp_rank;
    float *unit = alloc_pages((size_t)(largest * dp) * sizeof(float));
    if (!unit) return tp_fail(TP_ERR_NOMEM, "out of memory for the initial values of %lld parameters",
                              (long long)(largest * dp));
    int status = TP_OK;
    for (int k = 0; k < m->num_units && !status; k++) {
        const zero_unit *u = &m->units[k];
        memset(unit, 0, (size_t)(u->piece * dp) * sizeof(float)); /* the padding */
        status = init_values(m, unit, seed, u->first_view, u->views, u->first);
        if (!status)
            status = m->kernels->to_device(m->shard_params + u->at, unit + d * u->piece, (size_t)u->piece * sizeof(float));
    }
    free(unit);
    return status;
}

int gpt_model_init_values(gpt_model *m, uint64_t seed)
{
    gpt_model_weights_changed(m);
    if (m->zero == 3) return init_shards(m, seed);
    /* Computed on the host, in place on the CPU; zeroed first, as the
     * backend's memory is, so that what no view covers (ZeRO-1's padding)
     * is zero on every rank on a device too. */
    float *initial = m->kernels->on_device ? alloc_zeroed_pages((size_t)m->total * sizeof(float)) : m->memory;
    if (!initial) return tp_fail(TP_ERR_NOMEM, "out of memory for the initial values");
    int status = init_values(m, initial, seed, 0, m->num_params, 0);
    if (!status && initial != m->memory)
        status = m->kernels->to_device(m->memory, initial, (size_t)m->total * sizeof(float));
    if (initial != m->memory) free_zeroed_pages(initial);
    return status;
}

int gpt_model_create(gpt_model **out, const gpt_config *config, comm *c, const kernel_backend *kernels,
                     int64_t micro_batch, int64_t seq, int slots, int heads, int sequence_parallel, int virtual_stages,
                     int zero, int bf16)
{
    *out = NULL;
    TP_TRY(gpt_config_check(config, c->tp, c->pp));
    if (virtual_stages < 1) virtual_stages = 1;
    if (virtual_stages > 1 && config->layers % ((int64_t)c->pp * virtual_stages))
        return tp_fail(TP_ERR_ARG, "%lld layers cannot be split into pp %d x %d virtual stages = %lld chunks of equal "
                       "size", (long long)config->layers, c->pp, virtual_stages, (long long)c->pp * virtual_stages);
    TP_TRY(gpt_model_supported(config));
    if (seq > config->seq)
        return tp_fail(TP_ERR_ARG, "sequence length %lld exceeds the model's %lld positions", (long long)seq,
                       (long long)config->seq);
    if (sequence_parallel && c->tp < 2)
        return tp_fail(TP_ERR_ARG, "sequence parallelism splits the rows over the tensor-parallel ranks: it needs "
                       "tp 2 or more (tp is %d)", c->tp);
    if (sequence_parallel && (micro_batch * seq) % c->tp)
        return tp_fail(TP_ERR_ARG, "sequence parallelism splits the micro-batch's %lld x %lld = %lld rows over tp %d "
                       "ranks: they must divide evenly", (long long)micro_batch, (long long)seq,
                       (long long)(micro_batch * seq), c->tp);
    gpt_model *m = calloc(1, sizeof *m);
    if (!m) return tp_fail(TP_ERR_NOMEM, "out of memory for the model");
    m->config = *config;
    m->comm = c;
    m->kernels = kernels ? kernels : kernels_cpu();
    m->bf16 = bf16;
    m->activation_bytes = bf16 ? sizeof(uint16_t) : sizeof(float);
    const kernel_backend *k = m->kernels;
    int has_norm = config->arch == GPT_ARCH_LLAMA ? k->rmsnorm_forward_bf16 != NULL : k->layernorm_forward_bf16 != NULL;
    int has_activation = config->swiglu ? k->swiglu_forward_bf16 && k->swiglu_backward_bf16
                                        : k->matmul_forward_gelu_bf16 && k->matmul_backward_gelu_bf16;
    int has_qkv = config->arch == GPT_ARCH_LLAMA ? k->rope_forward_bf16 && k->rope_backward_bf16
                                                 : k->matmul_forward_bf16_bits != NULL;
    if (bf16 && (!k->matmul_forward_bf16 || !k->matmul_backward_bf16 || !k->matmul_backward_bf16_bits ||
                 !k->attention_forward_bf16 || !k->attention_backward_bf16 || !k->classifier_backward_bf16 ||
                 !has_norm || !has_activation || !has_qkv)) {
        free(m);
        return tp_fail(TP_ERR_ARG, "bf16 mixed precision: the %s kernel backend lacks bf16 operations this model needs "
                       "(products, attention, classifier, norm, MLP activation or qkv)", k->name);
    }
    m->stream = m->kernels->on_device ? COMM_DEVICE : COMM_HOST;
    m->B = micro_batch;
    m->T = seq;
    m->sequence_parallel = sequence_parallel;
    m->rows = sequence_parallel ? micro_batch * seq / c->tp : micro_batch * seq;
    m->row_first = sequence_parallel ? c->tp_rank * m->rows : 0;
    m->num_layers = (int)(config->layers / c->pp);
    m->virtual_stages = virtual_stages;
    m->chunk_layers = m->num_layers / virtual_stages;
    m->is_first = c->pp_rank == 0;
    m->is_last = c->pp_rank == c->pp - 1;
    m->D = config->dim;
    m->hd = config->dim / config->heads;
    m->heads_local = config->heads / c->tp;
    /* Fewer key/value heads than ranks: each rank holds the one its query
     * heads use, replicated over the tp / kv_heads ranks that share it. */
    m->kv_local = config->kv_heads >= c->tp ? config->kv_heads / c->tp : 1;
    m->qkv_local = (m->heads_local + 2 * m->kv_local) * m->hd;
    m->attn_local = m->heads_local * m->hd;
    m->ffn_local = config->ffn / c->tp;
    m->llama = config->arch == GPT_ARCH_LLAMA;
    m->kv_sharers = config->kv_heads >= c->tp ? 1 : (int)(c->tp / config->kv_heads);
    m->fc_local = config->swiglu ? 2 * m->ffn_local : m->ffn_local;
    m->wte = m->wpe = m->lnf_w = m->lnf_b = m->wte_out = -1;

    int count = 0;
    int status = gpt_catalog(config, 0, &m->catalog, &count);
    if (status) {
        gpt_model_free(m);
        return status;
    }
    m->num_catalog = count;
    const gpt_tensor *catalog = m->catalog;
    m->params = calloc((size_t)count + 1, sizeof *m->params);
    if (!m->params) goto nomem;
    ckpt_layout layout = {c->tp, c->pp, c->dp, config->layers, virtual_stages};
    for (int i = 0; i < count; i++) {
        const gpt_tensor *g = &catalog[i];
        int here = ckpt_tensor_stage(&g->desc, &layout) == c->pp_rank;
        int is_wte = g->kind == GPT_TOK_EMBED;
        /* The last stage keeps its own copy of the tied token table. */
        int tied_copy = is_wte && m->is_last && !m->is_first && !config->untied_embeddings;
        for (int copy = 0; copy < 2; copy++) {
            if (copy == 0 ? !here : !tied_copy) continue;
            param_view *v = &m->params[m->num_params++];
            v->spec = g;
            v->piece = g->desc.partition.kind == CKPT_SPLIT ? c->tp_rank : 0;
            ckpt_piece_shape(&g->desc, c->tp, v->shape);
            v->numel = 1;
            for (int d = 0; d < g->desc.ndim; d++) v->numel *= v->shape[d];
            v->tied_copy = copy == 1;
            /* Replicated tensors are stored once, by the first TP rank (docs/FORMAT.md). */
            v->owner = copy == 0 && (g->desc.partition.kind == CKPT_SPLIT || c->tp_rank == 0);
            v->norm_numel = v->numel;
        }
    }
    for (int i = 0; i < m->num_params; i++) {
        param_view *v = &m->params[i];
        switch (v->spec->kind) {
        case GPT_TOK_EMBED:
            if (!v->tied_copy) m->wte = i;
            if (m->is_last && !config->untied_embeddings) m->wte_out = i; /* a separate last stage's copy comes second */
            break;
        case GPT_OUTPUT_WEIGHT: m->wte_out = i; break;
        case GPT_POS_EMBED: m->wpe = i; break;
        case GPT_FINAL_NORM_WEIGHT: m->lnf_w = i; break;
        case GPT_FINAL_NORM_BIAS: m->lnf_b = i; break;
        default: break;
        }
    }
    int64_t padded[CKPT_MAX_DIMS];
    ckpt_padded_shape(&catalog[0].desc, c->tp, padded); /* the token table comes first */
    m->vocab_local = padded[0] / c->tp;
    m->vocab_first = c->tp_rank * m->vocab_local;

    m->layer = malloc(((size_t)m->num_layers + 1) * sizeof *m->layer);
    if (!m->layer) goto nomem;
    memset(m->layer, 0xff, ((size_t)m->num_layers + 1) * sizeof *m->layer); /* -1: kinds the architecture lacks */
    for (int i = 0; i < m->num_params; i++) {
        const gpt_tensor *g = m->params[i].spec;
        if (g->layer < 0) continue;
        /* Global layer g lies in chunk g / chunk_layers of the model, this stage's chunk of it that / pp. */
        int64_t local = g->layer / m->chunk_layers / c->pp * m->chunk_layers + g->layer % m->chunk_layers;
        m->layer[local][g->kind - GPT_FIRST_LAYER_KIND] = i;
    }
    if ((status = lay_out_memory(m, zero))) goto fail;
    m->num_slots = slots;
    m->slots = calloc((size_t)slots, sizeof *m->slots);
    if (!m->slots) goto nomem;
    for (int s = 0; s < slots; s++)
        if ((status = slot_init(m, &m->slots[s]))) goto fail;
    if (m->is_last) {
        if (heads < 1) heads = 1;
        m->heads = calloc((size_t)heads, sizeof *m->heads);
        if (!m->heads) goto nomem;
        m->num_heads = heads;
        status = m->kernels->alloc((void **)&m->head_memory, (size_t)(heads * head_floats(m)) * sizeof(float));
        for (int h = 0; h < heads && !status; h++) status = head_init(m, h);
        for (int s = 0; s < slots && s < heads && !status; s++) status = gpt_model_bind_head(m, &m->slots[s], s);
        if (status) goto fail;
        if (m->kernels->on_device && c->tp_rank == 0) { /* the step's loss statistics, read once */
            int64_t one = 3 * m->B * m->T * (int64_t)sizeof(float), held = LOSS_STATS_BYTES / one;
            m->losses_held = held < 1 ? 1 : held > LOSS_STATS_MOST ? LOSS_STATS_MOST : (int)held;
            size_t bytes = (size_t)(m->losses_held * one);
            if ((status = m->kernels->alloc((void **)&m->loss_stats, bytes))) goto fail;
            if (!(m->host_loss_stats = malloc(bytes))) goto nomem;
        }
    }
    if (m->llama && (status = rope_create(m))) goto fail;
    if (m->kv_sharers > 1) {
        /* A replica other than the first of its head counts only its query rows in the norm. */
        for (int i = 0; i < m->num_params; i++)
            if (m->params[i].spec->kind == GPT_QKV_WEIGHT && c->tp_rank % m->kv_sharers)
                m->params[i].norm_numel = m->attn_local * m->D;
        size_t bytes = (size_t)(2 * config->kv_heads * m->hd * m->D) * sizeof(float);
        if ((status = m->kernels->alloc((void **)&m->kv_grads, bytes))) goto fail;
    }
    if (bf16) { /* the bf16 copy of the weights, made before each use's first product (use_weights16) */
        if ((status = m->kernels->alloc((void **)&m->weights16, (size_t)weights16_count(m) * sizeof(uint16_t))))
            goto fail;
        if (!(m->weights16_made = calloc((size_t)m->num_layers + 2, sizeof *m->weights16_made))) goto nomem;
        m->weights_generation = 1; /* none made yet */
    }
    int64_t N = m->B * m->T;
    m->scratch_size = block_work_floats(m) + N * m->D;
    if ((status = m->kernels->alloc((void **)&m->scratch, (size_t)m->scratch_size * sizeof(float)))) goto fail;
    if (bf16 && (status = m->kernels->alloc((void **)&m->residual_bits,
                                            (size_t)(m->rows * m->D) * sizeof(uint16_t))))
        goto fail;
    if (sequence_parallel) {
        if ((status = m->kernels->alloc((void **)&m->gathered, (size_t)(2 * N * m->D) * sizeof(float)))) goto fail;
        m->partial = m->gathered + N * m->D;
    }
    *out = m;
    return TP_OK;
nomem:
    status = tp_fail(TP_ERR_NOMEM, "out of memory for the model (%lld parameters on this rank)", (long long)4 * m->total);
fail:
    gpt_model_free(m);
    return status;
}

int64_t gpt_model_activation_bytes(const gpt_model *m)
{
    int64_t ints, floats = slot_floats(m, &ints) * m->num_slots + head_floats(m) * m->num_heads;
    if (m->sequence_parallel) floats += 2 * m->B * m->T * m->D;
    return floats * (int64_t)sizeof(float) + ints * m->num_slots * (int64_t)sizeof(int);
}

int64_t gpt_model_optimizer_bytes(const gpt_model *m)
{
    return 2 * (m->zero ? m->shard_len : m->total) * (int64_t)sizeof(float);
}

int64_t gpt_model_parameter_bytes(const gpt_model *m)
{
    int64_t floats = m->zero == 3 ? 2 * m->shard_len + 2 * m->work_floats : 2 * m->total;
    return floats * (int64_t)sizeof(float) + (m->bf16 ? weights16_count(m) * (int64_t)sizeof(uint16_t) : 0);
}

void gpt_model_weights_changed(gpt_model *m)
{
    m->weights_generation++;
}

int gpt_model_zero_grads(gpt_model *m)
{
    if (m->zero == 3) return m->kernels->zero(m->shard_grads, (size_t)m->shard_len * sizeof(float));
    return m->kernels->zero(m->memory + m->total, (size_t)m->total * sizeof(float));
}

int gpt_model_to_host(const gpt_model *m, float *host, const float *values, int64_t count)
{
    return m->kernels->to_host(host, values, (size_t)count * sizeof(float));
}

int gpt_model_from_host(const gpt_model *m, float *values, const float *host, int64_t count)
{
    return m->kernels->to_device(values, host, (size_t)count * sizeof(float));
}

/* ------------------------------------------------------------------ forward */

/* Parameter and gradient of a kind of local layer pl's tensors. */
#define W(kind) (m->params[m->layer[pl][GPT_##kind - GPT_FIRST_LAYER_KIND]].data)
/* The view of such a tensor: a product's weight (its fp32 values, or in bf16 their bf16 copy: weight_of). */
#define VIEW(kind) (&m->params[m->layer[pl][GPT_##kind - GPT_FIRST_LAYER_KIND]])
#define G(kind) (m->params[m->layer[pl][GPT_##kind - GPT_FIRST_LAYER_KIND]].grad)
/* A kind the architecture may lack (biases): NULL then. */
#define W_OR_NULL(kind) (m->layer[pl][GPT_##kind - GPT_FIRST_LAYER_KIND] < 0 ? NULL : W(kind))
#define G_OR_NULL(kind) (m->layer[pl][GPT_##kind - GPT_FIRST_LAYER_KIND] < 0 ? NULL : G(kind))

/* All-reduces over the tensor-parallel group (a no-op at tp 1). */
static int tp_sum(gpt_model *m, float *data, int64_t n)
{
    return comm_all_reduce(m->comm, GROUP_TP, data, n, COMM_FLOAT, COMM_SUM, m->stream);
}

/* Sequence parallelism's two collectives over the tensor-parallel group:
 * every rank's [rows, D] into [B*T, D] (fp32, or a bf16 activation), and
 * the sum of every rank's [B*T, D] partial sums, each rank keeping its
 * [rows, D]. */
static int tp_gather_rows(gpt_model *m, const void *rows, void *all, comm_type type)
{
    return comm_all_gather(m->comm, GROUP_TP, rows, all, m->rows * m->D, type, m->stream);
}

static int tp_sum_rows(gpt_model *m, const float *partial, float *rows)
{
    return comm_reduce_scatter(m->comm, GROUP_TP, partial, rows, m->rows * m->D, COMM_FLOAT, m->stream);
}

/* A column-parallel linear's input: the norm's rows of this rank (an
 * activation: fp32 or bf16 bits), gathered from every rank with sequence
 * parallelism (into m->gathered). */
static int full_rows(gpt_model *m, const void *rows, const void **out)
{
    *out = rows;
    if (!m->sequence_parallel) return TP_OK;
    *out = m->gathered;
    return tp_gather_rows(m, rows, m->gathered, m->bf16 ? COMM_BF16 : COMM_FLOAT);
}

/* A row-parallel linear's output, partial sums of this rank's heads or
 * hidden units [B*T, D], summed over TP into this rank's rows. In place
 * without sequence parallelism (partial is the rows' buffer then). */
static int sum_rows(gpt_model *m, float *partial, float *rows)
{
    if (!m->sequence_parallel) return tp_sum(m, partial, m->B * m->T * m->D);
    return tp_sum_rows(m, partial, rows);
}

/* The gradient of a row-parallel linear's output for every row: d_rows
 * itself, or every rank's rows gathered (into m->partial). */
static int all_rows_of_gradient(gpt_model *m, const float *d_rows, const float **out)
{
    *out = d_rows;
    if (!m->sequence_parallel) return TP_OK;
    *out = m->partial;
    return tp_gather_rows(m, d_rows, m->partial, COMM_FLOAT);
}

/* The residual stream's gradient as an output projection's backward reads
 * it, for every row: in fp32 d_x (all_rows_of_gradient); in bf16 its bits,
 * m->residual_bits (written by the norm's backward that last changed d_x,
 * or at a stage's boundary rounded from the gradient received:
 * gpt_model_backward), or every rank's bits gathered into m->partial: half
 * the bytes of gathering the fp32 rows, and the same bits. */
static int residual_gradient_rows(gpt_model *m, const float *d_x, const void **out)
{
    if (!m->bf16) {
        const float *rows;
        int status = all_rows_of_gradient(m, d_x, &rows);
        *out = rows;
        return status;
    }
    *out = m->residual_bits;
    if (!m->sequence_parallel) return TP_OK;
    *out = m->partial;
    return tp_gather_rows(m, m->residual_bits, m->partial, COMM_BF16);
}

/* Calls add(dst + i D, table + position D, n D) over this rank's rows
 * [row_first, row_first + rows) in runs of consecutive positions (row r
 * is position r mod T): the position table's rows for the activations'. */
static int for_position_runs(gpt_model *m, float *rows, float *table, int to_table)
{
    const kernel_backend *k = m->kernels;
    int64_t D = m->D;
    for (int64_t i = 0; i < m->rows;) {
        int64_t position = (m->row_first + i) % m->T, run = m->T - position;
        if (run > m->rows - i) run = m->rows - i;
        if (to_table) TP_TRY(k->add_inplace(table + position * D, rows + i * D, run * D));
        else TP_TRY(k->residual_forward(rows + i * D, rows + i * D, table + position * D, run * D));
        i += run;
    }
    return TP_OK;
}

/* The kinds of a layer's weights that have a bf16 copy (the products'),
 * besides the head's output projection (m->wte_out). */
static const gpt_tensor_kind layer_copy_kinds[4] = {GPT_QKV_WEIGHT, GPT_PROJ_WEIGHT, GPT_FC_WEIGHT,
                                                    GPT_FCPROJ_WEIGHT};

/* The uses' (layers', the head's) weights with a bf16 copy: the views
 * use_weights16 rounds. */
static int use_weight_views(const gpt_model *m, int use, int views[4])
{
    if (use == ZERO_USE_HEAD) {
        views[0] = m->wte_out;
        return 1;
    }
    for (int n = 0; n < 4; n++) views[n] = m->layer[use][layer_copy_kinds[n] - GPT_FIRST_LAYER_KIND];
    return 4;
}

/* A product's weight operand, view w's values: fp32, or in bf16 their bf16
 * copy (m->weights16, made current for the use by use_weights16). */
static const void *weight_of(const gpt_model *m, const param_view *w)
{
    if (!m->bf16) return w->data;
    const float *base = m->zero == 3 ? m->work_params : m->memory;
    return m->weights16 + (w->data - base);
}

/* In bf16, the bf16 copy of the weights a use's products read (a layer's
 * four, the head's output projection; the embedding has none) made
 * current: rounded from the fp32 weights when they changed since it was
 * made (gpt_model_weights_changed), and with ZeRO-3 at every gather (the
 * work area holds another use's between). Once a use per optimizer step
 * and pipeline stage, instead of once per product and micro-batch. */
static int use_weights16(gpt_model *m, int use)
{
    if (!m->bf16 || use == ZERO_USE_EMBEDDING) return TP_OK;
    int64_t *made = &m->weights16_made[use - ZERO_USE_HEAD];
    if (m->zero != 3 && *made == m->weights_generation) return TP_OK;
    int views[4], n = use_weight_views(m, use, views);
    for (int j = 0; j < n; j++) {
        const param_view *w = &m->params[views[j]];
        TP_TRY(m->kernels->round_to_bf16((uint16_t *)weight_of(m, w), w->data, w->numel));
    }
    *made = m->weights_generation;
    return TP_OK;
}

uint16_t *gpt_model_update_bits(gpt_model *m, int index)
{
    if (!m->bf16 || m->zero) return NULL;
    const param_view *v = &m->params[index];
    int has_copy = index == m->wte_out;
    for (int n = 0; n < 4 && !has_copy; n++) has_copy = v->spec->kind == layer_copy_kinds[n];
    return has_copy ? (uint16_t *)weight_of(m, v) : NULL;
}

void gpt_model_weights_updated(gpt_model *m)
{
    gpt_model_weights_changed(m);
    if (!m->bf16 || m->zero) return; /* no copy was written (gpt_model_update_bits) */
    for (int use = ZERO_USE_HEAD; use < m->num_layers; use++)
        if (use != ZERO_USE_EMBEDDING) m->weights16_made[use - ZERO_USE_HEAD] = m->weights_generation;
}

/* The matrix products, in fp32 or with bf16 operands (m->bf16); in is an
 * activation (fp32, or bf16 bits), w the weight's view (weight_of). */
static int linear_forward(const gpt_model *m, float *out, const void *in, const param_view *w, const float *bias,
                          int64_t N, int64_t C, int64_t OC)
{
    if (m->bf16) return m->kernels->matmul_forward_bf16(out, in, weight_of(m, w), bias, N, C, OC);
    return m->kernels->matmul_forward(out, in, w->data, bias, N, C, OC);
}

/* A product [B*T, OC] written as an activation (fp32, or in bf16 its bf16
 * bits), which only the next operations read: GPT-2's qkv (the attention),
 * the MLP's input fc (its activation; GPT-2's in bf16 comes with its GELU:
 * mlp_forward_in), the logits (the cross-entropy). */
static int activation_product(const gpt_model *m, void *out, const void *in, const param_view *w, const float *bias,
                              int64_t C, int64_t OC)
{
    int64_t N = m->B * m->T;
    if (m->bf16) return m->kernels->matmul_forward_bf16_bits(out, in, weight_of(m, w), bias, N, C, OC);
    return m->kernels->matmul_forward(out, in, w->data, bias, N, C, OC);
}

/* The backward of a product that reads a norm's output (the qkv and fc
 * products, the classifier in fp32): d_out is an activation's gradient
 * (fp32, or bf16 bits: kernels.h), d_in the norm output's gradient, fp32 (it
 * is summed over tensor-parallel ranks). */
static int input_product_backward(const gpt_model *m, float *d_in, float *d_weight, float *d_bias, const void *d_out,
                                  const void *in, const param_view *w, int64_t N, int64_t C, int64_t OC)
{
    if (m->bf16)
        return m->kernels->matmul_backward_bf16(d_in, d_weight, d_bias, d_out, in, weight_of(m, w), N, C, OC);
    return m->kernels->matmul_backward(d_in, d_weight, d_bias, d_out, in, w->data, N, C, OC);
}

/* The backward of a product whose output joins the residual stream (the
 * attention's and the MLP's output projections): d_out is the residual
 * stream's gradient (fp32, or its bf16 bits: residual_gradient_rows); d_in
 * an activation's gradient (fp32, or bf16 bits), which the attention or the
 * MLP's activation reads next. */
static int output_product_backward(const gpt_model *m, void *d_in, float *d_weight, float *d_bias, const void *d_out,
                                   const void *in, const param_view *w, int64_t N, int64_t C, int64_t OC)
{
    if (m->bf16)
        return m->kernels->matmul_backward_bf16_bits(d_in, d_weight, d_bias, d_out, in, weight_of(m, w), N, C, OC);
    return m->kernels->matmul_backward(d_in, d_weight, d_bias, d_out, in, w->data, N, C, OC);
}

/* qkv [N, qkv_local] (an activation) = in @ Wqkv^T + bqkv, its Q and K
 * heads then turned by RoPE (Llama). In bf16 the product is written as bf16
 * bits, or for Llama first in fp32 into the backward scratch's d_qkv place
 * (free during a forward: block_work_floats), then turned and rounded into
 * qkv. */
static int qkv_forward(const gpt_model *m, void *qkv, const void *in, const param_view *w, const float *bias)
{
    const kernel_backend *k = m->kernels;
    int64_t N = m->B * m->T;
    const void *weight = weight_of(m, w);
    if (!m->llama) return activation_product(m, qkv, in, w, bias, m->D, m->qkv_local);
    if (!m->bf16) {
        TP_TRY(k->matmul_forward(qkv, in, weight, bias, N, m->D, m->qkv_local));
        return k->rope_forward(qkv, m->rope_cos_sin, m->B, m->T, m->heads_local, m->kv_local, m->hd);
    }
    float *unturned = block_d_qkv(m, m->scratch);
    TP_TRY(k->matmul_forward_bf16(unturned, in, weight, bias, N, m->D, m->qkv_local));
    return k->rope_forward_bf16(qkv, unturned, m->rope_cos_sin, m->B, m->T, m->heads_local, m->kv_local, m->hd);
}

/* The attention of this rank's heads, in fp32 or with bf16 operands as
 * cuDNN's flash attention reads them (m->bf16, as the products); qkv and
 * out are activations. */
static int attention_forward_in(const gpt_model *m, void *out, float *lse, float *scratch, const void *qkv)
{
    const kernel_backend *k = m->kernels;
    if (m->bf16)
        return k->attention_forward_bf16(out, lse, scratch, qkv, m->B, m->T, m->heads_local, m->kv_local, m->hd);
    return k->attention_forward(out, lse, scratch, qkv, m->B, m->T, m->heads_local, m->kv_local, m->hd);
}

/* d_qkv and d_out are activations' gradients (fp32, or bf16 bits). */
static int attention_backward_in(const gpt_model *m, void *d_qkv, float *scratch, const void *d_out, const void *qkv,
                                 const void *out, const float *lse)
{
    const kernel_backend *k = m->kernels;
    if (m->bf16)
        return k->attention_backward_bf16(d_qkv, scratch, d_out, qkv, out, lse, m->B, m->T, m->heads_local,
                                          m->kv_local, m->hd);
    return k->attention_backward(d_qkv, scratch, d_out, qkv, out, lse, m->B, m->T, m->heads_local, m->kv_local,
                                 m->hd);
}

/* The MLP's input fc [N, fc_local] = in @ Wfc^T + bfc and its activation gl
 * [N, ffn_local] (both activations): GELU, or SwiGLU of fc's [gate | up]. */
static int mlp_forward_in(const gpt_model *m, void *gl, void *fc, const void *in, const param_view *w,
                          const float *bias)
{
    const kernel_backend *k = m->kernels;
    int64_t N = m->B * m->T;
    if (gelu_in_products(m))
        return k->matmul_forward_gelu_bf16(gl, fc, in, weight_of(m, w), bias, N, m->D, m->fc_local);
    TP_TRY(activation_product(m, fc, in, w, bias, m->D, m->fc_local));
    if (m->config.swiglu)
        return m->bf16 ? k->swiglu_forward_bf16(gl, fc, N, m->ffn_local) : k->swiglu_forward(gl, fc, N, m->ffn_local);
    return k->gelu_forward(gl, fc, N * m->ffn_local);
}

/* The backward of the MLP's output projection (d_out: the residual
 * stream's gradient) and of its activation: d_fc [N, fc_local], the
 * gradient the fc product reads (fp32, or bf16 bits), through d_gl [N,
 * ffn_local], the activation's gradient (not written where GELU is in the
 * product). */
static int mlp_output_backward(const gpt_model *m, void *d_fc, void *d_gl, float *d_weight, float *d_bias,
                               const void *d_out, const void *gl, const void *fc, const param_view *w)
{
    const kernel_backend *k = m->kernels;
    int64_t N = m->B * m->T;
    if (gelu_in_products(m))
        return k->matmul_backward_gelu_bf16(d_fc, d_weight, d_bias, d_out, gl, weight_of(m, w), fc, N, m->ffn_local,
                                            m->D);
    TP_TRY(output_product_backward(m, d_gl, d_weight, d_bias, d_out, gl, w, N, m->ffn_local, m->D));
    if (m->config.swiglu)
        return m->bf16 ? k->swiglu_backward_bf16(d_fc, fc, d_gl, N, m->ffn_local)
                       : k->swiglu_backward(d_fc, fc, d_gl, N, m->ffn_local);
    return k->gelu_backward(d_fc, fc, d_gl, N * m->ffn_local);
}

/* RoPE's backward on the attention's d_qkv (fp32, or bf16 bits), in place. */
static int rope_backward_in(const gpt_model *m, void *d_qkv)
{
    const kernel_backend *k = m->kernels;
    if (m->bf16) return k->rope_backward_bf16(d_qkv, m->rope_cos_sin, m->B, m->T, m->heads_local, m->kv_local, m->hd);
    return k->rope_backward(d_qkv, m->rope_cos_sin, m->B, m->T, m->heads_local, m->kv_local, m->hd);
}

void gpt_model_attention_path(const gpt_model *m, char *text, size_t size)
{
    if (!m->kernels->describe_attention) snprintf(text, size, "(the %s kernels do not say)", m->kernels->name);
    else m->kernels->describe_attention(m->bf16, m->B, m->T, m->heads_local, m->kv_local, m->hd, text, size);
}

/* The norms, over this rank's rows: LayerNorm (GPT-2) or RMSNorm (Llama:
 * no bias, mean unused); out is an activation. */
static int norm_forward(const gpt_model *m, void *out, float *mean, float *rstd, const float *in, const float *weight,
                        const float *bias)
{
    const kernel_backend *k = m->kernels;
    int64_t N = m->rows;
    float eps = (float)m->config.norm_eps;
    if (m->llama)
        return m->bf16 ? k->rmsnorm_forward_bf16(out, rstd, in, weight, N, m->D, eps)
                       : k->rmsnorm_forward(out, rstd, in, weight, N, m->D, eps);
    return m->bf16 ? k->layernorm_forward_bf16(out, mean, rstd, in, weight, bias, N, m->D)
                   : k->layernorm_forward(out, mean, rstd, in, weight, bias, N, m->D);
}

/* sum = x + summed (+ residual_bias), then its norm as norm_forward's: one
 * operation, one pass over the rows on a GPU (kernels.h
 * residual_layernorm_forward). sum may be summed. */
static int residual_norm_forward(const gpt_model *m, void *out, float *mean, float *rstd, float *sum, const float *x,
                                 const float *summed, const float *residual_bias, const float *weight,
                                 const float *bias)
{
    const kernel_backend *k = m->kernels;
    int64_t N = m->rows, D = m->D;
    float eps = (float)m->config.norm_eps;
    if (m->llama)
        return m->bf16 ? k->residual_rmsnorm_forward_bf16(out, rstd, sum, x, summed, residual_bias, weight, N, D, eps)
                       : k->residual_rmsnorm_forward(out, rstd, sum, x, summed, residual_bias, weight, N, D, eps);
    if (m->bf16)
        return k->residual_layernorm_forward_bf16(out, mean, rstd, sum, x, summed, residual_bias, weight, bias, N, D);
    return k->residual_layernorm_forward(out, mean, rstd, sum, x, summed, residual_bias, weight, bias, N, D);
}

/* d_in += the gradient through the norm; its parameters' gradients too.
 * d_in is the residual stream's gradient: in bf16 its bits go to
 * m->residual_bits as it is written (residual_gradient_rows). */
static int norm_backward(const gpt_model *m, float *d_in, float *d_weight, float *d_bias, const float *d_out,
                         const float *in, const float *weight, const float *mean, const float *rstd)
{
    int64_t N = m->rows;
    uint16_t *bits = m->bf16 ? m->residual_bits : NULL;
    if (m->llama) return m->kernels->rmsnorm_backward(d_in, bits, d_weight, d_out, in, weight, rstd, N, m->D);
    return m->kernels->layernorm_backward(d_in, bits, d_weight, d_bias, d_out, in, weight, mean, rstd, N, m->D);
}

/* out[rows, D] = x + summed (+ bias, when the architecture has one). */
static int residual_add(const gpt_model *m, float *out, const float *x, const float *summed, const float *bias)
{
    int64_t N = m->rows;
    if (bias) return m->kernels->bias_residual_forward(out, x, summed, bias, N, m->D);
    return m->kernels->residual_forward(out, x, summed, N * m->D);
}

static int embed_forward(gpt_model *m, gpt_slot *s)
{
    const kernel_backend *k = m->kernels;
    int64_t N = m->B * m->T, D = m->D;
    const param_view *wte = &m->params[m->wte];
    /* Rows of this rank's part of the vocabulary, summed over TP. */
    float *partial = m->sequence_parallel ? m->partial : s->input;
    TP_TRY(k->embedding_forward(partial, s->kernel_tokens, wte->data, N, D, m->vocab_first, m->vocab_local));
    TP_TRY(sum_rows(m, partial, s->input));
    if (m->wpe < 0) return TP_OK; /* Llama: positions are rotary */
    return for_position_runs(m, s->input, m->params[m->wpe].data, 0);
}

/* Layer l of the slot's chunk, whose parameters are local layer pl's. */
static int block_forward(gpt_model *m, gpt_slot *s, int l, int pl, const float *x)
{
    int64_t N = m->B * m->T, R = m->rows, D = m->D;
    void *ln1 = activation_at(m, s->ln1, l * R * D), *attn = activation_at(m, s->attn, l * N * m->attn_local);
    void *ln2 = activation_at(m, s->ln2, l * R * D), *gl = activation_at(m, s->gelu, l * N * m->ffn_local);
    void *qkv = activation_at(m, s->qkv, l * N * m->qkv_local);
    float *lse = s->att_lse + l * N * m->heads_local, *res1 = s->res1 + l * R * D;
    void *fc = activation_at(m, s->fc, l * N * m->fc_local);
    float *res2 = s->res2 + l * R * D;
    /* The row-parallel linears' partial sums [N, D]: in place without sequence parallelism. */
    float *partial1 = m->sequence_parallel ? m->partial : res1, *partial2 = m->sequence_parallel ? m->partial : res2;
    const void *in;
    TP_TRY(norm_forward(m, ln1, s->ln1_mean + l * R, s->ln1_rstd + l * R, x, W(LN1_WEIGHT), W_OR_NULL(LN1_BIAS)));
    TP_TRY(full_rows(m, ln1, &in));
    TP_TRY(qkv_forward(m, qkv, in, VIEW(QKV_WEIGHT), W_OR_NULL(QKV_BIAS)));
    /* The scratch is free during a forward: the attention's own is its start. */
    TP_TRY(attention_forward_in(m, attn, lse, m->scratch, qkv));
    /* this rank's heads' part */
    TP_TRY(linear_forward(m, partial1, attn, VIEW(PROJ_WEIGHT), NULL, N, m->attn_local, D));
    TP_TRY(sum_rows(m, partial1, res1));
    /* res1 = x + p (+ bias), and ln2 of it */
    TP_TRY(residual_norm_forward(m, ln2, s->ln2_mean + l * R, s->ln2_rstd + l * R, res1, x, res1, W_OR_NULL(PROJ_BIAS),
                                 W(LN2_WEIGHT), W_OR_NULL(LN2_BIAS)));
    TP_TRY(full_rows(m, ln2, &in));
    TP_TRY(mlp_forward_in(m, gl, fc, in, VIEW(FC_WEIGHT), W_OR_NULL(FC_BIAS)));
    TP_TRY(linear_forward(m, partial2, gl, VIEW(FCPROJ_WEIGHT), NULL, N, m->ffn_local, D));
    TP_TRY(sum_rows(m, partial2, res2));
    return residual_add(m, res2, res1, res2, W_OR_NULL(FCPROJ_BIAS));
}

/* The token losses of rows [0, rows): log of the sum of exponentials
 * relative to the row's maximum, plus the maximum, less the target's
 * logit. */
static double rows_loss(const float *row_max, const float *row_sum, const float *target_logit, int64_t rows)
{
    double loss = 0;
    for (int64_t n = 0; n < rows; n++) loss += (double)(logf(row_sum[n]) + row_max[n] - target_logit[n]);
    return loss;
}

/* On a device: the statistics of the forwards kept so far, read at once
 * (one wait), their losses added to losses_taken. */
static int read_loss_stats(gpt_model *m)
{
    int64_t N = m->B * m->T;
    TP_TRY(m->kernels->to_host(m->host_loss_stats, m->loss_stats,
                               (size_t)(m->losses_pending * 3 * N) * sizeof(float)));
    for (int j = 0; j < m->losses_pending; j++) {
        const float *stats = m->host_loss_stats + j * 3 * N;
        m->losses_taken += rows_loss(stats, stats + N, stats + 2 * N, N);
    }
    m->losses_pending = 0;
    return TP_OK;
}

/* Final norm, vocabulary-parallel logits and cross-entropy. */
static int head_forward(gpt_model *m, gpt_slot *s, const float *x)
{
    gpt_head *h = s->head;
    int64_t N = m->B * m->T, D = m->D, V = m->vocab_local;
    const kernel_backend *k = m->kernels;
    const void *in;
    TP_TRY(norm_forward(m, h->lnf, h->lnf_mean, h->lnf_rstd, x, m->params[m->lnf_w].data,
                        m->lnf_b < 0 ? NULL : m->params[m->lnf_b].data));
    TP_TRY(full_rows(m, h->lnf, &in));
    /* In bf16 the logits are a bf16 activation (autocast's), their bits in
     * h->logits (sized so): half the bytes of the step's largest array; the
     * cross-entropy widens each (kernels.h). */
    uint16_t *logit_bits = m->bf16 ? (uint16_t *)h->logits : NULL;
    TP_TRY(activation_product(m, h->logits, in, &m->params[m->wte_out], NULL, D, V));
    /* One pass over the logits: this rank's maxima and its sums relative to
     * them; then the maxima over ranks, each rank's sums made relative to
     * them (at tp 1 a multiplication by exp(0) = 1, exact) and added. */
    if (logit_bits)
        TP_TRY(k->crossentropy_row_stats_bf16(h->row_max, h->row_sum, logit_bits, N, V, m->vocab_first,
                                              m->config.vocab));
    else
        TP_TRY(k->crossentropy_row_stats(h->row_max, h->row_sum, h->logits, N, V, m->vocab_first, m->config.vocab));
    TP_TRY(k->copy(h->local_max, h->row_max, (size_t)N * sizeof(float)));
    TP_TRY(comm_all_reduce(m->comm, GROUP_TP, h->row_max, N, COMM_FLOAT, COMM_MAX, m->stream));
    TP_TRY(k->crossentropy_rescale_sum(h->row_sum, h->local_max, h->row_max, N));
    TP_TRY(tp_sum(m, h->row_sum, N));
    if (logit_bits)
        TP_TRY(k->crossentropy_target_logit_bf16(h->target_logit, logit_bits, s->kernel_targets, N, V,
                                                 m->vocab_first));
    else
        TP_TRY(k->crossentropy_target_logit(h->target_logit, h->logits, s->kernel_targets, N, V, m->vocab_first));
    TP_TRY(tp_sum(m, h->target_logit, N));
    if (!k->on_device) {
        s->loss_sum = gpt_slot_loss(s, N);
        m->losses_taken += s->loss_sum;
        return TP_OK;
    }
    /* On a device: kept there, read with the step's others (row_max,
     * row_sum and target_logit are consecutive [N] each); by the first
     * tensor-parallel rank alone, whose loss the step reports. */
    s->loss_sum = NAN;
    if (!m->loss_stats) return TP_OK;
    if (m->losses_pending == m->losses_held) TP_TRY(read_loss_stats(m)); /* more micro-batches than it holds */
    size_t bytes = (size_t)(3 * N) * sizeof(float);
    TP_TRY(k->copy(m->loss_stats + m->losses_pending * 3 * N, h->row_max, bytes));
    m->losses_pending++;
    return TP_OK;
}

/* Local layer pl's shared key/value heads (kv_sharers > 1): the sum of
 * their replicas' gradients on each. */
static int reduce_shared_kv_layer(gpt_model *m, int pl)
{
    const kernel_backend *k = m->kernels;
    /* This rank's piece of qkv is [its query heads | its key head | its value
     * head] x D; head kv_head's slot in kv_grads is [2, hd, D]. */
    int64_t head_floats = m->hd * m->D, kv_heads = m->config.kv_heads;
    int64_t kv_head = m->comm->tp_rank / m->kv_sharers;
    size_t pair_bytes = (size_t)(2 * head_floats) * sizeof(float);
    float *rows = G(QKV_WEIGHT) + m->attn_local * m->D;
    TP_TRY(k->zero(m->kv_grads, (size_t)kv_heads * pair_bytes));
    TP_TRY(k->copy(m->kv_grads + kv_head * 2 * head_floats, rows, pair_bytes));
    TP_TRY(tp_sum(m, m->kv_grads, kv_heads * 2 * head_floats));
    return k->copy(rows, m->kv_grads + kv_head * 2 * head_floats, pair_bytes);
}

/* With sequence parallelism, the sum over TP of the gradients of a use's
 * tensors that each rank computed from its own rows alone: the norms'
 * weights and biases, the position table. */
static int reduce_sequence_parallel_use(gpt_model *m, int use)
{
    int views[GPT_LAYER_KINDS + 1], n = zero_use_views(m, use, views);
    for (int j = 0; j < n; j++) {
        param_view *v = &m->params[views[j]];
        switch (v->spec->kind) {
        case GPT_LN1_WEIGHT: case GPT_LN1_BIAS: case GPT_LN2_WEIGHT: case GPT_LN2_BIAS:
        case GPT_FINAL_NORM_WEIGHT: case GPT_FINAL_NORM_BIAS: case GPT_POS_EMBED:
            TP_TRY(tp_sum(m, v->grad, v->numel));
            break;
        default: break;
        }
    }
    return TP_OK;
}

/* The end of a use's backward with ZeRO-3, its gradients gathered for this
 * micro-batch alone: the sums over TP that reduce_shared_kv and
 * reduce_sequence_parallel make at the end of the step without it, then the
 * sum over the data-parallel ranks into each one's shard (the TP ranks of a
 * replica run the same use together). */
static int release_use_gradients(gpt_model *m, int use)
{
    if (m->zero != 3) return TP_OK;
    if (m->sequence_parallel) TP_TRY(reduce_sequence_parallel_use(m, use));
    if (m->kv_sharers > 1 && use >= 0) TP_TRY(reduce_shared_kv_layer(m, use));
    return zero_release_use(m);
}

int gpt_model_reduce_shared_kv(gpt_model *m)
{
    if (m->kv_sharers == 1 || m->zero == 3) return TP_OK; /* ZeRO-3: per use, release_use_gradients */
    for (int pl = 0; pl < m->num_layers; pl++) TP_TRY(reduce_shared_kv_layer(m, pl));
    return TP_OK;
}

double gpt_slot_loss(const gpt_slot *s, int64_t rows)
{
    const gpt_head *h = s->head;
    return h->host_row_max ? rows_loss(h->host_row_max, h->host_row_sum, h->host_target_logit, rows) : NAN;
}

int gpt_model_take_losses(gpt_model *m, double *loss_sum)
{
    if (m->losses_pending) TP_TRY(read_loss_stats(m));
    *loss_sum = m->losses_taken;
    m->losses_taken = 0;
    return TP_OK;
}

const float *gpt_model_output(const gpt_model *m, const gpt_slot *s)
{
    return m->chunk_layers ? s->res2 + (m->chunk_layers - 1) * m->rows * m->D : s->input;
}

int gpt_model_chunk_is_first(const gpt_model *m, int chunk)
{
    return m->is_first && chunk == 0;
}

int gpt_model_chunk_is_last(const gpt_model *m, int chunk)
{
    return m->is_last && chunk == m->virtual_stages - 1;
}

int gpt_model_forward(gpt_model *m, gpt_slot *s, int chunk)
{
    if (chunk < 0 || chunk >= m->virtual_stages)
        return tp_fail(TP_ERR_ARG, "chunk %d of a stage of %d", chunk, m->virtual_stages);
    int reads_tokens = gpt_model_chunk_is_first(m, chunk) || gpt_model_chunk_is_last(m, chunk);
    if (reads_tokens && s->kernel_tokens != s->tokens) /* tokens and targets, consecutive */
        TP_TRY(m->kernels->to_device(s->kernel_tokens, s->tokens, (size_t)(2 * m->B * m->T) * sizeof(int)));
    /* ZeRO-3: each use's parameters gathered before it, let go after (zero.h). */
    if (gpt_model_chunk_is_first(m, chunk)) {
        TP_TRY(zero_gather_use(m, ZERO_USE_EMBEDDING, ZERO_PARAMS));
        TP_TRY(embed_forward(m, s));
        TP_TRY(zero_release_use(m));
    }
    const float *x = s->input;
    for (int l = 0; l < m->chunk_layers; l++) {
        int pl = chunk * m->chunk_layers + l;
        TP_TRY(zero_gather_use(m, pl, ZERO_PARAMS));
        TP_TRY(use_weights16(m, pl));
        TP_TRY(block_forward(m, s, l, pl, x));
        TP_TRY(zero_release_use(m));
        x = s->res2 + l * m->rows * m->D;
    }
    if (gpt_model_chunk_is_last(m, chunk)) {
        if (!s->head) return tp_fail(TP_ERR_ARG, "a forward through the head on a slot without head buffers bound");
        TP_TRY(zero_gather_use(m, ZERO_USE_HEAD, ZERO_PARAMS));
        TP_TRY(use_weights16(m, ZERO_USE_HEAD));
        TP_TRY(head_forward(m, s, x));
        TP_TRY(zero_release_use(m));
    }
    return TP_OK;
}

/* ----------------------------------------------------------------- backward */

/* d_x: in, the gradient of the block's output r2 [rows, D]; out, that of
 * its input x, in place: the residual stream's gradient passes through
 * each residual add unchanged, so each norm's backward adds its part to d_x
 * once the products have read it (no copy of the stream's gradient). With
 * sequence parallelism a row-parallel linear's output gradient is every
 * rank's rows gathered, and a column-parallel linear's input gradient
 * (partial per rank) is reduce-scattered to the rows; the norms' outputs
 * are gathered again rather than kept whole. */
static int block_backward(gpt_model *m, gpt_slot *s, int l, int pl, const float *x, float *d_x, float *work)
{
    int64_t N = m->B * m->T, R = m->rows, D = m->D;
    const void *ln1 = activation_at(m, s->ln1, l * R * D), *attn = activation_at(m, s->attn, l * N * m->attn_local);
    const void *ln2 = activation_at(m, s->ln2, l * R * D), *gl = activation_at(m, s->gelu, l * N * m->ffn_local);
    const void *qkv = activation_at(m, s->qkv, l * N * m->qkv_local);
    const float *lse = s->att_lse + l * N * m->heads_local;
    const float *res1 = s->res1 + l * R * D;
    const void *fc = activation_at(m, s->fc, l * N * m->fc_local);
    float *d_ln = work;
    /* The activations' gradients (fp32, or bf16 bits), each in an fp32-sized place. */
    float *d_qkv = block_d_qkv(m, work), *d_attn = d_qkv + N * m->qkv_local;
    float *d_gelu = gelu_in_products(m) ? NULL : d_attn + N * m->attn_local; /* GELU's output's, where kept */
    float *d_fc = d_attn + N * m->attn_local + (d_gelu ? N * m->ffn_local : 0), *att_scratch = d_fc + N * m->fc_local;
    /* d_ln summed over TP: in place, or this rank's rows of it. */
    float *d_ln_rows = m->sequence_parallel ? m->gathered : d_ln;
    const void *d_out, *in;

    /* MLP: o = allreduce(g Wfcproj^T) + b: the gradient of o is d_x on every rank. */
    TP_TRY(residual_gradient_rows(m, d_x, &d_out));
    TP_TRY(mlp_output_backward(m, d_fc, d_gelu, G(FCPROJ_WEIGHT), G_OR_NULL(FCPROJ_BIAS), d_out, gl, fc,
                               VIEW(FCPROJ_WEIGHT)));
    TP_TRY(full_rows(m, ln2, &in));
    TP_TRY(input_product_backward(m, d_ln, G(FC_WEIGHT), G_OR_NULL(FC_BIAS), d_fc, in, VIEW(FC_WEIGHT), N, D,
                                  m->fc_local));
    TP_TRY(sum_rows(m, d_ln, d_ln_rows)); /* column-parallel input: partial per rank */
    /* d_x becomes the gradient of res1 = x + p: r2's plus ln2's part. */
    TP_TRY(norm_backward(m, d_x, G(LN2_WEIGHT), G_OR_NULL(LN2_BIAS), d_ln_rows, res1, W(LN2_WEIGHT),
                         s->ln2_mean + l * R, s->ln2_rstd + l * R));

    /* Attention: p = allreduce(a Wproj^T) + b. */
    TP_TRY(residual_gradient_rows(m, d_x, &d_out));
    TP_TRY(output_product_backward(m, d_attn, G(PROJ_WEIGHT), G_OR_NULL(PROJ_BIAS), d_out, attn, VIEW(PROJ_WEIGHT), N,
                                   m->attn_local, D));
    TP_TRY(attention_backward_in(m, d_qkv, att_scratch, d_attn, qkv, attn, lse));
    if (m->llama) TP_TRY(rope_backward_in(m, d_qkv));
    TP_TRY(full_rows(m, ln1, &in));
    TP_TRY(input_product_backward(m, d_ln, G(QKV_WEIGHT), G_OR_NULL(QKV_BIAS), d_qkv, in, VIEW(QKV_WEIGHT), N, D,
                                  m->qkv_local));
    TP_TRY(sum_rows(m, d_ln, d_ln_rows));
    return norm_backward(m, d_x, G(LN1_WEIGHT), G_OR_NULL(LN1_BIAS), d_ln_rows, x, W(LN1_WEIGHT), s->ln1_mean + l * R,
                         s->ln1_rstd + l * R);
}

/* The logits' gradient is written over them (kernels.h: in place), the
 * step's largest array [N, vocab_local]: no second one. */
static int head_backward(gpt_model *m, gpt_slot *s, const float *x, float *d_x, float *work, float loss_scale)
{
    int64_t N = m->B * m->T, D = m->D, V = m->vocab_local;
    float *d_lnf = work, *d_lnf_rows = m->sequence_parallel ? m->gathered : d_lnf;
    const void *in;
    param_view *wte = &m->params[m->wte_out];
    const kernel_backend *k = m->kernels;
    const gpt_head *h = s->head;
    TP_TRY(full_rows(m, h->lnf, &in));
    if (m->bf16) /* d_logits straight into the products' bf16 operand (kernels.h) */
        TP_TRY(k->classifier_backward_bf16(d_lnf, wte->grad, (uint16_t *)h->logits, h->row_max,
                                           h->row_sum, s->kernel_targets, in, weight_of(m, wte), N, D, V,
                                           m->vocab_first, m->config.vocab, loss_scale));
    else {
        TP_TRY(k->crossentropy_backward(h->logits, h->logits, h->row_max, h->row_sum, s->kernel_targets, N, V,
                                        m->vocab_first, m->config.vocab, loss_scale));
        TP_TRY(input_product_backward(m, d_lnf, wte->grad, NULL, h->logits, in, wte, N, D, V));
    }
    TP_TRY(sum_rows(m, d_lnf, d_lnf_rows)); /* logits were split by vocabulary */
    TP_TRY(k->zero(d_x, (size_t)(m->rows * D) * sizeof(float)));
    return norm_backward(m, d_x, m->params[m->lnf_w].grad, m->lnf_b < 0 ? NULL : m->params[m->lnf_b].grad, d_lnf_rows,
                         x, m->params[m->lnf_w].data, h->lnf_mean, h->lnf_rstd);
}

int gpt_model_backward(gpt_model *m, gpt_slot *s, int chunk, const float *d_output, float *d_input, float loss_scale)
{
    int64_t N = m->B * m->T, R = m->rows, D = m->D;
    float *work = m->scratch;
    float *d_x = work + block_work_floats(m); /* after the block's buffers */
    const float *top = gpt_model_output(m, s);
    const kernel_backend *k = m->kernels;
    if (chunk < 0 || chunk >= m->virtual_stages)
        return tp_fail(TP_ERR_ARG, "chunk %d of a stage of %d", chunk, m->virtual_stages);
    if (gpt_model_chunk_is_last(m, chunk)) {
        TP_TRY(zero_gather_use(m, ZERO_USE_HEAD, ZERO_PARAMS | ZERO_GRADS));
        TP_TRY(use_weights16(m, ZERO_USE_HEAD));
        TP_TRY(head_backward(m, s, top, d_x, work, loss_scale));
        TP_TRY(release_use_gradients(m, ZERO_USE_HEAD));
    } else {
        TP_TRY(k->copy(d_x, d_output, (size_t)(R * D) * sizeof(float)));
        if (m->bf16) TP_TRY(k->round_to_bf16(m->residual_bits, d_x, R * D)); /* as a norm's backward writes them */
    }
    for (int l = m->chunk_layers - 1; l >= 0; l--) {
        const float *x = l ? s->res2 + (l - 1) * R * D : s->input;
        int pl = chunk * m->chunk_layers + l;
        TP_TRY(zero_gather_use(m, pl, ZERO_PARAMS | ZERO_GRADS));
        TP_TRY(use_weights16(m, pl));
        TP_TRY(block_backward(m, s, l, pl, x, d_x, work));
        TP_TRY(release_use_gradients(m, pl));
    }
    if (gpt_model_chunk_is_first(m, chunk)) {
        TP_TRY(zero_gather_use(m, ZERO_USE_EMBEDDING, ZERO_GRADS)); /* the tables' gradients need no values */
        const param_view *wte = &m->params[m->wte];
        const float *d_all;
        TP_TRY(all_rows_of_gradient(m, d_x, &d_all)); /* every token's row meets this rank's part of the table */
        TP_TRY(k->embedding_backward(wte->grad, s->kernel_tokens, d_all, N, D, m->vocab_first, m->vocab_local));
        if (m->wpe >= 0) TP_TRY(for_position_runs(m, d_x, m->params[m->wpe].grad, 1));
        return release_use_gradients(m, ZERO_USE_EMBEDDING);
    }
    return k->copy(d_input, d_x, (size_t)(R * D) * sizeof(float));
}

int gpt_model_reduce_sequence_parallel(gpt_model *m)
{
    if (!m->sequence_parallel || m->zero == 3) return TP_OK; /* ZeRO-3: per use, release_use_gradients */
    for (int use = ZERO_USE_HEAD; use < m->num_layers; use++)
        TP_TRY(reduce_sequence_parallel_use(m, use));
    return TP_OK;
}
