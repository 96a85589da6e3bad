/* memory.c: page-aligned allocation, per-thread scratch buffers and the
 * process's resident memory. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "error.h"
#include "memory.h"

void *alloc_pages(size_t bytes)
{
    void *p = NULL;
    size_t rounded = (bytes + 4095) / 4096 * 4096;
    if (posix_memalign(&p, 4096, rounded ? rounded : 4096) != 0) return NULL;
    return p;
}

#if defined(__SANITIZE_ADDRESS__)
/* Under AddressSanitizer from the heap it watches, so that reads and writes
 * past a buffer's end are still caught. */
void *alloc_zeroed_pages(size_t bytes)
{
    void *p = alloc_pages(bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

void free_zeroed_pages(void *buffer)
{
    free(buffer);
}
#else
/* Huge pages where the system grants them: 512 times fewer first touches. */
enum { HUGE_PAGE = 2 << 20 };

/* Where a zeroed buffer's mapping begins and how long it is, kept in the
 * page before the buffer. */
typedef struct {
    void *base;
    size_t length;
} zeroed_header;

void *alloc_zeroed_pages(size_t bytes)
{
    size_t pages = (bytes + 4095) / 4096 * 4096;
    size_t length = pages + HUGE_PAGE + 4096; /* room to align the buffer after its header */
    if (pages < bytes || length < pages) return NULL;
    unsigned char *base = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return NULL;
    uintptr_t aligned = ((uintptr_t)base + 4096 + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    unsigned char *buffer = (unsigned char *)aligned;
    zeroed_header *h = (zeroed_header *)(buffer - 4096);
    h->base = base;
    h->length = length;
    /* Advice, not requirements: where huge pages or populating are not
     * available the pages come on first touch, as from malloc. */
#ifdef MADV_HUGEPAGE
    if (pages >= HUGE_PAGE) madvise(buffer, pages, MADV_HUGEPAGE);
#endif
#ifdef MADV_POPULATE_WRITE
    madvise(buffer, pages, MADV_POPULATE_WRITE);
#endif
    return buffer;
}

void free_zeroed_pages(void *buffer)
{
    if (!buffer) return;
    zeroed_header *h = (zeroed_header *)((unsigned char *)buffer - 4096);
    munmap(h->base, h->length);
}
#endif

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
    /* read(2) into the stack, not stdio: a FILE's buffer is a heap block,
     * and a measure of the memory should not move it (under
     * AddressSanitizer each freed buffer stayed resident in its quarantine,
     * 4 KiB more at every measure). */
    char text[128];
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0) return 0;
    text[n] = '\0';
    long pages = 0, resident = 0;
    if (sscanf(text, "%ld %ld", &pages, &resident) != 2) return 0;
    return (int64_t)resident * sysconf(_SC_PAGESIZE);
}
