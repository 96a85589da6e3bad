/* convert.c: CPU conversions between fp32, bf16 and fp16. */
#include <stdio.h>
#include <string.h>

#include "../../common/error.h"
#include "../convert_bits.h"
#include "../kernels.h"
#include "vector_clones.h"

VECTOR_CLONES void convert_to_f32(const void *in, tp_dtype in_format, float *out, int64_t n)
{
    const uint16_t *h = in;
    uint32_t *bits = (uint32_t *)out; /* fp32 written as its bit pattern */
    switch (in_format) {
    case TP_FP32: memcpy(out, in, (size_t)n * 4); break;
    case TP_BF16:
        for (int64_t i = 0; i < n; i++) bits[i] = bits_bf16_to_f32(h[i]);
        break;
    case TP_FP16:
        for (int64_t i = 0; i < n; i++) bits[i] = bits_f16_to_f32(h[i]);
        break;
    }
}

/* Narrowing counts its overflows in the loop that converts, behind a
 * branch taken only by magnitudes from the first that overflows up
 * (infinities and NaNs with them, sorted out inside): one AND and one
 * compare per element. These loops run scalar at -O2: a branch-free count
 * and max slowed them by 40-120%; this by 7% (bf16) and 13% (fp16) of the
 * loop alone, 16 MB of fp32 converted, and within the noise of a whole
 * tp-reshard --dtype fp16 (124M parameters: 2.08 s before, 2.14 s after). */
#define NARROW_COUNTING(narrow, threshold, overflows)                                    \
    for (int64_t i = 0; i < n; i++) {                                                    \
        uint32_t x = bits[i], magnitude = x & 0x7fffffffu;                               \
        h[i] = narrow(x);                                                                \
        if (__builtin_expect(magnitude >= (threshold), 0) && overflows(x)) {             \
            count++;                                                                     \
            largest = magnitude > largest ? magnitude : largest;                         \
        }                                                                                \
    }

VECTOR_CLONES convert_overflow convert_from_f32(const float *in, void *out, tp_dtype out_format, int64_t n)
{
    const uint32_t *bits = (const uint32_t *)in;
    uint16_t *h = out;
    int64_t count = 0;
    uint32_t largest = 0; /* bits of the largest magnitude that overflowed */
    switch (out_format) {
    case TP_FP32: memcpy(out, in, (size_t)n * 4); break;
    case TP_BF16: NARROW_COUNTING(bits_f32_to_bf16, BITS_F32_OVERFLOWS_BF16, bits_f32_overflows_bf16) break;
    case TP_FP16: NARROW_COUNTING(bits_f32_to_f16, BITS_F32_OVERFLOWS_F16, bits_f32_overflows_f16) break;
    }
    convert_overflow result = {count, 0.0f};
    memcpy(&result.largest, &largest, 4);
    return result;
}

convert_overflow convert_numbers(const void *in, tp_dtype in_format, void *out, tp_dtype out_format,
                                 int64_t n)
{
    convert_overflow none = {0, 0.0f};
    if (in_format == out_format) {
        memcpy(out, in, (size_t)n * tp_dtype_size(in_format));
        return none;
    }
    if (in_format == TP_FP32) return convert_from_f32(in, out, out_format, n);
    if (out_format == TP_FP32) {
        convert_to_f32(in, in_format, out, n);
        return none;
    }
    /* bf16 <-> fp16: widen a tile to fp32, then narrow (bf16 -> fp16 can overflow). */
    float tile[1024];
    const uint16_t *src = in;
    uint16_t *dst = out;
    convert_overflow sum = none;
    for (int64_t i = 0; i < n; i += 1024) {
        int64_t m = n - i < 1024 ? n - i : 1024;
        convert_to_f32(src + i, in_format, tile, m);
        convert_overflow_add(&sum, convert_from_f32(tile, dst + i, out_format, m));
    }
    return sum;
}

/* Elements converted, then counted, at a time: 8 KiB of fp32 input (and
 * as much output) stay in the L1 cache from one loop to the next, so the
 * count reads no memory the conversion did not already bring in. */
#define NONFINITE_BLOCK 2048

/* An exponent of all ones is an infinity (mantissa 0) or a NaN (any other
 * mantissa): with the sign masked off, above the infinity's bits is a NaN.
 * Compares summed, no branch, so that the loop vectorizes; the sums are
 * of the values' own width (a block's counts fit 16 bits), so that a
 * vector holds as many lanes as it holds values: 32-bit sums of 16-bit
 * values took twice as long. */
#define COUNT_NONFINITE(type, magnitude_mask, infinity)                                  \
    {                                                                                    \
        const type *v = values;                                                          \
        type nan_sum = 0, infinity_sum = 0;                                              \
        for (int64_t i = 0; i < n; i++) {                                                \
            type magnitude = v[i] & (magnitude_mask);                                    \
            nan_sum += magnitude > (infinity);                                           \
            infinity_sum += magnitude == (infinity);                                     \
        }                                                                                \
        nans = nan_sum;                                                                  \
        infinities = infinity_sum;                                                       \
    }

/* n at most NONFINITE_BLOCK. */
static VECTOR_CLONES void count_nonfinite(const void *values, tp_dtype format, int64_t n, uint32_t *nans_out,
                                          uint32_t *infinities_out)
{
    uint32_t nans = 0, infinities = 0;
    switch (format) {
    case TP_FP32: COUNT_NONFINITE(uint32_t, 0x7fffffffu, 0x7f800000u) break;
    case TP_BF16: COUNT_NONFINITE(uint16_t, 0x7fffu, 0x7f80u) break;
    case TP_FP16: COUNT_NONFINITE(uint16_t, 0x7fffu, 0x7c00u) break;
    }
    *nans_out = nans;
    *infinities_out = infinities;
}

/* Index of the first NaN or infinity among n values (a block known to hold one). */
static int64_t first_nonfinite(const void *values, tp_dtype format, int64_t n)
{
    uint32_t mask = format == TP_FP32 ? 0x7fffffffu : 0x7fffu;
    uint32_t infinity = format == TP_FP32 ? 0x7f800000u : format == TP_BF16 ? 0x7f80u : 0x7c00u;
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits = format == TP_FP32 ? ((const uint32_t *)values)[i] : ((const uint16_t *)values)[i];
        if ((bits & mask) >= infinity) return i;
    }
    return -1;
}

void convert_nonfinite_add(convert_nonfinite *tally, convert_nonfinite found, int64_t base)
{
    tally->nans += found.nans;
    tally->infinities += found.infinities;
    if (found.first >= 0 && (tally->first < 0 || base + found.first < tally->first)) tally->first = base + found.first;
}

convert_nonfinite numbers_nonfinite(const void *values, tp_dtype format, int64_t n)
{
    convert_nonfinite found = {0, 0, -1};
    size_t size = tp_dtype_size(format);
    for (int64_t at = 0; at < n; at += NONFINITE_BLOCK) {
        int64_t m = n - at < NONFINITE_BLOCK ? n - at : NONFINITE_BLOCK;
        const void *block = (const unsigned char *)values + (size_t)at * size;
        uint32_t nans, infinities;
        count_nonfinite(block, format, m, &nans, &infinities);
        if (nans | infinities) {
            if (found.first < 0) found.first = at + first_nonfinite(block, format, m);
            found.nans += nans;
            found.infinities += infinities;
        }
    }
    return found;
}

convert_overflow convert_numbers_counting(const void *in, tp_dtype in_format, int64_t in_stride, void *out,
                                          tp_dtype out_format, int64_t n, convert_nonfinite *nonfinite)
{
    convert_overflow sum = {0, 0.0f};
    *nonfinite = (convert_nonfinite){0, 0, -1};
    size_t in_size = tp_dtype_size(in_format), out_size = tp_dtype_size(out_format);
    uint32_t tile[NONFINITE_BLOCK]; /* a strided block gathered, in its own format */
    for (int64_t at = 0; at < n; at += NONFINITE_BLOCK) {
        int64_t m = n - at < NONFINITE_BLOCK ? n - at : NONFINITE_BLOCK;
        const void *block = (const unsigned char *)in + (size_t)(at * in_stride) * in_size;
        if (in_stride != 1) { /* bits moved as they are: the conversion below reads them from L1 */
            if (in_size == 4)
                for (int64_t i = 0; i < m; i++) tile[i] = ((const uint32_t *)block)[i * in_stride];
            else
                for (int64_t i = 0; i < m; i++) ((uint16_t *)tile)[i] = ((const uint16_t *)block)[i * in_stride];
            block = tile;
        }
        convert_overflow_add(&sum, convert_numbers(block, in_format, (unsigned char *)out + (size_t)at * out_size,
                                                   out_format, m));
        uint32_t nans, infinities;
        count_nonfinite(block, in_format, m, &nans, &infinities);
        if (nans | infinities) {
            if (nonfinite->first < 0) nonfinite->first = at + first_nonfinite(block, in_format, m);
            nonfinite->nans += nans;
            nonfinite->infinities += infinities;
        }
    }
    return sum;
}

int convert_overflow_first(const convert_overflow *per_tensor, int count, int *others)
{
    int first = -1;
    *others = 0;
    for (int i = 0; i < count; i++)
        if (per_tensor[i].count) {
            if (first < 0) first = i;
            else ++*others;
        }
    return first;
}

int convert_overflow_check(convert_overflow o, tp_dtype format, const char *what, int more)
{
    if (o.count == 0) return TP_OK;
    char others[64] = "";
    if (more) snprintf(others, sizeof others, "; %d more tensor%s as well", more, more == 1 ? "" : "s");
    return tp_fail(TP_ERR_ARG,
                   "%s: %lld value%s beyond %s's range (largest |x| %g) would become infinite: keep %s (--dtype)%s",
                   what, (long long)o.count, o.count == 1 ? "" : "s", tp_dtype_name(format), (double)o.largest,
                   format == TP_FP16 ? "fp32 or bf16" : "fp32", others);
}
