/* attention_kernels.h: what the tiled attention (attention_tiled.cu) and the
 * tensor cores' (attention_tf32x3.cu) share: loops unrolled on the device,
 * 64-bit minima and maxima for the device and the emulation, the grid's
 * limits, a launch's status and the emulations' check of a shape. CUDA C++,
 * included by those two files only. */
#ifndef TP_KERNELS_CUDA_ATTENTION_KERNELS_H
#define TP_KERNELS_CUDA_ATTENTION_KERNELS_H

#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "../../common/error.h"
}
#include "lanes.h" /* UNROLL */

static __host__ __device__ inline int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

static __host__ __device__ inline int64_t max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

/* Whether a grid of (row blocks, Hq, B) launches: its y and z take 1 to
 * 65535. */
static inline int attention_grid_fits(int64_t B, int64_t Hq)
{
    return B >= 1 && B <= 65535 && Hq >= 1 && Hq <= 65535;
}

/* TP_OK, or TP_ERR_DEVICE naming the kernel `what` whose launch failed. */
static inline int attention_launch_status(const char *what)
{
    cudaError_t error = cudaGetLastError();
    return error == cudaSuccess ? TP_OK : tp_fail(TP_ERR_DEVICE, "CUDA %s: %s", what, cudaGetErrorString(error));
}

/* An emulation's check of its shape: TP_ERR_ARG, naming the `kernels` and
 * the shape, unless they fit (`fits`), T >= 0 and Hkv >= 1 divides Hq. */
static inline int attention_emulation_shape(int fits, const char *kernels, int64_t B, int64_t T, int64_t Hq,
                                            int64_t Hkv, int64_t hd)
{
    if (!fits || T < 0 || Hkv < 1 || Hq % Hkv != 0)
        return tp_fail(TP_ERR_ARG, "%s attention: B=%lld T=%lld Hq=%lld Hkv=%lld hd=%lld do not fit", kernels,
                       (long long)B, (long long)T, (long long)Hq, (long long)Hkv, (long long)hd);
    return TP_OK;
}

#endif
