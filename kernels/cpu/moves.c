/* moves.c: strided moves with conversion, on the CPU (the twin of the
 * kernel in moves_cuda.cu), and transposition with conversion. */
#include <string.h>

#include "../convert_bits.h"
#include "../kernels.h"

convert_overflow moves_apply(const void *src, tp_dtype src_format, void *dst, tp_dtype dst_format,
                             const strided_move *moves, int64_t count)
{
    convert_overflow overflow = {0, 0.0f};
    size_t src_size = tp_dtype_size(src_format), dst_size = tp_dtype_size(dst_format);
    const char *in = src;
    char *out = dst;
    for (int64_t m = 0; m < count; m++) {
        const strided_move *mv = &moves[m];
        for (int64_t r = 0; r < mv->repeat; r++) {
            char *to = out + (mv->dst + r * mv->dst_stride) * (int64_t)dst_size;
            if (mv->src < 0)
                memset(to, 0, (size_t)mv->len * dst_size);
            else
                convert_overflow_add(&overflow, convert_numbers(in + (mv->src + r * mv->src_stride) * (int64_t)src_size,
                                                                src_format, to, dst_format, mv->len));
        }
    }
    return overflow;
}

/* An element's bits as fp32 bits, and back: convert.c's conversions one
 * element at a time (bf16 <-> fp16 goes through fp32 as there). */
static uint32_t load_as_f32(const unsigned char *p, tp_dtype format)
{
    if (format == TP_FP32) {
        uint32_t x;
        memcpy(&x, p, 4);
        return x;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return format == TP_BF16 ? bits_bf16_to_f32(h) : bits_f16_to_f32(h);
}

/* Counts an overflow in *overflow as convert_from_f32 does. */
static void store_from_f32(unsigned char *p, uint32_t x, tp_dtype format, convert_overflow *overflow)
{
    if (format == TP_FP32) {
        memcpy(p, &x, 4);
        return;
    }
    uint16_t h = format == TP_BF16 ? bits_f32_to_bf16(x) : bits_f32_to_f16(x);
    memcpy(p, &h, 2);
    if (format == TP_BF16 ? bits_f32_overflows_bf16(x) : bits_f32_overflows_f16(x)) {
        uint32_t magnitude = x & 0x7fffffffu;
        float value;
        memcpy(&value, &magnitude, 4);
        convert_overflow one = {1, value};
        convert_overflow_add(overflow, one);
    }
}

#define TRANSPOSE_TILE 32 /* 32 x 32 elements: a tile of input and of output stay in L1 */

convert_overflow transpose_numbers(const void *in, tp_dtype in_format, int64_t rows, int64_t cols,
                                   int64_t in_stride, void *out, tp_dtype out_format, int64_t out_stride)
{
    convert_overflow overflow = {0, 0.0f};
    const unsigned char *src = in;
    unsigned char *dst = out;
    int64_t is = (int64_t)tp_dtype_size(in_format), os = (int64_t)tp_dtype_size(out_format);
    for (int64_t r0 = 0; r0 < rows; r0 += TRANSPOSE_TILE) {
        int64_t r1 = r0 + TRANSPOSE_TILE < rows ? r0 + TRANSPOSE_TILE : rows;
        for (int64_t c0 = 0; c0 < cols; c0 += TRANSPOSE_TILE) {
            int64_t c1 = c0 + TRANSPOSE_TILE < cols ? c0 + TRANSPOSE_TILE : cols;
            for (int64_t c = c0; c < c1; c++) {
                unsigned char *to = dst + (c * out_stride + r0) * os;
                const unsigned char *from = src + (r0 * in_stride + c) * is;
                if (in_format == out_format && is == 4)
                    for (int64_t r = r0; r < r1; r++, to += 4, from += in_stride * 4) memcpy(to, from, 4);
                else if (in_format == out_format)
                    for (int64_t r = r0; r < r1; r++, to += 2, from += in_stride * 2) memcpy(to, from, 2);
                else
                    for (int64_t r = r0; r < r1; r++, to += os, from += in_stride * is)
                        store_from_f32(to, load_as_f32(from, in_format), out_format, &overflow);
            }
        }
    }
    return overflow;
}
