/* tp-mpirun: Open MPI's mpirun from inside a GPU pack (scripts/gpu-pack.sh,
 * docs/GPU.md), wherever the pack was unpacked.
 *
 * Open MPI finds its plugins, help texts and settings at the paths it was
 * configured with (/usr/lib/.../openmpi3, /etc/openmpi), and PMIx likewise;
 * on a machine without Open MPI those are absent. Both take the places from
 * the environment instead (OPAL_* and PMIX_* installation directories), and
 * the ranks mpirun starts inherit it. This launcher sets them to the pack's
 * copies, then runs the pack's mpirun with the arguments given. The library
 * path it leaves alone: mpirun, orted, the plugins and the libraries find
 * the pack's libraries through their run paths (set by the pack), and the
 * pack's libraries first on LD_LIBRARY_PATH would come before the machine's
 * own for every program the ranks start. A program and not a
 * script: it runs in a root that holds the pack and glibc only, where there
 * is no shell (tests/gpu/test_gpu_pack.sh).
 *
 * The pack's layout, relative to this program (build/bin/tp-mpirun):
 *   ../lib           the shared libraries
 *   ../mpi/bin       mpirun (orterun) and orted
 *   ../mpi/lib/openmpi, ../mpi/lib/pmix   the plugins
 *   ../mpi/share/openmpi, ../mpi/share/pmix   help texts
 *   ../mpi/etc       openmpi-mca-params.conf */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
    "usage: tp-mpirun [mpirun's options] PROGRAM [ARGS...]\n"
    "Open MPI's mpirun from inside a GPU pack (make gpu-pack, docs/GPU.md), wherever the pack was unpacked: it\n"
    "points Open MPI and PMIx at the pack's plugins, help texts and settings, then runs the pack's mpirun with\n"
    "the arguments given. Outside a pack, run the machine's mpirun instead.\n";

static void set_to(const char *variable, const char *build, const char *relative)
{
    char value[PATH_MAX + 64];
    snprintf(value, sizeof value, "%s/%s", build, relative);
    setenv(variable, value, 1);
}

int main(int argc, char **argv)
{
    /* --help: this program's usage, then (inside a pack) mpirun's own. */
    int help = argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0);
    if (help) {
        fputs(usage, stdout);
        fflush(stdout);
    }
    char self[PATH_MAX];
    if (!realpath("/proc/self/exe", self)) {
        perror("tp-mpirun: /proc/self/exe");
        return 127;
    }
    /* self: BUILD/bin/tp-mpirun */
    char *slash = strrchr(self, '/');
    *slash = '\0';
    slash = strrchr(self, '/');
    if (!slash) {
        fprintf(stderr, "tp-mpirun: %s is not inside a pack's build/bin\n", self);
        return 127;
    }
    *slash = '\0';
    const char *build = self[0] ? self : "/";
    char mpirun[PATH_MAX + 32];
    snprintf(mpirun, sizeof mpirun, "%s/mpi/bin/orterun", build);
    if (access(mpirun, X_OK) != 0) {
        if (help) return 0;
        fprintf(stderr,
                "tp-mpirun: %s: not found; tp-mpirun runs Open MPI from inside a GPU pack (make gpu-pack, "
                "docs/GPU.md), where it is build/bin/tp-mpirun\n",
                mpirun);
        return 127;
    }
    set_to("OPAL_PREFIX", build, "mpi");
    set_to("OPAL_EXEC_PREFIX", build, "mpi");
    set_to("OPAL_BINDIR", build, "mpi/bin");
    set_to("OPAL_LIBDIR", build, "lib");
    set_to("OPAL_PKGLIBDIR", build, "mpi/lib/openmpi");
    set_to("OPAL_DATADIR", build, "mpi/share");
    set_to("OPAL_DATAROOTDIR", build, "mpi/share");
    set_to("OPAL_PKGDATADIR", build, "mpi/share/openmpi");
    set_to("OPAL_SYSCONFDIR", build, "mpi/etc");
    set_to("PMIX_PREFIX", build, "mpi");
    set_to("PMIX_LIBDIR", build, "lib");
    set_to("PMIX_PKGLIBDIR", build, "mpi/lib/pmix");
    set_to("PMIX_DATADIR", build, "mpi/share");
    set_to("PMIX_PKGDATADIR", build, "mpi/share/pmix");
    set_to("PMIX_SYSCONFDIR", build, "mpi/etc");

    argv[0] = mpirun;
    execv(mpirun, argv);
    perror("tp-mpirun: cannot run the pack's mpirun");
    return 127;
}
