/* comm.c: what every backend shares: the placement of ranks, and agreeing
 * on a failure. */
#include <stdio.h>
#include <string.h>

#include "../common/error.h"
#include "comm.h"

int comm_place(comm *c, int rank, int world, int tp, int pp, int dp)
{
    if (tp < 1 || pp < 1 || dp < 1 || (int64_t)tp * pp * dp != world)
        return tp_fail(TP_ERR_ARG, "--tp %d x --pp %d x --dp %d = %lld ranks, but %d were launched (mpirun -np %lld)", tp,
                       pp, dp, (long long)tp * pp * dp, world, (long long)tp * pp * dp);
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

int comm_agree(comm *c, int status, const char *what)
{
    int failed;
    TP_TRY(comm_any(c, status != TP_OK, &failed));
    if (!failed) return TP_OK;
    return status ? status : tp_fail(TP_ERR_STATE, "%s: another rank failed", what);
}

int comm_agree_root(comm *c, int status, const char *what)
{
    /* status and message travel together: [status as text][message]. */
    char said[1024];
    memset(said, 0, sizeof said);
    if (c->rank == 0 && status) snprintf(said, sizeof said, "%d %s", status, tp_errmsg());
    int failed = 0;
    int travelled = comm_broadcast(c, said, (int64_t)sizeof said, 0, COMM_HOST);
    if (travelled) return comm_agree(c, travelled, what);
    if (c->rank == 0) return status;
    if (sscanf(said, "%d", &failed) != 1 || failed == TP_OK) return TP_OK;
    const char *message = strchr(said, ' ');
    return tp_fail(failed, "%s", message ? message + 1 : what);
}
