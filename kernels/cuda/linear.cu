/* linear.cu: matrix products through cuBLAS (fp32, and bf16 operands summed
 * in fp32), the MLP's products with GELU (matmul_forward_gelu_bf16,
 * matmul_backward_gelu_bf16: GELU in cuBLASLt's epilogue, products_lt.cu,
 * where it takes the shape), the rounding of fp32 values to bf16 bits
 * (round_to_bf16: the bf16 copy of the weights, and every rounding of the
 * CUDA files) and the elementwise operations of cpu/linear.c (bias,
 * residual, add, scale) on the GPU. cuBLAS is loaded here, and its handle
 * made on the backend's stream (cuda_blas_start). */
#include <cublas_v2.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

extern "C" {
#include "../kernels.h"
}
#include "../convert_bits.h"
#include "column_sums.h"
#include "internal.h"
#include "launch.h"
#include "libraries.h"

#define TP_STRINGIFY_(x) #x
#define TP_STRINGIFY(x) TP_STRINGIFY_(x)

/* cublasGemmEx's C declaration (cublas_api.h). In C++ the header adds an
 * inline overload taking a cudaDataType compute type, so &cublasGemmEx
 * alone is ambiguous: the static_cast picks the exported function, and
 * fails to compile if the header's declaration differs from this type. */
typedef cublasStatus_t (*gemm_ex_fn)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                     const void *, const void *, cudaDataType, int, const void *, cudaDataType, int,
                                     const void *, void *, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);

/* cuBLAS, loaded when the backend is created (dlopen), not linked: its
 * libraries are over 500 MB, and a program linked with them pays about
 * 0.6 s and 200 MB at every start, on the CPU too. The functions used,
 * typed as cublas_v2.h declares them. */
static struct {
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    decltype(&cublasSetMathMode) set_math_mode;
    decltype(&cublasSgemm_v2) sgemm;
    decltype(static_cast<gemm_ex_fn>(&cublasGemmEx)) gemm_ex; /* the bf16 products */
    decltype(&cublasGetStatusName) status_name;
    decltype(&cublasGetStatusString) status_string;
} blas;

/* Loads cuBLAS once; fails naming what is missing. */
static int load_cublas(void)
{
    static const char *const names[] = {"libcublas.so." TP_STRINGIFY(CUBLAS_VER_MAJOR), "libcublas.so"};
    if (blas.sgemm) return TP_OK;
    void *library = NULL;
    TP_TRY(cuda_library_open("cuBLAS", names, sizeof names / sizeof names[0], &library, NULL, 0));
    const cuda_library_symbol symbols[] = {
        {"cublasCreate_v2", (void **)&blas.create},
        {"cublasDestroy_v2", (void **)&blas.destroy},
        {"cublasSetStream_v2", (void **)&blas.set_stream},
        {"cublasSetMathMode", (void **)&blas.set_math_mode},
        {"cublasGetStatusName", (void **)&blas.status_name},
        {"cublasGetStatusString", (void **)&blas.status_string},
        {"cublasGemmEx", (void **)&blas.gemm_ex},
        {"cublasSgemm_v2", (void **)&blas.sgemm}, /* last: it says that all are loaded */
    };
    return cuda_library_symbols(library, "cuBLAS", names[0], symbols, sizeof symbols / sizeof symbols[0]);
}

/* cuBLAS calls in the convention of CUDA_TRY (check.h): "file:line: call:
 * STATUS_NAME (cuBLAS's description)" as a TP_ERR_DEVICE failure, then the
 * function's `fail` label. */
#define CUBLAS_TRY(call)                                                                                               \
    do {                                                                                                               \
        cublasStatus_t cublas_try_status_ = (call);                                                                    \
        if (cublas_try_status_ != CUBLAS_STATUS_SUCCESS) {                                                             \
            tp_fail(TP_ERR_DEVICE, "%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call,                                    \
                    blas.status_name(cublas_try_status_), blas.status_string(cublas_try_status_));                     \
            goto fail;                                                                                                 \
        }                                                                                                              \
    } while (0)

static cublasHandle_t blas_handle; /* on cuda_state.stream (cuda_blas_start) */

int cuda_blas_start(void)
{
    TP_TRY(load_cublas());
    CUBLAS_TRY(blas.create(&blas_handle));
    CUBLAS_TRY(blas.set_stream(blas_handle, cuda_state.stream));
    /* Plain fp32 products: no TF32 tensor cores, so that results stay within
     * fp32 rounding of the CPU's (atomics stay off, cuBLAS's default). And a
     * bf16 C is the fp32 sum rounded once: split-K's partial sums are not
     * added in bf16 (cuBLAS's default allows it for reduced-precision
     * outputs, which would round each part and their sum). */
    CUBLAS_TRY(blas.set_math_mode(blas_handle,
                                  (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    return TP_OK;
fail:
    cuda_blas_stop();
    return TP_ERR_DEVICE;
}

void cuda_blas_stop(void)
{
    if (blas_handle) blas.destroy(blas_handle);
    blas_handle = NULL;
}

/* ========================================================= matrix products
 * cuBLAS is column-major: a row-major [R, K] array with row stride K is, read
 * column-major, its transpose, a K x R matrix with leading dimension K. So
 * each row-major product of linear.c is computed as its transpose:
 *
 *   forward   out[N,OC] = in[N,C] @ W[OC,C]^T
 *             column-major: out^T (OC x N, ld OC) = W^T^T (OC x C) . in^T (C x N)
 *             where W read column-major is W^T (C x OC, ld C), so op(A) = T,
 *             and in read column-major is in^T (C x N, ld C), op(B) = N:
 *             Sgemm(T, N, m=OC, n=N, k=C, A=W lda=C, B=in ldb=C, C=out ldc=OC)
 *   d_in      d_in[N,C] = d_out[N,OC] @ W[OC,C]
 *             column-major: d_in^T (C x N, ld C) = W^T (C x OC, ld C) . d_out^T (OC x N, ld OC):
 *             Sgemm(N, N, m=C, n=N, k=OC, A=W lda=C, B=d_out ldb=OC, beta 0, C=d_in ldc=C)
 *   d_weight  d_weight[OC,C] += d_out^T[OC,N] @ in[N,C]
 *             column-major: d_weight^T (C x OC, ld C) += in^T (C x N, ld C) . (d_out^T)^T (N x OC):
 *             Sgemm(N, T, m=C, n=OC, k=N, A=in lda=C, B=d_out ldb=OC, beta 1, C=d_weight ldc=C)
 *
 * Dimensions are int in cuBLAS's API: larger ones are refused. A product
 * with an empty inner dimension is a fill with zeros, done here (leading
 * dimensions of 0 are invalid in cuBLAS). */

static int fits_int(int64_t n)
{
    return n >= 0 && n <= INT32_MAX;
}

/* out[N,OC] += bias[OC] on every row. */
static __global__ void add_bias_kernel(float *out, const float *bias, int64_t N, int64_t OC)
{
    ROWS_AND_COLUMNS(n, c, N, OC) out[n * OC + c] += bias[c];
}

/* ===================================================== bf16 matrix products
 * The bf16 twins (matmul_forward_bf16, matmul_backward_bf16,
 * matmul_backward_bf16_bits; linear.c) are the same products of bf16
 * operands, each of which comes as bf16 bits and is read where it is, at any
 * even address: in[N,C] (a bf16 activation, kernels.h, rounded by the
 * operation that wrote it), W[OC,C] (the trainer's bf16 copy of its fp32
 * weights, rounded once after they change) and d_out[N,OC] (a bf16
 * gradient: gelu's or swiglu's bf16 d_in, the attention's or RoPE's bf16
 * d_qkv, the classifier's d_logits, and the residual stream's gradient as
 * the norms' backward rounds it beside the fp32 one); then cublasGemmEx with
 * bf16 A and B, fp32 C and CUBLAS_COMPUTE_32F: the products of bf16 values
 * are exact in fp32 and are summed in fp32 (tensor cores where cuBLAS picks
 * them; not TF32, which concerns fp32 operands only). Nothing is rounded
 * here before a product. The bias of a product written in fp32 stays fp32
 * (add_bias_kernel; one written in bf16 adds it rounded, round_bias). d_bias
 * is the fp32 column sums of the bf16 d_out (column_of_values<uint16_t>,
 * widened); the fp32 products' d_bias sums the fp32 d_out. One function per
 * direction serves every precision (matmul_forward_in, matmul_backward_in):
 * only the operands' type (operands), the product call (gemm) and the
 * output's type differ.
 *
 * matmul_backward_bf16_bits (kernels.h) writes d_in[N,C] as bf16 bits (the
 * gradient of the attention's output or of SwiGLU's, which the next bf16
 * operation reads as it is): cublasGemmEx with a bf16 C (CUDA_R_16BF) and
 * beta 0, at any even address, as matmul_forward_bf16_bits without a bias:
 * cuBLAS's fp32 sum rounded to nearest, ties to even, as it is stored. No
 * bias enters d_in, so there is no second route.
 *
 * matmul_forward_bf16_bits (kernels.h) is the forward bf16 product written
 * as a bf16 activation: out as the bits of rounding matmul_forward_bf16's
 * fp32 out with the bias rounded to bf16 (round_bias), added in fp32.
 * matmul_forward_in writes it (its out_bits): without a bias, cublasGemmEx
 * with a bf16 C (CUDA_R_16BF; the fp32 sum rounded to nearest, ties to
 * even, as it is stored); with one, cuBLASLt's bias epilogue with a bf16 D
 * and the bias's bf16 bits (products_lt.cu: the fp32 sum plus the bias,
 * then rounded) where it has an algorithm; elsewhere the plain product
 * cannot add the bias to bits (a bf16 C with beta 1 would add it to a
 * rounded sum), so matmul_forward_bf16's own fp32 route (product_with_bias:
 * its epilogue, or the product and add_bias_kernel, with the bias's rounded
 * values) writes the fp32 out to a second scratch (out_scratch, taken only
 * there, 256-byte aligned), and cuda_round_to_bf16 rounds it into out: the
 * bits of rounding what matmul_forward_bf16 writes to an aligned out given
 * the rounded bias, by construction. (A bf16 C or D holds the rounding of
 * the same fp32 sums where cuBLAS runs the same algorithm as for an fp32
 * one: the tests check that it does, bit for bit.)
 *
 * out_lock is held from the taking of out_scratch (a cuda_scratch,
 * launch.h) until the rounding that reads it is queued, so that another
 * thread cannot overwrite it in between (on the one stream, work queued
 * later runs later, so once queued it is safe). The lock covers only the
 * queueing, which is short: threads sharing the GPU are not held up by each
 * other's products. */

static cuda_scratch out_scratch; /* a bits product's fp32 out, where no epilogue adds its bias to a bf16 D */
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

/* The bias of a product written in bf16, which adds it rounded to bf16
 * (kernels.h), in bias_scratch: as bf16 bits, what cuBLASLt's epilogue
 * with a bf16 D takes (a bias of D's type: it refused an fp32 one on the
 * H200, 2026-11-28), and as the fp32 values of those bits, what the
 * separate ways add to fp32 sums (add_bias_kernel; GELU's fp32 sums).
 * bias[OC] is small (a layer's width): one launch. bias_lock is held by the caller
 * from the rounding until the last product reading them is queued; it is
 * taken before gelu_lock and out_lock, never after them. */
static cuda_scratch bias_scratch;
static pthread_mutex_t bias_lock = PTHREAD_MUTEX_INITIALIZER;

static __global__ void round_bias_kernel(uint16_t *bits, float *values, const float *bias, int64_t n)
{
    GRID_STRIDE(i, n)
    {
        const uint16_t rounded = bits_f32_to_bf16(__float_as_uint(bias[i]));
        bits[i] = rounded;
        values[i] = __uint_as_float(bits_bf16_to_f32(rounded));
    }
}

/* bias[OC] rounded into bias_scratch: *bits and *values (above); bias_lock held. */
static int round_bias(const float *bias, int64_t OC, uint16_t **bits, float **values)
{
    void *parts[2];
    const size_t bytes[2] = {(size_t)OC * sizeof(uint16_t), (size_t)OC * sizeof(float)};
    TP_TRY(cuda_scratch_parts(&bias_scratch, "a bf16 product's bias, rounded to bf16", parts, bytes, 2));
    *bits = (uint16_t *)parts[0];
    *values = (float *)parts[1];
    round_bias_kernel<<<blocks_for(OC, THREADS), THREADS, 0, cuda_state.stream>>>(*bits, *values, bias, OC);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* out[i] = the bf16 bits of in[i], rounded as the CPU rounds. */
static __global__ void round_bf16_kernel(uint16_t *out, const float *in, int64_t n)
{
    GRID_STRIDE(i, n) out[i] = bits_f32_to_bf16(__float_as_uint(in[i]));
}

/* The same four values a thread: one 16-byte load and one 8-byte store
 * (in 16-byte aligned, out 8-byte aligned; n a multiple of 4). A value a
 * thread, the kernel was bound by its instructions, not by memory (the
 * H200's profile: 63% of the SMs' issue, 27% of memory throughput); it
 * rounds every weight of the model after each step (the table's
 * round_to_bf16), the residual stream's gradients the output projections'
 * products read, and the fp32 outputs rounded after (the attention's, a
 * bits product's without an epilogue). */
static __global__ void round_bf16_quads_kernel(ushort4 *out, const float4 *in, int64_t quads)
{
    GRID_STRIDE(q, quads) {
        float4 v = in[q];
        ushort4 r;
        r.x = bits_f32_to_bf16(__float_as_uint(v.x));
        r.y = bits_f32_to_bf16(__float_as_uint(v.y));
        r.z = bits_f32_to_bf16(__float_as_uint(v.z));
        r.w = bits_f32_to_bf16(__float_as_uint(v.w));
        out[q] = r;
    }
}

/* The table's round_to_bf16 too (backend.cu), so an operation: ENTER.
 * Vectors (round_bf16_quads_kernel) from the first value where in is
 * 16-byte aligned, if out is 8-byte aligned there too, as where a bf16 copy
 * lies at the same value offset as its fp32 original in arrays that start
 * aligned (the few head values before, at most 3, and the tail after, a
 * value a thread); where the two do not meet so (out at any other even
 * address), or fewer than four values would be left, a value a thread
 * throughout. */
int cuda_round_to_bf16(uint16_t *out, const float *in, int64_t n)
{
    ENTER();
    if (n <= 0) return TP_OK;
    {
        int64_t head = (int64_t)((16 - (uintptr_t)in % 16) % 16 / sizeof(float)), quads = 0;
        if (head + 4 <= n && (uintptr_t)(in + head) % 16 == 0 && (uintptr_t)(out + head) % 8 == 0)
            quads = (n - head) / 4;
        else head = n; /* no vectors: every value a thread */
        int64_t tail = n - head - 4 * quads;
        if (head) {
            round_bf16_kernel<<<blocks_for(head, THREADS), THREADS, 0, cuda_state.stream>>>(out, in, head);
            LAUNCH_CHECK();
        }
        if (quads) {
            round_bf16_quads_kernel<<<blocks_for(quads, THREADS), THREADS, 0, cuda_state.stream>>>(
                (ushort4 *)(out + head), (const float4 *)(in + head), quads);
            LAUNCH_CHECK();
        }
        if (tail) {
            round_bf16_kernel<<<blocks_for(tail, THREADS), THREADS, 0, cuda_state.stream>>>(
                out + head + 4 * quads, in + head + 4 * quads, tail);
            LAUNCH_CHECK();
        }
    }
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* The operands of one call's products, read where they lie: fp32, or bf16
 * bits where bf16 (at any even address: gemm and cuda_lt_* take any). */
typedef struct {
    int bf16;
    const void *of[3];
} operands;

/* C (m x n, ld ldc) = op(A) . op(B) + beta C, column-major, A and B from o
 * (fp32, or bf16 summed in fp32); C fp32, or bf16 bits (c_bits: bf16
 * products alone, beta 0: the fp32 sum rounded as it is stored); dimensions
 * checked by the caller (int, nonzero). */
static int gemm(const operands *o, cublasOperation_t op_a, cublasOperation_t op_b, int64_t m, int64_t n, int64_t k,
                const void *A, int64_t lda, const void *B, int64_t ldb, float beta, void *C, int c_bits, int64_t ldc)
{
    const float one = 1.0f;
    if (c_bits && (!o->bf16 || beta != 0.0f))
        return tp_fail(TP_ERR_ARG, "CUDA product: a bf16 C goes with bf16 operands and beta 0 alone");
    if (o->bf16)
        CUBLAS_TRY(blas.gemm_ex(blas_handle, op_a, op_b, (int)m, (int)n, (int)k, &one, A, CUDA_R_16BF, (int)lda, B,
                                CUDA_R_16BF, (int)ldb, &beta, C, c_bits ? CUDA_R_16BF : CUDA_R_32F, (int)ldc,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    else
        CUBLAS_TRY(blas.sgemm(blas_handle, op_a, op_b, (int)m, (int)n, (int)k, &one, (const float *)A, (int)lda,
                              (const float *)B, (int)ldb, &beta, (float *)C, (int)ldc));
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* what: the operation's name in messages, its precision's suffix apart. */
static int dimensions_ok(const char *what, const char *suffix, int64_t N, int64_t C, int64_t OC)
{
    if (!fits_int(N) || !fits_int(C) || !fits_int(OC))
        return tp_fail(TP_ERR_ARG, "CUDA %s%s: N=%lld C=%lld OC=%lld beyond cuBLAS's int dimensions", what, suffix,
                       (long long)N, (long long)C, (long long)OC);
    return TP_OK;
}

/* out = in . W^T with no bias, as the product writes it (fp32, or bf16
 * bits: out_bits): zeros where C is 0 (cuBLAS takes no empty inner
 * dimension). */
static int product(const operands *o, void *out, int out_bits, int64_t N, int64_t C, int64_t OC)
{
    if (C == 0) {
        CUDA_TRY(cudaMemsetAsync(out, 0, (size_t)(N * OC) * (out_bits ? sizeof(uint16_t) : sizeof(float)),
                                 cuda_state.stream));
        return TP_OK;
    }
    return gemm(o, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, o->of[1], C, o->of[0], C, 0.0f, out, out_bits, OC);
fail:
    return TP_ERR_DEVICE;
}

/* out (fp32) = in . W^T + bias (bias not NULL): the bias in cuBLASLt's
 * epilogue where it has an algorithm for it, else the product, then the
 * bias added where it lies. */
static int product_with_bias(const operands *o, float *out, const float *bias, int64_t N, int64_t C, int64_t OC)
{
    int bias_added = 0;
    if (C > 0) TP_TRY(cuda_lt_forward_bias(o->bf16, 0, out, o->of[0], o->of[1], bias, N, C, OC, &bias_added));
    if (bias_added) return TP_OK;
    TP_TRY(product(o, out, 0, N, C, OC));
    add_bias_kernel<<<blocks_for(N, 1), THREADS, 0, cuda_state.stream>>>(out, bias, N, OC);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* out = in . W^T (+ bias): operands in and W (fp32, or bf16 bits when
 * bf16); out fp32, or bf16 bits (out_bits, bf16 alone:
 * matmul_forward_bf16_bits, the bits of rounding the fp32 out this writes
 * without out_bits). With out_bits, bias holds the bias's rounding to bf16
 * as fp32 values and bias_bits the same as bf16 bits (round_bias), for
 * cuBLASLt's epilogue with a bf16 D. */
static int matmul_forward_in(int bf16, void *out, int out_bits, const void *in, const void *weight, const float *bias,
                             const uint16_t *bias_bits, int64_t N, int64_t C, int64_t OC)
{
    if (out_bits && !bf16)
        return tp_fail(TP_ERR_ARG, "CUDA matmul_forward: an out of bf16 bits goes with bf16 products alone");
    if (out_bits && bias && !bias_bits)
        return tp_fail(TP_ERR_ARG, "CUDA matmul_forward_bf16_bits: the bias's bf16 bits are missing (round_bias)");
    TP_TRY(dimensions_ok("matmul_forward", out_bits ? "_bf16_bits" : bf16 ? "_bf16" : "", N, C, OC));
    ENTER();
    if (N == 0 || OC == 0) return TP_OK;
    {
        const operands o = {bf16, {in, weight, NULL}};
        if (!bias) return product(&o, out, out_bits, N, C, OC); /* fp32, or rounded as cuBLAS stores it (bf16 C) */
        if (!out_bits) return product_with_bias(&o, (float *)out, bias, N, C, OC);
        /* cuBLASLt's epilogue with a bf16 D, else the fp32 out in out_scratch, rounded */
        int bias_added = 0, status = TP_OK;
        if (C > 0) TP_TRY(cuda_lt_forward_bias(1, 1, out, in, weight, bias_bits, N, C, OC, &bias_added));
        if (bias_added) return TP_OK;
        void *wide = NULL;
        const size_t bytes = (size_t)(N * OC) * sizeof(float);
        pthread_mutex_lock(&out_lock);
        status = cuda_scratch_parts(&out_scratch, "bf16 product's fp32 out", &wide, &bytes, 1);
        if (!status) status = product_with_bias(&o, (float *)wide, bias, N, C, OC);
        if (!status) status = cuda_round_to_bf16((uint16_t *)out, (const float *)wide, N * OC);
        pthread_mutex_unlock(&out_lock);
        return status;
    }
fail:
    return TP_ERR_DEVICE;
}

/* GPT-2's MLP product with its GELU (kernels.h matmul_forward_gelu_bf16,
 * matmul_backward_gelu_bf16): GELU, or its gradient, in cuBLASLt's epilogue
 * of the product (products_lt.cu: GELU_AUX_BIAS or GELU_AUX forward, DGELU
 * on the backward's d_in product; what that saves is said there) where it
 * takes the shape; elsewhere (TP_CUDA_EPILOGUE=off, GELU's input not
 * 16-byte aligned, a leading dimension not a multiple of 8, no algorithm)
 * the separate way: the product's fp32 sums (the forward's out, or the
 * backward's d_in) into gelu_scratch, exactly what matmul_forward_bf16 (given
 * the bias rounded to bf16, round_bias) and matmul_backward_bf16 write, then one kernel forms GELU's value or
 * gradient from them and rounds it (and the forward's pre is their
 * rounding). The backward's d_in product is queued, either way, in
 * matmul_backward_in (product_through_gelu_backward), beside d_weight's
 * product and d_bias's sums of the same d_out as matmul_backward_bf16_bits
 * queues them. gelu_lock is held from taking gelu_scratch until the last
 * kernel reading it is queued; it is taken before out_lock, never after it. */
static cuda_scratch gelu_scratch;
static pthread_mutex_t gelu_lock = PTHREAD_MUTEX_INITIALIZER;

/* d_pre[N,C] = bf16(gelu'(pre) * d_in), d_in[N,C] = d_out . W the fp32
 * product of o's operands (d_out's bf16 operand o->of[0], W o->of[1]; not
 * read where OC is 0: d_in is then an empty sum, +0, and d_pre gelu'(pre)
 * times it, a signed zero as the CPU's): cuBLASLt's DGELU epilogue, else d_in
 * into gelu_scratch and GELU's backward kernel. gelu_lock held by the caller. */
static int product_through_gelu_backward(const operands *o, uint16_t *d_pre, const uint16_t *pre, int64_t N, int64_t C,
                                         int64_t OC)
{
    int fused = 0;
    void *sums = NULL;
    const size_t bytes = (size_t)(N * C) * sizeof(float);
    if (OC > 0)
        TP_TRY(cuda_lt_backward_dgelu(d_pre, (const uint16_t *)o->of[0], (const uint16_t *)o->of[1], pre, N, C, OC,
                                      &fused));
    if (fused) return TP_OK;
    TP_TRY(cuda_scratch_parts(&gelu_scratch, "the MLP product's fp32 input gradient", &sums, &bytes, 1));
    if (OC > 0) TP_TRY(gemm(o, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, o->of[1], C, o->of[0], OC, 0.0f, sums, 0, C));
    else CUDA_TRY(cudaMemsetAsync(sums, 0, bytes, cuda_state.stream));
    return cuda_gelu_backward_of_sums(d_pre, pre, (const float *)sums, N * C);
fail:
    return TP_ERR_DEVICE;
}

/* Operands d_out, W (read where d_in is asked for) and in (where d_weight
 * is): fp32, or bf16 bits when bf16. d_in: fp32, or bf16 bits (d_in_bits,
 * bf16 alone: matmul_backward_bf16_bits), or with gelu_pre (bf16 bits of
 * GELU's input [N,C], d_in_bits too: matmul_backward_gelu_bf16, OC > 0)
 * d_pre, the bits of gelu'(pre) times the fp32 d_in
 * (product_through_gelu_backward, gelu_lock held by the caller). */
static int matmul_backward_in(int bf16, void *d_in, int d_in_bits, const uint16_t *gelu_pre, float *d_weight,
                              float *d_bias, const void *d_out, const void *in, const void *weight, int64_t N,
                              int64_t C, int64_t OC)
{
    if (d_in_bits && !bf16)
        return tp_fail(TP_ERR_ARG, "CUDA matmul_backward: a d_in of bf16 bits goes with bf16 products alone");
    if (gelu_pre && (!d_in_bits || OC == 0))
        return tp_fail(TP_ERR_ARG, "CUDA matmul_backward: GELU's gradient goes with a bf16 d_in and OC > 0 alone");
    TP_TRY(dimensions_ok("matmul_backward", gelu_pre ? "_gelu_bf16" : d_in_bits ? "_bf16_bits" : bf16 ? "_bf16" : "",
                         N, C, OC));
    ENTER();
    if (N == 0) return TP_OK;
    if (d_in && C > 0 && OC == 0) /* an empty sum: +0, whose bf16 bits are 0 too */
        CUDA_TRY(cudaMemsetAsync(d_in, 0, (size_t)(N * C) * (d_in_bits ? sizeof(uint16_t) : sizeof(float)),
                                 cuda_state.stream));
    {
        const operands o = {bf16, {d_out, weight, in}};
        if (C > 0 && OC > 0 && d_in && gelu_pre) /* d_pre = gelu'(pre) * (d_out @ W), overwritten */
            TP_TRY(product_through_gelu_backward(&o, (uint16_t *)d_in, gelu_pre, N, C, OC));
        else if (C > 0 && OC > 0 && d_in) /* d_in = d_out @ W, overwritten (fp32, or rounded as stored) */
            TP_TRY(gemm(&o, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, weight, C, d_out, OC, 0.0f, d_in, d_in_bits, C));
        if (C > 0 && OC > 0 && d_weight) /* d_weight += d_out^T @ in */
            TP_TRY(gemm(&o, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, in, C, d_out, OC, 1.0f, d_weight, 0, C));
        if (d_bias && bf16) { /* the bf16 gradient, widened */
            const column_of_values<uint16_t> bits = {(const uint16_t *)d_out, OC};
            TP_TRY(column_sums<1>(d_bias, NULL, bits, N, OC));
        } else if (d_bias) { /* the fp32 products' fp32 d_out */
            const column_of_values<float> values = {(const float *)d_out, OC};
            TP_TRY(column_sums<1>(d_bias, NULL, values, N, OC));
        }
    }
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

int cuda_matmul_forward(float *out, const float *in, const float *weight, const float *bias, int64_t N,
                        int64_t C, int64_t OC)
{
    return matmul_forward_in(0, out, 0, in, weight, bias, NULL, N, C, OC);
}

int cuda_matmul_forward_bf16(float *out, const uint16_t *in, const uint16_t *weight, const float *bias, int64_t N,
                             int64_t C, int64_t OC)
{
    return matmul_forward_in(1, out, 0, in, weight, bias, NULL, N, C, OC);
}

/* The bias rounded to bf16 first (round_bias), under bias_lock. */
int cuda_matmul_forward_bf16_bits(uint16_t *out, const uint16_t *in, const uint16_t *weight, const float *bias,
                                  int64_t N, int64_t C, int64_t OC)
{
    if (!bias || N == 0 || OC == 0) return matmul_forward_in(1, out, 1, in, weight, NULL, NULL, N, C, OC);
    TP_TRY(dimensions_ok("matmul_forward", "_bf16_bits", N, C, OC));
    ENTER();
    {
        uint16_t *bias_bits = NULL;
        float *bias_values = NULL;
        pthread_mutex_lock(&bias_lock);
        int status = round_bias(bias, OC, &bias_bits, &bias_values);
        if (!status) status = matmul_forward_in(1, out, 1, in, weight, bias_values, bias_bits, N, C, OC);
        pthread_mutex_unlock(&bias_lock);
        return status;
    }
fail:
    return TP_ERR_DEVICE;
}

int cuda_matmul_backward(float *d_in, float *d_weight, float *d_bias, const float *d_out, const float *in,
                         const float *weight, int64_t N, int64_t C, int64_t OC)
{
    return matmul_backward_in(0, d_in, 0, NULL, d_weight, d_bias, d_out, in, weight, N, C, OC);
}

int cuda_matmul_backward_bf16(float *d_in, float *d_weight, float *d_bias, const uint16_t *d_out, const uint16_t *in,
                              const uint16_t *weight, int64_t N, int64_t C, int64_t OC)
{
    return matmul_backward_in(1, d_in, 0, NULL, d_weight, d_bias, d_out, in, weight, N, C, OC);
}

int cuda_matmul_backward_bf16_bits(uint16_t *d_in, float *d_weight, float *d_bias, const uint16_t *d_out,
                                   const uint16_t *in, const uint16_t *weight, int64_t N, int64_t C, int64_t OC)
{
    return matmul_backward_in(1, d_in, 1, NULL, d_weight, d_bias, d_out, in, weight, N, C, OC);
}

/* The fused way where cuBLASLt takes it (in and W read where they lie:
 * bits, nothing rounded; the bias
 * rounded under bias_lock, round_bias), else the separate way (above). */
int cuda_matmul_forward_gelu_bf16(uint16_t *out, uint16_t *pre, const uint16_t *in, const uint16_t *weight,
                                  const float *bias, int64_t N, int64_t C, int64_t OC)
{
    TP_TRY(dimensions_ok("matmul_forward", "_gelu_bf16", N, C, OC));
    ENTER();
    if (N == 0 || OC == 0) return TP_OK;
    {
        int fused = 0, status = TP_OK;
        uint16_t *bias_bits = NULL;
        float *bias_values = NULL; /* the bias rounded to bf16 (round_bias), under bias_lock */
        if (bias) {
            pthread_mutex_lock(&bias_lock);
            status = round_bias(bias, OC, &bias_bits, &bias_values);
        }
        if (!status && C > 0) status = cuda_lt_forward_gelu(out, pre, in, weight, bias_bits, N, C, OC, &fused);
        if (!status && !fused) {
            void *sums = NULL;
            const size_t bytes = (size_t)(N * OC) * sizeof(float);
            pthread_mutex_lock(&gelu_lock);
            status = cuda_scratch_parts(&gelu_scratch, "the MLP product's fp32 sums", &sums, &bytes, 1);
            if (!status) status = matmul_forward_in(1, sums, 0, in, weight, bias_values, NULL, N, C, OC);
            if (!status) status = cuda_gelu_forward_of_sums(out, pre, (const float *)sums, N * OC);
            pthread_mutex_unlock(&gelu_lock);
        }
        if (bias) pthread_mutex_unlock(&bias_lock);
        return status;
    }
fail:
    return TP_ERR_DEVICE;
}

/* d_pre through matmul_backward_in (product_through_gelu_backward),
 * d_weight and d_bias as matmul_backward_bf16_bits; OC = 0 (no product, an
 * empty d_in) the separate way alone. */
int cuda_matmul_backward_gelu_bf16(uint16_t *d_pre, float *d_weight, float *d_bias, const uint16_t *d_out,
                                   const uint16_t *in, const uint16_t *weight, const uint16_t *pre, int64_t N,
                                   int64_t C, int64_t OC)
{
    TP_TRY(dimensions_ok("matmul_backward", "_gelu_bf16", N, C, OC));
    if (!d_pre || N == 0 || C == 0)
        return matmul_backward_in(1, NULL, 0, NULL, d_weight, d_bias, d_out, in, weight, N, C, OC);
    ENTER();
    {
        pthread_mutex_lock(&gelu_lock);
        int status = OC > 0 ? matmul_backward_in(1, d_pre, 1, pre, d_weight, d_bias, d_out, in, weight, N, C, OC)
                            : product_through_gelu_backward(NULL, d_pre, pre, N, C, 0);
        pthread_mutex_unlock(&gelu_lock);
        return status;
    }
fail:
    return TP_ERR_DEVICE;
}

/* ============================================================ elementwise
 * Each element read and written by one thread: out may be any of the inputs
 * (the trainer computes residual_forward(x, x, ...) and
 * bias_residual_forward(p, x, p, ...)). */

static __global__ void residual_kernel(float *out, const float *a, const float *b, int64_t n)
{
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

static __global__ void bias_residual_kernel(float *out, const float *x, const float *partial, const float *bias,
                                            int64_t N, int64_t C)
{
    ROWS_AND_COLUMNS(n, c, N, C) {
        int64_t i = n * C + c;
        out[i] = x[i] + (partial[i] + bias[c]);
    }
}

static __global__ void add_kernel(float *acc, const float *x, int64_t n)
{
    GRID_STRIDE(i, n) acc[i] += x[i];
}

static __global__ void scale_kernel(float *x, float scale, int64_t n)
{
    GRID_STRIDE(i, n) x[i] *= scale;
}

int cuda_residual_forward(float *out, const float *a, const float *b, int64_t n)
{
    ENTER();
    if (n <= 0) return TP_OK;
    residual_kernel<<<blocks_for(n, THREADS), THREADS, 0, cuda_state.stream>>>(out, a, b, n);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

int cuda_bias_residual_forward(float *out, const float *x, const float *partial, const float *bias, int64_t N,
                               int64_t C)
{
    ENTER();
    if (N <= 0 || C <= 0) return TP_OK;
    bias_residual_kernel<<<blocks_for(N, 1), THREADS, 0, cuda_state.stream>>>(out, x, partial, bias, N, C);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

int cuda_add_inplace(float *acc, const float *x, int64_t n)
{
    ENTER();
    if (n <= 0) return TP_OK;
    add_kernel<<<blocks_for(n, THREADS), THREADS, 0, cuda_state.stream>>>(acc, x, n);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

int cuda_scale_inplace(float *x, float scale, int64_t n)
{
    ENTER();
    if (n <= 0) return TP_OK;
    scale_kernel<<<blocks_for(n, THREADS), THREADS, 0, cuda_state.stream>>>(x, scale, n);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}
