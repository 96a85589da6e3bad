/* column_sums.cu: the partials' buffer of the column sums (column_sums.h),
 * one for the process, grown stream-ordered as cuda_scratch_parts grows. */
#include <pthread.h>
#include <stdint.h>

extern "C" {
#include "../kernels.h"
}
#include "column_sums.h"

static cuda_scratch partials_scratch;
static pthread_mutex_t partials_lock = PTHREAD_MUTEX_INITIALIZER;

int cuda_column_partials_begin(float **partials, int64_t floats)
{
    void *part = NULL;
    size_t bytes = (size_t)floats * sizeof(float);
    pthread_mutex_lock(&partials_lock);
    int status = cuda_scratch_parts(&partials_scratch, "column sums' partials", &part, &bytes, 1);
    if (status) pthread_mutex_unlock(&partials_lock);
    *partials = (float *)part;
    return status;
}

void cuda_column_partials_end(void)
{
    pthread_mutex_unlock(&partials_lock);
}
