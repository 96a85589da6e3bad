/* convert_bits.h: bit-level float conversions shared by the CPU kernels and
 * their CUDA twins, so both round identically by construction. */
#ifndef TP_CONVERT_BITS_H
#define TP_CONVERT_BITS_H

#include <stdint.h>

#ifdef __CUDACC__
#define BITS_FN static inline __host__ __device__
#else
#define BITS_FN static inline
#endif

/* bf16 is the top half of an fp32: widening is a shift. */
BITS_FN uint32_t bits_bf16_to_f32(uint16_t h)
{
    return (uint32_t)h << 16;
}

/* Both results computed and one chosen, without a branch: loops of it
 * vectorize (a branch kept rounding scalar, 7% of a bf16 training step). */
BITS_FN uint16_t bits_f32_to_bf16(uint32_t x)
{
    uint32_t quiet_nan = (x >> 16) | 0x0040u;
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16; /* to nearest, ties to even */
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

BITS_FN uint32_t bits_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu;
    uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0x1fu) return sign | 0x7f800000u | (mantissa << 13); /* inf, NaN */
    if (exponent != 0) return sign | ((exponent + 112u) << 23) | (mantissa << 13);
    if (mantissa == 0) return sign;
    /* Subnormal: value = mantissa * 2^-24; shift until the implicit bit (10) is set. */
    uint32_t shifts = 0;
    while (!(mantissa & 0x400u)) {
        mantissa <<= 1;
        shifts++;
    }
    return sign | ((113u - shifts) << 23) | ((mantissa & 0x3ffu) << 13);
}

BITS_FN uint16_t bits_f32_to_f16(uint32_t x)
{
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t exponent = (x >> 23) & 0xffu;
    uint32_t mantissa = x & 0x7fffffu;
    if (exponent == 0xffu) /* inf stays inf; NaN keeps its top payload bits, made quiet */
        return (uint16_t)(sign | 0x7c00u | (mantissa ? 0x200u | (mantissa >> 13) : 0u));
    int32_t e = (int32_t)exponent - 127 + 15; /* fp16 biased exponent */
    if (e >= 31) return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        /* Subnormal result m * 2^-24 with m = (1.mantissa) * 2^(e + 10), rounded. */
        if (e < -10) return (uint16_t)sign;
        uint32_t full = mantissa | 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t m = full >> shift, rest = full & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rest > half || (rest == half && (m & 1u))) m++;
        return (uint16_t)(sign | m);
    }
    uint32_t h = sign | ((uint32_t)e << 10) | (mantissa >> 13);
    uint32_t rest = mantissa & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++; /* a carry may reach infinity: right */
    return (uint16_t)h;
}

/* Whether a finite x becomes an infinity in fp16: |x| >= 65520, halfway
 * between fp16's largest (65504, 0x477fe000 as fp32) and 65536, where the
 * tie rounds to even, up (65504's last mantissa bit is odd). Infinities and
 * NaNs are not overflows: they stay what they were. 1 or 0, branch-free, so
 * that a loop counting them still vectorizes. */
#define BITS_F32_OVERFLOWS_F16 0x477ff000u /* the smallest fp32 magnitude that does */
BITS_FN uint32_t bits_f32_overflows_f16(uint32_t x)
{
    uint32_t magnitude = x & 0x7fffffffu;
    return (uint32_t)(magnitude >= BITS_F32_OVERFLOWS_F16) & (uint32_t)(magnitude < 0x7f800000u);
}

/* The same for bf16, whose range is fp32's but for the top half ulp: |x| >=
 * 0x7f7f8000 (~3.3961e38), halfway between bf16's largest (0x7f7f0000,
 * ~3.3895e38, odd) and 2^128. */
#define BITS_F32_OVERFLOWS_BF16 0x7f7f8000u
BITS_FN uint32_t bits_f32_overflows_bf16(uint32_t x)
{
    uint32_t magnitude = x & 0x7fffffffu;
    return (uint32_t)(magnitude >= BITS_F32_OVERFLOWS_BF16) & (uint32_t)(magnitude < 0x7f800000u);
}

#endif
