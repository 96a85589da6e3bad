/* digest.c: a digest of the logical tensor that any layout can compute piece
 * by piece, in any order (docs/FORMAT.md "Logical digests"):
 *
 *   D = sum over logical elements i of  x_i * K[i mod 4096] * F[i / 4096]   (mod 2^64)
 *
 * x_i is the stored bit pattern of element i (zero-extended to 64 bits), K
 * are 4096 odd 32-bit keys and F odd 64-bit keys, both from splitmix64. A sum
 * commutes, so partial digests of pieces add up to the tensor's. Every
 * weight is odd, so changing any single element always changes D. */
#include <pthread.h>
#include <string.h>

#include "../common/random.h"
#include "../kernels/kernels.h"
#include "internal.h"

#define DIGEST_SPAN 4096

static uint32_t keys[DIGEST_SPAN];
static pthread_once_t keys_once = PTHREAD_ONCE_INIT;

static void init_keys(void)
{
    for (int p = 0; p < DIGEST_SPAN; p++) keys[p] = (uint32_t)splitmix64(CKPT_DIGEST_KEY_SEED + (uint64_t)p) | 1u;
}

uint64_t ckpt_digest_block_key(uint64_t block)
{
    return splitmix64(CKPT_DIGEST_BLOCK_SEED + block) | 1u;
}

/* Sum of x * K[p] over a run inside one span. The 32x32->64 products
 * vectorize; an AVX2 clone is chosen at load time where the CPU has it. */
#define DIGEST_KERNEL __attribute__((optimize("tree-vectorize"), target_clones("avx2", "default")))

DIGEST_KERNEL static uint64_t span_sum32(const uint32_t *x, const uint32_t *k, int64_t n)
{
    uint64_t sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (uint64_t)x[i] * k[i];
    return sum;
}

DIGEST_KERNEL static uint64_t span_sum16(const uint16_t *x, const uint32_t *k, int64_t n)
{
    uint64_t sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (uint64_t)x[i] * k[i];
    return sum;
}

/* The digest of a run (ckpt_digest_run), and with found (not NULL) its NaNs
 * and infinities added to *found (first: the flat logical index), each span
 * counted as soon as the digest has read it: up to 16 KiB, still in the L1
 * cache, so that the count reads no memory the digest did not. */
static uint64_t digest_run(const void *data, tp_dtype dtype, int64_t first, int64_t n, convert_nonfinite *found)
{
    pthread_once(&keys_once, init_keys);
    size_t element_size = tp_dtype_size(dtype);
    const char *bytes = data;
    uint64_t digest = 0;
    while (n > 0) {
        int64_t position = first % DIGEST_SPAN;
        int64_t take = DIGEST_SPAN - position < n ? DIGEST_SPAN - position : n;
        uint64_t sum = element_size == 4 ? span_sum32((const uint32_t *)bytes, keys + position, take)
                                         : span_sum16((const uint16_t *)bytes, keys + position, take);
        digest += sum * ckpt_digest_block_key((uint64_t)(first / DIGEST_SPAN));
        if (found) convert_nonfinite_add(found, numbers_nonfinite(bytes, dtype, take), first);
        bytes += take * (int64_t)element_size;
        first += take;
        n -= take;
    }
    return digest;
}

uint64_t ckpt_digest_run(const void *data, size_t element_size, int64_t first, int64_t n)
{
    /* The digest reads bits: any dtype of the size does (BF16 and FP16 alike). */
    return digest_run(data, element_size == 4 ? TP_FP32 : TP_BF16, first, n, NULL);
}

typedef struct {
    const char *data;
    tp_dtype dtype;
    uint64_t sum;
    convert_nonfinite *found;
} digest_walk;

static int add_run(void *ctx, int64_t offset, int64_t logical_first, int64_t n)
{
    digest_walk *w = ctx;
    if (logical_first >= 0)
        w->sum += digest_run(w->data + offset * (int64_t)tp_dtype_size(w->dtype), w->dtype, logical_first, n, w->found);
    return 0;
}

uint64_t ckpt_digest_rows_counting(const ckpt_tensor_desc *t, int tp, int piece, int64_t row0, int64_t row1,
                                   const void *data, convert_nonfinite *found)
{
    digest_walk w = {data, t->dtype, 0, found};
    /* Each logical element once: a replicated granule's replicas are not counted. */
    ckpt_piece_element_runs_of(t, tp, piece, row0, row1, 1, add_run, &w);
    return w.sum;
}

uint64_t ckpt_digest_rows(const ckpt_tensor_desc *t, int tp, int piece, int64_t row0, int64_t row1,
                          const void *data)
{
    return ckpt_digest_rows_counting(t, tp, piece, row0, row1, data, NULL);
}
