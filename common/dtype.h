/* dtype.h: the floating-point storage formats of tensors, everywhere in the
 * project: in checkpoints (docs/FORMAT.md "Dtypes"), in kernels' conversions
 * and in exported files. */
#ifndef TP_DTYPE_H
#define TP_DTYPE_H

#include <stddef.h>

typedef enum { TP_FP32 = 0, TP_BF16 = 1, TP_FP16 = 2 } tp_dtype;

/* Bytes of one element: 4 or 2. */
size_t tp_dtype_size(tp_dtype dtype);

/* "fp32", "bf16", "fp16" */
const char *tp_dtype_name(tp_dtype dtype);

/* The inverse of tp_dtype_name; fails with TP_ERR_ARG naming the text. */
int tp_dtype_parse(const char *text, tp_dtype *out);

#endif
