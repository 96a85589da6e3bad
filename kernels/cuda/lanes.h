/* lanes.h: for kernel code that its CPU emulation runs too
 * (test_attention_tiled, test_attention_tf32x3, test_norm_backward): loops
 * unrolled on the device only, and a warp's work written once over the
 * lanes its caller holds. On the GPU a thread holds its own lane (L = 1);
 * in the emulation one caller holds the warp's 32 (L = 32), its values v[l]
 * of lane l side by side. CUDA C++, included by .cu files only. */
#ifndef TP_KERNELS_CUDA_LANES_H
#define TP_KERNELS_CUDA_LANES_H

#include <cuda_runtime.h>

/* Loops unrolled on the device, so that per-row or per-lane arrays stay in
 * registers (the host's compiler, for the emulations, does not know the
 * pragma). */
#ifdef __CUDA_ARCH__
#define UNROLL _Pragma("unroll")
#else
#define UNROLL
#endif

/* The warp's lane number of the l-th lane held. */
template <int L> static __host__ __device__ inline int lane_number(int l)
{
#ifdef __CUDA_ARCH__
    (void)l;
    return (int)(threadIdx.x & 31);
#else
    return l;
#endif
}

/* v[l] of every lane held replaced by the sum over the warp's 32 lanes, the
 * same in each: butterflies at offsets 16, 8, 4, 2, 1, each lane adding its
 * partner's value to its own (shuffles on the GPU; the same additions in
 * the same pairs on the host, so the same bits). */
template <int L> static __host__ __device__ inline void lanes_sum(float *v)
{
#ifdef __CUDA_ARCH__
    for (int offset = 16; offset > 0; offset >>= 1) v[0] += __shfl_xor_sync(0xffffffffu, v[0], offset);
#else
    static_assert(L == 32, "the emulation holds the warp's 32 lanes");
    for (int offset = 16; offset > 0; offset >>= 1) {
        float was[L];
        for (int l = 0; l < L; l++) was[l] = v[l];
        for (int l = 0; l < L; l++) v[l] = was[l] + was[l ^ offset];
    }
#endif
}

#endif
