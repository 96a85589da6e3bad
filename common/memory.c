/* memory.c: page-aligned allocation and the process's resident memory. */
#include <stdio.h>
#include <stdlib.h>

#include "error.h"
#include "memory.h"

void *alloc_pages(size_t bytes)
{
    void *p = NULL;
    size_t rounded = (bytes + 4095) / 4096 * 4096;
    if (posix_memalign(&p, 4096, rounded ? rounded : 4096) != 0) return NULL;
    return p;
}

int array_reserve(void **items, int *capacity, int needed, size_t item_size)
{
    if (needed <= *capacity) return TP_OK;
    int next = *capacity ? *capacity : 64;
    while (next < needed) next *= 2;
    void *bigger = realloc(*items, (size_t)next * item_size);
    if (!bigger) return tp_fail(TP_ERR_NOMEM, "out of memory for %d items of %zu bytes", next, item_size);
    *items = bigger;
    *capacity = next;
    return TP_OK;
}

int64_t resident_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, resident = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
        fclose(f);
    }
    return (int64_t)resident * 4096;
}
