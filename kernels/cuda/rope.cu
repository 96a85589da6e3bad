/* rope.cu: rotary position embeddings on the GPU, the twin of cpu/rope.c. */
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
 * ROWS_AND_COLUMNS in launch.h), a pair per thread, in place: no two threads
 * share an element. */

static __global__ void rope_kernel(float *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t H, int64_t stride,
                                   int64_t hd, float sign)
{
    int half = (int)(hd / 2), pairs = (int)(H * half); /* a row's, int: rope_turn checks */
    ROWS_OF_BLOCK(row, B * T) {
        int64_t t = row % T;
        for (int k = threadIdx.x; k < pairs; k += blockDim.x) {
            int h = k / half, j = k - h * half;
            float *x = qkv + row * stride + (int64_t)h * hd;
            float c = cos_sin[(t * half + j) * 2], s = sign * cos_sin[(t * half + j) * 2 + 1];
            float lo = x[j], hi = x[j + half];
            x[j] = lo * c - hi * s;
            x[j + half] = hi * c + lo * s;
        }
    }
}

static int rope_turn(float *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd,
                     float sign)
{
    ENTER();
    if (B <= 0 || T <= 0 || Hq + Hkv <= 0 || hd / 2 <= 0) return TP_OK;
    if ((Hq + Hkv) * (hd / 2) > INT32_MAX - THREADS) /* the thread's int counter passes the count by < THREADS */
        return tp_fail(TP_ERR_ARG, "CUDA rope: %lld heads of %lld values, beyond a row's int count of pairs",
                       (long long)(Hq + Hkv), (long long)hd);
    rope_kernel<<<blocks_for(B * T, 1), THREADS, 0, cuda_state.stream>>>(
        qkv, cos_sin, B, T, Hq + Hkv, (Hq + 2 * Hkv) * hd, hd, sign);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

int cuda_rope_forward(float *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                      int64_t hd)
{
    return rope_turn(qkv, cos_sin, B, T, Hq, Hkv, hd, 1.0f);
}

int cuda_rope_backward(float *d_qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                       int64_t hd)
{
    return rope_turn(d_qkv, cos_sin, B, T, Hq, Hkv, hd, -1.0f);
}
