/* products_lt.h: what the tests see of products_lt.cu (products with their
 * bias, or the MLP's GELU, in cuBLASLt's epilogue), and the GELU products
 * linear.cu asks it for; private to kernels/cuda and its tests. Plain C. */
#ifndef TP_KERNELS_CUDA_PRODUCTS_LT_H
#define TP_KERNELS_CUDA_PRODUCTS_LT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* How many products this process has queued with the bias in cuBLASLt's
 * epilogue (0 in a build without CUDA): the tests check that the epilogue
 * runs, not only that the results are right (the separate bias kernel gives
 * them too). */
int64_t cuda_lt_bias_epilogue_products(void);
/* Of those, how many wrote a bf16 D (matmul_forward_bf16_bits' out; the
 * rest wrote fp32, also where the bits product's fp32 route ran). */
int64_t cuda_lt_bias_epilogue_bits_products(void);
/* How many matmul_forward_gelu_bf16 products ran with GELU (and the bias,
 * if any) in cuBLASLt's epilogue (GELU_AUX_BIAS, GELU_AUX), and how many
 * matmul_backward_gelu_bf16 d_in products with GELU's gradient in it
 * (DGELU); 0 in a build without CUDA. Counted apart from the bias
 * epilogue's products. */
int64_t cuda_lt_gelu_epilogue_products(void);
int64_t cuda_lt_dgelu_epilogue_products(void);
/* Why the last product cuBLASLt's epilogue did not take went the separate
 * way (its epilogue and shape, and the heuristic's answer or cuBLASLt's
 * error), or "none": for a test's message. */
const char *cuda_lt_last_refusal(void);

#ifdef __cplusplus
}
#endif

#endif
