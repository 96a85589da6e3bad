/* moves.cu: strided moves with conversion on the GPU, the twin of
 * moves_apply (cpu/moves.c). Conversions use convert_bits.h like the CPU, so the
 * output is bit-identical. Each worker thread owns a mover: pinned host
 * buffers, device buffers and a stream, so transfers of one thread overlap
 * the kernels and disk I/O of the others. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "../kernels.h"
}
#include "../convert_bits.h"
#include "check.h"
#include "internal.h"

struct cuda_mover {
    cudaStream_t stream;
    void *host_staging, *host_output;     /* pinned */
    void *device_staging, *device_output;
    strided_move *device_moves;
    overflow_tally *device_tally, *host_tally; /* host_tally pinned */
    size_t staging_bytes, output_bytes;
    int64_t max_moves;
};

__device__ static uint32_t load_bits(const void *src, int format, int64_t i)
{
    if (format == TP_FP32) return ((const uint32_t *)src)[i];
    uint16_t h = ((const uint16_t *)src)[i];
    return format == TP_BF16 ? bits_bf16_to_f32(h) : bits_f16_to_f32(h);
}

/* Returns whether a finite value overflowed (convert_bits.h). */
__device__ static uint32_t store_bits(void *dst, int format, int64_t i, uint32_t bits)
{
    if (format == TP_FP32) {
        ((uint32_t *)dst)[i] = bits;
        return 0;
    }
    if (format == TP_BF16) {
        ((uint16_t *)dst)[i] = bits_f32_to_bf16(bits);
        return bits_f32_overflows_bf16(bits);
    }
    ((uint16_t *)dst)[i] = bits_f32_to_f16(bits);
    return bits_f32_overflows_f16(bits);
}

/* blockIdx.y picks the move; the x dimension walks its len * repeat elements. */
__global__ void moves_kernel(const void *src, int src_format, void *dst, int dst_format,
                             const strided_move *moves, overflow_tally *tally)
{
    strided_move mv = moves[blockIdx.y];
    unsigned long long count = 0;
    unsigned int largest = 0;
    int64_t total = mv.len * mv.repeat;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = e / mv.len, i = e % mv.len;
        int64_t to = mv.dst + r * mv.dst_stride + i;
        if (mv.src < 0) {
            store_bits(dst, dst_format, to, 0);
            continue;
        }
        uint32_t bits = load_bits(src, src_format, mv.src + r * mv.src_stride + i);
        if (src_format == dst_format && src_format != TP_FP32)
            ((uint16_t *)dst)[to] = ((const uint16_t *)src)[mv.src + r * mv.src_stride + i]; /* exact copy */
        else
            overflow_note(store_bits(dst, dst_format, to, bits), bits, &count, &largest);
    }
    overflow_flush(tally, count, largest);
}

extern "C" int cuda_mover_create(cuda_mover **out, size_t staging_bytes, size_t output_bytes, int64_t max_moves)
{
    *out = NULL;
    if (cuda_device_count() == 0) return tp_fail(TP_ERR_DEVICE, "no CUDA device is available");
    cuda_mover *m = (cuda_mover *)calloc(1, sizeof *m);
    if (!m) return tp_fail(TP_ERR_NOMEM, "out of memory for a GPU mover");
    m->staging_bytes = staging_bytes;
    m->output_bytes = output_bytes;
    m->max_moves = max_moves > 0 ? max_moves : 1;
    CUDA_TRY(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking));
    CUDA_TRY(cudaMallocHost(&m->host_staging, staging_bytes ? staging_bytes : 1));
    CUDA_TRY(cudaMallocHost(&m->host_output, output_bytes ? output_bytes : 1));
    CUDA_TRY(cudaMalloc(&m->device_staging, staging_bytes ? staging_bytes : 1));
    CUDA_TRY(cudaMalloc(&m->device_output, output_bytes ? output_bytes : 1));
    CUDA_TRY(cudaMalloc(&m->device_moves, (size_t)m->max_moves * sizeof(strided_move)));
    CUDA_TRY(cudaMalloc(&m->device_tally, sizeof(overflow_tally)));
    CUDA_TRY(cudaMallocHost(&m->host_tally, sizeof(overflow_tally)));
    *out = m;
    return TP_OK;
fail:
    cuda_mover_free(m);
    return TP_ERR_DEVICE;
}

extern "C" void *cuda_mover_staging(cuda_mover *m)
{
    return m->host_staging;
}

extern "C" void *cuda_mover_output(cuda_mover *m)
{
    return m->host_output;
}

extern "C" int cuda_mover_run(cuda_mover *m, size_t staging_used, tp_dtype src_format,
                              size_t output_used, tp_dtype dst_format, const strided_move *moves,
                              int64_t count, convert_overflow *overflow)
{
    if (staging_used > m->staging_bytes || output_used > m->output_bytes || count > m->max_moves)
        return tp_fail(TP_ERR_ARG, "GPU mover: %zu/%zu staging bytes, %zu/%zu output bytes, %lld/%lld moves",
                       staging_used, m->staging_bytes, output_used, m->output_bytes, (long long)count,
                       (long long)m->max_moves);
    CUDA_TRY(cudaMemcpyAsync(m->device_staging, m->host_staging, staging_used, cudaMemcpyHostToDevice, m->stream));
    CUDA_TRY(cudaMemcpyAsync(m->device_moves, moves, (size_t)count * sizeof(strided_move), cudaMemcpyHostToDevice,
                             m->stream));
    CUDA_TRY(cudaMemsetAsync(m->device_tally, 0, sizeof(overflow_tally), m->stream));
    /* Moves beyond 65535 go in batches (the grid's y limit). */
    for (int64_t first = 0; first < count; first += 65535) {
        int64_t batch = count - first < 65535 ? count - first : 65535;
        int64_t longest = 0;
        for (int64_t k = first; k < first + batch; k++)
            if (moves[k].len * moves[k].repeat > longest) longest = moves[k].len * moves[k].repeat;
        int threads = 256;
        int64_t blocks = (longest + threads - 1) / threads;
        if (blocks > 1024) blocks = 1024;
        if (blocks < 1) blocks = 1;
        dim3 grid((unsigned)blocks, (unsigned)batch);
        moves_kernel<<<grid, threads, 0, m->stream>>>(m->device_staging, src_format, m->device_output, dst_format,
                                                      m->device_moves + first, m->device_tally);
        CUDA_TRY(cudaGetLastError());
    }
    CUDA_TRY(cudaMemcpyAsync(m->host_output, m->device_output, output_used, cudaMemcpyDeviceToHost, m->stream));
    CUDA_TRY(cudaMemcpyAsync(m->host_tally, m->device_tally, sizeof(overflow_tally), cudaMemcpyDeviceToHost,
                             m->stream));
    CUDA_TRY(cudaStreamSynchronize(m->stream));
    if (overflow) *overflow = overflow_result(m->host_tally);
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

extern "C" void cuda_mover_free(cuda_mover *m)
{
    if (!m) return;
    if (m->host_tally) cudaFreeHost(m->host_tally);
    if (m->device_tally) cudaFree(m->device_tally);
    if (m->device_moves) cudaFree(m->device_moves);
    if (m->device_output) cudaFree(m->device_output);
    if (m->device_staging) cudaFree(m->device_staging);
    if (m->host_output) cudaFreeHost(m->host_output);
    if (m->host_staging) cudaFreeHost(m->host_staging);
    if (m->stream) cudaStreamDestroy(m->stream);
    free(m);
}
