/* kernels_timed (kernels/timed.c): a backend whose every operation is
 * counted and timed, issue and wait apart. Its results are the inner
 * backend's; the wait is the inner synchronize's time (a backend whose
 * synchronize sleeps shows it); reset forgets; one inner per process. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../common/error.h"
#include "../../kernels/kernels.h"
#include "../support/floats.h"

/* The CPU backend with a synchronize that takes 2 ms: the device's tail, as the timing sees it. */
static kernel_backend slow;

static int slow_synchronize(void)
{
    struct timespec pause = {0, 2000000};
    nanosleep(&pause, NULL);
    return TP_OK;
}

static const kernel_op_time *find(const kernel_op_time *times, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(times[i].name, name)) return &times[i];
    return NULL;
}

Test(timed, counts_times_and_keeps_the_results)
{
    slow = *kernels_cpu();
    slow.synchronize = slow_synchronize;
    const kernel_backend *k = kernels_timed(&slow);
    cr_assert(k, "%s", tp_errmsg());
    cr_assert_str_eq(k->name, "cpu");
    cr_assert_eq(k->on_device, 0);
    cr_assert_eq(kernels_timed(&slow), k, "the same inner again: the same table");
    kernel_backend other = *kernels_cpu();
    cr_assert_null(kernels_timed(&other), "another inner in the same process");
    cr_assert(strstr(tp_errmsg(), "one per process"), "%s", tp_errmsg());

    /* out[2,3] = in[2,4] . W[3,4]^T + b: the inner's results through the wrapper. */
    float in[8] = {1, 2, 3, 4, -1, 0.5f, 2, -3}, w[12], b[3] = {0.5f, -1, 2}, out[6], want[6];
    for (int i = 0; i < 12; i++) w[i] = 0.25f * (float)(i - 5);
    cr_assert_eq(kernels_cpu()->matmul_forward(want, in, w, b, 2, 4, 3), TP_OK);
    for (int r = 0; r < 3; r++) cr_assert_eq(k->matmul_forward(out, in, w, b, 2, 4, 3), TP_OK);
    cr_assert_eq(memcmp(out, want, sizeof out), 0, "the wrapper computes what the inner computes");
    cr_assert_eq(k->scale_inplace(out, 2.0f, 6), TP_OK);
    cr_assert_eq(k->synchronize(), TP_OK);

    kernel_op_time times[64];
    int n = kernels_timed_read(times, 64);
    cr_assert_eq(n, 3, "matmul_forward, scale_inplace, synchronize: %d", n);
    const kernel_op_time *mm = find(times, n, "matmul_forward"), *scale = find(times, n, "scale_inplace"),
                         *sync = find(times, n, "synchronize");
    cr_assert(mm && scale && sync);
    cr_assert_eq(mm->calls, 3);
    cr_assert_eq(scale->calls, 1);
    cr_assert_eq(sync->calls, 1);
    /* Each call waits once for the 2 ms synchronize; synchronize itself is all wait. */
    cr_assert(mm->wait_seconds >= 3 * 0.002 && mm->wait_seconds < 3 * 0.002 + 0.5, "%g", mm->wait_seconds);
    cr_assert(scale->wait_seconds >= 0.002, "%g", scale->wait_seconds);
    cr_assert(sync->wait_seconds >= 0.002 && sync->issue_seconds == 0, "%g %g", sync->wait_seconds, sync->issue_seconds);
    cr_assert(mm->issue_seconds >= 0 && mm->issue_seconds < mm->wait_seconds, "issue %g, wait %g", mm->issue_seconds,
              mm->wait_seconds);
    /* Slowest first: the first is the one of the largest total (matmul_forward's three waits, unless the
     * machine's load stretched another's: a 2 ms sleep has taken over 6 ms beside other work). */
    const kernel_op_time *slowest = mm;
    if (scale->issue_seconds + scale->wait_seconds > slowest->issue_seconds + slowest->wait_seconds) slowest = scale;
    if (sync->issue_seconds + sync->wait_seconds > slowest->issue_seconds + slowest->wait_seconds) slowest = sync;
    cr_assert_str_eq(times[0].name, slowest->name);
    for (int i = 1; i < n; i++)
        cr_assert(times[i - 1].issue_seconds + times[i - 1].wait_seconds >= times[i].issue_seconds + times[i].wait_seconds);
    cr_assert_eq(kernels_timed_read(times, 1), 1, "at most max");

    kernels_timed_reset();
    cr_assert_eq(kernels_timed_read(times, 64), 0, "reset forgets every call");
    cr_assert_eq(k->add_inplace(out, want, 6), TP_OK);
    n = kernels_timed_read(times, 64);
    cr_assert_eq(n, 1);
    cr_assert_str_eq(times[0].name, "add_inplace");
}

/* A failing call is passed on, its wait not taken. */
static int failing_zero(void *memory, size_t bytes)
{
    (void)memory, (void)bytes;
    return tp_fail(TP_ERR_DEVICE, "the test's zero fails");
}

Test(timed, a_failure_is_passed_on)
{
    slow = *kernels_cpu();
    slow.zero = failing_zero;
    const kernel_backend *k = kernels_timed(&slow);
    cr_assert(k);
    char buffer[8];
    cr_assert_eq(k->zero(buffer, sizeof buffer), TP_ERR_DEVICE);
    cr_assert(strstr(tp_errmsg(), "the test's zero fails"), "%s", tp_errmsg());
    kernel_op_time times[4];
    cr_assert_eq(kernels_timed_read(times, 4), 1);
    cr_assert_eq(times[0].calls, 1);
    cr_assert(times[0].wait_seconds < 0.001, "no wait after a failure: %g", times[0].wait_seconds);
}

/* An operation the inner backend lacks stays missing in the timed table
 * (NULL, as tp-train's check of a backend's bf16 operations expects), not a
 * wrapper that would call NULL. */
static kernel_backend lacking;

Test(timed, lacks_what_the_inner_backend_lacks)
{
    lacking = *kernels_cpu();
    lacking.rope_forward_bf16 = NULL;
    lacking.swiglu_forward_bf16 = NULL;
    lacking.rope_backward_bf16 = NULL;
    lacking.matmul_backward_bf16_bits = NULL;
    lacking.round_to_bf16 = NULL;
    const kernel_backend *k = kernels_timed(&lacking);
    cr_assert(k, "%s", tp_errmsg());
    cr_assert_null(k->rope_forward_bf16);
    cr_assert_null(k->swiglu_forward_bf16);
    cr_assert_null(k->rope_backward_bf16);
    cr_assert_null(k->matmul_backward_bf16_bits);
    cr_assert_null(k->round_to_bf16);
    cr_assert_not_null(k->matmul_forward_gelu_bf16);
    cr_assert_neq(k->matmul_forward_gelu_bf16, lacking.matmul_forward_gelu_bf16, "the operations it has are timed");
    cr_assert_not_null(k->swiglu_backward_bf16);
    cr_assert_neq(k->swiglu_backward_bf16, lacking.swiglu_backward_bf16, "the operations it has are timed");
}

/* The bf16 gradients' operations, and round_to_bf16 (the trainer's bf16
 * copy of its weights, which the products read), through the timed table:
 * each computes what the inner one computes, bit for bit (its arguments
 * passed on as they came), and is counted under its own name. */
static uint16_t *bits_of(int64_t n, float scale)
{
    float *x = floats_random(n, scale);
    uint16_t *bits = floats_bf16_bits(x, n);
    free(x);
    return bits;
}

Test(timed, bf16_gradients_and_rounding_are_the_inner_ones)
{
    const kernel_backend *inner = kernels_cpu(), *k = kernels_timed(inner);
    cr_assert(k, "%s", tp_errmsg());
    enum { N = 6, C = 8, OC = 5, B = 1, T = 3, HQ = 2, HKV = 1, HD = 4, QKV = (HQ + 2 * HKV) * HD };
    float *w = floats_random(OC * C, 1.0f);
    uint16_t *fc = bits_of(N * 2 * C, 1.0f), *in = bits_of(N * C, 1.0f), *d_out = bits_of(N * OC, 1.0f), *g = bits_of(N * C, 1.0f);
    float got[OC * C], want[OC * C], got_b[OC], want_b[OC], got_in[N * C], want_in[N * C];
    uint16_t got_bits[N * 2 * C], want_bits[N * 2 * C], w_bits[OC * C];

    /* The weights' bf16 bits through the table, then the products read them. */
    memset(got_bits, 0, sizeof got_bits), memset(want_bits, 0xff, sizeof want_bits);
    cr_assert_eq(k->round_to_bf16(got_bits, w, OC * C), TP_OK);
    cr_assert_eq(inner->round_to_bf16(want_bits, w, OC * C), TP_OK);
    cr_assert(!memcmp(got_bits, want_bits, OC * C * sizeof *got_bits), "round_to_bf16");
    memcpy(w_bits, got_bits, sizeof w_bits);

    memset(got, 0, sizeof got), memset(want, 0, sizeof want);
    memset(got_b, 0, sizeof got_b), memset(want_b, 0, sizeof want_b);
    cr_assert_eq(k->matmul_backward_bf16(got_in, got, got_b, d_out, in, w_bits, N, C, OC), TP_OK);
    cr_assert_eq(inner->matmul_backward_bf16(want_in, want, want_b, d_out, in, w_bits, N, C, OC), TP_OK);
    cr_assert(!memcmp(got_in, want_in, sizeof got_in) && !memcmp(got, want, sizeof got) &&
              !memcmp(got_b, want_b, sizeof got_b), "matmul_backward_bf16");

    memset(got, 0, sizeof got), memset(want, 0, sizeof want);
    memset(got_b, 0, sizeof got_b), memset(want_b, 0, sizeof want_b);
    cr_assert_eq(k->matmul_backward_bf16_bits(got_bits, got, got_b, d_out, in, w_bits, N, C, OC), TP_OK);
    cr_assert_eq(inner->matmul_backward_bf16_bits(want_bits, want, want_b, d_out, in, w_bits, N, C, OC), TP_OK);
    cr_assert(!memcmp(got_bits, want_bits, N * C * sizeof *got_bits) && !memcmp(got, want, sizeof got) &&
              !memcmp(got_b, want_b, sizeof got_b), "matmul_backward_bf16_bits");

    memset(got, 0, sizeof got), memset(want, 0, sizeof want);
    memset(got_b, 0, sizeof got_b), memset(want_b, 0, sizeof want_b);
    cr_assert_eq(k->matmul_backward_gelu_bf16(got_bits, got, got_b, d_out, in, w_bits, fc, N, C, OC), TP_OK);
    cr_assert_eq(inner->matmul_backward_gelu_bf16(want_bits, want, want_b, d_out, in, w_bits, fc, N, C, OC), TP_OK);
    cr_assert(!memcmp(got_bits, want_bits, N * C * sizeof *got_bits) && !memcmp(got, want, sizeof got) &&
              !memcmp(got_b, want_b, sizeof got_b), "matmul_backward_gelu_bf16");

    cr_assert_eq(k->swiglu_backward_bf16(got_bits, fc, g, N, C), TP_OK);
    cr_assert_eq(inner->swiglu_backward_bf16(want_bits, fc, g, N, C), TP_OK);
    cr_assert(!memcmp(got_bits, want_bits, sizeof got_bits), "swiglu_backward_bf16");

    float freq[HD / 2], cos_sin[T * HD];
    rope_frequencies(freq, HD, 10000.0, NULL);
    rope_table(cos_sin, freq, T, HD);
    uint16_t *qkv = bits_of(B * T * QKV, 1.0f), *d_qkv = bits_of(B * T * QKV, 1.0f);
    uint16_t *d_att = bits_of(B * T * HQ * HD, 1.0f), out[B * T * HQ * HD], got_qkv[B * T * QKV], want_qkv[B * T * QKV];
    memcpy(got_qkv, d_qkv, sizeof got_qkv), memcpy(want_qkv, d_qkv, sizeof want_qkv);
    cr_assert_eq(k->rope_backward_bf16(got_qkv, cos_sin, B, T, HQ, HKV, HD), TP_OK);
    cr_assert_eq(inner->rope_backward_bf16(want_qkv, cos_sin, B, T, HQ, HKV, HD), TP_OK);
    cr_assert(!memcmp(got_qkv, want_qkv, sizeof got_qkv), "rope_backward_bf16");

    float lse[B * HQ * T], *scratch = malloc((size_t)attention_scratch_floats(B, T, HQ) * sizeof(float));
    cr_assert(scratch);
    cr_assert_eq(inner->attention_forward_bf16(out, lse, scratch, qkv, B, T, HQ, HKV, HD), TP_OK); /* not timed */
    cr_assert_eq(k->attention_backward_bf16(got_qkv, scratch, d_att, qkv, out, lse, B, T, HQ, HKV, HD), TP_OK);
    cr_assert_eq(inner->attention_backward_bf16(want_qkv, scratch, d_att, qkv, out, lse, B, T, HQ, HKV, HD), TP_OK);
    cr_assert(!memcmp(got_qkv, want_qkv, sizeof got_qkv), "attention_backward_bf16");

    kernel_op_time times[64];
    int n = kernels_timed_read(times, 64);
    const char *names[] = {"round_to_bf16",        "matmul_backward_bf16", "matmul_backward_bf16_bits",
                           "matmul_backward_gelu_bf16", "swiglu_backward_bf16", "rope_backward_bf16",
                           "attention_backward_bf16"};
    cr_assert_eq(n, 7, "%d operations counted", n);
    for (int i = 0; i < 7; i++) {
        const kernel_op_time *t = find(times, n, names[i]);
        cr_assert(t && t->calls == 1, "%s: %s", names[i], t ? "not called once" : "not counted");
    }
    free(fc), free(w), free(in), free(d_out), free(g), free(qkv), free(d_qkv), free(d_att);
    free(scratch);
}
