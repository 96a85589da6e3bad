/* bf16_products.h: bf16 matrix products on the CPU (oneDNN), for the CPU
 * backend's bf16 mixed precision (linear.c), and the rounding of operands
 * where they are emulated. */
#ifndef TP_BF16_PRODUCTS_H
#define TP_BF16_PRODUCTS_H

#include <stdint.h>

/* Whether this CPU multiplies bf16 itself (AVX512_BF16 or AMX) and oneDNN
 * can run there; otherwise (or with TP_NO_ONEDNN set) linear.c emulates the
 * products with sgemm on rounded operands. */
int bf16_products_available(void);

/* oneDNN's ISA on this CPU as capped by ONEDNN_MAX_CPU_ISA, by oneDNN's
 * name for it ("avx2", "avx512_core_bf16", ...). */
const char *onednn_isa_name(void);

/* c[M, N] = (or += with accumulate) bf16(a) @ bf16(b), summed in fp32, where
 * a is [M, K] row-major ([K, M] with trans_a) and b is [K, N] ([N, K] with
 * trans_b). TP_ERR_NOMEM without scratch; TP_ERR_DEVICE when oneDNN fails
 * or is not available. */
int bf16_product(float *c, const float *a, const float *b, int64_t M, int64_t N, int64_t K, int trans_a, int trans_b,
                 int accumulate);

/* n values of x rounded to bf16 (bits_f32_to_bf16, convert_bits.h), kept as
 * fp32, in a new buffer (NULL when out of memory); free() releases it. The
 * operands of the products emulated by sgemm (linear.c) and of the bf16
 * attention (attention.c). */
float *rounded_to_bf16(const float *x, int64_t n);

#endif
