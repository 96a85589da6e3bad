/* cli.h: what the command-line programs share: one-line errors and usage
 * errors, and the option getopt rejected. Programs own the process: these
 * print and exit, which the libraries never do. */
#ifndef TP_PROGRAMS_CLI_H
#define TP_PROGRAMS_CLI_H

#include "../common/parse.h"

/* The command-line word getopt just rejected (an unknown option, or one
 * missing its value), for a one-line message; set opterr = 0 before parsing. */
const char *cli_rejected_option(char *const argv[]);

/* "PROGRAM: message (see PROGRAM --help)" on stderr, then exit status 2. */
void cli_usage_error(const char *program, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));

/* "PROGRAM: error: message" on stderr; returns 1, the failure exit status. */
int cli_error(const char *program, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
