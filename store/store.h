/* storage.h: where the checkpoint library's bytes live, behind a table of
 * operations, so that a store other than a local file system can take the
 * place of the POSIX one (storage_posix.c) without the reader, the writer,
 * the commit or the run-directory rules changing.
 *
 * Through the table go: the data of every piece (positioned reads and
 * writes), index.json and `latest`, and every operation on names: listing a
 * run directory, creating and removing directories, the renames of a commit
 * and the syncs that make it durable. HDF5 itself opens shard files by their
 * local path to read and write their metadata (dataset headers, attributes,
 * chunk indexes); a store without local paths needs the piece offsets the
 * index can record instead.
 *
 * Operations return a tp_status with a message naming the path. */
#ifndef TP_CKPT_STORAGE_H
#define TP_CKPT_STORAGE_H

#include <stddef.h>
#include <stdint.h>

typedef struct ckpt_storage ckpt_storage;

/* An open file of a store; each implementation defines it, its first member
 * being the storage it belongs to. */
typedef struct ckpt_file ckpt_file;

typedef enum {
    CKPT_OPEN_READ,   /* an existing file, to read */
    CKPT_OPEN_WRITE,  /* an existing file, to write in place */
    CKPT_OPEN_CREATE, /* a new file (an old one is truncated), to write */
} ckpt_open_mode;

typedef enum {
    CKPT_RENAME_REPLACE,   /* whatever is at the target is replaced */
    CKPT_RENAME_NOREPLACE, /* fails with TP_ERR_EXISTS when the target exists */
    CKPT_RENAME_EXCHANGE,  /* both exist; they swap, atomically (TP_ERR_STATE where the store cannot) */
} ckpt_rename_mode;

enum { CKPT_LOCK_WAIT = 1, CKPT_LOCK_SHARED = 2 };

typedef struct {
    int exists, is_dir;
    int64_t size; /* bytes of a file */
} ckpt_stat;

struct ckpt_storage {
    const char *name; /* "posix", "remote" */
    /* Whether HDF5 may open this store's paths itself (the local file
     * system); elsewhere the reader takes everything from the index. */
    int local_paths;
    int (*open)(const ckpt_storage *s, const char *path, ckpt_open_mode mode, ckpt_file **out);
    /* Whole transfers or a failure: a file ending early is TP_ERR_FORMAT (truncated). */
    int (*read_at)(ckpt_file *file, void *buf, size_t size, int64_t offset);
    int (*write_at)(ckpt_file *file, const void *buf, size_t size, int64_t offset);
    /* A hint that [offset, offset + size) will be read soon; may do nothing. */
    void (*read_ahead)(ckpt_file *file, int64_t offset, int64_t size);
    int (*resize)(ckpt_file *file, int64_t size); /* of a file opened to write; new bytes read as zeros */
    int (*sync)(ckpt_file *file);                 /* the file's data is durable */
    void (*close)(ckpt_file *file);
    const char *(*path_of)(const ckpt_file *file);
    int (*stat)(const ckpt_storage *s, const char *path, ckpt_stat *out); /* a missing path is exists = 0 */
    /* Calls visit for every entry of a directory but . and ..; a nonzero
     * return stops the walk and is returned. */
    int (*list)(const ckpt_storage *s, const char *dir, int (*visit)(void *ctx, const char *name), void *ctx);
    int (*make_dir)(const ckpt_storage *s, const char *path);
    int (*rename)(const ckpt_storage *s, const char *from, const char *to, ckpt_rename_mode mode);
    int (*remove_tree)(const ckpt_storage *s, const char *path); /* a file, or a directory and all in it; missing is fine */
    int (*sync_dir)(const ckpt_storage *s, const char *path);   /* the directory's entries are durable */
    /* A lock on the file or directory at path (exclusive, or shared with
     * CKPT_LOCK_SHARED), held until the returned handle is closed or the
     * process ends, however it ends; the entry locked is the one at path
     * when the call returns, even if it was renamed meanwhile. Without
     * CKPT_LOCK_WAIT, TP_ERR_EXISTS at once when a conflicting holder has it. */
    int (*lock)(const ckpt_storage *s, const char *path, int flags, ckpt_file **out);
    void *impl;
};

/* The local file system. */
const ckpt_storage *ckpt_storage_posix(void);

/* Object stores (storage_remote.c): paths are URLs, http(s):// of a
 * WebDAV-style server or s3://bucket/key. Read in place by ranged GETs;
 * written only whole, by the uploader (ckpt_upload). */
const ckpt_storage *ckpt_storage_remote(void);

/* The store a path lives in: local paths are the POSIX one's, http://,
 * https:// and s3:// URLs the remote one's; another scheme fails naming it. */
int ckpt_storage_for(const char *path, const ckpt_storage **out);

#endif
