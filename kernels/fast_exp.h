/* fast_exp.h: expf as plain arithmetic, so that loops calling it vectorize
 * (glibc's expf is a call per element). Within 2 ulp of expf on [-87, 88];
 * inputs outside are clamped there (exp(-87) ~ 1.6e-38, exp(88) ~ 1.7e38);
 * NaN stays NaN. Used where a kernel applies exp to every element. */
#ifndef TP_FAST_EXP_H
#define TP_FAST_EXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float fast_expf(float x)
{
    /* exp(x) = 2^k exp(r), k = round(x / ln2), r = x - k ln2 in [-ln2/2, ln2/2],
     * with ln2 split in two (Cody and Waite) so that r is exact to float
     * precision, and exp(r) by its Taylor series to r^7 (error < 6e-9). */
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    float clamped = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
    clamped = x == x ? clamped : 0.0f; /* NaN: computed as 0, returned as NaN (a NaN to int is undefined) */
    float k = floorf(clamped * log2e + 0.5f);
    float r = (clamped - k * ln2_hi) - k * ln2_lo;
    float p = 1.0f / 5040;
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)k + 127) << 23; /* 2^k, k in [-126, 127] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x != x ? x : p * scale;
}

#endif
