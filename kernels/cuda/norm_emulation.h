/* norm_emulation.h: the CUDA norms' backward in one pass (norm.cu's fused
 * kernel, rows up to 1,024 wide: GPT-2's and Llama's widths up to 350M)
 * worked on the CPU, for tests of the kernel's indexing on machines without
 * a GPU. C. */
#ifndef TP_KERNELS_CUDA_NORM_EMULATION_H
#define TP_KERNELS_CUDA_NORM_EMULATION_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* kernels.h's layernorm_backward and rmsnorm_backward (the same arguments,
 * host memory) the way the fused kernel computes them: its blocks, warps,
 * rows, lanes' columns, the warps' butterfly sums and the order of every
 * addition of the weight's and bias's gradients (its partials, then the
 * column sums' emulation). TP_ERR_ARG for rows over 1,024 columns (they
 * take the rows kernel and the column sums), TP_ERR_DEVICE in a build
 * without CUDA. */
int cuda_layernorm_backward_emulate(float *d_in, uint16_t *d_in_bits, float *d_weight, float *d_bias,
                                    const float *d_out, const float *in, const float *weight, const float *mean,
                                    const float *rstd, int64_t N, int64_t C);
int cuda_rmsnorm_backward_emulate(float *d_in, uint16_t *d_in_bits, float *d_weight, const float *d_out,
                                  const float *in, const float *weight, const float *rstd, int64_t N, int64_t C);

#ifdef __cplusplus
}
#endif

#endif
