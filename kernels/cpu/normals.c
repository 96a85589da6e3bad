/* normals.c: the standard normals of a fresh run's initial values
 * (docs/DATA.md "Initial values"), Box-Muller pairs from counters, computed
 * LANES pairs at a time with the toolkit's own logarithm, sine and cosine.
 *
 * Why not libm's: log, cos and sin per pair were 30 of the 44 ns a pair cost
 * (gpt2-124m: 1.4 s of a 2.8 s start on 2 cores), and they do not vectorize.
 * These are branch-free polynomials in plain double arithmetic (the
 * classical fdlibm approximations, within an ulp of double on their
 * ranges), written as loops over lanes that the compiler turns into vector
 * instructions; every lane and every leftover pair goes through the same
 * operations in the same order (no contraction into FMA under -std=c11), so
 * a value depends on its counter alone: the same at any layout, any cut of
 * a run, any machine. Against libm's in double the results differ by an ulp
 * or two of double, which changes the fp32 value in about one element in
 * 10^8 (tests/trainer/test_init.c counts them). */
#include <stdint.h>
#include <string.h>

#include "../../common/random.h"
#include "../kernels.h"

/* Pairs per block: eight doubles, an AVX-512 register. The helpers below
 * are inlined into each clone of box_muller_normals, which builds them for
 * its instruction set. */
#define LANES 8

/* ln x for x in [2^-54, 1): x = 2^e m with m in [sqrt(2)/2, sqrt(2)), and
 * ln m = 2 atanh(s), s = (m - 1) / (m + 1), as a polynomial in s^2 (fdlibm's
 * e_log.c coefficients), with ln 2 in two parts so that e ln 2 is exact. */
static inline __attribute__((always_inline)) void ln_lanes(double *out, const double *x)
{
    const double Lg1 = 6.666666666666735130e-01, Lg2 = 3.999999999940941908e-01, Lg3 = 2.857142874366239149e-01,
                 Lg4 = 2.222219843214978396e-01, Lg5 = 1.818357216161805012e-01, Lg6 = 1.531383769920937332e-01,
                 Lg7 = 1.479819860511658591e-01;
    const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    for (int k = 0; k < LANES; k++) {
        uint64_t bits;
        memcpy(&bits, &x[k], sizeof bits);
        /* m in [1, 2) and the exponent e; m above sqrt(2) is halved (e + 1). */
        uint64_t m_bits = (bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull;
        uint64_t high = m_bits > 0x3FF6A09E667F3BCDull; /* m > sqrt(2) */
        m_bits -= high << 52;
        /* e as a double without an integer conversion: 2^52 + biased exponent, less the bias. */
        uint64_t e_bits = 0x4330000000000000ull | ((bits >> 52) + high);
        double m, e;
        memcpy(&m, &m_bits, sizeof m);
        memcpy(&e, &e_bits, sizeof e);
        e -= 4503599627370496.0 + 1023.0;
        double f = m - 1.0, s = f / (2.0 + f), z = s * s, w = z * z;
        double t1 = w * (Lg2 + w * (Lg4 + w * Lg6)), t2 = z * (Lg1 + w * (Lg3 + w * (Lg5 + w * Lg7)));
        double half_f2 = 0.5 * f * f, r = t2 + t1;
        out[k] = e * ln2_hi - ((half_f2 - (s * (half_f2 + r) + e * ln2_lo)) - f);
    }
}

/* cos and sin of 2 pi u for u = n 2^-53 in [0, 1): u = q/4 + f with q the
 * nearest quarter, found in integers, so that f in [-1/8, 1/8] is exact;
 * r = 2 pi f in [-pi/4, pi/4], and the quadrant q turns (cos r, sin r) by q
 * right angles. The polynomials are fdlibm's k_sin.c and k_cos.c. */
static inline __attribute__((always_inline)) void cos_sin_lanes(double *c, double *s, const uint64_t *n)
{
    const double S1 = -1.66666666666666324348e-01, S2 = 8.33333333332248946124e-03,
                 S3 = -1.98412698298579493134e-04, S4 = 2.75573137070700676789e-06,
                 S5 = -2.50507602534068634195e-08, S6 = 1.58969099521155010221e-10;
    const double C1 = 4.16666666666666019037e-02, C2 = -1.38888888888741095749e-03,
                 C3 = 2.48015872894767294178e-05, C4 = -2.75573143513906633035e-07,
                 C5 = 2.08757232129817482790e-09, C6 = -1.13596475577881948265e-11;
    for (int k = 0; k < LANES; k++) {
        uint64_t q = (n[k] + (1ull << 50)) >> 51; /* 4u = n 2^-51, to the nearest integer: 0 .. 4 */
        double f = (double)((int64_t)n[k] - (int64_t)(q << 51)) * 0x1.0p-53;
        double r = 6.283185307179586 * f, z = r * r;
        double sin_r = r + z * r * (S1 + z * (S2 + z * (S3 + z * (S4 + z * (S5 + z * S6)))));
        double hz = 0.5 * z, w = 1.0 - hz;
        double cos_r = w + (((1.0 - w) - hz) + z * z * (C1 + z * (C2 + z * (C3 + z * (C4 + z * (C5 + z * C6))))));
        uint64_t quadrant = q & 3;
        double turned_c = quadrant & 1 ? sin_r : cos_r, turned_s = quadrant & 1 ? cos_r : sin_r;
        c[k] = quadrant == 1 || quadrant == 2 ? -turned_c : turned_c;
        s[k] = quadrant >= 2 ? -turned_s : turned_s;
    }
}

/* Pairs j0 .. j0 + LANES - 1: z[2(j - j0)] and z[2(j - j0) + 1]. */
static inline __attribute__((always_inline)) void pairs_block(float *z, uint64_t seed, uint64_t name_hash, int64_t j0)
{
    double u1[LANES], ln[LANES], c[LANES], s[LANES];
    uint64_t n2[LANES]; /* u2 = n2 2^-53 */
    for (int k = 0; k < LANES; k++) {
        uint64_t a = splitmix64(seed ^ splitmix64(name_hash ^ splitmix64((uint64_t)(j0 + k)))), b = splitmix64(a);
        u1[k] = ((double)(int64_t)(a >> 11) + 0.5) * 0x1.0p-53;
        n2[k] = b >> 11;
    }
    ln_lanes(ln, u1);
    cos_sin_lanes(c, s, n2);
    for (int k = 0; k < LANES; k++) {
        double radius = __builtin_sqrt(-2.0 * ln[k]);
        z[2 * k] = (float)(radius * c[k]);
        z[2 * k + 1] = (float)(radius * s[k]);
    }
}

__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void box_muller_normals(uint64_t seed,
                                                                                               uint64_t name_hash,
                                                                                               int64_t first, int64_t n,
                                                                                               float *out)
{
    float block[2 * LANES];
    int64_t end = first + n;
    /* Blocks of LANES pairs from the pair of element `first`; the first and
     * the last are copied in part. */
    for (int64_t j0 = first >> 1; 2 * j0 < end; j0 += LANES) {
        int64_t begin = 2 * j0, stop = 2 * (j0 + LANES);
        int64_t from = begin > first ? begin : first, to = stop < end ? stop : end;
        if (from == begin && to == stop) {
            pairs_block(out + (begin - first), seed, name_hash, j0);
        } else {
            pairs_block(block, seed, name_hash, j0);
            memcpy(out + (from - first), block + (from - begin), (size_t)(to - from) * sizeof(float));
        }
    }
}
