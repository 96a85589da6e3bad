/* store.h: where the toolkit's bytes live, behind a table of operations,
 * so that a store other than a local file system can take the place of the
 * POSIX one (posix.c) without the checkpoint reader, writer, commit or
 * run-directory rules changing.
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
#ifndef TP_STORE_H
#define TP_STORE_H

#include <stddef.h>
#include <stdint.h>

typedef struct store_ops store_ops;

/* An open file of a store; each implementation defines it, its first member
 * being the storage it belongs to. */
typedef struct store_file store_file;

typedef enum {
    STORE_OPEN_READ,   /* an existing file, to read */
    STORE_OPEN_WRITE,  /* an existing file, to write in place */
    STORE_OPEN_CREATE, /* a new file (an old one is truncated), to write */
} store_open_mode;

typedef enum {
    STORE_RENAME_REPLACE,   /* whatever is at the target is replaced */
    STORE_RENAME_NOREPLACE, /* fails with TP_ERR_EXISTS when the target exists */
    STORE_RENAME_EXCHANGE,  /* both exist; they swap, atomically (TP_ERR_STATE where the store cannot) */
} store_rename_mode;

enum { STORE_LOCK_WAIT = 1, STORE_LOCK_SHARED = 2 };

typedef struct {
    int exists, is_dir;
    int64_t size; /* bytes of a file */
} store_stat;

struct store_ops {
    const char *name; /* "posix", "webdav", "s3" */
    /* Whether HDF5 may open this store's paths itself (the local file
     * system); elsewhere the reader takes everything from the index. */
    int local_paths;
    int (*open)(const store_ops *s, const char *path, store_open_mode mode, store_file **out);
    /* Whole transfers or a failure: a file ending early is TP_ERR_FORMAT (truncated). */
    int (*read_at)(store_file *file, void *buf, size_t size, int64_t offset);
    int (*write_at)(store_file *file, const void *buf, size_t size, int64_t offset);
    /* A hint that [offset, offset + size) will be read soon; may do nothing. */
    void (*read_ahead)(store_file *file, int64_t offset, int64_t size);
    int (*resize)(store_file *file, int64_t size); /* of a file opened to write; new bytes read as zeros */
    int (*sync)(store_file *file);                 /* the file's data is durable */
    /* For a store that learns a file's size as it reads it (an object store:
     * every ranged GET's answer carries the object's size), so that a caller
     * who knows the size (from an index) needs no request of its own to
     * check it: a read whose answer shows another size fails with
     * TP_ERR_FORMAT, "PATH: N bytes, <whose> M (truncated or replaced?)".
     * NULL where a stat is as cheap as a read (the local file system). */
    int (*expect_size)(store_file *file, int64_t size, const char *whose);
    /* For a store whose objects have versions (an object store: the ETag
     * of a file's first answer, which its later reads must match): the
     * version a file's reads are pinned to ("" before the first read), and
     * a fresh handle pinned to a version another handle of the same path
     * read, so that reads through two handles never mix two versions of an
     * object. NULL where there are none (the local file system). */
    void (*version)(store_file *file, char *out, size_t size);
    int (*pin)(store_file *file, const char *version);
    void (*close)(store_file *file);
    const char *(*path_of)(const store_file *file);
    int (*stat)(const store_ops *s, const char *path, store_stat *out); /* a missing path is exists = 0 */
    /* Calls visit for every entry of a directory but . and ..; a nonzero
     * return stops the walk and is returned. */
    int (*list)(const store_ops *s, const char *dir, int (*visit)(void *ctx, const char *name), void *ctx);
    int (*make_dir)(const store_ops *s, const char *path);
    int (*rename)(const store_ops *s, const char *from, const char *to, store_rename_mode mode);
    int (*remove_tree)(const store_ops *s, const char *path); /* a file, or a directory and all in it; missing is fine */
    int (*sync_dir)(const store_ops *s, const char *path);   /* the directory's entries are durable */
    /* A lock on the file or directory at path (exclusive, or shared with
     * STORE_LOCK_SHARED), held until the returned handle is closed or the
     * process ends, however it ends; the entry locked is the one at path
     * when the call returns, even if it was renamed meanwhile. Without
     * STORE_LOCK_WAIT, TP_ERR_EXISTS at once when a conflicting holder has it. */
    int (*lock)(const store_ops *s, const char *path, int flags, store_file **out);
    /* Whole objects, for stores without positioned writes (object stores;
     * NULL elsewhere): bytes [offset, offset + length) of a local file, or
     * size bytes of memory, written as the object at path; one object
     * removed, a missing one being fine. Retried where transient. */
    int (*put_file)(const store_ops *s, const char *path, const char *local_path, int64_t offset, int64_t length,
                    int threads);
    int (*put_data)(const store_ops *s, const char *path, const void *data, size_t size);
    int (*delete_object)(const store_ops *s, const char *path);
    const void *impl; /* the implementation's own (an object store's protocol) */
};

/* ------------------------------------------------------------- the stores */

/* The local file system. */
const store_ops *store_posix(void);

/* Object stores, read in place by ranged GETs, written only whole
 * (put_file, put_data): http(s):// URLs of a WebDAV-style server
 * (webdav.c) and s3://bucket/key of S3 or an S3-compatible store (s3.c);
 * docs/STORES.md. */
const store_ops *store_webdav(void);
const store_ops *store_s3(void);

/* ------------------------------------------------------------- notices */

/* What a store is waiting out and a user should hear of while it lasts (an
 * object store asking its clients to slow down: store/http.c), as one line
 * of text without a newline. Libraries never print: a program installs
 * the function that does (programs/cli.c); without one, notices are
 * dropped. It may be called from any thread, never with a store's lock
 * held; fn NULL removes it. */
typedef void (*store_notice_fn)(void *ctx, const char *text);
void store_set_notice(store_notice_fn fn, void *ctx);
/* Tells the program's notice function text (nothing when none is set):
 * for a store's waits and for those of the claims kept in a store
 * (ckpt/runclaim.c watching a lease). */
void store_notify(const char *text);
/* How many requests to an object store this process gave up on after
 * every retry (TP_REMOTE_RETRIES) or the whole allowance of being asked to
 * slow down: a server that stopped answering, or answers every request
 * wrong. A reader of many pieces that goes on past a failed one (verify)
 * compares the count before and after to tell such a server from one
 * object's refusal (a 403 of one file: no retry), and stops asking. */
long store_requests_given_up(void);

/* ---------------------------------------------------------- the registry */

/* The one place that recognises a URL (registry.c): every scheme a store
 * serves is registered there with its prefix ("s3://"). A path without a
 * scheme is local (the POSIX store); a URL of a scheme no store serves
 * fails naming the scheme. */
int store_for(const char *path, const store_ops **out);

/* Whether path is a URL of a registered scheme (an object store's). */
int store_is_remote(const char *path);

/* Registers another store for the URLs starting with prefix (a scheme and
 * "://"; prefix and ops must outlive the process). TP_ERR_EXISTS when the
 * prefix has a store, TP_ERR_NOMEM past the table's room. */
int store_register(const char *prefix, const store_ops *ops);

/* The whole-object operations of the store of a URL (store_for); a store
 * without them fails with TP_ERR_STATE naming the path. store_put_file
 * sends large files to S3 as a multipart upload of TP_REMOTE_PART_MB parts
 * (default 64) on `threads` threads. */
int store_put_file(const char *url, const char *local_path, int64_t offset, int64_t length, int threads);

/* The part size of an S3 multipart upload of `length` bytes: `wanted`
 * (TP_REMOTE_PART_MB), or larger, in whole MiB, where `wanted` would make
 * more than S3's 10,000 parts; TP_ERR_ARG above what S3 takes (5 GiB parts,
 * 5 TiB objects). */
int store_s3_part_bytes(int64_t length, int64_t wanted, int64_t *part);
int store_put_data(const char *url, const void *data, size_t size);
int store_delete(const char *url);

/* The version file's reads are pinned to (store_ops.version), "" where the
 * store has none; and a fresh handle pinned to one ("" pins nothing). */
void store_file_version(const store_ops *storage, store_file *file, char *out, size_t size);
int store_file_pin(const store_ops *storage, store_file *file, const char *version);

/* ----------------------------------------------------- small files (files.c) */

/* Whether a path exists in a store: *exists 1 or 0 when the store answered
 * (a missing path is 0), else its failure (it did not answer, answered an
 * error, a redirect or garbage; a local disk's EIO or EACCES), naming the
 * path: a store that could not be asked is never taken for one that said
 * "not there". */
int store_exists(const store_ops *storage, const char *path, int *exists);
/* Whether the file system holding dir (an existing directory) has room for
 * bytes more: TP_OK, or TP_ERR_IO ("needs ..., and the file system of DIR
 * has ... free", for the caller to prefix with its output) naming what is
 * needed and what is free (what an unprivileged writer may take), so that an output that cannot fit
 * is refused before it is written rather than at the disk's end. Stores
 * other than the local disk, and file systems that report no size, are
 * not judged. */
int store_check_room(const store_ops *storage, const char *dir, int64_t bytes);
/* Writes a small file atomically: temp file, sync, rename, sync of the directory. */
int store_write_file_atomic(const store_ops *storage, const char *dir, const char *name, const char *data,
                            size_t size);
/* Reads a whole text file (up to max_bytes, no NUL bytes; FIFOs and
 * devices refused) of a store into a malloc'ed NUL-terminated string;
 * size_out may be NULL. */
int store_read_text(const store_ops *storage, const char *path, int64_t max_bytes, char **out, int64_t *size_out);
/* store_read_text in the store of the path (store_for): a local file or a URL. */
int store_read_text_file(const char *path, int64_t max_bytes, char **out, int64_t *size_out);
/* Whether a read of a small file a writer replaces (a lease, a claim, a
 * run's latest) failed as the file changing under it: torn, as a server
 * rewriting it in place serves it (TP_ERR_FORMAT); replaced between the
 * read's HEAD and its GET (TP_ERR_CHECKSUM, an object store's 412 to
 * If-Match); or removed between them (TP_ERR_NOT_FOUND). Another read may
 * find it whole; a store's own failure (TP_ERR_IO) is no such change. */
int store_read_changed(int status);
/* A whole file of any bytes (up to max_bytes) of the store of the path
 * into a malloc'ed buffer, a NUL after its *size_out bytes. */
int store_read_file(const char *path, int64_t max_bytes, char **out, int64_t *size_out);

/* What a store kept of an object whose PUT it answered as done, the one
 * check of it for every upload: a store (or a gateway in front of it) can
 * answer 201 and keep nothing, part, or other bytes, and an upload that
 * trusted the answer said "copied" over a checkpoint no one can read.
 * TP_OK when url holds size bytes and, with data, exactly those (read
 * back: for small objects, an index); else TP_ERR_IO naming url and what
 * arrived ("363504 bytes arrived of 363514 sent", or the first byte that
 * differs), or the store's failure to answer. */
int store_check_kept(const char *url, const void *data, int64_t size);

/* A shared lock on the file or directory at path (a local path or a URL),
 * held while another tool's checkpoint is read from it: a replacement of
 * it (--force, store_staged_publish) waits for or refuses its readers, as
 * for the toolkit's own checkpoints (ckpt_reader_open). Released with
 * store_hold_release (NULL is fine). Nothing at path: *out NULL, TP_OK
 * (the reader then says what is missing). */
typedef struct store_hold store_hold;
int store_hold_shared(const char *path, store_hold **out);
/* The shared lock a reader holds on what it reads at path in storage,
 * waited for: a local path through a symbolic link is locked where it
 * leads (the lock itself refuses links: a writer replaces the entry a path
 * names, never through one), so that a replacement of the target waits for
 * this reader as for any other. */
int store_lock_for_reading(const store_ops *storage, const char *path, store_file **out);
void store_hold_release(store_hold *hold);

/* Removes the file or directory at path (remove_tree) unless it is being
 * read: under the exclusive lock a replacement takes (store_staged_publish),
 * tried without waiting, so that what a reader holds shared
 * (ckpt_reader_open, store_hold_shared) is never removed from under it (it
 * then failed mid-read, taking the vanished files for damaged ones). A
 * reader that comes while it is removed waits, then finds nothing there.
 * TP_ERR_EXISTS, saying it is being read, when a reader holds it; nothing at
 * path is TP_OK. (An object store has no locks: there, removed as it is.) */
int store_remove_unless_read(const store_ops *storage, const char *path);

#endif
