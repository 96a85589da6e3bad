/* adamw.cu: the AdamW step and the gradients' sum of squares on the GPU,
 * the twins of cpu/adamw.c and the CPU backend's sum_of_squares. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

extern "C" {
#include "../kernels.h"
}
#include "internal.h"
#include "launch.h"

/* ============================================================ optimizer */

static pthread_mutex_t sums_lock = PTHREAD_MUTEX_INITIALIZER; /* cuda_cuda_state.sums */

/* adamw.c's step, operation for operation, with rounding intrinsics so that
 * no multiply-add is fused (the CPU build fuses none): the result is the
 * CPU's to the bit.
 *
 * Many tensors a launch (adamw_update_tensors): the launch's table of
 * tensors travels in the kernel's parameters (__grid_constant__: read in
 * place, not copied per thread), each tensor cut into blocks of
 * ADAMW_BLOCK_VALUES values; a block finds its tensor by the first block
 * of each. A model of 150 tensors is a handful of launches, not 150. */

#define ADAMW_TENSORS_PER_LAUNCH 48 /* 56 bytes each: the table stays within 4 KB of parameters */
#define ADAMW_BLOCK_VALUES (THREADS * 8)

typedef struct {
    float *param, *m, *v;
    const float *grad;
    uint16_t *param_bits; /* or NULL: the updated param's bf16 bits (adamw_tensor) */
    int64_t n;
    float decay;          /* 1 - lr weight_decay, as adamw.c rounds it */
    unsigned first_block; /* of this tensor in the launch's grid */
} adamw_launch_tensor;

typedef struct {
    adamw_launch_tensor tensors[ADAMW_TENSORS_PER_LAUNCH];
    int count;
    float step_size, bias2_sqrt, beta2, eps, keep1, keep2;
} adamw_launch;
/* A kernel's parameters hold 4 KiB on every GPU this builds for. */
static_assert(sizeof(adamw_launch) <= 4096, "adamw_launch passed by value must fit a kernel's 4 KiB of parameters");

static __global__ void adamw_tensors_kernel(const __grid_constant__ adamw_launch launch)
{
    /* The last tensor whose first block is at or before this one. */
    int lo = 0, hi = launch.count - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (launch.tensors[mid].first_block <= blockIdx.x) lo = mid;
        else hi = mid - 1;
    }
    const adamw_launch_tensor *t = &launch.tensors[lo];
    int64_t begin = (int64_t)(blockIdx.x - t->first_block) * ADAMW_BLOCK_VALUES;
    int64_t end = begin + ADAMW_BLOCK_VALUES < t->n ? begin + ADAMW_BLOCK_VALUES : t->n;
    float keep1 = launch.keep1, keep2 = launch.keep2, beta2 = launch.beta2, eps = launch.eps;
    float step_size = launch.step_size, bias2_sqrt = launch.bias2_sqrt, decay = t->decay;
    float *param = t->param, *m = t->m, *v = t->v;
    const float *grad = t->grad;
    uint16_t *param_bits = t->param_bits;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
        float p = __fmul_rn(param[i], decay), g = grad[i];
        float mi = __fadd_rn(m[i], __fmul_rn(keep1, __fsub_rn(g, m[i])));
        float vi = __fadd_rn(__fmul_rn(v[i], beta2), __fmul_rn(__fmul_rn(keep2, g), g));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bias2_sqrt), eps);
        float updated = __fadd_rn(p, __fdiv_rn(__fmul_rn(-step_size, mi), denom));
        param[i] = updated;
        if (param_bits) param_bits[i] = bits_f32_to_bf16(__float_as_uint(updated)); /* as round_to_bf16 */
        m[i] = mi;
        v[i] = vi;
    }
}

/* The grid's limit on blocks in x, and well within it: a launch ends
 * before its blocks would pass it. */
#define ADAMW_MAX_BLOCKS (1u << 30)

int cuda_adamw_update_tensors(const adamw_tensor *tensors, int count, float lr, float beta1, float beta2, float eps,
                              int64_t step)
{
    /* The scalars on the host in double, exactly as adamw.c computes them. */
    double bias1 = 1.0 - pow((double)beta1, (double)step), bias2 = 1.0 - pow((double)beta2, (double)step);
    adamw_launch launch;
    memset(&launch, 0, sizeof launch);
    launch.step_size = (float)((double)lr / bias1);
    launch.bias2_sqrt = (float)sqrt(bias2);
    launch.beta2 = beta2;
    launch.eps = eps;
    launch.keep1 = 1.0f - beta1;
    launch.keep2 = 1.0f - beta2;
    unsigned blocks = 0;
    /* Every size checked before anything is queued: a step applies whole or not at all. */
    for (int t = 0; t < count; t++)
        if (tensors[t].n > (int64_t)(ADAMW_MAX_BLOCKS - 1) * ADAMW_BLOCK_VALUES)
            return tp_fail(TP_ERR_ARG, "CUDA adamw_update_tensors: tensor %d of %d has %lld values, beyond %llu", t,
                           count, (long long)tensors[t].n,
                           (unsigned long long)(ADAMW_MAX_BLOCKS - 1) * ADAMW_BLOCK_VALUES);
    ENTER();
    for (int t = 0; t <= count; t++) {
        int64_t n = t < count ? tensors[t].n : 0;
        uint64_t needed = n > 0 ? (uint64_t)((n + ADAMW_BLOCK_VALUES - 1) / ADAMW_BLOCK_VALUES) : 0;
        /* Launch what the table holds when it is full, when this tensor's
         * blocks would pass the limit, or after the last tensor. */
        if (launch.count && (t == count || launch.count == ADAMW_TENSORS_PER_LAUNCH ||
                             blocks + needed > ADAMW_MAX_BLOCKS)) {
            adamw_tensors_kernel<<<blocks, THREADS, 0, cuda_state.stream>>>(launch);
            LAUNCH_CHECK();
            launch.count = 0;
            blocks = 0;
        }
        if (t == count || needed == 0) continue;
        adamw_launch_tensor *l = &launch.tensors[launch.count++];
        l->param = tensors[t].param;
        l->m = tensors[t].m;
        l->v = tensors[t].v;
        l->grad = tensors[t].grad;
        l->param_bits = tensors[t].param_bits;
        l->n = n;
        l->decay = (float)(1.0 - (double)lr * (double)tensors[t].weight_decay);
        l->first_block = blocks;
        blocks += (unsigned)needed;
    }
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
