/* Initial values (docs/DATA.md "Initial values"): the documented rule,
 * independence of where a run of elements starts and ends, and the moments
 * of a standard normal. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "../../common/random.h"
#include "../../kernels/kernels.h"

/* Element i by the rule as docs/DATA.md writes it, one element at a time. */
static float documented(uint64_t seed, const char *name, int64_t i)
{
    uint64_t h = XXH3_64bits(name, strlen(name)), j = (uint64_t)i / 2;
    uint64_t a = splitmix64(seed ^ splitmix64(h ^ splitmix64(j))), b = splitmix64(a);
    double u1 = ((double)(a >> 11) + 0.5) / 9007199254740992.0, u2 = (double)(b >> 11) / 9007199254740992.0;
    double r = sqrt(-2.0 * log(u1)), angle = 2.0 * M_PI * u2;
    return (float)(i % 2 == 0 ? r * cos(angle) : r * sin(angle));
}

/* Against the rule computed with libm's log, cos and sin in double: every
 * value within one fp32 ulp of it, and all but a very few (about one in
 * 10^8 lands where an ulp or two of double decides the fp32 rounding) the
 * same. A wrong coefficient or quadrant would differ in most. */
Test(init, values_follow_the_documented_rule)
{
    const char *name = "h.3.attn.c_attn.weight";
    uint64_t h = XXH3_64bits(name, strlen(name));
    enum { N = 1 << 22 };
    float *out = malloc(N * sizeof(float));
    box_muller_normals(1234, h, 1000001, N, out); /* an odd first element */
    int differ = 0;
    for (int k = 0; k < N; k++) {
        float want = documented(1234, name, 1000001 + k);
        if (out[k] == want) continue;
        differ++;
        cr_assert(fabsf(out[k] - want) <= fabsf(nextafterf(want, 2 * want) - want),
                  "element %d: %.9g, the rule gives %.9g", 1000001 + k, out[k], want);
    }
    cr_assert_leq(differ, 4, "%d of %d values differ from the rule's in the last bit", differ, N);
    free(out);
}

Test(init, runs_split_anywhere_give_the_same_values)
{
    enum { N = 4099 };
    float *whole = malloc(N * sizeof(float)), *parts = malloc(N * sizeof(float));
    box_muller_normals(7, 99, 10, N, whole);
    /* Pieces of odd and even starts and lengths, single elements among them. */
    int64_t cuts[] = {0, 1, 2, 5, 6, 7, 100, 101, 2048, 2049, 4000, N};
    for (size_t c = 0; c + 1 < sizeof cuts / sizeof *cuts; c++)
        box_muller_normals(7, 99, 10 + cuts[c], cuts[c + 1] - cuts[c], parts + cuts[c]);
    cr_assert_eq(memcmp(whole, parts, N * sizeof(float)), 0, "a run cut into pieces differs from the whole run");
    float other[16];
    box_muller_normals(8, 99, 10, 16, other);
    cr_assert_neq(memcmp(whole, other, sizeof other), 0, "another seed gives the same values");
    box_muller_normals(7, 98, 10, 16, other);
    cr_assert_neq(memcmp(whole, other, sizeof other), 0, "another tensor name gives the same values");
    free(whole);
    free(parts);
}

Test(init, values_have_the_moments_of_a_standard_normal)
{
    enum { N = 1 << 20 };
    float *z = malloc(N * sizeof(float));
    box_muller_normals(3, 5, 0, N, z);
    double sum = 0, squares = 0, fourth = 0, cross = 0;
    for (int i = 0; i < N; i++) {
        sum += z[i];
        squares += (double)z[i] * z[i];
        fourth += (double)z[i] * z[i] * z[i] * z[i];
        if (i % 2 == 0) cross += (double)z[i] * z[i + 1]; /* the two values of a pair are uncorrelated */
    }
    /* Standard errors at N = 2^20: mean 0.001, variance 0.0014, kurtosis 0.0047, pair correlation 0.0014. */
    cr_assert_lt(fabs(sum / N), 0.005, "mean %g", sum / N);
    cr_assert_lt(fabs(squares / N - 1), 0.007, "variance %g", squares / N);
    cr_assert_lt(fabs(fourth / N - 3), 0.03, "fourth moment %g (3 for a normal)", fourth / N);
    cr_assert_lt(fabs(cross / (N / 2)), 0.007, "correlation within pairs %g", cross / (N / 2));
    free(z);
}
