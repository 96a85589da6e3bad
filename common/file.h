/* file.h: opening files that come from users, which may be anything. */
#ifndef TP_COMMON_FILE_H
#define TP_COMMON_FILE_H

/* Opens path to read (close-on-exec). A FIFO, device or socket would block
 * or never end, so anything but a regular file is refused, naming what it
 * is, without blocking. Returns a tp_status; *fd_out is -1 on failure. */
int tp_open_regular(const char *path, int *fd_out);

/* Whether path names something that is not a regular file or a directory
 * (a FIFO, a device, a socket): TP_ERR_FORMAT naming it; TP_OK otherwise,
 * a missing path included. */
int tp_refuse_special(const char *path);

#endif
