/* path.h: paths as strings: joining and splitting, within one bound. The
 * same rules for local paths and URLs (s3://bucket/key splits at its last
 * '/' as a directory does). */
#ifndef TP_PATH_H
#define TP_PATH_H

#include <stddef.h>

#define TP_PATH_MAX 4096 /* bytes of a path, its NUL included */

/* out (TP_PATH_MAX bytes) = dir + "/" + name; TP_ERR_ARG when longer. */
int tp_path_join(char *out, const char *dir, const char *name);

/* Splits a path into its parent directory ("." for a bare name, "/" at the
 * root) and base name, trailing slashes dropped; TP_ERR_ARG when the path
 * names no directory entry (empty, ".", "..") or a part does not fit. */
int tp_split_path(const char *path, char *parent, size_t parent_size, char *base, size_t base_size);

#endif
