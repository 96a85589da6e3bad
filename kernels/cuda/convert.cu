/* convert.cu: GPU twins of the conversions in cpu/convert.c. They call the
 * same bit functions (convert_bits.h), so results are identical to the CPU. */
#include <cuda_runtime.h>
#include <stdio.h>

extern "C" {
#include "../kernels.h"
}
#include "../convert_bits.h"
#include "check.h"
#include "internal.h"

__global__ void convert_kernel(const void *in, int in_format, void *out, int out_format, int64_t n,
                               overflow_tally *tally)
{
    unsigned long long count = 0;
    unsigned int largest = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t bits;
        if (in_format == TP_FP32) bits = ((const uint32_t *)in)[i];
        else if (in_format == TP_BF16) bits = bits_bf16_to_f32(((const uint16_t *)in)[i]);
        else bits = bits_f16_to_f32(((const uint16_t *)in)[i]);
        if (out_format == TP_FP32) {
            ((uint32_t *)out)[i] = bits;
        } else if (out_format == TP_BF16) {
            ((uint16_t *)out)[i] = bits_f32_to_bf16(bits);
            overflow_note(bits_f32_overflows_bf16(bits), bits, &count, &largest);
        } else {
            ((uint16_t *)out)[i] = bits_f32_to_f16(bits);
            overflow_note(bits_f32_overflows_f16(bits), bits, &count, &largest);
        }
    }
    overflow_flush(tally, count, largest);
}

extern "C" int cuda_built(void)
{
    return 1;
}

extern "C" int cuda_device_count(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        return 0;
    }
    return count;
}

extern "C" int cuda_convert_numbers(const void *in, tp_dtype in_format, void *out, tp_dtype out_format, int64_t n,
                                    convert_overflow *overflow)
{
    void *d_in = NULL, *d_out = NULL;
    overflow_tally *d_tally = NULL, tally = {0, 0};
    size_t in_bytes = (size_t)n * tp_dtype_size(in_format);
    size_t out_bytes = (size_t)n * tp_dtype_size(out_format);
    int status = TP_ERR_DEVICE;
    if (cuda_device_count() == 0) return tp_fail(TP_ERR_DEVICE, "no CUDA device is available");
    CUDA_TRY(cudaMalloc(&d_in, in_bytes > 0 ? in_bytes : 1));
    CUDA_TRY(cudaMalloc(&d_out, out_bytes > 0 ? out_bytes : 1));
    CUDA_TRY(cudaMalloc(&d_tally, sizeof tally));
    CUDA_TRY(cudaMemset(d_tally, 0, sizeof tally));
    CUDA_TRY(cudaMemcpy(d_in, in, in_bytes, cudaMemcpyHostToDevice));
    if (n > 0) {
        int threads = 256;
        int64_t blocks = (n + threads - 1) / threads;
        if (blocks > 65535) blocks = 65535;
        convert_kernel<<<(unsigned)blocks, threads>>>(d_in, in_format, d_out, out_format, n, d_tally);
        CUDA_TRY(cudaGetLastError());
    }
    CUDA_TRY(cudaMemcpy(out, d_out, out_bytes, cudaMemcpyDeviceToHost));
    CUDA_TRY(cudaMemcpy(&tally, d_tally, sizeof tally, cudaMemcpyDeviceToHost));
    if (overflow) *overflow = overflow_result(&tally);
    status = TP_OK;
fail:
    cudaFree(d_tally);
    cudaFree(d_in);
    cudaFree(d_out);
    return status;
}
