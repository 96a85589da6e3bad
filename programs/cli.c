/* cli.c: one-line errors of the command-line programs. */
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int64_t cli_int(const char *program, const char *option, const char *text, int64_t min, int64_t max)
{
    int64_t value;
    if (parse_int(text, min, max, &value))
        cli_usage_error(program, "%s expects an integer in %lld..%lld, got '%s'", option, (long long)min, (long long)max,
                        text);
    return value;
}

double cli_number(const char *program, const char *option, const char *text)
{
    double value;
    if (parse_double(text, &value) || value < 0)
        cli_usage_error(program, "%s expects a non-negative number, got '%s'", option, text);
    return value;
}

int64_t cli_size(const char *program, const char *option, const char *text)
{
    int64_t value;
    if (parse_size(text, &value) || value < 1)
        cli_usage_error(program, "%s expects a size such as 512M or 4G, got '%s'", option, text);
    return value;
}

int cli_compress(const char *program, const char *text)
{
    int64_t level;
    if (strcmp(text, "none") == 0) return 0;
    if (strcmp(text, "zstd") == 0) return 3;
    if (strncmp(text, "zstd:", 5) == 0 && parse_int(text + 5, 1, 22, &level) == 0) return (int)level;
    cli_usage_error(program, "--compress expects zstd, zstd:LEVEL (1..22) or none, got '%s'", text);
}
