/* plan.c: the layout planner (plan.h). For every (tp, pp) that fits the
 * world it finds the largest DP that keeps the global batch and the largest
 * micro-batch within the limit that divides a DP rank's share and fits in
 * memory, estimates memory and communication per rank, and names the first
 * rule a layout breaks; then it picks by the preferences plan.h lists.
 *
 * The estimates count what the trainer holds and sends (trainer/model.c,
 * trainer/train.c, trainer/checkpoint.c), not a textbook formula: the
 * orchestrator links none of the trainer, so the counts are repeated here
 * and each says where its original lives. Notation: b micro-batch, s the
 * model's sequence, N = b*s rows, D dim, H heads, KV key/value heads,
 * hd = D/H, F the MLP width, Vp the vocabulary padded for tp, L/pp layers
 * per stage. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/dtype.h"
#include "../common/error.h"
#include "../kernels/kernels.h"
#include "../trainer/model.h"
#include "../trainer/schedule.h"
#include "plan.h"

#define DEFAULT_MICRO_BATCH_LIMIT 8
#define FP32 4 /* bytes: the trainer's activations, gradients, moments and messages */
#define GIB (1024.0 * 1024.0 * 1024.0)
#define MIB (1024.0 * 1024.0)

/* "1.50 GiB", "12.0 MiB", "800 KiB": sizes in reasons. */
static const char *format_bytes(double bytes, char *out, size_t size)
{
    if (bytes >= GIB) snprintf(out, size, "%.2f GiB", bytes / GIB);
    else if (bytes >= MIB) snprintf(out, size, "%.1f MiB", bytes / MIB);
    else snprintf(out, size, "%.0f KiB", bytes / 1024.0);
    return out;
}

/* ------------------------------------------------------- what a rank holds */

/* What one TP rank of one pipeline stage holds, in elements. The first TP
 * rank is counted: it also stores the replicated tensors' snapshot. With a
 * sharded optimizer, the first data-parallel rank. */
typedef struct {
    int64_t params;      /* its pieces of the parameters (padding included), the tied copy too */
    int64_t shard;       /* with a sharded optimizer, its shard of them (trainer/model.h zero_unit) */
    int64_t work;        /* ZeRO-3: the units of one use gathered whole, the most of any use */
    int64_t owned;       /* of those, what it stores: all but the tied copy */
    int64_t written;     /* of those, what its checkpoint snapshot copies: all owned, or with ZeRO-3 those
                            it writes the state of (trainer/zero.h zero_lay_out) */
    int64_t moments_written; /* of those, whose moments it writes (all owned, or with a sharded optimizer
                                those zero_lay_out gives it) */
    int64_t embed_piece; /* its piece of the token table, [Vp/tp, D]; 0 on a stage without one */
    int64_t vocab_local; /* Vp/tp: its columns of the logits */
} stage_share;

static int64_t elements(const int64_t *shape, int ndim)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

/* One view of a stage, in the trainer's order. */
typedef struct {
    int64_t numel;
    int layer, kind, tied_copy;
} stage_view;

/* What the first data-parallel rank writes of a stage's views (its share's
 * written and moments_written), the writers chosen as the trainer chooses
 * them (trainer/zero.h zero_lay_out): each stored view to the rank with the
 * fewest values to write so far. load: dp entries, zeroed. */
static void first_rank_writes(const stage_view *views, int count, int zero, int dp, int64_t *load, stage_share *share)
{
    for (int j = 0; j < count && zero == 1; j++) load[0] += views[j].tied_copy ? 0 : views[j].numel;
    for (int j = 0; j < count; j++) {
        if (views[j].tied_copy) continue; /* the last stage's copy: stored by the first */
        int writer = 0;
        for (int d = 1; d < dp && zero; d++)
            if (load[d] < load[writer]) writer = d;
        if (zero) load[writer] += (zero == 3 ? 3 : 2) * views[j].numel;
        if (writer) continue;
        share->written += views[j].numel;
        share->moments_written += views[j].numel;
    }
    if (zero == 1) share->written = share->owned; /* every parameter */
}

/* A stage's units as the trainer forms them (trainer/zero.c starts_unit,
 * zero_lay_out) from its views: one of all of them, or with ZeRO-3 one per
 * run of a layer's views and one per other view; each padded to dp pieces
 * with a sharded optimizer. Fills the share's params, shard and (ZeRO-3)
 * work. */
static void stage_units(const stage_view *views, int count, int zero, int dp, int first, int last, stage_share *share)
{
    int per_use = zero == 3;
    int64_t head = 0, embedding = 0, layer_span = 0;
    for (int i = 0; i < count;) {
        int end = i + 1;
        while (end < count && !(per_use && (views[end].layer < 0 || views[end].layer != views[end - 1].layer))) end++;
        int64_t length = 0;
        for (int j = i; j < end; j++) length += views[j].numel;
        int64_t piece = zero ? (length + dp - 1) / dp : length, span = zero ? piece * dp : length;
        share->params += span;
        share->shard += piece;
        /* ZeRO-3's uses (trainer/zero.h zero_use_views): a layer; the
         * embedding (token and position tables); the head (final norm, the
         * output projection: the tied copy, or the table itself on one stage,
         * or Llama's own). */
        int kind = views[i].kind;
        if (views[i].layer >= 0) {
            int same = i > 0 && views[i - 1].layer == views[i].layer;
            layer_span = same ? layer_span + span : span;
            if (layer_span > share->work) share->work = layer_span;
        } else if (kind == GPT_FINAL_NORM_WEIGHT || kind == GPT_FINAL_NORM_BIAS || kind == GPT_OUTPUT_WEIGHT ||
                   views[i].tied_copy) {
            head += span;
        } else if (kind == GPT_TOK_EMBED || kind == GPT_POS_EMBED) {
            embedding += span;
            if (kind == GPT_TOK_EMBED && first && last) head += span; /* one stage: the table is the output too */
        }
        i = end;
    }
    if (!per_use) share->work = 0;
    else {
        if (first && embedding > share->work) share->work = embedding;
        if (last && head > share->work) share->work = head;
    }
}

/* A model and its tensor catalogue (model/gpt.h gpt_catalog), built once
 * per plan: every layout considered reads it, several times each. */
typedef struct {
    const gpt_config *config;
    gpt_tensor *tensors;
    int count;
} catalogued_model;

static int catalogued_model_make(const gpt_config *config, catalogued_model *out)
{
    out->config = config;
    out->tensors = NULL;
    out->count = 0;
    return gpt_catalog(config, 0, &out->tensors, &out->count);
}

static void catalogued_model_free(catalogued_model *m)
{
    free(m->tensors);
    m->tensors = NULL;
}

/* The pieces each stage holds at (tp, pp), from the catalogue's partition
 * descriptions and pipeline anchors (model/gpt.h). The token table sits on
 * the first stage; a separate last stage keeps a copy of it for the tied
 * output projection (trainer/model.c gpt_model_create), or holds Llama's
 * untied output.weight. With fewer key/value heads than tp ranks, each
 * rank's QKV piece holds its shared heads' replicas. The trainer lays the
 * pieces out in the catalogue's order, the tied copy where the table is,
 * in units split over dp ranks by a sharded optimizer (zero 1 or 3; 0:
 * none). shares has pp entries. */
static int stage_shares(const catalogued_model *cm, int tp, int pp, int zero, int dp, stage_share *shares)
{
    const gpt_config *model = cm->config;
    const gpt_tensor *catalog = cm->tensors;
    int count = cm->count;
    ckpt_layout layout = {tp, pp, 1, model->layers, 1};
    memset(shares, 0, (size_t)pp * sizeof *shares);
    if (dp < 2) zero = 0;
    stage_view *views = calloc((size_t)count + 1, sizeof *views);
    int64_t *load = calloc((size_t)(zero ? dp : 1), sizeof *load);
    /* Each tensor's piece (elements at tp) and stage, once: the stages below read them. */
    int64_t *numel = malloc(((size_t)count + 1) * sizeof *numel);
    int *stage_of = malloc(((size_t)count + 1) * sizeof *stage_of);
    if (!views || !load || !numel || !stage_of) {
        free(views), free(load), free(numel), free(stage_of);
        return tp_fail(TP_ERR_NOMEM, "out of memory estimating memory for tp %d pp %d", tp, pp);
    }
    int64_t vocab_local = 0;
    for (int i = 0; i < count; i++) {
        int64_t shape[CKPT_MAX_DIMS];
        ckpt_piece_shape(&catalog[i].desc, tp, shape);
        numel[i] = elements(shape, catalog[i].desc.ndim);
        stage_of[i] = ckpt_tensor_stage(&catalog[i].desc, &layout);
        if (catalog[i].kind == GPT_TOK_EMBED) vocab_local = shape[0];
    }
    for (int stage = 0; stage < pp; stage++) {
        stage_share *here = &shares[stage];
        int n = 0;
        if (stage == pp - 1) here->vocab_local = vocab_local;
        for (int i = 0; i < count; i++) {
            int is_wte = catalog[i].kind == GPT_TOK_EMBED;
            int tied_copy = is_wte && pp > 1 && stage == pp - 1 && !model->untied_embeddings;
            if (stage_of[i] != stage && !tied_copy) continue;
            if (is_wte) here->embed_piece = numel[i];
            if (!tied_copy) here->owned += numel[i];
            views[n++] = (stage_view){numel[i], catalog[i].layer, catalog[i].kind, tied_copy};
        }
        stage_units(views, n, zero, dp, stage == 0, stage == pp - 1, here);
        memset(load, 0, (size_t)(zero ? dp : 1) * sizeof *load);
        first_rank_writes(views, n, zero, dp, load, here);
    }
    free(views), free(load), free(numel), free(stage_of);
    return TP_OK;
}

/* fp32 elements one micro-batch keeps for its backward pass on one rank of
 * a stage (trainer/model.c slot_floats; column-parallel widths over tp).
 * With bf16 (tp-train --dtype bf16) the activations marked * are bf16, two
 * to an fp32 element (bf16_activation_floats):
 *   the stage's input                             [N, D]
 *   per layer  ln1*, res1, ln2*, res2             4 x [N, D]
 *              norm means and 1/std               4 x [N]
 *              qkv*                               [N, (H/tp + 2 KVl) * hd], KVl = KV/tp or 1 (K < TP)
 *              attention row log-sum-exps         [N, H/tp]
 *              attention output*                  [N, H/tp * hd]
 *              fc* (pre-activation), gelu*        [N, F/tp] x 2 (fc [N, 2F/tp] with SwiGLU)
 *   a head, on the last stage (a pool of its own: as many as its schedule
 *   has in flight through it, trainer/model.h gpt_head)
 *              final norm*                        [N, D]
 *              its mean and 1/std, the loss's
 *              row max, sum and target logit, and
 *              this rank's own row max            6 x [N]
 *              logits*                            [N, Vp/tp] */
/* Columns of a rank's QKV: its query heads and its key/value heads (one
 * shared head when there are fewer than tp). */
static int64_t qkv_local(const gpt_config *m, int tp)
{
    int64_t kv_local = m->kv_heads >= tp ? m->kv_heads / tp : 1;
    return (m->heads / tp + 2 * kv_local) * (m->dim / m->heads);
}

/* fp32 elements that hold `count` values of an activation marked * above:
 * fp32, or with bf16 two to an element, each region (a chunk's layers of
 * one) rounded up as trainer/model.c carves it. */
static int64_t bf16_activation_floats(const gpt_config *m, int64_t count)
{
    return m->dtype == TP_BF16 ? (count + 1) / 2 : count;
}

/* With sequence parallelism the rows of the stage's input, the norms,
 * their statistics and the residuals are N / tp (R below). A slot: the
 * input and the layers of a chunk (L = layers / chunks of them). */
static int64_t micro_batch_floats(const gpt_config *m, int tp, int chunks, int64_t b, int sequence_parallel)
{
    int64_t s = m->seq, N = b * s, R = sequence_parallel ? N / tp : N, D = m->dim, hd = m->dim / m->heads;
    int64_t heads = m->heads / tp, qkv = qkv_local(m, tp), attn = heads * hd, f = m->ffn / tp, L = m->layers / chunks;
    int64_t fp32 = L * (R * (2 * D + 4) + N * heads);
    int64_t activations = 2 * bf16_activation_floats(m, L * R * D) + bf16_activation_floats(m, L * N * qkv) +
                          bf16_activation_floats(m, L * N * attn) +
                          bf16_activation_floats(m, L * N * (m->swiglu ? 2 : 1) * f) +
                          bf16_activation_floats(m, L * N * f);
    return R * D + fp32 + activations;
}

/* A head's buffers on the last stage (trainer/model.h gpt_head). */
static int64_t head_floats(const gpt_config *m, int tp, int64_t b, int64_t vocab_local, int sequence_parallel)
{
    int64_t N = b * m->seq, R = sequence_parallel ? N / tp : N;
    return gpt_head_buffer_floats(bf16_activation_floats(m, R * m->dim)) + 2 * gpt_head_buffer_floats(R) +
           gpt_head_buffer_floats(bf16_activation_floats(m, N * vocab_local)) + 4 * gpt_head_buffer_floats(N);
}

/* fp32 elements of the backward pass's working memory, once per rank: the
 * scratch (trainer/model.c: [N, 2 D + qkv + attn + F/tp + fc], fc being F/tp
 * or 2 F/tp with SwiGLU, and no F/tp (GELU's output's gradient) for a GELU
 * MLP in bf16, and attention's, kernels.h attention_scratch_floats; the
 * logits' gradient takes the logits' place), the gradients that cross stages
 * (trainer/train.c: d_output [R, D] and, where the stage sends gradients
 * back, PIPELINE_GRAD_BUFFERS d_input [R, D], R the rows a rank keeps: N,
 * or N / tp with sequence parallelism), in bf16 the residual stream's
 * gradient's bf16 bits [R, D] (model.h residual_bits), and
 * Llama's rotary table [S, hd] and, with K < TP, the key/value heads'
 * gradients summed over TP [KV, 2 hd, D]. */
static int64_t backward_floats(const gpt_config *m, int tp, int64_t b, int64_t grad_buffers, int sequence_parallel)
{
    int64_t s = m->seq, N = b * s, D = m->dim, hd = m->dim / m->heads;
    int64_t qkv = qkv_local(m, tp), attn = m->heads / tp * hd, f = m->ffn / tp, fc = m->swiglu ? 2 * f : f;
    int64_t d_gelu = m->dtype == TP_BF16 && !m->swiglu ? 0 : f; /* GPT-2's bf16 GELU is in its products */
    int64_t scratch = N * (2 * D + qkv + attn + d_gelu + fc) + attention_scratch_floats(b, s, m->heads / tp);
    int64_t llama = m->arch == GPT_ARCH_LLAMA ? s * hd + (m->kv_heads < tp ? 2 * m->kv_heads * hd * D : 0) : 0;
    int64_t gathering = sequence_parallel ? 2 * N * D : 0; /* sequence parallelism's two [N, D] buffers */
    int64_t R = sequence_parallel ? N / tp : N;
    int64_t residual_bits = m->dtype == TP_BF16 ? (R * D + 1) / 2 : 0;
    return scratch + (1 + grad_buffers) * R * D + residual_bits + llama + gathering;
}

/* Memory of one rank of `stage` with V virtual stages. Its schedule
 * (trainer/schedule.h) says how many chunks of micro-batches it keeps in
 * flight at most: the trainer's slots, each one chunk's layers (under 1F1B
 * up to pp - k micro-batches on stage k, never more than the accumulation). */
static int stage_memory(const gpt_config *m, int tp, int pp, int V, int stage, const stage_share *share,
                        int64_t micro_batch, int64_t grad_accum, int sp, int zero, elastic_memory *result)
{
    elastic_memory out;
    int last = stage == pp - 1, slots;
    pipeline_op *ops = NULL;
    int64_t count;
    TP_TRY(pipeline_schedule(pp, stage, V, grad_accum, &ops, &count, &slots));
    pipeline_buffers buffers = pipeline_buffers_used(ops, count);
    free(ops);
    /* A sharded optimizer (trainer/model.h): the moments of a shard; ZeRO-1
     * keeps the parameters and gradients whole (its shard's summed in their
     * own place), ZeRO-3 its shard of them and the work area of one use
     * (its parameters and their gradients). */
    int64_t p = zero == 3 ? share->shard + share->work : share->params;
    /* fp32 masters, and below fp32 the products' copy of them: of the work
     * area alone with ZeRO-3 (rounded at each gather, trainer/zero.c) */
    int64_t copy = zero == 3 ? share->work : p;
    out.weights = p * FP32 + (m->dtype == TP_FP32 ? 0 : copy * (int64_t)tp_dtype_size(m->dtype));
    out.gradients = p * FP32;
    out.optimizer = (zero ? share->shard : share->params) * 2 * FP32; /* AdamW: two fp32 moments */
    /* trainer/checkpoint.c: what replica 0 writes, weights and moments */
    out.snapshot = (share->written + 2 * share->moments_written) * FP32;
    /* A slot holds one chunk (of pp x V), a head the logits of one micro-batch in flight through it. */
    out.activations = FP32 * (slots * micro_batch_floats(m, tp, pp * V, micro_batch, sp) +
                              (last ? buffers.heads * head_floats(m, tp, micro_batch, share->vocab_local, sp) : 0) +
                              backward_floats(m, tp, micro_batch, buffers.grad_buffers, sp));
    out.total = out.weights + out.gradients + out.optimizer + out.snapshot + out.activations;
    *result = out;
    return TP_OK;
}

/* The stage with the most memory, at a given accumulation and V. */
static int memory_estimate(const catalogued_model *cm, int tp, int pp, int V, int64_t micro_batch, int64_t grad_accum,
                           int sp, int zero, int dp, elastic_memory *out)
{
    memset(out, 0, sizeof *out);
    stage_share *shares = calloc((size_t)pp, sizeof *shares);
    if (!shares) return tp_fail(TP_ERR_NOMEM, "out of memory estimating memory for tp %d pp %d", tp, pp);
    if (dp < 2) zero = 0;
    int status = stage_shares(cm, tp, pp, zero, dp, shares);
    for (int stage = 0; !status && stage < pp; stage++) {
        elastic_memory m;
        status = stage_memory(cm->config, tp, pp, V, stage, &shares[stage], micro_batch, grad_accum, sp, zero, &m);
        if (!status && m.total > out->total) *out = m;
    }
    free(shares);
    return status;
}

/* Whether tp-train can split a micro-batch's rows over tp (--sequence-parallel). */
static int can_split_rows(const gpt_config *model, int tp, int64_t micro_batch)
{
    return tp > 1 && (micro_batch * model->seq) % tp == 0;
}

int elastic_memory_estimate(const gpt_config *model, int tp, int pp, int64_t micro_batch, int sequence_parallel,
                            int zero, int dp, elastic_memory *out)
{
    memset(out, 0, sizeof *out);
    if (tp < 1 || pp < 1 || micro_batch < 1 || dp < 1)
        return tp_fail(TP_ERR_ARG, "memory estimate: tp %d, pp %d, micro-batch %lld and dp %d must be at least 1",
                       tp, pp, (long long)micro_batch, dp);
    if (zero != 0 && zero != 1 && zero != 3)
        return tp_fail(TP_ERR_ARG, "memory estimate: ZeRO stage %d (0, 1 or 3)", zero);
    TP_TRY(gpt_config_check(model, tp, pp));
    if (sequence_parallel && !can_split_rows(model, tp, micro_batch))
        return tp_fail(TP_ERR_ARG, "sequence parallelism: %lld rows do not split over tp %d",
                       (long long)(micro_batch * model->seq), tp);
    catalogued_model cm;
    TP_TRY(catalogued_model_make(model, &cm));
    int status = memory_estimate(&cm, tp, pp, 1, micro_batch, pp, sequence_parallel, zero, dp, out); /* 1F1B at its deepest */
    catalogued_model_free(&cm);
    return status;
}

/* ------------------------------------------------------ what a rank sends */

/* A ring all-reduce of n ranks sends 2 (n - 1)/n of the buffer per rank. */
static double ring(int n)
{
    return n > 1 ? 2.0 * (n - 1) / n : 0.0;
}

/* fp32 bytes one rank of `stage` sends per optimizer step
 * (trainer/model.c and trainer/train.c), with a = [N, D] fp32:
 *   TP  per micro-batch, all-reduced over the tp ranks of the stage:
 *       per layer 2 forward (attention and MLP outputs, row-parallel) and
 *       2 backward (the layer-norm input gradients, column-parallel);
 *       first stage: the embedding a; last stage: the final norm's gradient
 *       a and the loss's row max, sum and target logit 3 x [N]
 *       With sequence parallelism an all-gather or a reduce-scatter sends
 *       half of an all-reduce: per layer 2 + 2 in the forward, 4 + 2 in the
 *       backward (the norms' outputs gathered again), 5 a in all; the first
 *       stage a (the embedding's reduce-scatter and its gradient's gather),
 *       the last 1.5 a (the final norm gathered twice, its gradient
 *       reduce-scattered); and once a step the norms' weights and biases
 *       (and the position table) all-reduced
 *   PP  per micro-batch and chunk, a forward to the next stage and its
 *       gradient back to the previous one (point to point; with V virtual
 *       stages the last stage's chunks but the last send on to the first
 *       stage, and the first stage's but the first send back): a rank's
 *       rows, a / tp with sequence parallelism
 *   tie when pp > 1, first and last stages all-reduce the token table's
 *       gradient piece [Vp/tp, D] between them
 *   DP  the rank's gradients, all-reduced over the dp replicas (ZeRO-1:
 *       reduce-scattered and the parameters all-gathered, as much; ZeRO-3:
 *       below) */
static double stage_comm_bytes(const gpt_config *m, const elastic_layout *l, int stage, const stage_share *share)
{
    int first = stage == 0, last = stage == l->pp - 1;
    double N = (double)l->micro_batch * (double)m->seq, a = N * (double)m->dim * FP32;
    double tp_per_micro = (double)(m->layers / l->pp) * 4.0 * a + (first ? a : 0) + (last ? a + 3.0 * N * FP32 : 0);
    int llama = m->arch == GPT_ARCH_LLAMA; /* RMSNorm: weights only; no position table */
    if (l->sequence_parallel)
        tp_per_micro = (double)(m->layers / l->pp) * 5.0 * a + (first ? a : 0) + (last ? 1.5 * a + 3.0 * N * FP32 : 0);
    double tp_bytes = (double)l->grad_accum * ring(l->tp) * tp_per_micro;
    if (l->sequence_parallel)
        tp_bytes += ring(l->tp) * (double)((m->layers / l->pp) * (llama ? 2 : 4) * m->dim +
                                           (last ? (llama ? 1 : 2) * m->dim : 0) +
                                           (first && !llama ? m->seq * m->dim : 0)) * FP32;
    double message = l->sequence_parallel ? a / l->tp : a;
    int V = l->virtual_stages; /* at pp 1 (first and last, V 1) nothing */
    double pp_bytes = (double)l->grad_accum * message * ((first ? V - 1 : V) + (last ? V - 1 : V));
    double tie_bytes = l->pp > 1 && (first || last) ? ring(2) * (double)share->embed_piece * FP32 : 0;
    /* ZeRO-3: per micro-batch each unit all-gathered for the forward and
     * again for the backward, its gradients reduce-scattered: (dp - 1) / dp of
     * the parameters three times (the embedding's backward gathers none). */
    double dp_bytes = l->zero == 3 ? (double)l->grad_accum * 1.5 * ring(l->dp) * (double)share->params * FP32
                                   : ring(l->dp) * (double)share->params * FP32;
    return tp_bytes + pp_bytes + tie_bytes + dp_bytes;
}

/* The most any rank of the layout sends. */
static int comm_bytes_per_step(const catalogued_model *cm, const elastic_layout *l, int64_t *out)
{
    *out = 0;
    stage_share *shares = calloc((size_t)l->pp, sizeof *shares);
    if (!shares) return tp_fail(TP_ERR_NOMEM, "out of memory estimating communication for tp %d pp %d", l->tp, l->pp);
    int status = stage_shares(cm, l->tp, l->pp, l->zero, l->dp, shares);
    for (int stage = 0; !status && stage < l->pp; stage++) {
        int64_t bytes = (int64_t)stage_comm_bytes(cm->config, l, stage, &shares[stage]);
        if (bytes > *out) *out = bytes;
    }
    free(shares);
    return status;
}

/* ---------------------------------------------------------------- layouts */

static int64_t largest_divisor_at_most(int64_t n, int64_t limit)
{
    for (int64_t d = limit < n ? limit : n; d > 1; d--)
        if (n % d == 0) return d;
    return 1;
}

static int64_t micro_batch_limit(const elastic_plan_request *r)
{
    return r->micro_batch > 0 ? r->micro_batch : DEFAULT_MICRO_BATCH_LIMIT;
}

static void reject(elastic_layout *l, const char *reason)
{
    l->valid = 0;
    snprintf(l->reason, sizeof l->reason, "%s", reason);
}

/* DP and the global batch of (tp, pp): the largest DP within the world
 * that divides the global batch (dp = 1 always does). With
 * allow_batch_change, when that leaves ranks idle, every rank that fits
 * and the largest batch below the request that they divide instead. */
static void choose_dp(const elastic_plan_request *r, elastic_layout *l)
{
    int64_t most = r->world / (l->tp * l->pp);
    l->dp = (int)largest_divisor_at_most(r->global_batch, most);
    l->global_batch = r->global_batch;
    if (r->allow_batch_change && l->dp < most && r->global_batch >= most) {
        l->dp = (int)most;
        l->global_batch = r->global_batch / most * most;
    }
    l->ranks = l->tp * l->pp * l->dp;
}

/* What a layout saves memory with, as the plan says it. */
static const char *savings_name(int zero, int sequence_parallel)
{
    if (zero == 3) return sequence_parallel ? "ZeRO-3 and sequence parallelism" : "ZeRO-3";
    return zero && sequence_parallel ? "ZeRO-1 and sequence parallelism"
           : zero                    ? "ZeRO-1"
                                     : "sequence parallelism";
}

/* The batch split at l->dp: the largest micro-batch within the limit that
 * divides a DP rank's share and fits the memory per rank when one is given;
 * accumulation makes up the rest of the share. */
static void split_batch(const elastic_plan_request *r, const catalogued_model *cm, elastic_layout *l)
{
    int64_t share = l->global_batch / l->dp;
    for (int64_t m = largest_divisor_at_most(share, micro_batch_limit(r));; m = largest_divisor_at_most(share, m - 1)) {
        l->micro_batch = m;
        l->grad_accum = share / m;
        l->sequence_parallel = 0;
        l->zero = 0;
        l->virtual_stages = 1;
        if (memory_estimate(cm, l->tp, l->pp, 1, m, l->grad_accum, 0, 0, l->dp, &l->memory) != TP_OK) {
            reject(l, tp_errmsg());
            return;
        }
        if (!r->memory_per_rank || l->memory.total <= r->memory_per_rank) return;
        /* Too much. First ZeRO-1 (a dp-th of the moments for no more traffic: a
         * reduce-scatter and an all-gather send what the all-reduce did), then
         * sequence parallelism (1/tp of the norms' and residuals' rows for a
         * quarter more TP traffic), then both; then ZeRO-3 (a dp-th of the
         * parameters and gradients too, for every unit gathered twice and its
         * gradients reduce-scattered per micro-batch: about 1.5 x accumulation
         * times the data-parallel traffic), alone and with sequence
         * parallelism. */
        int splits = can_split_rows(&r->model, l->tp, m);
        const int tries[5][2] = {{1, 0}, {0, 1}, {1, 1}, {3, 0}, {3, 1}}; /* {zero, sequence parallel} */
        elastic_memory tried;
        int64_t least = 0; /* what the last option tried needs: the most it saves */
        const char *least_with = NULL;
        for (int k = 0; k < 5; k++) {
            int zero = tries[k][0], sp = tries[k][1];
            if ((zero && l->dp < 2) || (sp && !splits) ||
                memory_estimate(cm, l->tp, l->pp, 1, m, l->grad_accum, sp, zero, l->dp, &tried) != TP_OK)
                continue;
            least = tried.total;
            least_with = savings_name(zero, sp);
            if (tried.total > r->memory_per_rank) continue;
            l->zero = zero;
            l->sequence_parallel = sp;
            l->without_savings = l->memory.total;
            l->memory = tried;
            return;
        }
        if (m == 1) {
            char need[32], given[32], with[32], also[96] = "";
            l->valid = 0;
            if (least_with)
                snprintf(also, sizeof also, " (%s with %s)", format_bytes((double)least, with, sizeof with), least_with);
            snprintf(l->reason, sizeof l->reason, "needs %s per rank even at micro-batch 1%s, %s given",
                     format_bytes((double)l->memory.total, need, sizeof need), also,
                     format_bytes((double)r->memory_per_rank, given, sizeof given));
            return;
        }
    }
}

/* The interleaved schedule (tp-train --virtual-stages) where the pipeline's
 * bubble, (pp - 1) / m of the compute time for m micro-batches (the
 * stages' idle time against their work), is over
 * PLAN_BUBBLE_TARGET: the fewest virtual stages V that bring (pp - 1) / (V m)
 * under it, or the most the layers allow (layers / pp chunks of one layer),
 * among those that fit the memory per rank. It needs m a multiple of pp; each
 * micro-batch then crosses between the stages V times each way. */
static void choose_virtual_stages(const elastic_plan_request *r, const catalogued_model *cm, elastic_layout *l)
{
    l->bubble = l->pp > 1 ? pipeline_bubble_fraction(l->pp, 1, l->grad_accum) : 0;
    l->bubble_one_chunk = l->bubble;
    if (l->pp < 2 || l->bubble <= PLAN_BUBBLE_TARGET || l->grad_accum % l->pp) return;
    int64_t most = r->model.layers / l->pp;
    for (int V = 2; V <= most; V++) {
        elastic_memory memory;
        if (most % V || pipeline_check(l->pp, V, l->grad_accum) != TP_OK) continue;
        /* More chunks may keep less (more of them in flight, each smaller): a V over the limit is passed over. */
        if (memory_estimate(cm, l->tp, l->pp, V, l->micro_batch, l->grad_accum, l->sequence_parallel,
                            l->zero, l->dp, &memory) != TP_OK ||
            (r->memory_per_rank && memory.total > r->memory_per_rank))
            continue;
        l->virtual_stages = V;
        l->memory = memory;
        l->bubble = pipeline_bubble_fraction(l->pp, V, l->grad_accum);
        if (l->bubble <= PLAN_BUBBLE_TARGET) return;
    }
}

/* TP stays within a node: tp ranks are one node's, and a node holds whole TP groups. */
static int fits_in_node(const elastic_plan_request *r, elastic_layout *l)
{
    if (r->ranks_per_node <= 0) return 1;
    if (l->tp > r->ranks_per_node)
        snprintf(l->reason, sizeof l->reason, "tp %d exceeds %d ranks per node (TP stays within a node)", l->tp,
                 r->ranks_per_node);
    else if (r->ranks_per_node % l->tp != 0)
        snprintf(l->reason, sizeof l->reason, "tp %d does not divide %d ranks per node (TP stays within a node)",
                 l->tp, r->ranks_per_node);
    else return 1;
    l->valid = 0;
    return 0;
}

/* One (tp, pp): valid with its split, memory and communication, or the first rule it breaks. */
static void consider(const elastic_plan_request *r, const catalogued_model *cm, int tp, int pp, elastic_layout *l)
{
    memset(l, 0, sizeof *l);
    l->tp = tp;
    l->pp = pp;
    l->valid = 1;
    if (!fits_in_node(r, l)) return;
    if (gpt_config_check(&r->model, tp, pp) != TP_OK) { /* heads, KV heads, MLP width by tp; layers by pp */
        reject(l, tp_errmsg());
        return;
    }
    choose_dp(r, l);
    split_batch(r, cm, l);
    if (l->valid) choose_virtual_stages(r, cm, l);
    if (l->valid && comm_bytes_per_step(cm, l, &l->comm_bytes_per_step) != TP_OK) reject(l, tp_errmsg());
}

static int is_current(const elastic_plan_request *r, const elastic_layout *l)
{
    return l->tp == r->current_tp && l->pp == r->current_pp;
}

/* The part of a layout's pipeline bubble over PLAN_BUBBLE_TARGET: time
 * every rank idles in each step. Within the target it counts as none. */
static double bubble_over_target(const elastic_layout *l)
{
    return l->bubble > PLAN_BUBBLE_TARGET ? l->bubble - PLAN_BUBBLE_TARGET : 0;
}

/* Whether a is preferred to b (both valid): the most ranks, the global
 * batch nearest the request (the request itself unless allow_batch_change
 * lowered it), the current tp and pp, no ZeRO-3, the least bubble over the
 * target, the least memory, the least communication, the smaller tp. */
static int better(const elastic_plan_request *r, const elastic_layout *a, const elastic_layout *b)
{
    if (a->ranks != b->ranks) return a->ranks > b->ranks;
    if (a->global_batch != b->global_batch) return a->global_batch > b->global_batch; /* both <= the request */
    if (is_current(r, a) != is_current(r, b)) return is_current(r, a);
    /* ZeRO-3 is the last resort: its traffic grows with the accumulation. */
    if ((a->zero == 3) != (b->zero == 3)) return b->zero == 3;
    /* Memory that fits buys no time; a bubble costs it in every step: tp2
     * pp2 with one micro-batch idles each stage half the step (a bubble of
     * 100% of the ideal step) to save tp4 pp1 0.1 MiB per rank. */
    if (bubble_over_target(a) != bubble_over_target(b)) return bubble_over_target(a) < bubble_over_target(b);
    if (a->memory.total != b->memory.total) return a->memory.total < b->memory.total;
    if (a->comm_bytes_per_step != b->comm_bytes_per_step) return a->comm_bytes_per_step < b->comm_bytes_per_step;
    return a->tp < b->tp;
}

/* ------------------------------------------------------------------- why */

/* Appends to plan->why; drops what does not fit. */
static void why_append(elastic_plan *plan, const char *text)
{
    size_t used = strlen(plan->why);
    snprintf(plan->why + used, sizeof plan->why - used, "%s", text);
}

static void explain_none(const elastic_plan_request *r, elastic_plan *plan)
{
    char part[320];
    snprintf(plan->why, sizeof plan->why, "no layout is valid for %d ranks:", r->world);
    for (int i = 0; i < plan->count; i++) {
        snprintf(part, sizeof part, "%s tp%d pp%d: %s", i ? ";" : "", plan->layouts[i].tp, plan->layouts[i].pp,
                 plan->layouts[i].reason);
        if (strlen(plan->why) + strlen(part) + 5 >= sizeof plan->why) {
            why_append(plan, "; ...");
            return;
        }
        why_append(plan, part);
    }
}

/* What became of the current tp and pp when another layout, c, was chosen. */
static void explain_current(const elastic_plan_request *r, const elastic_plan *plan, const elastic_layout *c,
                            char *out, size_t size)
{
    for (int i = 0; i < plan->count; i++) {
        const elastic_layout *l = &plan->layouts[i];
        if (!is_current(r, l)) continue;
        if (!l->valid) snprintf(out, size, "the current tp%d pp%d is not valid (%s)", l->tp, l->pp, l->reason);
        else if (l->ranks < c->ranks)
            snprintf(out, size, "the current tp%d pp%d uses only %d ranks", l->tp, l->pp, l->ranks);
        else snprintf(out, size, "the current tp%d pp%d reaches only global batch %lld", l->tp, l->pp,
                      (long long)l->global_batch);
        return;
    }
    snprintf(out, size, "the current tp%d pp%d does not fit in %d ranks", r->current_tp, r->current_pp, r->world);
}

static void explain_chosen(const elastic_plan_request *r, elastic_plan *plan)
{
    const elastic_layout *c = &plan->layouts[plan->chosen];
    char part[320], bytes[32];
    if (c->ranks == r->world) snprintf(part, sizeof part, "uses all %d ranks", r->world);
    else snprintf(part, sizeof part, "uses %d of %d ranks, %d idle: no valid layout uses more",
                  c->ranks, r->world, r->world - c->ranks);
    why_append(plan, part);
    if (c->global_batch == r->global_batch)
        snprintf(part, sizeof part, "; global batch %lld kept", (long long)c->global_batch);
    else snprintf(part, sizeof part, "; global batch %lld instead of %lld (allowed to change)",
                  (long long)c->global_batch, (long long)r->global_batch);
    why_append(plan, part);
    int rivals = 0; /* valid layouts as good on ranks and batch */
    for (int i = 0; i < plan->count; i++)
        rivals += plan->layouts[i].valid && plan->layouts[i].ranks == c->ranks &&
                  plan->layouts[i].global_batch == c->global_batch;
    if (is_current(r, c)) snprintf(part, sizeof part, "; keeps the current tp%d pp%d", c->tp, c->pp);
    else if (r->current_tp > 0) {
        why_append(plan, "; ");
        explain_current(r, plan, c, part, sizeof part);
    } else part[0] = '\0';
    why_append(plan, part);
    /* The leanest rival passed over for its bubble, and whether any rival needs less. */
    const elastic_layout *leaner = NULL;
    int least = 1;
    for (int i = 0; i < plan->count; i++) {
        const elastic_layout *l = &plan->layouts[i];
        if (!l->valid || l->ranks != c->ranks || l->global_batch != c->global_batch ||
            l->memory.total >= c->memory.total)
            continue;
        least = 0;
        if (bubble_over_target(l) > bubble_over_target(c) && (!leaner || l->memory.total < leaner->memory.total))
            leaner = l;
    }
    format_bytes((double)c->memory.total, bytes, sizeof bytes);
    if (!is_current(r, c) && rivals > 1 && least)
        snprintf(part, sizeof part, "; %s per rank, the least memory of %d layouts as good", bytes, rivals);
    else snprintf(part, sizeof part, "; %s per rank", bytes);
    why_append(plan, part);
    if (!is_current(r, c) && leaner) {
        char less[32];
        snprintf(part, sizeof part,
                 " (tp%d pp%d needs %s but idles in a pipeline bubble of %.1f%% of its compute time)",
                 leaner->tp, leaner->pp, format_bytes((double)leaner->memory.total, less, sizeof less),
                 100 * leaner->bubble);
        why_append(plan, part);
    }
    if (c->sequence_parallel || c->zero) {
        char without[32];
        snprintf(part, sizeof part, " with %s (%s without, over the limit)", savings_name(c->zero, c->sequence_parallel),
                 format_bytes((double)c->without_savings, without, sizeof without));
        why_append(plan, part);
    }
    if (c->virtual_stages > 1) {
        snprintf(part, sizeof part, "; interleaved over %d virtual stages: an ideal bubble of %.1f%% of the compute "
                 "time instead of %.1f%%", c->virtual_stages, 100 * c->bubble, 100 * c->bubble_one_chunk);
        why_append(plan, part);
    } else if (c->pp > 1 && c->bubble > PLAN_BUBBLE_TARGET) {
        snprintf(part, sizeof part, "; an ideal bubble of %.1f%% of the compute time (%s)", 100 * c->bubble,
                 c->grad_accum % c->pp ? "the accumulation is not a multiple of pp: no virtual stages"
                                       : "virtual stages would not fit or the layers allow none");
        why_append(plan, part);
    }
}

/* ------------------------------------------------------------------ plan */

/* The (tp, pp) considered: tp up to the heads, pp up to the layers, tp x pp within the world. */
static int layouts_to_consider(const elastic_plan_request *r)
{
    int count = 0;
    for (int tp = 1; tp <= r->world && tp <= r->model.heads; tp++)
        for (int pp = 1; tp * pp <= r->world && pp <= r->model.layers; pp++) count++;
    return count;
}

int elastic_plan_make(const elastic_plan_request *r, elastic_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    plan->chosen = -1;
    if (r->world < 1) return tp_fail(TP_ERR_ARG, "world %d: there must be at least one rank", r->world);
    if (r->global_batch < 1) return tp_fail(TP_ERR_ARG, "global batch %lld must be at least 1", (long long)r->global_batch);
    if (r->micro_batch < 0 || r->memory_per_rank < 0 || r->ranks_per_node < 0)
        return tp_fail(TP_ERR_ARG, "micro-batch %lld, memory per rank %lld and ranks per node %d must not be negative",
                       (long long)r->micro_batch, (long long)r->memory_per_rank, r->ranks_per_node);
    TP_TRY(gpt_config_check(&r->model, 1, 1));
    catalogued_model cm;
    TP_TRY(catalogued_model_make(&r->model, &cm));
    plan->layouts = calloc((size_t)layouts_to_consider(r), sizeof *plan->layouts);
    if (!plan->layouts) {
        catalogued_model_free(&cm);
        return tp_fail(TP_ERR_NOMEM, "out of memory planning for %d ranks", r->world);
    }
    for (int tp = 1; tp <= r->world && tp <= r->model.heads; tp++)
        for (int pp = 1; tp * pp <= r->world && pp <= r->model.layers; pp++) {
            elastic_layout *l = &plan->layouts[plan->count++];
            consider(r, &cm, tp, pp, l);
            if (l->valid && (plan->chosen < 0 || better(r, l, &plan->layouts[plan->chosen])))
                plan->chosen = plan->count - 1;
        }
    catalogued_model_free(&cm);
    if (plan->chosen < 0) {
        explain_none(r, plan);
        return TP_OK;
    }
    plan->batch_changed = plan->layouts[plan->chosen].global_batch != r->global_batch;
    explain_chosen(r, plan);
    return TP_OK;
}

void elastic_plan_free(elastic_plan *plan)
{
    free(plan->layouts);
    memset(plan, 0, sizeof *plan);
    plan->chosen = -1;
}

/* ------------------------------------------------------------------ JSON */

static cJSON *request_json(const elastic_plan_request *r)
{
    cJSON *o = cJSON_CreateObject();
    char *model_text = gpt_config_to_json(&r->model);
    cJSON *model = model_text ? cJSON_Parse(model_text) : NULL;
    free(model_text);
    if (model) cJSON_AddItemToObject(o, "model", model);
    cJSON_AddNumberToObject(o, "world", r->world);
    cJSON_AddNumberToObject(o, "ranks_per_node", r->ranks_per_node);
    cJSON_AddNumberToObject(o, "global_batch", (double)r->global_batch);
    cJSON_AddNumberToObject(o, "micro_batch_limit", (double)micro_batch_limit(r));
    cJSON_AddNumberToObject(o, "memory_per_rank", (double)r->memory_per_rank);
    cJSON_AddNumberToObject(o, "current_tp", r->current_tp);
    cJSON_AddNumberToObject(o, "current_pp", r->current_pp);
    cJSON_AddBoolToObject(o, "allow_batch_change", r->allow_batch_change);
    return o;
}

static cJSON *layout_json(const elastic_plan_request *r, const elastic_layout *l)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "tp", l->tp);
    cJSON_AddNumberToObject(e, "pp", l->pp);
    cJSON_AddBoolToObject(e, "valid", l->valid);
    if (!l->valid) {
        cJSON_AddStringToObject(e, "reason", l->reason);
        return e;
    }
    cJSON_AddNumberToObject(e, "dp", l->dp);
    cJSON_AddNumberToObject(e, "micro_batch", (double)l->micro_batch);
    cJSON_AddNumberToObject(e, "grad_accum", (double)l->grad_accum);
    cJSON_AddNumberToObject(e, "global_batch", (double)l->global_batch);
    cJSON_AddNumberToObject(e, "ranks", l->ranks);
    cJSON_AddNumberToObject(e, "idle", r->world - l->ranks);
    cJSON *m = cJSON_AddObjectToObject(e, "memory_per_rank");
    cJSON_AddNumberToObject(m, "weights", (double)l->memory.weights);
    cJSON_AddNumberToObject(m, "gradients", (double)l->memory.gradients);
    cJSON_AddNumberToObject(m, "optimizer", (double)l->memory.optimizer);
    cJSON_AddNumberToObject(m, "snapshot", (double)l->memory.snapshot);
    cJSON_AddNumberToObject(m, "activations", (double)l->memory.activations);
    cJSON_AddNumberToObject(m, "total", (double)l->memory.total);
    cJSON_AddNumberToObject(e, "comm_bytes_per_step", (double)l->comm_bytes_per_step);
    cJSON_AddBoolToObject(e, "sequence_parallel", l->sequence_parallel);
    cJSON_AddNumberToObject(e, "zero", l->zero);
    cJSON_AddNumberToObject(e, "virtual_stages", l->virtual_stages);
    cJSON_AddNumberToObject(e, "bubble", l->bubble);
    if (l->sequence_parallel || l->zero)
        cJSON_AddNumberToObject(e, "memory_without_savings", (double)l->without_savings);
    return e;
}

char *elastic_plan_to_json(const elastic_plan_request *r, const elastic_plan *plan)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddItemToObject(o, "request", request_json(r));
    cJSON *list = cJSON_AddArrayToObject(o, "layouts");
    for (int i = 0; i < plan->count; i++) cJSON_AddItemToArray(list, layout_json(r, &plan->layouts[i]));
    cJSON_AddNumberToObject(o, "chosen", plan->chosen);
    cJSON_AddBoolToObject(o, "batch_changed", plan->batch_changed);
    cJSON_AddStringToObject(o, "why", plan->why);
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    return text;
}
