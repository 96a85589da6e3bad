/* comm_local.c: the communicator of a single process (tp = pp = dp = 1):
 * every reduction is the identity; there is no neighbouring stage. Used by
 * tools that run a model in one process, and by tests as the dense reference. */
#include <stdio.h>
#include <stdlib.h>

#include "comm.h"

static int identity_floats(comm *c, comm_group g, float *d, int64_t n)
{
    (void)c, (void)g, (void)d, (void)n;
    return 0;
}

static int identity_doubles(comm *c, comm_group g, double *d, int64_t n)
{
    (void)c, (void)g, (void)d, (void)n;
    return 0;
}

static int identity_ints(comm *c, comm_group g, int *d, int64_t n)
{
    (void)c, (void)g, (void)d, (void)n;
    return 0;
}

static int no_peer(comm *c, const float *d, int64_t n, int tag)
{
    (void)d, (void)n, (void)tag;
    snprintf(c->error, sizeof c->error, "a single process has no pipeline neighbour");
    return -1;
}

static int no_peer_recv(comm *c, float *d, int64_t n, int tag)
{
    return no_peer(c, d, n, tag);
}

static int nothing(comm *c)
{
    (void)c;
    return 0;
}

static int broadcast_self(comm *c, void *d, int64_t n, int root)
{
    (void)c, (void)d, (void)n, (void)root;
    return 0;
}

static void abort_self(comm *c, int status)
{
    (void)c;
    exit(status);
}

static void free_local(comm *c)
{
    free(c);
}

static const comm_ops local_ops = {identity_floats, identity_floats, identity_doubles, identity_ints, no_peer, no_peer,
                                   no_peer_recv, no_peer_recv, nothing, nothing, broadcast_self, abort_self, free_local};

int comm_local_create(comm **out)
{
    comm *c = calloc(1, sizeof *c);
    if (!c) return -1;
    c->ops = &local_ops;
    c->world = c->tp = c->pp = c->dp = 1;
    *out = c;
    return 0;
}
