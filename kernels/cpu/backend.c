/* backend.c: the CPU kernel backend: the functions of kernels.h on host
 * memory, in the table the trainer computes through. Nothing here fails
 * except allocation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "../../common/memory.h"
#include "../kernels.h"

static int cpu_alloc(void **out, size_t bytes)
{
    /* Page-aligned, zeroed and resident: the trainer's memory is used whole
     * from the first step. */
    *out = alloc_zeroed_pages(bytes ? bytes : 1);
    if (!*out) return tp_fail(TP_ERR_NOMEM, "out of memory (%zu bytes)", bytes);
    return TP_OK;
}

static void cpu_release(void *memory)
{
    free_zeroed_pages(memory);
}

static int cpu_zero(void *memory, size_t bytes)
{
    memset(memory, 0, bytes);
    return TP_OK;
}

/* Host to host: the three copies are one. */
static int cpu_copy(void *dst, const void *src, size_t bytes)
{
    if (dst != src) memmove(dst, src, bytes);
    return TP_OK;
}

/* Everything is done when issued: no mark, and the copies made at once. */
static int cpu_mark_work(void **mark)
{
    *mark = NULL;
    return TP_OK;
}

static int cpu_to_host_background(const void *mark, const host_copy *copies, int count)
{
    (void)mark;
    for (int i = 0; i < count; i++) cpu_copy(copies[i].host_dst, copies[i].device_src, copies[i].bytes);
    return TP_OK;
}

static void cpu_release_mark(void *mark)
{
    (void)mark;
}

/* The table's copy: ranges that overlap are refused, as on a GPU (kernels.h),
 * so that code relying on them fails here first. */
static int cpu_copy_apart(void *dst, const void *src, size_t bytes)
{
    if (copy_ranges_overlap(dst, src, bytes))
        return tp_fail(TP_ERR_ARG, "copy of %zu bytes between overlapping ranges (%p to %p)", bytes, src, dst);
    return cpu_copy(dst, src, bytes);
}

static int cpu_synchronize(void)
{
    return TP_OK;
}

/* The snapshot of a 124M-parameter model (1.5 GB) written page by page
 * cost 6-7 s of a resumed start here; populated as huge pages, a fraction. */
static int cpu_host_alloc(void **out, size_t bytes)
{
    *out = alloc_zeroed_pages(bytes ? bytes : 1);
    return *out ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory (%zu bytes)", bytes);
}

static void cpu_host_release(void *memory)
{
    free_zeroed_pages(memory);
}

/* Each operation: the CPU function, which cannot fail. */
#define CPU_OP(name, params, args) \
    static int cpu_##name params   \
    {                              \
        name args;                 \
        return TP_OK;              \
    }

CPU_OP(matmul_forward,
       (float *out, const float *in, const float *weight, const float *bias, int64_t N, int64_t C, int64_t OC),
       (out, in, weight, bias, N, C, OC))
CPU_OP(matmul_backward,
       (float *d_in, float *d_weight, float *d_bias, const float *d_out, const float *in, const float *weight,
        int64_t N, int64_t C, int64_t OC),
       (d_in, d_weight, d_bias, d_out, in, weight, N, C, OC))
CPU_OP(layernorm_forward,
       (float *out, float *mean, float *rstd, const float *in, const float *weight, const float *bias, int64_t N,
        int64_t C),
       (out, mean, rstd, in, weight, bias, N, C))
CPU_OP(layernorm_backward,
       (float *d_in, uint16_t *d_in_bits, float *d_weight, float *d_bias, const float *d_out, const float *in,
        const float *weight, const float *mean, const float *rstd, int64_t N, int64_t C),
       (d_in, d_in_bits, d_weight, d_bias, d_out, in, weight, mean, rstd, N, C))
CPU_OP(gelu_forward, (float *out, const float *in, int64_t n), (out, in, n))
CPU_OP(gelu_backward, (float *d_in, const float *in, const float *d_out, int64_t n), (d_in, in, d_out, n))
CPU_OP(rmsnorm_forward,
       (float *out, float *rstd, const float *in, const float *weight, int64_t N, int64_t C, float eps),
       (out, rstd, in, weight, N, C, eps))
CPU_OP(rmsnorm_backward,
       (float *d_in, uint16_t *d_in_bits, float *d_weight, const float *d_out, const float *in, const float *weight,
        const float *rstd, int64_t N, int64_t C),
       (d_in, d_in_bits, d_weight, d_out, in, weight, rstd, N, C))
CPU_OP(swiglu_forward, (float *out, const float *in, int64_t N, int64_t F), (out, in, N, F))
CPU_OP(swiglu_backward, (float *d_in, const float *in, const float *d_out, int64_t N, int64_t F),
       (d_in, in, d_out, N, F))
CPU_OP(rope_forward, (float *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd),
       (qkv, cos_sin, B, T, Hq, Hkv, hd))
CPU_OP(rope_backward,
       (float *d_qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd),
       (d_qkv, cos_sin, B, T, Hq, Hkv, hd))
CPU_OP(round_to_bf16, (uint16_t *out, const float *x, int64_t n), (out, x, n))
CPU_OP(residual_forward, (float *out, const float *a, const float *b, int64_t n), (out, a, b, n))
CPU_OP(bias_residual_forward,
       (float *out, const float *x, const float *partial, const float *bias, int64_t N, int64_t C),
       (out, x, partial, bias, N, C))
CPU_OP(residual_layernorm_forward,
       (float *out, float *mean, float *rstd, float *sum, const float *x, const float *partial,
        const float *residual_bias, const float *weight, const float *bias, int64_t N, int64_t C),
       (out, mean, rstd, sum, x, partial, residual_bias, weight, bias, N, C))
CPU_OP(residual_rmsnorm_forward,
       (float *out, float *rstd, float *sum, const float *x, const float *partial, const float *residual_bias,
        const float *weight, int64_t N, int64_t C, float eps),
       (out, rstd, sum, x, partial, residual_bias, weight, N, C, eps))
CPU_OP(add_inplace, (float *acc, const float *x, int64_t n), (acc, x, n))
CPU_OP(scale_inplace, (float *x, float scale, int64_t n), (x, scale, n))
CPU_OP(embedding_forward,
       (float *out, const int *tokens, const float *table, int64_t N, int64_t C, int64_t first, int64_t rows),
       (out, tokens, table, N, C, first, rows))
CPU_OP(embedding_backward,
       (float *d_table, const int *tokens, const float *d_out, int64_t N, int64_t C, int64_t first, int64_t rows),
       (d_table, tokens, d_out, N, C, first, rows))
CPU_OP(crossentropy_row_stats,
       (float *row_max, float *sum, const float *logits, int64_t N, int64_t V, int64_t first, int64_t vocab),
       (row_max, sum, logits, N, V, first, vocab))
CPU_OP(crossentropy_rescale_sum, (float *sum, const float *local_max, const float *global_max, int64_t N),
       (sum, local_max, global_max, N))
CPU_OP(crossentropy_target_logit,
       (float *target, const float *logits, const int *targets, int64_t N, int64_t V, int64_t first),
       (target, logits, targets, N, V, first))
CPU_OP(crossentropy_backward,
       (float *d_logits, const float *logits, const float *row_max, const float *sum, const int *targets, int64_t N,
        int64_t V, int64_t first, int64_t vocab, float scale),
       (d_logits, logits, row_max, sum, targets, N, V, first, vocab, scale))
CPU_OP(crossentropy_row_stats_bf16,
       (float *row_max, float *sum, const uint16_t *logits, int64_t N, int64_t V, int64_t first, int64_t vocab),
       (row_max, sum, logits, N, V, first, vocab))
CPU_OP(crossentropy_target_logit_bf16,
       (float *target, const uint16_t *logits, const int *targets, int64_t N, int64_t V, int64_t first),
       (target, logits, targets, N, V, first))
CPU_OP(adamw_update_tensors,
       (const adamw_tensor *tensors, int count, float lr, float beta1, float beta2, float eps, int64_t step),
       (tensors, count, lr, beta1, beta2, eps, step))

static int cpu_sum_of_squares(double *out, const float *const *spans, const int64_t *lengths, int count)
{
    *out = sum_of_squares(spans, lengths, count);
    return TP_OK;
}

/* The CPU's attention (attention.c): sgemm on blocks of query rows, in
 * fp32, on bf16-rounded operands for the bf16 operations. */
static void cpu_describe_attention(int bf16, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd, char *text,
                                   size_t size)
{
    (void)B, (void)T, (void)Hq, (void)Hkv, (void)hd;
    snprintf(text, size, "CPU fp32 (sgemm on blocks of %d query rows)%s", ATTENTION_ROWS,
             bf16 ? " on bf16-rounded q, k, v (and out, d_out in the backward), out written in bf16" : "");
}

static const kernel_backend cpu_backend = {
    .name = "cpu",
    .on_device = 0,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .zero = cpu_zero,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .copy = cpu_copy_apart,
    .synchronize = cpu_synchronize,
    .host_alloc = cpu_host_alloc,
    .host_release = cpu_host_release,
    .mark_work = cpu_mark_work,
    .to_host_background = cpu_to_host_background,
    .release_mark = cpu_release_mark,
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward,
    .matmul_forward_bf16 = matmul_forward_bf16, /* already in the table's form: they can fail */
    .matmul_backward_bf16 = matmul_backward_bf16,
    .matmul_backward_bf16_bits = matmul_backward_bf16_bits,
    .matmul_forward_bf16_bits = matmul_forward_bf16_bits,
    .matmul_forward_gelu_bf16 = matmul_forward_gelu_bf16,
    .matmul_backward_gelu_bf16 = matmul_backward_gelu_bf16,
    .round_to_bf16 = cpu_round_to_bf16,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .layernorm_forward_bf16 = layernorm_forward_bf16, /* in the table's form: they can fail */
    .rmsnorm_forward_bf16 = rmsnorm_forward_bf16,
    .swiglu_forward_bf16 = swiglu_forward_bf16,
    .swiglu_backward_bf16 = swiglu_backward_bf16,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .rope_forward_bf16 = rope_forward_bf16, /* in the table's form: they can fail */
    .rope_backward_bf16 = rope_backward_bf16,
    .residual_forward = cpu_residual_forward,
    .bias_residual_forward = cpu_bias_residual_forward,
    .residual_layernorm_forward = cpu_residual_layernorm_forward,
    .residual_rmsnorm_forward = cpu_residual_rmsnorm_forward,
    .residual_layernorm_forward_bf16 = residual_layernorm_forward_bf16, /* in the table's form: they can fail */
    .residual_rmsnorm_forward_bf16 = residual_rmsnorm_forward_bf16,
    .add_inplace = cpu_add_inplace,
    .scale_inplace = cpu_scale_inplace,
    .attention_forward = attention_forward, /* in the table's form: they can fail */
    .attention_backward = attention_backward,
    .attention_forward_bf16 = attention_forward_bf16,
    .attention_backward_bf16 = attention_backward_bf16,
    .describe_attention = cpu_describe_attention,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .crossentropy_row_stats = cpu_crossentropy_row_stats,
    .crossentropy_rescale_sum = cpu_crossentropy_rescale_sum,
    .crossentropy_target_logit = cpu_crossentropy_target_logit,
    .crossentropy_backward = cpu_crossentropy_backward,
    .crossentropy_row_stats_bf16 = cpu_crossentropy_row_stats_bf16,
    .crossentropy_target_logit_bf16 = cpu_crossentropy_target_logit_bf16,
    .classifier_backward_bf16 = classifier_backward_bf16, /* in the table's form: it can fail */
    .adamw_update_tensors = cpu_adamw_update_tensors,
    .sum_of_squares = cpu_sum_of_squares,
};

const kernel_backend *kernels_cpu(void)
{
    return &cpu_backend;
}
