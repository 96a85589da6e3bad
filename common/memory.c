/* memory.c: page-aligned allocation. */
#include <stdlib.h>

#include "memory.h"

void *alloc_pages(size_t bytes)
{
    void *p = NULL;
    size_t rounded = (bytes + 4095) / 4096 * 4096;
    if (posix_memalign(&p, 4096, rounded ? rounded : 4096) != 0) return NULL;
    return p;
}
