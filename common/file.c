/* file.c: opening files that come from users. */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"

static const char *kind_of(mode_t mode)
{
    return S_ISFIFO(mode) ? "a FIFO" : S_ISCHR(mode) ? "a character device" : S_ISBLK(mode) ? "a block device"
         : S_ISSOCK(mode) ? "a socket" : S_ISDIR(mode) ? "a directory" : "not a regular file";
}

/* Whether path names something that is not a regular file or a directory. */
static int refuse_special(const char *path, const char *verb)
{
    struct stat st;
    if (stat(path, &st) != 0 || S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)) return TP_OK;
    return tp_fail(TP_ERR_FORMAT, "%s is %s, not a regular file; refusing to %s it", path, kind_of(st.st_mode), verb);
}

int tp_open_regular_flags(const char *path, int flags, int mode, int *fd_out)
{
    *fd_out = -1;
    /* A FIFO named first: opened to write without a reader, it fails with
     * ENXIO, which would not say what is wrong. */
    const char *verb = (flags & O_ACCMODE) == O_RDONLY ? "read" : "write";
    TP_TRY(refuse_special(path, verb));
    /* O_NONBLOCK so that opening a FIFO (one put there since) returns at once. */
    int fd = open(path, flags | O_CLOEXEC | O_NONBLOCK, (mode_t)mode);
    if (fd < 0) {
        int err = errno;
        TP_TRY(refuse_special(path, verb));
        return tp_fail(err == ENOENT ? TP_ERR_NOT_FOUND : TP_ERR_IO, "%s: cannot open: %s", path, strerror(err));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return tp_fail(TP_ERR_IO, "%s: %s", path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return tp_fail(TP_ERR_FORMAT, "%s is %s, not a regular file; refusing to %s it", path, kind_of(st.st_mode), verb);
    }
    int now = fcntl(fd, F_GETFL);
    if (now >= 0) fcntl(fd, F_SETFL, now & ~O_NONBLOCK);
    *fd_out = fd;
    return TP_OK;
}

int tp_open_regular(const char *path, int *fd_out)
{
    return tp_open_regular_flags(path, O_RDONLY, 0, fd_out);
}

int tp_refuse_special(const char *path)
{
    return refuse_special(path, "open"); /* to read or to write */
}
