/* Conversions between fp32, bf16 and fp16 against independent references:
 * the compiler's _Float16 (libgcc's rounding) for fp16 and a naive
 * nearest-value search for bf16. The CUDA twin is compared bit for bit with
 * the CPU version when a GPU is present, and reports itself skipped otherwise. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "../../kernels/kernels.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t next_bits(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static float from_bits(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
static uint32_t to_bits(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }

/* Naive bf16 rounding: the two neighbouring bf16 values, the nearer one, ties
 * to the even mantissa; NaN stays NaN. */
static uint16_t reference_bf16(float x)
{
    if (isnan(x)) return 0x7fc0;
    uint32_t b = to_bits(x);
    uint32_t lo = b & 0xffff0000u, hi = lo + 0x10000u;
    double dl = fabs((double)from_bits(lo) - (double)x);
    double dh = isinf(from_bits(hi)) && !isinf(x) ? INFINITY : fabs((double)from_bits(hi) - (double)x);
    /* Rounding past the largest finite bf16 gives infinity, as IEEE does. */
    if (isinf(from_bits(hi)) && !isinf(x)) {
        double halfway = (double)from_bits(lo) + ((double)from_bits(lo) - (double)from_bits(lo - 0x10000u)) / 2;
        if (fabs((double)x) >= fabs(halfway)) return (uint16_t)(hi >> 16);
    }
    if (dl < dh) return (uint16_t)(lo >> 16);
    if (dh < dl) return (uint16_t)(hi >> 16);
    return (uint16_t)(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
}

/* Special values every conversion must get right. */
static const uint32_t specials[] = {
    0x00000000, 0x80000000, 0x3f800000, 0xbf800000, 0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001,
    0xffc12345, 0x00000001, 0x807fffff, 0x00800000, 0x7f7fffff, 0x477fe000, 0x477ff000, 0x477fefff,
    0x38800000, 0x387fc000, 0x33800000, 0x33000000, 0x33000001, 0x3f808000, 0x3f818000, 0x3f80ffff,
    0x47800000, 0xc77ff000, 0x34000000, 0x337fffff, 0x7f7f8000, 0x7f7f7fff};

static int same_number(uint32_t a, uint32_t b)
{
    int a_nan = (a & 0x7fffffffu) > 0x7f800000u, b_nan = (b & 0x7fffffffu) > 0x7f800000u;
    return a_nan && b_nan ? 1 : a == b;
}

Test(convert, bf16_matches_reference)
{
    enum { N = 1 << 20 };
    static float in[N];
    static uint16_t out[N];
    for (int i = 0; i < N; i++)
        in[i] = from_bits(i < (int)(sizeof specials / 4) ? specials[i] : next_bits() ^ (uint32_t)i << 31);
    convert_from_f32(in, out, TP_BF16, N);
    for (int i = 0; i < N; i++) {
        uint16_t want = reference_bf16(in[i]);
        if (isnan(in[i])) cr_assert((out[i] & 0x7fff) > 0x7f80, "NaN %08x stays NaN", to_bits(in[i]));
        else cr_assert_eq(out[i], want, "bf16 of %08x: got %04x want %04x", to_bits(in[i]), out[i], want);
    }
    /* Widening is exact: every bf16 back to fp32 and down again is identity. */
    static uint16_t all[65536], back[65536];
    static float wide[65536];
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    convert_to_f32(all, TP_BF16, wide, 65536);
    convert_from_f32(wide, back, TP_BF16, 65536);
    for (int i = 0; i < 65536; i++)
        if ((i & 0x7fff) <= 0x7f80) cr_assert_eq(back[i], all[i], "round trip of %04x", i);
}

Test(convert, fp16_matches_compiler)
{
    enum { N = 1 << 20 };
    static float in[N];
    static uint16_t out[N];
    for (int i = 0; i < N; i++) {
        uint32_t b = i < (int)(sizeof specials / 4) ? specials[i] : next_bits();
        /* Concentrate on the fp16 range, subnormals included. */
        if (i % 2) b = (b & 0x83ffffffu) | ((uint32_t)(96 + i % 48) << 23);
        in[i] = from_bits(b);
    }
    convert_from_f32(in, out, TP_FP16, N);
    for (int i = 0; i < N; i++) {
        _Float16 h = (_Float16)in[i];
        uint16_t want;
        memcpy(&want, &h, 2);
        if (isnan(in[i])) cr_assert((out[i] & 0x7fff) > 0x7c00, "NaN %08x stays NaN", to_bits(in[i]));
        else cr_assert_eq(out[i], want, "fp16 of %08x (%g): got %04x want %04x", to_bits(in[i]), in[i], out[i], want);
    }
    static uint16_t all[65536];
    static float wide[65536];
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    convert_to_f32(all, TP_FP16, wide, 65536);
    for (int i = 0; i < 65536; i++) {
        _Float16 h;
        uint16_t bits = (uint16_t)i;
        memcpy(&h, &bits, 2);
        cr_assert(same_number(to_bits(wide[i]), to_bits((float)h)), "widening %04x", i);
    }
}

Test(convert, any_to_any_goes_through_fp32)
{
    uint16_t bf[4] = {0x3f80, 0xc000, 0x4049, 0x0000}, half[4], again[4];
    float f[4];
    convert_numbers(bf, TP_BF16, half, TP_FP16, 4);
    convert_to_f32(half, TP_FP16, f, 4);
    cr_assert_eq(f[0], 1.0f);
    cr_assert_eq(f[1], -2.0f);
    cr_assert_float_eq(f[2], 3.140625f, 1e-3);
    convert_numbers(half, TP_FP16, again, TP_BF16, 4);
    cr_assert_eq(memcmp(again, bf, sizeof bf), 0);
    float same[4];
    convert_numbers(f, TP_FP32, same, TP_FP32, 4);
    cr_assert_eq(memcmp(f, same, sizeof f), 0);
}

Test(convert, cuda_twin_is_bit_identical)
{
    if (cuda_device_count() == 0)
        cr_skip_test("no CUDA device (%s)", cuda_built() ? "built with CUDA" : "built without CUDA");
    enum { N = 1 << 22 };
    float *in = malloc(N * sizeof(float));
    uint16_t *cpu = malloc(N * 2), *gpu = malloc(N * 2);
    float *cpu_wide = malloc(N * 4), *gpu_wide = malloc(N * 4);
    for (int i = 0; i < N; i++) in[i] = from_bits(i < (int)(sizeof specials / 4) ? specials[i] : next_bits());
    for (tp_dtype f = TP_BF16; f <= TP_FP16; f++) {
        convert_overflow cpu_overflow = convert_from_f32(in, cpu, f, N), gpu_overflow;
        cr_assert_eq(cuda_convert_numbers(in, TP_FP32, gpu, f, N, &gpu_overflow), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(memcmp(cpu, gpu, N * 2), 0, "narrowing to format %d", f);
        cr_assert_eq(gpu_overflow.count, cpu_overflow.count, "format %d: %lld overflows, the CPU %lld", f,
                     (long long)gpu_overflow.count, (long long)cpu_overflow.count);
        cr_assert_eq(gpu_overflow.largest, cpu_overflow.largest, "format %d: largest %g, the CPU %g", f,
                     gpu_overflow.largest, cpu_overflow.largest);
        convert_to_f32(cpu, f, cpu_wide, N);
        cr_assert_eq(cuda_convert_numbers(cpu, f, gpu_wide, TP_FP32, N, NULL), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(memcmp(cpu_wide, gpu_wide, N * 4), 0, "widening from format %d", f);
    }
    free(in), free(cpu), free(gpu), free(cpu_wide), free(gpu_wide);
}

/* The overflows a narrowing reports, judged from its own output: a finite
 * input whose result is an infinity. Every fp32 around each target's
 * largest value, both signs, with infinities and NaNs among them (which
 * stay what they are and are no overflow). */
static void check_overflows(tp_dtype format, uint32_t first, uint32_t last)
{
    int64_t n = (int64_t)(last - first) + 1;
    float *in = malloc((size_t)(2 * n + 4) * 4);
    uint16_t *out = malloc((size_t)(2 * n + 4) * 2);
    cr_assert(in && out);
    int64_t m = 0;
    for (uint32_t b = first;; b++) {
        in[m++] = from_bits(b);
        in[m++] = from_bits(b | 0x80000000u);
        if (b == last) break;
    }
    const uint32_t non_finite[] = {0x7f800000, 0xff800000, 0x7fc00000, 0xff812345};
    for (int k = 0; k < 4; k++) in[m++] = from_bits(non_finite[k]);
    convert_overflow got = convert_from_f32(in, out, format, m);
    uint16_t infinity = format == TP_FP16 ? 0x7c00 : 0x7f80;
    int64_t count = 0;
    float largest = 0;
    for (int64_t i = 0; i < m; i++)
        if (isfinite(in[i]) && (out[i] & 0x7fff) == infinity) {
            count++;
            if (fabsf(in[i]) > largest) largest = fabsf(in[i]);
        }
    cr_assert_gt(count, 0, "format %d: the range tried has overflows", format);
    cr_assert_eq(got.count, count, "format %d: %lld overflows counted, %lld in the output", format,
                 (long long)got.count, (long long)count);
    cr_assert_eq(got.largest, largest, "format %d: largest %g, the output says %g", format, got.largest, largest);
    free(in);
    free(out);
}

Test(convert, narrowing_counts_its_overflows)
{
    check_overflows(TP_FP16, 0x477f0000u, 0x47ffffffu); /* 65280 .. 131072 */
    check_overflows(TP_BF16, 0x7f7e0000u, 0x7f7fffffu); /* the top of fp32 */
    /* In range, and the largest that stays finite: none. */
    float fine[] = {65504.0f, -65519.99f, 1.0f, 0.0f, INFINITY, NAN};
    uint16_t h[6];
    cr_assert_eq(convert_from_f32(fine, h, TP_FP16, 6).count, 0);
    float top[] = {from_bits(0x7f7f7fffu), -3e38f, INFINITY};
    cr_assert_eq(convert_from_f32(top, h, TP_BF16, 3).count, 0, "bf16 holds fp32 up to 0x7f7f7fff");
    /* bf16 -> fp16 goes through fp32 and counts as well: 65536 and -1e6, not inf. */
    uint16_t bf[4] = {0x4780, 0xc974, 0x7f80, 0x3f80}, half[4];
    convert_overflow o = convert_numbers(bf, TP_BF16, half, TP_FP16, 4);
    cr_assert_eq(o.count, 2);
    cr_assert_eq(o.largest, from_bits(0x49740000u));
    /* Widening and equal formats never overflow. */
    cr_assert_eq(convert_numbers(half, TP_FP16, bf, TP_BF16, 4).count, 0);
    cr_assert_eq(convert_numbers(top, TP_FP32, top, TP_FP32, 0).count, 0);
}

Test(convert, overflow_check_names_the_tensor)
{
    convert_overflow none = {0, 0.0f}, three = {3, 1e6f};
    cr_assert_eq(convert_overflow_check(none, TP_FP16, "w", 0), TP_OK);
    cr_assert_eq(convert_overflow_check(three, TP_FP16, "model/layers.0.attn.qkv.weight", 0), TP_ERR_ARG);
    cr_assert_str_eq(tp_errmsg(), "model/layers.0.attn.qkv.weight: 3 values beyond fp16's range (largest |x| 1e+06) "
                                  "would become infinite: keep fp32 or bf16 (--dtype)");
    convert_overflow one = {1, 3.4e38f};
    cr_assert_eq(convert_overflow_check(one, TP_BF16, "w", 2), TP_ERR_ARG);
    cr_assert_str_eq(tp_errmsg(), "w: 1 value beyond bf16's range (largest |x| 3.4e+38) would become infinite: "
                                  "keep fp32 (--dtype); 2 more tensors as well");
}

Test(convert, overflow_first_of_many_tensors)
{
    convert_overflow tensors[5] = {{0, 0.0f}, {2, 7e4f}, {0, 0.0f}, {1, 1e6f}, {4, 9e4f}};
    int others = -1;
    cr_assert_eq(convert_overflow_first(tensors, 5, &others), 1);
    cr_assert_eq(others, 2);
    cr_assert_eq(convert_overflow_first(tensors, 1, &others), -1);
    cr_assert_eq(others, 0);
    cr_assert_eq(convert_overflow_first(tensors + 3, 1, &others), 0);
    cr_assert_eq(others, 0);
}

/* convert_numbers_counting converts as convert_numbers does, bit for bit,
 * and counts the input's NaNs and infinities across its blocks, as a
 * reference widening to fp32 and isnan/isinf finds them: every format
 * pair, contiguous and gathered (stride 3, import's transposition),
 * values at the edge of each format's range (its largest finite, the
 * smallest NaN payload, both signs), the first past the first block, the
 * short calls. */
static void set_bits(void *values, tp_dtype format, int64_t i, uint32_t bits)
{
    if (format == TP_FP32) ((uint32_t *)values)[i] = bits;
    else ((uint16_t *)values)[i] = (uint16_t)bits;
}

static void check_counting(const void *in, tp_dtype in_format, int64_t stride, tp_dtype out_format, int64_t n)
{
    static uint32_t gathered[5000], out[5000], expected[5000]; /* room for fp32 */
    static float wide[5000];
    size_t in_size = tp_dtype_size(in_format), out_size = tp_dtype_size(out_format);
    for (int64_t i = 0; i < n; i++)
        memcpy((char *)gathered + i * in_size, (const char *)in + i * stride * in_size, in_size);
    convert_overflow want = convert_numbers(gathered, in_format, expected, out_format, n);
    convert_to_f32(gathered, in_format, wide, n);
    int64_t nans = 0, infinities = 0, first = -1;
    for (int64_t i = 0; i < n; i++) {
        nans += isnan(wide[i]) != 0;
        infinities += isinf(wide[i]) != 0;
        if (first < 0 && !isfinite(wide[i])) first = i;
    }
    convert_nonfinite found = {-5, -5, -5};
    convert_overflow got = convert_numbers_counting(in, in_format, stride, out, out_format, n, &found);
    const char *a = tp_dtype_name(in_format), *b = tp_dtype_name(out_format);
    cr_assert_eq(memcmp(out, expected, (size_t)n * out_size), 0, "%s -> %s, stride %lld: the values", a, b,
                 (long long)stride);
    cr_assert_eq(got.count, want.count);
    cr_assert_eq(found.nans, nans, "%s -> %s, stride %lld: %lld NaNs, expected %lld", a, b, (long long)stride,
                 (long long)found.nans, (long long)nans);
    cr_assert_eq(found.infinities, infinities, "%s, stride %lld: %lld infinities, expected %lld", a, (long long)stride,
                 (long long)found.infinities, (long long)infinities);
    cr_assert_eq(found.first, first, "%s, stride %lld: first at %lld, expected %lld", a, (long long)stride,
                 (long long)found.first, (long long)first);
    /* The same values counted in place, without a conversion (a writer's digest pass). */
    convert_nonfinite alone = numbers_nonfinite(gathered, in_format, n);
    cr_assert(alone.nans == nans && alone.infinities == infinities && alone.first == first,
              "%s, counted in place: %lld NaNs, %lld infinities, first %lld; expected %lld, %lld, %lld", a,
              (long long)alone.nans, (long long)alone.infinities, (long long)alone.first, (long long)nans,
              (long long)infinities, (long long)first);
}

Test(convert, counting_finds_nans_and_infinities)
{
    enum { N = 5000 }; /* more than two blocks */
    const tp_dtype formats[] = {TP_FP32, TP_BF16, TP_FP16};
    for (int a = 0; a < 3; a++) {
        tp_dtype in_format = formats[a];
        float wide[N];
        for (int i = 0; i < N; i++) wide[i] = (float)((int)(next_bits() % 20001) - 10000) / 100.0f;
        uint32_t in[N]; /* room for fp32 */
        convert_numbers(wide, TP_FP32, in, in_format, N);
        uint32_t largest = in_format == TP_FP32 ? 0x7f7fffffu : in_format == TP_BF16 ? 0x7f7fu : 0x7bffu;
        uint32_t sign = in_format == TP_FP32 ? 0x80000000u : 0x8000u;
        uint32_t infinity = in_format == TP_FP32 ? 0x7f800000u : in_format == TP_BF16 ? 0x7f80u : 0x7c00u;
        set_bits(in, in_format, 7, largest); /* finite, both signs: not counted */
        set_bits(in, in_format, 8, largest | sign);
        set_bits(in, in_format, 2500, infinity | 1u);   /* a NaN of the smallest payload */
        set_bits(in, in_format, 2501, infinity | sign); /* -inf */
        set_bits(in, in_format, 2502, infinity | 1u);
        set_bits(in, in_format, 4100, infinity);        /* +inf, in the third block */
        set_bits(in, in_format, 4998, infinity | sign | (infinity >> 1)); /* a negative quiet NaN */
        for (int b = 0; b < 3; b++) {
            check_counting(in, in_format, 1, formats[b], N);
            check_counting(in, in_format, 3, formats[b], N / 3); /* 2502, 4998 and 7, not 2500, 2501 or 4100 */
            check_counting(in, in_format, 1, formats[b], 2500);  /* none: first -1 */
            check_counting((char *)in + 2501 * tp_dtype_size(in_format), in_format, 1, formats[b], 1);
            check_counting(in, in_format, 1, formats[b], 0);
        }
    }
}
