/* convert.c: CPU conversions between fp32, bf16 and fp16. */
#include <string.h>

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

VECTOR_CLONES void convert_from_f32(const float *in, void *out, tp_dtype out_format, int64_t n)
{
    const uint32_t *bits = (const uint32_t *)in;
    uint16_t *h = out;
    switch (out_format) {
    case TP_FP32: memcpy(out, in, (size_t)n * 4); break;
    case TP_BF16:
        for (int64_t i = 0; i < n; i++) h[i] = bits_f32_to_bf16(bits[i]);
        break;
    case TP_FP16:
        for (int64_t i = 0; i < n; i++) h[i] = bits_f32_to_f16(bits[i]);
        break;
    }
}

void convert_numbers(const void *in, tp_dtype in_format, void *out, tp_dtype out_format,
                     int64_t n)
{
    if (in_format == out_format) {
        memcpy(out, in, (size_t)n * tp_dtype_size(in_format));
        return;
    }
    if (in_format == TP_FP32) {
        convert_from_f32(in, out, out_format, n);
        return;
    }
    if (out_format == TP_FP32) {
        convert_to_f32(in, in_format, out, n);
        return;
    }
    /* bf16 <-> fp16: widen a tile to fp32, then narrow. */
    float tile[1024];
    const uint16_t *src = in;
    uint16_t *dst = out;
    for (int64_t i = 0; i < n; i += 1024) {
        int64_t m = n - i < 1024 ? n - i : 1024;
        convert_to_f32(src + i, in_format, tile, m);
        convert_from_f32(tile, dst + i, out_format, m);
    }
}
