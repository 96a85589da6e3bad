/* rope.cu: rotary position embeddings on the GPU, the twin of cpu/rope.c
 * (in place in fp32, into bf16 bits: rope_forward_bf16, or in place in bf16
 * bits: rope_backward_bf16). */
#include <math.h>
#include <stdint.h>

extern "C" {
#include "../kernels.h"
}
#include "internal.h"
#include "launch.h"

/* ======================================================= rotary embeddings
 * As rope.c: in each of the first H = Hq + Hkv heads of every row of
 * qkv[B,T,(Hq+2Hkv)*hd], element j < hd/2 and j + hd/2 turn by the angle
 * whose (cos, sin) is cos_sin[t, j]; sign +1 forward, -1 backward (the
 * transpose). A block per row (one 64-bit division a row, not an element:
 * ROWS_AND_COLUMNS in launch.h), a pair per thread: no two threads share an
 * element.
 *
 * One kernel, templated on its output (store_value, launch.h) and its input
 * (load_value): float in place (out is qkv: rope_forward, rope_backward);
 * float in, uint16_t out, the bf16 bits of each value it would leave in
 * qkv, written to out and qkv left as it is (rope_forward_bf16: a bf16
 * activation, kernels.h); or uint16_t in place (rope_backward_bf16: the
 * attention's bf16 d_qkv), each value widened, turned and rounded. The
 * arithmetic is one source for all, so the bits are those of rounding what
 * the fp32 kernel writes from the same values, by construction. Out of
 * place, the values no pair turns (the V heads; with an odd hd the last
 * value of each Q and K head) are rounded into out too (keep_unturned):
 * every element of out is written; in place they stay as they are (bits
 * too: not widened and rounded back, which would quiet a signaling NaN). */

/* In place (fp32, or bf16 bits): the values no pair turns stay where they are. */
template <typename T>
static __device__ inline void keep_unturned(T *out, const T *qkv, int64_t H, int64_t width, int64_t hd)
{
    (void)out, (void)qkv, (void)H, (void)width, (void)hd;
}

/* Out of place: a row's values that no pair turns, rounded into out's row
 * (out, qkv: the row's start; width: the row's values). */
static __device__ inline void keep_unturned(uint16_t *out, const float *qkv, int64_t H, int64_t width, int64_t hd)
{
    for (int64_t i = H * hd + threadIdx.x; i < width; i += blockDim.x) store_value(&out[i], qkv[i]); /* V */
    if (hd % 2) /* the last value of each Q and K head */
        for (int64_t h = threadIdx.x; h < H; h += blockDim.x) store_value(&out[h * hd + hd - 1], qkv[h * hd + hd - 1]);
}

template <typename Out, typename In>
static __global__ void rope_kernel(Out *out, const In *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t H,
                                   int64_t stride, int64_t hd, float sign)
{
    int half = (int)(hd / 2), pairs = (int)(H * half); /* a row's, int: rope_turn checks */
    ROWS_OF_BLOCK(row, B * T) {
        int64_t t = row % T;
        for (int k = threadIdx.x; k < pairs; k += blockDim.x) {
            int h = k / half, j = k - h * half;
            const In *x = qkv + row * stride + (int64_t)h * hd;
            Out *y = out + row * stride + (int64_t)h * hd;
            float c = cos_sin[(t * half + j) * 2], s = sign * cos_sin[(t * half + j) * 2 + 1];
            float lo = load_value(&x[j]), hi = load_value(&x[j + half]); /* both read before either is written */
            store_value(&y[j], lo * c - hi * s);
            store_value(&y[j + half], hi * c + lo * s);
        }
        keep_unturned(out + row * stride, qkv + row * stride, H, stride, hd);
    }
}

/* out: qkv itself (float or bf16 bits, in place) or bf16 bits of its shape. */
template <typename Out, typename In>
static int rope_turn(Out *out, const In *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                     int64_t hd, float sign)
{
    ENTER();
    /* In place, nothing to do without a pair to turn; out of place, every value is written */
    if (B <= 0 || T <= 0 || Hq + 2 * Hkv <= 0 || hd <= 0) return TP_OK;
    if ((void *)out == (const void *)qkv && (Hq + Hkv <= 0 || hd / 2 <= 0)) return TP_OK;
    if ((Hq + Hkv) * (hd / 2) > INT32_MAX - THREADS) /* the thread's int counter passes the count by < THREADS */
        return tp_fail(TP_ERR_ARG, "CUDA rope: %lld heads of %lld values, beyond a row's int count of pairs",
                       (long long)(Hq + Hkv), (long long)hd);
    rope_kernel<<<blocks_for(B * T, 1), THREADS, 0, cuda_state.stream>>>(out, qkv, cos_sin, B, T, Hq + Hkv,
                                                                         (Hq + 2 * Hkv) * hd, hd, sign);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

int cuda_rope_forward(float *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                      int64_t hd)
{
    return rope_turn(qkv, qkv, cos_sin, B, T, Hq, Hkv, hd, 1.0f);
}

int cuda_rope_backward(float *d_qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                       int64_t hd)
{
    return rope_turn(d_qkv, d_qkv, cos_sin, B, T, Hq, Hkv, hd, -1.0f);
}

int cuda_rope_forward_bf16(uint16_t *out, const float *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq,
                           int64_t Hkv, int64_t hd)
{
    return rope_turn(out, qkv, cos_sin, B, T, Hq, Hkv, hd, 1.0f);
}

int cuda_rope_backward_bf16(uint16_t *d_qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                            int64_t hd)
{
    return rope_turn(d_qkv, d_qkv, cos_sin, B, T, Hq, Hkv, hd, -1.0f);
}
