/* timed.c: a kernel backend that times the operations of another
 * (kernels_timed, kernels.h): where a training step's time goes, operation
 * by operation, on a machine without a profiler that sees the host's side.
 *
 * Each call is timed on the host (its issue: a GPU's operations return once
 * their work is queued, unless they wait, as to_host does), then the inner
 * backend's synchronize is timed (the device's work of that call still
 * running: the queue was empty when the call began, so issue + wait bounds
 * its device time from above). What a step spends outside all calls is the
 * trainer's own host time (communication, bookkeeping). The waits take the
 * overlap of host and device away, so a timed step is slower than a plain
 * one: the figures say what each part costs, not the step's speed. */
#include <pthread.h>
#include <string.h>

#include "../common/clock.h"
#include "../common/error.h"
#include "kernels.h"

/* Every operation timed: its field in kernel_backend. */
#define TIMED_OPS(X)                                                                                                   \
    X(alloc) X(zero) X(to_device) X(to_host) X(copy) X(synchronize) X(host_alloc) X(to_host_background)                \
    X(matmul_forward) X(matmul_backward) X(matmul_forward_bf16) X(matmul_backward_bf16) X(matmul_forward_bf16_bits)    \
    X(round_to_bf16)                                                                                                   \
    X(matmul_backward_bf16_bits) X(gelu_backward_bf16) X(swiglu_backward_bf16) X(rope_backward_bf16)                   \
    X(layernorm_forward) X(layernorm_backward) X(gelu_forward) X(gelu_backward) X(rmsnorm_forward) X(rmsnorm_backward) \
    X(swiglu_forward) X(swiglu_backward) X(layernorm_forward_bf16) X(rmsnorm_forward_bf16) X(gelu_forward_bf16)        \
    X(swiglu_forward_bf16) X(rope_forward) X(rope_backward) X(rope_forward_bf16) X(residual_forward)                   \
    X(bias_residual_forward) X(add_inplace) X(scale_inplace) X(attention_forward) X(attention_backward)                \
    X(attention_forward_bf16) X(attention_backward_bf16) X(embedding_forward) X(embedding_backward)                    \
    X(crossentropy_row_stats) X(crossentropy_rescale_sum) X(crossentropy_target_logit) X(crossentropy_backward)        \
    X(classifier_backward_bf16) X(adamw_update_tensors) X(sum_of_squares)

#define OP_INDEX(op) OP_##op,
enum { TIMED_OPS(OP_INDEX) NUM_TIMED_OPS };
#define OP_NAME(op) #op,
static const char *const op_names[NUM_TIMED_OPS] = {TIMED_OPS(OP_NAME)};

static struct {
    const kernel_backend *inner;
    kernel_backend table;
    kernel_op_time times[NUM_TIMED_OPS];
} timed;
static pthread_mutex_t times_lock = PTHREAD_MUTEX_INITIALIZER;

/* The call's status, else the wait's; both times recorded. */
static int record(int op, double start, int status)
{
    double issued = now_seconds();
    int waited = status ? TP_OK : timed.inner->synchronize();
    double done = now_seconds();
    pthread_mutex_lock(&times_lock);
    timed.times[op].calls++;
    timed.times[op].issue_seconds += issued - start;
    timed.times[op].wait_seconds += done - issued;
    pthread_mutex_unlock(&times_lock);
    return status ? status : waited;
}

/* A wrapper per operation: PARAMS its parameter list, ARGS the call's arguments. */
#define WRAP(op, PARAMS, ARGS)                                                                                         \
    static int timed_##op PARAMS                                                                                       \
    {                                                                                                                  \
        double start = now_seconds();                                                                                  \
        return record(OP_##op, start, timed.inner->op ARGS);                                                          \
    }

WRAP(alloc, (void **out, size_t bytes), (out, bytes))
WRAP(zero, (void *memory, size_t bytes), (memory, bytes))
WRAP(to_device, (void *device_dst, const void *host_src, size_t bytes), (device_dst, host_src, bytes))
WRAP(to_host, (void *host_dst, const void *device_src, size_t bytes), (host_dst, device_src, bytes))
WRAP(copy, (void *dst, const void *src, size_t bytes), (dst, src, bytes))
WRAP(host_alloc, (void **out, size_t bytes), (out, bytes))
WRAP(to_host_background, (void *host_dst, const void *device_src, size_t bytes), (host_dst, device_src, bytes))
WRAP(matmul_forward, (float *out, const float *in, const float *weight, const float *bias, int64_t N, int64_t C, int64_t OC),
     (out, in, weight, bias, N, C, OC))
WRAP(matmul_backward,
     (float *d_in, float *d_weight, float *d_bias, const float *d_out, const float *in, const float *weight, int64_t N,
      int64_t C, int64_t OC),
     (d_in, d_weight, d_bias, d_out, in, weight, N, C, OC))
WRAP(matmul_forward_bf16,
     (float *out, const uint16_t *in, const uint16_t *weight, const float *bias, int64_t N, int64_t C, int64_t OC),
     (out, in, weight, bias, N, C, OC))
WRAP(matmul_backward_bf16,
     (float *d_in, float *d_weight, float *d_bias, const uint16_t *d_out, const uint16_t *in, const uint16_t *weight,
      int64_t N, int64_t C, int64_t OC),
     (d_in, d_weight, d_bias, d_out, in, weight, N, C, OC))
WRAP(matmul_backward_bf16_bits,
     (uint16_t *d_in, float *d_weight, float *d_bias, const float *d_out, const uint16_t *in, const uint16_t *weight,
      int64_t N, int64_t C, int64_t OC),
     (d_in, d_weight, d_bias, d_out, in, weight, N, C, OC))
WRAP(matmul_forward_bf16_bits,
     (uint16_t *out, const uint16_t *in, const uint16_t *weight, const float *bias, int64_t N, int64_t C, int64_t OC),
     (out, in, weight, bias, N, C, OC))
WRAP(round_to_bf16, (uint16_t *out, const float *x, int64_t n), (out, x, n))
WRAP(layernorm_forward,
     (float *out, float *mean, float *rstd, const float *in, const float *weight, const float *bias, int64_t N,
      int64_t C),
     (out, mean, rstd, in, weight, bias, N, C))
WRAP(layernorm_backward,
     (float *d_in, float *d_weight, float *d_bias, const float *d_out, const float *in, const float *weight,
      const float *mean, const float *rstd, int64_t N, int64_t C),
     (d_in, d_weight, d_bias, d_out, in, weight, mean, rstd, N, C))
WRAP(gelu_forward, (float *out, const float *in, int64_t n), (out, in, n))
WRAP(gelu_backward, (float *d_in, const float *in, const float *d_out, int64_t n), (d_in, in, d_out, n))
WRAP(rmsnorm_forward, (float *out, float *rstd, const float *in, const float *weight, int64_t N, int64_t C, float eps),
     (out, rstd, in, weight, N, C, eps))
WRAP(rmsnorm_backward,
     (float *d_in, float *d_weight, const float *d_out, const float *in, const float *weight, const float *rstd,
      int64_t N, int64_t C),
     (d_in, d_weight, d_out, in, weight, rstd, N, C))
WRAP(swiglu_forward, (float *out, const float *in, int64_t N, int64_t F), (out, in, N, F))
WRAP(swiglu_backward, (float *d_in, const float *in, const float *d_out, int64_t N, int64_t F), (d_in, in, d_out, N, F))
WRAP(layernorm_forward_bf16,
     (uint16_t *out, float *mean, float *rstd, const float *in, const float *weight, const float *bias, int64_t N,
      int64_t C),
     (out, mean, rstd, in, weight, bias, N, C))
WRAP(rmsnorm_forward_bf16,
     (uint16_t *out, float *rstd, const float *in, const float *weight, int64_t N, int64_t C, float eps),
     (out, rstd, in, weight, N, C, eps))
WRAP(gelu_forward_bf16, (uint16_t *out, const uint16_t *in, int64_t n), (out, in, n))
WRAP(swiglu_forward_bf16, (uint16_t *out, const uint16_t *in, int64_t N, int64_t F), (out, in, N, F))
WRAP(gelu_backward_bf16, (uint16_t *d_in, const uint16_t *in, const uint16_t *d_out, int64_t n), (d_in, in, d_out, n))
WRAP(swiglu_backward_bf16, (uint16_t *d_in, const uint16_t *in, const uint16_t *d_out, int64_t N, int64_t F),
     (d_in, in, d_out, N, F))
WRAP(rope_forward, (float *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd),
     (qkv, cos_sin, B, T, Hq, Hkv, hd))
WRAP(rope_backward, (float *d_qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd),
     (d_qkv, cos_sin, B, T, Hq, Hkv, hd))
WRAP(rope_forward_bf16,
     (uint16_t *out, const float *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
      int64_t hd),
     (out, qkv, cos_sin, B, T, Hq, Hkv, hd))
WRAP(rope_backward_bf16,
     (uint16_t *d_qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd),
     (d_qkv, cos_sin, B, T, Hq, Hkv, hd))
WRAP(residual_forward, (float *out, const float *a, const float *b, int64_t n), (out, a, b, n))
WRAP(bias_residual_forward, (float *out, const float *x, const float *partial, const float *bias, int64_t N, int64_t C),
     (out, x, partial, bias, N, C))
WRAP(add_inplace, (float *acc, const float *x, int64_t n), (acc, x, n))
WRAP(scale_inplace, (float *x, float scale, int64_t n), (x, scale, n))
WRAP(attention_forward,
     (float *out, float *lse, float *scratch, const float *qkv, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
      int64_t hd),
     (out, lse, scratch, qkv, B, T, Hq, Hkv, hd))
WRAP(attention_backward,
     (float *d_qkv, float *scratch, const float *d_out, const float *qkv, const float *out, const float *lse, int64_t B,
      int64_t T, int64_t Hq, int64_t Hkv, int64_t hd),
     (d_qkv, scratch, d_out, qkv, out, lse, B, T, Hq, Hkv, hd))
WRAP(attention_forward_bf16,
     (uint16_t *out, float *lse, float *scratch, const uint16_t *qkv, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
      int64_t hd),
     (out, lse, scratch, qkv, B, T, Hq, Hkv, hd))
WRAP(attention_backward_bf16,
     (uint16_t *d_qkv, float *scratch, const uint16_t *d_out, const uint16_t *qkv, const uint16_t *out,
      const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd),
     (d_qkv, scratch, d_out, qkv, out, lse, B, T, Hq, Hkv, hd))
WRAP(embedding_forward,
     (float *out, const int *tokens, const float *table, int64_t N, int64_t C, int64_t first, int64_t rows),
     (out, tokens, table, N, C, first, rows))
WRAP(embedding_backward,
     (float *d_table, const int *tokens, const float *d_out, int64_t N, int64_t C, int64_t first, int64_t rows),
     (d_table, tokens, d_out, N, C, first, rows))
WRAP(crossentropy_row_stats,
     (float *row_max, float *sum, const float *logits, int64_t N, int64_t V, int64_t first, int64_t vocab),
     (row_max, sum, logits, N, V, first, vocab))
WRAP(crossentropy_rescale_sum, (float *sum, const float *local_max, const float *global_max, int64_t N),
     (sum, local_max, global_max, N))
WRAP(crossentropy_target_logit,
     (float *target, const float *logits, const int *targets, int64_t N, int64_t V, int64_t first),
     (target, logits, targets, N, V, first))
WRAP(crossentropy_backward,
     (float *d_logits, const float *logits, const float *row_max, const float *sum, const int *targets, int64_t N,
      int64_t V, int64_t first, int64_t vocab, float scale),
     (d_logits, logits, row_max, sum, targets, N, V, first, vocab, scale))
WRAP(classifier_backward_bf16,
     (float *d_in, float *d_weight, float *scratch, const float *logits, const float *row_max, const float *sum,
      const int *targets, const uint16_t *in, const uint16_t *weight, int64_t N, int64_t C, int64_t V, int64_t first,
      int64_t vocab, float scale),
     (d_in, d_weight, scratch, logits, row_max, sum, targets, in, weight, N, C, V, first, vocab, scale))
WRAP(adamw_update_tensors,
     (const adamw_tensor *tensors, int count, float lr, float beta1, float beta2, float eps, int64_t step),
     (tensors, count, lr, beta1, beta2, eps, step))
WRAP(sum_of_squares, (double *out, const float *const *spans, const int64_t *lengths, int count),
     (out, spans, lengths, count))

/* synchronize is its own wait: all of it counted as waiting. */
static int timed_synchronize(void)
{
    double start = now_seconds();
    int status = timed.inner->synchronize();
    double done = now_seconds();
    pthread_mutex_lock(&times_lock);
    timed.times[OP_synchronize].calls++;
    timed.times[OP_synchronize].wait_seconds += done - start;
    pthread_mutex_unlock(&times_lock);
    return status;
}

const kernel_backend *kernels_timed(const kernel_backend *inner)
{
    if (!inner) {
        tp_fail(TP_ERR_ARG, "kernels_timed: no backend to time");
        return NULL;
    }
    if (timed.inner && timed.inner != inner) {
        tp_fail(TP_ERR_STATE, "kernels_timed: this process times the %s backend already (one per process)",
                timed.inner->name);
        return NULL;
    }
    if (timed.inner) return &timed.table;
    timed.inner = inner;
    timed.table = *inner; /* operations not timed (release, host_release, and any added later) are the inner ones */
    for (int i = 0; i < NUM_TIMED_OPS; i++) timed.times[i].name = op_names[i];
#define INSTALL(op) if (inner->op) timed.table.op = timed_##op; /* an operation the backend lacks stays NULL */
    TIMED_OPS(INSTALL)
#undef INSTALL
    return &timed.table;
}

void kernels_timed_reset(void)
{
    pthread_mutex_lock(&times_lock);
    for (int i = 0; i < NUM_TIMED_OPS; i++) {
        timed.times[i].calls = 0;
        timed.times[i].issue_seconds = timed.times[i].wait_seconds = 0;
    }
    pthread_mutex_unlock(&times_lock);
}

int kernels_timed_read(kernel_op_time *out, int max)
{
    int n = 0;
    pthread_mutex_lock(&times_lock);
    for (int i = 0; i < NUM_TIMED_OPS && n < max; i++)
        if (timed.times[i].calls) out[n++] = timed.times[i];
    pthread_mutex_unlock(&times_lock);
    /* Slowest first: issue and wait together (an insertion sort of a few dozen). */
    for (int i = 1; i < n; i++) {
        kernel_op_time t = out[i];
        double total = t.issue_seconds + t.wait_seconds;
        int j = i;
        for (; j > 0 && out[j - 1].issue_seconds + out[j - 1].wait_seconds < total; j--) out[j] = out[j - 1];
        out[j] = t;
    }
    return n;
}
