/* comm.c: what every backend shares: the placement of ranks, and agreeing
 * on a failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/error.h"
#include "comm.h"

int comm_place(comm *c, int rank, int world, int tp, int pp, int dp)
{
    if (tp < 1 || pp < 1 || dp < 1 || (int64_t)tp * pp * dp != world)
        return tp_fail(TP_ERR_ARG, "--tp %d x --pp %d x --dp %d = %lld ranks, but %d %s launched (mpirun -np %lld)", tp,
                       pp, dp, (long long)tp * pp * dp, world, world == 1 ? "was" : "were", (long long)tp * pp * dp);
    if (rank < 0 || rank >= world) return tp_fail(TP_ERR_ARG, "rank %d outside a world of %d", rank, world);
    c->rank = rank;
    c->world = world;
    c->tp = tp;
    c->pp = pp;
    c->dp = dp;
    c->tp_rank = rank % tp;
    c->pp_rank = rank / tp % pp;
    c->dp_rank = rank / (tp * pp);
    return TP_OK;
}

void comm_texts_free(char **texts, int count)
{
    for (int r = 0; texts && r < count; r++) free(texts[r]);
    free(texts);
}

int comm_gather_texts(comm *c, const char *text, int root, char ***out)
{
    *out = NULL;
    int is_root = c->rank == root;
    /* Lengths first (-1: none), then the texts, each with its NUL. */
    int64_t length = text ? (int64_t)strlen(text) + 1 : -1;
    int64_t *lengths = is_root ? malloc((size_t)c->world * sizeof *lengths) : NULL;
    int64_t *eights = is_root ? malloc((size_t)c->world * sizeof *eights) : NULL;
    int status = is_root && (!lengths || !eights) ? tp_fail(TP_ERR_NOMEM, "out of memory gathering texts") : TP_OK;
    for (int r = 0; !status && is_root && r < c->world; r++) eights[r] = sizeof(int64_t);
    status = comm_agree(c, status, "gathering texts");
    if (!status) status = c->ops->gather(c, &length, sizeof length, lengths, eights, root);
    int64_t *counts = eights, total = 0;
    char *all = NULL;
    for (int r = 0; !status && is_root && r < c->world; r++) {
        counts[r] = lengths[r] > 0 ? lengths[r] : 0;
        total += counts[r];
    }
    if (!status && is_root && !(all = malloc(total > 0 ? (size_t)total : 1)))
        status = tp_fail(TP_ERR_NOMEM, "out of memory for %lld bytes of gathered texts", (long long)total);
    status = comm_agree(c, status, "gathering texts");
    if (!status)
        status = c->ops->gather(c, text, length > 0 ? length : 0, all, is_root ? counts : NULL, root);
    char **texts = NULL;
    if (!status && is_root && !(texts = calloc((size_t)c->world, sizeof *texts)))
        status = tp_fail(TP_ERR_NOMEM, "out of memory gathering texts");
    int64_t at = 0;
    for (int r = 0; !status && is_root && r < c->world; r++) {
        if (lengths[r] < 0) continue;
        if (lengths[r] == 0 || all[at + lengths[r] - 1] != '\0' || !(texts[r] = malloc((size_t)lengths[r])))
            status = tp_fail(lengths[r] == 0 ? TP_ERR_COMM : TP_ERR_NOMEM, "gathering the text of rank %d", r);
        else memcpy(texts[r], all + at, (size_t)lengths[r]);
        at += lengths[r];
    }
    free(all);
    free(lengths);
    free(eights);
    if (status) {
        comm_texts_free(texts, c->world);
        return status;
    }
    *out = texts;
    return TP_OK;
}

size_t comm_type_size(comm_type type)
{
    switch (type) {
    case COMM_DOUBLE: return sizeof(double);
    case COMM_INT: return sizeof(int);
    case COMM_BF16: return sizeof(uint16_t);
    case COMM_FLOAT: break;
    }
    return sizeof(float);
}

int comm_group_size(const comm *c, comm_group group)
{
    switch (group) {
    case GROUP_TP: return c->tp;
    case GROUP_DP: return c->dp;
    case GROUP_EMBED: return c->pp > 1 && (c->pp_rank == 0 || c->pp_rank == c->pp - 1) ? 2 : 1;
    case GROUP_WORLD: break;
    }
    return c->world;
}

int comm_broadcast_text(comm *c, char **text, int root)
{
    int is_root = c->rank == root;
    int64_t length = is_root && *text ? (int64_t)strlen(*text) + 1 : -1; /* with its NUL; -1: none */
    if (!is_root) *text = NULL;
    TP_TRY(comm_broadcast(c, &length, sizeof length, root, COMM_HOST));
    if (length < 0) return TP_OK;
    char *copy = is_root ? *text : malloc((size_t)length);
    int status = copy ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory for a text of %lld bytes", (long long)length);
    status = comm_agree(c, status, "broadcasting a text");
    if (!status) status = comm_broadcast(c, copy, length, root, COMM_HOST);
    if (!status && copy[length - 1] != '\0') status = tp_fail(TP_ERR_COMM, "a broadcast text arrived without its end");
    if (status) {
        if (!is_root) free(copy);
        return status;
    }
    if (!is_root) *text = copy;
    return TP_OK;
}

int comm_agree(comm *c, int status, const char *what)
{
    int failed;
    TP_TRY(comm_any(c, status != TP_OK, &failed));
    if (!failed) return TP_OK;
    return status ? status : tp_fail(TP_ERR_STATE, "%s: another rank failed", what);
}

int comm_first_failure(comm *c, int failed, char *message, int64_t size, int *any)
{
    int flag = failed ? c->world - c->rank : 0; /* the lowest failing rank has the largest */
    TP_TRY(comm_all_reduce(c, GROUP_WORLD, &flag, 1, COMM_INT, COMM_MAX, COMM_HOST));
    *any = flag != 0;
    return flag ? comm_broadcast(c, message, size, c->world - flag, COMM_HOST) : TP_OK;
}

/* The failure that said ("STATUS MESSAGE", as a rank wrote it) tells, as
 * this rank's; TP_OK when it tells none. */
static int told_failure(const char *said, const char *what)
{
    int failed = 0;
    if (sscanf(said, "%d", &failed) != 1 || failed == TP_OK) return TP_OK;
    const char *message = strchr(said, ' ');
    return tp_fail(failed, "%s", message ? message + 1 : what);
}

int comm_agree_root(comm *c, int status, const char *what)
{
    /* status and message travel together: [status as text][message]. */
    char said[1024];
    memset(said, 0, sizeof said);
    if (c->rank == 0 && status) snprintf(said, sizeof said, "%d %s", status, tp_errmsg());
    int travelled = comm_broadcast(c, said, (int64_t)sizeof said, 0, COMM_HOST);
    if (travelled) return comm_agree(c, travelled, what);
    return c->rank == 0 ? status : told_failure(said, what);
}

int comm_agree_first(comm *c, int status, const char *what)
{
    char said[1024];
    memset(said, 0, sizeof said);
    if (status && c->rank == 0) snprintf(said, sizeof said, "%d %s", status, tp_errmsg());
    else if (status) snprintf(said, sizeof said, "%d rank %d: %s", status, c->rank, tp_errmsg());
    int any = 0;
    int travelled = comm_first_failure(c, status != TP_OK, said, (int64_t)sizeof said, &any);
    if (travelled) return comm_agree(c, travelled, what);
    return any ? told_failure(said, what) : TP_OK;
}
