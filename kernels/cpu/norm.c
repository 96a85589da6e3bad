/* norm.c: the normalizations and the MLP's activations: layer normalization
 * (eps 1e-5) and GELU (GPT-2), RMSNorm and SwiGLU (Llama). */
#include <math.h>

#include "../fast_exp.h"
#include "../kernels.h"

#define LAYERNORM_EPS 1e-5f

void layernorm_forward(float *out, float *mean, float *rstd, const float *in, const float *weight,
                       const float *bias, int64_t N, int64_t C)
{
    for (int64_t n = 0; n < N; n++) {
        const float *x = in + n * C;
        float m = 0;
        for (int64_t c = 0; c < C; c++) m += x[c];
        m /= (float)C;
        float var = 0;
        for (int64_t c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
        var /= (float)C;
        float s = 1.0f / sqrtf(var + LAYERNORM_EPS);
        float *y = out + n * C;
        for (int64_t c = 0; c < C; c++) y[c] = (x[c] - m) * s * weight[c] + bias[c];
        mean[n] = m;
        rstd[n] = s;
    }
}

void layernorm_backward(float *d_in, float *d_weight, float *d_bias, const float *d_out, const float *in,
                        const float *weight, const float *mean, const float *rstd, int64_t N, int64_t C)
{
    for (int64_t n = 0; n < N; n++) {
        const float *x = in + n * C, *dy = d_out + n * C;
        float m = mean[n], s = rstd[n];
        /* With xhat = (x - m) s: dx = s (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dy w. */
        float mean_dxhat = 0, mean_dxhat_xhat = 0;
        for (int64_t c = 0; c < C; c++) {
            float xhat = (x[c] - m) * s, dxhat = dy[c] * weight[c];
            mean_dxhat += dxhat;
            mean_dxhat_xhat += dxhat * xhat;
        }
        mean_dxhat /= (float)C;
        mean_dxhat_xhat /= (float)C;
        float *dx = d_in + n * C;
        for (int64_t c = 0; c < C; c++) {
            float xhat = (x[c] - m) * s, dxhat = dy[c] * weight[c];
            d_bias[c] += dy[c];
            d_weight[c] += xhat * dy[c];
            dx[c] += (dxhat - mean_dxhat - xhat * mean_dxhat_xhat) * s;
        }
    }
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */

/* GELU (tanh approximation): 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
 * Computed as x * s with s = 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)): one expf
 * instead of tanhf (several times dearer), and no cancellation near u = 0. */
static inline float gelu_gate(float x)
{
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    return 1.0f / (1.0f + fast_expf(-2.0f * u));
}

/* Wider vectors where the processor has them; the arithmetic is the same. */
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

VECTOR_CLONES void gelu_forward(float *out, const float *in, int64_t n)
{
    for (int64_t i = 0; i < n; i++) out[i] = in[i] * gelu_gate(in[i]);
}

/* d/dx [x s] = s + x * 2 s (1 - s) * du/dx, since 1 - tanh^2 = 4 s (1 - s). */
VECTOR_CLONES void gelu_backward(float *d_in, const float *in, const float *d_out, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float x = in[i], s = gelu_gate(x);
        float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        d_in[i] = (s + 2.0f * x * s * (1.0f - s) * du) * d_out[i];
    }
}

/* RMSNorm as Hugging Face's LlamaRMSNorm computes it in fp32:
 * variance = mean(x^2), y = (x * rsqrt(variance + eps)) * weight. */
void rmsnorm_forward(float *out, float *rstd, const float *in, const float *weight, int64_t N, int64_t C, float eps)
{
    for (int64_t n = 0; n < N; n++) {
        const float *x = in + n * C;
        float ms = 0;
        for (int64_t c = 0; c < C; c++) ms += x[c] * x[c];
        ms /= (float)C;
        float s = 1.0f / sqrtf(ms + eps);
        float *y = out + n * C;
        for (int64_t c = 0; c < C; c++) y[c] = x[c] * s * weight[c];
        rstd[n] = s;
    }
}

/* With xhat = x s and s = (mean(x^2) + eps)^(-1/2): ds/dx_i = -s^3 x_i / C, so
 * dx = s (dxhat - xhat mean(dxhat xhat)), dxhat = dy w; d_weight += xhat dy. */
void rmsnorm_backward(float *d_in, float *d_weight, const float *d_out, const float *in, const float *weight,
                      const float *rstd, int64_t N, int64_t C)
{
    for (int64_t n = 0; n < N; n++) {
        const float *x = in + n * C, *dy = d_out + n * C;
        float s = rstd[n];
        float mean_dxhat_xhat = 0;
        for (int64_t c = 0; c < C; c++) mean_dxhat_xhat += dy[c] * weight[c] * (x[c] * s);
        mean_dxhat_xhat /= (float)C;
        float *dx = d_in + n * C;
        for (int64_t c = 0; c < C; c++) {
            float xhat = x[c] * s, dxhat = dy[c] * weight[c];
            d_weight[c] += xhat * dy[c];
            dx[c] += (dxhat - xhat * mean_dxhat_xhat) * s;
        }
    }
}

/* silu(g) = g / (1 + exp(-g)), as PyTorch's silu computes it. fast_expf is
 * within 2 ulp of exp, and 1 / (1 + e) carries at most that relative error
 * (e / (1 + e) < 1 of it), so silu stays within a few ulp (a few 1e-7
 * relative; the test measures it). Below -87 fast_expf's clamp gives
 * silu ~ g * 1.6e-38 where PyTorch gives -0: far below any tolerance. */
static inline float sigmoid(float g)
{
    return 1.0f / (1.0f + fast_expf(-g));
}

/* in[N,2F] = [gate | up] per row; out[N,F] = silu(gate) * up. */
VECTOR_CLONES void swiglu_forward(float *out, const float *in, int64_t N, int64_t F)
{
    for (int64_t n = 0; n < N; n++) {
        const float *gate = in + n * 2 * F, *up = gate + F;
        float *y = out + n * F;
        for (int64_t f = 0; f < F; f++) y[f] = gate[f] / (1.0f + fast_expf(-gate[f])) * up[f];
    }
}

/* d up = dy silu(g); d gate = dy up silu'(g), silu'(g) = s (1 + g (1 - s)),
 * s = sigmoid(g). Overwrites d_in[N,2F]. */
VECTOR_CLONES void swiglu_backward(float *d_in, const float *in, const float *d_out, int64_t N, int64_t F)
{
    for (int64_t n = 0; n < N; n++) {
        const float *gate = in + n * 2 * F, *up = gate + F, *dy = d_out + n * F;
        float *d_gate = d_in + n * 2 * F, *d_up = d_gate + F;
        for (int64_t f = 0; f < F; f++) {
            float g = gate[f], s = sigmoid(g);
            d_up[f] = dy[f] * (g * s);
            d_gate[f] = dy[f] * up[f] * (s * (1.0f + g * (1.0f - s)));
        }
    }
}
