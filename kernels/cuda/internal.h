/* internal.h: what the CUDA files of kernels/ share beyond kernels.h. */
#ifndef TP_KERNELS_CUDA_INTERNAL_H
#define TP_KERNELS_CUDA_INTERNAL_H

#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

extern "C" {
#include "../kernels.h" /* adamw_tensor */
}

/* convert.cu, moves.cu: a narrowing's overflows (kernels.h convert_overflow,
 * judged by convert_bits.h as on the CPU) counted on the device. Each thread
 * counts its own in registers and adds them to the tally once, at its end,
 * and only when it has some: a conversion without overflows costs no
 * atomics. The largest magnitude kept as its bits, which order as the
 * magnitudes do. */
struct overflow_tally {
    unsigned long long count;
    unsigned int largest;
};

__device__ static inline void overflow_note(uint32_t over, uint32_t bits, unsigned long long *count,
                                            unsigned int *largest)
{
    uint32_t magnitude = (bits & 0x7fffffffu) & (0u - over);
    *count += over;
    *largest = magnitude > *largest ? magnitude : *largest;
}

__device__ static inline void overflow_flush(overflow_tally *tally, unsigned long long count, unsigned int largest)
{
    if (!count) return;
    atomicAdd(&tally->count, count);
    atomicMax(&tally->largest, largest);
}

static inline convert_overflow overflow_result(const overflow_tally *tally)
{
    convert_overflow result = {(int64_t)tally->count, 0.0f};
    memcpy(&result.largest, &tally->largest, 4);
    return result;
}

/* The CUDA backend's stream and device (backend.cu); fails with
 * TP_ERR_STATE when kernels_cuda has not made the backend yet. */
extern "C" int cuda_backend_stream(cudaStream_t *stream, int *device);

/* attention_tiled.cu: the tiled attention kernels launched on `stream`
 * (shapes: attention_tiled.h; delta is the backward's scratch, [B, Hq, T]);
 * TP_ERR_DEVICE with CUDA's reason when a launch fails. */
int cuda_attention_tiled_forward(float *out, float *lse, const float *qkv, int64_t B, int64_t T, int64_t Hq,
                                 int64_t Hkv, int64_t hd, cudaStream_t stream);
int cuda_attention_tiled_backward(float *d_qkv, float *delta, const float *d_out, const float *qkv, const float *out,
                                  const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd,
                                  cudaStream_t stream);
/* attention_tf32x3.cu: the tensor cores' kernels, the same way
 * (attention_tf32x3.h). */
int cuda_attention_tf32x3_forward(float *out, float *lse, const float *qkv, int64_t B, int64_t T, int64_t Hq,
                                  int64_t Hkv, int64_t hd, cudaStream_t stream);
int cuda_attention_tf32x3_backward(float *d_qkv, float *delta, const float *d_out, const float *qkv, const float *out,
                                   const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd,
                                   cudaStream_t stream);
/* Whether `device` gives a block the shared memory those kernels take at
 * head size hd (32, 64 or 128): an H100's 227 KiB all, GPUs of 99 KiB
 * (sm_86, sm_89) not the backward at 128. */
int cuda_attention_tf32x3_shared_fits(int64_t hd, int device);
/* Which attention the backend runs (cuda_attention_variant, TP_CUDA_ATTENTION):
 * DEFAULT: the bf16 operations through cuDNN where it takes the shape
 * (attention_cudnn.h), else the tiled kernels on bf16-rounded operands; the
 * fp32 operations through the tiled kernels. CUDNN: the same, but a shape
 * cuDNN does not take is an error of the bf16 operations. TILED: the tiled
 * kernels for both (rounded operands for bf16). ROWS: the rows kernels
 * (attention.cu) for both. TF32X3: as DEFAULT, but the fp32 kernels are the
 * tensor cores' (attention_tf32x3.h) where they fit. The tiled kernels leave
 * the shapes they do not fit to the rows kernels, the tf32x3 kernels to the
 * tiled ones. */
typedef enum {
    CUDA_ATTENTION_DEFAULT,
    CUDA_ATTENTION_CUDNN,
    CUDA_ATTENTION_TILED,
    CUDA_ATTENTION_ROWS,
    CUDA_ATTENTION_TF32X3
} cuda_attention_choice;
cuda_attention_choice cuda_attention_chosen(void);
/* cuda_deterministic_variant's choice (attention_tiled.h): 1 for cuDNN's
 * deterministic backward. */
int cuda_deterministic_chosen(void);
/* cuda_tiled_forward_rows_variant's choice (attention_tiled.h): 2, 3 or 4,
 * or 0 when unset (the default, ROWS_FORWARD in attention_tiled.cu). */
int cuda_tiled_forward_rows_chosen(void);
/* cuda_tiled_backward_rows_variant's choice (attention_tiled.h): 1 or 2, or
 * 0 when unset (the default, ROWS_BACKWARD in attention_tiled.cu). */
int cuda_tiled_backward_rows_chosen(void);

/* The computing operations of the table (kernels.h, KERNEL_OPERATIONS) as
 * cuda_<name>, by file: linear.cu the products (bf16 operands read where
 * they lie), round_to_bf16 (launch.h) and the residual sums; norm.cu the
 * norms, GELU and SwiGLU; rope.cu; attention.cu; embedding.cu the embedding
 * and the classifier; adamw.cu AdamW and the gradient norm's sum. */
#define CUDA_OPERATION(op, PARAMS, ARGS) int cuda_##op PARAMS;
KERNEL_OPERATIONS(CUDA_OPERATION)
#undef CUDA_OPERATION
/* attention.cu */
void cuda_describe_attention(int bf16, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd, char *text,
                             size_t size);
/* linear.cu: loads cuBLAS and makes its handle on cuda_state.stream (plain
 * fp32 math); stop releases it (also after a failed start). */
int cuda_blas_start(void);
void cuda_blas_stop(void);
/* products_lt.cu: cuBLASLt, loaded and given a handle and a workspace at
 * start (stop releases them, also after a failed start; with
 * TP_CUDA_EPILOGUE=off, not loaded, and every product's bias separate, and
 * GELU's kernels beside the MLP's products); then
 * out[N,OC] = in . W^T + bias with the bias in the product's epilogue, on
 * cuda_state.stream, in and W as the product reads them (fp32, or bf16
 * when bf16: the caller's bf16 activation and bf16 weight bits themselves,
 * each at any even address), out fp32 or (out_bits, bf16 products
 * alone) bf16 bits, at any even address: the epilogue's fp32 result
 * rounded to bf16; the bias in out's type (fp32, or bf16 bits: cuBLASLt
 * refuses an fp32 bias with a bf16 D, "heuristic INVALID_VALUE" on the H200,
 * 2026-11-28); *done 0 (and nothing queued) where cuBLASLt has
 * no algorithm for the shape, types and alignments: the caller adds the
 * bias itself. */
int cuda_lt_start(void);
void cuda_lt_stop(void);
int cuda_lt_forward_bias(int bf16, int out_bits, void *out, const void *in, const void *weight, const void *bias,
                         int64_t N, int64_t C, int64_t OC, int *done);

/* Also through cuBLASLt's epilogues: GPT-2's MLP products with GELU. All
 * bf16 bits at any even address, on cuda_state.stream; *done 0 and nothing
 * queued where the epilogue is not taken (the reason kept for
 * cuda_lt_last_refusal): the caller goes the separate way.
 *
 * cuda_lt_forward_gelu: matmul_forward_gelu_bf16 in one product, in[N,C]
 * and W[OC,C] as the product reads them, bias[OC] bf16 bits or NULL:
 * pre[N,OC] = bf16(in . W^T + bias), out[N,OC] = bf16(gelu(the same fp32
 * sum)).
 *
 * cuda_lt_backward_dgelu: matmul_backward_gelu_bf16's d_in product,
 * d_out[N,OC] the bf16 operand the products read (the residual stream's
 * gradient's bits), W[OC,C], pre[N,C] GELU's input:
 * d_pre[N,C] = bf16(gelu'(pre) * (d_out . W), the product's fp32 sum). */
int cuda_lt_forward_gelu(uint16_t *out, uint16_t *pre, const uint16_t *in, const uint16_t *weight,
                         const uint16_t *bias, int64_t N, int64_t C, int64_t OC, int *done);
int cuda_lt_backward_dgelu(uint16_t *d_pre, const uint16_t *d_out, const uint16_t *weight, const uint16_t *pre,
                           int64_t N, int64_t C, int64_t OC, int *done);

#endif
