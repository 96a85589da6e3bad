/* encoded_backend.c: see encoded_backend.h. Each operation decodes the
 * bytes its arguments span (each pointer with the extent the operation's
 * shapes give it, kernels.h), runs the CPU function, and encodes them
 * again; the rest of every allocation stays encoded meanwhile, so an
 * operation that reached past its arguments' extents reads garbage. */
#include "encoded_backend.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"

#define KEY 0x5A
#define MAX_ALLOCATIONS 4096
#define MAX_TOUCHED 12 /* arguments of one operation */

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

/* A span of an operation's argument: pointer and bytes. */
typedef struct {
    const unsigned char *p;
    size_t bytes;
} span;

static int by_start(const void *a, const void *b)
{
    const unsigned char *x = ((const span *)a)->p, *y = ((const span *)b)->p;
    return x < y ? -1 : x > y;
}

/* Decodes (or encodes) the union of the spans that lie in allocations
 * (each clipped to its allocation; host memory and NULL left alone):
 * arguments that overlap, an operation in place, are flipped once. */
static void flip_spans(const span *spans, int count)
{
    span in[MAX_TOUCHED];
    int n = 0;
    for (int k = 0; k < count; k++) {
        int i = find(spans[k].p);
        if (i < 0 || spans[k].bytes == 0) continue;
        if (n == MAX_TOUCHED) abort(); /* more arguments in one call than this test backend tracks */
        const unsigned char *end = allocations[i].base + allocations[i].size;
        size_t room = (size_t)(end - spans[k].p);
        in[n++] = (span){spans[k].p, spans[k].bytes < room ? spans[k].bytes : room};
    }
    qsort(in, (size_t)n, sizeof *in, by_start);
    for (int k = 0; k < n;) {
        const unsigned char *start = in[k].p, *end = in[k].p + in[k].bytes;
        for (k++; k < n && in[k].p <= end; k++)
            if (in[k].p + in[k].bytes > end) end = in[k].p + in[k].bytes;
        flip((unsigned char *)start, (size_t)(end - start));
    }
}

/* S(pointer, elements): an argument's span. */
#define S(pointer, elements) ((span){(const unsigned char *)(pointer), (size_t)(elements) * sizeof *(pointer)})
#define ENTER(...)                                                    \
    const span touched_[] = {__VA_ARGS__};                             \
    int touched_count_ = (int)(sizeof touched_ / sizeof touched_[0]); \
    pthread_mutex_lock(&lock);                                        \
    flip_spans(touched_, touched_count_)
#define UNTOUCH()                         \
    flip_spans(touched_, touched_count_); \
    pthread_mutex_unlock(&lock)
#define LEAVE_WITH(status) \
    UNTOUCH();             \
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
    pthread_mutex_lock(&lock);
    memset(memory, KEY, bytes);
    pthread_mutex_unlock(&lock);
    return TP_OK;
}

/* The copies and zeroing under the lock too: an operation on another thread
 * decodes its arguments in place meanwhile (a checkpoint's snapshot is
 * copied while the next step computes). */
static int enc_to_device(void *device_dst, const void *host_src, size_t bytes)
{
    unsigned char *d = device_dst;
    const unsigned char *h = host_src;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < bytes; i++) d[i] = h[i] ^ KEY;
    pthread_mutex_unlock(&lock);
    return TP_OK;
}

static int enc_to_host(void *host_dst, const void *device_src, size_t bytes)
{
    return enc_to_device(host_dst, device_src, bytes); /* XOR both ways */
}

/* Every operation is done when it returns: no mark. */
static int enc_mark_work(void **mark)
{
    *mark = NULL;
    return TP_OK;
}

static int enc_to_host_background(const void *mark, const host_copy *copies, int count)
{
    (void)mark;
    for (int i = 0; i < count; i++) enc_to_host(copies[i].host_dst, copies[i].device_src, copies[i].bytes);
    return TP_OK;
}

static void enc_release_mark(void *mark)
{
    (void)mark;
}

static int enc_copy(void *dst, const void *src, size_t bytes)
{
    if (copy_ranges_overlap(dst, src, bytes)) /* refused as by every backend (kernels.h) */
        return tp_fail(TP_ERR_ARG, "copy of %zu bytes between overlapping ranges (%p to %p)", bytes, src, dst);
    pthread_mutex_lock(&lock);
    memmove(dst, src, bytes); /* encoded to encoded */
    pthread_mutex_unlock(&lock);
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
    ENTER(S(out, N * OC), S(in, N * C), S(weight, OC * C), S(bias, OC));
    matmul_forward(out, in, weight, bias, N, C, OC);
    LEAVE();
}

static int enc_matmul_backward(float *d_in, float *d_weight, float *d_bias, const float *d_out, const float *in,
                               const float *weight, int64_t N, int64_t C, int64_t OC)
{
    ENTER(S(d_in, N * C), S(d_weight, OC * C), S(d_bias, OC), S(d_out, N * OC), S(in, N * C), S(weight, OC * C));
    matmul_backward(d_in, d_weight, d_bias, d_out, in, weight, N, C, OC);
    LEAVE();
}

static int enc_matmul_forward_bf16(float *out, const uint16_t *in, const uint16_t *weight, const float *bias, int64_t N,
                                   int64_t C, int64_t OC)
{
    ENTER(S(out, N * OC), S(in, N * C), S(weight, OC * C), S(bias, OC));
    int status = matmul_forward_bf16(out, in, weight, bias, N, C, OC);
    LEAVE_WITH(status);
}

static int enc_matmul_backward_bf16(float *d_in, float *d_weight, float *d_bias, const uint16_t *d_out,
                                    const uint16_t *in, const uint16_t *weight, int64_t N, int64_t C, int64_t OC)
{
    ENTER(S(d_in, N * C), S(d_weight, OC * C), S(d_bias, OC), S(d_out, N * OC), S(in, N * C), S(weight, OC * C));
    int status = matmul_backward_bf16(d_in, d_weight, d_bias, d_out, in, weight, N, C, OC);
    LEAVE_WITH(status);
}

static int enc_matmul_backward_bf16_bits(uint16_t *d_in, float *d_weight, float *d_bias, const uint16_t *d_out,
                                         const uint16_t *in, const uint16_t *weight, int64_t N, int64_t C, int64_t OC)
{
    ENTER(S(d_in, N * C), S(d_weight, OC * C), S(d_bias, OC), S(d_out, N * OC), S(in, N * C), S(weight, OC * C));
    int status = matmul_backward_bf16_bits(d_in, d_weight, d_bias, d_out, in, weight, N, C, OC);
    LEAVE_WITH(status);
}

static int enc_matmul_forward_bf16_bits(uint16_t *out, const uint16_t *in, const uint16_t *weight, const float *bias,
                                        int64_t N, int64_t C, int64_t OC)
{
    ENTER(S(out, N * OC), S(in, N * C), S(weight, OC * C), S(bias, OC));
    int status = matmul_forward_bf16_bits(out, in, weight, bias, N, C, OC);
    LEAVE_WITH(status);
}

static int enc_matmul_forward_gelu_bf16(uint16_t *out, uint16_t *pre, const uint16_t *in, const uint16_t *weight,
                                        const float *bias, int64_t N, int64_t C, int64_t OC)
{
    ENTER(S(out, N * OC), S(pre, N * OC), S(in, N * C), S(weight, OC * C), S(bias, OC));
    int status = matmul_forward_gelu_bf16(out, pre, in, weight, bias, N, C, OC);
    LEAVE_WITH(status);
}

static int enc_matmul_backward_gelu_bf16(uint16_t *d_pre, float *d_weight, float *d_bias, const uint16_t *d_out,
                                         const uint16_t *in, const uint16_t *weight, const uint16_t *pre, int64_t N,
                                         int64_t C, int64_t OC)
{
    ENTER(S(d_pre, N * C), S(d_weight, OC * C), S(d_bias, OC), S(d_out, N * OC), S(in, N * C), S(weight, OC * C),
          S(pre, N * C));
    int status = matmul_backward_gelu_bf16(d_pre, d_weight, d_bias, d_out, in, weight, pre, N, C, OC);
    LEAVE_WITH(status);
}

static int enc_layernorm_forward(float *out, float *mean, float *rstd, const float *in, const float *weight,
                                 const float *bias, int64_t N, int64_t C)
{
    ENTER(S(out, N * C), S(mean, N), S(rstd, N), S(in, N * C), S(weight, C), S(bias, C));
    layernorm_forward(out, mean, rstd, in, weight, bias, N, C);
    LEAVE();
}

static int enc_layernorm_backward(float *d_in, uint16_t *d_in_bits, float *d_weight, float *d_bias, const float *d_out,
                                  const float *in, const float *weight, const float *mean, const float *rstd, int64_t N,
                                  int64_t C)
{
    ENTER(S(d_in, N * C), S(d_in_bits, N * C), S(d_weight, C), S(d_bias, C), S(d_out, N * C), S(in, N * C),
          S(weight, C), S(mean, N), S(rstd, N));
    layernorm_backward(d_in, d_in_bits, d_weight, d_bias, d_out, in, weight, mean, rstd, N, C);
    LEAVE();
}

static int enc_gelu_forward(float *out, const float *in, int64_t n)
{
    ENTER(S(out, n), S(in, n));
    gelu_forward(out, in, n);
    LEAVE();
}

static int enc_layernorm_forward_bf16(uint16_t *out, float *mean, float *rstd, const float *in, const float *weight,
                                      const float *bias, int64_t N, int64_t C)
{
    ENTER(S(out, N * C), S(mean, N), S(rstd, N), S(in, N * C), S(weight, C), S(bias, C));
    int status = layernorm_forward_bf16(out, mean, rstd, in, weight, bias, N, C);
    LEAVE_WITH(status);
}

static int enc_round_to_bf16(uint16_t *out, const float *x, int64_t n)
{
    ENTER(S(out, n), S(x, n));
    round_to_bf16(out, x, n);
    LEAVE();
}

static int enc_gelu_backward(float *d_in, const float *in, const float *d_out, int64_t n)
{
    ENTER(S(d_in, n), S(in, n), S(d_out, n));
    gelu_backward(d_in, in, d_out, n);
    LEAVE();
}

/* Llama's operations: RMSNorm, SwiGLU (in [N, 2F]: gate and up), RoPE on
 * qkv [B*T, (Hq + 2 Hkv) hd] with cos_sin [T, hd/2, 2]. */
static int enc_rmsnorm_forward(float *out, float *rstd, const float *in, const float *weight, int64_t N, int64_t C,
                               float eps)
{
    ENTER(S(out, N * C), S(rstd, N), S(in, N * C), S(weight, C));
    rmsnorm_forward(out, rstd, in, weight, N, C, eps);
    LEAVE();
}

static int enc_rmsnorm_backward(float *d_in, uint16_t *d_in_bits, float *d_weight, const float *d_out,
                                const float *in, const float *weight, const float *rstd, int64_t N, int64_t C)
{
    ENTER(S(d_in, N * C), S(d_in_bits, N * C), S(d_weight, C), S(d_out, N * C), S(in, N * C), S(weight, C),
          S(rstd, N));
    rmsnorm_backward(d_in, d_in_bits, d_weight, d_out, in, weight, rstd, N, C);
    LEAVE();
}

static int enc_rmsnorm_forward_bf16(uint16_t *out, float *rstd, const float *in, const float *weight, int64_t N,
                                    int64_t C, float eps)
{
    ENTER(S(out, N * C), S(rstd, N), S(in, N * C), S(weight, C));
    int status = rmsnorm_forward_bf16(out, rstd, in, weight, N, C, eps);
    LEAVE_WITH(status);
}

static int enc_swiglu_forward(float *out, const float *in, int64_t N, int64_t F)
{
    ENTER(S(out, N * F), S(in, N * 2 * F));
    swiglu_forward(out, in, N, F);
    LEAVE();
}

static int enc_swiglu_backward(float *d_in, const float *in, const float *d_out, int64_t N, int64_t F)
{
    ENTER(S(d_in, N * 2 * F), S(in, N * 2 * F), S(d_out, N * F));
    swiglu_backward(d_in, in, d_out, N, F);
    LEAVE();
}

static int enc_swiglu_forward_bf16(uint16_t *out, const uint16_t *in, int64_t N, int64_t F)
{
    ENTER(S(out, N * F), S(in, N * 2 * F));
    int status = swiglu_forward_bf16(out, in, N, F);
    LEAVE_WITH(status);
}

static int enc_swiglu_backward_bf16(uint16_t *d_in, const uint16_t *in, const uint16_t *d_out, int64_t N, int64_t F)
{
    ENTER(S(d_in, N * 2 * F), S(in, N * 2 * F), S(d_out, N * F));
    int status = swiglu_backward_bf16(d_in, in, d_out, N, F);
    LEAVE_WITH(status);
}

static int enc_rope_forward(float *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                            int64_t hd)
{
    ENTER(S(qkv, B * T * (Hq + 2 * Hkv) * hd), S(cos_sin, T * hd));
    rope_forward(qkv, cos_sin, B, T, Hq, Hkv, hd);
    LEAVE();
}

static int enc_rope_backward(float *d_qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                             int64_t hd)
{
    ENTER(S(d_qkv, B * T * (Hq + 2 * Hkv) * hd), S(cos_sin, T * hd));
    rope_backward(d_qkv, cos_sin, B, T, Hq, Hkv, hd);
    LEAVE();
}

static int enc_rope_forward_bf16(uint16_t *out, const float *qkv, const float *cos_sin, int64_t B, int64_t T,
                                 int64_t Hq, int64_t Hkv, int64_t hd)
{
    ENTER(S(out, B * T * (Hq + 2 * Hkv) * hd), S(qkv, B * T * (Hq + 2 * Hkv) * hd), S(cos_sin, T * hd));
    int status = rope_forward_bf16(out, qkv, cos_sin, B, T, Hq, Hkv, hd);
    LEAVE_WITH(status);
}

static int enc_rope_backward_bf16(uint16_t *d_qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq,
                                  int64_t Hkv, int64_t hd)
{
    ENTER(S(d_qkv, B * T * (Hq + 2 * Hkv) * hd), S(cos_sin, T * hd));
    int status = rope_backward_bf16(d_qkv, cos_sin, B, T, Hq, Hkv, hd);
    LEAVE_WITH(status);
}

static int enc_residual_forward(float *out, const float *a, const float *b, int64_t n)
{
    ENTER(S(out, n), S(a, n), S(b, n));
    residual_forward(out, a, b, n);
    LEAVE();
}

static int enc_bias_residual_forward(float *out, const float *x, const float *partial, const float *bias, int64_t N,
                                     int64_t C)
{
    ENTER(S(out, N * C), S(x, N * C), S(partial, N * C), S(bias, C));
    bias_residual_forward(out, x, partial, bias, N, C);
    LEAVE();
}

static int enc_residual_layernorm_forward(float *out, float *mean, float *rstd, float *sum, const float *x,
                                          const float *partial, const float *residual_bias, const float *weight,
                                          const float *bias, int64_t N, int64_t C)
{
    ENTER(S(out, N * C), S(mean, N), S(rstd, N), S(sum, N * C), S(x, N * C), S(partial, N * C), S(residual_bias, C),
          S(weight, C), S(bias, C));
    residual_layernorm_forward(out, mean, rstd, sum, x, partial, residual_bias, weight, bias, N, C);
    LEAVE();
}

static int enc_residual_rmsnorm_forward(float *out, float *rstd, float *sum, const float *x, const float *partial,
                                        const float *residual_bias, const float *weight, int64_t N, int64_t C,
                                        float eps)
{
    ENTER(S(out, N * C), S(rstd, N), S(sum, N * C), S(x, N * C), S(partial, N * C), S(residual_bias, C),
          S(weight, C));
    residual_rmsnorm_forward(out, rstd, sum, x, partial, residual_bias, weight, N, C, eps);
    LEAVE();
}

static int enc_residual_layernorm_forward_bf16(uint16_t *out, float *mean, float *rstd, float *sum, const float *x,
                                               const float *partial, const float *residual_bias,
                                               const float *weight, const float *bias, int64_t N, int64_t C)
{
    ENTER(S(out, N * C), S(mean, N), S(rstd, N), S(sum, N * C), S(x, N * C), S(partial, N * C), S(residual_bias, C),
          S(weight, C), S(bias, C));
    int status = residual_layernorm_forward_bf16(out, mean, rstd, sum, x, partial, residual_bias, weight, bias, N, C);
    LEAVE_WITH(status);
}

static int enc_residual_rmsnorm_forward_bf16(uint16_t *out, float *rstd, float *sum, const float *x,
                                             const float *partial, const float *residual_bias, const float *weight,
                                             int64_t N, int64_t C, float eps)
{
    ENTER(S(out, N * C), S(rstd, N), S(sum, N * C), S(x, N * C), S(partial, N * C), S(residual_bias, C),
          S(weight, C));
    int status = residual_rmsnorm_forward_bf16(out, rstd, sum, x, partial, residual_bias, weight, N, C, eps);
    LEAVE_WITH(status);
}

static int enc_add_inplace(float *acc, const float *x, int64_t n)
{
    ENTER(S(acc, n), S(x, n));
    add_inplace(acc, x, n);
    LEAVE();
}

static int enc_scale_inplace(float *x, float scale, int64_t n)
{
    ENTER(S(x, n));
    scale_inplace(x, scale, n);
    LEAVE();
}

/* The attention's arguments (the fp32 operations' and their bf16 twins':
 * the same extents, S sizing out and qkv by their type). */
#define ATTENTION_FORWARD_SPANS                                                                                        \
    S(out, B * T * Hq * hd), S(lse, B * Hq * T), S(scratch, attention_scratch_floats(B, T, Hq)),                       \
        S(qkv, B * T * (Hq + 2 * Hkv) * hd)
#define ATTENTION_BACKWARD_SPANS                                                                                       \
    S(d_qkv, B * T * (Hq + 2 * Hkv) * hd), S(scratch, attention_scratch_floats(B, T, Hq)), S(d_out, B * T * Hq * hd), \
        S(qkv, B * T * (Hq + 2 * Hkv) * hd), S(out, B * T * Hq * hd), S(lse, B * Hq * T)

static int enc_attention_forward(float *out, float *lse, float *scratch, const float *qkv, int64_t B, int64_t T,
                                 int64_t Hq, int64_t Hkv, int64_t hd)
{
    ENTER(ATTENTION_FORWARD_SPANS);
    int status = attention_forward(out, lse, scratch, qkv, B, T, Hq, Hkv, hd);
    LEAVE_WITH(status);
}

static int enc_attention_backward(float *d_qkv, float *scratch, const float *d_out, const float *qkv,
                                  const float *out, const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                                  int64_t hd)
{
    ENTER(ATTENTION_BACKWARD_SPANS);
    int status = attention_backward(d_qkv, scratch, d_out, qkv, out, lse, B, T, Hq, Hkv, hd);
    LEAVE_WITH(status);
}

static int enc_attention_forward_bf16(uint16_t *out, float *lse, float *scratch, const uint16_t *qkv, int64_t B,
                                      int64_t T, int64_t Hq, int64_t Hkv, int64_t hd)
{
    ENTER(ATTENTION_FORWARD_SPANS);
    int status = attention_forward_bf16(out, lse, scratch, qkv, B, T, Hq, Hkv, hd);
    LEAVE_WITH(status);
}

static int enc_attention_backward_bf16(uint16_t *d_qkv, float *scratch, const uint16_t *d_out, const uint16_t *qkv,
                                       const uint16_t *out, const float *lse, int64_t B, int64_t T, int64_t Hq,
                                       int64_t Hkv, int64_t hd)
{
    ENTER(ATTENTION_BACKWARD_SPANS);
    int status = attention_backward_bf16(d_qkv, scratch, d_out, qkv, out, lse, B, T, Hq, Hkv, hd);
    LEAVE_WITH(status);
}

static void enc_describe_attention(int bf16, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd, char *text,
                                   size_t size)
{
    kernels_cpu()->describe_attention(bf16, B, T, Hq, Hkv, hd, text, size);
}

static int enc_embedding_forward(float *out, const int *tokens, const float *table, int64_t N, int64_t C,
                                 int64_t first, int64_t rows)
{
    ENTER(S(out, N * C), S(tokens, N), S(table, rows * C));
    embedding_forward(out, tokens, table, N, C, first, rows);
    LEAVE();
}

static int enc_embedding_backward(float *d_table, const int *tokens, const float *d_out, int64_t N, int64_t C,
                                  int64_t first, int64_t rows)
{
    ENTER(S(d_table, rows * C), S(tokens, N), S(d_out, N * C));
    embedding_backward(d_table, tokens, d_out, N, C, first, rows);
    LEAVE();
}

static int enc_crossentropy_row_stats(float *row_max, float *sum, const float *logits, int64_t N, int64_t V,
                                      int64_t first, int64_t vocab)
{
    ENTER(S(row_max, N), S(sum, N), S(logits, N * V));
    crossentropy_row_stats(row_max, sum, logits, N, V, first, vocab);
    LEAVE();
}

static int enc_crossentropy_rescale_sum(float *sum, const float *local_max, const float *global_max, int64_t N)
{
    ENTER(S(sum, N), S(local_max, N), S(global_max, N));
    crossentropy_rescale_sum(sum, local_max, global_max, N);
    LEAVE();
}

static int enc_crossentropy_target_logit(float *target, const float *logits, const int *targets, int64_t N,
                                         int64_t V, int64_t first)
{
    ENTER(S(target, N), S(logits, N * V), S(targets, N));
    crossentropy_target_logit(target, logits, targets, N, V, first);
    LEAVE();
}

static int enc_crossentropy_backward(float *d_logits, const float *logits, const float *row_max, const float *sum,
                                     const int *targets, int64_t N, int64_t V, int64_t first, int64_t vocab,
                                     float scale)
{
    ENTER(S(d_logits, N * V), S(logits, N * V), S(row_max, N), S(sum, N), S(targets, N));
    crossentropy_backward(d_logits, logits, row_max, sum, targets, N, V, first, vocab, scale);
    LEAVE();
}

static int enc_crossentropy_row_stats_bf16(float *row_max, float *sum, const uint16_t *logits, int64_t N, int64_t V,
                                           int64_t first, int64_t vocab)
{
    ENTER(S(row_max, N), S(sum, N), S(logits, N * V));
    crossentropy_row_stats_bf16(row_max, sum, logits, N, V, first, vocab);
    LEAVE();
}

static int enc_crossentropy_target_logit_bf16(float *target, const uint16_t *logits, const int *targets, int64_t N,
                                              int64_t V, int64_t first)
{
    ENTER(S(target, N), S(logits, N * V), S(targets, N));
    crossentropy_target_logit_bf16(target, logits, targets, N, V, first);
    LEAVE();
}

static int enc_classifier_backward_bf16(float *d_in, float *d_weight, uint16_t *logits, const float *row_max,
                                        const float *sum, const int *targets, const uint16_t *in,
                                        const uint16_t *weight, int64_t N, int64_t C, int64_t V, int64_t first,
                                        int64_t vocab, float scale)
{
    ENTER(S(d_in, N * C), S(d_weight, V * C), S(logits, N * V), S(row_max, N), S(sum, N), S(targets, N),
          S(in, N * C), S(weight, V * C));
    int status = classifier_backward_bf16(d_in, d_weight, logits, row_max, sum, targets, in, weight, N, C, V, first,
                                          vocab, scale);
    LEAVE_WITH(status);
}

/* A tensor at a time (each its spans decoded, four or five), as adamw_update_tensors
 * computes each value alone: the same results as one call. */
static int enc_adamw_update_tensors(const adamw_tensor *tensors, int count, float lr, float beta1, float beta2,
                                    float eps, int64_t step)
{
    for (int t = 0; t < count; t++) {
        const adamw_tensor *x = &tensors[t];
        ENTER(S(x->param, x->n), S(x->grad, x->n), S(x->m, x->n), S(x->v, x->n),
              S(x->param_bits, x->param_bits ? x->n : 0));
        adamw_update_tensors(x, 1, lr, beta1, beta2, eps, step);
        UNTOUCH();
    }
    return TP_OK;
}

static int enc_sum_of_squares(double *out, const float *const *spans, const int64_t *lengths, int count)
{
    /* The gradients' spans may be many, in a few allocations: those are
     * flipped whole, once each (the sum in one call, as the CPU's). */
    int done[MAX_TOUCHED], n = 0;
    pthread_mutex_lock(&lock);
    for (int k = 0; k < count; k++) {
        int i = find(spans[k]), seen = 0;
        for (int j = 0; j < n; j++) seen |= done[j] == i;
        if (i < 0 || seen) continue;
        if (n == MAX_TOUCHED) abort(); /* more allocations in one call than this test backend tracks */
        done[n++] = i;
    }
    for (int j = 0; j < n; j++) flip(allocations[done[j]].base, allocations[done[j]].size);
    *out = sum_of_squares(spans, lengths, count);
    for (int j = 0; j < n; j++) flip(allocations[done[j]].base, allocations[done[j]].size);
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
    .mark_work = enc_mark_work,
    .to_host_background = enc_to_host_background,
    .release_mark = enc_release_mark,
    .matmul_forward = enc_matmul_forward,
    .matmul_backward = enc_matmul_backward,
    .matmul_forward_bf16 = enc_matmul_forward_bf16,
    .matmul_backward_bf16 = enc_matmul_backward_bf16,
    .matmul_backward_bf16_bits = enc_matmul_backward_bf16_bits,
    .matmul_forward_bf16_bits = enc_matmul_forward_bf16_bits,
    .matmul_forward_gelu_bf16 = enc_matmul_forward_gelu_bf16,
    .matmul_backward_gelu_bf16 = enc_matmul_backward_gelu_bf16,
    .round_to_bf16 = enc_round_to_bf16,
    .layernorm_forward = enc_layernorm_forward,
    .layernorm_backward = enc_layernorm_backward,
    .gelu_forward = enc_gelu_forward,
    .gelu_backward = enc_gelu_backward,
    .layernorm_forward_bf16 = enc_layernorm_forward_bf16,
    .rmsnorm_forward = enc_rmsnorm_forward,
    .rmsnorm_backward = enc_rmsnorm_backward,
    .rmsnorm_forward_bf16 = enc_rmsnorm_forward_bf16,
    .swiglu_forward = enc_swiglu_forward,
    .swiglu_backward = enc_swiglu_backward,
    .swiglu_forward_bf16 = enc_swiglu_forward_bf16,
    .swiglu_backward_bf16 = enc_swiglu_backward_bf16,
    .rope_forward = enc_rope_forward,
    .rope_backward = enc_rope_backward,
    .rope_forward_bf16 = enc_rope_forward_bf16,
    .rope_backward_bf16 = enc_rope_backward_bf16,
    .residual_forward = enc_residual_forward,
    .bias_residual_forward = enc_bias_residual_forward,
    .residual_layernorm_forward = enc_residual_layernorm_forward,
    .residual_rmsnorm_forward = enc_residual_rmsnorm_forward,
    .residual_layernorm_forward_bf16 = enc_residual_layernorm_forward_bf16,
    .residual_rmsnorm_forward_bf16 = enc_residual_rmsnorm_forward_bf16,
    .add_inplace = enc_add_inplace,
    .scale_inplace = enc_scale_inplace,
    .attention_forward = enc_attention_forward,
    .attention_backward = enc_attention_backward,
    .attention_forward_bf16 = enc_attention_forward_bf16,
    .attention_backward_bf16 = enc_attention_backward_bf16,
    .describe_attention = enc_describe_attention,
    .embedding_forward = enc_embedding_forward,
    .embedding_backward = enc_embedding_backward,
    .crossentropy_row_stats = enc_crossentropy_row_stats,
    .crossentropy_rescale_sum = enc_crossentropy_rescale_sum,
    .crossentropy_target_logit = enc_crossentropy_target_logit,
    .crossentropy_backward = enc_crossentropy_backward,
    .crossentropy_row_stats_bf16 = enc_crossentropy_row_stats_bf16,
    .crossentropy_target_logit_bf16 = enc_crossentropy_target_logit_bf16,
    .classifier_backward_bf16 = enc_classifier_backward_bf16,
    .adamw_update_tensors = enc_adamw_update_tensors,
    .sum_of_squares = enc_sum_of_squares,
};

const kernel_backend *encoded_backend(void)
{
    return &backend;
}
