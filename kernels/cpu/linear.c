/* linear.c: matrix products (OpenBLAS) and elementwise sums, scales and norms. */
#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "../convert_bits.h"
#include "../kernels.h"
#include "bf16_outputs.h"
#include "bf16_products.h"
#include "vector_clones.h"
#include "workers.h"

void kernels_set_threads(int threads)
{
    /* The pool owns the cores; OpenBLAS runs single-threaded in its tasks. */
    openblas_set_num_threads(1);
    workers_set_threads(threads);
}

static struct {
    pthread_once_t once;
    char text[160];
} cpu_paths = {PTHREAD_ONCE_INIT, ""};

static void describe_cpu_paths(void)
{
    snprintf(cpu_paths.text, sizeof cpu_paths.text, "OpenBLAS %s, oneDNN %s, bf16 products by %s",
             openblas_get_corename(), onednn_isa_name(),
             bf16_products_available() ? "oneDNN" : "sgemm on rounded operands");
}

const char *kernels_cpu_paths(void)
{
    pthread_once(&cpu_paths.once, describe_cpu_paths);
    return cpu_paths.text;
}

/* Rows (or columns) of a product's block at least: a thinner block wastes
 * the sgemm kernel's register tiles. */
#define PRODUCT_MIN_SHARE 32

/* c[M,N] = op(a)[M,K] op(b)[K,N] + beta c (+ bias[N] on every row), cut into
 * blocks of rows of c, or of columns where c is wider than tall (the head's
 * products for a few rows), each block a single-threaded sgemm. a is [M,K]
 * row-major ([K,M] with trans_a), b is [K,N] ([N,K] with trans_b). */
typedef struct {
    int trans_a, trans_b, by_rows;
    int64_t M, N, K, per_share;
    const float *a, *b, *bias;
    float *c, beta;
} product_job;

static int product_block(void *ctx, int64_t share)
{
    const product_job *p = ctx;
    int64_t extent = p->by_rows ? p->M : p->N, lo = share * p->per_share;
    int64_t hi = lo + p->per_share < extent ? lo + p->per_share : extent;
    int64_t lda = p->trans_a ? p->M : p->K, ldb = p->trans_b ? p->K : p->N;
    const float *a = p->a, *b = p->b;
    float *c = p->c;
    int64_t M = p->M, N = p->N;
    if (p->by_rows) { /* rows lo..hi of op(a) and of c */
        a += p->trans_a ? lo : lo * lda;
        c += lo * p->N;
        M = hi - lo;
    } else { /* columns lo..hi of op(b) and of c */
        b += p->trans_b ? lo * ldb : lo;
        c += lo;
        N = hi - lo;
    }
    cblas_sgemm(CblasRowMajor, p->trans_a ? CblasTrans : CblasNoTrans, p->trans_b ? CblasTrans : CblasNoTrans, (int)M,
                (int)N, (int)p->K, 1.0f, a, (int)lda, b, (int)ldb, p->beta, c, (int)p->N);
    if (p->bias) {
        const float *bias = p->bias + (p->by_rows ? 0 : lo);
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) c[m * p->N + n] += bias[n];
    }
    return TP_OK;
}

static void product(float *c, const float *a, const float *b, const float *bias, int64_t M, int64_t N, int64_t K,
                    int trans_a, int trans_b, float beta)
{
    product_job job = {trans_a, trans_b, M >= N, M, N, K, 0, a, b, bias, c, beta};
    int64_t shares = workers_shares(job.by_rows ? M : N, PRODUCT_MIN_SHARE, &job.per_share);
    (void)workers_run(shares, product_block, &job); /* sgemm cannot fail */
}

void matmul_forward(float *out, const float *in, const float *weight, const float *bias, int64_t N, int64_t C,
                    int64_t OC)
{
    product(out, in, weight, bias, N, OC, C, 0, 1, 0.0f); /* out[N,OC] = in[N,C] @ weight[OC,C]^T + bias */
}

/* d_bias[OC] += column sums of d_out[N,OC], columns o0..o1: each column
 * summed over the rows in order, whatever the threads. */
typedef struct {
    float *d_bias;
    const float *d_out;
    int64_t N, OC;
} column_sums_job;

static VECTOR_CLONES void column_sums(void *ctx, int64_t o0, int64_t o1)
{
    const column_sums_job *j = ctx;
    for (int64_t n = 0; n < j->N; n++)
        for (int64_t o = o0; o < o1; o++) j->d_bias[o] += j->d_out[n * j->OC + o];
}

void matmul_backward(float *d_in, float *d_weight, float *d_bias, const float *d_out, const float *in,
                     const float *weight, int64_t N, int64_t C, int64_t OC)
{
    if (d_in) product(d_in, d_out, weight, NULL, N, C, OC, 0, 0, 0.0f);         /* d_in[N,C] = d_out[N,OC] @ weight[OC,C] */
    if (d_weight) product(d_weight, d_out, in, NULL, OC, C, N, 1, 0, 1.0f);     /* d_weight[OC,C] += d_out^T @ in[N,C] */
    if (d_bias) {
        column_sums_job job = {d_bias, d_out, N, OC};
        workers_for(OC, N, column_sums, &job);
    }
}

/* The element-wise sums and scales, in spans over the pool: out, x and y
 * are arrays, bias a row of C values added to every row. */
typedef struct {
    float *out;
    const float *x, *y, *bias;
    float scale;
    int64_t C;
} elementwise_job;

static VECTOR_CLONES void sum_span(void *ctx, int64_t i0, int64_t i1)
{
    const elementwise_job *j = ctx;
    for (int64_t i = i0; i < i1; i++) j->out[i] = j->x[i] + j->y[i];
}

static VECTOR_CLONES void bias_residual_rows(void *ctx, int64_t n0, int64_t n1)
{
    const elementwise_job *j = ctx;
    for (int64_t n = n0; n < n1; n++)
        for (int64_t c = 0, i = n * j->C; c < j->C; c++, i++) j->out[i] = j->x[i] + (j->y[i] + j->bias[c]);
}

static VECTOR_CLONES void add_bias_rows(void *ctx, int64_t n0, int64_t n1)
{
    const elementwise_job *j = ctx;
    for (int64_t n = n0; n < n1; n++)
        for (int64_t c = 0; c < j->C; c++) j->out[n * j->C + c] += j->bias[c];
}

static VECTOR_CLONES void scale_span(void *ctx, int64_t i0, int64_t i1)
{
    const elementwise_job *j = ctx;
    for (int64_t i = i0; i < i1; i++) j->out[i] *= j->scale;
}

void residual_forward(float *out, const float *a, const float *b, int64_t n)
{
    elementwise_job job = {out, a, b, NULL, 0, 0};
    workers_for(n, 1, sum_span, &job);
}

void bias_residual_forward(float *out, const float *x, const float *partial, const float *bias, int64_t N, int64_t C)
{
    elementwise_job job = {out, x, partial, bias, 0, C};
    workers_for(N, C, bias_residual_rows, &job);
}

void add_inplace(float *acc, const float *x, int64_t n)
{
    elementwise_job job = {acc, acc, x, NULL, 0, 0};
    workers_for(n, 1, sum_span, &job);
}

void scale_inplace(float *x, float scale, int64_t n)
{
    elementwise_job job = {x, NULL, NULL, NULL, scale, 0};
    workers_for(n, 1, scale_span, &job);
}

/* Squares are summed in chunks of SQUARES_CHUNK elements of the spans'
 * concatenation, each chunk in SQUARES_LANES running sums (vector lanes)
 * added at its end, the chunks' sums added in order, ROUND_CHUNKS chunks
 * at a time on the pool: the same bits at any thread count. */
#define SQUARES_CHUNK 65536
#define SQUARES_LANES 16
#define ROUND_CHUNKS 256

typedef struct {
    const float *const *spans;
    const int64_t *lengths;
    int count;
    int64_t first_chunk;
    double sums[ROUND_CHUNKS];
} squares_job;

static VECTOR_CLONES double squares_of(const float *x, int64_t n)
{
    double lanes[SQUARES_LANES] = {0};
    int64_t i = 0;
    for (; i + SQUARES_LANES <= n; i += SQUARES_LANES)
        for (int k = 0; k < SQUARES_LANES; k++) lanes[k] += (double)x[i + k] * x[i + k];
    for (int k = 0; i < n; i++, k++) lanes[k] += (double)x[i] * x[i];
    double sum = 0;
    for (int k = 0; k < SQUARES_LANES; k++) sum += lanes[k];
    return sum;
}

static int squares_chunk(void *ctx, int64_t task)
{
    squares_job *j = ctx;
    int64_t begin = (j->first_chunk + task) * SQUARES_CHUNK, end = begin + SQUARES_CHUNK, at = 0;
    double sum = 0;
    for (int s = 0; s < j->count && at < end; at += j->lengths[s], s++) {
        int64_t lo = begin > at ? begin - at : 0, hi = end - at < j->lengths[s] ? end - at : j->lengths[s];
        if (hi > lo) sum += squares_of(j->spans[s] + lo, hi - lo);
    }
    j->sums[task] = sum;
    return TP_OK;
}

double sum_of_squares(const float *const *spans, const int64_t *lengths, int count)
{
    int64_t total = 0;
    for (int s = 0; s < count; s++) total += lengths[s];
    int64_t chunks = (total + SQUARES_CHUNK - 1) / SQUARES_CHUNK;
    squares_job job = {.spans = spans, .lengths = lengths, .count = count};
    double sum = 0;
    for (job.first_chunk = 0; job.first_chunk < chunks; job.first_chunk += ROUND_CHUNKS) {
        int64_t round = chunks - job.first_chunk < ROUND_CHUNKS ? chunks - job.first_chunk : ROUND_CHUNKS;
        (void)workers_run(round, squares_chunk, &job); /* its tasks cannot fail */
        for (int64_t c = 0; c < round; c++) sum += job.sums[c];
    }
    return sum;
}

/* Value i of a bf16 operand as fp32: its bits widened, or its fp32 value
 * rounded to bf16 (bits_f32_to_bf16, convert_bits.h). */
static inline float bf16_value_of(bf16_operand x, int64_t i)
{
    uint32_t bits;
    if (x.bits) bits = bits_bf16_to_f32(x.bits[i]);
    else {
        memcpy(&bits, &x.values[i], sizeof bits);
        bits = bits_bf16_to_f32(bits_f32_to_bf16(bits));
    }
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

float *bf16_operand_as_f32(bf16_operand x, int64_t n)
{
    float *out = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (out && x.bits) convert_to_f32(x.bits, TP_BF16, out, n);
    for (int64_t i = 0; out && !x.bits && i < n; i++) out[i] = bf16_value_of(x, i);
    return out;
}

int matmul_forward_bf16(float *out, const uint16_t *in, const uint16_t *weight, const float *bias, int64_t N,
                        int64_t C, int64_t OC)
{
    if (bf16_products_available()) { /* out[N,OC] = in[N,C] @ weight[OC,C]^T */
        TP_TRY(bf16_product(out, bf16_of_bits(in), bf16_of_bits(weight), N, OC, C, 0, 1, 0));
        elementwise_job job = {out, NULL, NULL, bias, 0, OC};
        if (bias) workers_for(N, OC, add_bias_rows, &job);
        return TP_OK;
    }
    float *a = bf16_operand_as_f32(bf16_of_bits(in), N * C), *w = bf16_operand_as_f32(bf16_of_bits(weight), OC * C);
    int status = a && w ? TP_OK
                        : tp_fail(TP_ERR_NOMEM, "out of memory widening a [%lld, %lld] x [%lld, %lld] bf16 product",
                                  (long long)N, (long long)C, (long long)OC, (long long)C);
    if (!status) matmul_forward(out, a, w, bias, N, C, OC);
    free(a);
    free(w);
    return status;
}

/* *sums: the fp32 sums of a product written in bf16, in the scratch (what
 * names it in messages), with its bias rounded to bf16 first (kernels.h;
 * NULL: none). */
static int sums_of_bf16_written_product(float **sums, const uint16_t *in, const uint16_t *weight, const float *bias,
                                        int64_t N, int64_t C, int64_t OC, const char *what)
{
    TP_TRY(bf16_output_scratch(sums, N * OC, what));
    float *rounded_bias = bias ? bf16_operand_as_f32(bf16_of_values(bias), OC) : NULL;
    if (bias && !rounded_bias)
        return tp_fail(TP_ERR_NOMEM, "out of memory for a bf16 %s's bias of %lld values, rounded", what,
                       (long long)OC);
    int status = matmul_forward_bf16(*sums, in, weight, rounded_bias, N, C, OC);
    free(rounded_bias);
    return status;
}

int matmul_forward_bf16_bits(uint16_t *out, const uint16_t *in, const uint16_t *weight, const float *bias, int64_t N,
                             int64_t C, int64_t OC)
{
    float *y;
    TP_TRY(sums_of_bf16_written_product(&y, in, weight, bias, N, C, OC, "product"));
    round_to_bf16(out, y, N * OC);
    return TP_OK;
}

/* The fp32 sum in the scratch: pre is its rounding, out the rounding of
 * its GELU, computed in place once pre has been taken. */
int matmul_forward_gelu_bf16(uint16_t *out, uint16_t *pre, const uint16_t *in, const uint16_t *weight,
                             const float *bias, int64_t N, int64_t C, int64_t OC)
{
    float *y;
    TP_TRY(sums_of_bf16_written_product(&y, in, weight, bias, N, C, OC, "product and GELU"));
    round_to_bf16(pre, y, N * OC);
    gelu_forward(y, y, N * OC);
    round_to_bf16(out, y, N * OC);
    return TP_OK;
}

/* d_bias[OC] += the column sums of the bf16 values of d_out[N, OC] (bits
 * widened): the gradient the bf16 product reads, summed row by row in fp32
 * as column_sums sums. */
typedef struct {
    float *d_bias;
    bf16_operand d_out;
    int64_t N, OC;
} bf16_column_sums_job;

static VECTOR_CLONES void bf16_column_sums(void *ctx, int64_t o0, int64_t o1)
{
    const bf16_column_sums_job *j = ctx;
    for (int64_t n = 0; n < j->N; n++)
        for (int64_t o = o0; o < o1; o++) j->d_bias[o] += bf16_value_of(j->d_out, n * j->OC + o);
}

int bf16_product_backward(float *d_in, float *d_weight, float *d_bias, const uint16_t *d_out_bits,
                          const uint16_t *in, const uint16_t *weight, int64_t N, int64_t C, int64_t OC)
{
    /* d_in = d_out @ weight; d_weight += d_out^T @ in; d_bias += column sums of d_out. */
    const bf16_operand d_out = bf16_of_bits(d_out_bits);
    if (d_bias) {
        bf16_column_sums_job job = {d_bias, d_out, N, OC};
        workers_for(OC, N, bf16_column_sums, &job);
    }
    if (bf16_products_available()) {
        if (d_in) TP_TRY(bf16_product(d_in, d_out, bf16_of_bits(weight), N, C, OC, 0, 0, 0)); /* [N,OC] @ [OC,C] */
        if (d_weight) /* [OC,N] @ [N,C], added */
            TP_TRY(bf16_product(d_weight, d_out, bf16_of_bits(in), OC, C, N, 1, 0, 1));
        return TP_OK;
    }
    if (!d_in && !d_weight) return TP_OK;
    float *g32 = bf16_operand_as_f32(d_out, N * OC);
    float *w = d_in ? bf16_operand_as_f32(bf16_of_bits(weight), OC * C) : NULL;
    float *a = d_weight ? bf16_operand_as_f32(bf16_of_bits(in), N * C) : NULL;
    int status = g32 && (w || !d_in) && (a || !d_weight)
                     ? TP_OK
                     : tp_fail(TP_ERR_NOMEM, "out of memory rounding a [%lld, %lld] x [%lld, %lld] product to bf16",
                               (long long)N, (long long)OC, (long long)OC, (long long)C);
    if (!status && d_in) matmul_backward(d_in, NULL, NULL, g32, NULL, w, N, C, OC);
    if (!status && d_weight) matmul_backward(NULL, d_weight, NULL, g32, a, NULL, N, C, OC);
    free(g32);
    free(w);
    free(a);
    return status;
}

int matmul_backward_bf16(float *d_in, float *d_weight, float *d_bias, const uint16_t *d_out, const uint16_t *in,
                         const uint16_t *weight, int64_t N, int64_t C, int64_t OC)
{
    return bf16_product_backward(d_in, d_weight, d_bias, d_out, in, weight, N, C, OC);
}

int matmul_backward_bf16_bits(uint16_t *d_in, float *d_weight, float *d_bias, const uint16_t *d_out,
                              const uint16_t *in, const uint16_t *weight, int64_t N, int64_t C, int64_t OC)
{
    float *d_in32 = NULL; /* d_in in fp32, then rounded: the bits of rounding it by construction */
    if (d_in) TP_TRY(bf16_output_scratch(&d_in32, N * C, "product's input gradient"));
    TP_TRY(bf16_product_backward(d_in32, d_weight, d_bias, d_out, in, weight, N, C, OC));
    if (d_in) round_to_bf16(d_in, d_in32, N * C);
    return TP_OK;
}

/* GELU's input is widened a chunk at a time (a few MiB of scratch beside
 * the fp32 d_in, whatever the layer's size); the gradient is formed in
 * place in the fp32 d_in, element by element, then rounded. */
#define GELU_PRE_CHUNK ((int64_t)1 << 20)

int matmul_backward_gelu_bf16(uint16_t *d_pre, float *d_weight, float *d_bias, const uint16_t *d_out,
                              const uint16_t *in, const uint16_t *weight, const uint16_t *pre, int64_t N, int64_t C,
                              int64_t OC)
{
    int64_t n = N * C, chunk = n < GELU_PRE_CHUNK ? n : GELU_PRE_CHUNK;
    float *d_in32 = NULL; /* [fp32 d_in (n) | a chunk of pre's values] */
    if (d_pre) TP_TRY(bf16_output_scratch(&d_in32, n + chunk, "product's input gradient and GELU's"));
    TP_TRY(bf16_product_backward(d_in32, d_weight, d_bias, d_out, in, weight, N, C, OC));
    if (!d_pre) return TP_OK;
    float *x = d_in32 + n;
    for (int64_t i = 0; i < n; i += chunk) {
        int64_t count = n - i < chunk ? n - i : chunk;
        convert_to_f32(pre + i, TP_BF16, x, count);
        gelu_backward(d_in32 + i, x, d_in32 + i, count);
        round_to_bf16(d_pre + i, d_in32 + i, count);
    }
    return TP_OK;
}
