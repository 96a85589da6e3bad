/* comm_nccl.c: the communicator of ranks on GPUs (comm.h,
 * comm_nccl_create). The trainer's all-reduces of device data (tensor
 * parallel sums, the tied embedding's gradient, data-parallel averaging)
 * go through NCCL groups on the CUDA backend's stream, and so do its
 * pipeline messages: each pair of neighbouring stages (same TP rank and
 * replica) has two links, one per direction (activations forward,
 * gradients backward), so that every NCCL communicator carries messages
 * one way, in issue order, with sends on a stream of their own
 * (cuda_group_send): 1F1B's sends then never wait on each other across
 * directions. Everything else (host data, integers, the stop and failure
 * verdicts) goes through the host communicator, device data copied
 * through the host (comm_staged). The NCCL groups' ids are drawn by each
 * group's first rank and shared with a world all-reduce of the host
 * communicator. */
#include <stdlib.h>
#include <string.h>

#include "../common/error.h"
#include "../kernels/kernels.h"
#include "comm.h"

/* Group kinds: comm_group's four, then the pipeline links. A link joins
 * stages s and s + 1 (members 0 and 1); a rank is in the link starting at
 * its own stage and in the one starting at the stage before, one of even s
 * and one of odd s, which makes each kind hold at most one group per rank. */
enum {
    GROUP_KINDS = 4, /* comm_group: WORLD, TP, DP, EMBED */
    LINK_EVEN_FORWARD = GROUP_KINDS, /* activations from even s to s + 1 */
    LINK_EVEN_BACKWARD,              /* gradients from s + 1 to even s */
    LINK_ODD_FORWARD,
    LINK_ODD_BACKWARD,
    ALL_KINDS
};

/* Where a pipeline send went: the link to the next stage, the one to the
 * previous stage, or the staged communicator (host data, the ring's wrap). */
enum { SENT_NEXT, SENT_PREV, SENT_STAGED, SENT_WAYS };

typedef struct {
    comm *staged;                   /* host data, integers */
    cuda_group *groups[ALL_KINDS];  /* NULL: not a member (EMBED on a middle stage, a link of a stage alone) */
    unsigned char *sent;            /* per send since the last wait for all: its SENT_ way */
    int64_t num_sent, max_sent;
} nccl_comm;

/* How many sends of each way are among the first `first` of a log of
 * ways: what a wait for those first sends must wait for on each. */
static void sends_per_way(const unsigned char *sent, int64_t num_sent, int64_t first, int64_t out[SENT_WAYS])
{
    for (int w = 0; w < SENT_WAYS; w++) out[w] = 0;
    for (int64_t i = 0; i < first && i < num_sent; i++) out[sent[i]]++;
}

/* Members of this rank's group of a kind, its place in it and the rank of
 * its first member; 0 members when the rank is in no such group. */
static void group_of(const comm *c, int kind, int *members, int *member, int *leader)
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
    default: { /* a link */
        int parity = kind == LINK_EVEN_FORWARD || kind == LINK_EVEN_BACKWARD ? 0 : 1;
        int start = c->pp_rank % 2 == parity ? c->pp_rank : c->pp_rank - 1;
        if (start >= 0 && start + 1 < c->pp)
            *members = 2, *member = c->pp_rank - start, *leader = c->rank - (c->pp_rank - start) * c->tp;
    }
    }
}

/* The link this rank sends to (or receives from) peer on, and the peer's
 * member number in it. To the next stage: the forward link starting here;
 * from it: the backward one. With the previous stage: the links starting
 * there, the other way round. The ring's wrap (the last stage's next is
 * the first) has no link: its messages go through the host communicator. */
static cuda_group *link_to(const nccl_comm *n, const comm *c, comm_peer peer, int sending, int *other)
{
    int start = peer == COMM_NEXT_STAGE ? c->pp_rank : c->pp_rank - 1;
    int forward = (peer == COMM_NEXT_STAGE) == (sending != 0);
    int kind = start % 2 == 0 ? (forward ? LINK_EVEN_FORWARD : LINK_EVEN_BACKWARD)
                              : (forward ? LINK_ODD_FORWARD : LINK_ODD_BACKWARD);
    *other = peer == COMM_NEXT_STAGE ? 1 : 0;
    return start >= 0 && start + 1 < c->pp ? n->groups[kind] : NULL;
}

/* The groups of one kind: their first ranks draw ids, a world sum of the
 * (otherwise zero) table shares them, each rank joins its own. */
static int make_groups(nccl_comm *n, comm *c, int kind)
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

static int nccl_all_gather(comm *c, comm_group group, const void *send, void *recv, int64_t count, comm_type type,
                           comm_stream stream)
{
    nccl_comm *n = c->impl;
    if (stream != COMM_DEVICE || type == COMM_INT)
        return comm_all_gather(n->staged, group, send, recv, count, type, stream);
    if (!n->groups[group]) return TP_OK;
    return cuda_group_all_gather(n->groups[group], send, recv, count, (int)comm_type_size(type));
}

static int nccl_reduce_scatter(comm *c, comm_group group, const void *send, void *recv, int64_t count,
                               comm_type type, comm_stream stream)
{
    nccl_comm *n = c->impl;
    if (stream != COMM_DEVICE || type == COMM_INT)
        return comm_reduce_scatter(n->staged, group, send, recv, count, type, stream);
    if (!n->groups[group]) return TP_OK;
    return cuda_group_reduce_scatter(n->groups[group], send, recv, count, type == COMM_DOUBLE);
}

/* Tags are not sent: each link's messages arrive in the order sent, which
 * is the order the pipeline receives them. */
static int nccl_send(comm *c, comm_peer peer, const void *data, int64_t count, comm_type type, int tag, comm_stream stream)
{
    nccl_comm *n = c->impl;
    int other;
    cuda_group *link = link_to(n, c, peer, 1, &other);
    int staged = stream != COMM_DEVICE || (type != COMM_FLOAT && type != COMM_DOUBLE) || !link;
    if (n->num_sent == n->max_sent) {
        int64_t more = n->max_sent ? 2 * n->max_sent : 64;
        unsigned char *bigger = realloc(n->sent, (size_t)more);
        if (!bigger) return tp_fail(TP_ERR_NOMEM, "out of memory for a log of %lld sends", (long long)more);
        n->sent = bigger;
        n->max_sent = more;
    }
    TP_TRY(staged ? comm_send(n->staged, peer, data, count, type, tag, stream)
                  : cuda_group_send(link, other, data, count, type == COMM_DOUBLE));
    n->sent[n->num_sent++] = staged ? SENT_STAGED : peer == COMM_NEXT_STAGE ? SENT_NEXT : SENT_PREV;
    return TP_OK;
}

static int nccl_recv(comm *c, comm_peer peer, void *data, int64_t count, comm_type type, int tag, comm_stream stream)
{
    nccl_comm *n = c->impl;
    int other;
    cuda_group *link = link_to(n, c, peer, 0, &other);
    if (stream != COMM_DEVICE || (type != COMM_FLOAT && type != COMM_DOUBLE) || !link)
        return comm_recv(n->staged, peer, data, count, type, tag, stream);
    return cuda_group_recv(link, other, data, count, type == COMM_DOUBLE);
}

/* The first `sends` sends: on each link as many of its own, and on the
 * staged communicator as many of its (each counts its sends since the
 * last wait for all, as this one does); all of them when sends < 0. A
 * wait for every link's send would deadlock the pipeline (schedule.h). */
static int nccl_wait_sends(comm *c, int64_t sends, comm_stream stream)
{
    nccl_comm *n = c->impl;
    int64_t per_way[SENT_WAYS];
    sends_per_way(n->sent, n->num_sent, sends < 0 ? n->num_sent : sends, per_way);
    const comm_peer peers[2] = {COMM_NEXT_STAGE, COMM_PREV_STAGE};
    for (int p = 0; p < 2 && stream == COMM_DEVICE; p++) {
        int other;
        cuda_group *link = link_to(n, c, peers[p], 1, &other);
        if (link) TP_TRY(cuda_group_wait_sends(link, sends < 0 ? -1 : per_way[p]));
    }
    TP_TRY(n->staged->ops->wait_sends(n->staged, sends < 0 ? -1 : per_way[SENT_STAGED], stream));
    if (sends < 0) n->num_sent = 0;
    return TP_OK;
}

static int nccl_broadcast(comm *c, void *data, int64_t bytes, int root, comm_stream stream)
{
    nccl_comm *n = c->impl;
    return comm_broadcast(n->staged, data, bytes, root, stream);
}

static int nccl_gather(comm *c, const void *data, int64_t bytes, void *out, const int64_t *counts, int root)
{
    nccl_comm *n = c->impl;
    return n->staged->ops->gather(n->staged, data, bytes, out, counts, root);
}

static void nccl_abort(comm *c, int status)
{
    nccl_comm *n = c->impl;
    comm_abort(n->staged, status);
}

static void nccl_free(comm *c)
{
    nccl_comm *n = c->impl;
    for (int k = 0; k < ALL_KINDS; k++) cuda_group_free(n->groups[k]);
    comm_free(n->staged);
    free(n->sent);
    free(n);
    free(c);
}

static const comm_ops nccl_ops = {.name = "nccl", .all_reduce = nccl_all_reduce, .send = nccl_send,
                                  .recv = nccl_recv, .wait_sends = nccl_wait_sends, .broadcast = nccl_broadcast,
                                  .gather = nccl_gather, .all_gather = nccl_all_gather,
                                  .reduce_scatter = nccl_reduce_scatter, .abort = nccl_abort, .free = nccl_free,
                                  .handles_device = 1};

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
    for (int k = 0; k < ALL_KINDS && !status; k++) status = make_groups(n, host, k);
    if (status) {
        if (c && n && n->staged) nccl_free(c);
        else free(c), free(n);
        return status;
    }
    *out = c;
    return TP_OK;
}
