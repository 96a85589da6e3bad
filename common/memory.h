/* memory.h: page-aligned buffers. The kernel copies to and from page-aligned
 * user buffers about twice as fast as from arbitrary ones, so every buffer
 * that meets pread/pwrite comes from here. */
#ifndef TP_MEMORY_H
#define TP_MEMORY_H

#include <stddef.h>
#include <stdint.h>

/* A buffer of at least bytes, aligned to 4096; free() releases it. NULL on failure. */
void *alloc_pages(size_t bytes);

/* A zeroed buffer of at least bytes, aligned to 4096 (to 2 MiB from 2 MiB
 * up), its pages made resident at once, as huge pages where the system
 * grants them; free_zeroed_pages releases it. For memory used whole from
 * the start, as a model's: on this project's virtual machines the first
 * touch of fresh memory cost 4.3 s per GiB page by page, 1.7-3 s as huge
 * pages populated by the kernel (docs/BENCHMARKS.md, "Start-up"). Under
 * AddressSanitizer it is heap memory, which the sanitizer watches. NULL on
 * failure. */
void *alloc_zeroed_pages(size_t bytes);
void free_zeroed_pages(void *buffer);

/* Buffers a thread reuses from call to call, one per slot, grown as asked
 * and released when the thread exits: a fresh large allocation costs page
 * faults and zeroing on every call, which showed as a fifth of the time of
 * streamed reads. NULL on failure. Hold them only while the call runs. */
enum {
    SCRATCH_CHUNK, SCRATCH_BOUNCE, SCRATCH_VERIFY, SCRATCH_STAGING, /* the checkpoint reader's and the resharder's */
    SCRATCH_PERMUTED, /* the checkpoint reader's rows of a box stored in another order, kept from call to call */
    SCRATCH_BF16_A, SCRATCH_BF16_B, SCRATCH_BF16_PAD,              /* bf16 products' operands and oneDNN's scratchpad */
    SCRATCH_BF16_OUTPUT,                                           /* a bf16 activation's fp32 values before rounding */
    SCRATCH_ATTENTION,                                             /* the CPU attention's blocks of a thread */
    SCRATCH_SLOTS
};
void *scratch_buffer(int slot, size_t bytes);

/* Makes room for needed items of item_size in *items (*capacity of them
 * now), doubling from 64; TP_OK or TP_ERR_NOMEM (the array unchanged). */
int array_reserve(void **items, int *capacity, int needed, size_t item_size);

/* Bytes resident in this process now (0 when the system does not say). */
int64_t resident_bytes(void);

#endif
