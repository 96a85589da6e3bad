/* embedding.c: vocabulary-parallel embedding and cross-entropy. */
#include <math.h>
#include <string.h>

#include "../convert_bits.h"
#include "../kernels.h"
#include "bf16_products.h"
#include "workers.h"

/* The arguments of an embedding or cross-entropy kernel, for its shares of
 * rows (or, for the table's gradient, of columns) on the pool. */
typedef struct {
    float *out, *sum_out;
    const float *in, *row_max, *sum;
    const uint16_t *in_bits; /* the cross-entropy's logits as bf16 bits, in place of in */
    uint16_t *out_bits;      /* its gradient as bf16 bits, in place of out (may be in_bits: in place) */
    const int *tokens;
    int64_t C, first, rows, valid;
    float scale;
} vocab_job;

/* Logit i of a cross-entropy job: fp32, or the bf16 bits widened (exact). */
static inline float logit_of(const vocab_job *j, int64_t i)
{
    if (!j->in_bits) return j->in[i];
    uint32_t bits = bits_bf16_to_f32(j->in_bits[i]);
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

static void embedding_rows(void *ctx, int64_t n0, int64_t n1)
{
    const vocab_job *j = ctx;
    for (int64_t n = n0; n < n1; n++) {
        int64_t row = (int64_t)j->tokens[n] - j->first;
        if (row >= 0 && row < j->rows) memcpy(j->out + n * j->C, j->in + row * j->C, (size_t)j->C * sizeof(float));
        else memset(j->out + n * j->C, 0, (size_t)j->C * sizeof(float));
    }
}

void embedding_forward(float *out, const int *tokens, const float *table, int64_t N, int64_t C, int64_t first,
                       int64_t rows)
{
    vocab_job job = {.out = out, .in = table, .tokens = tokens, .C = C, .first = first, .rows = rows};
    workers_for(N, C, embedding_rows, &job);
}

/* Columns c0..c1 of the table's gradient, the tokens in order: two tokens
 * may share a row, so threads split the columns, not the tokens. */
static void embedding_backward_columns(void *ctx, int64_t c0, int64_t c1)
{
    const vocab_job *j = ctx;
    for (int64_t n = 0; n < j->valid; n++) {
        int64_t row = (int64_t)j->tokens[n] - j->first;
        if (row < 0 || row >= j->rows) continue;
        for (int64_t c = c0; c < c1; c++) j->out[row * j->C + c] += j->in[n * j->C + c];
    }
}

void embedding_backward(float *d_table, const int *tokens, const float *d_out, int64_t N, int64_t C, int64_t first,
                        int64_t rows)
{
    vocab_job job = {.out = d_table, .in = d_out, .tokens = tokens, .C = C, .first = first, .rows = rows, .valid = N};
    workers_for(C, N, embedding_backward_columns, &job);
}

/* Columns of this rank that are real vocabulary (not padding). */
static int64_t valid_columns(int64_t V, int64_t first, int64_t vocab)
{
    int64_t valid = vocab - first;
    return valid < 0 ? 0 : valid > V ? V : valid;
}

/* For cross-entropy, in is logits[N,V] (C = V), valid its real columns. */

/* A row's maximum and sum of exponentials in one pass over its logits, in
 * chunks of STATS_CHUNK columns (each still in cache when its sum is
 * taken): the chunk's maximum, the chunk's sum relative to it, then the
 * running sum made relative to the larger of the two maxima. */
#define STATS_CHUNK 256

static void row_stats_rows(void *ctx, int64_t n0, int64_t n1)
{
    const vocab_job *j = ctx;
    float widened[STATS_CHUNK]; /* a chunk of bf16 logits widened */
    for (int64_t n = n0; n < n1; n++) {
        float max = -INFINITY, s = 0;
        for (int64_t v0 = 0; v0 < j->valid; v0 += STATS_CHUNK) {
            int64_t width = v0 + STATS_CHUNK < j->valid ? STATS_CHUNK : j->valid - v0;
            const float *x = widened; /* the chunk's logits, x[0..width) */
            if (j->in_bits)
                for (int64_t i = 0; i < width; i++) widened[i] = logit_of(j, n * j->C + v0 + i);
            else
                x = j->in + n * j->C + v0;
            float chunk_max = -INFINITY, chunk_sum = 0;
            for (int64_t i = 0; i < width; i++) chunk_max = x[i] > chunk_max ? x[i] : chunk_max;
            if (chunk_max == -INFINITY) { /* nothing to add (-inf - -inf would be NaN), but a NaN makes the sum NaN */
                for (int64_t i = 0; i < width; i++)
                    if (isnan(x[i])) s = NAN;
                continue;
            }
            for (int64_t i = 0; i < width; i++) chunk_sum += expf(x[i] - chunk_max);
            if (chunk_max > max) {
                s = s * expf(max - chunk_max) + chunk_sum;
                max = chunk_max;
            } else
                s += chunk_sum * expf(chunk_max - max);
        }
        j->out[n] = max;
        j->sum_out[n] = s;
    }
}

void crossentropy_row_stats(float *row_max, float *sum, const float *logits, int64_t N, int64_t V, int64_t first,
                            int64_t vocab)
{
    vocab_job job = {.out = row_max, .sum_out = sum, .in = logits, .C = V, .valid = valid_columns(V, first, vocab)};
    workers_for(N, 8 * V, row_stats_rows, &job); /* an expf costs several elements' work */
}

void crossentropy_row_stats_bf16(float *row_max, float *sum, const uint16_t *logits, int64_t N, int64_t V,
                                 int64_t first, int64_t vocab)
{
    vocab_job job = {.out = row_max, .sum_out = sum, .in_bits = logits, .C = V,
                     .valid = valid_columns(V, first, vocab)};
    workers_for(N, 8 * V, row_stats_rows, &job);
}

void crossentropy_rescale_sum(float *sum, const float *local_max, const float *global_max, int64_t N)
{
    for (int64_t n = 0; n < N; n++)
        if (local_max[n] != -INFINITY) sum[n] *= expf(local_max[n] - global_max[n]);
}

static void target_logit_of(float *target, const vocab_job *j, const int *targets, int64_t N, int64_t V,
                            int64_t first)
{
    for (int64_t n = 0; n < N; n++) {
        int64_t column = (int64_t)targets[n] - first;
        target[n] = column >= 0 && column < V ? logit_of(j, n * V + column) : 0.0f;
    }
}

void crossentropy_target_logit(float *target, const float *logits, const int *targets, int64_t N, int64_t V,
                               int64_t first)
{
    vocab_job job = {.in = logits};
    target_logit_of(target, &job, targets, N, V, first);
}

void crossentropy_target_logit_bf16(float *target, const uint16_t *logits, const int *targets, int64_t N, int64_t V,
                                    int64_t first)
{
    vocab_job job = {.in_bits = logits};
    target_logit_of(target, &job, targets, N, V, first);
}

/* Gradient i of a cross-entropy job: fp32 (out), or its bits rounded to
 * nearest, ties to even (out_bits). */
static inline void store_gradient(const vocab_job *j, int64_t i, float x)
{
    if (!j->out_bits) {
        j->out[i] = x;
        return;
    }
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    j->out_bits[i] = bits_f32_to_bf16(bits);
}

/* Each logit is read before its gradient is stored at its index: out (or
 * out_bits) may be the logits themselves. */
static void crossentropy_backward_rows(void *ctx, int64_t n0, int64_t n1)
{
    const vocab_job *j = ctx;
    int64_t V = j->C;
    for (int64_t n = n0; n < n1; n++) {
        int64_t column = (int64_t)j->tokens[n] - j->first;
        for (int64_t v = 0; v < j->valid; v++) {
            float x = j->scale * expf(logit_of(j, n * V + v) - j->row_max[n]) / j->sum[n];
            store_gradient(j, n * V + v, v == column ? x - j->scale : x);
        }
        for (int64_t v = j->valid; v < V; v++) store_gradient(j, n * V + v, 0.0f);
    }
}

void crossentropy_backward(float *d_logits, const float *logits, const float *row_max, const float *sum,
                           const int *targets, int64_t N, int64_t V, int64_t first, int64_t vocab, float scale)
{
    vocab_job job = {.out = d_logits, .in = logits, .row_max = row_max, .sum = sum, .tokens = targets, .C = V,
                     .first = first, .valid = valid_columns(V, first, vocab), .scale = scale};
    workers_for(N, 8 * V, crossentropy_backward_rows, &job);
}

int classifier_backward_bf16(float *d_in, float *d_weight, uint16_t *logits, const float *row_max, const float *sum,
                             const int *targets, const uint16_t *in, const uint16_t *weight, int64_t N, int64_t C,
                             int64_t V, int64_t first, int64_t vocab, float scale)
{
    vocab_job job = {.out_bits = logits, .in_bits = logits, .row_max = row_max, .sum = sum, .tokens = targets, .C = V,
                     .first = first, .valid = valid_columns(V, first, vocab), .scale = scale};
    workers_for(N, 8 * V, crossentropy_backward_rows, &job);
    return bf16_product_backward(d_in, d_weight, NULL, logits, in, weight, N, C, V);
}
