/* comm_mpi.h: the communicator on MPI, one process per rank (mpirun, srun).
 * A library of its own (libtpcomm_mpi): only programs launched under MPI
 * link it. */
#ifndef TP_COMM_MPI_H
#define TP_COMM_MPI_H

#include "comm.h"

/* Initializes MPI (if not done) and tells the world size, for choosing a
 * layout. A process that no MPI launcher started (no mpirun, srun or Hydra
 * variables) is a world of one and runs without MPI: the functions below
 * then answer for that one rank, and comm_mpi_create gives the local
 * communicator (comm.h comm_local_create). */
int comm_mpi_world_size(int *argc, char ***argv);

/* This process's rank in the world (after comm_mpi_world_size). */
int comm_mpi_rank(void);
/* The rank a launcher gave this process in its environment (mpirun's
 * OMPI_COMM_WORLD_RANK, PMIx's, PMI's), known before MPI starts: 0 without
 * a launcher. */
int comm_launcher_rank(void);

/* The communicator of this process at layout (tp, pp, dp); calls MPI_Init
 * when needed. Fails when tp * pp * dp is not the world size. Freeing it
 * ends MPI. */
int comm_mpi_create(comm **out, int *argc, char ***argv, int tp, int pp, int dp);

/* This process's rank among those on its machine (0, 1, ...): the GPU it
 * takes. Collective: every rank calls it. */
int comm_mpi_local_rank(void);

/* Ends MPI when no communicator was made. */
void comm_mpi_finalize(void);

#endif
