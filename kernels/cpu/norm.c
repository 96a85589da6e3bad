/* norm.c: the normalizations and the MLP's activations: layer normalization
 * (eps 1e-5) and GELU (GPT-2), RMSNorm and SwiGLU (Llama); their forwards'
 * bf16 twins, which write bf16 activations, and the activations' backwards
 * with bf16 gradients. */
#include <math.h>

#include "../../common/error.h"
#include "../fast_exp.h"
#include "../kernels.h"
#include "bf16_outputs.h"
#include "vector_clones.h"
#include "workers.h"

#define LAYERNORM_EPS 1e-5f

/* The arguments of a normalization or activation, for its shares of rows
 * (or, for parameter gradients, of columns) on the pool. */
typedef struct {
    float *out, *mean, *rstd, *d_weight, *d_bias;
    uint16_t *out_bits; /* the backward's d_in_bits (NULL: none) */
    const float *in, *d_out, *weight, *bias, *mean_in, *rstd_in;
    int64_t C, rows;
    float eps;
} norm_job;

static VECTOR_CLONES void layernorm_rows(void *ctx, int64_t n0, int64_t n1)
{
    const norm_job *j = ctx;
    int64_t C = j->C;
    for (int64_t n = n0; n < n1; n++) {
        const float *x = j->in + n * C;
        float m = 0;
        for (int64_t c = 0; c < C; c++) m += x[c];
        m /= (float)C;
        float var = 0;
        for (int64_t c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
        var /= (float)C;
        float s = 1.0f / sqrtf(var + LAYERNORM_EPS);
        float *y = j->out + n * C;
        for (int64_t c = 0; c < C; c++) y[c] = (x[c] - m) * s * j->weight[c] + j->bias[c];
        j->mean[n] = m;
        j->rstd[n] = s;
    }
}

void layernorm_forward(float *out, float *mean, float *rstd, const float *in, const float *weight,
                       const float *bias, int64_t N, int64_t C)
{
    norm_job job = {.out = out, .mean = mean, .rstd = rstd, .in = in, .weight = weight, .bias = bias, .C = C};
    workers_for(N, 2 * C, layernorm_rows, &job);
}

/* d_in of rows n0..n1 (added). With xhat = (x - m) s:
 * dx = s (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dy w.
 * Without mean_in (RMSNorm: m = 0, no mean(dxhat) term; rmsnorm_backward's
 * comment) the same loop gives dx = s (dxhat - xhat mean(dxhat xhat)):
 * x - 0 is x and dxhat - 0 is dxhat exactly. */
static VECTOR_CLONES void norm_backward_rows(void *ctx, int64_t n0, int64_t n1)
{
    const norm_job *j = ctx;
    int64_t C = j->C;
    for (int64_t n = n0; n < n1; n++) {
        const float *x = j->in + n * C, *dy = j->d_out + n * C;
        float m = j->mean_in ? j->mean_in[n] : 0.0f, s = j->rstd_in[n];
        float mean_dxhat = 0, mean_dxhat_xhat = 0;
        for (int64_t c = 0; c < C; c++) {
            float xhat = (x[c] - m) * s, dxhat = dy[c] * j->weight[c];
            mean_dxhat += dxhat;
            mean_dxhat_xhat += dxhat * xhat;
        }
        mean_dxhat = j->mean_in ? mean_dxhat / (float)C : 0.0f;
        mean_dxhat_xhat /= (float)C;
        float *dx = j->out + n * C;
        for (int64_t c = 0; c < C; c++) {
            float xhat = (x[c] - m) * s, dxhat = dy[c] * j->weight[c];
            dx[c] += (dxhat - mean_dxhat - xhat * mean_dxhat_xhat) * s;
        }
        if (j->out_bits) convert_from_f32(dx, j->out_bits + n * C, TP_BF16, C); /* round_to_bf16's rounding */
    }
}

/* d_weight (and d_bias) of columns c0..c1 (added), summed over the rows in
 * order: the same sums at any number of threads. Without mean_in (RMSNorm)
 * xhat = x s. */
static VECTOR_CLONES void layernorm_backward_columns(void *ctx, int64_t c0, int64_t c1)
{
    const norm_job *j = ctx;
    for (int64_t n = 0; n < j->rows; n++) {
        const float *x = j->in + n * j->C, *dy = j->d_out + n * j->C;
        float m = j->mean_in ? j->mean_in[n] : 0.0f, s = j->rstd_in[n]; /* x - 0 is x exactly */
        if (j->d_bias)
            for (int64_t c = c0; c < c1; c++) j->d_bias[c] += dy[c];
        for (int64_t c = c0; c < c1; c++) j->d_weight[c] += ((x[c] - m) * s) * dy[c];
    }
}

void layernorm_backward(float *d_in, uint16_t *d_in_bits, float *d_weight, float *d_bias, const float *d_out,
                        const float *in, const float *weight, const float *mean, const float *rstd, int64_t N,
                        int64_t C)
{
    norm_job job = {.out = d_in, .out_bits = d_in_bits, .d_weight = d_weight, .d_bias = d_bias, .in = in, .d_out = d_out,
                    .weight = weight, .mean_in = mean, .rstd_in = rstd, .C = C, .rows = N};
    workers_for(N, 3 * C, norm_backward_rows, &job);
    workers_for(C, N, layernorm_backward_columns, &job);
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

static VECTOR_CLONES void gelu_forward_span(void *ctx, int64_t i0, int64_t i1)
{
    const norm_job *j = ctx;
    for (int64_t i = i0; i < i1; i++) j->out[i] = j->in[i] * gelu_gate(j->in[i]);
}

void gelu_forward(float *out, const float *in, int64_t n)
{
    norm_job job = {.out = out, .in = in};
    workers_for(n, 4, gelu_forward_span, &job); /* an exp and a division per element */
}

/* d/dx [x s] = s + x * 2 s (1 - s) * du/dx, since 1 - tanh^2 = 4 s (1 - s). */
static VECTOR_CLONES void gelu_backward_span(void *ctx, int64_t i0, int64_t i1)
{
    const norm_job *j = ctx;
    for (int64_t i = i0; i < i1; i++) {
        float x = j->in[i], s = gelu_gate(x);
        float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        j->out[i] = (s + 2.0f * x * s * (1.0f - s) * du) * j->d_out[i];
    }
}

void gelu_backward(float *d_in, const float *in, const float *d_out, int64_t n)
{
    norm_job job = {.out = d_in, .in = in, .d_out = d_out};
    workers_for(n, 4, gelu_backward_span, &job);
}

/* RMSNorm as Hugging Face's LlamaRMSNorm computes it in fp32:
 * variance = mean(x^2), y = (x * rsqrt(variance + eps)) * weight. */
static VECTOR_CLONES void rmsnorm_rows(void *ctx, int64_t n0, int64_t n1)
{
    const norm_job *j = ctx;
    int64_t C = j->C;
    for (int64_t n = n0; n < n1; n++) {
        const float *x = j->in + n * C;
        float ms = 0;
        for (int64_t c = 0; c < C; c++) ms += x[c] * x[c];
        ms /= (float)C;
        float s = 1.0f / sqrtf(ms + j->eps);
        float *y = j->out + n * C;
        for (int64_t c = 0; c < C; c++) y[c] = x[c] * s * j->weight[c];
        j->rstd[n] = s;
    }
}

void rmsnorm_forward(float *out, float *rstd, const float *in, const float *weight, int64_t N, int64_t C, float eps)
{
    norm_job job = {.out = out, .rstd = rstd, .in = in, .weight = weight, .C = C, .eps = eps};
    workers_for(N, 2 * C, rmsnorm_rows, &job);
}

/* With xhat = x s and s = (mean(x^2) + eps)^(-1/2): ds/dx_i = -s^3 x_i / C, so
 * dx = s (dxhat - xhat mean(dxhat xhat)), dxhat = dy w (norm_backward_rows
 * without a mean); d_weight += xhat dy (layernorm_backward_columns). */
void rmsnorm_backward(float *d_in, uint16_t *d_in_bits, float *d_weight, const float *d_out, const float *in,
                      const float *weight, const float *rstd, int64_t N, int64_t C)
{
    norm_job job = {.out = d_in, .out_bits = d_in_bits, .d_weight = d_weight, .in = in, .d_out = d_out, .weight = weight,
                    .rstd_in = rstd, .C = C, .rows = N};
    workers_for(N, 3 * C, norm_backward_rows, &job);
    workers_for(C, N, layernorm_backward_columns, &job);
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
static VECTOR_CLONES void swiglu_forward_rows(void *ctx, int64_t n0, int64_t n1)
{
    const norm_job *j = ctx;
    int64_t F = j->C;
    for (int64_t n = n0; n < n1; n++) {
        const float *gate = j->in + n * 2 * F, *up = gate + F;
        float *y = j->out + n * F;
        for (int64_t f = 0; f < F; f++) y[f] = gate[f] / (1.0f + fast_expf(-gate[f])) * up[f];
    }
}

void swiglu_forward(float *out, const float *in, int64_t N, int64_t F)
{
    norm_job job = {.out = out, .in = in, .C = F};
    workers_for(N, 4 * F, swiglu_forward_rows, &job);
}

/* d up = dy silu(g); d gate = dy up silu'(g), silu'(g) = s (1 + g (1 - s)),
 * s = sigmoid(g). Overwrites d_in[N,2F]. */
static VECTOR_CLONES void swiglu_backward_rows(void *ctx, int64_t n0, int64_t n1)
{
    const norm_job *j = ctx;
    int64_t F = j->C;
    for (int64_t n = n0; n < n1; n++) {
        const float *gate = j->in + n * 2 * F, *up = gate + F, *dy = j->d_out + n * F;
        float *d_gate = j->out + n * 2 * F, *d_up = d_gate + F;
        for (int64_t f = 0; f < F; f++) {
            float g = gate[f], s = sigmoid(g);
            d_up[f] = dy[f] * (g * s);
            d_gate[f] = dy[f] * up[f] * (s * (1.0f + g * (1.0f - s)));
        }
    }
}

void swiglu_backward(float *d_in, const float *in, const float *d_out, int64_t N, int64_t F)
{
    norm_job job = {.out = d_in, .in = in, .d_out = d_out, .C = F};
    workers_for(N, 4 * F, swiglu_backward_rows, &job);
}

/* ========================================================= bf16 activations
 * The fp32 operations above into the thread's scratch, then rounded: the
 * bits of rounding their output by construction (kernels.h). */

int layernorm_forward_bf16(uint16_t *out, float *mean, float *rstd, const float *in, const float *weight,
                           const float *bias, int64_t N, int64_t C)
{
    float *y;
    TP_TRY(bf16_output_scratch(&y, N * C, "layer norm"));
    layernorm_forward(y, mean, rstd, in, weight, bias, N, C);
    round_to_bf16(out, y, N * C);
    return TP_OK;
}

int rmsnorm_forward_bf16(uint16_t *out, float *rstd, const float *in, const float *weight, int64_t N, int64_t C,
                         float eps)
{
    float *y;
    TP_TRY(bf16_output_scratch(&y, N * C, "RMSNorm"));
    rmsnorm_forward(y, rstd, in, weight, N, C, eps);
    round_to_bf16(out, y, N * C);
    return TP_OK;
}

/* The residual add before a norm (kernels.h residual_layernorm_forward):
 * linear.c's own operations, so that sum's bits are theirs, then the norm.
 * The CPU keeps the two passes: the fusion pays on a GPU, where it saves a
 * read of the stream from memory and a launch. */
static void residual_sum(float *sum, const float *x, const float *partial, const float *residual_bias, int64_t N,
                         int64_t C)
{
    if (residual_bias) bias_residual_forward(sum, x, partial, residual_bias, N, C);
    else residual_forward(sum, x, partial, N * C);
}

void residual_layernorm_forward(float *out, float *mean, float *rstd, float *sum, const float *x, const float *partial,
                                const float *residual_bias, const float *weight, const float *bias, int64_t N,
                                int64_t C)
{
    residual_sum(sum, x, partial, residual_bias, N, C);
    layernorm_forward(out, mean, rstd, sum, weight, bias, N, C);
}

void residual_rmsnorm_forward(float *out, float *rstd, float *sum, const float *x, const float *partial,
                              const float *residual_bias, const float *weight, int64_t N, int64_t C, float eps)
{
    residual_sum(sum, x, partial, residual_bias, N, C);
    rmsnorm_forward(out, rstd, sum, weight, N, C, eps);
}

int residual_layernorm_forward_bf16(uint16_t *out, float *mean, float *rstd, float *sum, const float *x,
                                    const float *partial, const float *residual_bias, const float *weight,
                                    const float *bias, int64_t N, int64_t C)
{
    residual_sum(sum, x, partial, residual_bias, N, C);
    return layernorm_forward_bf16(out, mean, rstd, sum, weight, bias, N, C);
}

int residual_rmsnorm_forward_bf16(uint16_t *out, float *rstd, float *sum, const float *x, const float *partial,
                                  const float *residual_bias, const float *weight, int64_t N, int64_t C, float eps)
{
    residual_sum(sum, x, partial, residual_bias, N, C);
    return rmsnorm_forward_bf16(out, rstd, sum, weight, N, C, eps);
}

/* SwiGLU in bf16 (kernels.h): its input (fc) and gradient come as bf16
 * bits. A chunk of rows is widened into the thread's scratch, the fp32
 * operation runs there, its result is rounded. Row by row, so chunks change
 * nothing but the scratch: about BF16_MLP_CHUNK values of the activation at
 * a time, a few MiB whatever the layer's size. */
#define BF16_MLP_CHUNK ((int64_t)1 << 20)

/* Rows of SwiGLU's [N, 2F] input in a chunk (at least one). */
static int64_t swiglu_chunk_rows(int64_t N, int64_t F)
{
    int64_t rows = F > 0 && BF16_MLP_CHUNK / F > 1 ? BF16_MLP_CHUNK / F : 1;
    return rows < N ? rows : N;
}

int swiglu_forward_bf16(uint16_t *out, const uint16_t *in, int64_t N, int64_t F)
{
    int64_t rows = swiglu_chunk_rows(N, F);
    float *x; /* [in (rows x 2F) | out (rows x F)] */
    TP_TRY(bf16_output_scratch(&x, 3 * rows * F, "SwiGLU"));
    for (int64_t n = 0; n < N; n += rows) {
        int64_t count = N - n < rows ? N - n : rows;
        convert_to_f32(in + n * 2 * F, TP_BF16, x, 2 * count * F);
        swiglu_forward(x + 2 * count * F, x, count, F);
        round_to_bf16(out + n * F, x + 2 * count * F, count * F);
    }
    return TP_OK;
}

int swiglu_backward_bf16(uint16_t *d_in, const uint16_t *in, const uint16_t *d_out, int64_t N, int64_t F)
{
    int64_t rows = swiglu_chunk_rows(N, F);
    float *x; /* [in (rows x 2F) | d_out (rows x F) | d_in (rows x 2F)] */
    TP_TRY(bf16_output_scratch(&x, 5 * rows * F, "SwiGLU's gradient"));
    for (int64_t n = 0; n < N; n += rows) {
        int64_t count = N - n < rows ? N - n : rows;
        float *x_in = x, *x_d_out = x + 2 * count * F, *x_d_in = x + 3 * count * F;
        convert_to_f32(in + n * 2 * F, TP_BF16, x_in, 2 * count * F);
        convert_to_f32(d_out + n * F, TP_BF16, x_d_out, count * F);
        swiglu_backward(x_d_in, x_in, x_d_out, count, F);
        round_to_bf16(d_in + n * 2 * F, x_d_in, 2 * count * F);
    }
    return TP_OK;
}
