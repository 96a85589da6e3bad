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

/* An operand of a bf16 product: fp32 values, rounded to bf16 on the way,
 * or bf16 bits taken as they are (a bf16 activation, kernels.h); exactly
 * one of the two is set. */
typedef struct {
    const float *values;
    const uint16_t *bits;
} bf16_operand;

static inline bf16_operand bf16_of_values(const float *values)
{
    return (bf16_operand){values, NULL};
}

static inline bf16_operand bf16_of_bits(const uint16_t *bits)
{
    return (bf16_operand){NULL, bits};
}

/* c[M, N] = (or += with accumulate) bf16(a) @ bf16(b), summed in fp32, where
 * a is [M, K] row-major ([K, M] with trans_a) and b is [K, N] ([N, K] with
 * trans_b). TP_ERR_NOMEM without scratch; TP_ERR_DEVICE when oneDNN fails
 * or is not available. */
int bf16_product(float *c, bf16_operand a, bf16_operand b, int64_t M, int64_t N, int64_t K, int trans_a, int trans_b,
                 int accumulate);

/* The backward of a bf16 product (linear.c) from the gradient d_out[N, OC]
 * as bf16 bits (matmul_backward_bf16 and its _bits and _gelu twins, the
 * classifier's d_logits): d_in[N,C] = d_out @ weight[OC,C] (bf16 bits);
 * d_weight += d_out^T @ in (bf16 bits [N,C]); d_bias += the column sums of
 * d_out's values; any may be NULL. TP_ERR_NOMEM without scratch;
 * TP_ERR_DEVICE when oneDNN fails. */
int bf16_product_backward(float *d_in, float *d_weight, float *d_bias, const uint16_t *d_out, const uint16_t *in,
                          const uint16_t *weight, int64_t N, int64_t C, int64_t OC);

/* n values of an operand as fp32 in a new buffer (NULL when out of
 * memory; free() releases it): the values rounded to bf16
 * (bits_f32_to_bf16, convert_bits.h), or the bits widened (exact). The
 * operands of the products emulated by sgemm (linear.c) and of the bf16
 * attention (attention.c). */
float *bf16_operand_as_f32(bf16_operand x, int64_t n);

#endif
