/* The CUDA backend's tensor-core attention (kernels/cuda/attention_tf32x3.cu),
 * emulated on the CPU (the kernels' own warp functions over a warp's 32
 * lanes: the instruction's fragment layouts, the TF32 splits, the quads'
 * shuffles; attention_tf32x3.h), against the CPU backend's attention: out,
 * lse, delta and d_qkv, for every head size it takes, rows past the last
 * block, grouped key/value heads and batches. On a GPU, test_cuda_backend
 * runs the kernels themselves against the same twins. Skipped in a build
 * without CUDA (there is nothing to emulate). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "../../kernels/cuda/attention_tf32x3.h"
#include "../../kernels/cuda/attention_tiled.h"
#include "../../kernels/kernels.h"
#include "../support/attention_emulation.h"

/* B, T, Hq, Hkv, hd: each head size; T of one row, of exactly one block
 * (64), within a warp's 16 and a tile's 32, and past several blocks with
 * the last partly filled; 2 and 3 query heads per key/value head; two
 * batches; and GPT-2's sequence, where the accumulators take the most
 * sums rounded toward zero (the emulated tensor cores'). */
static const int64_t shapes[][5] = {{2, 70, 4, 2, 32}, {1, 130, 3, 1, 64},  {1, 64, 2, 2, 64},  {2, 1, 2, 1, 64},
                                    {1, 21, 2, 1, 64}, {1, 150, 4, 2, 128}, {1, 200, 1, 1, 64}, {1, 1024, 2, 1, 64}};
#define SHAPES (int)(sizeof shapes / sizeof shapes[0])

static int emulation_built(void)
{
    float x = 0;
    return cuda_attention_tf32x3_emulate_forward(&x, &x, &x, 1, 0, 1, 1, 64) != TP_ERR_DEVICE;
}

Test(attention_tf32x3, forward_equals_the_cpu)
{
    if (!emulation_built()) cr_skip("a build without CUDA: %s", tp_errmsg());
    for (int s = 0; s < SHAPES; s++)
        attention_emulation_check_forward(cuda_attention_tf32x3_emulate_forward, shapes[s], "tf32x3");
}

Test(attention_tf32x3, backward_equals_the_cpu)
{
    if (!emulation_built()) cr_skip("a build without CUDA: %s", tp_errmsg());
    for (int s = 0; s < SHAPES; s++)
        attention_emulation_check_backward(cuda_attention_tf32x3_emulate_backward, shapes[s], "tf32x3");
}

/* 3xTF32, not TF32: operands whose low mantissa bits matter. Scores of
 * q . k = 1 + 2^-16 (a TF32 operand keeps 10 bits, so a single TF32
 * product would lose the 2^-16): the emulated output, and so the product's
 * parts, must carry them as fp32 does. Two keys, values 0 and 1: out of
 * row 1 = softmax weight of key 1 = 1 / (1 + e^(s0 - s1)). */
Test(attention_tf32x3, carries_fp32s_low_bits)
{
    if (!emulation_built()) cr_skip("a build without CUDA: %s", tp_errmsg());
    const int64_t hd = 32, T = 2, stride = 3 * hd;
    float qkv[2 * 3 * 32] = {0}, out[2 * 32], lse[2], want_out[2 * 32], want_lse[2];
    float scratch[64];
    float fine = 1.0f + 1.0f / 65536; /* 1 + 2^-16: its last 7 of 23 bits set above TF32's 10 */
    for (int64_t i = 0; i < T; i++) {
        qkv[i * stride] = fine * 32;          /* q_i = (32 (1 + 2^-16), 0, ...): scaled by 1/sqrt(32) */
        qkv[i * stride + hd] = i ? fine : 1;  /* k_1 = (1 + 2^-16, ...), k_0 = (1, ...) */
        qkv[i * stride + 2 * hd + 1] = i;     /* v_1's dimension 1 */
    }
    cr_assert_eq(attention_forward(want_out, want_lse, scratch, qkv, 1, T, 1, 1, hd), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(cuda_attention_tf32x3_emulate_forward(out, lse, qkv, 1, T, 1, 1, hd), TP_OK, "%s", tp_errmsg());
    /* the weight of key 1 differs from 1/2 by about 2^-18 of the scores' difference; TF32 alone would give 1/2 */
    cr_assert(want_out[hd + 1] > 0.5f + 1e-6f, "the CPU's weight %.9g", want_out[hd + 1]);
    cr_assert(fabsf(out[hd + 1] - want_out[hd + 1]) <= 5e-7f, "row 1's weight of key 1: %.9g, want %.9g",
              out[hd + 1], want_out[hd + 1]);
    cr_assert(fabsf(lse[1] - want_lse[1]) <= 2e-6f, "lse %.9g, want %.9g", lse[1], want_lse[1]);
}

Test(attention_tf32x3, refuses_what_it_does_not_take)
{
    if (!emulation_built()) cr_skip("a build without CUDA: %s", tp_errmsg());
    float x[64] = {0};
    cr_assert_eq(cuda_attention_tf32x3_emulate_forward(x, x, x, 1, 2, 2, 2, 256), TP_ERR_ARG, "a head size of 256");
    cr_assert(strstr(tp_errmsg(), "hd=256"), "%s", tp_errmsg());
    cr_assert_eq(cuda_attention_tf32x3_emulate_backward(x, x, x, x, x, x, 1, 2, 3, 2, 32), TP_ERR_ARG,
                 "Hq not a multiple of Hkv");
    cr_assert(!cuda_attention_tf32x3_fits(70000, 12, 64), "beyond the grid's batches");
    cr_assert(!cuda_attention_tf32x3_fits(4, 0, 64), "no query head: an empty grid");
    cr_assert(!cuda_attention_tf32x3_fits(4, 12, 48), "a head size that is not 32, 64 or 128");
    cr_assert(cuda_attention_tf32x3_fits(4, 12, 128));
    cr_assert_eq(cuda_attention_variant("tf32x3"), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(cuda_attention_variant("tf32"), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "tf32x3"), "the error names the variants: %s", tp_errmsg());
    cr_assert_eq(cuda_attention_variant(NULL), TP_OK);
}
