/* launch.h: what the CUDA op files (the .cu files of kernels/cuda) share: the
 * backend's state (backend.cu makes it), entering an operation, launch
 * shapes and checks, and block reductions. CUDA C++, included by .cu files
 * only. */
#ifndef TP_KERNELS_CUDA_LAUNCH_H
#define TP_KERNELS_CUDA_LAUNCH_H

#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "../convert_bits.h"
#include "check.h"

/* A kernel launch fails at once (a bad configuration) or later, at the next
 * synchronizing call, for errors while it runs. */
#define LAUNCH_CHECK() CUDA_TRY(cudaGetLastError())

#define THREADS 256        /* per block, elementwise and row kernels (a multiple of 32: block_reduce) */
#define MAX_BLOCKS 65535   /* within every device generation's grid limits; grid-stride loops do the rest */
#define SUM_BLOCKS 1024    /* sum_of_squares' first-pass blocks (partials) */

/* One state per process (backend.cu): the device, the stream every
 * operation queues on, a side stream for copies beside the computation. */
typedef struct {
    int ready, device;
    cudaStream_t stream;
    cudaStream_t side; /* copies beside the computation (to_host_background) */
    double *sums;      /* device [SUM_BLOCKS + 1]: sum_of_squares' block partials, then its result */
} cuda_backend_state;
extern cuda_backend_state cuda_state;

/* Every operation first makes the backend's device current in the calling
 * thread (the trainer may call from threads other than the one that created
 * the backend; cudaSetDevice is per thread and cheap) and drops the error a
 * failed runtime call may have left behind, so that LAUNCH_CHECK reports
 * this operation's launches only. Errors of running kernels are sticky and
 * still come back from the next call. */
#define ENTER()                                                                                                        \
    do {                                                                                                               \
        (void)cudaGetLastError();                                                                                      \
        CUDA_TRY(cudaSetDevice(cuda_state.device));                                                                    \
    } while (0)

/* A device buffer kept for the life of the process and grown when a call
 * needs more (the bf16 products' rounded operands, the bf16 attention's).
 * Growing is stream-ordered (cudaFreeAsync and cudaMallocAsync on
 * cuda_state.stream, which runs every operation): work queued earlier still
 * reads the old buffer, and nothing waits for the device. A cudaFree would,
 * and could deadlock a pipeline: it waits for a pending NCCL send whose
 * receiver may wait for this rank. Chosen over per-call cudaMallocAsync: no
 * dependence on the memory pool's release threshold (the default pool gives
 * memory back at every synchronization), and failures to get memory only
 * while it grows (a step's shapes repeat: after the first it no longer
 * does). Its user holds a lock from taking parts to queueing their last use. */
typedef struct {
    char *memory;
    size_t size;
} cuda_scratch;

/* parts[i] of bytes[i] each (count at most CUDA_SCRATCH_PARTS), each
 * starting 256-byte aligned, in scratch (backend.cu). what names its use in
 * messages. Out of device memory: TP_ERR_NOMEM; another CUDA error:
 * TP_ERR_DEVICE. */
#define CUDA_SCRATCH_PARTS 8
int cuda_scratch_parts(cuda_scratch *scratch, const char *what, void **parts, const size_t *bytes, int count);

/* out[i] = the bf16 bits of in[i], rounded as the CPU rounds (convert_bits.h),
 * queued on cuda_state.stream (linear.cu); in and out at any address of
 * their types. Also the table's round_to_bf16 (backend.cu): it enters as
 * an operation does (ENTER). */
int cuda_round_to_bf16(uint16_t *out, const float *in, int64_t n);

/* fp32 values (a product's sums) written as bf16 bits (pre) and their GELU
 * as bf16 bits (out), and GELU's gradient from bf16 bits of its input and an
 * fp32 d_out written as bf16 bits (norm.cu): the fused product and GELU's
 * separate way (linear.cu matmul_forward_gelu_bf16,
 * matmul_backward_gelu_bf16), where cuBLASLt's epilogue does not run. */
int cuda_gelu_forward_of_sums(uint16_t *out, uint16_t *pre, const float *in, int64_t n);
int cuda_gelu_backward_of_sums(uint16_t *d_in, const uint16_t *in, const float *d_out, int64_t n);

/* An output element of a kernel that writes fp32 or, templated on its
 * output type, bf16 bits (the bf16 activations and gradients, and the
 * classifier's d_logits, kernels.h): the fp32 value as computed, or the bits of rounding
 * that very value (bits_f32_to_bf16, as the CPU rounds). The arithmetic
 * before the store is one source for both, so the bits are exactly those
 * of rounding what the fp32 kernel writes. Also on the host, for the
 * kernels' CPU emulations. */
static __host__ __device__ inline void store_value(float *at, float value)
{
    *at = value;
}
static __host__ __device__ inline void store_value(uint16_t *at, float value)
{
#ifdef __CUDA_ARCH__
    *at = bits_f32_to_bf16(__float_as_uint(value));
#else
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    *at = bits_f32_to_bf16(bits);
#endif
}

/* An input element of a kernel that reads fp32 or, templated on its input
 * type, bf16 bits (the bf16 gradients, kernels.h): the fp32 value, or the
 * bf16 value widened (exact). With store_value, the kernels of the bf16
 * backward are the fp32 kernels' arithmetic on the widened values. Also on
 * the host, for the kernels' CPU emulations. */
static __host__ __device__ inline float load_value(const float *at)
{
    return *at;
}
static __host__ __device__ inline float load_value(const uint16_t *at)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(bits_bf16_to_f32(*at));
#else
    uint32_t wide = bits_bf16_to_f32(*at);
    float value;
    memcpy(&value, &wide, sizeof value);
    return value;
#endif
}

/* CHUNK consecutive values of a row in 16-byte pieces (one of bf16 bits,
 * two of fp32): a 2-byte load a thread keeps too few bytes in flight to
 * fill the memory's bandwidth, as a row kernel over the [N, vocabulary]
 * logits must. Each value as load_value and store_value have it. at: a
 * multiple of 16 bytes (chunks_fit). */
#define CHUNK 8
static __device__ inline void load_chunk(float *x, const float *at)
{
    float4 a = reinterpret_cast<const float4 *>(at)[0], b = reinterpret_cast<const float4 *>(at)[1];
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}
static __device__ inline void load_chunk(float *x, const uint16_t *at)
{
    uint4 u = *reinterpret_cast<const uint4 *>(at);
    unsigned words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) { /* little-endian: the lower half is the first value */
        x[2 * i] = __uint_as_float(bits_bf16_to_f32((uint16_t)(words[i] & 0xffffu)));
        x[2 * i + 1] = __uint_as_float(bits_bf16_to_f32((uint16_t)(words[i] >> 16)));
    }
}
static __device__ inline void store_chunk(float *at, const float *x)
{
    reinterpret_cast<float4 *>(at)[0] = make_float4(x[0], x[1], x[2], x[3]);
    reinterpret_cast<float4 *>(at)[1] = make_float4(x[4], x[5], x[6], x[7]);
}
static __device__ inline void store_chunk(uint16_t *at, const float *x)
{
    unsigned words[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        words[i] = (unsigned)bits_f32_to_bf16(__float_as_uint(x[2 * i])) |
                   (unsigned)bits_f32_to_bf16(__float_as_uint(x[2 * i + 1])) << 16;
    *reinterpret_cast<uint4 *>(at) = make_uint4(words[0], words[1], words[2], words[3]);
}

/* Whether the rows of `columns` values at `at` split into chunks: every
 * row starts at a multiple of 16 bytes. */
static inline int chunks_fit(const void *at, int64_t columns)
{
    return (uintptr_t)at % 16 == 0 && columns % CHUNK == 0;
}

/* Blocks for `work` items at `per_block` each, at least 1 (callers skip
 * empty work: a grid of 0 blocks is a launch error) and at most MAX_BLOCKS. */
static inline unsigned blocks_for(int64_t work, int64_t per_block)
{
    int64_t blocks = (work + per_block - 1) / per_block;
    return (unsigned)(blocks < 1 ? 1 : blocks > MAX_BLOCKS ? MAX_BLOCKS : blocks);
}

#define GRID_STRIDE(i, n)                                                                                              \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)
#define ROWS_OF_BLOCK(row, rows) for (int64_t row = blockIdx.x; row < (rows); row += gridDim.x)
#define COLUMNS_OF_THREAD(c, count) for (int64_t c = threadIdx.x; c < (count); c += blockDim.x)
/* Elements (row, column) of a row-major [rows, columns] array: a block per
 * row (blocks_for(rows, 1) of THREADS), its threads over the columns. Not
 * GRID_STRIDE with i / columns and i % columns: a 64-bit division is
 * emulated, dozens of instructions an element, about what the memory
 * traffic of a simple element-wise kernel costs. */
#define ROWS_AND_COLUMNS(row, column, rows, columns) ROWS_OF_BLOCK(row, rows) COLUMNS_OF_THREAD(column, columns)
/* A warp per row (blocks of THREADS, WARP_ROWS rows each: blocks_for(rows,
 * WARP_ROWS)), its lanes over the columns, its sums by shuffles (warp_sum):
 * the norms' rows, short (hundreds to thousands of columns), whose block
 * per row spent its time in the block's barriers and left each thread 3
 * elements (C = 768 on 256 threads). No barrier: the warps of a block go
 * their own ways. */
#define WARP_ROWS (THREADS / 32)
#define ROWS_OF_WARP(row, rows)                                                                                        \
    for (int64_t row = (int64_t)blockIdx.x * WARP_ROWS + (threadIdx.x >> 5); row < (rows);                             \
         row += (int64_t)gridDim.x * WARP_ROWS)
#define COLUMNS_OF_LANE(c, count) for (int64_t c = threadIdx.x & 31; c < (count); c += 32)

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

/* The value of every lane of the warp combined, returned to every lane
 * (bitwise the same in each, as below). Every lane must call it. */
template <typename T, typename Op> __device__ T warp_reduce(T value, Op op)
{
    for (int offset = 16; offset > 0; offset >>= 1) value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
    return value;
}

static __device__ inline float warp_sum(float value)
{
    return warp_reduce(value, Sum());
}

template <typename T, typename Op> __device__ T block_reduce(T value, Op op)
{
    __shared__ T partial[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    value = warp_reduce(value, op);
    __syncthreads(); /* every thread has read the partials of an earlier call */
    if (lane == 0) partial[warp] = value;
    __syncthreads();
    T total = partial[0];
    for (int w = 1; w < warps; w++) total = op(total, partial[w]);
    return total;
}

static __device__ inline float block_sum(float value)
{
    return block_reduce(value, Sum());
}
static __device__ inline double block_sum_double(double value)
{
    return block_reduce(value, Sum());
}
static __device__ inline float block_max(float value)
{
    return block_reduce(value, Max());
}

#endif
