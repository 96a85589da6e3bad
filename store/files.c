/* files.c: small files over a store (a checkpoint's index.json and
 * `latest`, configuration, state): existence, atomic writes, whole reads. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "../common/error.h"
#include "../common/parse.h"
#include "../common/path.h"
#include "store.h"

int store_exists(const store_ops *storage, const char *path, int *exists)
{
    store_stat st;
    *exists = 0;
    TP_TRY(storage->stat(storage, path, &st));
    *exists = st.exists;
    return TP_OK;
}

int store_check_room(const store_ops *storage, const char *dir, int64_t bytes)
{
    struct statvfs fs;
    if (!storage->local_paths || bytes <= 0 || statvfs(dir, &fs) != 0 || fs.f_blocks == 0) return TP_OK;
    uint64_t room = (uint64_t)fs.f_bavail * (uint64_t)fs.f_frsize;
    if ((uint64_t)bytes <= room) return TP_OK;
    char need[32], have[32];
    format_bytes((double)bytes, need, sizeof need);
    format_bytes((double)room, have, sizeof have);
    return tp_fail(TP_ERR_IO, "needs %s (%lld bytes), and the file system of %s has %s free: nothing was written",
                   need, (long long)bytes, dir, have);
}

int store_write_file_atomic(const store_ops *storage, const char *dir, const char *name, const char *data,
                           size_t size)
{
    char tmp_name[300], tmp[TP_PATH_MAX], final[TP_PATH_MAX];
    snprintf(tmp_name, sizeof tmp_name, ".%.200s.tmp.%ld", name, (long)getpid());
    TP_TRY(tp_path_join(tmp, dir, tmp_name));
    TP_TRY(tp_path_join(final, dir, name));
    store_file *file = NULL;
    TP_TRY(storage->open(storage, tmp, STORE_OPEN_CREATE, &file));
    int status = storage->write_at(file, data, size, 0);
    if (!status) status = storage->sync(file);
    storage->close(file);
    if (!status) status = storage->rename(storage, tmp, final, STORE_RENAME_REPLACE);
    if (status) {
        storage->remove_tree(storage, tmp);
        return status;
    }
    return storage->sync_dir(storage, dir);
}

/* size bytes of path from its start into a malloc'ed buffer, a NUL after
 * them: what every reading of a whole file here shares. */
static int read_exactly(const store_ops *storage, const char *path, int64_t size, char **out)
{
    *out = NULL;
    store_file *file = NULL;
    TP_TRY(storage->open(storage, path, STORE_OPEN_READ, &file));
    char *data = malloc((size_t)size + 1);
    int status = data ? storage->read_at(file, data, (size_t)size, 0) : tp_fail(TP_ERR_NOMEM, "out of memory reading %s", path);
    storage->close(file);
    if (status) {
        free(data);
        return status;
    }
    data[size] = '\0';
    *out = data;
    return TP_OK;
}

/* A whole file of at most max_bytes (kind: what it should be, for the
 * refusal of a directory). */
static int read_whole(const store_ops *storage, const char *path, int64_t max_bytes, const char *kind, char **out,
                      int64_t *size_out)
{
    *out = NULL;
    store_stat st;
    TP_TRY(storage->stat(storage, path, &st));
    if (!st.exists) return tp_fail(TP_ERR_NOT_FOUND, "%s: cannot open: %s", path, strerror(ENOENT));
    if (st.is_dir) return tp_fail(TP_ERR_FORMAT, "%s is a directory, not %s", path, kind);
    if (st.size > max_bytes)
        return tp_fail(TP_ERR_FORMAT, "%s: %lld bytes is too large for this file (at most %lld)", path,
                       (long long)st.size, (long long)max_bytes);
    TP_TRY(read_exactly(storage, path, st.size, out));
    if (size_out) *size_out = st.size;
    return TP_OK;
}

int store_read_text(const store_ops *storage, const char *path, int64_t max_bytes, char **out,
                   int64_t *size_out)
{
    int64_t size;
    TP_TRY(read_whole(storage, path, max_bytes, "a text file", out, &size));
    if (strlen(*out) != (size_t)size) {
        free(*out);
        *out = NULL;
        return tp_fail(TP_ERR_FORMAT, "%s: contains NUL bytes (damaged?)", path);
    }
    if (size_out) *size_out = size;
    return TP_OK;
}

int store_read_file(const char *path, int64_t max_bytes, char **out, int64_t *size_out)
{
    const store_ops *storage;
    *out = NULL;
    TP_TRY(store_for(path, &storage));
    return read_whole(storage, path, max_bytes, "a file", out, size_out);
}

int store_read_text_file(const char *path, int64_t max_bytes, char **out, int64_t *size_out)
{
    const store_ops *storage;
    *out = NULL;
    TP_TRY(store_for(path, &storage));
    return store_read_text(storage, path, max_bytes, out, size_out);
}

int store_read_changed(int status)
{
    return status == TP_ERR_FORMAT || status == TP_ERR_CHECKSUM || status == TP_ERR_NOT_FOUND;
}

int store_check_kept(const char *url, const void *data, int64_t size)
{
    const store_ops *storage;
    TP_TRY(store_for(url, &storage));
    store_stat st = {0};
    TP_TRY(storage->stat(storage, url, &st));
    if (!st.exists || st.is_dir || st.size != size)
        return tp_fail(TP_ERR_IO, "%s: %lld bytes arrived of %lld sent%s", url, (long long)(st.exists ? st.size : 0),
                       (long long)size, st.exists ? "" : " (nothing is there, though its PUT was answered as done)");
    if (!data || size == 0) return TP_OK;
    char *back;
    TP_TRY(read_exactly(storage, url, size, &back));
    const unsigned char *kept = (const unsigned char *)back, *sent = data;
    int64_t at = 0;
    while (at < size && kept[at] == sent[at]) at++;
    int status = at == size ? TP_OK
                            : tp_fail(TP_ERR_IO, "%s: the store kept other bytes than were sent: byte %lld of %lld is "
                                      "0x%02x, 0x%02x was sent", url, (long long)at, (long long)size, kept[at], sent[at]);
    free(back);
    return status;
}

struct store_hold {
    const store_ops *storage;
    store_file *lock;
};

int store_lock_for_reading(const store_ops *storage, const char *path, store_file **out)
{
    char resolved[PATH_MAX];
    const char *held = storage->local_paths && realpath(path, resolved) ? resolved : path;
    return storage->lock(storage, held, STORE_LOCK_SHARED | STORE_LOCK_WAIT, out);
}

int store_hold_shared(const char *path, store_hold **out)
{
    *out = NULL;
    store_hold *h = calloc(1, sizeof *h);
    if (!h) return tp_fail(TP_ERR_NOMEM, "out of memory");
    int status = store_for(path, &h->storage);
    store_stat st = {0};
    if (!status) status = h->storage->stat(h->storage, path, &st);
    if (!status && !st.exists) { /* nothing to hold: the reader says what is missing */
        free(h);
        return TP_OK;
    }
    if (!status) status = store_lock_for_reading(h->storage, path, &h->lock);
    if (status) {
        free(h);
        return tp_fail_context(status, "%s: a lock for reading", path);
    }
    *out = h;
    return TP_OK;
}

void store_hold_release(store_hold *h)
{
    if (!h) return;
    if (h->lock) h->storage->close(h->lock);
    free(h);
}

int store_remove_unless_read(const store_ops *storage, const char *path)
{
    store_file *lock = NULL;
    int status = storage->lock(storage, path, 0, &lock);
    if (status == TP_ERR_NOT_FOUND) return TP_OK; /* removed already */
    if (status == TP_ERR_EXISTS)
        return tp_fail(TP_ERR_EXISTS, "%s is being read (by another process, or by this one); not removed (try again "
                       "when it is done)", path);
    if (!status) status = storage->remove_tree(storage, path);
    if (lock) storage->close(lock); /* after the removal: a reader waiting for it finds nothing */
    return status;
}

void store_file_version(const store_ops *storage, store_file *file, char *out, size_t size)
{
    if (size) out[0] = '\0';
    if (storage->version && size) storage->version(file, out, size);
}

int store_file_pin(const store_ops *storage, store_file *file, const char *version)
{
    return storage->pin && version && version[0] ? storage->pin(file, version) : TP_OK;
}
