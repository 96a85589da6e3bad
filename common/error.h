/* error.h: the one error convention of every library in this project.
 *
 * A function that can fail returns a tp_status (TP_OK == 0) and, on failure,
 * records a message for the calling thread that names the object (file,
 * tensor, rank) and the cause, with expected against actual values where
 * there are such. tp_errmsg() returns it; libraries never print. A caller
 * that adds context prefixes it with tp_fail_context(); a caller that only
 * passes a failure on returns the status as it is, and the message stays. */
#ifndef TP_ERROR_H
#define TP_ERROR_H

typedef enum {
    TP_OK = 0,
    TP_ERR_ARG,       /* an argument or a description is invalid */
    TP_ERR_IO,        /* a system call failed */
    TP_ERR_HDF5,      /* the HDF5 library reported an error */
    TP_ERR_FORMAT,    /* contents do not follow their format (damaged or foreign) */
    TP_ERR_VERSION,   /* written by a newer major format version */
    TP_ERR_CHECKSUM,  /* data does not match its stored checksum */
    TP_ERR_NOT_FOUND, /* no such checkpoint, file or tensor */
    TP_ERR_EXISTS,    /* the output exists and overwriting was not asked for */
    TP_ERR_LAYOUT,    /* a tensor or model cannot be laid out at the requested degrees */
    TP_ERR_NOMEM,
    TP_ERR_STATE,     /* a call out of order, e.g. commit with pieces missing */
    TP_ERR_COMM,      /* communication between ranks failed */
    TP_ERR_DEVICE,    /* no usable GPU, or the GPU or its library failed */
    TP_ERR_LIMIT,     /* a limit the caller set (--memory-limit) is too small for the work: a usage error,
                         which the programs exit 2 for, not a failure of the work */
} tp_status;

/* Message of the last failure in this thread; never NULL. */
const char *tp_errmsg(void);

/* A short name of a status ("I/O error"). */
const char *tp_status_name(int status);

/* Records the message of a failure and returns status, so that a failure
 * reads `return tp_fail(TP_ERR_IO, "%s: cannot open: %s", path, why);`. */
int tp_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Puts context in front of the current message ("a.h5: " + message) and
 * returns status. */
int tp_fail_context(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Returns from the calling function with the status of a failed call. */
#define TP_TRY(call)                                                                                                   \
    do {                                                                                                               \
        int tp_try_status_ = (call);                                                                                   \
        if (tp_try_status_ != TP_OK) return tp_try_status_;                                                            \
    } while (0)

#endif
