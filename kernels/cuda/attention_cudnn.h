/* attention_cudnn.h: causal attention through cuDNN's fused flash attention
 * (scaled dot-product attention, SDPA), forward and backward, for the bf16
 * operations of the CUDA backend (attention.cu); private to kernels/cuda and
 * its tests. Plain C: the layout below is computed and tested without a GPU.
 *
 * cuDNN is loaded at run time (dlopen, libraries.h: the toolkit, PyTorch's
 * nvidia/cudnn wheel, TP_CUDA_LIBRARY_PATH), not linked, as cuBLAS is. Its
 * backend (graph) API builds, once per shape and direction, the operation
 * graph that NVIDIA's cudnn-frontend builds for SDPA (its "composite" nodes:
 * node/scaled_dot_product_flash_attention.h, the softmax, diagonal band mask,
 * pointwise, matmul and reduction nodes): the scores Q K^T, scaled by
 * 1/sqrt(hd), the causal mask (row and column indices, row >= column, -inf
 * elsewhere), softmax with its statistics, then P V; the backward as the
 * frontend's CompositeSDPABackwardNode (dV = P^T dO, dP = dO V^T, dS = P (dP -
 * rowsum(dO O)) scale, dK = dS^T Q, dQ = dS K through an fp32 accumulator;
 * grouped heads reduced per key/value head), or, deterministic, with dQ = dS K
 * written as dQ itself (below). cuDNN's heuristics (mode A, then
 * its fallback list) pick the engine; the first whose execution plan
 * finalizes is kept, with its workspace size, in a table of at most
 * CUDNN_ATTENTION_PLANS shapes (a shape beyond it is refused, said so).
 *
 * Tensors (B batches, T positions, Hq query and Hkv key/value heads of hd):
 * Q, K, V are bf16 views of the packed qkv[B, T, (Hq + 2 Hkv) hd] (position
 * t of batch b at row b T + t; query head h at column h hd, key head j at
 * (Hq + j) hd, value head j at (Hq + Hkv + j) hd): dims [B, H, T, hd], strides
 * [T S, hd, S, 1] with S = (Hq + 2 Hkv) hd, from the start of each head
 * group. O and dO are [B, Hq, T, hd] of out[B, T, Hq hd]; dQ, dK, dV the
 * views of d_qkv as of qkv. Stats, fp32 [B, Hq, T, 1], is the softmax's
 * max + log(sum of exp(score - max)) of the scaled, masked scores in natural
 * log (the frontend's composite softmax: reductions MAX and ADD, LOG, ADD):
 * exactly kernels.h's lse[B, Hq, T], so that no conversion is needed.
 *
 * What cuDNN takes (checked before a graph is built; the CUDA kernels run
 * otherwise): head sizes CUDNN_ATTENTION_MIN_HEAD to CUDNN_ATTENTION_MAX_HEAD,
 * multiples of 8 (cuDNN goes beyond on some GPUs; this is the range this
 * toolkit asks for and tests); T >= 2 (cuDNN's backward refuses one row and
 * one key); Hq a multiple of Hkv; a GPU of compute capability 8.0 or later;
 * cuDNN 9, not 9.10.0 or 9.10.1 (their SDPA has known bugs, as the frontend
 * says), and from 9.15.1 on where T is not a multiple of 128 (before, the
 * frontend works around a backward bug with a padding mask, not built here).
 * cuDNN reads Q, K, V as views of qkv's bits (a bf16 activation: kernels.h)
 * and dO as d_out's (a bf16 gradient), writes O, dQ, dK and dV in bf16 (O
 * is out itself, a bf16 activation too; dQ, dK, dV views of d_qkv, a bf16
 * gradient) and multiplies bf16 probabilities by V (and dO): its results
 * differ from the CPU twin (attention_forward_bf16 and
 * attention_backward_bf16, whose out and d_qkv are their fp32 results
 * rounded once) by those roundings, within bf16's precision. */
#ifndef TP_KERNELS_CUDA_ATTENTION_CUDNN_H
#define TP_KERNELS_CUDA_ATTENTION_CUDNN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDNN_ATTENTION_MIN_HEAD 64
#define CUDNN_ATTENTION_MAX_HEAD 128
#define CUDNN_ATTENTION_PLANS 32 /* shapes and directions whose plans are kept */

/* The unique ids of the graphs' tensors that are not virtual (the variant
 * pack names them); virtual tensors take ids from CUDNN_UID_VIRTUAL on. */
enum {
    CUDNN_UID_Q = 1,
    CUDNN_UID_K,          /* K^T in the graphs: [B, Hkv, hd, T], the same memory */
    CUDNN_UID_V,          /* V^T in the backward's */
    CUDNN_UID_O,
    CUDNN_UID_STATS,
    CUDNN_UID_SCALE,      /* 1/sqrt(hd), fp32, by value */
    CUDNN_UID_NEG_INF,    /* the masked scores' value, fp32, by value */
    CUDNN_UID_DO,
    CUDNN_UID_DQ,
    CUDNN_UID_DK,
    CUDNN_UID_DV,
    CUDNN_UID_ONE,        /* 1, fp32, by value: the backward's dropout scale */
    CUDNN_UID_SOFTMAX_SUM, /* fp32 [B, Hq, T, 1]: rowsum(dO O), in the workspace */
    CUDNN_UID_DQ_ACCUM,   /* fp32 [B, Hq, T, hd]: dQ's accumulator, in the workspace */
    CUDNN_UID_VIRTUAL = 100
};

/* Which graph. The backward sums dQ over the key tiles in an fp32
 * accumulator (CUDNN_UID_DQ_ACCUM) with atomics, in whatever order the
 * tiles finish: dQ's last bits, and so a run's, vary from run to run. The
 * deterministic backward is the frontend's "deterministic algorithm" on
 * Hopper (its dP workspace implementation): no accumulator, dQ = dS K
 * written as dQ, which cuDNN computes from dP kept in its workspace
 * (B Hq T T bf16: about 100 MB for GPT-2 124M at micro-batch 4) in a fixed
 * order. Blackwell's deterministic engines need knobs not set here. */
typedef enum {
    CUDNN_ATTENTION_FORWARD,
    CUDNN_ATTENTION_BACKWARD,
    CUDNN_ATTENTION_BACKWARD_DETERMINISTIC
} cudnn_attention_graph;

/* A tensor's dims and strides (elements) as cuDNN is told them. */
typedef struct {
    int64_t dims[4], strides[4];
} cudnn_tensor_shape;

typedef struct {
    int64_t B, T, Hq, Hkv, hd;
    cudnn_tensor_shape q, k, v;  /* [B, H, T, hd] of qkv (and d_qkv), each from its group's first head */
    int64_t k_offset, v_offset;  /* elements from qkv's start to K's and V's first heads */
    cudnn_tensor_shape o;        /* [B, Hq, T, hd] of out (and d_out) [B, T, Hq hd] */
    cudnn_tensor_shape stats;    /* [B, Hq, T, 1] of lse [B, Hq, T], fp32 */
} cudnn_attention_layout;

static inline cudnn_tensor_shape cudnn_shape(int64_t d0, int64_t d1, int64_t d2, int64_t d3, int64_t s0, int64_t s1,
                                             int64_t s2, int64_t s3)
{
    cudnn_tensor_shape t = {{d0, d1, d2, d3}, {s0, s1, s2, s3}};
    return t;
}

/* The same memory with its last two dimensions swapped (K^T of K). */
static inline cudnn_tensor_shape cudnn_transposed(cudnn_tensor_shape t)
{
    return cudnn_shape(t.dims[0], t.dims[1], t.dims[3], t.dims[2], t.strides[0], t.strides[1], t.strides[3],
                       t.strides[2]);
}

static inline cudnn_attention_layout cudnn_attention_layout_of(int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                                                               int64_t hd)
{
    int64_t S = (Hq + 2 * Hkv) * hd, O = Hq * hd;
    cudnn_attention_layout L = {B,
                                T,
                                Hq,
                                Hkv,
                                hd,
                                cudnn_shape(B, Hq, T, hd, T * S, hd, S, 1),
                                cudnn_shape(B, Hkv, T, hd, T * S, hd, S, 1),
                                cudnn_shape(B, Hkv, T, hd, T * S, hd, S, 1),
                                Hq * hd,
                                (Hq + Hkv) * hd,
                                cudnn_shape(B, Hq, T, hd, T * O, hd, O, 1),
                                cudnn_shape(B, Hq, T, 1, Hq * T, T, 1, 1)};
    return L;
}

/* Whether this toolkit asks cuDNN for the shape (the checks that need no
 * library: heads, T): TP_OK, or TP_ERR_ARG saying why not. */
int cudnn_attention_shape_ok(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd);

/* Loads cuDNN once per process (a failure is kept and reported again):
 * TP_OK with its version ("9.19.0") in version, or TP_ERR_DEVICE naming
 * what is missing. Needs no GPU. */
int cudnn_attention_load(char *version, size_t size);

/* The execution plan of one graph for a shape, built
 * on the first call (the backend must be made: a cuDNN handle on its stream,
 * also made on the first call) and kept; a failure is kept too and reported
 * again. TP_ERR_DEVICE names the step that failed: the cuDNN call, the
 * descriptor and attribute, cuDNN's status and its last error message. */
typedef struct cudnn_attention_plan cudnn_attention_plan;
int cudnn_attention_prepare(cudnn_attention_graph graph, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd,
                            const cudnn_attention_plan **plan);

/* For a start line: "engine N" of cuDNN's global engine list. */
int64_t cudnn_attention_engine(const cudnn_attention_plan *plan);

/* Device memory a run of the plan needs besides its tensors: cuDNN's
 * workspace, and the backward's fp32 rowsum(dO O) and dQ accumulator (not
 * the deterministic backward's). */
size_t cudnn_attention_workspace_bytes(const cudnn_attention_plan *plan);

/* Device pointers of one run (16-byte aligned): qkv bf16 [B, T, (Hq + 2 Hkv)
 * hd]; o bf16 [B, T, Hq hd]; stats fp32 [B, Hq, T] (written by the forward,
 * read by the backward); the backward's d_o (as o) and d_qkv (as qkv, written
 * whole: every element belongs to dQ, dK or dV); workspace of
 * cudnn_attention_workspace_bytes. */
typedef struct {
    void *qkv, *o, *stats, *d_o, *d_qkv, *workspace;
} cudnn_attention_tensors;

/* Queues the plan's work on the backend's stream. Call from a thread whose
 * current device is the backend's. TP_ERR_DEVICE with cuDNN's reason. */
int cudnn_attention_run(const cudnn_attention_plan *plan, const cudnn_attention_tensors *tensors);

/* ----------------------------------------------------------------- tests
 * What can be checked without a GPU (tests/kernels/test_attention_cudnn.c):
 * every descriptor of a graph built and finalized (the tensors,
 * the pointwise, matmul, reduction and reshape operations), the tensors that
 * are not virtual read back from cuDNN, and whether the operation graph
 * itself finalizes without a handle (cuDNN 9 may need a device for it). */
typedef struct {
    int64_t uid, dims[4], strides[4];
    char type[8]; /* "bf16", "fp32" */
    int by_value;
} cudnn_tensor_readback;

typedef struct {
    int operations;                  /* operation descriptors finalized */
    int tensors;                     /* tensors read back */
    cudnn_tensor_readback tensor[20];
    int graph_finalized;             /* the operation graph finalized without a handle */
    char graph_message[512];         /* otherwise cuDNN's status and message */
} cudnn_attention_check;

/* TP_OK with check filled when every descriptor finalized; else the failing
 * step's message (TP_ERR_DEVICE; or no cuDNN: TP_ERR_DEVICE from loading). */
int cudnn_attention_check_graph(cudnn_attention_graph graph, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd,
                                cudnn_attention_check *check);

#ifdef __cplusplus
}
#endif

#endif
