/* remote.h: what the object-store store (storage_remote.c) offers the rest
 * of the checkpoint library besides its ckpt_storage table: whole-object
 * writes and deletes, which the uploader (upload.c) builds checkpoints
 * from. Objects are written whole: an object store has no positioned
 * writes, renames or locks, so a checkpoint is written locally, committed
 * there, and uploaded with its index last (upload.c). */
#ifndef TP_CKPT_REMOTE_H
#define TP_CKPT_REMOTE_H

#include <stddef.h>
#include <stdint.h>

/* Writes bytes [offset, offset + length) of a local file as the object at
 * url. On S3, files larger than the part size (TP_REMOTE_PART_MB, default
 * 64) go as a multipart upload whose parts are sent on `threads` threads;
 * an http(s) server takes one PUT per file. Retries what is transient. */
int remote_put_file(const char *url, const char *local_path, int64_t offset, int64_t length, int threads);

/* Writes a small object from memory. */
int remote_put_data(const char *url, const void *data, size_t size);

/* Removes one object; a missing one is fine. */
int remote_delete(const char *url);

/* Whether a path names an object-store location (http://, https://, s3://). */
int remote_is_url(const char *path);

#endif
