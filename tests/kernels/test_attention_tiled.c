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
#include "../support/attention_emulation.h"

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
        char way[48];
        snprintf(way, sizeof way, "%s rows a thread", rows_choices[c] ? rows_choices[c] : "4");
        for (int s = 0; s < SHAPES; s++)
            attention_emulation_check_forward(cuda_attention_tiled_emulate_forward, shapes[s], way);
    }
}

/* At each choice of the backward's rows a thread
 * (TP_CUDA_TILED_BACKWARD_ROWS), the default last. */
Test(attention_tiled, backward_equals_the_cpu)
{
    if (!emulation_built()) cr_skip("a build without CUDA: %s", tp_errmsg());
    const char *rows_choices[] = {"1", NULL};
    for (int c = 0; c < 2; c++) {
        cr_assert_eq(cuda_tiled_backward_rows_variant(rows_choices[c]), TP_OK, "%s", tp_errmsg());
        for (int s = 0; s < SHAPES; s++)
            attention_emulation_check_backward(cuda_attention_tiled_emulate_backward, shapes[s],
                                               rows_choices[c] ? "1 row a thread" : "2 rows a thread");
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
