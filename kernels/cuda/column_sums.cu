/* column_sums.cu: the partials' buffer and the tiles' arrival counters of
 * the column sums (column_sums.h), one of each for the process, grown
 * stream-ordered as cuda_scratch_parts grows them; and the sums' CPU
 * emulation (column_sums_emulation.h). */
#include <pthread.h>
#include <stdint.h>

extern "C" {
#include "../../common/error.h"
#include "../kernels.h"
}
#include "column_sums.h"
#include "column_sums_emulation.h"

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

template <int VEC, typename In> static int emulate(float *sums, const In *values, int64_t N, int64_t C)
{
    return column_sums_emulate<1, VEC>(sums, (float *)NULL, column_of_values<In>{values, C}, N, C);
}

extern "C" int cuda_column_sums_emulate(float *sums, const void *values, int values_bf16, int64_t N, int64_t C,
                                        int chunked)
{
    if (N < 0 || C < 0)
        return tp_fail(TP_ERR_ARG, "column sums' emulation: a shape of [%lld, %lld]", (long long)N, (long long)C);
    if (chunked && C % CHUNK)
        return tp_fail(TP_ERR_ARG, "column sums' emulation: %lld columns do not split into chunks of %d",
                       (long long)C, CHUNK);
    if (N == 0 || C == 0) return TP_OK;
    if (values_bf16)
        return chunked ? emulate<CHUNK>(sums, (const uint16_t *)values, N, C)
                       : emulate<1>(sums, (const uint16_t *)values, N, C);
    return chunked ? emulate<CHUNK>(sums, (const float *)values, N, C) : emulate<1>(sums, (const float *)values, N, C);
}
