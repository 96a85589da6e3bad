/* floats.c: float arrays for the kernel tests (floats.h). A test that
 * cannot have its memory ends there. */
#include "floats.h"

#include <stdio.h>
#include <stdlib.h>

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
