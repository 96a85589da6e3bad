/* attention.cu: the CUDA backend's attention operations. fp32: causal
 * attention with a warp per row, the twin of cpu/attention.c, or the tiled
 * kernels (attention_tiled.cu) or the tensor cores' (attention_tf32x3.cu)
 * where they fit and are chosen. bf16 (qkv, out,
 * d_out and d_qkv as bf16 bits): cuDNN's flash attention (attention_cudnn.cu)
 * on those bits as they are, or the fp32 kernels on the same values widened
 * where cuDNN is not used. Which one runs: cuda_attention_variant
 * (attention_tiled.h), and the start line's text, cuda_describe_attention. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

extern "C" {
#include "../kernels.h"
}
#include "../convert_bits.h"
#include "attention_cudnn.h"
#include "attention_tf32x3.h"
#include "attention_tiled.h"
#include "internal.h"
#include "launch.h"

/* ============================================================== attention
 * qkv[B,T,(Hq+2Hkv)*hd]: at position t of batch b, query head h at
 * (b T + t) stride + h hd, its key head (h / group) at Hq hd + (h / group) hd
 * and its value head at (Hq + Hkv + h / group) hd, stride = (Hq + 2 Hkv) hd,
 * group = Hq / Hkv. out[B,T,Hq*hd]; lse[B,Hq,T], row r = (b Hq + h) T + i.
 *
 * Memory-efficient, as attention.c: no [T, T] matrix anywhere. A warp per
 * row: each lane holds the dimensions d = lane + 32 e (e < HEAD_DIMS_PER_LANE)
 * of the row's vectors in registers, a score is the warp's sum of the lanes'
 * partial products (every lane gets the same value), and the forward keeps a
 * running maximum and sum (online softmax) so that one pass over the keys
 * suffices. The backward recomputes each probability from lse: one kernel
 * per query row (dq, and delta_i = d_out_i . out_i for the other), one per
 * key row (dk and dv over the query rows and heads that see it). Every
 * element of d_qkv has one writer: no atomics, no zeroing. */

#define HEAD_DIMS_PER_LANE 8 /* head dimensions up to 256 */

/* w runs over warps of the grid (all lanes of a warp see the same w). */
#define WARPS_OF_GRID(w, count)                                                                                        \
    for (int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5; w < (count);                           \
         w += ((int64_t)gridDim.x * blockDim.x) >> 5)
#define LANE_DIMS(e, d, hd)                                                                                            \
    _Pragma("unroll") for (int e = 0, d = (int)(threadIdx.x & 31); e < HEAD_DIMS_PER_LANE && d < (hd); e++, d += 32)

/* The warp's dot product of a row held in registers with the row at p. */
static __device__ float warp_dot(const float *held, const float *p, int64_t hd)
{
    float partial = 0;
    LANE_DIMS(e, d, hd) partial += held[e] * p[d];
    return warp_sum(partial);
}

static __device__ void load_row(float *held, const float *p, int64_t hd)
{
    LANE_DIMS(e, d, hd) held[e] = p[d];
}

static __global__ void attention_forward_kernel(float *out, float *lse, const float *qkv, int64_t B, int64_t T,
                                                int64_t Hq, int64_t Hkv, int64_t hd, float scale)
{
    int64_t stride = (Hq + 2 * Hkv) * hd, group = Hq / Hkv;
    WARPS_OF_GRID(r, B * Hq * T) {
        int64_t i = r % T, h = (r / T) % Hq, b = r / (T * Hq);
        const float *k = qkv + b * T * stride + (Hq + h / group) * hd; /* key j at k + j stride */
        const float *v = qkv + b * T * stride + (Hq + Hkv + h / group) * hd;
        float q[HEAD_DIMS_PER_LANE], acc[HEAD_DIMS_PER_LANE] = {0};
        load_row(q, qkv + (b * T + i) * stride + h * hd, hd);
        float max = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= i; j++) {
            float s = warp_dot(q, k + j * stride, hd) * scale;
            float new_max = fmaxf(max, s), rescale = expf(max - new_max), p = expf(s - new_max);
            sum = sum * rescale + p;
            LANE_DIMS(e, d, hd) acc[e] = acc[e] * rescale + p * v[j * stride + d];
            max = new_max;
        }
        float *o = out + (b * T + i) * Hq * hd + h * hd;
        LANE_DIMS(e, d, hd) o[d] = acc[e] / sum;
        if ((threadIdx.x & 31) == 0) lse[r] = max + logf(sum);
    }
}

/* A warp per query row r: delta[r] = d_out_i . out_i, then
 * dq_i = sum_{j <= i} p_ij (d_out_i . v_j - delta) scale k_j. */
static __global__ void attention_backward_queries_kernel(float *d_qkv, float *delta, const float *d_out,
                                                         const float *qkv, const float *out, const float *lse,
                                                         int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd,
                                                         float scale)
{
    int64_t stride = (Hq + 2 * Hkv) * hd, group = Hq / Hkv;
    WARPS_OF_GRID(r, B * Hq * T) {
        int64_t i = r % T, h = (r / T) % Hq, b = r / (T * Hq), row = (b * T + i) * Hq * hd + h * hd;
        const float *k = qkv + b * T * stride + (Hq + h / group) * hd;
        const float *v = qkv + b * T * stride + (Hq + Hkv + h / group) * hd;
        float q[HEAD_DIMS_PER_LANE], g[HEAD_DIMS_PER_LANE], dq[HEAD_DIMS_PER_LANE] = {0};
        load_row(q, qkv + (b * T + i) * stride + h * hd, hd);
        load_row(g, d_out + row, hd);
        float row_delta = warp_dot(g, out + row, hd), row_lse = lse[r];
        if ((threadIdx.x & 31) == 0) delta[r] = row_delta;
        for (int64_t j = 0; j <= i; j++) {
            float p = expf(warp_dot(q, k + j * stride, hd) * scale - row_lse);
            float ds = p * (warp_dot(g, v + j * stride, hd) - row_delta) * scale;
            LANE_DIMS(e, d, hd) dq[e] += ds * k[j * stride + d];
        }
        float *dst = d_qkv + (b * T + i) * stride + h * hd;
        LANE_DIMS(e, d, hd) dst[d] = dq[e];
    }
}

/* A warp per key row (b, key head kh, j), after the queries kernel (delta):
 * over the group's query heads h and rows i >= j,
 * dk_j = sum p_ij (d_out_i . v_j - delta_i) scale q_i, dv_j = sum p_ij d_out_i. */
static __global__ void attention_backward_keys_kernel(float *d_qkv, const float *delta, const float *d_out,
                                                      const float *qkv, const float *lse, int64_t B, int64_t T,
                                                      int64_t Hq, int64_t Hkv, int64_t hd, float scale)
{
    int64_t stride = (Hq + 2 * Hkv) * hd, group = Hq / Hkv;
    WARPS_OF_GRID(r, B * Hkv * T) {
        int64_t j = r % T, kh = (r / T) % Hkv, b = r / (T * Hkv);
        float k[HEAD_DIMS_PER_LANE], v[HEAD_DIMS_PER_LANE], dk[HEAD_DIMS_PER_LANE] = {0}, dv[HEAD_DIMS_PER_LANE] = {0};
        load_row(k, qkv + (b * T + j) * stride + (Hq + kh) * hd, hd);
        load_row(v, qkv + (b * T + j) * stride + (Hq + Hkv + kh) * hd, hd);
        for (int64_t h = kh * group; h < (kh + 1) * group; h++) {
            const float *row_lse = lse + (b * Hq + h) * T, *row_delta = delta + (b * Hq + h) * T;
            for (int64_t i = j; i < T; i++) {
                const float *q = qkv + (b * T + i) * stride + h * hd, *g = d_out + (b * T + i) * Hq * hd + h * hd;
                float p = expf(warp_dot(k, q, hd) * scale - row_lse[i]);
                float ds = p * (warp_dot(v, g, hd) - row_delta[i]) * scale;
                LANE_DIMS(e, d, hd) dk[e] += ds * q[d], dv[e] += p * g[d];
            }
        }
        float *dst = d_qkv + (b * T + j) * stride;
        LANE_DIMS(e, d, hd) dst[(Hq + kh) * hd + d] = dk[e], dst[(Hq + Hkv + kh) * hd + d] = dv[e];
    }
}

static int attention_shape_ok(const char *what, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd)
{
    if (B < 0 || T < 0 || Hq < 0 || hd <= 0 || hd > 32 * HEAD_DIMS_PER_LANE || Hkv <= 0 || Hq % Hkv != 0)
        return tp_fail(TP_ERR_ARG,
                       "CUDA %s: B=%lld T=%lld Hq=%lld Hkv=%lld hd=%lld (want 0 < hd <= %d and Hq a multiple of "
                       "Hkv > 0)",
                       what, (long long)B, (long long)T, (long long)Hq, (long long)Hkv, (long long)hd,
                       32 * HEAD_DIMS_PER_LANE);
    return TP_OK;
}

/* The fp32 attention on device memory: the tensor cores' kernels where
 * chosen (TP_CUDA_ATTENTION=tf32x3) and they fit, else the tiled kernels
 * where they fit and are not set aside (TP_CUDA_ATTENTION=rows), else the
 * rows kernels. The caller checked the shape and entered (ENTER); nothing
 * is empty. */
static int tf32x3_runs(int64_t B, int64_t Hq, int64_t hd)
{
    return cuda_attention_chosen() == CUDA_ATTENTION_TF32X3 && cuda_attention_tf32x3_fits(B, Hq, hd) &&
           cuda_attention_tf32x3_shared_fits(hd, cuda_state.device);
}

static int tiled_runs(int64_t B, int64_t Hq, int64_t hd)
{
    return !tf32x3_runs(B, Hq, hd) && cuda_attention_chosen() != CUDA_ATTENTION_ROWS &&
           cuda_attention_tiled_fits(B, Hq, hd);
}

static int forward_fp32(float *out, float *lse, const float *qkv, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                        int64_t hd)
{
    if (tf32x3_runs(B, Hq, hd))
        return cuda_attention_tf32x3_forward(out, lse, qkv, B, T, Hq, Hkv, hd, cuda_state.stream);
    if (tiled_runs(B, Hq, hd)) return cuda_attention_tiled_forward(out, lse, qkv, B, T, Hq, Hkv, hd, cuda_state.stream);
    attention_forward_kernel<<<blocks_for(B * Hq * T * 32, THREADS), THREADS, 0, cuda_state.stream>>>(
        out, lse, qkv, B, T, Hq, Hkv, hd, 1.0f / sqrtf((float)hd));
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* The scratch: delta[B,Hq,T] at its start. */
static int backward_fp32(float *d_qkv, float *scratch, const float *d_out, const float *qkv, const float *out,
                         const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd)
{
    float scale = 1.0f / sqrtf((float)hd);
    if (tf32x3_runs(B, Hq, hd))
        return cuda_attention_tf32x3_backward(d_qkv, scratch, d_out, qkv, out, lse, B, T, Hq, Hkv, hd,
                                              cuda_state.stream);
    if (tiled_runs(B, Hq, hd))
        return cuda_attention_tiled_backward(d_qkv, scratch, d_out, qkv, out, lse, B, T, Hq, Hkv, hd, cuda_state.stream);
    attention_backward_queries_kernel<<<blocks_for(B * Hq * T * 32, THREADS), THREADS, 0, cuda_state.stream>>>(
        d_qkv, scratch, d_out, qkv, out, lse, B, T, Hq, Hkv, hd, scale);
    LAUNCH_CHECK();
    attention_backward_keys_kernel<<<blocks_for(B * Hkv * T * 32, THREADS), THREADS, 0, cuda_state.stream>>>(
        d_qkv, scratch, d_out, qkv, lse, B, T, Hq, Hkv, hd, scale);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* The scratch: the forward needs none; the backward keeps delta[B,Hq,T] at
 * its start. */
int cuda_attention_forward(float *out, float *lse, float *scratch, const float *qkv, int64_t B, int64_t T,
                           int64_t Hq, int64_t Hkv, int64_t hd)
{
    (void)scratch;
    TP_TRY(attention_shape_ok("attention_forward", B, T, Hq, Hkv, hd));
    ENTER();
    if (B == 0 || T == 0 || Hq == 0) return TP_OK;
    return forward_fp32(out, lse, qkv, B, T, Hq, Hkv, hd);
fail:
    return TP_ERR_DEVICE;
}

int cuda_attention_backward(float *d_qkv, float *scratch, const float *d_out, const float *qkv,
                            const float *out, const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                            int64_t hd)
{
    TP_TRY(attention_shape_ok("attention_backward", B, T, Hq, Hkv, hd));
    ENTER();
    if (B == 0 || T == 0) return TP_OK;
    return backward_fp32(d_qkv, scratch, d_out, qkv, out, lse, B, T, Hq, Hkv, hd);
fail:
    return TP_ERR_DEVICE;
}

/* ========================================================= bf16 attention
 * attention_forward_bf16 and attention_backward_bf16 (kernels.h): qkv and
 * out are bf16 activations, bf16 bits (qkv [B, T, (Hq + 2 Hkv) hd], written
 * by the qkv product or RoPE's bf16 forward; out [B, T, Hq hd], written by
 * the forward, read by the backward); d_out [B, T, Hq hd] and d_qkv [B, T,
 * (Hq + 2 Hkv) hd] are bf16 gradients, bf16 bits too (d_out written by the
 * output projection's matmul_backward_bf16_bits, d_qkv read by RoPE's bf16
 * backward or the qkv product's matmul_backward_bf16). With cuDNN
 * (attention_cudnn.h) Q, K and V are views of qkv's bits where they lie, O
 * is out itself and dO is d_out itself (bf16 in the same layouts,
 * attention_cudnn.h's), and cuDNN writes its bf16 dQ, dK, dV into d_qkv
 * itself (the same packed layout, every element written); its fp32 Stats
 * are lse: no rounding or widening kernel on either side. Without
 * (TP_CUDA_ATTENTION=tiled or rows, or a shape cuDNN does not take under the
 * default), qkv's, out's and d_out's bits widened to fp32 (exactly the
 * values the CPU twin widens) go to the fp32 kernels above: the CPU twin's
 * arithmetic, on the GPU; the forward's fp32 out and the backward's fp32
 * d_qkv go through the scratch and are rounded into out and d_qkv
 * (bits_f32_to_bf16, as the CPU twin rounds them).
 *
 * The copies, the fp32 results and cuDNN's workspace live in a cuda_scratch
 * of this file (launch.h: grown stream-ordered when a call needs more, and
 * kept); bf16_lock is held from a call's first copy until its last work is
 * queued. Its parts start 256-byte aligned; cuDNN's tensors are declared
 * 16-byte aligned (attention_cudnn.cu), so a qkv, out, d_out or d_qkv that
 * is not (an activation or gradient carved at any bf16 offset) goes to cuDNN
 * through the scratch, copied as it is (d_qkv copied back after the run).
 * Where qkv is, so are the K and V views (and where d_qkv is, the dK and dV
 * views): they start Hq hd and (Hq + Hkv) hd values in, and their rows
 * (Hq + 2 Hkv) hd values apart, multiples of 8 values (16 bytes), as
 * cuDNN's head sizes are (cudnn_attention_shape_ok). */

static cuda_scratch bf16_scratch; /* launch.h */
static pthread_mutex_t bf16_lock = PTHREAD_MUTEX_INITIALIZER;

/* parts[i] of bytes[i] each, in the scratch. Call with bf16_lock held. */
static int scratch_parts(void **parts, const size_t *bytes, int count)
{
    return cuda_scratch_parts(&bf16_scratch, "bf16 attention", parts, bytes, count);
}

/* out[i] = the bf16 value in[i] as fp32 (exact). */
static __global__ void bf16_widen_kernel(float *out, const uint16_t *in, int64_t n)
{
    GRID_STRIDE(i, n) out[i] = load_value(&in[i]);
}

static int widen_bf16(float *out, const void *in, int64_t n)
{
    bf16_widen_kernel<<<blocks_for(n, THREADS), THREADS, 0, cuda_state.stream>>>(out, (const uint16_t *)in, n);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* bytes from src to dst, both device memory, queued. */
static int copy_bytes(void *dst, const void *src, size_t bytes)
{
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_state.stream));
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* Whether cuDNN may read or write a tensor (qkv, out, d_out, d_qkv) where
 * it is: its tensors are declared 16-byte aligned (attention_cudnn.cu, as
 * the frontend declares them). */
static int cudnn_aligned(const void *p)
{
    return (uintptr_t)p % 16 == 0;
}

/* The plan cuDNN runs for this direction and shape (the deterministic
 * backward's with TP_CUDA_DETERMINISTIC=1), or (TP_ERR_*) why it does not
 * run: set aside (TP_CUDA_ATTENTION), a shape it does not take, a library,
 * device or graph that fails (attention_cudnn.h says which). */
static int cudnn_plan_for(int backward, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd,
                          const cudnn_attention_plan **plan)
{
    *plan = NULL;
    cuda_attention_choice choice = cuda_attention_chosen();
    if (choice == CUDA_ATTENTION_TILED || choice == CUDA_ATTENTION_ROWS)
        return tp_fail(TP_ERR_ARG, "TP_CUDA_ATTENTION=%s", choice == CUDA_ATTENTION_TILED ? "tiled" : "rows");
    cudnn_attention_graph graph = !backward                      ? CUDNN_ATTENTION_FORWARD
                                  : cuda_deterministic_chosen() ? CUDNN_ATTENTION_BACKWARD_DETERMINISTIC
                                                                : CUDNN_ATTENTION_BACKWARD;
    return cudnn_attention_prepare(graph, B, T, Hq, Hkv, hd, plan);
}

/* Scratch: a copy of qkv where it is not 16-byte aligned (else nothing:
 * cuDNN reads qkv itself), O where out is not (else nothing: cuDNN writes
 * out itself), Stats, cuDNN's workspace. */
static int forward_cudnn(const cudnn_attention_plan *plan, uint16_t *out, float *lse, const uint16_t *qkv,
                         int64_t n_qkv, int64_t n_out, int64_t n_lse)
{
    void *parts[4];
    int qkv_direct = cudnn_aligned(qkv), direct = cudnn_aligned(out);
    const size_t bytes[4] = {qkv_direct ? 0 : (size_t)n_qkv * 2, direct ? 0 : (size_t)n_out * 2,
                             (size_t)n_lse * sizeof(float), cudnn_attention_workspace_bytes(plan)};
    pthread_mutex_lock(&bf16_lock);
    int status = scratch_parts(parts, bytes, 4);
    /* The forward reads qkv and never writes it: the const goes for cuDNN's variant pack alone. */
    cudnn_attention_tensors t = {qkv_direct ? (void *)qkv : parts[0], direct ? (void *)out : parts[1], parts[2], NULL,
                                 NULL, parts[3]};
    if (!status && !qkv_direct) status = copy_bytes(t.qkv, qkv, (size_t)n_qkv * 2);
    if (!status) status = cudnn_attention_run(plan, &t);
    if (!status && !direct) status = copy_bytes(out, t.o, (size_t)n_out * 2);
    /* Stats through the scratch: lse need not be 16-byte aligned. */
    if (!status) status = copy_bytes(lse, t.stats, (size_t)n_lse * sizeof(float));
    pthread_mutex_unlock(&bf16_lock);
    return status;
}

/* Scratch: qkv widened (fp32), the fp32 out, rounded into out at the end. */
static int forward_rounded(uint16_t *out, float *lse, const uint16_t *qkv, int64_t B, int64_t T, int64_t Hq,
                           int64_t Hkv, int64_t hd)
{
    int64_t n_qkv = B * T * (Hq + 2 * Hkv) * hd, n_out = B * T * Hq * hd;
    void *parts[2];
    const size_t bytes[2] = {(size_t)n_qkv * sizeof(float), (size_t)n_out * sizeof(float)};
    pthread_mutex_lock(&bf16_lock);
    int status = scratch_parts(parts, bytes, 2);
    if (!status) status = widen_bf16((float *)parts[0], qkv, n_qkv);
    if (!status) status = forward_fp32((float *)parts[1], lse, (const float *)parts[0], B, T, Hq, Hkv, hd);
    if (!status) status = cuda_round_to_bf16(out, (const float *)parts[1], n_out);
    pthread_mutex_unlock(&bf16_lock);
    return status;
}

int cuda_attention_forward_bf16(uint16_t *out, float *lse, float *scratch, const uint16_t *qkv, int64_t B, int64_t T,
                                int64_t Hq, int64_t Hkv, int64_t hd)
{
    (void)scratch;
    TP_TRY(attention_shape_ok("attention_forward_bf16", B, T, Hq, Hkv, hd));
    ENTER();
    if (B == 0 || T == 0 || Hq == 0) return TP_OK;
    {
        const cudnn_attention_plan *plan;
        int status = cudnn_plan_for(0, B, T, Hq, Hkv, hd, &plan);
        if (!status)
            return forward_cudnn(plan, out, lse, qkv, B * T * (Hq + 2 * Hkv) * hd, B * T * Hq * hd, B * Hq * T);
        if (cuda_attention_chosen() == CUDA_ATTENTION_CUDNN) return status;
        return forward_rounded(out, lse, qkv, B, T, Hq, Hkv, hd);
    }
fail:
    return TP_ERR_DEVICE;
}

/* Scratch: copies of qkv, out and d_out where they are not 16-byte aligned
 * (else nothing: cuDNN reads them where they are), dQ, dK, dV where d_qkv
 * is not (else nothing: cuDNN writes d_qkv itself), Stats, cuDNN's
 * workspace. */
static int backward_cudnn(const cudnn_attention_plan *plan, uint16_t *d_qkv, const uint16_t *d_out,
                          const uint16_t *qkv, const uint16_t *out, const float *lse, int64_t n_qkv, int64_t n_out,
                          int64_t n_lse)
{
    void *parts[6];
    int qkv_direct = cudnn_aligned(qkv), direct = cudnn_aligned(out);
    int d_out_direct = cudnn_aligned(d_out), d_qkv_direct = cudnn_aligned(d_qkv);
    const size_t bytes[6] = {qkv_direct ? 0 : (size_t)n_qkv * 2,
                             direct ? 0 : (size_t)n_out * 2,
                             d_out_direct ? 0 : (size_t)n_out * 2,
                             d_qkv_direct ? 0 : (size_t)n_qkv * 2,
                             (size_t)n_lse * sizeof(float),
                             cudnn_attention_workspace_bytes(plan)};
    pthread_mutex_lock(&bf16_lock);
    int status = scratch_parts(parts, bytes, 6);
    /* The backward reads qkv, O and dO and never writes them: the const goes for cuDNN's variant pack alone. */
    cudnn_attention_tensors t = {qkv_direct ? (void *)qkv : parts[0],
                                 direct ? (void *)out : parts[1],
                                 parts[4],
                                 d_out_direct ? (void *)d_out : parts[2],
                                 d_qkv_direct ? (void *)d_qkv : parts[3],
                                 parts[5]};
    if (!status && !qkv_direct) status = copy_bytes(t.qkv, qkv, (size_t)n_qkv * 2);
    if (!status && !direct) status = copy_bytes(t.o, out, (size_t)n_out * 2);
    if (!status && !d_out_direct) status = copy_bytes(t.d_o, d_out, (size_t)n_out * 2);
    if (!status) status = copy_bytes(t.stats, lse, (size_t)n_lse * sizeof(float));
    if (!status) status = cudnn_attention_run(plan, &t);
    if (!status && !d_qkv_direct) status = copy_bytes(d_qkv, t.d_qkv, (size_t)n_qkv * 2);
    pthread_mutex_unlock(&bf16_lock);
    return status;
}

/* Scratch: qkv, out and d_out widened, the fp32 d_qkv, rounded into d_qkv
 * at the end (the caller's scratch keeps delta, as the fp32 backward's). */
static int backward_widened(uint16_t *d_qkv, float *scratch, const uint16_t *d_out, const uint16_t *qkv,
                            const uint16_t *out, const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                            int64_t hd)
{
    int64_t n_qkv = B * T * (Hq + 2 * Hkv) * hd, n_out = B * T * Hq * hd;
    void *parts[4];
    const size_t bytes[4] = {(size_t)n_qkv * sizeof(float), (size_t)n_out * sizeof(float),
                             (size_t)n_out * sizeof(float), (size_t)n_qkv * sizeof(float)};
    pthread_mutex_lock(&bf16_lock);
    int status = scratch_parts(parts, bytes, 4);
    if (!status) status = widen_bf16((float *)parts[0], qkv, n_qkv);
    if (!status) status = widen_bf16((float *)parts[1], out, n_out);
    if (!status) status = widen_bf16((float *)parts[2], d_out, n_out);
    if (!status)
        status = backward_fp32((float *)parts[3], scratch, (const float *)parts[2], (const float *)parts[0],
                               (const float *)parts[1], lse, B, T, Hq, Hkv, hd);
    if (!status) status = cuda_round_to_bf16(d_qkv, (const float *)parts[3], n_qkv);
    pthread_mutex_unlock(&bf16_lock);
    return status;
}

int cuda_attention_backward_bf16(uint16_t *d_qkv, float *scratch, const uint16_t *d_out, const uint16_t *qkv,
                                 const uint16_t *out, const float *lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                                 int64_t hd)
{
    TP_TRY(attention_shape_ok("attention_backward_bf16", B, T, Hq, Hkv, hd));
    ENTER();
    if (B == 0 || T == 0) return TP_OK;
    /* No query heads: out, d_out and lse are empty and no key is seen; dK and dV are zeros (+0, as the fp32
     * kernels' empty sums, whose bf16 bits are 0), all of d_qkv, without reading qkv. */
    if (Hq == 0) {
        CUDA_TRY(cudaMemsetAsync(d_qkv, 0, (size_t)(B * T * 2 * Hkv * hd) * sizeof(uint16_t), cuda_state.stream));
        return TP_OK;
    }
    {
        const cudnn_attention_plan *plan;
        int status = cudnn_plan_for(1, B, T, Hq, Hkv, hd, &plan);
        if (!status)
            return backward_cudnn(plan, d_qkv, d_out, qkv, out, lse, B * T * (Hq + 2 * Hkv) * hd, B * T * Hq * hd,
                                  B * Hq * T);
        if (cuda_attention_chosen() == CUDA_ATTENTION_CUDNN) return status;
        return backward_widened(d_qkv, scratch, d_out, qkv, out, lse, B, T, Hq, Hkv, hd);
    }
fail:
    return TP_ERR_DEVICE;
}

/* ========================================================== the start line
 * Which attention runs, for kernel_backend's describe_attention: the one
 * home of that text for the CUDA backend. For bf16 the graphs of both
 * directions are built here (and kept), so that a failure shows before the
 * first step, with cuDNN's reason. */
void cuda_describe_attention(int bf16, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd, char *text,
                             size_t size)
{
    cuda_attention_choice choice = cuda_attention_chosen();
    const char *kernels = tf32x3_runs(B, Hq, hd) ? "tensor cores' 3xTF32" : tiled_runs(B, Hq, hd) ? "tiled" : "rows";
    /* The tiled kernels' rows a thread, where chosen: rows_note for both
     * directions, backward_note for the backward alone. */
    char rows_note[160] = "", forward_note[64] = "", backward_note[64] = "";
    int rows = cuda_tiled_forward_rows_chosen(), backward_rows = cuda_tiled_backward_rows_chosen();
    if (tiled_runs(B, Hq, hd) && rows)
        snprintf(forward_note, sizeof forward_note, "forward: %d rows a thread, TP_CUDA_TILED_FORWARD_ROWS=%d", rows,
                 rows);
    if (tiled_runs(B, Hq, hd) && backward_rows)
        snprintf(backward_note, sizeof backward_note, "backward: %d row%s a thread, TP_CUDA_TILED_BACKWARD_ROWS=%d",
                 backward_rows, backward_rows == 1 ? "" : "s", backward_rows);
    if (forward_note[0] || backward_note[0])
        snprintf(rows_note, sizeof rows_note, " (%s%s%s)", forward_note,
                 forward_note[0] && backward_note[0] ? "; " : "", backward_note);
    const char *why_rows = choice == CUDA_ATTENTION_ROWS ? " (TP_CUDA_ATTENTION=rows)"
                           : tf32x3_runs(B, Hq, hd)       ? " (TP_CUDA_ATTENTION=tf32x3)"
                           : choice == CUDA_ATTENTION_TF32X3 && cuda_attention_tf32x3_fits(B, Hq, hd)
                               ? " (the tensor cores' kernels want more shared memory than this GPU gives a block)"
                           : choice == CUDA_ATTENTION_TF32X3
                               ? " (the tensor cores' kernels take head sizes 32, 64, 128)"
                           : tiled_runs(B, Hq, hd) ? ""
                                                   : " (the tiled kernels take head sizes 32, 64, 128, 256)";
    if (!bf16) {
        snprintf(text, size, "CUDA %s kernels%s, fp32%s", kernels, rows_note, why_rows);
        return;
    }
    const cudnn_attention_plan *forward = NULL, *backward = NULL;
    char version[32] = "";
    int status = cudaSetDevice(cuda_state.device) == cudaSuccess
                     ? TP_OK
                     : tp_fail(TP_ERR_DEVICE, "CUDA device %d cannot be made current", cuda_state.device);
    if (!status) status = cudnn_plan_for(0, B, T, Hq, Hkv, hd, &forward);
    if (!status) status = cudnn_plan_for(1, B, T, Hq, Hkv, hd, &backward);
    if (!status) status = cudnn_attention_load(version, sizeof version);
    if (!status) {
        snprintf(text, size, "cuDNN %s flash attention, bf16 (engines %lld forward, %lld backward%s)", version,
                 (long long)cudnn_attention_engine(forward), (long long)cudnn_attention_engine(backward),
                 cuda_deterministic_chosen() ? ", deterministic: TP_CUDA_DETERMINISTIC=1" : "");
        return;
    }
    (void)cudaGetLastError();
    const char *refusal = choice == CUDA_ATTENTION_CUDNN ? "asked for (TP_CUDA_ATTENTION=cudnn), so the steps will fail"
                                                         : "not used";
    if (forward && !backward) { /* the forward's graph built, the backward's did not: each runs its own way */
        char why[1024];
        snprintf(why, sizeof why, "%s", tp_errmsg());
        if (cudnn_attention_load(version, sizeof version)) snprintf(version, sizeof version, "9");
        snprintf(text, size, "cuDNN %s flash attention forward, bf16 (engine %lld); backward: CUDA %s kernels%s%s%s, "
                 "fp32 on bf16-rounded operands%s; cuDNN's backward %s: %s", version,
                 (long long)cudnn_attention_engine(forward), kernels, backward_note[0] ? " (" : "", backward_note,
                 backward_note[0] ? ")" : "", why_rows, refusal, why); /* no tiled forward here */
        return;
    }
    snprintf(text, size, "CUDA %s kernels%s, fp32 on bf16-rounded operands%s; cuDNN %s: %s", kernels, rows_note, why_rows,
             refusal, tp_errmsg());
}
