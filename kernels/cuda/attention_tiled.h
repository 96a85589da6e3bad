/* attention_tiled.h: causal attention on the GPU in tiles (attention_tiled.cu),
 * the alternative to attention.cu's kernels of a warp per row, and its
 * emulation on the CPU.
 *
 * Shapes as kernels.h's attention_forward and attention_backward:
 * qkv[B, T, (Hq + 2 Hkv) hd], out and d_out [B, T, Hq hd], lse and delta
 * [B, Hq, T]. Tiled kernels take head sizes of 32, 64, 128 and 256, and 1
 * to 65535 batches and query heads (cuda_attention_tiled_fits); attention.cu
 * keeps its own kernels for the others. */
#ifndef TP_KERNELS_CUDA_ATTENTION_TILED_H
#define TP_KERNELS_CUDA_ATTENTION_TILED_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Which code the CUDA backend runs for attention: unset (NULL or ""), the
 * default: cuDNN's flash attention for the bf16 operations where it takes
 * the shape (attention_cudnn.h), the tiled kernels otherwise and for fp32;
 * "cudnn": the same, but a shape cuDNN does not take (or a graph it does not
 * build) is an error of the bf16 operations instead of a fall-back; "tiled":
 * the tiled kernels (bf16: on rounded operands); "rows": a warp per row;
 * "tf32x3": as the default, but the fp32 kernels are the tensor cores'
 * (attention_tf32x3.h) where they fit. The tiled kernels leave the shapes
 * they do not fit to the rows kernels, the tf32x3 kernels to the tiled. The
 * backend reads TP_CUDA_ATTENTION when it is made; this sets it for the
 * process afterwards (tests). TP_ERR_ARG for another name. */
int cuda_attention_variant(const char *name);

/* Whether the bf16 attention's backward through cuDNN repeats bit for bit
 * (TP_CUDA_DETERMINISTIC): "1", cuDNN's deterministic graph
 * (attention_cudnn.h, CUDNN_ATTENTION_BACKWARD_DETERMINISTIC); unset, "" or
 * "0", its default graph, whose dQ sums in an order that varies from run to
 * run. Every other operation of the backend repeats bit for bit either way
 * (the tiled and rows kernels have one writer an element; the embedding's
 * gradient adds a token's rows in order; cuBLAS repeats on one GPU). The
 * backend reads TP_CUDA_DETERMINISTIC when it is made; this sets it for the
 * process afterwards (tests). TP_ERR_ARG for another value. */
int cuda_deterministic_variant(const char *value);

/* The rows a thread of the tiled forward holds (TP_CUDA_TILED_FORWARD_ROWS):
 * "2", "3" or "4"; unset or "", 4. More rows read each shared part for more
 * of them, fewer leave room for more blocks an SM (attention_tiled.cu).
 * The emulation takes the same choice. The backend reads the variable when
 * it is made; this sets it for the process afterwards (tests). TP_ERR_ARG
 * for another value. */
int cuda_tiled_forward_rows_variant(const char *value);

/* The rows a thread of the tiled backward's kernels holds
 * (TP_CUDA_TILED_BACKWARD_ROWS): "1" or "2"; unset or "", 2. Two rows read
 * each shared part for both (the keys kernel takes about 216 registers, 2
 * blocks an SM at head size 64); one leaves room for more blocks. As the
 * forward's choice: the emulation takes it too, the backend reads the
 * variable when it is made, this sets it for the process afterwards
 * (tests); TP_ERR_ARG for another value. */
int cuda_tiled_backward_rows_variant(const char *value);

/* Whether the tiled kernels take this shape. */
int cuda_attention_tiled_fits(int64_t B, int64_t Hq, int64_t hd);

/* The tiled kernels' work done on the CPU, on host memory, the way the
 * kernels do it: the same tiles in the same order, each thread's part of a
 * row and the sums across a row's threads in the kernels' order; only
 * expf and logf are the host's. For tests of the kernels' indexing and
 * arithmetic on machines without a GPU. d_qkv is written whole; delta
 * [B, Hq, T] is the backward's d_out . out per row. TP_ERR_ARG where the
 * shape does not fit; TP_ERR_DEVICE in a build without CUDA. */
int cuda_attention_tiled_emulate_forward(float *out, float *lse, const float *qkv, int64_t B, int64_t T, int64_t Hq,
                                         int64_t Hkv, int64_t hd);
int cuda_attention_tiled_emulate_backward(float *d_qkv, float *delta, const float *d_out, const float *qkv,
                                          const float *out, const float *lse, int64_t B, int64_t T, int64_t Hq,
                                          int64_t Hkv, int64_t hd);

#ifdef __cplusplus
}
#endif

#endif
