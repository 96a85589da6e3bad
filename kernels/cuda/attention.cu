/* attention.cu: causal attention with a warp per row on the GPU, the twin
 * of cpu/attention.c; the tiled kernels (attention_tiled.cu) run instead
 * where they fit and are chosen. */
#include <math.h>
#include <stdint.h>

extern "C" {
#include "../kernels.h"
}
#include "internal.h"
#include "launch.h"
#include "attention_tiled.h"

/* ============================================================== attention
 * qkv[B,T,(Hq+2Hkv)*hd]: at position t of batch b, query head h at
 * (b T + t) stride + h hd, its key head (h / group) at Hq hd + (h / group) hd
 * and its value head at (Hq + Hkv + h / group) hd, stride = (Hq + 2 Hkv) hd,
 * group = Hq / Hkv. out[B,T,Hq*hd]; lse[B,Hq,T], row r = (b Hq + h) T + i.
 *
 * Memory-efficient, as attention.c: no [T, T] matrix anywhere. A warp per
 * row: each lane holds the dimensions d = lane + 32 e (e < HEAD_DIMS_PER_LANE)
 * of the row's vectors in registers, a score is the warp's sum of the lanes'
 * partial products (every lane gets the same value), and the forward keeps a
 * running maximum and sum (online softmax) so that one pass over the keys
 * suffices. The backward recomputes each probability from lse: one kernel
 * per query row (dq, and delta_i = d_out_i . out_i for the other), one per
 * key row (dk and dv over the query rows and heads that see it). Every
 * element of d_qkv has one writer: no atomics, no zeroing. */

#define HEAD_DIMS_PER_LANE 8 /* head dimensions up to 256 */

/* w runs over warps of the grid (all lanes of a warp see the same w). */
#define WARPS_OF_GRID(w, count)                                                                                        \
    for (int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5; w < (count);                           \
         w += ((int64_t)gridDim.x * blockDim.x) >> 5)
#define LANE_DIMS(e, d, hd)                                                                                            \
    _Pragma("unroll") for (int e = 0, d = (int)(threadIdx.x & 31); e < HEAD_DIMS_PER_LANE && d < (hd); e++, d += 32)

static __device__ float warp_sum(float value)
{
    for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
    return value;
}

/* The warp's dot product of a row held in registers with the row at p. */
static __device__ float warp_dot(const float *held, const float *p, int64_t hd)
{
    float partial = 0;
    LANE_DIMS(e, d, hd) partial += held[e] * p[d];
    return warp_sum(partial);
}

static __device__ void load_row(float *held, const float *p, int64_t hd)
{
    LANE_DIMS(e, d, hd) held[e] = p[d];
}

static __global__ void attention_forward_kernel(float *out, float *lse, const float *qkv, int64_t B, int64_t T,
                                                int64_t Hq, int64_t Hkv, int64_t hd, float scale)
{
    int64_t stride = (Hq + 2 * Hkv) * hd, group = Hq / Hkv;
    WARPS_OF_GRID(r, B * Hq * T) {
        int64_t i = r % T, h = (r / T) % Hq, b = r / (T * Hq);
        const float *k = qkv + b * T * stride + (Hq + h / group) * hd; /* key j at k + j stride */
        const float *v = qkv + b * T * stride + (Hq + Hkv + h / group) * hd;
        float q[HEAD_DIMS_PER_LANE], acc[HEAD_DIMS_PER_LANE] = {0};
        load_row(q, qkv + (b * T + i) * stride + h * hd, hd);
        float max = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= i; j++) {
            float s = warp_dot(q, k + j * stride, hd) * scale;
            float new_max = fmaxf(max, s), rescale = expf(max - new_max), p = expf(s - new_max);
            sum = sum * rescale + p;
            LANE_DIMS(e, d, hd) acc[e] = acc[e] * rescale + p * v[j * stride + d];
            max = new_max;
        }
        float *o = out + (b * T + i) * Hq * hd + h * hd;
        LANE_DIMS(e, d, hd) o[d] = acc[e] / sum;
        if ((threadIdx.x & 31) == 0) lse[r] = max + logf(sum);
    }
}

/* A warp per query row r: delta[r] = d_out_i . out_i, then
 * dq_i = sum_{j <= i} p_ij (d_out_i . v_j - delta) scale k_j. */
static __global__ void attention_backward_queries_kernel(float *d_qkv, float *delta, const float *d_out,
                                                         const float *qkv, const float *out, const float *lse,
                                                         int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd,
                                                         float scale)
{
    int64_t stride = (Hq + 2 * Hkv) * hd, group = Hq / Hkv;
    WARPS_OF_GRID(r, B * Hq * T) {
        int64_t i = r % T, h = (r / T) % Hq, b = r / (T * Hq), row = (b * T + i) * Hq * hd + h * hd;
        const float *k = qkv + b * T * stride + (Hq + h / group) * hd;
        const float *v = qkv + b * T * stride + (Hq + Hkv + h / group) * hd;
        float q[HEAD_DIMS_PER_LANE], g[HEAD_DIMS_PER_LANE], dq[HEAD_DIMS_PER_LANE] = {0};
        load_row(q, qkv + (b * T + i) * stride + h * hd, hd);
        load_row(g, d_out + row, hd);
        float row_delta = warp_dot(g, out + row, hd), row_lse = lse[r];
        if ((threadIdx.x & 31) == 0) delta[r] = row_delta;
        for (int64_t j = 0; j <= i; j++) {
            float p = expf(warp_dot(q, k + j * stride, hd) * scale - row_lse);
            float ds = p * (warp_dot(g, v + j * stride, hd) - row_delta) * scale;
            LANE_DIMS(e, d, hd) dq[e] += ds * k[j * stride + d];
        }
        float *dst = d_qkv + (b * T + i) * stride + h * hd;
        LANE_DIMS(e, d, hd) dst[d] = dq[e];
    }
}

/* A warp per key row (b, key head kh, j), after the queries kernel (delta):
 * over the group's query heads h and rows i >= j,
 * dk_j = sum p_ij (d_out_i . v_j - delta_i) scale q_i, dv_j = sum p_ij d_out_i. */
static __global__ void attention_backward_keys_kernel(float *d_qkv, const float *delta, const float *d_out,
                                                      const float *qkv, const float *lse, int64_t B, int64_t T,
                                                      int64_t Hq, int64_t Hkv, int64_t hd, float scale)
{
    int64_t stride = (Hq + 2 * Hkv) * hd, group = Hq / Hkv;
    WARPS_OF_GRID(r, B * Hkv * T) {
        int64_t j = r % T, kh = (r / T) % Hkv, b = r / (T * Hkv);
        float k[HEAD_DIMS_PER_LANE], v[HEAD_DIMS_PER_LANE], dk[HEAD_DIMS_PER_LANE] = {0}, dv[HEAD_DIMS_PER_LANE] = {0};
        load_row(k, qkv + (b * T + j) * stride + (Hq + kh) * hd, hd);
        load_row(v, qkv + (b * T + j) * stride + (Hq + Hkv + kh) * hd, hd);
        for (int64_t h = kh * group; h < (kh + 1) * group; h++) {
            const float *row_lse = lse + (b * Hq + h) * T, *row_delta = delta + (b * Hq + h) * T;
            for (int64_t i = j; i < T; i++) {
                const float *q = qkv + (b * T + i) * stride + h * hd, *g = d_out + (b * T + i) * Hq * hd + h * hd;
                float p = expf(warp_dot(k, q, hd) * scale - row_lse[i]);
                float ds = p * (warp_dot(v, g, hd) - row_delta[i]) * scale;
                LANE_DIMS(e, d, hd) dk[e] += ds * q[d], dv[e] += p * g[d];
            }
        }
        float *dst = d_qkv + (b * T + j) * stride;
        LANE_DIMS(e, d, hd) dst[(Hq + kh) * hd + d] = dk[e], dst[(Hq + Hkv + kh) * hd + d] = dv[e];
    }
}

static int attention_shape_ok(const char *what, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd)
{
    if (B < 0 || T < 0 || Hq < 0 || hd <= 0 || hd > 32 * HEAD_DIMS_PER_LANE || Hkv <= 0 || Hq % Hkv != 0)
        return tp_fail(TP_ERR_ARG,
                       "CUDA %s: B=%lld T=%lld Hq=%lld Hkv=%lld hd=%lld (want 0 < hd <= %d and Hq a multiple of "
                       "Hkv > 0)",
                       what, (long long)B, (long long)T, (long long)Hq, (long long)Hkv, (long long)hd,
                       32 * HEAD_DIMS_PER_LANE);
    return TP_OK;
}

/* The scratch: the forward needs none; the backward keeps delta[B,Hq,T] at
 * its start. */
int cuda_attention_forward(float *out, float *lse, float *scratch, const float *qkv, int64_t B, int64_t T,
                           int64_t Hq, int64_t Hkv, int64_t hd)
{
    float scale = 1.0f / sqrtf((float)hd);
    (void)scratch;
    TP_TRY(attention_shape_ok("attention_forward", B, T, Hq, Hkv, hd));
    ENTER();
    if (B == 0 || T == 0 || Hq == 0) return TP_OK;
    if (cuda_attention_tiled_chosen() && cuda_attention_tiled_fits(B, Hq, hd))
        return cuda_attention_tiled_forward(out, lse, qkv, B, T, Hq, Hkv, hd, cuda_state.stream);
    attention_forward_kernel<<<blocks_for(B * Hq * T * 32, THREADS), THREADS, 0, cuda_state.stream>>>(out, lse, qkv, B, T,
                                                                                                  Hq, Hkv, hd, scale);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

int cuda_attention_backward(float *d_qkv, float *scratch, const float *d_out, const float *qkv,
                            const float *out, const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                            int64_t hd)
{
    float scale = 1.0f / sqrtf((float)hd);
    TP_TRY(attention_shape_ok("attention_backward", B, T, Hq, Hkv, hd));
    ENTER();
    if (B == 0 || T == 0) return TP_OK;
    if (cuda_attention_tiled_chosen() && cuda_attention_tiled_fits(B, Hq, hd))
        return cuda_attention_tiled_backward(d_qkv, scratch, d_out, qkv, out, lse, B, T, Hq, Hkv, hd, cuda_state.stream);
    attention_backward_queries_kernel<<<blocks_for(B * Hq * T * 32, THREADS), THREADS, 0, cuda_state.stream>>>(
        d_qkv, scratch, d_out, qkv, out, lse, B, T, Hq, Hkv, hd, scale);
    LAUNCH_CHECK();
    attention_backward_keys_kernel<<<blocks_for(B * Hkv * T * 32, THREADS), THREADS, 0, cuda_state.stream>>>(
        d_qkv, scratch, d_out, qkv, lse, B, T, Hq, Hkv, hd, scale);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}
