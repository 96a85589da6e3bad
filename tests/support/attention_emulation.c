/* attention_emulation.c: attention_emulation.h's checks. */
#include "attention_emulation.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "../../common/error.h"
#include "../../kernels/kernels.h"
#include "floats.h"

static void check_close(const float *got, const float *want, int64_t n, const char *way, const char *what,
                        const int64_t *shape)
{
    for (int64_t i = 0; i < n; i++)
        cr_assert(fabsf(got[i] - want[i]) <= 1e-4f * fabsf(want[i]) + 1e-5f,
                  "%s (%s)[%lld] at B=%lld T=%lld Hq=%lld Hkv=%lld hd=%lld: %.9g, want %.9g", what, way, (long long)i,
                  (long long)shape[0], (long long)shape[1], (long long)shape[2], (long long)shape[3],
                  (long long)shape[4], got[i], want[i]);
}

void attention_emulation_check_forward(emulated_attention_forward forward, const int64_t *shape, const char *way)
{
    int64_t B = shape[0], T = shape[1], Hq = shape[2], Hkv = shape[3], hd = shape[4];
    int64_t n_qkv = B * T * (Hq + 2 * Hkv) * hd, n_out = B * T * Hq * hd, n_lse = B * Hq * T;
    float *qkv = floats_random(n_qkv, 2.0f), *out = floats_filled(n_out, 7), *lse = floats_filled(n_lse, 7);
    float *scratch = floats_filled(attention_scratch_floats(B, T, Hq), 0);
    float *got_out = floats_filled(n_out, 7), *got_lse = floats_filled(n_lse, 7);
    cr_assert_eq(attention_forward(out, lse, scratch, qkv, B, T, Hq, Hkv, hd), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(forward(got_out, got_lse, qkv, B, T, Hq, Hkv, hd), TP_OK, "%s: %s", way, tp_errmsg());
    check_close(got_lse, lse, n_lse, way, "lse", shape);
    check_close(got_out, out, n_out, way, "out", shape);
    free(qkv), free(out), free(lse), free(scratch), free(got_out), free(got_lse);
}

void attention_emulation_check_backward(emulated_attention_backward backward, const int64_t *shape, const char *way)
{
    int64_t B = shape[0], T = shape[1], Hq = shape[2], Hkv = shape[3], hd = shape[4];
    int64_t n_qkv = B * T * (Hq + 2 * Hkv) * hd, n_out = B * T * Hq * hd, n_lse = B * Hq * T;
    float *qkv = floats_random(n_qkv, 2.0f), *d_out = floats_random(n_out, 1.0f), *out = floats_filled(n_out, 0);
    float *lse = floats_filled(n_lse, 0), *scratch = floats_filled(attention_scratch_floats(B, T, Hq), 0);
    float *d_qkv = floats_filled(n_qkv, 7), *got = floats_filled(n_qkv, 7), *delta = floats_filled(n_lse, 7);
    float *want_delta = floats_filled(n_lse, 0);
    cr_assert_eq(attention_forward(out, lse, scratch, qkv, B, T, Hq, Hkv, hd), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(attention_backward(d_qkv, scratch, d_out, qkv, out, lse, B, T, Hq, Hkv, hd), TP_OK, "%s",
                 tp_errmsg());
    cr_assert_eq(backward(got, delta, d_out, qkv, out, lse, B, T, Hq, Hkv, hd), TP_OK, "%s: %s", way, tp_errmsg());
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < T; i++) {
                const float *g = d_out + (b * T + i) * Hq * hd + h * hd, *o = out + (b * T + i) * Hq * hd + h * hd;
                double sum = 0;
                for (int64_t d = 0; d < hd; d++) sum += (double)g[d] * o[d];
                want_delta[(b * Hq + h) * T + i] = (float)sum;
            }
    check_close(delta, want_delta, n_lse, way, "delta", shape);
    check_close(got, d_qkv, n_qkv, way, "d_qkv", shape);
    free(qkv), free(d_out), free(out), free(lse), free(scratch), free(d_qkv), free(got), free(delta);
    free(want_delta);
}
