/* adamw.cu: the AdamW step and the gradients' sum of squares on the GPU,
 * the twins of cpu/adamw.c and the CPU backend's sum_of_squares. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>

extern "C" {
#include "../kernels.h"
}
#include "internal.h"
#include "launch.h"

/* ============================================================ optimizer */

static pthread_mutex_t sums_lock = PTHREAD_MUTEX_INITIALIZER; /* cuda_cuda_state.sums */

/* adamw.c's step, operation for operation, with rounding intrinsics so that
 * no multiply-add is fused (the CPU build fuses none): the result is the
 * CPU's to the bit. */
static __global__ void adamw_kernel(float *param, const float *grad, float *m, float *v, int64_t n, float decay,
                                    float step_size, float bias2_sqrt, float beta2, float eps, float keep1, float keep2)
{
    GRID_STRIDE(i, n) {
        float p = __fmul_rn(param[i], decay), g = grad[i];
        float mi = __fadd_rn(m[i], __fmul_rn(keep1, __fsub_rn(g, m[i])));
        float vi = __fadd_rn(__fmul_rn(v[i], beta2), __fmul_rn(__fmul_rn(keep2, g), g));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bias2_sqrt), eps);
        param[i] = __fadd_rn(p, __fdiv_rn(__fmul_rn(-step_size, mi), denom));
        m[i] = mi;
        v[i] = vi;
    }
}

int cuda_adamw_update(float *param, const float *grad, float *m, float *v, int64_t n, float lr, float beta1,
                      float beta2, float eps, float weight_decay, int64_t step)
{
    /* The scalars on the host in double, exactly as adamw.c computes them. */
    double bias1 = 1.0 - pow((double)beta1, (double)step), bias2 = 1.0 - pow((double)beta2, (double)step);
    float decay = (float)(1.0 - (double)lr * (double)weight_decay);
    float step_size = (float)((double)lr / bias1), bias2_sqrt = (float)sqrt(bias2);
    float keep1 = 1.0f - beta1, keep2 = 1.0f - beta2;
    ENTER();
    if (n <= 0) return TP_OK;
    adamw_kernel<<<blocks_for(n, THREADS), THREADS, 0, cuda_state.stream>>>(param, grad, m, v, n, decay, step_size,
                                                                        bias2_sqrt, beta2, eps, keep1, keep2);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* Sum of squares in double, in two passes with a fixed order (the same
 * result every run): for each span, each of at most SUM_BLOCKS blocks adds
 * the sum of its grid-stride share to partials[block] (the spans' kernels
 * run one after the other on the stream); then one block sums the partials
 * into partials[SUM_BLOCKS]. */
static __global__ void sum_squares_kernel(double *partials, const float *x, int64_t n)
{
    double s = 0;
    GRID_STRIDE(i, n) s += (double)x[i] * (double)x[i];
    s = block_sum_double(s);
    if (threadIdx.x == 0) partials[blockIdx.x] += s;
}

static __global__ void sum_partials_kernel(double *result, const double *partials, int count)
{
    double s = 0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
    s = block_sum_double(s);
    if (threadIdx.x == 0) *result = s;
}

/* One kernel per span into the same partials, one reduction, one wait:
 * the gradient norm of every tensor costs one round trip to the host. */
int cuda_sum_of_squares(double *out, const float *const *spans, const int64_t *lengths, int count)
{
    int status = TP_ERR_DEVICE;
    *out = 0;
    pthread_mutex_lock(&sums_lock); /* one result buffer for the process */
    ENTER();
    CUDA_TRY(cudaMemsetAsync(cuda_state.sums, 0, SUM_BLOCKS * sizeof(double), cuda_state.stream));
    for (int s = 0; s < count; s++) {
        if (lengths[s] <= 0) continue;
        unsigned blocks = blocks_for(lengths[s], THREADS);
        if (blocks > SUM_BLOCKS) blocks = SUM_BLOCKS;
        sum_squares_kernel<<<blocks, THREADS, 0, cuda_state.stream>>>(cuda_state.sums, spans[s], lengths[s]);
        LAUNCH_CHECK();
    }
    sum_partials_kernel<<<1, THREADS, 0, cuda_state.stream>>>(cuda_state.sums + SUM_BLOCKS, cuda_state.sums, SUM_BLOCKS);
    LAUNCH_CHECK();
    CUDA_TRY(cudaMemcpyAsync(out, cuda_state.sums + SUM_BLOCKS, sizeof(double), cudaMemcpyDeviceToHost, cuda_state.stream));
    CUDA_TRY(cudaStreamSynchronize(cuda_state.stream));
    status = TP_OK;
fail:
    pthread_mutex_unlock(&sums_lock);
    return status;
}
