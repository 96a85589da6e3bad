/* products_lt.cu: products with work in cuBLASLt's epilogue, where it
 * saves a pass over an activation:
 *
 * BIAS: the forward product with its bias added (CUBLASLT_EPILOGUE_BIAS),
 * for matmul_forward, matmul_forward_bf16 and matmul_forward_bf16_bits
 * (linear.cu).
 *
 * Why: out[N,OC] = in . W^T + bias as a product then add_bias_kernel
 * writes out, then reads and writes it again: for GPT-2 124M at micro-batch
 * 4 that second pass is about 2 GB a step (the qkv and fc products of 12
 * layers). In the epilogue the bias is added to the fp32 sum before the one
 * write, rounding once as add_bias_kernel's addition does; the sum itself
 * may come from another algorithm than cublasGemmEx picks (another order of
 * additions: last bits, as between any two of cuBLAS's algorithms). With a
 * bf16 D (matmul_forward_bf16_bits' out, bf16 bits) the epilogue's math is
 * the same, in fp32, with a bf16 bias (D's type: cuBLASLt refused an fp32
 * bias with a bf16 D on the H200, "heuristic INVALID_VALUE", 2026-11-28;
 * linear.cu rounds the bias, as kernels.h has a product written in bf16
 * add it), and its result is rounded to bf16 as it is stored, once: split-K's partial sums are kept to algorithms
 * that add them in fp32 (not in D's type). Its plan is its own (the
 * heuristic may pick another algorithm than for an fp32 D: the same sum in
 * another order). The plans are kept per type of D as well.
 *
 * GELU: GPT-2's MLP fc product and its GELU (matmul_forward_gelu_bf16,
 * kernels.h), CUBLASLT_EPILOGUE_GELU_AUX_BIAS (GELU_AUX without a bias):
 * the fp32 sum plus the bias (bf16, D's type, as BIAS's with a bf16 D) is
 * GELU's input; the epilogue stores it
 * rounded to bf16 in the aux matrix (pre[N,OC], what the backward reads)
 * and GELU of it, in fp32 and rounded once, in D (out[N,OC], what the
 * output projection reads). Layouts as BIAS's, D bf16 (so split-K's sums in
 * fp32 as there), the aux matrix OC x N with ld OC. cuBLASLt's GELU is the
 * tanh form that gelu_forward computes (PyTorch's _addmm_activation, which
 * calls this epilogue, matches its gelu "tanh" by it), its tanh perhaps the
 * hardware's approximation: a bf16 ulp apart here and there, as kernels.h
 * allows (the tests say how far).
 *
 * DGELU: the backward of the MLP's output projection and of GELU
 * (matmul_backward_gelu_bf16), CUBLASLT_EPILOGUE_DGELU on its d_in product:
 * d_in^T (C x N, ld C) = W (op N: C x OC, ld C) . d_out^T (OC x N, ld OC),
 * d_out the bf16 operand (the residual stream's gradient's bits),
 * the aux matrix pre (GELU's input, bf16, C x N, ld C): D = d_pre (bf16, ld
 * C) = gelu'(pre) times the fp32 sum, rounded once (split-K's parts summed
 * in fp32 before the epilogue multiplies: an algorithm that rounded them to
 * D's type first would round twice). d_weight and d_bias stay linear.cu's
 * (the bias gradient's column sums of d_out's values; not a BGRAD
 * epilogue, whose sums would be cuBLASLt's, in another order than the
 * other products' d_bias).
 *
 * Why the GELU ones: per GPT-2 124M layer at micro-batch 4 (N = 4096 rows,
 * fc width 3072, bf16: 25 MB an activation), against the operations the
 * trainer ran before (matmul_forward_bf16_bits then a bf16 GELU's kernel;
 * matmul_backward_bf16_bits then GELU's backward kernel) the forward saves
 * GELU's separate read of pre (25 MB) and a launch, the backward the
 * writing and reading of the bf16 gradient of GELU's output (50 MB) and a
 * launch: about 75 MB a layer, 0.9 GB a step of 12 layers, about 0.3-0.4 ms
 * a step on an H100 (predicted from its memory bandwidth, not measured: no
 * GPU yet). Against linear.cu's separate way (the fp32 sums through a
 * scratch, 50 MB written and read again) about 250 MB a layer.
 *
 * The aux matrix (cublasLt.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
 * _AUX_LD, _AUX_DATA_TYPE): its pointer "requires setting
 * CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD", and the heuristic "depend[s] on its
 * value to determine expected pointer alignment" (so its alignment is part
 * of a plan's key, as the bias's); the GELU input's leading dimension "must
 * be divisible by 8 and be no less than the number of rows in the output
 * matrix" (ld = those rows here: OC forward, C backward; refused otherwise);
 * its type, unset, "defaults to the type of elements of the output matrix"
 * (bf16, D's: pre's type; AUX_DATA_TYPE is left unset, since setting it
 * for a combination cuBLASLt does not take makes cublasLtMatmul return
 * INVALID_VALUE). The aux pointer is also refused below 16-byte alignment,
 * as the bias is (below), and d_pre in place of pre (cublasLt.h does not
 * say that D may be the aux input).
 *
 * cuBLASLt comes with cuBLAS (libcublas.so needs libcublasLt.so) and is
 * loaded the same way, when the backend starts. A plan (the descriptors
 * and the algorithm cuBLASLt's heuristic picks) is made once per shape and
 * per alignment of each pointer (cuBLASLt's algorithms assume 256-byte
 * alignment unless told less; the trainer's arrays are carved from larger
 * ones at float offsets, and the bf16 product's in and W, a bf16 activation
 * and the trainer's bf16 copy of a weight, both read where they lie, may be
 * only 2-byte aligned, each on its own), and kept for the process.
 * Where cuBLASLt offers no algorithm for a shape, that is remembered too
 * (with the reason: note_refusal), and the caller goes the separate way
 * (the product, then the bias kernel, or GELU's); so too where the bias is
 * not 16-byte aligned: cuBLASLt has no preference for
 * the bias's alignment, and its epilogues have been seen to fault on a less
 * aligned one ("misaligned address", which ends the CUDA context: PyTorch,
 * Marian and llm.c met it). */
#include <cublasLt.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "../kernels.h"
}
#include "internal.h"
#include "launch.h"
#include "libraries.h"
#include "products_lt.h"

#define TP_STRINGIFY_(x) #x
#define TP_STRINGIFY(x) TP_STRINGIFY_(x)

#define LT_WORKSPACE_BYTES ((size_t)32 << 20) /* cuBLASLt's advice for Hopper: 32 MiB */
#define LT_MAX_PLANS 64                        /* epilogues x shapes x alignments; a model has a handful */
#define LT_MIN_ALIGNMENT 16                    /* of the bias and of the aux matrix, in bytes (above) */
#define LT_AUX_LD_MULTIPLE 8                   /* cublasLt.h, EPILOGUE_AUX_LD: "divisible by 8" */

static struct {
    decltype(&cublasLtCreate) create;
    decltype(&cublasLtDestroy) destroy;
    decltype(&cublasLtMatmulDescCreate) desc_create;
    decltype(&cublasLtMatmulDescDestroy) desc_destroy;
    decltype(&cublasLtMatmulDescSetAttribute) desc_set;
    decltype(&cublasLtMatrixLayoutCreate) layout_create;
    decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
    decltype(&cublasLtMatmulPreferenceCreate) preference_create;
    decltype(&cublasLtMatmulPreferenceDestroy) preference_destroy;
    decltype(&cublasLtMatmulPreferenceSetAttribute) preference_set;
    decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
    decltype(&cublasLtGetStatusName) status_name;
    decltype(&cublasLtGetStatusString) status_string;
    decltype(&cublasLtMatmul) matmul;
} lt;

static int load_cublas_lt(void)
{
    static const char *const names[] = {"libcublasLt.so." TP_STRINGIFY(CUBLAS_VER_MAJOR), "libcublasLt.so"};
    if (lt.matmul) return TP_OK;
    void *library = NULL;
    TP_TRY(cuda_library_open("cuBLASLt", names, sizeof names / sizeof names[0], &library, NULL, 0));
    const cuda_library_symbol symbols[] = {
        {"cublasLtCreate", (void **)&lt.create},
        {"cublasLtDestroy", (void **)&lt.destroy},
        {"cublasLtMatmulDescCreate", (void **)&lt.desc_create},
        {"cublasLtMatmulDescDestroy", (void **)&lt.desc_destroy},
        {"cublasLtMatmulDescSetAttribute", (void **)&lt.desc_set},
        {"cublasLtMatrixLayoutCreate", (void **)&lt.layout_create},
        {"cublasLtMatrixLayoutDestroy", (void **)&lt.layout_destroy},
        {"cublasLtMatmulPreferenceCreate", (void **)&lt.preference_create},
        {"cublasLtMatmulPreferenceDestroy", (void **)&lt.preference_destroy},
        {"cublasLtMatmulPreferenceSetAttribute", (void **)&lt.preference_set},
        {"cublasLtMatmulAlgoGetHeuristic", (void **)&lt.heuristic},
        {"cublasLtGetStatusName", (void **)&lt.status_name},
        {"cublasLtGetStatusString", (void **)&lt.status_string},
        {"cublasLtMatmul", (void **)&lt.matmul}, /* last: it says that all are loaded */
    };
    return cuda_library_symbols(library, "cuBLASLt", names[0], symbols, sizeof symbols / sizeof symbols[0]);
}

/* cuBLASLt calls in the convention of CUDA_TRY (check.h). */
#define LT_TRY(call)                                                                                                   \
    do {                                                                                                               \
        cublasStatus_t lt_try_status_ = (call);                                                                        \
        if (lt_try_status_ != CUBLAS_STATUS_SUCCESS) {                                                                 \
            tp_fail(TP_ERR_DEVICE, "%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call, lt.status_name(lt_try_status_),   \
                    lt.status_string(lt_try_status_));                                                                 \
            goto fail;                                                                                                 \
        }                                                                                                              \
    } while (0)

/* Which epilogue a plan's product runs (the top of this file): the
 * forward bias; the forward GELU, its input kept in the aux matrix (with
 * the bias, GELU_AUX_BIAS, or without, GELU_AUX); GELU's gradient on the
 * backward's d_in product (DGELU). */
typedef enum { EPILOGUE_BIAS, EPILOGUE_GELU, EPILOGUE_DGELU } epilogue_kind;

/* The key of a plan: the epilogue (kind, and whether it adds a bias),
 * precision, D's type (fp32, or bf16 bits: out_bits), the operation's shape
 * N, C, OC, and the alignment in bytes (a power of two, at most 256) of
 * each array, each its own, 0 where there is none: in (B: the forward's in,
 * DGELU's d_out operand), W (A), out (C and D: out, or d_pre), bias and aux
 * (pre). */
typedef struct {
    epilogue_kind kind;
    int has_bias, bf16, out_bits;
    int64_t N, C, OC;
    unsigned align_in, align_weight, align_out, align_bias, align_aux;
} plan_key;

typedef struct {
    plan_key key;
    int usable; /* 0: cuBLASLt offered no algorithm; the caller goes the separate way */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t layout_weight, layout_in, layout_out;
    cublasLtMatmulAlgo_t algo;
    size_t workspace_bytes;
} plan;

static struct {
    cublasLtHandle_t handle;
    void *workspace; /* device, LT_WORKSPACE_BYTES; in stream order, so one for every product */
    plan plans[LT_MAX_PLANS];
    int num_plans;
    int64_t epilogue_products;      /* cuda_lt_bias_epilogue_products */
    int64_t epilogue_bits_products; /* cuda_lt_bias_epilogue_bits_products: those with a bf16 D */
    int64_t gelu_products;          /* cuda_lt_gelu_epilogue_products */
    int64_t dgelu_products;         /* cuda_lt_dgelu_epilogue_products */
    char refusal[320];              /* cuda_lt_last_refusal */
} state;
/* The plans, and each plan's bias and aux pointers from setting them to
 * queueing the product (the descriptor holds them). */
static pthread_mutex_t plans_lock = PTHREAD_MUTEX_INITIALIZER;

static int same_key(const plan_key *a, const plan_key *b)
{
    return a->kind == b->kind && a->has_bias == b->has_bias && a->bf16 == b->bf16 && a->out_bits == b->out_bits &&
           a->N == b->N && a->C == b->C && a->OC == b->OC && a->align_in == b->align_in &&
           a->align_weight == b->align_weight && a->align_out == b->align_out && a->align_bias == b->align_bias &&
           a->align_aux == b->align_aux;
}

/* 0 for NULL: no such array. */
static unsigned alignment_of(const void *p)
{
    uintptr_t address = (uintptr_t)p;
    unsigned alignment = 256;
    if (!p) return 0;
    while (alignment > 1 && address % alignment) alignment /= 2;
    return alignment;
}

/* The rows of B (the product's inner dimension) and of D (and of the aux
 * matrix, whose leading dimension is this): the forward's C and OC, the
 * backward's OC and C. */
static int64_t inner_of(const plan_key *k)
{
    return k->kind == EPILOGUE_DGELU ? k->OC : k->C;
}

static int64_t rows_of(const plan_key *k)
{
    return k->kind == EPILOGUE_DGELU ? k->C : k->OC;
}

static cublasLtEpilogue_t epilogue_of(const plan_key *k)
{
    switch (k->kind) {
    case EPILOGUE_GELU:
        return k->has_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    case EPILOGUE_DGELU:
        return CUBLASLT_EPILOGUE_DGELU;
    default:
        return CUBLASLT_EPILOGUE_BIAS;
    }
}

static const char *epilogue_name(const plan_key *k)
{
    switch (k->kind) {
    case EPILOGUE_GELU:
        return k->has_bias ? "GELU_AUX_BIAS" : "GELU_AUX";
    case EPILOGUE_DGELU:
        return "DGELU";
    default:
        return "bias";
    }
}

/* Whether cuBLASLt's status refuses a configuration (no algorithm for it),
 * not a failure: NOT_SUPPORTED, and for a bf16 D (out_bits: every GELU
 * product, and the bits product's bias) INVALID_VALUE too, which an fp32
 * bias with it gave (cublasLt.h: a bias is D's type but for a few
 * exceptions; the bias is bf16 with a bf16 D now), or an aux matrix of
 * D's type that this cuBLASLt does not take (cublasLt.h,
 * EPILOGUE_AUX_DATA_TYPE: "calling cublasLtMatmul() will return
 * CUBLAS_INVALID_VALUE"). The caller then takes its own way. */
static int refused(cublasStatus_t status, int out_bits)
{
    return status == CUBLAS_STATUS_NOT_SUPPORTED || (out_bits && status == CUBLAS_STATUS_INVALID_VALUE);
}

static void plan_release(plan *p)
{
    if (p->layout_out) lt.layout_destroy(p->layout_out);
    if (p->layout_in) lt.layout_destroy(p->layout_in);
    if (p->layout_weight) lt.layout_destroy(p->layout_weight);
    if (p->desc) lt.desc_destroy(p->desc);
    memset(p, 0, sizeof *p);
}

/* Why the epilogue was not taken for `key`'s product (cuda_lt_last_refusal). */
static void note_refusal(const plan_key *key, const char *why)
{
    snprintf(state.refusal, sizeof state.refusal, "cuBLASLt %s epilogue, %s N=%lld C=%lld OC=%lld%s: %s",
             epilogue_name(key), key->bf16 ? "bf16" : "fp32", (long long)key->N, (long long)key->C,
             (long long)key->OC, key->out_bits ? " (bf16 D)" : "", why);
}

/* Builds the plan of p->key, column-major as linear.cu's products:
 *   forward (BIAS, GELU): out^T (OC x N, ld OC) = W^T^T (op T of W read as
 *     C x OC, ld C) . in^T (C x N, ld C), the bias a vector of OC, one per
 *     row of out^T; the aux matrix (GELU) pre^T, OC x N, ld OC;
 *   backward (DGELU): d_pre^T (C x N, ld C) = W (op N, C x OC, ld C) .
 *     d_out^T (OC x N, ld OC); the aux matrix pre^T, C x N, ld C.
 * C and D are out, fp32 or bf16, and the bias D's type. usable 0 when the
 * heuristic offers nothing, and when cuBLASLt refuses a descriptor or the heuristic fails: the
 * product is then computed without the epilogue, as where it offers
 * nothing, and the reason kept for cuda_lt_last_refusal (a slower way, not
 * a wrong one: the tests count the epilogue's products and say why it did
 * not run). bias and aux are the call's (NULL where the key has none): the
 * heuristic reads their alignment from them. */
static void refuse_plan(plan *p, const char *why)
{
    plan_key key = p->key;
    plan_release(p);
    p->key = key; /* remembered as not usable */
    note_refusal(&key, why);
}

static int plan_build(plan *p, const void *bias, const void *aux)
{
    const plan_key *k = &p->key;
    cudaDataType operand = k->bf16 ? CUDA_R_16BF : CUDA_R_32F, result = k->out_bits ? CUDA_R_16BF : CUDA_R_32F;
    cublasOperation_t op_weight = k->kind == EPILOGUE_DGELU ? CUBLAS_OP_N : CUBLAS_OP_T, keep = CUBLAS_OP_N;
    uint32_t epilogue = epilogue_of(k);
    int32_t bias_type = result; /* D's type: a bf16 D's bias is bf16 (the caller's rounding of its fp32 bias) */
    int64_t inner = inner_of(k), rows = rows_of(k);
    uint64_t workspace_limit = LT_WORKSPACE_BYTES;
    cublasLtMatmulPreference_t preference = NULL;
    cublasLtMatmulHeuristicResult_t found;
    cublasStatus_t heuristic = CUBLAS_STATUS_SUCCESS;
    int count = 0;
    /* fp32 sums, fp32 alpha and beta: for fp32 operands plain fp32 (not
     * TF32), as cuBLAS's products here. */
    LT_TRY(lt.desc_create(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_TRY(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_weight, sizeof op_weight));
    LT_TRY(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep));
    LT_TRY(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    if (k->has_bias) {
        LT_TRY(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
        /* The heuristic reads the bias pointer's alignment from it. */
        LT_TRY(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    if (aux) { /* GELU's input: bf16 as D (the type left unset), ld the rows of D (the top of this file) */
        LT_TRY(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
        LT_TRY(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &rows, sizeof rows));
    }
    LT_TRY(lt.layout_create(&p->layout_weight, operand, (uint64_t)k->C, (uint64_t)k->OC, k->C));
    LT_TRY(lt.layout_create(&p->layout_in, operand, (uint64_t)inner, (uint64_t)k->N, inner));
    LT_TRY(lt.layout_create(&p->layout_out, result, (uint64_t)rows, (uint64_t)k->N, rows));
    LT_TRY(lt.preference_create(&preference));
    LT_TRY(lt.preference_set(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_limit,
                             sizeof workspace_limit));
    LT_TRY(lt.preference_set(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &k->align_weight,
                             sizeof k->align_weight));
    LT_TRY(lt.preference_set(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &k->align_in,
                             sizeof k->align_in));
    LT_TRY(lt.preference_set(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &k->align_out,
                             sizeof k->align_out));
    LT_TRY(lt.preference_set(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &k->align_out,
                             sizeof k->align_out));
    if (k->out_bits) { /* a bf16 D is the fp32 sum rounded once: split-K's parts summed in fp32, not in D's type */
        uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        LT_TRY(lt.preference_set(preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes));
    }
    heuristic = lt.heuristic(state.handle, p->desc, p->layout_weight, p->layout_in, p->layout_out, p->layout_out,
                             preference, 1, &found, &count);
    /* NOT_SUPPORTED: no algorithm for this configuration, as count 0 is;
     * for a bf16 D, INVALID_VALUE too (refused, above). */
    if (heuristic != CUBLAS_STATUS_SUCCESS && !refused(heuristic, k->out_bits)) LT_TRY(heuristic);
    lt.preference_destroy(preference);
    preference = NULL;
    if (heuristic != CUBLAS_STATUS_SUCCESS || count < 1 || found.state != CUBLAS_STATUS_SUCCESS ||
        found.workspaceSize > LT_WORKSPACE_BYTES) {
        char why[160];
        snprintf(why, sizeof why, "no algorithm (heuristic %s, %d found, state %s, workspace %zu of %zu bytes)",
                 lt.status_name(heuristic), count, count > 0 ? lt.status_name(found.state) : "-",
                 count > 0 ? found.workspaceSize : (size_t)0, LT_WORKSPACE_BYTES);
        refuse_plan(p, why);
        return TP_OK;
    }
    p->algo = found.algo;
    p->workspace_bytes = found.workspaceSize;
    p->usable = 1;
    return TP_OK;
fail:
    if (preference) lt.preference_destroy(preference);
    refuse_plan(p, tp_errmsg());
    return TP_OK;
}

/* The plan for key, built when first asked for (plans_lock held); NULL
 * with *status TP_OK when the table is full (the caller goes the separate
 * way: a process with more shapes than LT_MAX_PLANS is not a model's). */
static plan *plan_for(const plan_key *key, const void *bias, const void *aux, int *status)
{
    *status = TP_OK;
    for (int i = 0; i < state.num_plans; i++)
        if (same_key(&state.plans[i].key, key)) return &state.plans[i];
    if (state.num_plans == LT_MAX_PLANS) return NULL;
    plan *p = &state.plans[state.num_plans];
    memset(p, 0, sizeof *p);
    p->key = *key;
    if ((*status = plan_build(p, bias, aux))) return NULL;
    state.num_plans++;
    return p;
}

int cuda_lt_start(void)
{
    /* TP_CUDA_EPILOGUE=off sets every epilogue aside (the separate bias
     * kernel for every product, and GELU's kernels beside the MLP's
     * products): a switch for a GPU session that finds one at fault, as
     * TP_CUDA_ATTENTION is for attention. */
    const char *choice = getenv("TP_CUDA_EPILOGUE");
    if (choice && *choice && strcmp(choice, "on") && strcmp(choice, "off"))
        return tp_fail(TP_ERR_ARG, "TP_CUDA_EPILOGUE: '%s' is neither on nor off", choice);
    if (choice && !strcmp(choice, "off")) return TP_OK;
    TP_TRY(load_cublas_lt());
    LT_TRY(lt.create(&state.handle));
    CUDA_TRY(cudaMalloc(&state.workspace, LT_WORKSPACE_BYTES));
    return TP_OK;
fail:
    cuda_lt_stop();
    return TP_ERR_DEVICE;
}

void cuda_lt_stop(void)
{
    pthread_mutex_lock(&plans_lock);
    for (int i = 0; i < state.num_plans; i++) plan_release(&state.plans[i]);
    state.num_plans = 0;
    if (state.workspace) cudaFree(state.workspace);
    state.workspace = NULL;
    if (state.handle) lt.destroy(state.handle);
    state.handle = NULL;
    pthread_mutex_unlock(&plans_lock);
}

/* Why key's arrays are refused before any plan (the top of this file), in
 * why; "" where they are not. */
static void refusal_of_arrays(const plan_key *key, const void *out, const void *aux, char *why, size_t size)
{
    why[0] = '\0';
    if (key->has_bias && key->align_bias < LT_MIN_ALIGNMENT)
        snprintf(why, size, "the bias %u-byte aligned (%d needed)", key->align_bias, LT_MIN_ALIGNMENT);
    else if (aux && key->align_aux < LT_MIN_ALIGNMENT)
        snprintf(why, size, "GELU's input (the aux matrix) %u-byte aligned (%d needed)", key->align_aux,
                 LT_MIN_ALIGNMENT);
    else if (aux && rows_of(key) % LT_AUX_LD_MULTIPLE)
        snprintf(why, size, "GELU's input's leading dimension %lld not a multiple of %d (cublasLt.h, EPILOGUE_AUX_LD)",
                 (long long)rows_of(key), LT_AUX_LD_MULTIPLE);
    else if (aux && aux == out)
        snprintf(why, size, "D in place of its aux input (cublasLt.h does not say that it may be)");
    else if ((key->kind == EPILOGUE_GELU || key->out_bits) && key->align_out < LT_MIN_ALIGNMENT)
        /* Measured (H200, CUDA 13.0, 2026-11-28: test_cuda_backend's
         * mlp_product_and_gelu_in_one): the algorithm the heuristic gives a
         * D 2 bytes past alignment wrote GELU a bf16 ulp off the fp32 GELU's
         * rounding in 220 of 8192 values, up to 2^-9 of the value, beyond
         * the tanh approximation's 2^-11 that an aligned D stayed within.
         * Every bf16 D so placed is refused alike (the bias epilogue's and
         * DGELU's too, which no GPU has run there since the bias became
         * bf16): the separate way rounds once, exactly, and the trainer's
         * activations start aligned, so it costs nothing there. */
        snprintf(why, size, "%s output (D) %u-byte aligned (%d needed: its algorithm there is less exact)",
                 key->kind == EPILOGUE_GELU ? "GELU's" : "a bf16", key->align_out, LT_MIN_ALIGNMENT);
}

/* Queues key's product with its epilogue: out = op(weight) . in, with the
 * bias (NULL where the key has none) and the aux matrix (NULL for BIAS);
 * *done 1 where queued, else 0 with nothing queued and the reason noted. */
static int lt_product(const plan_key *key, void *out, const void *in, const void *weight, const void *bias,
                      const void *aux, int *done)
{
    const float one = 1.0f, zero = 0.0f;
    char why[160];
    *done = 0;
    if (!state.handle) return TP_OK; /* TP_CUDA_EPILOGUE=off: the separate way */
    refusal_of_arrays(key, out, aux, why, sizeof why);
    if (why[0]) {
        pthread_mutex_lock(&plans_lock);
        note_refusal(key, why);
        pthread_mutex_unlock(&plans_lock);
        return TP_OK;
    }
    pthread_mutex_lock(&plans_lock);
    int status = TP_OK;
    plan *p = plan_for(key, bias, aux, &status);
    if (!status && p && p->usable) {
        if (bias) LT_TRY(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        if (aux) LT_TRY(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
        cublasStatus_t ran = lt.matmul(state.handle, p->desc, &one, weight, p->layout_weight, in, p->layout_in, &zero,
                                       out, p->layout_out, out, p->layout_out, &p->algo, state.workspace,
                                       p->workspace_bytes, cuda_state.stream);
        /* Refused at the call (a bias or an aux type, which cublasLt.h's
         * type rules may refuse only here): nothing was
         * queued; the plan is set aside and the caller's own way runs. */
        if (refused(ran, key->out_bits)) {
            char at_call[96];
            p->usable = 0;
            snprintf(at_call, sizeof at_call, "%s at the call", lt.status_name(ran));
            note_refusal(&p->key, at_call);
        } else {
            LT_TRY(ran);
        }
        *done = p->usable;
        if (p->usable && key->kind == EPILOGUE_BIAS) state.epilogue_products++;
        if (p->usable && key->kind == EPILOGUE_BIAS && key->out_bits) state.epilogue_bits_products++;
        if (p->usable && key->kind == EPILOGUE_GELU) state.gelu_products++;
        if (p->usable && key->kind == EPILOGUE_DGELU) state.dgelu_products++;
    }
    pthread_mutex_unlock(&plans_lock);
    return status;
fail:
    pthread_mutex_unlock(&plans_lock);
    return TP_ERR_DEVICE;
}

/* The key of a product: kind, precision, D's type, shape, and each array's
 * alignment (0 for those it has not: NULL). */
static plan_key key_of(epilogue_kind kind, int bf16, int out_bits, int64_t N, int64_t C, int64_t OC, const void *in,
                       const void *weight, const void *out, const void *bias, const void *aux)
{
    plan_key key = {kind,
                    bias != NULL,
                    bf16,
                    out_bits,
                    N,
                    C,
                    OC,
                    alignment_of(in),
                    alignment_of(weight),
                    alignment_of(out),
                    alignment_of(bias),
                    alignment_of(aux)};
    return key;
}

int cuda_lt_forward_bias(int bf16, int out_bits, void *out, const void *in, const void *weight, const void *bias,
                         int64_t N, int64_t C, int64_t OC, int *done)
{
    const plan_key key = key_of(EPILOGUE_BIAS, bf16, out_bits, N, C, OC, in, weight, out, bias, NULL);
    return lt_product(&key, out, in, weight, bias, NULL, done);
}

int cuda_lt_forward_gelu(uint16_t *out, uint16_t *pre, const uint16_t *in, const uint16_t *weight,
                         const uint16_t *bias, int64_t N, int64_t C, int64_t OC, int *done)
{
    const plan_key key = key_of(EPILOGUE_GELU, 1, 1, N, C, OC, in, weight, out, bias, pre);
    return lt_product(&key, out, in, weight, bias, pre, done);
}

int cuda_lt_backward_dgelu(uint16_t *d_pre, const uint16_t *d_out, const uint16_t *weight, const uint16_t *pre,
                           int64_t N, int64_t C, int64_t OC, int *done)
{
    const plan_key key = key_of(EPILOGUE_DGELU, 1, 1, N, C, OC, d_out, weight, d_pre, NULL, pre);
    return lt_product(&key, d_pre, d_out, weight, NULL, pre, done);
}

/* A counter, read under the lock that its products are counted under. */
static int64_t counted(const int64_t *counter)
{
    pthread_mutex_lock(&plans_lock);
    int64_t products = *counter;
    pthread_mutex_unlock(&plans_lock);
    return products;
}

int64_t cuda_lt_bias_epilogue_products(void)
{
    return counted(&state.epilogue_products);
}

int64_t cuda_lt_bias_epilogue_bits_products(void)
{
    return counted(&state.epilogue_bits_products);
}

int64_t cuda_lt_gelu_epilogue_products(void)
{
    return counted(&state.gelu_products);
}

int64_t cuda_lt_dgelu_epilogue_products(void)
{
    return counted(&state.dgelu_products);
}

const char *cuda_lt_last_refusal(void)
{
    pthread_mutex_lock(&plans_lock);
    static char copy[sizeof state.refusal];
    snprintf(copy, sizeof copy, "%s", state.refusal[0] ? state.refusal : "none");
    pthread_mutex_unlock(&plans_lock);
    return copy;
}
