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

/* A strided move: `repeat` times, copy `len` elements from src to dst, then
 * advance src by src_stride and dst by dst_stride (all in elements). A
 * negative src fills with zeros instead. Resharding is a list of these. */
typedef struct {
    int64_t src, src_stride;
    int64_t dst, dst_stride;
    int64_t len, repeat;
} strided_move;

/* Applies moves from src (in src_format) to dst (in dst_format), converting
 * as convert_numbers does. Moves must not overlap in dst. */
void moves_apply(const void *src, number_format src_format, void *dst, number_format dst_format,
                 const strided_move *moves, int64_t count);

/* ----------------------------------------------------------------- CUDA */

/* Number of usable CUDA devices: 0 without a GPU or in a build without CUDA. */
int cuda_device_count(void);

/* Whether this build includes the CUDA kernels. */
int cuda_built(void);

/* GPU twin of convert_numbers on host buffers. Returns 0, or -1 with a
 * message in err (no GPU, build without CUDA, CUDA error). */
int cuda_convert_numbers(const void *in, number_format in_format, void *out,
                         number_format out_format, int64_t n, char *err, size_t err_size);

/* A GPU mover: pinned host buffers, device buffers and a stream of its own,
 * for one worker thread. The caller fills staging (host), run() copies it to
 * the device, applies the moves there and brings the output back. */
typedef struct cuda_mover cuda_mover;

int cuda_mover_create(cuda_mover **out, size_t staging_bytes, size_t output_bytes, int64_t max_moves,
                      char *err, size_t err_size);
void *cuda_mover_staging(cuda_mover *mover); /* pinned, staging_bytes */
void *cuda_mover_output(cuda_mover *mover);  /* pinned, output_bytes */
int cuda_mover_run(cuda_mover *mover, size_t staging_used, number_format src_format, size_t output_used,
                   number_format dst_format, const strided_move *moves, int64_t count, char *err,
                   size_t err_size);
void cuda_mover_free(cuda_mover *mover);

#endif
