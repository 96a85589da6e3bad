/* internal.h: what the CUDA files of kernels/ share beyond kernels.h. */
#ifndef TP_KERNELS_CUDA_INTERNAL_H
#define TP_KERNELS_CUDA_INTERNAL_H

#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "../kernels.h" /* adamw_tensor */
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
/* Which attention the backend runs (cuda_attention_variant, TP_CUDA_ATTENTION):
 * DEFAULT: the bf16 operations through cuDNN where it takes the shape
 * (attention_cudnn.h), else the tiled kernels on bf16-rounded operands; the
 * fp32 operations through the tiled kernels. CUDNN: the same, but a shape
 * cuDNN does not take is an error of the bf16 operations. TILED: the tiled
 * kernels for both (rounded operands for bf16). ROWS: the rows kernels
 * (attention.cu) for both. The tiled kernels leave the shapes they do not
 * fit to the rows kernels. */
typedef enum {
    CUDA_ATTENTION_DEFAULT,
    CUDA_ATTENTION_CUDNN,
    CUDA_ATTENTION_TILED,
    CUDA_ATTENTION_ROWS
} cuda_attention_choice;
cuda_attention_choice cuda_attention_chosen(void);

/* The operations of the table (kernels.h, kernel_backend), one file each. */
/* linear.cu */
int cuda_matmul_forward(float *out, const float *in, const float *weight, const float *bias, int64_t N, int64_t C,
                        int64_t OC);
/* linear.cu: the bf16 products read in, W and a bf16 d_out as the bits
 * given, where they lie (kernels.h: W the trainer's bf16 copy of its fp32
 * weights). */
int cuda_matmul_forward_bf16(float *out, const uint16_t *in, const uint16_t *weight, const float *bias, int64_t N,
                             int64_t C, int64_t OC);
int cuda_matmul_backward(float *d_in, float *d_weight, float *d_bias, const float *d_out, const float *in,
                         const float *weight, int64_t N, int64_t C, int64_t OC);
int cuda_matmul_backward_bf16(float *d_in, float *d_weight, float *d_bias, const uint16_t *d_out, const uint16_t *in,
                              const uint16_t *weight, int64_t N, int64_t C, int64_t OC);
/* linear.cu: the backward of a product whose d_out is fp32 (rounded on the
 * way) and whose d_in is written as bf16 bits (kernels.h: cuBLAS's fp32 sums
 * rounded as stored; d_bias from the rounded d_out). */
int cuda_matmul_backward_bf16_bits(uint16_t *d_in, float *d_weight, float *d_bias, const float *d_out,
                                   const uint16_t *in, const uint16_t *weight, int64_t N, int64_t C, int64_t OC);
/* linear.cu: matmul_forward_bf16 written as bf16 bits (kernels.h: the bits
 * of rounding its fp32 out, the bias added in fp32 first). */
int cuda_matmul_forward_bf16_bits(uint16_t *out, const uint16_t *in, const uint16_t *weight, const float *bias,
                                  int64_t N, int64_t C, int64_t OC);
int cuda_residual_forward(float *out, const float *a, const float *b, int64_t n);
int cuda_bias_residual_forward(float *out, const float *x, const float *partial, const float *bias, int64_t N,
                               int64_t C);
int cuda_add_inplace(float *acc, const float *x, int64_t n);
int cuda_scale_inplace(float *x, float scale, int64_t n);
/* linear.cu: the table's round_to_bf16 is cuda_round_to_bf16 (launch.h: the op files round with it too). */
/* norm.cu */
int cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *in, const float *weight,
                           const float *bias, int64_t N, int64_t C);
int cuda_layernorm_backward(float *d_in, float *d_weight, float *d_bias, const float *d_out, const float *in,
                            const float *weight, const float *mean, const float *rstd, int64_t N, int64_t C);
int cuda_gelu_forward(float *out, const float *in, int64_t n);
int cuda_gelu_backward(float *d_in, const float *in, const float *d_out, int64_t n);
int cuda_rmsnorm_forward(float *out, float *rstd, const float *in, const float *weight, int64_t N, int64_t C,
                         float eps);
int cuda_rmsnorm_backward(float *d_in, float *d_weight, const float *d_out, const float *in, const float *weight,
                          const float *rstd, int64_t N, int64_t C);
int cuda_swiglu_forward(float *out, const float *in, int64_t N, int64_t F);
int cuda_swiglu_backward(float *d_in, const float *in, const float *d_out, int64_t N, int64_t F);
/* norm.cu: the forwards above writing bf16 bits (kernels.h: the bits of
 * rounding the fp32 forward's out, by the same kernels); GELU and SwiGLU
 * read in, the MLP's input, as bf16 bits too (widened by the same kernels). */
int cuda_layernorm_forward_bf16(uint16_t *out, float *mean, float *rstd, const float *in, const float *weight,
                                const float *bias, int64_t N, int64_t C);
int cuda_rmsnorm_forward_bf16(uint16_t *out, float *rstd, const float *in, const float *weight, int64_t N, int64_t C,
                              float eps);
int cuda_gelu_forward_bf16(uint16_t *out, const uint16_t *in, int64_t n);
int cuda_swiglu_forward_bf16(uint16_t *out, const uint16_t *in, int64_t N, int64_t F);
/* norm.cu: gelu_backward and swiglu_backward of a bf16 in and d_out,
 * writing d_in as bf16 bits (kernels.h: the bits of rounding what the fp32
 * backward computes from in and d_out widened, by the same kernels). */
int cuda_gelu_backward_bf16(uint16_t *d_in, const uint16_t *in, const uint16_t *d_out, int64_t n);
int cuda_swiglu_backward_bf16(uint16_t *d_in, const uint16_t *in, const uint16_t *d_out, int64_t N, int64_t F);
/* rope.cu */
int cuda_rope_forward(float *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd);
int cuda_rope_backward(float *d_qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd);
/* rope.cu: rope_forward into bf16 bits (kernels.h: qkv left as it is, out
 * the bits of rounding what rope_forward leaves in it, by the same kernel). */
int cuda_rope_forward_bf16(uint16_t *out, const float *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq,
                           int64_t Hkv, int64_t hd);
/* rope.cu: rope_backward in place on bf16 bits (kernels.h: each turned value
 * widened, turned back by the same kernel, rounded; the rest untouched). */
int cuda_rope_backward_bf16(uint16_t *d_qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                            int64_t hd);
/* attention.cu */
int cuda_attention_forward(float *out, float *lse, float *scratch, const float *qkv, int64_t B, int64_t T, int64_t Hq,
                           int64_t Hkv, int64_t hd);
int cuda_attention_backward(float *d_qkv, float *scratch, const float *d_out, const float *qkv, const float *out,
                            const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd);
int cuda_attention_forward_bf16(uint16_t *out, float *lse, float *scratch, const uint16_t *qkv, int64_t B, int64_t T,
                                int64_t Hq, int64_t Hkv, int64_t hd);
int cuda_attention_backward_bf16(uint16_t *d_qkv, float *scratch, const uint16_t *d_out, const uint16_t *qkv,
                                 const uint16_t *out, const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                                 int64_t hd);
void cuda_describe_attention(int bf16, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd, char *text,
                             size_t size);
/* embedding.cu */
int cuda_embedding_forward(float *out, const int *tokens, const float *table, int64_t N, int64_t C, int64_t first,
                           int64_t rows);
int cuda_embedding_backward(float *d_table, const int *tokens, const float *d_out, int64_t N, int64_t C, int64_t first,
                            int64_t rows);
int cuda_crossentropy_row_stats(float *row_max, float *sum, const float *logits, int64_t N, int64_t V, int64_t first,
                                int64_t vocab);
int cuda_crossentropy_rescale_sum(float *sum, const float *local_max, const float *global_max, int64_t N);
int cuda_crossentropy_target_logit(float *target, const float *logits, const int *targets, int64_t N, int64_t V,
                                   int64_t first);
int cuda_classifier_backward_bf16(float *d_in, float *d_weight, float *scratch, const float *logits,
                                  const float *row_max, const float *sum, const int *targets, const uint16_t *in,
                                  const uint16_t *weight, int64_t N, int64_t C, int64_t V, int64_t first,
                                  int64_t vocab, float scale);
int cuda_crossentropy_backward(float *d_logits, const float *logits, const float *row_max, const float *sum,
                               const int *targets, int64_t N, int64_t V, int64_t first, int64_t vocab, float scale);
/* adamw.cu */
int cuda_adamw_update_tensors(const adamw_tensor *tensors, int count, float lr, float beta1, float beta2, float eps,
                              int64_t step);
int cuda_sum_of_squares(double *out, const float *const *spans, const int64_t *lengths, int count);
/* linear.cu: loads cuBLAS and makes its handle on cuda_state.stream (plain
 * fp32 math); stop releases it (also after a failed start). */
int cuda_blas_start(void);
void cuda_blas_stop(void);
/* products_lt.cu: cuBLASLt, loaded and given a handle and a workspace at
 * start (stop releases them, also after a failed start; with
 * TP_CUDA_EPILOGUE=off, not loaded, and every product's bias separate); then
 * out[N,OC] = in . W^T + bias with the bias in the product's epilogue, on
 * cuda_state.stream, in and W as the product reads them (fp32, or bf16
 * when bf16: the caller's bf16 activation and bf16 weight bits themselves,
 * each at any even address), the bias fp32, out fp32 or (out_bits, bf16
 * products alone) bf16 bits, at any even address: the epilogue's fp32
 * result rounded to bf16; *done 0 (and nothing queued) where cuBLASLt has
 * no algorithm for the shape, types and alignments: the caller adds the
 * bias itself. */
int cuda_lt_start(void);
void cuda_lt_stop(void);
int cuda_lt_forward_bias(int bf16, int out_bits, void *out, const void *in, const void *weight, const float *bias,
                         int64_t N, int64_t C, int64_t OC, int *done);

#endif
