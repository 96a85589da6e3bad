/* attention_tf32x3.h: the fp32 causal attention on the tensor cores, each
 * product as three TF32 products (attention_tf32x3.cu), and its emulation
 * on the CPU.
 *
 * Shapes as kernels.h's attention_forward and attention_backward:
 * qkv[B, T, (Hq + 2 Hkv) hd], out and d_out [B, T, Hq hd], lse and delta
 * [B, Hq, T]. The kernels take head sizes of 32, 64 and 128 and 1 to 65535
 * batches and query heads (cuda_attention_tf32x3_fits); the tiled kernels
 * (attention_tiled.h) keep the others. The backend runs them for the fp32
 * operations under TP_CUDA_ATTENTION=tf32x3 (cuda_attention_variant). */
#ifndef TP_KERNELS_CUDA_ATTENTION_TF32X3_H
#define TP_KERNELS_CUDA_ATTENTION_TF32X3_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Whether the kernels take this shape. */
int cuda_attention_tf32x3_fits(int64_t B, int64_t Hq, int64_t hd);

/* The kernels' work done on the CPU, on host memory, the way the kernels do
 * it: the same blocks, warps and tiles, each lane's fragments of the tensor
 * cores' operands and results in the instruction's layout, the operands
 * split into TF32 parts as the kernels split them, the cross-lane sums and
 * maxima in the shuffles' order. Only the tensor cores' own sums (an 8-term
 * product added in order here) and expf and logf are the host's. For tests
 * of the kernels' indexing and arithmetic on machines without a GPU. d_qkv
 * is written whole; delta [B, Hq, T] is d_out . out per row. TP_ERR_ARG
 * where the shape does not fit; TP_ERR_NOMEM; TP_ERR_DEVICE in a build
 * without CUDA. */
int cuda_attention_tf32x3_emulate_forward(float *out, float *lse, const float *qkv, int64_t B, int64_t T, int64_t Hq,
                                          int64_t Hkv, int64_t hd);
int cuda_attention_tf32x3_emulate_backward(float *d_qkv, float *delta, const float *d_out, const float *qkv,
                                           const float *out, const float *lse, int64_t B, int64_t T, int64_t Hq,
                                           int64_t Hkv, int64_t hd);

#ifdef __cplusplus
}
#endif

#endif
