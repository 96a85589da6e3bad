/* test_cpu_memory.c: the CPU backend's device memory (alloc_zeroed_pages):
 * zeroed, page-aligned, writable to its last byte, released by its own
 * release; the host memory by its own. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "../../common/memory.h"
#include "../../kernels/kernels.h"

static const size_t sizes[] = {0, 1, 4095, 4096, 4097, (2u << 20) - 1, 2u << 20, (2u << 20) + 1, 64u << 20};

Test(cpu_memory, zeroed_aligned_and_whole)
{
    const kernel_backend *k = kernels_cpu();
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        unsigned char *p = NULL;
        cr_assert_eq(k->alloc((void **)&p, n), 0, "alloc of %zu bytes", n);
        cr_assert_not_null(p);
        cr_expect_eq((uintptr_t)p % 4096, 0, "%zu bytes: not page-aligned", n);
        for (size_t j = 0; j < n; j += 4093) cr_assert_eq(p[j], 0, "%zu bytes: byte %zu not zero", n, j);
        if (n) {
            cr_assert_eq(p[n - 1], 0, "%zu bytes: the last byte not zero", n);
            memset(p, 0xA5, n); /* every byte writable */
        }
        k->release(p);
    }
    k->release(NULL);
}

Test(cpu_memory, again_zeroed_after_a_release)
{
    /* The pages of a released buffer come back zeroed, not with what was written. */
    const kernel_backend *k = kernels_cpu();
    for (int round = 0; round < 3; round++) {
        float *p = NULL;
        cr_assert_eq(k->alloc((void **)&p, 8u << 20), 0);
        for (size_t j = 0; j < (8u << 20) / sizeof(float); j++) cr_assert_eq(p[j], 0.0f, "round %d, float %zu", round, j);
        for (size_t j = 0; j < (8u << 20) / sizeof(float); j++) p[j] = 1.0f + (float)j;
        k->release(p);
    }
}

Test(cpu_memory, host_memory_has_its_own_release)
{
    const kernel_backend *k = kernels_cpu();
    void *host = NULL, *device = NULL;
    cr_assert_eq(k->host_alloc(&host, 3u << 20), 0);
    cr_assert_eq(k->alloc(&device, 3u << 20), 0);
    memset(host, 1, 3u << 20);
    memset(device, 2, 3u << 20);
    k->host_release(host);
    k->release(device);
}

Test(cpu_memory, zeroed_pages_directly)
{
    unsigned char *p = alloc_zeroed_pages(5u << 20);
    cr_assert_not_null(p);
    cr_expect_eq(p[0] | p[(5u << 20) - 1], 0);
    free_zeroed_pages(p);
    free_zeroed_pages(NULL);
}
