/* compare.c: logical comparison of two tensors, whatever their layouts.
 * Both sides are read as slabs of whole logical rows (axis 0) through
 * ckpt_reader_read_region, widened to fp32 and compared element by element. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/memory.h"
#include "../kernels/kernels.h"
#include "internal.h"

void ckpt_element_text(const void *at, tp_dtype dtype, char *out, size_t size)
{
    const unsigned char *bytes = at;
    float value = 0;
    uint32_t bits = 0;
    size_t n = tp_dtype_size(dtype);
    convert_numbers(at, dtype, &value, TP_FP32, 1);
    for (size_t b = 0; b < n && b < sizeof bits; b++) bits |= (uint32_t)bytes[b] << (8 * b);
    snprintf(out, size, "%.9g (0x%0*x)", (double)value, (int)(2 * n), bits);
}

void ckpt_element_place(const int64_t *shape, const int64_t *origin, int ndim, int64_t element, char *out, size_t size)
{
    char place[200] = "";
    int64_t rest = element;
    for (int x = ndim - 1; x >= 0; x--) { /* the last dimension's coordinate first */
        int64_t coordinate = x > 0 && shape[x] > 0 ? rest % shape[x] : rest;
        rest = x > 0 && shape[x] > 0 ? rest / shape[x] : 0;
        char part[200];
        snprintf(part, sizeof part, "%lld%s%.160s", (long long)(coordinate + (origin ? origin[x] : 0)), place[0] ? ", " : "",
                 place);
        snprintf(place, sizeof place, "%s", part);
    }
    snprintf(out, size, "%s", place);
}

int ckpt_compare_tensor(ckpt_reader *a, int ai, ckpt_reader *b, int bi, double rtol, double atol,
                        size_t slab_bytes, ckpt_compare_result *out)
{
    memset(out, 0, sizeof *out);
    out->worst_index = -1;
    const ckpt_tensor_desc *ta = ckpt_reader_tensor(a, ai), *tb = ckpt_reader_tensor(b, bi);
    if (!ta || !tb) return tp_fail(TP_ERR_ARG, "tensor index out of range");
    if (ta->ndim != tb->ndim || memcmp(ta->shape, tb->shape, sizeof(int64_t) * (size_t)ta->ndim) != 0)
        return tp_fail(TP_ERR_ARG, "tensor %s: logical shapes differ between the checkpoints",
                         ta->name);
    int64_t row_elements = 1;
    for (int d = 1; d < ta->ndim; d++) row_elements *= ta->shape[d];
    int64_t rows_per_slab = (int64_t)(slab_bytes / 4) / row_elements;
    if (rows_per_slab < 1) rows_per_slab = 1;
    if (rows_per_slab > ta->shape[0]) rows_per_slab = ta->shape[0];
    size_t slab_elements = (size_t)(rows_per_slab * row_elements);
    size_t raw_a = slab_elements * tp_dtype_size(ta->dtype), raw_b = slab_elements * tp_dtype_size(tb->dtype);
    void *buf_a = alloc_pages(raw_a), *buf_b = alloc_pages(raw_b);
    float *fa = malloc(slab_elements * 4), *fb = malloc(slab_elements * 4);
    int status = TP_OK;
    if (!buf_a || !buf_b || !fa || !fb)
        status = tp_fail(TP_ERR_NOMEM, "out of memory for %zu-element comparison slabs", slab_elements);
    int exact = rtol == 0 && atol == 0;
    for (int64_t row = 0; !status && row < ta->shape[0]; row += rows_per_slab) {
        int64_t start[CKPT_MAX_DIMS] = {0}, count[CKPT_MAX_DIMS];
        memcpy(count, ta->shape, sizeof count);
        start[0] = row;
        count[0] = ta->shape[0] - row < rows_per_slab ? ta->shape[0] - row : rows_per_slab;
        int64_t n = count[0] * row_elements;
        status = ckpt_reader_read_region(a, ai, start, count, buf_a, raw_a);
        if (!status) status = ckpt_reader_read_region(b, bi, start, count, buf_b, raw_b);
        if (status) break;
        out->elements += n;
        if (ta->dtype == tb->dtype && memcmp(buf_a, buf_b, (size_t)n * tp_dtype_size(ta->dtype)) == 0)
            continue;
        convert_to_f32(buf_a, ta->dtype, fa, n);
        convert_to_f32(buf_b, tb->dtype, fb, n);
        for (int64_t k = 0; k < n; k++) {
            double x = fa[k], y = fb[k];
            uint32_t bx, by;
            memcpy(&bx, &fa[k], 4);
            memcpy(&by, &fb[k], 4);
            if (bx == by) continue;
            double diff = fabs(x - y);
            double scale = fmax(fabs(x), fabs(y));
            /* An infinity or a NaN that is not the other side's bits is out
             * of any tolerance: an infinite scale would take in anything. */
            int finite = isfinite(x) && isfinite(y);
            if (!finite) diff = INFINITY;
            double rel = !finite ? INFINITY : scale > 0 ? diff / scale : diff;
            int within = !exact && finite && diff <= atol + rtol * scale;
            if (!within) out->mismatches++;
            if (diff > out->max_abs_diff || out->worst_index < 0) {
                out->max_abs_diff = diff;
                out->worst_index = row * row_elements + k;
                memcpy(out->worst_a, (const char *)buf_a + k * (int64_t)tp_dtype_size(ta->dtype), tp_dtype_size(ta->dtype));
                memcpy(out->worst_b, (const char *)buf_b + k * (int64_t)tp_dtype_size(tb->dtype), tp_dtype_size(tb->dtype));
            }
            if (rel > out->max_rel_diff) out->max_rel_diff = rel;
        }
    }
    free(buf_a);
    free(buf_b);
    free(fa);
    free(fb);
    return status;
}
