/* The CPU's bf16 products (kernels/cpu/bf16_products.c, oneDNN) against an
 * independent reference: both operands rounded to bf16 by a nearest-value
 * rule, products summed in double. fp32 sums in another order differ by a
 * few units of fp32's precision of the sum of magnitudes; a product of
 * unrounded operands differs by bf16's (2^-9), which the tests tell apart. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "../../kernels/cpu/bf16_products.h"
#include "../../kernels/kernels.h"
#include "../support/floats.h"

/* bf16 of x by truncation plus the rounding of the dropped half (no NaNs here). */
static double bf16_of(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    uint32_t low = bits & 0xffffu, kept = bits & 0xffff0000u;
    if (low > 0x8000u || (low == 0x8000u && (kept & 0x10000u))) kept += 0x10000u;
    float out;
    memcpy(&out, &kept, sizeof out);
    return out;
}

/* An operand of bf16_product: the values, or (as_bits) their bf16 bits in
 * *bits (freed by the caller). */
static bf16_operand operand(const float *values, int64_t n, int as_bits, uint16_t **bits)
{
    *bits = as_bits ? floats_bf16_bits(values, n) : NULL;
    return as_bits ? bf16_of_bits(*bits) : bf16_of_values(values);
}

static float *random_matrix(int64_t n, unsigned seed)
{
    float *x = malloc((size_t)n * sizeof(float));
    srand(seed);
    for (int64_t i = 0; i < n; i++) x[i] = (float)rand() / RAND_MAX * 2.0f - 1.0f;
    return x;
}

/* c (+)= op(a) op(b) in double from bf16 operands; the sums of magnitudes beside. */
static void reference(double *c, double *magnitude, const float *a, const float *b, int64_t M, int64_t N, int64_t K,
                      int trans_a, int trans_b, const float *before)
{
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double sum = before ? before[m * N + n] : 0, abs_sum = before ? fabs(before[m * N + n]) : 0;
            for (int64_t k = 0; k < K; k++) {
                double x = bf16_of(trans_a ? a[k * M + m] : a[m * K + k]);
                double y = bf16_of(trans_b ? b[n * K + k] : b[k * N + n]);
                sum += x * y;
                abs_sum += fabs(x * y);
            }
            c[m * N + n] = sum;
            magnitude[m * N + n] = abs_sum;
        }
}

/* as_bits: bit 0, a given as bf16 bits (a bf16 activation); bit 1, b. */
static void check_product(int64_t M, int64_t N, int64_t K, int trans_a, int trans_b, int accumulate, int as_bits)
{
    float *a = random_matrix(M * K, 1), *b = random_matrix(K * N, 2), *c = random_matrix(M * N, 3);
    float *before = accumulate ? random_matrix(M * N, 3) : NULL;
    double *want = malloc((size_t)(M * N) * sizeof(double)), *magnitude = malloc((size_t)(M * N) * sizeof(double));
    reference(want, magnitude, a, b, M, N, K, trans_a, trans_b, before);
    uint16_t *a_bits, *b_bits;
    bf16_operand a_operand = operand(a, M * K, as_bits & 1, &a_bits);
    bf16_operand b_operand = operand(b, K * N, as_bits & 2, &b_bits);
    cr_assert_eq(bf16_product(c, a_operand, b_operand, M, N, K, trans_a, trans_b, accumulate), TP_OK, "%s",
                 tp_errmsg());
    free(a_bits);
    free(b_bits);
    double worst = 0;
    for (int64_t i = 0; i < M * N; i++) worst = fmax(worst, fabs(c[i] - want[i]) / magnitude[i]);
    /* fp32 sums: at most about K units of 2^-24 of the magnitude; bf16 operands not rounded would be ~2^-9. */
    cr_assert_lt(worst, 4.0 * (double)K * 0x1p-24 + 0x1p-20,
                 "[%lld,%lld]x[%lld,%lld] trans %d%d accumulate %d bits %d: error %g of the sum of magnitudes",
                 (long long)M, (long long)K, (long long)K, (long long)N, trans_a, trans_b, accumulate, as_bits, worst);
    free(a);
    free(b);
    free(c);
    free(before);
    free(want);
    free(magnitude);
}

static void skip_without_bf16(void)
{
    if (!bf16_products_available()) cr_skip_test("this CPU has no bf16 instructions for oneDNN: linear.c emulates");
}

Test(bf16_products, forward_shapes) /* out = in @ weight^T */
{
    skip_without_bf16();
    check_product(3, 5, 7, 0, 1, 0, 0);
    check_product(64, 130, 300, 0, 1, 0, 1); /* in as bits, as the trainer's bf16 activations */
}

Test(bf16_products, backward_shapes) /* d_in = d_out @ weight; d_weight += d_out^T @ in */
{
    skip_without_bf16();
    check_product(37, 150, 72, 0, 0, 0, 0);
    check_product(72, 150, 37, 1, 0, 1, 2); /* d_weight's in as bits */
}

Test(bf16_products, empty_sums_give_zero_or_leave_c)
{
    skip_without_bf16();
    float c[6] = {1, 2, 3, 4, 5, 6}, a[1] = {0}, b[1] = {0};
    bf16_operand x = bf16_of_values(a), y = bf16_of_values(b);
    cr_assert_eq(bf16_product(c, x, y, 2, 3, 0, 0, 0, 1), TP_OK);
    cr_assert_eq(c[5], 6.0f, "accumulating a sum of nothing changed c");
    cr_assert_eq(bf16_product(c, x, y, 2, 3, 0, 0, 0, 0), TP_OK);
    for (int i = 0; i < 6; i++) cr_assert_eq(c[i], 0.0f, "c[%d] = %g, not the empty sum 0", i, c[i]);
    cr_assert_eq(bf16_product(c, x, y, 0, 3, 4, 0, 0, 0), TP_OK);
}

Test(bf16_products, many_shapes_and_threads)
{
    skip_without_bf16();
    kernels_set_threads(2);
    for (int64_t s = 1; s <= 70; s += 3)
        check_product(s, s + 1, 2 * s + 1, s % 2, (s / 2) % 2, (s / 3) % 2, (int)(s / 5) % 4);
    /* Rows cut into blocks, one per thread, the last one shorter: every layout. */
    kernels_set_threads(3);
    for (int t = 0; t < 8; t++) check_product(200, 45, 70, t & 1, (t >> 1) & 1, (t >> 2) & 1, t % 4);
    kernels_set_threads(1);
}

/* linear.c's bf16 entry points on every CPU, by whichever path this one
 * takes (oneDNN's bf16 instructions, or sgemm on rounded operands: capped by
 * ONEDNN_MAX_CPU_ISA, OPENBLAS_CORETYPE, TP_NO_ONEDNN; test_cpu_paths.sh
 * runs this file under each): every product equals the double sums of the
 * bf16-rounded operands within fp32 sums' error, as check_product's bound.
 * A path that summed in bf16 (errors of 2^-9 and more of the magnitude,
 * growing with K) or that did not round fails it. */
static double worst_of_magnitude(const float *got, const double *want, const double *magnitude, int64_t n)
{
    double worst = 0;
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(got[i] - want[i]) / magnitude[i]);
    return worst;
}

Test(bf16_products, linear_products_are_exact_sums_of_rounded_operands_on_every_path)
{
    kernels_set_threads(2);
    int64_t shapes[][3] = {{33, 48, 20}, {64, 300, 130}, {16, 1024, 64}}; /* N, C, OC: sums over C, OC and N */
    for (int s = 0; s < 3; s++) {
        int64_t N = shapes[s][0], C = shapes[s][1], OC = shapes[s][2];
        float *in = random_matrix(N * C, 11), *w = random_matrix(OC * C, 12), *d_out = random_matrix(N * OC, 13);
        float *out = calloc((size_t)(N * OC), sizeof(float)), *d_in = calloc((size_t)(N * C), sizeof(float));
        float *d_w = random_matrix(OC * C, 14), *d_w_before = malloc((size_t)(OC * C) * sizeof(float));
        memcpy(d_w_before, d_w, (size_t)(OC * C) * sizeof(float));
        size_t most = (size_t)(N * C > OC * C ? N * C : OC * C);
        double *want = malloc(most * sizeof(double)), *magnitude = malloc(most * sizeof(double));
        uint16_t *in_bits = floats_bf16_bits(in, N * C); /* a bf16 activation */
        cr_assert_eq(matmul_forward_bf16(out, in_bits, w, NULL, N, C, OC), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(matmul_backward_bf16(d_in, d_w, NULL, d_out, in_bits, w, N, C, OC), TP_OK, "%s", tp_errmsg());
        free(in_bits);
        struct { const float *got, *a, *b, *before; int64_t M, N, K; int ta, tb; const char *what; } p[] = {
            {out, in, w, NULL, N, OC, C, 0, 1, "out = in @ weight^T"},
            {d_in, d_out, w, NULL, N, C, OC, 0, 0, "d_in = d_out @ weight"},
            {d_w, d_out, in, d_w_before, OC, C, N, 1, 0, "d_weight += d_out^T @ in"}};
        for (int i = 0; i < 3; i++) {
            reference(want, magnitude, p[i].a, p[i].b, p[i].M, p[i].N, p[i].K, p[i].ta, p[i].tb, p[i].before);
            double worst = worst_of_magnitude(p[i].got, want, magnitude, p[i].M * p[i].N);
            cr_assert_lt(worst, 4.0 * (double)p[i].K * 0x1p-24 + 0x1p-20,
                         "%s, [%lld, %lld] x [%lld, %lld] (%s): error %g of the sum of magnitudes", p[i].what,
                         (long long)p[i].M, (long long)p[i].K, (long long)p[i].K, (long long)p[i].N,
                         kernels_cpu_paths(), worst);
        }
        free(in), free(w), free(d_out), free(out), free(d_in), free(d_w), free(d_w_before), free(want), free(magnitude);
    }
    kernels_set_threads(1);
}

/* The products of linear.c's bf16 entry points land where the fp32 ones do
 * (their layouts) and differ from them by bf16's rounding, not more. */
Test(bf16_products, linear_layers_use_them)
{
    int64_t N = 33, C = 48, OC = 20;
    float *in = random_matrix(N * C, 4), *w = random_matrix(OC * C, 5), *bias = random_matrix(OC, 6);
    float *d_out = random_matrix(N * OC, 7);
    float *out = calloc((size_t)(N * OC), sizeof(float)), *out32 = calloc((size_t)(N * OC), sizeof(float));
    float *d_in = calloc((size_t)(N * C), sizeof(float)), *d_in32 = calloc((size_t)(N * C), sizeof(float));
    float *d_w = calloc((size_t)(OC * C), sizeof(float)), *d_w32 = calloc((size_t)(OC * C), sizeof(float));
    float *d_b = calloc((size_t)OC, sizeof(float)), *d_b32 = calloc((size_t)OC, sizeof(float));
    uint16_t *in_bits = floats_bf16_bits(in, N * C);
    cr_assert_eq(matmul_forward_bf16(out, in_bits, w, bias, N, C, OC), TP_OK, "%s", tp_errmsg());
    matmul_forward(out32, in, w, bias, N, C, OC);
    cr_assert_eq(matmul_backward_bf16(d_in, d_w, d_b, d_out, in_bits, w, N, C, OC), TP_OK, "%s", tp_errmsg());
    free(in_bits);
    matmul_backward(d_in32, d_w32, d_b32, d_out, in, w, N, C, OC);
    struct { const float *got, *fp32; int64_t n; const char *what; } pairs[] = {
        {out, out32, N * OC, "out"}, {d_in, d_in32, N * C, "d_in"}, {d_w, d_w32, OC * C, "d_weight"}};
    for (int p = 0; p < 3; p++) {
        double worst = 0, largest = 0;
        for (int64_t i = 0; i < pairs[p].n; i++) {
            worst = fmax(worst, fabs(pairs[p].got[i] - pairs[p].fp32[i]));
            largest = fmax(largest, fabs(pairs[p].fp32[i]));
        }
        cr_assert_lt(worst, 0.02 * largest, "%s: %g from fp32 (largest %g)", pairs[p].what, worst, largest);
        cr_assert_gt(worst, 1e-5 * largest, "%s: %g from fp32: the operands were not rounded to bf16", pairs[p].what,
                     worst);
    }
    for (int64_t o = 0; o < OC; o++) cr_assert_eq(d_b[o], d_b32[o], "d_bias stays fp32");
    free(in), free(w), free(bias), free(d_out), free(out), free(out32), free(d_in), free(d_in32), free(d_w),
        free(d_w32), free(d_b), free(d_b32);
}
