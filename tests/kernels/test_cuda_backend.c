/* The CUDA kernel backend (kernels_cuda) against the CPU functions it twins:
 * every operation on random inputs of awkward sizes (not multiples of 32),
 * the CPU function on host copies and the CUDA operation on device copies,
 * compared with a tolerance suited to fp32 and stated in each test:
 * |got - want| <= abs + rel |want|. Gradients that accumulate start from
 * nonzero values, and outputs that are overwritten start from garbage.
 * Without a GPU these tests report themselves skipped, except the first,
 * which checks that asking for the backend then fails with its cause.
 *
 * Compiled again with CUDA_TESTS_REHEARSAL (test_cuda_rehearsal.c), the same
 * tests run on every machine with the encoded backend standing in for the
 * GPU (tests/support/encoded_backend.h: the CPU's operations on memory that
 * only the backend's copies decode). They then check themselves: sizes,
 * offsets, expectations (a bf16 operation's bits against rounding the same
 * backend's fp32 one), copies in and out, and under `make asan` their host
 * buffers, before a GPU machine's few minutes are spent on them. What only
 * CUDA has (cuBLASLt's epilogue, cuDNN, the attention variants' text) is
 * left to the GPU: REHEARSAL_SKIP names it. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "../../kernels/convert_bits.h"
#include "../../kernels/cuda/attention_cudnn.h"
#include "../../kernels/cuda/attention_tiled.h"
#include "../../kernels/cuda/products_lt.h"
#include "../../kernels/kernels.h"
#include "../support/floats.h"

#ifdef CUDA_TESTS_REHEARSAL
#include "../support/encoded_backend.h"
#define REHEARSAL 1
#define NEED_GPU() ((void)0)
/* A test, or a part of one, about what only CUDA does. */
#define REHEARSAL_SKIP(why) cr_skip_test("rehearsal on the encoded backend: %s needs CUDA itself", why)

static const kernel_backend *gpu(void)
{
    return encoded_backend();
}
/* The encoded backend has one attention, the CPU's: choosing among the
 * GPU's is a no-op (and cuDNN is not needed) there. */
#define cuda_attention_variant(name) ((void)(name), TP_OK)
#define cuda_deterministic_variant(value) ((void)(value), TP_OK)
#define cuda_tiled_forward_rows_variant(value) ((void)(value), TP_OK)
#define cuda_tiled_backward_rows_variant(value) ((void)(value), TP_OK)
#else
#define REHEARSAL 0
#define NEED_GPU()                                                                                                     \
    do {                                                                                                               \
        if (cuda_device_count() == 0)                                                                                  \
            cr_skip_test("no CUDA device (%s)", cuda_built() ? "built with CUDA" : "built without CUDA");              \
    } while (0)
#define REHEARSAL_SKIP(why) ((void)0)

static const kernel_backend *gpu(void)
{
    const kernel_backend *k = kernels_cuda(0);
    cr_assert(k, "kernels_cuda(0): %s", tp_errmsg());
    return k;
}
#endif

/* A device copy of n host values of `size` bytes each. */
static void *upload(const kernel_backend *k, const void *host, int64_t n, size_t size)
{
    void *device = NULL;
    cr_assert_eq(k->alloc(&device, (size_t)n * size), TP_OK, "alloc: %s", tp_errmsg());
    cr_assert_eq(k->to_device(device, host, (size_t)n * size), TP_OK, "to_device: %s", tp_errmsg());
    return device;
}

static float *upload_floats(const kernel_backend *k, const float *host, int64_t n)
{
    return upload(k, host, n, sizeof(float));
}

/* The device's n floats in new host memory (after the work queued before). */
static float *download(const kernel_backend *k, const float *device, int64_t n)
{
    float *host = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    cr_assert(host);
    cr_assert_eq(k->to_host(host, device, (size_t)n * sizeof(float)), TP_OK, "to_host: %s", tp_errmsg());
    return host;
}

static void check_close(const float *got, const float *want, int64_t n, double rel, double abs, const char *what)
{
    for (int64_t i = 0; i < n; i++) {
        if (got[i] == want[i] || (isnan(got[i]) && isnan(want[i]))) continue; /* infinities included */
        cr_assert(fabs((double)got[i] - (double)want[i]) <= abs + rel * fabs((double)want[i]),
                  "%s[%lld]: CUDA %.9g, CPU %.9g (tolerance %g relative + %g absolute)", what, (long long)i, got[i],
                  want[i], rel, abs);
    }
}

/* Compares the device's n floats with the CPU's. */
static void check_device(const kernel_backend *k, const float *device, const float *want, int64_t n, double rel,
                         double abs, const char *what)
{
    float *got = download(k, device, n);
    check_close(got, want, n, rel, abs, what);
    free(got);
}

static uint16_t *upload_bits(const kernel_backend *k, const uint16_t *host, int64_t n)
{
    return upload(k, host, n, sizeof(uint16_t));
}

/* A bf16 array of n values filled with 7 (0x40e0): garbage for outputs. */
static uint16_t *bits_garbage(int64_t n)
{
    uint16_t *bits = malloc((size_t)(n > 0 ? n : 1) * sizeof(uint16_t));
    cr_assert(bits);
    for (int64_t i = 0; i < n; i++) bits[i] = 0x40e0;
    return bits;
}

static int bf16_is_nan(uint16_t bits)
{
    return (bits & 0x7fffu) > 0x7f80u;
}

/* The device's n bf16 values in new host memory (after the work queued before). */
static uint16_t *download_bits(const kernel_backend *k, const uint16_t *device, int64_t n)
{
    uint16_t *host = malloc((size_t)(n > 0 ? n : 1) * sizeof(uint16_t));
    cr_assert(host);
    cr_assert_eq(k->to_host(host, device, (size_t)n * sizeof(uint16_t)), TP_OK, "to_host: %s", tp_errmsg());
    return host;
}

/* Checks of bf16 bits against the fp32 values they round, and against the
 * CPU twin's bits (defined with the bf16 activations' tests, below). */
static void check_rounding(const uint16_t *got, const float *fp32, int64_t n, double near_tie, const char *op,
                           const char *shape);
static void check_near_cpu(const uint16_t *got, const uint16_t *cpu, int64_t n, double abs, const char *op,
                           const char *shape);

/* ---------------------------------------------------------------- creation */

/* Runs with and without a GPU: without one (or without CUDA in the build)
 * the backend is NULL and the message names the cause; with one it is the
 * same table on every call, and another device is refused. */
Test(cuda_backend, creation_names_its_cause)
{
    REHEARSAL_SKIP("kernels_cuda");
    if (cuda_device_count() == 0) {
        tp_fail(TP_OK, "(no message yet)"); /* so that the message checked is kernels_cuda's */
        cr_assert_null(kernels_cuda(0), "kernels_cuda(0) without a device");
        const char *why = tp_errmsg();
        if (cuda_built()) cr_assert(strstr(why, "no CUDA device") != NULL, "message: %s", why);
        else cr_assert(strstr(why, "no CUDA support") != NULL, "message: %s", why);
        cr_assert_null(kernels_cuda(0), "a second call fails too");
        return;
    }
    const kernel_backend *k = gpu();
    cr_assert_str_eq(k->name, "cuda");
    cr_assert_eq(k->on_device, 1);
    cr_assert_eq(kernels_cuda(0), k, "the same table on a second call");
    cr_assert_null(kernels_cuda(cuda_device_count()), "another device is refused");
    cr_assert(strstr(tp_errmsg(), "device") != NULL, "message: %s", tp_errmsg());
    cr_assert_eq(kernels_cuda(0), k, "and the backend stays usable");
}

/* ------------------------------------------------------------------ memory */

Test(cuda_backend, memory_alloc_zero_copy)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    int64_t n = 1037;
    float *host = floats_random(n, 1.0f), *zeros = floats_filled(n, 0.0f);
    float *a = NULL, *b = NULL;
    cr_assert_eq(k->alloc((void **)&a, (size_t)n * sizeof(float)), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(k->alloc((void **)&b, (size_t)n * sizeof(float)), TP_OK, "%s", tp_errmsg());
    check_device(k, a, zeros, n, 0, 0, "alloc gives zeroes");
    cr_assert_eq(k->to_device(a, host, (size_t)n * sizeof(float)), TP_OK, "%s", tp_errmsg());
    check_device(k, a, host, n, 0, 0, "to_device then to_host");
    cr_assert_eq(k->copy(b, a, (size_t)n * sizeof(float)), TP_OK, "%s", tp_errmsg());
    check_device(k, b, host, n, 0, 0, "copy");
    cr_assert_eq(k->copy(a, a, (size_t)n * sizeof(float)), TP_OK, "copy onto itself is a no-op");
    cr_assert_eq(k->copy(a + 1, a, 8 * sizeof(float)), TP_ERR_ARG, "overlapping copy refused");
    cr_assert_eq(k->zero(b + 5, 100 * sizeof(float)), TP_OK, "%s", tp_errmsg());
    for (int i = 5; i < 105; i++) host[i] = 0;
    check_device(k, b, host, n, 0, 0, "zero of a range");
    cr_assert_eq(k->synchronize(), TP_OK, "%s", tp_errmsg());
    /* to_device returns once its source may be reused, from pageable and
     * from pinned memory (host_alloc), behind a long queue (1,000
     * zeroings): 12 small copies in a row from one buffer rewritten after
     * each (through the GPU's ring of 8 staging slots, wrapping it), then a
     * copy of 1.6 MB (past a slot: waited for); the device has what each
     * was given. */
    int64_t big = 400000, rounds = 12;
    float *given = floats_random(big, 1.0f), *expected = malloc((size_t)(rounds * n) * sizeof(float));
    float *pinned = NULL, *g_many = NULL;
    cr_assert(expected);
    cr_assert_eq(k->host_alloc((void **)&pinned, (size_t)big * sizeof(float)), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(k->alloc((void **)&g_many, (size_t)(rounds * n > big ? rounds * n : big) * sizeof(float)), TP_OK);
    for (int source = 0; source < 2; source++) {
        float *from = source ? pinned : malloc((size_t)big * sizeof(float));
        const char *kind = source ? "pinned" : "pageable";
        cr_assert(from);
        for (int i = 0; i < 1000; i++) cr_assert_eq(k->zero(b, (size_t)n * sizeof(float)), TP_OK);
        for (int64_t r = 0; r < rounds; r++) {
            for (int64_t i = 0; i < n; i++) from[i] = expected[r * n + i] = given[i] + (float)r;
            cr_assert_eq(k->to_device(g_many + r * n, from, (size_t)n * sizeof(float)), TP_OK, "%s", tp_errmsg());
            for (int64_t i = 0; i < n; i++) from[i] = -1.0f;
        }
        char what[96];
        snprintf(what, sizeof what, "12 small to_device from %s memory, each source rewritten at once", kind);
        check_device(k, g_many, expected, rounds * n, 0, 0, what);
        memcpy(from, given, (size_t)big * sizeof(float));
        cr_assert_eq(k->to_device(g_many, from, (size_t)big * sizeof(float)), TP_OK, "%s", tp_errmsg());
        for (int64_t i = 0; i < big; i++) from[i] = -1.0f;
        snprintf(what, sizeof what, "a 1.6 MB to_device from %s memory, its source rewritten at once", kind);
        check_device(k, g_many, given, big, 0, 0, what);
        if (!source) free(from);
    }
    k->host_release(pinned);
    k->release(g_many);
    free(given), free(expected);
    void *empty = NULL;
    cr_assert_eq(k->alloc(&empty, 0), TP_OK, "alloc of 0 bytes: %s", tp_errmsg());
    cr_assert_not_null(empty);
    k->release(empty);
    k->release(NULL);
    k->release(a);
    k->release(b);
    free(host), free(zeros);
}

/* --------------------------------------------------------- matrix products */

/* Tolerance 1e-4 relative + 1e-4 absolute: sums of 37 to 150 products of
 * values in [-1, 1), in another order (and other blocking) than OpenBLAS. */
Test(cuda_backend, matmul_forward)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    int64_t N = 37, C = 72, OC = 150;
    float *in = floats_random(N * C, 1.0f), *w = floats_random(OC * C, 1.0f), *bias = floats_random(OC, 1.0f);
    float *want = malloc((size_t)(N * OC) * sizeof(float));
    float *d_in = upload_floats(k, in, N * C), *d_w = upload_floats(k, w, OC * C), *d_bias = upload_floats(k, bias, OC);
    float *garbage = floats_filled(N * OC, 7.0f), *d_out = upload_floats(k, garbage, N * OC);
    matmul_forward(want, in, w, bias, N, C, OC);
    cr_assert_eq(k->matmul_forward(d_out, d_in, d_w, d_bias, N, C, OC), TP_OK, "%s", tp_errmsg());
    check_device(k, d_out, want, N * OC, 1e-4, 1e-4, "out (bias)");
    matmul_forward(want, in, w, NULL, N, C, OC);
    cr_assert_eq(k->matmul_forward(d_out, d_in, d_w, NULL, N, C, OC), TP_OK, "%s", tp_errmsg());
    check_device(k, d_out, want, N * OC, 1e-4, 1e-4, "out (no bias)");
    k->release(d_in), k->release(d_w), k->release(d_bias), k->release(d_out);
    free(in), free(w), free(bias), free(want), free(garbage);
}

/* d_in overwritten (starts from garbage), d_weight and d_bias accumulated
 * (start from random values). Tolerance as matmul_forward's. */
Test(cuda_backend, matmul_backward)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    int64_t N = 37, C = 72, OC = 150;
    float *in = floats_random(N * C, 1.0f), *w = floats_random(OC * C, 1.0f), *dout = floats_random(N * OC, 1.0f);
    float *din = floats_filled(N * C, 7.0f), *dw = floats_random(OC * C, 1.0f), *db = floats_random(OC, 1.0f);
    float *g_in = upload_floats(k, in, N * C), *g_w = upload_floats(k, w, OC * C);
    float *g_dout = upload_floats(k, dout, N * OC);
    float *g_din = upload_floats(k, din, N * C), *g_dw = upload_floats(k, dw, OC * C), *g_db = upload_floats(k, db, OC);
    matmul_backward(din, dw, db, dout, in, w, N, C, OC);
    cr_assert_eq(k->matmul_backward(g_din, g_dw, g_db, g_dout, g_in, g_w, N, C, OC), TP_OK, "%s", tp_errmsg());
    check_device(k, g_din, din, N * C, 1e-4, 1e-4, "d_in");
    check_device(k, g_dw, dw, OC * C, 1e-4, 1e-4, "d_weight");
    check_device(k, g_db, db, OC, 1e-4, 1e-4, "d_bias");
    /* Without d_in and d_bias: d_weight accumulates a second time, the rest untouched. */
    matmul_backward(NULL, dw, NULL, dout, in, w, N, C, OC);
    cr_assert_eq(k->matmul_backward(NULL, g_dw, NULL, g_dout, g_in, g_w, N, C, OC), TP_OK, "%s", tp_errmsg());
    check_device(k, g_dw, dw, OC * C, 1e-4, 1e-4, "d_weight, twice");
    check_device(k, g_db, db, OC, 1e-4, 1e-4, "d_bias, untouched");
    k->release(g_in), k->release(g_w), k->release(g_dout), k->release(g_din), k->release(g_dw), k->release(g_db);
    free(in), free(w), free(dout), free(din), free(dw), free(db);
}

/* bf16 mixed precision: the products of bf16 operands (bf16 bits: in, W and
 * d_out rounded on the host, as the CPU twin is given them), summed in
 * fp32. Shapes N, C, OC: the fp32 tests' and a larger one with odd
 * dimensions (unaligned rows of bf16), run in that order so that the
 * backend's scratch grows between them. Tolerance 1e-5 of the largest
 * magnitude of each output: the CPU sums the rounded operands in fp32 with
 * OpenBLAS, cuBLAS in another order (and perhaps on tensor cores); the
 * CPU's own error is about 1e-7 of that magnitude at these shapes (checked
 * against sums in double). Rounding must have happened: somewhere the
 * result differs from the fp32 product by over 1e-4 of that magnitude (at
 * these shapes it differs by about 2e-3). */
static const int64_t bf16_shapes[][3] = {{37, 72, 150}, {130, 97, 211}};

static double max_magnitude(const float *x, int64_t n)
{
    double max = 0;
    for (int64_t i = 0; i < n; i++)
        if (fabs((double)x[i]) > max) max = fabs((double)x[i]);
    return max;
}

/* The device's n floats against the CPU's, within 1e-5 of the largest |want|. */
static void check_bf16(const kernel_backend *k, const float *device, const float *want, int64_t n, const char *what)
{
    check_device(k, device, want, n, 0, 1e-5 * max_magnitude(want, n), what);
}

/* The device's n floats differ from the fp32 result by over 1e-4 of its largest magnitude somewhere. */
static void check_rounded(const kernel_backend *k, const float *device, const float *fp32, int64_t n, const char *what)
{
    float *got = download(k, device, n);
    double most = 0;
    for (int64_t i = 0; i < n; i++)
        if (fabs((double)got[i] - (double)fp32[i]) > most) most = fabs((double)got[i] - (double)fp32[i]);
    cr_assert(most > 1e-4 * max_magnitude(fp32, n), "%s: CUDA bf16 within %g of fp32 (largest %g): not rounded?",
              what, most, max_magnitude(fp32, n));
    free(got);
}

/* d_bias alone (the others NULL) of tall and of wide d_out, which the
 * column sums cut into many row chunks (column_sums.h): as the CPU's within
 * 1e-4 relative + 1e-3 absolute (columns of up to 5,000 rows, summed in
 * another order), and the same bits on a second run from the same start
 * (a fixed order: no atomics). */
Test(cuda_backend, bias_gradients_of_tall_arrays)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    const int64_t shapes[][2] = {{5000, 77}, {300, 3000}, {1000, 1}};
    for (int s = 0; s < 3; s++) {
        int64_t N = shapes[s][0], OC = shapes[s][1];
        float *dout = floats_random(N * OC, 1.0f), *db = floats_random(OC, 1.0f);
        float *g_dout = upload_floats(k, dout, N * OC), *g_db = upload_floats(k, db, OC);
        float *g_again = upload_floats(k, db, OC);
        matmul_backward(NULL, NULL, db, dout, NULL, NULL, N, 8, OC);
        cr_assert_eq(k->matmul_backward(NULL, NULL, g_db, g_dout, NULL, NULL, N, 8, OC), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(k->matmul_backward(NULL, NULL, g_again, g_dout, NULL, NULL, N, 8, OC), TP_OK, "%s", tp_errmsg());
        check_device(k, g_db, db, OC, 1e-4, 1e-3, "d_bias");
        float *first = download(k, g_db, OC), *second = download(k, g_again, OC);
        cr_assert(memcmp(first, second, (size_t)OC * sizeof(float)) == 0, "[%lld, %lld]: two runs differ",
                  (long long)N, (long long)OC);
        k->release(g_dout), k->release(g_db), k->release(g_again);
        free(dout), free(db), free(first), free(second);
    }
}

/* The products with a bias go through cuBLASLt's bias epilogue
 * (products_lt.cu), whose algorithms assume 256-byte aligned arrays unless
 * told otherwise; the trainer's arrays start at any float, its bf16
 * activations (the bf16 products' in, read where they are, and the bits
 * product's out) and its bf16 copy of the weights (the bf16 products' W,
 * read where it is) at any bf16. In three precisions, fp32, bf16 and bf16
 * written as bits (matmul_forward_bf16_bits), the bf16 ones given W's bits
 * rounded on the host, against the CPU twin given the same bits, with
 * matmul_forward's and matmul_forward_bf16's tolerances (the bits: the same
 * as the CPU's, or one bf16 ulp apart, or within that tolerance): every
 * array aligned (the epilogue runs: its count of products grows; for the
 * bits, with a bf16 D); in, W and out one value past an alignment (4 bytes;
 * 2 for bf16 in, bf16 W and bits out: another plan, or the separate bias
 * kernel where cuBLASLt has no algorithm for such arrays); the bias 4 bytes
 * past (fp32 and bf16: the separate kernel, always, the count stays; the
 * bits: below); then aligned again
 * (the kept plan). With TP_CUDA_EPILOGUE=off, the separate kernel every
 * time. The bits product adds its bias rounded to bf16 (kernels.h), from
 * its own aligned copy: its epilogue runs with a bf16 D (a bf16 bias, D's
 * type) wherever in, W and out are aligned, the caller's bias at any
 * offset. The bits are those of rounding what matmul_forward_bf16 writes
 * from the same in and W and the rounded bias to an aligned out, every one. The bf16 backward
 * (d_in and d_weight of in's, W's and d_out's bits, all read where they
 * lie) at the same offsets too, within matmul_backward_bf16's tolerance. */
Test(cuda_backend, products_with_bias_at_any_alignment)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    int64_t N = 67, C = 72, OC = 152; /* rows of 288 and 608 bytes: every row 16-byte aligned where the array is */
    float *in = floats_random(N * C, 1.0f), *w = floats_random(OC * C, 1.0f), *bias = floats_random(OC, 1.0f);
    float *rounded_bias = floats_rounded_to_bf16(bias, OC); /* what the bits product adds */
    float *dout = floats_random(N * OC, 1.0f), *dw = floats_random(OC * C, 1.0f);
    float *din = malloc((size_t)(N * C) * sizeof(float)), *want = malloc((size_t)(N * OC) * sizeof(float));
    uint16_t *in_bits = floats_bf16_bits(in, N * C), *want_bits = malloc((size_t)(N * OC) * sizeof(uint16_t));
    uint16_t *dout_bits = floats_bf16_bits(dout, N * OC), *out_garbage = bits_garbage(N * OC + 1);
    uint16_t *w_bits = floats_bf16_bits(w, OC * C);
    cr_assert(din && want && want_bits);
    /* One value more than each array: the array at offset 1 or 0. */
    float *g_in = NULL, *g_w = NULL, *g_bias = NULL, *g_out = NULL;
    float *g_din = NULL, *g_dw = NULL, *g_fp32 = NULL, *g_rounded_bias = upload_floats(k, rounded_bias, OC);
    uint16_t *g_bits = NULL, *g_w_bits = NULL, *g_dout_bits = NULL;
    uint16_t *g_out_bits = upload_bits(k, out_garbage, N * OC + 1);
    cr_assert_eq(k->alloc((void **)&g_in, (size_t)(N * C + 1) * sizeof(float)), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(k->alloc((void **)&g_dout_bits, (size_t)(N * OC + 1) * sizeof(uint16_t)), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(k->alloc((void **)&g_bits, (size_t)(N * C + 1) * sizeof(uint16_t)), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(k->alloc((void **)&g_din, (size_t)(N * C + 1) * sizeof(float)), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(k->alloc((void **)&g_dw, (size_t)(OC * C + 1) * sizeof(float)), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(k->alloc((void **)&g_w, (size_t)(OC * C + 1) * sizeof(float)), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(k->alloc((void **)&g_w_bits, (size_t)(OC * C + 1) * sizeof(uint16_t)), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(k->alloc((void **)&g_bias, (size_t)(OC + 1) * sizeof(float)), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(k->alloc((void **)&g_out, (size_t)(N * OC + 1) * sizeof(float)), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(k->alloc((void **)&g_fp32, (size_t)(N * OC) * sizeof(float)), TP_OK, "%s", tp_errmsg());
    /* The offsets of in, W and out, and of the bias; 1: the epilogue must run, 0: it must not, -1: either. */
    const struct {
        int arrays, bias, epilogue;
        const char *what;
    } cases[] = {{0, 0, 1, "all aligned"},
                 {1, 0, -1, "in, W and out one value past alignment (4 bytes; bf16 in, W and bits out 2)"},
                 {0, 1, 0, "the bias 4 bytes past alignment"},
                 {0, 0, 1, "all aligned, again"}};
    static const char *const precisions[] = {"fp32", "bf16", "bf16 bits"};
    for (int precision = 0; precision < 3; precision++)
        for (int c = 0; c < 4; c++) {
            int at = cases[c].arrays, bias_at = cases[c].bias, bf16 = precision > 0;
            cr_assert_eq(k->to_device(g_in + at, in, (size_t)(N * C) * sizeof(float)), TP_OK, "%s", tp_errmsg());
            cr_assert_eq(k->to_device(g_bits + at, in_bits, (size_t)(N * C) * sizeof(uint16_t)), TP_OK, "%s",
                         tp_errmsg());
            cr_assert_eq(k->to_device(g_w + at, w, (size_t)(OC * C) * sizeof(float)), TP_OK, "%s", tp_errmsg());
            cr_assert_eq(k->to_device(g_w_bits + at, w_bits, (size_t)(OC * C) * sizeof(uint16_t)), TP_OK, "%s",
                         tp_errmsg());
            cr_assert_eq(k->to_device(g_bias + bias_at, bias, (size_t)OC * sizeof(float)), TP_OK, "%s", tp_errmsg());
            int64_t before = cuda_lt_bias_epilogue_products(), bits_before = cuda_lt_bias_epilogue_bits_products();
            int64_t epilogues = 0, bits_epilogues = 0; /* the counts' growth for this product */
            if (precision == 2) {
                char shape[192];
                snprintf(shape, sizeof shape, "N=%lld C=%lld OC=%lld, %s", (long long)N, (long long)C, (long long)OC,
                         cases[c].what);
                cr_assert_eq(k->to_device(g_out_bits, out_garbage, (size_t)(N * OC + 1) * sizeof(uint16_t)), TP_OK);
                cr_assert_eq(matmul_forward_bf16(want, in_bits, w_bits, rounded_bias, N, C, OC), TP_OK, "%s",
                             tp_errmsg());
                cr_assert_eq(matmul_forward_bf16_bits(want_bits, in_bits, w_bits, bias, N, C, OC), TP_OK, "%s",
                             tp_errmsg());
                cr_assert_eq(k->matmul_forward_bf16_bits(g_out_bits + at, g_bits + at, g_w_bits + at, g_bias + bias_at,
                                                         N, C, OC),
                             TP_OK, "bf16 bits, %s: %s", cases[c].what, tp_errmsg());
                epilogues = cuda_lt_bias_epilogue_products() - before;
                bits_epilogues = cuda_lt_bias_epilogue_bits_products() - bits_before;
                /* the fp32 twin from the same in and W and the rounded bias, to an aligned out (its epilogue
                 * not counted) */
                cr_assert_eq(k->matmul_forward_bf16(g_fp32, g_bits + at, g_w_bits + at, g_rounded_bias, N, C, OC),
                             TP_OK, "%s", tp_errmsg());
                uint16_t *got = download_bits(k, g_out_bits + at, N * OC);
                float *fp32 = download(k, g_fp32, N * OC);
                /* cuBLASLt's bf16 D rounds its own sums (near_tie, check_rounding); the fp32 route is exact */
                check_rounding(got, fp32, N * OC, 1e-4 * max_magnitude(want, N * OC), "matmul_forward_bf16_bits",
                               shape);
                check_near_cpu(got, want_bits, N * OC, 1e-5 * max_magnitude(want, N * OC), "matmul_forward_bf16_bits",
                               shape);
                uint16_t *after = download_bits(k, g_out_bits, N * OC + 1);
                cr_assert(at == 0 || after[0] == 0x40e0u, "matmul_forward_bf16_bits %s: wrote before out", shape);
                cr_assert(at == 1 || after[N * OC] == 0x40e0u, "matmul_forward_bf16_bits %s: wrote past out", shape);
                free(got), free(fp32), free(after);
            } else if (bf16) {
                cr_assert_eq(matmul_forward_bf16(want, in_bits, w_bits, bias, N, C, OC), TP_OK, "%s", tp_errmsg());
                cr_assert_eq(k->matmul_forward_bf16(g_out + at, g_bits + at, g_w_bits + at, g_bias + bias_at, N, C,
                                                    OC),
                             TP_OK, "bf16, %s: %s", cases[c].what, tp_errmsg());
                check_bf16(k, g_out + at, want, N * OC, cases[c].what);
            } else {
                matmul_forward(want, in, w, bias, N, C, OC);
                cr_assert_eq(k->matmul_forward(g_out + at, g_in + at, g_w + at, g_bias + bias_at, N, C, OC), TP_OK,
                             "fp32, %s: %s", cases[c].what, tp_errmsg());
                check_device(k, g_out + at, want, N * OC, 1e-4, 1e-4, cases[c].what);
            }
            if (precision < 2) {
                epilogues = cuda_lt_bias_epilogue_products() - before;
                bits_epilogues = cuda_lt_bias_epilogue_bits_products() - bits_before;
            }
            const char *choice = getenv("TP_CUDA_EPILOGUE");
            /* the bits product's bias is its aligned rounded copy: the caller's offset does not matter */
            int expected = precision == 2 && bias_at && !at ? 1 : cases[c].epilogue;
            if ((choice && !strcmp(choice, "off")) || REHEARSAL) expected = 0; /* the encoded backend: no cuBLASLt */
            if (expected >= 0)
                cr_assert_eq(epilogues, expected, "%s, %s: %lld products in cuBLASLt's epilogue, want %d (%s)",
                             precisions[precision], cases[c].what, (long long)epilogues, expected,
                             cuda_lt_last_refusal());
            if (precision == 2 && expected == 1) /* with a bf16 D and a bf16 bias (an fp32 one was refused on the
                                                     H200: docs/GPU.md), not an fp32 D rounded after */
                cr_assert_eq(bits_epilogues, 1, "bf16 bits, %s: the epilogue wrote an fp32 D, not the bf16 one (%s)",
                             cases[c].what, cuda_lt_last_refusal());
            if (precision == 2 && epilogues)
                cr_log_info("bf16 qkv product, %s: cuBLASLt's epilogue with a%s D", cases[c].what,
                            bits_epilogues ? " bf16" : "n fp32 (rounded after)");
            if (precision < 2)
                cr_assert_eq(bits_epilogues, 0, "%s, %s: %lld products with a bf16 D", precisions[precision],
                             cases[c].what, (long long)bits_epilogues);
            if (precision == 1) { /* the backward of the same bits: d_in overwritten, d_weight accumulated */
                float *dw_want = malloc((size_t)(OC * C) * sizeof(float));
                cr_assert(dw_want);
                memcpy(dw_want, dw, (size_t)(OC * C) * sizeof(float));
                cr_assert_eq(k->to_device(g_dw + at, dw, (size_t)(OC * C) * sizeof(float)), TP_OK, "%s", tp_errmsg());
                cr_assert_eq(k->to_device(g_dout_bits + at, dout_bits, (size_t)(N * OC) * sizeof(uint16_t)), TP_OK,
                             "%s", tp_errmsg());
                cr_assert_eq(matmul_backward_bf16(din, dw_want, NULL, dout_bits, in_bits, w_bits, N, C, OC), TP_OK,
                             "%s", tp_errmsg());
                cr_assert_eq(k->matmul_backward_bf16(g_din + at, g_dw + at, NULL, g_dout_bits + at, g_bits + at,
                                                     g_w_bits + at, N, C, OC),
                             TP_OK, "bf16 backward, %s: %s", cases[c].what, tp_errmsg());
                char what[160];
                snprintf(what, sizeof what, "d_in of bf16 in, %s", cases[c].what);
                check_bf16(k, g_din + at, din, N * C, what);
                snprintf(what, sizeof what, "d_weight of bf16 in, %s", cases[c].what);
                check_bf16(k, g_dw + at, dw_want, OC * C, what);
                free(dw_want);
            }
        }
    k->release(g_in), k->release(g_w), k->release(g_bias), k->release(g_out), k->release(g_bits);
    k->release(g_dout_bits), k->release(g_din), k->release(g_dw), k->release(g_fp32), k->release(g_out_bits);
    k->release(g_w_bits), k->release(g_rounded_bias);
    free(in), free(w), free(bias), free(want), free(dout), free(dw), free(din), free(in_bits), free(want_bits);
    free(rounded_bias);
    free(dout_bits), free(out_garbage), free(w_bits);
}

/* out overwritten (starts from garbage), with and without bias; in and W
 * as bf16 bits (the CPU's rounding of random values), on both sides. */
Test(cuda_backend, matmul_forward_bf16)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    for (int s = 0; s < 2; s++) {
        int64_t N = bf16_shapes[s][0], C = bf16_shapes[s][1], OC = bf16_shapes[s][2];
        float *in = floats_random(N * C, 1.0f), *w = floats_random(OC * C, 1.0f), *bias = floats_random(OC, 1.0f);
        float *want = malloc((size_t)(N * OC) * sizeof(float)), *fp32 = malloc((size_t)(N * OC) * sizeof(float));
        float *garbage = floats_filled(N * OC, 7.0f);
        uint16_t *in_bits = floats_bf16_bits(in, N * C), *g_in = upload_bits(k, in_bits, N * C);
        uint16_t *w_bits = floats_bf16_bits(w, OC * C), *g_w = upload_bits(k, w_bits, OC * C);
        float *g_bias = upload_floats(k, bias, OC), *g_out = upload_floats(k, garbage, N * OC);
        cr_assert_eq(matmul_forward_bf16(want, in_bits, w_bits, bias, N, C, OC), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(k->matmul_forward_bf16(g_out, g_in, g_w, g_bias, N, C, OC), TP_OK, "%s", tp_errmsg());
        check_bf16(k, g_out, want, N * OC, "out (bias)");
        matmul_forward(fp32, in, w, bias, N, C, OC);
        check_rounded(k, g_out, fp32, N * OC, "out (bias)");

        cr_assert_eq(k->to_device(g_out, garbage, (size_t)(N * OC) * sizeof(float)), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(matmul_forward_bf16(want, in_bits, w_bits, NULL, N, C, OC), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(k->matmul_forward_bf16(g_out, g_in, g_w, NULL, N, C, OC), TP_OK, "%s", tp_errmsg());
        check_bf16(k, g_out, want, N * OC, "out (no bias)");
        matmul_forward(fp32, in, w, NULL, N, C, OC);
        check_rounded(k, g_out, fp32, N * OC, "out (no bias)");
        k->release(g_in), k->release(g_w), k->release(g_bias), k->release(g_out);
        free(in), free(in_bits), free(w), free(w_bits), free(bias), free(want), free(fp32), free(garbage);
    }
}

/* d_in overwritten (starts from garbage), d_weight and d_bias accumulated
 * (start from random values); then d_weight alone a second time (d_in and
 * d_bias untouched), then d_in alone (d_weight untouched). d_out, in and W
 * are bf16 bits (the CPU's rounding of random values) on both sides. d_bias is
 * the column sums of d_out's bf16 values: as the CPU twin's (check_bf16),
 * and as the host's fp32 column sums of the widened bits within
 * matmul_backward's fp32 tolerance (1e-4 relative + 1e-4 absolute: the same
 * values summed in another order). */
Test(cuda_backend, matmul_backward_bf16)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    for (int s = 0; s < 2; s++) {
        int64_t N = bf16_shapes[s][0], C = bf16_shapes[s][1], OC = bf16_shapes[s][2];
        float *in = floats_random(N * C, 1.0f), *w = floats_random(OC * C, 1.0f), *dout = floats_random(N * OC, 1.0f);
        float *din = floats_filled(N * C, 7.0f), *dw = floats_random(OC * C, 1.0f), *db = floats_random(OC, 1.0f);
        float *din32 = malloc((size_t)(N * C) * sizeof(float)), *dw32 = malloc((size_t)(OC * C) * sizeof(float));
        float *db_sums = malloc((size_t)OC * sizeof(float));
        cr_assert(din32 && dw32 && db_sums);
        memcpy(dw32, dw, (size_t)(OC * C) * sizeof(float));
        memcpy(db_sums, db, (size_t)OC * sizeof(float));
        uint16_t *in_bits = floats_bf16_bits(in, N * C), *g_in = upload_bits(k, in_bits, N * C);
        uint16_t *dout_bits = floats_bf16_bits(dout, N * OC), *g_dout = upload_bits(k, dout_bits, N * OC);
        uint16_t *w_bits = floats_bf16_bits(w, OC * C), *g_w = upload_bits(k, w_bits, OC * C);
        float *dout_wide = floats_of_bf16_bits(dout_bits, N * OC);
        float *g_din = upload_floats(k, din, N * C), *g_dw = upload_floats(k, dw, OC * C), *g_db = upload_floats(k, db, OC);
        cr_assert_eq(matmul_backward_bf16(din, dw, db, dout_bits, in_bits, w_bits, N, C, OC), TP_OK, "%s",
                     tp_errmsg());
        cr_assert_eq(k->matmul_backward_bf16(g_din, g_dw, g_db, g_dout, g_in, g_w, N, C, OC), TP_OK, "%s",
                     tp_errmsg());
        check_bf16(k, g_din, din, N * C, "d_in");
        check_bf16(k, g_dw, dw, OC * C, "d_weight");
        check_bf16(k, g_db, db, OC, "d_bias");
        matmul_backward(NULL, NULL, db_sums, dout_wide, NULL, NULL, N, C, OC);
        check_device(k, g_db, db_sums, OC, 1e-4, 1e-4, "d_bias, the column sums of d_out's bf16 values");
        matmul_backward(din32, dw32, NULL, dout, in, w, N, C, OC);
        check_rounded(k, g_din, din32, N * C, "d_in");
        check_rounded(k, g_dw, dw32, OC * C, "d_weight");

        cr_assert_eq(matmul_backward_bf16(NULL, dw, NULL, dout_bits, in_bits, w_bits, N, C, OC), TP_OK, "%s",
                     tp_errmsg());
        cr_assert_eq(k->matmul_backward_bf16(NULL, g_dw, NULL, g_dout, g_in, g_w, N, C, OC), TP_OK, "%s",
                     tp_errmsg());
        check_bf16(k, g_dw, dw, OC * C, "d_weight, twice");
        check_bf16(k, g_din, din, N * C, "d_in, untouched");
        check_bf16(k, g_db, db, OC, "d_bias, untouched");

        float *garbage = floats_filled(N * C, 7.0f);
        cr_assert_eq(k->to_device(g_din, garbage, (size_t)(N * C) * sizeof(float)), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(matmul_backward_bf16(din, NULL, NULL, dout_bits, in_bits, w_bits, N, C, OC), TP_OK, "%s",
                     tp_errmsg());
        cr_assert_eq(k->matmul_backward_bf16(g_din, NULL, NULL, g_dout, g_in, g_w, N, C, OC), TP_OK, "%s",
                     tp_errmsg());
        check_bf16(k, g_din, din, N * C, "d_in alone");
        check_bf16(k, g_dw, dw, OC * C, "d_weight, untouched");
        k->release(g_in), k->release(g_w), k->release(g_dout), k->release(g_din), k->release(g_dw), k->release(g_db);
        free(in), free(in_bits), free(w), free(w_bits), free(dout), free(din), free(dw), free(db), free(din32);
        free(dw32), free(db_sums), free(dout_bits), free(dout_wide), free(garbage);
    }
}

/* Products with an inner dimension of 1 are single products of two bf16
 * values, exact in fp32: the device must equal the CPU to the bit, which it
 * does only if every operand it reads holds the CPU's bits: W as the
 * trainer makes it, the device's round_to_bf16 of the fp32 weights (first
 * checked equal to the host's rounding, which the CPU twin is given); in
 * and d_out come as bits, the CPU's rounding on both sides. The operands include halfway cases (ties to
 * even, up and down, both signs) and values just past them. Forward:
 * C = 1; d_in: OC = 1 (d_weight not asked), also written as bits by
 * matmul_backward_bf16_bits (the exact product rounded as cuBLAS stores it
 * into a bf16 C: to nearest, ties to even, the products' own ties included);
 * d_weight: N = 1, from zero, of d_out's bits through both products, whose
 * d_bias, one row's sum from zero, is then d_out's values themselves. */
Test(cuda_backend, matmul_bf16_rounds_as_the_cpu)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    /* Halfway: 1 + 2^-8 rounds down to 1 (even), 1 + 3 2^-8 up to 1 + 2^-6,
     * 0.75 + 2^-9 down, 0.75 + 3 2^-9 up, 257 down to 256; just past
     * halfway, 1 + 2^-8 + 2^-20 and 65793 = 2^16 (1 + 2^-8 + 2^-16) up. */
    const float special[] = {1.00390625f, -1.00390625f, 1.01171875f, -1.01171875f, 1.0039072f,  -0.751953125f,
                             0.755859375f, 257.0f,      -65793.0f,   3.1415927f,   0.33333334f, 1e-3f};
    const int64_t count = (int64_t)(sizeof special / sizeof special[0]);
    int64_t N = 37, M = 150; /* the long dimensions */
    float *a = floats_random(N, 1.0f), *b = floats_random(M, 1.0f), *zeros = floats_filled(N * M, 0.0f);
    float *want = malloc((size_t)(N * M) * sizeof(float)), *fp32 = malloc((size_t)(N * M) * sizeof(float));
    float *garbage = floats_filled(N * M, 7.0f);
    memcpy(a, special, (size_t)count * sizeof(float));
    memcpy(b + 20, special, (size_t)count * sizeof(float));
    float *g_a = upload_floats(k, a, N), *g_b = upload_floats(k, b, M), *g_out = upload_floats(k, garbage, N * M);
    uint16_t *a_bits = floats_bf16_bits(a, N), *b_bits = floats_bf16_bits(b, M);
    uint16_t *g_a_bits = upload_bits(k, a_bits, N), *g_b_bits = upload_bits(k, b_bits, M);

    /* W's bits: b rounded on the device (the table's round_to_bf16), the host's bits */
    uint16_t *w_garbage = bits_garbage(M), *g_w_bits = upload_bits(k, w_garbage, M);
    cr_assert_eq(k->round_to_bf16(g_w_bits, g_b, M), TP_OK, "%s", tp_errmsg());
    uint16_t *w_bits = download_bits(k, g_w_bits, M);
    for (int64_t i = 0; i < M; i++)
        cr_assert_eq(w_bits[i], b_bits[i], "W rounded on the device: [%lld] bits %#06x, the host's %#06x (%.9g)",
                     (long long)i, w_bits[i], b_bits[i], b[i]);

    /* out[N,M] = bf16(a[N,1]) bf16(b[M,1])^T: a as in's bits, b as W's bits */
    cr_assert_eq(matmul_forward_bf16(want, a_bits, b_bits, NULL, N, 1, M), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(k->matmul_forward_bf16(g_out, g_a_bits, g_w_bits, NULL, N, 1, M), TP_OK, "%s", tp_errmsg());
    check_device(k, g_out, want, N * M, 0, 0, "out, C = 1");
    matmul_forward(fp32, a, b, NULL, N, 1, M);
    check_rounded(k, g_out, fp32, N * M, "out, C = 1");

    /* d_in[N,M] = bf16(d_out[N,1]) bf16(weight[1,M]): a as d_out's bits, b as W's bits */
    cr_assert_eq(k->to_device(g_out, garbage, (size_t)(N * M) * sizeof(float)), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(matmul_backward_bf16(want, NULL, NULL, a_bits, NULL, b_bits, N, M, 1), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(k->matmul_backward_bf16(g_out, NULL, NULL, g_a_bits, NULL, g_w_bits, N, M, 1), TP_OK, "%s",
                 tp_errmsg());
    check_device(k, g_out, want, N * M, 0, 0, "d_in, OC = 1");

    /* the same d_in written as bits, a as d_out's bits: the exact product rounded */
    uint16_t *garbage_bits = bits_garbage(N * M), *g_in_bits = upload_bits(k, garbage_bits, N * M);
    uint16_t *want_bits = malloc((size_t)(N * M) * sizeof(uint16_t));
    float *a_rounded = floats_of_bf16_bits(a_bits, N), *b_rounded = floats_of_bf16_bits(b_bits, M);
    cr_assert(want_bits);
    cr_assert_eq(matmul_backward_bf16_bits(want_bits, NULL, NULL, a_bits, NULL, b_bits, N, M, 1), TP_OK, "%s",
                 tp_errmsg());
    cr_assert_eq(k->matmul_backward_bf16_bits(g_in_bits, NULL, NULL, g_a_bits, NULL, g_w_bits, N, M, 1), TP_OK,
                 "%s", tp_errmsg());
    uint16_t *got_bits = download_bits(k, g_in_bits, N * M);
    for (int64_t i = 0; i < N * M; i++) {
        float product = a_rounded[i / M] * b_rounded[i % M]; /* exact: 8 significant bits times 8 */
        uint32_t x;
        memcpy(&x, &product, sizeof x);
        cr_assert_eq(got_bits[i], bits_f32_to_bf16(x),
                     "matmul_backward_bf16_bits d_in, OC = 1: [%lld] bits %#06x, the exact product %.9g rounds to "
                     "%#06x",
                     (long long)i, got_bits[i], product, bits_f32_to_bf16(x));
        cr_assert_eq(got_bits[i], want_bits[i], "matmul_backward_bf16_bits d_in, OC = 1: [%lld] bits %#06x, CPU %#06x",
                     (long long)i, got_bits[i], want_bits[i]);
    }

    /* d_weight[N,M] = 0 + bf16(d_out[1,N])^T bf16(in[1,M]): a as d_out's bits, b as in's bits */
    float *g_dw = upload_floats(k, zeros, N * M);
    memcpy(want, zeros, (size_t)(N * M) * sizeof(float));
    cr_assert_eq(matmul_backward_bf16(NULL, want, NULL, a_bits, b_bits, NULL, 1, M, N), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(k->matmul_backward_bf16(NULL, g_dw, NULL, g_a_bits, g_b_bits, NULL, 1, M, N), TP_OK, "%s",
                 tp_errmsg());
    check_device(k, g_dw, want, N * M, 0, 0, "d_weight, N = 1");

    /* the same through matmul_backward_bf16_bits; d_bias[N] = 0 + bf16(d_out[1,N]) */
    float *g_db = upload_floats(k, zeros, N);
    cr_assert_eq(k->to_device(g_dw, zeros, (size_t)(N * M) * sizeof(float)), TP_OK, "%s", tp_errmsg());
    memcpy(want, zeros, (size_t)(N * M) * sizeof(float));
    cr_assert_eq(matmul_backward_bf16_bits(NULL, want, NULL, a_bits, b_bits, NULL, 1, M, N), TP_OK, "%s",
                 tp_errmsg());
    cr_assert_eq(k->matmul_backward_bf16_bits(NULL, g_dw, g_db, g_a_bits, g_b_bits, NULL, 1, M, N), TP_OK, "%s",
                 tp_errmsg());
    check_device(k, g_dw, want, N * M, 0, 0, "matmul_backward_bf16_bits d_weight, N = 1");
    check_device(k, g_db, a_rounded, N, 0, 0, "matmul_backward_bf16_bits d_bias, N = 1 (d_out's values)");

    k->release(g_a), k->release(g_b), k->release(g_out), k->release(g_dw), k->release(g_a_bits), k->release(g_b_bits);
    k->release(g_in_bits), k->release(g_db), k->release(g_w_bits);
    free(a), free(b), free(zeros), free(want), free(fp32), free(garbage), free(a_bits), free(b_bits);
    free(garbage_bits), free(want_bits), free(got_bits), free(a_rounded), free(b_rounded), free(w_garbage);
    free(w_bits);
}

/* Dimensions beyond cuBLAS's int are refused, as by the fp32 products. */
Test(cuda_backend, matmul_bf16_refuses_huge_dimensions)
{
    NEED_GPU();
    REHEARSAL_SKIP("cuBLAS's int dimensions");
    const kernel_backend *k = gpu();
    float *g = NULL;
    int64_t huge = (int64_t)INT32_MAX + 1;
    cr_assert_eq(k->alloc((void **)&g, 4096), TP_OK, "%s", tp_errmsg());
    const uint16_t *bits = (const uint16_t *)g;
    cr_assert_eq(k->matmul_forward_bf16(g, bits, bits, NULL, huge, 1, 1), TP_ERR_ARG, "N beyond int");
    cr_assert_eq(k->matmul_backward_bf16(g, g, g, bits, bits, bits, 1, huge, 1), TP_ERR_ARG, "C beyond int");
    cr_assert_eq(k->matmul_backward_bf16(g, g, g, bits, bits, bits, 1, 1, huge), TP_ERR_ARG, "OC beyond int");
    cr_assert_eq(k->matmul_backward_bf16_bits((uint16_t *)g, g, g, bits, bits, bits, huge, 1, 1), TP_ERR_ARG,
                 "backward bits: N beyond int");
    cr_assert(strstr(tp_errmsg(), "matmul_backward_bf16_bits") != NULL, "%s", tp_errmsg());
    cr_assert_eq(k->matmul_forward_bf16_bits((uint16_t *)g, bits, bits, NULL, 1, huge, 1), TP_ERR_ARG,
                 "bits: C beyond int");
    cr_assert(strstr(tp_errmsg(), "matmul_forward_bf16_bits") != NULL, "%s", tp_errmsg());
    k->release(g);
}

/* -------------------------------------------------------------- layer norm */

/* Rows of 72 and of 1000 values (more than a block's threads, not a
 * multiple of them), shifted so that the mean matters. Tolerance 1e-4
 * relative + 1e-5 absolute: mean and variance are reductions. */
Test(cuda_backend, layernorm_forward)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    /* the last: more rows than a grid's 65,535 blocks of WARP_ROWS (8) warps hold, so that a warp takes a
     * second row (ROWS_OF_WARP, launch.h) */
    const int64_t shapes[][2] = {{37, 72}, {5, 1000}, {8 * 65535 + 37, 8}};
    for (int s = 0; s < 3; s++) {
        int64_t N = shapes[s][0], C = shapes[s][1];
        float *x = floats_random(N * C, 2.0f), *w = floats_random(C, 1.0f), *b = floats_random(C, 1.0f);
        for (int64_t i = 0; i < N * C; i++) x[i] += 0.5f;
        float *out = malloc((size_t)(N * C) * sizeof(float)), *mean = malloc((size_t)N * sizeof(float));
        float *rstd = malloc((size_t)N * sizeof(float)), *garbage = floats_filled(N * C, 7.0f);
        float *g_x = upload_floats(k, x, N * C), *g_w = upload_floats(k, w, C), *g_b = upload_floats(k, b, C);
        float *g_out = upload_floats(k, garbage, N * C), *g_mean = upload_floats(k, garbage, N);
        float *g_rstd = upload_floats(k, garbage, N);
        layernorm_forward(out, mean, rstd, x, w, b, N, C);
        cr_assert_eq(k->layernorm_forward(g_out, g_mean, g_rstd, g_x, g_w, g_b, N, C), TP_OK, "%s", tp_errmsg());
        check_device(k, g_out, out, N * C, 1e-4, 1e-5, "out");
        check_device(k, g_mean, mean, N, 1e-4, 1e-5, "mean");
        check_device(k, g_rstd, rstd, N, 1e-4, 1e-5, "rstd");
        k->release(g_x), k->release(g_w), k->release(g_b), k->release(g_out), k->release(g_mean), k->release(g_rstd);
        free(x), free(w), free(b), free(out), free(mean), free(rstd), free(garbage);
    }
}

/* The norms' backward with d_in_bits (g_bits, given garbage): the bits of
 * rounding the device's own new d_in (g_dx), every one (the CPU's d_in is
 * only close: its bits may differ near a tie). */
static void check_bits_of_d_in(const kernel_backend *k, const uint16_t *g_bits, const float *g_dx, int64_t n,
                               const char *what)
{
    float *dx = download(k, g_dx, n);
    uint16_t *bits = download_bits(k, g_bits, n);
    floats_assert_rounded(bits, dx, n, what);
    free(dx), free(bits);
}

/* All three gradients accumulate (norm.c): they start from random values.
 * Both sides get the CPU's mean and rstd. Tolerance 1e-4 relative + 1e-5
 * absolute (row and column reductions); the tall shape's column sums, of
 * 3,000 rows (each warp's, then a block's, then the blocks' partials
 * through column_sums; norm.cu), where the CPU sums each column in one
 * run, 1e-3 absolute (sums of about 50: a few units in the last place of
 * each partial sum). The fourth has no bias (d_bias NULL: not summed), its
 * columns 65,572 rows: 1e-2 absolute. The fifth has more rows than a grid's
 * 65,535 blocks of WARP_ROWS (8) warps hold (a warp takes many rows,
 * ROWS_OF_WARP: the fused kernel's grid stops at 512 blocks, the rows
 * kernel's at 65,535), its columns 524,317 rows: 0.25 absolute (the CPU
 * adds them one by one in fp32: its running sums reach hundreds, each
 * addition off by up to 2^-24 of them, about 0.02 over the column as a
 * random walk; the GPU's shorter sums err far less). The rows loop shows in
 * d_in. Widths: 8 to 1024 through the fused kernel (a lane's 8, 16, 24 or
 * 32 columns: 8, 40, 72 and 77; 300; 768, GPT-2's; 1000 and 1024), wider
 * ones through the rows kernel and column_sums: 1500 (a column a thread
 * there), 1032 and 2048 (Llama 3.2 1B's; in 16-byte chunks, 3,000 rows in
 * many). Every shape but the second also writes d_in_bits
 * (check_bits_of_d_in). */
Test(cuda_backend, layernorm_backward)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    const int64_t shapes[][2] = {{37, 72},  {5, 1000},  {3000, 77}, {65535 + 37, 40}, {8 * 65535 + 37, 8}, {40, 300},
                                 {33, 768}, {17, 1024}, {9, 1500}, {3000, 1032},     {3000, 2048}};
    for (int s = 0; s < 11; s++) {
        /* the tall shapes' columns sum many rows */
        double column_abs = s == 4 ? 0.25 : s == 3 ? 1e-2 : s == 2 || s >= 9 ? 1e-3 : 1e-5;
        int no_bias = s == 3;
        int64_t N = shapes[s][0], C = shapes[s][1];
        float *x = floats_random(N * C, 2.0f), *w = floats_random(C, 1.0f), *b = floats_random(C, 1.0f);
        float *dout = floats_random(N * C, 1.0f), *dx = floats_random(N * C, 1.0f), *dw = floats_random(C, 1.0f);
        float *db = floats_random(C, 1.0f), *out = malloc((size_t)(N * C) * sizeof(float));
        float *mean = malloc((size_t)N * sizeof(float)), *rstd = malloc((size_t)N * sizeof(float));
        layernorm_forward(out, mean, rstd, x, w, b, N, C);
        float *g_x = upload_floats(k, x, N * C), *g_w = upload_floats(k, w, C), *g_dout = upload_floats(k, dout, N * C);
        float *g_dx = upload_floats(k, dx, N * C), *g_dw = upload_floats(k, dw, C), *g_db = upload_floats(k, db, C);
        float *g_mean = upload_floats(k, mean, N), *g_rstd = upload_floats(k, rstd, N);
        uint16_t *garbage_bits = bits_garbage(N * C), *g_bits = s == 1 ? NULL : upload_bits(k, garbage_bits, N * C);
        layernorm_backward(dx, NULL, dw, no_bias ? NULL : db, dout, x, w, mean, rstd, N, C);
        cr_assert_eq(k->layernorm_backward(g_dx, g_bits, g_dw, no_bias ? NULL : g_db, g_dout, g_x, g_w, g_mean, g_rstd,
                                           N, C),
                     TP_OK, "%s", tp_errmsg());
        check_device(k, g_dx, dx, N * C, 1e-4, 1e-5, "d_in");
        if (g_bits) check_bits_of_d_in(k, g_bits, g_dx, N * C, "layernorm_backward");
        k->release(g_bits), free(garbage_bits);
        check_device(k, g_dw, dw, C, 1e-4, column_abs, "d_weight");
        check_device(k, g_db, db, C, 1e-4, column_abs, no_bias ? "d_bias (NULL given: untouched)" : "d_bias");
        k->release(g_x), k->release(g_w), k->release(g_dout), k->release(g_dx), k->release(g_dw), k->release(g_db);
        k->release(g_mean), k->release(g_rstd);
        free(x), free(w), free(b), free(dout), free(dx), free(dw), free(db), free(out), free(mean), free(rstd);
    }
}

/* -------------------------------------------------------------------- GELU */

/* Inputs in [-5, 5) and a few far out. The CPU's exp (fast_exp.h) and the
 * GPU's expf are each within 2 ulp: tolerance 1e-5 relative + 1e-6
 * absolute (the derivative crosses zero near x = -0.75). */
Test(cuda_backend, gelu_forward_and_backward)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    int64_t n = 1037;
    float *x = floats_random(n, 5.0f), *dout = floats_random(n, 1.0f);
    const float far[] = {0.0f, -0.0f, 10.0f, -10.0f, 30.0f, -30.0f, 1e-20f, -1e-20f};
    memcpy(x, far, sizeof far);
    float *out = malloc((size_t)n * sizeof(float)), *din = malloc((size_t)n * sizeof(float));
    float *garbage = floats_filled(n, 7.0f);
    float *g_x = upload_floats(k, x, n), *g_dout = upload_floats(k, dout, n), *g_out = upload_floats(k, garbage, n);
    float *g_din = upload_floats(k, garbage, n);
    gelu_forward(out, x, n);
    gelu_backward(din, x, dout, n);
    cr_assert_eq(k->gelu_forward(g_out, g_x, n), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(k->gelu_backward(g_din, g_x, g_dout, n), TP_OK, "%s", tp_errmsg());
    check_device(k, g_out, out, n, 1e-5, 1e-6, "gelu");
    check_device(k, g_din, din, n, 1e-5, 1e-6, "d_in");
    k->release(g_x), k->release(g_dout), k->release(g_out), k->release(g_din);
    free(x), free(dout), free(out), free(din), free(garbage);
}

/* ----------------------------------------------------------------- RMSNorm */

/* Rows of 72 and of 1000 values, as layernorm's; eps 1e-5 and 1e-6.
 * Tolerance 1e-4 relative + 1e-5 absolute: the mean of squares is a
 * reduction in another order. */
Test(cuda_backend, rmsnorm_forward)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    const int64_t shapes[][2] = {{37, 72}, {5, 1000}};
    const float eps[] = {1e-5f, 1e-6f};
    for (int s = 0; s < 2; s++) {
        int64_t N = shapes[s][0], C = shapes[s][1];
        float *x = floats_random(N * C, 2.0f), *w = floats_random(C, 1.0f);
        float *out = malloc((size_t)(N * C) * sizeof(float)), *rstd = malloc((size_t)N * sizeof(float));
        float *garbage = floats_filled(N * C, 7.0f);
        float *g_x = upload_floats(k, x, N * C), *g_w = upload_floats(k, w, C);
        float *g_out = upload_floats(k, garbage, N * C), *g_rstd = upload_floats(k, garbage, N);
        rmsnorm_forward(out, rstd, x, w, N, C, eps[s]);
        cr_assert_eq(k->rmsnorm_forward(g_out, g_rstd, g_x, g_w, N, C, eps[s]), TP_OK, "%s", tp_errmsg());
        check_device(k, g_out, out, N * C, 1e-4, 1e-5, "out");
        check_device(k, g_rstd, rstd, N, 1e-4, 1e-5, "rstd");
        k->release(g_x), k->release(g_w), k->release(g_out), k->release(g_rstd);
        free(x), free(w), free(out), free(rstd), free(garbage);
    }
}

/* Both gradients accumulate: they start from random values. Both sides get
 * the CPU's rstd. Shapes and tolerances as layernorm_backward's (its first
 * three, then widths through each of the fused kernel's lane sizes and
 * past them: 1500, 1032, 2048), d_in_bits likewise. */
Test(cuda_backend, rmsnorm_backward)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    const int64_t shapes[][2] = {{37, 72},   {5, 1000},  {3000, 77},   {40, 300},
                                 {33, 768},  {17, 1024}, {9, 1500},    {3000, 1032}, {3000, 2048}};
    for (int s = 0; s < 9; s++) {
        double column_abs = s == 2 || s >= 7 ? 1e-3 : 1e-5; /* the tall shapes' columns sum 3,000 rows */
        int64_t N = shapes[s][0], C = shapes[s][1];
        float *x = floats_random(N * C, 2.0f), *w = floats_random(C, 1.0f), *dout = floats_random(N * C, 1.0f);
        float *dx = floats_random(N * C, 1.0f), *dw = floats_random(C, 1.0f);
        float *out = malloc((size_t)(N * C) * sizeof(float)), *rstd = malloc((size_t)N * sizeof(float));
        rmsnorm_forward(out, rstd, x, w, N, C, 1e-5f);
        float *g_x = upload_floats(k, x, N * C), *g_w = upload_floats(k, w, C), *g_dout = upload_floats(k, dout, N * C);
        float *g_dx = upload_floats(k, dx, N * C), *g_dw = upload_floats(k, dw, C), *g_rstd = upload_floats(k, rstd, N);
        uint16_t *garbage_bits = bits_garbage(N * C), *g_bits = s == 1 ? NULL : upload_bits(k, garbage_bits, N * C);
        rmsnorm_backward(dx, NULL, dw, dout, x, w, rstd, N, C);
        cr_assert_eq(k->rmsnorm_backward(g_dx, g_bits, g_dw, g_dout, g_x, g_w, g_rstd, N, C), TP_OK, "%s",
                     tp_errmsg());
        check_device(k, g_dx, dx, N * C, 1e-4, 1e-5, "d_in");
        if (g_bits) check_bits_of_d_in(k, g_bits, g_dx, N * C, "rmsnorm_backward");
        k->release(g_bits), free(garbage_bits);
        check_device(k, g_dw, dw, C, 1e-4, column_abs, "d_weight");
        k->release(g_x), k->release(g_w), k->release(g_dout), k->release(g_dx), k->release(g_dw), k->release(g_rstd);
        free(x), free(w), free(dout), free(dx), free(dw), free(out), free(rstd);
    }
}

/* ------------------------------------------------------------------ SwiGLU */

/* in[N,2F] = [gate | up]: gates in [-8, 8) and a few far out, ups in
 * [-1, 1); F = 29 (rows not aligned to anything). Exp as GELU's: tolerance
 * 1e-5 relative + 1e-6 absolute (silu' crosses zero near g = -1.28; far
 * below zero the CPU's clamped exp gives ~1e-37 where the GPU's gives 0).
 * d_in is overwritten: it starts from garbage. */
Test(cuda_backend, swiglu_forward_and_backward)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    int64_t N = 37, F = 29;
    float *in = floats_random(N * 2 * F, 1.0f), *dout = floats_random(N * F, 1.0f);
    for (int64_t n = 0; n < N; n++)
        for (int64_t f = 0; f < F; f++) in[n * 2 * F + f] *= 8.0f;
    const float far[] = {0.0f, -0.0f, 20.0f, -20.0f, 100.0f, -100.0f, 1e-20f, -1e-20f};
    memcpy(in, far, sizeof far);
    float *out = malloc((size_t)(N * F) * sizeof(float)), *din = malloc((size_t)(N * 2 * F) * sizeof(float));
    float *garbage = floats_filled(N * 2 * F, 7.0f);
    float *g_in = upload_floats(k, in, N * 2 * F), *g_dout = upload_floats(k, dout, N * F);
    float *g_out = upload_floats(k, garbage, N * F), *g_din = upload_floats(k, garbage, N * 2 * F);
    swiglu_forward(out, in, N, F);
    swiglu_backward(din, in, dout, N, F);
    cr_assert_eq(k->swiglu_forward(g_out, g_in, N, F), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(k->swiglu_backward(g_din, g_in, g_dout, N, F), TP_OK, "%s", tp_errmsg());
    check_device(k, g_out, out, N * F, 1e-5, 1e-6, "swiglu");
    check_device(k, g_din, din, N * 2 * F, 1e-5, 1e-6, "d_in");
    k->release(g_in), k->release(g_dout), k->release(g_out), k->release(g_din);
    free(in), free(dout), free(out), free(din), free(garbage);
}

/* -------------------------------------------------------- bf16 activations
 * layernorm_forward_bf16, rmsnorm_forward_bf16 and swiglu_forward_bf16
 * write bf16 bits (GELU's bf16 forward: mlp_product_and_gelu_in_one, below):
 * on the GPU the very kernel of the fp32 operation, rounding each value as
 * it stores it, so their bits must be
 * those of rounding the GPU's own fp32 output on every element (exactly;
 * the norms' mean and rstd too). Against the CPU twin, the fp32 case's
 * tolerance translated to bf16: the same bits, or one bf16 ulp apart (the
 * two fp32 results differ in their last bits, and a rounding boundary may
 * lie between them), or within the fp32 case's absolute tolerance as values
 * (near zero). Shapes as the fp32 cases' and a tall one (N >> C); values
 * steered through each operation exactly where it lets them (out = bias
 * where the weight is 0; a row that rstd scales by 2^-10; gates whose SiLU
 * is the gate itself): ties to
 * even both ways and both signs, values just past and short of a tie, a
 * bf16 value, large ties, the largest float's tie (up to infinity),
 * subnormal ties. At those elements the bits are checked against the
 * steered value's rounding (convert_bits.h) as well. SwiGLU reads the
 * MLP's input as bf16 bits (a bf16 activation itself): its inputs
 * are rounded on the host, the device's fp32 operation compared with is
 * given the same values widened (floats_of_bf16_bits) and the CPU twin the
 * same bits, and only what bf16 inputs reach exactly is steered (below). */

/* fp32 bit patterns of the outputs steered (the norms, RoPE). */
static const uint32_t steered[] = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0xbf818000u, 0x3f808001u,
                                   0x3f807fffu, 0x3f800000u, 0x71498000u, 0xf1498000u, 0x7f7f8000u,
                                   0x00008000u, 0x00018000u, 0x80018000u};
#define STEERED (int64_t)(sizeof steered / sizeof steered[0])

static float float_of(uint32_t bits)
{
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

static uint32_t bits_of(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return bits;
}

/* A bf16 value's place on the number line: neighbours differ by 1 (both zeros at 0). */
static int32_t bf16_ordinal(uint16_t bits)
{
    return bits & 0x8000u ? -(int32_t)(bits & 0x7fffu) : (int32_t)bits;
}

/* Every one of n bf16 values `got` is the bits of rounding the fp32 value
 * at the same index of fp32 (convert_bits.h); a failure names the first
 * element that is not, and how many are not and how far (in bf16 ulps): a
 * few one ulp apart is another fp32 value on the device's side (a sum in
 * another order, where a rounding boundary lies between the two); many (a
 * truncation: about half) or farther is a rounding gone wrong. near_tie 0:
 * every element exactly (our kernels round what they computed); above 0,
 * for cuBLAS's own rounding of its fp32 sums (a bf16 C or D: its algorithm
 * may sum in another order than the fp32 product compared with), the
 * rounding of some value within near_tie of the fp32 one: one ulp apart
 * where it lies near the midpoint between the two, or more where the sum
 * nearly cancels (its ulps finer than what another order moves). */
static uint16_t bf16_of_ordinal(int32_t ordinal)
{
    return ordinal < 0 ? (uint16_t)(0x8000u | (uint32_t)-ordinal) : (uint16_t)ordinal;
}

static double bf16_double(uint16_t bits)
{
    return float_of(bits_bf16_to_f32(bits));
}

/* Whether bits is the rounding of a value within slack of x: x within
 * slack of the values that round to it (up to the midpoints to its
 * neighbours). */
static int rounds_within(uint16_t bits, double x, double slack)
{
    int32_t ordinal = bf16_ordinal(bits);
    double value = bf16_double(bits);
    double low = (value + bf16_double(bf16_of_ordinal(ordinal - 1))) / 2;
    double high = (value + bf16_double(bf16_of_ordinal(ordinal + 1))) / 2;
    return x >= low - slack && x <= high + slack;
}

static void check_rounding(const uint16_t *got, const float *fp32, int64_t n, double near_tie, const char *op,
                           const char *shape)
{
    int64_t wrong = 0, first = -1;
    int32_t farthest = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t x;
        memcpy(&x, &fp32[i], sizeof x);
        uint16_t want = bits_f32_to_bf16(x);
        if (got[i] == want || (bf16_is_nan(got[i]) && bf16_is_nan(want))) continue;
        int32_t apart = abs(bf16_ordinal(got[i]) - bf16_ordinal(want));
        if (near_tie > 0 && rounds_within(got[i], fp32[i], near_tie)) continue;
        if (first < 0) first = i;
        wrong++, farthest = apart > farthest ? apart : farthest;
    }
    if (first >= 0) {
        uint32_t x;
        memcpy(&x, &fp32[first], sizeof x);
        cr_assert_fail("%s %s: [%lld] bits %#06x, the GPU's fp32 operation wrote %.9g (%#010x), which rounds to "
                       "%#06x (%lld of %lld elements differ, by up to %d bf16 ulps)",
                       op, shape, (long long)first, got[first], fp32[first], x, bits_f32_to_bf16(x), (long long)wrong,
                       (long long)n, farthest);
    }
}

/* The device's bits against the CPU twin's: the same, or one bf16 ulp apart
 * (the two fp32 results differ in their last bits, and a rounding boundary
 * may lie between them), or within abs as values (near zero). */
static void check_near_cpu(const uint16_t *got, const uint16_t *cpu, int64_t n, double abs, const char *op,
                           const char *shape)
{
    for (int64_t i = 0; i < n; i++) {
        if (got[i] == cpu[i] || (bf16_is_nan(got[i]) && bf16_is_nan(cpu[i]))) continue;
        int32_t apart = bf16_ordinal(got[i]) - bf16_ordinal(cpu[i]);
        double g = float_of(bits_bf16_to_f32(got[i])), c = float_of(bits_bf16_to_f32(cpu[i]));
        cr_assert((apart == 1 || apart == -1) || fabs(g - c) <= abs,
                  "%s %s: [%lld] GPU %#06x (%.9g), CPU %#06x (%.9g): %d bf16 ulps apart (tolerance 1 ulp, or %g "
                  "absolute)",
                  op, shape, (long long)i, got[i], g, cpu[i], c, apart, abs);
    }
}

/* The device's bf16 activation, n values: every element the bits of rounding
 * the device's fp32 output of the same operation, and close to the CPU
 * twin's bits (above); returns the device's bits (the caller frees them). */
static uint16_t *check_activation(const kernel_backend *k, const uint16_t *device_bits, const float *device_fp32,
                                  const uint16_t *cpu, int64_t n, double abs, double near_tie, const char *op,
                                  const char *shape)
{
    uint16_t *got = download_bits(k, device_bits, n);
    float *fp32 = download(k, device_fp32, n);
    check_rounding(got, fp32, n, near_tie, op, shape);
    check_near_cpu(got, cpu, n, abs, op, shape);
    free(fp32);
    return got;
}

/* Element i was steered to the fp32 value of bits `value`: its bits are that value's rounding. */
static void check_steered(const uint16_t *got, int64_t i, uint32_t value, const char *op, const char *shape)
{
    cr_assert_eq(got[i], bits_f32_to_bf16(value), "%s %s: [%lld] bits %#06x, steered to %.9g (%#010x), which rounds "
                 "to %#06x",
                 op, shape, (long long)i, got[i], float_of(value), value, bits_f32_to_bf16(value));
}

/* The device's n floats are bit for bit those at other (both device memory). */
static void check_same_floats(const kernel_backend *k, const float *device, const float *other, int64_t n,
                              const char *what, const char *shape)
{
    float *got = download(k, device, n), *want = download(k, other, n);
    for (int64_t i = 0; i < n; i++)
        cr_assert(memcmp(&got[i], &want[i], sizeof(float)) == 0, "%s %s: [%lld] %.9g, the fp32 operation's %.9g",
                  what, shape, (long long)i, got[i], want[i]);
    free(got), free(want);
}

/* Columns c < STEERED have weight 0 and bias steered[c]: out = bias. The CPU
 * tolerance: layernorm_forward's absolute 1e-5. */
Test(cuda_backend, layernorm_forward_bf16)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    const int64_t shapes[][2] = {{37, 72}, {5, 1000}, {3000, 77}};
    for (int s = 0; s < 3; s++) {
        int64_t N = shapes[s][0], C = shapes[s][1];
        char shape[64];
        snprintf(shape, sizeof shape, "N=%lld C=%lld", (long long)N, (long long)C);
        float *x = floats_random(N * C, 2.0f), *w = floats_random(C, 1.0f), *b = floats_random(C, 1.0f);
        for (int64_t i = 0; i < N * C; i++) x[i] += 0.5f;
        for (int64_t c = 0; c < STEERED; c++) w[c] = 0.0f, b[c] = float_of(steered[c]);
        uint16_t *out = malloc((size_t)(N * C) * sizeof(uint16_t)), *garbage_bits = bits_garbage(N * C);
        float *mean = malloc((size_t)N * sizeof(float)), *rstd = malloc((size_t)N * sizeof(float));
        float *garbage = floats_filled(N * C, 7.0f);
        cr_assert(out && mean && rstd);
        float *g_x = upload_floats(k, x, N * C), *g_w = upload_floats(k, w, C), *g_b = upload_floats(k, b, C);
        float *g_mean = upload_floats(k, garbage, N), *g_rstd = upload_floats(k, garbage, N);
        float *g_fp32 = upload_floats(k, garbage, N * C), *g_mean32 = upload_floats(k, garbage, N);
        float *g_rstd32 = upload_floats(k, garbage, N);
        uint16_t *g_out = upload_bits(k, garbage_bits, N * C);
        cr_assert_eq(layernorm_forward_bf16(out, mean, rstd, x, w, b, N, C), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(k->layernorm_forward_bf16(g_out, g_mean, g_rstd, g_x, g_w, g_b, N, C), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(k->layernorm_forward(g_fp32, g_mean32, g_rstd32, g_x, g_w, g_b, N, C), TP_OK, "%s", tp_errmsg());
        uint16_t *got = check_activation(k, g_out, g_fp32, out, N * C, 1e-5, 0, "layernorm_forward_bf16", shape);
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < STEERED; c++)
                check_steered(got, n * C + c, steered[c], "layernorm_forward_bf16", shape);
        check_same_floats(k, g_mean, g_mean32, N, "layernorm_forward_bf16 mean", shape);
        check_same_floats(k, g_rstd, g_rstd32, N, "layernorm_forward_bf16 rstd", shape);
        check_device(k, g_mean, mean, N, 1e-4, 1e-5, "mean");
        check_device(k, g_rstd, rstd, N, 1e-4, 1e-5, "rstd");
        k->release(g_x), k->release(g_w), k->release(g_b), k->release(g_mean), k->release(g_rstd);
        k->release(g_fp32), k->release(g_mean32), k->release(g_rstd32), k->release(g_out);
        free(x), free(w), free(b), free(out), free(garbage_bits), free(mean), free(rstd), free(garbage), free(got);
    }
}

/* Row 0 is all 1024: its mean square 2^20 (exact, eps below its ulp), rstd
 * 2^-10, x rstd 1, so out = weight, and weights c < STEERED are steered[c].
 * eps 1e-5 and 1e-6 as rmsnorm_forward's case; the CPU tolerance its
 * absolute 1e-5. */
Test(cuda_backend, rmsnorm_forward_bf16)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    const int64_t shapes[][2] = {{37, 72}, {5, 1000}, {3000, 77}};
    const float eps[] = {1e-5f, 1e-6f, 1e-5f};
    for (int s = 0; s < 3; s++) {
        int64_t N = shapes[s][0], C = shapes[s][1];
        char shape[64];
        snprintf(shape, sizeof shape, "N=%lld C=%lld eps=%g", (long long)N, (long long)C, eps[s]);
        float *x = floats_random(N * C, 2.0f), *w = floats_random(C, 1.0f);
        for (int64_t c = 0; c < C; c++) x[c] = 1024.0f;
        for (int64_t c = 0; c < STEERED; c++) w[c] = float_of(steered[c]);
        uint16_t *out = malloc((size_t)(N * C) * sizeof(uint16_t)), *garbage_bits = bits_garbage(N * C);
        float *rstd = malloc((size_t)N * sizeof(float)), *garbage = floats_filled(N * C, 7.0f);
        cr_assert(out && rstd);
        float *g_x = upload_floats(k, x, N * C), *g_w = upload_floats(k, w, C), *g_rstd = upload_floats(k, garbage, N);
        float *g_fp32 = upload_floats(k, garbage, N * C), *g_rstd32 = upload_floats(k, garbage, N);
        uint16_t *g_out = upload_bits(k, garbage_bits, N * C);
        cr_assert_eq(rmsnorm_forward_bf16(out, rstd, x, w, N, C, eps[s]), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(k->rmsnorm_forward_bf16(g_out, g_rstd, g_x, g_w, N, C, eps[s]), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(k->rmsnorm_forward(g_fp32, g_rstd32, g_x, g_w, N, C, eps[s]), TP_OK, "%s", tp_errmsg());
        uint16_t *got = check_activation(k, g_out, g_fp32, out, N * C, 1e-5, 0, "rmsnorm_forward_bf16", shape);
        for (int64_t c = 0; c < STEERED; c++) check_steered(got, c, steered[c], "rmsnorm_forward_bf16", shape);
        check_same_floats(k, g_rstd, g_rstd32, N, "rmsnorm_forward_bf16 rstd", shape);
        check_device(k, g_rstd, rstd, N, 1e-4, 1e-5, "rstd");
        k->release(g_x), k->release(g_w), k->release(g_rstd), k->release(g_fp32), k->release(g_rstd32);
        k->release(g_out);
        free(x), free(w), free(out), free(garbage_bits), free(rstd), free(garbage), free(got);
    }
}

/* One of the residual norms (kernels.h residual_layernorm_forward) of
 * variant v (bit 0: RMSNorm, bit 1: bf16 out) on the device; out is fp32
 * or bf16 bits by v. */
static int residual_norm_on(const kernel_backend *k, int v, void *out, float *mean, float *rstd, float *sum,
                            const float *x, const float *partial, const float *residual_bias, const float *w,
                            const float *b, int64_t N, int64_t C)
{
    switch (v) {
    case 0: return k->residual_layernorm_forward(out, mean, rstd, sum, x, partial, residual_bias, w, b, N, C);
    case 1: return k->residual_rmsnorm_forward(out, rstd, sum, x, partial, residual_bias, w, N, C, 1e-6f);
    case 2: return k->residual_layernorm_forward_bf16(out, mean, rstd, sum, x, partial, residual_bias, w, b, N, C);
    default: return k->residual_rmsnorm_forward_bf16(out, rstd, sum, x, partial, residual_bias, w, N, C, 1e-6f);
    }
}

/* The same norm alone, of in. */
static int norm_alone_on(const kernel_backend *k, int v, void *out, float *mean, float *rstd, const float *in,
                         const float *w, const float *b, int64_t N, int64_t C)
{
    switch (v) {
    case 0: return k->layernorm_forward(out, mean, rstd, in, w, b, N, C);
    case 1: return k->rmsnorm_forward(out, rstd, in, w, N, C, 1e-6f);
    case 2: return k->layernorm_forward_bf16(out, mean, rstd, in, w, b, N, C);
    default: return k->rmsnorm_forward_bf16(out, rstd, in, w, N, C, 1e-6f);
    }
}

/* The residual add and the norm in one kernel (a block's res1 and ln2):
 * bit for bit the device's residual operation, then its norm of the sum
 * (the sum, out, mean and rstd), for both norms, fp32 and bf16 out, with
 * and without the residual's bias, the sum written over partial (as the
 * trainer does), over x or apart; the sum bit for bit the CPU's (two
 * additions, no product to contract), out, mean and rstd near the CPU's.
 * Shapes as the norms' cases, and a tall one of 65,600 rows (the rows
 * loop's second pass is layernorm_forward's and layernorm_backward's to
 * check: here it would cost seconds on the CPU's side). */
Test(cuda_backend, residual_norms_in_one_pass)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    const int64_t shapes[][2] = {{37, 72}, {5, 1000}, {3000, 77}, {65600, 8}};
    const char *const names[] = {"residual_layernorm_forward", "residual_rmsnorm_forward",
                                 "residual_layernorm_forward_bf16", "residual_rmsnorm_forward_bf16"};
    for (int s = 0; s < 4; s++) {
        int64_t N = shapes[s][0], C = shapes[s][1], n = N * C;
        float *x = floats_random(n, 2.0f), *partial = floats_random(n, 2.0f), *rbias = floats_random(C, 1.0f);
        float *w = floats_random(C, 1.0f), *b = floats_random(C, 1.0f), *garbage = floats_filled(n, 7.0f);
        float *cpu_sum = malloc((size_t)n * sizeof(float)), *cpu_out = malloc((size_t)n * sizeof(float));
        uint16_t *cpu_bits = malloc((size_t)n * sizeof(uint16_t));
        float *cpu_mean = malloc((size_t)N * sizeof(float)), *cpu_rstd = malloc((size_t)N * sizeof(float));
        cr_assert(cpu_sum && cpu_out && cpu_bits && cpu_mean && cpu_rstd);
        float *g_x = upload_floats(k, x, n), *g_partial = upload_floats(k, partial, n);
        float *g_rbias = upload_floats(k, rbias, C), *g_w = upload_floats(k, w, C), *g_b = upload_floats(k, b, C);
        float *g_sum = upload_floats(k, garbage, n), *g_alone_sum = upload_floats(k, garbage, n);
        float *g_out = upload_floats(k, garbage, n), *g_alone_out = upload_floats(k, garbage, n);
        float *g_mean = upload_floats(k, garbage, N), *g_rstd = upload_floats(k, garbage, N);
        float *g_alone_mean = upload_floats(k, garbage, N), *g_alone_rstd = upload_floats(k, garbage, N);
        for (int v = 0; v < 4; v++)
            for (int with_bias = 0; with_bias < 2; with_bias++)
                for (int place = 0; place < 3; place++) { /* the sum over partial, over x, apart */
                    static const char *const places[] = {"over partial", "over x", "apart"};
                    char shape[96];
                    snprintf(shape, sizeof shape, "N=%lld C=%lld, bias %d, the sum %s", (long long)N, (long long)C,
                             with_bias, places[place]);
                    const float *bias_arg = with_bias ? g_rbias : NULL;
                    /* the device's two operations in turn */
                    if (with_bias)
                        cr_assert_eq(k->bias_residual_forward(g_alone_sum, g_x, g_partial, g_rbias, N, C), TP_OK);
                    else cr_assert_eq(k->residual_forward(g_alone_sum, g_x, g_partial, n), TP_OK);
                    cr_assert_eq(norm_alone_on(k, v, g_alone_out, g_alone_mean, g_alone_rstd, g_alone_sum, g_w, g_b,
                                               N, C),
                                 TP_OK, "%s", tp_errmsg());
                    /* the fused one, its sum over a copy of partial or of x (g_sum), or apart */
                    const float *x_arg = place == 1 ? g_sum : g_x, *partial_arg = place == 0 ? g_sum : g_partial;
                    if (place < 2)
                        cr_assert_eq(k->copy(g_sum, place == 0 ? g_partial : g_x, (size_t)n * sizeof(float)),
                                     TP_OK, "%s", tp_errmsg());
                    cr_assert_eq(residual_norm_on(k, v, g_out, g_mean, g_rstd, g_sum, x_arg, partial_arg, bias_arg,
                                                  g_w, g_b, N, C),
                                 TP_OK, "%s %s: %s", names[v], shape, tp_errmsg());
                    check_same_floats(k, g_sum, g_alone_sum, n, names[v], shape);
                    check_same_floats(k, g_rstd, g_alone_rstd, N, "rstd", shape);
                    if (!(v & 1)) check_same_floats(k, g_mean, g_alone_mean, N, "mean", shape);
                    /* out: n floats, or n bf16 values in the first half of its floats */
                    int64_t out_floats = v & 2 ? (n + 1) / 2 : n;
                    check_same_floats(k, g_out, g_alone_out, out_floats, names[v], shape);
                    /* the CPU's */
                    if (with_bias) bias_residual_forward(cpu_sum, x, partial, rbias, N, C);
                    else residual_forward(cpu_sum, x, partial, n);
                    float *got_sum = download(k, g_sum, n);
                    cr_assert_eq(memcmp(got_sum, cpu_sum, (size_t)n * sizeof(float)), 0, "%s %s: the sum, CPU's",
                                 names[v], shape);
                    free(got_sum);
                    if (v & 2) {
                        int status = v & 1 ? rmsnorm_forward_bf16(cpu_bits, cpu_rstd, cpu_sum, w, N, C, 1e-6f)
                                           : layernorm_forward_bf16(cpu_bits, cpu_mean, cpu_rstd, cpu_sum, w, b, N, C);
                        cr_assert_eq(status, TP_OK, "%s", tp_errmsg());
                        uint16_t *got = download_bits(k, (const uint16_t *)g_out, n);
                        check_near_cpu(got, cpu_bits, n, 1e-5, names[v], shape);
                        free(got);
                    } else {
                        if (v & 1) rmsnorm_forward(cpu_out, cpu_rstd, cpu_sum, w, N, C, 1e-6f);
                        else layernorm_forward(cpu_out, cpu_mean, cpu_rstd, cpu_sum, w, b, N, C);
                        check_device(k, g_out, cpu_out, n, 1e-4, 1e-5, names[v]);
                    }
                    check_device(k, g_rstd, cpu_rstd, N, 1e-4, 1e-5, "rstd");
                    if (!(v & 1)) check_device(k, g_mean, cpu_mean, N, 1e-4, 1e-5, "mean");
                }
        k->release(g_x), k->release(g_partial), k->release(g_rbias), k->release(g_w), k->release(g_b);
        k->release(g_sum), k->release(g_alone_sum), k->release(g_out), k->release(g_alone_out);
        k->release(g_mean), k->release(g_rstd), k->release(g_alone_mean), k->release(g_alone_rstd);
        free(x), free(partial), free(rbias), free(w), free(b), free(garbage), free(cpu_sum), free(cpu_out);
        free(cpu_bits), free(cpu_mean), free(cpu_rstd);
    }
}

/* SwiGLU's steered values (row 0's first elements): bf16 ties, and a bf16
 * value, as exact products of two bf16 values a and b. A tie's significand
 * has 9 bits, the last one 1; it is reached where it factors into two of at
 * most 8 bits (just above 1, 257 is prime: 259 = 7 x 37 and 261 = 9 x 29
 * instead), and the product is exact in fp32 (16 significant bits at most,
 * or a multiple of its smallest subnormal). Values just past or short of a
 * tie need more bits than two bf16 values multiply to. Every a is at least
 * 17: exp(-a) < 2^-24, so 1 + exp(-a) rounds to 1 and SiLU(a) is a,
 * sigmoid(a) 1, exactly. */
static const struct {
    float a, b;
    uint32_t product; /* a b, fp32 bits */
} swiglu_steered[] = {
    {37.0f, 0x1.cp-6f, 0x3f818000u},  /* 259 2^-8: a tie, up to even */
    {29.0f, 0x1.2p-5f, 0x3f828000u},  /* 261 2^-8: a tie, down to even */
    {37.0f, -0x1.cp-6f, 0xbf818000u}, /* and negative */
    {29.0f, -0x1.2p-5f, 0xbf828000u},
    {32.0f, 0x1p-5f, 0x3f800000u},    /* 1: a bf16 value */
    {31.0f, 0x1.ap94f, 0x71498000u},  /* 403 2^91: a large tie, up */
    {31.0f, -0x1.ap94f, 0xf1498000u},
    {73.0f, 0x1.cp121f, 0x7f7f8000u}, /* 511 2^119: the largest float's tie, up to infinity */
    {17.5f, 0x1p-133f, 0x00118000u},  /* 17.5 2^-133: a subnormal tie, up to even 18 2^-133 */
    {18.5f, 0x1p-133f, 0x00128000u},  /* 18.5 2^-133: down to even 18 2^-133 */
    {18.5f, -0x1p-133f, 0x80128000u},
};
#define SWIGLU_STEERED (int64_t)(sizeof swiglu_steered / sizeof swiglu_steered[0])

/* in[N,2F] = [gate | up] as swiglu_forward_and_backward's (F = 29: N F odd),
 * rows wider than a block (F = 1000) and a tall shape, rounded to bf16 (the
 * MLP's input is a bf16 activation); row 0's first gates a and ups b
 * (swiglu_steered): out = a b. The CPU tolerance: swiglu's absolute 1e-6. */
Test(cuda_backend, swiglu_forward_bf16)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    const int64_t shapes[][2] = {{37, 29}, {5, 1000}, {3000, 29}};
    for (int s = 0; s < 3; s++) {
        int64_t N = shapes[s][0], F = shapes[s][1];
        char shape[64];
        snprintf(shape, sizeof shape, "N=%lld F=%lld", (long long)N, (long long)F);
        float *in = floats_random(N * 2 * F, 1.0f);
        for (int64_t r = 0; r < N; r++)
            for (int64_t f = 0; f < F; f++) in[r * 2 * F + f] *= 8.0f;
        const float far[] = {0.0f, -0.0f, 20.0f, -20.0f, 100.0f, -100.0f, 1e-20f, -1e-20f};
        memcpy(in + SWIGLU_STEERED, far, sizeof far); /* after the steered gates, in row 0's gates (F >= 19) */
        for (int64_t f = 0; f < SWIGLU_STEERED; f++) in[f] = swiglu_steered[f].a, in[F + f] = swiglu_steered[f].b;
        uint16_t *in_bits = floats_bf16_bits(in, N * 2 * F); /* the activation, on both sides */
        float *in_wide = floats_of_bf16_bits(in_bits, N * 2 * F), *garbage = floats_filled(N * F, 7.0f);
        uint16_t *out = malloc((size_t)(N * F) * sizeof(uint16_t)), *garbage_bits = bits_garbage(N * F);
        cr_assert(out);
        float *g_in_wide = upload_floats(k, in_wide, N * 2 * F), *g_fp32 = upload_floats(k, garbage, N * F);
        uint16_t *g_in = upload_bits(k, in_bits, N * 2 * F), *g_out = upload_bits(k, garbage_bits, N * F);
        cr_assert_eq(swiglu_forward_bf16(out, in_bits, N, F), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(k->swiglu_forward_bf16(g_out, g_in, N, F), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(k->swiglu_forward(g_fp32, g_in_wide, N, F), TP_OK, "%s", tp_errmsg());
        uint16_t *got = check_activation(k, g_out, g_fp32, out, N * F, 1e-6, 0, "swiglu_forward_bf16", shape);
        for (int64_t f = 0; f < SWIGLU_STEERED; f++)
            check_steered(got, f, swiglu_steered[f].product, "swiglu_forward_bf16", shape);
        k->release(g_in_wide), k->release(g_fp32), k->release(g_in), k->release(g_out);
        free(in), free(in_bits), free(in_wide), free(garbage), free(out), free(garbage_bits), free(got);
    }
}

/* ------------------------------------------------------------ bf16 gradients
 * swiglu_backward_bf16 reads in (the MLP's input, as the forward read it)
 * and d_out as bf16 bits and writes d_in as bf16 bits (GELU's bf16
 * backward: mlp_product_and_gelu_in_one, below):
 * on the GPU the very kernel of the fp32 backward, widening each in and
 * d_out value as it loads it and rounding each d_in value as it stores it,
 * so their bits must be those of rounding the GPU's own fp32 backward of in
 * and d_out widened, on every element (exactly), and close to the CPU
 * twin's (check_near_cpu, with the fp32 case's absolute tolerance). Values
 * steered where the operation lets them through exactly from bf16 inputs,
 * as the bf16 activations' tests do: ties to even both ways and both signs,
 * large ties, the largest float's tie, subnormal ties; at those elements
 * the bits are checked against the steered value's rounding as well. */

/* in[N,2F] = [gate | up] as swiglu_forward_bf16's (F = 29: N F odd; rows
 * wider than a block; a tall shape) and d_out random values, rounded on the
 * host. Row 0's first gates 128, whose SiLU is exactly 128 and sigmoid
 * exactly 1 (exp(-128) is 0 in fp32), with ups b and d_out a
 * (swiglu_steered): d gate = a b 1 (1 + 128 0) = a b (ties, the largest
 * float's tie to infinity, subnormal ties), and d up = a 128, exact. The
 * CPU tolerance: swiglu's absolute 1e-6. */
Test(cuda_backend, swiglu_backward_bf16)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    const int64_t shapes[][2] = {{37, 29}, {5, 1000}, {3000, 29}};
    for (int s = 0; s < 3; s++) {
        int64_t N = shapes[s][0], F = shapes[s][1];
        char shape[64];
        snprintf(shape, sizeof shape, "N=%lld F=%lld", (long long)N, (long long)F);
        float *in = floats_random(N * 2 * F, 1.0f), *dout = floats_random(N * F, 1.0f);
        for (int64_t r = 0; r < N; r++)
            for (int64_t f = 0; f < F; f++) in[r * 2 * F + f] *= 8.0f;
        const float far[] = {0.0f, -0.0f, 20.0f, -20.0f, 100.0f, -100.0f, 1e-20f, -1e-20f};
        memcpy(in + SWIGLU_STEERED, far, sizeof far); /* after the steered gates, in row 0's gates (F >= 19) */
        for (int64_t f = 0; f < SWIGLU_STEERED; f++)
            in[f] = 128.0f, in[F + f] = swiglu_steered[f].b, dout[f] = swiglu_steered[f].a;
        uint16_t *in_bits = floats_bf16_bits(in, N * 2 * F), *dout_bits = floats_bf16_bits(dout, N * F);
        float *in_wide = floats_of_bf16_bits(in_bits, N * 2 * F), *dout_wide = floats_of_bf16_bits(dout_bits, N * F);
        float *garbage = floats_filled(N * 2 * F, 7.0f);
        uint16_t *din = malloc((size_t)(N * 2 * F) * sizeof(uint16_t)), *garbage_bits = bits_garbage(N * 2 * F);
        cr_assert(din);
        float *g_in_wide = upload_floats(k, in_wide, N * 2 * F), *g_dout_wide = upload_floats(k, dout_wide, N * F);
        float *g_fp32 = upload_floats(k, garbage, N * 2 * F);
        uint16_t *g_in = upload_bits(k, in_bits, N * 2 * F), *g_dout = upload_bits(k, dout_bits, N * F);
        uint16_t *g_din = upload_bits(k, garbage_bits, N * 2 * F);
        cr_assert_eq(swiglu_backward_bf16(din, in_bits, dout_bits, N, F), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(k->swiglu_backward_bf16(g_din, g_in, g_dout, N, F), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(k->swiglu_backward(g_fp32, g_in_wide, g_dout_wide, N, F), TP_OK, "%s", tp_errmsg());
        uint16_t *got = check_activation(k, g_din, g_fp32, din, N * 2 * F, 1e-6, 0, "swiglu_backward_bf16", shape);
        for (int64_t f = 0; f < SWIGLU_STEERED; f++) {
            check_steered(got, f, swiglu_steered[f].product, "swiglu_backward_bf16 (d gate)", shape);
            check_steered(got, F + f, bits_of(swiglu_steered[f].a * 128.0f), "swiglu_backward_bf16 (d up)", shape);
        }
        k->release(g_in_wide), k->release(g_dout_wide), k->release(g_fp32), k->release(g_in), k->release(g_dout);
        k->release(g_din);
        free(in), free(dout), free(in_bits), free(dout_bits), free(in_wide), free(dout_wide), free(garbage);
        free(din), free(garbage_bits), free(got);
    }
}

/* ------------------------------------------ the bf16 copy of the weights
 * round_to_bf16 makes the trainer's bf16 copy of its fp32 weights, the W
 * every bf16 product reads: bit for bit the CPU's round_to_bf16 (kernels.h)
 * on every element, and for special values the bits convert_bits.h gives
 * (bits_f32_to_bf16): ties to even, down and up, both signs, subnormal and
 * the largest float's (to infinity); just past and short of a tie;
 * infinities; NaNs quieted with their payload's top bits kept, a signalling
 * NaN whose truncation would be infinity and one whose rounding carry would
 * reach the sign among them. n of 1, 3 and 1037 (odd: a vector's remainder)
 * with the special values at the start, in the middle and at the end, and
 * random values between; x and out aligned, or 4 and 2 bytes past (every
 * way of being, or not being, able to take four values at a time); nothing
 * written before or after out. n = 0 writes nothing. */

/* Which of count special values x[i] of n holds: the first count values,
 * count from the middle on, the last count (those of the start where they
 * overlap); -1 for the random ones between. */
static int64_t special_at(int64_t i, int64_t n, int64_t count)
{
    if (i < count) return i;
    if (i >= n / 2 && i - n / 2 < count) return i - n / 2;
    if (i >= n - count) return i - (n - count);
    return -1;
}

Test(cuda_backend, round_to_bf16)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    static const struct {
        uint32_t x;
        uint16_t bits;
    } special[] = {
        {0x3f808000u, 0x3f80u}, /* 1 + 2^-8: a tie, down to even */
        {0x3f818000u, 0x3f82u}, /* 1 + 3 2^-8: a tie, up to even */
        {0xbf808000u, 0xbf80u}, {0xbf818000u, 0xbf82u},
        {0x3f808001u, 0x3f81u}, /* just past a tie: up */
        {0x3f807fffu, 0x3f80u}, /* just short: down */
        {0x00008000u, 0x0000u}, /* a subnormal tie, down to +0 */
        {0x00018000u, 0x0002u}, /* and up */
        {0x80000000u, 0x8000u}, /* -0 */
        {0x7f7f7fffu, 0x7f7fu}, /* just short of the largest float's tie */
        {0x7f7f8000u, 0x7f80u}, /* the largest float's tie: to infinity */
        {0xff7fffffu, 0xff80u}, /* the largest float, negative: to -infinity */
        {0x7f800000u, 0x7f80u}, /* infinities */
        {0xff800000u, 0xff80u},
        {0x7fc00000u, 0x7fc0u}, /* a quiet NaN */
        {0x7f800001u, 0x7fc0u}, /* a signalling NaN: quieted, not truncated to infinity */
        {0xff812345u, 0xffc1u}, /* signalling, negative, with a payload: its top bits kept */
        {0x7fffffffu, 0x7fffu}, /* a NaN whose rounding carry would reach the sign */
    };
    enum { SPECIAL = sizeof special / sizeof special[0] };
    const int64_t sizes[] = {1, 3, 1037};
    for (int s = 0; s < 3; s++)
        for (int way = 0; way < 4; way++) {
            int64_t n = sizes[s], x_at = way / 2, out_at = way % 2; /* in values: x 4 bytes past, out 2 */
            char shape[96];
            snprintf(shape, sizeof shape, "n=%lld, x %s, out %s", (long long)n, x_at ? "4 bytes past" : "aligned",
                     out_at ? "2 bytes past" : "aligned");
            float *x = floats_random(n, 4.0f);
            for (int64_t i = 0; i < n; i++)
                if (special_at(i, n, SPECIAL) >= 0) x[i] = float_of(special[special_at(i, n, SPECIAL)].x);
            uint16_t *want = malloc((size_t)n * sizeof(uint16_t)), *garbage_bits = bits_garbage(n + 2);
            cr_assert(want);
            round_to_bf16(want, x, n);
            float *g_x_memory = NULL;
            cr_assert_eq(k->alloc((void **)&g_x_memory, (size_t)(n + 1) * sizeof(float)), TP_OK, "%s", tp_errmsg());
            cr_assert_eq(k->to_device(g_x_memory + x_at, x, (size_t)n * sizeof(float)), TP_OK, "%s", tp_errmsg());
            uint16_t *g_out_memory = upload_bits(k, garbage_bits, n + 2);
            cr_assert_eq(k->round_to_bf16(g_out_memory + out_at, g_x_memory + x_at, n), TP_OK, "round_to_bf16 %s: %s",
                         shape, tp_errmsg());
            uint16_t *around = download_bits(k, g_out_memory, n + 2), *got = around + out_at;
            for (int64_t i = 0, j; i < n; i++) /* the special values: the CPU's bits, then the GPU's */
                if ((j = special_at(i, n, SPECIAL)) >= 0) {
                    cr_assert_eq(want[i], special[j].bits, "the CPU's round_to_bf16: [%lld] bits %#06x, %#010x "
                                 "rounds to %#06x",
                                 (long long)i, want[i], special[j].x, special[j].bits);
                    cr_assert_eq(got[i], special[j].bits, "round_to_bf16 %s: [%lld] bits %#06x, %#010x rounds to %#06x",
                                 shape, (long long)i, got[i], special[j].x, special[j].bits);
                }
            for (int64_t i = 0; i < n; i++)
                cr_assert_eq(got[i], want[i], "round_to_bf16 %s: [%lld] bits %#06x, the CPU's %#06x (%#010x)", shape,
                             (long long)i, got[i], want[i], bits_of(x[i]));
            cr_assert(out_at == 0 || around[0] == 0x40e0u, "round_to_bf16 %s: wrote before out", shape);
            cr_assert(around[out_at + n] == 0x40e0u, "round_to_bf16 %s: wrote past out", shape);
            k->release(g_x_memory), k->release(g_out_memory);
            free(x), free(want), free(garbage_bits), free(around);
        }
    /* n = 0: nothing written */
    uint16_t *garbage_bits = bits_garbage(4), *g_out = upload_bits(k, garbage_bits, 4);
    float *g_x = upload_floats(k, (const float[]){1.0f, 2.0f, 3.0f, 4.0f}, 4);
    cr_assert_eq(k->round_to_bf16(g_out, g_x, 0), TP_OK, "round_to_bf16 n=0: %s", tp_errmsg());
    cr_assert_eq(k->round_to_bf16(g_out + 1, g_x + 1, 0), TP_OK, "round_to_bf16 n=0, 2 bytes past: %s", tp_errmsg());
    uint16_t *got = download_bits(k, g_out, 4);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(got[i], 0x40e0u, "round_to_bf16 n=0: [%d] bits %#06x, written", i, got[i]);
    k->release(g_out), k->release(g_x);
    free(garbage_bits), free(got);
}

/* ---------------------------------------------- bf16 products written as bits
 * matmul_forward_bf16_bits writes the bf16 product as a bf16 activation: its
 * bits must be those of rounding what the GPU's own matmul_forward_bf16
 * writes from the same operands and the bias rounded to bf16 (kernels.h;
 * to an aligned out), on every element
 * (cuBLAS rounding its fp32 sums into a bf16 C or D, or the fp32 out
 * rounded after), and close to the CPU twin's bits given the same in and W
 * bits (check_near_cpu, with matmul_forward_bf16's tolerance, 1e-5 of the
 * largest |out|). */

/* Shapes as matmul_forward_bf16's (odd dimensions: rows of bf16 out at
 * 2-byte offsets), with a bias and without, out from garbage; then an empty
 * inner dimension (C = 0: out is the bias rounded, or zeros), which no
 * product computes. */
Test(cuda_backend, matmul_forward_bf16_bits)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    for (int s = 0; s < 2; s++)
        for (int with_bias = 1; with_bias >= 0; with_bias--) {
            int64_t N = bf16_shapes[s][0], C = bf16_shapes[s][1], OC = bf16_shapes[s][2];
            char shape[96];
            snprintf(shape, sizeof shape, "N=%lld C=%lld OC=%lld, %s", (long long)N, (long long)C, (long long)OC,
                     with_bias ? "bias" : "no bias");
            float *in = floats_random(N * C, 1.0f), *w = floats_random(OC * C, 1.0f), *bias = floats_random(OC, 1.0f);
            float *want = malloc((size_t)(N * OC) * sizeof(float)), *garbage = floats_filled(N * OC, 7.0f);
            uint16_t *want_bits = malloc((size_t)(N * OC) * sizeof(uint16_t)), *garbage_bits = bits_garbage(N * OC);
            cr_assert(want && want_bits);
            uint16_t *in_bits = floats_bf16_bits(in, N * C), *g_in = upload_bits(k, in_bits, N * C);
            uint16_t *w_bits = floats_bf16_bits(w, OC * C), *g_w = upload_bits(k, w_bits, OC * C);
            uint16_t *g_out = upload_bits(k, garbage_bits, N * OC);
            float *rounded_bias = floats_rounded_to_bf16(bias, OC);
            float *g_bias = upload_floats(k, bias, OC), *g_fp32 = upload_floats(k, garbage, N * OC);
            float *g_rounded_bias = upload_floats(k, rounded_bias, OC);
            const float *b = with_bias ? bias : NULL, *g_b = with_bias ? g_bias : NULL;
            cr_assert_eq(matmul_forward_bf16(want, in_bits, w_bits, with_bias ? rounded_bias : NULL, N, C, OC), TP_OK,
                         "%s", tp_errmsg());
            cr_assert_eq(matmul_forward_bf16_bits(want_bits, in_bits, w_bits, b, N, C, OC), TP_OK, "%s",
                         tp_errmsg());
            cr_assert_eq(k->matmul_forward_bf16_bits(g_out, g_in, g_w, g_b, N, C, OC), TP_OK, "%s %s: %s",
                         "matmul_forward_bf16_bits", shape, tp_errmsg());
            cr_assert_eq(k->matmul_forward_bf16(g_fp32, g_in, g_w, with_bias ? g_rounded_bias : NULL, N, C, OC), TP_OK,
                         "%s", tp_errmsg());
            double scale = max_magnitude(want, N * OC); /* cuBLAS rounds its own sums: near_tie (check_rounding) */
            uint16_t *got = check_activation(k, g_out, g_fp32, want_bits, N * OC, 1e-5 * scale, 1e-4 * scale,
                                             "matmul_forward_bf16_bits", shape);
            k->release(g_in), k->release(g_out), k->release(g_w), k->release(g_bias), k->release(g_fp32);
            k->release(g_rounded_bias);
            free(in), free(w), free(bias), free(want), free(garbage), free(want_bits), free(garbage_bits);
            free(in_bits), free(w_bits), free(got), free(rounded_bias);
        }
    {
        int64_t N = 3, OC = 13; /* C = 0 */
        float *bias = floats_random(OC, 1.0f), *garbage = floats_filled(N * OC, 7.0f);
        bias[0] = -0.0f;                   /* 0 + -0 is +0 */
        bias[1] = float_of(0x3f808000u); /* a tie: rounds to even, 1 */
        uint16_t *garbage_bits = bits_garbage(N * OC), *g_out = upload_bits(k, garbage_bits, N * OC);
        float *g_bias = upload_floats(k, bias, OC), *g_fp32 = upload_floats(k, garbage, N * OC);
        uint16_t *g_in = upload_bits(k, garbage_bits, 1); /* in and W: never read */
        for (int with_bias = 1; with_bias >= 0; with_bias--) {
            const char *shape = with_bias ? "N=3 C=0 OC=13, bias" : "N=3 C=0 OC=13, no bias";
            const float *g_b = with_bias ? g_bias : NULL;
            cr_assert_eq(k->to_device(g_out, garbage_bits, (size_t)(N * OC) * sizeof(uint16_t)), TP_OK);
            cr_assert_eq(k->matmul_forward_bf16_bits(g_out, g_in, g_in, g_b, N, 0, OC), TP_OK, "%s: %s", shape,
                         tp_errmsg());
            cr_assert_eq(k->matmul_forward_bf16(g_fp32, g_in, g_in, g_b, N, 0, OC), TP_OK, "%s", tp_errmsg());
            uint16_t *got = download_bits(k, g_out, N * OC);
            float *fp32 = download(k, g_fp32, N * OC);
            check_rounding(got, fp32, N * OC, 0, "matmul_forward_bf16_bits", shape); /* C = 0: nothing summed */
            for (int64_t i = 0; i < N * OC; i++) {
                float value = with_bias ? 0.0f + bias[i % OC] : 0.0f;
                uint32_t x;
                memcpy(&x, &value, sizeof x);
                cr_assert_eq(got[i], bits_f32_to_bf16(x),
                             "matmul_forward_bf16_bits %s: [%lld] bits %#06x, want %#06x (%.9g rounded)", shape,
                             (long long)i, got[i], bits_f32_to_bf16(x), value);
            }
            free(got), free(fp32);
        }
        k->release(g_out), k->release(g_bias), k->release(g_fp32), k->release(g_in);
        free(bias), free(garbage), free(garbage_bits);
    }
}

/* The rounding is the CPU's, in each way the bits are written: sums of bf16
 * terms (in = 1, W a row of terms: products exact, every partial sum exact
 * in fp32) steered onto ties (to even, up and down, both signs, large
 * values, the largest float's tie, which rounds to infinity) and just past
 * and short of one; without a bias (a bf16 C), with a zero bias aligned
 * (cuBLASLt's epilogue with a bf16 D, where it has one) and 4 bytes past
 * alignment (the same: the product adds its aligned rounded copy; the fp32
 * route, rounded after, runs under TP_CUDA_EPILOGUE=off). W's bits are its terms' own
 * (bf16 values: rounding leaves them). First the fp32 product itself must
 * be the exact sum (else the device's fp32 sums are not exact, and the
 * failure says so); then the bits are those of its rounding, and the CPU's. */
Test(cuda_backend, matmul_forward_bf16_bits_rounds_as_the_cpu)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    /* target (fp32 bits) = a + b + c, each a bf16 value */
    static const struct {
        uint32_t target;
        float a, b, c;
    } sums[] = {
        {0x3f808000u, 1.0f, 0x1p-8f, 0.0f},           /* 1 + 2^-8: a tie, down to even 1 */
        {0x3f818000u, 1.0f, 0x3p-8f, 0.0f},           /* 1 + 3 2^-8: a tie, up to even 1 + 2^-6 */
        {0xbf808000u, -1.0f, -0x1p-8f, 0.0f},         /* and negative */
        {0xbf818000u, -1.0f, -0x3p-8f, 0.0f},
        {0x3f808001u, 1.0f, 0x1p-8f, 0x1p-23f},       /* just past a tie: up */
        {0x3f807fffu, 1.0f, 0x1p-8f, -0x1p-23f},      /* just short: down */
        {0x71498000u, 0x1.92p+99f, 0x1p+91f, 0.0f},   /* a large tie, up to even */
        {0xf1498000u, -0x1.92p+99f, -0x1p+91f, 0.0f},
        {0x7f7f8000u, 0x1.fep+127f, 0x1p+119f, 0.0f}, /* the largest float's tie: to infinity */
        {0x3f800000u, 0.5f, 0.25f, 0.25f},            /* exact: 1 */
    };
    enum { COUNT = sizeof sums / sizeof sums[0] };
    int64_t N = 5, C = 3, OC = COUNT;
    float w[COUNT * 3], zeros[COUNT + 1] = {0};
    uint16_t in[5 * 3], want_cpu[5 * COUNT];
    for (int64_t i = 0; i < N * C; i++) in[i] = 0x3f80u; /* 1 */
    for (int o = 0; o < COUNT; o++) {
        w[o * 3] = sums[o].a, w[o * 3 + 1] = sums[o].b, w[o * 3 + 2] = sums[o].c;
        float sum = sums[o].a + sums[o].b + sums[o].c; /* exact on the host too: no partial sum rounds */
        uint32_t x;
        memcpy(&x, &sum, sizeof x);
        cr_assert_eq(x, sums[o].target, "the test's sum %d: %#010x, want %#010x", o, x, sums[o].target);
        for (int t = 0; t < 3; t++) {
            uint32_t term;
            memcpy(&term, &w[o * 3 + t], sizeof term);
            cr_assert_eq(term & 0xffffu, 0u, "the test's term %d of sum %d is not a bf16 value", t, o);
        }
    }
    uint16_t *garbage_bits = bits_garbage(N * OC), *w_bits = floats_bf16_bits(w, OC * C);
    uint16_t *g_in = upload_bits(k, in, N * C), *g_out = upload_bits(k, garbage_bits, N * OC);
    uint16_t *g_w = upload_bits(k, w_bits, OC * C);
    float *g_zeros = upload_floats(k, zeros, OC + 1), *g_fp32 = NULL;
    cr_assert_eq(k->alloc((void **)&g_fp32, (size_t)(N * OC) * sizeof(float)), TP_OK);
    cr_assert_eq(k->matmul_forward_bf16(g_fp32, g_in, g_w, NULL, N, C, OC), TP_OK, "%s", tp_errmsg());
    float *fp32 = download(k, g_fp32, N * OC);
    for (int64_t i = 0; i < N * OC; i++) {
        uint32_t x;
        memcpy(&x, &fp32[i], sizeof x);
        cr_assert_eq(x, sums[i % OC].target,
                     "matmul_forward_bf16 N=5 C=3 OC=%d: [%lld] %#010x (%.9g), the exact sum %#010x: the device's "
                     "fp32 sum of exact terms is not exact",
                     COUNT, (long long)i, x, fp32[i], sums[i % OC].target);
    }
    const char *ways[] = {"no bias (a bf16 C)", "a zero bias (the epilogue, bf16 D)",
                          "a zero bias 4 bytes past alignment (its rounded copy aligned: the epilogue)"};
    const float *biases[] = {NULL, zeros, zeros + 1}, *g_biases[] = {NULL, g_zeros, g_zeros + 1};
    for (int way = 0; way < 3; way++) {
        char shape[128];
        snprintf(shape, sizeof shape, "N=5 C=3 OC=%d, %s", COUNT, ways[way]);
        cr_assert_eq(k->to_device(g_out, garbage_bits, (size_t)(N * OC) * sizeof(uint16_t)), TP_OK);
        cr_assert_eq(matmul_forward_bf16_bits(want_cpu, in, w_bits, biases[way], N, C, OC), TP_OK, "%s",
                     tp_errmsg());
        cr_assert_eq(k->matmul_forward_bf16_bits(g_out, g_in, g_w, g_biases[way], N, C, OC), TP_OK, "%s: %s", shape,
                     tp_errmsg());
        uint16_t *got = download_bits(k, g_out, N * OC);
        for (int64_t i = 0; i < N * OC; i++) {
            uint16_t want = bits_f32_to_bf16(sums[i % OC].target);
            cr_assert_eq(got[i], want,
                         "matmul_forward_bf16_bits %s: [%lld] bits %#06x, the sum %.9g (%#010x) rounds to %#06x", shape,
                         (long long)i, got[i], float_of(sums[i % OC].target), sums[i % OC].target, want);
            cr_assert_eq(want_cpu[i], want, "the CPU's matmul_forward_bf16_bits %s: [%lld] bits %#06x, want %#06x",
                         shape, (long long)i, want_cpu[i], want);
        }
        free(got);
    }
    k->release(g_in), k->release(g_out), k->release(g_w), k->release(g_zeros), k->release(g_fp32);
    free(garbage_bits), free(w_bits), free(fp32);
}

/* matmul_backward_bf16_bits: d_out bf16 bits (the residual stream's
 * gradient as the norms' backward rounds it); d_in written as bf16 bits.
 * Against the GPU's own matmul_backward_bf16 given the same d_out, in and W
 * bits, where they lie (an algorithm may depend on their alignment): d_in's bits those of rounding its fp32 d_in (check_rounding: one
 * ulp apart only near a tie, cuBLAS rounding its own sums into a bf16 C),
 * d_weight and d_bias the same floats (the same products, and the same
 * column sums, of the same bf16 values). And against the CPU twin given the
 * same bits (check_near_cpu and check_bf16, matmul_backward_bf16's
 * tolerance); d_bias the host's column sums of d_out's values
 * (matmul_backward's fp32 tolerance), not of the fp32 values they were
 * rounded from (check_rounded). Shapes as matmul_backward_bf16's, d_in,
 * d_out and W aligned, then each one value (2 bytes) past an allocation's
 * start (cuBLAS writes and reads them, and the column sums read d_out,
 * where they are; nothing written before or after d_in); d_in from garbage,
 * d_weight and d_bias accumulated from random values. Then each alone (the
 * others NULL and untouched): d_in; d_weight; d_bias, which no product
 * reads. Then an empty inner dimension (OC = 0): d_in zeros. */
Test(cuda_backend, matmul_backward_bf16_bits)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    for (int s = 0; s < 2; s++)
        for (int at = 0; at <= 1; at++) {
            int64_t N = bf16_shapes[s][0], C = bf16_shapes[s][1], OC = bf16_shapes[s][2];
            char shape[128];
            snprintf(shape, sizeof shape, "N=%lld C=%lld OC=%lld, d_in, d_out and W %s", (long long)N, (long long)C,
                     (long long)OC, at ? "one value past alignment" : "aligned");
            float *in = floats_random(N * C, 1.0f), *w = floats_random(OC * C, 1.0f);
            float *dout = floats_random(N * OC, 1.0f), *dw = floats_random(OC * C, 1.0f), *db = floats_random(OC, 1.0f);
            float *dw_cpu = malloc((size_t)(OC * C) * sizeof(float)), *db_cpu = malloc((size_t)OC * sizeof(float));
            float *db_sums = malloc((size_t)OC * sizeof(float)), *db_fp32 = malloc((size_t)OC * sizeof(float));
            uint16_t *din_cpu = malloc((size_t)(N * C) * sizeof(uint16_t));
            cr_assert(dw_cpu && db_cpu && db_sums && db_fp32 && din_cpu);
            memcpy(dw_cpu, dw, (size_t)(OC * C) * sizeof(float));
            memcpy(db_cpu, db, (size_t)OC * sizeof(float));
            memcpy(db_sums, db, (size_t)OC * sizeof(float));
            memcpy(db_fp32, db, (size_t)OC * sizeof(float));
            uint16_t *in_bits = floats_bf16_bits(in, N * C), *dout_bits = floats_bf16_bits(dout, N * OC);
            uint16_t *w_bits = floats_bf16_bits(w, OC * C);
            float *dout_wide = floats_of_bf16_bits(dout_bits, N * OC), *garbage = floats_filled(N * C, 7.0f);
            uint16_t *garbage_bits = bits_garbage(N * C + 2);
            uint16_t *g_in = upload_bits(k, in_bits, N * C);
            /* d_in at `at` values in, with garbage before and one value after; d_out and W at `at` values in */
            uint16_t *g_din_memory = upload_bits(k, garbage_bits, N * C + 2), *g_din = g_din_memory + at;
            uint16_t *g_dout_memory = NULL, *g_dout;
            cr_assert_eq(k->alloc((void **)&g_dout_memory, (size_t)(N * OC + 1) * sizeof(uint16_t)), TP_OK, "%s",
                         tp_errmsg());
            g_dout = g_dout_memory + at;
            cr_assert_eq(k->to_device(g_dout, dout_bits, (size_t)(N * OC) * sizeof(uint16_t)), TP_OK, "%s",
                         tp_errmsg());
            uint16_t *g_w_memory = NULL, *g_w;
            cr_assert_eq(k->alloc((void **)&g_w_memory, (size_t)(OC * C + 1) * sizeof(uint16_t)), TP_OK, "%s",
                         tp_errmsg());
            g_w = g_w_memory + at;
            cr_assert_eq(k->to_device(g_w, w_bits, (size_t)(OC * C) * sizeof(uint16_t)), TP_OK, "%s", tp_errmsg());
            float *g_dw = upload_floats(k, dw, OC * C);
            float *g_db = upload_floats(k, db, OC), *g_din32 = upload_floats(k, garbage, N * C);
            float *g_dw32 = upload_floats(k, dw, OC * C), *g_db32 = upload_floats(k, db, OC);

            cr_assert_eq(matmul_backward_bf16_bits(din_cpu, dw_cpu, db_cpu, dout_bits, in_bits, w_bits, N, C, OC),
                         TP_OK, "%s", tp_errmsg());
            cr_assert_eq(k->matmul_backward_bf16_bits(g_din, g_dw, g_db, g_dout, g_in, g_w, N, C, OC), TP_OK,
                         "matmul_backward_bf16_bits %s: %s", shape, tp_errmsg());
            cr_assert_eq(k->matmul_backward_bf16(g_din32, g_dw32, g_db32, g_dout, g_in, g_w, N, C, OC), TP_OK, "%s",
                         tp_errmsg());
            uint16_t *got = download_bits(k, g_din, N * C), *around = download_bits(k, g_din_memory, N * C + 2);
            float *fp32 = download(k, g_din32, N * C);
            double scale = max_magnitude(fp32, N * C);
            check_rounding(got, fp32, N * C, 1e-4 * scale, "matmul_backward_bf16_bits d_in", shape);
            check_near_cpu(got, din_cpu, N * C, 1e-5 * scale, "matmul_backward_bf16_bits d_in", shape);
            cr_assert(at == 0 || around[0] == 0x40e0u, "matmul_backward_bf16_bits %s: wrote before d_in", shape);
            cr_assert(around[at + N * C] == 0x40e0u, "matmul_backward_bf16_bits %s: wrote past d_in", shape);
            check_same_floats(k, g_dw, g_dw32, OC * C, "matmul_backward_bf16_bits d_weight", shape);
            check_same_floats(k, g_db, g_db32, OC, "matmul_backward_bf16_bits d_bias", shape);
            check_bf16(k, g_dw, dw_cpu, OC * C, "matmul_backward_bf16_bits d_weight");
            check_bf16(k, g_db, db_cpu, OC, "matmul_backward_bf16_bits d_bias");
            matmul_backward(NULL, NULL, db_sums, dout_wide, NULL, NULL, N, C, OC);
            matmul_backward(NULL, NULL, db_fp32, dout, NULL, NULL, N, C, OC);
            check_device(k, g_db, db_sums, OC, 1e-4, 1e-4, "matmul_backward_bf16_bits d_bias (d_out's values)");
            check_rounded(k, g_db, db_fp32, OC, "matmul_backward_bf16_bits d_bias (not the fp32 d_out's)");

            /* d_in alone, from garbage again: the same bits; d_weight and d_bias untouched */
            cr_assert_eq(k->to_device(g_din_memory, garbage_bits, (size_t)(N * C + 2) * sizeof(uint16_t)), TP_OK);
            cr_assert_eq(k->matmul_backward_bf16_bits(g_din, NULL, NULL, g_dout, g_in, g_w, N, C, OC), TP_OK,
                         "matmul_backward_bf16_bits %s, d_in alone: %s", shape, tp_errmsg());
            uint16_t *alone = download_bits(k, g_din, N * C);
            cr_assert(memcmp(alone, got, (size_t)(N * C) * sizeof(uint16_t)) == 0,
                      "matmul_backward_bf16_bits %s: d_in alone differs from d_in with the others", shape);
            /* d_weight alone, then d_bias alone, beside matmul_backward_bf16's; d_in untouched */
            cr_assert_eq(k->matmul_backward_bf16_bits(NULL, g_dw, NULL, g_dout, g_in, g_w, N, C, OC), TP_OK,
                         "matmul_backward_bf16_bits %s, d_weight alone: %s", shape, tp_errmsg());
            cr_assert_eq(k->matmul_backward_bf16(NULL, g_dw32, NULL, g_dout, g_in, g_w, N, C, OC), TP_OK, "%s",
                         tp_errmsg());
            check_same_floats(k, g_dw, g_dw32, OC * C, "matmul_backward_bf16_bits d_weight alone", shape);
            check_same_floats(k, g_db, g_db32, OC, "matmul_backward_bf16_bits d_bias, untouched", shape);
            cr_assert_eq(k->matmul_backward_bf16_bits(NULL, NULL, g_db, g_dout, g_in, g_w, N, C, OC), TP_OK,
                         "matmul_backward_bf16_bits %s, d_bias alone: %s", shape, tp_errmsg());
            cr_assert_eq(k->matmul_backward_bf16(NULL, NULL, g_db32, g_dout, g_in, g_w, N, C, OC), TP_OK, "%s",
                         tp_errmsg());
            check_same_floats(k, g_db, g_db32, OC, "matmul_backward_bf16_bits d_bias alone", shape);
            check_same_floats(k, g_dw, g_dw32, OC * C, "matmul_backward_bf16_bits d_weight, untouched", shape);
            uint16_t *after = download_bits(k, g_din, N * C);
            cr_assert(memcmp(after, got, (size_t)(N * C) * sizeof(uint16_t)) == 0,
                      "matmul_backward_bf16_bits %s: d_in changed by calls without it", shape);

            k->release(g_in), k->release(g_din_memory), k->release(g_dout_memory);
            k->release(g_w_memory), k->release(g_dw), k->release(g_db), k->release(g_din32), k->release(g_dw32);
            k->release(g_db32);
            free(in), free(w), free(dout), free(dw), free(db), free(dw_cpu), free(db_cpu), free(db_sums);
            free(db_fp32), free(din_cpu), free(in_bits), free(w_bits), free(dout_bits), free(dout_wide), free(garbage);
            free(garbage_bits), free(got), free(around), free(fp32), free(alone), free(after);
        }
    {
        int64_t N = 3, C = 13; /* OC = 0: d_in is an empty sum, +0 */
        uint16_t *garbage_bits = bits_garbage(N * C), *g_din = upload_bits(k, garbage_bits, N * C);
        uint16_t *g_in = upload_bits(k, garbage_bits, N * C); /* d_out, in and W: never read */
        cr_assert_eq(k->matmul_backward_bf16_bits(g_din, NULL, NULL, g_in, g_in, g_in, N, C, 0), TP_OK, "%s",
                     tp_errmsg());
        uint16_t *got = download_bits(k, g_din, N * C);
        for (int64_t i = 0; i < N * C; i++)
            cr_assert_eq(got[i], 0u, "matmul_backward_bf16_bits N=3 C=13 OC=0: d_in[%lld] bits %#06x, want +0",
                         (long long)i, got[i]);
        k->release(g_din), k->release(g_in);
        free(garbage_bits), free(got);
    }
}

/* ------------------------------------------------ the MLP's products with GELU
 * matmul_forward_gelu_bf16 and matmul_backward_gelu_bf16 (kernels.h): on the
 * GPU GELU, or its gradient, in cuBLASLt's epilogue of the product
 * (products_lt.cu: GELU_AUX_BIAS or GELU_AUX, DGELU) where it takes the
 * shape, else the product's fp32 sums and a separate kernel (linear.cu). */

/* n bf16 values `at` values past the start of a new device allocation
 * (garbage before them): a bf16 activation carved at any bf16 offset. The
 * allocation is *memory (release it); returns the values' address. */
static uint16_t *upload_bits_at(const kernel_backend *k, const uint16_t *host, int64_t n, int64_t at, uint16_t **memory)
{
    uint16_t *shifted = bits_garbage(n + at);
    memcpy(shifted + at, host, (size_t)n * sizeof(uint16_t));
    *memory = upload_bits(k, shifted, n + at);
    free(shifted);
    return *memory + at;
}

/* Nothing written before or after an output of n bf16 values `at` values
 * into memory, an array of n + 2 that held garbage (0x40e0). */
static void check_untouched_around(const kernel_backend *k, const uint16_t *memory, int64_t n, int at, const char *op,
                                   const char *shape)
{
    uint16_t *around = download_bits(k, memory, n + 2);
    cr_assert(at == 0 || around[0] == 0x40e0u, "%s %s: wrote before its output", op, shape);
    cr_assert(around[at + n] == 0x40e0u, "%s %s: wrote past its output", op, shape);
    free(around);
}

/* The epilogue's count grew by `fused` for one call: as `expected` (1 the
 * epilogue must run, 0 it must not; -1 either, the way it went in the log),
 * 0 with TP_CUDA_EPILOGUE=off and in the rehearsal (the encoded backend has
 * no cuBLASLt), cuBLASLt's reason in the message. */
static void check_fused(int64_t fused, int expected, const char *op, const char *shape)
{
    const char *choice = getenv("TP_CUDA_EPILOGUE");
    if ((choice && !strcmp(choice, "off")) || REHEARSAL) expected = 0;
    if (expected < 0) {
        cr_log_info("%s %s: %s (%s)", op, shape, fused ? "through cuBLASLt's epilogue" : "the separate way",
                    fused ? "-" : cuda_lt_last_refusal());
        return;
    }
    cr_assert_eq(fused, expected, "%s %s: %lld products with GELU in cuBLASLt's epilogue, want %d (%s)", op, shape,
                 (long long)fused, expected, cuda_lt_last_refusal());
}

/* GELU's slack where cuBLASLt's epilogue computed it: its tanh may be the
 * hardware's approximation (MUFU.TANH, relative error up to 2^-11), which
 * moves GELU(x) = x (1 + tanh u) / 2 by up to |x| 2^-12, and GELU'(x) = (1 +
 * tanh u) / 2 + x u' (1 - tanh^2 u) / 2 by up to (1/2 + |x u'(x)|) 2^-11
 * (u = sqrt(2/pi) (x + 0.044715 x^3), u' its slope), each times what it
 * multiplies; plus 1e-4 of the largest value for the sums' order. Forward:
 * the largest of |x| 2^-12 over pre's values (x_max); backward: the largest
 * of (1/2 + |x u'(x)|) 2^-11 over them, times the largest |d_in|. */
static double gelu_epilogue_slack(const float *pre, int64_t n, double scale, int backward)
{
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = fabs((double)pre[i]), slope = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
        double moved = backward ? (0.5 + x * slope) * 0x1p-11 : x * 0x1p-12;
        worst = moved > worst ? moved : worst;
    }
    return (backward ? worst * scale : worst) + 1e-4 * scale;
}

/* Shapes {N, C, OC}: leading dimensions multiples of 8 with every array
 * aligned (GELU's epilogues must run, their counts grow: GELU_AUX_BIAS with
 * the product's bf16 copy of the bias, GELU_AUX without one, and DGELU); the same with GELU's input and output 2 bytes
 * past alignment (pre, out, d_pre: the separate way, cuBLASLt's aux matrix
 * below 16-byte alignment); out and d_pre alone 2 bytes past (the
 * forward the separate way, products_lt.cu refusing GELU's output below
 * 16-byte alignment; the backward's way recorded: the heuristic's answer
 * for D's alignment); leading
 * dimensions not multiples of 8 (OC = 100 forward, C = 97 backward: the
 * separate way); each with a bias (and d_bias) and without. W is scaled to
 * put GELU's inputs around [-3, 3], where its curve bends.
 *
 * Forward, against the GPU's own matmul_forward_bf16 of the same in and W
 * and the bias rounded to bf16 (kernels.h; fp32 sums) and its gelu_forward
 * of them: pre's and out's bits are
 * those of rounding them (check_rounding: the separate way exactly; where
 * the epilogue ran within near_tie, as for cuBLAS's own bf16 D, its sums in
 * another order and its GELU its own), pre's within one ulp of the GPU's
 * matmul_forward_bf16_bits (its sums perhaps in another order too); both
 * near the CPU twin's bits (check_near_cpu: 1e-5 of the largest |pre| for
 * pre; 1.5e-5 for out, GELU's slope, at most 1.13, times the sums'
 * difference; where the epilogue ran, gelu_epilogue_slack: cuBLASLt's GELU
 * may take its tanh from the hardware's approximation).
 *
 * Backward: in[N,C] GELU's output and pre[N,C] its input (bf16 bits,
 * random: only their values matter here), d_out bf16 bits; d_pre from
 * garbage against the GPU's gelu_backward of pre's values and of its
 * matmul_backward_bf16 d_in from the same d_out: exactly its rounding the
 * separate way, within
 * gelu_epilogue_slack in the epilogue; near the CPU twin's bits (1.5e-5 of
 * the largest |d_in|, or gelu_epilogue_slack where the epilogue ran). d_weight and d_bias,
 * accumulated from random values, are the floats the GPU's
 * matmul_backward_bf16_bits adds from the same start (the same products and
 * column sums of the same d_out). Then d_pre NULL: d_weight and
 * d_bias accumulate alone, as there, d_pre untouched. Last an empty inner
 * dimension (OC = 0): d_pre is gelu'(pre) times an empty sum, zeros
 * (check_near_cpu with 0: either sign). */
Test(cuda_backend, mlp_product_and_gelu_in_one)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    const struct {
        int64_t N, C, OC;
        int at_aux, at_out, epilogue; /* epilogue: 1 must run, 0 must not, -1 either (its count recorded) */
        const char *what;
    } cases[] = {
        {64, 96, 128, 0, 0, 1, "aligned"},
        {64, 96, 128, 1, 1, 0, "pre, out and d_pre 2 bytes past alignment"},
        {64, 96, 128, 0, 1, -1, "out and d_pre 2 bytes past alignment, pre aligned"},
        {37, 97, 100, 0, 0, 0, "leading dimensions not multiples of 8"},
    };
    for (int c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++)
        for (int with_bias = 1; with_bias >= 0; with_bias--) {
            int64_t N = cases[c].N, C = cases[c].C, OC = cases[c].OC;
            int at_aux = cases[c].at_aux, at_out = cases[c].at_out;
            /* GELU_AUX_BIAS (a bf16 bias: the product's rounded copy of it), GELU_AUX and DGELU must run where
             * the arrays allow; the forward's D below 16-byte alignment is refused (products_lt.cu: its
             * algorithm there is less exact) */
            int forward_epilogue = at_out ? 0 : cases[c].epilogue;
            char shape[160];
            snprintf(shape, sizeof shape, "N=%lld C=%lld OC=%lld, %s, %s", (long long)N, (long long)C, (long long)OC,
                     cases[c].what, with_bias ? "bias" : "no bias");
            float *in = floats_random(N * C, 1.0f), *w = floats_random(OC * C, 3.0f / sqrtf((float)C));
            float *bias = floats_random(OC, 0.5f), *garbage = floats_filled(N * (C > OC ? C : OC), 7.0f);
            float *rounded_bias = floats_rounded_to_bf16(bias, OC); /* what the product adds (kernels.h) */
            uint16_t *garbage_bits = bits_garbage(N * (C > OC ? C : OC) + 2);
            float *want = malloc((size_t)(N * OC) * sizeof(float));
            uint16_t *out_cpu = malloc((size_t)(N * OC) * sizeof(uint16_t));
            uint16_t *pre_cpu = malloc((size_t)(N * OC) * sizeof(uint16_t));
            cr_assert(want && out_cpu && pre_cpu);
            uint16_t *in_bits = floats_bf16_bits(in, N * C), *w_bits = floats_bf16_bits(w, OC * C);
            uint16_t *g_in = upload_bits(k, in_bits, N * C), *g_w = upload_bits(k, w_bits, OC * C);
            float *g_bias = upload_floats(k, bias, OC), *g_rounded_bias = upload_floats(k, rounded_bias, OC);
            const float *b = with_bias ? bias : NULL, *g_b = with_bias ? g_bias : NULL;
            const float *rb = with_bias ? rounded_bias : NULL, *g_rb = with_bias ? g_rounded_bias : NULL;

            /* forward */
            uint16_t *g_out_memory = upload_bits(k, garbage_bits, N * OC + 2), *g_out = g_out_memory + at_out;
            uint16_t *g_pre_memory = upload_bits(k, garbage_bits, N * OC + 2), *g_pre = g_pre_memory + at_aux;
            uint16_t *g_bits = upload_bits(k, garbage_bits, N * OC);
            float *g_fp32 = upload_floats(k, garbage, N * OC), *g_gelu32 = upload_floats(k, garbage, N * OC);
            cr_assert_eq(matmul_forward_gelu_bf16(out_cpu, pre_cpu, in_bits, w_bits, b, N, C, OC), TP_OK, "%s",
                         tp_errmsg());
            cr_assert_eq(matmul_forward_bf16(want, in_bits, w_bits, rb, N, C, OC), TP_OK, "%s", tp_errmsg());
            int64_t before = cuda_lt_gelu_epilogue_products();
            cr_assert_eq(k->matmul_forward_gelu_bf16(g_out, g_pre, g_in, g_w, g_b, N, C, OC), TP_OK,
                         "matmul_forward_gelu_bf16 %s: %s", shape, tp_errmsg());
            int64_t fused = cuda_lt_gelu_epilogue_products() - before;
            check_fused(fused, forward_epilogue, "matmul_forward_gelu_bf16", shape);
            cr_assert_eq(k->matmul_forward_bf16(g_fp32, g_in, g_w, g_rb, N, C, OC), TP_OK, "%s", tp_errmsg());
            cr_assert_eq(k->gelu_forward(g_gelu32, g_fp32, N * OC), TP_OK, "%s", tp_errmsg());
            cr_assert_eq(k->matmul_forward_bf16_bits(g_bits, g_in, g_w, g_b, N, C, OC), TP_OK, "%s", tp_errmsg());
            double scale = max_magnitude(want, N * OC), near_tie = fused ? 1e-4 * scale : 0;
            double gelu_slack = fused ? gelu_epilogue_slack(want, N * OC, scale, 0) : 0;
            uint16_t *got_pre = check_activation(k, g_pre, g_fp32, pre_cpu, N * OC, 1e-5 * scale, near_tie,
                                                 "matmul_forward_gelu_bf16 pre", shape);
            uint16_t *got_out = check_activation(k, g_out, g_gelu32, out_cpu, N * OC,
                                                 fused ? gelu_slack : 1.5e-5 * scale, gelu_slack,
                                                 "matmul_forward_gelu_bf16 out", shape);
            uint16_t *bits = download_bits(k, g_bits, N * OC);
            check_near_cpu(got_pre, bits, N * OC, 1e-5 * scale, "matmul_forward_gelu_bf16 pre (against the GPU's "
                           "matmul_forward_bf16_bits)", shape);
            check_untouched_around(k, g_pre_memory, N * OC, at_aux, "matmul_forward_gelu_bf16 pre", shape);
            check_untouched_around(k, g_out_memory, N * OC, at_out, "matmul_forward_gelu_bf16 out", shape);

            /* backward: GELU's input and output [N, C] */
            float *act = floats_random(N * C, 1.0f), *pre = floats_random(N * C, 3.0f);
            float *dout = floats_random(N * OC, 1.0f), *dw = floats_random(OC * C, 1.0f), *db = floats_random(OC, 1.0f);
            float *dw_cpu = malloc((size_t)(OC * C) * sizeof(float)), *db_cpu = malloc((size_t)OC * sizeof(float));
            float *din_cpu = malloc((size_t)(N * C) * sizeof(float));
            uint16_t *dpre_cpu = malloc((size_t)(N * C) * sizeof(uint16_t));
            cr_assert(dw_cpu && db_cpu && din_cpu && dpre_cpu);
            memcpy(dw_cpu, dw, (size_t)(OC * C) * sizeof(float));
            memcpy(db_cpu, db, (size_t)OC * sizeof(float));
            uint16_t *act_bits = floats_bf16_bits(act, N * C), *pre_bits = floats_bf16_bits(pre, N * C);
            uint16_t *dout_bits = floats_bf16_bits(dout, N * OC);
            float *pre_wide = floats_of_bf16_bits(pre_bits, N * C);
            uint16_t *g_act = upload_bits(k, act_bits, N * C), *g_dout_bits = upload_bits(k, dout_bits, N * OC);
            uint16_t *g_pre_in_memory, *g_pre_in = upload_bits_at(k, pre_bits, N * C, at_aux, &g_pre_in_memory);
            uint16_t *g_dpre_memory = upload_bits(k, garbage_bits, N * C + 2), *g_dpre = g_dpre_memory + at_out;
            uint16_t *g_din_bits = upload_bits(k, garbage_bits, N * C);
            float *g_pre_wide = upload_floats(k, pre_wide, N * C);
            float *g_din32 = upload_floats(k, garbage, N * C), *g_dgelu32 = upload_floats(k, garbage, N * C);
            float *g_dw = upload_floats(k, dw, OC * C), *g_db = upload_floats(k, db, OC);
            float *g_dw_bits = upload_floats(k, dw, OC * C), *g_db_bits = upload_floats(k, db, OC);
            float *db_c = with_bias ? db_cpu : NULL, *g_db_c = with_bias ? g_db : NULL;
            float *g_db_bits_c = with_bias ? g_db_bits : NULL;
            cr_assert_eq(
                matmul_backward_gelu_bf16(dpre_cpu, dw_cpu, db_c, dout_bits, act_bits, w_bits, pre_bits, N, C, OC), TP_OK,
                "%s", tp_errmsg());
            cr_assert_eq(matmul_backward_bf16(din_cpu, NULL, NULL, dout_bits, act_bits, w_bits, N, C, OC), TP_OK, "%s",
                         tp_errmsg());
            before = cuda_lt_dgelu_epilogue_products();
            cr_assert_eq(
                k->matmul_backward_gelu_bf16(g_dpre, g_dw, g_db_c, g_dout_bits, g_act, g_w, g_pre_in, N, C, OC), TP_OK,
                "matmul_backward_gelu_bf16 %s: %s", shape, tp_errmsg());
            fused = cuda_lt_dgelu_epilogue_products() - before;
            check_fused(fused, cases[c].epilogue, "matmul_backward_gelu_bf16", shape);
            cr_assert_eq(
                k->matmul_backward_bf16_bits(g_din_bits, g_dw_bits, g_db_bits_c, g_dout_bits, g_act, g_w, N, C, OC),
                TP_OK, "%s", tp_errmsg());
            cr_assert_eq(k->matmul_backward_bf16(g_din32, NULL, NULL, g_dout_bits, g_act, g_w, N, C, OC), TP_OK, "%s",
                         tp_errmsg());
            cr_assert_eq(k->gelu_backward(g_dgelu32, g_pre_wide, g_din32, N * C), TP_OK, "%s", tp_errmsg());
            double d_scale = max_magnitude(din_cpu, N * C);
            double d_near_tie = fused ? gelu_epilogue_slack(pre_wide, N * C, d_scale, 1) : 0;
            double d_abs = fused ? d_near_tie : 1.5e-5 * d_scale;
            uint16_t *got_dpre = check_activation(k, g_dpre, g_dgelu32, dpre_cpu, N * C, d_abs, d_near_tie,
                                                  "matmul_backward_gelu_bf16 d_pre", shape);
            check_untouched_around(k, g_dpre_memory, N * C, at_out, "matmul_backward_gelu_bf16 d_pre", shape);
            check_same_floats(k, g_dw, g_dw_bits, OC * C, "matmul_backward_gelu_bf16 d_weight", shape);
            check_bf16(k, g_dw, dw_cpu, OC * C, "matmul_backward_gelu_bf16 d_weight");
            if (with_bias) {
                check_same_floats(k, g_db, g_db_bits, OC, "matmul_backward_gelu_bf16 d_bias", shape);
                check_bf16(k, g_db, db_cpu, OC, "matmul_backward_gelu_bf16 d_bias");
            } else {
                check_device(k, g_db, db, OC, 0, 0, "matmul_backward_gelu_bf16 d_bias NULL: untouched");
            }
            /* d_pre NULL: d_weight and d_bias alone, again; d_pre untouched */
            cr_assert_eq(
                k->matmul_backward_gelu_bf16(NULL, g_dw, g_db_c, g_dout_bits, g_act, g_w, g_pre_in, N, C, OC), TP_OK,
                "matmul_backward_gelu_bf16 %s, d_pre NULL: %s", shape, tp_errmsg());
            cr_assert_eq(k->matmul_backward_bf16_bits(NULL, g_dw_bits, g_db_bits_c, g_dout_bits, g_act, g_w, N, C, OC),
                         TP_OK, "%s", tp_errmsg());
            check_same_floats(k, g_dw, g_dw_bits, OC * C, "matmul_backward_gelu_bf16 d_weight, d_pre NULL", shape);
            if (with_bias)
                check_same_floats(k, g_db, g_db_bits, OC, "matmul_backward_gelu_bf16 d_bias, d_pre NULL", shape);
            uint16_t *dpre_after = download_bits(k, g_dpre, N * C);
            cr_assert(memcmp(dpre_after, got_dpre, (size_t)(N * C) * sizeof(uint16_t)) == 0,
                      "matmul_backward_gelu_bf16 %s: d_pre changed by a call without it", shape);

            k->release(g_in), k->release(g_w), k->release(g_bias), k->release(g_rounded_bias), k->release(g_out_memory);
            k->release(g_pre_memory), k->release(g_fp32), k->release(g_gelu32), k->release(g_bits);
            k->release(g_act), k->release(g_dout_bits), k->release(g_pre_in_memory), k->release(g_dpre_memory);
            k->release(g_din_bits), k->release(g_pre_wide), k->release(g_din32);
            k->release(g_dgelu32), k->release(g_dw), k->release(g_db), k->release(g_dw_bits), k->release(g_db_bits);
            free(in), free(w), free(bias), free(garbage), free(garbage_bits), free(want), free(out_cpu), free(pre_cpu);
            free(in_bits), free(rounded_bias);
            free(w_bits), free(got_pre), free(got_out), free(bits), free(act), free(pre), free(dout), free(dw);
            free(db), free(dw_cpu), free(db_cpu), free(din_cpu), free(dpre_cpu), free(act_bits), free(pre_bits);
            free(dout_bits), free(pre_wide), free(got_dpre), free(dpre_after);
        }
    {
        int64_t N = 3, C = 13; /* OC = 0: d_pre = gelu'(pre) times an empty sum */
        float *pre = floats_random(N * C, 3.0f);
        uint16_t *pre_bits = floats_bf16_bits(pre, N * C), *garbage_bits = bits_garbage(N * C);
        uint16_t *dpre_cpu = malloc((size_t)(N * C) * sizeof(uint16_t));
        cr_assert(dpre_cpu);
        uint16_t *g_pre = upload_bits(k, pre_bits, N * C), *g_dpre = upload_bits(k, garbage_bits, N * C);
        /* d_out, W, in: never read */
        cr_assert_eq(matmul_backward_gelu_bf16(dpre_cpu, NULL, NULL, pre_bits, pre_bits, pre_bits, pre_bits, N, C, 0),
                     TP_OK, "%s", tp_errmsg());
        cr_assert_eq(k->matmul_backward_gelu_bf16(g_dpre, NULL, NULL, g_pre, g_pre, g_pre, g_pre, N, C, 0), TP_OK,
                     "matmul_backward_gelu_bf16 N=3 C=13 OC=0: %s", tp_errmsg());
        uint16_t *got = download_bits(k, g_dpre, N * C);
        check_near_cpu(got, dpre_cpu, N * C, 0, "matmul_backward_gelu_bf16 d_pre", "N=3 C=13 OC=0");
        for (int64_t i = 0; i < N * C; i++)
            cr_assert_eq(got[i] & 0x7fffu, 0u, "matmul_backward_gelu_bf16 N=3 C=13 OC=0: d_pre[%lld] bits %#06x, "
                         "want a zero", (long long)i, got[i]);
        k->release(g_pre), k->release(g_dpre);
        free(pre), free(pre_bits), free(garbage_bits), free(dpre_cpu), free(got);
    }
}

/* ------------------------------------------------------- rotary embeddings */

/* Shapes {B, T, Hq, Hkv, hd}: grouped heads, one KV head, Hq == Hkv, and
 * hd 64 with Llama 3's scaled frequencies (the table from the CPU, as the
 * trainer uploads it). Forward on qkv, backward on another array, both in
 * place; V bit for bit untouched. A product and a sum per value (the GPU
 * may fuse them): tolerance 1e-5 relative + 1e-6 absolute. */
static const int64_t rope_shapes[][5] = {{2, 33, 4, 2, 16}, {1, 97, 3, 1, 24}, {2, 5, 2, 2, 8}, {1, 130, 4, 4, 64}};

Test(cuda_backend, rope_forward_and_backward)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    for (size_t s = 0; s < sizeof rope_shapes / sizeof rope_shapes[0]; s++) {
        int64_t B = rope_shapes[s][0], T = rope_shapes[s][1], Hq = rope_shapes[s][2], Hkv = rope_shapes[s][3];
        int64_t hd = rope_shapes[s][4], stride = (Hq + 2 * Hkv) * hd, n = B * T * stride;
        rope_scaling llama3 = {32, 1, 4, 8192};
        float *freq = malloc((size_t)(hd / 2) * sizeof(float)), *cos_sin = malloc((size_t)(T * hd) * sizeof(float));
        rope_frequencies(freq, hd, hd == 64 ? 500000.0 : 10000.0, hd == 64 ? &llama3 : NULL);
        rope_table(cos_sin, freq, T, hd);
        float *qkv = floats_random(n, 1.0f), *grad = floats_random(n, 1.0f);
        float *g_qkv = upload_floats(k, qkv, n), *g_grad = upload_floats(k, grad, n);
        float *g_cos_sin = upload_floats(k, cos_sin, T * hd);
        float *v = malloc((size_t)n * sizeof(float));
        memcpy(v, qkv, (size_t)n * sizeof(float));
        rope_forward(qkv, cos_sin, B, T, Hq, Hkv, hd);
        rope_backward(grad, cos_sin, B, T, Hq, Hkv, hd);
        cr_assert_eq(k->rope_forward(g_qkv, g_cos_sin, B, T, Hq, Hkv, hd), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(k->rope_backward(g_grad, g_cos_sin, B, T, Hq, Hkv, hd), TP_OK, "%s", tp_errmsg());
        check_device(k, g_qkv, qkv, n, 1e-5, 1e-6, "rope_forward");
        check_device(k, g_grad, grad, n, 1e-5, 1e-6, "rope_backward");
        float *got = download(k, g_qkv, n);
        for (int64_t r = 0; r < B * T; r++)
            cr_assert_eq(memcmp(got + r * stride + (Hq + Hkv) * hd, v + r * stride + (Hq + Hkv) * hd,
                                (size_t)(Hkv * hd) * sizeof(float)),
                         0, "V of row %lld changed", (long long)r);
        k->release(g_qkv), k->release(g_grad), k->release(g_cos_sin);
        free(freq), free(cos_sin), free(qkv), free(grad), free(v), free(got);
    }
}

/* rope_forward_bf16: qkv left as it is, bit for bit; out's bits those of
 * rounding what the GPU's own rope_forward leaves in qkv, every element (V,
 * rounded as it is, included), and close to the CPU twin's (rope's
 * absolute 1e-6). Shapes as rope_forward_and_backward's (Hkv < Hq and
 * Hkv == Hq, T not a power of two) and an odd head size (9: each Q and K
 * head's last value turns with nothing, rounded as it is). At t = 0 the
 * angle is 0 (cos 1, sin 0): there the first Q head's values and V's are
 * steered (steered[], the bf16 activations' ties and their neighbours) and
 * come out rounded as themselves. */
static const int64_t rope_bf16_shapes[][5] = {{2, 33, 4, 2, 16}, {1, 97, 3, 1, 24}, {2, 5, 2, 2, 8},
                                              {1, 130, 4, 4, 64}, {2, 7, 2, 1, 9}};

Test(cuda_backend, rope_forward_bf16)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    for (size_t s = 0; s < sizeof rope_bf16_shapes / sizeof rope_bf16_shapes[0]; s++) {
        int64_t B = rope_bf16_shapes[s][0], T = rope_bf16_shapes[s][1], Hq = rope_bf16_shapes[s][2];
        int64_t Hkv = rope_bf16_shapes[s][3], hd = rope_bf16_shapes[s][4], stride = (Hq + 2 * Hkv) * hd;
        int64_t n = B * T * stride;
        char shape[96];
        snprintf(shape, sizeof shape, "B=%lld T=%lld Hq=%lld Hkv=%lld hd=%lld", (long long)B, (long long)T,
                 (long long)Hq, (long long)Hkv, (long long)hd);
        rope_scaling llama3 = {32, 1, 4, 8192};
        float *freq = malloc((size_t)(hd / 2 > 0 ? hd / 2 : 1) * sizeof(float));
        float *cos_sin = malloc((size_t)(T * (hd / 2) * 2 > 0 ? T * (hd / 2) * 2 : 1) * sizeof(float));
        cr_assert(freq && cos_sin);
        rope_frequencies(freq, hd, hd == 64 ? 500000.0 : 10000.0, hd == 64 ? &llama3 : NULL);
        rope_table(cos_sin, freq, T, hd);
        float *qkv = floats_random(n, 1.0f);
        int64_t steered_q = STEERED < hd ? STEERED : hd, steered_v = STEERED < Hkv * hd ? STEERED : Hkv * hd;
        for (int64_t i = 0; i < steered_q; i++) qkv[i] = float_of(steered[i]); /* row 0 (b 0, t 0), Q head 0 */
        for (int64_t i = 0; i < steered_v; i++) qkv[stride - Hkv * hd + i] = float_of(steered[i]); /* its V */
        uint16_t *want = malloc((size_t)n * sizeof(uint16_t)), *garbage_bits = bits_garbage(n);
        cr_assert(want);
        float *g_qkv = upload_floats(k, qkv, n), *g_turned = upload_floats(k, qkv, n);
        float *g_cos_sin = upload_floats(k, cos_sin, T * (hd / 2) * 2 > 0 ? T * (hd / 2) * 2 : 1);
        uint16_t *g_out = upload_bits(k, garbage_bits, n);
        cr_assert_eq(rope_forward_bf16(want, qkv, cos_sin, B, T, Hq, Hkv, hd), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(k->rope_forward_bf16(g_out, g_qkv, g_cos_sin, B, T, Hq, Hkv, hd), TP_OK,
                     "rope_forward_bf16 %s: %s", shape, tp_errmsg());
        cr_assert_eq(k->rope_forward(g_turned, g_cos_sin, B, T, Hq, Hkv, hd), TP_OK, "%s", tp_errmsg());
        float *left = download(k, g_qkv, n);
        for (int64_t i = 0; i < n; i++)
            cr_assert(memcmp(&left[i], &qkv[i], sizeof(float)) == 0,
                      "rope_forward_bf16 %s: qkv[%lld] changed, %.9g to %.9g", shape, (long long)i, qkv[i], left[i]);
        uint16_t *got = check_activation(k, g_out, g_turned, want, n, 1e-6, 0, "rope_forward_bf16", shape);
        for (int64_t i = 0; i < steered_q; i++) check_steered(got, i, steered[i], "rope_forward_bf16 (Q)", shape);
        for (int64_t i = 0; i < steered_v; i++)
            check_steered(got, stride - Hkv * hd + i, steered[i], "rope_forward_bf16 (V)", shape);
        k->release(g_qkv), k->release(g_turned), k->release(g_cos_sin), k->release(g_out);
        free(freq), free(cos_sin), free(qkv), free(want), free(garbage_bits), free(left), free(got);
    }
}

/* rope_backward_bf16, in place on bf16 bits (the attention's d_qkv): every
 * element's bits those of rounding what the GPU's own rope_backward leaves
 * in an fp32 copy of the bits widened (exactly), and close to the CPU
 * twin's (rope's absolute 1e-6); V's bits, and with an odd head size each Q
 * and K head's last value, exactly as they were, a signaling NaN among them
 * (0x7f81, 0xff81: not quieted, as widening and rounding would). Shapes as
 * rope_forward_bf16's. Ties: the table's position 1 holds, for every
 * frequency, cos 1 and sin 2^-8 (no angle's pair, but the kernels take any
 * table), so that the backward computes a + b 2^-8 and b - a 2^-8 from each
 * pair (a, b) = (x[j], x[j + hd/2]), exactly in fp32; the first Q head of
 * the first batch's position 1 takes pairs whose results are ties (to even,
 * down and up, both signs), just past and short of one, exact, and the
 * largest bf16's, which rounds up to infinity; their bits are checked
 * against those exact results' rounding too. */
static const uint16_t rope_tie_pairs[][2] = {
    {0x3f80u, 0x3f80u}, /* 1 + 2^-8: a tie, down to 1; 1 - 2^-8 exact */
    {0x3f80u, 0x4040u}, /* 1 + 3 2^-8: a tie, up to 1 + 2^-6; 3 - 2^-8 to 3 */
    {0xbf80u, 0xbf80u}, /* negative */
    {0x3f80u, 0x3f81u}, /* 1 + 2^-8 + 2^-15: just past, up; 1 + 2^-7 - 2^-8: a tie, down to 1 */
    {0xbf80u, 0xc040u}, /* negative */
    {0x3f80u, 0x3f7fu}, /* 1 + 2^-8 - 2^-16: just short, down; 1 - 2^-7 exact */
    {0x4000u, 0x3f80u}, /* 2 + 2^-8 to 2; 1 - 2^-7 exact */
    {0x7f7fu, 0x7f7fu}, /* the largest bf16 (1 + 2^-8): beyond the largest bf16's tie, to infinity */
};

Test(cuda_backend, rope_backward_bf16)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    const int64_t count = (int64_t)(sizeof rope_tie_pairs / sizeof rope_tie_pairs[0]);
    for (size_t s = 0; s < sizeof rope_bf16_shapes / sizeof rope_bf16_shapes[0]; s++) {
        int64_t B = rope_bf16_shapes[s][0], T = rope_bf16_shapes[s][1], Hq = rope_bf16_shapes[s][2];
        int64_t Hkv = rope_bf16_shapes[s][3], hd = rope_bf16_shapes[s][4], stride = (Hq + 2 * Hkv) * hd;
        int64_t n = B * T * stride, half = hd / 2, ties = count < half ? count : half;
        char shape[96];
        snprintf(shape, sizeof shape, "B=%lld T=%lld Hq=%lld Hkv=%lld hd=%lld", (long long)B, (long long)T,
                 (long long)Hq, (long long)Hkv, (long long)hd);
        rope_scaling llama3 = {32, 1, 4, 8192};
        int64_t table = T * half * 2 > 0 ? T * half * 2 : 1;
        float *freq = malloc((size_t)(half > 0 ? half : 1) * sizeof(float));
        float *cos_sin = malloc((size_t)table * sizeof(float));
        cr_assert(freq && cos_sin);
        rope_frequencies(freq, hd, hd == 64 ? 500000.0 : 10000.0, hd == 64 ? &llama3 : NULL);
        rope_table(cos_sin, freq, T, hd);
        for (int64_t j = 0; j < half; j++) cos_sin[(half + j) * 2] = 1.0f, cos_sin[(half + j) * 2 + 1] = 0x1p-8f;
        float *values = floats_random(n, 1.0f);
        uint16_t *bits = floats_bf16_bits(values, n); /* the gradient as it comes */
        for (int64_t i = 0; i < ties; i++)              /* position 1 (row 1), Q head 0 */
            bits[stride + i] = rope_tie_pairs[i][0], bits[stride + i + half] = rope_tie_pairs[i][1];
        bits[stride - Hkv * hd] = 0x7f81u; /* row 0's first V value: a signaling NaN */
        if (hd % 2) bits[hd - 1] = 0xff81u; /* row 0's first Q head's last value, which no pair turns */
        uint16_t *want = malloc((size_t)n * sizeof(uint16_t));
        cr_assert(want);
        memcpy(want, bits, (size_t)n * sizeof(uint16_t));
        float *wide = floats_of_bf16_bits(bits, n);
        float *g_wide = upload_floats(k, wide, n), *g_cos_sin = upload_floats(k, cos_sin, table);
        uint16_t *g_bits = upload_bits(k, bits, n);
        cr_assert_eq(rope_backward_bf16(want, cos_sin, B, T, Hq, Hkv, hd), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(k->rope_backward_bf16(g_bits, g_cos_sin, B, T, Hq, Hkv, hd), TP_OK, "rope_backward_bf16 %s: %s",
                     shape, tp_errmsg());
        cr_assert_eq(k->rope_backward(g_wide, g_cos_sin, B, T, Hq, Hkv, hd), TP_OK, "%s", tp_errmsg());
        uint16_t *got = check_activation(k, g_bits, g_wide, want, n, 1e-6, 0, "rope_backward_bf16", shape);
        for (int64_t i = 0; i < ties; i++) {
            float a = float_of(bits_bf16_to_f32(rope_tie_pairs[i][0]));
            float b = float_of(bits_bf16_to_f32(rope_tie_pairs[i][1]));
            float turned[2] = {a + b * 0x1p-8f, b - a * 0x1p-8f}; /* exact: 8 significant bits and 8 more */
            uint32_t x[2];
            memcpy(x, turned, sizeof x);
            check_steered(got, stride + i, x[0], "rope_backward_bf16 (tie)", shape);
            check_steered(got, stride + i + half, x[1], "rope_backward_bf16 (tie)", shape);
        }
        for (int64_t r = 0; r < B * T; r++) {
            for (int64_t c = (Hq + Hkv) * hd; c < stride; c++)
                cr_assert_eq(got[r * stride + c], bits[r * stride + c],
                             "rope_backward_bf16 %s: V's [%lld] bits %#06x, were %#06x", shape,
                             (long long)(r * stride + c), got[r * stride + c], bits[r * stride + c]);
            for (int64_t h = 0; hd % 2 && h < Hq + Hkv; h++) {
                int64_t i = r * stride + h * hd + hd - 1;
                cr_assert_eq(got[i], bits[i], "rope_backward_bf16 %s: [%lld], no pair's, bits %#06x, were %#06x",
                             shape, (long long)i, got[i], bits[i]);
            }
        }
        k->release(g_wide), k->release(g_cos_sin), k->release(g_bits);
        free(freq), free(cos_sin), free(values), free(bits), free(want), free(wide), free(got);
    }
}

/* ------------------------------------------------------------- elementwise */

/* One rounding each, the same on both sides: tolerance 1e-5 relative +
 * 1e-6 absolute (in practice equal). Outputs aliasing an input as the
 * trainer calls them; scale_inplace also on more elements than one pass of
 * the largest grid covers (65535 blocks of 256 threads). */
Test(cuda_backend, elementwise)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    int64_t N = 37, C = 72, n = N * C;
    float *a = floats_random(n, 1.0f), *b = floats_random(n, 1.0f), *bias = floats_random(C, 1.0f);
    float *want = malloc((size_t)n * sizeof(float)), *garbage = floats_filled(n, 7.0f);
    float *g_a = upload_floats(k, a, n), *g_b = upload_floats(k, b, n), *g_bias = upload_floats(k, bias, C);
    float *g_out = upload_floats(k, garbage, n);

    residual_forward(want, a, b, n);
    cr_assert_eq(k->residual_forward(g_out, g_a, g_b, n), TP_OK, "%s", tp_errmsg());
    check_device(k, g_out, want, n, 1e-5, 1e-6, "residual_forward");

    bias_residual_forward(want, a, b, bias, N, C);
    cr_assert_eq(k->bias_residual_forward(g_out, g_a, g_b, g_bias, N, C), TP_OK, "%s", tp_errmsg());
    check_device(k, g_out, want, n, 1e-5, 1e-6, "bias_residual_forward");
    cr_assert_eq(k->bias_residual_forward(g_b, g_a, g_b, g_bias, N, C), TP_OK, "%s", tp_errmsg()); /* out = partial */
    check_device(k, g_b, want, n, 1e-5, 1e-6, "bias_residual_forward in place");
    cr_assert_eq(k->to_device(g_b, b, (size_t)n * sizeof(float)), TP_OK, "%s", tp_errmsg());

    memcpy(want, a, (size_t)n * sizeof(float));
    add_inplace(want, b, n);
    cr_assert_eq(k->add_inplace(g_a, g_b, n), TP_OK, "%s", tp_errmsg());
    check_device(k, g_a, want, n, 1e-5, 1e-6, "add_inplace");

    scale_inplace(want, 0.37f, n);
    cr_assert_eq(k->scale_inplace(g_a, 0.37f, n), TP_OK, "%s", tp_errmsg());
    check_device(k, g_a, want, n, 1e-5, 1e-6, "scale_inplace");

    int64_t big = 65535LL * 256 + 4099;
    float *x = floats_random(big, 3.0f), *g_x = upload_floats(k, x, big);
    scale_inplace(x, -1.5f, big);
    cr_assert_eq(k->scale_inplace(g_x, -1.5f, big), TP_OK, "%s", tp_errmsg());
    check_device(k, g_x, x, big, 1e-5, 1e-6, "scale_inplace, beyond one grid");

    k->release(g_a), k->release(g_b), k->release(g_bias), k->release(g_out), k->release(g_x);
    free(a), free(b), free(bias), free(want), free(garbage), free(x);
}

/* --------------------------------------------------------------- attention */

/* B, T, Hq, Hkv, hd: grouped KV heads (2 query heads per KV head), one KV
 * head for all with T beyond the CPU's ATTENTION_ROWS, as many KV heads as
 * query heads, GPT-2's head size (64) over two CPU blocks, and over GPT-2's
 * sequence (1024: the error of sums over many keys, which tensor cores
 * round toward zero, attention_tf32x3.cu). */
static const int64_t attention_shapes[][5] = {{2, 33, 4, 2, 16},   {1, 97, 3, 1, 24},    {2, 5, 2, 2, 8},
                                              {1, 130, 2, 2, 64},  {2, 70, 4, 2, 32},    {1, 150, 4, 2, 128},
                                              {1, 40, 2, 1, 256},  {1, 1024, 2, 1, 64}};
#define ATTENTION_SHAPES (int)(sizeof attention_shapes / sizeof attention_shapes[0])

/* Each test runs every attention variant of the fp32 operations
 * (kernels/cuda/attention_tiled.h): the tiled kernels take the shapes of
 * head size 32, 64, 128 and 256, the rows kernels the others; under tf32x3
 * the tensor cores' kernels (attention_tf32x3.h) take 32, 64 and 128, the
 * tiled 256, the rows the others. The forward's ways: each variant, and the
 * tiled forward at each of its rows a thread (TP_CUDA_TILED_FORWARD_ROWS;
 * unset: 4). */
static const struct {
    const char *variant, *forward_rows, *name;
} attention_forward_ways[] = {
    {"rows", NULL, "rows"},          {"tiled", NULL, "tiled"},   {"tiled", "2", "tiled, 2 rows"},
    {"tiled", "3", "tiled, 3 rows"}, {"tf32x3", NULL, "tf32x3"}};
#define ATTENTION_FORWARD_WAYS (int)(sizeof attention_forward_ways / sizeof attention_forward_ways[0])

/* out and lse, the device's from garbage. Tolerance 1e-4 relative + 1e-5
 * absolute: the device sums scores over keys in another order (online
 * softmax) than the CPU's sgemm. */
Test(cuda_backend, attention_forward)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    for (int s = 0; s < ATTENTION_FORWARD_WAYS * ATTENTION_SHAPES; s++) {
        int way = s / ATTENTION_SHAPES;
        cr_assert_eq(cuda_attention_variant(attention_forward_ways[way].variant), TP_OK);
        cr_assert_eq(cuda_tiled_forward_rows_variant(attention_forward_ways[way].forward_rows), TP_OK);
        const int64_t *shape = attention_shapes[s % ATTENTION_SHAPES];
        int64_t B = shape[0], T = shape[1], Hq = shape[2], Hkv = shape[3], hd = shape[4];
        int64_t n_qkv = B * T * (Hq + 2 * Hkv) * hd, n_out = B * T * Hq * hd, n_lse = B * Hq * T;
        int64_t n_scratch = attention_scratch_floats(B, T, Hq);
        float *qkv = floats_random(n_qkv, 2.0f), *out = malloc((size_t)n_out * sizeof(float));
        float *lse = malloc((size_t)n_lse * sizeof(float)), *scratch = malloc((size_t)n_scratch * sizeof(float));
        float *garbage = floats_filled(n_scratch > n_out ? n_scratch : n_out, 7.0f);
        float *g_qkv = upload_floats(k, qkv, n_qkv), *g_out = upload_floats(k, garbage, n_out);
        float *g_lse = upload_floats(k, garbage, n_lse), *g_scratch = upload_floats(k, garbage, n_scratch);
        cr_assert_eq(attention_forward(out, lse, scratch, qkv, B, T, Hq, Hkv, hd), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(k->attention_forward(g_out, g_lse, g_scratch, g_qkv, B, T, Hq, Hkv, hd), TP_OK, "%s",
                     tp_errmsg());
        char what[48];
        snprintf(what, sizeof what, "lse (%s)", attention_forward_ways[way].name);
        check_device(k, g_lse, lse, n_lse, 1e-4, 1e-5, what);
        snprintf(what, sizeof what, "out (%s)", attention_forward_ways[way].name);
        check_device(k, g_out, out, n_out, 1e-4, 1e-5, what);
        k->release(g_qkv), k->release(g_out), k->release(g_lse), k->release(g_scratch);
        free(qkv), free(out), free(lse), free(scratch), free(garbage);
    }
    cr_assert_eq(cuda_tiled_forward_rows_variant(NULL), TP_OK);
}

/* The backward's ways: each variant, and the tiled backward at each of
 * its rows a thread (TP_CUDA_TILED_BACKWARD_ROWS; unset: 2). */
static const struct {
    const char *variant, *backward_rows, *name;
} attention_backward_ways[] = {{"rows", NULL, "rows"},
                               {"tiled", NULL, "tiled"},
                               {"tiled", "1", "tiled, 1 row"},
                               {"tf32x3", NULL, "tf32x3"}};
#define ATTENTION_BACKWARD_WAYS (int)(sizeof attention_backward_ways / sizeof attention_backward_ways[0])

/* d_qkv is overwritten (the device's starts from garbage, as does its
 * scratch). Both sides get the CPU's out and lse. Tolerance 1e-4 relative +
 * 1e-5 absolute. */
Test(cuda_backend, attention_backward)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    for (int s = 0; s < ATTENTION_BACKWARD_WAYS * ATTENTION_SHAPES; s++) {
        int way = s / ATTENTION_SHAPES;
        cr_assert_eq(cuda_attention_variant(attention_backward_ways[way].variant), TP_OK);
        cr_assert_eq(cuda_tiled_backward_rows_variant(attention_backward_ways[way].backward_rows), TP_OK);
        const int64_t *shape = attention_shapes[s % ATTENTION_SHAPES];
        int64_t B = shape[0], T = shape[1], Hq = shape[2], Hkv = shape[3], hd = shape[4];
        int64_t n_qkv = B * T * (Hq + 2 * Hkv) * hd, n_out = B * T * Hq * hd, n_lse = B * Hq * T;
        int64_t n_scratch = attention_scratch_floats(B, T, Hq);
        float *qkv = floats_random(n_qkv, 2.0f), *out = malloc((size_t)n_out * sizeof(float));
        float *lse = malloc((size_t)n_lse * sizeof(float)), *dout = floats_random(n_out, 1.0f);
        float *dqkv = malloc((size_t)n_qkv * sizeof(float)), *scratch = malloc((size_t)n_scratch * sizeof(float));
        float *garbage = floats_filled(n_scratch > n_qkv ? n_scratch : n_qkv, 7.0f);
        cr_assert_eq(attention_forward(out, lse, scratch, qkv, B, T, Hq, Hkv, hd), TP_OK, "%s", tp_errmsg());
        float *g_qkv = upload_floats(k, qkv, n_qkv), *g_out = upload_floats(k, out, n_out);
        float *g_lse = upload_floats(k, lse, n_lse), *g_dout = upload_floats(k, dout, n_out);
        float *g_dqkv = upload_floats(k, garbage, n_qkv), *g_scratch = upload_floats(k, garbage, n_scratch);
        cr_assert_eq(attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, Hq, Hkv, hd), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(k->attention_backward(g_dqkv, g_scratch, g_dout, g_qkv, g_out, g_lse, B, T, Hq, Hkv, hd), TP_OK,
                     "%s", tp_errmsg());
        char what[48];
        snprintf(what, sizeof what, "d_qkv (%s)", attention_backward_ways[way].name);
        check_device(k, g_dqkv, dqkv, n_qkv, 1e-4, 1e-5, what);
        k->release(g_qkv), k->release(g_out), k->release(g_lse), k->release(g_dout), k->release(g_dqkv);
        k->release(g_scratch);
        free(qkv), free(out), free(lse), free(dout), free(dqkv), free(scratch), free(garbage);
    }
    cr_assert_eq(cuda_tiled_backward_rows_variant(NULL), TP_OK);
}

Test(cuda_backend, attention_refuses_bad_heads)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    float *g = NULL;
    cr_assert_eq(k->alloc((void **)&g, 4096), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(k->attention_forward(g, g, g, g, 1, 2, 3, 2, 4), TP_ERR_ARG, "Hq not a multiple of Hkv");
    cr_assert_eq(k->attention_forward(g, g, g, g, 1, 2, 2, 0, 4), TP_ERR_ARG, "no KV head");
    if (!REHEARSAL) /* the CPU takes any head size */
        cr_assert_eq(k->attention_forward(g, g, g, g, 1, 2, 2, 2, 257), TP_ERR_ARG, "a head beyond 256 dimensions");
    k->release(g);
}

/* ---------------------------------------------------------- bf16 attention
 * attention_forward_bf16 and attention_backward_bf16 on the GPU against
 * their CPU twin (the fp32 attention of the bf16 operands), through cuDNN
 * (TP_CUDA_ATTENTION=cudnn: a cuDNN failure is the test's) and through the
 * tiled kernels on the same values as fp32 (tiled). qkv and d_out come as
 * bf16 bits (a bf16 activation and a bf16 gradient: random values rounded
 * on the host, convert_from_f32, the same bits on both sides); out and
 * d_qkv are written as bf16 bits on both sides. Shapes: GPT-2's head size 64 and Llama's
 * 128, grouped heads (Hq 4, Hkv 2 or 1) and one per query head, T not a
 * multiple of 64 (100, 77, 33) nor 128 (130), and one that is (256, which
 * any cuDNN 9 takes). Failures name the variant, the tensor (and the part
 * of d_qkv), the shape, the largest error and where, and the root mean
 * square error against that of the values. */

static const int64_t bf16_attention_shapes[][5] = {{2, 100, 4, 2, 64}, {1, 130, 4, 2, 128}, {3, 77, 2, 2, 64},
                                         {1, 256, 4, 2, 128}, {2, 33, 4, 1, 64}};
#define BF16_ATTENTION_SHAPES (int)(sizeof bf16_attention_shapes / sizeof bf16_attention_shapes[0])
static const char *const bf16_variants[] = {"cudnn", "tiled"};

/* Elements [first, first + width) of each of `rows` rows of `stride`:
 * |got - want| <= rel |want| + abs scale, scale the largest |want| of them
 * (abs_scaled) or 1. Reports the worst element. */
typedef struct {
    const char *variant, *what;
    const int64_t *shape;
    double rel, abs;
    int abs_scaled;
} bf16_check;

static void check_part(const bf16_check *c, const float *got, const float *want, int64_t rows, int64_t stride,
                       int64_t first, int64_t width)
{
    double scale = 0, sum_error = 0, sum_value = 0, worst = -1, worst_error = 0, worst_bound = 0;
    int64_t worst_at = 0, n = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = r * stride + first; i < r * stride + first + width; i++) scale = fmax(scale, fabs(want[i]));
    if (!c->abs_scaled) scale = 1;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = r * stride + first; i < r * stride + first + width; i++) {
            double error = fabs((double)got[i] - want[i]), bound = c->rel * fabs(want[i]) + c->abs * scale;
            if (isnan(got[i]) != isnan(want[i])) error = INFINITY;
            sum_error += error * error, sum_value += (double)want[i] * want[i], n++;
            if (error - bound > worst) worst = error - bound, worst_at = i, worst_error = error, worst_bound = bound;
        }
    const int64_t *x = c->shape;
    cr_assert(worst <= 0,
              "%s (TP_CUDA_ATTENTION=%s) B=%lld T=%lld Hq=%lld Hkv=%lld hd=%lld: largest error %.3g at [%lld] "
              "(GPU %.9g, CPU twin %.9g) beyond %.3g (%g relative + %g x %.3g); rms error %.3g of rms %.3g",
              c->what, c->variant, (long long)x[0], (long long)x[1], (long long)x[2], (long long)x[3],
              (long long)x[4], worst_error, (long long)worst_at, got[worst_at], want[worst_at], worst_bound, c->rel,
              c->abs, scale, sqrt(sum_error / (double)(n ? n : 1)), sqrt(sum_value / (double)(n ? n : 1)));
}

/* Runs one variant on one shape, forward then backward, against the CPU
 * twin, with out, qkv, d_out and d_qkv (all bf16 bits) out_at, qkv_at,
 * d_out_at and d_qkv_at values past an allocation's start (1: 2 bytes,
 * which cuDNN reaches through the scratch; 8: 16 bytes, which it reads or
 * writes where it is); nothing is written before or after d_qkv. The
 * backward gets the CPU twin's out and lse on both sides (each direction
 * compared alone), and d_out as bits (random values rounded on the host,
 * the same bits on both sides). Tolerances: the tiled kernels on the
 * widened bits do the CPU's arithmetic in another order, then both sides
 * round out and d_qkv to bf16: each within one bf16 ulp (2^-7 of the value
 * at most: the fp32 results, within fp32's 1e-4 of each other, may
 * straddle a rounding boundary) + 1e-5; lse 1e-4 relative + 1e-5 (fp32's,
 * as attention_forward's test). cuDNN rounds its outputs to bf16 (2^-8
 * relative, as the CPU twin rounds its out and d_qkv) and multiplies bf16
 * probabilities by V (each within 2^-8: at most 2^-8 max|v| in out): out
 * within 2^-7 relative + 2^-7 of the largest |v| (the sum of those); lse is
 * fp32 there too (1e-4 + 1e-4, its exp as exp2 of a scaled score); dQ, dK
 * and dV are bf16 and their products take bf16 P and dS: each part within
 * 2^-7 relative + 2^-5 of its largest value (the sums over T positions of
 * terms rounded at 2^-8).
 *
 * Exact where it can be: the kernels' bf16 forward writes the bits of
 * rounding the GPU's own fp32 forward of qkv widened, and their bf16
 * backward the bits of rounding the GPU's own fp32 backward of qkv, out and
 * d_out widened, every element (the same kernels, no atomics); cuDNN's
 * forward writes the same out wherever qkv and out lie. */
static void bf16_attention_case(const kernel_backend *k, const char *variant, const int64_t *shape, int64_t out_at,
                                int64_t qkv_at, int64_t d_out_at, int64_t d_qkv_at)
{
    int64_t B = shape[0], T = shape[1], Hq = shape[2], Hkv = shape[3], hd = shape[4];
    int64_t S = (Hq + 2 * Hkv) * hd, n_qkv = B * T * S, n_out = B * T * Hq * hd, n_lse = B * Hq * T;
    int64_t n_scratch = attention_scratch_floats(B, T, Hq);
    int cudnn = strcmp(variant, "cudnn") == 0;
    cr_assert_eq(cuda_attention_variant(variant), TP_OK);
    float *qkv_values = floats_random(n_qkv, 2.0f), *dout_values = floats_random(n_out, 1.0f);
    uint16_t *qkv = floats_bf16_bits(qkv_values, n_qkv); /* the activation, on both sides */
    uint16_t *dout = floats_bf16_bits(dout_values, n_out); /* the gradient, on both sides */
    uint16_t *out = malloc((size_t)n_out * sizeof(uint16_t)), *out_garbage = bits_garbage(n_out + out_at);
    uint16_t *dqkv = malloc((size_t)n_qkv * sizeof(uint16_t)), *dqkv_garbage = bits_garbage(n_qkv + d_qkv_at + 1);
    float *lse = malloc((size_t)n_lse * sizeof(float)), *scratch = malloc((size_t)n_scratch * sizeof(float));
    float *garbage = floats_filled(n_qkv > n_scratch ? n_qkv : n_scratch, 7.0f);
    cr_assert(out && lse && dqkv && scratch);
    uint16_t *g_qkv_memory, *g_qkv = upload_bits_at(k, qkv, n_qkv, qkv_at, &g_qkv_memory);
    uint16_t *g_dout_memory, *g_dout = upload_bits_at(k, dout, n_out, d_out_at, &g_dout_memory);
    float *g_lse = upload_floats(k, garbage, n_lse), *g_scratch = upload_floats(k, garbage, n_scratch);
    /* d_qkv from garbage, one value more after it: nothing may be written before or after */
    uint16_t *g_dqkv_memory = upload_bits(k, dqkv_garbage, n_qkv + d_qkv_at + 1), *g_dqkv = g_dqkv_memory + d_qkv_at;
    uint16_t *g_out_memory = upload_bits(k, out_garbage, n_out + out_at), *g_out = g_out_memory + out_at;
    cr_assert_eq(attention_forward_bf16(out, lse, scratch, qkv, B, T, Hq, Hkv, hd), TP_OK, "%s", tp_errmsg());
    int status = k->attention_forward_bf16(g_out, g_lse, g_scratch, g_qkv, B, T, Hq, Hkv, hd);
    if (cudnn && status && strstr(tp_errmsg(), "not built here")) {
        cr_log_warn("%s", tp_errmsg()); /* an older cuDNN and T not a multiple of 128: refused, as documented */
        goto done;
    }
    cr_assert_eq(status, TP_OK,
                 "attention_forward_bf16 (TP_CUDA_ATTENTION=%s, out %lld values in, qkv %lld values in): %s", variant,
                 (long long)out_at, (long long)qkv_at, tp_errmsg());
    {
        double v_max = 0; /* the largest |v|: out's absolute scale for cuDNN */
        float *qkv_wide = floats_of_bf16_bits(qkv, n_qkv);
        for (int64_t r = 0; r < B * T; r++)
            for (int64_t c = (Hq + Hkv) * hd; c < S; c++) v_max = fmax(v_max, fabs(qkv_wide[r * S + c]));
        uint16_t *got_bits = download_bits(k, g_out, n_out);
        float *got_out = floats_of_bf16_bits(got_bits, n_out), *want_out = floats_of_bf16_bits(out, n_out);
        float *got_lse = download(k, g_lse, n_lse);
        bf16_check o = {.variant = variant, .what = "out", .shape = shape, .rel = ldexp(1, -7),
                        .abs = cudnn ? ldexp(1, -7) * v_max : 1e-5};
        check_part(&o, got_out, want_out, B * T, Hq * hd, 0, Hq * hd);
        bf16_check l = {.variant = variant, .what = "lse", .shape = shape, .rel = 1e-4, .abs = cudnn ? 1e-4 : 1e-5};
        check_part(&l, got_lse, lse, 1, n_lse, 0, n_lse);
        if (cudnn && (out_at % 8 != 0 || qkv_at % 8 != 0)) {
            /* through the scratch: the same bits as cuDNN writes with qkv and out 256-byte aligned */
            uint16_t *g_aligned = upload_bits(k, out_garbage, n_out), *g_qkv_aligned = upload_bits(k, qkv, n_qkv);
            uint16_t *aligned;
            cr_assert_eq(k->attention_forward_bf16(g_aligned, g_lse, g_scratch, g_qkv_aligned, B, T, Hq, Hkv, hd),
                         TP_OK, "%s", tp_errmsg());
            aligned = download_bits(k, g_aligned, n_out);
            for (int64_t i = 0; i < n_out; i++)
                cr_assert_eq(got_bits[i], aligned[i],
                             "attention_forward_bf16 (cuDNN) B=%lld T=%lld Hq=%lld Hkv=%lld hd=%lld: out[%lld] %#06x "
                             "with out %lld and qkv %lld values in, %#06x with both aligned",
                             (long long)B, (long long)T, (long long)Hq, (long long)Hkv, (long long)hd, (long long)i,
                             got_bits[i], (long long)out_at, (long long)qkv_at, aligned[i]);
            k->release(g_aligned), k->release(g_qkv_aligned);
            free(aligned);
        }
        if (!cudnn) { /* the bits of rounding the GPU's own fp32 forward of qkv widened */
            float *g_wide = upload_floats(k, qkv_wide, n_qkv), *g_fp32 = upload_floats(k, garbage, n_out), *fp32;
            cr_assert_eq(k->attention_forward(g_fp32, g_lse, g_scratch, g_wide, B, T, Hq, Hkv, hd), TP_OK, "%s",
                         tp_errmsg());
            fp32 = download(k, g_fp32, n_out);
            for (int64_t i = 0; i < n_out; i++) {
                uint32_t x;
                memcpy(&x, &fp32[i], sizeof x);
                cr_assert_eq(got_bits[i], bits_f32_to_bf16(x),
                             "attention_forward_bf16 (TP_CUDA_ATTENTION=%s) B=%lld T=%lld Hq=%lld Hkv=%lld hd=%lld: "
                             "out[%lld] %#06x, the GPU's fp32 attention of qkv widened %.9g rounds to %#06x",
                             variant, (long long)B, (long long)T, (long long)Hq, (long long)Hkv, (long long)hd,
                             (long long)i, got_bits[i], fp32[i], bits_f32_to_bf16(x));
            }
            k->release(g_wide), k->release(g_fp32);
            free(fp32);
        }
        free(qkv_wide), free(got_bits), free(got_out), free(want_out), free(got_lse);
    }
    cr_assert_eq(k->to_device(g_out, out, (size_t)n_out * sizeof(uint16_t)), TP_OK);
    cr_assert_eq(k->to_device(g_lse, lse, (size_t)n_lse * sizeof(float)), TP_OK);
    cr_assert_eq(attention_backward_bf16(dqkv, scratch, dout, qkv, out, lse, B, T, Hq, Hkv, hd), TP_OK, "%s",
                 tp_errmsg());
    cr_assert_eq(k->attention_backward_bf16(g_dqkv, g_scratch, g_dout, g_qkv, g_out, g_lse, B, T, Hq, Hkv, hd), TP_OK,
                 "attention_backward_bf16 (TP_CUDA_ATTENTION=%s, out %lld, qkv %lld, d_out %lld, d_qkv %lld values "
                 "in): %s",
                 variant, (long long)out_at, (long long)qkv_at, (long long)d_out_at, (long long)d_qkv_at, tp_errmsg());
    {
        char what[256];
        snprintf(what, sizeof what,
                 "attention_backward_bf16 (TP_CUDA_ATTENTION=%s, out %lld, qkv %lld, d_out %lld, d_qkv %lld values in)",
                 variant, (long long)out_at, (long long)qkv_at, (long long)d_out_at, (long long)d_qkv_at);
        char dims[96];
        snprintf(dims, sizeof dims, "B=%lld T=%lld Hq=%lld Hkv=%lld hd=%lld", (long long)B, (long long)T,
                 (long long)Hq, (long long)Hkv, (long long)hd);
        uint16_t *got_bits = download_bits(k, g_dqkv, n_qkv);
        uint16_t *around = download_bits(k, g_dqkv_memory, n_qkv + d_qkv_at + 1);
        cr_assert(d_qkv_at == 0 || around[0] == 0x40e0u, "%s %s: wrote before d_qkv", what, dims);
        cr_assert(around[d_qkv_at + n_qkv] == 0x40e0u, "%s %s: wrote past d_qkv", what, dims);
        float *got = floats_of_bf16_bits(got_bits, n_qkv), *want = floats_of_bf16_bits(dqkv, n_qkv);
        const char *parts[3] = {"d_qkv (dQ)", "d_qkv (dK)", "d_qkv (dV)"};
        const int64_t first[3] = {0, Hq * hd, (Hq + Hkv) * hd}, width[3] = {Hq * hd, Hkv * hd, Hkv * hd};
        for (int p = 0; p < 3; p++) {
            bf16_check d = {.variant = variant, .what = parts[p], .shape = shape, .rel = ldexp(1, -7),
                            .abs = cudnn ? ldexp(1, -5) : 1e-5, .abs_scaled = cudnn};
            check_part(&d, got, want, B * T, S, first[p], width[p]);
        }
        if (!cudnn) { /* the bits of rounding the GPU's own fp32 backward of qkv, out and d_out widened */
            float *wide = floats_of_bf16_bits(qkv, n_qkv), *dout_wide = floats_of_bf16_bits(dout, n_out);
            float *out_wide = floats_of_bf16_bits(out, n_out), *fp32;
            float *g_wide = upload_floats(k, wide, n_qkv), *g_dout_wide = upload_floats(k, dout_wide, n_out);
            float *g_out_wide = upload_floats(k, out_wide, n_out), *g_fp32 = upload_floats(k, garbage, n_qkv);
            cr_assert_eq(k->attention_backward(g_fp32, g_scratch, g_dout_wide, g_wide, g_out_wide, g_lse, B, T, Hq,
                                               Hkv, hd),
                         TP_OK, "%s", tp_errmsg());
            fp32 = download(k, g_fp32, n_qkv);
            check_rounding(got_bits, fp32, n_qkv, 0, what, dims);
            k->release(g_wide), k->release(g_dout_wide), k->release(g_out_wide), k->release(g_fp32);
            free(wide), free(dout_wide), free(out_wide), free(fp32);
        }
        free(got_bits), free(around), free(got), free(want);
    }
done:
    k->release(g_qkv_memory), k->release(g_out_memory), k->release(g_lse), k->release(g_scratch);
    k->release(g_dout_memory), k->release(g_dqkv_memory);
    free(qkv_values), free(qkv), free(dout_values), free(dout), free(out), free(out_garbage), free(lse), free(dqkv);
    free(dqkv_garbage), free(scratch), free(garbage);
}

/* cuDNN where it is installed; a skip saying so where it is not (the
 * default then runs the tiled kernels, as the next tests check). */
static void need_cudnn_library(void)
{
    if (REHEARSAL) return;
    char version[32];
    if (cudnn_attention_load(version, sizeof version) != TP_OK) {
        if (strstr(tp_errmsg(), "not found")) cr_skip_test("%s", tp_errmsg());
        cr_assert_fail("cuDNN: %s", tp_errmsg());
    }
    cr_log_info("cuDNN %s", version);
}

/* Every shape with qkv, out, d_out and d_qkv aligned; the first two also
 * with out, then qkv, then d_out, then d_qkv, then all four 2 bytes past
 * (through the scratch: d_qkv copied back after cuDNN writes it), and 16
 * bytes past (where they are, not 256-aligned: the K and V views, and dK
 * and dV, 16-byte aligned still). */
Test(cuda_backend, attention_bf16_through_cudnn)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    need_cudnn_library();
    for (int s = 0; s < BF16_ATTENTION_SHAPES; s++)
        bf16_attention_case(k, bf16_variants[0], bf16_attention_shapes[s], 0, 0, 0, 0);
    for (int s = 0; s < 4; s += s == 1 ? 2 : 1) { /* 0, 1 and 3 (T = 256: taken by every cuDNN 9) */
        bf16_attention_case(k, bf16_variants[0], bf16_attention_shapes[s], 1, 0, 0, 0);
        bf16_attention_case(k, bf16_variants[0], bf16_attention_shapes[s], 0, 1, 0, 0);
        bf16_attention_case(k, bf16_variants[0], bf16_attention_shapes[s], 0, 0, 1, 0);
        bf16_attention_case(k, bf16_variants[0], bf16_attention_shapes[s], 0, 0, 0, 1);
        bf16_attention_case(k, bf16_variants[0], bf16_attention_shapes[s], 1, 1, 1, 1);
        bf16_attention_case(k, bf16_variants[0], bf16_attention_shapes[s], 8, 8, 8, 8);
    }
}

/* The backward three times on the same inputs (the CPU twin's out and lse,
 * random bf16 qkv and d_out): whether every run wrote the bits of the
 * first. TP_ERR_ARG when cuDNN refuses the shape (an older cuDNN, T not a
 * multiple of 128: attention_cudnn.h). */
static int attention_backward_repeats(const kernel_backend *k, const int64_t *shape, int *repeats)
{
    int64_t B = shape[0], T = shape[1], Hq = shape[2], Hkv = shape[3], hd = shape[4];
    int64_t n_qkv = B * T * (Hq + 2 * Hkv) * hd, n_out = B * T * Hq * hd, n_lse = B * Hq * T;
    int64_t n_scratch = attention_scratch_floats(B, T, Hq);
    float *qkv_values = floats_random(n_qkv, 2.0f), *dout_values = floats_random(n_out, 1.0f);
    uint16_t *qkv = floats_bf16_bits(qkv_values, n_qkv), *dout = floats_bf16_bits(dout_values, n_out);
    uint16_t *out = malloc((size_t)n_out * sizeof(uint16_t));
    float *lse = malloc((size_t)n_lse * sizeof(float)), *scratch = malloc((size_t)n_scratch * sizeof(float));
    cr_assert(out && lse && scratch);
    cr_assert_eq(attention_forward_bf16(out, lse, scratch, qkv, B, T, Hq, Hkv, hd), TP_OK, "%s", tp_errmsg());
    uint16_t *g_qkv = upload_bits(k, qkv, n_qkv), *g_dout = upload_bits(k, dout, n_out);
    uint16_t *g_out = upload_bits(k, out, n_out), *g_dqkv = NULL;
    float *g_lse = upload_floats(k, lse, n_lse), *g_scratch = upload_floats(k, scratch, n_scratch);
    cr_assert_eq(k->alloc((void **)&g_dqkv, (size_t)n_qkv * sizeof(uint16_t)), TP_OK);
    uint16_t *first = NULL;
    int status = TP_OK;
    *repeats = 1;
    for (int run = 0; run < 3 && !status; run++) {
        status = k->attention_backward_bf16(g_dqkv, g_scratch, g_dout, g_qkv, g_out, g_lse, B, T, Hq, Hkv, hd);
        if (status) break;
        uint16_t *got = download_bits(k, g_dqkv, n_qkv);
        if (!first) first = got;
        else {
            if (memcmp(got, first, (size_t)n_qkv * sizeof(uint16_t)) != 0) *repeats = 0;
            free(got);
        }
    }
    free(first);
    k->release(g_qkv), k->release(g_dout), k->release(g_out), k->release(g_dqkv), k->release(g_lse);
    k->release(g_scratch);
    free(qkv_values), free(dout_values), free(qkv), free(dout), free(out), free(lse), free(scratch);
    return status;
}

/* TP_CUDA_DETERMINISTIC=1: cuDNN's deterministic backward (dQ written as dQ,
 * no accumulator: attention_cudnn.h) on every shape, aligned and 2 bytes
 * past, against the CPU twin with the same tolerances; then, on those
 * shapes and one of 1,024 positions (16 key tiles and more a query tile,
 * where the default backward's accumulation order has room to vary), the
 * backward three times on the same inputs: the same bits each time. Both
 * graphs' plans build on each shape (their engines and workspaces logged),
 * and the start line names the deterministic backward. The default
 * backward's repeats are logged, not required (cuDNN does not promise
 * them: why this graph exists). */
Test(cuda_backend, attention_bf16_deterministic_backward)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    need_cudnn_library();
    cr_assert_eq(cuda_deterministic_variant("1"), TP_OK);
    /* GPT-2's sequence, with grouped key/value heads and without (GPT-2's
     * own: should cuDNN sum a group's dK and dV in a varying order, the
     * grouped shapes alone would differ). Every shape is tried and said
     * before the test fails, naming the shapes that did not repeat. */
    static const int64_t long_shapes[2][5] = {{1, 1024, 4, 2, 64}, {1, 1024, 4, 4, 64}};
    char unrepeated[512] = "";
    for (int s = 0; s < BF16_ATTENTION_SHAPES + 2; s++) {
        const int64_t *shape =
            s < BF16_ATTENTION_SHAPES ? bf16_attention_shapes[s] : long_shapes[s - BF16_ATTENTION_SHAPES];
        cr_assert_eq(cuda_deterministic_variant("1"), TP_OK);
        bf16_attention_case(k, bf16_variants[0], shape, 0, 0, 0, 0);
        if (s < BF16_ATTENTION_SHAPES) bf16_attention_case(k, bf16_variants[0], shape, 1, 1, 1, 1);
        int repeats = 0, status = attention_backward_repeats(k, shape, &repeats);
        if (status && strstr(tp_errmsg(), "not built here")) {
            cr_log_warn("%s", tp_errmsg()); /* an older cuDNN and T not a multiple of 128, as documented */
            continue;
        }
        cr_assert_eq(status, TP_OK, "deterministic backward: %s", tp_errmsg());
        cr_log_info("TP_CUDA_DETERMINISTIC=1, B=%lld T=%lld Hq=%lld Hkv=%lld hd=%lld: d_qkv %s in three runs",
                    (long long)shape[0], (long long)shape[1], (long long)shape[2], (long long)shape[3],
                    (long long)shape[4], repeats ? "repeated" : "DIFFERED");
        if (!repeats) {
            size_t used = strlen(unrepeated);
            snprintf(unrepeated + used, sizeof unrepeated - used, " B=%lld T=%lld Hq=%lld Hkv=%lld hd=%lld;",
                     (long long)shape[0], (long long)shape[1], (long long)shape[2], (long long)shape[3],
                     (long long)shape[4]);
        }
        if (REHEARSAL) continue;
        const cudnn_attention_plan *deterministic = NULL, *by_default = NULL;
        cr_assert_eq(cudnn_attention_prepare(CUDNN_ATTENTION_BACKWARD_DETERMINISTIC, shape[0], shape[1], shape[2],
                                             shape[3], shape[4], &deterministic),
                     TP_OK, "%s", tp_errmsg());
        cr_assert_eq(cudnn_attention_prepare(CUDNN_ATTENTION_BACKWARD, shape[0], shape[1], shape[2], shape[3],
                                             shape[4], &by_default),
                     TP_OK, "%s", tp_errmsg());
        cr_log_info("T=%lld: the deterministic backward's engine %lld, workspace %zu bytes; the default's engine "
                    "%lld, %zu bytes",
                    (long long)shape[1], (long long)cudnn_attention_engine(deterministic),
                    cudnn_attention_workspace_bytes(deterministic), (long long)cudnn_attention_engine(by_default),
                    cudnn_attention_workspace_bytes(by_default));
        cr_assert_eq(cuda_deterministic_variant("0"), TP_OK);
        cr_assert_eq(attention_backward_repeats(k, shape, &repeats), TP_OK, "default backward: %s", tp_errmsg());
        cr_log_info("T=%lld: cuDNN's default backward %s three runs", (long long)shape[1],
                    repeats ? "repeated its bits in" : "gave different bits in");
    }
    if (!REHEARSAL) {
        char text[2048];
        const int64_t *shape = bf16_attention_shapes[3];
        cr_assert_eq(cuda_deterministic_variant("1"), TP_OK);
        k->describe_attention(1, shape[0], shape[1], shape[2], shape[3], shape[4], text, sizeof text);
        cr_log_info("TP_CUDA_DETERMINISTIC=1: %s", text);
        cr_assert(strstr(text, "deterministic") != NULL, "the start line should say so: %s", text);
        cr_assert_eq(cuda_deterministic_variant("0"), TP_OK);
        k->describe_attention(1, shape[0], shape[1], shape[2], shape[3], shape[4], text, sizeof text);
        cr_assert(strstr(text, "deterministic") == NULL, "TP_CUDA_DETERMINISTIC=0: %s", text);
        cr_assert_eq(cuda_deterministic_variant("yes"), TP_ERR_ARG, "a value neither 1 nor 0");
    }
    cr_assert_eq(cuda_deterministic_variant(NULL), TP_OK);
    cr_assert(!unrepeated[0], "TP_CUDA_DETERMINISTIC=1: d_qkv differs between runs at%s", unrepeated);
}

/* Every shape with qkv, out, d_out and d_qkv aligned, one with all four 2
 * bytes past (out and d_qkv rounded value by value, not four at a time;
 * qkv and d_out widened where they are); the rows kernels likewise. */
Test(cuda_backend, attention_bf16_through_tiled_kernels)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    for (int s = 0; s < BF16_ATTENTION_SHAPES; s++)
        bf16_attention_case(k, bf16_variants[1], bf16_attention_shapes[s], 0, 0, 0, 0);
    bf16_attention_case(k, bf16_variants[1], bf16_attention_shapes[2], 1, 1, 1, 1);
    /* and the rows kernels where the tiled do not fit (head size 72) */
    static const int64_t rows_shape[5] = {2, 50, 4, 2, 72};
    bf16_attention_case(k, "rows", rows_shape, 0, 0, 0, 0);
    bf16_attention_case(k, "rows", rows_shape, 1, 1, 1, 1);
}

/* The default (TP_CUDA_ATTENTION unset): cuDNN for the bf16 operations where
 * it is installed, the same results as asking for it (bit for bit, the
 * forward); the start line's text says so; the fp32 operations keep the
 * tiled kernels. A head size cuDNN is not asked for (32) falls back to the
 * tiled kernels under the default (the CPU twin's results within fp32's
 * tolerance) and is an error when cuDNN is asked for. */
Test(cuda_backend, attention_bf16_default_and_fallback)
{
    NEED_GPU();
    REHEARSAL_SKIP("the choice of attention and its text");
    const kernel_backend *k = gpu();
    char text[2048];
    cr_assert_eq(cuda_attention_variant(NULL), TP_OK);
    k->describe_attention(0, 2, 100, 4, 2, 64, text, sizeof text);
    cr_log_info("fp32: %s", text);
    cr_assert(strstr(text, "tiled") && strstr(text, "fp32"), "fp32 attention: %s", text);
    k->describe_attention(1, 2, 100, 4, 2, 32, text, sizeof text);
    cr_log_info("bf16, head size 32: %s", text);
    cr_assert(strstr(text, "tiled") && strstr(text, "not used") && strstr(text, "head size"), "%s", text);

    const int64_t *shape = bf16_attention_shapes[3]; /* T = 256: every cuDNN 9 takes it (attention_cudnn.h) */
    int64_t B = shape[0], T = shape[1], Hq = shape[2], Hkv = shape[3], hd = shape[4];
    int64_t n_qkv = B * T * (Hq + 2 * Hkv) * hd, n_out = B * T * Hq * hd, n_lse = B * Hq * T;
    float *qkv = floats_random(n_qkv, 2.0f);
    uint16_t *qkv_bits = floats_bf16_bits(qkv, n_qkv), *g_qkv = upload_bits(k, qkv_bits, n_qkv);
    float *g_lse = NULL, *g_scratch = NULL;
    uint16_t *g_out = NULL;
    cr_assert_eq(k->alloc((void **)&g_out, (size_t)n_out * sizeof(uint16_t)), TP_OK);
    cr_assert_eq(k->alloc((void **)&g_lse, (size_t)n_lse * sizeof(float)), TP_OK);
    cr_assert_eq(k->alloc((void **)&g_scratch, (size_t)attention_scratch_floats(B, T, Hq) * sizeof(float)), TP_OK);
    char version[32];
    if (cudnn_attention_load(version, sizeof version) == TP_OK) {
        k->describe_attention(1, B, T, Hq, Hkv, hd, text, sizeof text);
        cr_log_info("bf16, T %lld, head size %lld: %s", (long long)T, (long long)hd, text);
        cr_assert(strncmp(text, "cuDNN 9.", 8) == 0, "the default for bf16 should be cuDNN: %s", text);
        cr_assert_eq(k->attention_forward_bf16(g_out, g_lse, g_scratch, g_qkv, B, T, Hq, Hkv, hd), TP_OK, "%s",
                     tp_errmsg());
        uint16_t *by_default = download_bits(k, g_out, n_out);
        cr_assert_eq(cuda_attention_variant("cudnn"), TP_OK);
        cr_assert_eq(k->attention_forward_bf16(g_out, g_lse, g_scratch, g_qkv, B, T, Hq, Hkv, hd), TP_OK, "%s",
                     tp_errmsg());
        uint16_t *asked = download_bits(k, g_out, n_out);
        cr_assert(memcmp(by_default, asked, (size_t)n_out * sizeof(uint16_t)) == 0,
                  "the default's out differs from TP_CUDA_ATTENTION=cudnn's");
        free(by_default), free(asked);
        /* asked for, a head size cuDNN is not asked for is an error naming it */
        uint16_t *g_small = upload_bits(k, qkv_bits, B * T * (Hq + 2 * Hkv) * 32);
        cr_assert_eq(k->attention_forward_bf16(g_out, g_lse, g_scratch, g_small, B, T, Hq, Hkv, 32), TP_ERR_ARG,
                     "head size 32 with TP_CUDA_ATTENTION=cudnn");
        cr_assert(strstr(tp_errmsg(), "head size") != NULL, "%s", tp_errmsg());
        k->release(g_small);
    } else {
        cr_log_warn("no cuDNN here (%s): the default's fallback only", tp_errmsg());
    }
    /* the fallback under the default: head size 32 */
    cr_assert_eq(cuda_attention_variant(NULL), TP_OK);
    static const int64_t small[5] = {2, 100, 4, 2, 32};
    bf16_attention_case(k, "", small, 0, 0, 0, 0); /* "" is the default: the tiled kernels' tolerances, as they run */
    k->release(g_qkv), k->release(g_out), k->release(g_lse), k->release(g_scratch);
    free(qkv), free(qkv_bits);
}

/* qkv's bits are taken as they are: one position passes v through whole
 * (T = 1: out = v, widened and rounded back), for special bf16 values
 * (the largest, infinities, NaN, subnormals, both signs), through the rows
 * and the tiled kernels, out's bits equal to v's and to the CPU twin's (a
 * NaN's payload aside: the GPU's arithmetic gives its canonical NaN). The
 * rounding of fp32 values into such bits is the operations' that write qkv
 * (matmul_forward_bf16_bits, rope_forward_bf16: their tests below). */
Test(cuda_backend, attention_bf16_keeps_the_bits_of_qkv)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    static const uint16_t special[] = {0x3f80u, 0x3f81u, 0xbf81u, 0x7f7fu, 0xff7fu, 0xff80u,
                                       0x7f80u, 0x7fc1u, 0x0001u, 0x8001u, 0x0040u, 0x0080u};
    const int64_t count = (int64_t)(sizeof special / sizeof special[0]);
    int64_t Hq = 2, Hkv = 2, hd = 32, S = (Hq + 2 * Hkv) * hd;
    float lse[2], scratch[2];
    uint16_t qkv[(2 + 4) * 32], out[2 * 32];
    for (int64_t c = 0; c < S; c++) /* q and k: 0.25, a finite score; v: the special values */
        qkv[c] = c < (Hq + Hkv) * hd ? 0x3e80u : special[c % count];
    cr_assert_eq(attention_forward_bf16(out, lse, scratch, qkv, 1, 1, Hq, Hkv, hd), TP_OK);
    const char *variants[] = {"rows", "tiled"};
    for (int v = 0; v < 2; v++) {
        cr_assert_eq(cuda_attention_variant(variants[v]), TP_OK);
        uint16_t *g_qkv = upload_bits(k, qkv, S), *g_out = NULL;
        float *g_lse = NULL, *g_scratch = NULL;
        cr_assert_eq(k->alloc((void **)&g_out, sizeof out), TP_OK);
        cr_assert_eq(k->alloc((void **)&g_lse, sizeof lse), TP_OK);
        cr_assert_eq(k->alloc((void **)&g_scratch, sizeof scratch), TP_OK);
        cr_assert_eq(k->attention_forward_bf16(g_out, g_lse, g_scratch, g_qkv, 1, 1, Hq, Hkv, hd), TP_OK, "%s",
                     tp_errmsg());
        uint16_t *got = download_bits(k, g_out, Hq * hd);
        for (int64_t i = 0; i < Hq * hd; i++) {
            uint16_t v_bits = qkv[(Hq + Hkv) * hd + i]; /* Hq == Hkv: query head h reads value head h */
            cr_assert(got[i] == out[i] || (bf16_is_nan(got[i]) && bf16_is_nan(out[i])),
                      "attention_forward_bf16 (%s) B=1 T=1 Hq=%lld Hkv=%lld hd=%lld: out[%lld] %#06x, the CPU "
                      "twin's %#06x",
                      variants[v], (long long)Hq, (long long)Hkv, (long long)hd, (long long)i, got[i], out[i]);
            cr_assert(got[i] == v_bits || (bf16_is_nan(got[i]) && bf16_is_nan(v_bits)),
                      "attention_forward_bf16 (%s) B=1 T=1 Hq=%lld Hkv=%lld hd=%lld: out[%lld] %#06x, v's bits %#06x",
                      variants[v], (long long)Hq, (long long)Hkv, (long long)hd, (long long)i, got[i], v_bits);
        }
        free(got);
        k->release(g_qkv), k->release(g_out), k->release(g_lse), k->release(g_scratch);
    }
}

/* --------------------------------------------------------------- embedding */

/* The backward of N tokens' random gradients into a random table of
 * `rows` rows of C from `first`: the device's as the CPU's, exactly. */
static void check_embedding_backward(const kernel_backend *k, const int *tokens, int64_t N, int64_t C, int64_t first,
                                     int64_t rows, const char *what)
{
    float *dout = floats_random(N * C, 1.0f), *d_table = floats_random(rows * C, 1.0f);
    int *g_tokens = upload(k, tokens, N, sizeof(int));
    float *g_dout = upload_floats(k, dout, N * C), *g_dtable = upload_floats(k, d_table, rows * C);
    embedding_backward(d_table, tokens, dout, N, C, first, rows);
    cr_assert_eq(k->embedding_backward(g_dtable, g_tokens, g_dout, N, C, first, rows), TP_OK, "%s", tp_errmsg());
    check_device(k, g_dtable, d_table, rows * C, 0, 0, what);
    k->release(g_tokens), k->release(g_dout), k->release(g_dtable);
    free(dout), free(d_table);
}

/* This rank holds rows [100, 250) of the table; tokens fall below, inside
 * (some repeated) and above. Forward: copies, exact (tolerance 0).
 * Backward: accumulates into a table of random values, a repeated token's
 * gradients added in the order of their positions, as the CPU adds them:
 * exact too (tolerance 0), at N = 37 and at N = 5000 with 21 tokens (runs of
 * about 250), one of them all of the first 300 positions, and for a table
 * of 300 columns (the kernel's column slices beyond the first). */
Test(cuda_backend, embedding_forward_and_backward)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    int64_t N = 37, C = 72, first = 100, rows = 150;
    int tokens[37];
    for (int64_t n = 0; n < N; n++) tokens[n] = 80 + (int)((floats_uniform() + 1.0f) * 95.0f); /* [80, 270) */
    tokens[3] = 99, tokens[4] = 100, tokens[5] = 249, tokens[6] = 250;        /* the edges */
    tokens[10] = tokens[11] = tokens[20] = tokens[36] = 123;                  /* repeats */
    float *table = floats_random(rows * C, 1.0f), *out = malloc((size_t)(N * C) * sizeof(float));
    float *garbage = floats_filled(N * C, 7.0f);
    int *g_tokens = upload(k, tokens, N, sizeof(int));
    float *g_table = upload_floats(k, table, rows * C), *g_out = upload_floats(k, garbage, N * C);
    embedding_forward(out, tokens, table, N, C, first, rows);
    cr_assert_eq(k->embedding_forward(g_out, g_tokens, g_table, N, C, first, rows), TP_OK, "%s", tp_errmsg());
    check_device(k, g_out, out, N * C, 0, 0, "out");
    k->release(g_tokens), k->release(g_table), k->release(g_out);
    free(table), free(out), free(garbage);
    check_embedding_backward(k, tokens, N, C, first, rows, "d_table");

    int64_t many = 5000;
    int *repeated = malloc((size_t)many * sizeof(int));
    cr_assert(repeated);
    for (int64_t n = 0; n < many; n++)
        repeated[n] = n < 300 ? 140 : 120 + (int)((floats_uniform() + 1.0f) * 10.0f); /* [120, 140] */
    check_embedding_backward(k, repeated, many, C, first, rows, "d_table, 5000 positions of 21 tokens");
    free(repeated);

    /* A wide table: 300 columns, three slices of EMBEDDING_COLUMNS (128; the
     * last 44 wide), each block of a run adding its slice. */
    int some[64];
    for (int n = 0; n < 64; n++) some[n] = n % 3 == 0 ? 200 : 95 + n * 2; /* 200 repeated; some not held */
    check_embedding_backward(k, some, 64, 300, first, rows, "d_table, 300 columns (three slices)");
}

/* ----------------------------------------------------------- cross-entropy */

/* Local logits of 150 columns: global ids [300, 450) of a vocabulary of 420
 * (30 padding columns), [0, 150) of 1000 (no padding) and [450, 600) of 420
 * (padding only: max -inf, sum 0, gradient 0). Each step gets the CPU's
 * results of the step before, so that each op is compared alone. Max and
 * target logit are exact (tolerance 0); the sum of exponentials is a
 * reduction (1e-4 relative); its rescaling an expf and a product (1e-6
 * relative); the gradient elementwise (1e-5 relative + 1e-6 absolute). */
Test(cuda_backend, crossentropy)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    /* V, first, vocab: 150 columns a row (a column a thread at a time), 152
     * (rows in 16-byte chunks, CHUNK columns at a time; the last real
     * column inside a chunk at vocab 425). */
    const int64_t cases[][3] = {{150, 300, 420}, {150, 0, 1000}, {150, 450, 420},
                                {152, 300, 420}, {152, 0, 1000}, {152, 450, 420}, {152, 300, 425}};
    int64_t N = 37;
    for (int s = 0; s < (int)(sizeof cases / sizeof cases[0]); s++) {
        int64_t V = cases[s][0], first = cases[s][1], vocab = cases[s][2];
        int targets[37];
        for (int64_t n = 0; n < N; n++) {
            /* Every other target in this rank's columns where it has real ones, the rest anywhere. */
            int64_t valid = vocab - first < 0 ? 0 : vocab - first > V ? V : vocab - first;
            double u = (floats_uniform() + 1.0) / 2.0;
            targets[n] = (int)(n % 2 == 0 && valid > 0 ? first + (int64_t)(u * (double)valid)
                                                       : (int64_t)(u * (double)vocab));
        }
        float *logits = floats_random(N * V, 4.0f), *row_max = malloc((size_t)N * sizeof(float));
        float *sum = malloc((size_t)N * sizeof(float)), *target = malloc((size_t)N * sizeof(float));
        float *d_logits = malloc((size_t)(N * V) * sizeof(float)), *garbage = floats_filled(N * V, 7.0f);
        int *g_targets = upload(k, targets, N, sizeof(int));
        float *g_logits = upload_floats(k, logits, N * V), *g_max = upload_floats(k, garbage, N);
        float *g_sum = upload_floats(k, garbage, N), *g_target = upload_floats(k, garbage, N);
        float *g_dlogits = upload_floats(k, garbage, N * V);

        crossentropy_row_stats(row_max, sum, logits, N, V, first, vocab);
        cr_assert_eq(k->crossentropy_row_stats(g_max, g_sum, g_logits, N, V, first, vocab), TP_OK, "%s", tp_errmsg());
        check_device(k, g_max, row_max, N, 0, 0, "row_stats' max");
        check_device(k, g_sum, sum, N, 1e-4, 0, "row_stats' sum");
        cr_assert_eq(k->to_device(g_sum, sum, (size_t)N * sizeof(float)), TP_OK, "%s", tp_errmsg());

        /* Each sum relative to a larger maximum (as over ranks): rows' maxima + 0.5, and row 0's unchanged. */
        float *global = malloc((size_t)N * sizeof(float)), *scaled = malloc((size_t)N * sizeof(float));
        for (int64_t n = 0; n < N; n++) global[n] = row_max[n] == -INFINITY ? 1.0f : row_max[n] + (n ? 0.5f : 0.0f);
        float *g_global = upload_floats(k, global, N), *g_scaled = upload_floats(k, sum, N);
        memcpy(scaled, sum, (size_t)N * sizeof(float));
        crossentropy_rescale_sum(scaled, row_max, global, N);
        cr_assert_eq(k->crossentropy_rescale_sum(g_scaled, g_max, g_global, N), TP_OK, "%s", tp_errmsg());
        check_device(k, g_scaled, scaled, N, 1e-6, 0, "rescale_sum");
        k->release(g_global), k->release(g_scaled);
        free(global), free(scaled);

        crossentropy_target_logit(target, logits, targets, N, V, first);
        cr_assert_eq(k->crossentropy_target_logit(g_target, g_logits, g_targets, N, V, first), TP_OK, "%s",
                     tp_errmsg());
        check_device(k, g_target, target, N, 0, 0, "target_logit");

        crossentropy_backward(d_logits, logits, row_max, sum, targets, N, V, first, vocab, 0.5f);
        cr_assert_eq(k->crossentropy_backward(g_dlogits, g_logits, g_max, g_sum, g_targets, N, V, first, vocab, 0.5f),
                     TP_OK, "%s", tp_errmsg());
        check_device(k, g_dlogits, d_logits, N * V, 1e-5, 1e-6, "d_logits");
        /* in place, as the trainer writes it (kernels.h): the same floats, bit for bit */
        cr_assert_eq(k->crossentropy_backward(g_logits, g_logits, g_max, g_sum, g_targets, N, V, first, vocab, 0.5f),
                     TP_OK, "%s", tp_errmsg());
        float *got_apart = download(k, g_dlogits, N * V), *got_in_place = download(k, g_logits, N * V);
        cr_assert(memcmp(got_in_place, got_apart, (size_t)(N * V) * sizeof(float)) == 0,
                  "V=%lld: d_logits written over the logits differ from those written apart", (long long)V);
        free(got_apart), free(got_in_place);

        k->release(g_targets), k->release(g_logits), k->release(g_max), k->release(g_sum), k->release(g_target);
        k->release(g_dlogits);
        free(logits), free(row_max), free(sum), free(target), free(d_logits), free(garbage);
    }
}

/* Rows longer than a block (THREADS = 256; V = 150 above gives a thread one
 * column at most): each thread's maximum grows and its sum is rescaled, or
 * not; -infinity in threads' first columns and in whole first passes;
 * padding left out; a NaN keeps the sum NaN. Against the CPU: the max exact,
 * the sum within 1e-5 relative (sums of thousands of terms in other orders,
 * each expf within 2 ulp: a few 1e-7 measured in an emulation of the
 * kernel). */
static void row_stats_of_wide_rows(int64_t V)
{
    const kernel_backend *k = gpu();
    enum { N = 7 };
    int64_t first = 0, vocab = 2900; /* padding columns */
    float *logits = floats_random(N * V, 8.0f), row_max[N], sum[N];
    logits[0 * V + 3] = 30.0f;                                              /* the max in a thread's first column */
    logits[1 * V + 2899] = 30.0f;                                           /* in the last real column */
    logits[1 * V + 2950] = 99.0f;                                           /* padding: not taken */
    for (int64_t v = 0; v < V; v++) logits[2 * V + v] = (float)v / 100.0f;  /* every thread's max grows each time */
    for (int64_t v = 0; v < V; v++) logits[3 * V + v] = -(float)v / 100.0f; /* never grows after the first */
    for (int64_t v = 0; v < V; v += 2) logits[4 * V + v] = -INFINITY;       /* half -inf, threads' first included */
    /* whole first passes -inf (2,048 columns a pass chunked) */
    for (int64_t v = 0; v < 2100; v++) logits[5 * V + v] = -INFINITY;
    logits[6 * V + 5] = NAN;                                                /* a NaN among a thread's first */
    crossentropy_row_stats(row_max, sum, logits, N, V, first, vocab);
    cr_assert(isnan(sum[6]), "the CPU's sum of a row with a NaN: %g", sum[6]);
    float *g_logits = upload_floats(k, logits, N * V), *g_max = upload_floats(k, logits, N);
    float *g_sum = upload_floats(k, logits, N);
    cr_assert_eq(k->crossentropy_row_stats(g_max, g_sum, g_logits, N, V, first, vocab), TP_OK, "%s", tp_errmsg());
    check_device(k, g_max, row_max, N, 0, 0, "wide rows' max");
    check_device(k, g_sum, sum, N, 1e-5, 0, "wide rows' sum"); /* NaN on both sides passes check_close */
    k->release(g_logits), k->release(g_max), k->release(g_sum);
    free(logits);
}

Test(cuda_backend, crossentropy_row_stats_wide_rows)
{
    NEED_GPU();
    for (int64_t V = 3000; V >= 2999; V--) /* in 16-byte chunks (launch.h); a column a thread at a time */
        row_stats_of_wide_rows(V);
}

/* The bf16 logits' row statistics and target logits (bits, as the
 * classifier's bf16 product writes them): the fp32 operations' results on
 * the widened logits, to the bit, on the GPU (the same kernels, each logit
 * widened exactly) and on the CPU; the GPU's against the CPU's as the fp32
 * test above (max and target exact, sum 1e-5). Rows of a vocabulary of
 * 3,000 (threads' running maxima rescaled), one a NaN. */
static void crossentropy_of_bf16_logits_of(int64_t V)
{
    const kernel_backend *k = gpu();
    int64_t N = 7, first = 0, vocab = 2990;
    int targets[7] = {0, 5, 2999, 2989, 1500, 17, 2990}; /* 2999 and 2990: padding columns (vocab 2990) */
    float *values = floats_random(N * V, 8.0f);
    values[3 * V + 11] = NAN;
    uint16_t *bits = floats_bf16_bits(values, N * V);
    float *wide = floats_of_bf16_bits(bits, N * V);
    float *row_max = malloc((size_t)N * sizeof(float)), *sum = malloc((size_t)N * sizeof(float));
    float *target = malloc((size_t)N * sizeof(float)), *want_max = malloc((size_t)N * sizeof(float));
    float *want_sum = malloc((size_t)N * sizeof(float)), *want_target = malloc((size_t)N * sizeof(float));
    cr_assert(row_max && sum && target && want_max && want_sum && want_target);
    crossentropy_row_stats(want_max, want_sum, wide, N, V, first, vocab);
    crossentropy_target_logit(want_target, wide, targets, N, V, first);
    crossentropy_row_stats_bf16(row_max, sum, bits, N, V, first, vocab);
    crossentropy_target_logit_bf16(target, bits, targets, N, V, first);
    for (int64_t n = 0; n < N; n++) {
        cr_assert(memcmp(&row_max[n], &want_max[n], sizeof(float)) == 0, "CPU row %lld: max %a, of the widened %a",
                  (long long)n, row_max[n], want_max[n]);
        cr_assert(memcmp(&sum[n], &want_sum[n], sizeof(float)) == 0 || (isnan(sum[n]) && isnan(want_sum[n])),
                  "CPU row %lld: sum %a, of the widened %a", (long long)n, sum[n], want_sum[n]);
        cr_assert(memcmp(&target[n], &want_target[n], sizeof(float)) == 0, "CPU row %lld: target %a, of the widened %a",
                  (long long)n, target[n], want_target[n]);
    }
    uint16_t *g_bits = upload_bits(k, bits, N * V);
    int *g_targets = upload(k, targets, N, sizeof(int));
    float *g_wide = upload_floats(k, wide, N * V), *g_max = upload_floats(k, values, N), *g_sum = upload_floats(k, values, N);
    float *g_target = upload_floats(k, values, N), *g_wide_max = upload_floats(k, values, N);
    float *g_wide_sum = upload_floats(k, values, N), *g_wide_target = upload_floats(k, values, N);
    cr_assert_eq(k->crossentropy_row_stats_bf16(g_max, g_sum, g_bits, N, V, first, vocab), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(k->crossentropy_target_logit_bf16(g_target, g_bits, g_targets, N, V, first), TP_OK, "%s",
                 tp_errmsg());
    cr_assert_eq(k->crossentropy_row_stats(g_wide_max, g_wide_sum, g_wide, N, V, first, vocab), TP_OK, "%s",
                 tp_errmsg());
    cr_assert_eq(k->crossentropy_target_logit(g_wide_target, g_wide, g_targets, N, V, first), TP_OK, "%s",
                 tp_errmsg());
    float *got[3] = {download(k, g_max, N), download(k, g_sum, N), download(k, g_target, N)};
    float *of_wide[3] = {download(k, g_wide_max, N), download(k, g_wide_sum, N), download(k, g_wide_target, N)};
    const char *names[3] = {"max", "sum", "target"};
    for (int i = 0; i < 3; i++)
        for (int64_t n = 0; n < N; n++)
            cr_assert(memcmp(&got[i][n], &of_wide[i][n], sizeof(float)) == 0 || (isnan(got[i][n]) && isnan(of_wide[i][n])),
                      "device row %lld: %s %a from the bits, %a from the widened logits", (long long)n, names[i],
                      got[i][n], of_wide[i][n]);
    check_device(k, g_max, want_max, N, 0, 0, "bf16 logits' max");
    check_device(k, g_sum, want_sum, N, 1e-5, 0, "bf16 logits' sum");
    check_device(k, g_target, want_target, N, 0, 0, "bf16 logits' target");
    for (int i = 0; i < 3; i++) free(got[i]), free(of_wide[i]);
    k->release(g_bits), k->release(g_targets), k->release(g_wide), k->release(g_max), k->release(g_sum);
    k->release(g_target), k->release(g_wide_max), k->release(g_wide_sum), k->release(g_wide_target);
    free(values), free(bits), free(wide), free(row_max), free(sum), free(target), free(want_max), free(want_sum);
    free(want_target);
}

Test(cuda_backend, crossentropy_of_bf16_logits)
{
    NEED_GPU();
    for (int64_t V = 3000; V >= 2999; V--) /* in 16-byte chunks (launch.h); a column a thread at a time */
        crossentropy_of_bf16_logits_of(V);
}

/* classifier_backward_bf16 in two links, each exact where it can be: the
 * d_logits it writes over the logits (in place, kernels.h) are the bf16 bits of the GPU's own fp32
 * crossentropy_backward of the bf16 logits widened (the same kernel, each
 * logit widened exactly, rounded on store: equal to the
 * bit; the CPU's d_logits differ from the GPU's in the last bits of expf,
 * checked above, so that a rounding could flip between them); its d_in and
 * d_weight are the CPU's bf16 products of those very bits (matmul_backward_bf16
 * with them as its d_out), within the bf16 products' tolerance. With padding columns (vocab < first + V) and
 * d_weight accumulated from random values; in (the final norm's
 * activation) and the weight (the table's bf16 copy) as bf16 bits, the
 * same on both sides. */
static void classifier_backward_bf16_of(int64_t V)
{
    const kernel_backend *k = gpu();
    int64_t N = 37, C = 72, first = 300, vocab = 425;
    int targets[37];
    for (int64_t n = 0; n < N; n++) /* a third on another rank's columns */
        targets[n] = (int)(n % 3 == 0 ? n : first + (n * 7) % (vocab - first));
    float *values = floats_random(N * V, 4.0f), *in = floats_random(N * C, 1.0f), *w = floats_random(V * C, 1.0f);
    uint16_t *logit_bits = floats_bf16_bits(values, N * V); /* the bf16 logits */
    float *logits = floats_of_bf16_bits(logit_bits, N * V);   /* and their values */
    float *row_max = malloc((size_t)N * sizeof(float)), *sum = malloc((size_t)N * sizeof(float));
    float *d_weight = floats_random(V * C, 1.0f), *d_in = malloc((size_t)(N * C) * sizeof(float));
    float *garbage = floats_filled(N * V, 7.0f);
    crossentropy_row_stats(row_max, sum, logits, N, V, first, vocab);
    int *g_targets = upload(k, targets, N, sizeof(int));
    uint16_t *g_logit_bits = upload_bits(k, logit_bits, N * V);
    float *g_logits = upload_floats(k, logits, N * V), *g_max = upload_floats(k, row_max, N);
    uint16_t *in_bits = floats_bf16_bits(in, N * C), *g_in = upload_bits(k, in_bits, N * C);
    uint16_t *w_bits = floats_bf16_bits(w, V * C), *g_w = upload_bits(k, w_bits, V * C);
    float *g_sum = upload_floats(k, sum, N);
    float *g_dw = upload_floats(k, d_weight, V * C), *g_din = upload_floats(k, garbage, N * C);
    float *g_fp32 = upload_floats(k, garbage, N * V);
    cr_assert_eq(k->classifier_backward_bf16(g_din, g_dw, g_logit_bits, g_max, g_sum, g_targets, g_in, g_w, N, C, V,
                                             first, vocab, 0.5f),
                 TP_OK, "%s", tp_errmsg());
    cr_assert_eq(k->crossentropy_backward(g_fp32, g_logits, g_max, g_sum, g_targets, N, V, first, vocab, 0.5f), TP_OK,
                 "%s", tp_errmsg());
    uint16_t *bits = download_bits(k, g_logit_bits, N * V); /* the gradient, where the logits were */
    float *fp32 = download(k, g_fp32, N * V);
    floats_assert_rounded(bits, fp32, N * V, "d_logits (the GPU's fp32 crossentropy_backward rounded)");
    cr_assert_eq(matmul_backward_bf16(d_in, d_weight, NULL, bits, in_bits, w_bits, N, C, V), TP_OK, "%s",
                 tp_errmsg());
    check_bf16(k, g_din, d_in, N * C, "d_in");
    check_bf16(k, g_dw, d_weight, V * C, "d_weight (accumulated)");
    k->release(g_targets), k->release(g_logits), k->release(g_max), k->release(g_sum), k->release(g_in);
    k->release(g_w), k->release(g_dw), k->release(g_din), k->release(g_fp32);
    k->release(g_logit_bits);
    free(values), free(logit_bits), free(logits), free(in), free(w), free(row_max), free(sum), free(d_weight);
    free(d_in), free(garbage), free(bits), free(fp32), free(in_bits), free(w_bits);
}

Test(cuda_backend, classifier_backward_bf16)
{
    NEED_GPU();
    for (int64_t V = 150; V <= 152; V += 2) /* a column a thread at a time; in 16-byte chunks (launch.h) */
        classifier_backward_bf16_of(V);
}

/* --------------------------------------------------------------- optimizer */

/* Three steps from zero moments, new gradients each step, over many
 * tensors in one call: more than one launch's table of 48, sizes of 0, 1,
 * exactly a block of 2,048 values, across blocks, and 1037; weight decay on
 * some. The same operations in the same order with no fused multiply-add as
 * the CPU's adamw_update on each tensor alone, so the two should agree to
 * the bit; tolerance 1e-6 relative + 1e-12 absolute. Every third tensor
 * has its bf16 copy written in the update (param_bits, from garbage): the
 * bits of rounding the device's updated values, exactly; the others' copy
 * areas untouched. */
Test(cuda_backend, adamw_update_tensors)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    enum { COUNT = 100 };
    int64_t sizes[COUNT];
    for (int t = 0; t < COUNT; t++) sizes[t] = t % 7 == 0 ? 0 : t % 7 == 1 ? 1 : 5 + 13 * t;
    sizes[3] = 2048, sizes[10] = 2048 * 3 + 1, sizes[50] = 1037, sizes[99] = 70001;
    float *param[COUNT], *m[COUNT], *v[COUNT], *g_param[COUNT], *g_m[COUNT], *g_v[COUNT];
    uint16_t *g_bits[COUNT], *garbage_bits[COUNT];
    adamw_tensor tensors[COUNT];
    for (int t = 0; t < COUNT; t++) {
        param[t] = floats_random(sizes[t], 1.0f), m[t] = floats_filled(sizes[t], 0.0f), v[t] = floats_filled(sizes[t], 0.0f);
        g_param[t] = upload_floats(k, param[t], sizes[t]), g_m[t] = upload_floats(k, m[t], sizes[t]);
        g_v[t] = upload_floats(k, v[t], sizes[t]);
        garbage_bits[t] = malloc((size_t)(sizes[t] + 1) * sizeof(uint16_t));
        cr_assert(garbage_bits[t]);
        for (int64_t i = 0; i <= sizes[t]; i++) garbage_bits[t][i] = 0x7777;
        g_bits[t] = upload_bits(k, garbage_bits[t], sizes[t] + 1);
    }
    for (int64_t step = 1; step <= 3; step++) {
        float *grad[COUNT], *g_grad[COUNT];
        for (int t = 0; t < COUNT; t++) {
            float decay = t % 2 ? 0.1f : 0.0f;
            grad[t] = floats_random(sizes[t], 0.1f), g_grad[t] = upload_floats(k, grad[t], sizes[t]);
            adamw_update(param[t], grad[t], m[t], v[t], sizes[t], 6e-4f, 0.9f, 0.95f, 1e-8f, decay, step);
            tensors[t] = (adamw_tensor){g_param[t], g_m[t], g_v[t], g_grad[t], sizes[t], decay,
                                        t % 3 == 0 ? g_bits[t] : NULL};
        }
        cr_assert_eq(k->adamw_update_tensors(tensors, COUNT, 6e-4f, 0.9f, 0.95f, 1e-8f, step), TP_OK, "%s",
                     tp_errmsg());
        for (int t = 0; t < COUNT; t++) k->release(g_grad[t]), free(grad[t]);
    }
    for (int t = 0; t < COUNT; t++) {
        check_device(k, g_param[t], param[t], sizes[t], 1e-6, 1e-12, "param");
        check_device(k, g_m[t], m[t], sizes[t], 1e-6, 1e-12, "m");
        check_device(k, g_v[t], v[t], sizes[t], 1e-6, 1e-12, "v");
        float *updated = download(k, g_param[t], sizes[t]);
        uint16_t *bits = download_bits(k, g_bits[t], sizes[t] + 1);
        if (t % 3 == 0)
            floats_assert_rounded(bits, updated, sizes[t], "param_bits (the updated values rounded)");
        for (int64_t i = t % 3 == 0 ? sizes[t] : 0; i <= sizes[t]; i++)
            cr_assert_eq(bits[i], 0x7777, "tensor %d: bf16 copy value %lld of %lld written (%s)", t, (long long)i,
                         (long long)sizes[t], t % 3 == 0 ? "past the tensor" : "no param_bits given");
        k->release(g_param[t]), k->release(g_m[t]), k->release(g_v[t]), k->release(g_bits[t]);
        free(param[t]), free(m[t]), free(v[t]), free(updated), free(bits), free(garbage_bits[t]);
    }
}

/* Squares of floats are exact in double; only the order of the additions
 * differs: tolerance 1e-10 relative. Spans: empty, within one block, and
 * more than the first pass's 1024 blocks of 256 cover at once; alone, and
 * all in one call (the partials of one span added to the next's). */
Test(cuda_backend, sum_of_squares)
{
    NEED_GPU();
    const kernel_backend *k = gpu();
    const int64_t sizes[] = {0, 37, (1 << 20) + 37};
    float *x[3], *g_x[3];
    for (int s = 0; s < 3; s++) {
        x[s] = floats_random(sizes[s], 3.0f), g_x[s] = upload_floats(k, x[s], sizes[s]);
        const float *host[] = {x[s]}, *device[] = {g_x[s]};
        double got = -1, want = sum_of_squares(host, &sizes[s], 1);
        cr_assert_eq(k->sum_of_squares(&got, device, &sizes[s], 1), TP_OK, "%s", tp_errmsg());
        cr_assert(fabs(got - want) <= 1e-10 * fabs(want), "n=%lld: CUDA %.17g, CPU %.17g", (long long)sizes[s], got,
                  want);
    }
    const float *host[] = {x[2], x[0], x[1], x[2]}, *device[] = {g_x[2], g_x[0], g_x[1], g_x[2]};
    const int64_t lengths[] = {sizes[2], sizes[0], sizes[1], sizes[2]};
    double got = -1, want = sum_of_squares(host, lengths, 4);
    cr_assert_eq(k->sum_of_squares(&got, device, lengths, 4), TP_OK, "%s", tp_errmsg());
    cr_assert(fabs(got - want) <= 1e-10 * fabs(want), "four spans: CUDA %.17g, CPU %.17g", got, want);
    cr_assert_eq(k->sum_of_squares(&got, device, lengths, 0), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(got, 0.0, "no span");
    for (int s = 0; s < 3; s++) k->release(g_x[s]), free(x[s]);
}
