/* init.c: the library's one-time setup (ckpt_library_init): HDF5 silenced
 * and bounded, the zstd filter registered. */
#include <pthread.h>

#include "internal.h"

extern int ckpt_zstd_register(void);

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int init_status = TP_OK;

static void init_library(void)
{
    /* No HDF5 clean-up at exit: a shard whose close failed (disk full: the
     * metadata flush fails) stays half-closed inside HDF5, and HDF5's exit
     * handler then crashes closing it again. The library closes every file
     * it opens itself; a failed one is removed with its staging directory. */
    H5dont_atexit();
    /* The library reports errors through tp_errmsg(); HDF5 must not print. */
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    /* HDF5 keeps freed internal objects on free lists; bounded, so that
     * memory does not grow with the number of tensors a process touches. */
    H5set_free_list_limits(1 << 20, 256 << 10, 1 << 20, 256 << 10, 4 << 20, 1 << 20);
    init_status = ckpt_zstd_register();
}

int ckpt_library_init(void)
{
    /* HDF5 keeps its error-printing setting per thread in thread-safe builds,
     * so every thread that reaches HDF5 through us passes here once. */
    static _Thread_local int thread_ready;
    pthread_once(&init_once, init_library);
    if (!thread_ready) {
        H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
        thread_ready = 1;
    }
    return init_status;
}
