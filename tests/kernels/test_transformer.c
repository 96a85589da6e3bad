/* Transformer kernels against naive references in double precision: matrix
 * products, layer norm, GELU, RMSNorm, SwiGLU, rotary embeddings and their
 * frequencies (Llama 3 scaling), attention (with grouped KV heads),
 * embedding, vocabulary-parallel cross-entropy pieces, AdamW. Backward passes are also
 * checked against central finite differences of the naive forward. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "../../kernels/fast_exp.h"
#include "../../kernels/kernels.h"
#include "../support/floats.h"

static uint64_t rng_state = 0x853C49E6748FEA9Bull;
static float uniform(void) /* [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static float *random_floats(int64_t n)
{
    float *p = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = uniform();
    return p;
}

static void assert_close(const float *got, const double *want, int64_t n, double tol, const char *what)
{
    double scale = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (int64_t i = 0; i < n; i++)
        cr_assert(fabs(got[i] - want[i]) <= tol * fmax(scale, 1e-3), "%s[%lld]: %g, want %g", what, (long long)i,
                  got[i], want[i]);
}

Test(transformer, matmul_against_loops)
{
    int64_t N = 7, C = 13, OC = 5;
    float *in = random_floats(N * C), *w = random_floats(OC * C), *b = random_floats(OC), *out = calloc(N * OC, 4);
    float *dout = random_floats(N * OC), *din = calloc(N * C, 4), *dw = calloc(OC * C, 4), *db = calloc(OC, 4);
    matmul_forward(out, in, w, b, N, C, OC);
    matmul_backward(din, dw, db, dout, in, w, N, C, OC);
    double want[1024];
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < OC; o++) {
            double s = b[o];
            for (int64_t c = 0; c < C; c++) s += (double)in[n * C + c] * w[o * C + c];
            want[n * OC + o] = s;
        }
    assert_close(out, want, N * OC, 1e-6, "out");
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            double s = 0;
            for (int64_t o = 0; o < OC; o++) s += (double)dout[n * OC + o] * w[o * C + c];
            want[n * C + c] = s;
        }
    assert_close(din, want, N * C, 1e-6, "d_in");
    for (int64_t o = 0; o < OC; o++)
        for (int64_t c = 0; c < C; c++) {
            double s = 0;
            for (int64_t n = 0; n < N; n++) s += (double)dout[n * OC + o] * in[n * C + c];
            want[o * C + c] = s;
        }
    assert_close(dw, want, OC * C, 1e-6, "d_weight");
    for (int64_t o = 0; o < OC; o++) {
        double s = 0;
        for (int64_t n = 0; n < N; n++) s += dout[n * OC + o];
        want[o] = s;
    }
    assert_close(db, want, OC, 1e-6, "d_bias");
    free(in), free(w), free(b), free(out), free(dout), free(din), free(dw), free(db);
}

/* Naive forwards in double, for the finite differences. */
static void layernorm_naive(double *out, const float *x, const float *w, const float *b, int64_t N, int64_t C)
{
    for (int64_t n = 0; n < N; n++) {
        double m = 0, v = 0;
        for (int64_t c = 0; c < C; c++) m += x[n * C + c];
        m /= (double)C;
        for (int64_t c = 0; c < C; c++) v += (x[n * C + c] - m) * (x[n * C + c] - m);
        v /= (double)C;
        for (int64_t c = 0; c < C; c++) out[n * C + c] = (x[n * C + c] - m) / sqrt(v + 1e-5) * w[c] + b[c];
    }
}

/* d(sum(dout * f(x)))/dx_i by central differences on a float input. */
static double numeric_grad(float *x, int64_t i, const float *dout, int64_t n_out,
                           void (*f)(double *out, void *ctx), void *ctx)
{
    double *plus = malloc((size_t)n_out * sizeof(double)), *minus = malloc((size_t)n_out * sizeof(double));
    float saved = x[i], h = 1e-2f;
    x[i] = saved + h;
    f(plus, ctx);
    x[i] = saved - h;
    f(minus, ctx);
    x[i] = saved;
    double g = 0;
    for (int64_t k = 0; k < n_out; k++) g += dout[k] * (plus[k] - minus[k]) / (2.0 * h);
    free(plus);
    free(minus);
    return g;
}

typedef struct {
    float *x, *w, *b;
    int64_t N, C;
} ln_ctx;

static void ln_eval(double *out, void *ctx)
{
    ln_ctx *c = ctx;
    layernorm_naive(out, c->x, c->w, c->b, c->N, c->C);
}

Test(transformer, layernorm_against_naive_and_finite_differences)
{
    int64_t N = 5, C = 24;
    float *x = random_floats(N * C), *w = random_floats(C), *b = random_floats(C), *out = malloc(N * C * 4);
    float mean[5], rstd[5], *dout = random_floats(N * C), *dx = calloc(N * C, 4), *dw = calloc(C, 4), *db = calloc(C, 4);
    layernorm_forward(out, mean, rstd, x, w, b, N, C);
    double want[5 * 24];
    layernorm_naive(want, x, w, b, N, C);
    assert_close(out, want, N * C, 1e-5, "layernorm");
    layernorm_backward(dx, NULL, dw, db, dout, x, w, mean, rstd, N, C);
    ln_ctx ctx = {x, w, b, N, C};
    double grads[5 * 24];
    for (int64_t i = 0; i < N * C; i++) grads[i] = numeric_grad(x, i, dout, N * C, ln_eval, &ctx);
    assert_close(dx, grads, N * C, 2e-3, "d_in");
    for (int64_t i = 0; i < C; i++) grads[i] = numeric_grad(w, i, dout, N * C, ln_eval, &ctx);
    assert_close(dw, grads, C, 2e-3, "d_weight");
    for (int64_t i = 0; i < C; i++) grads[i] = numeric_grad(b, i, dout, N * C, ln_eval, &ctx);
    assert_close(db, grads, C, 2e-3, "d_bias");
    free(x), free(w), free(b), free(out), free(dout), free(dx), free(dw), free(db);
}

Test(transformer, gelu_tanh_approximation)
{
    float x[200], y[200], dy[200], dx[200];
    double want[200], slope[200];
    for (int i = 0; i < 200; i++) {
        x[i] = (float)(i - 100) / 20.0f;
        dy[i] = 1.0f;
        double u = sqrt(2.0 / M_PI) * (x[i] + 0.044715 * pow(x[i], 3));
        want[i] = 0.5 * x[i] * (1 + tanh(u));
        double h = 1e-4, a = x[i] + h, b = x[i] - h;
        double fa = 0.5 * a * (1 + tanh(sqrt(2.0 / M_PI) * (a + 0.044715 * a * a * a)));
        double fb = 0.5 * b * (1 + tanh(sqrt(2.0 / M_PI) * (b + 0.044715 * b * b * b)));
        slope[i] = (fa - fb) / (2 * h);
    }
    gelu_forward(y, x, 200);
    gelu_backward(dx, x, dy, 200);
    assert_close(y, want, 200, 1e-6, "gelu");
    assert_close(dx, slope, 200, 1e-5, "gelu'");
}

static void rmsnorm_naive(double *out, const float *x, const float *w, int64_t N, int64_t C, double eps)
{
    for (int64_t n = 0; n < N; n++) {
        double ms = 0;
        for (int64_t c = 0; c < C; c++) ms += (double)x[n * C + c] * x[n * C + c];
        ms /= (double)C;
        for (int64_t c = 0; c < C; c++) out[n * C + c] = x[n * C + c] / sqrt(ms + eps) * w[c];
    }
}

typedef struct {
    float *x, *w;
    int64_t N, C;
    double eps;
} rms_ctx;

static void rms_eval(double *out, void *ctx)
{
    rms_ctx *c = ctx;
    rmsnorm_naive(out, c->x, c->w, c->N, c->C, c->eps);
}

/* Gradients accumulate: they start from random values, and what was added
 * is compared with the finite differences. Rows scaled differently (and one
 * shifted) so that rstd differs between rows. */
Test(transformer, rmsnorm_against_naive_and_finite_differences)
{
    int64_t N = 5, C = 24;
    float eps = 1e-5f;
    float *x = random_floats(N * C), *w = random_floats(C), *out = malloc(N * C * 4), rstd[5];
    for (int64_t i = 0; i < N * C; i++) x[i] = x[i] * (float)(1 + i / C) + (i / C == 2 ? 0.7f : 0.0f);
    float *dout = random_floats(N * C), *dx = random_floats(N * C), *dw = random_floats(C);
    float *dx0 = malloc(N * C * 4), *dw0 = malloc(C * 4);
    memcpy(dx0, dx, N * C * 4);
    memcpy(dw0, dw, C * 4);
    rmsnorm_forward(out, rstd, x, w, N, C, eps);
    double want[5 * 24];
    rmsnorm_naive(want, x, w, N, C, eps);
    assert_close(out, want, N * C, 1e-6, "rmsnorm");
    for (int64_t n = 0; n < N; n++) {
        double ms = 0;
        for (int64_t c = 0; c < C; c++) ms += (double)x[n * C + c] * x[n * C + c];
        double r = 1 / sqrt(ms / (double)C + eps);
        cr_assert(fabs(rstd[n] - r) <= 1e-6 * r, "rstd[%lld]: %g, want %g", (long long)n, rstd[n], r);
    }
    rmsnorm_backward(dx, NULL, dw, dout, x, w, rstd, N, C);
    for (int64_t i = 0; i < N * C; i++) dx[i] -= dx0[i];
    for (int64_t i = 0; i < C; i++) dw[i] -= dw0[i];
    rms_ctx ctx = {x, w, N, C, eps};
    double grads[5 * 24];
    for (int64_t i = 0; i < N * C; i++) grads[i] = numeric_grad(x, i, dout, N * C, rms_eval, &ctx);
    assert_close(dx, grads, N * C, 2e-3, "d_in (added)");
    for (int64_t i = 0; i < C; i++) grads[i] = numeric_grad(w, i, dout, N * C, rms_eval, &ctx);
    assert_close(dw, grads, C, 2e-3, "d_weight (added)");
    free(x), free(w), free(out), free(dout), free(dx), free(dw), free(dx0), free(dw0);
}

/* The norms' backward with d_in_bits: d_in, d_weight and d_bias bit for bit
 * as without them, and d_in_bits the bits of rounding the new d_in (to
 * nearest, ties to even: round_to_bf16), at 1 and 3 threads; rows of 77
 * (odd) and 768 (GPT-2's) columns. d_in starts from values at ties (an fp32
 * whose low half is 0x8000: 1 + 2^-8 rounds down to 1, 1 + 3 2^-8 up to
 * 1 + 2^-6) in rows whose d_out is 0, so that those rows add +0 and keep
 * them: rounding them another way, or truncating, fails. */
Test(transformer, norms_backward_writes_the_bits_of_the_new_d_in)
{
    const int64_t widths[2] = {77, 768}, N = 6;
    for (int threads = 1; threads <= 3; threads += 2) {
        kernels_set_threads(threads);
        for (int wi = 0; wi < 2; wi++) {
            int64_t C = widths[wi], n = N * C;
            float *x = random_floats(n), *w = random_floats(C), *b = random_floats(C), *out = malloc(n * 4);
            float *dout = random_floats(n), *dx0 = random_floats(n), mean[6], rstd[6];
            for (int64_t i = 0; i < C; i++) { /* rows 0 and 1: ties, and nothing added */
                dout[i] = dout[C + i] = 0.0f;
                dx0[i] = i % 2 ? 1.00390625f : -1.01171875f;
                dx0[C + i] = ldexpf(i % 2 ? 1.01171875f : -1.00390625f, (int)(i % 7) - 3);
            }
            layernorm_forward(out, mean, rstd, x, w, b, N, C);
            for (int rms = 0; rms < 2; rms++) {
                float *want_dx = malloc(n * 4), *got_dx = malloc(n * 4), *want_dw = calloc(C, 4), *got_dw = calloc(C, 4);
                float *want_db = calloc(C, 4), *got_db = calloc(C, 4);
                uint16_t *bits = malloc(n * sizeof *bits);
                cr_assert(want_dx && got_dx && want_dw && got_dw && want_db && got_db && bits);
                memcpy(want_dx, dx0, n * 4);
                memcpy(got_dx, dx0, n * 4);
                if (rms) {
                    rmsnorm_backward(want_dx, NULL, want_dw, dout, x, w, rstd, N, C);
                    rmsnorm_backward(got_dx, bits, got_dw, dout, x, w, rstd, N, C);
                } else {
                    layernorm_backward(want_dx, NULL, want_dw, want_db, dout, x, w, mean, rstd, N, C);
                    layernorm_backward(got_dx, bits, got_dw, got_db, dout, x, w, mean, rstd, N, C);
                }
                char name[80];
                snprintf(name, sizeof name, "%s, C=%lld, %d threads", rms ? "rmsnorm_backward" : "layernorm_backward",
                         (long long)C, threads);
                cr_assert_eq(memcmp(got_dx, want_dx, n * 4), 0, "%s: d_in", name);
                cr_assert_eq(memcmp(got_dw, want_dw, C * 4), 0, "%s: d_weight", name);
                cr_assert_eq(memcmp(got_db, want_db, C * 4), 0, "%s: d_bias", name);
                floats_assert_rounded(bits, want_dx, n, name); /* d_in_bits */
                for (int64_t c = 0; c < C; c++) { /* the ties, kept: 1 and -(1 + 2^-6); 1 + 2^-6 and -1, scaled */
                    uint16_t scaled = (uint16_t)(((int)(c % 7) - 3) * 0x80); /* 2^e: e added to the exponent */
                    uint16_t row0 = c % 2 ? 0x3f80 : 0xbf82, row1 = (uint16_t)((c % 2 ? 0x3f82 : 0xbf80) + scaled);
                    cr_assert_eq(bits[c], row0, "%s: the tie d_in[%lld] rounded to 0x%04x, want 0x%04x", name,
                                 (long long)c, bits[c], row0);
                    cr_assert_eq(bits[C + c], row1, "%s: the tie d_in[%lld] rounded to 0x%04x, want 0x%04x", name,
                                 (long long)(C + c), bits[C + c], row1);
                }
                free(want_dx), free(got_dx), free(want_dw), free(got_dw), free(want_db), free(got_db), free(bits);
            }
            free(x), free(w), free(b), free(out), free(dout), free(dx0);
        }
    }
    kernels_set_threads(1);
}

static double silu_exact(double g)
{
    return g / (1 + exp(-g));
}

static void swiglu_naive(double *out, const float *in, int64_t N, int64_t F)
{
    for (int64_t n = 0; n < N; n++)
        for (int64_t f = 0; f < F; f++) out[n * F + f] = silu_exact(in[n * 2 * F + f]) * in[n * 2 * F + F + f];
}

typedef struct {
    float *in;
    int64_t N, F;
} swiglu_ctx;

static void swiglu_eval(double *out, void *ctx)
{
    swiglu_ctx *c = ctx;
    swiglu_naive(out, c->in, c->N, c->F);
}

/* [gate | up] per row: gates in [-6, 6), ups in [-1, 1). The backward
 * overwrites d_in (it starts from garbage); checked against finite
 * differences of the double forward. */
Test(transformer, swiglu_against_naive_and_finite_differences)
{
    int64_t N = 3, F = 11;
    float *in = random_floats(N * 2 * F), *dout = random_floats(N * F), *out = malloc(N * F * 4);
    float *din = malloc(N * 2 * F * 4);
    for (int64_t n = 0; n < N; n++)
        for (int64_t f = 0; f < F; f++) in[n * 2 * F + f] *= 6.0f;
    for (int64_t i = 0; i < N * 2 * F; i++) din[i] = 7.0f;
    swiglu_forward(out, in, N, F);
    double want[3 * 11], grads[3 * 22];
    swiglu_naive(want, in, N, F);
    assert_close(out, want, N * F, 1e-6, "swiglu");
    swiglu_backward(din, in, dout, N, F);
    swiglu_ctx ctx = {in, N, F};
    for (int64_t i = 0; i < N * 2 * F; i++) grads[i] = numeric_grad(in, i, dout, N * F, swiglu_eval, &ctx);
    assert_close(din, grads, N * 2 * F, 2e-3, "d_in");
    free(in), free(dout), free(out), free(din);
}

/* silu through fast_expf, element by element against double, over
 * [-30, 30] (where the up value is 1): every value within 4 ulp (relative
 * 2.4e-7), and the derivative within 1e-6 (relative to max(1, |silu'|)).
 * The trainer's logits must agree with PyTorch to 1e-5. */
Test(transformer, silu_within_a_few_ulp)
{
    enum { COUNT = 60001 };
    float *in = malloc(COUNT * 2 * sizeof(float)), *out = malloc(COUNT * sizeof(float));
    float *ones = malloc(COUNT * sizeof(float)), *din = malloc(COUNT * 2 * sizeof(float));
    for (int i = 0; i < COUNT; i++) {
        in[i] = -30.0f + (float)i * 1e-3f;
        in[COUNT + i] = 1.0f;
        ones[i] = 1.0f;
    }
    /* One row of F = COUNT: gates, then ups. */
    swiglu_forward(out, in, 1, COUNT);
    swiglu_backward(din, in, ones, 1, COUNT);
    double worst = 0, worst_at = 0, worst_slope = 0, worst_slope_at = 0;
    for (int i = 0; i < COUNT; i++) {
        double g = in[i], want = silu_exact(g), relative = fabs(out[i] - want) / fabs(want);
        if (want != 0 && relative > worst) worst = relative, worst_at = g;
        double s = 1 / (1 + exp(-g)), slope = s * (1 + g * (1 - s));
        double error = fabs(din[i] - slope) / fmax(1.0, fabs(slope));
        if (error > worst_slope) worst_slope = error, worst_slope_at = g;
        cr_assert(fabs(din[COUNT + i] - want) <= 4 * 0x1.0p-24 * fabs(want) + 1e-30, "d_up at %g", g);
    }
    cr_assert(worst < 4 * 0x1.0p-24, "silu(%g) is %.3g off (relative), more than 4 ulp", worst_at, worst);
    cr_assert(worst_slope < 1e-6, "silu'(%g) is %.3g off", worst_slope_at, worst_slope);
    free(in), free(out), free(ones), free(din);
}

/* Rotary embeddings in double, from the same table: the Q and K heads of
 * each row turn, element j paired with j + hd/2 (rotate-half); V is copied. */
typedef struct {
    float *qkv;
    const float *cos_sin;
    int64_t B, T, Hq, Hkv, hd;
} rope_ctx;

static void rope_naive(double *out, void *ctx)
{
    rope_ctx *c = ctx;
    int64_t half = c->hd / 2, stride = (c->Hq + 2 * c->Hkv) * c->hd;
    for (int64_t r = 0; r < c->B * c->T; r++) {
        const float *x = c->qkv + r * stride, *cs = c->cos_sin + (r % c->T) * half * 2;
        double *y = out + r * stride;
        for (int64_t i = 0; i < stride; i++) y[i] = x[i];
        for (int64_t h = 0; h < c->Hq + c->Hkv; h++)
            for (int64_t j = 0; j < half; j++) {
                double a = x[h * c->hd + j], b = x[h * c->hd + j + half], cosine = cs[2 * j], sine = cs[2 * j + 1];
                y[h * c->hd + j] = a * cosine - b * sine;
                y[h * c->hd + j + half] = b * cosine + a * sine;
            }
    }
}

/* Several heads, Hq != Hkv, several batches and positions: the forward
 * against the double reference, V bit for bit untouched; the backward
 * undoes the forward and equals the finite differences of sum(w * rope(x))
 * (V's gradient passed through). */
Test(transformer, rope_forward_and_backward)
{
    int64_t B = 2, T = 5, Hq = 4, Hkv = 2, hd = 8, stride = (Hq + 2 * Hkv) * hd, n = B * T * stride;
    float freq[4], cos_sin[5 * 4 * 2];
    rope_frequencies(freq, hd, 10000.0, NULL);
    rope_table(cos_sin, freq, T, hd);
    float *x = random_floats(n), *y = malloc(n * 4), *w = random_floats(n), *dx = malloc(n * 4);
    memcpy(y, x, n * 4);
    rope_forward(y, cos_sin, B, T, Hq, Hkv, hd);
    double *want = malloc(n * sizeof(double)), *grads = malloc(n * sizeof(double));
    rope_ctx ctx = {x, cos_sin, B, T, Hq, Hkv, hd};
    rope_naive(want, &ctx);
    assert_close(y, want, n, 1e-6, "rope");
    int moved = 0;
    for (int64_t r = 0; r < B * T; r++)
        for (int64_t i = 0; i < stride; i++) {
            if (i >= (Hq + Hkv) * hd)
                cr_assert(memcmp(&y[r * stride + i], &x[r * stride + i], 4) == 0, "V changed at row %lld", (long long)r);
            else moved += y[r * stride + i] != x[r * stride + i];
        }
    cr_assert(moved > B * (T - 1) * (Hq + Hkv) * hd / 2, "Q and K turned (all but position 0)");
    memcpy(dx, y, n * 4);
    rope_backward(dx, cos_sin, B, T, Hq, Hkv, hd);
    for (int64_t i = 0; i < n; i++) want[i] = x[i];
    assert_close(dx, want, n, 1e-6, "backward of forward");
    memcpy(dx, w, n * 4);
    rope_backward(dx, cos_sin, B, T, Hq, Hkv, hd);
    for (int64_t i = 0; i < n; i++) grads[i] = numeric_grad(x, i, w, n, rope_naive, &ctx);
    assert_close(dx, grads, n, 1e-5, "d_qkv");
    free(x), free(y), free(w), free(dx), free(want), free(grads);
}

/* The table: (cos, sin) of t * freq[j] per position t and frequency j, the
 * angle rounded to fp32 as Hugging Face computes it (at t = 24 that moves
 * cos by more than an ulp), then within half an ulp. */
Test(transformer, rope_table_of_cos_and_sin)
{
    int64_t T = 40, hd = 16;
    float freq[8], cos_sin[40 * 8 * 2];
    rope_frequencies(freq, hd, 10000.0, NULL);
    rope_table(cos_sin, freq, T, hd);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < hd / 2; j++) {
            double angle = (float)t * freq[j], exact = (double)t * freq[j];
            const float *cs = cos_sin + (t * hd / 2 + j) * 2;
            cr_assert(fabs(cs[0] - cos(angle)) <= 0x1.0p-25 && fabs(cs[1] - sin(angle)) <= 0x1.0p-25,
                      "t %lld j %lld: (%.9g, %.9g), want (%.9g, %.9g)", (long long)t, (long long)j, cs[0], cs[1],
                      cos(angle), sin(angle));
            cr_assert(fabs(cs[0] - cos(exact)) < 1e-6 && fabs(cs[1] - sin(exact)) < 1e-6, "t %lld j %lld",
                      (long long)t, (long long)j);
        }
    cr_assert(cos_sin[0] == 1.0f && cos_sin[1] == 0.0f, "position 0 does not turn");
}

/* Hugging Face's default frequencies, theta^(-2j/hd): fp32 as PyTorch
 * computes them, so within a few 1e-7 of the exact values (the fp32
 * exponent 2j/hd is off by up to half an ulp, times ln(theta) ~ 9). */
Test(transformer, rope_frequencies_as_hugging_face)
{
    float freq[32];
    rope_frequencies(freq, 64, 10000.0, NULL);
    cr_assert_eq(freq[0], 1.0f);
    cr_assert(fabs(freq[1] - 0.74989420933245582) < 1e-7, "10000^(-2/64): %.9g", freq[1]);
    for (int j = 0; j < 32; j++) {
        double want = pow(10000.0, -2.0 * j / 64);
        cr_assert(fabs(freq[j] - want) <= 1e-6 * want, "freq[%d]: %.9g, want %.9g", j, freq[j], want);
    }
    rope_scaling none = {0, 1, 4, 8192};
    float same[32];
    rope_frequencies(same, 64, 10000.0, &none);
    cr_assert_eq(memcmp(same, freq, sizeof freq), 0, "factor 0: no scaling");
}

/* Llama 3.x's scaling (factor 32, low 1, high 4, original 8192, theta
 * 500000, hd 64) against the formula of transformers'
 * _compute_llama3_parameters evaluated in double here; each of its three
 * regimes is met. */
Test(transformer, rope_frequencies_with_llama3_scaling)
{
    rope_scaling scaling = {32, 1, 4, 8192};
    float freq[32];
    rope_frequencies(freq, 64, 500000.0, &scaling);
    int kept = 0, divided = 0, blended = 0;
    for (int j = 0; j < 32; j++) {
        double inv = pow(500000.0, -2.0 * j / 64), wavelen = 2 * M_PI / inv, want;
        if (wavelen < 8192.0 / 4) want = inv, kept++;
        else if (wavelen > 8192.0 / 1) want = inv / 32, divided++;
        else {
            double smooth = (8192.0 / wavelen - 1) / (4 - 1);
            want = (1 - smooth) * inv / 32 + smooth * inv;
            blended++;
        }
        cr_assert(fabs(freq[j] - want) <= 2e-6 * want, "freq[%d]: %.9g, want %.9g", j, freq[j], want);
    }
    cr_assert(kept > 0 && divided > 0 && blended > 0, "kept %d, divided %d, blended %d", kept, divided, blended);
}

Test(transformer, fast_exp_within_three_ulp_of_exp)
{
    double worst = 0, worst_at = 0;
    for (int i = 0; i <= 1750000; i++) {
        float x = -87.0f + (float)i * 1e-4f;
        double want = exp((double)x), relative = fabs(fast_expf(x) - want) / want;
        if (relative > worst) worst = relative, worst_at = x;
    }
    cr_assert(worst < 3 * 0x1.0p-24, "fast_expf(%g) is %.3g off (relative), more than 3 ulp", worst_at, worst);
    cr_assert_eq(fast_expf(0.0f), 1.0f);
    cr_assert(fast_expf(-1000.0f) > 0 && fast_expf(-1000.0f) < 1e-37f, "clamped below at exp(-87)");
    cr_assert(isfinite(fast_expf(1000.0f)) && fast_expf(1000.0f) > 1e38f, "clamped above at exp(88)");
    cr_assert(isnan(fast_expf(NAN)), "NaN stays NaN");
    /* At run time (a constant folds): a NaN of either sign once reached a
     * NaN-to-int conversion and a shift of a negative value, which UBSan
     * (make asan) reports; a diverged run's attention met it. */
    volatile float nans[2] = {NAN, -NAN};
    for (int i = 0; i < 2; i++) cr_assert(isnan(fast_expf(nans[i])), "NaN %d stays NaN", i);
}

typedef struct {
    float *qkv;
    int64_t B, T, Hq, Hkv, hd;
} att_ctx;

/* Dense causal attention in double: out, and when lse is not NULL each
 * row's log-sum-exp; when d_qkv is not NULL also the gradient of
 * sum(d_out * out) by the textbook softmax backward over the full [T, T]
 * probabilities (no log-sum-exp, no blocks: independent of attention.c). */
static void attention_dense(const att_ctx *c, double *out, double *lse, const float *d_out, double *d_qkv)
{
    int64_t T = c->T, hd = c->hd, stride = (c->Hq + 2 * c->Hkv) * hd, group = c->Hq / c->Hkv, os = c->Hq * hd;
    double *p = malloc((size_t)(T * T) * sizeof(double)), *dp = malloc((size_t)(T * T) * sizeof(double));
    if (d_qkv) memset(d_qkv, 0, (size_t)(c->B * T * stride) * sizeof(double));
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++) {
            int64_t qo = h * hd, ko = (c->Hq + h / group) * hd, vo = (c->Hq + c->Hkv + h / group) * hd;
            const float *x = c->qkv + b * T * stride;
            for (int64_t i = 0; i < T; i++) {
                double max = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < hd; d++) s += (double)x[i * stride + qo + d] * x[j * stride + ko + d];
                    p[i * T + j] = s / sqrt((double)hd);
                    max = fmax(max, p[i * T + j]);
                }
                for (int64_t j = 0; j <= i; j++) sum += p[i * T + j] = exp(p[i * T + j] - max);
                for (int64_t j = 0; j <= i; j++) p[i * T + j] /= sum;
                if (lse) lse[(b * c->Hq + h) * T + i] = max + log(sum);
                for (int64_t d = 0; d < hd; d++) {
                    double y = 0;
                    for (int64_t j = 0; j <= i; j++) y += p[i * T + j] * x[j * stride + vo + d];
                    out[(b * T + i) * os + qo + d] = y;
                }
            }
            if (!d_qkv) continue;
            const float *g = d_out + b * T * os + qo;
            double *dx = d_qkv + b * T * stride;
            for (int64_t i = 0; i < T; i++) {
                double dot = 0;
                for (int64_t j = 0; j <= i; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < hd; d++) s += (double)g[i * os + d] * x[j * stride + vo + d];
                    dp[i * T + j] = s;
                    dot += p[i * T + j] * s;
                    for (int64_t d = 0; d < hd; d++) dx[j * stride + vo + d] += p[i * T + j] * g[i * os + d];
                }
                for (int64_t j = 0; j <= i; j++) {
                    double ds = p[i * T + j] * (dp[i * T + j] - dot) / sqrt((double)hd);
                    for (int64_t d = 0; d < hd; d++) {
                        dx[i * stride + qo + d] += ds * x[j * stride + ko + d];
                        dx[j * stride + ko + d] += ds * x[i * stride + qo + d];
                    }
                }
            }
        }
    free(p), free(dp);
}

static void attention_naive(double *out, void *ctx)
{
    attention_dense(ctx, out, NULL, NULL, NULL);
}

/* Small: the backward against finite differences of the dense forward. */
Test(transformer, attention_with_grouped_heads)
{
    int64_t B = 2, T = 6, Hq = 4, Hkv = 2, hd = 3;
    int64_t n_in = B * T * (Hq + 2 * Hkv) * hd, n_out = B * T * Hq * hd;
    float *qkv = random_floats(n_in), *out = malloc(n_out * 4), *lse = malloc(B * Hq * T * 4);
    float *dout = random_floats(n_out), *dqkv = malloc(n_in * 4);
    float *scratch = malloc((size_t)attention_scratch_floats(B, T, Hq) * 4);
    cr_assert_eq(attention_forward(out, lse, scratch, qkv, B, T, Hq, Hkv, hd), TP_OK, "%s", tp_errmsg());
    att_ctx ctx = {qkv, B, T, Hq, Hkv, hd};
    double *want = malloc(n_out * sizeof(double)), *grads = malloc(n_in * sizeof(double));
    attention_naive(want, &ctx);
    assert_close(out, want, n_out, 1e-5, "attention");
    cr_assert_eq(attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, Hq, Hkv, hd), TP_OK, "%s", tp_errmsg());
    for (int64_t i = 0; i < n_in; i++) grads[i] = numeric_grad(qkv, i, dout, n_out, attention_naive, &ctx);
    assert_close(dqkv, grads, n_in, 2e-3, "d_qkv");
    free(qkv), free(out), free(lse), free(dout), free(dqkv), free(scratch), free(want), free(grads);
}

/* Longer than ATTENTION_ROWS (blocks of 64, 64 and 19 query rows; the
 * scratch as small as promised, between guards): out, lse and d_qkv
 * against the dense double reference. */
Test(transformer, attention_over_several_blocks_of_rows)
{
    int64_t B = 2, T = 2 * ATTENTION_ROWS + 19, Hq = 3, Hkv = 1, hd = 8;
    int64_t n_in = B * T * (Hq + 2 * Hkv) * hd, n_out = B * T * Hq * hd, n_lse = B * Hq * T;
    int64_t n_scratch = attention_scratch_floats(B, T, Hq);
    float *qkv = random_floats(n_in), *out = malloc(n_out * 4), *lse = malloc(n_lse * 4);
    float *dout = random_floats(n_out), *dqkv = malloc(n_in * 4), *guarded = malloc((n_scratch + 2) * 4);
    for (int64_t i = 0; i < n_in; i++) qkv[i] *= 2.0f; /* peakier softmax */
    guarded[0] = guarded[n_scratch + 1] = 12345.0f;
    cr_assert_eq(attention_forward(out, lse, guarded + 1, qkv, B, T, Hq, Hkv, hd), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(attention_backward(dqkv, guarded + 1, dout, qkv, out, lse, B, T, Hq, Hkv, hd), TP_OK, "%s", tp_errmsg());
    cr_assert(guarded[0] == 12345.0f && guarded[n_scratch + 1] == 12345.0f, "scratch written out of its bounds");
    att_ctx ctx = {qkv, B, T, Hq, Hkv, hd};
    double *want = malloc(n_out * sizeof(double)), *want_lse = malloc(n_lse * sizeof(double));
    double *want_grad = malloc(n_in * sizeof(double));
    attention_dense(&ctx, want, want_lse, dout, want_grad);
    assert_close(out, want, n_out, 1e-5, "out");
    assert_close(lse, want_lse, n_lse, 1e-6, "lse");
    assert_close(dqkv, want_grad, n_in, 1e-5, "d_qkv");
    free(qkv), free(out), free(lse), free(dout), free(dqkv), free(guarded), free(want), free(want_lse);
    free(want_grad);
}

Test(transformer, vocabulary_parallel_embedding_and_cross_entropy)
{
    /* Vocabulary 10 padded to 12, split over 3 ranks of 4 rows; the pieces
     * reduced by hand must give the dense embedding and loss. */
    int64_t N = 5, C = 3, V = 10, Vp = 12, ranks = 3, rows = Vp / ranks;
    int tokens[5] = {0, 4, 9, 7, 3}, targets[5] = {2, 9, 0, 5, 8};
    float *table = random_floats(Vp * C), *x = random_floats(N * C);
    float emb[15] = {0}, part[15];
    for (int64_t r = 0; r < ranks; r++) {
        embedding_forward(part, tokens, table + r * rows * C, N, C, r * rows, rows);
        for (int i = 0; i < 15; i++) emb[i] += part[i];
    }
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) cr_assert_eq(emb[n * C + c], table[tokens[n] * C + c]);
    /* logits = x @ table^T, per rank its columns */
    float logits[3][5 * 4], max[5], sum[5] = {0}, target[5] = {0}, part_max[3][5], part_sum[3][5], part_target[5];
    for (int64_t n = 0; n < N; n++) max[n] = -INFINITY;
    for (int64_t r = 0; r < ranks; r++) { /* each rank's statistics, then the max over ranks */
        matmul_forward(logits[r], x, table + r * rows * C, NULL, N, C, rows);
        crossentropy_row_stats(part_max[r], part_sum[r], logits[r], N, rows, r * rows, V);
        for (int64_t n = 0; n < N; n++) max[n] = fmaxf(max[n], part_max[r][n]);
    }
    /* The last rank holds 2 real columns of 4: its padding takes no part. */
    for (int64_t n = 0; n < N; n++) {
        float want_max = fmaxf(logits[2][n * rows], logits[2][n * rows + 1]);
        cr_assert_eq(part_max[2][n], want_max, "rank 2's row max of row %lld", (long long)n);
    }
    for (int64_t r = 0; r < ranks; r++) { /* each rank's sums made relative to the max over ranks, then added */
        crossentropy_rescale_sum(part_sum[r], part_max[r], max, N);
        crossentropy_target_logit(part_target, logits[r], targets, N, rows, r * rows);
        for (int64_t n = 0; n < N; n++) sum[n] += part_sum[r][n], target[n] += part_target[n];
    }
    for (int64_t n = 0; n < N; n++) {
        double dense[10], m = -INFINITY, s = 0;
        for (int64_t v = 0; v < V; v++) {
            dense[v] = 0;
            for (int64_t c = 0; c < C; c++) dense[v] += (double)x[n * C + c] * table[v * C + c];
            m = fmax(m, dense[v]);
        }
        for (int64_t v = 0; v < V; v++) s += exp(dense[v] - m);
        double loss = log(s) + m - dense[targets[n]];
        double got = log(sum[n]) + max[n] - target[n];
        cr_assert(fabs(got - loss) < 1e-5, "loss of row %lld: %g, want %g", (long long)n, got, loss);
        for (int64_t r = 0; r < ranks; r++) {
            float d[5 * 4], in_place[5 * 4];
            crossentropy_backward(d, logits[r], max, sum, targets, N, rows, r * rows, V, 0.5f);
            memcpy(in_place, logits[r], sizeof in_place); /* written over the logits, as the trainer does */
            crossentropy_backward(in_place, in_place, max, sum, targets, N, rows, r * rows, V, 0.5f);
            cr_assert_eq(memcmp(in_place, d, sizeof d), 0, "rank %lld: d_logits in place differ", (long long)r);
            for (int64_t k = 0; k < rows; k++) {
                int64_t v = r * rows + k;
                double want = v >= V ? 0 : 0.5 * (exp(dense[v] - m) / s - (v == targets[n]));
                cr_assert(fabs(d[n * rows + k] - want) < 1e-6, "d_logits[%lld][%lld]", (long long)n, (long long)v);
            }
        }
    }
    free(table), free(x);
}

/* Rows longer than the CPU's chunks of 256 columns, whose maximum comes in
 * the first chunk, in the last, and in between; padding columns (vocab
 * ends inside the rank's columns) left out; a rank without real columns:
 * -infinity and 0. Against double sums: the max exact, the sum within
 * 1e-5 relative; rescale_sum against exp of the difference. */
Test(transformer, crossentropy_row_stats_in_one_pass)
{
    enum { N = 6, V = 1000 };
    int64_t first = 2000, vocab = 2000 + 900; /* 900 real columns, 100 padding */
    float *logits = malloc((size_t)N * V * sizeof(float)), row_max[N], sum[N];
    for (int64_t i = 0; i < N * V; i++) logits[i] = 8.0f * uniform();
    logits[0 * V + 3] = 30.0f;   /* row 0: the max in the first chunk */
    logits[1 * V + 899] = 30.0f; /* row 1: in the last real column */
    logits[1 * V + 950] = 99.0f; /* a padding column: not taken */
    for (int64_t v = 0; v < V; v++) logits[2 * V + v] = (float)v / 50.0f; /* row 2: rising through every chunk */
    logits[3 * V + 600] = -40.0f;                                        /* row 3: random, one far below */
    for (int64_t v = 0; v < 256; v++) logits[4 * V + v] = -INFINITY;    /* row 4: a first chunk of -inf */
    for (int64_t v = 256; v < 512; v++) logits[5 * V + v] = NAN;        /* row 5: a chunk of NaN: the sum NaN */
    crossentropy_row_stats(row_max, sum, logits, N, V, first, vocab);
    cr_assert(isnan(sum[5]), "a row with a chunk of NaN: sum %g, want NaN", sum[5]);
    for (int n = 0; n < N - 1; n++) {
        double max = -INFINITY, s = 0;
        for (int64_t v = 0; v < 900; v++) max = fmax(max, logits[n * V + v]);
        for (int64_t v = 0; v < 900; v++) s += exp((double)logits[n * V + v] - max);
        cr_assert_eq(row_max[n], (float)max, "row %d: max %.9g, want %.9g", n, row_max[n], max);
        cr_assert(fabs(sum[n] - s) <= 1e-5 * s, "row %d: sum %.9g, want %.9g", n, sum[n], s);
    }
    float none_max[N], none_sum[N];
    crossentropy_row_stats(none_max, none_sum, logits, N, V, vocab, vocab); /* a rank past the vocabulary */
    for (int n = 0; n < N; n++)
        cr_assert(none_max[n] == -INFINITY && none_sum[n] == 0, "row %d without columns: %g, %g", n, none_max[n],
                  none_sum[n]);
    float global[N] = {31.0f, 31.0f, 30.0f, 20.0f, 20.0f, 20.0f}, scaled[N];
    memcpy(scaled, sum, sizeof sum);
    crossentropy_rescale_sum(scaled, row_max, global, N);
    for (int n = 0; n < N - 1; n++) {
        double want = sum[n] * exp((double)row_max[n] - global[n]);
        cr_assert(fabs(scaled[n] - want) <= 1e-6 * want, "row %d rescaled: %.9g, want %.9g", n, scaled[n], want);
    }
    crossentropy_rescale_sum(none_sum, none_max, global, N);
    for (int n = 0; n < N; n++) cr_assert(none_sum[n] == 0, "row %d without columns rescaled: %g", n, none_sum[n]);
    free(logits);
}

Test(transformer, adamw_step_formula)
{
    float p[3] = {0.5f, -1.0f, 2.0f}, g[3] = {0.1f, -0.2f, 0.0f}, m[3] = {0}, v[3] = {0};
    for (int64_t step = 1; step <= 3; step++) adamw_update(p, g, m, v, 3, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
    /* The same three steps in double. */
    double P[3] = {0.5, -1.0, 2.0}, M[3] = {0}, Vv[3] = {0};
    for (int step = 1; step <= 3; step++)
        for (int i = 0; i < 3; i++) {
            P[i] *= 1 - 1e-2 * 0.1;
            M[i] = 0.9 * M[i] + 0.1 * g[i];
            Vv[i] = 0.95 * Vv[i] + 0.05 * (double)g[i] * g[i];
            double mh = M[i] / (1 - pow(0.9, step)), vh = Vv[i] / (1 - pow(0.95, step));
            P[i] -= 1e-2 * mh / (sqrt(vh) + 1e-8);
        }
    for (int i = 0; i < 3; i++) cr_assert(fabs(p[i] - P[i]) < 1e-6, "param %d: %g, want %g", i, p[i], P[i]);
}

/* One call over many tensors is one adamw_update per tensor, to the bit:
 * sizes of 0 and 1 and tensors large enough that the workers' shares cut
 * through them; weight decay on every other. Every third writes its bf16
 * copy in the update (param_bits): round_to_bf16 of the updated values,
 * exactly, and nothing past them. */
Test(transformer, adamw_update_tensors_equals_each_tensor_alone)
{
    enum { COUNT = 9 };
    const int64_t sizes[COUNT] = {0, 1, 70001, 3, 0, 40000, 17, 100003, 5};
    float *alone[COUNT][3], *together[COUNT][3], *grad[COUNT];
    uint16_t *bits[COUNT];
    adamw_tensor tensors[COUNT];
    for (int t = 0; t < COUNT; t++) {
        for (int i = 0; i < 3; i++) {
            alone[t][i] = random_floats(sizes[t] > 0 ? sizes[t] : 1);
            together[t][i] = malloc((size_t)(sizes[t] > 0 ? sizes[t] : 1) * sizeof(float));
            memcpy(together[t][i], alone[t][i], (size_t)sizes[t] * sizeof(float));
        }
        for (int64_t j = 0; j < sizes[t]; j++) alone[t][2][j] = together[t][2][j] = fabsf(alone[t][2][j]); /* v >= 0 */
        bits[t] = malloc((size_t)(sizes[t] + 1) * sizeof(uint16_t));
        cr_assert(bits[t]);
        for (int64_t j = 0; j <= sizes[t]; j++) bits[t][j] = 0x7777;
        tensors[t] = (adamw_tensor){together[t][0], together[t][1], together[t][2], NULL,
                                    sizes[t],       t % 2 ? 0.1f : 0, t % 3 == 0 ? bits[t] : NULL};
    }
    for (int64_t step = 1; step <= 3; step++) {
        for (int t = 0; t < COUNT; t++) {
            grad[t] = random_floats(sizes[t] > 0 ? sizes[t] : 1);
            tensors[t].grad = grad[t];
            adamw_update(alone[t][0], grad[t], alone[t][1], alone[t][2], sizes[t], 6e-4f, 0.9f, 0.95f, 1e-8f,
                         tensors[t].weight_decay, step);
        }
        adamw_update_tensors(tensors, COUNT, 6e-4f, 0.9f, 0.95f, 1e-8f, step);
        for (int t = 0; t < COUNT; t++) free(grad[t]);
    }
    for (int t = 0; t < COUNT; t++)
        for (int i = 0; i < 3; i++) {
            cr_assert(memcmp(alone[t][i], together[t][i], (size_t)sizes[t] * sizeof(float)) == 0,
                      "tensor %d (%lld values): %s differs from adamw_update's", t, (long long)sizes[t],
                      i == 0 ? "param" : i == 1 ? "m" : "v");
            free(alone[t][i]);
        }
    for (int t = 0; t < COUNT; t++) {
        uint16_t *want = malloc((size_t)(sizes[t] + 1) * sizeof(uint16_t));
        cr_assert(want);
        round_to_bf16(want, together[t][0], sizes[t]);
        if (t % 3 == 0)
            cr_assert(memcmp(bits[t], want, (size_t)sizes[t] * sizeof(uint16_t)) == 0,
                      "tensor %d: param_bits are not round_to_bf16 of the updated values", t);
        for (int64_t j = t % 3 == 0 ? sizes[t] : 0; j <= sizes[t]; j++)
            cr_assert_eq(bits[t][j], 0x7777, "tensor %d: value %lld of the bf16 copy written", t, (long long)j);
        for (int i = 0; i < 3; i++) free(together[t][i]);
        free(bits[t]), free(want);
    }
}

Test(transformer, elementwise_sums_scales_and_squares)
{
    /* out[N,C] = x + (partial + bias[C]), in that order of additions. */
    const int64_t N = 3, C = 5;
    float *x = random_floats(N * C), *partial = random_floats(N * C), *bias = random_floats(C);
    float out[15];
    bias_residual_forward(out, x, partial, bias, N, C);
    for (int64_t i = 0; i < N * C; i++) cr_assert_eq(out[i], x[i] + (partial[i] + bias[i % C]), "element %lld", (long long)i);
    float acc[15];
    memcpy(acc, x, sizeof acc);
    add_inplace(acc, partial, N * C);
    scale_inplace(acc, 0.5f, N * C);
    for (int64_t i = 0; i < N * C; i++) cr_assert_eq(acc[i], (x[i] + partial[i]) * 0.5f);
    double want = 0;
    for (int64_t i = 0; i < N * C; i++) want += (double)x[i] * x[i];
    const float *whole[] = {x}, *pieces[] = {x, x + 4, x + 4};
    const int64_t whole_length[] = {N * C}, piece_lengths[] = {4, 0, N * C - 4};
    cr_assert_eq(sum_of_squares(whole, whole_length, 1), want);
    cr_assert(fabs(sum_of_squares(pieces, piece_lengths, 3) - want) <= 1e-15 * want, "spans in pieces");
    cr_assert_eq(sum_of_squares(pieces, piece_lengths, 0), 0.0, "no span");
    free(x);
    free(partial);
    free(bias);
}

Test(transformer, the_cpu_backend_is_the_cpu_functions)
{
    const kernel_backend *cpu = NULL;
    cr_assert_eq(kernels_choose("cpu", 0, 0, &cpu), TP_OK);
    cr_assert_eq(cpu, kernels_cpu());
    cr_assert_eq(cpu->on_device, 0);
    float *in = random_floats(12), out_backend[12], out_direct[12];
    cr_assert_eq(cpu->gelu_forward(out_backend, in, 12), TP_OK);
    gelu_forward(out_direct, in, 12);
    cr_assert_eq(memcmp(out_backend, out_direct, sizeof out_direct), 0);
    /* The Llama operations: N = 2 rows of C = 6 (SwiGLU: F = 3), qkv of
     * B = 1, T = 2, Hq = 1, Hkv = 1, hd = 2 (rows of 6). */
    float *w = random_floats(6), *dout = random_floats(12), rstd_backend[2], rstd_direct[2];
    cr_assert_eq(cpu->rmsnorm_forward(out_backend, rstd_backend, in, w, 2, 6, 1e-5f), TP_OK);
    rmsnorm_forward(out_direct, rstd_direct, in, w, 2, 6, 1e-5f);
    cr_assert_eq(memcmp(out_backend, out_direct, sizeof out_direct), 0, "rmsnorm_forward");
    cr_assert_eq(memcmp(rstd_backend, rstd_direct, sizeof rstd_direct), 0, "rmsnorm_forward's rstd");
    float dw_backend[6] = {0}, dw_direct[6] = {0};
    memset(out_backend, 0, sizeof out_backend);
    memset(out_direct, 0, sizeof out_direct);
    cr_assert_eq(cpu->rmsnorm_backward(out_backend, NULL, dw_backend, dout, in, w, rstd_direct, 2, 6), TP_OK);
    rmsnorm_backward(out_direct, NULL, dw_direct, dout, in, w, rstd_direct, 2, 6);
    cr_assert_eq(memcmp(out_backend, out_direct, sizeof out_direct), 0, "rmsnorm_backward's d_in");
    cr_assert_eq(memcmp(dw_backend, dw_direct, sizeof dw_direct), 0, "rmsnorm_backward's d_weight");
    cr_assert_eq(cpu->swiglu_forward(out_backend, in, 2, 3), TP_OK);
    swiglu_forward(out_direct, in, 2, 3);
    cr_assert_eq(memcmp(out_backend, out_direct, 6 * sizeof(float)), 0, "swiglu_forward");
    cr_assert_eq(cpu->swiglu_backward(out_backend, in, dout, 2, 3), TP_OK);
    swiglu_backward(out_direct, in, dout, 2, 3);
    cr_assert_eq(memcmp(out_backend, out_direct, sizeof out_direct), 0, "swiglu_backward");
    float freq[1], cos_sin[2 * 1 * 2];
    rope_frequencies(freq, 2, 10000.0, NULL);
    rope_table(cos_sin, freq, 2, 2);
    memcpy(out_backend, in, sizeof out_backend);
    memcpy(out_direct, in, sizeof out_direct);
    cr_assert_eq(cpu->rope_forward(out_backend, cos_sin, 1, 2, 1, 1, 2), TP_OK);
    rope_forward(out_direct, cos_sin, 1, 2, 1, 1, 2);
    cr_assert_eq(memcmp(out_backend, out_direct, sizeof out_direct), 0, "rope_forward");
    cr_assert_neq(memcmp(out_backend, in, sizeof out_backend), 0, "rope_forward turned position 1");
    cr_assert_eq(cpu->rope_backward(out_backend, cos_sin, 1, 2, 1, 1, 2), TP_OK);
    rope_backward(out_direct, cos_sin, 1, 2, 1, 1, 2);
    cr_assert_eq(memcmp(out_backend, out_direct, sizeof out_direct), 0, "rope_backward");
    free(in), free(w), free(dout);
    const kernel_backend *none = cpu;
    cr_assert_eq(kernels_choose("gpu", 0, 0, &none), TP_ERR_ARG);
    cr_assert_null(none);
    cr_assert(strstr(tp_errmsg(), "cpu, cuda or auto"), "%s", tp_errmsg());
}

Test(transformer, auto_and_cuda_without_a_gpu)
{
    if (cuda_device_count() > 0) cr_skip_test("this machine has a GPU (tests/kernels/test_cuda_backend.c covers it)");
    const kernel_backend *chosen = NULL;
    cr_assert_eq(kernels_choose("auto", 0, 0, &chosen), TP_OK);
    cr_assert_eq(chosen, kernels_cpu(), "auto without a GPU is the CPU");
    cr_assert_eq(kernels_choose("cuda", 0, 0, &chosen), TP_ERR_DEVICE);
    cr_assert(strstr(tp_errmsg(), "no CUDA support") || strstr(tp_errmsg(), "no CUDA device"), "%s", tp_errmsg());
    cr_assert_eq(kernels_choose("cuda", 3, 1, &chosen), TP_ERR_DEVICE, "shared or not, no GPU is no GPU");
    cr_assert(strstr(tp_errmsg(), "no CUDA support") || strstr(tp_errmsg(), "no CUDA device"), "%s", tp_errmsg());
}

/* Which GPU a local rank computes on: its own, or with sharing, its rank modulo the GPUs. */
Test(transformer, gpus_for_local_ranks)
{
    int index = 7;
    for (int rank = 0; rank < 4; rank++) {
        cr_assert_eq(kernels_gpu_index(rank, 4, 0, &index), TP_OK);
        cr_assert_eq(index, rank);
    }
    cr_assert_eq(kernels_gpu_index(2, 2, 0, &index), TP_ERR_DEVICE, "a third rank on two GPUs, not shared");
    cr_assert_eq(index, -1);
    cr_assert(strstr(tp_errmsg(), "local rank 2 needs GPU 2, but this machine has 2") &&
                  strstr(tp_errmsg(), "--share-gpus"),
              "%s", tp_errmsg());
    const int ranks = 5, gpus = 2, want[] = {0, 1, 0, 1, 0};
    for (int rank = 0; rank < ranks; rank++) {
        cr_assert_eq(kernels_gpu_index(rank, gpus, 1, &index), TP_OK);
        cr_assert_eq(index, want[rank], "rank %d shares GPU %d", rank, want[rank]);
    }
    cr_assert_eq(kernels_gpu_index(0, 0, 1, &index), TP_ERR_DEVICE, "sharing no GPU");
    cr_assert(strstr(tp_errmsg(), "no CUDA device"), "%s", tp_errmsg());
}

Test(transformer, gpu_peaks_for_model_flops_utilization)
{
    cr_assert_eq(gpu_peak_bf16_flops("NVIDIA H100 80GB HBM3"), 989.4e12);
    cr_assert_eq(gpu_peak_bf16_flops("NVIDIA H200"), 989.4e12);
    cr_assert_eq(gpu_peak_bf16_flops("NVIDIA H100 PCIe"), 756.0e12);
    cr_assert_eq(gpu_peak_bf16_flops("NVIDIA A100-SXM4-80GB"), 312.0e12);
    cr_assert_eq(gpu_peak_bf16_flops("NVIDIA L40S"), 362.05e12, "not taken for an L4");
    cr_assert_eq(gpu_peak_bf16_flops("Some Other GPU"), 0);
    cr_assert_eq(gpu_peak_bf16_flops(""), 0);
    char name[64] = "x";
    if (cuda_device_count() == 0) {
        cuda_device_name(0, name, sizeof name);
        cr_assert_str_eq(name, "", "no device, no name");
    }
}

/* v rounded to bf16 (to nearest, ties to even), as an fp32. */
static float bf16_of(float v)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
    memcpy(&v, &bits, sizeof bits);
    return v;
}

Test(transformer, bf16_products_round_their_operands)
{
    const int64_t N = 5, C = 7, OC = 3;
    float *in = random_floats(N * C), *w = random_floats(OC * C), *bias = random_floats(OC);
    float *in16 = malloc(N * C * sizeof(float)), *w16 = malloc(OC * C * sizeof(float));
    for (int64_t i = 0; i < N * C; i++) in16[i] = bf16_of(in[i]);
    for (int64_t i = 0; i < OC * C; i++) w16[i] = bf16_of(w[i]);
    float got[15], want[15], fp32[15];
    uint16_t in_bits[35]; /* in as a bf16 activation holds it */
    convert_from_f32(in, in_bits, TP_BF16, N * C);
    uint16_t *w_bits = floats_bf16_bits(w, OC * C); /* the trainer's bf16 copy of its weights */
    cr_assert_eq(matmul_forward_bf16(got, in_bits, w_bits, bias, N, C, OC), TP_OK);
    matmul_forward(want, in16, w16, bias, N, C, OC);
    matmul_forward(fp32, in, w, bias, N, C, OC);
    cr_assert_eq(memcmp(got, want, sizeof got), 0, "the product of the rounded operands, summed in fp32");
    cr_assert_neq(memcmp(got, fp32, sizeof got), 0, "not the fp32 product");
    /* Backward: d_out comes as bf16 bits (a gradient inside a layer); d_in and d_weight from the rounded
     * operands, d_bias the sums of d_out's bf16 values (d_weight and d_bias accumulate). */
    float *d_out = random_floats(N * OC), *d_out16 = malloc(N * OC * sizeof(float));
    for (int64_t i = 0; i < N * OC; i++) d_out16[i] = bf16_of(d_out[i]);
    uint16_t d_out_bits[15];
    convert_from_f32(d_out, d_out_bits, TP_BF16, N * OC);
    float d_in[35], d_in_want[35], d_w[21], d_w_want[21], d_b[3], d_b_want[3], d_b_fp32[3];
    for (int i = 0; i < 21; i++) d_w[i] = d_w_want[i] = 0.25f;
    for (int i = 0; i < 3; i++) d_b[i] = d_b_want[i] = d_b_fp32[i] = -0.5f;
    cr_assert_eq(matmul_backward_bf16(d_in, d_w, d_b, d_out_bits, in_bits, w_bits, N, C, OC), TP_OK);
    matmul_backward(d_in_want, d_w_want, d_b_want, d_out16, in16, w16, N, C, OC);
    matmul_backward(NULL, NULL, d_b_fp32, d_out, NULL, NULL, N, C, OC);
    cr_assert_eq(memcmp(d_in, d_in_want, sizeof d_in), 0);
    cr_assert_eq(memcmp(d_w, d_w_want, sizeof d_w), 0);
    cr_assert_eq(memcmp(d_b, d_b_want, sizeof d_b), 0, "d_bias: the sums of d_out's bf16 values");
    cr_assert_neq(memcmp(d_b, d_b_fp32, sizeof d_b), 0, "d_bias: the sums of the fp32 d_out, not rounded");
    free(in), free(w), free(w_bits), free(bias), free(in16), free(w16), free(d_out), free(d_out16);
}

/* bf16 activations: each norm's *_forward_bf16 writes the bits of rounding
 * its fp32 operation's output (kernels.h), at one thread and at several (the
 * rows in shares), on tall and wide shapes, and with values the rounding
 * must carry: ties (an fp32 whose low half is 0x8000) from the norms'
 * bias, large and tiny magnitudes from the inputs' scale. */
Test(transformer, bf16_activations_are_the_rounded_fp32_outputs)
{
    const int64_t shapes[][2] = {{3, 5}, {257, 16}, {4, 1000}, {64, 130}};
    for (int threads = 1; threads <= 3; threads += 2) {
        kernels_set_threads(threads);
        for (int s = 0; s < 4; s++) {
            int64_t N = shapes[s][0], C = shapes[s][1], n = N * C;
            float *x = random_floats(2 * n), *w = random_floats(C), *b = random_floats(C), *y = malloc(2 * n * 4);
            uint16_t *bits = malloc(2 * n * sizeof *bits);
            float mean[1000], rstd[1000], mean16[1000], rstd16[1000];
            for (int64_t i = 0; i < 2 * n; i++) x[i] *= i % 3 == 0 ? 1e4f : i % 3 == 1 ? 1e-3f : 1.0f;
            for (int64_t c = 0; c < C; c += 2) w[c] = 0.0f, b[c] = 1.00390625f; /* 1 + 2^-8: a tie, to even */
            layernorm_forward(y, mean, rstd, x, w, b, N, C);
            cr_assert_eq(layernorm_forward_bf16(bits, mean16, rstd16, x, w, b, N, C), TP_OK, "%s", tp_errmsg());
            floats_assert_rounded(bits, y, n, "layernorm");
            cr_assert_eq(memcmp(mean, mean16, (size_t)N * 4), 0, "layernorm's mean");
            cr_assert_eq(memcmp(rstd, rstd16, (size_t)N * 4), 0, "layernorm's rstd");
            rmsnorm_forward(y, rstd, x, w, N, C, 1e-6f);
            cr_assert_eq(rmsnorm_forward_bf16(bits, rstd16, x, w, N, C, 1e-6f), TP_OK, "%s", tp_errmsg());
            floats_assert_rounded(bits, y, n, "rmsnorm");
            cr_assert_eq(memcmp(rstd, rstd16, (size_t)N * 4), 0, "rmsnorm's rstd");
            free(x), free(w), free(b), free(y), free(bits);
        }
    }
    kernels_set_threads(1);
    /* The tie above rounds to even: 1 + 2^-8 to 1 (0x3f80), not up. */
    float tie = 1.00390625f, x = 0.0f, w = 0.0f;
    uint16_t bits;
    float m, r;
    cr_assert_eq(layernorm_forward_bf16(&bits, &m, &r, &x, &w, &tie, 1, 1), TP_OK);
    cr_assert_eq(bits, 0x3f80, "a tie rounded to 0x%04x, not to even (0x3f80)", bits);
    /* The CPU table gives them. */
    const kernel_backend *k = kernels_cpu();
    cr_assert(k->layernorm_forward_bf16 == layernorm_forward_bf16 && k->rmsnorm_forward_bf16 == rmsnorm_forward_bf16);
}

/* The residual add and the norm in one operation (a block's res1 and ln2)
 * give the bits of the two operations in turn, for both norms, fp32 and
 * bf16 outputs, with and without the residual's bias, the sum written over
 * partial (as the trainer does), over x, or apart; through the CPU table. */
Test(transformer, residual_norms_are_the_add_then_the_norm)
{
    const kernel_backend *k = kernels_cpu();
    const int64_t N = 37, C = 130, n = N * C;
    float *x = random_floats(n), *partial = random_floats(n), *rbias = random_floats(C), *w = random_floats(C);
    size_t floats = (size_t)n * sizeof(float), halves = (size_t)n * sizeof(uint16_t);
    float *b = random_floats(C), *sum = malloc(floats), *want_sum = malloc(floats), *out = malloc(floats);
    float *want_out = malloc(floats), *x_in = malloc(floats), *partial_in = malloc(floats);
    uint16_t *bits = malloc(halves), *want_bits = malloc(halves);
    cr_assert(sum && want_sum && out && want_out && x_in && partial_in && bits && want_bits);
    float mean[37], rstd[37], want_mean[37], want_rstd[37];
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (int rms = 0; rms < 2; rms++)
            for (int with_bias = 0; with_bias < 2; with_bias++)
                for (int place = 0; place < 3; place++) { /* sum over partial, over x, apart */
                    const float *bias_arg = with_bias ? rbias : NULL;
                    /* the two operations in turn */
                    if (with_bias) bias_residual_forward(want_sum, x, partial, rbias, N, C);
                    else residual_forward(want_sum, x, partial, n);
                    if (rms && bf16) rmsnorm_forward_bf16(want_bits, want_rstd, want_sum, w, N, C, 1e-6f);
                    if (rms && !bf16) rmsnorm_forward(want_out, want_rstd, want_sum, w, N, C, 1e-6f);
                    if (!rms && bf16) layernorm_forward_bf16(want_bits, want_mean, want_rstd, want_sum, w, b, N, C);
                    if (!rms && !bf16) layernorm_forward(want_out, want_mean, want_rstd, want_sum, w, b, N, C);
                    /* the fused one */
                    memcpy(x_in, x, floats);
                    memcpy(partial_in, partial, floats);
                    float *target = place == 0 ? partial_in : place == 1 ? x_in : sum;
                    int status;
                    if (rms && bf16)
                        status = k->residual_rmsnorm_forward_bf16(bits, rstd, target, x_in, partial_in, bias_arg, w, N,
                                                                  C, 1e-6f);
                    else if (rms)
                        status = k->residual_rmsnorm_forward(out, rstd, target, x_in, partial_in, bias_arg, w, N, C,
                                                             1e-6f);
                    else if (bf16)
                        status = k->residual_layernorm_forward_bf16(bits, mean, rstd, target, x_in, partial_in,
                                                                    bias_arg, w, b, N, C);
                    else
                        status = k->residual_layernorm_forward(out, mean, rstd, target, x_in, partial_in, bias_arg, w,
                                                               b, N, C);
                    const char *what = rms ? "rmsnorm" : "layernorm";
                    cr_assert_eq(status, TP_OK, "%s bf16 %d: %s", what, bf16, tp_errmsg());
                    cr_assert_eq(memcmp(target, want_sum, floats), 0, "%s bf16 %d bias %d place %d: the sum", what,
                                 bf16, with_bias, place);
                    if (bf16) cr_assert_eq(memcmp(bits, want_bits, halves), 0, "%s: the bf16 output", what);
                    else cr_assert_eq(memcmp(out, want_out, floats), 0, "%s: the output", what);
                    cr_assert_eq(memcmp(rstd, want_rstd, sizeof rstd), 0, "%s: rstd", what);
                    if (!rms) cr_assert_eq(memcmp(mean, want_mean, sizeof mean), 0, "%s: mean", what);
                }
    free(x), free(partial), free(rbias), free(w), free(b), free(sum), free(want_sum), free(out), free(want_out);
    free(x_in), free(partial_in), free(bits), free(want_bits);
}

/* The qkv activation in bf16: GPT-2's product written as bits is the
 * rounding of matmul_forward_bf16's out with the bias rounded to bf16
 * (added first), Llama's
 * rotation into bits the rounding of what rope_forward leaves (V rounded
 * as it is), its fp32 input left alone. */
Test(transformer, bf16_qkv_is_the_rounded_product_or_rotation)
{
    for (int threads = 1; threads <= 3; threads += 2) {
        kernels_set_threads(threads);
        const int64_t N = 70, C = 48, OC = 3 * 48;
        float *in = random_floats(N * C), *w = random_floats(OC * C), *bias = random_floats(OC);
        float *out = malloc(N * OC * 4);
        uint16_t *in_bits = malloc(N * C * 2), *bits = malloc(N * OC * 2), *w_bits = floats_bf16_bits(w, OC * C);
        convert_from_f32(in, in_bits, TP_BF16, N * C);
        float *rounded_bias = floats_rounded_to_bf16(bias, OC);
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            const float *b = with_bias ? bias : NULL;
            cr_assert_eq(matmul_forward_bf16(out, in_bits, w_bits, with_bias ? rounded_bias : NULL, N, C, OC), TP_OK,
                         "%s", tp_errmsg());
            cr_assert_eq(matmul_forward_bf16_bits(bits, in_bits, w_bits, b, N, C, OC), TP_OK, "%s", tp_errmsg());
            floats_assert_rounded(bits, out, N * OC, with_bias ? "qkv product with a bias" : "qkv product");
        }
        free(in), free(w), free(w_bits), free(bias), free(rounded_bias), free(out), free(in_bits), free(bits);

        const int64_t heads[][2] = {{4, 2}, {3, 3}}; /* grouped, and a key/value head a query head */
        for (int h = 0; h < 2; h++) {
            int64_t B = 2, T = 7, Hq = heads[h][0], Hkv = heads[h][1], hd = 8, n = B * T * (Hq + 2 * Hkv) * hd;
            float freq[4], cos_sin[7 * 8], *qkv = random_floats(n), *turned = malloc(n * 4), *kept = malloc(n * 4);
            uint16_t *turned_bits = malloc(n * 2);
            rope_frequencies(freq, hd, 10000.0, NULL);
            rope_table(cos_sin, freq, T, hd);
            memcpy(turned, qkv, n * 4);
            memcpy(kept, qkv, n * 4);
            rope_forward(turned, cos_sin, B, T, Hq, Hkv, hd);
            cr_assert_eq(rope_forward_bf16(turned_bits, qkv, cos_sin, B, T, Hq, Hkv, hd), TP_OK, "%s", tp_errmsg());
            floats_assert_rounded(turned_bits, turned, n, "rope");
            cr_assert_eq(memcmp(qkv, kept, n * 4), 0, "rope_forward_bf16 changed its fp32 input");
            free(qkv), free(turned), free(kept), free(turned_bits);
        }
    }
    kernels_set_threads(1);
    const kernel_backend *k = kernels_cpu();
    cr_assert(k->matmul_forward_bf16_bits == matmul_forward_bf16_bits && k->rope_forward_bf16 == rope_forward_bf16);
}

/* SwiGLU in bf16: its input (fc) comes as bf16 bits, and so does the
 * backward's d_out (the gradient of the MLP's activation);
 * swiglu_forward_bf16 writes the bits of rounding what swiglu_forward
 * computes from the input's values, and swiglu_backward_bf16 those of
 * rounding what swiglu_backward computes from the input's and d_out's, at
 * one thread and at several, on odd sizes (one element, a thousand and
 * three columns), tall and wide shapes and past the CPU's chunks of 2^20
 * values (norm.c: SwiGLU's rows cut, a row longer than a chunk), with inputs
 * and gradients of large and tiny magnitudes. (GELU in bf16 is one
 * operation with its product: test_bf16_products.) */
Test(transformer, bf16_swiglu_is_the_rounded_fp32_swiglu)
{
    enum { SHAPES = 7 };
    const int64_t shapes[SHAPES][2] = {{1, 1}, {3, 5}, {257, 16}, {4, 1000}, {1, 1003}, {1049, 1000},
                                       {2, (1 << 20) + 1}}; /* N, F */
    char what[96];
    for (int threads = 1; threads <= 3; threads += 2) {
        kernels_set_threads(threads);
        for (int s = 0; s < SHAPES; s++) {
            int64_t N = shapes[s][0], F = shapes[s][1];
            int64_t n_in = 2 * N * F, n_out = N * F; /* SwiGLU's in is [N, 2F]: gate | up */
            float *x = random_floats(n_in), *g = random_floats(n_out), *want = malloc(n_in * sizeof(float));
            for (int64_t i = 0; i < n_in; i++) x[i] *= i % 3 == 0 ? 8.0f : i % 3 == 1 ? 1e-3f : 1.0f;
            for (int64_t i = 0; i < n_out; i++) g[i] *= i % 2 ? 1e4f : 1e-4f;
            uint16_t *x_bits = floats_bf16_bits(x, n_in), *g_bits = floats_bf16_bits(g, n_out);
            uint16_t *bits = malloc(n_in * sizeof *bits);
            float *x16 = floats_of_bf16_bits(x_bits, n_in), *g16 = floats_of_bf16_bits(g_bits, n_out);
            swiglu_forward(want, x16, N, F);
            cr_assert_eq(swiglu_forward_bf16(bits, x_bits, N, F), TP_OK, "%s", tp_errmsg());
            snprintf(what, sizeof what, "SwiGLU's out [%lld, %lld] at %d threads", (long long)N, (long long)F,
                     threads);
            floats_assert_rounded(bits, want, n_out, what);
            swiglu_backward(want, x16, g16, N, F);
            cr_assert_eq(swiglu_backward_bf16(bits, x_bits, g_bits, N, F), TP_OK, "%s", tp_errmsg());
            snprintf(what, sizeof what, "SwiGLU's d_in [%lld, %lld] at %d threads", (long long)N, (long long)(2 * F),
                     threads);
            floats_assert_rounded(bits, want, n_in, what);
            free(x), free(g), free(want), free(x_bits), free(g_bits), free(bits), free(x16), free(g16);
        }
    }
    kernels_set_threads(1);
    const kernel_backend *k = kernels_cpu();
    cr_assert(k->swiglu_forward_bf16 == swiglu_forward_bf16 && k->swiglu_backward_bf16 == swiglu_backward_bf16);
}

/* RoPE's bf16 gradient, in place on the attention's bf16 d_qkv: the bits
 * of rounding what rope_backward leaves of their values, and V's bits as
 * they were, special values among them (infinities, -0, a bf16 subnormal,
 * a quiet NaN with a payload), on grouped heads and on a key/value head
 * per query head, at 1 and 3 threads. */
Test(transformer, bf16_rope_gradient_is_the_rounded_fp32_rotation)
{
    static const uint16_t special[] = {0x7f80, 0xff80, 0x8000, 0x0001, 0x7fc1, 0x4049};
    const int64_t heads[][2] = {{4, 2}, {3, 3}};
    for (int threads = 1; threads <= 3; threads += 2) {
        kernels_set_threads(threads);
        for (int h = 0; h < 2; h++) {
            int64_t B = 2, T = 7, Hq = heads[h][0], Hkv = heads[h][1], hd = 8, width = (Hq + 2 * Hkv) * hd;
            int64_t n = B * T * width, v0 = (Hq + Hkv) * hd; /* V's first column */
            float freq[4], cos_sin[7 * 8], *d = random_floats(n);
            rope_frequencies(freq, hd, 10000.0, NULL);
            rope_table(cos_sin, freq, T, hd);
            uint16_t *bits = floats_bf16_bits(d, n), *before = malloc(n * sizeof *before);
            for (int64_t r = 0; r < B * T; r++)
                for (int64_t i = 0; i < 6; i++) bits[r * width + v0 + (r + 3 * i) % (Hkv * hd)] = special[i];
            memcpy(before, bits, n * sizeof *before);
            float *want = floats_of_bf16_bits(bits, n);
            rope_backward(want, cos_sin, B, T, Hq, Hkv, hd);
            cr_assert_eq(rope_backward_bf16(bits, cos_sin, B, T, Hq, Hkv, hd), TP_OK, "%s", tp_errmsg());
            floats_assert_rounded(bits, want, n, Hq == Hkv ? "RoPE's d_qkv" : "RoPE's grouped d_qkv");
            for (int64_t r = 0; r < B * T; r++)
                for (int64_t c = v0; c < width; c++)
                    cr_assert_eq(bits[r * width + c], before[r * width + c],
                                 "%d threads, Hq %lld, Hkv %lld: V's bits at [%lld, %lld] 0x%04x, were 0x%04x", threads,
                                 (long long)Hq, (long long)Hkv, (long long)r, (long long)c, bits[r * width + c],
                                 before[r * width + c]);
            free(d), free(bits), free(before), free(want);
        }
    }
    kernels_set_threads(1);
    cr_assert(kernels_cpu()->rope_backward_bf16 == rope_backward_bf16);
}
