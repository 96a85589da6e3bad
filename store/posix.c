/* posix.c: the store of the local file system: positioned I/O,
 * renames (atomic exchange and no-replace where the kernel offers them),
 * fsync of files and directories. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/error.h"
#include "../common/file.h"
#include "../common/path.h"
#include "store.h"

struct store_file {
    const store_ops *storage;
    int fd;
    char path[TP_PATH_MAX];
};

/* The store's handle of an open descriptor (closed on failure). */
static int wrap(const store_ops *s, int fd, const char *path, store_file **out)
{
    store_file *f = malloc(sizeof *f);
    if (!f) {
        close(fd);
        return tp_fail(TP_ERR_NOMEM, "out of memory opening %s", path);
    }
    f->storage = s;
    f->fd = fd;
    strcpy(f->path, path);
    *out = f;
    return TP_OK;
}

static int posix_open(const store_ops *s, const char *path, store_open_mode mode, store_file **out)
{
    *out = NULL;
    if (strlen(path) >= TP_PATH_MAX) return tp_fail(TP_ERR_ARG, "path too long: %s", path);
    int flags = mode == STORE_OPEN_WRITE ? O_WRONLY : O_WRONLY | O_CREAT | O_TRUNC;
    int fd = -1;
    if (mode == STORE_OPEN_READ) TP_TRY(tp_open_regular(path, &fd)); /* never a FIFO: it would block */
    else fd = open(path, flags | O_CLOEXEC, 0644);
    if (fd < 0)
        return tp_fail(errno == ENOENT ? TP_ERR_NOT_FOUND : TP_ERR_IO, "%s: cannot %s: %s", path,
                       mode == STORE_OPEN_CREATE ? "create" : "open", strerror(errno));
    return wrap(s, fd, path, out);
}

static int posix_read_at(store_file *f, void *buf, size_t size, int64_t offset)
{
    char *p = buf;
    while (size > 0) {
        ssize_t n = pread(f->fd, p, size, (off_t)offset);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0)
            return tp_fail(TP_ERR_IO, "%s: read of %zu bytes at offset %lld failed: %s", f->path, size,
                           (long long)offset, strerror(errno));
        if (n == 0)
            return tp_fail(TP_ERR_FORMAT, "%s: file ends before offset %lld (%zu bytes missing; truncated?)", f->path,
                           (long long)offset, size);
        p += n;
        size -= (size_t)n;
        offset += n;
    }
    return TP_OK;
}

/* Bytes per write system call at most. The kernel takes page-cache folios
 * as large as a write allows (up to 2 MiB); on this project's virtual
 * machines, memory the guest gave back to the host (free page reporting,
 * in 2 MiB blocks) is what 2 MiB folios come from, and its first touch
 * faults to the host: new files written in 2 MiB-aligned writes of 2 MiB
 * cost 2.2-2.8 s of CPU per GB, in writes of 1 MiB 0.18-0.35 s
 * (docs/BENCHMARKS.md, issue 28). Elsewhere 1 MiB per call costs no more. */
#define WRITE_CALL_MAX ((size_t)1 << 20)

/* Writes of at least this size start their writeback at once. */
#define WRITEBACK_MIN ((size_t)1 << 20)

static int posix_write_at(store_file *f, const void *buf, size_t size, int64_t offset)
{
    const char *p = buf;
    int64_t first = offset;
    size_t total = size;
    while (size > 0) {
        /* Up to the next multiple of WRITE_CALL_MAX in the file, so that the
         * calls after a first unaligned one start aligned. */
        size_t room = WRITE_CALL_MAX - (size_t)(offset % (int64_t)WRITE_CALL_MAX);
        ssize_t n = pwrite(f->fd, p, size < room ? size : room, (off_t)offset);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            return tp_fail(TP_ERR_IO, "%s: write of %zu bytes at offset %lld failed: %s", f->path, size,
                           (long long)offset, n < 0 ? strerror(errno) : "no progress");
        p += n;
        size -= (size_t)n;
        offset += n;
    }
    /* The disk starts on these bytes now, while the caller computes the
     * next ones, rather than all at the final fsync (which then waits for
     * the whole file: resharding 2.5 GB spent 2 of its 4 s in fsyncs after
     * the last write). Advice: an error surfaces at that fsync. */
    if (total >= WRITEBACK_MIN) sync_file_range(f->fd, first, (off_t)total, SYNC_FILE_RANGE_WRITE);
    return TP_OK;
}

static void posix_read_ahead(store_file *f, int64_t offset, int64_t size)
{
    posix_fadvise(f->fd, offset, size, POSIX_FADV_WILLNEED);
}

static int posix_resize(store_file *f, int64_t size)
{
    if (ftruncate(f->fd, (off_t)size) != 0)
        return tp_fail(TP_ERR_IO, "%s: cannot size to %lld bytes: %s", f->path, (long long)size, strerror(errno));
    return TP_OK;
}

static int posix_sync(store_file *f)
{
    if (fsync(f->fd) != 0) return tp_fail(TP_ERR_IO, "%s: fsync failed: %s", f->path, strerror(errno));
    return TP_OK;
}

static void posix_close(store_file *f)
{
    if (!f) return;
    close(f->fd);
    free(f);
}

static const char *posix_path_of(const store_file *f)
{
    return f->path;
}

static int posix_stat(const store_ops *s, const char *path, store_stat *out)
{
    (void)s;
    struct stat st;
    memset(out, 0, sizeof *out);
    if (stat(path, &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR) return TP_OK;
        return tp_fail(TP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    out->exists = 1;
    out->is_dir = S_ISDIR(st.st_mode);
    out->size = (int64_t)st.st_size;
    return TP_OK;
}

static int posix_list(const store_ops *s, const char *dir, int (*visit)(void *ctx, const char *name), void *ctx)
{
    (void)s;
    DIR *d = opendir(dir);
    if (!d) return tp_fail(errno == ENOENT ? TP_ERR_NOT_FOUND : TP_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
    int status = TP_OK;
    struct dirent *e;
    while (!status && (e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) status = visit(ctx, e->d_name);
    closedir(d);
    return status;
}

static int posix_make_dir(const store_ops *s, const char *path)
{
    (void)s;
    if (mkdir(path, 0755) != 0)
        return tp_fail(errno == EEXIST ? TP_ERR_EXISTS : TP_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    return TP_OK;
}

static int posix_rename(const store_ops *s, const char *from, const char *to, store_rename_mode mode)
{
    (void)s;
    int moved;
    if (mode == STORE_RENAME_EXCHANGE) {
        if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_EXCHANGE) == 0) return TP_OK;
        if (errno == EINVAL || errno == ENOSYS)
            return tp_fail(TP_ERR_STATE, "cannot exchange %s and %s atomically on this file system", from, to);
        return tp_fail(TP_ERR_IO, "cannot exchange %s and %s: %s", from, to, strerror(errno));
    }
    if (mode == STORE_RENAME_NOREPLACE) {
        moved = renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE);
        /* No RENAME_NOREPLACE here: check, then rename (a narrow race remains). */
        if (moved != 0 && (errno == EINVAL || errno == ENOSYS)) {
            struct stat st;
            if (lstat(to, &st) == 0) errno = EEXIST;
            else moved = rename(from, to);
        }
    } else {
        moved = rename(from, to);
    }
    if (moved == 0) return TP_OK;
    int err = errno;
    return tp_fail(err == EEXIST || err == ENOTEMPTY ? TP_ERR_EXISTS : TP_ERR_IO, "cannot move %s to %s: %s", from, to,
                   strerror(err));
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    int rc = type == FTW_DP ? rmdir(path) : unlink(path);
    return rc != 0 && errno != ENOENT ? -1 : 0;
}

static int posix_remove_tree(const store_ops *s, const char *path)
{
    (void)s;
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? TP_OK : tp_fail(TP_ERR_IO, "%s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        if (unlink(path) != 0) return tp_fail(TP_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
        return TP_OK;
    }
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return tp_fail(TP_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    return TP_OK;
}

static int posix_sync_dir(const store_ops *s, const char *path)
{
    (void)s;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return tp_fail(TP_ERR_IO, "%s: cannot open to sync: %s", path, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    if (rc != 0) return tp_fail(TP_ERR_IO, "%s: fsync failed: %s", path, strerror(err));
    return TP_OK;
}

static int posix_lock(const store_ops *s, const char *path, int flags, store_file **out)
{
    /* flock on the entry itself (a directory too): held by the open file,
     * released when it is closed or the process dies, however it dies. The
     * entry may be renamed away while this waits: then the one at path now
     * is locked instead. */
    *out = NULL;
    if (strlen(path) >= TP_PATH_MAX) return tp_fail(TP_ERR_ARG, "path too long: %s", path);
    int operation = (flags & STORE_LOCK_SHARED ? LOCK_SH : LOCK_EX) | (flags & STORE_LOCK_WAIT ? 0 : LOCK_NB);
    for (int attempt = 0;; attempt++) {
        int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
            return tp_fail(errno == ENOENT ? TP_ERR_NOT_FOUND : TP_ERR_IO, "%s: cannot open to lock: %s", path,
                           strerror(errno));
        int rc;
        while ((rc = flock(fd, operation)) != 0 && errno == EINTR) {
        }
        if (rc != 0) {
            int err = errno;
            close(fd);
            if (err == EWOULDBLOCK) return tp_fail(TP_ERR_EXISTS, "%s is locked by another process", path);
            return tp_fail(TP_ERR_IO, "%s: cannot lock: %s", path, strerror(err));
        }
        struct stat held, now;
        if (fstat(fd, &held) == 0 && stat(path, &now) == 0 && held.st_ino == now.st_ino && held.st_dev == now.st_dev)
            return wrap(s, fd, path, out);
        close(fd);
        if (attempt == 100) return tp_fail(TP_ERR_IO, "%s: cannot lock: it keeps being replaced", path);
    }
}

static const store_ops posix_storage = {.name = "posix",
                                        .local_paths = 1,
                                        .open = posix_open,
                                        .read_at = posix_read_at,
                                        .write_at = posix_write_at,
                                        .read_ahead = posix_read_ahead,
                                        .resize = posix_resize,
                                        .sync = posix_sync,
                                        .close = posix_close,
                                        .path_of = posix_path_of,
                                        .stat = posix_stat,
                                        .list = posix_list,
                                        .make_dir = posix_make_dir,
                                        .rename = posix_rename,
                                        .remove_tree = posix_remove_tree,
                                        .sync_dir = posix_sync_dir,
                                        .lock = posix_lock};

const store_ops *store_posix(void)
{
    return &posix_storage;
}
