/* encoded_backend.c: see encoded_backend.h. Each operation decodes the
 * allocations its pointer arguments fall in, runs the CPU function, and
 * encodes them again. */
#include "encoded_backend.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"

#define KEY 0x5A
#define MAX_ALLOCATIONS 4096
#define MAX_TOUCHED 12

typedef struct {
    unsigned char *base;
    size_t size;
} allocation;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static allocation allocations[MAX_ALLOCATIONS];
static int num_allocations;

/* Every byte of p[0, n) XOR KEY; eight at a time (the test trainer flips
 * its whole buffers at every operation: byte by byte it took most of
 * test_train's time). */
static void flip(unsigned char *p, size_t n)
{
    const uint64_t key8 = 0x0101010101010101ull * KEY;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t word;
        memcpy(&word, p + i, sizeof word);
        word ^= key8;
        memcpy(p + i, &word, sizeof word);
    }
    for (; i < n; i++) p[i] ^= KEY;
}

/* The allocation holding p, or -1 (host memory, NULL). */
static int find(const void *p)
{
    const unsigned char *q = p;
    for (int i = 0; q && i < num_allocations; i++)
        if (q >= allocations[i].base && q < allocations[i].base + allocations[i].size) return i;
    return -1;
}

/* Decodes (or encodes) each distinct allocation touched by the pointers. */
static void flip_touched(const void *const *pointers, int count)
{
    int done[MAX_TOUCHED], n = 0;
    for (int k = 0; k < count; k++) {
        int i = find(pointers[k]), seen = 0;
        if (i < 0) continue;
        for (int j = 0; j < n; j++) seen |= done[j] == i;
        if (seen) continue;
        if (n == MAX_TOUCHED) abort(); /* more distinct allocations in one call than this test backend tracks */
        done[n++] = i;
        flip(allocations[i].base, allocations[i].size);
    }
}

#define ENTER(...)                                                    \
    const void *const touched_[] = {__VA_ARGS__};                      \
    int touched_count_ = (int)(sizeof touched_ / sizeof touched_[0]); \
    pthread_mutex_lock(&lock);                                        \
    flip_touched(touched_, touched_count_)
#define LEAVE_WITH(status)                     \
    flip_touched(touched_, touched_count_);    \
    pthread_mutex_unlock(&lock);               \
    return (status)
#define LEAVE() LEAVE_WITH(TP_OK)

static int enc_alloc(void **out, size_t bytes)
{
    *out = NULL;
    unsigned char *p = malloc(bytes ? bytes : 1);
    if (!p) return tp_fail(TP_ERR_NOMEM, "out of memory (%zu bytes)", bytes);
    memset(p, KEY, bytes); /* encoded zeros */
    pthread_mutex_lock(&lock);
    int full = num_allocations == MAX_ALLOCATIONS;
    if (!full) allocations[num_allocations++] = (allocation){p, bytes};
    pthread_mutex_unlock(&lock);
    if (full) {
        free(p);
        return tp_fail(TP_ERR_NOMEM, "encoded backend: more than %d allocations", MAX_ALLOCATIONS);
    }
    *out = p;
    return TP_OK;
}

static void enc_release(void *memory)
{
    if (!memory) return;
    pthread_mutex_lock(&lock);
    int i = find(memory);
    if (i >= 0) allocations[i] = allocations[--num_allocations];
    pthread_mutex_unlock(&lock);
    free(memory);
}

size_t encoded_backend_live_bytes(void)
{
    size_t bytes = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < num_allocations; i++) bytes += allocations[i].size;
    pthread_mutex_unlock(&lock);
    return bytes;
}

static int enc_zero(void *memory, size_t bytes)
{
    memset(memory, KEY, bytes);
    return TP_OK;
}

static int enc_to_device(void *device_dst, const void *host_src, size_t bytes)
{
    unsigned char *d = device_dst;
    const unsigned char *h = host_src;
    for (size_t i = 0; i < bytes; i++) d[i] = h[i] ^ KEY;
    return TP_OK;
}

static int enc_to_host(void *host_dst, const void *device_src, size_t bytes)
{
    return enc_to_device(host_dst, device_src, bytes); /* XOR both ways */
}

static int enc_copy(void *dst, const void *src, size_t bytes)
{
    memmove(dst, src, bytes); /* encoded to encoded */
    return TP_OK;
}

static int enc_synchronize(void)
{
    return TP_OK;
}

static int enc_host_alloc(void **out, size_t bytes)
{
    *out = malloc(bytes ? bytes : 1); /* host memory: not registered, not encoded */
    return *out ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory (%zu bytes)", bytes);
}

static int enc_matmul_forward(float *out, const float *in, const float *weight, const float *bias, int64_t N,
                              int64_t C, int64_t OC)
{
    ENTER(out, in, weight, bias);
    matmul_forward(out, in, weight, bias, N, C, OC);
    LEAVE();
}

static int enc_matmul_backward(float *d_in, float *d_weight, float *d_bias, const float *d_out, const float *in,
                               const float *weight, int64_t N, int64_t C, int64_t OC)
{
    ENTER(d_in, d_weight, d_bias, d_out, in, weight);
    matmul_backward(d_in, d_weight, d_bias, d_out, in, weight, N, C, OC);
    LEAVE();
}

static int enc_matmul_forward_bf16(float *out, const float *in, const float *weight, const float *bias, int64_t N,
                                   int64_t C, int64_t OC)
{
    ENTER(out, in, weight, bias);
    int status = matmul_forward_bf16(out, in, weight, bias, N, C, OC);
    LEAVE_WITH(status);
}

static int enc_matmul_backward_bf16(float *d_in, float *d_weight, float *d_bias, const float *d_out, const float *in,
                                    const float *weight, int64_t N, int64_t C, int64_t OC)
{
    ENTER(d_in, d_weight, d_bias, d_out, in, weight);
    int status = matmul_backward_bf16(d_in, d_weight, d_bias, d_out, in, weight, N, C, OC);
    LEAVE_WITH(status);
}

static int enc_layernorm_forward(float *out, float *mean, float *rstd, const float *in, const float *weight,
                                 const float *bias, int64_t N, int64_t C)
{
    ENTER(out, mean, rstd, in, weight, bias);
    layernorm_forward(out, mean, rstd, in, weight, bias, N, C);
    LEAVE();
}

static int enc_layernorm_backward(float *d_in, float *d_weight, float *d_bias, const float *d_out, const float *in,
                                  const float *weight, const float *mean, const float *rstd, int64_t N, int64_t C)
{
    ENTER(d_in, d_weight, d_bias, d_out, in, weight, mean, rstd);
    layernorm_backward(d_in, d_weight, d_bias, d_out, in, weight, mean, rstd, N, C);
    LEAVE();
}

static int enc_gelu_forward(float *out, const float *in, int64_t n)
{
    ENTER(out, in);
    gelu_forward(out, in, n);
    LEAVE();
}

static int enc_gelu_backward(float *d_in, const float *in, const float *d_out, int64_t n)
{
    ENTER(d_in, in, d_out);
    gelu_backward(d_in, in, d_out, n);
    LEAVE();
}

static int enc_residual_forward(float *out, const float *a, const float *b, int64_t n)
{
    ENTER(out, a, b);
    residual_forward(out, a, b, n);
    LEAVE();
}

static int enc_bias_residual_forward(float *out, const float *x, const float *partial, const float *bias, int64_t N,
                                     int64_t C)
{
    ENTER(out, x, partial, bias);
    bias_residual_forward(out, x, partial, bias, N, C);
    LEAVE();
}

static int enc_add_inplace(float *acc, const float *x, int64_t n)
{
    ENTER(acc, x);
    add_inplace(acc, x, n);
    LEAVE();
}

static int enc_scale_inplace(float *x, float scale, int64_t n)
{
    ENTER(x);
    scale_inplace(x, scale, n);
    LEAVE();
}

static int enc_attention_forward(float *out, float *lse, float *scratch, const float *qkv, int64_t B, int64_t T,
                                 int64_t Hq, int64_t Hkv, int64_t hd)
{
    ENTER(out, lse, scratch, qkv);
    int status = attention_forward(out, lse, scratch, qkv, B, T, Hq, Hkv, hd);
    LEAVE_WITH(status);
}

static int enc_attention_backward(float *d_qkv, float *scratch, const float *d_out, const float *qkv,
                                  const float *out, const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                                  int64_t hd)
{
    ENTER(d_qkv, scratch, d_out, qkv, out, lse);
    int status = attention_backward(d_qkv, scratch, d_out, qkv, out, lse, B, T, Hq, Hkv, hd);
    LEAVE_WITH(status);
}

static int enc_embedding_forward(float *out, const int *tokens, const float *table, int64_t N, int64_t C,
                                 int64_t first, int64_t rows)
{
    ENTER(out, tokens, table);
    embedding_forward(out, tokens, table, N, C, first, rows);
    LEAVE();
}

static int enc_embedding_backward(float *d_table, const int *tokens, const float *d_out, int64_t N, int64_t C,
                                  int64_t first, int64_t rows)
{
    ENTER(d_table, tokens, d_out);
    embedding_backward(d_table, tokens, d_out, N, C, first, rows);
    LEAVE();
}

static int enc_crossentropy_row_max(float *row_max, const float *logits, int64_t N, int64_t V, int64_t first,
                                    int64_t vocab)
{
    ENTER(row_max, logits);
    crossentropy_row_max(row_max, logits, N, V, first, vocab);
    LEAVE();
}

static int enc_crossentropy_row_sumexp(float *sum, const float *logits, const float *row_max, int64_t N, int64_t V,
                                       int64_t first, int64_t vocab)
{
    ENTER(sum, logits, row_max);
    crossentropy_row_sumexp(sum, logits, row_max, N, V, first, vocab);
    LEAVE();
}

static int enc_crossentropy_target_logit(float *target, const float *logits, const int *targets, int64_t N,
                                         int64_t V, int64_t first)
{
    ENTER(target, logits, targets);
    crossentropy_target_logit(target, logits, targets, N, V, first);
    LEAVE();
}

static int enc_crossentropy_backward(float *d_logits, const float *logits, const float *row_max, const float *sum,
                                     const int *targets, int64_t N, int64_t V, int64_t first, int64_t vocab,
                                     float scale)
{
    ENTER(d_logits, logits, row_max, sum, targets);
    crossentropy_backward(d_logits, logits, row_max, sum, targets, N, V, first, vocab, scale);
    LEAVE();
}

static int enc_adamw_update(float *param, const float *grad, float *m, float *v, int64_t n, float lr, float beta1,
                            float beta2, float eps, float weight_decay, int64_t step)
{
    ENTER(param, grad, m, v);
    adamw_update(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
    LEAVE();
}

static int enc_sum_of_squares(double *out, const float *const *spans, const int64_t *lengths, int count)
{
    pthread_mutex_lock(&lock);
    flip_touched((const void *const *)spans, count);
    *out = sum_of_squares(spans, lengths, count);
    flip_touched((const void *const *)spans, count);
    pthread_mutex_unlock(&lock);
    return TP_OK;
}

static const kernel_backend backend = {
    .name = "encoded",
    .on_device = 1,
    .alloc = enc_alloc,
    .release = enc_release,
    .zero = enc_zero,
    .to_device = enc_to_device,
    .to_host = enc_to_host,
    .copy = enc_copy,
    .synchronize = enc_synchronize,
    .host_alloc = enc_host_alloc,
    .host_release = free,
    .to_host_background = enc_to_host,
    .matmul_forward = enc_matmul_forward,
    .matmul_backward = enc_matmul_backward,
    .matmul_forward_bf16 = enc_matmul_forward_bf16,
    .matmul_backward_bf16 = enc_matmul_backward_bf16,
    .layernorm_forward = enc_layernorm_forward,
    .layernorm_backward = enc_layernorm_backward,
    .gelu_forward = enc_gelu_forward,
    .gelu_backward = enc_gelu_backward,
    .residual_forward = enc_residual_forward,
    .bias_residual_forward = enc_bias_residual_forward,
    .add_inplace = enc_add_inplace,
    .scale_inplace = enc_scale_inplace,
    .attention_forward = enc_attention_forward,
    .attention_backward = enc_attention_backward,
    .embedding_forward = enc_embedding_forward,
    .embedding_backward = enc_embedding_backward,
    .crossentropy_row_max = enc_crossentropy_row_max,
    .crossentropy_row_sumexp = enc_crossentropy_row_sumexp,
    .crossentropy_target_logit = enc_crossentropy_target_logit,
    .crossentropy_backward = enc_crossentropy_backward,
    .adamw_update = enc_adamw_update,
    .sum_of_squares = enc_sum_of_squares,
};

const kernel_backend *encoded_backend(void)
{
    return &backend;
}
