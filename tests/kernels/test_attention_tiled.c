/* The CUDA backend's tiled attention (kernels/cuda/attention_tiled.cu),
 * emulated on the CPU (the kernels' own per-thread functions, tiles and
 * cross-thread sums; attention_tiled.h), against the CPU backend's
 * attention: out, lse, delta and d_qkv, for every head size it takes, rows
 * past the last tile, grouped key/value heads and batches. On a GPU,
 * test_cuda_backend runs the kernels themselves against the same twins.
 * Skipped in a build without CUDA (there is nothing to emulate). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "../../kernels/cuda/attention_tiled.h"
#include "../../kernels/kernels.h"
#include "../support/floats.h"

/* As test_cuda_backend's tolerance for the GPU's attention: 1e-4 relative
 * plus 1e-5 absolute (the sums over keys run in another order). */
static void check_close(const float *got, const float *want, int64_t n, const char *what, const int64_t *shape)
{
    for (int64_t i = 0; i < n; i++)
        cr_assert(fabsf(got[i] - want[i]) <= 1e-4f * fabsf(want[i]) + 1e-5f,
                  "%s[%lld] at B=%lld T=%lld Hq=%lld Hkv=%lld hd=%lld: %.9g, want %.9g", what, (long long)i,
                  (long long)shape[0], (long long)shape[1], (long long)shape[2], (long long)shape[3],
                  (long long)shape[4], got[i], want[i]);
}

/* B, T, Hq, Hkv, hd: each head size; T of one row, of exactly one tile,
 * and past several tiles (the last part full); 2 and 3 query heads per
 * key/value head; two batches. */
static const int64_t shapes[][5] = {{2, 70, 4, 2, 32}, {1, 130, 3, 1, 64}, {1, 64, 2, 2, 64}, {2, 1, 2, 1, 64},
                                    {1, 150, 4, 2, 128}, {1, 40, 2, 2, 256}};
#define SHAPES (int)(sizeof shapes / sizeof shapes[0])

static int emulation_built(void)
{
    float x = 0;
    return cuda_attention_tiled_emulate_forward(&x, &x, &x, 1, 0, 1, 1, 64) != TP_ERR_DEVICE;
}

/* At each choice of the forward's rows a thread (TP_CUDA_TILED_FORWARD_ROWS),
 * the default last. */
Test(attention_tiled, forward_equals_the_cpu)
{
    if (!emulation_built()) cr_skip("a build without CUDA: %s", tp_errmsg());
    const char *rows_choices[] = {"2", "3", NULL};
    for (int c = 0; c < 3; c++) {
        cr_assert_eq(cuda_tiled_forward_rows_variant(rows_choices[c]), TP_OK, "%s", tp_errmsg());
        for (int s = 0; s < SHAPES; s++) {
            int64_t B = shapes[s][0], T = shapes[s][1], Hq = shapes[s][2], Hkv = shapes[s][3], hd = shapes[s][4];
            int64_t n_qkv = B * T * (Hq + 2 * Hkv) * hd, n_out = B * T * Hq * hd, n_lse = B * Hq * T;
            float *qkv = floats_random(n_qkv, 2.0f), *out = floats_filled(n_out, 7), *lse = floats_filled(n_lse, 7);
            float *scratch = floats_filled(attention_scratch_floats(B, T, Hq), 0);
            float *got_out = floats_filled(n_out, 7), *got_lse = floats_filled(n_lse, 7);
            cr_assert_eq(attention_forward(out, lse, scratch, qkv, B, T, Hq, Hkv, hd), TP_OK, "%s", tp_errmsg());
            cr_assert_eq(cuda_attention_tiled_emulate_forward(got_out, got_lse, qkv, B, T, Hq, Hkv, hd), TP_OK, "%s",
                         tp_errmsg());
            char what[48];
            snprintf(what, sizeof what, "lse (%s rows a thread)", rows_choices[c] ? rows_choices[c] : "4");
            check_close(got_lse, lse, n_lse, what, shapes[s]);
            snprintf(what, sizeof what, "out (%s rows a thread)", rows_choices[c] ? rows_choices[c] : "4");
            check_close(got_out, out, n_out, what, shapes[s]);
            free(qkv), free(out), free(lse), free(scratch), free(got_out), free(got_lse);
        }
    }
}

/* d_qkv from garbage (every element has its writer); delta against
 * d_out . out computed here. At each choice of the backward's rows a
 * thread (TP_CUDA_TILED_BACKWARD_ROWS), the default last. */
Test(attention_tiled, backward_equals_the_cpu)
{
    if (!emulation_built()) cr_skip("a build without CUDA: %s", tp_errmsg());
    const char *rows_choices[] = {"1", NULL};
    for (int s = 0; s < 2 * SHAPES; s++) {
        if (s % SHAPES == 0)
            cr_assert_eq(cuda_tiled_backward_rows_variant(rows_choices[s / SHAPES]), TP_OK, "%s", tp_errmsg());
        const int64_t *shape = shapes[s % SHAPES];
        const char *rows = rows_choices[s / SHAPES] ? "1 row a thread" : "2 rows a thread";
        int64_t B = shape[0], T = shape[1], Hq = shape[2], Hkv = shape[3], hd = shape[4];
        int64_t n_qkv = B * T * (Hq + 2 * Hkv) * hd, n_out = B * T * Hq * hd, n_lse = B * Hq * T;
        float *qkv = floats_random(n_qkv, 2.0f), *d_out = floats_random(n_out, 1.0f), *out = floats_filled(n_out, 0);
        float *lse = floats_filled(n_lse, 0), *scratch = floats_filled(attention_scratch_floats(B, T, Hq), 0);
        float *d_qkv = floats_filled(n_qkv, 7), *got = floats_filled(n_qkv, 7), *delta = floats_filled(n_lse, 7);
        float *want_delta = floats_filled(n_lse, 0);
        cr_assert_eq(attention_forward(out, lse, scratch, qkv, B, T, Hq, Hkv, hd), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(attention_backward(d_qkv, scratch, d_out, qkv, out, lse, B, T, Hq, Hkv, hd), TP_OK, "%s",
                     tp_errmsg());
        cr_assert_eq(cuda_attention_tiled_emulate_backward(got, delta, d_out, qkv, out, lse, B, T, Hq, Hkv, hd), TP_OK,
                     "%s", tp_errmsg());
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < Hq; h++)
                for (int64_t i = 0; i < T; i++) {
                    const float *g = d_out + (b * T + i) * Hq * hd + h * hd, *o = out + (b * T + i) * Hq * hd + h * hd;
                    double sum = 0;
                    for (int64_t d = 0; d < hd; d++) sum += (double)g[d] * o[d];
                    want_delta[(b * Hq + h) * T + i] = (float)sum;
                }
        char what[48];
        snprintf(what, sizeof what, "delta (%s)", rows);
        check_close(delta, want_delta, n_lse, what, shape);
        snprintf(what, sizeof what, "d_qkv (%s)", rows);
        check_close(got, d_qkv, n_qkv, what, shape);
        free(qkv), free(d_out), free(out), free(lse), free(scratch), free(d_qkv), free(got), free(delta);
        free(want_delta);
    }
}

Test(attention_tiled, refuses_what_it_does_not_take)
{
    if (!emulation_built()) cr_skip("a build without CUDA: %s", tp_errmsg());
    float x[64] = {0};
    cr_assert_eq(cuda_attention_tiled_emulate_forward(x, x, x, 1, 2, 2, 2, 48), TP_ERR_ARG, "a head size of 48");
    cr_assert(strstr(tp_errmsg(), "hd=48"), "%s", tp_errmsg());
    cr_assert_eq(cuda_attention_tiled_emulate_forward(x, x, x, 1, 2, 3, 2, 32), TP_ERR_ARG, "Hq not a multiple of Hkv");
    cr_assert(!cuda_attention_tiled_fits(70000, 12, 64), "beyond the grid's batches");
    cr_assert(!cuda_attention_tiled_fits(4, 0, 64), "no query head: an empty grid");
    cr_assert(!cuda_attention_tiled_fits(4, 70000, 64), "beyond the grid's heads");
    cr_assert(cuda_attention_tiled_fits(4, 12, 128));
    cr_assert_eq(cuda_attention_variant("flash"), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "'flash'"), "%s", tp_errmsg());
    cr_assert_eq(cuda_attention_variant("rows"), TP_OK);
    cr_assert_eq(cuda_attention_variant(NULL), TP_OK, "unset: the tiled kernels");
    cr_assert_eq(cuda_deterministic_variant("yes"), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "TP_CUDA_DETERMINISTIC: 'yes'"), "%s", tp_errmsg());
    cr_assert_eq(cuda_deterministic_variant("1"), TP_OK);
    cr_assert_eq(cuda_deterministic_variant("0"), TP_OK);
    cr_assert_eq(cuda_deterministic_variant(NULL), TP_OK, "unset: cuDNN's default backward");
    cr_assert_eq(cuda_tiled_forward_rows_variant("5"), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "TP_CUDA_TILED_FORWARD_ROWS: '5'"), "%s", tp_errmsg());
    cr_assert_eq(cuda_tiled_forward_rows_variant("22"), TP_ERR_ARG);
    cr_assert_eq(cuda_tiled_forward_rows_variant("3"), TP_OK);
    cr_assert_eq(cuda_tiled_forward_rows_variant(""), TP_OK, "unset: 4 rows");
    cr_assert_eq(cuda_tiled_backward_rows_variant("3"), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "TP_CUDA_TILED_BACKWARD_ROWS: '3'"), "%s", tp_errmsg());
    cr_assert_eq(cuda_tiled_backward_rows_variant("12"), TP_ERR_ARG);
    cr_assert_eq(cuda_tiled_backward_rows_variant("1"), TP_OK);
    cr_assert_eq(cuda_tiled_backward_rows_variant(""), TP_OK, "unset: 2 rows");
}
