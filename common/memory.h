/* memory.h: page-aligned buffers. The kernel copies to and from page-aligned
 * user buffers about twice as fast as from arbitrary ones, so every buffer
 * that meets pread/pwrite comes from here. */
#ifndef TP_MEMORY_H
#define TP_MEMORY_H

#include <stddef.h>

/* A buffer of at least bytes, aligned to 4096; free() releases it. NULL on failure. */
void *alloc_pages(size_t bytes);

#endif
