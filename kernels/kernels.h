/* kernels.h: arithmetic kernels. Each exists as a plain CPU function and, in
 * builds with CUDA, as a GPU twin that is tested bit for bit against it. */
#ifndef TP_KERNELS_H
#define TP_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* Floating-point storage formats the kernels convert between. */
typedef enum { NUMBER_F32 = 0, NUMBER_BF16 = 1, NUMBER_F16 = 2 } number_format;

size_t number_format_size(number_format format);

/* Converts n values; out may not overlap in. Narrowing rounds to nearest,
 * ties to even; overflow gives infinity; NaN stays NaN (quiet). */
void convert_to_f32(const void *in, number_format in_format, float *out, int64_t n);
void convert_from_f32(const float *in, void *out, number_format out_format, int64_t n);
/* Any format to any format (through fp32, which is exact for widening). */
void convert_numbers(const void *in, number_format in_format, void *out, number_format out_format,
                     int64_t n);

/* ----------------------------------------------------------------- CUDA */

/* Number of usable CUDA devices: 0 without a GPU or in a build without CUDA. */
int cuda_device_count(void);

/* Whether this build includes the CUDA kernels. */
int cuda_built(void);

/* GPU twin of convert_numbers on host buffers. Returns 0, or -1 with a
 * message in err (no GPU, build without CUDA, CUDA error). */
int cuda_convert_numbers(const void *in, number_format in_format, void *out,
                         number_format out_format, int64_t n, char *err, size_t err_size);

#endif
