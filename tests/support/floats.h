/* floats.h: float arrays for the kernel tests, random (xorshift64 from a
 * fixed seed, so that failures reproduce) or filled, and their bf16 bits. */
#ifndef TP_TEST_FLOATS_H
#define TP_TEST_FLOATS_H

#include <stdint.h>

float floats_uniform(void);                   /* [-1, 1) */
float *floats_random(int64_t n, float scale); /* scale * floats_uniform(), malloc'ed (one element at least) */
float *floats_filled(int64_t n, float value); /* malloc'ed (one element at least) */

/* bf16 activations (kernels.h): x rounded to bf16 bits (convert_from_f32),
 * malloc'ed (one element at least); and the test's failure unless every
 * got[i] is the bits of rounding fp32[i], naming `what`, the index, both
 * bits and the fp32 value. */
uint16_t *floats_bf16_bits(const float *x, int64_t n);
float *floats_of_bf16_bits(const uint16_t *bits, int64_t n); /* widened (exact), malloc'ed */
/* x rounded to bf16, as fp32 values, malloc'ed; NULL for NULL (a bias a
 * product written in bf16 rounds, kernels.h). */
float *floats_rounded_to_bf16(const float *x, int64_t n);
void floats_assert_rounded(const uint16_t *got, const float *fp32, int64_t n, const char *what);

#endif
