/* products_lt.cu: the forward product with its bias added in cuBLASLt's
 * epilogue (CUBLASLT_EPILOGUE_BIAS), for matmul_forward,
 * matmul_forward_bf16 and matmul_forward_bf16_bits (linear.cu).
 *
 * Why: out[N,OC] = in . W^T + bias as a product then add_bias_kernel
 * writes out, then reads and writes it again: for GPT-2 124M at micro-batch
 * 4 that second pass is about 2 GB a step (the qkv and fc products of 12
 * layers). In the epilogue the bias is added to the fp32 sum before the one
 * write, rounding once as add_bias_kernel's addition does; the sum itself
 * may come from another algorithm than cublasGemmEx picks (another order of
 * additions: last bits, as between any two of cuBLAS's algorithms). With a
 * bf16 D (matmul_forward_bf16_bits' out, bf16 bits) the epilogue's math is
 * the same, in fp32 (the bias stays fp32), and its result is rounded to
 * bf16 as it is stored, once: split-K's partial sums are kept to algorithms
 * that add them in fp32 (not in D's type). Its plan is its own (the
 * heuristic may pick another algorithm than for an fp32 D: the same sum in
 * another order). The plans are kept per type of D as well.
 *
 * cuBLASLt comes with cuBLAS (libcublas.so needs libcublasLt.so) and is
 * loaded the same way, when the backend starts. A plan (the descriptors
 * and the algorithm cuBLASLt's heuristic picks) is made once per shape and
 * per alignment of each pointer (cuBLASLt's algorithms assume 256-byte
 * alignment unless told less; the trainer's arrays are carved from larger
 * ones at float offsets, and the bf16 product's in and W, a bf16 activation
 * and the trainer's bf16 copy of a weight, both read where they lie, may be
 * only 2-byte aligned, each on its own), and kept for the process.
 * Where cuBLASLt offers no algorithm for a shape, that is remembered too,
 * and the caller does the product and the bias separately as before; so
 * too where the bias is not 16-byte aligned: cuBLASLt has no preference for
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
#define LT_MAX_PLANS 64                        /* shapes x alignments; a model has a handful */

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

/* The key of a plan: precision, out's type (fp32, or bf16 bits: out_bits),
 * shape, and the alignment in bytes (a power of two, at most 256) of in, W,
 * out and bias, each its own (the preference's minimum alignment of A is
 * W's, of B in's, of C and D out's). */
typedef struct {
    int bf16, out_bits;
    int64_t N, C, OC;
    unsigned align_in, align_weight, align_out, align_bias;
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
    char refusal[320];              /* cuda_lt_last_refusal */
} state;
/* The plans, and each plan's bias pointer from setting it to queueing the
 * product (the descriptor holds it). */
static pthread_mutex_t plans_lock = PTHREAD_MUTEX_INITIALIZER;

static int same_key(const plan_key *a, const plan_key *b)
{
    return a->bf16 == b->bf16 && a->out_bits == b->out_bits && a->N == b->N && a->C == b->C && a->OC == b->OC &&
           a->align_in == b->align_in && a->align_weight == b->align_weight && a->align_out == b->align_out &&
           a->align_bias == b->align_bias;
}

static unsigned alignment_of(const void *p)
{
    uintptr_t address = (uintptr_t)p;
    unsigned alignment = 256;
    while (alignment > 1 && address % alignment) alignment /= 2;
    return alignment;
}

/* Whether cuBLASLt's status refuses a configuration (no algorithm for it),
 * not a failure: NOT_SUPPORTED, and for a bf16 D (out_bits) INVALID_VALUE
 * too, which an fp32 bias with it may give (cublasLt.h: a bias is D's type
 * but for a few exceptions). The caller then takes its own way. */
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

/* Why the epilogue was not taken for `key`'s shape (cuda_lt_last_refusal). */
static void note_refusal(const plan_key *key, const char *why)
{
    snprintf(state.refusal, sizeof state.refusal, "cuBLASLt bias epilogue, %s N=%lld C=%lld OC=%lld%s: %s",
             key->bf16 ? "bf16" : "fp32", (long long)key->N, (long long)key->C, (long long)key->OC,
             key->out_bits ? " (bf16 D)" : "", why);
}

/* Builds the plan of p->key (column-major, as linear.cu's forward:
 * out^T (OC x N, ld OC) = W^T^T (op T of W read as C x OC, ld C) . in^T
 * (C x N, ld C), the bias a vector of OC, one per row of out^T; C and D are
 * out, fp32 or bf16). usable 0 when the heuristic offers nothing (also for
 * an fp32 bias with a bf16 D, should this cuBLASLt not take one), and when
 * cuBLASLt refuses a descriptor or the heuristic fails: the product is then
 * computed without the epilogue, as where it offers nothing, and the reason
 * kept for cuda_lt_last_refusal (a slower way, not a wrong one: the tests
 * count the epilogue's products and say why it did not run). */
static void refuse_plan(plan *p, const char *why)
{
    plan_key key = p->key;
    plan_release(p);
    p->key = key; /* remembered as not usable */
    note_refusal(&key, why);
}

static int plan_build(plan *p, const float *bias)
{
    const plan_key *k = &p->key;
    cudaDataType operand = k->bf16 ? CUDA_R_16BF : CUDA_R_32F, result = k->out_bits ? CUDA_R_16BF : CUDA_R_32F;
    cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
    uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    int32_t bias_type = CUDA_R_32F;
    uint64_t workspace_limit = LT_WORKSPACE_BYTES;
    cublasLtMatmulPreference_t preference = NULL;
    cublasLtMatmulHeuristicResult_t found;
    cublasStatus_t heuristic = CUBLAS_STATUS_SUCCESS;
    int count = 0;
    /* fp32 sums, fp32 alpha and beta: for fp32 operands plain fp32 (not
     * TF32), as cuBLAS's products here. */
    LT_TRY(lt.desc_create(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_TRY(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose));
    LT_TRY(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep));
    LT_TRY(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    LT_TRY(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
    /* The heuristic reads the bias pointer's alignment from it. */
    LT_TRY(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    LT_TRY(lt.layout_create(&p->layout_weight, operand, (uint64_t)k->C, (uint64_t)k->OC, k->C));
    LT_TRY(lt.layout_create(&p->layout_in, operand, (uint64_t)k->C, (uint64_t)k->N, k->C));
    LT_TRY(lt.layout_create(&p->layout_out, result, (uint64_t)k->OC, (uint64_t)k->N, k->OC));
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
     * for a bf16 D, INVALID_VALUE too (an fp32 bias with it, which
     * cublasLt.h's bias type rule may reject so). */
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
static plan *plan_for(const plan_key *key, const float *bias, int *status)
{
    *status = TP_OK;
    for (int i = 0; i < state.num_plans; i++)
        if (same_key(&state.plans[i].key, key)) return &state.plans[i];
    if (state.num_plans == LT_MAX_PLANS) return NULL;
    plan *p = &state.plans[state.num_plans];
    memset(p, 0, sizeof *p);
    p->key = *key;
    if ((*status = plan_build(p, bias))) return NULL;
    state.num_plans++;
    return p;
}

int cuda_lt_start(void)
{
    /* TP_CUDA_EPILOGUE=off sets the epilogue aside (the separate bias
     * kernel for every product): a switch for a GPU session that finds it
     * at fault, as TP_CUDA_ATTENTION is for attention. */
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

int cuda_lt_forward_bias(int bf16, int out_bits, void *out, const void *in, const void *weight, const float *bias,
                         int64_t N, int64_t C, int64_t OC, int *done)
{
    const float one = 1.0f, zero = 0.0f;
    plan_key key = {bf16, out_bits, N, C, OC, alignment_of(in), alignment_of(weight), alignment_of(out),
                    alignment_of(bias)};
    *done = 0;
    if (!state.handle) return TP_OK; /* the separate way */
    if (key.align_bias < 16) {
        char why[64];
        snprintf(why, sizeof why, "the bias %zu-byte aligned (16 needed)", (size_t)key.align_bias);
        pthread_mutex_lock(&plans_lock);
        note_refusal(&key, why);
        pthread_mutex_unlock(&plans_lock);
        return TP_OK;
    }
    pthread_mutex_lock(&plans_lock);
    int status = TP_OK;
    plan *p = plan_for(&key, bias, &status);
    if (!status && p && p->usable) {
        LT_TRY(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        cublasStatus_t ran = lt.matmul(state.handle, p->desc, &one, weight, p->layout_weight, in, p->layout_in, &zero,
                                       out, p->layout_out, out, p->layout_out, &p->algo, state.workspace,
                                       p->workspace_bytes, cuda_state.stream);
        /* Refused at the call (an fp32 bias with a bf16 D, which
         * cublasLt.h's bias type rule may refuse only here): nothing was
         * queued; the plan is set aside and the caller's own way runs. */
        if (refused(ran, out_bits)) {
            char why[96];
            p->usable = 0;
            snprintf(why, sizeof why, "%s at the call", lt.status_name(ran));
            note_refusal(&p->key, why);
        } else {
            LT_TRY(ran);
        }
        *done = p->usable;
        if (p->usable) state.epilogue_products++;
        if (p->usable && out_bits) state.epilogue_bits_products++;
    }
    pthread_mutex_unlock(&plans_lock);
    return status;
fail:
    pthread_mutex_unlock(&plans_lock);
    return TP_ERR_DEVICE;
}

int64_t cuda_lt_bias_epilogue_products(void)
{
    pthread_mutex_lock(&plans_lock);
    int64_t products = state.epilogue_products;
    pthread_mutex_unlock(&plans_lock);
    return products;
}

int64_t cuda_lt_bias_epilogue_bits_products(void)
{
    pthread_mutex_lock(&plans_lock);
    int64_t products = state.epilogue_bits_products;
    pthread_mutex_unlock(&plans_lock);
    return products;
}

const char *cuda_lt_last_refusal(void)
{
    pthread_mutex_lock(&plans_lock);
    static char copy[sizeof state.refusal];
    snprintf(copy, sizeof copy, "%s", state.refusal[0] ? state.refusal : "none");
    pthread_mutex_unlock(&plans_lock);
    return copy;
}
