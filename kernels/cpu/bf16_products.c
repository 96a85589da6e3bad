/* bf16_products.c: bf16 matrix products on the CPU through oneDNN, where the
 * CPU multiplies bf16 itself (AVX512_BF16, AMX). Both operands are rounded
 * to bf16 (to nearest, ties to even) into per-thread scratch, multiplied
 * with fp32 sums, and the fp32 result written or added (an operand held
 * in bf16 already, a bf16 activation, is read as it is): the numbers of the
 * emulation in linear.c (operands rounded, products in fp32 by sgemm) up to
 * the order of the sums, at 3.5-4x its speed on one core here (oneDNN's
 * brgemm with AVX512_BF16 against OpenBLAS's Haswell sgemm; docs/BENCHMARKS.md).
 *
 * Threads: each product's rows are cut into one block per thread of the
 * CPU backend's pool (workers.h), each block a single-threaded oneDNN
 * product; the operands are rounded in shares on the pool too. oneDNN's own
 * threads are OpenMP's, whose waiting threads spin: beside OpenBLAS's and
 * another process on 2 cores a tiny model's step took 220-320 ms instead of
 * 3 ms (OMP_WAIT_POLICY=passive, which cures it, is read when the OpenMP
 * runtime loads, before any code of ours runs).
 *
 * Primitives are made once per shape and kept (a model has a few dozen);
 * each block brings its own scratchpad, so threads may run one primitive at
 * once. */
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "../../common/memory.h"
#include "../kernels.h"
#include "bf16_outputs.h"
#include "bf16_products.h"
#include "workers.h"

/* Shapes kept; a GPT has at most 4 products x 3 directions per layer kind
 * plus the head's, and tensor parallelism does not add more. */
#define CACHED_PRIMITIVES 64

/* c[M, N] (+)= a[M, K] b[K, N] with the rows of each operand lda, ldb and
 * ldc elements apart (a block of a larger product). */
typedef struct {
    int64_t M, N, K, lda, ldb, ldc;
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
} dnnl = {PTHREAD_ONCE_INIT, 0, NULL, PTHREAD_MUTEX_INITIALIZER, {{0}}, 0};

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

const char *onednn_isa_name(void)
{
    /* The values of dnnl_cpu_isa_t (oneapi/dnnl/dnnl_types.h); ONEDNN_MAX_CPU_ISA caps what this CPU has. */
    switch ((unsigned)dnnl_get_effective_cpu_isa()) {
    case 0x1: return "sse41";
    case 0x3: return "avx";
    case 0x7: return "avx2";
    case 0x407: return "avx2_vnni";
    case 0xf: return "avx512_mic";
    case 0x1f: return "avx512_mic_4ops";
    case 0x27: return "avx512_core";
    case 0x67: return "avx512_core_vnni";
    case 0xe7: return "avx512_core_bf16";
    case 0x3e7: return "avx512_core_amx";
    default: return "other";
    }
}

/* [rows, cols] with rows ld elements apart, or its transpose, stored as
 * [cols, rows] with rows ld apart. */
static dnnl_status_t matrix_desc(dnnl_memory_desc_t *desc, int64_t rows, int64_t cols, int64_t ld, int transposed,
                                 dnnl_data_type_t type)
{
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides = {transposed ? 1 : ld, transposed ? ld : 1};
    return dnnl_memory_desc_init_by_strides(desc, 2, dims, type, strides);
}

static int make_product(cached_product *p)
{
    dnnl_memory_desc_t a, b, c;
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t post = NULL;
    dnnl_primitive_desc_t pd = NULL;
    int ok = matrix_desc(&a, p->M, p->K, p->lda, p->trans_a, dnnl_bf16) == dnnl_success &&
             matrix_desc(&b, p->K, p->N, p->ldb, p->trans_b, dnnl_bf16) == dnnl_success &&
             matrix_desc(&c, p->M, p->N, p->ldc, 0, dnnl_f32) == dnnl_success &&
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

/* The cached primitive of key's shape, made on first use. Past
 * CACHED_PRIMITIVES shapes one is made for the call (*owned: the caller
 * destroys it): a cached one is never destroyed while another thread may
 * run it. */
static int find_product(const cached_product *key, cached_product *out, int *owned)
{
    *owned = 0;
    pthread_mutex_lock(&dnnl.lock);
    int status = TP_OK, i;
    for (i = 0; i < dnnl.cached; i++) {
        const cached_product *p = &dnnl.cache[i];
        if (p->M == key->M && p->N == key->N && p->K == key->K && p->lda == key->lda && p->ldb == key->ldb &&
            p->ldc == key->ldc && p->trans_a == key->trans_a && p->trans_b == key->trans_b &&
            p->accumulate == key->accumulate)
            break;
    }
    if (i < dnnl.cached) {
        *out = dnnl.cache[i];
    } else {
        *out = *key;
        out->primitive = NULL;
        status = make_product(out);
        if (!status && dnnl.cached < CACHED_PRIMITIVES) dnnl.cache[dnnl.cached++] = *out;
        else if (!status) *owned = 1;
    }
    pthread_mutex_unlock(&dnnl.lock);
    return status;
}

/* The operand's bits: its own, or its values rounded into the calling
 * thread's scratch slot. */
static const uint16_t *to_bf16(int slot, bf16_operand x, int64_t n)
{
    if (x.bits) return x.bits;
    uint16_t *out = scratch_buffer(slot, (size_t)(n > 0 ? n : 1) * sizeof(uint16_t));
    if (out) round_to_bf16(out, x.values, n);
    return out;
}

/* One block of rows of a product: c rows [m0, m1). */
typedef struct {
    float *c;
    const uint16_t *a, *b;
    int64_t M, N, K, rows_per_block;
    int trans_a, trans_b, accumulate;
    char *pads;       /* a scratchpad per block, pad_bytes each */
    size_t pad_bytes; /* the largest block's */
} product_job;

static int run_block(const product_job *job, int64_t m0, int64_t m1, char *pad)
{
    int64_t M = job->M, N = job->N, K = job->K;
    /* Row m of a is at m * K, or, transposed ([K, M] stored), column m at m. */
    const uint16_t *a = job->a + (job->trans_a ? m0 : m0 * K);
    cached_product key = {m1 - m0, N, K, job->trans_a ? M : K, job->trans_b ? K : N, N,
                          job->trans_a, job->trans_b, job->accumulate, NULL, 0}, p;
    int owned;
    TP_TRY(find_product(&key, &p, &owned));
    dnnl_memory_desc_t ad, bd, cd, padd;
    dnnl_memory_t am = NULL, bm = NULL, cm = NULL, padm = NULL;
    dnnl_stream_t stream = NULL;
    dnnl_dims_t pad_dims = {(int64_t)p.scratchpad_bytes};
    int ok = p.scratchpad_bytes <= job->pad_bytes &&
             matrix_desc(&ad, p.M, K, p.lda, p.trans_a, dnnl_bf16) == dnnl_success &&
             matrix_desc(&bd, K, N, p.ldb, p.trans_b, dnnl_bf16) == dnnl_success &&
             matrix_desc(&cd, p.M, N, p.ldc, 0, dnnl_f32) == dnnl_success &&
             dnnl_memory_desc_init_by_tag(&padd, 1, pad_dims, dnnl_u8, dnnl_a) == dnnl_success &&
             dnnl_memory_create(&am, &ad, dnnl.engine, (void *)a) == dnnl_success &&
             dnnl_memory_create(&bm, &bd, dnnl.engine, (void *)job->b) == dnnl_success &&
             dnnl_memory_create(&cm, &cd, dnnl.engine, job->c + m0 * N) == dnnl_success &&
             (!p.scratchpad_bytes || dnnl_memory_create(&padm, &padd, dnnl.engine, pad) == dnnl_success) &&
             dnnl_stream_create(&stream, dnnl.engine, dnnl_stream_default_flags) == dnnl_success;
    if (ok) {
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm},
                                   {DNNL_ARG_SCRATCHPAD, padm}};
        omp_set_num_threads(1); /* threads are ours (the file's comment) */
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
        return tp_fail(TP_ERR_DEVICE, "oneDNN: the bf16 product of [%lld, %lld] x [%lld, %lld] failed", (long long)p.M,
                       (long long)K, (long long)K, (long long)N);
    return TP_OK;
}

static int block_task(void *ctx, int64_t k)
{
    const product_job *job = ctx;
    int64_t m0 = k * job->rows_per_block, m1 = m0 + job->rows_per_block < job->M ? m0 + job->rows_per_block : job->M;
    return run_block(job, m0, m1, job->pads + (size_t)k * job->pad_bytes);
}

/* Rows per block: at least this many, so that a block's product outweighs
 * handing it to another thread. */
#define MIN_BLOCK_ROWS 64

int bf16_product(float *c, bf16_operand a, bf16_operand b, int64_t M, int64_t N, int64_t K, int trans_a, int trans_b,
                 int accumulate)
{
    if (!bf16_products_available()) return tp_fail(TP_ERR_STATE, "oneDNN's bf16 products are not available here");
    if (M <= 0 || N <= 0) return TP_OK;
    if (K <= 0) { /* a sum of nothing */
        if (!accumulate) memset(c, 0, (size_t)(M * N) * sizeof *c);
        return TP_OK;
    }
    int64_t rows_per_block, blocks = workers_shares(M, MIN_BLOCK_ROWS, &rows_per_block);
    /* Every block's scratchpad is as large as the larger of the two block
     * shapes' (the last block may be shorter). */
    size_t pad_bytes = 0;
    for (int last = 0; last < 2; last++) {
        int64_t rows = last ? M - (blocks - 1) * rows_per_block : rows_per_block;
        cached_product key = {rows, N, K, trans_a ? M : K, trans_b ? K : N, N, trans_a, trans_b, accumulate, NULL, 0};
        cached_product p;
        int owned;
        TP_TRY(find_product(&key, &p, &owned));
        if (owned) dnnl_primitive_destroy(p.primitive);
        if (p.scratchpad_bytes > pad_bytes) pad_bytes = p.scratchpad_bytes;
    }
    pad_bytes = (pad_bytes + 4095) / 4096 * 4096;
    const uint16_t *a16 = to_bf16(SCRATCH_BF16_A, a, M * K), *b16 = to_bf16(SCRATCH_BF16_B, b, K * N);
    char *pads = pad_bytes ? scratch_buffer(SCRATCH_BF16_PAD, (size_t)blocks * pad_bytes) : NULL;
    if (!a16 || !b16 || (pad_bytes && !pads))
        return tp_fail(TP_ERR_NOMEM, "out of memory for a bf16 product of [%lld, %lld] x [%lld, %lld]", (long long)M,
                       (long long)K, (long long)K, (long long)N);
    product_job job = {c, a16, b16, M, N, K, rows_per_block, trans_a, trans_b, accumulate, pads, pad_bytes};
    if (blocks == 1) return run_block(&job, 0, M, pads);
    return workers_run(blocks, block_task, &job);
}
