/* internal.h: what the CUDA files of kernels/ share beyond kernels.h. */
#ifndef TP_KERNELS_CUDA_INTERNAL_H
#define TP_KERNELS_CUDA_INTERNAL_H

#include <cuda_runtime.h>
#include <stdint.h>

/* The CUDA backend's stream and device (backend.cu); fails with
 * TP_ERR_STATE when kernels_cuda has not made the backend yet. */
extern "C" int cuda_backend_stream(cudaStream_t *stream, int *device);

/* attention_tiled.cu: the tiled attention kernels launched on `stream`
 * (shapes: attention_tiled.h; delta is the backward's scratch, [B, Hq, T]);
 * TP_ERR_DEVICE with CUDA's reason when a launch fails. Whether the backend
 * runs them (cuda_attention_variant). */
int cuda_attention_tiled_forward(float *out, float *lse, const float *qkv, int64_t B, int64_t T, int64_t Hq,
                                 int64_t Hkv, int64_t hd, cudaStream_t stream);
int cuda_attention_tiled_backward(float *d_qkv, float *delta, const float *d_out, const float *qkv, const float *out,
                                  const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd,
                                  cudaStream_t stream);
int cuda_attention_tiled_chosen(void);

#endif
