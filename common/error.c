/* error.c: per-thread failure messages. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "error.h"

static _Thread_local char last_message[2048];

const char *tp_errmsg(void)
{
    return last_message[0] ? last_message : "no error";
}

const char *tp_status_name(int status)
{
    switch (status) {
    case TP_OK: return "ok";
    case TP_ERR_ARG: return "invalid argument";
    case TP_ERR_IO: return "I/O error";
    case TP_ERR_HDF5: return "HDF5 error";
    case TP_ERR_FORMAT: return "format error";
    case TP_ERR_VERSION: return "unsupported version";
    case TP_ERR_CHECKSUM: return "checksum mismatch";
    case TP_ERR_NOT_FOUND: return "not found";
    case TP_ERR_EXISTS: return "already exists";
    case TP_ERR_LAYOUT: return "impossible layout";
    case TP_ERR_NOMEM: return "out of memory";
    case TP_ERR_STATE: return "call out of order";
    case TP_ERR_COMM: return "communication error";
    case TP_ERR_DEVICE: return "device error";
    case TP_ERR_LIMIT: return "limit too small";
    default: return "unknown status";
    }
}

int tp_fail(int status, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    vsnprintf(last_message, sizeof last_message, fmt, args);
    va_end(args);
    return status;
}

int tp_fail_context(int status, const char *fmt, ...)
{
    char prefix[1024], old[sizeof last_message];
    va_list args;
    va_start(args, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, args);
    va_end(args);
    memcpy(old, last_message, sizeof old);
    if (!prefix[0]) return status;
    /* The message may name the context's file already ("P: cannot write"
     * under "P: tensor T"): said once, "P: tensor T: cannot write". */
    const char *rest = old;
    size_t lead = strcspn(prefix, ":");
    if (lead > 0 && strncmp(old, prefix, lead) == 0 && old[lead] == ':' && old[lead + 1] == ' ') rest = old + lead + 2;
    if (snprintf(last_message, sizeof last_message, "%s: %s", prefix, rest) >= (int)sizeof last_message)
        strcpy(last_message + sizeof last_message - 4, "...");
    return status;
}
