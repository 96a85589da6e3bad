/* cli.c: one-line errors of the command-line programs. */
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"

void cli_usage_error(const char *program, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "%s: ", program);
    vfprintf(stderr, fmt, args);
    fprintf(stderr, " (see %s --help)\n", program);
    va_end(args);
    exit(2);
}

int cli_error(const char *program, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "%s: error: ", program);
    vfprintf(stderr, fmt, args);
    fprintf(stderr, "\n");
    va_end(args);
    return 1;
}

const char *cli_rejected_option(char *const argv[])
{
    return optind > 1 ? argv[optind - 1] : "?";
}
