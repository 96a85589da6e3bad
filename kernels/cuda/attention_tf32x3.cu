/* attention_tf32x3.cu: causal attention for fp32 on the tensor cores, each
 * product as three TF32 products (3xTF32), for head sizes of 32, 64 and 128.
 *
 * Why: the fp32 step keeps its attention off cuDNN (whose flash attention
 * takes no fp32), and the tiled kernels (attention_tiled.cu) compute it on
 * the CUDA cores: about 26 of the fp32 step's 95.9 ms at GPT-2 124M
 * micro-batch 4 on an H200, against PyTorch's whole fp32 step of 85.1 ms.
 * PyTorch's fp32 attention (SDPA's memory-efficient kernel) runs on the
 * tensor cores in 3xTF32. Here too: each fp32 operand x is split into
 * big = tf32(x) and small = tf32(x - big) (tf32: 10 bits of mantissa,
 * rounded to nearest), and a b is a_small b_big + a_big b_small + a_big
 * b_big; the part left out, a_small b_small, is below fp32's last bit of
 * a b. The results are fp32's within rounding (the tests' 1e-4 relative
 * against the CPU), as the tiled kernels' are; TF32 alone is not used.
 *
 * The instruction: mma.sync m16n8k8, A 16 x 8 (row-major), B 8 x 8, C 16 x 8
 * fp32; lane = 4 g + t holds A's (g, t), (g + 8, t), (g, t + 4),
 * (g + 8, t + 4), B's (t, g), (t + 4, g), and C's (g, 2t), (g, 2t + 1),
 * (g + 8, 2t), (g + 8, 2t + 1). A warp owns 16 rows (one A), a block 4
 * warps: 64 rows (queries in the forward and the queries kernel, keys in
 * the keys kernel); the rows met (keys and values, or queries and output
 * gradients) come a tile of 32 at a time through shared memory, split into
 * their TF32 parts once as the tile is loaded, for the 4 warps to read.
 * Scores are C fragments; as the next product's A they keep their lanes: A's
 * column k = t is the scores' column 2t and k = t + 4 is 2t + 1, and the
 * rows met are read as B in that order (b_of_rows), so no lane needs
 * another's value. Rows in shared memory are HD + 4 floats apart: every
 * fragment's 32 reads fall in 32 banks.
 *
 * Three kernels, as the tiled ones, with the same arithmetic per pair of
 * rows (the same results within rounding):
 *   forward:  per query row i, over keys j <= i, an online softmax (the
 *             running maximum a row's, the sum kept per lane and added
 *             across its quad at the end); out_i = acc / sum, lse_i = max +
 *             log(sum).
 *   queries:  delta_i = d_out_i . out_i; over j <= i, p = exp(q_i . k_j
 *             scale - lse_i), ds = p (d_out_i . v_j - delta_i) scale,
 *             dq_i += ds k_j.
 *   keys:     per key row j of key/value head kh, over the query heads of its
 *             group and rows i >= j: dk_j += ds q_i, dv_j += p d_out_i.
 * Every element of d_qkv has one writer: no atomics, no zeroing. Tensor
 * cores have been measured to round their fp32 sums toward zero (V100 to
 * A100), a bias of up to an ulp of the sum a product: the accumulators
 * (out's, dq's, dk's and dv's) take each tile's products summed in the
 * tensor cores from zero, then add them in fp32 to nearest
 * (add_tile_products), so that the bias does not grow with T (the
 * emulation rounds as those tensor cores do, and checks T = 1024;
 * test_cuda_backend T = 1024 on the GPU).
 *
 * The warp's work is written once, in __host__ __device__ functions over
 * the L lanes that the code holds: on the GPU a thread holds its own lane
 * (L = 1) and the tensor cores and shuffles do the rest; the emulation
 * (cuda_attention_tf32x3_emulate_*) holds a warp's 32 and does the
 * instruction and the shuffles itself, in the lanes' layout. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "../../common/error.h"
}
#include "attention_kernels.h"
#include "attention_tf32x3.h"
#include "internal.h"
#include "lanes.h" /* lane_number */

#define WARPS 4
#define BLOCK_THREADS (32 * WARPS)
#define WARP_ROWS 16                 /* a warp's own rows: the instruction's M */
#define OWN_ROWS (WARPS * WARP_ROWS) /* a block's own rows */
#define MET_ROWS 32                  /* the rows of a tile met */
#define MET_GROUPS (MET_ROWS / 8)    /* its groups of 8 rows: the instruction's N (scores) or K (products) */
#define PAD 4                        /* floats after each row in shared memory, for the banks */

/* ============================================================ TF32 parts */

/* x rounded to TF32 (to nearest, ties away from zero: cvt.rna), as an fp32
 * value whose last 13 bits are zero. */
static __host__ __device__ inline float to_tf32(float x)
{
#ifdef __CUDA_ARCH__
    uint32_t bits;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(bits) : "f"(x));
    return __uint_as_float(bits & 0xffffe000u);
#else
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7f800000u) == 0x7f800000u) return x; /* inf and NaN as they are */
    bits = (bits + 0x1000u) & 0xffffe000u;              /* sign and magnitude: a half step away from zero, cut */
    memcpy(&x, &bits, sizeof x);
    return x;
#endif
}

static __host__ __device__ inline void split(float x, float *big, float *small)
{
    *big = to_tf32(x);
    *small = to_tf32(x - *big);
}

/* A lane's fragments: A's and B's in their two TF32 parts, C's fp32. */
struct a_fragment {
    float big[4], small[4];
};

struct b_fragment {
    float big[2], small[2];
};

struct c_fragment {
    float x[4];
};

/* c += a b for the warp's L lanes held, in TF32 (a's and b's parts as
 * chosen). The emulation adds the 8 products (each exact in fp32, as
 * TF32's are) and c in double, then rounds the sum toward zero (of the
 * double: nearly always the exact sum's rounding): tensor cores have
 * been measured to round their fp32 sums so (V100 to A100; Fasi, Higham,
 * Mikaitis and Pranesh, 2021), a bias that the emulation then carries
 * through every accumulator as the GPU does. */
template <int L>
static __host__ __device__ inline void mma(c_fragment *c, const a_fragment *a, bool a_small, const b_fragment *b,
                                           bool b_small)
{
#ifdef __CUDA_ARCH__
    const float *x = a_small ? a->small : a->big, *y = b_small ? b->small : b->big;
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c->x[0]), "+f"(c->x[1]), "+f"(c->x[2]), "+f"(c->x[3])
        : "r"(__float_as_uint(x[0])), "r"(__float_as_uint(x[1])), "r"(__float_as_uint(x[2])),
          "r"(__float_as_uint(x[3])), "r"(__float_as_uint(y[0])), "r"(__float_as_uint(y[1])));
#else
    float A[16][8], Bm[8][8];
    for (int l = 0; l < L; l++) {
        int g = l >> 2, t = l & 3;
        const float *x = a_small ? a[l].small : a[l].big, *y = b_small ? b[l].small : b[l].big;
        A[g][t] = x[0], A[g + 8][t] = x[1], A[g][t + 4] = x[2], A[g + 8][t + 4] = x[3];
        Bm[t][g] = y[0], Bm[t + 4][g] = y[1];
    }
    for (int l = 0; l < L; l++) {
        int g = l >> 2, t = l & 3;
        for (int e = 0; e < 4; e++) {
            int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
            double sum = c[l].x[e];
            for (int k = 0; k < 8; k++) sum += (double)A[row][k] * Bm[k][col];
            float nearest = (float)sum;
            c[l].x[e] = fabs((double)nearest) > fabs(sum) ? nextafterf(nearest, 0.0f) : nearest;
        }
    }
#endif
}

/* c += a b to about fp32's precision: the small parts' products first. */
template <int L> static __host__ __device__ inline void mma3(c_fragment *c, const a_fragment *a, const b_fragment *b)
{
    mma<L>(c, a, true, b, false);
    mma<L>(c, a, false, b, true);
    mma<L>(c, a, false, b, false);
}

/* ============================================================= fragments */

/* A = the 16 rows from `rows` (stride floats apart, fp32 in shared memory),
 * columns k0 to k0 + 7, split here. */
template <int L>
static __host__ __device__ inline void a_of_rows(a_fragment *a, const float *rows, int stride, int k0)
{
UNROLL
    for (int l = 0; l < L; l++) {
        int lane = lane_number<L>(l), g = lane >> 2, t = lane & 3;
        const float *top = rows + g * stride + k0 + t, *bottom = top + 8 * stride;
        split(top[0], &a[l].big[0], &a[l].small[0]);
        split(bottom[0], &a[l].big[1], &a[l].small[1]);
        split(top[4], &a[l].big[2], &a[l].small[2]);
        split(bottom[4], &a[l].big[3], &a[l].small[3]);
    }
}

/* A = a C fragment of scores, as the next product's left operand: A's
 * column k = t is the scores' column 2t, k = t + 4 is 2t + 1. */
template <int L> static __host__ __device__ inline void a_of_scores(a_fragment *a, const c_fragment *c)
{
UNROLL
    for (int l = 0; l < L; l++) {
        split(c[l].x[0], &a[l].big[0], &a[l].small[0]);
        split(c[l].x[2], &a[l].big[1], &a[l].small[1]);
        split(c[l].x[1], &a[l].big[2], &a[l].small[2]);
        split(c[l].x[3], &a[l].big[3], &a[l].small[3]);
    }
}

/* A tile met in shared memory: MET_ROWS rows of HD + PAD floats, the big
 * parts, then as many of the small parts. */
template <int HD> struct met_tile {
    static constexpr int stride = HD + PAD;
    static constexpr int floats = 2 * MET_ROWS * stride;
};

/* B[k][n] = the tile's row n0 + n, column k0 + k: the rows met as B's
 * columns (scores against them). */
template <int HD, int L>
static __host__ __device__ inline void b_of_columns(b_fragment *b, const float *tile, int n0, int k0)
{
    const int stride = met_tile<HD>::stride, small = MET_ROWS * stride;
UNROLL
    for (int l = 0; l < L; l++) {
        int lane = lane_number<L>(l), g = lane >> 2, t = lane & 3;
        const float *at = tile + (n0 + g) * stride + k0 + t;
        b[l].big[0] = at[0], b[l].big[1] = at[4];
        b[l].small[0] = at[small], b[l].small[1] = at[small + 4];
    }
}

/* B[k][n] = the tile's row k0 + (k = t: 2t; k = t + 4: 2t + 1), column
 * n0 + n: the rows met as B's rows, in a_of_scores's order. */
template <int HD, int L>
static __host__ __device__ inline void b_of_rows(b_fragment *b, const float *tile, int k0, int n0)
{
    const int stride = met_tile<HD>::stride, small = MET_ROWS * stride;
UNROLL
    for (int l = 0; l < L; l++) {
        int lane = lane_number<L>(l), g = lane >> 2, t = lane & 3;
        const float *at = tile + (k0 + 2 * t) * stride + n0 + g;
        b[l].big[0] = at[0], b[l].big[1] = at[stride];
        b[l].small[0] = at[small], b[l].small[1] = at[small + stride];
    }
}

/* The maximum and the sum across the 4 lanes of a quad (the lanes holding
 * a row of a C fragment), on each: butterflies, offsets 1 then 2. */
template <int L> static __host__ __device__ inline void quad_max(float *v)
{
#ifdef __CUDA_ARCH__
    v[0] = fmaxf(v[0], __shfl_xor_sync(0xffffffffu, v[0], 1));
    v[0] = fmaxf(v[0], __shfl_xor_sync(0xffffffffu, v[0], 2));
#else
    for (int offset = 1; offset < 4; offset <<= 1) {
        float next[L];
        for (int l = 0; l < L; l++) next[l] = fmaxf(v[l], v[l ^ offset]);
        memcpy(v, next, sizeof next);
    }
#endif
}

template <int L> static __host__ __device__ inline void quad_sum(float *v)
{
#ifdef __CUDA_ARCH__
    v[0] += __shfl_xor_sync(0xffffffffu, v[0], 1);
    v[0] += __shfl_xor_sync(0xffffffffu, v[0], 2);
#else
    for (int offset = 1; offset < 4; offset <<= 1) {
        float next[L];
        for (int l = 0; l < L; l++) next[l] = v[l] + v[l ^ offset];
        memcpy(v, next, sizeof next);
    }
#endif
}

template <int L> static __host__ __device__ inline void zero_fragments(c_fragment *c, int count)
{
UNROLL
    for (int f = 0; f < count * L; f++)
UNROLL
        for (int e = 0; e < 4; e++) c[f].x[e] = 0;
}

/* s[n] += rows . the tile's rows 8n to 8n + 7, for the groups n in [from,
 * to): the scores of the warp's 16 rows (in shared memory, as they are)
 * against the rows met (a tile, split). */
template <int HD, int L>
static __host__ __device__ inline void add_scores(c_fragment (*s)[L], const float *rows, const float *tile, int from,
                                                  int to)
{
UNROLL
    for (int k = 0; k < HD; k += 8) {
        a_fragment a[L];
        a_of_rows<L>(a, rows, HD + PAD, k);
UNROLL
        for (int n = 0; n < MET_GROUPS; n++)
            if (n >= from && n < to) {
                b_fragment b[L];
                b_of_columns<HD, L>(b, tile, 8 * n, k);
                mma3<L>(s[n], a, b);
            }
    }
}

/* acc[m] += scores . the tile's rows, dimensions 8m to 8m + 7, for every
 * m: the scores' groups n in [from, to) (columns 8n to 8n + 7) times the
 * rows met 8n to 8n + 7. Each m's products of the tile are summed in the
 * tensor cores from zero, then added to acc in fp32 (to nearest): tensor
 * cores round their sums toward zero, and an accumulator taking every
 * tile's products in them drifts with the tiles (dv over 1,024 queries
 * 8e-4 off in the emulation test, which rounds so). */
template <int HD, int L>
static __host__ __device__ inline void add_tile_products(c_fragment (*acc)[L], const c_fragment (*scores)[L],
                                                         const float *tile, int from, int to)
{
    a_fragment a[MET_GROUPS][L];
UNROLL
    for (int n = 0; n < MET_GROUPS; n++)
        if (n >= from && n < to) a_of_scores<L>(a[n], scores[n]);
UNROLL
    for (int m = 0; m < HD / 8; m++) {
        c_fragment part[L];
        zero_fragments<L>(part, 1);
UNROLL
        for (int n = 0; n < MET_GROUPS; n++)
            if (n >= from && n < to) {
                b_fragment b[L];
                b_of_rows<HD, L>(b, tile, 8 * n, 8 * m);
                mma3<L>(part, a[n], b);
            }
UNROLL
        for (int l = 0; l < L; l++)
UNROLL
            for (int e = 0; e < 4; e++) acc[m][l].x[e] += part[l].x[e];
    }
}

/* The warp's 16 rows of acc (HD columns: 8 a fragment) from row0 to dst
 * (row i at + i stride), those below T; each divided by its row's divisor
 * (NULL: as they are). Then, where `each` is not NULL, row i's value of it
 * to one[i]. */
template <int HD, int L>
static __host__ __device__ inline void store_rows(const c_fragment (*acc)[L], const float (*divisor)[L], float *dst,
                                                  int64_t stride, const float (*each)[L], float *one, int64_t row0,
                                                  int64_t T)
{
UNROLL
    for (int l = 0; l < L; l++) {
        int lane = lane_number<L>(l), g = lane >> 2, t = lane & 3;
UNROLL
        for (int r = 0; r < 2; r++) {
            int64_t i = row0 + g + 8 * r;
            if (i >= T) continue;
UNROLL
            for (int m = 0; m < HD / 8; m++)
                for (int c = 0; c < 2; c++) {
                    float v = acc[m][l].x[2 * r + c];
                    dst[i * stride + 8 * m + 2 * t + c] = divisor ? v / divisor[r][l] : v;
                }
            if (each && t == 0) one[i] = each[r][l];
        }
    }
}

/* ================================================================= tiles */

/* Element idx (< rows HD) of a tile of own rows: row r = idx / HD of src
 * (row stride `stride`) from `first`, zero at or past `limit`, at
 * tile + r (HD + PAD), as it is. */
template <int HD>
static __host__ __device__ inline void own_element(float *tile, const float *src, int64_t stride, int64_t first,
                                                   int64_t limit, int idx)
{
    int r = idx / HD, d = idx % HD;
    int64_t row = first + r;
    tile[r * (HD + PAD) + d] = row < limit ? src[row * stride + d] : 0.0f;
}

/* Element idx (< MET_ROWS HD) of a tile met, split (met_tile). */
template <int HD>
static __host__ __device__ inline void met_element(float *tile, const float *src, int64_t stride, int64_t first,
                                                   int64_t limit, int idx)
{
    int r = idx / HD, d = idx % HD, at = r * met_tile<HD>::stride + d;
    int64_t row = first + r;
    split(row < limit ? src[row * stride + d] : 0.0f, &tile[at], &tile[MET_ROWS * met_tile<HD>::stride + at]);
}

/* The groups of 8 rows of the tile met from met0 (up to met_end) that a
 * warp's rows from row0 meet: in the forward and queries kernels the keys
 * up to the warp's last row below T, [0, groups_to); in the keys kernel the
 * queries from its first row, [groups_from, groups to met_end). */
static __host__ __device__ inline int groups_to(int64_t row0, int64_t T, int64_t met0, int64_t met_end)
{
    if (row0 >= T) return 0;
    int64_t n = min64(met_end, min64(T, row0 + WARP_ROWS)) - met0;
    return n <= 0 ? 0 : (int)((n + 7) / 8);
}

static __host__ __device__ inline int groups_from(int64_t row0, int64_t T, int64_t met0)
{
    return row0 >= T ? MET_GROUPS : (int)min64(MET_GROUPS, max64(0, row0 - met0) / 8);
}

/* ================================================================ forward */

/* A warp's 16 query rows: lane (g, t) holds rows g (r = 0) and g + 8 (r = 1). */
template <int HD, int L> struct forward_warp {
    c_fragment acc[HD / 8][L];  /* the output's sums, 8 dimensions a fragment */
    float max[2][L], sum[2][L]; /* the running maximum (a quad's lanes agree), the lane's part of the sum */
};

template <int HD, int L> static __host__ __device__ inline void forward_begin(forward_warp<HD, L> *w)
{
    zero_fragments<L>(&w->acc[0][0], HD / 8);
    for (int r = 0; r < 2; r++)
        for (int l = 0; l < L; l++) w->max[r][l] = -INFINITY, w->sum[r][l] = 0;
}

/* The keys from k0, `groups` groups of 8 of them, against the warp's rows
 * from row0 (queries: the warp's rows in shared memory). */
template <int HD, int L>
static __host__ __device__ inline void forward_tile(forward_warp<HD, L> *w, const float *queries, const float *keys,
                                                    const float *values, int64_t row0, int64_t k0, int groups,
                                                    int64_t T, float scale)
{
    if (groups == 0) return; /* warp-uniform */
    c_fragment s[MET_GROUPS][L];
    zero_fragments<L>(&s[0][0], MET_GROUPS);
    add_scores<HD, L>(s, queries, keys, 0, groups);
    /* Scaled and masked (-inf past the diagonal or the sequence); each row's
     * new maximum. A row meets key 0 in its first tile, and its maximum
     * stays finite: no exp(-inf + inf). */
    float top[2][L];
UNROLL
    for (int l = 0; l < L; l++) {
        int lane = lane_number<L>(l), g = lane >> 2, t = lane & 3;
UNROLL
        for (int r = 0; r < 2; r++) {
            int64_t i = row0 + g + 8 * r;
            float m = w->max[r][l];
UNROLL
            for (int n = 0; n < MET_GROUPS; n++)
                if (n < groups)
UNROLL
                    for (int c = 0; c < 2; c++) {
                        int64_t j = k0 + 8 * n + 2 * t + c;
                        float v = j <= i && j < T ? s[n][l].x[2 * r + c] * scale : -INFINITY;
                        s[n][l].x[2 * r + c] = v;
                        m = fmaxf(m, v);
                    }
            top[r][l] = m;
        }
    }
    quad_max<L>(top[0]);
    quad_max<L>(top[1]);
UNROLL
    for (int l = 0; l < L; l++)
UNROLL
        for (int r = 0; r < 2; r++) {
            float rescale = expf(w->max[r][l] - top[r][l]); /* 0 at the first tile */
            w->max[r][l] = top[r][l];
            w->sum[r][l] *= rescale;
UNROLL
            for (int m = 0; m < HD / 8; m++) w->acc[m][l].x[2 * r] *= rescale, w->acc[m][l].x[2 * r + 1] *= rescale;
UNROLL
            for (int n = 0; n < MET_GROUPS; n++)
                if (n < groups)
UNROLL
                    for (int c = 0; c < 2; c++) {
                        float p = expf(s[n][l].x[2 * r + c] - top[r][l]);
                        s[n][l].x[2 * r + c] = p;
                        w->sum[r][l] += p;
                    }
        }
    /* acc += p v */
    add_tile_products<HD, L>(w->acc, s, values, 0, groups);
}

/* out: head h's column of batch b (row i at + i out_stride); lse: its row
 * of [B, Hq, T]. */
template <int HD, int L>
static __host__ __device__ inline void forward_end(forward_warp<HD, L> *w, float *out, int64_t out_stride, float *lse,
                                                   int64_t row0, int64_t T)
{
    quad_sum<L>(w->sum[0]);
    quad_sum<L>(w->sum[1]);
    float row_lse[2][L];
UNROLL
    for (int r = 0; r < 2; r++)
UNROLL
        for (int l = 0; l < L; l++) row_lse[r][l] = w->max[r][l] + logf(w->sum[r][l]);
    store_rows<HD, L>(w->acc, w->sum, out, out_stride, row_lse, lse, row0, T);
}

/* The forward's shared memory: the block's queries, then a tile of keys and
 * one of values. */
template <int HD> static size_t forward_shared_floats(void)
{
    return (size_t)OWN_ROWS * (HD + PAD) + 2 * met_tile<HD>::floats;
}

/* Grid (ceil(T / OWN_ROWS), Hq, B); block BLOCK_THREADS; shared
 * forward_shared_floats. */
template <int HD>
__global__ void __launch_bounds__(BLOCK_THREADS)
    attention_forward_tf32x3(float *out, float *lse, const float *qkv, int64_t T, int64_t Hq, int64_t Hkv, float scale)
{
    extern __shared__ __align__(16) float shared[];
    float *queries = shared, *keys = queries + OWN_ROWS * (HD + PAD), *values = keys + met_tile<HD>::floats;
    /* The last rows meet the most keys: their blocks first, so that no long block starts last. */
    int64_t b = blockIdx.z, h = blockIdx.y, first = (int64_t)(gridDim.x - 1 - blockIdx.x) * OWN_ROWS;
    int warp = threadIdx.x / 32;
    int64_t row0 = first + warp * WARP_ROWS, end = min64(T, first + OWN_ROWS);
    int64_t stride = (Hq + 2 * Hkv) * HD, kh = h / (Hq / Hkv);
    const float *base = qkv + b * T * stride;
    for (int idx = threadIdx.x; idx < OWN_ROWS * HD; idx += BLOCK_THREADS)
        own_element<HD>(queries, base + h * HD, stride, first, T, idx);
    forward_warp<HD, 1> w;
    forward_begin<HD, 1>(&w);
    for (int64_t k0 = 0; k0 < end; k0 += MET_ROWS) {
        __syncthreads(); /* the queries loaded; every warp done with the last tile */
        for (int idx = threadIdx.x; idx < MET_ROWS * HD; idx += BLOCK_THREADS) {
            met_element<HD>(keys, base + (Hq + kh) * HD, stride, k0, end, idx);
            met_element<HD>(values, base + (Hq + Hkv + kh) * HD, stride, k0, end, idx);
        }
        __syncthreads();
        int groups = groups_to(row0, T, k0, min64(end, k0 + MET_ROWS));
        forward_tile<HD, 1>(&w, queries + warp * WARP_ROWS * (HD + PAD), keys, values, row0, k0, groups, T, scale);
    }
    forward_end<HD, 1>(&w, out + b * T * Hq * HD + h * HD, Hq * HD, lse + (b * Hq + h) * T, row0, T);
}

/* ======================================================== backward: queries */

template <int HD, int L> struct query_warp {
    c_fragment dq[HD / 8][L];
    float lse[2][L], delta[2][L]; /* rows g and g + 8 */
};

/* grads: the warp's output gradients in shared memory; out and lse: head
 * h's column of batch b and its row of [B, Hq, T]. delta's terms a lane's
 * quarter of the dimensions, then summed across the quad. */
template <int HD, int L>
static __host__ __device__ inline void query_begin(query_warp<HD, L> *w, const float *grads, const float *out,
                                                   int64_t out_stride, const float *lse, int64_t row0, int64_t T)
{
    zero_fragments<L>(&w->dq[0][0], HD / 8);
UNROLL
    for (int l = 0; l < L; l++) {
        int lane = lane_number<L>(l), g = lane >> 2, t = lane & 3;
UNROLL
        for (int r = 0; r < 2; r++) {
            int64_t i = row0 + g + 8 * r;
            float part = 0;
            if (i < T)
                for (int d = t * (HD / 4); d < (t + 1) * (HD / 4); d++)
                    part += grads[(g + 8 * r) * (HD + PAD) + d] * out[i * out_stride + d];
            w->delta[r][l] = part;
            w->lse[r][l] = i < T ? lse[i] : 0.0f;
        }
    }
    quad_sum<L>(w->delta[0]);
    quad_sum<L>(w->delta[1]);
}

template <int HD, int L>
static __host__ __device__ inline void query_tile(query_warp<HD, L> *w, const float *queries, const float *grads,
                                                  const float *keys, const float *values, int64_t row0, int64_t k0,
                                                  int groups, int64_t T, float scale)
{
    if (groups == 0) return; /* warp-uniform */
    c_fragment s[MET_GROUPS][L], dpv[MET_GROUPS][L];
    zero_fragments<L>(&s[0][0], MET_GROUPS);
    zero_fragments<L>(&dpv[0][0], MET_GROUPS);
    add_scores<HD, L>(s, queries, keys, 0, groups);
    add_scores<HD, L>(dpv, grads, values, 0, groups);
UNROLL
    for (int l = 0; l < L; l++) {
        int lane = lane_number<L>(l), g = lane >> 2, t = lane & 3;
UNROLL
        for (int r = 0; r < 2; r++) {
            int64_t i = row0 + g + 8 * r;
UNROLL
            for (int n = 0; n < MET_GROUPS; n++)
                if (n < groups)
UNROLL
                    for (int c = 0; c < 2; c++) {
                        int64_t j = k0 + 8 * n + 2 * t + c;
                        float ds = 0;
                        if (j <= i && i < T) {
                            float p = expf(s[n][l].x[2 * r + c] * scale - w->lse[r][l]);
                            ds = p * (dpv[n][l].x[2 * r + c] - w->delta[r][l]) * scale;
                        }
                        s[n][l].x[2 * r + c] = ds;
                    }
        }
    }
    /* dq += ds k */
    add_tile_products<HD, L>(w->dq, s, keys, 0, groups);
}

/* dq: head h's query column of d_qkv, batch b (row i at + i stride); delta:
 * its row of [B, Hq, T]. */
template <int HD, int L>
static __host__ __device__ inline void query_end(const query_warp<HD, L> *w, float *dq, int64_t stride, float *delta,
                                                 int64_t row0, int64_t T)
{
    store_rows<HD, L>(w->dq, NULL, dq, stride, w->delta, delta, row0, T);
}

/* The backward kernels' shared memory: two tiles of own rows (queries and
 * output gradients, or keys and values), two tiles met, and (the keys
 * kernel) the met queries' lse and delta. */
template <int HD> static size_t backward_shared_floats(void)
{
    return (size_t)2 * OWN_ROWS * (HD + PAD) + 2 * met_tile<HD>::floats + 2 * MET_ROWS;
}

/* Grid (ceil(T / OWN_ROWS), Hq, B); block BLOCK_THREADS; shared
 * backward_shared_floats. */
template <int HD>
__global__ void __launch_bounds__(BLOCK_THREADS)
    attention_queries_tf32x3(float *d_qkv, float *delta, const float *d_out, const float *qkv, const float *out,
                             const float *lse, int64_t T, int64_t Hq, int64_t Hkv, float scale)
{
    extern __shared__ __align__(16) float shared[];
    float *queries = shared, *grads = queries + OWN_ROWS * (HD + PAD), *keys = grads + OWN_ROWS * (HD + PAD);
    float *values = keys + met_tile<HD>::floats;
    int64_t b = blockIdx.z, h = blockIdx.y, first = (int64_t)(gridDim.x - 1 - blockIdx.x) * OWN_ROWS;
    int warp = threadIdx.x / 32;
    int64_t row0 = first + warp * WARP_ROWS, end = min64(T, first + OWN_ROWS);
    int64_t stride = (Hq + 2 * Hkv) * HD, kh = h / (Hq / Hkv), out_stride = Hq * HD;
    const float *base = qkv + b * T * stride, *g_base = d_out + b * T * out_stride + h * HD;
    for (int idx = threadIdx.x; idx < OWN_ROWS * HD; idx += BLOCK_THREADS) {
        own_element<HD>(queries, base + h * HD, stride, first, T, idx);
        own_element<HD>(grads, g_base, out_stride, first, T, idx);
    }
    __syncthreads();
    const float *my_queries = queries + warp * WARP_ROWS * (HD + PAD), *my_grads = grads + warp * WARP_ROWS * (HD + PAD);
    query_warp<HD, 1> w;
    query_begin<HD, 1>(&w, my_grads, out + b * T * out_stride + h * HD, out_stride, lse + (b * Hq + h) * T, row0, T);
    for (int64_t k0 = 0; k0 < end; k0 += MET_ROWS) {
        __syncthreads();
        for (int idx = threadIdx.x; idx < MET_ROWS * HD; idx += BLOCK_THREADS) {
            met_element<HD>(keys, base + (Hq + kh) * HD, stride, k0, end, idx);
            met_element<HD>(values, base + (Hq + Hkv + kh) * HD, stride, k0, end, idx);
        }
        __syncthreads();
        int groups = groups_to(row0, T, k0, min64(end, k0 + MET_ROWS));
        query_tile<HD, 1>(&w, my_queries, my_grads, keys, values, row0, k0, groups, T, scale);
    }
    query_end<HD, 1>(&w, d_qkv + b * T * stride + h * HD, stride, delta + (b * Hq + h) * T, row0, T);
}

/* =========================================================== backward: keys */

template <int HD, int L> struct key_warp {
    c_fragment dk[HD / 8][L], dv[HD / 8][L];
};

/* The queries from q0 (groups [from, to) of 8), with their lse and delta
 * in lse_tile and delta_tile, against the warp's key rows from row0 (keys,
 * values: the warp's rows in shared memory). */
template <int HD, int L>
static __host__ __device__ inline void key_tile(key_warp<HD, L> *w, const float *keys, const float *values,
                                                const float *queries, const float *grads, const float *lse_tile,
                                                const float *delta_tile, int64_t row0, int64_t q0, int from, int to,
                                                int64_t T, float scale)
{
    if (from >= to) return; /* warp-uniform */
    c_fragment s[MET_GROUPS][L], dpv[MET_GROUPS][L];
    zero_fragments<L>(&s[0][0], MET_GROUPS);
    zero_fragments<L>(&dpv[0][0], MET_GROUPS);
    add_scores<HD, L>(s, keys, queries, from, to);
    add_scores<HD, L>(dpv, values, grads, from, to);
    /* s becomes p, dpv ds: rows keys j, columns queries i. */
UNROLL
    for (int l = 0; l < L; l++) {
        int lane = lane_number<L>(l), g = lane >> 2, t = lane & 3;
UNROLL
        for (int r = 0; r < 2; r++) {
            int64_t j = row0 + g + 8 * r;
UNROLL
            for (int n = 0; n < MET_GROUPS; n++)
                if (n >= from && n < to)
UNROLL
                    for (int c = 0; c < 2; c++) {
                        int column = 8 * n + 2 * t + c;
                        int64_t i = q0 + column;
                        float p = 0, ds = 0;
                        if (i >= j && i < T && j < T) {
                            p = expf(s[n][l].x[2 * r + c] * scale - lse_tile[column]);
                            ds = p * (dpv[n][l].x[2 * r + c] - delta_tile[column]) * scale;
                        }
                        s[n][l].x[2 * r + c] = p;
                        dpv[n][l].x[2 * r + c] = ds;
                    }
        }
    }
    /* dv += p d_out, dk += ds q */
    add_tile_products<HD, L>(w->dv, s, grads, from, to);
    add_tile_products<HD, L>(w->dk, dpv, queries, from, to);
}

/* dk, dv: the key/value head's columns of d_qkv, batch b (row j at + j
 * stride). */
template <int HD, int L>
static __host__ __device__ inline void key_end(const key_warp<HD, L> *w, float *dk, float *dv, int64_t stride,
                                               int64_t row0, int64_t T)
{
    store_rows<HD, L>(w->dk, NULL, dk, stride, NULL, NULL, row0, T);
    store_rows<HD, L>(w->dv, NULL, dv, stride, NULL, NULL, row0, T);
}

/* Element idx (< MET_ROWS) of the lse and delta tiles: query rows from q0
 * of head h's row of [B, Hq, T] (lse and delta there). */
static __host__ __device__ inline void stats_element(float *lse_tile, float *delta_tile, const float *lse,
                                                     const float *delta, int64_t q0, int64_t T, int idx)
{
    int64_t i = q0 + idx;
    lse_tile[idx] = i < T ? lse[i] : 0.0f;
    delta_tile[idx] = i < T ? delta[i] : 0.0f;
}

/* Grid (ceil(T / OWN_ROWS), Hkv, B), block BLOCK_THREADS, shared
 * backward_shared_floats: after the queries kernel (delta). */
template <int HD>
__global__ void __launch_bounds__(BLOCK_THREADS)
    attention_keys_tf32x3(float *d_qkv, const float *delta, const float *d_out, const float *qkv, const float *lse,
                          int64_t T, int64_t Hq, int64_t Hkv, float scale)
{
    extern __shared__ __align__(16) float shared[];
    float *keys = shared, *values = keys + OWN_ROWS * (HD + PAD), *queries = values + OWN_ROWS * (HD + PAD);
    float *grads = queries + met_tile<HD>::floats, *lse_tile = grads + met_tile<HD>::floats;
    float *delta_tile = lse_tile + MET_ROWS;
    int64_t b = blockIdx.z, kh = blockIdx.y, first = (int64_t)blockIdx.x * OWN_ROWS;
    int warp = threadIdx.x / 32;
    int64_t row0 = first + warp * WARP_ROWS, stride = (Hq + 2 * Hkv) * HD, out_stride = Hq * HD, group = Hq / Hkv;
    const float *base = qkv + b * T * stride, *g_base = d_out + b * T * out_stride;
    for (int idx = threadIdx.x; idx < OWN_ROWS * HD; idx += BLOCK_THREADS) {
        own_element<HD>(keys, base + (Hq + kh) * HD, stride, first, T, idx);
        own_element<HD>(values, base + (Hq + Hkv + kh) * HD, stride, first, T, idx);
    }
    key_warp<HD, 1> w;
    zero_fragments<1>(&w.dk[0][0], HD / 8);
    zero_fragments<1>(&w.dv[0][0], HD / 8);
    for (int64_t h = kh * group; h < (kh + 1) * group; h++)
        for (int64_t q0 = first; q0 < T; q0 += MET_ROWS) {
            __syncthreads(); /* the own rows loaded; every warp done with the last tile */
            for (int idx = threadIdx.x; idx < MET_ROWS * HD; idx += BLOCK_THREADS) {
                met_element<HD>(queries, base + h * HD, stride, q0, T, idx);
                met_element<HD>(grads, g_base + h * HD, out_stride, q0, T, idx);
            }
            for (int idx = threadIdx.x; idx < MET_ROWS; idx += BLOCK_THREADS)
                stats_element(lse_tile, delta_tile, lse + (b * Hq + h) * T, delta + (b * Hq + h) * T, q0, T, idx);
            __syncthreads();
            int to = (int)((min64(MET_ROWS, T - q0) + 7) / 8);
            key_tile<HD, 1>(&w, keys + warp * WARP_ROWS * (HD + PAD), values + warp * WARP_ROWS * (HD + PAD), queries,
                            grads, lse_tile, delta_tile, row0, q0, groups_from(row0, T, q0), to, T, scale);
        }
    key_end<HD, 1>(&w, d_qkv + b * T * stride + (Hq + kh) * HD, d_qkv + b * T * stride + (Hq + Hkv + kh) * HD, stride,
                   row0, T);
}

/* ================================================================ launches */

extern "C" int cuda_attention_tf32x3_fits(int64_t B, int64_t Hq, int64_t hd)
{
    return (hd == 32 || hd == 64 || hd == 128) && attention_grid_fits(B, Hq);
}

int cuda_attention_tf32x3_shared_fits(int64_t hd, int device)
{
    int optin = 0;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
        (void)cudaGetLastError(); /* no such device: nothing runs there, and the launch says why */
        return 0;
    }
    size_t floats = hd == 32 ? backward_shared_floats<32>() : hd == 64 ? backward_shared_floats<64>()
                                                                       : backward_shared_floats<128>();
    return floats * sizeof(float) <= (size_t)optin;
}

/* A kernel's shared memory beyond the 48 KiB every kernel may take. */
static int allow_shared(const void *kernel, size_t bytes, const char *what)
{
    cudaError_t error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    return error == cudaSuccess ? TP_OK
                                : tp_fail(TP_ERR_DEVICE, "CUDA %s: %zu bytes of shared memory: %s", what, bytes,
                                          cudaGetErrorString(error));
}

template <int HD>
static int forward_launch(float *out, float *lse, const float *qkv, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                          float scale, cudaStream_t stream)
{
    size_t bytes = forward_shared_floats<HD>() * sizeof(float);
    TP_TRY(allow_shared((const void *)attention_forward_tf32x3<HD>, bytes, "attention_forward_tf32x3"));
    dim3 grid((unsigned)((T + OWN_ROWS - 1) / OWN_ROWS), (unsigned)Hq, (unsigned)B);
    attention_forward_tf32x3<HD><<<grid, BLOCK_THREADS, bytes, stream>>>(out, lse, qkv, T, Hq, Hkv, scale);
    return attention_launch_status("attention_forward_tf32x3");
}

template <int HD>
static int backward_launch(float *d_qkv, float *delta, const float *d_out, const float *qkv, const float *out,
                           const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, float scale,
                           cudaStream_t stream)
{
    size_t bytes = backward_shared_floats<HD>() * sizeof(float);
    unsigned tiles = (unsigned)((T + OWN_ROWS - 1) / OWN_ROWS);
    TP_TRY(allow_shared((const void *)attention_queries_tf32x3<HD>, bytes, "attention_queries_tf32x3"));
    TP_TRY(allow_shared((const void *)attention_keys_tf32x3<HD>, bytes, "attention_keys_tf32x3"));
    attention_queries_tf32x3<HD><<<dim3(tiles, (unsigned)Hq, (unsigned)B), BLOCK_THREADS, bytes, stream>>>(
        d_qkv, delta, d_out, qkv, out, lse, T, Hq, Hkv, scale);
    TP_TRY(attention_launch_status("attention_queries_tf32x3"));
    attention_keys_tf32x3<HD><<<dim3(tiles, (unsigned)Hkv, (unsigned)B), BLOCK_THREADS, bytes, stream>>>(
        d_qkv, delta, d_out, qkv, lse, T, Hq, Hkv, scale);
    return attention_launch_status("attention_keys_tf32x3");
}

int cuda_attention_tf32x3_forward(float *out, float *lse, const float *qkv, int64_t B, int64_t T, int64_t Hq,
                                  int64_t Hkv, int64_t hd, cudaStream_t stream)
{
    float scale = 1.0f / sqrtf((float)hd);
    switch (hd) {
    case 32: return forward_launch<32>(out, lse, qkv, B, T, Hq, Hkv, scale, stream);
    case 64: return forward_launch<64>(out, lse, qkv, B, T, Hq, Hkv, scale, stream);
    case 128: return forward_launch<128>(out, lse, qkv, B, T, Hq, Hkv, scale, stream);
    default: return tp_fail(TP_ERR_ARG, "tf32x3 attention: head size %lld (32, 64 or 128)", (long long)hd);
    }
}

int cuda_attention_tf32x3_backward(float *d_qkv, float *delta, const float *d_out, const float *qkv, const float *out,
                                   const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd,
                                   cudaStream_t stream)
{
    float scale = 1.0f / sqrtf((float)hd);
    switch (hd) {
    case 32: return backward_launch<32>(d_qkv, delta, d_out, qkv, out, lse, B, T, Hq, Hkv, scale, stream);
    case 64: return backward_launch<64>(d_qkv, delta, d_out, qkv, out, lse, B, T, Hq, Hkv, scale, stream);
    case 128: return backward_launch<128>(d_qkv, delta, d_out, qkv, out, lse, B, T, Hq, Hkv, scale, stream);
    default: return tp_fail(TP_ERR_ARG, "tf32x3 attention: head size %lld (32, 64 or 128)", (long long)hd);
    }
}

/* =========================================================== CPU emulation
 * Each block in turn: its tiles loaded element by element, then each warp's
 * step over a tile with the warp's 32 lanes (L = 32). Blocks, and warps
 * between two __syncthreads, are independent (one writer an element): their
 * order is the emulation's. */

template <int HD>
static int emulate_forward(float *out, float *lse, const float *qkv, int64_t B, int64_t T, int64_t Hq, int64_t Hkv)
{
    float scale = 1.0f / sqrtf((float)HD), *shared = (float *)malloc(forward_shared_floats<HD>() * sizeof(float));
    forward_warp<HD, 32> *w = (forward_warp<HD, 32> *)malloc(WARPS * sizeof *w);
    int status = shared && w ? TP_OK : tp_fail(TP_ERR_NOMEM, "tf32x3 attention emulation: no memory");
    int64_t stride = (Hq + 2 * Hkv) * HD;
    for (int64_t b = 0; !status && b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t first = 0; first < T; first += OWN_ROWS) {
                float *queries = shared, *keys = queries + OWN_ROWS * (HD + PAD), *values = keys + met_tile<HD>::floats;
                int64_t end = min64(T, first + OWN_ROWS), kh = h / (Hq / Hkv);
                const float *base = qkv + b * T * stride;
                for (int idx = 0; idx < OWN_ROWS * HD; idx++)
                    own_element<HD>(queries, base + h * HD, stride, first, T, idx);
                for (int warp = 0; warp < WARPS; warp++) forward_begin<HD, 32>(&w[warp]);
                for (int64_t k0 = 0; k0 < end; k0 += MET_ROWS) {
                    for (int idx = 0; idx < MET_ROWS * HD; idx++) {
                        met_element<HD>(keys, base + (Hq + kh) * HD, stride, k0, end, idx);
                        met_element<HD>(values, base + (Hq + Hkv + kh) * HD, stride, k0, end, idx);
                    }
                    for (int warp = 0; warp < WARPS; warp++) {
                        int64_t row0 = first + warp * WARP_ROWS;
                        int groups = groups_to(row0, T, k0, min64(end, k0 + MET_ROWS));
                        forward_tile<HD, 32>(&w[warp], queries + warp * WARP_ROWS * (HD + PAD), keys, values, row0, k0,
                                             groups, T, scale);
                    }
                }
                for (int warp = 0; warp < WARPS; warp++)
                    forward_end<HD, 32>(&w[warp], out + b * T * Hq * HD + h * HD, Hq * HD, lse + (b * Hq + h) * T,
                                        first + warp * WARP_ROWS, T);
            }
    free(shared), free(w);
    return status;
}

template <int HD>
static int emulate_backward(float *d_qkv, float *delta, const float *d_out, const float *qkv, const float *out,
                            const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv)
{
    float scale = 1.0f / sqrtf((float)HD), *shared = (float *)malloc(backward_shared_floats<HD>() * sizeof(float));
    query_warp<HD, 32> *qw = (query_warp<HD, 32> *)malloc(WARPS * sizeof *qw);
    key_warp<HD, 32> *kw = (key_warp<HD, 32> *)malloc(WARPS * sizeof *kw);
    int status = shared && qw && kw ? TP_OK : tp_fail(TP_ERR_NOMEM, "tf32x3 attention emulation: no memory");
    int64_t stride = (Hq + 2 * Hkv) * HD, out_stride = Hq * HD, group = Hq / Hkv;
    /* The queries kernel's blocks (delta first: the keys kernel reads it). */
    for (int64_t b = 0; !status && b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t first = 0; first < T; first += OWN_ROWS) {
                float *queries = shared, *grads = queries + OWN_ROWS * (HD + PAD);
                float *keys = grads + OWN_ROWS * (HD + PAD), *values = keys + met_tile<HD>::floats;
                int64_t end = min64(T, first + OWN_ROWS), kh = h / group;
                const float *base = qkv + b * T * stride, *g_base = d_out + b * T * out_stride + h * HD;
                for (int idx = 0; idx < OWN_ROWS * HD; idx++) {
                    own_element<HD>(queries, base + h * HD, stride, first, T, idx);
                    own_element<HD>(grads, g_base, out_stride, first, T, idx);
                }
                for (int warp = 0; warp < WARPS; warp++)
                    query_begin<HD, 32>(&qw[warp], grads + warp * WARP_ROWS * (HD + PAD),
                                        out + b * T * out_stride + h * HD, out_stride, lse + (b * Hq + h) * T,
                                        first + warp * WARP_ROWS, T);
                for (int64_t k0 = 0; k0 < end; k0 += MET_ROWS) {
                    for (int idx = 0; idx < MET_ROWS * HD; idx++) {
                        met_element<HD>(keys, base + (Hq + kh) * HD, stride, k0, end, idx);
                        met_element<HD>(values, base + (Hq + Hkv + kh) * HD, stride, k0, end, idx);
                    }
                    for (int warp = 0; warp < WARPS; warp++) {
                        int64_t row0 = first + warp * WARP_ROWS;
                        int groups = groups_to(row0, T, k0, min64(end, k0 + MET_ROWS));
                        query_tile<HD, 32>(&qw[warp], queries + warp * WARP_ROWS * (HD + PAD),
                                           grads + warp * WARP_ROWS * (HD + PAD), keys, values, row0, k0, groups, T,
                                           scale);
                    }
                }
                for (int warp = 0; warp < WARPS; warp++)
                    query_end<HD, 32>(&qw[warp], d_qkv + b * T * stride + h * HD, stride, delta + (b * Hq + h) * T,
                                      first + warp * WARP_ROWS, T);
            }
    /* The keys kernel's blocks. */
    for (int64_t b = 0; !status && b < B; b++)
        for (int64_t kh = 0; kh < Hkv; kh++)
            for (int64_t first = 0; first < T; first += OWN_ROWS) {
                float *keys = shared, *values = keys + OWN_ROWS * (HD + PAD), *queries = values + OWN_ROWS * (HD + PAD);
                float *grads = queries + met_tile<HD>::floats, *lse_tile = grads + met_tile<HD>::floats;
                float *delta_tile = lse_tile + MET_ROWS;
                const float *base = qkv + b * T * stride, *g_base = d_out + b * T * out_stride;
                for (int idx = 0; idx < OWN_ROWS * HD; idx++) {
                    own_element<HD>(keys, base + (Hq + kh) * HD, stride, first, T, idx);
                    own_element<HD>(values, base + (Hq + Hkv + kh) * HD, stride, first, T, idx);
                }
                for (int warp = 0; warp < WARPS; warp++) {
                    zero_fragments<32>(&kw[warp].dk[0][0], HD / 8);
                    zero_fragments<32>(&kw[warp].dv[0][0], HD / 8);
                }
                for (int64_t h = kh * group; h < (kh + 1) * group; h++)
                    for (int64_t q0 = first; q0 < T; q0 += MET_ROWS) {
                        for (int idx = 0; idx < MET_ROWS * HD; idx++) {
                            met_element<HD>(queries, base + h * HD, stride, q0, T, idx);
                            met_element<HD>(grads, g_base + h * HD, out_stride, q0, T, idx);
                        }
                        for (int idx = 0; idx < MET_ROWS; idx++)
                            stats_element(lse_tile, delta_tile, lse + (b * Hq + h) * T, delta + (b * Hq + h) * T, q0,
                                          T, idx);
                        int to = (int)((min64(MET_ROWS, T - q0) + 7) / 8);
                        for (int warp = 0; warp < WARPS; warp++) {
                            int64_t row0 = first + warp * WARP_ROWS;
                            key_tile<HD, 32>(&kw[warp], keys + warp * WARP_ROWS * (HD + PAD),
                                             values + warp * WARP_ROWS * (HD + PAD), queries, grads, lse_tile,
                                             delta_tile, row0, q0, groups_from(row0, T, q0), to, T, scale);
                        }
                    }
                for (int warp = 0; warp < WARPS; warp++)
                    key_end<HD, 32>(&kw[warp], d_qkv + b * T * stride + (Hq + kh) * HD,
                                    d_qkv + b * T * stride + (Hq + Hkv + kh) * HD, stride, first + warp * WARP_ROWS, T);
            }
    free(shared), free(qw), free(kw);
    return status;
}

extern "C" int cuda_attention_tf32x3_emulate_forward(float *out, float *lse, const float *qkv, int64_t B, int64_t T,
                                                     int64_t Hq, int64_t Hkv, int64_t hd)
{
    TP_TRY(attention_emulation_shape(cuda_attention_tf32x3_fits(B, Hq, hd), "tf32x3", B, T, Hq, Hkv, hd));
    switch (hd) {
    case 32: return emulate_forward<32>(out, lse, qkv, B, T, Hq, Hkv);
    case 64: return emulate_forward<64>(out, lse, qkv, B, T, Hq, Hkv);
    default: return emulate_forward<128>(out, lse, qkv, B, T, Hq, Hkv);
    }
}

extern "C" int cuda_attention_tf32x3_emulate_backward(float *d_qkv, float *delta, const float *d_out, const float *qkv,
                                                      const float *out, const float *lse, int64_t B, int64_t T,
                                                      int64_t Hq, int64_t Hkv, int64_t hd)
{
    TP_TRY(attention_emulation_shape(cuda_attention_tf32x3_fits(B, Hq, hd), "tf32x3", B, T, Hq, Hkv, hd));
    switch (hd) {
    case 32: return emulate_backward<32>(d_qkv, delta, d_out, qkv, out, lse, B, T, Hq, Hkv);
    case 64: return emulate_backward<64>(d_qkv, delta, d_out, qkv, out, lse, B, T, Hq, Hkv);
    default: return emulate_backward<128>(d_qkv, delta, d_out, qkv, out, lse, B, T, Hq, Hkv);
    }
}
