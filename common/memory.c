/* memory.c: page-aligned allocation, per-thread scratch buffers and the
 * process's resident memory. */
#include <pthread.h>
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

typedef struct {
    void *buffer[SCRATCH_SLOTS];
    size_t size[SCRATCH_SLOTS];
} thread_scratch;

static _Thread_local thread_scratch scratch;
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void release_scratch(void *arg)
{
    thread_scratch *s = arg;
    for (int i = 0; i < SCRATCH_SLOTS; i++) {
        free(s->buffer[i]);
        s->buffer[i] = NULL;
        s->size[i] = 0;
    }
}

static void make_scratch_key(void)
{
    pthread_key_create(&scratch_key, release_scratch);
}

void *scratch_buffer(int slot, size_t bytes)
{
    if (scratch.size[slot] >= bytes) return scratch.buffer[slot];
    pthread_once(&scratch_once, make_scratch_key);
    pthread_setspecific(scratch_key, &scratch);
    free(scratch.buffer[slot]);
    scratch.buffer[slot] = alloc_pages(bytes);
    scratch.size[slot] = scratch.buffer[slot] ? bytes : 0;
    return scratch.buffer[slot];
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
