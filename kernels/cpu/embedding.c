/* embedding.c: vocabulary-parallel embedding and cross-entropy. */
#include <math.h>
#include <string.h>

#include "../kernels.h"

void embedding_forward(float *out, const int *tokens, const float *table, int64_t N, int64_t C, int64_t first,
                       int64_t rows)
{
    for (int64_t n = 0; n < N; n++) {
        int64_t row = (int64_t)tokens[n] - first;
        if (row >= 0 && row < rows) memcpy(out + n * C, table + row * C, (size_t)C * sizeof(float));
        else memset(out + n * C, 0, (size_t)C * sizeof(float));
    }
}

void embedding_backward(float *d_table, const int *tokens, const float *d_out, int64_t N, int64_t C, int64_t first,
                        int64_t rows)
{
    for (int64_t n = 0; n < N; n++) {
        int64_t row = (int64_t)tokens[n] - first;
        if (row < 0 || row >= rows) continue;
        for (int64_t c = 0; c < C; c++) d_table[row * C + c] += d_out[n * C + c];
    }
}

/* Columns of this rank that are real vocabulary (not padding). */
static int64_t valid_columns(int64_t V, int64_t first, int64_t vocab)
{
    int64_t valid = vocab - first;
    return valid < 0 ? 0 : valid > V ? V : valid;
}

void crossentropy_row_max(float *row_max, const float *logits, int64_t N, int64_t V, int64_t first, int64_t vocab)
{
    int64_t valid = valid_columns(V, first, vocab);
    for (int64_t n = 0; n < N; n++) {
        float max = -INFINITY;
        for (int64_t v = 0; v < valid; v++) max = logits[n * V + v] > max ? logits[n * V + v] : max;
        row_max[n] = max;
    }
}

void crossentropy_row_sumexp(float *sum, const float *logits, const float *row_max, int64_t N, int64_t V,
                             int64_t first, int64_t vocab)
{
    int64_t valid = valid_columns(V, first, vocab);
    for (int64_t n = 0; n < N; n++) {
        float s = 0;
        for (int64_t v = 0; v < valid; v++) s += expf(logits[n * V + v] - row_max[n]);
        sum[n] = s;
    }
}

void crossentropy_target_logit(float *target, const float *logits, const int *targets, int64_t N, int64_t V,
                               int64_t first)
{
    for (int64_t n = 0; n < N; n++) {
        int64_t column = (int64_t)targets[n] - first;
        target[n] = column >= 0 && column < V ? logits[n * V + column] : 0.0f;
    }
}

void crossentropy_backward(float *d_logits, const float *logits, const float *row_max, const float *sum,
                           const int *targets, int64_t N, int64_t V, int64_t first, int64_t vocab, float scale)
{
    int64_t valid = valid_columns(V, first, vocab);
    for (int64_t n = 0; n < N; n++) {
        float *d = d_logits + n * V;
        for (int64_t v = 0; v < valid; v++) d[v] = scale * expf(logits[n * V + v] - row_max[n]) / sum[n];
        for (int64_t v = valid; v < V; v++) d[v] = 0;
        int64_t column = (int64_t)targets[n] - first;
        if (column >= 0 && column < valid) d[column] -= scale;
    }
}
