/* The CPU's bf16 products (kernels/cpu/bf16_products.c, oneDNN) against an
 * independent reference: both operands rounded to bf16 by a nearest-value
 * rule, products summed in double. fp32 sums in another order differ by a
 * few units of fp32's precision of the sum of magnitudes; a product of
 * unrounded operands differs by bf16's (2^-9), which the tests tell apart. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
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

/* sums[o] += the column sums of the values of bits[N, OC] (bf16, widened),
 * summed in fp32 row by row onto sums[o], as kernels.h has d_bias summed. */
static void add_column_sums_of_bits(float *sums, const uint16_t *bits, int64_t N, int64_t OC)
{
    float *values = floats_of_bf16_bits(bits, N * OC);
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < OC; o++) sums[o] += values[n * OC + o];
    free(values);
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
        uint16_t *d_out_bits = floats_bf16_bits(d_out, N * OC); /* a bf16 gradient */
        uint16_t *w_bits = floats_bf16_bits(w, OC * C);         /* the trainer's bf16 copy of its weights */
        cr_assert_eq(matmul_forward_bf16(out, in_bits, w_bits, NULL, N, C, OC), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(matmul_backward_bf16(d_in, d_w, NULL, d_out_bits, in_bits, w_bits, N, C, OC), TP_OK, "%s",
                     tp_errmsg());
        free(in_bits);
        free(d_out_bits);
        free(w_bits);
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
 * (their layouts) and differ from them by bf16's rounding, not more; d_bias
 * is the column sums of d_out's bf16 values, not of the fp32 d_out it was
 * rounded from. */
Test(bf16_products, linear_layers_use_them)
{
    int64_t N = 33, C = 48, OC = 20;
    float *in = random_matrix(N * C, 4), *w = random_matrix(OC * C, 5), *bias = random_matrix(OC, 6);
    float *d_out = random_matrix(N * OC, 7);
    float *out = calloc((size_t)(N * OC), sizeof(float)), *out32 = calloc((size_t)(N * OC), sizeof(float));
    float *d_in = calloc((size_t)(N * C), sizeof(float)), *d_in32 = calloc((size_t)(N * C), sizeof(float));
    float *d_w = calloc((size_t)(OC * C), sizeof(float)), *d_w32 = calloc((size_t)(OC * C), sizeof(float));
    float *d_b = calloc((size_t)OC, sizeof(float)), *d_b32 = calloc((size_t)OC, sizeof(float));
    uint16_t *in_bits = floats_bf16_bits(in, N * C), *d_out_bits = floats_bf16_bits(d_out, N * OC);
    uint16_t *w_bits = floats_bf16_bits(w, OC * C);
    cr_assert_eq(matmul_forward_bf16(out, in_bits, w_bits, bias, N, C, OC), TP_OK, "%s", tp_errmsg());
    matmul_forward(out32, in, w, bias, N, C, OC);
    cr_assert_eq(matmul_backward_bf16(d_in, d_w, d_b, d_out_bits, in_bits, w_bits, N, C, OC), TP_OK, "%s",
                 tp_errmsg());
    free(in_bits);
    free(w_bits);
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
    float *d_b16 = calloc((size_t)OC, sizeof(float));
    add_column_sums_of_bits(d_b16, d_out_bits, N, OC);
    cr_assert_eq(memcmp(d_b, d_b16, (size_t)OC * sizeof(float)), 0, "d_bias: the column sums of d_out's bf16 values");
    cr_assert_neq(memcmp(d_b, d_b32, (size_t)OC * sizeof(float)), 0, "d_bias: the sums of the fp32 d_out, not rounded");
    free(in), free(w), free(bias), free(d_out), free(d_out_bits), free(out), free(out32), free(d_in), free(d_in32),
        free(d_w), free(d_w32), free(d_b), free(d_b32), free(d_b16);
}

/* ------------------------------------------------- the bf16 gradients
 * matmul_backward_bf16 reads d_out as bf16 bits and writes an fp32 d_in;
 * matmul_backward_bf16_bits reads the same (the residual stream's gradient,
 * as the norms' backward rounds it) and writes d_in as bf16 bits
 * (kernels.h). */

static float *copy_of(const float *x, int64_t n)
{
    float *out = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    cr_assert(out);
    memcpy(out, x, (size_t)n * sizeof(float));
    return out;
}

static void assert_same_floats(const float *got, const float *want, int64_t n, const char *what)
{
    for (int64_t i = 0; i < n; i++)
        cr_assert(memcmp(&got[i], &want[i], sizeof got[i]) == 0, "%s[%lld]: %.9g, want %.9g (bit for bit, %s)", what,
                  (long long)i, got[i], want[i], kernels_cpu_paths());
}

/* A product of the bf16 forward or backward, got, against want, the fp32
 * forward or backward of its operands' bf16 values: bit for bit where the
 * CPU computes bf16 products as sgemm on rounded operands (the same sgemm
 * of the same values); where oneDNN's bf16 instructions compute them, its
 * sums in another order, within check_product's bound of the double sums
 * of the operands a and b rounded (before: what was added to, or NULL). */
static void assert_bf16_product_of_values(const float *got, const float *want, const float *a, const float *b,
                                          int64_t M, int64_t N, int64_t K, int trans_a, int trans_b,
                                          const float *before, const char *what)
{
    if (!bf16_products_available()) {
        assert_same_floats(got, want, M * N, what);
        return;
    }
    double *sums = malloc((size_t)(M * N) * sizeof(double)), *magnitude = malloc((size_t)(M * N) * sizeof(double));
    cr_assert(sums && magnitude);
    reference(sums, magnitude, a, b, M, N, K, trans_a, trans_b, before);
    double worst = worst_of_magnitude(got, sums, magnitude, M * N);
    cr_assert_lt(worst, 4.0 * (double)K * 0x1p-24 + 0x1p-20, "%s (%s): error %g of the sum of magnitudes", what,
                 kernels_cpu_paths(), worst);
    free(sums);
    free(magnitude);
}

/* N, C, OC: tiny, a block per thread and a short one, sums over a few hundred. */
static const int64_t product_shapes[][3] = {{5, 7, 3}, {33, 48, 20}, {70, 130, 64}};
#define PRODUCT_SHAPES (int)(sizeof product_shapes / sizeof product_shapes[0])

/* matmul_backward_bf16 is matmul_backward of its operands' bf16 values (d_out's,
 * in's and weight's bits widened): d_in overwritten, d_weight added to
 * (see assert_bf16_product_of_values), and d_bias += the column sums of
 * d_out's values summed row by row in fp32, bit for bit on every path. Any
 * of the three may be NULL: the others are then what the full call gives,
 * bit for bit. At 1 and 3 threads. */
Test(bf16_products, backward_is_the_fp32_backward_of_the_bf16_values)
{
    for (int threads = 1; threads <= 3; threads += 2) {
        kernels_set_threads(threads);
        for (int s = 0; s < PRODUCT_SHAPES; s++) {
            int64_t N = product_shapes[s][0], C = product_shapes[s][1], OC = product_shapes[s][2];
            float *in = random_matrix(N * C, 21), *w = random_matrix(OC * C, 22), *d_out = random_matrix(N * OC, 23);
            float *w_before = random_matrix(OC * C, 24), *b_before = random_matrix(OC, 25);
            uint16_t *in_bits = floats_bf16_bits(in, N * C), *d_out_bits = floats_bf16_bits(d_out, N * OC);
            uint16_t *w_bits = floats_bf16_bits(w, OC * C);
            float *a = floats_of_bf16_bits(in_bits, N * C), *g = floats_of_bf16_bits(d_out_bits, N * OC);
            float *w16 = floats_of_bf16_bits(w_bits, OC * C);
            float *want_in = floats_filled(N * C, 0.0f), *want_w = copy_of(w_before, OC * C);
            float *want_b = copy_of(b_before, OC);
            matmul_backward(want_in, want_w, NULL, g, a, w16, N, C, OC);
            add_column_sums_of_bits(want_b, d_out_bits, N, OC);

            float *in_before = floats_filled(N * C, 7.0f); /* d_in is overwritten */
            float *d_in = copy_of(in_before, N * C), *d_w = copy_of(w_before, OC * C), *d_b = copy_of(b_before, OC);
            cr_assert_eq(matmul_backward_bf16(d_in, d_w, d_b, d_out_bits, in_bits, w_bits, N, C, OC), TP_OK, "%s",
                         tp_errmsg());
            assert_bf16_product_of_values(d_in, want_in, d_out, w, N, C, OC, 0, 0, NULL, "d_in");
            assert_bf16_product_of_values(d_w, want_w, d_out, in, OC, C, N, 1, 0, w_before, "d_weight");
            assert_same_floats(d_b, want_b, OC, "d_bias");

            for (int mask = 0; mask < 7; mask++) { /* bit 0: d_in given, 1: d_weight, 2: d_bias */
                float *p_in = copy_of(in_before, N * C), *p_w = copy_of(w_before, OC * C), *p_b = copy_of(b_before, OC);
                cr_assert_eq(matmul_backward_bf16(mask & 1 ? p_in : NULL, mask & 2 ? p_w : NULL, mask & 4 ? p_b : NULL,
                                                  d_out_bits, in_bits, w_bits, N, C, OC),
                             TP_OK, "%s", tp_errmsg());
                assert_same_floats(p_in, mask & 1 ? d_in : in_before, N * C, "d_in, some NULL");
                assert_same_floats(p_w, mask & 2 ? d_w : w_before, OC * C, "d_weight, some NULL");
                assert_same_floats(p_b, mask & 4 ? d_b : b_before, OC, "d_bias, some NULL");
                free(p_in), free(p_w), free(p_b);
            }
            free(in), free(w), free(d_out), free(w_before), free(b_before), free(in_bits), free(d_out_bits);
            free(w_bits), free(a), free(g), free(w16), free(want_in), free(want_w), free(want_b), free(d_in);
            free(in_before), free(d_w), free(d_b);
        }
    }
    kernels_set_threads(1);
}

/* The weight comes as bf16 bits, the trainer's bf16 copy of its fp32
 * weights (kernels.h); given w's bits floats_bf16_bits(w), the forward
 * computes exactly what it computed from the fp32 w rounded on the way.
 * Those bits widened are the weights the sgemm route rounded on the way
 * (bf16_operand_as_f32 of w's values), bit for bit, ties among them (w's
 * low half 0x8000, rounded down and up to even), so out is matmul_forward
 * of in's and w's widened bits, bit for bit there (see
 * assert_bf16_product_of_values); where oneDNN computes the products, out
 * is its product of w's values rounded on the way, bias added after as
 * linear.c adds it, bit for bit. With and without a bias, at 1 and 3
 * threads. */
Test(bf16_products, forward_of_weight_bits_is_the_product_of_weights_rounded_on_the_way)
{
    char what[96], onednn[160];
    for (int threads = 1; threads <= 3; threads += 2) {
        kernels_set_threads(threads);
        for (int s = 0; s < PRODUCT_SHAPES; s++) {
            int64_t N = product_shapes[s][0], C = product_shapes[s][1], OC = product_shapes[s][2];
            float *in = random_matrix(N * C, 41), *w = random_matrix(OC * C, 42), *bias = random_matrix(OC, 43);
            for (int64_t i = 0; i < OC * C; i += 3) /* +-(1 + 2^-8) and +-(1 + 3 2^-8), scaled by 2^-2 .. 2^2 */
                w[i] = ldexpf(i % 2 ? -1.0f : 1.0f, (int)(i % 5) - 2) * (i % 4 ? 1.00390625f : 1.01171875f);
            uint16_t *in_bits = floats_bf16_bits(in, N * C), *w_bits = floats_bf16_bits(w, OC * C);
            float *a = floats_of_bf16_bits(in_bits, N * C), *w16 = floats_of_bf16_bits(w_bits, OC * C);
            float *on_the_way = bf16_operand_as_f32(bf16_of_values(w), OC * C);
            cr_assert(on_the_way);
            assert_same_floats(w16, on_the_way, OC * C, "the weight's bits widened against its values rounded");
            float *out = floats_filled(N * OC, 7.0f), *want = floats_filled(N * OC, 0.0f);
            float *bias_rows = floats_filled(N * OC, 0.0f); /* what the products are added to */
            for (int with_bias = 0; with_bias < 2; with_bias++) {
                const float *b = with_bias ? bias : NULL;
                for (int64_t i = 0; i < N * OC; i++) bias_rows[i] = b ? b[i % OC] : 0.0f;
                snprintf(what, sizeof what, "out [%lld, %lld]%s at %d threads", (long long)N, (long long)OC,
                         b ? " with a bias" : "", threads);
                cr_assert_eq(matmul_forward_bf16(out, in_bits, w_bits, b, N, C, OC), TP_OK, "%s", tp_errmsg());
                matmul_forward(want, a, w16, b, N, C, OC);
                assert_bf16_product_of_values(out, want, in, w, N, OC, C, 0, 1, bias_rows, what);
                if (bf16_products_available()) {
                    float *rounded = floats_filled(N * OC, 0.0f);
                    cr_assert_eq(bf16_product(rounded, bf16_of_bits(in_bits), bf16_of_values(w), N, OC, C, 0, 1, 0),
                                 TP_OK, "%s", tp_errmsg());
                    for (int64_t i = 0; b && i < N * OC; i++) rounded[i] += b[i % OC];
                    snprintf(onednn, sizeof onednn, "%s, against the product of w's values rounded on the way", what);
                    assert_same_floats(out, rounded, N * OC, onednn);
                    free(rounded);
                }
            }
            free(in), free(w), free(bias), free(in_bits), free(w_bits), free(a), free(w16), free(on_the_way);
            free(out), free(want), free(bias_rows);
        }
    }
    kernels_set_threads(1);
}

/* matmul_backward_bf16_bits is matmul_backward_bf16 of the same d_out
 * bits: d_in the bits of rounding its fp32 d_in, d_weight and d_bias its
 * own, bit for bit (d_in NULL too), on d_out rounded from values at ties
 * (an fp32 whose low half is 0x8000) among random ones. At 1 and 3
 * threads. */
Test(bf16_products, backward_to_bits_rounds_the_fp32_d_in)
{
    for (int threads = 1; threads <= 3; threads += 2) {
        kernels_set_threads(threads);
        for (int s = 0; s < PRODUCT_SHAPES; s++) {
            int64_t N = product_shapes[s][0], C = product_shapes[s][1], OC = product_shapes[s][2];
            float *in = random_matrix(N * C, 31), *w = random_matrix(OC * C, 32), *d_out = random_matrix(N * OC, 33);
            float *w_before = random_matrix(OC * C, 34), *b_before = random_matrix(OC, 35);
            for (int64_t i = 0; i < N * OC; i += 3) /* +-(1 + 2^-8) and +-(1 + 3 2^-8), scaled by 2^-2 .. 2^2 */
                d_out[i] = ldexpf(i % 2 ? -1.0f : 1.0f, (int)(i % 5) - 2) * (i % 4 ? 1.00390625f : 1.01171875f);
            uint16_t *in_bits = floats_bf16_bits(in, N * C), *d_out_bits = floats_bf16_bits(d_out, N * OC);
            uint16_t *w_bits = floats_bf16_bits(w, OC * C);
            float *want_in = floats_filled(N * C, 0.0f), *want_w = copy_of(w_before, OC * C);
            float *want_b = copy_of(b_before, OC);
            cr_assert_eq(matmul_backward_bf16(want_in, want_w, want_b, d_out_bits, in_bits, w_bits, N, C, OC), TP_OK,
                         "%s", tp_errmsg());

            uint16_t *d_in = malloc((size_t)(N * C) * sizeof *d_in);
            float *d_w = copy_of(w_before, OC * C), *d_b = copy_of(b_before, OC);
            cr_assert(d_in);
            cr_assert_eq(matmul_backward_bf16_bits(d_in, d_w, d_b, d_out_bits, in_bits, w_bits, N, C, OC), TP_OK,
                         "%s", tp_errmsg());
            floats_assert_rounded(d_in, want_in, N * C, "d_in");
            assert_same_floats(d_w, want_w, OC * C, "d_weight");
            assert_same_floats(d_b, want_b, OC, "d_bias");

            memcpy(d_w, w_before, (size_t)(OC * C) * sizeof(float));
            memcpy(d_b, b_before, (size_t)OC * sizeof(float));
            cr_assert_eq(matmul_backward_bf16_bits(NULL, d_w, d_b, d_out_bits, in_bits, w_bits, N, C, OC), TP_OK,
                         "%s", tp_errmsg());
            assert_same_floats(d_w, want_w, OC * C, "d_weight without d_in");
            assert_same_floats(d_b, want_b, OC, "d_bias without d_in");
            free(in), free(w), free(d_out), free(w_before), free(b_before), free(in_bits), free(d_out_bits);
            free(w_bits), free(want_in), free(want_w), free(want_b), free(d_in), free(d_w), free(d_b);
        }
    }
    kernels_set_threads(1);
}

/* The CPU backend's table gives the backward to bits. */
Test(bf16_products, backward_to_bits_in_the_cpu_table)
{
    const kernel_backend *k = kernels_cpu();
    cr_assert_eq(k->matmul_backward_bf16, matmul_backward_bf16);
    cr_assert_eq(k->matmul_backward_bf16_bits, matmul_backward_bf16_bits);
}

/* ------------------------------------------------- the MLP's product with GELU
 * GPT-2's fc product and its GELU in one operation, each way (kernels.h
 * matmul_forward_gelu_bf16, matmul_backward_gelu_bf16; on a GPU cuBLASLt's
 * GELU epilogues): GELU reads the product's fp32 sums, not their rounding,
 * and GELU's gradient the backward product's fp32 d_in, not its rounding.
 * Each is checked bit for bit against the operations it stands for, and
 * also against the rounding it leaves out, which must change some bits
 * (else these tests could not tell the two apart). Shapes: those above,
 * and one over the backward's chunk of 2^20 values (1100 x 1000). */
static const int64_t gelu_shapes[][3] = {{5, 7, 3}, {33, 48, 20}, {70, 130, 64}, {1100, 4, 1000}};
#define GELU_SHAPES (int)(sizeof gelu_shapes / sizeof gelu_shapes[0])

static int64_t bits_differing(const uint16_t *a, const uint16_t *b, int64_t n)
{
    int64_t count = 0;
    for (int64_t i = 0; i < n; i++) count += a[i] != b[i];
    return count;
}

/* got the bits of rounding fp32 (floats_assert_rounded), the message naming the shape and threads. */
static void assert_rounded_at(const uint16_t *got, const float *fp32, int64_t n, const char *what, int64_t N,
                              int64_t C, int64_t OC, int threads)
{
    char named[160];
    snprintf(named, sizeof named, "%s of N=%lld C=%lld OC=%lld, %d threads (%s)", what, (long long)N, (long long)C,
             (long long)OC, threads, kernels_cpu_paths());
    floats_assert_rounded(got, fp32, n, named);
}

/* A product written in bf16 adds its bias rounded to bf16 (kernels.h: the
 * activation's type, as cuBLASLt's epilogue with a bf16 D takes it), one
 * written in fp32 adds it as it is. in = W = 1 (one column), bias 2^-8 +
 * 2^-17, which rounds to 2^-8: 1 + 2^-8 is the tie between 1 and 1 + 2^-7
 * and rounds to 1 (even), while 1 + 2^-8 + 2^-17 rounds up: the two ways
 * give other bits. */
Test(bf16_products, a_product_written_in_bf16_adds_its_bias_in_bf16)
{
    const float bias = 0x1p-8f + 0x1p-17f;
    const uint16_t one = 0x3f80, up = 0x3f81;
    uint16_t bits, pre, out;
    float sum;
    cr_assert_eq(matmul_forward_bf16(&sum, &one, &one, &bias, 1, 1, 1), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(sum, 1.0f + bias, "the fp32 product adds its bias as it is: %.9g", sum);
    cr_assert_eq(matmul_forward_bf16_bits(&bits, &one, &one, &bias, 1, 1, 1), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(bits, one, "the bits product: %#06x, want %#06x (the rounded bias; %#06x unrounded)", bits, one, up);
    cr_assert_eq(matmul_forward_gelu_bf16(&out, &pre, &one, &one, &bias, 1, 1, 1), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(pre, one, "GELU's input: %#06x, want %#06x (%#06x unrounded)", pre, one, up);
    float gelu, x = 1.0f + 0x1p-8f;
    gelu_forward(&gelu, &x, 1);
    uint16_t *want = floats_bf16_bits(&gelu, 1);
    cr_assert_eq(out, want[0], "GELU: %#06x, want %#06x, the rounding of GELU(1 + 2^-8)", out, want[0]);
    free(want);
}

/* Forward [N, C] x [OC, C]^T: pre the rounding of matmul_forward_bf16's fp32
 * out (with the bias rounded to bf16), out the rounding of gelu_forward of
 * that fp32 out, with and without a bias, at 1 and 3 threads. */
Test(bf16_products, product_with_gelu_is_gelu_of_the_unrounded_sums)
{
    int64_t apart = 0; /* outputs where GELU of the rounded sums differs */
    for (int threads = 1; threads <= 3; threads += 2) {
        kernels_set_threads(threads);
        for (int s = 0; s < GELU_SHAPES; s++)
            for (int with_bias = 0; with_bias < 2; with_bias++) {
                int64_t N = gelu_shapes[s][0], C = gelu_shapes[s][1], OC = gelu_shapes[s][2], n = N * OC;
                float *in = random_matrix(N * C, 41), *w = random_matrix(OC * C, 42), *bias = random_matrix(OC, 43);
                uint16_t *in_bits = floats_bf16_bits(in, N * C), *w_bits = floats_bf16_bits(w, OC * C);
                const float *b = with_bias ? bias : NULL;
                float *sums = floats_filled(n, 0.0f), *gelu = floats_filled(n, 0.0f);
                float *rounded_bias = floats_rounded_to_bf16(b, OC); /* kernels.h: the bias in bf16 */
                cr_assert_eq(matmul_forward_bf16(sums, in_bits, w_bits, rounded_bias, N, C, OC), TP_OK, "%s",
                             tp_errmsg());
                free(rounded_bias);
                gelu_forward(gelu, sums, n);
                uint16_t *want_pre = floats_bf16_bits(sums, n), *want_out = floats_bf16_bits(gelu, n);
                float *pre_values = floats_of_bf16_bits(want_pre, n), *gelu_of_rounded = floats_filled(n, 0.0f);
                gelu_forward(gelu_of_rounded, pre_values, n);
                uint16_t *rounded_way = floats_bf16_bits(gelu_of_rounded, n);
                apart += bits_differing(rounded_way, want_out, n);

                uint16_t *out = malloc((size_t)n * sizeof *out), *pre = malloc((size_t)n * sizeof *pre);
                cr_assert(out && pre);
                cr_assert_eq(matmul_forward_gelu_bf16(out, pre, in_bits, w_bits, b, N, C, OC), TP_OK, "%s",
                             tp_errmsg());
                assert_rounded_at(pre, sums, n, "pre", N, C, OC, threads);
                assert_rounded_at(out, gelu, n, "out", N, C, OC, threads);
                free(in), free(w), free(bias), free(in_bits), free(w_bits), free(sums), free(gelu), free(want_pre);
                free(want_out), free(pre_values), free(gelu_of_rounded), free(rounded_way), free(out), free(pre);
            }
    }
    kernels_set_threads(1);
    cr_assert_gt(apart, 0, "GELU of the rounded sums gave every output's bits: the test cannot tell the two apart");
}

/* Backward: d_out [N, OC], in [N, C] GELU's output and pre [N, C] its
 * input as bits; d_pre the rounding of gelu_backward of pre's values and
 * matmul_backward_bf16's fp32 d_in of the same d_out; d_weight and d_bias added to as matmul_backward_bf16_bits
 * adds, also without d_pre. At 1 and 3 threads. */
Test(bf16_products, backward_with_gelu_is_gelu_backward_of_the_unrounded_d_in)
{
    int64_t apart = 0; /* gradients where GELU's backward of the rounded d_in differs */
    for (int threads = 1; threads <= 3; threads += 2) {
        kernels_set_threads(threads);
        for (int s = 0; s < GELU_SHAPES; s++) {
            /* the forward's N, C, OC: here d_pre is [N, OC] and the projection's input is OC wide */
            int64_t N = gelu_shapes[s][0], C = gelu_shapes[s][2], OC = gelu_shapes[s][1], n = N * C;
            float *gl = random_matrix(n, 51), *w = random_matrix(OC * C, 52), *d_out = random_matrix(N * OC, 53);
            float *pre = random_matrix(n, 54), *w_before = random_matrix(OC * C, 55), *b_before = random_matrix(OC, 56);
            for (int64_t i = 0; i < n; i++) pre[i] *= 4.0f; /* GELU's bend and both tails */
            uint16_t *gl_bits = floats_bf16_bits(gl, n), *w_bits = floats_bf16_bits(w, OC * C);
            uint16_t *pre_bits = floats_bf16_bits(pre, n), *d_out_bits = floats_bf16_bits(d_out, N * OC);
            float *d_in = floats_filled(n, 0.0f), *want_w = copy_of(w_before, OC * C), *want_b = copy_of(b_before, OC);
            cr_assert_eq(matmul_backward_bf16(d_in, want_w, want_b, d_out_bits, gl_bits, w_bits, N, C, OC), TP_OK,
                         "%s", tp_errmsg());
            float *pre_values = floats_of_bf16_bits(pre_bits, n), *d_gelu = floats_filled(n, 0.0f);
            gelu_backward(d_gelu, pre_values, d_in, n);
            uint16_t *want_pre = floats_bf16_bits(d_gelu, n), *d_in_bits = floats_bf16_bits(d_in, n);
            float *d_in_rounded = floats_of_bf16_bits(d_in_bits, n), *d_gelu_of_rounded = floats_filled(n, 0.0f);
            gelu_backward(d_gelu_of_rounded, pre_values, d_in_rounded, n);
            uint16_t *rounded_way = floats_bf16_bits(d_gelu_of_rounded, n);
            apart += bits_differing(rounded_way, want_pre, n);

            uint16_t *d_pre = malloc((size_t)n * sizeof *d_pre);
            float *d_w = copy_of(w_before, OC * C), *d_b = copy_of(b_before, OC);
            cr_assert(d_pre);
            cr_assert_eq(matmul_backward_gelu_bf16(d_pre, d_w, d_b, d_out_bits, gl_bits, w_bits, pre_bits, N, C, OC),
                         TP_OK, "%s", tp_errmsg());
            assert_rounded_at(d_pre, d_gelu, n, "d_pre", N, C, OC, threads);
            assert_same_floats(d_w, want_w, OC * C, "d_weight");
            assert_same_floats(d_b, want_b, OC, "d_bias");
            memcpy(d_w, w_before, (size_t)(OC * C) * sizeof(float));
            memcpy(d_b, b_before, (size_t)OC * sizeof(float));
            cr_assert_eq(matmul_backward_gelu_bf16(NULL, d_w, d_b, d_out_bits, gl_bits, w_bits, pre_bits, N, C, OC),
                         TP_OK, "%s", tp_errmsg());
            assert_same_floats(d_w, want_w, OC * C, "d_weight without d_pre");
            assert_same_floats(d_b, want_b, OC, "d_bias without d_pre");
            free(gl), free(w), free(d_out), free(pre), free(w_before), free(b_before), free(gl_bits), free(w_bits);
            free(pre_bits), free(d_out_bits), free(d_in), free(want_w), free(want_b), free(pre_values), free(d_gelu);
            free(want_pre), free(d_in_bits), free(d_in_rounded), free(d_gelu_of_rounded), free(rounded_way), free(d_pre), free(d_w), free(d_b);
        }
    }
    kernels_set_threads(1);
    cr_assert_gt(apart, 0, "GELU's backward of the rounded d_in gave every bit: the test cannot tell the two apart");
}

/* The CPU backend's table gives both. */
Test(bf16_products, product_with_gelu_in_the_cpu_table)
{
    const kernel_backend *k = kernels_cpu();
    cr_assert_eq(k->matmul_forward_gelu_bf16, matmul_forward_gelu_bf16);
    cr_assert_eq(k->matmul_backward_gelu_bf16, matmul_backward_gelu_bf16);
}

/* ------------------------------------------------- round_to_bf16
 * The trainer's bf16 copy of its weights (kernels.h): to nearest, ties to
 * even, NaNs made quiet (bits_f32_to_bf16, convert_bits.h). These values,
 * planted among random ones, and what each must give. */
static const struct {
    uint32_t fp32;
    uint16_t bf16;
} rounding_cases[] = {
    {0x3f808000u, 0x3f80}, /* 1 + 2^-8, a tie: down to even 1 */
    {0x3f818000u, 0x3f82}, /* 1 + 3 2^-8, a tie: up to even 1 + 2^-6 */
    {0xbf808000u, 0xbf80}, /* -(1 + 2^-8): down to even, the sign kept */
    {0xbf818000u, 0xbf82}, /* -(1 + 3 2^-8): up to even */
    {0x3f808001u, 0x3f81}, /* just above a tie: up */
    {0x3f817fffu, 0x3f81}, /* just below a tie: down */
    {0x00018000u, 0x0002}, /* a tie between subnormals: up to even */
    {0x80000000u, 0x8000}, /* -0 */
    {0x7f800000u, 0x7f80}, /* +infinity kept */
    {0xff800000u, 0xff80}, /* -infinity kept */
    {0x7f7fffffu, 0x7f80}, /* the largest fp32: past bf16's largest, to infinity */
    {0x7f800001u, 0x7fc0}, /* a signalling NaN, its payload in the low half: quiet, not infinity */
    {0xffa00000u, 0xffe0}, /* a negative signalling NaN: quiet, sign and payload kept */
};
#define ROUNDING_CASES (int64_t)(sizeof rounding_cases / sizeof rounding_cases[0])

/* Which case lies at x[i] of n (every fifth, and the last), or -1. */
static int64_t rounding_case_at(int64_t i, int64_t n)
{
    return i == n - 1 ? ROUNDING_CASES - 1 : i % 5 == 0 ? i / 5 % ROUNDING_CASES : -1;
}

/* round_to_bf16 writes every element as floats_bf16_bits rounds it (the
 * reference), the cases above their own bits, and nothing past n; at 1 and
 * 3 threads (the elements in shares, the last one shorter), on odd sizes
 * (none, one, fewer than a vector's lanes, a thousand and three, past 2^20),
 * among values of large, small and subnormal magnitudes. The CPU table's
 * round_to_bf16 gives the same bits. */
Test(bf16_products, round_to_bf16_is_the_reference_rounding)
{
    const int64_t sizes[] = {0, 1, 7, 1003, (1 << 20) + 3};
    const uint16_t unwritten = 0x5555; /* about 1.5e13: none of the values here rounds to it */
    const kernel_backend *k = kernels_cpu();
    cr_assert_not_null(k->round_to_bf16, "the CPU table has no round_to_bf16");
    char what[96];
    for (int threads = 1; threads <= 3; threads += 2) {
        kernels_set_threads(threads);
        for (int s = 0; s < (int)(sizeof sizes / sizeof sizes[0]); s++) {
            int64_t n = sizes[s];
            float *x = floats_random(n, 1.0f);
            for (int64_t i = 0; i < n; i++) {
                x[i] *= i % 4 == 0 ? 1.0f : i % 4 == 1 ? 1e4f : i % 4 == 2 ? 1e-3f : 1e-40f;
                int64_t c = rounding_case_at(i, n);
                if (c >= 0) memcpy(&x[i], &rounding_cases[c].fp32, sizeof x[i]);
            }
            uint16_t *out = malloc((size_t)(n + 1) * sizeof *out), *table = malloc((size_t)(n + 1) * sizeof *table);
            cr_assert(out && table);
            for (int64_t i = 0; i <= n; i++) out[i] = table[i] = unwritten;
            round_to_bf16(out, x, n);
            snprintf(what, sizeof what, "round_to_bf16 of %lld at %d threads", (long long)n, threads);
            floats_assert_rounded(out, x, n, what);
            for (int64_t i = 0; i < n; i++) {
                int64_t c = rounding_case_at(i, n);
                if (c >= 0)
                    cr_assert_eq(out[i], rounding_cases[c].bf16, "%s: [%lld], fp32 bits 0x%08x, gave 0x%04x, want "
                                 "0x%04x", what, (long long)i, (unsigned)rounding_cases[c].fp32, out[i],
                                 rounding_cases[c].bf16);
            }
            cr_assert_eq(out[n], unwritten, "%s: wrote past n (0x%04x)", what, out[n]);
            cr_assert_eq(k->round_to_bf16(table, x, n), TP_OK, "%s", tp_errmsg());
            cr_assert_eq(memcmp(table, out, (size_t)(n + 1) * sizeof *out), 0, "%s: the CPU table's bits differ",
                         what);
            free(x), free(out), free(table);
        }
    }
    kernels_set_threads(1);
}
