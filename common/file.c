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

int tp_open_regular(const char *path, int *fd_out)
{
    *fd_out = -1;
    /* O_NONBLOCK so that opening a FIFO with no writer returns at once. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return tp_fail(errno == ENOENT ? TP_ERR_NOT_FOUND : TP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return tp_fail(TP_ERR_IO, "%s: %s", path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return tp_fail(TP_ERR_FORMAT, "%s is %s, not a regular file; refusing to read it", path, kind_of(st.st_mode));
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    *fd_out = fd;
    return TP_OK;
}

int tp_refuse_special(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0 || S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)) return TP_OK;
    return tp_fail(TP_ERR_FORMAT, "%s is %s, not a regular file; refusing to read it", path, kind_of(st.st_mode));
}
