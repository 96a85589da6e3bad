/* The bf16 attention of the CPU (attention_forward_bf16,
 * attention_backward_bf16; kernels/cpu/attention.c), the twin of cuDNN's
 * flash attention on a GPU: it is the fp32 attention of the operands cuDNN
 * reads in bf16, rounded as convert_bits.h rounds: qkv arrives as bf16
 * bits (a bf16 activation), out is written as bf16 bits and read so by the
 * backward, d_out arrives as bf16 bits and d_qkv leaves as bf16 bits (the
 * fp32 gradient rounded once, a grouped key/value head's sum over its
 * query heads included). So: bit for bit the fp32 attention where those
 * operands are already bf16 values (out and d_qkv the bits of rounding its
 * out and d_qkv); on any operands, bit for bit the fp32 attention of their
 * roundings (special values included), and within the error bf16's
 * rounding of the operands, of out and of d_qkv can make of the fp32
 * attention of the unrounded ones. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "../../kernels/convert_bits.h"
#include "../../kernels/kernels.h"
#include "../support/floats.h"

static float round_bf16(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    bits = bits_bf16_to_f32(bits_f32_to_bf16(bits));
    memcpy(&x, &bits, sizeof bits);
    return x;
}

static float *rounded_copy(const float *x, int64_t n)
{
    float *out = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    cr_assert(out);
    for (int64_t i = 0; i < n; i++) out[i] = round_bf16(x[i]);
    return out;
}

static uint16_t *alloc_bits(int64_t n)
{
    uint16_t *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    cr_assert(p);
    return p;
}

static void assert_same_bits(const float *got, const float *want, int64_t n, const char *what)
{
    for (int64_t i = 0; i < n; i++)
        cr_assert(memcmp(&got[i], &want[i], sizeof got[i]) == 0, "%s[%lld]: %.9g, want %.9g (bit for bit)", what,
                  (long long)i, got[i], want[i]);
}

typedef struct {
    int64_t B, T, Hq, Hkv, hd;
    int64_t n_qkv, n_out, n_lse, n_scratch;
} shape;

static shape shape_of(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd)
{
    return (shape){B, T, Hq, Hkv, hd, B * T * (Hq + 2 * Hkv) * hd, B * T * Hq * hd, B * Hq * T,
                   attention_scratch_floats(B, T, Hq)};
}

/* Grouped heads over several CPU blocks of rows (T > ATTENTION_ROWS), as
 * many key/value heads as query heads, GPT-2's and Llama's head sizes. */
static const int64_t shapes[][5] = {{2, 70, 4, 2, 16}, {1, 2 * ATTENTION_ROWS + 19, 3, 1, 8}, {2, 33, 2, 2, 64},
                                    {1, 40, 4, 2, 128}};
#define SHAPES (int)(sizeof shapes / sizeof shapes[0])

static float *alloc_floats(int64_t n)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    cr_assert(p);
    return p;
}

/* Operands that are bf16 values already: the bf16 operations are the fp32
 * ones, bit for bit (lse included; the backward's out too is a bf16 value,
 * as cuDNN's is). */
Test(attention_bf16, is_the_fp32_attention_on_bf16_values)
{
    for (int s = 0; s < SHAPES; s++) {
        shape x = shape_of(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4]);
        float *raw = floats_random(x.n_qkv, 2.0f), *qkv = rounded_copy(raw, x.n_qkv);
        uint16_t *qkv_bits = floats_bf16_bits(qkv, x.n_qkv);
        float *raw_g = floats_random(x.n_out, 1.0f), *d_out = rounded_copy(raw_g, x.n_out);
        uint16_t *d_out_bits = floats_bf16_bits(d_out, x.n_out), *out = alloc_bits(x.n_out);
        float *lse = alloc_floats(x.n_lse), *want_out = alloc_floats(x.n_out);
        float *want_lse = alloc_floats(x.n_lse), *scratch = alloc_floats(x.n_scratch);
        uint16_t *dqkv = alloc_bits(x.n_qkv);
        float *want_dqkv = alloc_floats(x.n_qkv);
        cr_assert_eq(attention_forward(want_out, want_lse, scratch, qkv, x.B, x.T, x.Hq, x.Hkv, x.hd), TP_OK);
        cr_assert_eq(attention_forward_bf16(out, lse, scratch, qkv_bits, x.B, x.T, x.Hq, x.Hkv, x.hd), TP_OK, "%s",
                     tp_errmsg());
        floats_assert_rounded(out, want_out, x.n_out, "out");
        assert_same_bits(lse, want_lse, x.n_lse, "lse");
        float *o = floats_of_bf16_bits(out, x.n_out); /* the bf16 out, as the backward reads it */
        cr_assert_eq(attention_backward(want_dqkv, scratch, d_out, qkv, o, want_lse, x.B, x.T, x.Hq, x.Hkv, x.hd),
                     TP_OK);
        cr_assert_eq(attention_backward_bf16(dqkv, scratch, d_out_bits, qkv_bits, out, want_lse, x.B, x.T, x.Hq,
                                             x.Hkv, x.hd),
                     TP_OK, "%s", tp_errmsg());
        floats_assert_rounded(dqkv, want_dqkv, x.n_qkv, "d_qkv");
        free(raw), free(qkv), free(qkv_bits), free(raw_g), free(d_out), free(d_out_bits), free(out), free(lse);
        free(want_out), free(want_lse);
        free(scratch), free(dqkv), free(want_dqkv), free(o);
    }
}

/* Any operands: the fp32 attention of qkv (and out, d_out) rounded by
 * bits_f32_to_bf16, bit for bit, and d_qkv the bits of rounding its
 * gradient: the rounding is convert_bits.h's. */
Test(attention_bf16, rounds_as_convert_bits)
{
    for (int s = 0; s < SHAPES; s++) {
        shape x = shape_of(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4]);
        float *qkv = floats_random(x.n_qkv, 2.0f), *d_out = floats_random(x.n_out, 1.0f);
        float *fwd_out = floats_random(x.n_out, 1.0f); /* any out, as bf16 bits */
        uint16_t *fwd_bits = floats_bf16_bits(fwd_out, x.n_out), *qkv_bits = floats_bf16_bits(qkv, x.n_qkv);
        uint16_t *d_out_bits = floats_bf16_bits(d_out, x.n_out);
        float *q = rounded_copy(qkv, x.n_qkv), *g = rounded_copy(d_out, x.n_out), *o = rounded_copy(fwd_out, x.n_out);
        uint16_t *out = alloc_bits(x.n_out), *dqkv = alloc_bits(x.n_qkv);
        float *lse = alloc_floats(x.n_lse), *want_out = alloc_floats(x.n_out);
        float *want_lse = alloc_floats(x.n_lse), *scratch = alloc_floats(x.n_scratch);
        float *want_dqkv = alloc_floats(x.n_qkv);
        cr_assert_eq(attention_forward(want_out, want_lse, scratch, q, x.B, x.T, x.Hq, x.Hkv, x.hd), TP_OK);
        cr_assert_eq(attention_forward_bf16(out, lse, scratch, qkv_bits, x.B, x.T, x.Hq, x.Hkv, x.hd), TP_OK);
        floats_assert_rounded(out, want_out, x.n_out, "out");
        assert_same_bits(lse, want_lse, x.n_lse, "lse");
        cr_assert_eq(attention_backward(want_dqkv, scratch, g, q, o, lse, x.B, x.T, x.Hq, x.Hkv, x.hd), TP_OK);
        cr_assert_eq(attention_backward_bf16(dqkv, scratch, d_out_bits, qkv_bits, fwd_bits, lse, x.B, x.T, x.Hq,
                                             x.Hkv, x.hd),
                     TP_OK);
        floats_assert_rounded(dqkv, want_dqkv, x.n_qkv, "d_qkv");
        free(qkv), free(qkv_bits), free(d_out), free(d_out_bits), free(fwd_out), free(fwd_bits), free(q), free(g);
        free(o), free(out), free(lse);
        free(want_out), free(want_lse), free(scratch), free(dqkv), free(want_dqkv);
    }
}

/* One position and head size 1 pass values through whole: out = v
 * (probability 1), lse = q k (k = 1 here), and in the backward dV = d_out
 * and, with v = 0, d = 1, dQ = -d_out out. So the roundings show as they
 * are: ties to even both ways, the largest finite float to infinity,
 * infinities and NaN kept, subnormals (compared as values: sgemm may give +0 for
 * -0); d_out's bits come back as dV's, d_qkv's rounding adding nothing to
 * a bf16 value. */
Test(attention_bf16, one_position_shows_the_rounding)
{
    static const uint32_t special[] = {
        0x3f808000u, /* a tie, even below: 1.00390625 -> 1 */
        0x3f818000u, /* a tie, odd below: up to 0x3f82 */
        0x3f80c000u, /* above the tie: up */
        0x3f804000u, /* below the tie: down */
        0x7f7fffffu, /* the largest float: to infinity */
        0xff800000u, /* -infinity */
        0x7f800000u, /* infinity */
        0x7fa00000u, /* a signaling NaN: a NaN */
        0x00000001u, /* the smallest subnormal: to 0 */
        0x00408000u, /* a subnormal tie */
        0x80000000u, /* -0 */
        0xc2c9f5c3u, /* -100.98 */
    };
    enum { H = sizeof special / sizeof special[0] };
    float value[H];
    memcpy(value, special, sizeof value);
    /* B=1, T=1, H heads of one dimension, a key/value head each: a row is [q0..q9 | k0..k9 | v0..v9]. */
    float qkv[3 * H], out[H], lse[H], scratch[H], d_out[H], dqkv[3 * H], fwd_out[H];
    uint16_t out_bits[H], fwd_bits[H], qkv_bits[3 * H], d_out_bits[H], dqkv_bits[3 * H];
    for (int h = 0; h < H; h++) {
        qkv[h] = isfinite(round_bf16(value[h])) ? value[h] : 1.0f; /* q: finite once rounded (an infinite score
                                                                       has no softmax) */
        qkv[H + h] = 1.0f;                             /* k */
        qkv[2 * H + h] = value[h];                     /* v */
    }
    convert_from_f32(qkv, qkv_bits, TP_BF16, 3 * H); /* the rounding under test */
    cr_assert_eq(attention_forward_bf16(out_bits, lse, scratch, qkv_bits, 1, 1, H, H, 1), TP_OK);
    convert_to_f32(out_bits, TP_BF16, out, H);
    for (int h = 0; h < H; h++) {
        float v = round_bf16(value[h]), q = round_bf16(qkv[h]);
        cr_assert(out[h] == v || (isnan(out[h]) && isnan(v)), "out[%d] %.9g, want bf16(v) %.9g", h, out[h], v);
        cr_assert(lse[h] == q, "lse[%d] %.9g, want bf16(q) %.9g", h, lse[h], q);
    }
    /* backward: v = 0, k = 1, d = 1: dV = bf16(d_out), dQ = -bf16(d_out) bf16(out) */
    for (int h = 0; h < H; h++) {
        qkv[h] = 1.0f, qkv[2 * H + h] = 0.0f, lse[h] = 1.0f; /* lse = q k: probability 1 */
        d_out[h] = 1.0f;
        fwd_out[h] = isfinite(value[h]) ? value[h] : 0.5f;
    }
    convert_from_f32(fwd_out, fwd_bits, TP_BF16, H);
    convert_from_f32(qkv, qkv_bits, TP_BF16, 3 * H);
    convert_from_f32(d_out, d_out_bits, TP_BF16, H);
    cr_assert_eq(attention_backward_bf16(dqkv_bits, scratch, d_out_bits, qkv_bits, fwd_bits, lse, 1, 1, H, H, 1),
                 TP_OK);
    convert_to_f32(dqkv_bits, TP_BF16, dqkv, 3 * H);
    for (int h = 0; h < H; h++) {
        float o = round_bf16(fwd_out[h]);
        if (isfinite(o)) cr_assert(dqkv[h] == -o, "dQ[%d] %.9g, want -bf16(out) %.9g", h, dqkv[h], -o);
        cr_assert(dqkv[2 * H + h] == 1.0f, "dV[%d] %.9g, want d_out", h, dqkv[2 * H + h]);
    }
    for (int h = 0; h < H; h++) d_out[h] = value[h], fwd_bits[h] = 0;
    convert_from_f32(d_out, d_out_bits, TP_BF16, H); /* the rounding under test */
    cr_assert_eq(attention_backward_bf16(dqkv_bits, scratch, d_out_bits, qkv_bits, fwd_bits, lse, 1, 1, H, H, 1),
                 TP_OK);
    convert_to_f32(dqkv_bits, TP_BF16, dqkv, 3 * H);
    for (int h = 0; h < H; h++) {
        float g = round_bf16(value[h]);
        cr_assert(dqkv[2 * H + h] == g || (isnan(g) && isnan(dqkv[2 * H + h])), "dV[%d] %.9g, want bf16(d_out) %.9g",
                  h, dqkv[2 * H + h], g);
    }
}

/* Grouped query heads: a key/value head's dK and dV are sums over its
 * Hq/Hkv query heads, and d_qkv is that fp32 sum rounded once (kernels.h,
 * as cuDNN writes dK and dV): bit for bit the rounding of the fp32
 * attention's gradient on the widened operands. Each query head's part is
 * the gradient of the same attention with its key/value head repeated for
 * it (Hkv = Hq, the same keys, values and probabilities); their sums are
 * the grouped gradient (to fp32's order of sums), and rounding each part
 * before summing them gives other bits on these operands: an
 * attention_backward_bf16 that rounded per query head fails the first
 * check. */
Test(attention_bf16, grouped_heads_round_their_summed_gradient_once)
{
    static const int64_t grouped[][5] = {{2, 70, 4, 1, 16}, {1, 40, 4, 2, 32}}; /* B, T, Hq, Hkv, hd */
    for (int s = 0; s < 2; s++) {
        shape x = shape_of(grouped[s][0], grouped[s][1], grouped[s][2], grouped[s][3], grouped[s][4]);
        shape y = shape_of(x.B, x.T, x.Hq, x.Hq, x.hd); /* a key/value head per query head */
        int64_t S = (x.Hq + 2 * x.Hkv) * x.hd, R = 3 * x.Hq * x.hd, group = x.Hq / x.Hkv;
        float *raw = floats_random(x.n_qkv, 2.0f), *raw_g = floats_random(x.n_out, 1.0f);
        uint16_t *qkv_bits = floats_bf16_bits(raw, x.n_qkv), *d_out_bits = floats_bf16_bits(raw_g, x.n_out);
        uint16_t *out_bits = alloc_bits(x.n_out), *dqkv = alloc_bits(x.n_qkv);
        float *lse = alloc_floats(x.n_lse), *scratch = alloc_floats(y.n_scratch), *want = alloc_floats(x.n_qkv);
        cr_assert_eq(attention_forward_bf16(out_bits, lse, scratch, qkv_bits, x.B, x.T, x.Hq, x.Hkv, x.hd), TP_OK);
        float *q = floats_of_bf16_bits(qkv_bits, x.n_qkv), *g = floats_of_bf16_bits(d_out_bits, x.n_out);
        float *o = floats_of_bf16_bits(out_bits, x.n_out);
        cr_assert_eq(attention_backward(want, scratch, g, q, o, lse, x.B, x.T, x.Hq, x.Hkv, x.hd), TP_OK);
        cr_assert_eq(attention_backward_bf16(dqkv, scratch, d_out_bits, qkv_bits, out_bits, lse, x.B, x.T, x.Hq,
                                             x.Hkv, x.hd),
                     TP_OK, "%s", tp_errmsg());
        floats_assert_rounded(dqkv, want, x.n_qkv, "grouped d_qkv");

        float *repeated = alloc_floats(y.n_qkv), *parts = alloc_floats(y.n_qkv);
        for (int64_t r = 0; r < x.B * x.T; r++) {
            memcpy(repeated + r * R, q + r * S, (size_t)(x.Hq * x.hd) * sizeof(float));
            for (int64_t h = 0; h < x.Hq; h++)
                for (int64_t kv = 0; kv < 2; kv++) /* K, then V */
                    memcpy(repeated + r * R + ((1 + kv) * x.Hq + h) * x.hd,
                           q + r * S + (x.Hq + kv * x.Hkv + h / group) * x.hd, (size_t)x.hd * sizeof(float));
        }
        cr_assert_eq(attention_backward(parts, scratch, g, repeated, o, lse, x.B, x.T, x.Hq, x.Hq, x.hd), TP_OK);
        int64_t rounded_apart = 0;
        double largest = 0, worst = 0;
        for (int64_t r = 0; r < x.B * x.T; r++)
            for (int64_t kv = 0; kv < 2; kv++)
                for (int64_t h = 0; h < x.Hkv; h++)
                    for (int64_t d = 0; d < x.hd; d++) {
                        float sum = 0, sum_of_rounded = 0;
                        for (int64_t m = 0; m < group; m++) {
                            float part = parts[r * R + ((1 + kv) * x.Hq + h * group + m) * x.hd + d];
                            sum += part;
                            sum_of_rounded += round_bf16(part);
                        }
                        int64_t at = r * S + (x.Hq + kv * x.Hkv + h) * x.hd + d;
                        largest = fmax(largest, fabs((double)want[at]));
                        worst = fmax(worst, fabs((double)sum - want[at]));
                        uint32_t got = bits_bf16_to_f32(dqkv[at]);
                        float got_value;
                        memcpy(&got_value, &got, sizeof got_value);
                        rounded_apart += round_bf16(sum_of_rounded) != got_value;
                    }
        cr_assert(worst <= 1e-5 * largest, "shape %d: the query heads' parts sum to the grouped gradient within "
                  "%.3g, not %.3g: they are not its parts", s, 1e-5 * largest, worst);
        cr_assert_gt(rounded_apart, 0, "shape %d: rounding each query head's part before the sum gave the same bits "
                     "everywhere: this test cannot tell the two apart", s);
        free(raw), free(raw_g), free(qkv_bits), free(d_out_bits), free(out_bits), free(dqkv), free(lse);
        free(scratch), free(want), free(q), free(g), free(o), free(repeated), free(parts);
    }
}

/* Against the fp32 attention of the unrounded operands: rounding to nearest
 * moves each operand by at most u = 2^-8 of itself (bf16 keeps 8
 * significant bits, 7 stored). A score s_ij = scale q_i . k_j then moves by
 * at most
 *   e_i = scale (2 u + u^2) sum_d |q_id| |k_jd|    (max over j <= i),
 * each probability by a factor within exp(+-2 e_i) (its softmax numerator
 * and denominator both move), so out_i = sum_j p_ij v_j moves by at most
 *   (exp(2 e_i) - 1) max_j |v_j| + u max_j |v_j|,
 * and lse_i = log sum exp by at most e_i; out's own rounding to bf16 adds
 * u of it. Checked per row with that bound
 * (plus fp32's own rounding, 1e-5 relative + 1e-6): a justified tolerance,
 * not a guessed one. The gradients: within 5% of the largest of each (dQ,
 * dK, dV): each is a sum of products of at most five rounded factors
 * (q k in p, d_out v, d_out out, and k or q), 5 u (2%) relative each, with
 * the probabilities' exp(2 e) on top (e about 0.02 for these operands),
 * and the gradient's own rounding to bf16, u of it. */
Test(attention_bf16, within_the_rounding_of_its_operands)
{
    for (int s = 0; s < SHAPES; s++) {
        shape x = shape_of(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4]);
        int64_t S = (x.Hq + 2 * x.Hkv) * x.hd, group = x.Hq / x.Hkv;
        float *qkv = floats_random(x.n_qkv, 1.0f), *d_out = floats_random(x.n_out, 1.0f);
        uint16_t *out_bits = alloc_bits(x.n_out), *qkv_bits = floats_bf16_bits(qkv, x.n_qkv);
        uint16_t *d_out_bits = floats_bf16_bits(d_out, x.n_out), *dqkv_bits = alloc_bits(x.n_qkv);
        float *lse = alloc_floats(x.n_lse), *want_out = alloc_floats(x.n_out);
        float *want_lse = alloc_floats(x.n_lse), *scratch = alloc_floats(x.n_scratch);
        float *want_dqkv = alloc_floats(x.n_qkv);
        cr_assert_eq(attention_forward(want_out, want_lse, scratch, qkv, x.B, x.T, x.Hq, x.Hkv, x.hd), TP_OK);
        cr_assert_eq(attention_forward_bf16(out_bits, lse, scratch, qkv_bits, x.B, x.T, x.Hq, x.Hkv, x.hd), TP_OK);
        float *out = floats_of_bf16_bits(out_bits, x.n_out);
        double scale = 1.0 / sqrt((double)x.hd), u = ldexp(1.0, -8);
        for (int64_t b = 0; b < x.B; b++)
            for (int64_t h = 0; h < x.Hq; h++) {
                const float *base = qkv + b * x.T * S, *k = base + (x.Hq + h / group) * x.hd;
                const float *v = base + (x.Hq + x.Hkv + h / group) * x.hd;
                for (int64_t i = 0; i < x.T; i++) {
                    const float *q = base + i * S + h * x.hd;
                    double e = 0, v_max = 0;
                    for (int64_t j = 0; j <= i; j++) {
                        double dot = 0;
                        for (int64_t d = 0; d < x.hd; d++) {
                            dot += fabs((double)q[d] * k[j * S + d]);
                            v_max = fmax(v_max, fabs((double)v[j * S + d]));
                        }
                        e = fmax(e, scale * (2 * u + u * u) * dot);
                    }
                    double out_bound = (exp(2 * e) - 1) * v_max + u * v_max;
                    int64_t row = (b * x.Hq + h) * x.T + i;
                    double lse_error = fabs((double)lse[row] - want_lse[row]);
                    cr_assert(lse_error <= e + 1e-5 * fabs(want_lse[row]) + 1e-6,
                              "lse[%lld]: bf16 %.9g, fp32 %.9g: %.3g beyond the bound %.3g", (long long)row, lse[row],
                              want_lse[row], lse_error, e);
                    for (int64_t d = 0; d < x.hd; d++) {
                        int64_t at = (b * x.T + i) * x.Hq * x.hd + h * x.hd + d;
                        double error = fabs((double)out[at] - want_out[at]);
                        cr_assert(error <= out_bound + (u + 1e-5) * fabs(want_out[at]) + 1e-6,
                                  "out[%lld]: bf16 %.9g, fp32 %.9g: %.3g beyond the bound %.3g", (long long)at,
                                  out[at], want_out[at], error, out_bound);
                    }
                }
            }
        cr_assert_eq(attention_backward(want_dqkv, scratch, d_out, qkv, want_out, want_lse, x.B, x.T, x.Hq, x.Hkv,
                                        x.hd),
                     TP_OK);
        uint16_t *want_out_bits = floats_bf16_bits(want_out, x.n_out);
        cr_assert_eq(attention_backward_bf16(dqkv_bits, scratch, d_out_bits, qkv_bits, want_out_bits, want_lse, x.B,
                                             x.T, x.Hq, x.Hkv, x.hd),
                     TP_OK);
        free(want_out_bits);
        float *dqkv = floats_of_bf16_bits(dqkv_bits, x.n_qkv);
        /* per part (dQ, dK, dV): the largest error against 5% of the largest value */
        const int64_t first[3] = {0, x.Hq * x.hd, (x.Hq + x.Hkv) * x.hd}, width[3] = {x.Hq * x.hd, x.Hkv * x.hd,
                                                                                        x.Hkv * x.hd};
        const char *names[3] = {"dQ", "dK", "dV"};
        for (int part = 0; part < 3; part++) {
            double largest = 0, worst = 0;
            int64_t worst_at = 0;
            for (int64_t r = 0; r < x.B * x.T; r++)
                for (int64_t c = first[part]; c < first[part] + width[part]; c++) {
                    double error = fabs((double)dqkv[r * S + c] - want_dqkv[r * S + c]);
                    largest = fmax(largest, fabs((double)want_dqkv[r * S + c]));
                    if (error > worst) worst = error, worst_at = r * S + c;
                }
            cr_assert(worst <= 0.05 * largest + 1e-6,
                      "%s (shape %d): largest error %.3g at [%lld] (bf16 %.9g, fp32 %.9g), beyond 5%% of its largest "
                      "value %.3g",
                      names[part], s, worst, (long long)worst_at, dqkv[worst_at], want_dqkv[worst_at], largest);
        }
        free(qkv), free(qkv_bits), free(d_out), free(d_out_bits), free(out), free(out_bits), free(lse), free(want_out);
        free(want_lse), free(scratch), free(dqkv), free(dqkv_bits), free(want_dqkv);
    }
}

/* The CPU backend's table gives them, and says what runs. */
Test(attention_bf16, in_the_cpu_table)
{
    const kernel_backend *k = kernels_cpu();
    cr_assert_eq(k->attention_forward_bf16, attention_forward_bf16);
    cr_assert_eq(k->attention_backward_bf16, attention_backward_bf16);
    char text[256];
    k->describe_attention(1, 2, 64, 4, 2, 64, text, sizeof text);
    cr_assert(strstr(text, "bf16-rounded") != NULL, "%s", text);
    k->describe_attention(0, 2, 64, 4, 2, 64, text, sizeof text);
    cr_assert(strstr(text, "CPU fp32") != NULL && strstr(text, "bf16") == NULL, "%s", text);
}
