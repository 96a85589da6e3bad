/* Runs layer_check (each tensor-parallel layer against its dense version,
 * and the MPI collectives) under mpirun at tp = 1, 2 and 4. */
#include <criterion/criterion.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void run_at(int ranks)
{
    char self[PATH_MAX] = "", session[PATH_MAX], command[3 * PATH_MAX + 256];
    cr_assert(readlink("/proc/self/exe", self, sizeof self - 1) > 0);
    /* A TMPDIR of its own for each launch's Open MPI session directory:
     * Criterion runs these tests at once, and mpiruns that create the same
     * TMPDIR/ompi.HOST.UID at one instant race in Open MPI 4 (one failed
     * with "A call to mkdir was unable to create the desired directory ...
     * File exists", orte_init failed: 3 of 240 launches, 4 at a time, in a
     * fresh TMPDIR; 0 of 240 each in its own). */
    const char *tmp = getenv("TMPDIR");
    snprintf(session, sizeof session, "%s/layers-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    cr_assert_not_null(mkdtemp(session), "mkdtemp %s", session);
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    /* Containers often forbid Open MPI's cross-process memory copies. */
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 1);
    /* hwloc's PCI discovery, slow in virtual machines (tests/e2e/lib.sh use_open_mpi). */
    setenv("HWLOC_COMPONENTS", "-pci,-linuxio", 1);
    snprintf(command, sizeof command,
             "TMPDIR='%s' mpirun --oversubscribe -np %d '%s/layer_check' </dev/null >/dev/null; status=$?; "
             "rm -rf '%s'; exit $status",
             session, ranks, dirname(self), session);
    cr_assert_eq(system(command), 0, "layer_check at tp=%d: a parallel layer differs from its dense version", ranks);
}

Test(layers, tp1) { run_at(1); }
Test(layers, tp2) { run_at(2); }
Test(layers, tp4) { run_at(4); }

/* The all-gather and reduce-scatter of sequence parallelism over MPI in the
 * units and pieces of counts above one call's (TP_COMM_PART_MAX 8: 40
 * values a member go as 5 units of 8, or in 5 pieces). */
Test(layers, tp2_collectives_in_pieces)
{
    setenv("TP_COMM_PART_MAX", "8", 1);
    run_at(2);
    unsetenv("TP_COMM_PART_MAX");
}
