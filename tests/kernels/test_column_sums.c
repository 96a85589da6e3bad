/* The CUDA column sums (kernels/cuda/column_sums.h: the bias gradients and
 * the norms' weight and bias gradients), emulated on the CPU with the
 * kernel's own per-thread functions, tiles and row chunks: every row of
 * every column added once, to its own column, a column a thread and a
 * chunk of 8 a thread, fp32 and bf16 values. On a GPU, test_cuda_backend
 * runs the kernel itself against the CPU twins. Skipped in a build without
 * CUDA (there is nothing to emulate). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "../../kernels/convert_bits.h"
#include "../../kernels/cuda/column_sums_emulation.h"
#include "../support/floats.h"

static int emulation_built(void)
{
    float x = 0;
    return cuda_column_sums_emulate(&x, &x, 0, 1, 1, 0) != TP_ERR_DEVICE;
}

/* N, C: one value; columns past the last whole tile of 64 (77, 136: a
 * third tile of one chunk of 8); fewer rows than a block's thread rows
 * (37); GPT-2's width at micro-batch 4 (4,096 rows of 768: 32 chunks of
 * 128); row chunks that do not divide the rows (20,011: 156 chunks of 129,
 * the last of 16; 3,000: 23 chunks of 131, the last of 118); the most
 * chunks a tile (140,000 rows: 512 chunks of 274, the last empty). */
static const int64_t shapes[][2] = {{1, 1},   {3000, 77},    {1000, 1},  {5000, 8},
                                    {37, 136}, {4096, 768},  {20011, 24}, {140000, 8}};
#define SHAPES (int)(sizeof shapes / sizeof shapes[0])

/* Integers from -8 to 8: every sum exact in fp32 and in any order, so a
 * row added twice, left out or added to its neighbour's column shows. */
static float *small_integers(int64_t n, uint64_t seed)
{
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((int)(seed >> 59) - 8 + (int)((seed >> 40) & 1));
    }
    return x;
}

static void check_exact(int64_t N, int64_t C, int bf16, int chunked)
{
    float *values = small_integers(N * C, (uint64_t)(N * 131 + C));
    uint16_t *bits = floats_bf16_bits(values, N * C);
    float *sums = malloc((size_t)C * sizeof(float));
    double *want = calloc((size_t)C, sizeof(double));
    for (int64_t c = 0; c < C; c++) sums[c] = (float)c, want[c] = (double)c; /* the kernel adds to what is there */
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) want[c] += values[n * C + c];
    cr_assert_eq(cuda_column_sums_emulate(sums, bf16 ? (const void *)bits : (const void *)values, bf16, N, C, chunked),
                 TP_OK, "%s", tp_errmsg());
    for (int64_t c = 0; c < C; c++)
        cr_assert(sums[c] == (float)want[c], "[%lld, %lld] %s, %s: column %lld summed to %.1f, want %.1f",
                  (long long)N, (long long)C, bf16 ? "bf16" : "fp32",
                  chunked ? "a chunk of columns a thread" : "a column a thread", (long long)c, sums[c], want[c]);
    free(values), free(bits), free(sums), free(want);
}

Test(column_sums, every_row_of_every_column_once)
{
    if (!emulation_built()) cr_skip("a build without CUDA: %s", tp_errmsg());
    for (int s = 0; s < SHAPES; s++)
        for (int bf16 = 0; bf16 < 2; bf16++)
            for (int chunked = 0; chunked < 2; chunked++)
                if (!chunked || shapes[s][1] % 8 == 0) check_exact(shapes[s][0], shapes[s][1], bf16, chunked);
}

/* Random values: as the sums in double within 1e-5 relative + 1e-4
 * absolute (20,011 values of about 0.5 a column, partial sums of tens:
 * fp32's roundings on the way add up to about 1e-5; a row left out would
 * be off by about 0.5). */
Test(column_sums, random_values_close_to_exact_sums)
{
    if (!emulation_built()) cr_skip("a build without CUDA: %s", tp_errmsg());
    int64_t N = 20011, C = 136;
    float *values = floats_random(N * C, 1.0f);
    for (int chunked = 0; chunked < 2; chunked++) {
        float *sums = floats_filled(C, 0);
        cr_assert_eq(cuda_column_sums_emulate(sums, values, 0, N, C, chunked), TP_OK, "%s", tp_errmsg());
        for (int64_t c = 0; c < C; c++) {
            double want = 0;
            for (int64_t n = 0; n < N; n++) want += values[n * C + c];
            cr_assert(fabs(sums[c] - want) <= 1e-5 * fabs(want) + 1e-4, "column %lld (%s): %.9g, want %.9g",
                      (long long)c, chunked ? "chunked" : "a column a thread", sums[c], want);
        }
        free(sums);
    }
    free(values);
}

Test(column_sums, refuses_what_it_does_not_take)
{
    if (!emulation_built()) cr_skip("a build without CUDA: %s", tp_errmsg());
    float x[80] = {0};
    cr_assert_eq(cuda_column_sums_emulate(x, x, 0, 1, 77, 1), TP_ERR_ARG, "77 columns in chunks of 8");
    cr_assert(strstr(tp_errmsg(), "77 columns"), "%s", tp_errmsg());
    cr_assert_eq(cuda_column_sums_emulate(x, x, 0, -1, 8, 0), TP_ERR_ARG, "a negative row count");
    cr_assert_eq(cuda_column_sums_emulate(x, x, 0, 0, 8, 1), TP_OK, "no rows: nothing to add");
    cr_assert_eq(x[0], 0.0f);
}
