/* comm.h: what the trainer needs from a communicator, behind a table of
 * functions so that an NCCL implementation can take the place of MPI's.
 *
 * Ranks are laid out with tensor parallelism innermost:
 *   rank = dp_rank * (pp * tp) + pp_rank * tp + tp_rank
 * Groups: TP (same stage and replica), DP (same stage and TP rank), and EMBED
 * (first and last stage of the same TP rank and replica: the tied embedding). */
#ifndef TP_COMM_H
#define TP_COMM_H

#include <stdint.h>

typedef enum { GROUP_WORLD, GROUP_TP, GROUP_DP, GROUP_EMBED } comm_group;

typedef struct comm comm;

typedef struct {
    /* In-place sums and maxima over a group. */
    int (*sum_floats)(comm *c, comm_group group, float *data, int64_t n);
    int (*max_floats)(comm *c, comm_group group, float *data, int64_t n);
    int (*sum_doubles)(comm *c, comm_group group, double *data, int64_t n);
    int (*max_ints)(comm *c, comm_group group, int *data, int64_t n);
    /* Pipeline: to or from the neighbouring stage of the same TP rank and replica. */
    int (*send_next)(comm *c, const float *data, int64_t n, int tag);
    int (*send_prev)(comm *c, const float *data, int64_t n, int tag);
    int (*recv_prev)(comm *c, float *data, int64_t n, int tag);
    int (*recv_next)(comm *c, float *data, int64_t n, int tag);
    int (*wait_sends)(comm *c); /* every send started so far has completed */
    int (*barrier)(comm *c);
    int (*broadcast_bytes)(comm *c, void *data, int64_t n, int root); /* over the world */
    void (*abort)(comm *c, int status); /* ends every rank: one failed while others wait on it */
    void (*free)(comm *c);
} comm_ops;

struct comm {
    const comm_ops *ops;
    void *impl;
    int rank, world;
    int tp, pp, dp;
    int tp_rank, pp_rank, dp_rank;
    char error[512]; /* message of the last failure */
};

/* One process alone (tp = pp = dp = 1), without MPI. */
int comm_local_create(comm **out);

/* MPI: calls MPI_Init when needed. Fails when tp * pp * dp != world size. */
int comm_mpi_create(comm **out, int *argc, char ***argv, int tp, int pp, int dp, char *err, size_t err_size);

/* Initializes MPI (if not done) and tells the world size, for choosing a layout. */
int comm_mpi_world_size(int *argc, char ***argv);

/* This process's rank in the world (after comm_mpi_world_size). */
int comm_mpi_rank(void);

/* Ends MPI when no communicator was made. */
void comm_mpi_finalize(void);

#endif
