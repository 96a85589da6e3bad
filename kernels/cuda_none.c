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
