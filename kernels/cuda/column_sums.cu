/* column_sums.cu: the partials' buffer and the tiles' arrival counters of
 * the column sums (column_sums.h), one of each for the process, grown
 * stream-ordered as cuda_scratch_parts grows them. */
#include <pthread.h>
#include <stdint.h>

extern "C" {
#include "../kernels.h"
}
#include "column_sums.h"

static cuda_scratch partials_scratch, arrivals_scratch;
static pthread_mutex_t partials_lock = PTHREAD_MUTEX_INITIALIZER;

int cuda_column_partials_begin(float **partials, int64_t floats, unsigned **arrivals, int64_t tiles)
{
    void *part = NULL, *counters = NULL;
    size_t bytes = (size_t)floats * sizeof(float), counter_bytes = (size_t)tiles * sizeof(unsigned);
    pthread_mutex_lock(&partials_lock);
    size_t had = arrivals_scratch.size;
    int status = cuda_scratch_parts(&partials_scratch, "column sums' partials", &part, &bytes, 1);
    if (!status) status = cuda_scratch_parts(&arrivals_scratch, "column sums' arrival counters", &counters,
                                             &counter_bytes, 1);
    /* New counters start at zero (each call's last blocks leave them so). */
    if (!status && arrivals_scratch.size != had) {
        cudaError_t error = cudaMemsetAsync(arrivals_scratch.memory, 0, arrivals_scratch.size, cuda_state.stream);
        if (error != cudaSuccess) {
            (void)cudaGetLastError();
            status = tp_fail(TP_ERR_DEVICE, "column sums: clearing %zu bytes of arrival counters: %s",
                             arrivals_scratch.size, cudaGetErrorString(error));
            /* Not kept uncleared: the next call allocates and clears again. */
            (void)cudaFreeAsync(arrivals_scratch.memory, cuda_state.stream);
            (void)cudaGetLastError();
            arrivals_scratch.memory = NULL;
            arrivals_scratch.size = 0;
        }
    }
    if (status) pthread_mutex_unlock(&partials_lock);
    *partials = (float *)part;
    *arrivals = (unsigned *)counters;
    return status;
}

void cuda_column_partials_end(void)
{
    pthread_mutex_unlock(&partials_lock);
}
