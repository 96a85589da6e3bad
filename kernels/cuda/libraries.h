/* libraries.h: finding the CUDA libraries the backend loads with dlopen
 * (cuBLAS, NCCL) on machines laid out in different ways.
 *
 * A GPU machine may hold them in the CUDA toolkit, only in PyTorch's wheels
 * (site-packages/nvidia/<package>/lib), or somewhere only its user knows.
 * cuda_library_open looks, in this order:
 *   1. the CUDA toolkit: $CUDA_HOME/lib64, $CUDA_PATH/lib64, the toolkit the
 *      build used, then the loader's own search (LD_LIBRARY_PATH, the
 *      program's run path, ld.so.cache);
 *   2. PyTorch's wheels: site-packages/nvidia/STAR/lib under $VIRTUAL_ENV,
 *      $CONDA_PREFIX and the prefix of every python3 on PATH;
 *   3. the directories of TP_CUDA_LIBRARY_PATH (separated by ':').
 * Plain C, built with or without CUDA, so that the search is tested on
 * machines without a GPU (tests/kernels/test_cuda_libraries.c). */
#ifndef TP_KERNELS_CUDA_LIBRARIES_H
#define TP_KERNELS_CUDA_LIBRARIES_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Opens the first of NAMES (sonames, most specific first) found in the
 * order above into *LIBRARY (dlopen, RTLD_NOW) and writes its directory
 * into FOUND_IN (FOUND_IN_SIZE bytes; "the loader's path" when the loader
 * found it). WHAT names the library in messages ("cuBLAS"). Fails with
 * TP_ERR_DEVICE naming every place looked in, or, when a copy was found but
 * did not load (a missing dependency), naming it with the loader's reason. */
int cuda_library_open(const char *what, const char *const *names, size_t name_count, void **library,
                      char *found_in, size_t found_in_size);

/* A function a loaded library must have: its name, and the function
 * pointer that receives its address (the address of a field typed as the
 * library's header declares the function). */
typedef struct {
    const char *name;
    void **address;
} cuda_library_symbol;

/* Looks each of SYMBOLS up in LIBRARY (dlsym), in order, into its address;
 * at the first missing one fails with TP_ERR_DEVICE, "WHAT (WHERE) has no
 * NAME", leaving that address and the later ones as they were (a loader
 * that keeps its last symbol for "all loaded" then finds it unset). */
int cuda_library_symbols(void *library, const char *what, const char *where, const cuda_library_symbol *symbols,
                         size_t count);

#ifdef __cplusplus
}
#endif

#endif
