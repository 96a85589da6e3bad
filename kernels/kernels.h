/* kernels.h: the arithmetic of the project, one header for every backend.
 *
 * Every operation has a plain CPU version (cpu/) that is obviously correct
 * and is the reference its faster twins are tested against. CUDA twins
 * (cuda/, built when nvcc is present): the conversions and the strided
 * moves, bit for bit equal to the CPU, and every transformer operation in
 * the CUDA kernel backend (kernels_cuda, within fp32 rounding of the CPU;
 * not yet run on a GPU). A build without CUDA links cuda/none.c, whose
 * entry points report that there is no device.
 *
 * Arrays are row-major; shapes are in the comments. Functions that can fail
 * return a tp_status with the message in tp_errmsg() (common/error.h). */
#ifndef TP_KERNELS_H
#define TP_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "../common/dtype.h"

/* ============================================================ data movement */

/* What a narrowing did to finite values beyond the target's range: count
 * of them written as infinities, and the largest magnitude among them (0
 * when none). The conversions return it from the pass that converts, so a
 * caller that must not write infinities (reshard, export, import) learns of
 * them without reading the data again; convert_overflow_check makes it an
 * error. Infinities and NaNs in the input are not counted. */
typedef struct {
    int64_t count;
    float largest;
} convert_overflow;

static inline void convert_overflow_add(convert_overflow *sum, convert_overflow part)
{
    sum->count += part.count;
    if (part.largest > sum->largest) sum->largest = part.largest;
}

/* TP_OK when o counts nothing; else TP_ERR_ARG naming what (a tensor) and
 * how many values would have become infinite in format, the largest of
 * them, and the dtypes that hold them; `more` other tensors that overflowed
 * as well are said after (0: none). */
int convert_overflow_check(convert_overflow o, tp_dtype format, const char *what, int more);
/* The first of count tensors' overflows that counts anything (-1: none),
 * and how many others do (*others): what convert_overflow_check names
 * when a conversion of many tensors overflowed. */
int convert_overflow_first(const convert_overflow *per_tensor, int count, int *others);

/* Converts n values; out may not overlap in. Narrowing rounds to nearest,
 * ties to even; overflow gives infinity, counted in the result; NaN stays
 * NaN (quiet). */
void convert_to_f32(const void *in, tp_dtype in_format, float *out, int64_t n);
convert_overflow convert_from_f32(const float *in, void *out, tp_dtype out_format, int64_t n);
/* Any format to any format (through fp32, which is exact for widening). */
convert_overflow convert_numbers(const void *in, tp_dtype in_format, void *out, tp_dtype out_format,
                                 int64_t n);

/* NaNs and infinities in a conversion's input: how many of each, and the
 * index of the first from the start of the input (-1 when there is none).
 * Import refuses a model holding them (a damaged download, an export of a
 * diverged run), naming the first, so it counts them in the pass that
 * converts rather than reading the weights a second time. */
typedef struct {
    int64_t nans, infinities;
    int64_t first;
} convert_nonfinite;

/* convert_numbers of n values in[i * in_stride] (in elements; 1:
 * contiguous, more: a gather, such as a column of a matrix being
 * transposed) into out[i], and their NaNs and infinities in *nonfinite
 * (overwritten; first counts i). Counted block by block over what the
 * conversion has just read, while it is in the L1 cache (a gather first
 * moves a block's bits into a tile), in a loop without branches that
 * vectorizes; only a block that holds one is searched for the first. */
convert_overflow convert_numbers_counting(const void *in, tp_dtype in_format, int64_t in_stride, void *out,
                                          tp_dtype out_format, int64_t n, convert_nonfinite *nonfinite);

/* The NaNs and infinities of n values already in memory, counted as
 * convert_numbers_counting counts them (first: the index among the n).
 * Where values are only copied, not converted, the pass that already reads
 * them counts them: a checkpoint writer's digest of the rows it writes
 * (ckpt_write_options.count_nonfinite), span by span while in the L1 cache. */
convert_nonfinite numbers_nonfinite(const void *values, tp_dtype format, int64_t n);

/* Adds what one count found to a tally (a tensor's): the counts, and its
 * first, at base + found.first, when earlier than the tally's (-1: none). */
void convert_nonfinite_add(convert_nonfinite *tally, convert_nonfinite found, int64_t base);

/* A strided move: `repeat` times, copy `len` elements from src to dst, then
 * advance src by src_stride and dst by dst_stride (all in elements). A
 * negative src fills with zeros instead. Resharding is a list of these. */
typedef struct {
    int64_t src, src_stride;
    int64_t dst, dst_stride;
    int64_t len, repeat;
} strided_move;

/* Applies moves from src (in src_format) to dst (in dst_format), converting
 * as convert_numbers does (its overflows summed). Moves must not overlap in
 * dst. */
convert_overflow moves_apply(const void *src, tp_dtype src_format, void *dst, tp_dtype dst_format,
                 const strided_move *moves, int64_t count);

/* out[c * out_stride + r] = in[r * in_stride + c] for r < rows, c < cols,
 * converted as convert_numbers does; in tiles, so that both sides stay in
 * cache (strides in elements). CPU only: export's transposition. */
convert_overflow transpose_numbers(const void *in, tp_dtype in_format, int64_t rows, int64_t cols,
                                   int64_t in_stride, void *out, tp_dtype out_format, int64_t out_stride);

/* =================================================================== CUDA */

/* Number of usable CUDA devices: 0 without a GPU or in a build without CUDA. */
int cuda_device_count(void);

/* Whether this build includes the CUDA kernels. */
int cuda_built(void);

/* GPU twin of convert_numbers on host buffers; *overflow (when not NULL)
 * as convert_numbers returns it. Fails with TP_ERR_DEVICE (no GPU, a build
 * without CUDA, a CUDA error). */
int cuda_convert_numbers(const void *in, tp_dtype in_format, void *out, tp_dtype out_format, int64_t n,
                         convert_overflow *overflow);

/* A GPU mover: pinned host buffers, device buffers and a stream of its own,
 * for one worker thread. The caller fills staging (host), run() copies it to
 * the device, applies the moves there and brings the output back. */
typedef struct cuda_mover cuda_mover;

int cuda_mover_create(cuda_mover **out, size_t staging_bytes, size_t output_bytes, int64_t max_moves);
void *cuda_mover_staging(cuda_mover *mover); /* pinned, staging_bytes */
void *cuda_mover_output(cuda_mover *mover);  /* pinned, output_bytes */
/* *overflow (when not NULL): as moves_apply returns it. */
int cuda_mover_run(cuda_mover *mover, size_t staging_used, tp_dtype src_format, size_t output_used,
                   tp_dtype dst_format, const strided_move *moves, int64_t count, convert_overflow *overflow);
void cuda_mover_free(cuda_mover *mover);

/* ================================================= transformer arithmetic
 * fp32. N counts rows (batch x time). Backward functions accumulate (+=)
 * into parameter gradients and overwrite input gradients unless said
 * otherwise. These are the CPU versions; kernel_backend below gives the
 * same operations on a device. */

/* Threads each CPU kernel call may use (kernels/cpu/workers.h). */
void kernels_set_threads(int threads);

/* Which code computes the CPU's products on this machine, for logs and
 * reports: "OpenBLAS CORE, oneDNN ISA, bf16 products by oneDNN" or "... by
 * sgemm on rounded operands". The libraries choose by the CPU's flags,
 * capped by OPENBLAS_CORETYPE and ONEDNN_MAX_CPU_ISA (and TP_NO_ONEDNN for
 * the bf16 products); the text is the same for the process's life. */
const char *kernels_cpu_paths(void);

/* out[N,OC] = in[N,C] @ weight[OC,C]^T + bias[OC] (bias may be NULL). */
void matmul_forward(float *out, const float *in, const float *weight, const float *bias, int64_t N, int64_t C,
                    int64_t OC);
/* d_in[N,C] = d_out[N,OC] @ weight[OC,C] (skipped when d_in is NULL);
 * d_weight[OC,C] += d_out^T @ in; d_bias[OC] += column sums of d_out (if not NULL). */
void matmul_backward(float *d_in, float *d_weight, float *d_bias, const float *d_out, const float *in,
                     const float *weight, int64_t N, int64_t C, int64_t OC);

/* bf16 mixed precision (tp-train --dtype bf16). Activations that only bf16
 * products, the bf16 attention and the MLP's activation read (the norms'
 * outputs, q, k and v, the attention's output, the MLP's input and its
 * activation) are kept as bf16 bits (uint16_t: the top
 * half of an fp32, rounded to nearest, ties to even, convert_bits.h), half
 * the memory and traffic of fp32 and no rounding before each product that
 * reads them. The *_bf16 operations below that write such an activation
 * write those bits: the same bits as rounding the fp32 operation's output.
 * Their gradients inside a layer are bf16 bits as well (the attention's
 * output's, q, k and v's, SwiGLU's output's and the MLP's input's: what a
 * product or the attention reads next); the residual stream's gradients,
 * and the norms' input gradients summed over tensor-parallel ranks, stay
 * fp32, the residual stream's with a bf16 copy that the norms' backward
 * writes beside it for the output projections' products.
 *
 * The products with bf16 operands summed in fp32, as tensor cores compute
 * them. The weight[OC,C] comes as bf16 bits too: the trainer's bf16 copy
 * of its fp32 weights, rounded once after they change rather than at every
 * product. Forward: in[N,C] is bf16 bits; out, the bias fp32 (added as it is:
 * a product written in bf16 rounds it, below). Backward:
 * d_out is bf16 bits, in bf16 bits; d_in, d_weight fp32, and d_bias += the
 * column sums of d_out's bf16 values (summed in fp32: the gradient the
 * product reads, as autocast's bf16 linear sums its bf16 gradient). They
 * may need scratch: TP_ERR_NOMEM when it cannot be had. */
int matmul_forward_bf16(float *out, const uint16_t *in, const uint16_t *weight, const float *bias, int64_t N, int64_t C,
                        int64_t OC);
int matmul_backward_bf16(float *d_in, float *d_weight, float *d_bias, const uint16_t *d_out, const uint16_t *in,
                         const uint16_t *weight, int64_t N, int64_t C, int64_t OC);
/* The backward of a product whose output joins the residual stream (the
 * attention's and the MLP's output projections): d_out[N,OC] the bf16 bits
 * of the residual stream's fp32 gradient (the norms' backward writes them:
 * layernorm_backward's d_in_bits); d_in[N,C] written as bf16 bits (the
 * gradient of the attention's output or of the MLP's activation), the bits
 * of rounding the fp32 d_in that matmul_backward_bf16 computes; d_weight and
 * d_bias as there. A GPU may have cuBLAS round its own fp32 sums, in another
 * order: one ulp apart where a sum lies near a tie. TP_ERR_NOMEM when
 * scratch cannot be had. */
int matmul_backward_bf16_bits(uint16_t *d_in, float *d_weight, float *d_bias, const uint16_t *d_out,
                              const uint16_t *in, const uint16_t *weight, int64_t N, int64_t C, int64_t OC);
/* matmul_forward_bf16 written as a bf16 activation: out[N,OC] as bf16
 * bits, the bits of rounding matmul_forward_bf16's fp32 out with the bias
 * rounded to bf16 first (a product written in bf16 adds its bias in bf16,
 * the activation's type: as cuBLASLt's epilogue takes a bias with a bf16
 * D, and as PyTorch's autocast rounds a linear layer's bias; added to the
 * fp32 sums, the result rounded once). GPT-2's qkv, which only the attention reads, and
 * Llama's MLP input (fc), which only SwiGLU reads (GPT-2's fc comes with
 * its GELU: matmul_forward_gelu_bf16). A GPU may have
 * cuBLAS round its own fp32 sums, in another order than its fp32 product's:
 * one ulp apart where a sum lies near a tie. TP_ERR_NOMEM when the CPU's
 * scratch cannot be had. */
int matmul_forward_bf16_bits(uint16_t *out, const uint16_t *in, const uint16_t *weight, const float *bias, int64_t N,
                             int64_t C, int64_t OC);
/* GPT-2's MLP input and its GELU in one operation (a GPU's cuBLASLt
 * computes GELU in the product's epilogue, CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
 * and writes both): pre[N,OC] = in . W^T + bias as bf16 bits (those of
 * matmul_forward_bf16_bits, the bias rounded to bf16 as there), and out[N,OC] the bits of rounding gelu_forward
 * of the fp32 sum before its rounding (not of pre's value: the epilogue has
 * the fp32 sum). pre is what the backward reads (matmul_backward_gelu_bf16),
 * out what the MLP's output projection reads. A GPU's sums may come in
 * another order, and its GELU from its own tanh: one ulp apart here and
 * there. TP_ERR_NOMEM when the CPU's scratch cannot be had. */
int matmul_forward_gelu_bf16(uint16_t *out, uint16_t *pre, const uint16_t *in, const uint16_t *weight,
                             const float *bias, int64_t N, int64_t C, int64_t OC);
/* The backward of the MLP's output projection and of the GELU before it in
 * one operation (on a GPU the product's epilogue, CUBLASLT_EPILOGUE_DGELU):
 * d_out[N,OC] the bf16 bits of the residual stream's gradient, as
 * matmul_backward_bf16_bits'; in[N,C] the GELU's output (bf16 bits),
 * pre[N,C] its input (bf16 bits, matmul_forward_gelu_bf16's pre); d_pre[N,C]
 * written as bf16 bits: the rounding of gelu_backward of pre's values and
 * the fp32 d_in that matmul_backward_bf16 computes (that d_in is not rounded
 * first); d_weight and d_bias as matmul_backward_bf16_bits. A GPU's sums may
 * come in another order, and GELU's derivative from its own tanh: one ulp
 * apart here and there. TP_ERR_NOMEM when scratch cannot be had. */
int matmul_backward_gelu_bf16(uint16_t *d_pre, float *d_weight, float *d_bias, const uint16_t *d_out,
                              const uint16_t *in, const uint16_t *weight, const uint16_t *pre, int64_t N, int64_t C,
                              int64_t OC);
/* out[i] = the bf16 bits of x[i] (to nearest, ties to even, convert_bits.h),
 * in shares over the CPU's threads: the trainer's bf16 copy of its weights. */
void round_to_bf16(uint16_t *out, const float *x, int64_t n);

/* out[N,C] = (in - mean) * rstd * weight + bias over each row (eps 1e-5);
 * mean[N], rstd[N] kept for backward. */
void layernorm_forward(float *out, float *mean, float *rstd, const float *in, const float *weight,
                       const float *bias, int64_t N, int64_t C);
/* d_in[N,C] += ..., d_weight[C] += ..., d_bias[C] += ... (d_bias NULL: not summed).
 * d_in_bits (NULL: none) receives the bf16 bits of the new d_in (to nearest,
 * ties to even, as round_to_bf16): in bf16 mixed precision d_in is the
 * residual stream's gradient, and the bits are what the output projections'
 * backward reads next (matmul_backward_bf16_bits, matmul_backward_gelu_bf16),
 * written as d_in is instead of rounded by a pass of their own. */
void layernorm_backward(float *d_in, uint16_t *d_in_bits, float *d_weight, float *d_bias, const float *d_out,
                        const float *in, const float *weight, const float *mean, const float *rstd, int64_t N,
                        int64_t C);

/* GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
void gelu_forward(float *out, const float *in, int64_t n);
void gelu_backward(float *d_in, const float *in, const float *d_out, int64_t n); /* d_in = gelu'(in) * d_out */

/* RMSNorm (Llama): out[N,C] = in * rstd * weight, rstd[N] = 1 / sqrt(mean(in^2)
 * + eps) over each row, kept for backward. */
void rmsnorm_forward(float *out, float *rstd, const float *in, const float *weight, int64_t N, int64_t C, float eps);
/* d_in[N,C] += ..., d_weight[C] += ...; d_in_bits as layernorm_backward's. */
void rmsnorm_backward(float *d_in, uint16_t *d_in_bits, float *d_weight, const float *d_out, const float *in,
                      const float *weight, const float *rstd, int64_t N, int64_t C);

/* SwiGLU (Llama's MLP): in[N,2F] holds [gate | up] per row (the fused
 * column-parallel fc's two segments), out[N,F] = silu(gate) * up with
 * silu(x) = x / (1 + exp(-x)). Backward overwrites d_in[N,2F]. */
void swiglu_forward(float *out, const float *in, int64_t N, int64_t F);
void swiglu_backward(float *d_in, const float *in, const float *d_out, int64_t N, int64_t F);

/* The norms and SwiGLU as bf16 activations (tp-train --dtype bf16): out as
 * bf16 bits, the same bits as rounding the fp32 operation's out; mean and
 * rstd fp32 as there. The norms read the residual stream (fp32); SwiGLU
 * reads the MLP's input, itself a bf16 activation (the fc product's output,
 * matmul_forward_bf16_bits), as bits: out is then the rounding of the fp32
 * operation on in's values. (GELU in bf16 is computed with its product:
 * matmul_forward_gelu_bf16.) On the CPU the fp32 values pass through a
 * thread's scratch: TP_ERR_NOMEM when it cannot be had. */
int layernorm_forward_bf16(uint16_t *out, float *mean, float *rstd, const float *in, const float *weight,
                           const float *bias, int64_t N, int64_t C);
int rmsnorm_forward_bf16(uint16_t *out, float *rstd, const float *in, const float *weight, int64_t N, int64_t C,
                         float eps);
int swiglu_forward_bf16(uint16_t *out, const uint16_t *in, int64_t N, int64_t F);
/* SwiGLU's backward with bf16 gradients: d_out is bf16 bits (the gradient
 * of the MLP's activation, matmul_backward_bf16_bits's d_in), in the MLP's
 * input as the forward read it (bf16 bits); d_in written as bf16 bits, the
 * bits of rounding what swiglu_backward computes from in's and d_out's
 * values (the gradient the MLP's input product reads). TP_ERR_NOMEM when the
 * CPU's scratch cannot be had. */
int swiglu_backward_bf16(uint16_t *d_in, const uint16_t *in, const uint16_t *d_out, int64_t N, int64_t F);

/* Rotary position embeddings, Hugging Face's rotate-half convention: in
 * each head's hd values, element j < hd/2 pairs with j + hd/2 and both turn
 * by the angle t * freq[j] of the row's position t:
 *   x'[j] = x[j] cos - x[j + hd/2] sin,  x'[j + hd/2] = x[j + hd/2] cos + x[j] sin.
 * Applied in place to the Q and K heads of qkv[B,T,(Hq+2Hkv)*hd] (V is left
 * alone). cos_sin[T, hd/2, 2] holds (cos, sin) of every position and
 * frequency (rope_table). Backward turns the gradient of the rotated Q and
 * K, in place in d_qkv, back by the same angles (the transpose). */
void rope_forward(float *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd);
void rope_backward(float *d_qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd);
/* rope_forward as a bf16 activation (Llama's qkv, which only the attention
 * reads): qkv (fp32) left as it is, out[B,T,(Hq+2Hkv)*hd] the bf16 bits of
 * rounding what rope_forward would leave in qkv (V rounded as it is).
 * TP_ERR_NOMEM when the CPU's scratch cannot be had. */
int rope_forward_bf16(uint16_t *out, const float *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq,
                      int64_t Hkv, int64_t hd);
/* rope_backward on a bf16 gradient, in place: d_qkv[B,T,(Hq+2Hkv)*hd] bf16
 * bits (the attention's bf16 d_qkv) turned back as rope_backward turns
 * their values, then rounded; the bits of V, and of a head's unpaired last
 * value (hd odd), stay as they are. TP_ERR_NOMEM when the CPU's scratch
 * cannot be had. */
int rope_backward_bf16(uint16_t *d_qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                       int64_t hd);

/* The frequencies of rotary embeddings: freq[j] = theta^(-2j/hd) for j < hd/2,
 * computed as Hugging Face computes them (fp32), then, with
 * scaling->factor > 0, Llama 3's frequency scaling (long wavelengths divided
 * by factor, short ones kept, a smooth blend between). */
typedef struct {
    double factor;            /* 0: no scaling */
    double low_freq_factor;   /* Llama 3.x: 1 */
    double high_freq_factor;  /* Llama 3.x: 4 */
    double original_seq;      /* original_max_position_embeddings: 8192 */
} rope_scaling;
void rope_frequencies(float *freq, int64_t hd, double theta, const rope_scaling *scaling);
/* cos_sin[T, hd/2, 2] of positions 0..T-1: the angle t * freq[j] in fp32 as
 * Hugging Face computes it, its cos and sin in double rounded to fp32. */
void rope_table(float *cos_sin, const float *freq, int64_t T, int64_t hd);

/* out[n] = a[n] + b[n] */
void residual_forward(float *out, const float *a, const float *b, int64_t n);

/* out[N,C] = x[N,C] + (partial[N,C] + bias[C]): a row-parallel linear's
 * summed output, its bias and the residual (out may be partial). */
void bias_residual_forward(float *out, const float *x, const float *partial, const float *bias, int64_t N, int64_t C);

/* A residual add and the norm that reads it, in one pass (a block's
 * res1 = x + (p + b) and ln2 of it: one read of the stream fewer, one launch
 * fewer on a GPU): sum[N,C] = x + (partial + residual_bias), or x + partial
 * when residual_bias is NULL, as bias_residual_forward (residual_forward)
 * computes it; then the norm of sum into out (fp32, or bf16 bits for the
 * _bf16 ones), mean and rstd, as layernorm_forward, rmsnorm_forward and
 * their bf16 twins compute it: the same bits as the two operations in turn.
 * sum may be x or partial (each element is read, then written, once). */
void residual_layernorm_forward(float *out, float *mean, float *rstd, float *sum, const float *x, const float *partial,
                                const float *residual_bias, const float *weight, const float *bias, int64_t N,
                                int64_t C);
void residual_rmsnorm_forward(float *out, float *rstd, float *sum, const float *x, const float *partial,
                              const float *residual_bias, const float *weight, int64_t N, int64_t C, float eps);
int residual_layernorm_forward_bf16(uint16_t *out, float *mean, float *rstd, float *sum, const float *x,
                                    const float *partial, const float *residual_bias, const float *weight,
                                    const float *bias, int64_t N, int64_t C);
int residual_rmsnorm_forward_bf16(uint16_t *out, float *rstd, float *sum, const float *x, const float *partial,
                                  const float *residual_bias, const float *weight, int64_t N, int64_t C, float eps);

/* acc[n] += x[n] */
void add_inplace(float *acc, const float *x, int64_t n);

/* x[n] *= scale */
void scale_inplace(float *x, float scale, int64_t n);

/* Causal self-attention of the heads held locally. qkv[B,T,(Hq+2Hkv)*hd] holds
 * [Q | K | V] per position; query head h attends with key/value head
 * h / (Hq/Hkv). Scale 1/sqrt(hd). Memory-efficient: the [T, T]
 * probabilities are never kept; out[B,T,Hq*hd] and lse[B,Hq,T] (each query
 * row's log-sum-exp of its scaled scores) are all the backward needs besides
 * qkv, which recomputes the probabilities from them. scratch holds
 * attention_scratch_floats(B, T, Hq) floats (forward and backward). On the
 * CPU each thread works on its own [ATTENTION_ROWS, T] blocks (scratch_buffer):
 * TP_ERR_NOMEM when they cannot be had. TP_ERR_ARG unless Hq is a multiple
 * of Hkv > 0 and hd > 0 (the four attention operations; a GPU's also
 * refuses hd beyond what its kernels hold). */
int attention_forward(float *out, float *lse, float *scratch, const float *qkv, int64_t B, int64_t T, int64_t Hq,
                      int64_t Hkv, int64_t hd);
/* d_qkv[B,T,(Hq+2Hkv)*hd] = gradient from d_out[B,T,Hq*hd], given the
 * forward's out and lse. */
int attention_backward(float *d_qkv, float *scratch, const float *d_out, const float *qkv, const float *out,
                       const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd);
/* bf16 mixed precision (tp-train --dtype bf16), the attention as cuDNN's
 * flash attention computes it on a GPU: the operands it reads in bf16
 * rounded to bf16 (to nearest, ties to even, convert_bits.h), everything
 * else as attention_forward and attention_backward compute it, in fp32
 * (scores, softmax, lse, sums). q, k and v (qkv) come as bf16 bits (a
 * bf16 activation: the qkv product's, or RoPE's, output rounded); the
 * forward writes out as bf16 bits (the same bits as rounding the fp32
 * attention's out); the backward reads qkv, out and d_out as bf16 bits (as
 * cuDNN reads them), takes lse as it is (fp32 in cuDNN too) and writes
 * d_qkv as bf16 bits (as cuDNN writes dQ, dK, dV: the fp32 gradient, its
 * sums over a shared key/value head's query heads included, rounded once).
 * Shapes and scratch as the fp32 functions, lse fp32; TP_ERR_NOMEM when the
 * widened copies cannot be had. A GPU's results differ from these by the
 * order of its fp32 sums and, through cuDNN, by its bf16 probabilities in
 * the products with V and d_out (kernels/cuda/attention_cudnn.h). */
int attention_forward_bf16(uint16_t *out, float *lse, float *scratch, const uint16_t *qkv, int64_t B, int64_t T,
                           int64_t Hq, int64_t Hkv, int64_t hd);
int attention_backward_bf16(uint16_t *d_qkv, float *scratch, const uint16_t *d_out, const uint16_t *qkv,
                            const uint16_t *out, const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                            int64_t hd);
/* Query rows the CPU attention computes at a time; the scratch it is given
 * is a [B,Hq,T] row vector. */
#define ATTENTION_ROWS 64
int64_t attention_scratch_floats(int64_t B, int64_t T, int64_t Hq);

/* Vocabulary-parallel embedding: this rank holds rows [first, first + rows)
 * of the (padded) token table. out[N,C] = the row of each token held here,
 * zero for the others (summed over ranks afterwards). */
void embedding_forward(float *out, const int *tokens, const float *table, int64_t N, int64_t C, int64_t first,
                       int64_t rows);
/* d_table[rows,C] += d_out rows of the tokens held here. */
void embedding_backward(float *d_table, const int *tokens, const float *d_out, int64_t N, int64_t C, int64_t first,
                        int64_t rows);

/* Vocabulary-parallel cross-entropy over local logits[N,V] whose columns are
 * global ids [first, first + V); ids >= vocab (padding) take no part. Steps
 * that need the other ranks' values are separated by the caller's reduction:
 * row_stats (then MAX of row_max over ranks, and each rank's sum made
 * relative to it by rescale_sum, then SUM), target_logit (then SUM).
 *
 * row_stats: row_max[n], the largest of row n's valid logits (-infinity
 * where it has none), and sum[n], the sum of exp(logit - row_max[n]) over
 * them (0 where none), in one pass over the logits (each value read once:
 * [N, V] is a step's largest array). */
void crossentropy_row_stats(float *row_max, float *sum, const float *logits, int64_t N, int64_t V, int64_t first,
                            int64_t vocab);
/* sum[n] *= exp(local_max[n] - global_max[n]): a rank's sum relative to its
 * own maximum made relative to the maximum over ranks (a rank without
 * valid columns, local -infinity, keeps its 0). */
void crossentropy_rescale_sum(float *sum, const float *local_max, const float *global_max, int64_t N);
void crossentropy_target_logit(float *target, const float *logits, const int *targets, int64_t N, int64_t V,
                               int64_t first);
/* d_logits[N,V] = scale * (softmax - onehot(target)); zero in padding columns.
 * d_logits may be logits itself (in place, as the trainer writes it: no
 * second array as large as the logits, the step's largest). */
void crossentropy_backward(float *d_logits, const float *logits, const float *row_max, const float *sum,
                           const int *targets, int64_t N, int64_t V, int64_t first, int64_t vocab, float scale);
/* bf16 mixed precision: the logits as bf16 bits (the classifier's product
 * written as a bf16 activation, matmul_forward_bf16_bits, as autocast
 * writes it), each widened (exact) where the fp32 operations read a logit:
 * the same results as those operations on the widened logits. The
 * cross-entropy itself stays fp32 (maxima, exponentials, sums). Half the
 * bytes of the step's largest array, [N, vocabulary], written once and read
 * twice. */
void crossentropy_row_stats_bf16(float *row_max, float *sum, const uint16_t *logits, int64_t N, int64_t V,
                                 int64_t first, int64_t vocab);
void crossentropy_target_logit_bf16(float *target, const uint16_t *logits, const int *targets, int64_t N, int64_t V,
                                    int64_t first);

/* The classifier's backward in bf16 mixed precision, in one operation:
 * crossentropy_backward's d_logits [N,V] of the bf16 logits (bits, as
 * crossentropy_row_stats_bf16 reads them), written over them as bf16 bits
 * (the same bits as rounding crossentropy_backward's values; each logit
 * read before its gradient replaces it), then matmul_backward_bf16 of those
 * bits without a bias: d_in[N,C] = d_logits @ weight[V,C] (overwritten,
 * fp32: the final norm's gradient), d_weight[V,C] += d_logits^T @ in[N,C]
 * (in: bf16 bits, the final norm's bf16 activation). One operation so that
 * d_logits is written once, already as the bits the products read, where
 * the logits were: no second array of the step's largest shape, [N,
 * vocabulary], in either precision. */
int classifier_backward_bf16(float *d_in, float *d_weight, uint16_t *logits, const float *row_max, const float *sum,
                             const int *targets, const uint16_t *in, const uint16_t *weight, int64_t N, int64_t C,
                             int64_t V, int64_t first, int64_t vocab, float scale);

/* One AdamW step exactly as torch.optim.AdamW computes it (decoupled decay
 * first, then the bias-corrected Adam update). step counts from 1. */
void adamw_update(float *param, const float *grad, float *m, float *v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t step);

/* One tensor of an AdamW step over many (adamw_update_tensors): n values of
 * param, grad and the moments m and v, with its own weight decay (0 for
 * biases and norms). param_bits, where not NULL: n values that get the bf16
 * bits of the updated param, rounded as round_to_bf16 rounds (the bf16
 * copy the products read, written in the update's pass instead of a pass
 * of its own that reads the weights again). */
typedef struct {
    float *param, *m, *v;
    const float *grad;
    int64_t n;
    float weight_decay;
    uint16_t *param_bits;
} adamw_tensor;

/* adamw_update on each of count tensors, value for value the same
 * arithmetic (the results equal one adamw_update per tensor to the bit), in
 * one call for a whole model: a GPU launches once per few dozen tensors
 * instead of once per tensor, and the CPU's workers share the model's
 * values instead of each small tensor's. */
void adamw_update_tensors(const adamw_tensor *tensors, int count, float lr, float beta1, float beta2, float eps,
                          int64_t step);

/* Sum of squares of the values of `count` spans (span s: lengths[s] values
 * from spans[s]), accumulated in double: the gradient norm of many tensors
 * in one call. The order of the sums is fixed by the lengths alone (chunks
 * of the spans' concatenation, kernels/cpu/linear.c), whatever the threads. */
double sum_of_squares(const float *const *spans, const int64_t *lengths, int count);

/* Standard normals of logical elements [first, first + n) of a tensor, from
 * (seed, tensor name hash, element index) alone, in Box-Muller pairs
 * (docs/DATA.md "Initial values"; kernels/cpu/normals.c): the same at every
 * layout, cut of the run and machine. */
void box_muller_normals(uint64_t seed, uint64_t name_hash, int64_t first, int64_t n, float *out);

/* The operations of a kernel backend that compute, in one list: each as
 * X(name, (parameters), (the arguments that pass them on)), so that the
 * table below, the timed backend (timed.c) and the CUDA backend's
 * declarations (cuda/internal.h) cannot disagree. Shapes and semantics:
 * the CPU functions of the same name above. */
#define KERNEL_OPERATIONS(X)                                                                                           \
    X(matmul_forward,                                                                                                  \
      (float *out, const float *in, const float *weight, const float *bias, int64_t N, int64_t C, int64_t OC),         \
      (out, in, weight, bias, N, C, OC))                                                                               \
    X(matmul_backward,                                                                                                 \
      (float *d_in, float *d_weight, float *d_bias, const float *d_out, const float *in, const float *weight,          \
       int64_t N, int64_t C, int64_t OC),                                                                              \
      (d_in, d_weight, d_bias, d_out, in, weight, N, C, OC))                                                           \
    X(matmul_forward_bf16,                                                                                             \
      (float *out, const uint16_t *in, const uint16_t *weight, const float *bias, int64_t N, int64_t C, int64_t OC),   \
      (out, in, weight, bias, N, C, OC))                                                                               \
    X(matmul_backward_bf16,                                                                                            \
      (float *d_in, float *d_weight, float *d_bias, const uint16_t *d_out, const uint16_t *in, const uint16_t *weight, \
       int64_t N, int64_t C, int64_t OC),                                                                              \
      (d_in, d_weight, d_bias, d_out, in, weight, N, C, OC))                                                           \
    X(matmul_backward_bf16_bits,                                                                                       \
      (uint16_t *d_in, float *d_weight, float *d_bias, const uint16_t *d_out, const uint16_t *in,                      \
       const uint16_t *weight, int64_t N, int64_t C, int64_t OC),                                                      \
      (d_in, d_weight, d_bias, d_out, in, weight, N, C, OC))                                                           \
    X(matmul_forward_bf16_bits,                                                                                        \
      (uint16_t *out, const uint16_t *in, const uint16_t *weight, const float *bias, int64_t N, int64_t C,             \
       int64_t OC),                                                                                                    \
      (out, in, weight, bias, N, C, OC))                                                                               \
    X(matmul_forward_gelu_bf16,                                                                                        \
      (uint16_t *out, uint16_t *pre, const uint16_t *in, const uint16_t *weight, const float *bias, int64_t N,         \
       int64_t C, int64_t OC),                                                                                         \
      (out, pre, in, weight, bias, N, C, OC))                                                                          \
    X(matmul_backward_gelu_bf16,                                                                                       \
      (uint16_t *d_pre, float *d_weight, float *d_bias, const uint16_t *d_out, const uint16_t *in,                     \
       const uint16_t *weight, const uint16_t *pre, int64_t N, int64_t C, int64_t OC),                                 \
      (d_pre, d_weight, d_bias, d_out, in, weight, pre, N, C, OC))                                                     \
    X(round_to_bf16,                                                                                                   \
      (uint16_t *out, const float *x, int64_t n),                                                                      \
      (out, x, n))                                                                                                     \
    X(layernorm_forward,                                                                                               \
      (float *out, float *mean, float *rstd, const float *in, const float *weight, const float *bias, int64_t N,       \
       int64_t C),                                                                                                     \
      (out, mean, rstd, in, weight, bias, N, C))                                                                       \
    X(layernorm_backward,                                                                                              \
      (float *d_in, uint16_t *d_in_bits, float *d_weight, float *d_bias, const float *d_out, const float *in,          \
       const float *weight, const float *mean, const float *rstd, int64_t N, int64_t C),                               \
      (d_in, d_in_bits, d_weight, d_bias, d_out, in, weight, mean, rstd, N, C))                                        \
    X(gelu_forward,                                                                                                    \
      (float *out, const float *in, int64_t n),                                                                        \
      (out, in, n))                                                                                                    \
    X(gelu_backward,                                                                                                   \
      (float *d_in, const float *in, const float *d_out, int64_t n),                                                   \
      (d_in, in, d_out, n))                                                                                            \
    X(rmsnorm_forward,                                                                                                 \
      (float *out, float *rstd, const float *in, const float *weight, int64_t N, int64_t C, float eps),                \
      (out, rstd, in, weight, N, C, eps))                                                                              \
    X(rmsnorm_backward,                                                                                                \
      (float *d_in, uint16_t *d_in_bits, float *d_weight, const float *d_out, const float *in, const float *weight,    \
       const float *rstd, int64_t N, int64_t C),                                                                       \
      (d_in, d_in_bits, d_weight, d_out, in, weight, rstd, N, C))                                                      \
    X(swiglu_forward,                                                                                                  \
      (float *out, const float *in, int64_t N, int64_t F),                                                             \
      (out, in, N, F))                                                                                                 \
    X(swiglu_backward,                                                                                                 \
      (float *d_in, const float *in, const float *d_out, int64_t N, int64_t F),                                        \
      (d_in, in, d_out, N, F))                                                                                         \
    X(layernorm_forward_bf16,                                                                                          \
      (uint16_t *out, float *mean, float *rstd, const float *in, const float *weight, const float *bias, int64_t N,    \
       int64_t C),                                                                                                     \
      (out, mean, rstd, in, weight, bias, N, C))                                                                       \
    X(rmsnorm_forward_bf16,                                                                                            \
      (uint16_t *out, float *rstd, const float *in, const float *weight, int64_t N, int64_t C, float eps),             \
      (out, rstd, in, weight, N, C, eps))                                                                              \
    X(swiglu_forward_bf16,                                                                                             \
      (uint16_t *out, const uint16_t *in, int64_t N, int64_t F),                                                       \
      (out, in, N, F))                                                                                                 \
    X(swiglu_backward_bf16,                                                                                            \
      (uint16_t *d_in, const uint16_t *in, const uint16_t *d_out, int64_t N, int64_t F),                               \
      (d_in, in, d_out, N, F))                                                                                         \
    X(rope_forward,                                                                                                    \
      (float *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd),                   \
      (qkv, cos_sin, B, T, Hq, Hkv, hd))                                                                               \
    X(rope_backward,                                                                                                   \
      (float *d_qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd),                 \
      (d_qkv, cos_sin, B, T, Hq, Hkv, hd))                                                                             \
    X(rope_forward_bf16,                                                                                               \
      (uint16_t *out, const float *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,           \
       int64_t hd),                                                                                                    \
      (out, qkv, cos_sin, B, T, Hq, Hkv, hd))                                                                          \
    X(rope_backward_bf16,                                                                                              \
      (uint16_t *d_qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd),              \
      (d_qkv, cos_sin, B, T, Hq, Hkv, hd))                                                                             \
    X(residual_forward,                                                                                                \
      (float *out, const float *a, const float *b, int64_t n),                                                         \
      (out, a, b, n))                                                                                                  \
    X(bias_residual_forward,                                                                                           \
      (float *out, const float *x, const float *partial, const float *bias, int64_t N, int64_t C),                     \
      (out, x, partial, bias, N, C))                                                                                   \
    X(residual_layernorm_forward,                                                                                      \
      (float *out, float *mean, float *rstd, float *sum, const float *x, const float *partial,                         \
       const float *residual_bias, const float *weight, const float *bias, int64_t N, int64_t C),                      \
      (out, mean, rstd, sum, x, partial, residual_bias, weight, bias, N, C))                                           \
    X(residual_rmsnorm_forward,                                                                                        \
      (float *out, float *rstd, float *sum, const float *x, const float *partial, const float *residual_bias,          \
       const float *weight, int64_t N, int64_t C, float eps),                                                          \
      (out, rstd, sum, x, partial, residual_bias, weight, N, C, eps))                                                  \
    X(residual_layernorm_forward_bf16,                                                                                 \
      (uint16_t *out, float *mean, float *rstd, float *sum, const float *x, const float *partial,                      \
       const float *residual_bias, const float *weight, const float *bias, int64_t N, int64_t C),                      \
      (out, mean, rstd, sum, x, partial, residual_bias, weight, bias, N, C))                                           \
    X(residual_rmsnorm_forward_bf16,                                                                                   \
      (uint16_t *out, float *rstd, float *sum, const float *x, const float *partial, const float *residual_bias,       \
       const float *weight, int64_t N, int64_t C, float eps),                                                          \
      (out, rstd, sum, x, partial, residual_bias, weight, N, C, eps))                                                  \
    X(add_inplace,                                                                                                     \
      (float *acc, const float *x, int64_t n),                                                                         \
      (acc, x, n))                                                                                                     \
    X(scale_inplace,                                                                                                   \
      (float *x, float scale, int64_t n),                                                                              \
      (x, scale, n))                                                                                                   \
    X(attention_forward,                                                                                               \
      (float *out, float *lse, float *scratch, const float *qkv, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,        \
       int64_t hd),                                                                                                    \
      (out, lse, scratch, qkv, B, T, Hq, Hkv, hd))                                                                     \
    X(attention_backward,                                                                                              \
      (float *d_qkv, float *scratch, const float *d_out, const float *qkv, const float *out, const float *lse,         \
       int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd),                                                     \
      (d_qkv, scratch, d_out, qkv, out, lse, B, T, Hq, Hkv, hd))                                                       \
    X(attention_forward_bf16,                                                                                          \
      (uint16_t *out, float *lse, float *scratch, const uint16_t *qkv, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,  \
       int64_t hd),                                                                                                    \
      (out, lse, scratch, qkv, B, T, Hq, Hkv, hd))                                                                     \
    X(attention_backward_bf16,                                                                                         \
      (uint16_t *d_qkv, float *scratch, const uint16_t *d_out, const uint16_t *qkv, const uint16_t *out,               \
       const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd),                                   \
      (d_qkv, scratch, d_out, qkv, out, lse, B, T, Hq, Hkv, hd))                                                       \
    X(embedding_forward,                                                                                               \
      (float *out, const int *tokens, const float *table, int64_t N, int64_t C, int64_t first, int64_t rows),          \
      (out, tokens, table, N, C, first, rows))                                                                         \
    X(embedding_backward,                                                                                              \
      (float *d_table, const int *tokens, const float *d_out, int64_t N, int64_t C, int64_t first, int64_t rows),      \
      (d_table, tokens, d_out, N, C, first, rows))                                                                     \
    X(crossentropy_row_stats,                                                                                          \
      (float *row_max, float *sum, const float *logits, int64_t N, int64_t V, int64_t first, int64_t vocab),           \
      (row_max, sum, logits, N, V, first, vocab))                                                                      \
    X(crossentropy_rescale_sum,                                                                                        \
      (float *sum, const float *local_max, const float *global_max, int64_t N),                                        \
      (sum, local_max, global_max, N))                                                                                 \
    X(crossentropy_target_logit,                                                                                       \
      (float *target, const float *logits, const int *targets, int64_t N, int64_t V, int64_t first),                   \
      (target, logits, targets, N, V, first))                                                                          \
    X(crossentropy_backward,                                                                                           \
      (float *d_logits, const float *logits, const float *row_max, const float *sum, const int *targets, int64_t N,    \
       int64_t V, int64_t first, int64_t vocab, float scale),                                                          \
      (d_logits, logits, row_max, sum, targets, N, V, first, vocab, scale))                                            \
    X(crossentropy_row_stats_bf16,                                                                                     \
      (float *row_max, float *sum, const uint16_t *logits, int64_t N, int64_t V, int64_t first, int64_t vocab),        \
      (row_max, sum, logits, N, V, first, vocab))                                                                      \
    X(crossentropy_target_logit_bf16,                                                                                  \
      (float *target, const uint16_t *logits, const int *targets, int64_t N, int64_t V, int64_t first),                \
      (target, logits, targets, N, V, first))                                                                          \
    X(classifier_backward_bf16,                                                                                        \
      (float *d_in, float *d_weight, uint16_t *logits, const float *row_max, const float *sum, const int *targets,      \
       const uint16_t *in, const uint16_t *weight, int64_t N, int64_t C, int64_t V, int64_t first, int64_t vocab,       \
       float scale),                                                                                                   \
      (d_in, d_weight, logits, row_max, sum, targets, in, weight, N, C, V, first, vocab, scale))                       \
    /* tensors: a host array of the backend's pointers and counts. */                                                  \
    X(adamw_update_tensors,                                                                                            \
      (const adamw_tensor *tensors, int count, float lr, float beta1, float beta2, float eps, int64_t step),           \
      (tensors, count, lr, beta1, beta2, eps, step))                                                                   \
    /* *out is host memory; spans and lengths are host arrays of device pointers and counts. */                        \
    X(sum_of_squares,                                                                                                  \
      (double *out, const float *const *spans, const int64_t *lengths, int count),                                     \
      (out, spans, lengths, count))

/* Whether a backend's copy of `bytes` from src to dst would read what it
 * writes: distinct ranges that overlap, which every backend's copy refuses
 * (TP_ERR_ARG; dst == src is a no-op). */
static inline int copy_ranges_overlap(const void *dst, const void *src, size_t bytes)
{
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    return dst != src && bytes && d < s + bytes && s < d + bytes;
}

/* A copy of `bytes` from a backend's memory to the host
 * (kernel_backend's to_host_background). */
typedef struct {
    void *host_dst;
    const void *device_src;
    size_t bytes;
} host_copy;

/* ========================================================= kernel backends
 * The transformer arithmetic above, on a device: the trainer computes
 * through one of these tables, so that the same model code runs on the CPU
 * (plain host memory; every call succeeds) and on a GPU (device memory, the
 * CUDA twins in cuda/, run in order on one stream). Pointers given to the
 * operations are the backend's memory (from alloc); shapes and semantics are
 * those of the CPU functions of the same name. Every function that can fail
 * returns a tp_status (TP_ERR_DEVICE for a device's error, with CUDA's
 * reason). */
typedef struct kernel_backend {
    const char *name; /* "cpu" or "cuda" */
    int on_device;    /* memory is not host memory: copy with to_device/to_host */

    /* Memory of the backend; alloc gives zeroed memory. */
    int (*alloc)(void **out, size_t bytes);
    void (*release)(void *memory);
    int (*zero)(void *memory, size_t bytes);
    /* to_device returns once host_src may be reused (on a GPU a small copy
     * may still be queued: later work sees its result); to_host once the
     * copy, and the work queued before it, is done. */
    int (*to_device)(void *device_dst, const void *host_src, size_t bytes);
    int (*to_host)(void *host_dst, const void *device_src, size_t bytes);
    int (*copy)(void *dst, const void *src, size_t bytes); /* both the backend's memory; overlapping: TP_ERR_ARG */
    int (*synchronize)(void);                               /* waits for all work issued */
    /* Host memory for snapshots of device memory, resident when returned
     * (the first snapshot takes no page faults while training waits for it):
     * pinned (page-locked) on a GPU, so that copies run at full speed beside
     * the computation; on the CPU alloc's populated huge pages. */
    int (*host_alloc)(void **out, size_t bytes);
    void (*host_release)(void *memory);
    /* Snapshots beside the computation (a checkpoint's, taken while the next
     * step runs): mark_work records a point in the work issued so far (on
     * a GPU an event on the stream; nothing on the CPU, where *mark is
     * NULL); then any thread may copy to the host after that point
     * (to_host_background: on a side stream on a GPU), waiting for the work
     * issued before the mark alone, not for what was issued since (mark
     * NULL: for all the work issued so far); it returns when every copy is
     * complete. release_mark frees a mark (NULL too). */
    int (*mark_work)(void **mark);
    int (*to_host_background)(const void *mark, const host_copy *copies, int count);
    void (*release_mark)(void *mark);

    /* The operations that compute (KERNEL_OPERATIONS): each returns a tp_status. */
#define KERNEL_OPERATION_FIELD(op, PARAMS, ARGS) int (*op) PARAMS;
    KERNEL_OPERATIONS(KERNEL_OPERATION_FIELD)
#undef KERNEL_OPERATION_FIELD
    /* Which code computes the attention of this shape (bf16: the *_bf16
     * operations, else the fp32 ones), and why, in a line for logs and the
     * trainer's start line: on a GPU, cuDNN's flash attention or the CUDA
     * kernels with the reason cuDNN is not used (its graphs for the shape
     * are built here, so that the line says what the steps will run). The
     * one home of that text (kernels/cpu/backend.c, kernels/cuda/attention.cu). */
    void (*describe_attention)(int bf16, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd, char *text,
                               size_t size);
} kernel_backend;

/* The CPU backend: the functions above on host memory. */
const kernel_backend *kernels_cpu(void);

/* Time spent in one operation of a timed backend (kernels_timed). */
typedef struct {
    const char *name;    /* the operation's field, "matmul_forward_bf16" */
    int64_t calls;
    double issue_seconds; /* on the host, in the call (a GPU's returns once its work is queued, unless it waits) */
    double wait_seconds;  /* in the synchronize that follows each call: that call's device work still running */
} kernel_op_time;

/* inner with every operation timed (timed.c): each call, then a
 * synchronize after it, so that a step's time splits into each
 * operation's issue and device tail, and the host's own time around them.
 * Slower than inner (no overlap of host and device): for finding where
 * the time goes, not for measuring speed. One per process (the same inner
 * again gives the same table; another is TP_ERR_STATE); NULL with the
 * reason in tp_errmsg(). */
const kernel_backend *kernels_timed(const kernel_backend *inner);
/* Forgets the times so far (the first step's warm-up, say). */
void kernels_timed_reset(void);
/* The operations called since the start or the last reset, slowest (issue
 * and wait together) first: at most max into out; returns how many. */
int kernels_timed_read(kernel_op_time *out, int max);

/* The CUDA backend on device `device` (cudaSetDevice; a cuBLAS handle and a
 * stream of this process); NULL with the reason in tp_errmsg() when this
 * build has no CUDA or the device cannot be used. Matrix products through
 * cuBLAS in fp32 (TF32 off: results within fp32 rounding of the CPU's). */
const kernel_backend *kernels_cuda(int device);

/* Device collectives (NCCL, loaded when first used) among processes that
 * each hold a CUDA backend: a group of `members` processes, this one
 * `member`, made from an id that one member draws (cuda_group_id) and the
 * others receive through a host communicator. All-reduces run on the CUDA
 * backend's stream, in place, ordered after the work issued there; like
 * every collective, in the same order on every member. Fail with
 * TP_ERR_DEVICE and NCCL's reason (a build without CUDA: there is none). */
#define CUDA_GROUP_ID_BYTES 128
typedef struct cuda_group cuda_group;
int cuda_group_id(unsigned char id[CUDA_GROUP_ID_BYTES]);
int cuda_group_create(cuda_group **out, const unsigned char id[CUDA_GROUP_ID_BYTES], int members, int member);
/* data: count values of the backend's memory, float (is_double 0) or
 * double; sum (is_max 0) or max. */
int cuda_group_all_reduce(cuda_group *group, void *data, int64_t count, int is_double, int is_max);
/* count values of send from every member, in member order, into recv
 * (members x count), values of value_bytes bytes (2: bf16 bits, 4: float,
 * 8: double; a gather moves them as they are). */
int cuda_group_all_gather(cuda_group *group, const void *send, void *recv, int64_t count, int value_bytes);
/* The sum of every member's send (members x count), member j keeping part
 * j (count values) in recv. */
int cuda_group_reduce_scatter(cuda_group *group, const void *send, void *recv, int64_t count, int is_double);
/* Point to point with member `peer`, in the order issued (a pipeline link:
 * one group per direction, so that the messages of each go one way). A
 * receive runs on the backend's stream. A send runs on a stream of the
 * group's, after the work issued on the backend's stream so far: it does
 * not hold up the computation issued after it while the peer is not yet
 * receiving. Its data must stay untouched until cuda_group_wait_sends has
 * ordered the backend's stream after it: after the first `sends` sends
 * since the last wait for all, or (sends < 0) after every send so far. */
int cuda_group_send(cuda_group *group, int peer, const void *data, int64_t count, int is_double);
int cuda_group_recv(cuda_group *group, int peer, void *data, int64_t count, int is_double);
int cuda_group_wait_sends(cuda_group *group, int64_t sends);
void cuda_group_free(cuda_group *group);

/* The backend for a device asked for by name: "cpu"; "cuda" (the GPU
 * local_rank of this machine: it must exist; with share_gpus, the GPU
 * kernels_gpu_index gives, shared with other processes); "auto" (cuda when
 * this build has CUDA and the machine a GPU for local_rank, else cpu; never
 * shared). Fails naming what is missing (no CUDA in this build, no GPU,
 * fewer GPUs than ranks on the machine, a CUDA error). */
int kernels_choose(const char *device, int local_rank, int share_gpus, const kernel_backend **out);

/* The GPU a process of local rank local_rank computes on, of the machine's
 * gpus: its own, local_rank (TP_ERR_DEVICE when the machine has fewer); or,
 * with share_gpus, local_rank modulo gpus: several processes on one GPU
 * (each its own context and stream; their collectives cannot be NCCL's,
 * which refuses two ranks on one GPU: they go through the host). */
int kernels_gpu_index(int local_rank, int gpus, int share_gpus, int *index);

/* What "auto" asks of this process: whether this build has CUDA and the
 * machine a GPU for local_rank (a job on several ranks agrees on it before
 * choosing: tp-train). */
int kernels_gpu_for(int local_rank);

/* GPU facts for reports: the name of CUDA device `device` ("" without
 * one), and the dense bf16 tensor-core peak of a GPU by its name, in
 * FLOP/s (0 when the table does not know it: H100 SXM and PCIe, H200,
 * A100, L40S, A10G are in it). */
void cuda_device_name(int device, char *name, size_t size);
double gpu_peak_bf16_flops(const char *name);

#endif
