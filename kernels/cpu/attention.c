/* attention.c: causal multi-head attention over locally held heads, with
 * grouped key/value heads, memory-efficient: the [T, T] probabilities are
 * never kept. The forward keeps each query row's log-sum-exp of its scores
 * (lse[B,Hq,T]); the backward recomputes the probabilities of a block of
 * query rows from it, P = exp(S - lse), as FlashAttention does.
 *
 * Per (batch, head) and block of at most ATTENTION_ROWS query rows [i0, i1),
 * the products are sgemm calls over strided views of qkv, limited to the
 * keys [0, i1) the block can see (the causal mask's upper triangle beyond
 * the block is skipped, within the block it is zeroed). */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "../../common/memory.h"
#include "../fast_exp.h"
#include "../kernels.h"
#include "bf16_outputs.h"
#include "bf16_products.h"
#include "vector_clones.h"
#include "workers.h"

int64_t attention_scratch_floats(int64_t B, int64_t T, int64_t Hq)
{
    return B * Hq * T;
}

/* A task's [rows, keys] blocks: the probabilities and, in the backward,
 * d_att then d_scores. Each thread keeps its own (scratch_buffer). */
static float *attention_blocks(int64_t T, int count)
{
    int64_t rows = T < ATTENTION_ROWS ? T : ATTENTION_ROWS;
    return scratch_buffer(SCRATCH_ATTENTION, (size_t)(count * rows * T > 0 ? count * rows * T : 1) * sizeof(float));
}

static int no_blocks(int64_t T)
{
    return tp_fail(TP_ERR_NOMEM, "out of memory for the attention's blocks of %d x %lld floats", ATTENTION_ROWS,
                   (long long)T);
}

/* Views of one (batch, head) in qkv[B,T,(Hq+2Hkv)*hd] and out[B,T,Hq*hd]:
 * row t of q, k, v at + t stride, of o at + t out_stride. */
typedef struct {
    const float *q, *k, *v;
    int64_t stride, out_stride;
} head_view;

static head_view head_of(const float *qkv, int64_t b, int64_t h, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd)
{
    int64_t stride = (Hq + 2 * Hkv) * hd, kv = h / (Hq / Hkv);
    const float *base = qkv + b * T * stride;
    return (head_view){base + h * hd, base + (Hq + kv) * hd, base + (Hq + Hkv + kv) * hd, stride, Hq * hd};
}

/* s[rows, keys] (row stride keys) = scale * q[i0 .. i0 + rows) k[0 .. keys)^T */
static void block_scores(float *s, const head_view *x, int64_t i0, int64_t rows, int64_t keys, int64_t hd, float scale)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)keys, (int)hd, scale, x->q + i0 * x->stride,
                (int)x->stride, x->k, (int)x->stride, 0.0f, s, (int)keys);
}

/* The arguments of either direction. Task t is batch t / Hkv and key/value
 * head t % Hkv with the query heads that share it: the tasks write disjoint
 * parts of out, lse and d_qkv (a shared key/value head's gradient gathers
 * its query heads' in one task). */
typedef struct {
    float *out, *lse, *d_qkv, *delta;
    const float *qkv, *d_out, *fwd_out, *fwd_lse;
    int64_t B, T, Hq, Hkv, hd;
} attention_job;

static VECTOR_CLONES int forward_group(void *ctx, int64_t task)
{
    const attention_job *j = ctx;
    int64_t T = j->T, hd = j->hd, b = task / j->Hkv, group = j->Hq / j->Hkv, h0 = task % j->Hkv * group;
    float scale = 1.0f / sqrtf((float)hd);
    float *p = attention_blocks(T, 1); /* [rows, keys] of one block */
    if (!p) return no_blocks(T);
    for (int64_t h = h0; h < h0 + group; h++) {
        head_view x = head_of(j->qkv, b, h, T, j->Hq, j->Hkv, hd);
        float *row_lse = j->lse + (b * j->Hq + h) * T, *o = j->out + b * T * x.out_stride + h * hd;
        for (int64_t i0 = 0; i0 < T; i0 += ATTENTION_ROWS) {
            int64_t rows = T - i0 < ATTENTION_ROWS ? T - i0 : ATTENTION_ROWS, keys = i0 + rows;
            block_scores(p, &x, i0, rows, keys, hd, scale);
            for (int64_t r = 0; r < rows; r++) {
                float *row = p + r * keys, max = -INFINITY, sum = 0;
                int64_t i = i0 + r;
                for (int64_t k = 0; k <= i; k++) max = row[k] > max ? row[k] : max;
                for (int64_t k = 0; k <= i; k++) row[k] = fast_expf(row[k] - max); /* vectorizes */
                for (int64_t k = 0; k <= i; k++) sum += row[k];
                for (int64_t k = 0; k <= i; k++) row[k] /= sum;
                for (int64_t k = i + 1; k < keys; k++) row[k] = 0;
                row_lse[i] = max + logf(sum);
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)hd, (int)keys, 1.0f, p, (int)keys,
                        x.v, (int)x.stride, 0.0f, o + i0 * x.out_stride, (int)x.out_stride);
        }
    }
    return TP_OK;
}

/* Query heads grouped over key/value heads (group = Hq / Hkv) need Hq a
 * multiple of Hkv > 0: another shape would read the wrong heads. */
static int shape_ok(const char *what, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd)
{
    if (B < 0 || T < 0 || Hq < 0 || hd <= 0 || Hkv <= 0 || Hq % Hkv != 0)
        return tp_fail(TP_ERR_ARG, "%s: B=%lld T=%lld Hq=%lld Hkv=%lld hd=%lld (want hd > 0 and Hq a multiple of Hkv > 0)",
                       what, (long long)B, (long long)T, (long long)Hq, (long long)Hkv, (long long)hd);
    return TP_OK;
}

int attention_forward(float *out, float *lse, float *scratch, const float *qkv, int64_t B, int64_t T, int64_t Hq,
                      int64_t Hkv, int64_t hd)
{
    TP_TRY(shape_ok("attention_forward", B, T, Hq, Hkv, hd));
    (void)scratch; /* the forward needs none besides its blocks */
    attention_job job = {.out = out, .lse = lse, .qkv = qkv, .B = B, .T = T, .Hq = Hq, .Hkv = Hkv, .hd = hd};
    return workers_run(B * Hkv, forward_group, &job);
}

static VECTOR_CLONES int backward_group(void *ctx, int64_t task)
{
    const attention_job *j = ctx;
    int64_t T = j->T, hd = j->hd, b = task / j->Hkv, group = j->Hq / j->Hkv, h0 = task % j->Hkv * group;
    float scale = 1.0f / sqrtf((float)hd);
    float *p = attention_blocks(T, 2); /* [rows, keys]: probabilities of a block */
    if (!p) return no_blocks(T);
    float *ds = p + (T < ATTENTION_ROWS ? T : ATTENTION_ROWS) * T; /* [rows, keys]: d_att, then d_scores */
    for (int64_t h = h0; h < h0 + group; h++) {
        head_view x = head_of(j->qkv, b, h, T, j->Hq, j->Hkv, hd), dx = head_of(j->d_qkv, b, h, T, j->Hq, j->Hkv, hd);
        float *dq = (float *)dx.q, *dk = (float *)dx.k, *dv = (float *)dx.v;
        const float *g = j->d_out + b * T * x.out_stride + h * hd, *o = j->fwd_out + b * T * x.out_stride + h * hd;
        const float *row_lse = j->fwd_lse + (b * j->Hq + h) * T;
        float *row_delta = j->delta + (b * j->Hq + h) * T; /* d_out_i . out_i = sum_j p_ij d_att_ij */
        for (int64_t i = 0; i < T; i++) {
            float dot = 0;
            for (int64_t d = 0; d < hd; d++) dot += g[i * x.out_stride + d] * o[i * x.out_stride + d];
            row_delta[i] = dot;
        }
        for (int64_t i0 = 0; i0 < T; i0 += ATTENTION_ROWS) {
            int64_t rows = T - i0 < ATTENTION_ROWS ? T - i0 : ATTENTION_ROWS, keys = i0 + rows;
            const float *g0 = g + i0 * x.out_stride;
            block_scores(p, &x, i0, rows, keys, hd, scale);
            /* d_att = d_out V^T */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)keys, (int)hd, 1.0f, g0,
                        (int)x.out_stride, x.v, (int)x.stride, 0.0f, ds, (int)keys);
            /* softmax backward, then the 1/sqrt(hd) of the scores */
            for (int64_t r = 0; r < rows; r++) {
                int64_t i = i0 + r;
                float *pr = p + r * keys, *dr = ds + r * keys;
                for (int64_t k = 0; k <= i; k++) {
                    pr[k] = fast_expf(pr[k] - row_lse[i]);
                    dr[k] = pr[k] * (dr[k] - row_delta[i]) * scale;
                }
                for (int64_t k = i + 1; k < keys; k++) pr[k] = dr[k] = 0;
            }
            /* dV += P^T d_out; dQ += d_scores K; dK += d_scores^T Q */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)keys, (int)hd, (int)rows, 1.0f, p, (int)keys, g0,
                        (int)x.out_stride, 1.0f, dv, (int)x.stride);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)hd, (int)keys, 1.0f, ds, (int)keys,
                        x.k, (int)x.stride, 1.0f, dq + i0 * x.stride, (int)x.stride);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)keys, (int)hd, (int)rows, 1.0f, ds, (int)keys,
                        x.q + i0 * x.stride, (int)x.stride, 1.0f, dk, (int)x.stride);
        }
    }
    return TP_OK;
}

int attention_backward(float *d_qkv, float *scratch, const float *d_out, const float *qkv, const float *out,
                       const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd)
{
    TP_TRY(shape_ok("attention_backward", B, T, Hq, Hkv, hd));
    memset(d_qkv, 0, (size_t)(B * T * (Hq + 2 * Hkv) * hd) * sizeof(float));
    attention_job job = {.d_qkv = d_qkv, .delta = scratch, .qkv = qkv, .d_out = d_out, .fwd_out = out,
                         .fwd_lse = lse, .B = B, .T = T, .Hq = Hq, .Hkv = Hkv, .hd = hd};
    return workers_run(B * Hkv, backward_group, &job);
}

/* ======================================================== bf16 attention
 * The operands cuDNN's flash attention reads in bf16 (qkv, out and d_out:
 * bf16 activations and gradients, their bits as they are) widened, then the
 * fp32 attention above, its out and d_qkv rounded as cuDNN writes them:
 * its twin on a GPU (kernels/cuda/attention.cu) gives cuDNN the same bf16
 * values, so that the two differ by the order of the fp32 sums and by
 * cuDNN's own bf16 roundings (the probabilities it multiplies by V and
 * d_out), not by what they read. */

static int no_rounded_copy(const char *what, int64_t B, int64_t T, int64_t width)
{
    return tp_fail(TP_ERR_NOMEM, "out of memory rounding the attention's %s [%lld, %lld, %lld] to bf16", what,
                   (long long)B, (long long)T, (long long)width);
}

int attention_forward_bf16(uint16_t *out, float *lse, float *scratch, const uint16_t *qkv, int64_t B, int64_t T,
                           int64_t Hq, int64_t Hkv, int64_t hd)
{
    TP_TRY(shape_ok("attention_forward_bf16", B, T, Hq, Hkv, hd));
    int64_t width = (Hq + 2 * Hkv) * hd;
    float *y;
    TP_TRY(bf16_output_scratch(&y, B * T * Hq * hd, "attention"));
    float *rounded = bf16_operand_as_f32(bf16_of_bits(qkv), B * T * width);
    if (!rounded) return no_rounded_copy("qkv", B, T, width);
    int status = attention_forward(y, lse, scratch, rounded, B, T, Hq, Hkv, hd);
    free(rounded);
    if (!status) round_to_bf16(out, y, B * T * Hq * hd);
    return status;
}

int attention_backward_bf16(uint16_t *d_qkv, float *scratch, const uint16_t *d_out, const uint16_t *qkv,
                            const uint16_t *out, const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                            int64_t hd)
{
    TP_TRY(shape_ok("attention_backward_bf16", B, T, Hq, Hkv, hd));
    int64_t width = (Hq + 2 * Hkv) * hd;
    float *d_qkv32; /* the fp32 gradient, then rounded once, as cuDNN writes its bf16 dQ, dK, dV */
    TP_TRY(bf16_output_scratch(&d_qkv32, B * T * width, "attention's gradient"));
    float *q = bf16_operand_as_f32(bf16_of_bits(qkv), B * T * width);
    float *o = bf16_operand_as_f32(bf16_of_bits(out), B * T * Hq * hd);
    float *g = bf16_operand_as_f32(bf16_of_bits(d_out), B * T * Hq * hd);
    int status = !q ? no_rounded_copy("qkv", B, T, width)
                 : !o ? no_rounded_copy("out", B, T, Hq * hd)
                 : !g ? no_rounded_copy("d_out", B, T, Hq * hd)
                      : attention_backward(d_qkv32, scratch, g, q, o, lse, B, T, Hq, Hkv, hd);
    free(q);
    free(o);
    free(g);
    if (!status) round_to_bf16(d_qkv, d_qkv32, B * T * width);
    return status;
}
