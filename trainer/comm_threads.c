/* comm_threads.c: the ranks of a layout as threads of one process, sharing
 * memory: no MPI, no second process. Tests run parallel layouts with it, and
 * a single GPU can hold several ranks.
 *
 * A collective is two meetings of the group's members: each posts a pointer
 * to its buffer, every member computes the result from all of them into its
 * own scratch (in member order, so every member gets the same bits), they
 * meet again (nobody reads a buffer any more) and each copies its result
 * home. A pipeline message is copied into a queue of the receiving rank, so
 * a send never waits. One lock and one condition serve everything: the
 * traffic of tests is small. Aborting wakes every waiting rank with an error. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../common/error.h"
#include "comm.h"

typedef struct {
    int members;
    int arrived;
    uint64_t generation;
    void **slots; /* per member: its buffer during a collective */
} meeting;

typedef struct message {
    struct message *next;
    int from, tag;
    int64_t bytes;
    char data[];
} message;

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int tp, pp, dp, world;
    int aborted, abort_status, abort_rank;
    int live; /* communicators not yet freed */
    meeting world_group;
    meeting *tp_groups, *dp_groups, *embed_groups;
    message **inbox; /* per rank */
} shared_state;

/* Called with the lock held: waits for any change, unless the job ended. */
static int wait_change(shared_state *s, comm *c)
{
    if (!s->aborted) pthread_cond_wait(&s->changed, &s->lock);
    if (!s->aborted) return TP_OK;
    return tp_fail(TP_ERR_COMM, "rank %d: rank %d ended the job (status %d)", c->rank, s->abort_rank, s->abort_status);
}

/* Called with the lock held: returns once every member has arrived. */
static int meet(shared_state *s, meeting *g, comm *c)
{
    uint64_t generation = g->generation;
    if (++g->arrived == g->members) {
        g->arrived = 0;
        g->generation++;
        pthread_cond_broadcast(&s->changed);
        return TP_OK;
    }
    while (g->generation == generation) TP_TRY(wait_change(s, c));
    return TP_OK;
}

/* The meeting of a group this rank belongs to, and its place in it; NULL
 * when it is not a member (EMBED on a middle stage). */
static meeting *group_of(comm *c, comm_group group, int *member)
{
    shared_state *s = c->impl;
    switch (group) {
    case GROUP_TP:
        *member = c->tp_rank;
        return &s->tp_groups[c->dp_rank * c->pp + c->pp_rank];
    case GROUP_DP:
        *member = c->dp_rank;
        return &s->dp_groups[c->pp_rank * c->tp + c->tp_rank];
    case GROUP_EMBED:
        if (c->pp < 2 || (c->pp_rank != 0 && c->pp_rank != c->pp - 1)) return NULL;
        *member = c->pp_rank == 0 ? 0 : 1;
        return &s->embed_groups[c->dp_rank * c->tp + c->tp_rank];
    case GROUP_WORLD: break;
    }
    *member = c->rank;
    return &s->world_group;
}

/* A collective's first meeting: this member posts its buffer and waits for
 * the others', whose buffers it may then read. */
static int post(meeting *g, comm *c, int member, const void *buffer)
{
    shared_state *s = c->impl;
    pthread_mutex_lock(&s->lock);
    g->slots[member] = (void *)buffer;
    int status = meet(s, g, c);
    pthread_mutex_unlock(&s->lock);
    return status;
}

/* Its second: nobody reads another's buffer after it. Passes a failure on. */
static int part(meeting *g, comm *c, int status)
{
    shared_state *s = c->impl;
    pthread_mutex_lock(&s->lock);
    if (!status) status = meet(s, g, c);
    pthread_mutex_unlock(&s->lock);
    return status;
}

static int host_only(comm *c, comm_stream stream)
{
    if (stream == COMM_HOST) return TP_OK;
    return tp_fail(TP_ERR_COMM, "rank %d: the thread communicator works on host memory only", c->rank);
}

#define COMBINE(T)                                                                                                     \
    do {                                                                                                               \
        T *acc = out;                                                                                                  \
        memcpy(acc, slots[0], (size_t)count * sizeof(T));                                                              \
        for (int j = 1; j < members; j++) {                                                                            \
            const T *x = slots[j];                                                                                     \
            if (op == COMM_SUM)                                                                                        \
                for (int64_t k = 0; k < count; k++) acc[k] += x[k];                                                    \
            else                                                                                                       \
                for (int64_t k = 0; k < count; k++) acc[k] = x[k] > acc[k] ? x[k] : acc[k];                            \
        }                                                                                                              \
    } while (0)

static void combine(void *const *slots, int members, void *out, int64_t count, comm_type type, comm_reduction op)
{
    if (type == COMM_DOUBLE) COMBINE(double);
    else if (type == COMM_INT) COMBINE(int);
    else COMBINE(float);
}

static int all_reduce(comm *c, comm_group group, void *data, int64_t count, comm_type type, comm_reduction op,
                      comm_stream stream)
{
    TP_TRY(host_only(c, stream));
    int member;
    meeting *g = group_of(c, group, &member);
    if (!g || g->members == 1 || count == 0) return TP_OK;
    void *result = malloc((size_t)count * comm_type_size(type));
    if (!result) return tp_fail(TP_ERR_NOMEM, "rank %d: out of memory for a reduction of %lld values", c->rank,
                                (long long)count);
    int status = post(g, c, member, data);
    if (!status) combine(g->slots, g->members, result, count, type, op);
    status = part(g, c, status);
    if (!status) memcpy(data, result, (size_t)count * comm_type_size(type));
    free(result);
    return status;
}

/* Stages form a ring (comm.h). */
static int peer_rank(comm *c, comm_peer peer, int *out)
{
    if (c->pp < 2)
        return tp_fail(TP_ERR_COMM, "rank %d (stage %d of %d) has no %s stage", c->rank, c->pp_rank, c->pp,
                       peer == COMM_NEXT_STAGE ? "next" : "previous");
    int stage = (c->pp_rank + (peer == COMM_NEXT_STAGE ? 1 : c->pp - 1)) % c->pp;
    *out = c->rank + (stage - c->pp_rank) * c->tp;
    return TP_OK;
}

static int send(comm *c, comm_peer peer, const void *data, int64_t count, comm_type type, int tag, comm_stream stream)
{
    shared_state *s = c->impl;
    int to;
    TP_TRY(host_only(c, stream));
    TP_TRY(peer_rank(c, peer, &to));
    int64_t bytes = count * (int64_t)comm_type_size(type);
    message *m = malloc(sizeof *m + (size_t)bytes);
    if (!m) return tp_fail(TP_ERR_NOMEM, "rank %d: out of memory for a message of %lld bytes", c->rank, (long long)bytes);
    m->next = NULL;
    m->from = c->rank;
    m->tag = tag;
    m->bytes = bytes;
    memcpy(m->data, data, (size_t)bytes);
    pthread_mutex_lock(&s->lock);
    message **tail = &s->inbox[to];
    while (*tail) tail = &(*tail)->next;
    *tail = m;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
    return TP_OK;
}

static int recv(comm *c, comm_peer peer, void *data, int64_t count, comm_type type, int tag, comm_stream stream)
{
    shared_state *s = c->impl;
    int from, status = TP_OK;
    TP_TRY(host_only(c, stream));
    TP_TRY(peer_rank(c, peer, &from));
    int64_t bytes = count * (int64_t)comm_type_size(type);
    pthread_mutex_lock(&s->lock);
    message *m = NULL;
    while (!status) {
        message **at = &s->inbox[c->rank];
        while (*at && ((*at)->from != from || (*at)->tag != tag)) at = &(*at)->next;
        if (*at) {
            m = *at;
            *at = m->next;
            break;
        }
        status = wait_change(s, c);
    }
    pthread_mutex_unlock(&s->lock);
    if (status) return status;
    if (m->bytes != bytes)
        status = tp_fail(TP_ERR_COMM, "rank %d: message %d from rank %d holds %lld bytes, %lld expected", c->rank, tag,
                         from, (long long)m->bytes, (long long)bytes);
    else memcpy(data, m->data, (size_t)bytes);
    free(m);
    return status;
}

/* Sends are copied when made. */
static int wait_sends(comm *c, int64_t sends, comm_stream stream)
{
    (void)sends;
    return host_only(c, stream);
}

static int broadcast(comm *c, void *data, int64_t bytes, int root, comm_stream stream)
{
    TP_TRY(host_only(c, stream));
    shared_state *s = c->impl;
    if (root < 0 || root >= c->world) return tp_fail(TP_ERR_ARG, "broadcast from rank %d of %d", root, c->world);
    meeting *g = &s->world_group;
    int status = post(g, c, c->rank, data);
    if (!status && c->rank != root) memcpy(data, g->slots[root], (size_t)bytes);
    return part(g, c, status);
}

static int gather(comm *c, const void *data, int64_t bytes, void *out, const int64_t *counts, int root)
{
    shared_state *s = c->impl;
    if (root < 0 || root >= c->world) return tp_fail(TP_ERR_ARG, "gather to rank %d of %d", root, c->world);
    meeting *g = &s->world_group;
    int status = post(g, c, c->rank, data);
    (void)bytes; /* the root's counts say */
    int64_t at = 0;
    for (int r = 0; !status && c->rank == root && r < c->world; at += counts[r], r++)
        if (counts[r]) memcpy((char *)out + at, g->slots[r], (size_t)counts[r]);
    return part(g, c, status);
}

/* The meeting of an all-gather or a reduce-scatter of `bytes` a member, or
 * NULL when there is none to hold: not a member (recv untouched), or a
 * group of one (recv is send). Both meet twice, as all_reduce: each member
 * reads the others' send between the meetings and writes only its own recv. */
static meeting *scatter_meeting(comm *c, comm_group group, const void *send, void *recv, size_t bytes, int *member)
{
    meeting *g = group_of(c, group, member);
    if (g && g->members == 1) {
        if (bytes && recv != send) memcpy(recv, send, bytes); /* in place: nothing to move */
        return NULL;
    }
    return g;
}

static int all_gather(comm *c, comm_group group, const void *send, void *recv, int64_t count, comm_type type,
                      comm_stream stream)
{
    TP_TRY(host_only(c, stream));
    int member;
    size_t bytes = (size_t)count * comm_type_size(type);
    meeting *g = scatter_meeting(c, group, send, recv, bytes, &member);
    if (!g) return TP_OK;
    int status = post(g, c, member, send);
    for (int j = 0; !status && j < g->members; j++) /* in place, this member's own part is where it goes */
        if (bytes && (char *)recv + (size_t)j * bytes != g->slots[j])
            memcpy((char *)recv + (size_t)j * bytes, g->slots[j], bytes);
    return part(g, c, status);
}

static int reduce_scatter(comm *c, comm_group group, const void *send, void *recv, int64_t count, comm_type type,
                          comm_stream stream)
{
    TP_TRY(host_only(c, stream));
    int member;
    size_t bytes = (size_t)count * comm_type_size(type);
    meeting *g = scatter_meeting(c, group, send, recv, bytes, &member);
    if (!g) return TP_OK;
    void *result = malloc(bytes ? bytes : 1);
    const void **chunks = malloc((size_t)g->members * sizeof *chunks);
    if (!result || !chunks) {
        free(result);
        free(chunks);
        return tp_fail(TP_ERR_NOMEM, "rank %d: out of memory for a reduce-scatter of %lld values", c->rank,
                       (long long)count);
    }
    int status = post(g, c, member, send);
    if (!status) { /* this member's part of every member's send, summed in member order (all_reduce's bits) */
        for (int j = 0; j < g->members; j++) chunks[j] = (const char *)g->slots[j] + (size_t)member * bytes;
        combine((void *const *)chunks, g->members, result, count, type, COMM_SUM);
    }
    status = part(g, c, status);
    if (!status && bytes) memcpy(recv, result, bytes);
    free(result);
    free(chunks);
    return status;
}

static void abort_all(comm *c, int status)
{
    shared_state *s = c->impl;
    pthread_mutex_lock(&s->lock);
    if (!s->aborted) {
        s->aborted = 1;
        s->abort_status = status;
        s->abort_rank = c->rank;
    }
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
}

static void free_meetings(meeting *groups, int count)
{
    for (int i = 0; groups && i < count; i++) free(groups[i].slots);
    free(groups);
}

static void free_shared(shared_state *s)
{
    for (int r = 0; s->inbox && r < s->world; r++)
        while (s->inbox[r]) {
            message *m = s->inbox[r];
            s->inbox[r] = m->next;
            free(m);
        }
    free(s->inbox);
    free(s->world_group.slots);
    free_meetings(s->tp_groups, s->dp * s->pp);
    free_meetings(s->dp_groups, s->pp * s->tp);
    free_meetings(s->embed_groups, s->dp * s->tp);
    pthread_cond_destroy(&s->changed);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static void free_rank(comm *c)
{
    shared_state *s = c->impl;
    pthread_mutex_lock(&s->lock);
    int last = --s->live == 0;
    pthread_mutex_unlock(&s->lock);
    if (last) free_shared(s);
    free(c);
}

static const comm_ops thread_ops = {.name = "threads", .all_reduce = all_reduce, .send = send, .recv = recv,
                                    .wait_sends = wait_sends, .broadcast = broadcast, .gather = gather,
                                    .all_gather = all_gather, .reduce_scatter = reduce_scatter, .abort = abort_all,
                                    .free = free_rank};

static meeting *make_meetings(int count, int members)
{
    meeting *groups = calloc((size_t)count, sizeof *groups);
    for (int i = 0; groups && i < count; i++) {
        groups[i].members = members;
        if (!(groups[i].slots = calloc((size_t)members, sizeof(void *)))) {
            free_meetings(groups, i);
            return NULL;
        }
    }
    return groups;
}

int comm_threads_create(comm **out, int tp, int pp, int dp)
{
    if (tp < 1 || pp < 1 || dp < 1 || (int64_t)tp * pp * dp > 4096)
        return tp_fail(TP_ERR_ARG, "thread communicator: tp=%d pp=%d dp=%d is not a layout of 1..4096 ranks", tp, pp, dp);
    int world = tp * pp * dp;
    for (int r = 0; r < world; r++) out[r] = NULL;
    shared_state *s = calloc(1, sizeof *s);
    if (!s) return tp_fail(TP_ERR_NOMEM, "out of memory for a thread communicator");
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->changed, NULL);
    s->tp = tp, s->pp = pp, s->dp = dp, s->world = world;
    s->world_group.members = world;
    s->world_group.slots = calloc((size_t)world, sizeof(void *));
    s->tp_groups = make_meetings(dp * pp, tp);
    s->dp_groups = make_meetings(pp * tp, dp);
    s->embed_groups = make_meetings(dp * tp, 2);
    s->inbox = calloc((size_t)world, sizeof *s->inbox);
    int status = s->world_group.slots && s->tp_groups && s->dp_groups && s->embed_groups && s->inbox
                     ? TP_OK
                     : tp_fail(TP_ERR_NOMEM, "out of memory for a thread communicator");
    for (int r = 0; r < world && !status; r++) {
        out[r] = calloc(1, sizeof **out);
        if (!out[r]) {
            status = tp_fail(TP_ERR_NOMEM, "out of memory for a thread communicator");
            break;
        }
        out[r]->ops = &thread_ops;
        out[r]->impl = s;
        comm_place(out[r], r, world, tp, pp, dp);
        s->live++;
    }
    if (status) {
        for (int r = 0; r < world; r++) {
            free(out[r]);
            out[r] = NULL;
        }
        free_shared(s);
    }
    return status;
}
