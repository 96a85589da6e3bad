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
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

extern "C" {
#include "../kernels.h"
}
#include "column_sums.h"
#include "internal.h"
#include "lanes.h"
#include "launch.h"
#include "norm_emulation.h"

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

/* d_in[i] += value, as norm.c adds it, and where d_in_bits is not NULL the
 * bf16 bits of the sum (store_value: rounded as the CPU rounds): the
 * residual stream's gradient and the copy the products read (kernels.h). */
static __host__ __device__ inline void add_to_d_in(float *d_in, uint16_t *d_in_bits, int64_t i, float value)
{
    float sum = d_in[i] + value;
    d_in[i] = sum;
    if (d_in_bits) store_value(&d_in_bits[i], sum);
}

/* d_in's rows wider than NORM_FUSED_COLUMNS (narrower ones:
 * norm_backward_fused_kernel, below), a warp per row, accumulated as norm.c does:
 * dx += (dxhat - mean(dxhat) - xhat mean(dxhat xhat)) rstd, dxhat = dy w;
 * d_in_bits (NULL: none) the bf16 bits of each new value, rounded as the
 * CPU rounds (store_value). */
static __global__ void layernorm_backward_rows_kernel(float *d_in, uint16_t *d_in_bits, const float *d_out,
                                                      const float *in, const float *weight, const float *mean,
                                                      const float *rstd, int64_t N, int64_t C)
{
    ROWS_OF_WARP(n, N) {
        const float *x = in + n * C, *dy = d_out + n * C;
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
            add_to_d_in(d_in, d_in_bits, n * C + c, (dxhat - mean_dxhat - xhat * mean_dxhat_xhat) * s);
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

/* ========================================== the norms' backward in one pass
 * Where a row fits a warp's registers (C <= NORM_FUSED_COLUMNS: 32 columns
 * a lane, j < COLS of columns lane + 32 j), each warp also sums its rows'
 * terms of the weight's gradient (xhat dy) and of layer norm's bias's (dy)
 * as it writes d_in, so that d_out and in are read from memory once: the
 * rows kernel and column_sums read them twice, 8 bytes a value again (2.5
 * GB a step of GPT-2 124M at micro-batch 16, more than an L2 holds). The
 * block's warps then add theirs in warp order in shared memory, and the
 * block writes one row of partials [blocks, OUTS, C]; column_sums adds
 * those rows (a few MB) in row order. Each warp's rows are fixed by the
 * grid (blocks_for(N, WARP_ROWS), at most NORM_FUSED_BLOCKS), so the order
 * of every sum is too: the same bits every run. d_in, and its bits, are
 * the rows kernels': the same arithmetic in the same order. A warp's work
 * is written once over the lanes its caller holds (lanes.h), so that the
 * CPU emulation (norm_emulation.h) runs the kernel's own code: tests
 * without a GPU check its indexing (test_norm_backward). */
#define NORM_FUSED_COLUMNS 1024
#define NORM_FUSED_BLOCKS 512 /* about 4 an SM of an H100 */

/* The fused kernel's blocks for N rows: a warp a row, at most
 * NORM_FUSED_BLOCKS (a warp then takes every WARP_ROWS x blocks-th row). */
static inline unsigned norm_fused_blocks(int64_t N)
{
    unsigned blocks = blocks_for(N, WARP_ROWS);
    return blocks > NORM_FUSED_BLOCKS ? NORM_FUSED_BLOCKS : blocks;
}

/* Row n of the fused backward by its warp, written once over the L lanes
 * the caller holds (lanes.h: a GPU thread its own, the emulation all 32):
 * d_in's row (+=, and its bits), and each lane's terms of the gradients'
 * sums added to acc[l][o][j] for its columns c = lane + 32 j: the weight's
 * (xhat dy) at o 0, layer norm's bias's (dy) at o 1. */
template <int COLS, bool MEAN, int OUTS, int L>
static __host__ __device__ inline void norm_fused_row(float (*acc)[OUTS][COLS], float *d_in, uint16_t *d_in_bits,
                                                      const float *d_out, const float *in, const float *weight,
                                                      const float *mean, const float *rstd, int64_t n, int64_t C)
{
    const float *x = in + n * C, *dy = d_out + n * C;
    float m = MEAN ? mean[n] : 0.0f, s = rstd[n], a[L], b[L]; /* x - 0 is x exactly (RMSNorm) */
UNROLL
    for (int l = 0; l < L; l++) {
        int lane = lane_number<L>(l);
        a[l] = b[l] = 0;
UNROLL
        for (int j = 0; j < COLS; j++) {
            int64_t c = lane + 32 * j;
            if (c < C) {
                float xhat = (x[c] - m) * s, dxhat = dy[c] * weight[c];
                if (MEAN) a[l] += dxhat;
                b[l] += dxhat * xhat;
            }
        }
    }
    if (MEAN) lanes_sum<L>(a);
    lanes_sum<L>(b);
UNROLL
    for (int l = 0; l < L; l++) {
        int lane = lane_number<L>(l);
        float mean_dxhat = MEAN ? a[l] / (float)C : 0.0f, mean_dxhat_xhat = b[l] / (float)C;
UNROLL
        for (int j = 0; j < COLS; j++) {
            int64_t c = lane + 32 * j;
            if (c < C) {
                float dyc = dy[c], xhat = (x[c] - m) * s, dxhat = dyc * weight[c];
                add_to_d_in(d_in, d_in_bits, n * C + c,
                            MEAN ? (dxhat - mean_dxhat - xhat * mean_dxhat_xhat) * s
                                 : (dxhat - xhat * mean_dxhat_xhat) * s);
                acc[l][0][j] += xhat * dyc;
                if (MEAN) acc[l][OUTS - 1][j] += dyc;
            }
        }
    }
}

/* Warp w's sums acc (lane `lane`'s) into the block's, block_sums [OUTS]
 * [NORM_FUSED_COLUMNS]: warp 0's written, each later warp's added, the
 * warps in order. */
template <int COLS, int OUTS>
static __host__ __device__ inline void norm_fused_block_add(float *block_sums, const float (*acc)[COLS], int w,
                                                            int lane, int64_t C)
{
UNROLL
    for (int o = 0; o < OUTS; o++)
UNROLL
        for (int j = 0; j < COLS; j++) {
            int c = lane + 32 * j;
            float *sum = &block_sums[o * NORM_FUSED_COLUMNS + c];
            if (c < C) *sum = w == 0 ? acc[o][j] : *sum + acc[o][j];
        }
}

/* Column c of the block's sums into its row of the partials [blocks, OUTS,
 * C]. */
template <int OUTS>
static __host__ __device__ inline void norm_fused_partials(float *partials, const float *block_sums, int64_t block,
                                                           int64_t c, int64_t C)
{
    for (int o = 0; o < OUTS; o++) partials[(block * OUTS + o) * C + c] = block_sums[o * NORM_FUSED_COLUMNS + c];
}

template <int COLS, bool MEAN, int OUTS>
static __global__ void __launch_bounds__(THREADS)
    norm_backward_fused_kernel(float *d_in, uint16_t *d_in_bits, float *partials, const float *d_out, const float *in,
                               const float *weight, const float *mean, const float *rstd, int64_t N, int64_t C)
{
    static_assert(COLS * 32 <= NORM_FUSED_COLUMNS && OUTS == (MEAN ? 2 : 1), "a lane's columns; layer norm's two sums");
    __shared__ float block_sums[OUTS * NORM_FUSED_COLUMNS];
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    float acc[1][OUTS][COLS];
#pragma unroll
    for (int o = 0; o < OUTS; o++)
#pragma unroll
        for (int j = 0; j < COLS; j++) acc[0][o][j] = 0.0f;
    ROWS_OF_WARP(n, N) {
        norm_fused_row<COLS, MEAN, OUTS, 1>(acc, d_in, d_in_bits, d_out, in, weight, mean, rstd, n, C);
    }
    for (int w = 0; w < WARP_ROWS; w++) { /* the warps' sums in warp order */
        if (warp == w) norm_fused_block_add<COLS, OUTS>(block_sums, acc[0], w, lane, C);
        __syncthreads();
    }
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
        norm_fused_partials<OUTS>(partials, block_sums, blockIdx.x, c, C);
}

/* Row n of the fused kernel's partials [blocks, OUTS, C], columns c.. c + VEC
 * of each output (column_sums). */
template <int OUTS> struct norm_partials_terms {
    const float *partials;
    int64_t C;
    int chunks_fit() const { return ::chunks_fit(partials, C); } /* then partials + C too */
    template <int VEC> __host__ __device__ void add(int64_t n, int64_t c, float *s) const
    {
        for (int o = 0; o < OUTS; o++) {
            float v[VEC];
            column_load<VEC>(v, &partials[(n * OUTS + o) * C + c]);
            for (int i = 0; i < VEC; i++) s[o * VEC + i] += v[i];
        }
    }
};

/* The partials, held (fused_lock) from their taking until column_sums,
 * which reads them, is queued. */
static cuda_scratch fused_partials;
static pthread_mutex_t fused_lock = PTHREAD_MUTEX_INITIALIZER;

/* run(std::integral_constant<int, COLS>{}) at the fewest columns a lane,
 * COLS of 8, 16, 24 and 32, that hold a row of C (C <= NORM_FUSED_COLUMNS). */
template <typename Run> static int norm_fused_at_width(int64_t C, const Run &run)
{
    if (C <= 8 * 32) return run(std::integral_constant<int, 8>{});
    if (C <= 16 * 32) return run(std::integral_constant<int, 16>{});
    if (C <= 24 * 32) return run(std::integral_constant<int, 24>{});
    return run(std::integral_constant<int, 32>{});
}

template <bool MEAN, int OUTS>
static int norm_backward_fused_launch(unsigned blocks, float *d_in, uint16_t *d_in_bits, float *partials,
                                      const float *d_out, const float *in, const float *weight, const float *mean,
                                      const float *rstd, int64_t N, int64_t C)
{
    norm_fused_at_width(C, [&](auto cols) {
        norm_backward_fused_kernel<decltype(cols)::value, MEAN, OUTS><<<blocks, THREADS, 0, cuda_state.stream>>>(
            d_in, d_in_bits, partials, d_out, in, weight, mean, rstd, N, C);
        return TP_OK;
    });
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* The backward of layer norm (MEAN, OUTS 2: d_weight and d_bias, which may
 * be NULL) or RMSNorm (OUTS 1) with C <= NORM_FUSED_COLUMNS, N, C > 0. */
template <bool MEAN, int OUTS>
static int norm_backward_fused(float *d_in, uint16_t *d_in_bits, float *d_weight, float *d_bias, const float *d_out,
                               const float *in, const float *weight, const float *mean, const float *rstd, int64_t N,
                               int64_t C)
{
    unsigned blocks = norm_fused_blocks(N);
    void *partials = NULL;
    const size_t bytes = (size_t)blocks * OUTS * (size_t)C * sizeof(float);
    pthread_mutex_lock(&fused_lock);
    int status = cuda_scratch_parts(&fused_partials, "the norm backward's partial sums", &partials, &bytes, 1);
    if (!status)
        status = norm_backward_fused_launch<MEAN, OUTS>(blocks, d_in, d_in_bits, (float *)partials, d_out, in, weight,
                                                        mean, rstd, N, C);
    if (!status)
        status = column_sums<OUTS>(d_weight, MEAN ? d_bias : NULL, norm_partials_terms<OUTS>{(float *)partials, C},
                                   (int64_t)blocks, C);
    pthread_mutex_unlock(&fused_lock);
    return status;
}

/* norm_backward_fused worked on the CPU (host memory), for tests of its
 * indexing without a GPU: the kernel's blocks one after the other, each
 * block's warps in order (a warp's rows, then its sums into the block's),
 * with the kernel's own per-warp functions over the warp's 32 lanes; then
 * column_sums' emulation over the partials. */
template <int COLS, bool MEAN, int OUTS>
static int norm_backward_fused_emulate(float *d_in, uint16_t *d_in_bits, float *d_weight, float *d_bias,
                                       const float *d_out, const float *in, const float *weight, const float *mean,
                                       const float *rstd, int64_t N, int64_t C)
{
    unsigned blocks = norm_fused_blocks(N);
    float *partials = (float *)malloc((size_t)blocks * OUTS * (size_t)C * sizeof(float));
    float *block_sums = (float *)malloc(sizeof(float) * OUTS * NORM_FUSED_COLUMNS);
    float(*acc)[OUTS][COLS] = (float(*)[OUTS][COLS])malloc(sizeof(float) * 32 * OUTS * COLS);
    int status = TP_OK;
    if (!partials || !block_sums || !acc)
        status = tp_fail(TP_ERR_NOMEM, "the norms' backward emulation: %u blocks of %lld columns", blocks,
                         (long long)C);
    for (unsigned block = 0; block < blocks && !status; block++) {
        for (int w = 0; w < WARP_ROWS; w++) {
            memset(acc, 0, sizeof(float) * 32 * OUTS * COLS);
            for (int64_t n = (int64_t)block * WARP_ROWS + w; n < N; n += (int64_t)blocks * WARP_ROWS) /* ROWS_OF_WARP */
                norm_fused_row<COLS, MEAN, OUTS, 32>(acc, d_in, d_in_bits, d_out, in, weight, mean, rstd, n, C);
            for (int lane = 0; lane < 32; lane++) norm_fused_block_add<COLS, OUTS>(block_sums, acc[lane], w, lane, C);
        }
        for (int64_t c = 0; c < C; c++) norm_fused_partials<OUTS>(partials, block_sums, block, c, C);
    }
    if (!status) {
        const norm_partials_terms<OUTS> terms = {partials, C};
        float *d_bias_or_none = MEAN ? d_bias : NULL;
        status = terms.chunks_fit() ? column_sums_emulate<OUTS, CHUNK>(d_weight, d_bias_or_none, terms, blocks, C)
                                    : column_sums_emulate<OUTS, 1>(d_weight, d_bias_or_none, terms, blocks, C);
    }
    free(partials), free(block_sums), free(acc);
    return status;
}

static int norm_emulation_shape(int64_t N, int64_t C)
{
    if (N < 0 || C < 0)
        return tp_fail(TP_ERR_ARG, "the norms' backward emulation: a shape of [%lld, %lld]", (long long)N,
                       (long long)C);
    if (C > NORM_FUSED_COLUMNS)
        return tp_fail(TP_ERR_ARG,
                       "the norms' backward emulation: rows of %lld columns (the fused kernel takes %d at most)",
                       (long long)C, NORM_FUSED_COLUMNS);
    return TP_OK;
}

extern "C" int cuda_layernorm_backward_emulate(float *d_in, uint16_t *d_in_bits, float *d_weight, float *d_bias,
                                               const float *d_out, const float *in, const float *weight,
                                               const float *mean, const float *rstd, int64_t N, int64_t C)
{
    TP_TRY(norm_emulation_shape(N, C));
    if (N == 0 || C == 0) return TP_OK;
    return norm_fused_at_width(C, [&](auto cols) {
        return norm_backward_fused_emulate<decltype(cols)::value, true, 2>(d_in, d_in_bits, d_weight, d_bias, d_out,
                                                                           in, weight, mean, rstd, N, C);
    });
}

extern "C" int cuda_rmsnorm_backward_emulate(float *d_in, uint16_t *d_in_bits, float *d_weight, const float *d_out,
                                             const float *in, const float *weight, const float *rstd, int64_t N,
                                             int64_t C)
{
    TP_TRY(norm_emulation_shape(N, C));
    if (N == 0 || C == 0) return TP_OK;
    return norm_fused_at_width(C, [&](auto cols) {
        return norm_backward_fused_emulate<decltype(cols)::value, false, 1>(d_in, d_in_bits, d_weight, NULL, d_out,
                                                                            in, weight, NULL, rstd, N, C);
    });
}

int cuda_layernorm_backward(float *d_in, uint16_t *d_in_bits, float *d_weight, float *d_bias, const float *d_out,
                            const float *in, const float *weight, const float *mean, const float *rstd, int64_t N,
                            int64_t C)
{
    ENTER();
    if (N <= 0 || C <= 0) return TP_OK;
    if (C <= NORM_FUSED_COLUMNS)
        return norm_backward_fused<true, 2>(d_in, d_in_bits, d_weight, d_bias, d_out, in, weight, mean, rstd, N, C);
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
        float s = rstd[n], b = 0;
        COLUMNS_OF_LANE(c, C) b += dy[c] * weight[c] * (x[c] * s);
        float mean_dxhat_xhat = warp_sum(b) / (float)C;
        COLUMNS_OF_LANE(c, C) {
            float xhat = x[c] * s, dxhat = dy[c] * weight[c];
            add_to_d_in(d_in, d_in_bits, n * C + c, (dxhat - xhat * mean_dxhat_xhat) * s);
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
    if (C <= NORM_FUSED_COLUMNS)
        return norm_backward_fused<false, 1>(d_in, d_in_bits, d_weight, NULL, d_out, in, weight, NULL, rstd, N, C);
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
