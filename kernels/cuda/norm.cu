/* norm.cu: layer norm, GELU, RMSNorm and SwiGLU on the GPU, the twins of
 * cpu/norm.c (tests/kernels/test_cuda_backend.c). Row kernels give a row to
 * a warp (ROWS_OF_WARP, warp_sum: launch.h); the weight and bias gradients
 * are column sums in a fixed order (column_sums.h). Each forward kernel is a
 * template on its output, float or uint16_t: the *_forward_bf16 operations
 * (kernels.h, bf16 activations) are the same kernel storing the bits of
 * rounding each fp32 value it computes (store_value, launch.h), so that
 * their bits are those of rounding the fp32 operation's out, by
 * construction. The SwiGLU kernels
 * are templates on their input's type as well: in bf16 mixed precision the
 * MLP's input (the fc product's output) is a bf16 activation, which
 * swiglu_forward_bf16 reads as bits widened (load_value, exact); GELU's
 * bf16 forward reads the product's fp32 sums (cuda_gelu_forward_of_sums,
 * matmul_forward_gelu_bf16's separate way). The backward kernels are
 * templates on d_in's, in's and d_out's types alike: swiglu_backward_bf16
 * (bf16 gradients) reads in's and d_out's bits widened and stores d_in's
 * bits rounded, cuda_gelu_backward_of_sums reads in's bits and an fp32
 * d_out. One source of fp32 arithmetic serves both precisions: the bf16
 * operations' bits are those of rounding what the fp32 kernels compute from
 * the widened values. The norms read the residual stream, fp32 in both.
 * Their forward kernels may begin with the residual add that makes the
 * row they normalize (residual_terms: the residual_*norm_forward
 * operations), the sum written and summed in the same pass. */
#include <math.h>
#include <stdint.h>

extern "C" {
#include "../kernels.h"
}
#include "column_sums.h"
#include "internal.h"
#include "launch.h"

#define LAYERNORM_EPS 1e-5f
#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */

/* The residual add a norm's forward may begin with (kernels.h
 * residual_layernorm_forward): sum = x + (partial + bias), or x + partial
 * without a bias, each element as linear.cu's bias_residual_kernel and
 * residual_kernel compute it; sum NULL: none, the norm reads its input. */
struct residual_terms {
    float *sum;
    const float *x, *partial, *bias;
};

/* Row n of the norm's input, made first when r has a sum: each lane of the
 * row's warp writes its columns of the sum and adds them (or their squares,
 * Squares) to the partial it returns, the first pass of the norm's
 * statistics in the CPU's order. The lane reads those columns again
 * afterwards (its own writes: no barrier needed); sum may be x or partial,
 * each element read before it is written by the same lane. */
template <bool Squares>
static __device__ const float *norm_input_row(const residual_terms &r, const float *in, int64_t n, int64_t C,
                                              float *partial_sum)
{
    float s = 0;
    if (!r.sum) {
        const float *x = in + n * C;
        COLUMNS_OF_LANE(c, C) s += Squares ? x[c] * x[c] : x[c];
        *partial_sum = s;
        return x;
    }
    float *row = r.sum + n * C;
    const float *a = r.x + n * C, *p = r.partial + n * C;
    COLUMNS_OF_LANE(c, C) {
        float v = r.bias ? a[c] + (p[c] + r.bias[c]) : a[c] + p[c];
        row[c] = v;
        s += Squares ? v * v : v;
    }
    *partial_sum = s;
    return row;
}

/* ============================================================== layer norm */

/* A warp per row, in the CPU's order of operations: mean, then the variance
 * about it (two passes), rstd = 1 / sqrt(var + eps). Out: float or
 * uint16_t (bf16 bits). */
template <typename Out>
static __global__ void layernorm_forward_kernel(Out *out, float *mean, float *rstd, const float *in,
                                                const float *weight, const float *bias, int64_t N, int64_t C,
                                                residual_terms residual)
{
    ROWS_OF_WARP(n, N) {
        float s;
        const float *x = norm_input_row<false>(residual, in, n, C, &s);
        Out *y = out + n * C;
        float m = warp_sum(s) / (float)C;
        float q = 0;
        COLUMNS_OF_LANE(c, C) q += (x[c] - m) * (x[c] - m);
        float var = warp_sum(q) / (float)C;
        float r = 1.0f / sqrtf(var + LAYERNORM_EPS);
        COLUMNS_OF_LANE(c, C) store_value(&y[c], (x[c] - m) * r * weight[c] + bias[c]);
        if ((threadIdx.x & 31) == 0) {
            mean[n] = m;
            rstd[n] = r;
        }
    }
}

/* d_in's rows (a warp per row), accumulated as norm.c does:
 * dx += (dxhat - mean(dxhat) - xhat mean(dxhat xhat)) rstd, dxhat = dy w;
 * d_in_bits (NULL: none) the bf16 bits of each new value, rounded as the
 * CPU rounds (store_value). */
static __global__ void layernorm_backward_rows_kernel(float *d_in, uint16_t *d_in_bits, const float *d_out,
                                                      const float *in, const float *weight, const float *mean,
                                                      const float *rstd, int64_t N, int64_t C)
{
    ROWS_OF_WARP(n, N) {
        const float *x = in + n * C, *dy = d_out + n * C;
        float *dx = d_in + n * C;
        float m = mean[n], s = rstd[n];
        float a = 0, b = 0;
        COLUMNS_OF_LANE(c, C) {
            float xhat = (x[c] - m) * s, dxhat = dy[c] * weight[c];
            a += dxhat;
            b += dxhat * xhat;
        }
        float mean_dxhat = warp_sum(a) / (float)C;
        float mean_dxhat_xhat = warp_sum(b) / (float)C;
        COLUMNS_OF_LANE(c, C) {
            float xhat = (x[c] - m) * s, dxhat = dy[c] * weight[c];
            float sum = dx[c] + (dxhat - mean_dxhat - xhat * mean_dxhat_xhat) * s;
            dx[c] = sum;
            if (d_in_bits) store_value(&d_in_bits[n * C + c], sum);
        }
    }
}

/* Row n's terms of columns c.. c + VEC of the gradients: d_weight's
 * xhat dy, then d_bias's dy (column_sums). */
struct layernorm_weight_bias_terms {
    const float *d_out, *in, *mean, *rstd;
    int64_t C;
    int chunks_fit() const { return ::chunks_fit(d_out, C) && ::chunks_fit(in, C); }
    template <int VEC> __host__ __device__ void add(int64_t n, int64_t c, float *s) const
    {
        float dy[VEC], x[VEC], m = mean[n], r = rstd[n];
        column_load<VEC>(dy, &d_out[n * C + c]);
        column_load<VEC>(x, &in[n * C + c]);
        for (int v = 0; v < VEC; v++) {
            s[v] += (x[v] - m) * r * dy[v];
            s[VEC + v] += dy[v];
        }
    }
};

template <typename Out>
static int layernorm_forward_as(Out *out, float *mean, float *rstd, const float *in, const float *weight,
                                const float *bias, int64_t N, int64_t C, residual_terms r = {})
{
    ENTER();
    if (N <= 0) return TP_OK;
    layernorm_forward_kernel<<<blocks_for(N, WARP_ROWS), THREADS, 0, cuda_state.stream>>>(out, mean, rstd, in, weight,
                                                                                          bias, N, C, r);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

int cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *in, const float *weight,
                           const float *bias, int64_t N, int64_t C)
{
    return layernorm_forward_as(out, mean, rstd, in, weight, bias, N, C);
}

int cuda_layernorm_forward_bf16(uint16_t *out, float *mean, float *rstd, const float *in, const float *weight,
                                const float *bias, int64_t N, int64_t C)
{
    return layernorm_forward_as(out, mean, rstd, in, weight, bias, N, C);
}

int cuda_residual_layernorm_forward(float *out, float *mean, float *rstd, float *sum, const float *x,
                                    const float *partial, const float *residual_bias, const float *weight,
                                    const float *bias, int64_t N, int64_t C)
{
    residual_terms r = {sum, x, partial, residual_bias};
    return layernorm_forward_as(out, mean, rstd, sum, weight, bias, N, C, r);
}

int cuda_residual_layernorm_forward_bf16(uint16_t *out, float *mean, float *rstd, float *sum, const float *x,
                                         const float *partial, const float *residual_bias, const float *weight,
                                         const float *bias, int64_t N, int64_t C)
{
    residual_terms r = {sum, x, partial, residual_bias};
    return layernorm_forward_as(out, mean, rstd, sum, weight, bias, N, C, r);
}

int cuda_layernorm_backward(float *d_in, uint16_t *d_in_bits, float *d_weight, float *d_bias, const float *d_out,
                            const float *in, const float *weight, const float *mean, const float *rstd, int64_t N,
                            int64_t C)
{
    ENTER();
    if (N <= 0 || C <= 0) return TP_OK;
    layernorm_backward_rows_kernel<<<blocks_for(N, WARP_ROWS), THREADS, 0, cuda_state.stream>>>(
        d_in, d_in_bits, d_out, in, weight, mean, rstd, N, C);
    LAUNCH_CHECK();
    return column_sums<2>(d_weight, d_bias, layernorm_weight_bias_terms{d_out, in, mean, rstd, C}, N, C);
fail:
    return TP_ERR_DEVICE;
}

/* =================================================================== GELU
 * As norm.c: x s with s = 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)); the CPU
 * takes exp from fast_exp.h (within 2 ulp of expf), the GPU its own expf
 * (also within 2 ulp): the two agree to a few ulp, not bit for bit. */

static __device__ float gelu_gate(float x)
{
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    return 1.0f / (1.0f + expf(-2.0f * u));
}

/* out[i] = GELU of the fp32 in[i]; Out: float (gelu_forward), or uint16_t
 * (bf16 bits: cuda_gelu_forward_of_sums, whose pre, where given, gets the
 * bits of in[i] itself: the sums read once for both). */
template <typename Out> static __global__ void gelu_forward_kernel(Out *out, uint16_t *pre, const float *in, int64_t n)
{
    GRID_STRIDE(i, n) {
        float x = in[i];
        if (pre) store_value(&pre[i], x);
        store_value(&out[i], x * gelu_gate(x));
    }
}

/* d/dx [x s] = s + x * 2 s (1 - s) * du/dx. DIn, In, DOut: float
 * (gelu_backward), or d_in and in bf16 bits with an fp32 d_out
 * (cuda_gelu_backward_of_sums). */
template <typename DIn, typename In, typename DOut>
static __global__ void gelu_backward_kernel(DIn *d_in, const In *in, const DOut *d_out, int64_t n)
{
    GRID_STRIDE(i, n) {
        float x = load_value(&in[i]), s = gelu_gate(x);
        float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        store_value(&d_in[i], (s + 2.0f * x * s * (1.0f - s) * du) * load_value(&d_out[i]));
    }
}

template <typename Out> static int gelu_forward_as(Out *out, uint16_t *pre, const float *in, int64_t n)
{
    ENTER();
    if (n <= 0) return TP_OK;
    gelu_forward_kernel<<<blocks_for(n, THREADS), THREADS, 0, cuda_state.stream>>>(out, pre, in, n);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

int cuda_gelu_forward(float *out, const float *in, int64_t n)
{
    return gelu_forward_as(out, (uint16_t *)NULL, in, n);
}

int cuda_gelu_forward_of_sums(uint16_t *out, uint16_t *pre, const float *in, int64_t n)
{
    return gelu_forward_as(out, pre, in, n);
}

template <typename DIn, typename In, typename DOut>
static int gelu_backward_as(DIn *d_in, const In *in, const DOut *d_out, int64_t n)
{
    ENTER();
    if (n <= 0) return TP_OK;
    gelu_backward_kernel<<<blocks_for(n, THREADS), THREADS, 0, cuda_state.stream>>>(d_in, in, d_out, n);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

int cuda_gelu_backward(float *d_in, const float *in, const float *d_out, int64_t n)
{
    return gelu_backward_as(d_in, in, d_out, n);
}

int cuda_gelu_backward_of_sums(uint16_t *d_in, const uint16_t *in, const float *d_out, int64_t n)
{
    return gelu_backward_as(d_in, in, d_out, n);
}

/* ================================================================ RMSNorm
 * As norm.c: a warp per row for the forward and for d_in, rstd =
 * 1 / sqrt(mean(x^2) + eps), y = x rstd w; d_weight by column sums in a
 * fixed order (column_sums.h; no atomics). */

template <typename Out>
static __global__ void rmsnorm_forward_kernel(Out *out, float *rstd, const float *in, const float *weight, int64_t N,
                                              int64_t C, float eps, residual_terms residual)
{
    ROWS_OF_WARP(n, N) {
        float q;
        const float *x = norm_input_row<true>(residual, in, n, C, &q);
        Out *y = out + n * C;
        float r = 1.0f / sqrtf(warp_sum(q) / (float)C + eps);
        COLUMNS_OF_LANE(c, C) store_value(&y[c], x[c] * r * weight[c]);
        if ((threadIdx.x & 31) == 0) rstd[n] = r;
    }
}

/* dx += (dxhat - xhat mean(dxhat xhat)) rstd, xhat = x rstd, dxhat = dy w;
 * d_in_bits as layernorm_backward_rows_kernel's. */
static __global__ void rmsnorm_backward_rows_kernel(float *d_in, uint16_t *d_in_bits, const float *d_out,
                                                    const float *in, const float *weight, const float *rstd,
                                                    int64_t N, int64_t C)
{
    ROWS_OF_WARP(n, N) {
        const float *x = in + n * C, *dy = d_out + n * C;
        float *dx = d_in + n * C;
        float s = rstd[n], b = 0;
        COLUMNS_OF_LANE(c, C) b += dy[c] * weight[c] * (x[c] * s);
        float mean_dxhat_xhat = warp_sum(b) / (float)C;
        COLUMNS_OF_LANE(c, C) {
            float xhat = x[c] * s, dxhat = dy[c] * weight[c];
            float sum = dx[c] + (dxhat - xhat * mean_dxhat_xhat) * s;
            dx[c] = sum;
            if (d_in_bits) store_value(&d_in_bits[n * C + c], sum);
        }
    }
}

/* Row n's terms of columns c.. c + VEC of d_weight: x rstd dy
 * (column_sums). */
struct rmsnorm_weight_terms {
    const float *d_out, *in, *rstd;
    int64_t C;
    int chunks_fit() const { return ::chunks_fit(d_out, C) && ::chunks_fit(in, C); }
    template <int VEC> __host__ __device__ void add(int64_t n, int64_t c, float *s) const
    {
        float dy[VEC], x[VEC], r = rstd[n];
        column_load<VEC>(dy, &d_out[n * C + c]);
        column_load<VEC>(x, &in[n * C + c]);
        for (int v = 0; v < VEC; v++) s[v] += x[v] * r * dy[v];
    }
};

template <typename Out>
static int rmsnorm_forward_as(Out *out, float *rstd, const float *in, const float *weight, int64_t N, int64_t C,
                              float eps, residual_terms r = {})
{
    ENTER();
    if (N <= 0) return TP_OK;
    rmsnorm_forward_kernel<<<blocks_for(N, WARP_ROWS), THREADS, 0, cuda_state.stream>>>(out, rstd, in, weight, N, C,
                                                                                        eps, r);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

int cuda_rmsnorm_forward(float *out, float *rstd, const float *in, const float *weight, int64_t N, int64_t C,
                         float eps)
{
    return rmsnorm_forward_as(out, rstd, in, weight, N, C, eps);
}

int cuda_rmsnorm_forward_bf16(uint16_t *out, float *rstd, const float *in, const float *weight, int64_t N, int64_t C,
                              float eps)
{
    return rmsnorm_forward_as(out, rstd, in, weight, N, C, eps);
}

int cuda_residual_rmsnorm_forward(float *out, float *rstd, float *sum, const float *x, const float *partial,
                                  const float *residual_bias, const float *weight, int64_t N, int64_t C, float eps)
{
    residual_terms r = {sum, x, partial, residual_bias};
    return rmsnorm_forward_as(out, rstd, sum, weight, N, C, eps, r);
}

int cuda_residual_rmsnorm_forward_bf16(uint16_t *out, float *rstd, float *sum, const float *x, const float *partial,
                                       const float *residual_bias, const float *weight, int64_t N, int64_t C,
                                       float eps)
{
    residual_terms r = {sum, x, partial, residual_bias};
    return rmsnorm_forward_as(out, rstd, sum, weight, N, C, eps, r);
}

int cuda_rmsnorm_backward(float *d_in, uint16_t *d_in_bits, float *d_weight, const float *d_out, const float *in,
                          const float *weight, const float *rstd, int64_t N, int64_t C)
{
    ENTER();
    if (N <= 0 || C <= 0) return TP_OK;
    rmsnorm_backward_rows_kernel<<<blocks_for(N, WARP_ROWS), THREADS, 0, cuda_state.stream>>>(
        d_in, d_in_bits, d_out, in, weight, rstd, N, C);
    LAUNCH_CHECK();
    return column_sums<1>(d_weight, NULL, rmsnorm_weight_terms{d_out, in, rstd, C}, N, C);
fail:
    return TP_ERR_DEVICE;
}

/* ================================================================= SwiGLU
 * As norm.c: in[N,2F] = [gate | up] per row, out[N,F] = g / (1 + exp(-g)) up;
 * the GPU's expf for the CPU's fast_expf (each within 2 ulp). A block per
 * row, an element of out (and its two of d_in) per thread. */

/* Out, In: float, or uint16_t (bf16 bits: swiglu_forward_bf16). */
template <typename Out, typename In>
static __global__ void swiglu_forward_kernel(Out *out, const In *in, int64_t N, int64_t F)
{
    ROWS_AND_COLUMNS(n, f, N, F) {
        float g = load_value(&in[n * 2 * F + f]), up = load_value(&in[n * 2 * F + F + f]);
        store_value(&out[n * F + f], g / (1.0f + expf(-g)) * up);
    }
}

/* d up = dy g s, d gate = dy up s (1 + g (1 - s)), s = sigmoid(g). DIn,
 * In, DOut: float, or uint16_t (bf16 bits: swiglu_backward_bf16). */
template <typename DIn, typename In, typename DOut>
static __global__ void swiglu_backward_kernel(DIn *d_in, const In *in, const DOut *d_out, int64_t N, int64_t F)
{
    ROWS_AND_COLUMNS(n, f, N, F) {
        float g = load_value(&in[n * 2 * F + f]), up = load_value(&in[n * 2 * F + F + f]);
        float dy = load_value(&d_out[n * F + f]);
        float s = 1.0f / (1.0f + expf(-g));
        store_value(&d_in[n * 2 * F + F + f], dy * (g * s));
        store_value(&d_in[n * 2 * F + f], dy * up * (s * (1.0f + g * (1.0f - s))));
    }
}

template <typename Out, typename In> static int swiglu_forward_as(Out *out, const In *in, int64_t N, int64_t F)
{
    ENTER();
    if (N <= 0 || F <= 0) return TP_OK;
    swiglu_forward_kernel<<<blocks_for(N, 1), THREADS, 0, cuda_state.stream>>>(out, in, N, F);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

int cuda_swiglu_forward(float *out, const float *in, int64_t N, int64_t F)
{
    return swiglu_forward_as(out, in, N, F);
}

int cuda_swiglu_forward_bf16(uint16_t *out, const uint16_t *in, int64_t N, int64_t F)
{
    return swiglu_forward_as(out, in, N, F);
}

template <typename DIn, typename In, typename DOut>
static int swiglu_backward_as(DIn *d_in, const In *in, const DOut *d_out, int64_t N, int64_t F)
{
    ENTER();
    if (N <= 0 || F <= 0) return TP_OK;
    swiglu_backward_kernel<<<blocks_for(N, 1), THREADS, 0, cuda_state.stream>>>(d_in, in, d_out, N, F);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

int cuda_swiglu_backward(float *d_in, const float *in, const float *d_out, int64_t N, int64_t F)
{
    return swiglu_backward_as(d_in, in, d_out, N, F);
}

int cuda_swiglu_backward_bf16(uint16_t *d_in, const uint16_t *in, const uint16_t *d_out, int64_t N, int64_t F)
{
    return swiglu_backward_as(d_in, in, d_out, N, F);
}
