/* attention_tiled.cu: causal attention in tiles (flash-style), fp32 on the
 * CUDA cores, for head sizes of 32, 64, 128 and 256.
 *
 * Why: the profile of a GPT-2 124M step on an H200 (docs/BENCHMARKS.md) put
 * 94% of the GPU's time in the rows attention (attention.cu), which gives
 * each row a warp and sums every score across the warp with five shuffles. Here a row
 * has hd / 32 threads, each holding 32 of its dimensions in registers; a
 * block of 64 rows reads the rows it meets (keys and values, or queries and
 * output gradients) a tile at a time from shared memory, every thread of
 * the block reading the same shared row at once (a broadcast). A score is
 * each thread's 32 products then log2(hd / 32) shuffles.
 *
 * Three kernels, as attention.cu's, with the same arithmetic per pair of rows
 * (the same results within rounding: sums run in another order):
 *   forward:  per query row i, over keys j <= i, an online softmax: a
 *             running maximum and sum, the accumulator rescaled when the
 *             maximum grows; out_i = acc / sum, lse_i = max + log(sum).
 *   queries:  per query row, delta_i = d_out_i . out_i, then over j <= i,
 *             p = exp(q_i . k_j scale - lse_i), ds = p (d_out_i . v_j -
 *             delta_i) scale, dq_i += ds k_j.
 *   keys:     per key row j of key/value head kh, over the query heads of
 *             its group and rows i >= j: dk_j += ds q_i, dv_j += p d_out_i.
 * Every element of d_qkv has one writer: no atomics, no zeroing.
 *
 * The per-thread work is written once, in __host__ __device__ functions;
 * the kernels and their CPU emulation (cuda_attention_tiled_emulate_*)
 * both call them, the emulation doing a row's cross-thread sums in the
 * shuffles' order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "../../common/error.h"
}
#include "attention_tiled.h"
#include "internal.h"

#define PART 32          /* head dimensions per thread */
#define PART_STRIDE 36   /* floats of a part in shared memory: 4 of padding put a row's parts in other banks */
#define TILE_FLOATS 4608 /* one shared tile: 128 parts of PART_STRIDE floats, 18 KiB */
#define MAX_GRID_YZ 65535

/* Loops of PART unrolled on the device, so that the parts stay in
 * registers (the host's compiler, for the emulation, does not know the
 * pragma). */
#ifdef __CUDA_ARCH__
#define UNROLL _Pragma("unroll")
#else
#define UNROLL
#endif

/* The shape of the kernels for a head size HD: `rows` rows per block (query
 * rows in the forward and queries kernels, key rows in the keys kernel),
 * `split` threads per row, a shared tile of `tile_rows` rows (so that a tile
 * is TILE_FLOATS). 32 rows at 256 dimensions: 256 threads a block may use up
 * to 255 registers each, which the keys kernel's 128 floats of state need
 * (at 512 threads it spilled them all). */
template <int HD> struct tiling {
    static constexpr int split = HD / PART;
    static constexpr int rows = HD >= 256 ? 32 : 64;
    static constexpr int threads = rows * split;
    static constexpr int row_floats = split * PART_STRIDE;
    static constexpr int tile_rows = TILE_FLOATS / row_floats;
};

static __host__ __device__ inline int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* Element idx (< tile_rows HD) of a tile: row r = idx / HD of the matrix
 * src (row stride `stride`) counted from `first`, zero at or past `limit`,
 * to its place in shared memory (part by part, PART_STRIDE apart). */
template <int HD>
static __host__ __device__ inline void tile_element(float *tile, const float *src, int64_t stride, int64_t first,
                                                    int64_t limit, int idx)
{
    int r = idx / HD, d = idx % HD;
    int64_t row = first + r;
    tile[r * tiling<HD>::row_floats + (d / PART) * PART_STRIDE + d % PART] = row < limit ? src[row * stride + d] : 0.0f;
}

/* A row's part in shared memory. */
template <int HD> static __host__ __device__ inline const float *tile_part(const float *tile, int row, int part)
{
    return tile + row * tiling<HD>::row_floats + part * PART_STRIDE;
}

/* Four floats of a part in shared memory in one 16-byte load (parts and
 * rows start at multiples of 4 floats, tiles are aligned): a quarter of
 * the shared-memory loads per multiply-add. */
static __host__ __device__ inline float4 quad(const float *part, int d)
{
#ifdef __CUDA_ARCH__
    return *reinterpret_cast<const float4 *>(part + d);
#else
    float4 t; /* the emulation: the same four values, without type punning */
    memcpy(&t, part + d, sizeof t);
    return t;
#endif
}

/* mine . theirs, theirs a part in shared memory, summed in order of d. */
static __host__ __device__ inline float part_dot(const float *mine, const float *theirs)
{
    float sum = 0;
UNROLL
    for (int d = 0; d < PART; d += 4) {
        float4 t = quad(theirs, d);
        sum += mine[d] * t.x;
        sum += mine[d + 1] * t.y;
        sum += mine[d + 2] * t.z;
        sum += mine[d + 3] * t.w;
    }
    return sum;
}

/* acc += a x, x a part in shared memory. */
static __host__ __device__ inline void part_axpy(float *acc, float a, const float *x)
{
UNROLL
    for (int d = 0; d < PART; d += 4) {
        float4 t = quad(x, d);
        acc[d] += a * t.x;
        acc[d + 1] += a * t.y;
        acc[d + 2] += a * t.z;
        acc[d + 3] += a * t.w;
    }
}

/* PART values from global memory, or zeros for a row past the end. */
static __host__ __device__ inline void load_part(float *mine, const float *src, int valid)
{
UNROLL
    for (int d = 0; d < PART; d++) mine[d] = valid ? src[d] : 0.0f;
}

/* The sum of a row's SPLIT threads' values, on each of them: butterfly
 * pairs, offsets 1, 2, 4 (every thread of the warp takes part). */
template <int SPLIT> static __device__ inline float row_sum(float value)
{
UNROLL
    for (int offset = 1; offset < SPLIT; offset <<= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
    return value;
}

/* row_sum on the CPU: values[p] the partial of thread p of the row. */
template <int SPLIT> static void row_sum_emulated(float *values)
{
    for (int offset = 1; offset < SPLIT; offset <<= 1) {
        float next[SPLIT];
        for (int p = 0; p < SPLIT; p++) next[p] = values[p] + values[p ^ offset];
        memcpy(values, next, sizeof next);
    }
}

/* ================================================================ forward */

struct forward_part {
    float q[PART], acc[PART], max, sum;
};

static __host__ __device__ inline void forward_begin(forward_part *st, const float *q, int valid)
{
    load_part(st->q, q, valid);
UNROLL
    for (int d = 0; d < PART; d++) st->acc[d] = 0;
    st->max = -INFINITY;
    st->sum = 0;
}

/* Key j's score s (scaled) and value part v, where j <= i. */
static __host__ __device__ inline void forward_key(forward_part *st, float s, int valid, const float *v)
{
    if (!valid) return;
    if (s > st->max) { /* exp(-inf) = 0 at the first key */
        float rescale = expf(st->max - s);
        st->sum *= rescale;
UNROLL
        for (int d = 0; d < PART; d++) st->acc[d] *= rescale;
        st->max = s;
    }
    float p = expf(s - st->max);
    st->sum += p;
    part_axpy(st->acc, p, v);
}

static __host__ __device__ inline void forward_end(const forward_part *st, float *out, float *lse, int part, int valid)
{
    if (!valid) return;
UNROLL
    for (int d = 0; d < PART; d++) out[d] = st->acc[d] / st->sum;
    if (part == 0) *lse = st->max + logf(st->sum);
}

/* Where block (x, h, b)'s thread of part `part` in row `row` reads and
 * writes: the same for the kernel and the emulation. */
struct row_places {
    const float *keys, *values; /* key/value head's column in qkv, batch b (row j at + j stride) */
    const float *q;             /* this row's query part */
    float *out, *lse;
};

static __host__ __device__ inline row_places forward_places(float *out, float *lse, const float *qkv, int64_t b,
                                                            int64_t h, int64_t i, int part, int64_t T, int64_t Hq,
                                                            int64_t Hkv, int64_t hd)
{
    int64_t stride = (Hq + 2 * Hkv) * hd, kh = h / (Hq / Hkv);
    const float *base = qkv + b * T * stride;
    row_places at;
    at.keys = base + (Hq + kh) * hd;
    at.values = base + (Hq + Hkv + kh) * hd;
    at.q = base + i * stride + h * hd + part * PART;
    at.out = out + (b * T + i) * Hq * hd + h * hd + part * PART;
    at.lse = lse + (b * Hq + h) * T + i;
    return at;
}

/* Grid (ceil(T / rows), Hq, B); block tiling<HD>::threads. */
template <int HD>
__global__ void __launch_bounds__(tiling<HD>::threads)
    attention_forward_tiled(float *out, float *lse, const float *qkv, int64_t T, int64_t Hq, int64_t Hkv, float scale)
{
    typedef tiling<HD> S;
    __shared__ __align__(16) float keys[TILE_FLOATS], values[TILE_FLOATS];
    int part = threadIdx.x % S::split, row = threadIdx.x / S::split;
    /* The last rows meet the most keys: their blocks first, so that no long block starts last. */
    int64_t b = blockIdx.z, h = blockIdx.y, first = (int64_t)(gridDim.x - 1 - blockIdx.x) * S::rows, i = first + row;
    int64_t stride = (Hq + 2 * Hkv) * HD, end = min64(T, first + S::rows);
    row_places at = forward_places(out, lse, qkv, b, h, i, part, T, Hq, Hkv, HD);
    forward_part st;
    forward_begin(&st, at.q, i < T);
    for (int64_t k0 = 0; k0 < end; k0 += S::tile_rows) {
        __syncthreads(); /* every thread is done with the last tile */
        for (int idx = threadIdx.x; idx < S::tile_rows * HD; idx += S::threads) {
            tile_element<HD>(keys, at.keys, stride, k0, end, idx);
            tile_element<HD>(values, at.values, stride, k0, end, idx);
        }
        __syncthreads();
        int n = (int)min64(S::tile_rows, end - k0);
        for (int j = 0; j < n; j++) {
            float s = row_sum<S::split>(part_dot(st.q, tile_part<HD>(keys, j, part))) * scale;
            forward_key(&st, s, k0 + j <= i && i < T, tile_part<HD>(values, j, part));
        }
    }
    forward_end(&st, at.out, at.lse, part, i < T);
}

/* ======================================================== backward: queries */

struct query_part {
    float q[PART], g[PART], dq[PART], lse, delta;
};

/* Returns this part's share of delta = d_out_i . out_i. */
static __host__ __device__ inline float query_begin(query_part *st, const float *q, const float *g, const float *out,
                                                    const float *lse, int valid)
{
    load_part(st->q, q, valid);
    load_part(st->g, g, valid);
UNROLL
    for (int d = 0; d < PART; d++) st->dq[d] = 0;
    st->lse = valid ? *lse : 0;
    float partial = 0;
UNROLL
    for (int d = 0; d < PART; d++) partial += st->g[d] * (valid ? out[d] : 0.0f);
    return partial;
}

/* Key j's score s (scaled), d_out_i . v_j, and key part k. */
static __host__ __device__ inline void query_key(query_part *st, float s, float dpv, int valid, const float *k,
                                                 float scale)
{
    if (!valid) return;
    float p = expf(s - st->lse), ds = p * (dpv - st->delta) * scale;
    part_axpy(st->dq, ds, k);
}

static __host__ __device__ inline void query_end(const query_part *st, float *dq, float *delta, int part, int valid)
{
    if (!valid) return;
UNROLL
    for (int d = 0; d < PART; d++) dq[d] = st->dq[d];
    if (part == 0) *delta = st->delta;
}

struct query_places {
    const float *keys, *values, *q, *g, *out, *lse;
    float *dq, *delta;
};

static __host__ __device__ inline query_places query_places_of(float *d_qkv, float *delta, const float *d_out,
                                                               const float *qkv, const float *out, const float *lse,
                                                               int64_t b, int64_t h, int64_t i, int part, int64_t T,
                                                               int64_t Hq, int64_t Hkv, int64_t hd)
{
    int64_t stride = (Hq + 2 * Hkv) * hd, kh = h / (Hq / Hkv), row = (b * T + i) * Hq * hd + h * hd + part * PART;
    const float *base = qkv + b * T * stride;
    query_places at;
    at.keys = base + (Hq + kh) * hd;
    at.values = base + (Hq + Hkv + kh) * hd;
    at.q = base + i * stride + h * hd + part * PART;
    at.g = d_out + row;
    at.out = out + row;
    at.lse = lse + (b * Hq + h) * T + i;
    at.dq = d_qkv + (b * T + i) * stride + h * hd + part * PART;
    at.delta = delta + (b * Hq + h) * T + i;
    return at;
}

/* Grid (ceil(T / rows), Hq, B). */
template <int HD>
__global__ void __launch_bounds__(tiling<HD>::threads)
    attention_queries_tiled(float *d_qkv, float *delta, const float *d_out, const float *qkv, const float *out,
                            const float *lse, int64_t T, int64_t Hq, int64_t Hkv, float scale)
{
    typedef tiling<HD> S;
    __shared__ __align__(16) float keys[TILE_FLOATS], values[TILE_FLOATS];
    int part = threadIdx.x % S::split, row = threadIdx.x / S::split;
    /* The last rows meet the most keys: their blocks first, so that no long block starts last. */
    int64_t b = blockIdx.z, h = blockIdx.y, first = (int64_t)(gridDim.x - 1 - blockIdx.x) * S::rows, i = first + row;
    int64_t stride = (Hq + 2 * Hkv) * HD, end = min64(T, first + S::rows);
    query_places at = query_places_of(d_qkv, delta, d_out, qkv, out, lse, b, h, i, part, T, Hq, Hkv, HD);
    query_part st;
    st.delta = row_sum<S::split>(query_begin(&st, at.q, at.g, at.out, at.lse, i < T));
    for (int64_t k0 = 0; k0 < end; k0 += S::tile_rows) {
        __syncthreads();
        for (int idx = threadIdx.x; idx < S::tile_rows * HD; idx += S::threads) {
            tile_element<HD>(keys, at.keys, stride, k0, end, idx);
            tile_element<HD>(values, at.values, stride, k0, end, idx);
        }
        __syncthreads();
        int n = (int)min64(S::tile_rows, end - k0);
        for (int j = 0; j < n; j++) {
            float s = row_sum<S::split>(part_dot(st.q, tile_part<HD>(keys, j, part))) * scale;
            float dpv = row_sum<S::split>(part_dot(st.g, tile_part<HD>(values, j, part)));
            query_key(&st, s, dpv, k0 + j <= i && i < T, tile_part<HD>(keys, j, part), scale);
        }
    }
    query_end(&st, at.dq, at.delta, part, i < T);
}

/* =========================================================== backward: keys */

struct key_part {
    float k[PART], v[PART], dk[PART], dv[PART];
};

static __host__ __device__ inline void key_begin(key_part *st, const float *k, const float *v, int valid)
{
    load_part(st->k, k, valid);
    load_part(st->v, v, valid);
UNROLL
    for (int d = 0; d < PART; d++) st->dk[d] = 0, st->dv[d] = 0;
}

/* Query row i's score s (scaled), d_out_i . v_j, its lse and delta, and
 * the parts of q_i and d_out_i. */
static __host__ __device__ inline void key_query(key_part *st, float s, float dpv, int valid, float lse, float delta,
                                                 const float *q, const float *g, float scale)
{
    if (!valid) return;
    float p = expf(s - lse), ds = p * (dpv - delta) * scale;
    part_axpy(st->dk, ds, q);
    part_axpy(st->dv, p, g);
}

static __host__ __device__ inline void key_end(const key_part *st, float *dk, float *dv, int valid)
{
    if (!valid) return;
UNROLL
    for (int d = 0; d < PART; d++) dk[d] = st->dk[d], dv[d] = st->dv[d];
}

/* Element idx (< tile_rows) of the lse and delta tiles: query rows from
 * q0 of head h. */
static __host__ __device__ inline void row_stats_element(float *lse_tile, float *delta_tile, const float *lse,
                                                         const float *delta, int64_t b, int64_t h, int64_t q0,
                                                         int64_t T, int64_t Hq, int idx)
{
    int64_t i = q0 + idx, at = (b * Hq + h) * T + i;
    lse_tile[idx] = i < T ? lse[at] : 0.0f;
    delta_tile[idx] = i < T ? delta[at] : 0.0f;
}

/* Where block (x, kh, b)'s thread of part `part` in key row j reads and
 * writes: the same for the kernel and the emulation. Query row i of head h
 * is at queries + i stride + h hd, its output gradient at grads + i Hq hd +
 * h hd. */
struct key_places {
    const float *k, *v, *queries, *grads;
    float *dk, *dv;
};

static __host__ __device__ inline key_places key_places_of(float *d_qkv, const float *d_out, const float *qkv,
                                                           int64_t b, int64_t kh, int64_t j, int part, int64_t T,
                                                           int64_t Hq, int64_t Hkv, int64_t hd)
{
    int64_t stride = (Hq + 2 * Hkv) * hd, row = (b * T + j) * stride + part * PART;
    key_places at;
    at.k = qkv + row + (Hq + kh) * hd;
    at.v = qkv + row + (Hq + Hkv + kh) * hd;
    at.queries = qkv + b * T * stride;
    at.grads = d_out + b * T * Hq * hd;
    at.dk = d_qkv + row + (Hq + kh) * hd;
    at.dv = d_qkv + row + (Hq + Hkv + kh) * hd;
    return at;
}

/* Grid (ceil(T / rows), Hkv, B): after the queries kernel (delta). */
template <int HD>
__global__ void __launch_bounds__(tiling<HD>::threads)
    attention_keys_tiled(float *d_qkv, const float *delta, const float *d_out, const float *qkv, const float *lse,
                         int64_t T, int64_t Hq, int64_t Hkv, float scale)
{
    typedef tiling<HD> S;
    __shared__ __align__(16) float queries[TILE_FLOATS], grads[TILE_FLOATS];
    __shared__ float lse_tile[S::tile_rows], delta_tile[S::tile_rows];
    int part = threadIdx.x % S::split, row = threadIdx.x / S::split;
    int64_t b = blockIdx.z, kh = blockIdx.y, first = (int64_t)blockIdx.x * S::rows, j = first + row;
    int64_t stride = (Hq + 2 * Hkv) * HD, group = Hq / Hkv;
    key_places at = key_places_of(d_qkv, d_out, qkv, b, kh, j, part, T, Hq, Hkv, HD);
    key_part st;
    key_begin(&st, at.k, at.v, j < T);
    for (int64_t h = kh * group; h < (kh + 1) * group; h++)
        for (int64_t q0 = first; q0 < T; q0 += S::tile_rows) {
            __syncthreads();
            for (int idx = threadIdx.x; idx < S::tile_rows * HD; idx += S::threads) {
                tile_element<HD>(queries, at.queries + h * HD, stride, q0, T, idx);
                tile_element<HD>(grads, at.grads + h * HD, Hq * HD, q0, T, idx);
            }
            for (int idx = threadIdx.x; idx < S::tile_rows; idx += S::threads)
                row_stats_element(lse_tile, delta_tile, lse, delta, b, h, q0, T, Hq, idx);
            __syncthreads();
            int n = (int)min64(S::tile_rows, T - q0);
            for (int ii = 0; ii < n; ii++) {
                float s = row_sum<S::split>(part_dot(st.k, tile_part<HD>(queries, ii, part))) * scale;
                float dpv = row_sum<S::split>(part_dot(st.v, tile_part<HD>(grads, ii, part)));
                key_query(&st, s, dpv, q0 + ii >= j && j < T, lse_tile[ii], delta_tile[ii],
                          tile_part<HD>(queries, ii, part), tile_part<HD>(grads, ii, part), scale);
            }
        }
    key_end(&st, at.dk, at.dv, j < T);
}

/* ================================================================ launches */

static cuda_attention_choice chosen = CUDA_ATTENTION_DEFAULT; /* cuda_attention_variant */

extern "C" int cuda_attention_variant(const char *name)
{
    if (!name || !name[0]) chosen = CUDA_ATTENTION_DEFAULT;
    else if (strcmp(name, "cudnn") == 0) chosen = CUDA_ATTENTION_CUDNN;
    else if (strcmp(name, "tiled") == 0) chosen = CUDA_ATTENTION_TILED;
    else if (strcmp(name, "rows") == 0) chosen = CUDA_ATTENTION_ROWS;
    else
        return tp_fail(TP_ERR_ARG, "TP_CUDA_ATTENTION: '%s' is not an attention variant (cudnn, tiled or rows)",
                       name);
    return TP_OK;
}

cuda_attention_choice cuda_attention_chosen(void)
{
    return chosen;
}

static int deterministic; /* cuda_deterministic_variant */

extern "C" int cuda_deterministic_variant(const char *value)
{
    if (!value || !value[0] || strcmp(value, "0") == 0) deterministic = 0;
    else if (strcmp(value, "1") == 0) deterministic = 1;
    else return tp_fail(TP_ERR_ARG, "TP_CUDA_DETERMINISTIC: '%s' is neither 1 nor 0", value);
    return TP_OK;
}

int cuda_deterministic_chosen(void)
{
    return deterministic;
}

extern "C" int cuda_attention_tiled_fits(int64_t B, int64_t Hq, int64_t hd)
{
    return (hd == 32 || hd == 64 || hd == 128 || hd == 256) && B >= 1 && B <= MAX_GRID_YZ && Hq >= 1 &&
           Hq <= MAX_GRID_YZ;
}

static int launch_failed(const char *what)
{
    cudaError_t error = cudaGetLastError();
    return error == cudaSuccess ? TP_OK : tp_fail(TP_ERR_DEVICE, "CUDA %s: %s", what, cudaGetErrorString(error));
}

template <int HD>
static int forward_launch(float *out, float *lse, const float *qkv, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                          float scale, cudaStream_t stream)
{
    dim3 grid((unsigned)((T + tiling<HD>::rows - 1) / tiling<HD>::rows), (unsigned)Hq, (unsigned)B);
    attention_forward_tiled<HD><<<grid, tiling<HD>::threads, 0, stream>>>(out, lse, qkv, T, Hq, Hkv, scale);
    return launch_failed("attention_forward_tiled");
}

template <int HD>
static int backward_launch(float *d_qkv, float *delta, const float *d_out, const float *qkv, const float *out,
                           const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, float scale,
                           cudaStream_t stream)
{
    unsigned tiles = (unsigned)((T + tiling<HD>::rows - 1) / tiling<HD>::rows);
    attention_queries_tiled<HD><<<dim3(tiles, (unsigned)Hq, (unsigned)B), tiling<HD>::threads, 0, stream>>>(
        d_qkv, delta, d_out, qkv, out, lse, T, Hq, Hkv, scale);
    TP_TRY(launch_failed("attention_queries_tiled"));
    attention_keys_tiled<HD><<<dim3(tiles, (unsigned)Hkv, (unsigned)B), tiling<HD>::threads, 0, stream>>>(
        d_qkv, delta, d_out, qkv, lse, T, Hq, Hkv, scale);
    return launch_failed("attention_keys_tiled");
}

int cuda_attention_tiled_forward(float *out, float *lse, const float *qkv, int64_t B, int64_t T, int64_t Hq,
                                 int64_t Hkv, int64_t hd, cudaStream_t stream)
{
    float scale = 1.0f / sqrtf((float)hd);
    switch (hd) {
    case 32: return forward_launch<32>(out, lse, qkv, B, T, Hq, Hkv, scale, stream);
    case 64: return forward_launch<64>(out, lse, qkv, B, T, Hq, Hkv, scale, stream);
    case 128: return forward_launch<128>(out, lse, qkv, B, T, Hq, Hkv, scale, stream);
    case 256: return forward_launch<256>(out, lse, qkv, B, T, Hq, Hkv, scale, stream);
    default: return tp_fail(TP_ERR_ARG, "tiled attention: head size %lld (32, 64, 128 or 256)", (long long)hd);
    }
}

int cuda_attention_tiled_backward(float *d_qkv, float *delta, const float *d_out, const float *qkv, const float *out,
                                  const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd,
                                  cudaStream_t stream)
{
    float scale = 1.0f / sqrtf((float)hd);
    switch (hd) {
    case 32: return backward_launch<32>(d_qkv, delta, d_out, qkv, out, lse, B, T, Hq, Hkv, scale, stream);
    case 64: return backward_launch<64>(d_qkv, delta, d_out, qkv, out, lse, B, T, Hq, Hkv, scale, stream);
    case 128: return backward_launch<128>(d_qkv, delta, d_out, qkv, out, lse, B, T, Hq, Hkv, scale, stream);
    case 256: return backward_launch<256>(d_qkv, delta, d_out, qkv, out, lse, B, T, Hq, Hkv, scale, stream);
    default: return tp_fail(TP_ERR_ARG, "tiled attention: head size %lld (32, 64, 128 or 256)", (long long)hd);
    }
}

/* =========================================================== CPU emulation
 * Each block in turn; within it, each phase between two __syncthreads for
 * every thread (the tile loads element by element), and each key (or
 * query) step for every row, its threads' partials summed as row_sum does. */

template <int HD>
static int emulate_forward(float *out, float *lse, const float *qkv, int64_t B, int64_t T, int64_t Hq, int64_t Hkv)
{
    typedef tiling<HD> S;
    float scale = 1.0f / sqrtf((float)HD), *keys = (float *)malloc(TILE_FLOATS * sizeof(float));
    float *values = (float *)malloc(TILE_FLOATS * sizeof(float));
    forward_part *st = (forward_part *)malloc(S::threads * sizeof *st);
    row_places *at = (row_places *)malloc(S::threads * sizeof *at);
    int status = keys && values && st && at ? TP_OK : tp_fail(TP_ERR_NOMEM, "tiled attention emulation: no memory");
    int64_t stride = (Hq + 2 * Hkv) * HD;
    for (int64_t b = 0; !status && b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t first = 0; first < T; first += S::rows) {
                int64_t end = min64(T, first + S::rows);
                for (int t = 0; t < S::threads; t++) {
                    int64_t i = first + t / S::split;
                    at[t] = forward_places(out, lse, qkv, b, h, i, t % S::split, T, Hq, Hkv, HD);
                    forward_begin(&st[t], at[t].q, i < T);
                }
                for (int64_t k0 = 0; k0 < end; k0 += S::tile_rows) {
                    for (int idx = 0; idx < S::tile_rows * HD; idx++) {
                        tile_element<HD>(keys, at[0].keys, stride, k0, end, idx);
                        tile_element<HD>(values, at[0].values, stride, k0, end, idx);
                    }
                    int n = (int)min64(S::tile_rows, end - k0);
                    for (int j = 0; j < n; j++)
                        for (int row = 0; row < S::rows; row++) {
                            int64_t i = first + row;
                            float s[S::split];
                            for (int p = 0; p < S::split; p++)
                                s[p] = part_dot(st[row * S::split + p].q, tile_part<HD>(keys, j, p));
                            row_sum_emulated<S::split>(s);
                            for (int p = 0; p < S::split; p++)
                                forward_key(&st[row * S::split + p], s[p] * scale, k0 + j <= i && i < T,
                                            tile_part<HD>(values, j, p));
                        }
                }
                for (int t = 0; t < S::threads; t++)
                    forward_end(&st[t], at[t].out, at[t].lse, t % S::split, first + t / S::split < T);
            }
    free(keys), free(values), free(st), free(at);
    return status;
}

/* A row's two sums in the backward kernels, emulated: s = a . tile_a's row
 * r and dpv = b . tile_b's row r, where a[p] and b[p] are the registers of
 * the row's thread p, each summed across the threads as row_sum does. */
template <int HD>
static void emulated_row_sums(const float *const *a, const float *const *b, const float *tile_a, const float *tile_b,
                              int r, float *s, float *dpv)
{
    const int split = tiling<HD>::split;
    for (int p = 0; p < split; p++) {
        s[p] = part_dot(a[p], tile_part<HD>(tile_a, r, p));
        dpv[p] = part_dot(b[p], tile_part<HD>(tile_b, r, p));
    }
    row_sum_emulated<split>(s);
    row_sum_emulated<split>(dpv);
}

template <int HD>
static int emulate_backward(float *d_qkv, float *delta, const float *d_out, const float *qkv, const float *out,
                            const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv)
{
    typedef tiling<HD> S;
    float scale = 1.0f / sqrtf((float)HD), *tile_a = (float *)malloc(TILE_FLOATS * sizeof(float));
    float *tile_b = (float *)malloc(TILE_FLOATS * sizeof(float));
    float lse_tile[S::tile_rows], delta_tile[S::tile_rows];
    query_part *qs = (query_part *)malloc(S::threads * sizeof *qs);
    query_places *qat = (query_places *)malloc(S::threads * sizeof *qat);
    key_part *ks = (key_part *)malloc(S::threads * sizeof *ks);
    key_places *kat = (key_places *)malloc(S::threads * sizeof *kat);
    int status = tile_a && tile_b && qs && qat && ks && kat ? TP_OK
                                                     : tp_fail(TP_ERR_NOMEM, "tiled attention emulation: no memory");
    int64_t stride = (Hq + 2 * Hkv) * HD, group = Hq / Hkv;
    /* The queries kernel's blocks (delta first: the keys kernel reads it). */
    for (int64_t b = 0; !status && b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t first = 0; first < T; first += S::rows) {
                int64_t end = min64(T, first + S::rows);
                for (int row = 0; row < S::rows; row++) {
                    int64_t i = first + row;
                    float partial[S::split];
                    for (int p = 0; p < S::split; p++) {
                        int t = row * S::split + p;
                        qat[t] = query_places_of(d_qkv, delta, d_out, qkv, out, lse, b, h, i, p, T, Hq, Hkv, HD);
                        partial[p] = query_begin(&qs[t], qat[t].q, qat[t].g, qat[t].out, qat[t].lse, i < T);
                    }
                    row_sum_emulated<S::split>(partial);
                    for (int p = 0; p < S::split; p++) qs[row * S::split + p].delta = partial[p];
                }
                for (int64_t k0 = 0; k0 < end; k0 += S::tile_rows) {
                    for (int idx = 0; idx < S::tile_rows * HD; idx++) {
                        tile_element<HD>(tile_a, qat[0].keys, stride, k0, end, idx);
                        tile_element<HD>(tile_b, qat[0].values, stride, k0, end, idx);
                    }
                    int n = (int)min64(S::tile_rows, end - k0);
                    for (int j = 0; j < n; j++)
                        for (int row = 0; row < S::rows; row++) {
                            int64_t i = first + row;
                            float s[S::split], dpv[S::split];
                            const float *q[S::split], *g[S::split];
                            for (int p = 0; p < S::split; p++)
                                q[p] = qs[row * S::split + p].q, g[p] = qs[row * S::split + p].g;
                            emulated_row_sums<HD>(q, g, tile_a, tile_b, j, s, dpv);
                            for (int p = 0; p < S::split; p++)
                                query_key(&qs[row * S::split + p], s[p] * scale, dpv[p], k0 + j <= i && i < T,
                                          tile_part<HD>(tile_a, j, p), scale);
                        }
                }
                for (int t = 0; t < S::threads; t++)
                    query_end(&qs[t], qat[t].dq, qat[t].delta, t % S::split, first + t / S::split < T);
            }
    /* The keys kernel's blocks. */
    for (int64_t b = 0; !status && b < B; b++)
        for (int64_t kh = 0; kh < Hkv; kh++)
            for (int64_t first = 0; first < T; first += S::rows) {
                for (int t = 0; t < S::threads; t++) {
                    int64_t j = first + t / S::split;
                    kat[t] = key_places_of(d_qkv, d_out, qkv, b, kh, j, t % S::split, T, Hq, Hkv, HD);
                    key_begin(&ks[t], kat[t].k, kat[t].v, j < T);
                }
                for (int64_t h = kh * group; h < (kh + 1) * group; h++)
                    for (int64_t q0 = first; q0 < T; q0 += S::tile_rows) {
                        for (int idx = 0; idx < S::tile_rows * HD; idx++) {
                            tile_element<HD>(tile_a, kat[0].queries + h * HD, stride, q0, T, idx);
                            tile_element<HD>(tile_b, kat[0].grads + h * HD, Hq * HD, q0, T, idx);
                        }
                        for (int idx = 0; idx < S::tile_rows; idx++)
                            row_stats_element(lse_tile, delta_tile, lse, delta, b, h, q0, T, Hq, idx);
                        int n = (int)min64(S::tile_rows, T - q0);
                        for (int ii = 0; ii < n; ii++)
                            for (int row = 0; row < S::rows; row++) {
                                int64_t j = first + row;
                                float s[S::split], dpv[S::split];
                                const float *k[S::split], *v[S::split];
                                for (int p = 0; p < S::split; p++)
                                    k[p] = ks[row * S::split + p].k, v[p] = ks[row * S::split + p].v;
                                emulated_row_sums<HD>(k, v, tile_a, tile_b, ii, s, dpv);
                                for (int p = 0; p < S::split; p++)
                                    key_query(&ks[row * S::split + p], s[p] * scale, dpv[p], q0 + ii >= j && j < T,
                                              lse_tile[ii], delta_tile[ii], tile_part<HD>(tile_a, ii, p),
                                              tile_part<HD>(tile_b, ii, p), scale);
                            }
                    }
                for (int t = 0; t < S::threads; t++) key_end(&ks[t], kat[t].dk, kat[t].dv, first + t / S::split < T);
            }
    free(tile_a), free(tile_b), free(qs), free(qat), free(ks), free(kat);
    return status;
}

static int emulation_fits(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd)
{
    if (!cuda_attention_tiled_fits(B, Hq, hd) || T < 0 || Hkv < 1 || Hq % Hkv != 0)
        return tp_fail(TP_ERR_ARG, "tiled attention: B=%lld T=%lld Hq=%lld Hkv=%lld hd=%lld do not fit", (long long)B,
                       (long long)T, (long long)Hq, (long long)Hkv, (long long)hd);
    return TP_OK;
}

extern "C" int cuda_attention_tiled_emulate_forward(float *out, float *lse, const float *qkv, int64_t B, int64_t T,
                                                    int64_t Hq, int64_t Hkv, int64_t hd)
{
    TP_TRY(emulation_fits(B, T, Hq, Hkv, hd));
    switch (hd) {
    case 32: return emulate_forward<32>(out, lse, qkv, B, T, Hq, Hkv);
    case 64: return emulate_forward<64>(out, lse, qkv, B, T, Hq, Hkv);
    case 128: return emulate_forward<128>(out, lse, qkv, B, T, Hq, Hkv);
    default: return emulate_forward<256>(out, lse, qkv, B, T, Hq, Hkv);
    }
}

extern "C" int cuda_attention_tiled_emulate_backward(float *d_qkv, float *delta, const float *d_out, const float *qkv,
                                                     const float *out, const float *lse, int64_t B, int64_t T,
                                                     int64_t Hq, int64_t Hkv, int64_t hd)
{
    TP_TRY(emulation_fits(B, T, Hq, Hkv, hd));
    switch (hd) {
    case 32: return emulate_backward<32>(d_qkv, delta, d_out, qkv, out, lse, B, T, Hq, Hkv);
    case 64: return emulate_backward<64>(d_qkv, delta, d_out, qkv, out, lse, B, T, Hq, Hkv);
    case 128: return emulate_backward<128>(d_qkv, delta, d_out, qkv, out, lse, B, T, Hq, Hkv);
    default: return emulate_backward<256>(d_qkv, delta, d_out, qkv, out, lse, B, T, Hq, Hkv);
    }
}
