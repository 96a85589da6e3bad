/* column_sums_emulation.h: the CUDA column sums (column_sums.h: the bias
 * gradients' and the norms' weight and bias gradients) worked on the CPU,
 * for tests of the kernel's indexing on machines without a GPU. C. */
#ifndef TP_KERNELS_CUDA_COLUMN_SUMS_EMULATION_H
#define TP_KERNELS_CUDA_COLUMN_SUMS_EMULATION_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* sums[C] += the column sums of values [N, C] (fp32, or bf16 bits when
 * values_bf16), host memory, the way the kernel sums a bias's gradient:
 * its tiles, row chunks, threads' rows and columns and the order of every
 * addition; the blocks of a tile in reverse order (the kernel's last block
 * adds the chunks in chunk order whichever it is). chunked: a chunk of
 * columns a thread (the kernel's way where the rows split into 16-byte
 * chunks; TP_ERR_ARG unless C is a multiple of 8), else a column a thread.
 * TP_ERR_DEVICE in a build without CUDA. */
int cuda_column_sums_emulate(float *sums, const void *values, int values_bf16, int64_t N, int64_t C, int chunked);

#ifdef __cplusplus
}
#endif

#endif
