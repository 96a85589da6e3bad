/* attention_tiled.cu: causal attention in tiles (flash-style), fp32 on the
 * CUDA cores, for head sizes of 32, 64, 128 and 256.
 *
 * Why: the profile of a GPT-2 124M step on an H200 (docs/BENCHMARKS.md) put
 * 94% of the GPU's time in the rows attention (attention.cu), which gives
 * each row a warp and sums every score across the warp with five shuffles.
 * Here a row has hd / 16 threads, each holding 16 of its dimensions in
 * registers; a block of rows reads the rows it meets (keys and values, or
 * queries and output gradients) a tile at a time from shared memory, every
 * thread of a row's part reading the same shared part at once (a
 * broadcast). A score is each thread's 16 products then log2(hd / 16)
 * shuffles.
 *
 * Each thread holds the same part of several rows (ROWS_FORWARD in the
 * forward, ROWS_BACKWARD in the backward's kernels): a part read from
 * shared memory into registers once serves all of them. The forward's rows
 * may be chosen (TP_CUDA_TILED_FORWARD_ROWS: 2, 3 or 4): 4 rows take about
 * 226 registers, 2 blocks an SM; 3 about 168 (3 blocks), 2 about 127 (4
 * blocks), none spilling; and the backward's (TP_CUDA_TILED_BACKWARD_ROWS:
 * 1 or 2; at 2 the keys kernel takes about 216 registers, 2 blocks); which
 * is fastest is the GPU's to say. With one row a
 * thread, the kernels made a 16-byte shared load for every 4
 * multiply-adds (twice that in the backward, which read each part twice),
 * and ran at about a fifth of the GPU's fp32 rate: the shared loads, not
 * the arithmetic, set the pace. A warp's rows are consecutive, and a warp
 * stops at its last row's keys (the causal mask's other side is not
 * computed); the block's rows share the tiles.
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
 * The per-row work is written once, in __host__ __device__ functions on a
 * row's part; the kernels and their CPU emulation
 * (cuda_attention_tiled_emulate_*) both call them, the emulation doing a
 * row's cross-thread sums in the shuffles' order. Which thread holds a row,
 * and which keys a warp skips because the mask hides them, change no
 * row's arithmetic: a row meets its keys in order either way. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "../../common/error.h"
}
#include "attention_kernels.h"
#include "attention_tiled.h"
#include "internal.h"

#define PART 16          /* head dimensions per thread */
#define PART_STRIDE 20   /* floats of a part in shared memory: 4 of padding put a row's parts in other banks */
#define TILE_FLOATS 5120 /* one shared tile: 256 parts of PART_STRIDE floats, 20 KiB */
#define THREADS 128      /* a block's threads */
#define ROWS_FORWARD 4   /* rows a thread holds in the forward (2 x 16 floats of state each), unless chosen */
#define ROWS_BACKWARD 2  /* and in the backward's kernels (3 and 4 x 16 floats each), unless chosen */

/* The shared tiles for a head size HD: a row's `split` parts, each of
 * PART_STRIDE floats, `row_floats` a row; `tile_rows` rows a tile (so that
 * a tile is TILE_FLOATS). */
template <int HD> struct tile_layout {
    static constexpr int split = HD / PART;
    static constexpr int row_floats = split * PART_STRIDE;
    static constexpr int tile_rows = TILE_FLOATS / row_floats;
};

/* The shape of a kernel for a head size HD and R rows a thread: a row's
 * `split` threads, THREADS threads holding `rows` rows a block (query rows
 * in the forward and queries kernels, key rows in the keys kernel), thread
 * t the part t % split of rows (t / split) R to (t / split) R + R - 1 of
 * the block, so that a warp holds `warp_rows` consecutive rows. */
template <int HD, int R> struct tiling : tile_layout<HD> {
    static constexpr int rows = THREADS / tile_layout<HD>::split * R;
    static constexpr int warp_rows = 32 / tile_layout<HD>::split * R;
};

/* Element idx (< tile_rows HD) of a tile: row r = idx / HD of the matrix
 * src (row stride `stride`) counted from `first`, zero at or past `limit`,
 * to its place in shared memory (part by part, PART_STRIDE apart). */
template <int HD>
static __host__ __device__ inline void tile_element(float *tile, const float *src, int64_t stride, int64_t first,
                                                    int64_t limit, int idx)
{
    int r = idx / HD, d = idx % HD;
    int64_t row = first + r;
    tile[r * tile_layout<HD>::row_floats + (d / PART) * PART_STRIDE + d % PART] =
        row < limit ? src[row * stride + d] : 0.0f;
}

/* A row's part in shared memory. */
template <int HD> static __host__ __device__ inline const float *tile_part(const float *tile, int row, int part)
{
    return tile + row * tile_layout<HD>::row_floats + part * PART_STRIDE;
}

/* A part in shared memory into registers, four floats a load (parts and
 * rows start at multiples of 4 floats, tiles are aligned). */
static __host__ __device__ inline void read_part(float *mine, const float *shared_part)
{
#ifdef __CUDA_ARCH__
UNROLL
    for (int d = 0; d < PART; d += 4) {
        float4 t = *reinterpret_cast<const float4 *>(shared_part + d);
        mine[d] = t.x, mine[d + 1] = t.y, mine[d + 2] = t.z, mine[d + 3] = t.w;
    }
#else
    memcpy(mine, shared_part, PART * sizeof(float));
#endif
}

/* a . b over a part, summed in order of d. */
static __host__ __device__ inline float part_dot(const float *a, const float *b)
{
    float sum = 0;
UNROLL
    for (int d = 0; d < PART; d++) sum += a[d] * b[d];
    return sum;
}

/* acc += a x over a part. */
static __host__ __device__ inline void part_axpy(float *acc, float a, const float *x)
{
UNROLL
    for (int d = 0; d < PART; d++) acc[d] += a * x[d];
}

/* PART values from global memory, or zeros for a row past the end. */
static __host__ __device__ inline void load_part(float *mine, const float *src, int valid)
{
UNROLL
    for (int d = 0; d < PART; d++) mine[d] = valid ? src[d] : 0.0f;
}

/* The sum of a row's SPLIT threads' values, on each of them: butterfly
 * pairs, offsets 1, 2, 4... (every thread of the warp takes part). */
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

/* Thread t's rows: the first of the R it holds; and how many of a tile's
 * rows its warp meets. A warp meets a row (a key in the forward and
 * queries kernels, a query in the keys kernel) when the mask leaves it to
 * one of the warp's rows at least: in the forward and queries kernels the
 * keys up to the warp's last row (below T), an end; in the keys kernel the
 * queries from the warp's first row, a start. Warp-uniform, as the shuffles
 * need. */
template <int HD, int R> static __host__ __device__ inline int64_t thread_first_row(int64_t block_first, int t)
{
    return block_first + (int64_t)(t / tiling<HD, R>::split) * R;
}

template <int HD, int R>
static __host__ __device__ inline int warp_end(int64_t block_first, int t, int64_t T, int64_t k0, int n)
{
    int64_t warp_first = block_first + (int64_t)(t / 32) * tiling<HD, R>::warp_rows;
    if (warp_first >= T) return 0; /* the last block's warps past the sequence */
    int64_t warp_last = min64(T, warp_first + tiling<HD, R>::warp_rows) - 1;
    return (int)max64(0, min64(n, warp_last - k0 + 1));
}

template <int HD, int R> static __host__ __device__ inline int warp_start(int64_t block_first, int t, int64_t q0, int n)
{
    int64_t warp_first = block_first + (int64_t)(t / 32) * tiling<HD, R>::warp_rows;
    return (int)min64(n, max64(0, warp_first - q0));
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

/* A thread's R rows from i0: row r's query part at at->q + r stride, its
 * output part at at->out + r out_stride, its lse at at->lse + r. */
template <int R>
static __host__ __device__ inline void forward_rows_begin(forward_part *st, const float *q, int64_t i0, int64_t stride,
                                                          int64_t T)
{
UNROLL
    for (int r = 0; r < R; r++) forward_begin(&st[r], q + r * stride, i0 + r < T);
}

template <int R>
static __host__ __device__ inline void forward_rows_end(const forward_part *st, float *out, float *lse, int part,
                                                        int64_t i0, int64_t out_stride, int64_t T)
{
UNROLL
    for (int r = 0; r < R; r++) forward_end(&st[r], out + r * out_stride, lse + r, part, i0 + r < T);
}

/* Where part `part` of query row i of head h, batch b, reads and writes:
 * the same for the kernel and the emulation. */
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

/* Grid (ceil(T / rows), Hq, B); block THREADS. */
template <int HD, int R>
__global__ void __launch_bounds__(THREADS)
    attention_forward_tiled(float *out, float *lse, const float *qkv, int64_t T, int64_t Hq, int64_t Hkv, float scale)
{
    typedef tiling<HD, R> S;
    __shared__ __align__(16) float keys[TILE_FLOATS], values[TILE_FLOATS];
    int part = threadIdx.x % S::split;
    /* The last rows meet the most keys: their blocks first, so that no long block starts last. */
    int64_t b = blockIdx.z, h = blockIdx.y, first = (int64_t)(gridDim.x - 1 - blockIdx.x) * S::rows;
    int64_t i0 = thread_first_row<HD, R>(first, threadIdx.x);
    int64_t stride = (Hq + 2 * Hkv) * HD, end = min64(T, first + S::rows);
    row_places at = forward_places(out, lse, qkv, b, h, i0, part, T, Hq, Hkv, HD);
    forward_part st[R];
    forward_rows_begin<R>(st, at.q, i0, stride, T);
    for (int64_t k0 = 0; k0 < end; k0 += S::tile_rows) {
        __syncthreads(); /* every thread is done with the last tile */
        for (int idx = threadIdx.x; idx < S::tile_rows * HD; idx += THREADS) {
            tile_element<HD>(keys, at.keys, stride, k0, end, idx);
            tile_element<HD>(values, at.values, stride, k0, end, idx);
        }
        __syncthreads();
        int n = warp_end<HD, R>(first, threadIdx.x, T, k0, (int)min64(S::tile_rows, end - k0));
        for (int j = 0; j < n; j++) {
            float part_of[PART], s[R];
            read_part(part_of, tile_part<HD>(keys, j, part));
UNROLL
            for (int r = 0; r < R; r++) s[r] = part_dot(st[r].q, part_of);
UNROLL
            for (int r = 0; r < R; r++) s[r] = row_sum<S::split>(s[r]) * scale;
            read_part(part_of, tile_part<HD>(values, j, part));
UNROLL
            for (int r = 0; r < R; r++) forward_key(&st[r], s[r], k0 + j <= i0 + r && i0 + r < T, part_of);
        }
    }
    forward_rows_end<R>(st, at.out, at.lse, part, i0, Hq * HD, T);
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

/* A thread's R rows from i0 (their parts at r stride in qkv and d_qkv, r
 * out_stride in d_out and out, r in lse and delta); partial[r] row r's
 * share of delta. */
template <int R>
static __host__ __device__ inline void query_rows_begin(query_part *st, float *partial, const float *q, const float *g,
                                                        const float *out, const float *lse, int64_t i0, int64_t stride,
                                                        int64_t out_stride, int64_t T)
{
UNROLL
    for (int r = 0; r < R; r++)
        partial[r] = query_begin(&st[r], q + r * stride, g + r * out_stride, out + r * out_stride, lse + r, i0 + r < T);
}

template <int R>
static __host__ __device__ inline void query_rows_end(const query_part *st, float *dq, float *delta, int part,
                                                      int64_t i0, int64_t stride, int64_t T)
{
UNROLL
    for (int r = 0; r < R; r++) query_end(&st[r], dq + r * stride, delta + r, part, i0 + r < T);
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

/* Grid (ceil(T / rows), Hq, B); block THREADS. */
template <int HD, int R>
__global__ void __launch_bounds__(THREADS)
    attention_queries_tiled(float *d_qkv, float *delta, const float *d_out, const float *qkv, const float *out,
                            const float *lse, int64_t T, int64_t Hq, int64_t Hkv, float scale)
{
    typedef tiling<HD, R> S;
    __shared__ __align__(16) float keys[TILE_FLOATS], values[TILE_FLOATS];
    int part = threadIdx.x % S::split;
    /* The last rows meet the most keys: their blocks first, so that no long block starts last. */
    int64_t b = blockIdx.z, h = blockIdx.y, first = (int64_t)(gridDim.x - 1 - blockIdx.x) * S::rows;
    int64_t i0 = thread_first_row<HD, R>(first, threadIdx.x);
    int64_t stride = (Hq + 2 * Hkv) * HD, end = min64(T, first + S::rows), out_stride = Hq * HD;
    query_places at = query_places_of(d_qkv, delta, d_out, qkv, out, lse, b, h, i0, part, T, Hq, Hkv, HD);
    query_part st[R];
    float partial[R];
    query_rows_begin<R>(st, partial, at.q, at.g, at.out, at.lse, i0, stride, out_stride, T);
UNROLL
    for (int r = 0; r < R; r++) st[r].delta = row_sum<S::split>(partial[r]);
    for (int64_t k0 = 0; k0 < end; k0 += S::tile_rows) {
        __syncthreads();
        for (int idx = threadIdx.x; idx < S::tile_rows * HD; idx += THREADS) {
            tile_element<HD>(keys, at.keys, stride, k0, end, idx);
            tile_element<HD>(values, at.values, stride, k0, end, idx);
        }
        __syncthreads();
        int n = warp_end<HD, R>(first, threadIdx.x, T, k0, (int)min64(S::tile_rows, end - k0));
        for (int j = 0; j < n; j++) {
            float k[PART], v[PART], s[R], dpv[R];
            read_part(k, tile_part<HD>(keys, j, part));
            read_part(v, tile_part<HD>(values, j, part));
UNROLL
            for (int r = 0; r < R; r++) s[r] = part_dot(st[r].q, k), dpv[r] = part_dot(st[r].g, v);
UNROLL
            for (int r = 0; r < R; r++)
                s[r] = row_sum<S::split>(s[r]) * scale, dpv[r] = row_sum<S::split>(dpv[r]);
UNROLL
            for (int r = 0; r < R; r++)
                query_key(&st[r], s[r], dpv[r], k0 + j <= i0 + r && i0 + r < T, k, scale);
        }
    }
    query_rows_end<R>(st, at.dq, at.delta, part, i0, stride, T);
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

/* A thread's R key rows from j0 (their parts at r stride in qkv and d_qkv). */
template <int R>
static __host__ __device__ inline void key_rows_begin(key_part *st, const float *k, const float *v, int64_t j0,
                                                      int64_t stride, int64_t T)
{
UNROLL
    for (int r = 0; r < R; r++) key_begin(&st[r], k + r * stride, v + r * stride, j0 + r < T);
}

template <int R>
static __host__ __device__ inline void key_rows_end(const key_part *st, float *dk, float *dv, int64_t j0, int64_t stride,
                                                    int64_t T)
{
UNROLL
    for (int r = 0; r < R; r++) key_end(&st[r], dk + r * stride, dv + r * stride, j0 + r < T);
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

/* Where part `part` of key row j of key/value head kh, batch b, reads and
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

/* Grid (ceil(T / rows), Hkv, B), block THREADS: after the queries kernel
 * (delta). */
template <int HD, int R>
__global__ void __launch_bounds__(THREADS)
    attention_keys_tiled(float *d_qkv, const float *delta, const float *d_out, const float *qkv, const float *lse,
                         int64_t T, int64_t Hq, int64_t Hkv, float scale)
{
    typedef tiling<HD, R> S;
    __shared__ __align__(16) float queries[TILE_FLOATS], grads[TILE_FLOATS];
    __shared__ float lse_tile[S::tile_rows], delta_tile[S::tile_rows];
    int part = threadIdx.x % S::split;
    int64_t b = blockIdx.z, kh = blockIdx.y, first = (int64_t)blockIdx.x * S::rows;
    int64_t j0 = thread_first_row<HD, R>(first, threadIdx.x);
    int64_t stride = (Hq + 2 * Hkv) * HD, group = Hq / Hkv;
    key_places at = key_places_of(d_qkv, d_out, qkv, b, kh, j0, part, T, Hq, Hkv, HD);
    key_part st[R];
    key_rows_begin<R>(st, at.k, at.v, j0, stride, T);
    for (int64_t h = kh * group; h < (kh + 1) * group; h++)
        for (int64_t q0 = first; q0 < T; q0 += S::tile_rows) {
            __syncthreads();
            for (int idx = threadIdx.x; idx < S::tile_rows * HD; idx += THREADS) {
                tile_element<HD>(queries, at.queries + h * HD, stride, q0, T, idx);
                tile_element<HD>(grads, at.grads + h * HD, Hq * HD, q0, T, idx);
            }
            for (int idx = threadIdx.x; idx < S::tile_rows; idx += THREADS)
                row_stats_element(lse_tile, delta_tile, lse, delta, b, h, q0, T, Hq, idx);
            __syncthreads();
            int n = (int)min64(S::tile_rows, T - q0);
            for (int ii = warp_start<HD, R>(first, threadIdx.x, q0, n); ii < n; ii++) {
                float q[PART], g[PART], s[R], dpv[R];
                read_part(q, tile_part<HD>(queries, ii, part));
                read_part(g, tile_part<HD>(grads, ii, part));
UNROLL
                for (int r = 0; r < R; r++) s[r] = part_dot(st[r].k, q), dpv[r] = part_dot(st[r].v, g);
UNROLL
                for (int r = 0; r < R; r++)
                    s[r] = row_sum<S::split>(s[r]) * scale, dpv[r] = row_sum<S::split>(dpv[r]);
UNROLL
                for (int r = 0; r < R; r++)
                    key_query(&st[r], s[r], dpv[r], q0 + ii >= j0 + r && j0 + r < T, lse_tile[ii], delta_tile[ii], q,
                              g, scale);
            }
        }
    key_rows_end<R>(st, at.dk, at.dv, j0, stride, T);
}

/* ================================================================ launches */

static cuda_attention_choice chosen = CUDA_ATTENTION_DEFAULT; /* cuda_attention_variant */

extern "C" int cuda_attention_variant(const char *name)
{
    if (!name || !name[0]) chosen = CUDA_ATTENTION_DEFAULT;
    else if (strcmp(name, "cudnn") == 0) chosen = CUDA_ATTENTION_CUDNN;
    else if (strcmp(name, "tiled") == 0) chosen = CUDA_ATTENTION_TILED;
    else if (strcmp(name, "rows") == 0) chosen = CUDA_ATTENTION_ROWS;
    else if (strcmp(name, "tf32x3") == 0) chosen = CUDA_ATTENTION_TF32X3;
    else
        return tp_fail(TP_ERR_ARG,
                       "TP_CUDA_ATTENTION: '%s' is not an attention variant (cudnn, tiled, rows or tf32x3)", name);
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

/* A choice of rows a thread from `value` (variable's): unset or "" is 0
 * (the default), else one digit from lowest to highest. */
static int rows_choice(int *chosen, const char *value, const char *variable, int lowest, int highest)
{
    if (!value || !value[0]) *chosen = 0;
    else if (!value[1] && value[0] >= '0' + lowest && value[0] <= '0' + highest) *chosen = value[0] - '0';
    else return tp_fail(TP_ERR_ARG, "%s: '%s' is not a number of rows from %d to %d", variable, value, lowest, highest);
    return TP_OK;
}

static int chosen_rows;          /* cuda_tiled_forward_rows_variant: 2, 3 or 4, or 0 when unset */
static int chosen_backward_rows; /* cuda_tiled_backward_rows_variant: 1 or 2, or 0 when unset */

extern "C" int cuda_tiled_forward_rows_variant(const char *value)
{
    return rows_choice(&chosen_rows, value, "TP_CUDA_TILED_FORWARD_ROWS", 2, 4);
}

extern "C" int cuda_tiled_backward_rows_variant(const char *value)
{
    return rows_choice(&chosen_backward_rows, value, "TP_CUDA_TILED_BACKWARD_ROWS", 1, 2);
}

int cuda_tiled_forward_rows_chosen(void)
{
    return chosen_rows;
}

int cuda_tiled_backward_rows_chosen(void)
{
    return chosen_backward_rows;
}

/* The rows a thread of the forward and of the backward's kernels: the
 * chosen, else ROWS_FORWARD and ROWS_BACKWARD. */
static int forward_rows(void)
{
    return chosen_rows ? chosen_rows : ROWS_FORWARD;
}

static int backward_rows(void)
{
    return chosen_backward_rows ? chosen_backward_rows : ROWS_BACKWARD;
}

extern "C" int cuda_attention_tiled_fits(int64_t B, int64_t Hq, int64_t hd)
{
    return (hd == 32 || hd == 64 || hd == 128 || hd == 256) && attention_grid_fits(B, Hq);
}

template <int HD, int R>
static int forward_launch_rows(float *out, float *lse, const float *qkv, int64_t B, int64_t T, int64_t Hq,
                               int64_t Hkv, float scale, cudaStream_t stream)
{
    const int rows = tiling<HD, R>::rows;
    dim3 grid((unsigned)((T + rows - 1) / rows), (unsigned)Hq, (unsigned)B);
    attention_forward_tiled<HD, R><<<grid, THREADS, 0, stream>>>(out, lse, qkv, T, Hq, Hkv, scale);
    return attention_launch_status("attention_forward_tiled");
}

template <int HD>
static int forward_launch(float *out, float *lse, const float *qkv, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                          float scale, cudaStream_t stream)
{
    switch (forward_rows()) {
    case 2: return forward_launch_rows<HD, 2>(out, lse, qkv, B, T, Hq, Hkv, scale, stream);
    case 3: return forward_launch_rows<HD, 3>(out, lse, qkv, B, T, Hq, Hkv, scale, stream);
    default: return forward_launch_rows<HD, 4>(out, lse, qkv, B, T, Hq, Hkv, scale, stream);
    }
}

template <int HD, int R>
static int backward_launch_rows(float *d_qkv, float *delta, const float *d_out, const float *qkv, const float *out,
                                const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, float scale,
                                cudaStream_t stream)
{
    const int rows = tiling<HD, R>::rows;
    unsigned tiles = (unsigned)((T + rows - 1) / rows);
    attention_queries_tiled<HD, R><<<dim3(tiles, (unsigned)Hq, (unsigned)B), THREADS, 0, stream>>>(
        d_qkv, delta, d_out, qkv, out, lse, T, Hq, Hkv, scale);
    TP_TRY(attention_launch_status("attention_queries_tiled"));
    attention_keys_tiled<HD, R><<<dim3(tiles, (unsigned)Hkv, (unsigned)B), THREADS, 0, stream>>>(
        d_qkv, delta, d_out, qkv, lse, T, Hq, Hkv, scale);
    return attention_launch_status("attention_keys_tiled");
}

template <int HD>
static int backward_launch(float *d_qkv, float *delta, const float *d_out, const float *qkv, const float *out,
                           const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, float scale,
                           cudaStream_t stream)
{
    if (backward_rows() == 1)
        return backward_launch_rows<HD, 1>(d_qkv, delta, d_out, qkv, out, lse, B, T, Hq, Hkv, scale, stream);
    return backward_launch_rows<HD, 2>(d_qkv, delta, d_out, qkv, out, lse, B, T, Hq, Hkv, scale, stream);
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
 * Each block in turn, its THREADS threads holding the kernel's rows; within
 * the block, each phase between two __syncthreads for every thread (the
 * tile loads element by element), and each key (or query) step for every
 * group of a row's threads over the rows its warp meets, the group's
 * partials summed as row_sum does. Blocks and groups are independent (one
 * writer an element): their order is the emulation's. */

/* The partials of a group's `split` threads for their R rows, summed
 * across the threads as row_sum does: sums[p R + r] is thread p's. */
template <int SPLIT, int R> static void group_sums_emulated(float *sums)
{
    for (int r = 0; r < R; r++) {
        float values[SPLIT];
        for (int p = 0; p < SPLIT; p++) values[p] = sums[p * R + r];
        row_sum_emulated<SPLIT>(values);
        for (int p = 0; p < SPLIT; p++) sums[p * R + r] = values[p];
    }
}

/* A group's two sums for each of its rows at a tile's row `row`: s = a .
 * tile_a's row and dpv = b . tile_b's, where a[p R + r] and b[p R + r] are
 * the registers of thread p's row r, each summed across the group's threads
 * as row_sum does (the backward kernels' two scores). */
template <int HD, int R>
static void group_dots_emulated(const float *const *a, const float *const *b, const float *tile_a, const float *tile_b,
                                int row, float *s, float *dpv)
{
    const int split = HD / PART;
    for (int p = 0; p < split; p++)
        for (int r = 0; r < R; r++) {
            s[p * R + r] = part_dot(a[p * R + r], tile_part<HD>(tile_a, row, p));
            dpv[p * R + r] = part_dot(b[p * R + r], tile_part<HD>(tile_b, row, p));
        }
    group_sums_emulated<split, R>(s);
    group_sums_emulated<split, R>(dpv);
}

template <int HD, int R>
static int emulate_forward_rows(float *out, float *lse, const float *qkv, int64_t B, int64_t T, int64_t Hq,
                                int64_t Hkv)
{
    typedef tiling<HD, R> S;
    const int split = S::split;
    float scale = 1.0f / sqrtf((float)HD), *keys = (float *)malloc(TILE_FLOATS * sizeof(float));
    float *values = (float *)malloc(TILE_FLOATS * sizeof(float));
    forward_part *st = (forward_part *)malloc(THREADS * R * sizeof *st); /* thread t's row r at t R + r */
    row_places *at = (row_places *)malloc(THREADS * sizeof *at);
    int status = keys && values && st && at ? TP_OK : tp_fail(TP_ERR_NOMEM, "tiled attention emulation: no memory");
    int64_t stride = (Hq + 2 * Hkv) * HD;
    for (int64_t b = 0; !status && b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t first = 0; first < T; first += S::rows) {
                int64_t end = min64(T, first + S::rows);
                for (int t = 0; t < THREADS; t++) {
                    int64_t i0 = thread_first_row<HD, R>(first, t);
                    at[t] = forward_places(out, lse, qkv, b, h, i0, t % split, T, Hq, Hkv, HD);
                    forward_rows_begin<R>(&st[t * R], at[t].q, i0, stride, T);
                }
                for (int64_t k0 = 0; k0 < end; k0 += S::tile_rows) {
                    for (int idx = 0; idx < S::tile_rows * HD; idx++) {
                        tile_element<HD>(keys, at[0].keys, stride, k0, end, idx);
                        tile_element<HD>(values, at[0].values, stride, k0, end, idx);
                    }
                    for (int t0 = 0; t0 < THREADS; t0 += split) { /* a group: one set of rows, its split parts */
                        int64_t i0 = thread_first_row<HD, R>(first, t0);
                        int n = warp_end<HD, R>(first, t0, T, k0, (int)min64(S::tile_rows, end - k0));
                        for (int j = 0; j < n; j++) {
                            float s[split * R];
                            for (int p = 0; p < split; p++)
                                for (int r = 0; r < R; r++)
                                    s[p * R + r] = part_dot(st[(t0 + p) * R + r].q, tile_part<HD>(keys, j, p));
                            group_sums_emulated<split, R>(s);
                            for (int p = 0; p < split; p++)
                                for (int r = 0; r < R; r++)
                                    forward_key(&st[(t0 + p) * R + r], s[p * R + r] * scale,
                                                k0 + j <= i0 + r && i0 + r < T, tile_part<HD>(values, j, p));
                        }
                    }
                }
                for (int t = 0; t < THREADS; t++)
                    forward_rows_end<R>(&st[t * R], at[t].out, at[t].lse, t % split,
                                        thread_first_row<HD, R>(first, t), Hq * HD, T);
            }
    free(keys), free(values), free(st), free(at);
    return status;
}

template <int HD>
static int emulate_forward(float *out, float *lse, const float *qkv, int64_t B, int64_t T, int64_t Hq, int64_t Hkv)
{
    switch (forward_rows()) {
    case 2: return emulate_forward_rows<HD, 2>(out, lse, qkv, B, T, Hq, Hkv);
    case 3: return emulate_forward_rows<HD, 3>(out, lse, qkv, B, T, Hq, Hkv);
    default: return emulate_forward_rows<HD, 4>(out, lse, qkv, B, T, Hq, Hkv);
    }
}

template <int HD, int R>
static int emulate_backward_rows(float *d_qkv, float *delta, const float *d_out, const float *qkv, const float *out,
                                 const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv)
{
    typedef tiling<HD, R> S;
    const int split = S::split;
    float scale = 1.0f / sqrtf((float)HD), *tile_a = (float *)malloc(TILE_FLOATS * sizeof(float));
    float *tile_b = (float *)malloc(TILE_FLOATS * sizeof(float));
    float lse_tile[S::tile_rows], delta_tile[S::tile_rows];
    query_part *qs = (query_part *)malloc(THREADS * R * sizeof *qs); /* thread t's row r at t R + r */
    query_places *qat = (query_places *)malloc(THREADS * sizeof *qat);
    key_part *ks = (key_part *)malloc(THREADS * R * sizeof *ks);
    key_places *kat = (key_places *)malloc(THREADS * sizeof *kat);
    int status = tile_a && tile_b && qs && qat && ks && kat ? TP_OK
                                                     : tp_fail(TP_ERR_NOMEM, "tiled attention emulation: no memory");
    int64_t stride = (Hq + 2 * Hkv) * HD, out_stride = Hq * HD, group = Hq / Hkv;
    /* The queries kernel's blocks (delta first: the keys kernel reads it). */
    for (int64_t b = 0; !status && b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t first = 0; first < T; first += S::rows) {
                int64_t end = min64(T, first + S::rows);
                for (int t0 = 0; t0 < THREADS; t0 += split) {
                    int64_t i0 = thread_first_row<HD, R>(first, t0);
                    float partial[split * R];
                    for (int p = 0; p < split; p++) {
                        int t = t0 + p;
                        qat[t] = query_places_of(d_qkv, delta, d_out, qkv, out, lse, b, h, i0, p, T, Hq, Hkv, HD);
                        query_rows_begin<R>(&qs[t * R], &partial[p * R], qat[t].q, qat[t].g, qat[t].out, qat[t].lse, i0,
                                            stride, out_stride, T);
                    }
                    group_sums_emulated<split, R>(partial);
                    for (int p = 0; p < split; p++)
                        for (int r = 0; r < R; r++) qs[(t0 + p) * R + r].delta = partial[p * R + r];
                }
                for (int64_t k0 = 0; k0 < end; k0 += S::tile_rows) {
                    for (int idx = 0; idx < S::tile_rows * HD; idx++) {
                        tile_element<HD>(tile_a, qat[0].keys, stride, k0, end, idx);
                        tile_element<HD>(tile_b, qat[0].values, stride, k0, end, idx);
                    }
                    for (int t0 = 0; t0 < THREADS; t0 += split) {
                        int64_t i0 = thread_first_row<HD, R>(first, t0);
                        int n = warp_end<HD, R>(first, t0, T, k0, (int)min64(S::tile_rows, end - k0));
                        const float *q[split * R], *g[split * R];
                        for (int x = 0; x < split * R; x++) q[x] = qs[t0 * R + x].q, g[x] = qs[t0 * R + x].g;
                        for (int j = 0; j < n; j++) {
                            float s[split * R], dpv[split * R];
                            group_dots_emulated<HD, R>(q, g, tile_a, tile_b, j, s, dpv);
                            for (int p = 0; p < split; p++)
                                for (int r = 0; r < R; r++)
                                    query_key(&qs[(t0 + p) * R + r], s[p * R + r] * scale, dpv[p * R + r],
                                              k0 + j <= i0 + r && i0 + r < T, tile_part<HD>(tile_a, j, p), scale);
                        }
                    }
                }
                for (int t = 0; t < THREADS; t++)
                    query_rows_end<R>(&qs[t * R], qat[t].dq, qat[t].delta, t % split,
                                      thread_first_row<HD, R>(first, t), stride, T);
            }
    /* The keys kernel's blocks. */
    for (int64_t b = 0; !status && b < B; b++)
        for (int64_t kh = 0; kh < Hkv; kh++)
            for (int64_t first = 0; first < T; first += S::rows) {
                for (int t = 0; t < THREADS; t++) {
                    int64_t j0 = thread_first_row<HD, R>(first, t);
                    kat[t] = key_places_of(d_qkv, d_out, qkv, b, kh, j0, t % split, T, Hq, Hkv, HD);
                    key_rows_begin<R>(&ks[t * R], kat[t].k, kat[t].v, j0, stride, T);
                }
                for (int64_t h = kh * group; h < (kh + 1) * group; h++)
                    for (int64_t q0 = first; q0 < T; q0 += S::tile_rows) {
                        for (int idx = 0; idx < S::tile_rows * HD; idx++) {
                            tile_element<HD>(tile_a, kat[0].queries + h * HD, stride, q0, T, idx);
                            tile_element<HD>(tile_b, kat[0].grads + h * HD, out_stride, q0, T, idx);
                        }
                        for (int idx = 0; idx < S::tile_rows; idx++)
                            row_stats_element(lse_tile, delta_tile, lse, delta, b, h, q0, T, Hq, idx);
                        int n = (int)min64(S::tile_rows, T - q0);
                        for (int t0 = 0; t0 < THREADS; t0 += split) {
                            int64_t j0 = thread_first_row<HD, R>(first, t0);
                            const float *k[split * R], *v[split * R];
                            for (int x = 0; x < split * R; x++) k[x] = ks[t0 * R + x].k, v[x] = ks[t0 * R + x].v;
                            for (int ii = warp_start<HD, R>(first, t0, q0, n); ii < n; ii++) {
                                float s[split * R], dpv[split * R];
                                group_dots_emulated<HD, R>(k, v, tile_a, tile_b, ii, s, dpv);
                                for (int p = 0; p < split; p++)
                                    for (int r = 0; r < R; r++)
                                        key_query(&ks[(t0 + p) * R + r], s[p * R + r] * scale, dpv[p * R + r],
                                                  q0 + ii >= j0 + r && j0 + r < T, lse_tile[ii], delta_tile[ii],
                                                  tile_part<HD>(tile_a, ii, p), tile_part<HD>(tile_b, ii, p), scale);
                            }
                        }
                    }
                for (int t = 0; t < THREADS; t++)
                    key_rows_end<R>(&ks[t * R], kat[t].dk, kat[t].dv, thread_first_row<HD, R>(first, t), stride, T);
            }
    free(tile_a), free(tile_b), free(qs), free(qat), free(ks), free(kat);
    return status;
}

template <int HD>
static int emulate_backward(float *d_qkv, float *delta, const float *d_out, const float *qkv, const float *out,
                            const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv)
{
    if (backward_rows() == 1) return emulate_backward_rows<HD, 1>(d_qkv, delta, d_out, qkv, out, lse, B, T, Hq, Hkv);
    return emulate_backward_rows<HD, 2>(d_qkv, delta, d_out, qkv, out, lse, B, T, Hq, Hkv);
}

extern "C" int cuda_attention_tiled_emulate_forward(float *out, float *lse, const float *qkv, int64_t B, int64_t T,
                                                    int64_t Hq, int64_t Hkv, int64_t hd)
{
    TP_TRY(attention_emulation_shape(cuda_attention_tiled_fits(B, Hq, hd), "tiled", B, T, Hq, Hkv, hd));
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
    TP_TRY(attention_emulation_shape(cuda_attention_tiled_fits(B, Hq, hd), "tiled", B, T, Hq, Hkv, hd));
    switch (hd) {
    case 32: return emulate_backward<32>(d_qkv, delta, d_out, qkv, out, lse, B, T, Hq, Hkv);
    case 64: return emulate_backward<64>(d_qkv, delta, d_out, qkv, out, lse, B, T, Hq, Hkv);
    case 128: return emulate_backward<128>(d_qkv, delta, d_out, qkv, out, lse, B, T, Hq, Hkv);
    default: return emulate_backward<256>(d_qkv, delta, d_out, qkv, out, lse, B, T, Hq, Hkv);
    }
}
