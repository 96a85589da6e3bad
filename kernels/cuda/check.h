/* check.h: CUDA runtime calls in the project's error convention. */
#ifndef TP_KERNELS_CUDA_CHECK_H
#define TP_KERNELS_CUDA_CHECK_H

#include <cuda_runtime.h>

extern "C" {
#include "../../common/error.h"
}

/* On failure: records "file:line: call: CUDA's reason" as a TP_ERR_DEVICE
 * failure and jumps to the function's `fail` label. */
#define CUDA_TRY(call)                                                                                                 \
    do {                                                                                                               \
        cudaError_t cuda_try_error_ = (call);                                                                          \
        if (cuda_try_error_ != cudaSuccess) {                                                                          \
            tp_fail(TP_ERR_DEVICE, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(cuda_try_error_));   \
            goto fail;                                                                                                 \
        }                                                                                                              \
    } while (0)

#endif
