/* comm_mpi.c: the communicator on MPI. Sends are non-blocking (a pipeline
 * stage may send before its neighbour posts the receive); receives block. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"

#define MAX_PENDING 64

typedef struct {
    MPI_Comm world, tp, dp, embed;
    int next, prev; /* world ranks of the neighbouring stages, or -1 */
    MPI_Request pending[MAX_PENDING];
    int num_pending;
} mpi_impl;

static MPI_Comm group_of(comm *c, comm_group group)
{
    mpi_impl *m = c->impl;
    switch (group) {
    case GROUP_TP: return m->tp;
    case GROUP_DP: return m->dp;
    case GROUP_EMBED: return m->embed;
    case GROUP_WORLD: break;
    }
    return m->world;
}

static int check(comm *c, int rc, const char *what)
{
    if (rc == MPI_SUCCESS) return 0;
    char text[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, text, &n);
    snprintf(c->error, sizeof c->error, "MPI %s failed: %s", what, text);
    return -1;
}

static int reduce(comm *c, comm_group group, void *data, int64_t n, MPI_Datatype type, MPI_Op op)
{
    MPI_Comm g = group_of(c, group);
    if (g == MPI_COMM_NULL) return 0; /* not a member: nothing to combine */
    /* Counts above INT_MAX go in pieces. */
    char *p = data;
    int size;
    MPI_Type_size(type, &size);
    while (n > 0) {
        int count = n > (1 << 30) ? (1 << 30) : (int)n;
        if (check(c, MPI_Allreduce(MPI_IN_PLACE, p, count, type, op, g), "allreduce")) return -1;
        p += (int64_t)count * size;
        n -= count;
    }
    return 0;
}

static int sum_floats(comm *c, comm_group group, float *data, int64_t n)
{
    return reduce(c, group, data, n, MPI_FLOAT, MPI_SUM);
}

static int max_floats(comm *c, comm_group group, float *data, int64_t n)
{
    return reduce(c, group, data, n, MPI_FLOAT, MPI_MAX);
}

static int sum_doubles(comm *c, comm_group group, double *data, int64_t n)
{
    return reduce(c, group, data, n, MPI_DOUBLE, MPI_SUM);
}

static int max_ints(comm *c, comm_group group, int *data, int64_t n)
{
    return reduce(c, group, data, n, MPI_INT, MPI_MAX);
}

static int send_to(comm *c, int peer, const float *data, int64_t n, int tag)
{
    mpi_impl *m = c->impl;
    if (peer < 0) {
        snprintf(c->error, sizeof c->error, "no neighbouring stage to send to");
        return -1;
    }
    if (m->num_pending == MAX_PENDING && c->ops->wait_sends(c)) return -1;
    return check(c, MPI_Isend(data, (int)n, MPI_FLOAT, peer, tag, m->world, &m->pending[m->num_pending++]), "send");
}

static int recv_from(comm *c, int peer, float *data, int64_t n, int tag)
{
    mpi_impl *m = c->impl;
    if (peer < 0) {
        snprintf(c->error, sizeof c->error, "no neighbouring stage to receive from");
        return -1;
    }
    return check(c, MPI_Recv(data, (int)n, MPI_FLOAT, peer, tag, m->world, MPI_STATUS_IGNORE), "recv");
}

static int send_next(comm *c, const float *data, int64_t n, int tag)
{
    return send_to(c, ((mpi_impl *)c->impl)->next, data, n, tag);
}

static int send_prev(comm *c, const float *data, int64_t n, int tag)
{
    return send_to(c, ((mpi_impl *)c->impl)->prev, data, n, tag);
}

static int recv_prev(comm *c, float *data, int64_t n, int tag)
{
    return recv_from(c, ((mpi_impl *)c->impl)->prev, data, n, tag);
}

static int recv_next(comm *c, float *data, int64_t n, int tag)
{
    return recv_from(c, ((mpi_impl *)c->impl)->next, data, n, tag);
}

static int wait_sends(comm *c)
{
    mpi_impl *m = c->impl;
    int rc = MPI_Waitall(m->num_pending, m->pending, MPI_STATUSES_IGNORE);
    m->num_pending = 0;
    return check(c, rc, "wait");
}

static int barrier(comm *c)
{
    return check(c, MPI_Barrier(((mpi_impl *)c->impl)->world), "barrier");
}

static int broadcast_bytes(comm *c, void *data, int64_t n, int root)
{
    return check(c, MPI_Bcast(data, (int)n, MPI_BYTE, root, ((mpi_impl *)c->impl)->world), "broadcast");
}

static void abort_all(comm *c, int status)
{
    MPI_Abort(((mpi_impl *)c->impl)->world, status);
}

static void free_comm(comm *c)
{
    if (!c) return;
    mpi_impl *m = c->impl;
    if (m) {
        if (m->num_pending) MPI_Waitall(m->num_pending, m->pending, MPI_STATUSES_IGNORE);
        MPI_Comm *groups[] = {&m->tp, &m->dp, &m->embed, &m->world};
        for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++)
            if (*groups[i] != MPI_COMM_NULL) MPI_Comm_free(groups[i]);
        free(m);
    }
    free(c);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
}

static const comm_ops mpi_ops = {sum_floats, max_floats, sum_doubles, max_ints, send_next, send_prev, recv_prev,
                                 recv_next, wait_sends, barrier, broadcast_bytes, abort_all, free_comm};

int comm_mpi_world_size(int *argc, char ***argv)
{
    int initialized = 0, size = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
        int provided;
        /* Only the main thread calls MPI; checkpoint writers do file I/O alone. */
        MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    }
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    return size;
}

int comm_mpi_rank(void)
{
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

void comm_mpi_finalize(void)
{
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
}

int comm_mpi_create(comm **out, int *argc, char ***argv, int tp, int pp, int dp, char *err, size_t err_size)
{
    *out = NULL;
    int world = comm_mpi_world_size(argc, argv), rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if ((int64_t)tp * pp * dp != world) {
        snprintf(err, err_size, "--tp %d x --pp %d x --dp %d = %lld ranks, but %d were launched (mpirun -np %lld)", tp,
                 pp, dp, (long long)tp * pp * dp, world, (long long)tp * pp * dp);
        return -1;
    }
    comm *c = calloc(1, sizeof *c);
    mpi_impl *m = calloc(1, sizeof *m);
    if (!c || !m) {
        free(c);
        free(m);
        snprintf(err, err_size, "out of memory");
        return -1;
    }
    c->ops = &mpi_ops;
    c->impl = m;
    c->rank = rank;
    c->world = world;
    c->tp = tp;
    c->pp = pp;
    c->dp = dp;
    c->tp_rank = rank % tp;
    c->pp_rank = rank / tp % pp;
    c->dp_rank = rank / (tp * pp);
    MPI_Comm_dup(MPI_COMM_WORLD, &m->world);
    /* Errors come back as codes, to be reported on one line. */
    MPI_Comm_set_errhandler(m->world, MPI_ERRORS_RETURN);
    MPI_Comm_split(m->world, c->dp_rank * pp + c->pp_rank, c->tp_rank, &m->tp);
    MPI_Comm_split(m->world, c->pp_rank * tp + c->tp_rank, c->dp_rank, &m->dp);
    int first_or_last = c->pp_rank == 0 || c->pp_rank == pp - 1;
    MPI_Comm_split(m->world, pp > 1 && first_or_last ? c->dp_rank * tp + c->tp_rank : MPI_UNDEFINED, c->pp_rank,
                   &m->embed);
    m->next = c->pp_rank + 1 < pp ? rank + tp : -1;
    m->prev = c->pp_rank > 0 ? rank - tp : -1;
    *out = c;
    return 0;
}
