/* backend.cu: the CUDA kernel backend (kernels.h, kernel_backend): the
 * transformer arithmetic of cpu/ on device memory, each operation the twin
 * of the CPU function of the same name and tested against it
 * (tests/kernels/test_cuda_backend.c). This file holds the state, memory
 * and copies, and the table of operations; the operations are in one file
 * each, as in cpu/: linear.cu (products through cuBLAS, bias, residual,
 * add, scale, and the MLP's products with GELU; products_lt.cu the
 * products whose bias or GELU cuBLASLt's epilogue adds),
 * norm.cu (layer norm, GELU, RMSNorm, SwiGLU), column_sums.cu (the
 * gradients' column sums), rope.cu, attention.cu (and attention_tiled.cu,
 * attention_cudnn.cu), embedding.cu (embedding, cross-entropy), adamw.cu
 * (AdamW, the gradients' sum of squares); what they share is launch.h.
 *
 * One state per process: the device, a non-blocking stream and a cuBLAS
 * handle bound to it. Every kernel, product and copy goes to that stream in
 * the order issued; to_host and sum_of_squares wait for it, as to_device
 * does for a large copy (the caller reuses its host memory at once: a small
 * one goes through pinned staging and is queued), the other operations
 * return as soon as their work is queued, and synchronize() waits for all
 * of it.
 *
 * Correct first, fast later: matrix products through cuBLAS in plain fp32
 * (TF32 off), or for bf16 mixed precision (the *_bf16 products) of bf16
 * operands summed in fp32 by cublasGemmEx: the activation in as the bf16 bits
 * the norm, attention or MLP activation wrote (their *_bf16 forwards, the
 * fp32 kernels rounding on store), and a layer's gradients as bf16 bits as
 * well (matmul_backward_bf16's d_out: the bits matmul_backward_gelu_bf16,
 * swiglu_backward_bf16, rope_backward_bf16 and attention_backward_bf16 wrote,
 * the fp32 kernels widening on load and rounding on store; the output
 * projections' d_in, written by matmul_backward_bf16_bits: a bf16 C), the
 * weights as the trainer's bf16 copy of them (the bits round_to_bf16
 * writes once after they change: convert_bits.h's rounding, the CPU's),
 * the residual stream's gradient (matmul_backward_bf16_bits' and
 * matmul_backward_gelu_bf16's d_out) as the bits the norms' backward writes
 * beside its fp32 values (norm.cu, the same rounding); the qkv product (and RoPE)
 * written as bf16 bits too, which only the attention reads, and the MLP's
 * fc product, which only SwiGLU or GELU's backward reads
 * (matmul_forward_bf16_bits: a bf16 C; rope_forward_bf16; swiglu_forward_bf16
 * and its backward, widening it on load); a forward product with a bias
 * through cuBLASLt, the bias in its epilogue (products_lt.cu), and GPT-2's
 * MLP products with GELU in it (matmul_forward_gelu_bf16: GELU_AUX_BIAS;
 * matmul_backward_gelu_bf16's d_in product: DGELU), each where cuBLASLt
 * takes the shape, else the product and a separate kernel;
 * attention through cuDNN in bf16 where it can (attention.cu: qkv, out, d_out
 * and d_qkv bound as the bits they are), else the tiled kernels on the
 * widened values; the rest in simple kernels. Launch shapes: element-wise
 * kernels walk their elements in grid-stride loops (at most MAX_BLOCKS
 * blocks), or, where an element needs its row or column, a block per row
 * (ROWS_AND_COLUMNS, no 64-bit division per element); row kernels give a
 * row to a warp (the norms: ROWS_OF_WARP) or, for rows of thousands of
 * columns, to a block (cross-entropy's), also in grid-stride loops over
 * rows; column sums (bias and norm-weight gradients) cut the rows into
 * chunks and sum each chunk's columns, then the chunks, in a fixed order
 * (column_sums.h, one launch); AdamW takes a launch per 48 tensors. No
 * kernel here adds values by atomics (the column sums count arrivals with
 * one; embedding_backward sorts the positions by token and adds a token's
 * rows in order): every operation repeats bit for bit from run to
 * run, but cuDNN's default attention backward, whose dQ sums in a varying
 * order (TP_CUDA_DETERMINISTIC=1 takes its deterministic graph:
 * attention_cudnn.h). */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "../kernels.h"
}
#include "attention_tiled.h"
#include "check.h"
#include "internal.h"
#include "launch.h"

/* ==================================================================== state */

cuda_backend_state cuda_state;
static kernel_backend backend_table;
static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER; /* kernels_cuda */

/* ======================================================== memory and copies */

static int cuda_alloc(void **out, size_t bytes)
{
    *out = NULL;
    ENTER();
    {
        cudaError_t error = cudaMalloc(out, bytes ? bytes : 1);
        if (error != cudaSuccess) {
            (void)cudaGetLastError();
            *out = NULL;
            return tp_fail(TP_ERR_DEVICE, "cannot allocate %zu bytes on CUDA device %d: %s", bytes, cuda_state.device,
                           cudaGetErrorString(error));
        }
    }
    CUDA_TRY(cudaMemsetAsync(*out, 0, bytes, cuda_state.stream));
    CUDA_TRY(cudaStreamSynchronize(cuda_state.stream));
    return TP_OK;
fail:
    if (*out) cudaFree(*out);
    *out = NULL;
    return TP_ERR_DEVICE;
}

int cuda_scratch_parts(cuda_scratch *scratch, const char *what, void **parts, const size_t *bytes, int count)
{
    size_t total = 0, offsets[CUDA_SCRATCH_PARTS];
    if (count > CUDA_SCRATCH_PARTS)
        return tp_fail(TP_ERR_ARG, "%d parts of %s scratch asked for (%d at most)", count, what, CUDA_SCRATCH_PARTS);
    for (int i = 0; i < count; i++) {
        if (bytes[i] > SIZE_MAX / 2 - total)
            return tp_fail(TP_ERR_NOMEM, "%s scratch beyond addressable memory", what);
        offsets[i] = total;
        total += (bytes[i] + 255) / 256 * 256;
    }
    if (total > scratch->size) {
        if (scratch->memory) {
            CUDA_TRY(cudaFreeAsync(scratch->memory, cuda_state.stream));
            scratch->memory = NULL;
            scratch->size = 0;
        }
        cudaError_t error = cudaMallocAsync((void **)&scratch->memory, total, cuda_state.stream);
        if (error != cudaSuccess) {
            (void)cudaGetLastError();
            scratch->memory = NULL;
            return tp_fail(error == cudaErrorMemoryAllocation ? TP_ERR_NOMEM : TP_ERR_DEVICE,
                           "cannot allocate %zu bytes of %s scratch on CUDA device %d: %s", total, what,
                           cuda_state.device, cudaGetErrorString(error));
        }
        scratch->size = total;
    }
    for (int i = 0; i < count; i++) parts[i] = scratch->memory + offsets[i];
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* Waits for the stream first: kernels queued on it may still use the memory. */
static void cuda_release(void *memory)
{
    if (!memory) return;
    if (cudaSetDevice(cuda_state.device) == cudaSuccess) cudaStreamSynchronize(cuda_state.stream);
    cudaFree(memory);
    (void)cudaGetLastError(); /* nowhere to report it; not left for the next launch check */
}

static int cuda_zero(void *memory, size_t bytes)
{
    ENTER();
    if (bytes) CUDA_TRY(cudaMemsetAsync(memory, 0, bytes, cuda_state.stream));
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* Between host and device, synchronous for the host: the caller reuses its
 * buffer at once. */
static int copy_and_wait(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    ENTER();
    if (bytes) CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, cuda_state.stream));
    CUDA_TRY(cudaStreamSynchronize(cuda_state.stream));
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* Host to device. A small copy (a micro-batch's tokens, a staged
 * message's piece) goes through a slot of a ring of pinned buffers: the
 * source is copied into the slot at once (the caller may reuse it), the
 * slot's copy to the device is queued without waiting for the work before
 * it, and an event says when the slot may be filled again. A larger one (a
 * checkpoint's tensor) waits, as before. Without the ring, each
 * micro-batch's tokens waited for the previous micro-batch's backward.
 * (cudaMemcpyAsync from pageable memory is documented only as possibly
 * synchronous: the ring does not rely on how it stages.) */
#define STAGING_SLOTS 8
#define STAGING_BYTES ((size_t)1 << 20)
static struct {
    char *memory;                    /* pinned, STAGING_SLOTS * STAGING_BYTES, made at the first small copy */
    cudaEvent_t done[STAGING_SLOTS]; /* recorded after the slot's last copy */
    int next;
    int refused; /* the ring could not be made (pinned memory refused): every copy waits, as a large one */
} staging;
static pthread_mutex_t staging_lock = PTHREAD_MUTEX_INITIALIZER;

/* Every slot at once, at the first small copy. A slot made at its first
 * copy (one a step: the step's tokens) pinned 1 MiB and made an event, about
 * 1 ms of host time at the start of each of the first 8 steps (all of
 * bench-gpu's), before the step's first kernel was queued: the H200's kernel
 * times, `to_device` 1.0 ms a step. Only the update of the step before (0.9
 * ms at GPT-2 124M micro-batch 4) ran beside it on the device. */
static int staging_ready(void)
{
    if (staging.memory) return TP_OK;
    for (int slot = 0; slot < STAGING_SLOTS; slot++)
        if (!staging.done[slot]) CUDA_TRY(cudaEventCreateWithFlags(&staging.done[slot], cudaEventDisableTiming));
    CUDA_TRY(cudaMallocHost((void **)&staging.memory, STAGING_SLOTS * STAGING_BYTES));
    return TP_OK;
fail:
    staging.memory = NULL;
    return TP_ERR_DEVICE;
}

static int cuda_to_device(void *device_dst, const void *host_src, size_t bytes)
{
    if (bytes > STAGING_BYTES) return copy_and_wait(device_dst, host_src, bytes, cudaMemcpyHostToDevice);
    if (!bytes) return TP_OK;
    int status = TP_ERR_DEVICE, refused = 0;
    pthread_mutex_lock(&staging_lock);
    ENTER();
    if (!staging.refused && staging_ready()) {
        staging.refused = 1;
        (void)cudaGetLastError(); /* an allocation's failure, not the device's: not left for the next check */
    }
    refused = staging.refused;
    if (refused) goto fail;
    {
        int slot = staging.next;
        char *buffer = staging.memory + (size_t)slot * STAGING_BYTES;
        CUDA_TRY(cudaEventSynchronize(staging.done[slot])); /* its last copy has run (at once: long before) */
        memcpy(buffer, host_src, bytes);
        CUDA_TRY(cudaMemcpyAsync(device_dst, buffer, bytes, cudaMemcpyHostToDevice, cuda_state.stream));
        cudaError_t recorded = cudaEventRecord(staging.done[slot], cuda_state.stream);
        if (recorded != cudaSuccess) { /* the slot's event would not say when this copy is done: wait for it here */
            (void)cudaStreamSynchronize(cuda_state.stream);
            (void)cudaGetLastError();
            tp_fail(TP_ERR_DEVICE, "CUDA: recording the upload slot's event: %s", cudaGetErrorString(recorded));
            goto fail;
        }
        staging.next = (slot + 1) % STAGING_SLOTS;
        status = TP_OK;
    }
fail:
    pthread_mutex_unlock(&staging_lock);
    if (refused) return copy_and_wait(device_dst, host_src, bytes, cudaMemcpyHostToDevice);
    return status;
}

static int cuda_to_host(void *host_dst, const void *device_src, size_t bytes)
{
    return copy_and_wait(host_dst, device_src, bytes, cudaMemcpyDeviceToHost);
}

/* Device to device, queued. The CPU's copy is a memmove; a device copy of
 * overlapping ranges is undefined, so it is refused (dst == src is a no-op,
 * as on the CPU). */
static int cuda_copy(void *dst, const void *src, size_t bytes)
{
    if (dst == src || bytes == 0) return TP_OK;
    if (copy_ranges_overlap(dst, src, bytes))
        return tp_fail(TP_ERR_ARG, "CUDA copy of %zu bytes between overlapping ranges (%p to %p)", bytes, src, dst);
    ENTER();
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_state.stream));
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

static int cuda_synchronize(void)
{
    ENTER();
    CUDA_TRY(cudaStreamSynchronize(cuda_state.stream));
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

static int cuda_host_alloc(void **out, size_t bytes)
{
    *out = NULL;
    ENTER();
    CUDA_TRY(cudaMallocHost(out, bytes ? bytes : 1));
    return TP_OK;
fail:
    *out = NULL;
    return TP_ERR_DEVICE;
}

static void cuda_host_release(void *memory)
{
    if (memory) cudaFreeHost(memory);
}

/* A mark: an event recorded on the computing stream now. */
static int cuda_mark_work(void **mark)
{
    cudaEvent_t issued = NULL;
    *mark = NULL;
    ENTER();
    CUDA_TRY(cudaEventCreateWithFlags(&issued, cudaEventDisableTiming));
    CUDA_TRY(cudaEventRecord(issued, cuda_state.stream));
    *mark = (void *)issued;
    return TP_OK;
fail:
    if (issued) cudaEventDestroy(issued);
    return TP_ERR_DEVICE;
}

static void cuda_release_mark(void *mark)
{
    if (mark) cudaEventDestroy((cudaEvent_t)mark);
}

/* On the side stream, after the mark (or a mark made now): the copies
 * overlap what was issued on the computing stream after it, and the one
 * wait is for them alone. */
static int cuda_to_host_background(const void *mark, const host_copy *copies, int count)
{
    void *made = NULL;
    int status = mark ? TP_OK : cuda_mark_work(&made);
    if (status) return status;
    ENTER();
    CUDA_TRY(cudaStreamWaitEvent(cuda_state.side, (cudaEvent_t)(mark ? mark : made), 0));
    for (int i = 0; i < count; i++)
        if (copies[i].bytes)
            CUDA_TRY(cudaMemcpyAsync(copies[i].host_dst, copies[i].device_src, copies[i].bytes, cudaMemcpyDeviceToHost,
                                     cuda_state.side));
    CUDA_TRY(cudaStreamSynchronize(cuda_state.side));
    cuda_release_mark(made);
    return TP_OK;
fail:
    (void)cudaStreamSynchronize(cuda_state.side); /* the copies queued before the failure write no more */
    (void)cudaGetLastError();
    cuda_release_mark(made);
    return TP_ERR_DEVICE;
}

/* ================================================================ the table */

static void fill_table(kernel_backend *t)
{
    memset(t, 0, sizeof *t);
    t->name = "cuda";
    t->on_device = 1;
    t->alloc = cuda_alloc;
    t->release = cuda_release;
    t->zero = cuda_zero;
    t->to_device = cuda_to_device;
    t->to_host = cuda_to_host;
    t->copy = cuda_copy;
    t->synchronize = cuda_synchronize;
    t->host_alloc = cuda_host_alloc;
    t->host_release = cuda_host_release;
    t->mark_work = cuda_mark_work;
    t->to_host_background = cuda_to_host_background;
    t->release_mark = cuda_release_mark;
#define INSTALL(op, PARAMS, ARGS) t->op = cuda_##op;
    KERNEL_OPERATIONS(INSTALL)
#undef INSTALL
    t->describe_attention = cuda_describe_attention;
}

extern "C" int cuda_backend_stream(cudaStream_t *stream, int *device)
{
    pthread_mutex_lock(&state_lock);
    int ready = cuda_state.ready;
    *stream = cuda_state.stream;
    *device = cuda_state.device;
    pthread_mutex_unlock(&state_lock);
    return ready ? TP_OK : tp_fail(TP_ERR_STATE, "the CUDA backend is not made yet (kernels_cuda comes first)");
}

/* Created on the first call and kept for the life of the process (the
 * stream, handle and buffer are released with it). A failed creation leaves
 * nothing behind, and a later call tries again. */
extern "C" const kernel_backend *kernels_cuda(int device)
{
    const kernel_backend *result = NULL;
    int count = 0;
    cudaError_t error;
    pthread_mutex_lock(&state_lock);
    if (cuda_state.ready) {
        if (device == cuda_state.device) result = &backend_table;
        else
            tp_fail(TP_ERR_DEVICE,
                    "the CUDA backend of this process is on device %d; device %d asked for (one device per process)",
                    cuda_state.device, device);
        goto done;
    }
    error = cudaGetDeviceCount(&count);
    if (error != cudaSuccess) {
        (void)cudaGetLastError();
        tp_fail(TP_ERR_DEVICE, "no CUDA device (cudaGetDeviceCount: %s)", cudaGetErrorString(error));
        goto done;
    }
    if (count == 0) {
        tp_fail(TP_ERR_DEVICE, "no CUDA device (cudaGetDeviceCount found none)");
        goto done;
    }
    if (device < 0 || device >= count) {
        tp_fail(TP_ERR_DEVICE, "no CUDA device %d (this machine has %d: 0 to %d)", device, count, count - 1);
        goto done;
    }
    if (cuda_attention_variant(getenv("TP_CUDA_ATTENTION"))) goto done;
    if (cuda_deterministic_variant(getenv("TP_CUDA_DETERMINISTIC"))) goto done;
    if (cuda_tiled_forward_rows_variant(getenv("TP_CUDA_TILED_FORWARD_ROWS"))) goto done;
    if (cuda_tiled_backward_rows_variant(getenv("TP_CUDA_TILED_BACKWARD_ROWS"))) goto done;
    CUDA_TRY(cudaSetDevice(device));
    CUDA_TRY(cudaStreamCreateWithFlags(&cuda_state.stream, cudaStreamNonBlocking));
    CUDA_TRY(cudaStreamCreateWithFlags(&cuda_state.side, cudaStreamNonBlocking));
    if (cuda_blas_start()) goto fail;
    if (cuda_lt_start()) goto fail;
    CUDA_TRY(cudaMalloc(&cuda_state.sums, (SUM_BLOCKS + 1) * sizeof(double)));
    cuda_state.device = device;
    fill_table(&backend_table);
    cuda_state.ready = 1;
    result = &backend_table;
    goto done;
fail:
    if (cuda_state.sums) cudaFree(cuda_state.sums);
    cuda_lt_stop();
    cuda_blas_stop();
    if (cuda_state.stream) cudaStreamDestroy(cuda_state.stream);
    if (cuda_state.side) cudaStreamDestroy(cuda_state.side);
    (void)cudaGetLastError();
    cuda_state.sums = NULL;
    cuda_state.stream = NULL;
    cuda_state.side = NULL;
done:
    pthread_mutex_unlock(&state_lock);
    return result;
}
