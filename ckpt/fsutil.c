/* fsutil.c: positioned I/O, durable renames and directory housekeeping. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

int ckpt_path_join(char *out, const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    if (a + 1 + b + 1 > CKPT_PATH_MAX)
        return tp_fail(TP_ERR_ARG, "path %s/%s is longer than %d bytes", dir, name, CKPT_PATH_MAX);
    memcpy(out, dir, a);
    out[a] = '/';
    memcpy(out + a + 1, name, b + 1);
    return TP_OK;
}

int ckpt_write_all_at(int fd, const void *buf, size_t size, int64_t offset, const char *path)
{
    const char *p = buf;
    while (size > 0) {
        ssize_t n = pwrite(fd, p, size, (off_t)offset);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            return tp_fail(TP_ERR_IO, "%s: write of %zu bytes at offset %lld failed: %s", path,
                             size, (long long)offset, n < 0 ? strerror(errno) : "no progress");
        p += n;
        size -= (size_t)n;
        offset += n;
    }
    return TP_OK;
}

int ckpt_read_all_at(int fd, void *buf, size_t size, int64_t offset, const char *path)
{
    char *p = buf;
    while (size > 0) {
        ssize_t n = pread(fd, p, size, (off_t)offset);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0)
            return tp_fail(TP_ERR_IO, "%s: read of %zu bytes at offset %lld failed: %s", path,
                             size, (long long)offset, strerror(errno));
        if (n == 0)
            return tp_fail(TP_ERR_FORMAT,
                             "%s: file ends before offset %lld (%zu bytes missing; truncated?)",
                             path, (long long)offset, size);
        p += n;
        size -= (size_t)n;
        offset += n;
    }
    return TP_OK;
}

int ckpt_fsync_path(const char *path, int is_dir)
{
    int fd = open(path, (is_dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
    if (fd < 0) return tp_fail(TP_ERR_IO, "%s: cannot open to sync: %s", path, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    if (rc != 0) return tp_fail(TP_ERR_IO, "%s: fsync failed: %s", path, strerror(err));
    return TP_OK;
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    int rc = type == FTW_DP ? rmdir(path) : unlink(path);
    return rc != 0 && errno != ENOENT ? -1 : 0;
}

int ckpt_remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? TP_OK : tp_fail(TP_ERR_IO, "%s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        if (unlink(path) != 0)
            return tp_fail(TP_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
        return TP_OK;
    }
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return tp_fail(TP_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    return TP_OK;
}

int ckpt_path_exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

int ckpt_split_path(const char *path, char *parent, size_t parent_size, char *base,
                    size_t base_size)
{
    char copy[CKPT_PATH_MAX];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof copy) return tp_fail(TP_ERR_ARG, "path '%s' is empty or too long", path);
    memcpy(copy, path, n + 1);
    while (n > 1 && copy[n - 1] == '/') copy[--n] = '\0';
    char *slash = strrchr(copy, '/');
    const char *dir = ".", *name = copy;
    if (slash == copy) {
        dir = "/";
        name = copy + 1;
    } else if (slash) {
        *slash = '\0';
        dir = copy;
        name = slash + 1;
    }
    if (!*name || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return tp_fail(TP_ERR_ARG, "path '%s' does not name a directory entry", path);
    if (snprintf(parent, parent_size, "%s", dir) >= (int)parent_size ||
        snprintf(base, base_size, "%s", name) >= (int)base_size)
        return tp_fail(TP_ERR_ARG, "path '%s' is too long", path);
    return TP_OK;
}

int ckpt_staging_path(const char *path, char *out, size_t out_size)
{
    char parent[CKPT_PATH_MAX], base[CKPT_PATH_MAX], hidden[CKPT_PATH_MAX + 16];
    int status = ckpt_split_path(path, parent, sizeof parent, base, sizeof base);
    if (status) return status;
    snprintf(hidden, sizeof hidden, ".%s.staging", base);
    if (out_size < CKPT_PATH_MAX) return tp_fail(TP_ERR_ARG, "path buffer too small");
    return ckpt_path_join(out, parent, hidden);
}

int ckpt_write_file_atomic(const char *dir, const char *name, const char *data, size_t size)
{
    char tmp_name[300], tmp[CKPT_PATH_MAX], final[CKPT_PATH_MAX];
    snprintf(tmp_name, sizeof tmp_name, ".%.200s.tmp.%ld", name, (long)getpid());
    int status = ckpt_path_join(tmp, dir, tmp_name);
    if (!status) status = ckpt_path_join(final, dir, name);
    if (status) return status;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return tp_fail(TP_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    status = ckpt_write_all_at(fd, data, size, 0, tmp);
    if (!status && fsync(fd) != 0)
        status = tp_fail(TP_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
    close(fd);
    if (!status && rename(tmp, final) != 0)
        status = tp_fail(TP_ERR_IO, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
    if (status) {
        unlink(tmp);
        return status;
    }
    return ckpt_fsync_path(dir, 1);
}

int ckpt_read_text_file(const char *path, char **out, int64_t *size_out)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tp_fail(errno == ENOENT ? TP_ERR_NOT_FOUND : TP_ERR_IO, "%s: cannot open: %s",
                         path, strerror(errno));
    struct stat st;
    int status = TP_OK;
    if (fstat(fd, &st) != 0) status = tp_fail(TP_ERR_IO, "%s: %s", path, strerror(errno));
    else if (st.st_size > ((int64_t)1 << 30))
        status = tp_fail(TP_ERR_FORMAT, "%s: %lld bytes is too large for a text file (at most 1 GiB)", path,
                           (long long)st.st_size);
    char *text = status ? NULL : malloc((size_t)st.st_size + 1);
    if (!status && !text) status = tp_fail(TP_ERR_NOMEM, "out of memory reading %s", path);
    if (!status) status = ckpt_read_all_at(fd, text, (size_t)st.st_size, 0, path);
    close(fd);
    if (status) {
        free(text);
        return status;
    }
    text[st.st_size] = '\0';
    if (strlen(text) != (size_t)st.st_size) {
        free(text);
        return tp_fail(TP_ERR_FORMAT, "%s: contains NUL bytes (damaged?)", path);
    }
    *out = text;
    if (size_out) *size_out = (int64_t)st.st_size;
    return TP_OK;
}
