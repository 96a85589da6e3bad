/* The CPU backend's pool (kernels/cpu/workers.c) and the kernels that run
 * on it: every task once, failures reported as the lowest failed task's,
 * calls from tasks, from several threads at once and after fork; and every
 * threaded CPU kernel giving at 2, 3 and 7 threads the very bits it gives
 * on one (each output element is computed by one thread in the same order
 * at any thread count; the bf16 ones' bits too), the matrix products to
 * fp32's rounding. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../common/error.h"
#include "../../kernels/cpu/bf16_products.h"
#include "../../kernels/cpu/workers.h"
#include "../../kernels/kernels.h"
#include "../support/floats.h"

typedef struct {
    atomic_int *runs;
    int64_t fail_from; /* tasks from here on fail (-1: none) */
} count_job;

static int count_task(void *ctx, int64_t task)
{
    count_job *job = ctx;
    atomic_fetch_add(&job->runs[task], 1);
    if (job->fail_from >= 0 && task >= job->fail_from)
        return tp_fail(task % 2 ? TP_ERR_IO : TP_ERR_FORMAT, "task %lld failed", (long long)task);
    return TP_OK;
}

/* Runs tasks counting tasks on the pool and checks that each of them ran
 * once and no other of runs[0 .. capacity) did; round names the call. */
static void run_each_once(atomic_int *runs, int64_t capacity, int64_t tasks, int round)
{
    for (int64_t i = 0; i < capacity; i++) atomic_init(&runs[i], 0);
    count_job job = {runs, -1};
    cr_assert_eq(workers_run(tasks, count_task, &job), TP_OK);
    for (int64_t i = 0; i < capacity; i++)
        cr_assert_eq(atomic_load(&runs[i]), i < tasks ? 1 : 0, "threads %d, round %d, %lld tasks: task %lld ran %d times",
                     workers_threads(), round, (long long)tasks, (long long)i, atomic_load(&runs[i]));
}

Test(workers, every_task_once_at_every_thread_count)
{
    atomic_int runs[200];
    for (int threads = 1; threads <= 8; threads++) {
        workers_set_threads(threads);
        for (int round = 0; round < 300; round++) run_each_once(runs, 200, 1 + (round * 37 + threads) % 200, round);
    }
    workers_set_threads(1);
}

/* A call of few tasks and then one of many, over and over on more threads
 * than cores: a worker that read the spent claim word of the first (next =
 * its count) and then the second's larger count must not claim a task of
 * the second under the first's generation (it once ran task 14 twice). */
Test(workers, every_task_once_when_small_and_large_calls_alternate)
{
    atomic_int runs[64];
    workers_set_threads(8);
    for (int round = 0; round < 50000; round++) run_each_once(runs, 64, round % 2 ? 1 + round % 3 : 40 + round % 24, round);
    workers_set_threads(1);
}

Test(workers, the_lowest_failed_task_is_reported)
{
    atomic_int runs[64];
    for (int threads = 1; threads <= 4; threads++) {
        workers_set_threads(threads);
        for (int64_t first = 0; first < 64; first += 9) {
            for (int i = 0; i < 64; i++) atomic_init(&runs[i], 0);
            count_job job = {runs, first};
            int status = workers_run(64, count_task, &job);
            char want[64];
            snprintf(want, sizeof want, "task %lld failed", (long long)first);
            cr_assert_eq(status, first % 2 ? TP_ERR_IO : TP_ERR_FORMAT, "threads %d: status %d", threads, status);
            cr_assert_str_eq(tp_errmsg(), want);
            for (int64_t i = 0; i < first; i++) cr_assert_eq(atomic_load(&runs[i]), 1, "task %lld before the failure", (long long)i);
            for (int64_t i = first; i < 64; i++) cr_assert_leq(atomic_load(&runs[i]), 1);
        }
    }
    workers_set_threads(1);
}

typedef struct {
    atomic_int *runs; /* [outer][inner] */
    int inner;
} nested_job;

static int inner_task(void *ctx, int64_t task)
{
    atomic_fetch_add((atomic_int *)ctx + task, 1);
    return TP_OK;
}

static int outer_task(void *ctx, int64_t task)
{
    nested_job *job = ctx;
    return workers_run(job->inner, inner_task, job->runs + task * job->inner);
}

Test(workers, a_call_from_a_task_runs_inline)
{
    workers_set_threads(3);
    atomic_int runs[12 * 5];
    for (int i = 0; i < 60; i++) atomic_init(&runs[i], 0);
    nested_job job = {runs, 5};
    cr_assert_eq(workers_run(12, outer_task, &job), TP_OK);
    for (int i = 0; i < 60; i++) cr_assert_eq(atomic_load(&runs[i]), 1, "inner task %d", i);
    workers_set_threads(1);
}

/* Ranks as threads of one process call at once: one holds the pool, the
 * others run inline; all finish with every task once. */
static void *caller(void *arg)
{
    atomic_int *runs = arg;
    for (int round = 0; round < 200; round++) {
        for (int i = 0; i < 50; i++) atomic_init(&runs[i], 0);
        count_job job = {runs, -1};
        if (workers_run(50, count_task, &job) != TP_OK) return "failed";
        for (int i = 0; i < 50; i++)
            if (atomic_load(&runs[i]) != 1) return "a task ran other than once";
    }
    return NULL;
}

Test(workers, callers_in_several_threads_at_once)
{
    workers_set_threads(3);
    pthread_t ids[4];
    atomic_int runs[4][50];
    for (int t = 0; t < 4; t++) cr_assert_eq(pthread_create(&ids[t], NULL, caller, runs[t]), 0);
    for (int t = 0; t < 4; t++) {
        void *why;
        pthread_join(ids[t], &why);
        cr_assert_null(why, "caller %d: %s", t, (char *)why);
    }
    workers_set_threads(1);
}

/* A child of fork has none of its parent's threads: its calls must still end. */
Test(workers, calls_after_fork)
{
    workers_set_threads(3);
    atomic_int runs[40];
    count_job job = {runs, -1};
    for (int i = 0; i < 40; i++) atomic_init(&runs[i], 0);
    cr_assert_eq(workers_run(40, count_task, &job), TP_OK);
    pid_t child = fork();
    if (child == 0) {
        for (int i = 0; i < 40; i++) atomic_init(&runs[i], 0);
        alarm(20);
        int status = workers_run(40, count_task, &job);
        for (int i = 0; i < 40; i++)
            if (atomic_load(&runs[i]) != 1) _exit(2);
        _exit(status == TP_OK ? 0 : 1);
    }
    int status;
    cr_assert_eq(waitpid(child, &status, 0), child);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child's call: status %d", status);
    workers_set_threads(1);
}

Test(workers, shares_cover_the_count)
{
    workers_set_threads(4);
    for (int64_t count = 1; count < 500; count += 7)
        for (int64_t min_share = 1; min_share < 200; min_share += 13) {
            int64_t per, shares = workers_shares(count, min_share, &per);
            cr_assert(shares >= 1 && shares <= 4, "%lld shares", (long long)shares);
            cr_assert((shares - 1) * per < count && shares * per >= count, "count %lld: %lld x %lld", (long long)count,
                      (long long)shares, (long long)per);
            cr_assert(shares == 1 || per >= min_share, "count %lld min %lld: per %lld", (long long)count,
                      (long long)min_share, (long long)per);
        }
    workers_set_threads(1);
}

/* ------------------------------------------------ the kernels on the pool */

static float *random_floats(int64_t n, unsigned seed)
{
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    srand(seed);
    for (int64_t i = 0; i < n; i++) x[i] = (float)rand() / RAND_MAX * 2.0f - 1.0f;
    return x;
}

/* The outputs of one run of every kernel, on inputs fixed by the seed. */
#define B 3
#define T 70 /* two blocks of query rows and a short one */
#define HQ 4
#define HKV 2
#define HD 8
#define C (HQ * HD)
#define N (B * T)
#define V 300
#define QKV ((HQ + 2 * HKV) * HD)

enum { OUT_FWD, OUT_D_IN, OUT_D_W, OUT_D_B, OUT_LN, OUT_MEAN, OUT_RSTD, OUT_LN_DIN, OUT_LN_DW, OUT_LN_DB, OUT_GELU,
       OUT_GELU_D, OUT_RMS, OUT_RMS_RSTD, OUT_RMS_DIN, OUT_RMS_DW, OUT_SWI, OUT_SWI_D, OUT_ROPE, OUT_ATT, OUT_LSE,
       OUT_ATT_D, OUT_EMB, OUT_EMB_D, OUT_MAX, OUT_SUM, OUT_CE_D, OUT_ADAM_P, OUT_ADAM_M, OUT_ADAM_V, OUT_RES,
       OUT_BRES, OUT_ADD, OUT_SCALE, OUT_BF16, OUT_BF16_DW, OUT_BF16_DB, OUT_GELU_D16, OUT_SWI_D16, OUT_ROPE_D16,
       OUT_ATT16, OUT_LSE16, OUT_ATT_D16, OUTPUTS };

static const int64_t out_size[OUTPUTS] = {
    [OUT_FWD] = N * V, [OUT_D_IN] = N * C, [OUT_D_W] = V * C, [OUT_D_B] = V, [OUT_LN] = N * C, [OUT_MEAN] = N,
    [OUT_RSTD] = N, [OUT_LN_DIN] = N * C, [OUT_LN_DW] = C, [OUT_LN_DB] = C, [OUT_GELU] = N * C, [OUT_GELU_D] = N * C,
    [OUT_RMS] = N * C, [OUT_RMS_RSTD] = N, [OUT_RMS_DIN] = N * C, [OUT_RMS_DW] = C, [OUT_SWI] = N * C,
    [OUT_SWI_D] = N * 2 * C, [OUT_ROPE] = N * QKV, [OUT_ATT] = N * C, [OUT_LSE] = B * HQ * T, [OUT_ATT_D] = N * QKV,
    [OUT_EMB] = N * C, [OUT_EMB_D] = V * C, [OUT_MAX] = N, [OUT_SUM] = N, [OUT_CE_D] = N * V, [OUT_ADAM_P] = V * C,
    [OUT_ADAM_M] = V * C, [OUT_ADAM_V] = V * C, [OUT_RES] = N * C, [OUT_BRES] = N * C, [OUT_ADD] = N * C,
    [OUT_SCALE] = N * C, [OUT_BF16] = N * V, [OUT_BF16_DW] = V * C, [OUT_BF16_DB] = V, [OUT_GELU_D16] = N * C,
    [OUT_SWI_D16] = N * 2 * C, [OUT_ROPE_D16] = N * QKV, [OUT_ATT16] = N * C, [OUT_LSE16] = B * HQ * T,
    [OUT_ATT_D16] = N * QKV};

static void run_kernels(float **out)
{
    for (int k = 0; k < OUTPUTS; k++) out[k] = calloc((size_t)out_size[k], sizeof(float));
    float *x = random_floats(N * C, 1), *w = random_floats(V * C, 2), *bias = random_floats(V, 3);
    float *dy = random_floats(N * V, 4), *dx = random_floats(N * C, 5), *x2 = random_floats(N * 2 * C, 6);
    float *qkv = random_floats(N * QKV, 7), *d_att = random_floats(N * C, 8);
    int tokens[N];
    for (int n = 0; n < N; n++) tokens[n] = (n * 7919) % V; /* repeated tokens: rows shared in the gradient */
    matmul_forward(out[OUT_FWD], x, w, bias, N, C, V);
    matmul_backward(out[OUT_D_IN], out[OUT_D_W], out[OUT_D_B], dy, x, w, N, C, V);
    layernorm_forward(out[OUT_LN], out[OUT_MEAN], out[OUT_RSTD], x, w, bias, N, C);
    layernorm_backward(out[OUT_LN_DIN], NULL, out[OUT_LN_DW], out[OUT_LN_DB], dx, x, w, out[OUT_MEAN], out[OUT_RSTD], N, C);
    gelu_forward(out[OUT_GELU], x, N * C);
    gelu_backward(out[OUT_GELU_D], x, dx, N * C);
    rmsnorm_forward(out[OUT_RMS], out[OUT_RMS_RSTD], x, w, N, C, 1e-6f);
    rmsnorm_backward(out[OUT_RMS_DIN], NULL, out[OUT_RMS_DW], dx, x, w, out[OUT_RMS_RSTD], N, C);
    swiglu_forward(out[OUT_SWI], x2, N, C);
    swiglu_backward(out[OUT_SWI_D], x2, dx, N, C);
    float freq[HD / 2], *table = malloc((size_t)T * HD * sizeof(float));
    rope_frequencies(freq, HD, 10000.0, NULL);
    rope_table(table, freq, T, HD);
    memcpy(out[OUT_ROPE], qkv, (size_t)N * QKV * sizeof(float));
    rope_forward(out[OUT_ROPE], table, B, T, HQ, HKV, HD);
    rope_backward(out[OUT_ROPE], table, B, T, HQ, HKV, HD); /* back: rounding shows, and must be the same */
    float *scratch = malloc((size_t)attention_scratch_floats(B, T, HQ) * sizeof(float));
    cr_assert_eq(attention_forward(out[OUT_ATT], out[OUT_LSE], scratch, qkv, B, T, HQ, HKV, HD), TP_OK);
    cr_assert_eq(attention_backward(out[OUT_ATT_D], scratch, d_att, qkv, out[OUT_ATT], out[OUT_LSE], B, T, HQ, HKV, HD),
                 TP_OK);
    embedding_forward(out[OUT_EMB], tokens, w, N, C, 0, V);
    embedding_backward(out[OUT_EMB_D], tokens, dx, N, C, 0, V);
    /* Inputs of their own, not the products' outputs (the products' bits may depend on the threads). */
    float *logits = random_floats(N * V, 9), *grad = random_floats(V * C, 10);
    crossentropy_row_stats(out[OUT_MAX], out[OUT_SUM], logits, N, V, 0, V - 20); /* the last 20 columns padding */
    crossentropy_backward(out[OUT_CE_D], logits, out[OUT_MAX], out[OUT_SUM], tokens, N, V, 0, V - 20, 0.01f);
    memcpy(out[OUT_ADAM_P], w, (size_t)V * C * sizeof(float));
    for (int step = 1; step <= 3; step++)
        adamw_update(out[OUT_ADAM_P], grad, out[OUT_ADAM_M], out[OUT_ADAM_V], V * C, 1e-3f, 0.9f, 0.95f, 1e-8f,
                     0.1f, step);
    residual_forward(out[OUT_RES], x, dx, N * C);
    bias_residual_forward(out[OUT_BRES], x, dx, bias, N, C);
    memcpy(out[OUT_ADD], x, (size_t)N * C * sizeof(float));
    add_inplace(out[OUT_ADD], dx, N * C);
    memcpy(out[OUT_SCALE], x, (size_t)N * C * sizeof(float));
    scale_inplace(out[OUT_SCALE], 0.37f, N * C);
    /* bf16 mixed precision: activations and gradients as bf16 bits, widened (exactly) into the outputs. */
    uint16_t *x_bits = floats_bf16_bits(x, N * C), *dy_bits = floats_bf16_bits(dy, N * V);
    uint16_t *dx_bits = floats_bf16_bits(dx, N * C), *qkv_bits = floats_bf16_bits(qkv, N * QKV);
    uint16_t *d_att_bits = floats_bf16_bits(d_att, N * C), *x2_bits = floats_bf16_bits(x2, N * 2 * C);
    uint16_t *w_bits = floats_bf16_bits(w, V * C); /* the trainer's bf16 copy of its weights */
    uint16_t *bits = malloc((size_t)(N * QKV) * sizeof *bits), *att_bits = malloc((size_t)(N * C) * sizeof *att_bits);
    cr_assert(bits && att_bits);
    if (bf16_products_available()) {
        cr_assert_eq(matmul_forward_bf16(out[OUT_BF16], x_bits, w_bits, bias, N, C, V), TP_OK);
        cr_assert_eq(matmul_backward_bf16(NULL, out[OUT_BF16_DW], NULL, dy_bits, x_bits, w_bits, N, C, V), TP_OK);
        /* GELU's gradient through the product's d_in: dx's bits as GELU's input */
        cr_assert_eq(matmul_backward_gelu_bf16(bits, NULL, NULL, dy_bits, x_bits, w_bits, dx_bits, N, C, V), TP_OK);
        convert_to_f32(bits, TP_BF16, out[OUT_GELU_D16], N * C);
    }
    cr_assert_eq(matmul_backward_bf16(NULL, NULL, out[OUT_BF16_DB], dy_bits, x_bits, w_bits, N, C, V), TP_OK);
    cr_assert_eq(swiglu_backward_bf16(bits, x2_bits, dx_bits, N, C), TP_OK);
    convert_to_f32(bits, TP_BF16, out[OUT_SWI_D16], N * 2 * C);
    memcpy(bits, qkv_bits, (size_t)(N * QKV) * sizeof *bits);
    cr_assert_eq(rope_backward_bf16(bits, table, B, T, HQ, HKV, HD), TP_OK);
    convert_to_f32(bits, TP_BF16, out[OUT_ROPE_D16], N * QKV);
    cr_assert_eq(attention_forward_bf16(att_bits, out[OUT_LSE16], scratch, qkv_bits, B, T, HQ, HKV, HD), TP_OK);
    convert_to_f32(att_bits, TP_BF16, out[OUT_ATT16], N * C);
    cr_assert_eq(attention_backward_bf16(bits, scratch, d_att_bits, qkv_bits, att_bits, out[OUT_LSE16], B, T, HQ, HKV,
                                         HD),
                 TP_OK);
    convert_to_f32(bits, TP_BF16, out[OUT_ATT_D16], N * QKV);
    free(x_bits), free(dy_bits), free(dx_bits), free(qkv_bits), free(d_att_bits), free(x2_bits), free(w_bits),
        free(bits), free(att_bits);
    free(x), free(w), free(bias), free(dy), free(dx), free(x2), free(qkv), free(d_att), free(table), free(scratch);
    free(logits), free(grad);
}

/* The matrix products' blocks are single-threaded sgemm or oneDNN calls on
 * fewer rows or columns, and some OpenBLAS kernels (Haswell's, Zen's) sum a
 * row in another order when the block's shape changes: their outputs are
 * compared to fp32's rounding of the sums (K <= 300 terms of magnitude
 * <= 1), every other kernel's bit for bit. */
static int is_product(int k)
{
    return k == OUT_FWD || k == OUT_D_IN || k == OUT_D_W || k == OUT_BF16 || k == OUT_BF16_DW;
}

Test(workers, kernels_give_the_same_bits_at_any_thread_count)
{
    float *one[OUTPUTS], *many[OUTPUTS];
    kernels_set_threads(1);
    run_kernels(one);
    for (int threads = 2; threads <= 7; threads += threads == 3 ? 4 : 1) {
        kernels_set_threads(threads);
        run_kernels(many);
        for (int k = 0; k < OUTPUTS; k++) {
            if (is_product(k)) {
                for (int64_t i = 0; i < out_size[k]; i++)
                    cr_assert(fabsf(many[k][i] - one[k][i]) <= 1e-4f * (1.0f + fabsf(one[k][i])),
                              "product %d, element %lld at %d threads: %.9g, one thread %.9g", k, (long long)i,
                              threads, many[k][i], one[k][i]);
            } else {
                cr_assert(memcmp(one[k], many[k], (size_t)out_size[k] * sizeof(float)) == 0,
                          "output %d differs at %d threads", k, threads);
            }
            free(many[k]);
        }
    }
    kernels_set_threads(1);
    for (int k = 0; k < OUTPUTS; k++) free(one[k]);
}

/* The test above would pass if nothing ran on other threads; this one
 * fails unless the pool really runs tasks elsewhere at the same time. */
typedef struct {
    atomic_int arrived;
    pthread_t first;
    atomic_int other_thread;
} meet_job;

static int meet_task(void *ctx, int64_t task)
{
    meet_job *job = ctx;
    (void)task;
    if (!pthread_equal(pthread_self(), job->first)) atomic_store(&job->other_thread, 1);
    atomic_fetch_add(&job->arrived, 1);
    time_t give_up = time(NULL) + 30; /* a loaded machine may leave the other thread waiting a while */
    while (atomic_load(&job->arrived) < 2 && time(NULL) < give_up) sched_yield();
    return atomic_load(&job->arrived) >= 2 ? TP_OK : tp_fail(TP_ERR_STATE, "the two tasks never ran at once");
}

Test(workers, tasks_run_on_other_threads_at_once)
{
    workers_set_threads(2);
    meet_job job = {.first = pthread_self()};
    atomic_init(&job.arrived, 0);
    atomic_init(&job.other_thread, 0);
    cr_assert_eq(workers_run(2, meet_task, &job), TP_OK, "%s", tp_errmsg());
    cr_assert(atomic_load(&job.other_thread), "no task ran on a worker");
    workers_set_threads(1);
}

/* The gradient norm's sum: the same bits at any thread count, and close to
 * a long double sum, over spans of odd lengths that cut chunks anywhere. */
Test(workers, sum_of_squares_the_same_at_any_thread_count)
{
    enum { SPANS = 7 };
    const int64_t lengths[SPANS] = {1, 70001, 0, 65536, 300000, 17, 513201};
    const float *spans[SPANS];
    float *data[SPANS];
    long double want = 0;
    for (int s = 0; s < SPANS; s++) {
        data[s] = random_floats(lengths[s], 100 + s);
        spans[s] = data[s];
        for (int64_t i = 0; i < lengths[s]; i++) want += (long double)data[s][i] * data[s][i];
    }
    kernels_set_threads(1);
    double one = sum_of_squares(spans, lengths, SPANS);
    cr_assert(fabsl(one - want) <= 1e-13L * want, "%.17g, want %.17Lg", one, want);
    for (int threads = 2; threads <= 7; threads += 2) {
        kernels_set_threads(threads);
        double many = sum_of_squares(spans, lengths, SPANS);
        cr_assert(memcmp(&one, &many, sizeof one) == 0, "%d threads: %.17g, one thread %.17g", threads, many, one);
    }
    kernels_set_threads(1);
    for (int s = 0; s < SPANS; s++) free(data[s]);
}
