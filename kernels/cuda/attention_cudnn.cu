/* attention_cudnn.cu: cuDNN's flash attention through its backend (graph)
 * API, loaded with dlopen: the graphs, their plans and their runs
 * (attention_cudnn.h). attention.cu gives it qkv and out as the bf16
 * activations they are, and d_out and d_qkv as the bf16 gradients they are
 * (dO read and dQ, dK, dV written in place: no rounding or widening); this
 * file sees bf16 and fp32 device tensors only.
 *
 * Each cuDNN call is checked; the first that fails ends the build of a
 * graph with a message naming the call, the descriptor (the tensor or
 * operation by the frontend's name for it: "bmm1", "attn_scale", ...), the
 * attribute, cuDNN's status and its last error message (what a first run on
 * a GPU needs to see to fix a graph). One lock (dnn_lock) serializes
 * loading, the handle, the plan table and the runs: a cuDNN handle is not
 * for two threads at once. */
#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "../../common/error.h"
}
#include "attention_cudnn.h"
#include "check.h"
#include "launch.h"
#include "libraries.h"

#define TP_CUDNN_STR_(x) #x
#define TP_CUDNN_STR(x) TP_CUDNN_STR_(x)

extern "C" int cudnn_attention_shape_ok(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd)
{
    const char *why = NULL;
    if (hd < CUDNN_ATTENTION_MIN_HEAD || hd > CUDNN_ATTENTION_MAX_HEAD || hd % 8 != 0)
        why = "the head size is not a multiple of 8 from " TP_CUDNN_STR(CUDNN_ATTENTION_MIN_HEAD) " to " TP_CUDNN_STR(
            CUDNN_ATTENTION_MAX_HEAD);
    else if (T < 2) why = "cuDNN's backward takes no sequence of one position";
    else if (B < 1 || Hq < 1 || Hkv < 1 || Hq % Hkv != 0) why = "Hq must be a positive multiple of Hkv";
    if (!why) return TP_OK;
    return tp_fail(TP_ERR_ARG, "cuDNN attention: B=%lld T=%lld Hq=%lld Hkv=%lld hd=%lld: %s", (long long)B,
                   (long long)T, (long long)Hq, (long long)Hkv, (long long)hd, why);
}

#if __has_include(<cudnn_graph.h>)
#include <cudnn_graph.h>

/* The functions used, typed as cudnn_graph.h declares them. */
static struct {
    decltype(&cudnnGetVersion) get_version;
    decltype(&cudnnGetErrorString) error_string;
    decltype(&cudnnGetLastErrorString) last_error; /* NULL where the library lacks it */
    decltype(&cudnnCreate) create;
    decltype(&cudnnSetStream) set_stream;
    decltype(&cudnnBackendCreateDescriptor) create_descriptor;
    decltype(&cudnnBackendDestroyDescriptor) destroy_descriptor;
    decltype(&cudnnBackendSetAttribute) set_attribute;
    decltype(&cudnnBackendGetAttribute) get_attribute;
    decltype(&cudnnBackendFinalize) finalize;
    decltype(&cudnnDestroy) destroy;
    decltype(&cudnnBackendExecute) execute;
} dnn;

/* The process's cuDNN: loaded once (a failure kept), its version, and the
 * handle on the backend's stream (made once, a failure kept). */
static struct {
    int tried, status;
    char why[1536];
    size_t version;
    char version_text[24]; /* "9.19.0" */
    char found_in[512];
    int handle_tried, handle_status;
    char handle_why[1024];
    cudnnHandle_t handle;
} lib;
static pthread_mutex_t dnn_lock = PTHREAD_MUTEX_INITIALIZER;

/* cuDNN compiles some of its engines at run time with NVRTC, which it
 * loads by name when first needed. From PyTorch's wheels (nvidia/cudnn/lib
 * beside nvidia/cuda_nvrtc/lib) its own search would not find it unless the
 * toolkit's is on the loader's path: loaded here once cuDNN is (before any
 * engine is built), from where the CUDA libraries are looked for, so that
 * cuDNN's request finds it by its soname. Where there is none, nothing is
 * lost: cuDNN's engines say so. */
static void preload_nvrtc(void *cudnn)
{
    /* NVRTC of cuDNN's own CUDA major (a cuDNN of PyTorch's cu12 wheels asks
     * for libnvrtc.so.12 whatever this build's CUDA), else of this build's. */
    size_t (*cudart_version)(void) = NULL;
    *(void **)&cudart_version = dlsym(cudnn, "cudnnGetCudartVersion");
    size_t major = cudart_version ? cudart_version() / 1000 : CUDART_VERSION / 1000;
    char name[32], found_in[512];
    snprintf(name, sizeof name, "libnvrtc.so.%zu", major);
    const char *const names[] = {name};
    void *library = NULL;
    if (cuda_library_open("NVRTC", names, 1, &library, found_in, sizeof found_in) != TP_OK)
        return; /* none found: not an error of cuDNN's load (the engines that need it say so) */
}

static int load_locked(void)
{
    static const char *const names[] = {"libcudnn.so." TP_CUDNN_STR(CUDNN_MAJOR), "libcudnn.so"};
    if (lib.tried) return lib.status ? tp_fail(lib.status, "%s", lib.why) : TP_OK;
    lib.tried = 1;
    void *library = NULL;
    int status = cuda_library_open("cuDNN", names, sizeof names / sizeof names[0], &library, lib.found_in,
                                   sizeof lib.found_in);
    if (!status) {
        const cuda_library_symbol symbols[] = {
            {"cudnnGetVersion", (void **)&dnn.get_version},
            {"cudnnGetErrorString", (void **)&dnn.error_string},
            {"cudnnCreate", (void **)&dnn.create},
            {"cudnnDestroy", (void **)&dnn.destroy},
            {"cudnnSetStream", (void **)&dnn.set_stream},
            {"cudnnBackendCreateDescriptor", (void **)&dnn.create_descriptor},
            {"cudnnBackendDestroyDescriptor", (void **)&dnn.destroy_descriptor},
            {"cudnnBackendSetAttribute", (void **)&dnn.set_attribute},
            {"cudnnBackendGetAttribute", (void **)&dnn.get_attribute},
            {"cudnnBackendFinalize", (void **)&dnn.finalize},
            {"cudnnBackendExecute", (void **)&dnn.execute},
        };
        char where[600];
        snprintf(where, sizeof where, "%s in %s", names[0], lib.found_in);
        status = cuda_library_symbols(library, "cuDNN", where, symbols, sizeof symbols / sizeof symbols[0]);
    }
    if (!status) {
        preload_nvrtc(library);
        *(void **)&dnn.last_error = dlsym(library, "cudnnGetLastErrorString");
        lib.version = dnn.get_version();
        snprintf(lib.version_text, sizeof lib.version_text, "%zu.%zu.%zu", lib.version / 10000,
                 lib.version / 100 % 100, lib.version % 100);
        if (lib.version / 10000 != CUDNN_MAJOR)
            status = tp_fail(TP_ERR_DEVICE, "cuDNN in %s is version %s; this build takes cuDNN %d", lib.found_in,
                             lib.version_text, CUDNN_MAJOR);
    }
    lib.status = status;
    if (status) snprintf(lib.why, sizeof lib.why, "%s", tp_errmsg());
    return status;
}

extern "C" int cudnn_attention_load(char *version, size_t size)
{
    pthread_mutex_lock(&dnn_lock);
    int status = load_locked();
    if (!status && size)
        snprintf(version, size, "%s", lib.version_text);
    pthread_mutex_unlock(&dnn_lock);
    return status;
}

/* cuDNN's last error message, or "" (a library without the call). */
static const char *last_error(char *text, size_t size)
{
    text[0] = '\0';
    if (dnn.last_error) dnn.last_error(text, size);
    return text;
}

/* The handle on the backend's stream; the GPU must take cuDNN's SDPA
 * (compute capability 8.0 or later). */
static int handle_locked(void)
{
    if (lib.handle_tried) return lib.handle_status ? tp_fail(lib.handle_status, "%s", lib.handle_why) : TP_OK;
    lib.handle_tried = 1;
    int status = TP_OK, major = 0;
    cudaError_t error = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, cuda_state.device);
    if (error != cudaSuccess) {
        (void)cudaGetLastError();
        status = tp_fail(TP_ERR_DEVICE, "cuDNN attention: the compute capability of CUDA device %d: %s",
                         cuda_state.device, cudaGetErrorString(error));
    } else if (major < 8) {
        status = tp_fail(TP_ERR_DEVICE, "cuDNN's flash attention needs compute capability 8.0 or later; CUDA device "
                                        "%d has %d.x",
                         cuda_state.device, major);
    } else {
        char message[512];
        cudnnStatus_t s = dnn.create(&lib.handle);
        if (s == CUDNN_STATUS_SUCCESS) s = dnn.set_stream(lib.handle, cuda_state.stream);
        if (s != CUDNN_STATUS_SUCCESS) {
            status = tp_fail(TP_ERR_DEVICE, "cuDNN (%s): cudnnCreate/cudnnSetStream: %s (%s)", lib.found_in,
                             dnn.error_string(s), last_error(message, sizeof message));
            if (lib.handle) dnn.destroy(lib.handle);
            lib.handle = NULL;
        }
    }
    lib.handle_status = status;
    if (status) snprintf(lib.handle_why, sizeof lib.handle_why, "%s", tp_errmsg());
    return status;
}

/* ================================================================ builder
 * One graph's descriptors, all kept (and destroyed together): the tensors
 * and operations, then the graph, heuristics, engine configurations and the
 * plan. The first failing call is recorded and every later step is a no-op,
 * so that a graph reads as a list of steps. */

/* A backward graph holds about 90 descriptors; each heuristics mode adds up
 * to 64 configurations, each tried with a plan and an engine. */
#define MAX_DESCRIPTORS 640
#define MAX_OPERATIONS 40
#define MAX_ENGINE_CONFIGS 64

typedef struct {
    cudnnBackendDescriptor_t owned[MAX_DESCRIPTORS];
    int count;
    cudnnBackendDescriptor_t operations[MAX_OPERATIONS];
    int operation_count;
    int64_t next_uid;  /* of virtual tensors */
    int failed;        /* the message is in tp_errmsg() */
    char context[160]; /* "cuDNN attention forward (B=.. T=.. ...)" */
} builder;

static int builder_fail(builder *b, const char *call, const char *what, const char *attribute, cudnnStatus_t s)
{
    char message[512];
    if (b->failed) return b->failed;
    b->failed = tp_fail(TP_ERR_DEVICE, "%s: %s(%s%s%s): %s%s%s%s", b->context, call, what, attribute ? ", " : "",
                        attribute ? attribute : "", dnn.error_string(s), dnn.last_error ? " (cuDNN: " : "",
                        last_error(message, sizeof message), dnn.last_error ? ")" : "");
    return b->failed;
}

static void builder_free(builder *b)
{
    for (int i = b->count - 1; i >= 0; i--) dnn.destroy_descriptor(b->owned[i]);
    b->count = 0;
}

static cudnnBackendDescriptor_t make(builder *b, cudnnBackendDescriptorType_t type, const char *type_name,
                                     const char *what)
{
    cudnnBackendDescriptor_t d = NULL;
    if (b->failed) return NULL;
    if (b->count == MAX_DESCRIPTORS) {
        b->failed = tp_fail(TP_ERR_DEVICE, "%s: more than %d descriptors (%s)", b->context, MAX_DESCRIPTORS, what);
        return NULL;
    }
    cudnnStatus_t s = dnn.create_descriptor(type, &d);
    if (s != CUDNN_STATUS_SUCCESS) {
        builder_fail(b, "cudnnBackendCreateDescriptor", what, type_name, s);
        return NULL;
    }
    b->owned[b->count++] = d;
    return d;
}
#define MAKE(b, type, what) make(b, type, #type, what)

static void set(builder *b, cudnnBackendDescriptor_t d, const char *what, cudnnBackendAttributeName_t attribute,
                const char *attribute_name, cudnnBackendAttributeType_t type, int64_t count, const void *value)
{
    if (b->failed) return;
    cudnnStatus_t s = dnn.set_attribute(d, attribute, type, count, value);
    if (s != CUDNN_STATUS_SUCCESS) builder_fail(b, "cudnnBackendSetAttribute", what, attribute_name, s);
}
#define SET(b, d, what, attribute, type, count, value) set(b, d, what, attribute, #attribute, type, count, value)

static void finalize(builder *b, cudnnBackendDescriptor_t d, const char *what)
{
    if (b->failed) return;
    cudnnStatus_t s = dnn.finalize(d);
    if (s != CUDNN_STATUS_SUCCESS) builder_fail(b, "cudnnBackendFinalize", what, NULL, s);
}

/* A tensor: uid 0 for a new virtual one. Every tensor 16-byte aligned, as
 * the frontend declares them (attention.cu's scratch parts are 256-byte
 * aligned, and qkv, O, dO and dQKV are the caller's qkv, out, d_out and
 * d_qkv only where they are 16-byte aligned; the K and V views (and dK, dV)
 * start hd multiples of 8 bf16 values in, and their rows are (Hq + 2 Hkv) hd
 * values apart: 16-byte multiples). */
static cudnnBackendDescriptor_t tensor(builder *b, const char *what, cudnnDataType_t type, cudnn_tensor_shape shape,
                                       int64_t uid, int by_value)
{
    cudnnBackendDescriptor_t t = MAKE(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR, what);
    int64_t alignment = 16;
    bool yes = true;
    if (!uid) uid = b->next_uid++;
    SET(b, t, what, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    SET(b, t, what, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, shape.dims);
    SET(b, t, what, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, shape.strides);
    SET(b, t, what, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    SET(b, t, what, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    if (uid >= CUDNN_UID_VIRTUAL) SET(b, t, what, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes);
    if (by_value) SET(b, t, what, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes);
    finalize(b, t, what);
    return t;
}

static cudnnBackendDescriptor_t virtual_tensor(builder *b, const char *what, cudnnDataType_t type,
                                               cudnn_tensor_shape shape)
{
    return tensor(b, what, type, shape, 0, 0);
}

/* An fp32 scalar passed by value ([1, 1, 1, 1], as the frontend expands its
 * scalars to the other operand's rank). */
static cudnnBackendDescriptor_t scalar(builder *b, const char *what, int64_t uid)
{
    return tensor(b, what, CUDNN_DATA_FLOAT, cudnn_shape(1, 1, 1, 1, 1, 1, 1, 1), uid, 1);
}

static void add_operation(builder *b, cudnnBackendDescriptor_t op, const char *what)
{
    finalize(b, op, what);
    if (b->failed) return;
    if (b->operation_count == MAX_OPERATIONS) {
        b->failed = tp_fail(TP_ERR_DEVICE, "%s: more than %d operations (%s)", b->context, MAX_OPERATIONS, what);
        return;
    }
    b->operations[b->operation_count++] = op;
}

/* y = mode(x[, second[, third]]) elementwise, computed in math (the
 * frontend's default: fp32; booleans for comparisons). axis: GEN_INDEX's
 * dimension, else -1. As the frontend's PointwiseNode: the mode's
 * descriptor, then the operation with alpha1 = alpha2 = 1. */
static void pointwise(builder *b, const char *what, cudnnPointwiseMode_t mode, cudnnDataType_t math,
                      cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t second, cudnnBackendDescriptor_t third,
                      cudnnBackendDescriptor_t y, int64_t axis)
{
    cudnnBackendDescriptor_t pw = MAKE(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what);
    SET(b, pw, what, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    SET(b, pw, what, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
    if (axis >= 0) SET(b, pw, what, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    finalize(b, pw, what);
    cudnnBackendDescriptor_t op = MAKE(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what);
    float one = 1.0f;
    SET(b, op, what, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
    SET(b, op, what, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    SET(b, op, what, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    if (second) SET(b, op, what, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &second);
    if (third) SET(b, op, what, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &third);
    SET(b, op, what, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    SET(b, op, what, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    add_operation(b, op, what);
}

/* c = a b over the last two dimensions (batched over the first two, a
 * key/value head broadcast over its group of query heads), summed in fp32. */
static void matmul(builder *b, const char *what, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t bm,
                   cudnnBackendDescriptor_t c)
{
    cudnnBackendDescriptor_t mm = MAKE(b, CUDNN_BACKEND_MATMUL_DESCRIPTOR, what);
    cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    SET(b, mm, what, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
    finalize(b, mm, what);
    cudnnBackendDescriptor_t op = MAKE(b, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what);
    SET(b, op, what, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    SET(b, op, what, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bm);
    SET(b, op, what, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    SET(b, op, what, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm);
    add_operation(b, op, what);
}

/* y = x reduced (ADD or MAX) over the dimensions where y has fewer. */
static void reduction(builder *b, const char *what, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                      cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t rd = MAKE(b, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what);
    cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    SET(b, rd, what, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
    SET(b, rd, what, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
#if CUDNN_VERSION >= 91100 /* headers before 9.11 lack the attribute; the library's own version decides too */
    if (lib.version >= 91100) { /* the attribute's first version; the frontend sets it false */
        bool deterministic = false;
        SET(b, rd, what, CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1, &deterministic);
    }
#endif
    finalize(b, rd, what);
    cudnnBackendDescriptor_t op = MAKE(b, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what);
    SET(b, op, what, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd);
    SET(b, op, what, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    SET(b, op, what, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    add_operation(b, op, what);
}

/* y: x seen with other dims and strides (the backward's transposes). */
static void reshape(builder *b, const char *what, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t op = MAKE(b, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, what);
    SET(b, op, what, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    SET(b, op, what, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    add_operation(b, op, what);
}

/* ================================================================= graphs */

/* [B, Hq, T, T] scores, row-major; its transpose in place ([.., keys,
 * queries] of the same memory); [B, Hq, T, 1] per query row. */
static cudnn_tensor_shape scores_shape(const cudnn_attention_layout *L)
{
    return cudnn_shape(L->B, L->Hq, L->T, L->T, L->Hq * L->T * L->T, L->T * L->T, L->T, 1);
}

static cudnn_tensor_shape rows_shape(const cudnn_attention_layout *L)
{
    return cudnn_shape(L->B, L->Hq, L->T, 1, L->Hq * L->T, L->T, 1, 1);
}

/* The causal mask of the frontend (a diagonal band with right bound 0,
 * top-left aligned: CompositeDiagonalBandMaskNode before cuDNN 9.21): keep
 * score[i][j] where row i >= column j, else the negative infinity. */
static cudnnBackendDescriptor_t causal_mask(builder *b, const cudnn_attention_layout *L,
                                            cudnnBackendDescriptor_t scores, cudnnBackendDescriptor_t neg_inf)
{
    cudnn_tensor_shape s = scores_shape(L);
    cudnnBackendDescriptor_t row = virtual_tensor(b, "gen_row_index", CUDNN_DATA_INT32, s);
    cudnnBackendDescriptor_t col = virtual_tensor(b, "gen_col_index", CUDNN_DATA_INT32, s);
    cudnnBackendDescriptor_t keep = virtual_tensor(b, "row>=col", CUDNN_DATA_BOOLEAN, s);
    cudnnBackendDescriptor_t masked = virtual_tensor(b, "binary_select", CUDNN_DATA_FLOAT, s);
    pointwise(b, "gen_row_index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, scores, NULL, NULL, row, 2);
    pointwise(b, "gen_col_index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, scores, NULL, NULL, col, 3);
    pointwise(b, "row>=col", CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep, -1);
    pointwise(b, "binary_select", CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, scores, neg_inf, keep, masked, -1);
    return masked;
}

/* The forward (the frontend's CompositeSDPANode with causal mask, attention
 * scale and stats, no dropout, before cuDNN 9.21's unified nodes). */
static void build_forward(builder *b, const cudnn_attention_layout *L)
{
    cudnn_tensor_shape s = scores_shape(L), r = rows_shape(L);
    cudnnBackendDescriptor_t q = tensor(b, "Q", CUDNN_DATA_BFLOAT16, L->q, CUDNN_UID_Q, 0);
    cudnnBackendDescriptor_t kt = tensor(b, "K^T", CUDNN_DATA_BFLOAT16, cudnn_transposed(L->k), CUDNN_UID_K, 0);
    cudnnBackendDescriptor_t v = tensor(b, "V", CUDNN_DATA_BFLOAT16, L->v, CUDNN_UID_V, 0);
    cudnnBackendDescriptor_t o = tensor(b, "O", CUDNN_DATA_BFLOAT16, L->o, CUDNN_UID_O, 0);
    cudnnBackendDescriptor_t stats = tensor(b, "Stats", CUDNN_DATA_FLOAT, L->stats, CUDNN_UID_STATS, 0);
    cudnnBackendDescriptor_t scale = scalar(b, "attn_scale", CUDNN_UID_SCALE);
    cudnnBackendDescriptor_t neg_inf = scalar(b, "negative_inf", CUDNN_UID_NEG_INF);

    cudnnBackendDescriptor_t s1 = virtual_tensor(b, "bmm1::C", CUDNN_DATA_FLOAT, s);
    matmul(b, "bmm1", q, kt, s1);
    cudnnBackendDescriptor_t s2 = virtual_tensor(b, "attn_scale::OUT_0", CUDNN_DATA_FLOAT, s);
    pointwise(b, "attn_scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s1, scale, NULL, s2, -1);
    cudnnBackendDescriptor_t s3 = causal_mask(b, L, s2, neg_inf);

    /* softmax (CompositeSoftmaxNode with stats) */
    cudnnBackendDescriptor_t max = virtual_tensor(b, "Max", CUDNN_DATA_FLOAT, r);
    reduction(b, "Max", CUDNN_REDUCE_TENSOR_MAX, s3, max);
    cudnnBackendDescriptor_t shifted = virtual_tensor(b, "sub_M", CUDNN_DATA_FLOAT, s);
    pointwise(b, "sub", CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, s3, max, NULL, shifted, -1);
    cudnnBackendDescriptor_t e = virtual_tensor(b, "exp_sub_M", CUDNN_DATA_FLOAT, s);
    pointwise(b, "exp", CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, shifted, NULL, NULL, e, -1);
    cudnnBackendDescriptor_t sum = virtual_tensor(b, "SumExp", CUDNN_DATA_FLOAT, r);
    reduction(b, "sum", CUDNN_REDUCE_TENSOR_ADD, e, sum);
    cudnnBackendDescriptor_t log_sum = virtual_tensor(b, "log::OUT_0", CUDNN_DATA_FLOAT, r);
    pointwise(b, "log", CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, sum, NULL, NULL, log_sum, -1);
    pointwise(b, "add", CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, max, log_sum, NULL, stats, -1);
    /* P in the inputs' type: the type bmm2 multiplies V in */
    cudnnBackendDescriptor_t p = virtual_tensor(b, "softmax::S", CUDNN_DATA_BFLOAT16, s);
    pointwise(b, "div", CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, sum, NULL, p, -1);

    matmul(b, "bmm2", p, v, o);
}

/* dX = sum over each key/value head's group of query heads of the
 * full-head product: direct for Hq == Hkv; else the product into a virtual
 * [B, Hq, T, hd] (bf16, as the frontend) and a reduction ADD. */
static void grouped_product(builder *b, const cudnn_attention_layout *L, const char *what, const char *full_name,
                            const char *reduce_name, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t bm,
                            cudnnBackendDescriptor_t out)
{
    if (L->Hq == L->Hkv) {
        matmul(b, what, a, bm, out);
        return;
    }
    int64_t T = L->T, hd = L->hd;
    cudnnBackendDescriptor_t full = virtual_tensor(b, full_name, CUDNN_DATA_BFLOAT16,
                                                   cudnn_shape(L->B, L->Hq, T, hd, L->Hq * T * hd, T * hd, hd, 1));
    matmul(b, what, a, bm, full);
    reduction(b, reduce_name, CUDNN_REDUCE_TENSOR_ADD, full, out);
}

/* The backward (the frontend's CompositeSDPABackwardNode: causal mask,
 * attention scale, no dropout or bias; dQ through its fp32 accumulator, as
 * the frontend builds it from cuDNN 9.0 on without the dP workspace; or,
 * deterministic, dQ written as dQ, as it builds it with the dP workspace). */
static void build_backward(builder *b, const cudnn_attention_layout *L, int deterministic)
{
    int64_t B = L->B, Hq = L->Hq, T = L->T, hd = L->hd;
    cudnn_tensor_shape s = scores_shape(L), r = rows_shape(L);
    cudnn_tensor_shape s_t = cudnn_shape(B, Hq, T, T, Hq * T * T, T * T, 1, T); /* [keys, queries] */
    cudnnBackendDescriptor_t q = tensor(b, "Q", CUDNN_DATA_BFLOAT16, L->q, CUDNN_UID_Q, 0);
    cudnnBackendDescriptor_t kt = tensor(b, "K^T", CUDNN_DATA_BFLOAT16, cudnn_transposed(L->k), CUDNN_UID_K, 0);
    cudnnBackendDescriptor_t vt = tensor(b, "V^T", CUDNN_DATA_BFLOAT16, cudnn_transposed(L->v), CUDNN_UID_V, 0);
    cudnnBackendDescriptor_t o = tensor(b, "O", CUDNN_DATA_BFLOAT16, L->o, CUDNN_UID_O, 0);
    cudnnBackendDescriptor_t stats = tensor(b, "Stats", CUDNN_DATA_FLOAT, L->stats, CUDNN_UID_STATS, 0);
    cudnnBackendDescriptor_t d_o = tensor(b, "dO", CUDNN_DATA_BFLOAT16, L->o, CUDNN_UID_DO, 0);
    cudnnBackendDescriptor_t d_q = tensor(b, "dQ", CUDNN_DATA_BFLOAT16, L->q, CUDNN_UID_DQ, 0);
    cudnnBackendDescriptor_t d_k = tensor(b, "dK", CUDNN_DATA_BFLOAT16, L->k, CUDNN_UID_DK, 0);
    cudnnBackendDescriptor_t d_v = tensor(b, "dV", CUDNN_DATA_BFLOAT16, L->v, CUDNN_UID_DV, 0);
    cudnnBackendDescriptor_t scale = scalar(b, "attn_scale", CUDNN_UID_SCALE);
    cudnnBackendDescriptor_t neg_inf = scalar(b, "negative_inf", CUDNN_UID_NEG_INF);
    cudnnBackendDescriptor_t one = scalar(b, "one", CUDNN_UID_ONE);
    cudnnBackendDescriptor_t softmax_sum = tensor(b, "softmax_sum", CUDNN_DATA_FLOAT, r, CUDNN_UID_SOFTMAX_SUM, 0);

    /* softmax_sum = rowsum(dO O) (times the dropout scale's inverse, 1) */
    cudnnBackendDescriptor_t d_o_o = virtual_tensor(b, "mul_dO_O::OUT_0", CUDNN_DATA_FLOAT,
                                                    cudnn_shape(B, Hq, T, hd, Hq * T * hd, T * hd, Hq * hd, 1));
    pointwise(b, "mul_dO_O", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, d_o, o, NULL, d_o_o, -1);
    cudnnBackendDescriptor_t row_sum = virtual_tensor(b, "reduce_dO_o::Y", CUDNN_DATA_FLOAT, r);
    reduction(b, "reduce_dO_o", CUDNN_REDUCE_TENSOR_ADD, d_o_o, row_sum);
    pointwise(b, "scale_dropout_inv", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, row_sum, one, NULL, softmax_sum, -1);

    /* P = exp(scale Q K^T - stats), masked */
    cudnnBackendDescriptor_t s1 = virtual_tensor(b, "matmul_Q_KT::C", CUDNN_DATA_FLOAT, s);
    matmul(b, "matmul_Q_KT", q, kt, s1);
    cudnnBackendDescriptor_t s2 = virtual_tensor(b, "mul_s_attn_scale::OUT_0", CUDNN_DATA_FLOAT, s);
    pointwise(b, "mul_s_attn_scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s1, scale, NULL, s2, -1);
    cudnnBackendDescriptor_t s3 = virtual_tensor(b, "sub_s_m::OUT_0", CUDNN_DATA_FLOAT, s);
    pointwise(b, "sub_s_m", CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, s2, stats, NULL, s3, -1);
    cudnnBackendDescriptor_t s4 = causal_mask(b, L, s3, neg_inf);
    cudnnBackendDescriptor_t p = virtual_tensor(b, "exp_s::OUT_0", CUDNN_DATA_FLOAT, s);
    pointwise(b, "exp_s", CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, s4, NULL, NULL, p, -1);

    /* dV = P^T dO */
    cudnnBackendDescriptor_t p_t = virtual_tensor(b, "reshape_p::Y", CUDNN_DATA_BFLOAT16, s_t);
    reshape(b, "reshape_p", p, p_t);
    grouped_product(b, L, "matmul_pT_dO", "matmul_pT_dO::C", "red_dV_head", p_t, d_o, d_v);

    /* dS = P (dO V^T - softmax_sum) scale */
    cudnnBackendDescriptor_t dp = virtual_tensor(b, "matmul_dO_VT::C", CUDNN_DATA_FLOAT, s);
    matmul(b, "matmul_dO_VT", d_o, vt, dp);
    cudnnBackendDescriptor_t dp2 = virtual_tensor(b, "sub_dP_softmax_sum::OUT_0", CUDNN_DATA_FLOAT, s);
    pointwise(b, "sub_dP_softmax_sum", CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, dp, softmax_sum, NULL, dp2, -1);
    cudnnBackendDescriptor_t dp3 = virtual_tensor(b, "mul_dP_exp_s::OUT_0", CUDNN_DATA_FLOAT, s);
    pointwise(b, "mul_dP_exp_s", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dp2, p, NULL, dp3, -1);
    cudnnBackendDescriptor_t ds = virtual_tensor(b, "mul_dS_attn_scale::OUT_0", CUDNN_DATA_FLOAT, s);
    pointwise(b, "mul_dS_attn_scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dp3, scale, NULL, ds, -1);

    /* dK = dS^T Q */
    cudnnBackendDescriptor_t ds_t = virtual_tensor(b, "reshape_dS::Y", CUDNN_DATA_BFLOAT16, s_t);
    reshape(b, "reshape_dS", ds, ds_t);
    grouped_product(b, L, "matmul_dST_Q", "matmul_dST_Q::C", "red_dK_head", ds_t, q, d_k);

    /* dQ = dS K: in fp32, then to bf16 (identity); deterministic, into dQ itself */
    cudnnBackendDescriptor_t k = virtual_tensor(b, "reshape_k::Y", CUDNN_DATA_FLOAT, L->k);
    reshape(b, "reshape_k", kt, k);
    if (deterministic) {
        matmul(b, "matmul_dS_K", ds, k, d_q);
        return;
    }
    cudnnBackendDescriptor_t dq_accum = tensor(b, "dQ_accum", CUDNN_DATA_FLOAT,
                                               cudnn_shape(B, Hq, T, hd, Hq * T * hd, T * hd, hd, 1),
                                               CUDNN_UID_DQ_ACCUM, 0);
    matmul(b, "matmul_dS_K", ds, k, dq_accum);
    pointwise(b, "identity_dQ", CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, dq_accum, NULL, NULL, d_q, -1);
}

static const char *const graph_names[] = {"forward", "backward", "deterministic backward"};

static void build(builder *b, cudnn_attention_graph graph, const cudnn_attention_layout *L)
{
    b->next_uid = CUDNN_UID_VIRTUAL;
    snprintf(b->context, sizeof b->context, "cuDNN %s attention %s (B=%lld T=%lld Hq=%lld Hkv=%lld hd=%lld)",
             lib.version_text, graph_names[graph], (long long)L->B, (long long)L->T, (long long)L->Hq,
             (long long)L->Hkv, (long long)L->hd);
    if (graph == CUDNN_ATTENTION_FORWARD) build_forward(b, L);
    else build_backward(b, L, graph == CUDNN_ATTENTION_BACKWARD_DETERMINISTIC);
}

/* ================================================================== plans */

struct cudnn_attention_plan {
    int64_t B, T, Hq, Hkv, hd;
    cudnn_attention_graph kind;
    int backward, accumulates_dq;  /* kind is a backward; the one with dQ's accumulator */
    int status; /* TP_OK, or the failure kept with its message */
    char why[1536];
    builder graph;                 /* every descriptor, the plan last */
    cudnnBackendDescriptor_t plan; /* the execution plan (in graph.owned) */
    int64_t engine;                /* cuDNN's global index of its engine */
    size_t cudnn_bytes;            /* cuDNN's workspace */
    size_t softmax_sum_offset, dq_accum_offset, workspace_bytes;
    float scale, neg_inf, one;     /* the by-value scalars */
};

static cudnn_attention_plan plans[CUDNN_ATTENTION_PLANS];
static int plan_count;

static size_t aligned(size_t bytes)
{
    return (bytes + 255) / 256 * 256;
}

/* The graph finalized on the handle, then the engines cuDNN's heuristics
 * list (mode A, then the fallback list), each tried until one's execution
 * plan finalizes; the failures of the first few are reported when none
 * does. */
static int choose_engine(cudnn_attention_plan *p)
{
    builder *b = &p->graph;
    cudnnBackendDescriptor_t graph = MAKE(b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    SET(b, graph, "operation graph", CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        b->operation_count, b->operations);
    SET(b, graph, "operation graph", CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &lib.handle);
    finalize(b, graph, "operation graph");
    if (b->failed) return b->failed;
    char tried[1024] = "";
    size_t used = 0;
    int configs_seen = 0;
    static const cudnnBackendHeurMode_t modes[] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    static const char *const mode_names[] = {"A", "fallback"};
    for (int m = 0; m < 2; m++) {
        cudnnBackendDescriptor_t heur = MAKE(b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics");
        SET(b, heur, "engine heuristics", CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
            &graph);
        SET(b, heur, "engine heuristics", CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m]);
        if (b->failed) return b->failed;
        /* A mode whose heuristics fail is one that lists nothing: the next is
         * tried, the failure reported with the engines' if none finalizes. */
        int64_t count = 0;
        cudnnStatus_t s = dnn.finalize(heur);
        if (s == CUDNN_STATUS_SUCCESS)
            s = dnn.get_attribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL);
        if (s != CUDNN_STATUS_SUCCESS) {
            if (used < sizeof tried) {
                char message[256];
                int wrote = snprintf(tried + used, sizeof tried - used, "%sheuristics %s: %s%s%s", used ? "; " : "",
                                     mode_names[m], dnn.error_string(s), dnn.last_error ? " " : "",
                                     last_error(message, sizeof message));
                used += wrote > 0 ? (size_t)wrote : 0;
            }
            continue;
        }
        if (count > MAX_ENGINE_CONFIGS) count = MAX_ENGINE_CONFIGS;
        cudnnBackendDescriptor_t configs[MAX_ENGINE_CONFIGS];
        for (int64_t i = 0; i < count; i++)
            configs[i] = MAKE(b, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine configuration");
        if (b->failed) return b->failed;
        int64_t got = 0;
        if (count > 0) {
            s = dnn.get_attribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                  configs);
            if (s != CUDNN_STATUS_SUCCESS)
                return builder_fail(b, "cudnnBackendGetAttribute", "engine heuristics",
                                    "CUDNN_ATTR_ENGINEHEUR_RESULTS", s);
        }
        for (int64_t i = 0; i < got; i++) {
            configs_seen++;
            cudnnBackendDescriptor_t plan = MAKE(b, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
            SET(b, plan, "execution plan", CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &lib.handle);
            SET(b, plan, "execution plan", CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                &configs[i]);
            if (b->failed) return b->failed;
            s = dnn.finalize(plan);
            /* The engine's global index, for the report. */
            int64_t engine = -1, n = 0;
            cudnnBackendDescriptor_t e = MAKE(b, CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine");
            if (b->failed) return b->failed;
            if (dnn.get_attribute(configs[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e) ==
                CUDNN_STATUS_SUCCESS)
                (void)dnn.get_attribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &engine);
            if (s == CUDNN_STATUS_SUCCESS) {
                int64_t bytes = 0;
                s = dnn.get_attribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                      &bytes);
                if (s != CUDNN_STATUS_SUCCESS)
                    return builder_fail(b, "cudnnBackendGetAttribute", "execution plan",
                                        "CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE", s);
                p->plan = plan;
                p->engine = engine;
                p->cudnn_bytes = (size_t)(bytes > 0 ? bytes : 0);
                return TP_OK;
            }
            if (used < sizeof tried && configs_seen <= 4) {
                char message[256];
                int wrote = snprintf(tried + used, sizeof tried - used, "%sengine %lld (heuristics %s): %s%s%s",
                                     used ? "; " : "", (long long)engine, mode_names[m], dnn.error_string(s),
                                     dnn.last_error ? " " : "", last_error(message, sizeof message));
                used += wrote > 0 ? (size_t)wrote : 0;
            }
        }
    }
    if (!configs_seen)
        return b->failed = tp_fail(TP_ERR_DEVICE, "%s: cuDNN's heuristics (modes A and fallback) list no engine for "
                                                  "the graph%s%s",
                                   b->context, used ? ": " : "", tried);
    return b->failed = tp_fail(TP_ERR_DEVICE, "%s: none of the %d engines cuDNN's heuristics list finalized its "
                                              "execution plan (the first: %s)",
                               b->context, configs_seen, tried);
}

/* Why cuDNN's version cannot run this shape (NULL when it can). */
static const char *version_refuses(int64_t T)
{
    if (lib.version == 91000 || lib.version == 91001)
        return "cuDNN 9.10.0 and 9.10.1 have known bugs in their SDPA (the frontend refuses them)";
    if (lib.version <= 91500 && T % 128 != 0)
        return "before cuDNN 9.15.1 the backward needs a padding mask where T is not a multiple of 128 (not built "
               "here)";
    return NULL;
}

static int prepare_locked(cudnn_attention_graph graph, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd,
                          const cudnn_attention_plan **out)
{
    TP_TRY(cudnn_attention_shape_ok(B, T, Hq, Hkv, hd));
    TP_TRY(load_locked());
    const char *refused = version_refuses(T);
    if (refused)
        return tp_fail(TP_ERR_ARG, "cuDNN attention (T=%lld): %s; this is cuDNN %s", (long long)T, refused,
                       lib.version_text);
    for (int i = 0; i < plan_count; i++) {
        cudnn_attention_plan *p = &plans[i];
        if (p->kind == graph && p->B == B && p->T == T && p->Hq == Hq && p->Hkv == Hkv && p->hd == hd) {
            *out = p;
            return p->status ? tp_fail(p->status, "%s", p->why) : TP_OK;
        }
    }
    TP_TRY(handle_locked());
    if (plan_count == CUDNN_ATTENTION_PLANS)
        return tp_fail(TP_ERR_ARG,
                       "cuDNN attention: the table of plans is full (%d shapes and directions); B=%lld T=%lld Hq=%lld "
                       "Hkv=%lld hd=%lld is not kept",
                       CUDNN_ATTENTION_PLANS, (long long)B, (long long)T, (long long)Hq, (long long)Hkv,
                       (long long)hd);
    cudnn_attention_plan *p = &plans[plan_count++];
    memset(p, 0, sizeof *p);
    p->B = B, p->T = T, p->Hq = Hq, p->Hkv = Hkv, p->hd = hd, p->kind = graph;
    p->backward = graph != CUDNN_ATTENTION_FORWARD;
    p->accumulates_dq = graph == CUDNN_ATTENTION_BACKWARD;
    p->scale = 1.0f / sqrtf((float)hd);
    p->neg_inf = lib.version < 91000 ? -FLT_MAX : -INFINITY; /* as the frontend: older cuDNN wants the lowest */
    p->one = 1.0f;
    cudnn_attention_layout L = cudnn_attention_layout_of(B, T, Hq, Hkv, hd);
    build(&p->graph, graph, &L);
    p->status = p->graph.failed ? p->graph.failed : choose_engine(p);
    if (p->status) {
        snprintf(p->why, sizeof p->why, "%s", tp_errmsg());
        builder_free(&p->graph); /* the failure is kept, not the descriptors */
        p->plan = NULL;
    } else {
        size_t rows = (size_t)(B * Hq * T) * sizeof(float);
        p->softmax_sum_offset = aligned(p->cudnn_bytes);
        p->dq_accum_offset = p->softmax_sum_offset + (p->backward ? aligned(rows) : 0);
        p->workspace_bytes = p->dq_accum_offset + (p->accumulates_dq ? aligned(rows * (size_t)hd) : 0);
    }
    *out = p;
    return p->status ? tp_fail(p->status, "%s", p->why) : TP_OK;
}

extern "C" int cudnn_attention_prepare(cudnn_attention_graph graph, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                                       int64_t hd, const cudnn_attention_plan **plan)
{
    *plan = NULL;
    pthread_mutex_lock(&dnn_lock);
    int status = prepare_locked(graph, B, T, Hq, Hkv, hd, plan);
    pthread_mutex_unlock(&dnn_lock);
    if (status) *plan = NULL;
    return status;
}

extern "C" int64_t cudnn_attention_engine(const cudnn_attention_plan *plan)
{
    return plan->engine;
}

extern "C" size_t cudnn_attention_workspace_bytes(const cudnn_attention_plan *plan)
{
    return plan->workspace_bytes;
}

/* ==================================================================== runs */

extern "C" int cudnn_attention_run(const cudnn_attention_plan *p, const cudnn_attention_tensors *t)
{
    cudnn_attention_layout L = cudnn_attention_layout_of(p->B, p->T, p->Hq, p->Hkv, p->hd);
    char *qkv = (char *)t->qkv, *d_qkv = (char *)t->d_qkv, *workspace = (char *)t->workspace;
    size_t k = (size_t)L.k_offset * 2, v = (size_t)L.v_offset * 2; /* bf16 bytes */
    int64_t uids[16];
    void *pointers[16];
    int n = 0;
#define BIND(uid, pointer) (uids[n] = (uid), pointers[n] = (void *)(pointer), n++)
    BIND(CUDNN_UID_Q, qkv);
    BIND(CUDNN_UID_K, qkv + k);
    BIND(CUDNN_UID_V, qkv + v);
    BIND(CUDNN_UID_O, t->o);
    BIND(CUDNN_UID_STATS, t->stats);
    BIND(CUDNN_UID_SCALE, &p->scale);
    BIND(CUDNN_UID_NEG_INF, &p->neg_inf);
    if (p->backward) {
        BIND(CUDNN_UID_DO, t->d_o);
        BIND(CUDNN_UID_DQ, d_qkv);
        BIND(CUDNN_UID_DK, d_qkv + k);
        BIND(CUDNN_UID_DV, d_qkv + v);
        BIND(CUDNN_UID_ONE, &p->one);
        BIND(CUDNN_UID_SOFTMAX_SUM, workspace + p->softmax_sum_offset);
        if (p->accumulates_dq) BIND(CUDNN_UID_DQ_ACCUM, workspace + p->dq_accum_offset);
    }
#undef BIND
    int status = TP_OK;
    pthread_mutex_lock(&dnn_lock);
    /* Before cuDNN 9.6 the accumulator of dQ had to start at zero (the frontend clears it). */
    if (p->accumulates_dq && lib.version < 90600) {
        cudaError_t error = cudaMemsetAsync(workspace + p->dq_accum_offset, 0,
                                            p->workspace_bytes - p->dq_accum_offset, cuda_state.stream);
        if (error != cudaSuccess) {
            (void)cudaGetLastError();
            status = tp_fail(TP_ERR_DEVICE, "cuDNN attention backward: clearing dQ's accumulator: %s",
                             cudaGetErrorString(error));
        }
    }
    builder b = {};
    snprintf(b.context, sizeof b.context, "cuDNN %s attention %s run (B=%lld T=%lld Hq=%lld Hkv=%lld hd=%lld)",
             lib.version_text, graph_names[p->kind], (long long)p->B, (long long)p->T, (long long)p->Hq,
             (long long)p->Hkv, (long long)p->hd);
    b.failed = status;
    cudnnBackendDescriptor_t pack = MAKE(&b, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack");
    void *workspace_pointer = workspace;
    SET(&b, pack, "variant pack", CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    SET(&b, pack, "variant pack", CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, pointers);
    SET(&b, pack, "variant pack", CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace_pointer);
    finalize(&b, pack, "variant pack");
    if (!b.failed) {
        cudnnStatus_t s = dnn.execute(lib.handle, p->plan, pack);
        if (s != CUDNN_STATUS_SUCCESS) builder_fail(&b, "cudnnBackendExecute", "execution plan", NULL, s);
    }
    status = b.failed;
    builder_free(&b);
    pthread_mutex_unlock(&dnn_lock);
    return status;
}

/* ================================================================== tests */

static const char *type_name(cudnnDataType_t type)
{
    return type == CUDNN_DATA_BFLOAT16 ? "bf16" : type == CUDNN_DATA_FLOAT ? "fp32" : "other";
}

extern "C" int cudnn_attention_check_graph(cudnn_attention_graph graph, int64_t B, int64_t T, int64_t Hq,
                                           int64_t Hkv, int64_t hd, cudnn_attention_check *check)
{
    memset(check, 0, sizeof *check);
    pthread_mutex_lock(&dnn_lock);
    int status = load_locked();
    if (status) {
        pthread_mutex_unlock(&dnn_lock);
        return status;
    }
    builder b = {};
    cudnn_attention_layout L = cudnn_attention_layout_of(B, T, Hq, Hkv, hd);
    build(&b, graph, &L);
    status = b.failed;
    check->operations = b.operation_count;
    /* The tensors that are not virtual, as cuDNN holds them. */
    for (int i = 0; !status && i < b.count; i++) {
        cudnnBackendDescriptor_t d = b.owned[i];
        int64_t uid = 0, n = 0;
        if (dnn.get_attribute(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &n, &uid) != CUDNN_STATUS_SUCCESS)
            continue; /* not a tensor */
        if (uid >= CUDNN_UID_VIRTUAL || check->tensors == (int)(sizeof check->tensor / sizeof check->tensor[0]))
            continue;
        cudnn_tensor_readback *r = &check->tensor[check->tensors++];
        cudnnDataType_t type = CUDNN_DATA_FLOAT;
        bool by_value = false;
        r->uid = uid;
        cudnnStatus_t s = dnn.get_attribute(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, &n, r->dims);
        if (s == CUDNN_STATUS_SUCCESS)
            s = dnn.get_attribute(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, &n, r->strides);
        if (s == CUDNN_STATUS_SUCCESS)
            s = dnn.get_attribute(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &n, &type);
        if (s == CUDNN_STATUS_SUCCESS)
            s = dnn.get_attribute(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &n, &by_value);
        if (s != CUDNN_STATUS_SUCCESS) status = builder_fail(&b, "cudnnBackendGetAttribute", "a tensor", NULL, s);
        snprintf(r->type, sizeof r->type, "%s", type_name(type));
        r->by_value = by_value;
    }
    if (!status) {
        /* The graph without a handle: cuDNN may want one (a device). */
        cudnnBackendDescriptor_t graph = MAKE(&b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
        SET(&b, graph, "operation graph", CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
            b.operation_count, b.operations);
        status = b.failed;
        if (!status) {
            cudnnStatus_t s = dnn.finalize(graph);
            char message[256];
            check->graph_finalized = s == CUDNN_STATUS_SUCCESS;
            if (!check->graph_finalized)
                snprintf(check->graph_message, sizeof check->graph_message, "%s %s", dnn.error_string(s),
                         last_error(message, sizeof message));
        }
    }
    builder_free(&b);
    pthread_mutex_unlock(&dnn_lock);
    return status;
}

#else /* no cuDNN headers: the CUDA kernels run instead */

#define NO_CUDNN "this build has no cuDNN (its headers, cudnn_graph.h, were not found by nvcc)"

extern "C" int cudnn_attention_load(char *version, size_t size)
{
    (void)version, (void)size;
    return tp_fail(TP_ERR_DEVICE, NO_CUDNN);
}

extern "C" int cudnn_attention_prepare(cudnn_attention_graph graph, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                                       int64_t hd, const cudnn_attention_plan **plan)
{
    (void)graph, (void)B, (void)T, (void)Hq, (void)Hkv, (void)hd;
    *plan = NULL;
    return tp_fail(TP_ERR_DEVICE, NO_CUDNN);
}

extern "C" int64_t cudnn_attention_engine(const cudnn_attention_plan *plan)
{
    (void)plan;
    return -1;
}

extern "C" size_t cudnn_attention_workspace_bytes(const cudnn_attention_plan *plan)
{
    (void)plan;
    return 0;
}

extern "C" int cudnn_attention_run(const cudnn_attention_plan *plan, const cudnn_attention_tensors *tensors)
{
    (void)plan, (void)tensors;
    return tp_fail(TP_ERR_DEVICE, NO_CUDNN);
}

extern "C" int cudnn_attention_check_graph(cudnn_attention_graph graph, int64_t B, int64_t T, int64_t Hq,
                                           int64_t Hkv, int64_t hd, cudnn_attention_check *check)
{
    (void)graph, (void)B, (void)T, (void)Hq, (void)Hkv, (void)hd;
    memset(check, 0, sizeof *check);
    return tp_fail(TP_ERR_DEVICE, NO_CUDNN);
}

#endif
