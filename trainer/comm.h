/* comm.h: what the trainer needs from a communicator, behind a table of
 * operations that any backend fills: MPI between processes (comm_mpi.h, a
 * library of its own), threads of one process (comm_threads_create), one
 * process alone (comm_local_create), and NCCL on GPUs (comm_nccl_create). The trainer
 * itself needs no MPI.
 *
 * Ranks are laid out with tensor parallelism innermost:
 *   rank = dp_rank * (pp * tp) + pp_rank * tp + tp_rank
 * Groups: TP (same stage and replica), DP (same stage and TP rank), and EMBED
 * (first and last stage of the same TP rank and replica: the tied embedding).
 *
 * Every operation takes a stream: where a backend orders it among other work
 * on a device (a cudaStream_t for NCCL). COMM_HOST is the host: the
 * operation is complete when it returns. Operations return a tp_status
 * (TP_ERR_COMM on failure, message in tp_errmsg()). Collective operations
 * must be issued in the same order on every member of the group. */
#ifndef TP_COMM_H
#define TP_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "../common/error.h"

typedef enum { GROUP_WORLD, GROUP_TP, GROUP_DP, GROUP_EMBED } comm_group;
/* COMM_BF16: bf16 bits (2 bytes, the trainer's bf16 activations), moved
 * as they are by gathers and messages; no backend sums them (MPI has no
 * bf16 type): all_reduce and reduce_scatter refuse them. */
typedef enum { COMM_FLOAT, COMM_DOUBLE, COMM_INT, COMM_BF16 } comm_type;
typedef enum { COMM_SUM, COMM_MAX } comm_reduction;
/* Same TP rank and replica. The stages form a ring: the last stage's next
 * is the first (the interleaved schedule's chunks continue there). */
typedef enum { COMM_NEXT_STAGE, COMM_PREV_STAGE } comm_peer;
/* The largest message tag: the largest every MPI guarantees (MPI_TAG_UB >=
 * 32767). Messages between two ranks arrive in the order sent whatever
 * their tags, so a sender that needs more numbers reuses them. */
#define COMM_MAX_TAG 32767

#define COMM_ALL_SENDS ((int64_t)-1)

typedef void *comm_stream;
#define COMM_HOST ((comm_stream)0)
/* Data in the memory of the process's kernel backend on a device, the
 * operation ordered after the work issued there (a backend without a device
 * communicator copies through the host: comm_staged_create). */
#define COMM_DEVICE ((comm_stream)1)

typedef struct comm comm;

typedef struct {
    const char *name; /* "mpi", "threads", "local" */
    /* In place over the members of group; a rank outside the group (EMBED
     * on a middle stage) leaves data as it is. */
    int (*all_reduce)(comm *c, comm_group group, void *data, int64_t count, comm_type type, comm_reduction op,
                      comm_stream stream);
    /* Pipeline messages. A send may return before the peer receives; its
     * buffer must stay untouched until wait_sends has waited for it. */
    int (*send)(comm *c, comm_peer peer, const void *data, int64_t count, comm_type type, int tag, comm_stream stream);
    int (*recv)(comm *c, comm_peer peer, void *data, int64_t count, comm_type type, int tag, comm_stream stream);
    /* The first `sends` sends started since the last wait for all of them
     * (COMM_ALL_SENDS: all) have completed: their buffers may be used again. */
    int (*wait_sends)(comm *c, int64_t sends, comm_stream stream);
    int (*broadcast)(comm *c, void *data, int64_t bytes, int root, comm_stream stream); /* over the world */
    /* Host bytes of every rank to root, in rank order: rank r sends bytes
     * (counts[r], which root alone knows); root receives them one after the
     * other into out. Others pass counts and out NULL. Over the world. */
    int (*gather)(comm *c, const void *data, int64_t bytes, void *out, const int64_t *counts, int root);
    /* Over the members of group (TP or DP; every member passes the same
     * count): each member's `count` values of send, one after the other in
     * member order, into recv (members x count values) on every member.
     * send and recv must not overlap, but for the one arrangement in place:
     * send is this member's own part of recv (recv + member x count), which
     * saves a buffer of the part's size. A rank outside the group leaves
     * recv as it is. */
    int (*all_gather)(comm *c, comm_group group, const void *send, void *recv, int64_t count, comm_type type,
                      comm_stream stream);
    /* The sum over the members of their send (members x count values),
     * member j keeping values [j count, (j + 1) count) of it in recv (as
     * all_gather: no overlap, non-members untouched). In place: recv is
     * member j's own part of send (send + j x count), the sum landing
     * where its values were; the rest of send is then undefined. */
    int (*reduce_scatter)(comm *c, comm_group group, const void *send, void *recv, int64_t count, comm_type type,
                          comm_stream stream);
    /* Ends every rank's part in the job: one rank failed while others may be
     * waiting on it. Called by programs, never by the libraries. */
    void (*abort)(comm *c, int status);
    void (*free)(comm *c);
    int handles_device; /* takes COMM_DEVICE data (staged, NCCL); host backends refuse it */
} comm_ops;

struct comm {
    const comm_ops *ops;
    void *impl;
    int rank, world;
    int tp, pp, dp;
    int tp_rank, pp_rank, dp_rank;
};

/* Fills the rank coordinates of c from its rank and the degrees (backends
 * call it); fails when tp * pp * dp is not the world size. */
int comm_place(comm *c, int rank, int world, int tp, int pp, int dp);

/* Data in a device's memory through a host communicator (MPI, threads):
 * COMM_DEVICE operations copy to the host and back with the kernel
 * backend's copies; COMM_HOST ones pass through. host stays the caller's,
 * to be freed after the result. */
struct kernel_backend;
int comm_staged_create(comm **out, comm *host, const struct kernel_backend *kernels);

/* Data on GPUs: all-reduces and pipeline messages of COMM_DEVICE float
 * data through NCCL groups (world, TP, DP, the tied embedding's pairs, a
 * link per direction between neighbouring stages), on the CUDA backend's
 * streams and without host copies; host data and integers through host,
 * as comm_staged. Collective: every rank of host calls it, after kernels_cuda.
 * host stays the caller's, to be freed after the result. Fails with
 * TP_ERR_DEVICE and NCCL's reason (a build without CUDA, no GPU). */
int comm_nccl_create(comm **out, comm *host, const struct kernel_backend *kernels);

/* One process alone (tp = pp = dp = 1). */
int comm_local_create(comm **out);

/* tp * pp * dp ranks in this process, one thread per rank: out[rank] is
 * rank's communicator, to be used by one thread only. Freeing is per rank;
 * the shared state goes with the last. */
int comm_threads_create(comm **out, int tp, int pp, int dp);

/* Sums and maxima of bf16 bits are refused here, for every backend. */
static inline int comm_no_bf16_sums(comm_type type, const char *what)
{
    if (type != COMM_BF16) return TP_OK;
    return tp_fail(TP_ERR_ARG, "%s of bf16 values: the communicators move bf16 but do not sum it", what);
}

static inline int comm_all_reduce(comm *c, comm_group group, void *data, int64_t count, comm_type type,
                                  comm_reduction op, comm_stream stream)
{
    TP_TRY(comm_no_bf16_sums(type, "an all-reduce"));
    return c->ops->all_reduce(c, group, data, count, type, op, stream);
}

static inline int comm_send(comm *c, comm_peer peer, const void *data, int64_t count, comm_type type, int tag,
                            comm_stream stream)
{
    return c->ops->send(c, peer, data, count, type, tag, stream);
}

static inline int comm_recv(comm *c, comm_peer peer, void *data, int64_t count, comm_type type, int tag,
                            comm_stream stream)
{
    return c->ops->recv(c, peer, data, count, type, tag, stream);
}

/* Every send started so far has completed. */
static inline int comm_wait_sends(comm *c, comm_stream stream)
{
    return c->ops->wait_sends(c, COMM_ALL_SENDS, stream);
}

/* The first `sends` sends since the last comm_wait_sends have completed
 * (the others may still be on their way: their receivers may be waiting
 * for this rank). */
static inline int comm_wait_first_sends(comm *c, int64_t sends, comm_stream stream)
{
    return c->ops->wait_sends(c, sends, stream);
}

static inline int comm_all_gather(comm *c, comm_group group, const void *send, void *recv, int64_t count,
                                  comm_type type, comm_stream stream)
{
    return c->ops->all_gather(c, group, send, recv, count, type, stream);
}

static inline int comm_reduce_scatter(comm *c, comm_group group, const void *send, void *recv, int64_t count,
                                      comm_type type, comm_stream stream)
{
    TP_TRY(comm_no_bf16_sums(type, "a reduce-scatter"));
    return c->ops->reduce_scatter(c, group, send, recv, count, type, stream);
}

/* Bytes of one value of a type. */
size_t comm_type_size(comm_type type);

/* The members of a group this rank belongs to (1 for EMBED on a middle stage). */
int comm_group_size(const comm *c, comm_group group);

static inline int comm_broadcast(comm *c, void *data, int64_t bytes, int root, comm_stream stream)
{
    return c->ops->broadcast(c, data, bytes, root, stream);
}

/* Every rank's text (NUL-terminated; NULL counts as none) to root:
 * *out (root: world entries, malloc'ed, NULL for ranks that sent none;
 * others: NULL). Collective; free with comm_texts_free. */
int comm_gather_texts(comm *c, const char *text, int root, char ***out);
void comm_texts_free(char **texts, int count);

/* Root's text (NUL-terminated; NULL: none) to every rank: on the others
 * *text becomes a malloc'ed copy (NULL when root had none); root's is left
 * as it is. Collective. */
int comm_broadcast_text(comm *c, char **text, int root);

/* Whether `flag` is set on any rank: every rank gets the same answer in *any.
 * The way ranks agree on a verdict (a failure, a stop request). */
static inline int comm_any(comm *c, int flag, int *any)
{
    *any = flag != 0;
    return c->ops->all_reduce(c, GROUP_WORLD, any, 1, COMM_INT, COMM_MAX, COMM_HOST);
}

/* Every rank learns whether any rank's status is a failure: a failed rank
 * returns its own status and message, the others TP_ERR_STATE with "WHAT:
 * another rank failed" (or the communicator's failure). The same verdict on
 * every rank. */
int comm_agree(comm *c, int status, const char *what);

/* Whether any rank failed (*any, the same on every rank), and if one did,
 * the message of the lowest rank that failed in every rank's `message`
 * (`size` bytes; a failed rank passes its own there). Collective. */
int comm_first_failure(comm *c, int failed, char *message, int64_t size, int *any);

/* Rank 0's status, and its message, become every rank's: for what rank 0
 * alone decides (a run directory's claim), said alike by all. Collective. */
int comm_agree_root(comm *c, int status, const char *what);

/* As comm_agree, but every rank gets the status and message of the lowest
 * rank that failed ("rank R: " in front where R is not 0): the cause, where
 * comm_agree leaves the others with "another rank failed" (rank 0, which
 * speaks for the job, then named no cause when only another rank failed).
 * Collective. */
int comm_agree_first(comm *c, int status, const char *what);

static inline void comm_abort(comm *c, int status)
{
    c->ops->abort(c, status);
}

static inline void comm_free(comm *c)
{
    if (c) c->ops->free(c);
}

#endif
