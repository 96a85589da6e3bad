/* backend.cu: the CUDA kernel backend (kernels.h, kernel_backend): the
 * transformer arithmetic of cpu/ on device memory, each operation the twin
 * of the CPU function of the same name and tested against it
 * (tests/kernels/test_cuda_backend.c).
 *
 * One state per process: the device, a non-blocking stream and a cuBLAS
 * handle bound to it. Every kernel, product and copy goes to that stream in
 * the order issued; to_device, to_host and sum_of_squares wait for it (the
 * caller reuses its host memory at once), the other operations return as
 * soon as their work is queued, and synchronize() waits for all of it.
 *
 * Correct first, fast later: matrix products through cuBLAS in plain fp32
 * (TF32 off), or for bf16 mixed precision (the *_bf16 products) with both
 * operands rounded to bf16 by a kernel (convert_bits.h, as the CPU rounds)
 * and summed in fp32 by cublasGemmEx; the rest in simple kernels. Launch
 * shapes: elementwise kernels walk their elements in grid-stride loops (at
 * most MAX_BLOCKS blocks); row kernels (layer norm, RMSNorm, cross-entropy)
 * give a row to a block, also in a grid-stride loop over rows; attention gives a
 * row to a warp (memory-efficient: no [T, T] matrix);
 * column sums (bias and norm-weight gradients) give 32 columns to a block of
 * 32 x COL_ROWS threads, the rows split among the COL_ROWS thread rows and
 * summed in a fixed order. Only embedding_backward uses atomics (tokens
 * repeat), so it alone is not bit-reproducible from run to run. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "../kernels.h"
}
#include "../convert_bits.h"
#include "attention_tiled.h"
#include "check.h"
#include "internal.h"
#include "libraries.h"

#define TP_STRINGIFY_(x) #x
#define TP_STRINGIFY(x) TP_STRINGIFY_(x)

/* cublasGemmEx's C declaration (cublas_api.h). In C++ the header adds an
 * inline overload taking a cudaDataType compute type, so &cublasGemmEx
 * alone is ambiguous: the static_cast picks the exported function, and
 * fails to compile if the header's declaration differs from this type. */
typedef cublasStatus_t (*gemm_ex_fn)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                     const void *, const void *, cudaDataType, int, const void *, cudaDataType, int,
                                     const void *, void *, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);

/* cuBLAS, loaded when the backend is created (dlopen), not linked: its
 * libraries are over 500 MB, and a program linked with them pays about
 * 0.6 s and 200 MB at every start, on the CPU too. The functions used,
 * typed as cublas_v2.h declares them. */
static struct {
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    decltype(&cublasSetMathMode) set_math_mode;
    decltype(&cublasSgemm_v2) sgemm;
    decltype(static_cast<gemm_ex_fn>(&cublasGemmEx)) gemm_ex; /* the bf16 products */
    decltype(&cublasGetStatusName) status_name;
    decltype(&cublasGetStatusString) status_string;
} blas;

/* Loads cuBLAS once; fails naming what is missing. */
static int load_cublas(void)
{
    static const char *const names[] = {"libcublas.so." TP_STRINGIFY(CUBLAS_VER_MAJOR), "libcublas.so"};
    if (blas.sgemm) return TP_OK;
    void *library = NULL;
    TP_TRY(cuda_library_open("cuBLAS", names, sizeof names / sizeof names[0], &library, NULL, 0));
#define LOAD(field, symbol)                                                                                            \
    if (!(*(void **)&blas.field = dlsym(library, #symbol)))                                                           \
        return tp_fail(TP_ERR_DEVICE, "cuBLAS (%s) has no %s", names[0], #symbol);
    LOAD(create, cublasCreate_v2)
    LOAD(destroy, cublasDestroy_v2)
    LOAD(set_stream, cublasSetStream_v2)
    LOAD(set_math_mode, cublasSetMathMode)
    LOAD(status_name, cublasGetStatusName)
    LOAD(status_string, cublasGetStatusString)
    LOAD(gemm_ex, cublasGemmEx)
    LOAD(sgemm, cublasSgemm_v2) /* last: it says that all are loaded */
#undef LOAD
    return TP_OK;
}

/* cuBLAS calls in the convention of CUDA_TRY (check.h): "file:line: call:
 * STATUS_NAME (cuBLAS's description)" as a TP_ERR_DEVICE failure, then the
 * function's `fail` label. */
#define CUBLAS_TRY(call)                                                                                               \
    do {                                                                                                               \
        cublasStatus_t cublas_try_status_ = (call);                                                                    \
        if (cublas_try_status_ != CUBLAS_STATUS_SUCCESS) {                                                             \
            tp_fail(TP_ERR_DEVICE, "%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call,                                    \
                    blas.status_name(cublas_try_status_), blas.status_string(cublas_try_status_));                     \
            goto fail;                                                                                                 \
        }                                                                                                              \
    } while (0)

/* A kernel launch fails at once (a bad configuration) or later, at the next
 * synchronizing call, for errors while it runs. */
#define LAUNCH_CHECK() CUDA_TRY(cudaGetLastError())

#define THREADS 256        /* per block, elementwise and row kernels (a multiple of 32: block_reduce) */
#define MAX_BLOCKS 65535   /* within every device generation's grid limits; grid-stride loops do the rest */
#define COL_TILE 32        /* columns per block in column sums */
#define COL_ROWS 16        /* thread rows per block in column sums */
#define SUM_BLOCKS 1024    /* sum_of_squares' first-pass blocks (partials) */
#define LAYERNORM_EPS 1e-5f
#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */

/* ==================================================================== state */

static struct {
    int ready, device;
    cudaStream_t stream;
    cudaStream_t side; /* copies beside the computation (to_host_background) */
    cublasHandle_t blas;
    double *sums;     /* device [SUM_BLOCKS + 1]: sum_of_squares' block partials, then its result */
    uint16_t *bf16;   /* device scratch: the bf16 products' rounded operands (bf16 bits), grown as needed */
    size_t bf16_size; /* its capacity in values */
    kernel_backend table;
} state;
static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER; /* kernels_cuda */
static pthread_mutex_t sums_lock = PTHREAD_MUTEX_INITIALIZER;  /* state.sums */
static pthread_mutex_t bf16_lock = PTHREAD_MUTEX_INITIALIZER;  /* state.bf16, from rounding to the last product */

/* Every operation first makes the backend's device current in the calling
 * thread (the trainer may call from threads other than the one that created
 * the backend; cudaSetDevice is per thread and cheap) and drops the error a
 * failed runtime call may have left behind, so that LAUNCH_CHECK reports
 * this operation's launches only. Errors of running kernels are sticky and
 * still come back from the next call. */
#define ENTER()                                                                                                        \
    do {                                                                                                               \
        (void)cudaGetLastError();                                                                                      \
        CUDA_TRY(cudaSetDevice(state.device));                                                                         \
    } while (0)

/* Blocks for `work` items at `per_block` each, at least 1 (callers skip
 * empty work: a grid of 0 blocks is a launch error) and at most MAX_BLOCKS. */
static unsigned blocks_for(int64_t work, int64_t per_block)
{
    int64_t blocks = (work + per_block - 1) / per_block;
    return (unsigned)(blocks < 1 ? 1 : blocks > MAX_BLOCKS ? MAX_BLOCKS : blocks);
}

#define GRID_STRIDE(i, n)                                                                                              \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)
#define ROWS_OF_BLOCK(row, rows) for (int64_t row = blockIdx.x; row < (rows); row += gridDim.x)
#define COLUMNS_OF_THREAD(c, count) for (int64_t c = threadIdx.x; c < (count); c += blockDim.x)

/* ========================================================== block reductions
 * The value of every thread of the block combined, returned to every thread
 * (bitwise the same in each: the butterfly pairs combine commutatively and
 * every thread adds the warps' partials in the same order). Every thread of
 * the block must call it; blockDim.x a multiple of 32, blockDim.y 1. */

struct Sum {
    template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct Max {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename T, typename Op> __device__ T block_reduce(T value, Op op)
{
    __shared__ T partial[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    for (int offset = 16; offset > 0; offset >>= 1) value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
    __syncthreads(); /* every thread has read the partials of an earlier call */
    if (lane == 0) partial[warp] = value;
    __syncthreads();
    T total = partial[0];
    for (int w = 1; w < warps; w++) total = op(total, partial[w]);
    return total;
}

static __device__ float block_sum(float value)
{
    return block_reduce(value, Sum());
}
static __device__ double block_sum_double(double value)
{
    return block_reduce(value, Sum());
}
static __device__ float block_max(float value)
{
    return block_reduce(value, Max());
}

/* ======================================================== memory and copies */

static int cuda_alloc(void **out, size_t bytes)
{
    *out = NULL;
    ENTER();
    {
        cudaError_t error = cudaMalloc(out, bytes ? bytes : 1);
        if (error != cudaSuccess) {
            (void)cudaGetLastError();
            *out = NULL;
            return tp_fail(TP_ERR_DEVICE, "cannot allocate %zu bytes on CUDA device %d: %s", bytes, state.device,
                           cudaGetErrorString(error));
        }
    }
    CUDA_TRY(cudaMemsetAsync(*out, 0, bytes, state.stream));
    CUDA_TRY(cudaStreamSynchronize(state.stream));
    return TP_OK;
fail:
    if (*out) cudaFree(*out);
    *out = NULL;
    return TP_ERR_DEVICE;
}

/* Waits for the stream first: kernels queued on it may still use the memory. */
static void cuda_release(void *memory)
{
    if (!memory) return;
    if (cudaSetDevice(state.device) == cudaSuccess) cudaStreamSynchronize(state.stream);
    cudaFree(memory);
    (void)cudaGetLastError(); /* nowhere to report it; not left for the next launch check */
}

static int cuda_zero(void *memory, size_t bytes)
{
    ENTER();
    if (bytes) CUDA_TRY(cudaMemsetAsync(memory, 0, bytes, state.stream));
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* Between host and device, synchronous for the host: the caller reuses its
 * buffer at once. */
static int copy_and_wait(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    ENTER();
    if (bytes) CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, state.stream));
    CUDA_TRY(cudaStreamSynchronize(state.stream));
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

static int cuda_to_device(void *device_dst, const void *host_src, size_t bytes)
{
    return copy_and_wait(device_dst, host_src, bytes, cudaMemcpyHostToDevice);
}

static int cuda_to_host(void *host_dst, const void *device_src, size_t bytes)
{
    return copy_and_wait(host_dst, device_src, bytes, cudaMemcpyDeviceToHost);
}

/* Device to device, queued. The CPU's copy is a memmove; a device copy of
 * overlapping ranges is undefined, so it is refused (dst == src is a no-op,
 * as on the CPU). */
static int cuda_copy(void *dst, const void *src, size_t bytes)
{
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    if (dst == src || bytes == 0) return TP_OK;
    if (d < s + bytes && s < d + bytes)
        return tp_fail(TP_ERR_ARG, "CUDA copy of %zu bytes between overlapping ranges (%p to %p)", bytes, src, dst);
    ENTER();
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, state.stream));
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

static int cuda_synchronize(void)
{
    ENTER();
    CUDA_TRY(cudaStreamSynchronize(state.stream));
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

static int cuda_host_alloc(void **out, size_t bytes)
{
    *out = NULL;
    ENTER();
    CUDA_TRY(cudaMallocHost(out, bytes ? bytes : 1));
    return TP_OK;
fail:
    *out = NULL;
    return TP_ERR_DEVICE;
}

static void cuda_host_release(void *memory)
{
    if (memory) cudaFreeHost(memory);
}

/* On the side stream, after an event that marks the work issued so far on
 * the computing stream: the copy overlaps what is issued after it. */
static int cuda_to_host_background(void *host_dst, const void *device_src, size_t bytes)
{
    cudaEvent_t issued = NULL;
    ENTER();
    CUDA_TRY(cudaEventCreateWithFlags(&issued, cudaEventDisableTiming));
    CUDA_TRY(cudaEventRecord(issued, state.stream));
    CUDA_TRY(cudaStreamWaitEvent(state.side, issued, 0));
    if (bytes) CUDA_TRY(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, state.side));
    CUDA_TRY(cudaStreamSynchronize(state.side));
    CUDA_TRY(cudaEventDestroy(issued));
    return TP_OK;
fail:
    if (issued) cudaEventDestroy(issued);
    return TP_ERR_DEVICE;
}

/* ========================================================= matrix products
 * cuBLAS is column-major: a row-major [R, K] array with row stride K is, read
 * column-major, its transpose, a K x R matrix with leading dimension K. So
 * each row-major product of linear.c is computed as its transpose:
 *
 *   forward   out[N,OC] = in[N,C] @ W[OC,C]^T
 *             column-major: out^T (OC x N, ld OC) = W^T^T (OC x C) . in^T (C x N)
 *             where W read column-major is W^T (C x OC, ld C), so op(A) = T,
 *             and in read column-major is in^T (C x N, ld C), op(B) = N:
 *             Sgemm(T, N, m=OC, n=N, k=C, A=W lda=C, B=in ldb=C, C=out ldc=OC)
 *   d_in      d_in[N,C] = d_out[N,OC] @ W[OC,C]
 *             column-major: d_in^T (C x N, ld C) = W^T (C x OC, ld C) . d_out^T (OC x N, ld OC):
 *             Sgemm(N, N, m=C, n=N, k=OC, A=W lda=C, B=d_out ldb=OC, beta 0, C=d_in ldc=C)
 *   d_weight  d_weight[OC,C] += d_out^T[OC,N] @ in[N,C]
 *             column-major: d_weight^T (C x OC, ld C) += in^T (C x N, ld C) . (d_out^T)^T (N x OC):
 *             Sgemm(N, T, m=C, n=OC, k=N, A=in lda=C, B=d_out ldb=OC, beta 1, C=d_weight ldc=C)
 *
 * Dimensions are int in cuBLAS's API: larger ones are refused. A product
 * with an empty inner dimension is a fill with zeros, done here (leading
 * dimensions of 0 are invalid in cuBLAS). */

static int fits_int(int64_t n)
{
    return n >= 0 && n <= INT32_MAX;
}

/* out[N,OC] += bias[OC] on every row. */
static __global__ void add_bias_kernel(float *out, const float *bias, int64_t N, int64_t OC)
{
    GRID_STRIDE(i, N * OC) out[i] += bias[i % OC];
}

/* sums[c] += sum over n of x[n*C + c]: a block takes COL_TILE columns, its
 * thread rows take every COL_ROWS-th row, and thread row 0 adds their sums in
 * order (deterministic: no atomics). */
static __global__ void column_sums_kernel(float *sums, const float *x, int64_t N, int64_t C)
{
    __shared__ float part[COL_ROWS][COL_TILE + 1];
    for (int64_t tile = blockIdx.x; tile * COL_TILE < C; tile += gridDim.x) {
        int64_t c = tile * COL_TILE + threadIdx.x;
        float s = 0;
        if (c < C)
            for (int64_t n = threadIdx.y; n < N; n += COL_ROWS) s += x[n * C + c];
        part[threadIdx.y][threadIdx.x] = s;
        __syncthreads();
        if (threadIdx.y == 0 && c < C) {
            float total = 0;
            for (int r = 0; r < COL_ROWS; r++) total += part[r][threadIdx.x];
            sums[c] += total;
        }
        __syncthreads(); /* part is reused by the next tile */
    }
}

/* ===================================================== bf16 matrix products
 * The bf16 twins (matmul_forward_bf16, matmul_backward_bf16; linear.c) are
 * the same products with each operand rounded to bf16 by round_bf16_kernel,
 * with bits_f32_to_bf16 (convert_bits.h), so to nearest, ties to even,
 * exactly as the CPU rounds; then cublasGemmEx with bf16 A and B, fp32 C and
 * CUBLAS_COMPUTE_32F: the products of bf16 values are exact in fp32 and are
 * summed in fp32 (tensor cores where cuBLAS picks them; not TF32, which
 * concerns fp32 operands only). The bias and d_bias stay fp32
 * (add_bias_kernel, column_sums_kernel on the unrounded d_out). One
 * function per direction serves both precisions (matmul_forward_in,
 * matmul_backward_in): only the operands (operands_begin) and the product
 * call (gemm) differ.
 *
 * The rounded operands (2 bytes a value) go to one device scratch buffer in
 * the state, grown when a product needs more and kept for the life of the
 * process, like state.sums; bf16_lock is held from the rounding of a
 * product's operands until its last product is queued, so that another
 * thread cannot overwrite them in between (on the one stream, work queued
 * later runs later, so once queued they are safe). Chosen over per-call
 * cudaMallocAsync: no dependence on the device's memory pool and its
 * release threshold (the default pool gives memory back at every
 * synchronization, so each step would map it again), no allocation per
 * product, and failures to get memory only while the buffer grows (the
 * trainer's products have the same shapes every step: after the first
 * step it no longer grows). The lock covers only the queueing, which is
 * short: threads sharing the GPU are not held up by each other's products. */

#define BF16_ALIGN 128 /* values: each part of the scratch starts 256-byte aligned */
#define MAX_OPERANDS 3

/* out[i] = the bf16 bits of in[i], rounded as the CPU rounds. */
static __global__ void round_bf16_kernel(uint16_t *out, const float *in, int64_t n)
{
    GRID_STRIDE(i, n) out[i] = bits_f32_to_bf16(__float_as_uint(in[i]));
}

/* Scratch for `count` rounded operands of sizes[i] values: parts[i]. Call
 * with bf16_lock held. Growing is stream-ordered (cudaFreeAsync and
 * cudaMallocAsync on the compute stream, which runs every product): the
 * products queued earlier still read the old buffer, and nothing waits for
 * the device. A cudaFree would, and could deadlock a pipeline: it waits for
 * a pending NCCL send whose receiver may wait for this rank. Out of device
 * memory: TP_ERR_NOMEM (kernels.h), another CUDA error: TP_ERR_DEVICE. */
static int bf16_scratch(uint16_t **parts, const int64_t *sizes, int count)
{
    size_t total = 0, offsets[MAX_OPERANDS];
    cudaError_t error;
    for (int i = 0; i < count; i++) { /* each size at most INT32_MAX^2 < 2^62: the sum fits */
        offsets[i] = total;
        total += ((size_t)sizes[i] + BF16_ALIGN - 1) / BF16_ALIGN * BF16_ALIGN;
    }
    if (total > SIZE_MAX / sizeof(uint16_t))
        return tp_fail(TP_ERR_NOMEM, "bf16 scratch of %zu values is beyond addressable memory", total);
    if (total > state.bf16_size) {
        if (state.bf16) {
            CUDA_TRY(cudaFreeAsync(state.bf16, state.stream));
            state.bf16 = NULL;
            state.bf16_size = 0;
        }
        error = cudaMallocAsync((void **)&state.bf16, total * sizeof(uint16_t), state.stream);
        if (error != cudaSuccess) {
            (void)cudaGetLastError();
            state.bf16 = NULL;
            return tp_fail(error == cudaErrorMemoryAllocation ? TP_ERR_NOMEM : TP_ERR_DEVICE,
                           "cannot allocate %zu bytes of bf16 scratch on CUDA device %d: %s",
                           total * sizeof(uint16_t), state.device, cudaGetErrorString(error));
        }
        state.bf16_size = total;
    }
    for (int i = 0; i < count; i++) parts[i] = state.bf16 + offsets[i];
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* The operands of one call's products as the products read them: the fp32
 * arrays themselves, or (bf16) their roundings in the scratch, with
 * bf16_lock held until operands_end. An operand of size 0 is not used. */
typedef struct {
    int bf16;
    const void *of[MAX_OPERANDS];
} operands;

static int operands_begin(operands *o, int bf16, const float *const *arrays, const int64_t *sizes, int count)
{
    uint16_t *parts[MAX_OPERANDS] = {NULL};
    o->bf16 = bf16;
    for (int i = 0; i < count; i++) o->of[i] = arrays[i];
    if (!bf16) return TP_OK;
    pthread_mutex_lock(&bf16_lock);
    TP_TRY(bf16_scratch(parts, sizes, count));
    for (int i = 0; i < count; i++) {
        o->of[i] = parts[i];
        if (sizes[i] == 0) continue;
        round_bf16_kernel<<<blocks_for(sizes[i], THREADS), THREADS, 0, state.stream>>>(parts[i], arrays[i], sizes[i]);
        LAUNCH_CHECK();
    }
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

static void operands_end(const operands *o)
{
    if (o->bf16) pthread_mutex_unlock(&bf16_lock);
}

/* C (m x n, ld ldc, fp32) = op(A) . op(B) + beta C, column-major, A and B
 * from o (fp32, or bf16 summed in fp32); dimensions checked by the caller
 * (int, nonzero). */
static int gemm(const operands *o, cublasOperation_t op_a, cublasOperation_t op_b, int64_t m, int64_t n, int64_t k,
                const void *A, int64_t lda, const void *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
    const float one = 1.0f;
    if (o->bf16)
        CUBLAS_TRY(blas.gemm_ex(state.blas, op_a, op_b, (int)m, (int)n, (int)k, &one, A, CUDA_R_16BF, (int)lda, B,
                                CUDA_R_16BF, (int)ldb, &beta, C, CUDA_R_32F, (int)ldc, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
    else
        CUBLAS_TRY(blas.sgemm(state.blas, op_a, op_b, (int)m, (int)n, (int)k, &one, (const float *)A, (int)lda,
                              (const float *)B, (int)ldb, &beta, C, (int)ldc));
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

static int dimensions_ok(const char *what, int bf16, int64_t N, int64_t C, int64_t OC)
{
    if (!fits_int(N) || !fits_int(C) || !fits_int(OC))
        return tp_fail(TP_ERR_ARG, "CUDA %s%s: N=%lld C=%lld OC=%lld beyond cuBLAS's int dimensions", what,
                       bf16 ? "_bf16" : "", (long long)N, (long long)C, (long long)OC);
    return TP_OK;
}

/* out = in . W^T (+ bias): operands in, W. */
static int matmul_forward_in(int bf16, float *out, const float *in, const float *weight, const float *bias, int64_t N,
                             int64_t C, int64_t OC)
{
    TP_TRY(dimensions_ok("matmul_forward", bf16, N, C, OC));
    ENTER();
    if (N == 0 || OC == 0) return TP_OK;
    if (C == 0) CUDA_TRY(cudaMemsetAsync(out, 0, (size_t)(N * OC) * sizeof(float), state.stream));
    else {
        const float *arrays[2] = {in, weight};
        const int64_t sizes[2] = {N * C, OC * C};
        operands o;
        int status = operands_begin(&o, bf16, arrays, sizes, 2);
        if (!status) status = gemm(&o, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, o.of[1], C, o.of[0], C, 0.0f, out, OC);
        operands_end(&o);
        if (status) return status;
    }
    if (bias) {
        add_bias_kernel<<<blocks_for(N * OC, THREADS), THREADS, 0, state.stream>>>(out, bias, N, OC);
        LAUNCH_CHECK();
    }
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* Operands d_out, then W when d_in is asked for and in when d_weight is
 * (size 0 otherwise: not rounded). */
static int matmul_backward_in(int bf16, float *d_in, float *d_weight, float *d_bias, const float *d_out,
                              const float *in, const float *weight, int64_t N, int64_t C, int64_t OC)
{
    TP_TRY(dimensions_ok("matmul_backward", bf16, N, C, OC));
    ENTER();
    if (N == 0) return TP_OK;
    if (d_in && C > 0 && OC == 0) CUDA_TRY(cudaMemsetAsync(d_in, 0, (size_t)(N * C) * sizeof(float), state.stream));
    if ((d_in || d_weight) && C > 0 && OC > 0) {
        const float *arrays[3] = {d_out, weight, in};
        const int64_t sizes[3] = {N * OC, d_in ? OC * C : 0, d_weight ? N * C : 0};
        operands o;
        int status = operands_begin(&o, bf16, arrays, sizes, 3);
        if (!status && d_in) /* d_in = d_out @ W, overwritten */
            status = gemm(&o, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, o.of[1], C, o.of[0], OC, 0.0f, d_in, C);
        if (!status && d_weight) /* d_weight += d_out^T @ in */
            status = gemm(&o, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, o.of[2], C, o.of[0], OC, 1.0f, d_weight, C);
        operands_end(&o);
        if (status) return status;
    }
    if (d_bias && OC > 0) { /* d_bias += column sums of the fp32 d_out */
        dim3 block(COL_TILE, COL_ROWS);
        column_sums_kernel<<<blocks_for(OC, COL_TILE), block, 0, state.stream>>>(d_bias, d_out, N, OC);
        LAUNCH_CHECK();
    }
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

static int cuda_matmul_forward(float *out, const float *in, const float *weight, const float *bias, int64_t N,
                               int64_t C, int64_t OC)
{
    return matmul_forward_in(0, out, in, weight, bias, N, C, OC);
}

static int cuda_matmul_forward_bf16(float *out, const float *in, const float *weight, const float *bias, int64_t N,
                                    int64_t C, int64_t OC)
{
    return matmul_forward_in(1, out, in, weight, bias, N, C, OC);
}

static int cuda_matmul_backward(float *d_in, float *d_weight, float *d_bias, const float *d_out, const float *in,
                                const float *weight, int64_t N, int64_t C, int64_t OC)
{
    return matmul_backward_in(0, d_in, d_weight, d_bias, d_out, in, weight, N, C, OC);
}

static int cuda_matmul_backward_bf16(float *d_in, float *d_weight, float *d_bias, const float *d_out, const float *in,
                                     const float *weight, int64_t N, int64_t C, int64_t OC)
{
    return matmul_backward_in(1, d_in, d_weight, d_bias, d_out, in, weight, N, C, OC);
}

/* ============================================================== layer norm */

/* A block per row, in the CPU's order of operations: mean, then the variance
 * about it (two passes), rstd = 1 / sqrt(var + eps). */
static __global__ void layernorm_forward_kernel(float *out, float *mean, float *rstd, const float *in,
                                                const float *weight, const float *bias, int64_t N, int64_t C)
{
    ROWS_OF_BLOCK(n, N) {
        const float *x = in + n * C;
        float *y = out + n * C;
        float s = 0;
        COLUMNS_OF_THREAD(c, C) s += x[c];
        float m = block_sum(s) / (float)C;
        float q = 0;
        COLUMNS_OF_THREAD(c, C) q += (x[c] - m) * (x[c] - m);
        float var = block_sum(q) / (float)C;
        float r = 1.0f / sqrtf(var + LAYERNORM_EPS);
        COLUMNS_OF_THREAD(c, C) y[c] = (x[c] - m) * r * weight[c] + bias[c];
        if (threadIdx.x == 0) {
            mean[n] = m;
            rstd[n] = r;
        }
    }
}

/* d_in's rows (a block per row), accumulated as norm.c does:
 * dx += (dxhat - mean(dxhat) - xhat mean(dxhat xhat)) rstd, dxhat = dy w. */
static __global__ void layernorm_backward_rows_kernel(float *d_in, const float *d_out, const float *in,
                                                      const float *weight, const float *mean, const float *rstd,
                                                      int64_t N, int64_t C)
{
    ROWS_OF_BLOCK(n, N) {
        const float *x = in + n * C, *dy = d_out + n * C;
        float *dx = d_in + n * C;
        float m = mean[n], s = rstd[n];
        float a = 0, b = 0;
        COLUMNS_OF_THREAD(c, C) {
            float xhat = (x[c] - m) * s, dxhat = dy[c] * weight[c];
            a += dxhat;
            b += dxhat * xhat;
        }
        float mean_dxhat = block_sum(a) / (float)C;
        float mean_dxhat_xhat = block_sum(b) / (float)C;
        COLUMNS_OF_THREAD(c, C) {
            float xhat = (x[c] - m) * s, dxhat = dy[c] * weight[c];
            dx[c] += (dxhat - mean_dxhat - xhat * mean_dxhat_xhat) * s;
        }
    }
}

/* d_bias[c] += sum of dy over rows, d_weight[c] += sum of xhat dy: column
 * sums as in column_sums_kernel. */
static __global__ void layernorm_backward_columns_kernel(float *d_weight, float *d_bias, const float *d_out,
                                                         const float *in, const float *mean, const float *rstd,
                                                         int64_t N, int64_t C)
{
    __shared__ float part_w[COL_ROWS][COL_TILE + 1], part_b[COL_ROWS][COL_TILE + 1];
    for (int64_t tile = blockIdx.x; tile * COL_TILE < C; tile += gridDim.x) {
        int64_t c = tile * COL_TILE + threadIdx.x;
        float sw = 0, sb = 0;
        if (c < C)
            for (int64_t n = threadIdx.y; n < N; n += COL_ROWS) {
                float dy = d_out[n * C + c], xhat = (in[n * C + c] - mean[n]) * rstd[n];
                sb += dy;
                sw += xhat * dy;
            }
        part_w[threadIdx.y][threadIdx.x] = sw;
        part_b[threadIdx.y][threadIdx.x] = sb;
        __syncthreads();
        if (threadIdx.y == 0 && c < C) {
            float tw = 0, tb = 0;
            for (int r = 0; r < COL_ROWS; r++) {
                tw += part_w[r][threadIdx.x];
                tb += part_b[r][threadIdx.x];
            }
            d_weight[c] += tw;
            d_bias[c] += tb;
        }
        __syncthreads();
    }
}

static int cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *in, const float *weight,
                                  const float *bias, int64_t N, int64_t C)
{
    ENTER();
    if (N <= 0) return TP_OK;
    layernorm_forward_kernel<<<blocks_for(N, 1), THREADS, 0, state.stream>>>(out, mean, rstd, in, weight, bias, N, C);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

static int cuda_layernorm_backward(float *d_in, float *d_weight, float *d_bias, const float *d_out, const float *in,
                                   const float *weight, const float *mean, const float *rstd, int64_t N, int64_t C)
{
    dim3 column_block(COL_TILE, COL_ROWS);
    ENTER();
    if (N <= 0 || C <= 0) return TP_OK;
    layernorm_backward_rows_kernel<<<blocks_for(N, 1), THREADS, 0, state.stream>>>(d_in, d_out, in, weight, mean,
                                                                                    rstd, N, C);
    LAUNCH_CHECK();
    layernorm_backward_columns_kernel<<<blocks_for(C, COL_TILE), column_block, 0, state.stream>>>(
        d_weight, d_bias, d_out, in, mean, rstd, N, C);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* =================================================================== GELU
 * As norm.c: x s with s = 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)); the CPU
 * takes exp from fast_exp.h (within 2 ulp of expf), the GPU its own expf
 * (also within 2 ulp): the two agree to a few ulp, not bit for bit. */

static __device__ float gelu_gate(float x)
{
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    return 1.0f / (1.0f + expf(-2.0f * u));
}

static __global__ void gelu_forward_kernel(float *out, const float *in, int64_t n)
{
    GRID_STRIDE(i, n) out[i] = in[i] * gelu_gate(in[i]);
}

/* d/dx [x s] = s + x * 2 s (1 - s) * du/dx. */
static __global__ void gelu_backward_kernel(float *d_in, const float *in, const float *d_out, int64_t n)
{
    GRID_STRIDE(i, n) {
        float x = in[i], s = gelu_gate(x);
        float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        d_in[i] = (s + 2.0f * x * s * (1.0f - s) * du) * d_out[i];
    }
}

static int cuda_gelu_forward(float *out, const float *in, int64_t n)
{
    ENTER();
    if (n <= 0) return TP_OK;
    gelu_forward_kernel<<<blocks_for(n, THREADS), THREADS, 0, state.stream>>>(out, in, n);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

static int cuda_gelu_backward(float *d_in, const float *in, const float *d_out, int64_t n)
{
    ENTER();
    if (n <= 0) return TP_OK;
    gelu_backward_kernel<<<blocks_for(n, THREADS), THREADS, 0, state.stream>>>(d_in, in, d_out, n);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* ================================================================ RMSNorm
 * As norm.c: a block per row for the forward and for d_in, rstd =
 * 1 / sqrt(mean(x^2) + eps), y = x rstd w; d_weight by column sums in a
 * fixed order as layernorm_backward_columns_kernel (no atomics). */

static __global__ void rmsnorm_forward_kernel(float *out, float *rstd, const float *in, const float *weight,
                                              int64_t N, int64_t C, float eps)
{
    ROWS_OF_BLOCK(n, N) {
        const float *x = in + n * C;
        float *y = out + n * C;
        float q = 0;
        COLUMNS_OF_THREAD(c, C) q += x[c] * x[c];
        float r = 1.0f / sqrtf(block_sum(q) / (float)C + eps);
        COLUMNS_OF_THREAD(c, C) y[c] = x[c] * r * weight[c];
        if (threadIdx.x == 0) rstd[n] = r;
    }
}

/* dx += (dxhat - xhat mean(dxhat xhat)) rstd, xhat = x rstd, dxhat = dy w. */
static __global__ void rmsnorm_backward_rows_kernel(float *d_in, const float *d_out, const float *in,
                                                    const float *weight, const float *rstd, int64_t N, int64_t C)
{
    ROWS_OF_BLOCK(n, N) {
        const float *x = in + n * C, *dy = d_out + n * C;
        float *dx = d_in + n * C;
        float s = rstd[n], b = 0;
        COLUMNS_OF_THREAD(c, C) b += dy[c] * weight[c] * (x[c] * s);
        float mean_dxhat_xhat = block_sum(b) / (float)C;
        COLUMNS_OF_THREAD(c, C) {
            float xhat = x[c] * s, dxhat = dy[c] * weight[c];
            dx[c] += (dxhat - xhat * mean_dxhat_xhat) * s;
        }
    }
}

/* d_weight[c] += sum over rows of x rstd dy. */
static __global__ void rmsnorm_backward_columns_kernel(float *d_weight, const float *d_out, const float *in,
                                                       const float *rstd, int64_t N, int64_t C)
{
    __shared__ float part[COL_ROWS][COL_TILE + 1];
    for (int64_t tile = blockIdx.x; tile * COL_TILE < C; tile += gridDim.x) {
        int64_t c = tile * COL_TILE + threadIdx.x;
        float sw = 0;
        if (c < C)
            for (int64_t n = threadIdx.y; n < N; n += COL_ROWS) sw += in[n * C + c] * rstd[n] * d_out[n * C + c];
        part[threadIdx.y][threadIdx.x] = sw;
        __syncthreads();
        if (threadIdx.y == 0 && c < C) {
            float total = 0;
            for (int r = 0; r < COL_ROWS; r++) total += part[r][threadIdx.x];
            d_weight[c] += total;
        }
        __syncthreads();
    }
}

static int cuda_rmsnorm_forward(float *out, float *rstd, const float *in, const float *weight, int64_t N, int64_t C,
                                float eps)
{
    ENTER();
    if (N <= 0) return TP_OK;
    rmsnorm_forward_kernel<<<blocks_for(N, 1), THREADS, 0, state.stream>>>(out, rstd, in, weight, N, C, eps);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

static int cuda_rmsnorm_backward(float *d_in, float *d_weight, const float *d_out, const float *in,
                                 const float *weight, const float *rstd, int64_t N, int64_t C)
{
    dim3 column_block(COL_TILE, COL_ROWS);
    ENTER();
    if (N <= 0 || C <= 0) return TP_OK;
    rmsnorm_backward_rows_kernel<<<blocks_for(N, 1), THREADS, 0, state.stream>>>(d_in, d_out, in, weight, rstd, N,
                                                                                  C);
    LAUNCH_CHECK();
    rmsnorm_backward_columns_kernel<<<blocks_for(C, COL_TILE), column_block, 0, state.stream>>>(d_weight, d_out, in,
                                                                                                 rstd, N, C);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* ================================================================= SwiGLU
 * As norm.c: in[N,2F] = [gate | up] per row, out[N,F] = g / (1 + exp(-g)) up;
 * the GPU's expf for the CPU's fast_expf (each within 2 ulp). An element of
 * out (and its two of d_in) per thread. */

static __global__ void swiglu_forward_kernel(float *out, const float *in, int64_t N, int64_t F)
{
    GRID_STRIDE(i, N * F) {
        int64_t n = i / F, f = i - n * F;
        float g = in[n * 2 * F + f];
        out[i] = g / (1.0f + expf(-g)) * in[n * 2 * F + F + f];
    }
}

/* d up = dy g s, d gate = dy up s (1 + g (1 - s)), s = sigmoid(g). */
static __global__ void swiglu_backward_kernel(float *d_in, const float *in, const float *d_out, int64_t N, int64_t F)
{
    GRID_STRIDE(i, N * F) {
        int64_t n = i / F, f = i - n * F;
        float g = in[n * 2 * F + f], up = in[n * 2 * F + F + f], dy = d_out[i];
        float s = 1.0f / (1.0f + expf(-g));
        d_in[n * 2 * F + F + f] = dy * (g * s);
        d_in[n * 2 * F + f] = dy * up * (s * (1.0f + g * (1.0f - s)));
    }
}

static int cuda_swiglu_forward(float *out, const float *in, int64_t N, int64_t F)
{
    ENTER();
    if (N <= 0 || F <= 0) return TP_OK;
    swiglu_forward_kernel<<<blocks_for(N * F, THREADS), THREADS, 0, state.stream>>>(out, in, N, F);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

static int cuda_swiglu_backward(float *d_in, const float *in, const float *d_out, int64_t N, int64_t F)
{
    ENTER();
    if (N <= 0 || F <= 0) return TP_OK;
    swiglu_backward_kernel<<<blocks_for(N * F, THREADS), THREADS, 0, state.stream>>>(d_in, in, d_out, N, F);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* ======================================================= rotary embeddings
 * As rope.c: in each of the first H = Hq + Hkv heads of every row of
 * qkv[B,T,(Hq+2Hkv)*hd], element j < hd/2 and j + hd/2 turn by the angle
 * whose (cos, sin) is cos_sin[t, j]; sign +1 forward, -1 backward (the
 * transpose). A pair per thread, in place: no two threads share an element. */

static __global__ void rope_kernel(float *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t H, int64_t stride,
                                   int64_t hd, float sign)
{
    int64_t half = hd / 2;
    GRID_STRIDE(i, B * T * H * half) {
        int64_t j = i % half, head = i / half, h = head % H, row = head / H, t = row % T;
        float *x = qkv + row * stride + h * hd;
        float c = cos_sin[(t * half + j) * 2], s = sign * cos_sin[(t * half + j) * 2 + 1];
        float lo = x[j], hi = x[j + half];
        x[j] = lo * c - hi * s;
        x[j + half] = hi * c + lo * s;
    }
}

static int rope_turn(float *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd,
                     float sign)
{
    ENTER();
    if (B <= 0 || T <= 0 || Hq + Hkv <= 0 || hd / 2 <= 0) return TP_OK;
    rope_kernel<<<blocks_for(B * T * (Hq + Hkv) * (hd / 2), THREADS), THREADS, 0, state.stream>>>(
        qkv, cos_sin, B, T, Hq + Hkv, (Hq + 2 * Hkv) * hd, hd, sign);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

static int cuda_rope_forward(float *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                             int64_t hd)
{
    return rope_turn(qkv, cos_sin, B, T, Hq, Hkv, hd, 1.0f);
}

static int cuda_rope_backward(float *d_qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                              int64_t hd)
{
    return rope_turn(d_qkv, cos_sin, B, T, Hq, Hkv, hd, -1.0f);
}

/* ============================================================ elementwise
 * Each element read and written by one thread: out may be any of the inputs
 * (the trainer computes residual_forward(x, x, ...) and
 * bias_residual_forward(p, x, p, ...)). */

static __global__ void residual_kernel(float *out, const float *a, const float *b, int64_t n)
{
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

static __global__ void bias_residual_kernel(float *out, const float *x, const float *partial, const float *bias,
                                            int64_t N, int64_t C)
{
    GRID_STRIDE(i, N * C) out[i] = x[i] + (partial[i] + bias[i % C]);
}

static __global__ void add_kernel(float *acc, const float *x, int64_t n)
{
    GRID_STRIDE(i, n) acc[i] += x[i];
}

static __global__ void scale_kernel(float *x, float scale, int64_t n)
{
    GRID_STRIDE(i, n) x[i] *= scale;
}

static int cuda_residual_forward(float *out, const float *a, const float *b, int64_t n)
{
    ENTER();
    if (n <= 0) return TP_OK;
    residual_kernel<<<blocks_for(n, THREADS), THREADS, 0, state.stream>>>(out, a, b, n);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

static int cuda_bias_residual_forward(float *out, const float *x, const float *partial, const float *bias, int64_t N,
                                      int64_t C)
{
    ENTER();
    if (N <= 0 || C <= 0) return TP_OK;
    bias_residual_kernel<<<blocks_for(N * C, THREADS), THREADS, 0, state.stream>>>(out, x, partial, bias, N, C);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

static int cuda_add_inplace(float *acc, const float *x, int64_t n)
{
    ENTER();
    if (n <= 0) return TP_OK;
    add_kernel<<<blocks_for(n, THREADS), THREADS, 0, state.stream>>>(acc, x, n);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

static int cuda_scale_inplace(float *x, float scale, int64_t n)
{
    ENTER();
    if (n <= 0) return TP_OK;
    scale_kernel<<<blocks_for(n, THREADS), THREADS, 0, state.stream>>>(x, scale, n);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* ============================================================== attention
 * qkv[B,T,(Hq+2Hkv)*hd]: at position t of batch b, query head h at
 * (b T + t) stride + h hd, its key head (h / group) at Hq hd + (h / group) hd
 * and its value head at (Hq + Hkv + h / group) hd, stride = (Hq + 2 Hkv) hd,
 * group = Hq / Hkv. out[B,T,Hq*hd]; lse[B,Hq,T], row r = (b Hq + h) T + i.
 *
 * Memory-efficient, as attention.c: no [T, T] matrix anywhere. A warp per
 * row: each lane holds the dimensions d = lane + 32 e (e < HEAD_DIMS_PER_LANE)
 * of the row's vectors in registers, a score is the warp's sum of the lanes'
 * partial products (every lane gets the same value), and the forward keeps a
 * running maximum and sum (online softmax) so that one pass over the keys
 * suffices. The backward recomputes each probability from lse: one kernel
 * per query row (dq, and delta_i = d_out_i . out_i for the other), one per
 * key row (dk and dv over the query rows and heads that see it). Every
 * element of d_qkv has one writer: no atomics, no zeroing. */

#define HEAD_DIMS_PER_LANE 8 /* head dimensions up to 256 */

/* w runs over warps of the grid (all lanes of a warp see the same w). */
#define WARPS_OF_GRID(w, count)                                                                                        \
    for (int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5; w < (count);                           \
         w += ((int64_t)gridDim.x * blockDim.x) >> 5)
#define LANE_DIMS(e, d, hd)                                                                                            \
    _Pragma("unroll") for (int e = 0, d = (int)(threadIdx.x & 31); e < HEAD_DIMS_PER_LANE && d < (hd); e++, d += 32)

static __device__ float warp_sum(float value)
{
    for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
    return value;
}

/* The warp's dot product of a row held in registers with the row at p. */
static __device__ float warp_dot(const float *held, const float *p, int64_t hd)
{
    float partial = 0;
    LANE_DIMS(e, d, hd) partial += held[e] * p[d];
    return warp_sum(partial);
}

static __device__ void load_row(float *held, const float *p, int64_t hd)
{
    LANE_DIMS(e, d, hd) held[e] = p[d];
}

static __global__ void attention_forward_kernel(float *out, float *lse, const float *qkv, int64_t B, int64_t T,
                                                int64_t Hq, int64_t Hkv, int64_t hd, float scale)
{
    int64_t stride = (Hq + 2 * Hkv) * hd, group = Hq / Hkv;
    WARPS_OF_GRID(r, B * Hq * T) {
        int64_t i = r % T, h = (r / T) % Hq, b = r / (T * Hq);
        const float *k = qkv + b * T * stride + (Hq + h / group) * hd; /* key j at k + j stride */
        const float *v = qkv + b * T * stride + (Hq + Hkv + h / group) * hd;
        float q[HEAD_DIMS_PER_LANE], acc[HEAD_DIMS_PER_LANE] = {0};
        load_row(q, qkv + (b * T + i) * stride + h * hd, hd);
        float max = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= i; j++) {
            float s = warp_dot(q, k + j * stride, hd) * scale;
            float new_max = fmaxf(max, s), rescale = expf(max - new_max), p = expf(s - new_max);
            sum = sum * rescale + p;
            LANE_DIMS(e, d, hd) acc[e] = acc[e] * rescale + p * v[j * stride + d];
            max = new_max;
        }
        float *o = out + (b * T + i) * Hq * hd + h * hd;
        LANE_DIMS(e, d, hd) o[d] = acc[e] / sum;
        if ((threadIdx.x & 31) == 0) lse[r] = max + logf(sum);
    }
}

/* A warp per query row r: delta[r] = d_out_i . out_i, then
 * dq_i = sum_{j <= i} p_ij (d_out_i . v_j - delta) scale k_j. */
static __global__ void attention_backward_queries_kernel(float *d_qkv, float *delta, const float *d_out,
                                                         const float *qkv, const float *out, const float *lse,
                                                         int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd,
                                                         float scale)
{
    int64_t stride = (Hq + 2 * Hkv) * hd, group = Hq / Hkv;
    WARPS_OF_GRID(r, B * Hq * T) {
        int64_t i = r % T, h = (r / T) % Hq, b = r / (T * Hq), row = (b * T + i) * Hq * hd + h * hd;
        const float *k = qkv + b * T * stride + (Hq + h / group) * hd;
        const float *v = qkv + b * T * stride + (Hq + Hkv + h / group) * hd;
        float q[HEAD_DIMS_PER_LANE], g[HEAD_DIMS_PER_LANE], dq[HEAD_DIMS_PER_LANE] = {0};
        load_row(q, qkv + (b * T + i) * stride + h * hd, hd);
        load_row(g, d_out + row, hd);
        float row_delta = warp_dot(g, out + row, hd), row_lse = lse[r];
        if ((threadIdx.x & 31) == 0) delta[r] = row_delta;
        for (int64_t j = 0; j <= i; j++) {
            float p = expf(warp_dot(q, k + j * stride, hd) * scale - row_lse);
            float ds = p * (warp_dot(g, v + j * stride, hd) - row_delta) * scale;
            LANE_DIMS(e, d, hd) dq[e] += ds * k[j * stride + d];
        }
        float *dst = d_qkv + (b * T + i) * stride + h * hd;
        LANE_DIMS(e, d, hd) dst[d] = dq[e];
    }
}

/* A warp per key row (b, key head kh, j), after the queries kernel (delta):
 * over the group's query heads h and rows i >= j,
 * dk_j = sum p_ij (d_out_i . v_j - delta_i) scale q_i, dv_j = sum p_ij d_out_i. */
static __global__ void attention_backward_keys_kernel(float *d_qkv, const float *delta, const float *d_out,
                                                      const float *qkv, const float *lse, int64_t B, int64_t T,
                                                      int64_t Hq, int64_t Hkv, int64_t hd, float scale)
{
    int64_t stride = (Hq + 2 * Hkv) * hd, group = Hq / Hkv;
    WARPS_OF_GRID(r, B * Hkv * T) {
        int64_t j = r % T, kh = (r / T) % Hkv, b = r / (T * Hkv);
        float k[HEAD_DIMS_PER_LANE], v[HEAD_DIMS_PER_LANE], dk[HEAD_DIMS_PER_LANE] = {0}, dv[HEAD_DIMS_PER_LANE] = {0};
        load_row(k, qkv + (b * T + j) * stride + (Hq + kh) * hd, hd);
        load_row(v, qkv + (b * T + j) * stride + (Hq + Hkv + kh) * hd, hd);
        for (int64_t h = kh * group; h < (kh + 1) * group; h++) {
            const float *row_lse = lse + (b * Hq + h) * T, *row_delta = delta + (b * Hq + h) * T;
            for (int64_t i = j; i < T; i++) {
                const float *q = qkv + (b * T + i) * stride + h * hd, *g = d_out + (b * T + i) * Hq * hd + h * hd;
                float p = expf(warp_dot(k, q, hd) * scale - row_lse[i]);
                float ds = p * (warp_dot(v, g, hd) - row_delta[i]) * scale;
                LANE_DIMS(e, d, hd) dk[e] += ds * q[d], dv[e] += p * g[d];
            }
        }
        float *dst = d_qkv + (b * T + j) * stride;
        LANE_DIMS(e, d, hd) dst[(Hq + kh) * hd + d] = dk[e], dst[(Hq + Hkv + kh) * hd + d] = dv[e];
    }
}

static int attention_shape_ok(const char *what, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd)
{
    if (B < 0 || T < 0 || Hq < 0 || hd <= 0 || hd > 32 * HEAD_DIMS_PER_LANE || Hkv <= 0 || Hq % Hkv != 0)
        return tp_fail(TP_ERR_ARG,
                       "CUDA %s: B=%lld T=%lld Hq=%lld Hkv=%lld hd=%lld (want 0 < hd <= %d and Hq a multiple of "
                       "Hkv > 0)",
                       what, (long long)B, (long long)T, (long long)Hq, (long long)Hkv, (long long)hd,
                       32 * HEAD_DIMS_PER_LANE);
    return TP_OK;
}

/* The scratch: the forward needs none; the backward keeps delta[B,Hq,T] at
 * its start. */
static int cuda_attention_forward(float *out, float *lse, float *scratch, const float *qkv, int64_t B, int64_t T,
                                  int64_t Hq, int64_t Hkv, int64_t hd)
{
    float scale = 1.0f / sqrtf((float)hd);
    (void)scratch;
    TP_TRY(attention_shape_ok("attention_forward", B, T, Hq, Hkv, hd));
    ENTER();
    if (B == 0 || T == 0 || Hq == 0) return TP_OK;
    if (cuda_attention_tiled_chosen() && cuda_attention_tiled_fits(B, Hq, hd))
        return cuda_attention_tiled_forward(out, lse, qkv, B, T, Hq, Hkv, hd, state.stream);
    attention_forward_kernel<<<blocks_for(B * Hq * T * 32, THREADS), THREADS, 0, state.stream>>>(out, lse, qkv, B, T,
                                                                                                  Hq, Hkv, hd, scale);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

static int cuda_attention_backward(float *d_qkv, float *scratch, const float *d_out, const float *qkv,
                                   const float *out, const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                                   int64_t hd)
{
    float scale = 1.0f / sqrtf((float)hd);
    TP_TRY(attention_shape_ok("attention_backward", B, T, Hq, Hkv, hd));
    ENTER();
    if (B == 0 || T == 0) return TP_OK;
    if (cuda_attention_tiled_chosen() && cuda_attention_tiled_fits(B, Hq, hd))
        return cuda_attention_tiled_backward(d_qkv, scratch, d_out, qkv, out, lse, B, T, Hq, Hkv, hd, state.stream);
    attention_backward_queries_kernel<<<blocks_for(B * Hq * T * 32, THREADS), THREADS, 0, state.stream>>>(
        d_qkv, scratch, d_out, qkv, out, lse, B, T, Hq, Hkv, hd, scale);
    LAUNCH_CHECK();
    attention_backward_keys_kernel<<<blocks_for(B * Hkv * T * 32, THREADS), THREADS, 0, state.stream>>>(
        d_qkv, scratch, d_out, qkv, lse, B, T, Hq, Hkv, hd, scale);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* ============================================== embedding and cross-entropy */

/* out[n,c] = table[token - first, c] for tokens held here, else 0. */
static __global__ void embedding_forward_kernel(float *out, const int *tokens, const float *table, int64_t N, int64_t C,
                                                int64_t first, int64_t rows)
{
    GRID_STRIDE(i, N * C) {
        int64_t n = i / C, c = i % C, row = (int64_t)tokens[n] - first;
        out[i] = row >= 0 && row < rows ? table[row * C + c] : 0.0f;
    }
}

/* d_table[token - first, c] += d_out[n,c]. A token may come several times
 * in the batch, so threads of different n add to the same element: atomics
 * (their order, hence the last bits of a repeated token's row, varies from
 * run to run). */
static __global__ void embedding_backward_kernel(float *d_table, const int *tokens, const float *d_out, int64_t N,
                                                 int64_t C, int64_t first, int64_t rows)
{
    GRID_STRIDE(i, N * C) {
        int64_t n = i / C, c = i % C, row = (int64_t)tokens[n] - first;
        if (row >= 0 && row < rows) atomicAdd(&d_table[row * C + c], d_out[i]);
    }
}

static int cuda_embedding_forward(float *out, const int *tokens, const float *table, int64_t N, int64_t C,
                                  int64_t first, int64_t rows)
{
    ENTER();
    if (N <= 0 || C <= 0) return TP_OK;
    embedding_forward_kernel<<<blocks_for(N * C, THREADS), THREADS, 0, state.stream>>>(out, tokens, table, N, C,
                                                                                        first, rows);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

static int cuda_embedding_backward(float *d_table, const int *tokens, const float *d_out, int64_t N, int64_t C,
                                   int64_t first, int64_t rows)
{
    ENTER();
    if (N <= 0 || C <= 0) return TP_OK;
    embedding_backward_kernel<<<blocks_for(N * C, THREADS), THREADS, 0, state.stream>>>(d_table, tokens, d_out, N, C,
                                                                                         first, rows);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* Columns of this rank that are real vocabulary (not padding), as embedding.c. */
static int64_t valid_columns(int64_t V, int64_t first, int64_t vocab)
{
    int64_t valid = vocab - first;
    return valid < 0 ? 0 : valid > V ? V : valid;
}

/* A block per row; -infinity for a row without valid columns, as the CPU. */
static __global__ void row_max_kernel(float *row_max, const float *logits, int64_t N, int64_t V, int64_t valid)
{
    ROWS_OF_BLOCK(n, N) {
        float max = -INFINITY;
        COLUMNS_OF_THREAD(v, valid) max = fmaxf(max, logits[n * V + v]);
        max = block_max(max);
        if (threadIdx.x == 0) row_max[n] = max;
    }
}

static __global__ void row_sumexp_kernel(float *sum, const float *logits, const float *row_max, int64_t N, int64_t V,
                                         int64_t valid)
{
    ROWS_OF_BLOCK(n, N) {
        float s = 0;
        COLUMNS_OF_THREAD(v, valid) s += expf(logits[n * V + v] - row_max[n]);
        s = block_sum(s);
        if (threadIdx.x == 0) sum[n] = s;
    }
}

/* The target's logit when its column is held here (any of the V columns, as
 * the CPU: targets are real tokens, never padding), else 0. */
static __global__ void target_logit_kernel(float *target, const float *logits, const int *targets, int64_t N, int64_t V,
                                           int64_t first)
{
    GRID_STRIDE(n, N) {
        int64_t column = (int64_t)targets[n] - first;
        target[n] = column >= 0 && column < V ? logits[n * V + column] : 0.0f;
    }
}

/* d = scale softmax - scale at the target's column; zero in padding columns. */
static __global__ void crossentropy_backward_kernel(float *d_logits, const float *logits, const float *row_max,
                                                    const float *sum, const int *targets, int64_t N, int64_t V,
                                                    int64_t first, int64_t valid, float scale)
{
    GRID_STRIDE(i, N * V) {
        int64_t n = i / V, v = i % V;
        float d = 0.0f;
        if (v < valid) {
            d = scale * expf(logits[i] - row_max[n]) / sum[n];
            if (v == (int64_t)targets[n] - first) d -= scale;
        }
        d_logits[i] = d;
    }
}

static int cuda_crossentropy_row_max(float *row_max, const float *logits, int64_t N, int64_t V, int64_t first,
                                     int64_t vocab)
{
    int64_t valid = valid_columns(V, first, vocab);
    ENTER();
    if (N <= 0) return TP_OK;
    row_max_kernel<<<blocks_for(N, 1), THREADS, 0, state.stream>>>(row_max, logits, N, V, valid);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

static int cuda_crossentropy_row_sumexp(float *sum, const float *logits, const float *row_max, int64_t N, int64_t V,
                                        int64_t first, int64_t vocab)
{
    int64_t valid = valid_columns(V, first, vocab);
    ENTER();
    if (N <= 0) return TP_OK;
    row_sumexp_kernel<<<blocks_for(N, 1), THREADS, 0, state.stream>>>(sum, logits, row_max, N, V, valid);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

static int cuda_crossentropy_target_logit(float *target, const float *logits, const int *targets, int64_t N,
                                          int64_t V, int64_t first)
{
    ENTER();
    if (N <= 0) return TP_OK;
    target_logit_kernel<<<blocks_for(N, THREADS), THREADS, 0, state.stream>>>(target, logits, targets, N, V, first);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

static int cuda_crossentropy_backward(float *d_logits, const float *logits, const float *row_max, const float *sum,
                                      const int *targets, int64_t N, int64_t V, int64_t first, int64_t vocab,
                                      float scale)
{
    int64_t valid = valid_columns(V, first, vocab);
    ENTER();
    if (N <= 0 || V <= 0) return TP_OK;
    crossentropy_backward_kernel<<<blocks_for(N * V, THREADS), THREADS, 0, state.stream>>>(
        d_logits, logits, row_max, sum, targets, N, V, first, valid, scale);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* ============================================================ optimizer */

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

static int cuda_adamw_update(float *param, const float *grad, float *m, float *v, int64_t n, float lr, float beta1,
                             float beta2, float eps, float weight_decay, int64_t step)
{
    /* The scalars on the host in double, exactly as adamw.c computes them. */
    double bias1 = 1.0 - pow((double)beta1, (double)step), bias2 = 1.0 - pow((double)beta2, (double)step);
    float decay = (float)(1.0 - (double)lr * (double)weight_decay);
    float step_size = (float)((double)lr / bias1), bias2_sqrt = (float)sqrt(bias2);
    float keep1 = 1.0f - beta1, keep2 = 1.0f - beta2;
    ENTER();
    if (n <= 0) return TP_OK;
    adamw_kernel<<<blocks_for(n, THREADS), THREADS, 0, state.stream>>>(param, grad, m, v, n, decay, step_size,
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
static int cuda_sum_of_squares(double *out, const float *const *spans, const int64_t *lengths, int count)
{
    int status = TP_ERR_DEVICE;
    *out = 0;
    pthread_mutex_lock(&sums_lock); /* one result buffer for the process */
    ENTER();
    CUDA_TRY(cudaMemsetAsync(state.sums, 0, SUM_BLOCKS * sizeof(double), state.stream));
    for (int s = 0; s < count; s++) {
        if (lengths[s] <= 0) continue;
        unsigned blocks = blocks_for(lengths[s], THREADS);
        if (blocks > SUM_BLOCKS) blocks = SUM_BLOCKS;
        sum_squares_kernel<<<blocks, THREADS, 0, state.stream>>>(state.sums, spans[s], lengths[s]);
        LAUNCH_CHECK();
    }
    sum_partials_kernel<<<1, THREADS, 0, state.stream>>>(state.sums + SUM_BLOCKS, state.sums, SUM_BLOCKS);
    LAUNCH_CHECK();
    CUDA_TRY(cudaMemcpyAsync(out, state.sums + SUM_BLOCKS, sizeof(double), cudaMemcpyDeviceToHost, state.stream));
    CUDA_TRY(cudaStreamSynchronize(state.stream));
    status = TP_OK;
fail:
    pthread_mutex_unlock(&sums_lock);
    return status;
}

/* ================================================================ the table */

static void fill_table(kernel_backend *t)
{
    memset(t, 0, sizeof *t);
    t->name = "cuda";
    t->on_device = 1;
    t->alloc = cuda_alloc;
    t->release = cuda_release;
    t->zero = cuda_zero;
    t->to_device = cuda_to_device;
    t->to_host = cuda_to_host;
    t->copy = cuda_copy;
    t->synchronize = cuda_synchronize;
    t->host_alloc = cuda_host_alloc;
    t->host_release = cuda_host_release;
    t->to_host_background = cuda_to_host_background;
    t->matmul_forward = cuda_matmul_forward;
    t->matmul_backward = cuda_matmul_backward;
    t->matmul_forward_bf16 = cuda_matmul_forward_bf16;
    t->matmul_backward_bf16 = cuda_matmul_backward_bf16;
    t->layernorm_forward = cuda_layernorm_forward;
    t->layernorm_backward = cuda_layernorm_backward;
    t->gelu_forward = cuda_gelu_forward;
    t->gelu_backward = cuda_gelu_backward;
    t->rmsnorm_forward = cuda_rmsnorm_forward;
    t->rmsnorm_backward = cuda_rmsnorm_backward;
    t->swiglu_forward = cuda_swiglu_forward;
    t->swiglu_backward = cuda_swiglu_backward;
    t->rope_forward = cuda_rope_forward;
    t->rope_backward = cuda_rope_backward;
    t->residual_forward = cuda_residual_forward;
    t->bias_residual_forward = cuda_bias_residual_forward;
    t->add_inplace = cuda_add_inplace;
    t->scale_inplace = cuda_scale_inplace;
    t->attention_forward = cuda_attention_forward;
    t->attention_backward = cuda_attention_backward;
    t->embedding_forward = cuda_embedding_forward;
    t->embedding_backward = cuda_embedding_backward;
    t->crossentropy_row_max = cuda_crossentropy_row_max;
    t->crossentropy_row_sumexp = cuda_crossentropy_row_sumexp;
    t->crossentropy_target_logit = cuda_crossentropy_target_logit;
    t->crossentropy_backward = cuda_crossentropy_backward;
    t->adamw_update = cuda_adamw_update;
    t->sum_of_squares = cuda_sum_of_squares;
}

extern "C" int cuda_backend_stream(cudaStream_t *stream, int *device)
{
    pthread_mutex_lock(&state_lock);
    int ready = state.ready;
    *stream = state.stream;
    *device = state.device;
    pthread_mutex_unlock(&state_lock);
    return ready ? TP_OK : tp_fail(TP_ERR_STATE, "the CUDA backend is not made yet (kernels_cuda comes first)");
}

/* Created on the first call and kept for the life of the process (the
 * stream, handle and buffer are released with it). A failed creation leaves
 * nothing behind, and a later call tries again. */
extern "C" const kernel_backend *kernels_cuda(int device)
{
    const kernel_backend *result = NULL;
    int count = 0;
    cudaError_t error;
    pthread_mutex_lock(&state_lock);
    if (state.ready) {
        if (device == state.device) result = &state.table;
        else
            tp_fail(TP_ERR_DEVICE,
                    "the CUDA backend of this process is on device %d; device %d asked for (one device per process)",
                    state.device, device);
        goto done;
    }
    error = cudaGetDeviceCount(&count);
    if (error != cudaSuccess) {
        (void)cudaGetLastError();
        tp_fail(TP_ERR_DEVICE, "no CUDA device (cudaGetDeviceCount: %s)", cudaGetErrorString(error));
        goto done;
    }
    if (count == 0) {
        tp_fail(TP_ERR_DEVICE, "no CUDA device (cudaGetDeviceCount found none)");
        goto done;
    }
    if (device < 0 || device >= count) {
        tp_fail(TP_ERR_DEVICE, "no CUDA device %d (this machine has %d: 0 to %d)", device, count, count - 1);
        goto done;
    }
    if (load_cublas()) goto done;
    if (cuda_attention_variant(getenv("TP_CUDA_ATTENTION"))) goto done;
    CUDA_TRY(cudaSetDevice(device));
    CUDA_TRY(cudaStreamCreateWithFlags(&state.stream, cudaStreamNonBlocking));
    CUDA_TRY(cudaStreamCreateWithFlags(&state.side, cudaStreamNonBlocking));
    CUBLAS_TRY(blas.create(&state.blas));
    CUBLAS_TRY(blas.set_stream(state.blas, state.stream));
    /* Plain fp32 products: no TF32 tensor cores, so that results stay within
     * fp32 rounding of the CPU's (atomics stay off, cuBLAS's default). */
    CUBLAS_TRY(blas.set_math_mode(state.blas, CUBLAS_DEFAULT_MATH));
    CUDA_TRY(cudaMalloc(&state.sums, (SUM_BLOCKS + 1) * sizeof(double)));
    state.device = device;
    fill_table(&state.table);
    state.ready = 1;
    result = &state.table;
    goto done;
fail:
    if (state.sums) cudaFree(state.sums);
    if (state.blas) blas.destroy(state.blas);
    if (state.stream) cudaStreamDestroy(state.stream);
    if (state.side) cudaStreamDestroy(state.side);
    (void)cudaGetLastError();
    state.sums = NULL;
    state.blas = NULL;
    state.stream = NULL;
    state.side = NULL;
done:
    pthread_mutex_unlock(&state_lock);
    return result;
}
