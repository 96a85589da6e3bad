/* file.h: opening files that come from users, which may be anything. */
#ifndef TP_COMMON_FILE_H
#define TP_COMMON_FILE_H

/* Opens path to read (close-on-exec). A FIFO, device or socket would block
 * or never end, so anything but a regular file is refused, naming what it
 * is, without blocking. Returns a tp_status; *fd_out is -1 on failure. */
int tp_open_regular(const char *path, int *fd_out);

/* As tp_open_regular, with open(2)'s flags and mode (O_WRONLY | O_CREAT |
 * O_APPEND, ...; close-on-exec is added): for files a program writes where
 * a user could have put a FIFO, which would block the open for good. A FIFO
 * that appears between the check and the open fails the open (O_NONBLOCK)
 * instead of blocking it. */
int tp_open_regular_flags(const char *path, int flags, int mode, int *fd_out);

/* Whether path names something that is not a regular file or a directory
 * (a FIFO, a device, a socket): TP_ERR_FORMAT naming it; TP_OK otherwise,
 * a missing path included. */
int tp_refuse_special(const char *path);

#endif
