/* floats.c: float arrays for the kernel tests (floats.h). A test that
 * cannot have its memory ends there. */
#include "floats.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "../../kernels/kernels.h"

static uint64_t state = 0x2545F4914F6CDD1Dull;

float floats_uniform(void)
{
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return (float)((double)(state >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static float *floats(int64_t n)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!p) {
        fprintf(stderr, "floats: no memory for %lld floats\n", (long long)n);
        abort();
    }
    return p;
}

float *floats_random(int64_t n, float scale)
{
    float *p = floats(n);
    for (int64_t i = 0; i < n; i++) p[i] = scale * floats_uniform();
    return p;
}

float *floats_filled(int64_t n, float value)
{
    float *p = floats(n);
    for (int64_t i = 0; i < n; i++) p[i] = value;
    return p;
}

uint16_t *floats_bf16_bits(const float *x, int64_t n)
{
    uint16_t *bits = malloc((size_t)(n > 0 ? n : 1) * sizeof *bits);
    if (!bits) {
        fprintf(stderr, "floats: no memory for %lld bf16 values\n", (long long)n);
        abort();
    }
    convert_from_f32(x, bits, TP_BF16, n);
    return bits;
}

float *floats_of_bf16_bits(const uint16_t *bits, int64_t n)
{
    float *x = floats(n);
    convert_to_f32(bits, TP_BF16, x, n);
    return x;
}

float *floats_rounded_to_bf16(const float *x, int64_t n)
{
    if (!x) return NULL;
    uint16_t *bits = floats_bf16_bits(x, n);
    float *rounded = floats_of_bf16_bits(bits, n);
    free(bits);
    return rounded;
}

void floats_assert_rounded(const uint16_t *got, const float *fp32, int64_t n, const char *what)
{
    uint16_t *want = floats_bf16_bits(fp32, n);
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(got[i], want[i], "%s[%lld]: bf16 bits 0x%04x, want 0x%04x (the fp32 value %.9g rounded)", what,
                     (long long)i, got[i], want[i], fp32[i]);
    free(want);
}
