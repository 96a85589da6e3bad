/* object.h: what the object stores (webdav.c, s3.c) share: a request as a
 * store's user names it, the errors of answers, whole-object writes and
 * deletes, and open files read by ranged GETs checked against what was
 * asked and against the object's ETag (object.c). Each protocol gives its
 * way of sending a request (a URL resolved, a signature) as the impl of its
 * store_ops; the shared code sends through it and knows no protocol. */
#ifndef TP_STORE_OBJECT_H
#define TP_STORE_OBJECT_H

#include <stddef.h>
#include <stdint.h>

#include "http.h"
#include "sigv4.h"
#include "store.h"

#define OBJECT_LIST_MAX ((size_t)64 << 20) /* bytes of one listing answer */

/* A request to a store: a URL as the store's users name it, an optional
 * query (decoded pairs), and the rest as http.c takes it (its url and
 * signature are filled in by the protocol). */
typedef struct {
    const char *path;
    const sigv4_pair *query;
    int num_query;
    http_request http;
} object_call;

/* A protocol: sends a request, TP_OK with the answer whatever its code. */
typedef struct {
    int (*send)(const object_call *c, http_response *r);
    /* Whether a whole object's PUT carries its body's MD5 (Content-MD5)
     * and is answered with it as its ETag (S3; object_put_file). */
    int put_md5;
} object_protocol;

/* The protocol of an object store (its impl). */
const object_protocol *object_protocol_of(const store_ops *s);

/* A request that must succeed (2xx). */
int object_call_ok(const store_ops *s, const object_call *c, http_response *r);

/* The failure of an answer that is not a success: what it means for a
 * user, never a secret. */
int object_answer_error(const char *method, const char *path, const http_response *r);

/* The region S3 requests are signed for and where it came from, for
 * errors: "eu-west-1, from AWS_REGION" (s3.c). */
void object_s3_region(char *out, size_t size);

/* host[:port] of an http(s) URL, and where its path starts; URLs with user
 * information are refused. */
int object_split_authority(const char *url, char *host, size_t host_size, const char **path_out);

/* DELETE of url (errors name `what`); what is not there is fine. */
int object_delete_at(const store_ops *s, const char *url, const char *const *headers, const char *what);

/* The store_ops members every object store shares. */
int object_open(const store_ops *s, const char *path, store_open_mode mode, store_file **out);
int object_read_at(store_file *f, void *buf, size_t size, int64_t offset);
int object_write_at(store_file *f, const void *buf, size_t size, int64_t offset); /* refused */
void object_read_ahead(store_file *f, int64_t offset, int64_t size);
int object_resize(store_file *f, int64_t size); /* refused */
int object_sync(store_file *f);
int object_expect_size(store_file *f, int64_t size, const char *whose);
void object_close(store_file *f);
const char *object_path_of(const store_file *f);
int object_rename(const store_ops *s, const char *from, const char *to, store_rename_mode mode); /* refused */
int object_sync_dir(const store_ops *s, const char *path);
int object_lock(const store_ops *s, const char *path, int flags, store_file **out);
/* The ETag a file's reads are pinned to, and a fresh file pinned to one. */
void object_version(store_file *f, char *out, size_t size);
int object_pin(store_file *f, const char *version);
/* One PUT of a local file's bytes, or of memory; where the protocol's
 * PUTs carry an MD5 (put_md5), checked by the store (Content-MD5) and
 * against the ETag of its answer. */
int object_put_file(const store_ops *s, const char *path, const char *local_path, int64_t offset, int64_t length);
int object_put_data(const store_ops *s, const char *path, const void *data, size_t size);
int object_delete(const store_ops *s, const char *path);

/* The store_ops entries every object store takes from here, for its
 * table's initializer; the store adds its name, protocol, stat, list,
 * make_dir, remove_tree and put_file. */
#define OBJECT_STORE_OPS                                                                                               \
    .local_paths = 0, .open = object_open, .read_at = object_read_at, .write_at = object_write_at,                     \
    .read_ahead = object_read_ahead, .resize = object_resize, .sync = object_sync,                                     \
    .expect_size = object_expect_size, .version = object_version, .pin = object_pin, .close = object_close,          \
    .path_of = object_path_of, .rename = object_rename,                                                                \
    .sync_dir = object_sync_dir, .lock = object_lock, .put_data = object_put_data, .delete_object = object_delete

#endif
