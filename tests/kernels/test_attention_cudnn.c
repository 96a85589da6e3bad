/* cuDNN's flash attention (kernels/cuda/attention_cudnn.h) as far as it is
 * checked without a GPU: the dims and strides of the packed layout (any
 * build), the shapes this toolkit asks cuDNN for, and, where cuDNN is
 * installed, the library found by the search of libraries.h and every
 * descriptor of both graphs built and finalized, its tensors read back from
 * cuDNN. What needs a device (the operation graph with a handle, the
 * engines, the runs) is in test_cuda_backend.c. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "../../kernels/cuda/attention_cudnn.h"
#include "../../kernels/kernels.h"

static void assert_shape(cudnn_tensor_shape got, const int64_t dims[4], const int64_t strides[4], const char *what)
{
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(got.dims[i], dims[i], "%s: dims[%d] %lld, want %lld", what, i, (long long)got.dims[i],
                     (long long)dims[i]);
        cr_assert_eq(got.strides[i], strides[i], "%s: strides[%d] %lld, want %lld", what, i,
                     (long long)got.strides[i], (long long)strides[i]);
    }
}

/* B=2, T=100, Hq=4, Hkv=2, hd=64: a row of qkv holds (4 + 2 + 2) 64 = 512
 * values, of out 256. Written out by hand. */
Test(attention_cudnn, layout_by_hand)
{
    cudnn_attention_layout L = cudnn_attention_layout_of(2, 100, 4, 2, 64);
    assert_shape(L.q, (int64_t[]){2, 4, 100, 64}, (int64_t[]){51200, 64, 512, 1}, "Q");
    assert_shape(L.k, (int64_t[]){2, 2, 100, 64}, (int64_t[]){51200, 64, 512, 1}, "K");
    assert_shape(L.v, (int64_t[]){2, 2, 100, 64}, (int64_t[]){51200, 64, 512, 1}, "V");
    cr_assert_eq(L.k_offset, 256, "K's first head after Q's 4 heads of 64");
    cr_assert_eq(L.v_offset, 384, "V's after K's 2 more");
    assert_shape(L.o, (int64_t[]){2, 4, 100, 64}, (int64_t[]){25600, 64, 256, 1}, "O");
    assert_shape(L.stats, (int64_t[]){2, 4, 100, 1}, (int64_t[]){400, 100, 1, 1}, "Stats");
    assert_shape(cudnn_transposed(L.k), (int64_t[]){2, 2, 64, 100}, (int64_t[]){51200, 64, 1, 512}, "K^T");
}

/* Every element the views address is the one kernels.h's packed layout
 * puts there: qkv[(b T + t) S + h hd + d] for Q, (Hq + j) hd for key head j,
 * (Hq + Hkv + j) hd for value head j; out[(b T + t) Hq hd + h hd + d];
 * lse[(b Hq + h) T + t]. Over several shapes, every index. */
Test(attention_cudnn, layout_addresses_the_packed_tensors)
{
    static const int64_t shapes[][5] = {{2, 100, 4, 2, 64}, {1, 130, 4, 2, 128}, {3, 7, 2, 2, 72}, {1, 5, 6, 1, 8}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t B = shapes[s][0], T = shapes[s][1], Hq = shapes[s][2], Hkv = shapes[s][3], hd = shapes[s][4];
        int64_t S = (Hq + 2 * Hkv) * hd;
        cudnn_attention_layout L = cudnn_attention_layout_of(B, T, Hq, Hkv, hd);
        cudnn_tensor_shape kt = cudnn_transposed(L.k);
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < T; t++)
                for (int64_t d = 0; d < hd; d++) {
                    for (int64_t h = 0; h < Hq; h++) {
                        int64_t q = b * L.q.strides[0] + h * L.q.strides[1] + t * L.q.strides[2] + d * L.q.strides[3];
                        int64_t o = b * L.o.strides[0] + h * L.o.strides[1] + t * L.o.strides[2] + d * L.o.strides[3];
                        cr_assert_eq(q, (b * T + t) * S + h * hd + d, "Q[%lld,%lld,%lld,%lld]", (long long)b,
                                     (long long)h, (long long)t, (long long)d);
                        cr_assert_eq(o, (b * T + t) * Hq * hd + h * hd + d, "O");
                        if (d == 0)
                            cr_assert_eq(b * L.stats.strides[0] + h * L.stats.strides[1] + t * L.stats.strides[2],
                                         (b * Hq + h) * T + t, "Stats");
                    }
                    for (int64_t j = 0; j < Hkv; j++) {
                        int64_t k = L.k_offset + b * L.k.strides[0] + j * L.k.strides[1] + t * L.k.strides[2] +
                                    d * L.k.strides[3];
                        int64_t v = L.v_offset + b * L.v.strides[0] + j * L.v.strides[1] + t * L.v.strides[2] +
                                    d * L.v.strides[3];
                        int64_t k_t = L.k_offset + b * kt.strides[0] + j * kt.strides[1] + d * kt.strides[2] +
                                      t * kt.strides[3];
                        cr_assert_eq(k, (b * T + t) * S + (Hq + j) * hd + d, "K");
                        cr_assert_eq(v, (b * T + t) * S + (Hq + Hkv + j) * hd + d, "V");
                        cr_assert_eq(k_t, k, "K^T[b, j, d, t] is K[b, j, t, d]");
                    }
                }
        /* 16-byte alignment of K's and V's views: hd a multiple of 8 bf16 values */
        if (hd % 8 == 0) cr_assert(L.k_offset * 2 % 16 == 0 && L.v_offset * 2 % 16 == 0);
    }
}

static int cuda_skip(void)
{
    return !cuda_built();
}

Test(attention_cudnn, shapes_asked_for)
{
    if (cuda_skip()) cr_skip_test("built without CUDA");
    cr_assert_eq(cudnn_attention_shape_ok(2, 100, 4, 2, 64), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(cudnn_attention_shape_ok(1, 2, 1, 1, 128), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(cudnn_attention_shape_ok(1, 8, 2, 1, 72), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(cudnn_attention_shape_ok(1, 8, 2, 1, 32), TP_ERR_ARG, "head size 32");
    cr_assert(strstr(tp_errmsg(), "head size") != NULL, "%s", tp_errmsg());
    cr_assert_eq(cudnn_attention_shape_ok(1, 8, 2, 1, 136), TP_ERR_ARG, "head size 136");
    cr_assert_eq(cudnn_attention_shape_ok(1, 8, 2, 1, 100), TP_ERR_ARG, "head size 100, not a multiple of 8");
    cr_assert_eq(cudnn_attention_shape_ok(1, 1, 2, 1, 64), TP_ERR_ARG, "T = 1");
    cr_assert_eq(cudnn_attention_shape_ok(1, 8, 3, 2, 64), TP_ERR_ARG, "Hq not a multiple of Hkv");
}

/* cuDNN from the search of libraries.h (here: the toolkit's lib64), or a
 * skip where it is not installed. */
static void need_cudnn(char *version, size_t size)
{
    if (cuda_skip()) cr_skip_test("built without CUDA");
    int status = cudnn_attention_load(version, size);
    if (status && strstr(tp_errmsg(), "not found")) cr_skip_test("%s", tp_errmsg());
    cr_assert_eq(status, TP_OK, "%s", tp_errmsg());
}

Test(attention_cudnn, loads_cudnn_9)
{
    char version[32];
    need_cudnn(version, sizeof version);
    cr_log_info("cuDNN %s", version);
    cr_assert(strncmp(version, "9.", 2) == 0, "version %s", version);
    char again[32];
    cr_assert_eq(cudnn_attention_load(again, sizeof again), TP_OK, "a second load: %s", tp_errmsg());
    cr_assert_str_eq(again, version);
}

/* The tensors that are not virtual, as cuDNN read them back: each of the
 * expected uids once, with the layout's dims and strides (K and V as the
 * graphs take them: K^T always, V^T in the backward) and type. */
typedef struct {
    int64_t uid;
    cudnn_tensor_shape shape;
    const char *type;
    int by_value;
} expected_tensor;

static void check_tensors(const cudnn_attention_check *c, const expected_tensor *want, int count, const char *graph)
{
    cr_assert_eq(c->tensors, count, "%s: %d tensors not virtual, want %d", graph, c->tensors, count);
    for (int i = 0; i < count; i++) {
        const cudnn_tensor_readback *got = NULL;
        for (int j = 0; j < c->tensors; j++)
            if (c->tensor[j].uid == want[i].uid) got = &c->tensor[j];
        cr_assert(got, "%s: no tensor of uid %lld", graph, (long long)want[i].uid);
        char what[64];
        snprintf(what, sizeof what, "%s tensor %lld", graph, (long long)want[i].uid);
        cudnn_tensor_shape held;
        memcpy(held.dims, got->dims, sizeof held.dims);
        memcpy(held.strides, got->strides, sizeof held.strides);
        assert_shape(held, want[i].shape.dims, want[i].shape.strides, what);
        cr_assert_str_eq(got->type, want[i].type, "%s: type %s, want %s", what, got->type, want[i].type);
        cr_assert_eq(got->by_value, want[i].by_value, "%s: by value", what);
    }
}

static cudnn_tensor_shape scalar_shape(void)
{
    return (cudnn_tensor_shape){{1, 1, 1, 1}, {1, 1, 1, 1}};
}

/* cuDNN's minor version from "9.M.P". */
static int minor_of(const char *version)
{
    return atoi(strchr(version, '.') + 1);
}

/* Both graphs of two shapes (grouped heads, T not a multiple of 64; and as
 * many key/value heads as query heads at hd 128), every descriptor
 * finalized: 14 operations forward (bmm1, the scale, the causal mask's 4,
 * softmax's 7, bmm2); backward 22 with a key/value head per query head
 * (rowsum(dO O)'s 3, Q K^T, the scale, minus Stats, the mask's 4, exp, P^T,
 * dV, dO V^T, dS's 3, dS^T, dK, K, dQ and its conversion), 24 with grouped
 * heads (the reductions of dK and dV over a group); the deterministic
 * backward one fewer (dQ written as dQ: no conversion) and no accumulator
 * among its tensors. The operation graphs
 * finalize too from cuDNN 9.8 on, which needs no handle for them (before,
 * their outcome is logged): cuDNN has checked how the operations connect. */
Test(attention_cudnn, graphs_finalize_without_a_device)
{
    char version[32];
    need_cudnn(version, sizeof version);
    static const int64_t shapes[][5] = {{2, 100, 4, 2, 64}, {1, 130, 2, 2, 128}};
    for (int s = 0; s < 2; s++) {
        int64_t B = shapes[s][0], T = shapes[s][1], Hq = shapes[s][2], Hkv = shapes[s][3], hd = shapes[s][4];
        cudnn_attention_layout L = cudnn_attention_layout_of(B, T, Hq, Hkv, hd);
        cudnn_tensor_shape rows = {{B, Hq, T, 1}, {Hq * T, T, 1, 1}};
        cudnn_tensor_shape accum = {{B, Hq, T, hd}, {Hq * T * hd, T * hd, hd, 1}};
        cudnn_attention_check c;

        cr_assert_eq(cudnn_attention_check_graph(CUDNN_ATTENTION_FORWARD, B, T, Hq, Hkv, hd, &c), TP_OK, "forward: %s", tp_errmsg());
        cr_assert_eq(c.operations, 14, "forward: %d operations", c.operations);
        expected_tensor forward[] = {
            {CUDNN_UID_Q, L.q, "bf16", 0},          {CUDNN_UID_K, cudnn_transposed(L.k), "bf16", 0},
            {CUDNN_UID_V, L.v, "bf16", 0},          {CUDNN_UID_O, L.o, "bf16", 0},
            {CUDNN_UID_STATS, L.stats, "fp32", 0},  {CUDNN_UID_SCALE, scalar_shape(), "fp32", 1},
            {CUDNN_UID_NEG_INF, scalar_shape(), "fp32", 1},
        };
        check_tensors(&c, forward, sizeof forward / sizeof forward[0], "forward");
        cr_log_info("cuDNN %s, forward B=%lld T=%lld Hq=%lld Hkv=%lld hd=%lld: the operation graph %s%s", version,
                    (long long)B, (long long)T, (long long)Hq, (long long)Hkv, (long long)hd,
                    c.graph_finalized ? "finalized without a handle" : "did not finalize without a handle: ",
                    c.graph_message);
        if (minor_of(version) >= 8) cr_assert(c.graph_finalized, "forward graph: %s", c.graph_message);

        cr_assert_eq(cudnn_attention_check_graph(CUDNN_ATTENTION_BACKWARD, B, T, Hq, Hkv, hd, &c), TP_OK,
                     "backward: %s", tp_errmsg());
        cr_assert_eq(c.operations, Hq == Hkv ? 22 : 24, "backward: %d operations", c.operations);
        expected_tensor backward[] = {
            {CUDNN_UID_Q, L.q, "bf16", 0},
            {CUDNN_UID_K, cudnn_transposed(L.k), "bf16", 0},
            {CUDNN_UID_V, cudnn_transposed(L.v), "bf16", 0},
            {CUDNN_UID_O, L.o, "bf16", 0},
            {CUDNN_UID_STATS, L.stats, "fp32", 0},
            {CUDNN_UID_SCALE, scalar_shape(), "fp32", 1},
            {CUDNN_UID_NEG_INF, scalar_shape(), "fp32", 1},
            {CUDNN_UID_DO, L.o, "bf16", 0},
            {CUDNN_UID_DQ, L.q, "bf16", 0},
            {CUDNN_UID_DK, L.k, "bf16", 0},
            {CUDNN_UID_DV, L.v, "bf16", 0},
            {CUDNN_UID_ONE, scalar_shape(), "fp32", 1},
            {CUDNN_UID_SOFTMAX_SUM, rows, "fp32", 0},
            {CUDNN_UID_DQ_ACCUM, accum, "fp32", 0},
        };
        check_tensors(&c, backward, sizeof backward / sizeof backward[0], "backward");
        cr_log_info("cuDNN %s, backward: the operation graph %s%s", version,
                    c.graph_finalized ? "finalized without a handle" : "did not finalize without a handle: ",
                    c.graph_message);
        if (minor_of(version) >= 8) cr_assert(c.graph_finalized, "backward graph: %s", c.graph_message);

        cr_assert_eq(cudnn_attention_check_graph(CUDNN_ATTENTION_BACKWARD_DETERMINISTIC, B, T, Hq, Hkv, hd, &c),
                     TP_OK, "deterministic backward: %s", tp_errmsg());
        cr_assert_eq(c.operations, Hq == Hkv ? 21 : 23, "deterministic backward: %d operations", c.operations);
        check_tensors(&c, backward, sizeof backward / sizeof backward[0] - 1, "deterministic backward");
        cr_log_info("cuDNN %s, deterministic backward: the operation graph %s%s", version,
                    c.graph_finalized ? "finalized without a handle" : "did not finalize without a handle: ",
                    c.graph_message);
        if (minor_of(version) >= 8) cr_assert(c.graph_finalized, "deterministic backward graph: %s", c.graph_message);
    }
}
