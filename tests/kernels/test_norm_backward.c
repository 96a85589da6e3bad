/* The CUDA norms' backward in one pass (kernels/cuda/norm.cu's fused
 * kernel: rows up to 1,024 wide), emulated on the CPU with the kernel's own
 * per-warp functions, blocks, warps' rows and butterfly sums
 * (norm_emulation.h), against the CPU backend's layernorm_backward and
 * rmsnorm_backward: d_in (added to what is there) and its bf16 bits, and
 * the weight's and bias's gradients (added too) against their sums in
 * double. Every lane count a row takes (8, 16, 24 and 32 columns a lane),
 * rows past a lane's last whole group, warps taking one row and many. On a
 * GPU, test_cuda_backend runs the kernel itself against the same twins.
 * Skipped in a build without CUDA (there is nothing to emulate). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "../../kernels/cuda/norm_emulation.h"
#include "../../kernels/kernels.h"
#include "../support/floats.h"

static int emulation_built(void)
{
    float x = 0;
    return cuda_rmsnorm_backward_emulate(&x, NULL, &x, &x, &x, &x, &x, 1, 1) != TP_ERR_DEVICE;
}

/* N, C: one column; 8 columns a lane at most (8, 40, 77: past the last
 * whole group of 32, 256); 16 (300, 512); 24 (768: GPT-2 124M); 32 (1000,
 * 1024: 350M). Rows: one; fewer than a block's warps (9, 37); 4,097 to
 * 4,200, past the 512 blocks' 4,096 warps (a few warps take a second row);
 * 20,000 (each warp 4 or 5). */
static const int64_t shapes[][2] = {{3, 1},    {1, 8},     {37, 40},  {200, 77},   {20000, 72}, {9, 256},
                                    {50, 300}, {4100, 512}, {4097, 768}, {50, 1000}, {4200, 1024}};
#define SHAPES (int)(sizeof shapes / sizeof shapes[0])

typedef struct {
    int64_t N, C;
    int layer_norm;
    float *in, *d_out, *weight, *bias, *mean, *rstd, *scratch;
    float *d_in_got, *d_in_want, *d_weight, *d_bias, *d_weight_at_first, *d_bias_at_first;
    uint16_t *d_in_bits;
} norm_case;

/* Inputs of scale 1 with an offset per row (the mean matters), the forward's
 * statistics from the CPU backend, and gradients already holding values. */
static norm_case case_make(int64_t N, int64_t C, int layer_norm)
{
    norm_case k = {.N = N, .C = C, .layer_norm = layer_norm};
    k.in = floats_random(N * C, 1.0f);
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) k.in[n * C + c] += (float)(n % 7) * 0.25f;
    k.d_out = floats_random(N * C, 1.0f);
    k.weight = floats_random(C, 1.0f);
    k.bias = floats_random(C, 1.0f);
    k.mean = floats_filled(N, 0);
    k.rstd = floats_filled(N, 0);
    k.scratch = floats_filled(N * C, 0);
    if (layer_norm) layernorm_forward(k.scratch, k.mean, k.rstd, k.in, k.weight, k.bias, N, C);
    else rmsnorm_forward(k.scratch, k.rstd, k.in, k.weight, N, C, 1e-5f);
    k.d_in_got = floats_random(N * C, 0.5f);
    k.d_in_want = malloc((size_t)(N * C) * sizeof(float));
    memcpy(k.d_in_want, k.d_in_got, (size_t)(N * C) * sizeof(float));
    k.d_weight_at_first = floats_random(C, 2.0f);
    k.d_bias_at_first = floats_random(C, 2.0f);
    k.d_weight = malloc((size_t)C * sizeof(float));
    k.d_bias = malloc((size_t)C * sizeof(float));
    memcpy(k.d_weight, k.d_weight_at_first, (size_t)C * sizeof(float));
    memcpy(k.d_bias, k.d_bias_at_first, (size_t)C * sizeof(float));
    k.d_in_bits = calloc((size_t)(N * C), sizeof(uint16_t));
    return k;
}

static void case_free(norm_case *k)
{
    free(k->in), free(k->d_out), free(k->weight), free(k->bias), free(k->mean), free(k->rstd), free(k->scratch);
    free(k->d_in_got), free(k->d_in_want), free(k->d_weight), free(k->d_bias), free(k->d_weight_at_first);
    free(k->d_bias_at_first), free(k->d_in_bits);
}

static const char *case_name(const norm_case *k)
{
    static char name[64];
    snprintf(name, sizeof name, "%s [%lld, %lld]", k->layer_norm ? "layer norm" : "RMSNorm", (long long)k->N,
             (long long)k->C);
    return name;
}

/* d_in as the CPU's within fp32's roundings of the rows' two means (summed
 * in another order: about 1e-6 of the row's largest term); a column moved
 * or a row taken twice is off by the whole term. Its bits the rounding of
 * the emulation's own d_in, every one. */
static void check_d_in(norm_case *k, int with_bits)
{
    int64_t N = k->N, C = k->C;
    if (k->layer_norm)
        layernorm_backward(k->d_in_want, NULL, k->scratch, NULL, k->d_out, k->in, k->weight, k->mean, k->rstd, N, C);
    else rmsnorm_backward(k->d_in_want, NULL, k->scratch, k->d_out, k->in, k->weight, k->rstd, N, C);
    for (int64_t n = 0; n < N; n++) {
        double largest = 0;
        for (int64_t c = 0; c < C; c++) largest = fmax(largest, fabs(k->d_in_want[n * C + c]));
        for (int64_t c = 0; c < C; c++) {
            float got = k->d_in_got[n * C + c], want = k->d_in_want[n * C + c];
            cr_assert(fabs(got - want) <= 1e-5 * largest + 1e-7, "%s: d_in[%lld, %lld] %.9g, the CPU's %.9g",
                      case_name(k), (long long)n, (long long)c, got, want);
        }
    }
    if (with_bits) floats_assert_rounded(k->d_in_bits, k->d_in_got, N * C, case_name(k));
}

/* The weight's (xhat dy) and the bias's (dy) gradients added to what was
 * there, against the sums in double of the terms as the kernel forms them
 * in fp32: within 1e-5 of the sum of the terms' sizes (a row left out or
 * added to its neighbour's column is off by about 1/N of it, 2e-4 at most
 * at these shapes). */
static void check_sums(norm_case *k, int with_bias)
{
    int64_t N = k->N, C = k->C;
    for (int64_t c = 0; c < C; c++) {
        double weight_sum = k->d_weight_at_first[c], bias_sum = k->d_bias_at_first[c], weight_size = 0, bias_size = 0;
        for (int64_t n = 0; n < N; n++) {
            float m = k->layer_norm ? k->mean[n] : 0.0f, xhat = (k->in[n * C + c] - m) * k->rstd[n];
            float dy = k->d_out[n * C + c];
            weight_sum += (double)(xhat * dy), weight_size += fabs((double)(xhat * dy));
            bias_sum += dy, bias_size += fabs(dy);
        }
        cr_assert(fabs(k->d_weight[c] - weight_sum) <= 1e-5 * weight_size + 1e-6,
                  "%s: d_weight[%lld] %.9g, the sum %.9g (of terms of sizes %.3g)", case_name(k), (long long)c,
                  k->d_weight[c], weight_sum, weight_size);
        if (with_bias)
            cr_assert(fabs(k->d_bias[c] - bias_sum) <= 1e-5 * bias_size + 1e-6,
                      "%s: d_bias[%lld] %.9g, the sum %.9g (of terms of sizes %.3g)", case_name(k), (long long)c,
                      k->d_bias[c], bias_sum, bias_size);
        else
            cr_assert(k->d_bias[c] == k->d_bias_at_first[c], "%s: d_bias[%lld] changed without a bias",
                      case_name(k), (long long)c);
    }
}

Test(norm_backward, layer_norm_as_the_cpu_at_every_width)
{
    if (!emulation_built()) cr_skip("a build without CUDA: %s", tp_errmsg());
    for (int s = 0; s < SHAPES; s++) {
        norm_case k = case_make(shapes[s][0], shapes[s][1], 1);
        int with_bits = s % 2 == 0, with_bias = s % 3 != 2; /* both kinds of call at small and wide rows */
        cr_assert_eq(cuda_layernorm_backward_emulate(k.d_in_got, with_bits ? k.d_in_bits : NULL, k.d_weight,
                                                     with_bias ? k.d_bias : NULL, k.d_out, k.in, k.weight, k.mean,
                                                     k.rstd, k.N, k.C),
                     TP_OK, "%s: %s", case_name(&k), tp_errmsg());
        check_d_in(&k, with_bits);
        check_sums(&k, with_bias);
        case_free(&k);
    }
}

Test(norm_backward, rmsnorm_as_the_cpu_at_every_width)
{
    if (!emulation_built()) cr_skip("a build without CUDA: %s", tp_errmsg());
    for (int s = 0; s < SHAPES; s++) {
        norm_case k = case_make(shapes[s][0], shapes[s][1], 0);
        int with_bits = s % 2 == 1;
        cr_assert_eq(cuda_rmsnorm_backward_emulate(k.d_in_got, with_bits ? k.d_in_bits : NULL, k.d_weight, k.d_out,
                                                   k.in, k.weight, k.rstd, k.N, k.C),
                     TP_OK, "%s: %s", case_name(&k), tp_errmsg());
        check_d_in(&k, with_bits);
        check_sums(&k, 0);
        case_free(&k);
    }
}

Test(norm_backward, refuses_what_the_fused_kernel_does_not_take)
{
    if (!emulation_built()) cr_skip("a build without CUDA: %s", tp_errmsg());
    float *x = floats_filled(1025, 1.0f);
    cr_assert_eq(cuda_layernorm_backward_emulate(x, NULL, x, x, x, x, x, x, x, 1, 1025), TP_ERR_ARG,
                 "1,025 columns take the rows kernel");
    cr_assert(strstr(tp_errmsg(), "1025 columns"), "%s", tp_errmsg());
    cr_assert_eq(cuda_rmsnorm_backward_emulate(x, NULL, x, x, x, x, x, -1, 8), TP_ERR_ARG, "a negative row count");
    cr_assert_eq(cuda_rmsnorm_backward_emulate(x, NULL, x, x, x, x, x, 0, 8), TP_OK, "no rows: nothing to add");
    cr_assert_eq(x[0], 1.0f, "no rows: nothing added");
    free(x);
}
