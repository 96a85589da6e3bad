/* path.h: paths as strings: joining and splitting, within one bound. The
 * same rules for local paths and URLs (s3://bucket/key splits at its last
 * '/' as a directory does). */
#ifndef TP_PATH_H
#define TP_PATH_H

#include <stddef.h>

#define TP_PATH_MAX 4096 /* bytes of a path, its NUL included */

/* out (TP_PATH_MAX bytes) = dir + "/" + name, dir's trailing slashes
 * dropped (a scheme's "//" kept); TP_ERR_ARG when longer. */
int tp_path_join(char *out, const char *dir, const char *name);

/* path with every run of '/' after a URL's scheme ("s3://", "http://")
 * made one, and a URL's "." and ".." segments taken (as curl sends it), into
 * out (size bytes): "s3://b/run//step/" -> "s3://b/run/step/",
 * "http://h/z/./out" -> "http://h/z/out"; a local path's dot segments are
 * left to the system. A trailing slash is kept (a WebDAV collection is named with one). The
 * object stores send requests for this form, so that a location given with
 * trailing slashes, and what callers join to it, name the same objects as
 * without. TP_ERR_ARG when it does not fit. */
int tp_path_canonical(const char *path, char *out, size_t size);

/* Splits a path into its parent directory ("." for a bare name, "/" at the
 * root) and base name, trailing slashes dropped; TP_ERR_ARG when the path
 * names no directory entry (empty, ".", "..") or a part does not fit. */
int tp_split_path(const char *path, char *parent, size_t parent_size, char *base, size_t base_size);

/* Whether path is a URL: a scheme (a letter, then letters, digits, + - .)
 * and "://" (store_for finds its store; a local path may hold "://" past a
 * '/'). */
int tp_path_is_url(const char *path);

/* Whether path lies within outer or is outer itself, as the system would
 * resolve both: symbolic links followed, "." and ".." taken. A path that
 * does not exist yet (an output) is placed by its parent: the parent
 * resolved, then its name. Both the entry and, when it is a link, where it
 * points count: within if either lies in outer, resolved the same ways. A
 * URL is compared with another in the form two spellings of one location
 * share (canonical, scheme and host in lowercase, a loopback host by one
 * name, no default port or user information, unreserved escapes decoded);
 * a URL and a local path never overlap. *within is 0 when outer does not exist. TP_OK,
 * or TP_ERR_ARG / TP_ERR_IO when a path cannot be resolved. */
int tp_path_within(const char *path, const char *outer, int *within);

/* Whether path is a URL whose authority holds user information
 * (s3://KEY:SECRET@bucket, http://user:pass@host): credentials, which
 * every message would then repeat. */
int tp_url_has_user_info(const char *path);

/* TP_OK, or TP_ERR_ARG naming an http(s) URL that holds a byte a URL
 * cannot carry as it is (a space, a control character) and its
 * %-encoded spelling: such a URL is refused, never encoded for the user
 * (path.c says why). Other paths, s3:// URLs among them, are TP_OK. */
int tp_url_refuse_unencoded(const char *path);

/* Where temporary files go: $TMPDIR when set and not empty, else /tmp. */
const char *tp_temporary_dir(void);

#endif
