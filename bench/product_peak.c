/* product_peak: the peak rate of the matrix products this machine offers a
 * trainer, the denominator of bench-train's "CPU MFU": OpenBLAS's sgemm on
 * its own threads, and oneDNN's bf16 matmul (fp32 sums) as the CPU backend
 * runs it, where the CPU multiplies bf16 itself. Square products of SIZE, the best of a
 * few (bf16_gflops 0 where the CPU does not multiply bf16 itself); prints
 * one JSON object with the OpenBLAS kernel and oneDNN's ISA in use.
 *   product_peak THREADS [SIZE (default 2048)] */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../common/error.h"
#include "../kernels/cpu/bf16_products.h"
#include "../kernels/kernels.h"

char *openblas_get_corename(void);

static double seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* GFLOP/s of sgemm, the best of 5 after a warm-up. */
static double sgemm_rate(int n, const float *a, const float *b, float *c)
{
    double best = 0;
    for (int rep = 0; rep < 6; rep++) {
        double t0 = seconds();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double rate = 2.0 * n * n * n / (seconds() - t0) / 1e9;
        if (rep > 0 && rate > best) best = rate;
    }
    return best;
}

/* GFLOP/s of oneDNN's bf16 matmul with fp32 sums as the CPU backend runs
 * it (kernels/cpu/bf16_products.c: rows in blocks on its pool of threads;
 * a as the trainer's bf16 activations hold it, b as its bf16 copy of the
 * weights, both bits rounded once before: the product alone is timed), or
 * 0 where the CPU has no bf16 instructions. */
static double bf16_rate(int n, const uint16_t *a, const uint16_t *b, float *c)
{
    if (!bf16_products_available()) return 0;
    double best = 0;
    for (int rep = 0; rep < 6; rep++) {
        double t0 = seconds();
        if (matmul_forward_bf16(c, a, b, NULL, n, n, n) != TP_OK) {
            fprintf(stderr, "product_peak: %s\n", tp_errmsg());
            exit(1);
        }
        double rate = 2.0 * n * n * n / (seconds() - t0) / 1e9;
        if (rep > 0 && rate > best) best = rate;
    }
    return best;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 0, n = argc > 2 ? atoi(argv[2]) : 2048;
    if (argc < 2 || argc > 3 || threads < 1 || n < 16) {
        fprintf(stderr, "usage: product_peak THREADS [SIZE (default 2048)]\n");
        return 2;
    }
    kernels_set_threads(threads); /* the bf16 products' pool; it sets OpenBLAS to one thread */
    float *a = malloc((size_t)n * n * 4), *b = malloc((size_t)n * n * 4), *c = malloc((size_t)n * n * 4);
    uint16_t *a_bits = malloc((size_t)n * n * sizeof *a_bits), *b_bits = malloc((size_t)n * n * sizeof *b_bits);
    if (!a || !b || !c || !a_bits || !b_bits) {
        fprintf(stderr, "product_peak: out of memory for %d x %d products\n", n, n);
        return 1;
    }
    for (size_t i = 0; i < (size_t)n * n; i++) a[i] = b[i] = (float)(i % 7) * 0.125f;
    convert_from_f32(a, a_bits, TP_BF16, (int64_t)n * n);
    round_to_bf16(b_bits, b, (int64_t)n * n); /* as the trainer rounds its weights, once, outside the timing */
    double bf16 = bf16_rate(n, a_bits, b_bits, c);
    openblas_set_num_threads(threads);
    double sgemm = sgemm_rate(n, a, b, c);
    printf("{\"threads\": %d, \"size\": %d, \"openblas_core\": \"%s\", \"onednn_isa\": \"%s\", \"sgemm_gflops\": %.1f, "
           "\"bf16_gflops\": %.1f}\n",
           threads, n, openblas_get_corename(), onednn_isa_name(), sgemm, bf16);
    free(a), free(b), free(c), free(a_bits), free(b_bits);
    return 0;
}
