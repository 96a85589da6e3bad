/* error.c: HDF5's errors in this project's convention. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* What ckpt_fail_hdf5 reports of HDF5's error stack: the innermost entry,
 * and the first that carries a system call's error. */
typedef struct {
    char innermost[256];
    char system[256];
} stack_detail;

/* H5Ewalk callback. A file driver's failure reads "file write failed: time
 * = ..., errno = 28, error message = 'No space left on device', ...". When a
 * flush fails on closing a file, HDF5 pushes consequent errors after it, and
 * the innermost entry then names one of those ("slist already enabled?")
 * rather than the full disk: the system's message is reported instead. */
static herr_t keep_detail(unsigned n, const H5E_error2_t *entry, void *out)
{
    stack_detail *d = out;
    const char *desc = entry->desc ? entry->desc : "?", *func = entry->func_name ? entry->func_name : "?";
    if (n == 0) snprintf(d->innermost, sizeof d->innermost, "%s (in %s)", desc, func);
    const char *marker = "error message = '", *why = strstr(desc, marker);
    if (why && !d->system[0]) {
        why += strlen(marker);
        const char *end = strchr(why, '\'');
        snprintf(d->system, sizeof d->system, "%.*s: %.*s (in %s)", (int)strcspn(desc, ":"), desc,
                 end ? (int)(end - why) : 120, why, func);
    }
    return 0;
}

int ckpt_fail_hdf5(const char *fmt, ...)
{
    stack_detail detail = {"no detail from HDF5", ""};
    char prefix[1024];
    va_list args;
    va_start(args, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, args);
    va_end(args);
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, keep_detail, &detail);
    H5Eclear2(H5E_DEFAULT);
    return tp_fail(TP_ERR_HDF5, "%s: %s", prefix, detail.system[0] ? detail.system : detail.innermost);
}
