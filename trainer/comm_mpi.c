/* comm_mpi.c: the communicator on MPI. Sends are non-blocking (a pipeline
 * stage may send before its neighbour posts the receive); receives block.
 * MPI works on host memory: a stream other than COMM_HOST is refused.
 *
 * Waiting sleeps. Open MPI's blocking calls poll without end: a rank that
 * waits for a peer (a pipeline bubble, a peer's slow save, a hung rank)
 * keeps its core busy, taking it from the ranks it waits for where ranks
 * share cores. So every wait here polls a request (wait_politely): 2 ms
 * of polling, then sleeps growing to WAIT_SLEEP_MAX_NS between polls. A
 * collective first waits for all members at a non-blocking barrier, then
 * runs as MPI's blocking call with everyone there: its algorithm, and so
 * its sums, are those of the blocking call. */
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/error.h"
#include "comm_mpi.h"

#define MAX_PENDING 64

typedef struct {
    MPI_Comm world, tp, dp, embed;
    int next, prev; /* world ranks of the neighbouring stages, or -1 */
    MPI_Request pending[MAX_PENDING]; /* sends not yet waited for, oldest first */
    int num_pending;
    int64_t waited;                   /* sends since the last wait for all that were waited for */
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

static MPI_Datatype mpi_type(comm_type type)
{
    switch (type) {
    case COMM_DOUBLE: return MPI_DOUBLE;
    case COMM_INT: return MPI_INT;
    case COMM_BF16: return MPI_UINT16_T; /* moved, never summed (comm.h) */
    case COMM_FLOAT: break;
    }
    return MPI_FLOAT;
}

static int check(comm *c, int rc, const char *what)
{
    if (rc == MPI_SUCCESS) return TP_OK;
    char text[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, text, &n);
    return tp_fail(TP_ERR_COMM, "rank %d: MPI %s failed: %s", c->rank, what, text);
}

/* How long a wait polls before it sleeps, and the longest sleep. The waits
 * of a step (a peer's micro-batch, a collective) mostly end within the
 * polling: with 50 us of it, the tiny model at tp2pp2 on 4 ranks of 2 cores
 * took 2.3 times as long, every short wait paying a sleep; with 2 ms, as
 * long as with MPI's blocking calls. A longer wait (a slow save, a hung
 * peer: test_elastic took 65 processor seconds, now 28) costs at most one
 * sleep's latency, against the milliseconds it waited. */
#define WAIT_SPIN_NS 2000000L
#define WAIT_SLEEP_MAX_NS 1000000L

static long elapsed_ns(const struct timespec *since)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - since->tv_sec) * 1000000000L + (now.tv_nsec - since->tv_nsec);
}

/* Waits for n requests as MPI_Waitall does, sleeping once the spin is spent. */
static int wait_politely(int n, MPI_Request *requests)
{
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    long sleep_ns = 10000;
    for (;;) {
        int done = 0;
        int rc = MPI_Testall(n, requests, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS || done) return rc;
        if (elapsed_ns(&start) < WAIT_SPIN_NS) continue;
        struct timespec pause = {0, sleep_ns};
        nanosleep(&pause, NULL);
        sleep_ns = sleep_ns * 2 > WAIT_SLEEP_MAX_NS ? WAIT_SLEEP_MAX_NS : sleep_ns * 2;
    }
}

/* Every member of g at this point (a non-blocking barrier, waited for
 * politely): the blocking collective that follows does not wait. */
static int all_arrived(comm *c, MPI_Comm g)
{
    MPI_Request barrier;
    TP_TRY(check(c, MPI_Ibarrier(g, &barrier), "barrier"));
    return check(c, wait_politely(1, &barrier), "barrier");
}

static int host_only(comm *c, comm_stream stream)
{
    if (stream == COMM_HOST) return TP_OK;
    return tp_fail(TP_ERR_COMM, "rank %d: the MPI communicator works on host memory only (a device stream was given)",
                   c->rank);
}

static int all_reduce(comm *c, comm_group group, void *data, int64_t count, comm_type type, comm_reduction op,
                      comm_stream stream)
{
    TP_TRY(host_only(c, stream));
    MPI_Comm g = group_of(c, group);
    if (g == MPI_COMM_NULL) return TP_OK; /* not a member: nothing to combine */
    MPI_Datatype t = mpi_type(type);
    int size;
    MPI_Type_size(t, &size);
    TP_TRY(all_arrived(c, g));
    /* Counts above INT_MAX go in pieces. */
    char *p = data;
    while (count > 0) {
        int n = count > (1 << 30) ? (1 << 30) : (int)count;
        TP_TRY(check(c, MPI_Allreduce(MPI_IN_PLACE, p, n, t, op == COMM_MAX ? MPI_MAX : MPI_SUM, g), "allreduce"));
        p += (int64_t)n * size;
        count -= n;
    }
    return TP_OK;
}

/* The most values of one member's part one MPI call takes: what an int
 * counts, with room for the library's byte offsets; TP_COMM_PART_MAX (a
 * testing aid) lowers it, so that small tests take the paths of big counts. */
static int64_t part_max(void)
{
    const char *text = getenv("TP_COMM_PART_MAX");
    long long value = text ? atoll(text) : 0;
    return value > 0 && value < INT_MAX / 8 ? (int64_t)value : INT_MAX / 8;
}

/* Each member's part of an all-gather in one call: counts above part_max
 * (rows x D of a long sequence) go as units of `unit` values, a contiguous
 * type (a power of two dividing the count). */
static int member_part(comm *c, int64_t count, comm_type type, MPI_Datatype *unit_type, int *units, int64_t *unit)
{
    int64_t most = part_max();
    *unit = 1;
    while (count / *unit > most && count % (*unit * 2) == 0) *unit *= 2;
    if (count / *unit > most)
        return tp_fail(TP_ERR_COMM, "rank %d: %lld values per member do not split into MPI counts", c->rank,
                       (long long)count);
    *units = (int)(count / *unit);
    *unit_type = mpi_type(type);
    if (*unit == 1) return TP_OK;
    TP_TRY(check(c, MPI_Type_contiguous((int)*unit, mpi_type(type), unit_type), "type"));
    return check(c, MPI_Type_commit(unit_type), "type");
}

static int all_gather(comm *c, comm_group group, const void *send, void *recv, int64_t count, comm_type type,
                      comm_stream stream)
{
    TP_TRY(host_only(c, stream));
    MPI_Comm g = group_of(c, group);
    if (g == MPI_COMM_NULL) return TP_OK; /* not a member */
    int me;
    TP_TRY(check(c, MPI_Comm_rank(g, &me), "rank"));
    /* In place (comm.h): MPI takes each member's part from where it goes. */
    if (send == (const char *)recv + (size_t)me * (size_t)count * comm_type_size(type)) send = MPI_IN_PLACE;
    MPI_Datatype t = MPI_DATATYPE_NULL;
    int units = 0;
    int64_t unit = 1;
    TP_TRY(member_part(c, count, type, &t, &units, &unit));
    int status = all_arrived(c, g);
    if (!status) status = check(c, MPI_Allgather(send, units, t, recv, units, t, g), "allgather");
    if (unit > 1) MPI_Type_free(&t);
    return status;
}

/* Values of one member's part a reduce-scatter sends at once (reduce_scatter). */
#define REDUCE_SCATTER_PIECE ((int64_t)1 << 20)

static int reduce_scatter(comm *c, comm_group group, const void *send, void *recv, int64_t count, comm_type type,
                          comm_stream stream)
{
    TP_TRY(host_only(c, stream));
    MPI_Comm g = group_of(c, group);
    if (g == MPI_COMM_NULL) return TP_OK; /* not a member */
    /* MPI's sum is defined on the predefined types only: large parts go in
     * pieces of each member's part, each its own reduce-scatter. The pieces
     * are also what bounds the library's own buffers: Open MPI 4.1's
     * reduce-scatter takes temporaries the size of the whole (its default
     * for a few members sums everything on member 0, twice its size there:
     * 154 MB of ZeRO-1's 19M gradients, what the sharded moments saved),
     * so that no part is sent whole beyond REDUCE_SCATTER_PIECE values. */
    int members, me;
    TP_TRY(check(c, MPI_Comm_size(g, &members), "size"));
    TP_TRY(check(c, MPI_Comm_rank(g, &me), "rank"));
    TP_TRY(all_arrived(c, g));
    size_t size = comm_type_size(type);
    int64_t piece = part_max() < REDUCE_SCATTER_PIECE ? part_max() : REDUCE_SCATTER_PIECE;
    if (count <= piece && recv == (const char *)send + (size_t)me * (size_t)count * size) {
        /* In place (comm.h): MPI leaves the member's sum at the start of the
         * buffer, from where it moves to the member's own part. */
        TP_TRY(check(c, MPI_Reduce_scatter_block(MPI_IN_PLACE, (void *)send, (int)count, mpi_type(type), MPI_SUM, g),
                     "reduce_scatter"));
        if (me && count) memmove(recv, send, (size_t)count * size);
        return TP_OK;
    }
    if (count <= piece)
        return check(c, MPI_Reduce_scatter_block(send, recv, (int)count, mpi_type(type), MPI_SUM, g), "reduce_scatter");
    char *packed = malloc((size_t)members * (size_t)piece * size);
    if (!packed) return tp_fail(TP_ERR_NOMEM, "rank %d: out of memory for a reduce-scatter", c->rank);
    int status = TP_OK;
    for (int64_t at = 0; !status && at < count; at += piece) {
        int64_t n = count - at < piece ? count - at : piece;
        /* Member j's part of this piece, packed one after the other. In
         * place, this piece's sum overwrites only what was packed for it. */
        for (int j = 0; j < members; j++)
            memcpy(packed + (size_t)j * (size_t)n * size, (const char *)send + ((size_t)j * (size_t)count + (size_t)at) * size,
                   (size_t)n * size);
        status = check(c, MPI_Reduce_scatter_block(packed, (char *)recv + (size_t)at * size, (int)n, mpi_type(type),
                                                   MPI_SUM, g), "reduce_scatter");
    }
    free(packed);
    return status;
}

static int peer_rank(comm *c, comm_peer peer, int *out)
{
    mpi_impl *m = c->impl;
    *out = peer == COMM_NEXT_STAGE ? m->next : m->prev;
    if (*out >= 0) return TP_OK;
    return tp_fail(TP_ERR_COMM, "rank %d (stage %d of %d) has no %s stage", c->rank, c->pp_rank, c->pp,
                   peer == COMM_NEXT_STAGE ? "next" : "previous");
}

static int wait_sends(comm *c, int64_t sends, comm_stream stream)
{
    TP_TRY(host_only(c, stream));
    mpi_impl *m = c->impl;
    /* The oldest n pending: those of the first `sends` not waited for yet. */
    int64_t n = sends < 0 ? m->num_pending : sends - m->waited;
    if (n > m->num_pending) n = m->num_pending;
    if (n < 0) n = 0;
    int rc = wait_politely((int)n, m->pending);
    m->num_pending -= (int)n;
    memmove(m->pending, m->pending + n, (size_t)m->num_pending * sizeof *m->pending);
    m->waited = sends < 0 ? 0 : m->waited + n; /* the count starts again after a wait for all */
    return check(c, rc, "wait");
}

/* A point-to-point message's count as MPI takes it, an int: one beyond it
 * (more than 2^31 values between two stages) is refused, never cut to its
 * low bits, as a cast would. */
static int int_count(comm *c, int64_t count, const char *what)
{
    if (count <= INT_MAX) return TP_OK;
    return tp_fail(TP_ERR_COMM, "rank %d: a %s of %lld values, more than one MPI message counts (%d)", c->rank, what,
                   (long long)count, INT_MAX);
}

static int send(comm *c, comm_peer peer, const void *data, int64_t count, comm_type type, int tag, comm_stream stream)
{
    mpi_impl *m = c->impl;
    int to;
    TP_TRY(host_only(c, stream));
    TP_TRY(int_count(c, count, "send"));
    TP_TRY(peer_rank(c, peer, &to));
    if (m->num_pending == MAX_PENDING) TP_TRY(wait_sends(c, m->waited + 1, stream)); /* the oldest */
    return check(c, MPI_Isend(data, (int)count, mpi_type(type), to, tag, m->world, &m->pending[m->num_pending++]),
                 "send");
}

static int recv(comm *c, comm_peer peer, void *data, int64_t count, comm_type type, int tag, comm_stream stream)
{
    mpi_impl *m = c->impl;
    int from;
    TP_TRY(host_only(c, stream));
    TP_TRY(int_count(c, count, "receive"));
    TP_TRY(peer_rank(c, peer, &from));
    MPI_Request request;
    TP_TRY(check(c, MPI_Irecv(data, (int)count, mpi_type(type), from, tag, m->world, &request), "recv"));
    return check(c, wait_politely(1, &request), "recv");
}

static int broadcast(comm *c, void *data, int64_t bytes, int root, comm_stream stream)
{
    TP_TRY(host_only(c, stream));
    MPI_Comm world = ((mpi_impl *)c->impl)->world;
    TP_TRY(all_arrived(c, world));
    for (int64_t at = 0; at < bytes; at += 1 << 30) /* MPI counts are ints: in pieces, in order */
        TP_TRY(check(c, MPI_Bcast((char *)data + at, (int)(bytes - at < (1 << 30) ? bytes - at : 1 << 30), MPI_BYTE, root,
                                  world), "broadcast"));
    return TP_OK;
}

static int gather(comm *c, const void *data, int64_t bytes, void *out, const int64_t *counts, int root)
{
    mpi_impl *m = c->impl;
    int *sizes = NULL, *offsets = NULL, status = TP_OK;
    if (bytes > INT_MAX) return tp_fail(TP_ERR_COMM, "rank %d: %lld bytes to gather, more than MPI counts", c->rank, (long long)bytes);
    if (c->rank == root) {
        sizes = malloc((size_t)c->world * sizeof *sizes);
        offsets = malloc((size_t)c->world * sizeof *offsets);
        if (!sizes || !offsets) status = tp_fail(TP_ERR_NOMEM, "out of memory for a gather");
        int64_t at = 0;
        for (int r = 0; !status && r < c->world; r++) {
            if (at + counts[r] > INT_MAX)
                status = tp_fail(TP_ERR_COMM, "a gather of more than %d bytes", INT_MAX);
            sizes[r] = (int)counts[r];
            offsets[r] = (int)at;
            at += counts[r];
        }
    }
    /* A root that cannot receive still takes part, then fails: the others are waiting. */
    int ok = !status;
    int arrived = all_arrived(c, m->world);
    int mpi = arrived ? MPI_SUCCESS : MPI_Gatherv(data, (int)bytes, MPI_BYTE, ok ? out : NULL, ok ? sizes : NULL, ok ? offsets : NULL, MPI_BYTE,
                          root, m->world);
    free(sizes);
    free(offsets);
    if (arrived) return arrived;
    if (status) return status;
    return check(c, mpi, "gather");
}

static void abort_all(comm *c, int status)
{
    MPI_Abort(((mpi_impl *)c->impl)->world, status);
}

static void free_comm(comm *c)
{
    mpi_impl *m = c->impl;
    if (m) {
        if (m->num_pending) MPI_Waitall(m->num_pending, m->pending, MPI_STATUSES_IGNORE);
        MPI_Comm *groups[] = {&m->tp, &m->dp, &m->embed, &m->world};
        for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++)
            if (*groups[i] != MPI_COMM_NULL) MPI_Comm_free(groups[i]);
        free(m);
    }
    free(c);
    comm_mpi_finalize();
}

static const comm_ops mpi_ops = {.name = "mpi", .all_reduce = all_reduce, .send = send, .recv = recv,
                                 .wait_sends = wait_sends, .broadcast = broadcast, .gather = gather,
                                 .all_gather = all_gather, .reduce_scatter = reduce_scatter, .abort = abort_all,
                                 .free = free_comm};

/* Whether no MPI launcher started this process (none of the variables that
 * mpirun, srun's PMIx or PMI-2 and Hydra give their ranks) and MPI is not
 * running: a world of one, without MPI. Open MPI's start in a process of
 * its own (a singleton, for which it starts a daemon) took 0.3 s of a tiny
 * run's 0.4. */
static int alone(void)
{
    static const char *const launchers[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"};
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return 0;
    for (size_t i = 0; i < sizeof launchers / sizeof *launchers; i++)
        if (getenv(launchers[i])) return 0;
    return 1;
}

static int mpi_running(void)
{
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    if (initialized) MPI_Finalized(&finalized);
    return initialized && !finalized;
}

int comm_mpi_world_size(int *argc, char ***argv)
{
    int initialized = 0, size = 0;
    if (alone()) return 1;
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
    if (mpi_running()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

int comm_launcher_rank(void)
{
    static const char *const ranks[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof ranks / sizeof *ranks; i++) {
        const char *text = getenv(ranks[i]);
        if (text && *text) return atoi(text);
    }
    return 0;
}

int comm_mpi_local_rank(void)
{
    /* The ranks that share this machine's memory, in world order. */
    MPI_Comm node;
    int local = 0;
    if (!mpi_running()) return 0;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, comm_mpi_rank(), MPI_INFO_NULL, &node) != MPI_SUCCESS)
        return comm_mpi_rank();
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    return local;
}

void comm_mpi_finalize(void)
{
    if (mpi_running()) MPI_Finalize();
}

int comm_mpi_create(comm **out, int *argc, char ***argv, int tp, int pp, int dp)
{
    *out = NULL;
    int world = comm_mpi_world_size(argc, argv), rank = comm_mpi_rank();
    if (!mpi_running()) { /* alone: the one rank's communicator */
        comm layout;
        TP_TRY(comm_place(&layout, rank, world, tp, pp, dp));
        return comm_local_create(out);
    }
    comm *c = calloc(1, sizeof *c);
    mpi_impl *m = calloc(1, sizeof *m);
    if (!c || !m) {
        free(c);
        free(m);
        return tp_fail(TP_ERR_NOMEM, "out of memory for a communicator");
    }
    int status = comm_place(c, rank, world, tp, pp, dp);
    if (status) {
        free(c);
        free(m);
        return status;
    }
    c->ops = &mpi_ops;
    c->impl = m;
    MPI_Comm_dup(MPI_COMM_WORLD, &m->world);
    /* Errors come back as codes, to be reported on one line. */
    MPI_Comm_set_errhandler(m->world, MPI_ERRORS_RETURN);
    MPI_Comm_split(m->world, c->dp_rank * pp + c->pp_rank, c->tp_rank, &m->tp);
    MPI_Comm_split(m->world, c->pp_rank * tp + c->tp_rank, c->dp_rank, &m->dp);
    int first_or_last = c->pp_rank == 0 || c->pp_rank == pp - 1;
    MPI_Comm_split(m->world, pp > 1 && first_or_last ? c->dp_rank * tp + c->tp_rank : MPI_UNDEFINED, c->pp_rank,
                   &m->embed);
    /* A ring: the last stage's next is the first (the interleaved
     * schedule's chunks continue there), the first's previous the last. */
    m->next = pp > 1 ? rank + (c->pp_rank + 1 < pp ? tp : -(pp - 1) * tp) : -1;
    m->prev = pp > 1 ? rank + (c->pp_rank > 0 ? -tp : (pp - 1) * tp) : -1;
    *out = c;
    return TP_OK;
}
