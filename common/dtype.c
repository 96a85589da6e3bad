/* dtype.c: sizes and names of the storage formats. */
#include <string.h>

#include "dtype.h"
#include "error.h"

size_t tp_dtype_size(tp_dtype dtype)
{
    return dtype == TP_FP32 ? 4 : 2;
}

const char *tp_dtype_name(tp_dtype dtype)
{
    switch (dtype) {
    case TP_FP32: return "fp32";
    case TP_BF16: return "bf16";
    case TP_FP16: return "fp16";
    }
    return "?";
}

int tp_dtype_parse(const char *text, tp_dtype *out)
{
    static const tp_dtype all[] = {TP_FP32, TP_BF16, TP_FP16};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (strcmp(text, tp_dtype_name(all[i])) == 0) {
            *out = all[i];
            return TP_OK;
        }
    }
    return tp_fail(TP_ERR_ARG, "unknown dtype '%s' (expected fp32, bf16 or fp16)", text);
}
