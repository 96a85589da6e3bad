/* floats.h: float arrays for the kernel tests, random (xorshift64 from a
 * fixed seed, so that failures reproduce) or filled. */
#ifndef TP_TEST_FLOATS_H
#define TP_TEST_FLOATS_H

#include <stdint.h>

float floats_uniform(void);                   /* [-1, 1) */
float *floats_random(int64_t n, float scale); /* scale * floats_uniform(), malloc'ed (one element at least) */
float *floats_filled(int64_t n, float value); /* malloc'ed (one element at least) */

#endif
