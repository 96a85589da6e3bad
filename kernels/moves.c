/* moves.c: strided moves with conversion, on the CPU (the twin of the
 * kernel in moves_cuda.cu). */
#include <string.h>

#include "kernels.h"

void moves_apply(const void *src, number_format src_format, void *dst, number_format dst_format,
                 const strided_move *moves, int64_t count)
{
    size_t src_size = number_format_size(src_format), dst_size = number_format_size(dst_format);
    const char *in = src;
    char *out = dst;
    for (int64_t m = 0; m < count; m++) {
        const strided_move *mv = &moves[m];
        for (int64_t r = 0; r < mv->repeat; r++) {
            char *to = out + (mv->dst + r * mv->dst_stride) * (int64_t)dst_size;
            if (mv->src < 0)
                memset(to, 0, (size_t)mv->len * dst_size);
            else
                convert_numbers(in + (mv->src + r * mv->src_stride) * (int64_t)src_size, src_format, to,
                                dst_format, mv->len);
        }
    }
}
