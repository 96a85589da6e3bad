/* internal.h: what the CUDA files of kernels/ share beyond kernels.h. */
#ifndef TP_KERNELS_CUDA_INTERNAL_H
#define TP_KERNELS_CUDA_INTERNAL_H

#include <cuda_runtime.h>

/* The CUDA backend's stream and device (backend.cu); fails with
 * TP_ERR_STATE when kernels_cuda has not made the backend yet. */
extern "C" int cuda_backend_stream(cudaStream_t *stream, int *device);

#endif
