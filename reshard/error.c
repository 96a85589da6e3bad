/* error.c: per-thread failure messages of the reshard library. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

static _Thread_local char last_message[2048];

const char *reshard_errmsg(void)
{
    return last_message[0] ? last_message : "no error";
}

int reshard_fail(int status, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    vsnprintf(last_message, sizeof last_message, fmt, args);
    va_end(args);
    return status;
}

int reshard_fail_ckpt(int status, const char *fmt, ...)
{
    char prefix[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, args);
    va_end(args);
    if (snprintf(last_message, sizeof last_message, "%s%s%s", prefix, prefix[0] ? ": " : "", ckpt_errmsg()) >=
        (int)sizeof last_message)
        strcpy(last_message + sizeof last_message - 4, "...");
    return status;
}

int reshard_ckpt_error(int status)
{
    snprintf(last_message, sizeof last_message, "%s", ckpt_errmsg());
    return status;
}
