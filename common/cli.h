/* cli.h: small parsing helpers shared by the command-line programs. */
#ifndef TP_CLI_H
#define TP_CLI_H

#include <stdint.h>

/* Parses a non-negative integer (decimal) into *out within [min, max]. */
int cli_parse_int(const char *text, int64_t min, int64_t max, int64_t *out);

/* Parses a size with an optional binary suffix: "512", "64K", "1.5G", "2GiB". */
int cli_parse_size(const char *text, int64_t *out);

/* Parses a floating-point number. */
int cli_parse_double(const char *text, double *out);

/* The command-line word getopt just rejected (an unknown option, or one
 * missing its value), for a one-line message; set opterr = 0 before parsing. */
const char *cli_rejected_option(char *const argv[]);

/* "PROGRAM: message (see PROGRAM --help)" on stderr, then exit status 2. */
void cli_usage_error(const char *program, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), noreturn));

/* "PROGRAM: error: message" on stderr; returns 1, the failure exit status. */
int cli_error(const char *program, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
