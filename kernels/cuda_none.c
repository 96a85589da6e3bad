/* cuda_none.c: the CUDA entry points of a build without CUDA (make CUDA=0):
 * there is no device, and asking for one says why. */
#include <stdio.h>

#include "kernels.h"

int cuda_device_count(void)
{
    return 0;
}

int cuda_built(void)
{
    return 0;
}

int cuda_convert_numbers(const void *in, number_format in_format, void *out,
                         number_format out_format, int64_t n, char *err, size_t err_size)
{
    (void)in, (void)in_format, (void)out, (void)out_format, (void)n;
    snprintf(err, err_size, "this build has no CUDA support (rebuild with nvcc available)");
    return -1;
}

struct cuda_mover {
    int unused;
};

int cuda_mover_create(cuda_mover **out, size_t staging_bytes, size_t output_bytes, int64_t max_moves,
                      char *err, size_t err_size)
{
    (void)staging_bytes, (void)output_bytes, (void)max_moves;
    *out = NULL;
    snprintf(err, err_size, "this build has no CUDA support (rebuild with nvcc available)");
    return -1;
}

void *cuda_mover_staging(cuda_mover *mover)
{
    (void)mover;
    return NULL;
}

void *cuda_mover_output(cuda_mover *mover)
{
    (void)mover;
    return NULL;
}

int cuda_mover_run(cuda_mover *mover, size_t staging_used, number_format src_format, size_t output_used,
                   number_format dst_format, const strided_move *moves, int64_t count, char *err,
                   size_t err_size)
{
    (void)mover, (void)staging_used, (void)src_format, (void)output_used, (void)dst_format, (void)moves,
        (void)count;
    snprintf(err, err_size, "this build has no CUDA support (rebuild with nvcc available)");
    return -1;
}

void cuda_mover_free(cuda_mover *mover)
{
    (void)mover;
}
