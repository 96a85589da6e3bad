/* comm_nccl.c: the communicator of ranks on GPUs (comm.h,
 * comm_nccl_create). The trainer's all-reduces of device data (tensor
 * parallel sums, the tied embedding's gradient, data-parallel averaging)
 * go through NCCL groups on the CUDA backend's stream; everything else
 * (pipeline messages, host data, the stop and failure verdicts) through
 * the host communicator, device data copied through the host
 * (comm_staged). The NCCL groups' ids are drawn by each group's first rank
 * and shared with a world all-reduce of the host communicator. */
#include <stdlib.h>
#include <string.h>

#include "../common/error.h"
#include "../kernels/kernels.h"
#include "comm.h"

enum { GROUP_KINDS = 4 }; /* comm_group: WORLD, TP, DP, EMBED */

typedef struct {
    comm *staged;                     /* pipeline messages and host data */
    cuda_group *groups[GROUP_KINDS]; /* NULL: not a member (EMBED on a middle stage, or pp 1) */
} nccl_comm;

/* Members of this rank's group of a kind, its place in it and the rank of
 * its first member; 0 members when the rank is in no such group. */
static void group_of(const comm *c, comm_group kind, int *members, int *member, int *leader)
{
    int stage_first = c->dp_rank * c->pp * c->tp; /* rank of (dp_rank, pp 0, tp 0) */
    *members = *member = *leader = 0;
    switch (kind) {
    case GROUP_WORLD: *members = c->world, *member = c->rank, *leader = 0; break;
    case GROUP_TP: *members = c->tp, *member = c->tp_rank, *leader = c->rank - c->tp_rank; break;
    case GROUP_DP: *members = c->dp, *member = c->dp_rank, *leader = c->pp_rank * c->tp + c->tp_rank; break;
    case GROUP_EMBED:
        if (c->pp > 1 && (c->pp_rank == 0 || c->pp_rank == c->pp - 1))
            *members = 2, *member = c->pp_rank == 0 ? 0 : 1, *leader = stage_first + c->tp_rank;
        break;
    }
}

/* The groups of one kind: their first ranks draw ids, a world sum of the
 * (otherwise zero) table shares them, each rank joins its own. */
static int make_groups(nccl_comm *n, comm *c, comm_group kind)
{
    int members, member, leader;
    group_of(c, kind, &members, &member, &leader);
    size_t slot = CUDA_GROUP_ID_BYTES / sizeof(int);
    int *ids = calloc((size_t)c->world * slot, sizeof(int));
    if (!ids) return tp_fail(TP_ERR_NOMEM, "out of memory for NCCL group ids");
    int status = members > 0 && c->rank == leader ? cuda_group_id((unsigned char *)(ids + (size_t)c->rank * slot))
                                                  : TP_OK;
    /* Every rank takes part in the exchange, whatever its own result. */
    status = comm_agree(n->staged, status, "drawing NCCL group ids");
    if (!status)
        status = comm_all_reduce(n->staged, GROUP_WORLD, ids, (int64_t)c->world * (int64_t)slot, COMM_INT, COMM_SUM,
                                 COMM_HOST);
    if (!status && members > 0)
        status = cuda_group_create(&n->groups[kind], (const unsigned char *)(ids + (size_t)leader * slot), members,
                                   member);
    free(ids);
    return comm_agree(n->staged, status, "joining the NCCL groups");
}

static int nccl_all_reduce(comm *c, comm_group group, void *data, int64_t count, comm_type type, comm_reduction op,
                           comm_stream stream)
{
    nccl_comm *n = c->impl;
    if (stream != COMM_DEVICE || type == COMM_INT)
        return comm_all_reduce(n->staged, group, data, count, type, op, stream);
    if (!n->groups[group]) return TP_OK; /* not a member: data stays as it is */
    return cuda_group_all_reduce(n->groups[group], data, count, type == COMM_DOUBLE, op == COMM_MAX);
}

static int nccl_send(comm *c, comm_peer peer, const void *data, int64_t count, comm_type type, int tag, comm_stream stream)
{
    nccl_comm *n = c->impl;
    return comm_send(n->staged, peer, data, count, type, tag, stream);
}

static int nccl_recv(comm *c, comm_peer peer, void *data, int64_t count, comm_type type, int tag, comm_stream stream)
{
    nccl_comm *n = c->impl;
    return comm_recv(n->staged, peer, data, count, type, tag, stream);
}

static int nccl_wait_sends(comm *c, comm_stream stream)
{
    nccl_comm *n = c->impl;
    return comm_wait_sends(n->staged, stream);
}

static int nccl_broadcast(comm *c, void *data, int64_t bytes, int root, comm_stream stream)
{
    nccl_comm *n = c->impl;
    return comm_broadcast(n->staged, data, bytes, root, stream);
}

static void nccl_abort(comm *c, int status)
{
    nccl_comm *n = c->impl;
    comm_abort(n->staged, status);
}

static void nccl_free(comm *c)
{
    nccl_comm *n = c->impl;
    for (int k = 0; k < GROUP_KINDS; k++) cuda_group_free(n->groups[k]);
    comm_free(n->staged);
    free(n);
    free(c);
}

static const comm_ops nccl_ops = {"nccl", nccl_all_reduce, nccl_send, nccl_recv, nccl_wait_sends, nccl_broadcast,
                                  nccl_abort, nccl_free, 1};

int comm_nccl_create(comm **out, comm *host, const kernel_backend *kernels)
{
    *out = NULL;
    comm *c = calloc(1, sizeof *c);
    nccl_comm *n = calloc(1, sizeof *n);
    int status = c && n ? comm_staged_create(&n->staged, host, kernels)
                        : tp_fail(TP_ERR_NOMEM, "out of memory for a communicator");
    if (!status) {
        *c = *host; /* the same placement */
        c->ops = &nccl_ops;
        c->impl = n;
    }
    const comm_group kinds[GROUP_KINDS] = {GROUP_WORLD, GROUP_TP, GROUP_DP, GROUP_EMBED};
    for (int k = 0; k < GROUP_KINDS && !status; k++) status = make_groups(n, host, kinds[k]);
    if (status) {
        if (c && n && n->staged) nccl_free(c);
        else free(c), free(n);
        return status;
    }
    *out = c;
    return TP_OK;
}
