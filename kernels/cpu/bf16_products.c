/* bf16_products.c: bf16 matrix products on the CPU through oneDNN, where the
 * CPU multiplies bf16 itself (AVX512_BF16, AMX). Both operands are rounded
 * to bf16 (to nearest, ties to even) into per-thread scratch, multiplied
 * with fp32 sums, and the fp32 result written or added: the numbers of the
 * emulation in linear.c (operands rounded, products in fp32 by sgemm) up to
 * the order of the sums, at 3.5-4x its speed on one core here (oneDNN's
 * brgemm with AVX512_BF16 against OpenBLAS's Haswell sgemm; docs/BENCHMARKS.md).
 *
 * Primitives are made once per shape and kept (a model has a few dozen);
 * each call brings its own scratchpad, so threads may run one primitive at
 * once. oneDNN threads with OpenMP: each call runs on kernels_set_threads'
 * count. */
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "../../common/memory.h"
#include "../convert_bits.h"
#include "../kernels.h"
#include "bf16_products.h"

/* Shapes kept; a GPT has at most 4 products x 3 directions per layer kind
 * plus the head's, and tensor parallelism does not add more. */
#define CACHED_PRIMITIVES 64

typedef struct {
    int64_t M, N, K;
    int trans_a, trans_b, accumulate;
    dnnl_primitive_t primitive;
    size_t scratchpad_bytes;
} cached_product;

static struct {
    pthread_once_t once;
    int usable;                 /* the CPU has bf16 instructions and oneDNN an engine */
    dnnl_engine_t engine;
    pthread_mutex_t lock;       /* the cache */
    cached_product cache[CACHED_PRIMITIVES];
    int cached;
    int threads;
} dnnl = {PTHREAD_ONCE_INIT, 0, NULL, PTHREAD_MUTEX_INITIALIZER, {{0}}, 0, 1};

static void start(void)
{
    /* oneDNN's ISA values are nested bit sets: a CPU with AVX512_BF16 has all of its bits. */
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    if ((isa & (unsigned)dnnl_cpu_isa_avx512_core_bf16) != (unsigned)dnnl_cpu_isa_avx512_core_bf16) return;
    if (getenv("TP_NO_ONEDNN")) return; /* the emulation, for comparisons */
    if (dnnl_engine_create(&dnnl.engine, dnnl_cpu, 0) != dnnl_success) return;
    dnnl.usable = 1;
}

int bf16_products_available(void)
{
    pthread_once(&dnnl.once, start);
    return dnnl.usable;
}

void bf16_products_set_threads(int threads)
{
    __atomic_store_n(&dnnl.threads, threads > 0 ? threads : 1, __ATOMIC_RELAXED);
}

/* Row-major [rows, cols], or its transpose when stored as [cols, rows]. */
static dnnl_status_t matrix_desc(dnnl_memory_desc_t *desc, int64_t rows, int64_t cols, int transposed,
                                 dnnl_data_type_t type)
{
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides = {transposed ? 1 : cols, transposed ? rows : 1};
    return dnnl_memory_desc_init_by_strides(desc, 2, dims, type, strides);
}

static int make_product(cached_product *p)
{
    dnnl_memory_desc_t a, b, c;
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t post = NULL;
    dnnl_primitive_desc_t pd = NULL;
    int ok = matrix_desc(&a, p->M, p->K, p->trans_a, dnnl_bf16) == dnnl_success &&
             matrix_desc(&b, p->K, p->N, p->trans_b, dnnl_bf16) == dnnl_success &&
             matrix_desc(&c, p->M, p->N, 0, dnnl_f32) == dnnl_success &&
             dnnl_matmul_desc_init(&desc, &a, &b, NULL, &c) == dnnl_success &&
             dnnl_primitive_attr_create(&attr) == dnnl_success &&
             dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success;
    if (ok && p->accumulate) /* c += a b: the sum post-op adds what c held */
        ok = dnnl_post_ops_create(&post) == dnnl_success && dnnl_post_ops_append_sum(post, 1.0f) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(attr, post) == dnnl_success;
    ok = ok && dnnl_primitive_desc_create(&pd, &desc, attr, dnnl.engine, NULL) == dnnl_success;
    if (ok) {
        const dnnl_memory_desc_t *pad = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        p->scratchpad_bytes = pad ? dnnl_memory_desc_get_size(pad) : 0;
        ok = dnnl_primitive_create(&p->primitive, pd) == dnnl_success;
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (post) dnnl_post_ops_destroy(post);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (!ok)
        return tp_fail(TP_ERR_DEVICE, "oneDNN: no bf16 product for [%lld, %lld] x [%lld, %lld]", (long long)p->M,
                       (long long)p->K, (long long)p->K, (long long)p->N);
    return TP_OK;
}

/* The cached primitive of this shape, made on first use. Past
 * CACHED_PRIMITIVES shapes one is made for the call (*owned: the caller
 * destroys it): a cached one is never destroyed while another thread may
 * run it. */
static int find_product(int64_t M, int64_t N, int64_t K, int trans_a, int trans_b, int accumulate,
                        cached_product *out, int *owned)
{
    *owned = 0;
    pthread_mutex_lock(&dnnl.lock);
    int status = TP_OK, i;
    for (i = 0; i < dnnl.cached; i++) {
        const cached_product *p = &dnnl.cache[i];
        if (p->M == M && p->N == N && p->K == K && p->trans_a == trans_a && p->trans_b == trans_b &&
            p->accumulate == accumulate)
            break;
    }
    if (i < dnnl.cached) {
        *out = dnnl.cache[i];
    } else {
        *out = (cached_product){M, N, K, trans_a, trans_b, accumulate, NULL, 0};
        status = make_product(out);
        if (!status && dnnl.cached < CACHED_PRIMITIVES) dnnl.cache[dnnl.cached++] = *out;
        else if (!status) *owned = 1;
    }
    pthread_mutex_unlock(&dnnl.lock);
    return status;
}

/* x rounded to bf16 into a thread's scratch slot. */
static const uint16_t *to_bf16(int slot, const float *x, int64_t n)
{
    uint16_t *out = scratch_buffer(slot, (size_t)(n > 0 ? n : 1) * sizeof(uint16_t));
    if (!out) return NULL;
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], sizeof bits);
        out[i] = bits_f32_to_bf16(bits);
    }
    return out;
}

int bf16_product(float *c, const float *a, const float *b, int64_t M, int64_t N, int64_t K, int trans_a, int trans_b,
                 int accumulate)
{
    if (!bf16_products_available()) return tp_fail(TP_ERR_STATE, "oneDNN's bf16 products are not available here");
    cached_product p;
    int owned;
    TP_TRY(find_product(M, N, K, trans_a, trans_b, accumulate, &p, &owned));
    const uint16_t *a16 = to_bf16(SCRATCH_BF16_A, a, M * K), *b16 = to_bf16(SCRATCH_BF16_B, b, K * N);
    void *pad = p.scratchpad_bytes ? scratch_buffer(SCRATCH_BF16_PAD, p.scratchpad_bytes) : NULL;
    if (!a16 || !b16 || (p.scratchpad_bytes && !pad)) {
        if (owned) dnnl_primitive_destroy(p.primitive);
        return tp_fail(TP_ERR_NOMEM, "out of memory for a bf16 product of [%lld, %lld] x [%lld, %lld]", (long long)M,
                       (long long)K, (long long)K, (long long)N);
    }
    dnnl_memory_desc_t ad, bd, cd, padd;
    dnnl_memory_t am = NULL, bm = NULL, cm = NULL, padm = NULL;
    dnnl_stream_t stream = NULL;
    dnnl_dims_t pad_dims = {(int64_t)p.scratchpad_bytes};
    int ok = matrix_desc(&ad, M, K, trans_a, dnnl_bf16) == dnnl_success &&
             matrix_desc(&bd, K, N, trans_b, dnnl_bf16) == dnnl_success &&
             matrix_desc(&cd, M, N, 0, dnnl_f32) == dnnl_success &&
             dnnl_memory_desc_init_by_tag(&padd, 1, pad_dims, dnnl_u8, dnnl_a) == dnnl_success &&
             dnnl_memory_create(&am, &ad, dnnl.engine, (void *)a16) == dnnl_success &&
             dnnl_memory_create(&bm, &bd, dnnl.engine, (void *)b16) == dnnl_success &&
             dnnl_memory_create(&cm, &cd, dnnl.engine, c) == dnnl_success &&
             (!pad || dnnl_memory_create(&padm, &padd, dnnl.engine, pad) == dnnl_success) &&
             dnnl_stream_create(&stream, dnnl.engine, dnnl_stream_default_flags) == dnnl_success;
    if (ok) {
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm},
                                   {DNNL_ARG_SCRATCHPAD, padm}};
        omp_set_num_threads(__atomic_load_n(&dnnl.threads, __ATOMIC_RELAXED));
        ok = dnnl_primitive_execute(p.primitive, stream, padm ? 4 : 3, args) == dnnl_success &&
             dnnl_stream_wait(stream) == dnnl_success;
    }
    if (stream) dnnl_stream_destroy(stream);
    if (padm) dnnl_memory_destroy(padm);
    if (cm) dnnl_memory_destroy(cm);
    if (bm) dnnl_memory_destroy(bm);
    if (am) dnnl_memory_destroy(am);
    if (owned) dnnl_primitive_destroy(p.primitive);
    if (!ok)
        return tp_fail(TP_ERR_DEVICE, "oneDNN: the bf16 product of [%lld, %lld] x [%lld, %lld] failed", (long long)M,
                       (long long)K, (long long)K, (long long)N);
    return TP_OK;
}
