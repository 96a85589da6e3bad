/* nccl.cu: device collectives through NCCL (kernels.h, cuda_group_*).
 * NCCL is loaded with dlopen when first used, as cuBLAS is: its library is
 * over 200 MB, and every program of a CUDA build would otherwise pay for
 * it at start. Collectives and receives run on the CUDA backend's stream;
 * sends on a stream of the group's own, ordered after the backend's work
 * by an event, so that a send waiting for its peer holds up no kernel. */
#include <nccl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "internal.h"
#include "libraries.h"

extern "C" {
#include "../kernels.h"
}

static_assert(CUDA_GROUP_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "kernels.h's group id is NCCL's unique id");

struct cuda_group {
    ncclComm_t comm;
    cudaStream_t stream;      /* the backend's */
    cudaStream_t send_stream; /* sends; created with the first */
    cudaEvent_t sends_ready;  /* on the backend's stream: what a send must wait for */
    cudaEvent_t sends_done;   /* on send_stream: every send issued so far */
    cudaEvent_t *sent;        /* on send_stream, after each send since the last wait for all (made as needed) */
    int64_t num_sent, max_sent;
    int device;
};

static struct {
    decltype(&ncclGetUniqueId) get_unique_id;
    decltype(&ncclCommInitRank) init_rank;
    decltype(&ncclCommDestroy) destroy;
    decltype(&ncclAllReduce) all_reduce;
    decltype(&ncclAllGather) all_gather;
    decltype(&ncclReduceScatter) reduce_scatter;
    decltype(&ncclSend) send;
    decltype(&ncclRecv) recv;
    decltype(&ncclGetErrorString) error_string;
} nccl;
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

#define NCCL_NAME_(major) "libnccl.so." #major
#define NCCL_NAME(major) NCCL_NAME_(major)

/* Loads NCCL once; fails naming what is missing. */
static int load_nccl(void)
{
    static const char *const names[] = {NCCL_NAME(NCCL_MAJOR), "libnccl.so"};
    int status = TP_OK;
    pthread_mutex_lock(&load_lock);
    if (!nccl.all_reduce) {
        void *library = NULL;
        status = cuda_library_open("NCCL", names, sizeof names / sizeof names[0], &library, NULL, 0);
        const cuda_library_symbol symbols[] = {
            {"ncclGetUniqueId", (void **)&nccl.get_unique_id},
            {"ncclCommInitRank", (void **)&nccl.init_rank},
            {"ncclCommDestroy", (void **)&nccl.destroy},
            {"ncclGetErrorString", (void **)&nccl.error_string},
            {"ncclSend", (void **)&nccl.send},
            {"ncclRecv", (void **)&nccl.recv},
            {"ncclAllGather", (void **)&nccl.all_gather},
            {"ncclReduceScatter", (void **)&nccl.reduce_scatter},
            {"ncclAllReduce", (void **)&nccl.all_reduce}, /* last: it says that all are loaded */
        };
        if (!status)
            status = cuda_library_symbols(library, "NCCL", names[0], symbols, sizeof symbols / sizeof symbols[0]);
    }
    pthread_mutex_unlock(&load_lock);
    return status;
}

/* NCCL calls: "file:line: call: NCCL's reason" as a TP_ERR_DEVICE failure,
 * then the function's `fail` label. */
#define NCCL_TRY(call)                                                                                                 \
    do {                                                                                                               \
        ncclResult_t nccl_try_result_ = (call);                                                                        \
        if (nccl_try_result_ != ncclSuccess) {                                                                         \
            tp_fail(TP_ERR_DEVICE, "%s:%d: %s: %s", __FILE__, __LINE__, #call, nccl.error_string(nccl_try_result_));  \
            goto fail;                                                                                                 \
        }                                                                                                              \
    } while (0)

extern "C" int cuda_group_id(unsigned char id[CUDA_GROUP_ID_BYTES])
{
    ncclUniqueId unique;
    TP_TRY(load_nccl());
    NCCL_TRY(nccl.get_unique_id(&unique));
    memcpy(id, unique.internal, CUDA_GROUP_ID_BYTES);
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

extern "C" int cuda_group_create(cuda_group **out, const unsigned char id[CUDA_GROUP_ID_BYTES], int members,
                                 int member)
{
    *out = NULL;
    ncclUniqueId unique;
    cuda_group *group = NULL;
    if (members < 1 || member < 0 || member >= members)
        return tp_fail(TP_ERR_ARG, "a device group of %d members has no member %d", members, member);
    TP_TRY(load_nccl());
    group = (cuda_group *)calloc(1, sizeof *group);
    if (!group) return tp_fail(TP_ERR_NOMEM, "out of memory for a device group");
    if (cuda_backend_stream(&group->stream, &group->device)) {
        free(group);
        return TP_ERR_STATE;
    }
    memcpy(unique.internal, id, CUDA_GROUP_ID_BYTES);
    CUDA_TRY(cudaSetDevice(group->device));
    NCCL_TRY(nccl.init_rank(&group->comm, members, unique, member));
    *out = group;
    return TP_OK;
fail:
    free(group);
    return TP_ERR_DEVICE;
}

extern "C" int cuda_group_all_reduce(cuda_group *group, void *data, int64_t count, int is_double, int is_max)
{
    if (count <= 0) return TP_OK;
    CUDA_TRY(cudaSetDevice(group->device));
    NCCL_TRY(nccl.all_reduce(data, data, (size_t)count, is_double ? ncclFloat64 : ncclFloat32, is_max ? ncclMax : ncclSum,
                             group->comm, group->stream));
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* A gather adds nothing up: it moves each member's values as they are, so
 * it moves bytes (ncclUint8, count x value_bytes of them), whatever the
 * values are: bf16 bits (2), float (4) or double (8). */
extern "C" int cuda_group_all_gather(cuda_group *group, const void *send, void *recv, int64_t count, int value_bytes)
{
    if (value_bytes != 2 && value_bytes != 4 && value_bytes != 8)
        return tp_fail(TP_ERR_ARG, "device group all_gather: values of %d bytes (want 2, 4 or 8)", value_bytes);
    if (count <= 0) return TP_OK;
    if ((uint64_t)count > SIZE_MAX / (size_t)value_bytes)
        return tp_fail(TP_ERR_ARG, "device group all_gather: %lld values of %d bytes beyond addressable memory",
                       (long long)count, value_bytes);
    CUDA_TRY(cudaSetDevice(group->device));
    NCCL_TRY(nccl.all_gather(send, recv, (size_t)count * (size_t)value_bytes, ncclUint8, group->comm, group->stream));
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

extern "C" int cuda_group_reduce_scatter(cuda_group *group, const void *send, void *recv, int64_t count, int is_double)
{
    if (count <= 0) return TP_OK;
    CUDA_TRY(cudaSetDevice(group->device));
    NCCL_TRY(nccl.reduce_scatter(send, recv, (size_t)count, is_double ? ncclFloat64 : ncclFloat32, ncclSum,
                                 group->comm, group->stream));
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

static int peer_ok(const char *what, int peer, int64_t count)
{
    if (peer < 0 || count < 0) return tp_fail(TP_ERR_ARG, "device group %s: peer %d, %lld values", what, peer, (long long)count);
    return TP_OK;
}

extern "C" int cuda_group_send(cuda_group *group, int peer, const void *data, int64_t count, int is_double)
{
    TP_TRY(peer_ok("send", peer, count));
    CUDA_TRY(cudaSetDevice(group->device));
    /* Made at the first send, each kept once made (a failure half-way leaks nothing). */
    if (!group->sends_ready) CUDA_TRY(cudaEventCreateWithFlags(&group->sends_ready, cudaEventDisableTiming));
    if (!group->sends_done) CUDA_TRY(cudaEventCreateWithFlags(&group->sends_done, cudaEventDisableTiming));
    if (!group->send_stream) CUDA_TRY(cudaStreamCreateWithFlags(&group->send_stream, cudaStreamNonBlocking));
    CUDA_TRY(cudaEventRecord(group->sends_ready, group->stream)); /* the data is computed */
    CUDA_TRY(cudaStreamWaitEvent(group->send_stream, group->sends_ready, 0));
    if (group->num_sent == group->max_sent) {
        int64_t more = group->max_sent ? 2 * group->max_sent : 16;
        cudaEvent_t *bigger = (cudaEvent_t *)realloc(group->sent, (size_t)more * sizeof *bigger);
        if (!bigger) return tp_fail(TP_ERR_NOMEM, "out of memory for the events of %lld sends", (long long)more);
        group->sent = bigger;
        for (; group->max_sent < more; group->max_sent++) group->sent[group->max_sent] = NULL;
    }
    if (!group->sent[group->num_sent])
        CUDA_TRY(cudaEventCreateWithFlags(&group->sent[group->num_sent], cudaEventDisableTiming));
    NCCL_TRY(nccl.send(data, (size_t)count, is_double ? ncclFloat64 : ncclFloat32, peer, group->comm,
                       group->send_stream));
    CUDA_TRY(cudaEventRecord(group->sent[group->num_sent++], group->send_stream));
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

extern "C" int cuda_group_recv(cuda_group *group, int peer, void *data, int64_t count, int is_double)
{
    TP_TRY(peer_ok("receive", peer, count));
    CUDA_TRY(cudaSetDevice(group->device));
    NCCL_TRY(nccl.recv(data, (size_t)count, is_double ? ncclFloat64 : ncclFloat32, peer, group->comm, group->stream));
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

extern "C" int cuda_group_wait_sends(cuda_group *group, int64_t sends)
{
    if (!group->send_stream) return TP_OK; /* no send yet */
    CUDA_TRY(cudaSetDevice(group->device));
    if (sends >= 0) { /* the first `sends`: the event recorded after the last of them */
        if (sends > group->num_sent) sends = group->num_sent;
        if (sends > 0) CUDA_TRY(cudaStreamWaitEvent(group->stream, group->sent[sends - 1], 0));
        return TP_OK;
    }
    CUDA_TRY(cudaEventRecord(group->sends_done, group->send_stream));
    CUDA_TRY(cudaStreamWaitEvent(group->stream, group->sends_done, 0));
    group->num_sent = 0; /* the events are recorded again: a wait already issued keeps what it waited for */
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

extern "C" void cuda_group_free(cuda_group *group)
{
    if (!group) return;
    /* The work in flight first, sends and receives or all-reduces: it uses the communicator. */
    (void)cudaSetDevice(group->device);
    if (group->send_stream) (void)cudaStreamSynchronize(group->send_stream);
    if (group->stream) (void)cudaStreamSynchronize(group->stream);
    if (group->comm) nccl.destroy(group->comm);
    if (group->send_stream) (void)cudaStreamDestroy(group->send_stream);
    if (group->sends_ready) (void)cudaEventDestroy(group->sends_ready);
    if (group->sends_done) (void)cudaEventDestroy(group->sends_done);
    for (int64_t i = 0; i < group->max_sent; i++)
        if (group->sent[i]) (void)cudaEventDestroy(group->sent[i]);
    free(group->sent);
    free(group);
}
