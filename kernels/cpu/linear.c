/* linear.c: matrix products (OpenBLAS) and elementwise sums, scales and norms. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "../convert_bits.h"
#include "../kernels.h"
#include "bf16_products.h"

void kernels_set_threads(int threads)
{
    openblas_set_num_threads(threads > 0 ? threads : 1);
    bf16_products_set_threads(threads);
}

void matmul_forward(float *out, const float *in, const float *weight, const float *bias, int64_t N, int64_t C,
                    int64_t OC)
{
    /* out[N,OC] = in[N,C] @ weight[OC,C]^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)OC, (int)C, 1.0f, in, (int)C, weight, (int)C,
                0.0f, out, (int)OC);
    if (!bias) return;
    for (int64_t n = 0; n < N; n++) {
        float *row = out + n * OC;
        for (int64_t o = 0; o < OC; o++) row[o] += bias[o];
    }
}

void matmul_backward(float *d_in, float *d_weight, float *d_bias, const float *d_out, const float *in,
                     const float *weight, int64_t N, int64_t C, int64_t OC)
{
    if (d_in) /* d_in[N,C] = d_out[N,OC] @ weight[OC,C] */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)C, (int)OC, 1.0f, d_out, (int)OC, weight,
                    (int)C, 0.0f, d_in, (int)C);
    if (d_weight) /* d_weight[OC,C] += d_out^T[OC,N] @ in[N,C] */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)OC, (int)C, (int)N, 1.0f, d_out, (int)OC, in, (int)C,
                    1.0f, d_weight, (int)C);
    if (d_bias)
        for (int64_t n = 0; n < N; n++)
            for (int64_t o = 0; o < OC; o++) d_bias[o] += d_out[n * OC + o];
}

void residual_forward(float *out, const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void bias_residual_forward(float *out, const float *x, const float *partial, const float *bias, int64_t N, int64_t C)
{
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) out[n * C + c] = x[n * C + c] + (partial[n * C + c] + bias[c]);
}

void add_inplace(float *acc, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) acc[i] += x[i];
}

void scale_inplace(float *x, float scale, int64_t n)
{
    for (int64_t i = 0; i < n; i++) x[i] *= scale;
}

double sum_of_squares(const float *const *spans, const int64_t *lengths, int count)
{
    double sum = 0;
    for (int s = 0; s < count; s++)
        for (int64_t i = 0; i < lengths[s]; i++) sum += (double)spans[s][i] * spans[s][i];
    return sum;
}

/* n values of x rounded to bf16, kept as fp32, in a new buffer (NULL when
 * out of memory); free() releases it. */
static float *rounded_to_bf16(const float *x, int64_t n)
{
    float *out = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; out && i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], sizeof bits);
        bits = bits_bf16_to_f32(bits_f32_to_bf16(bits));
        memcpy(&out[i], &bits, sizeof bits);
    }
    return out;
}

int matmul_forward_bf16(float *out, const float *in, const float *weight, const float *bias, int64_t N, int64_t C,
                        int64_t OC)
{
    if (bf16_products_available()) { /* out[N,OC] = in[N,C] @ weight[OC,C]^T */
        TP_TRY(bf16_product(out, in, weight, N, OC, C, 0, 1, 0));
        if (bias)
            for (int64_t n = 0; n < N; n++)
                for (int64_t o = 0; o < OC; o++) out[n * OC + o] += bias[o];
        return TP_OK;
    }
    float *a = rounded_to_bf16(in, N * C), *w = rounded_to_bf16(weight, OC * C);
    int status = a && w ? TP_OK
                        : tp_fail(TP_ERR_NOMEM, "out of memory rounding a [%lld, %lld] x [%lld, %lld] product to bf16",
                                  (long long)N, (long long)C, (long long)OC, (long long)C);
    if (!status) matmul_forward(out, a, w, bias, N, C, OC);
    free(a);
    free(w);
    return status;
}

int matmul_backward_bf16(float *d_in, float *d_weight, float *d_bias, const float *d_out, const float *in,
                         const float *weight, int64_t N, int64_t C, int64_t OC)
{
    /* d_in = bf16(d_out) @ bf16(weight); d_weight += bf16(d_out)^T @ bf16(in); d_bias from d_out in fp32. */
    if (bf16_products_available()) {
        if (d_in) TP_TRY(bf16_product(d_in, d_out, weight, N, C, OC, 0, 0, 0));         /* [N,OC] @ [OC,C] */
        if (d_weight) TP_TRY(bf16_product(d_weight, d_out, in, OC, C, N, 1, 0, 1));    /* [OC,N] @ [N,C], added */
        if (d_bias) matmul_backward(NULL, NULL, d_bias, d_out, NULL, NULL, N, C, OC);
        return TP_OK;
    }
    float *g = rounded_to_bf16(d_out, N * OC);
    float *w = d_in ? rounded_to_bf16(weight, OC * C) : NULL, *a = d_weight ? rounded_to_bf16(in, N * C) : NULL;
    int status = g && (w || !d_in) && (a || !d_weight)
                     ? TP_OK
                     : tp_fail(TP_ERR_NOMEM, "out of memory rounding a [%lld, %lld] x [%lld, %lld] product to bf16",
                               (long long)N, (long long)OC, (long long)OC, (long long)C);
    if (!status && d_in) matmul_backward(d_in, NULL, NULL, g, NULL, w, N, C, OC);
    if (!status && d_weight) matmul_backward(NULL, d_weight, NULL, g, a, NULL, N, C, OC);
    if (!status && d_bias) matmul_backward(NULL, NULL, d_bias, d_out, NULL, NULL, N, C, OC);
    free(g);
    free(w);
    free(a);
    return status;
}
