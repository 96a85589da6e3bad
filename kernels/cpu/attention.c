/* attention.c: causal multi-head attention over locally held heads, with
 * grouped key/value heads. Per (batch, head) the products are three sgemm
 * calls over strided views of qkv; the scores are computed in full and
 * masked (the upper triangle is wasted work, kept for simplicity). */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "../kernels.h"

void attention_forward(float *out, float *att, const float *qkv, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                       int64_t hd)
{
    int64_t stride = (Hq + 2 * Hkv) * hd, out_stride = Hq * hd, group = Hq / Hkv;
    float scale = 1.0f / sqrtf((float)hd);
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < Hq; h++) {
            const float *q = qkv + b * T * stride + h * hd;
            const float *k = qkv + b * T * stride + (Hq + h / group) * hd;
            const float *v = qkv + b * T * stride + (Hq + Hkv + h / group) * hd;
            float *a = att + (b * Hq + h) * T * T; /* [T, T] */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)T, (int)hd, scale, q, (int)stride, k,
                        (int)stride, 0.0f, a, (int)T);
            for (int64_t i = 0; i < T; i++) {
                float *row = a + i * T, max = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= i; j++) max = row[j] > max ? row[j] : max;
                for (int64_t j = 0; j <= i; j++) {
                    row[j] = expf(row[j] - max);
                    sum += row[j];
                }
                for (int64_t j = 0; j <= i; j++) row[j] /= sum;
                for (int64_t j = i + 1; j < T; j++) row[j] = 0;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)hd, (int)T, 1.0f, a, (int)T, v,
                        (int)stride, 0.0f, out + b * T * out_stride + h * hd, (int)out_stride);
        }
    }
}

void attention_backward(float *d_qkv, float *scratch, const float *d_out, const float *qkv, const float *att,
                        int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd)
{
    int64_t stride = (Hq + 2 * Hkv) * hd, out_stride = Hq * hd, group = Hq / Hkv;
    float scale = 1.0f / sqrtf((float)hd);
    memset(d_qkv, 0, (size_t)(B * T * stride) * sizeof(float));
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < Hq; h++) {
            const float *q = qkv + b * T * stride + h * hd;
            const float *k = qkv + b * T * stride + (Hq + h / group) * hd;
            const float *v = qkv + b * T * stride + (Hq + Hkv + h / group) * hd;
            float *dq = d_qkv + b * T * stride + h * hd;
            float *dk = d_qkv + b * T * stride + (Hq + h / group) * hd;
            float *dv = d_qkv + b * T * stride + (Hq + Hkv + h / group) * hd;
            const float *a = att + (b * Hq + h) * T * T, *dout = d_out + b * T * out_stride + h * hd;
            float *da = scratch; /* [T, T] */
            /* d_att = d_out @ V^T; dV += att^T @ d_out */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)T, (int)hd, 1.0f, dout, (int)out_stride,
                        v, (int)stride, 0.0f, da, (int)T);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)T, (int)hd, (int)T, 1.0f, a, (int)T, dout,
                        (int)out_stride, 1.0f, dv, (int)stride);
            /* softmax backward, then the 1/sqrt(hd) of the scores */
            for (int64_t i = 0; i < T; i++) {
                const float *p = a + i * T;
                float *dp = da + i * T, dot = 0;
                for (int64_t j = 0; j <= i; j++) dot += p[j] * dp[j];
                for (int64_t j = 0; j <= i; j++) dp[j] = p[j] * (dp[j] - dot) * scale;
                for (int64_t j = i + 1; j < T; j++) dp[j] = 0;
            }
            /* dQ += d_scores @ K; dK += d_scores^T @ Q */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)hd, (int)T, 1.0f, da, (int)T, k,
                        (int)stride, 1.0f, dq, (int)stride);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)T, (int)hd, (int)T, 1.0f, da, (int)T, q,
                        (int)stride, 1.0f, dk, (int)stride);
        }
    }
}
