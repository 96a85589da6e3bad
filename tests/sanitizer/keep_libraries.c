/* Linked into the programs and tests of the sanitized build only (make asan):
 * every shared library a process loads stays loaded until it exits.
 *
 * Why: Open MPI keeps allocations from MPI_Init in its components
 * (openmpi3/mca_*.so), which MPI_Finalize unloads. A leak report at exit
 * then shows an address in no module, which no suppression can name, unless
 * every allocation was unwound fully through libmpi.so (slow unwinding:
 * 2 to 8 times the processor time of an MPI run). With the components kept,
 * the fast unwinder's first frame already lies in a named module
 * (tests/lsan.supp).
 *
 * This definition takes the place of the C library's for every library of the
 * process (the link exports it: -Wl,--export-dynamic-symbol=dlclose). */
int dlclose(void *handle);

int dlclose(void *handle)
{
    (void)handle;
    return 0;
}
