/* fsutil.c: paths, and the small files of a checkpoint (index.json,
 * latest) over a store. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

int ckpt_exists(const ckpt_storage *storage, const char *path)
{
    ckpt_stat st;
    return storage->stat(storage, path, &st) == TP_OK && st.exists;
}

int ckpt_write_file_atomic(const ckpt_storage *storage, const char *dir, const char *name, const char *data,
                           size_t size)
{
    char tmp_name[300], tmp[CKPT_PATH_MAX], final[CKPT_PATH_MAX];
    snprintf(tmp_name, sizeof tmp_name, ".%.200s.tmp.%ld", name, (long)getpid());
    TP_TRY(tp_path_join(tmp, dir, tmp_name));
    TP_TRY(tp_path_join(final, dir, name));
    ckpt_file *file = NULL;
    TP_TRY(storage->open(storage, tmp, CKPT_OPEN_CREATE, &file));
    int status = storage->write_at(file, data, size, 0);
    if (!status) status = storage->sync(file);
    storage->close(file);
    if (!status) status = storage->rename(storage, tmp, final, CKPT_RENAME_REPLACE);
    if (status) {
        storage->remove_tree(storage, tmp);
        return status;
    }
    return storage->sync_dir(storage, dir);
}

int ckpt_read_text(const ckpt_storage *storage, const char *path, int64_t max_bytes, char **out,
                   int64_t *size_out)
{
    *out = NULL;
    ckpt_stat st;
    TP_TRY(storage->stat(storage, path, &st));
    if (!st.exists) return tp_fail(TP_ERR_NOT_FOUND, "%s: cannot open: %s", path, strerror(ENOENT));
    if (st.is_dir) return tp_fail(TP_ERR_FORMAT, "%s is a directory, not a text file", path);
    if (st.size > max_bytes)
        return tp_fail(TP_ERR_FORMAT, "%s: %lld bytes is too large for this file (at most %lld)", path,
                       (long long)st.size, (long long)max_bytes);
    ckpt_file *file = NULL;
    TP_TRY(storage->open(storage, path, CKPT_OPEN_READ, &file));
    char *text = malloc((size_t)st.size + 1);
    int status = text ? storage->read_at(file, text, (size_t)st.size, 0) : tp_fail(TP_ERR_NOMEM, "out of memory reading %s", path);
    storage->close(file);
    if (status) {
        free(text);
        return status;
    }
    text[st.size] = '\0';
    if (strlen(text) != (size_t)st.size) {
        free(text);
        return tp_fail(TP_ERR_FORMAT, "%s: contains NUL bytes (damaged?)", path);
    }
    *out = text;
    if (size_out) *size_out = st.size;
    return TP_OK;
}

int ckpt_read_text_file(const char *path, int64_t max_bytes, char **out, int64_t *size_out)
{
    const ckpt_storage *storage;
    *out = NULL;
    TP_TRY(ckpt_storage_for(path, &storage));
    return ckpt_read_text(storage, path, max_bytes, out, size_out);
}
