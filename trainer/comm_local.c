/* comm_local.c: the communicator of a single process (tp = pp = dp = 1):
 * every reduction is the identity; there is no neighbouring stage. Used by
 * tools that run a model in one process, and by tests as the dense reference. */
#include <stdlib.h>
#include <string.h>

#include "../common/error.h"
#include "comm.h"

static int identity(comm *c, comm_group group, void *data, int64_t count, comm_type type, comm_reduction op,
                    comm_stream stream)
{
    (void)c, (void)group, (void)data, (void)count, (void)type, (void)op, (void)stream;
    return TP_OK;
}

static int no_peer(comm *c, comm_peer peer, const void *data, int64_t count, comm_type type, int tag, comm_stream stream)
{
    (void)c, (void)peer, (void)data, (void)count, (void)type, (void)tag, (void)stream;
    return tp_fail(TP_ERR_COMM, "a single process has no pipeline neighbour");
}

static int no_peer_recv(comm *c, comm_peer peer, void *data, int64_t count, comm_type type, int tag,
                        comm_stream stream)
{
    return no_peer(c, peer, data, count, type, tag, stream);
}

static int nothing_pending(comm *c, int64_t sends, comm_stream stream)
{
    (void)c, (void)sends, (void)stream;
    return TP_OK;
}

static int broadcast_self(comm *c, void *data, int64_t bytes, int root, comm_stream stream)
{
    (void)c, (void)data, (void)bytes, (void)root, (void)stream;
    return TP_OK;
}

static int gather_self(comm *c, const void *data, int64_t bytes, void *out, const int64_t *counts, int root)
{
    (void)c, (void)counts, (void)root;
    if (bytes) memcpy(out, data, (size_t)bytes);
    return TP_OK;
}

/* A group of one: its own values are the gathered ones and the sum. */
static int copy_self(comm *c, comm_group group, const void *send, void *recv, int64_t count, comm_type type,
                     comm_stream stream)
{
    (void)c, (void)group, (void)stream;
    size_t bytes = (size_t)count * comm_type_size(type);
    if (bytes && recv != send) memcpy(recv, send, bytes); /* in place: nothing to move */
    return TP_OK;
}

/* Nobody else waits on a process alone: the caller ends it as it likes. */
static void abort_self(comm *c, int status)
{
    (void)c, (void)status;
}

static void free_local(comm *c)
{
    free(c);
}

static const comm_ops local_ops = {.name = "local", .all_reduce = identity, .send = no_peer, .recv = no_peer_recv,
                                   .wait_sends = nothing_pending, .broadcast = broadcast_self, .gather = gather_self,
                                   .all_gather = copy_self, .reduce_scatter = copy_self, .abort = abort_self,
                                   .free = free_local};

int comm_local_create(comm **out)
{
    *out = NULL;
    comm *c = calloc(1, sizeof *c);
    if (!c) return tp_fail(TP_ERR_NOMEM, "out of memory for a communicator");
    c->ops = &local_ops;
    comm_place(c, 0, 1, 1, 1, 1);
    *out = c;
    return TP_OK;
}
